//! `troupe report`: a run's audit log drawn as a timeline (SVG, or one
//! self-contained HTML page with a summary). Declares the parts and
//! re-exports what callers use.

pub mod concurrency;
pub mod duration;
pub mod error;
pub mod escape;
pub mod graph;
pub mod html;
pub mod layout;
pub mod lines;
pub mod read;
pub mod store;
pub mod summary;
pub mod svg;
pub mod timeline;
pub mod timestamp;

pub use concurrency::Concurrency;
pub use error::ReportError;
pub use html::render_html;
pub use layout::{Bin, Row, RowBudget, rows};
pub use store::{audit_path, load_run};
pub use summary::{StageSummary, stage_summaries};
pub use svg::{SvgOptions, render_svg, svg_style_source};
pub use timeline::{
    ApprovalWait, Execution, Group, Item, Micros, Outcome, Retry, Role, RunInfo, RunStatus,
    Timeline,
};
