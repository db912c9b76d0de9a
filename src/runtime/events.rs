//! Runtime events: the vocabulary (names, classes, the event and its
//! fields), its encoding as audit lines (and decoding, for events relayed
//! from workers), and the timestamps those carry.
//! See ARCHITECTURE.md, Events and audit.

mod decode;
mod encode;
mod relay;
mod vocabulary;

#[cfg(test)]
mod record_tests;

pub use crate::auditlog::clock::{parse_rfc3339, rfc3339};
pub use relay::{RelayBudget, Relaying, relayed_lines, relayed_lines_within};
pub use vocabulary::{Event, EventName, FieldValue};
