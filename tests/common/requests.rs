//! Model requests for provider tests: the Echo tool and a `done`
//! completion channel, a system and a user message, a minimal context.

use std::sync::Arc;

use serde_json::json;
use troupe::definition::ToolSpec;
use troupe::provider::{Message, ModelRequest};
use troupe::runtime::context::{SharedContext, StageContext};

/// `Echo` and the completion tool `done`.
pub fn tools() -> Arc<Vec<ToolSpec>> {
    Arc::new(vec![
        troupe::definition::tool_catalog::builtin("Echo").unwrap(),
        ToolSpec {
            name: "done".into(),
            description: "Finish.".into(),
            parameters: json!({"type": "object", "properties": {"summary": {"type": "string"}}}),
        },
    ])
}

/// A request of stage `a` with `messages`.
pub fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        stage_id: "a".into(),
        stage_execution_id: "r/a/1".into(),
        index: None,
        messages: messages.into(),
        tools: tools(),
        completion_tool: "done".into(),
        completion_schema: Arc::new(json!({"type": "object"})),
        ctx: Arc::new(StageContext {
            shared: Arc::new(SharedContext {
                fields: Default::default(),
                upstream: Default::default(),
                results: Default::default(),
                workflow_run_id: "r".into(),
                stage_id: "a".into(),
                stage_name: "a".into(),
            }),
            stage_execution_id: "r/a/1".into(),
            item: None,
            index: None,
        }),
        observer: None,
    }
}

/// A request with a system and a user message.
pub fn hello() -> ModelRequest {
    request(vec![
        Message::System {
            content: "You are a test.".into(),
        },
        Message::User {
            content: "Begin.".into(),
        },
    ])
}
