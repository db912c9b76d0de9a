//! A stage-local transcript: the messages of one stage execution. It never
//! crosses a stage boundary.

use std::sync::Arc;

use serde::Serialize;

use crate::provider::Message;

/// The ordered messages of a stage execution. Shared copy-on-write with
/// the request in flight: a turn's request carries the transcript without
/// copying it, and the next push copies only if that request is still alive.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Transcript {
    messages: Arc<Vec<Message>>,
}

impl Transcript {
    pub fn new(system_prompt: String) -> Transcript {
        // Room for a short stage's whole conversation (the prompt, the
        // kickoff, two turns and a tool result is five): grown one
        // message at a time from one, it was reallocated twice.
        let mut messages = Vec::with_capacity(8);
        messages.push(Message::System {
            content: system_prompt,
        });
        Transcript {
            messages: Arc::new(messages),
        }
    }

    pub fn push(&mut self, message: Message) {
        Arc::make_mut(&mut self.messages).push(message);
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The messages as they are now, shared (for a model request).
    pub fn shared(&self) -> Arc<Vec<Message>> {
        Arc::clone(&self.messages)
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}
