//! Runtime events: the vocabulary (names, classes, the event and its
//! fields), its encoding as audit lines, and the timestamps those carry.
//! See ARCHITECTURE.md, Events and audit.

mod clock;
mod encode;
mod vocabulary;

pub use clock::{parse_rfc3339, rfc3339};
pub use vocabulary::{Event, EventName, FieldValue};
