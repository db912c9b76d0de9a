//! One provider request of a turn, with its transient retries: audited
//! try by try, counted in the execution's usage and the run's budget, and
//! never started once the budget is spent.

use std::cell::RefCell;
use std::rc::Rc;

use super::run::StageRun;
use super::whereabouts::Whereabouts;
use crate::error::HasCode;
use crate::provider::{ModelRequest, ModelResponse, ProviderError, Usage};
use crate::runtime::events::EventName;

impl StageRun {
    /// A transient failure not tried again because the server asked for a
    /// longer wait than troupe waits: said so, not only as the server's
    /// message (a 429 that reads like any other).
    fn not_waited_for(&self, err: ProviderError, retry: u32) -> ProviderError {
        let max = self.kit.settings.provider_max_wait;
        match err {
            ProviderError::Transient {
                code,
                message,
                retry_after: Some(after),
                usage,
            } if after > max && retry < self.kit.settings.provider_retries => {
                ProviderError::Transient {
                    code,
                    message: format!(
                        "{message} (the server asked to wait {}, longer than the {} troupe waits before a retry)",
                        crate::definition::duration::format_duration(after),
                        crate::definition::duration::format_duration(max)
                    ),
                    retry_after: Some(after),
                    usage,
                }
            }
            other => other,
        }
    }

    /// One provider request with transient retries, audited. Every try
    /// counts as a request in `usage`, a failed one too; no try starts
    /// once the run's budget is spent.
    pub(super) async fn request(
        &self,
        request: ModelRequest,
        turn: u32,
        usage: &mut Usage,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> Result<ModelResponse, ProviderError> {
        let mut retry = 0u32;
        loop {
            if let Some(budget) = &self.kit.settings.budget
                && !budget.allows_request()
            {
                // The scheduler is cancelling the run: no new request
                // starts, and this execution waits to be dropped.
                self.cancel.token().cancelled().await;
                std::future::pending::<()>().await;
            }
            self.emit(
                self.event(EventName::ProviderRequestStarted)
                    .with_static("provider", self.kit.provider.name())
                    .with("turn", turn)
                    .with("try", retry + 1),
            );
            // A provider reports tokens and slot waits on the bus as they
            // come, inside this poll when it answers at once: after this.
            // Under a budget the try is in the log as soon as it passed
            // the meter, as before polls were published together: a try
            // that another thread's answer trips the meter for is then
            // never recorded after the run's cancellation.
            if request.observer.is_some() || self.kit.settings.budget.is_some() {
                self.flush();
            }
            {
                let mut w = whereabouts.borrow_mut();
                w.usage.requests = w.usage.requests.saturating_add(1);
                w.requesting = Some(turn);
            }
            let outcome = self.kit.provider.complete(request.clone()).await;
            whereabouts.borrow_mut().requesting = None;
            for notice in self.kit.provider.take_notices() {
                self.emit(
                    self.event(EventName::ProviderNotice)
                        .with_static("provider", self.kit.provider.name())
                        .with_static("code", notice.code)
                        .with("message", notice.message),
                );
            }
            // A failed try is one request, and what the server said it
            // used before it failed (it bills that).
            let spent = match &outcome {
                Ok(response) => response.usage,
                Err(err) => Usage {
                    requests: 1,
                    ..err.usage().unwrap_or_default()
                },
            };
            usage.add(spent);
            // Its request was counted as it was sent.
            whereabouts.borrow_mut().usage.add(Usage {
                requests: 0,
                ..spent
            });
            if let Some(budget) = &self.kit.settings.budget {
                // Tripped, the meter wakes the scheduler, which records
                // the run's cancellation on its thread: after this try.
                self.flush();
                budget.record(spent);
            }
            match outcome {
                Ok(response) => {
                    let mut completed = self
                        .event(EventName::ProviderRequestCompleted)
                        .with("turn", turn)
                        .with("toolCalls", response.tool_calls.len())
                        .with("usage", response.usage);
                    // Said when the model was cut short (`length`), which
                    // otherwise reads as a model that answered badly.
                    if let Some(reason) =
                        response.finish_reason.as_deref().filter(|r| *r == "length")
                    {
                        completed = completed.with("finishReason", reason.to_owned());
                    }
                    self.emit(completed);
                    // Under a budget, in the log as soon as the meter has
                    // counted it, as the scheduler may be stopping the run
                    // for it: completions read in the meter's order.
                    if self.kit.settings.budget.is_some() {
                        self.flush();
                    }
                    return Ok(response);
                }
                Err(err) => {
                    let wait = match &err {
                        ProviderError::Transient { retry_after, .. }
                            if retry < self.kit.settings.provider_retries =>
                        {
                            self.kit.settings.retry_wait(retry + 1, *retry_after)
                        }
                        _ => None,
                    };
                    let mut failed = self
                        .event(EventName::ProviderRequestFailed)
                        .with("turn", turn)
                        .with("code", err.code().to_string())
                        .with("message", err.to_string())
                        .with("retrying", wait.is_some());
                    if let ProviderError::Transient {
                        retry_after: Some(after),
                        ..
                    } = &err
                    {
                        failed = failed.with("retryAfterMs", after.as_millis() as u64);
                    }
                    if let Some(wait) = wait {
                        failed = failed.with("waitMs", wait.as_millis() as u64);
                    }
                    if let Some(billed) = err.usage() {
                        failed = failed.with("usage", billed);
                    }
                    self.emit(failed);
                    let Some(wait) = wait else {
                        return Err(self.not_waited_for(err, retry));
                    };
                    retry += 1;
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    }
}
