//! Hook declarations: the slots hooks attach to (`<TURN_STAGE>/pre|post`
//! of the six message-loop stages), what a hook may do, and a hook command
//! as `pipeline.yaml` declares it. The runtime's `hooks` runs them.

use std::time::Duration;

use serde::Serialize;

/// The six message-loop stages hooks attach to.
pub const TURN_STAGES: [&str; 6] = [
    "RECEIVE_INPUT",
    "COMPOSE_REQUEST",
    "SEND_REQUEST",
    "STREAM_RESPONSE",
    "TOOL_CALL",
    "RENDER",
];

/// What a hook may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HookKind {
    Guard,
    Transform,
    Observer,
}

impl HookKind {
    pub fn parse(s: &str) -> Option<HookKind> {
        match s {
            "guard" => Some(HookKind::Guard),
            "transform" => Some(HookKind::Transform),
            "observer" => Some(HookKind::Observer),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::Guard => "guard",
            HookKind::Transform => "transform",
            HookKind::Observer => "observer",
        }
    }
}

/// `true` for `<TURN_STAGE>/pre` and `<TURN_STAGE>/post`.
pub fn is_slot(slot: &str) -> bool {
    slot.split_once('/')
        .is_some_and(|(stage, when)| TURN_STAGES.contains(&stage) && matches!(when, "pre" | "post"))
}

/// A hook command declared in `pipeline.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HookDef {
    pub name: String,
    pub at: String,
    pub kind: HookKind,
    /// Run with `sh -c` in the pipeline folder.
    pub command: String,
    #[serde(with = "duration_ms")]
    pub timeout: Duration,
    /// For `TOOL_CALL` slots: only calls of these tools (all when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// Variables passed on from troupe's environment besides the harmless
    /// ones (`env: [NAME]`); a hook gets no other.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

mod duration_ms {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}ms", d.as_millis()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_six_turn_stages_pre_and_post() {
        assert!(is_slot("TOOL_CALL/pre"));
        assert!(is_slot("RENDER/post"));
        assert!(!is_slot("TOOL_CALL"));
        assert!(!is_slot("TOOL_CALL/during"));
        assert!(!is_slot("ACT/pre"));
    }
}
