//! Elicitation: an MCP server asking the user for input in the middle of a
//! call (`elicitation/create`, a form of primitive fields). The pool hands
//! the request to the run's [`Elicitor`] (the runtime's, which asks the
//! run's interactors); with none, or none that can answer, it is declined.

use std::sync::{Arc, PoisonError, RwLock};

use futures::future::BoxFuture;
use serde_json::Value;

/// A server's question.
#[derive(Debug, Clone, PartialEq)]
pub struct ElicitRequest {
    pub server: String,
    pub message: String,
    /// The requested schema: an object of primitive properties.
    pub schema: Value,
}

/// The user's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ElicitAnswer {
    /// The content, which the server checks against its schema.
    Accept(Value),
    Decline,
    Cancel,
}

/// Who answers a run's elicitations.
pub trait Elicitor: Send + Sync + std::fmt::Debug {
    fn elicit(&self, request: ElicitRequest) -> BoxFuture<'static, ElicitAnswer>;
}

/// Where a pool's connections find the run's elicitor, set once the run's
/// interactors exist (after the servers started), and again by each run
/// that uses the same pool (a chat's turns share one).
#[derive(Debug, Default)]
pub struct ElicitorSlot(RwLock<Option<Arc<dyn Elicitor>>>);

impl ElicitorSlot {
    pub fn set(&self, elicitor: Arc<dyn Elicitor>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(elicitor);
    }

    pub fn get(&self) -> Option<Arc<dyn Elicitor>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
