//! The `troupe` binary.
fn main() {}
