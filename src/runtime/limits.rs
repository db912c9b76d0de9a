//! The run's budget: what it may spend (`--max-tokens`, `--max-cost`).
//! Past it the run is cancelled strictly, like Ctrl-C, but ends as failed
//! with a typed reason (as it does past `--max-run-time`, which the
//! session's timer enforces).
//!
//! The budget is a meter every model request of the run goes through: each
//! response's usage is added as it arrives, and once the total crosses a
//! limit no new request starts (the stage waits for the cancel instead)
//! and the scheduler, woken by the meter, cancels the run. The meter only
//! counts and says "over"; how the run ends is the scheduler's decision.

use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::watch;

use crate::definition::Price;
use crate::error::{Code, ErrorClass, HasCode};
use crate::provider::Usage;

/// Why the budget stopped the run: `Budget/TokensExceeded` or
/// `Budget/CostExceeded`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BudgetExceeded {
    pub code: &'static str,
    pub message: String,
}

impl HasCode for BudgetExceeded {
    fn code(&self) -> Code {
        Code {
            class: ErrorClass::Budget,
            name: self.code,
        }
    }
}

/// Spent against the budget, for the summary and `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetReport {
    pub spent_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// US dollars, when the model's price is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spent_cost: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// The limit that stopped the run (`Budget/...`), if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exceeded: Option<String>,
}

/// Where a budget's limits were set: a flag or a pipeline's key.
#[derive(Debug, Clone, Copy)]
pub struct SetBy {
    pub tokens: &'static str,
    pub cost: &'static str,
}

impl Default for SetBy {
    fn default() -> SetBy {
        SetBy {
            tokens: "--max-tokens",
            cost: "--max-cost",
        }
    }
}

/// An amount of US dollars as the summary and messages show it: cents
/// from a dollar up, and below that as many places as it takes (up to
/// six), so that a limit of $0.001 does not read as $0.00.
pub fn dollars(amount: f64) -> String {
    if amount.abs() >= 1.0 || amount == 0.0 {
        return format!("{amount:.2}");
    }
    let mut text = format!("{amount:.6}");
    while text.ends_with('0') && text.len() > text.find('.').map_or(0, |dot| dot + 3) {
        text.pop();
    }
    text
}

/// The run's token and cost meter. Shared by every execution of a run.
#[derive(Debug)]
pub struct Budget {
    max_tokens: Option<u64>,
    max_cost: Option<f64>,
    price: Option<Price>,
    /// Where each limit was set, as its message names it.
    set_by: SetBy,
    spent: Mutex<Usage>,
    exceeded: watch::Sender<Option<BudgetExceeded>>,
}

impl Budget {
    /// A meter with the given limits. `price` converts tokens to dollars;
    /// a cost limit without a price is refused by the caller (the CLI).
    pub fn new(max_tokens: Option<u64>, max_cost: Option<f64>, price: Option<Price>) -> Budget {
        Budget {
            max_tokens,
            max_cost,
            price,
            set_by: SetBy::default(),
            spent: Mutex::new(Usage::default()),
            exceeded: watch::Sender::new(None),
        }
    }

    /// Whether a new model request may start.
    pub fn allows_request(&self) -> bool {
        self.exceeded.borrow().is_none()
    }

    /// Adds one response's usage; the first response that takes the total
    /// over a limit trips the meter.
    pub fn record(&self, usage: Usage) {
        let total = {
            let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
            spent.add(usage);
            *spent
        };
        if !self.allows_request() {
            return;
        }
        if let Some(over) = self.over(total, "") {
            self.exceeded.send_if_modified(|slot| {
                if slot.is_none() {
                    *slot = Some(over);
                    true
                } else {
                    false
                }
            });
        }
    }

    /// Starts the meter at what a resumed run's earlier sessions used (its
    /// stored executions'), so that a budget bounds the whole run, not
    /// each session. Refused, with the meter untouched and untripped, when
    /// that is already over a limit: nothing should start, and the run
    /// stays resumable with a larger budget.
    pub fn carry_over(&self, earlier: Usage) -> Result<(), BudgetExceeded> {
        self.carry_over_from(earlier, " in its earlier sessions")
    }

    /// [`Budget::carry_over`], saying where `earlier` was spent (`when`
    /// follows the amount in a refusal's message).
    pub fn carry_over_from(&self, earlier: Usage, when: &str) -> Result<(), BudgetExceeded> {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        let mut total = *spent;
        total.add(earlier);
        if let Some(over) = self.over(total, when) {
            return Err(over);
        }
        *spent = total;
        Ok(())
    }

    /// Names where the limits were set (the flags, or the pipeline's
    /// `provider:` block), for the message of the one that trips.
    #[must_use]
    pub fn set_by(mut self, set_by: SetBy) -> Budget {
        self.set_by = set_by;
        self
    }

    /// The limit `total` is over, if any; `when` follows the amount in
    /// the message.
    fn over(&self, total: Usage, when: &str) -> Option<BudgetExceeded> {
        let tokens = total.prompt_tokens.saturating_add(total.completion_tokens);
        match (self.max_tokens, self.cost_of(total), self.max_cost) {
            (Some(max), _, _) if tokens > max => Some(BudgetExceeded {
                code: "TokensExceeded",
                message: format!(
                    "the run used {tokens} tokens{when}, over its budget of {max} ({})",
                    self.set_by.tokens
                ),
            }),
            (_, Some(cost), Some(max)) if cost > max => Some(BudgetExceeded {
                code: "CostExceeded",
                message: format!(
                    "the run spent ${}{when}, over its budget of ${} ({})",
                    dollars(cost),
                    dollars(max),
                    self.set_by.cost
                ),
            }),
            _ => None,
        }
    }

    fn cost_of(&self, usage: Usage) -> Option<f64> {
        self.price
            .map(|p| p.cost(usage.prompt_tokens, usage.completion_tokens))
    }

    /// Why the meter tripped, once it has.
    pub fn exceeded(&self) -> Option<BudgetExceeded> {
        self.exceeded.borrow().clone()
    }

    /// Resolves once the meter trips.
    pub async fn tripped(&self) -> BudgetExceeded {
        let mut rx = self.exceeded.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(over) => over.clone().unwrap_or_else(unreachable_exceeded),
            // The sender lives in `self`, so it cannot be gone while this
            // borrow is alive; answer something typed all the same.
            Err(_) => unreachable_exceeded(),
        }
    }

    /// Spent vs budget so far.
    /// The model's price, when it is known.
    pub fn price(&self) -> Option<Price> {
        self.price
    }

    pub fn report(&self) -> BudgetReport {
        let spent = *self.spent.lock().unwrap_or_else(|e| e.into_inner());
        BudgetReport {
            spent_tokens: spent.prompt_tokens.saturating_add(spent.completion_tokens),
            max_tokens: self.max_tokens,
            spent_cost: self.cost_of(spent),
            max_cost: self.max_cost,
            exceeded: self
                .exceeded
                .borrow()
                .as_ref()
                .map(|e| e.code().to_string()),
        }
    }
}

fn unreachable_exceeded() -> BudgetExceeded {
    BudgetExceeded {
        code: "TokensExceeded",
        message: "the budget meter closed".to_owned(),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn dollars_show_cents_and_below_a_dollar_what_it_takes() {
        for (amount, shown) in [
            (0.0, "0.00"),
            (12.345, "12.35"),
            (1.0, "1.00"),
            (0.5, "0.50"),
            (0.001, "0.001"),
            (0.0015, "0.0015"),
            (0.123_456_7, "0.123457"),
            (0.000_000_1, "0.00"),
        ] {
            assert_eq!(dollars(amount), shown, "{amount}");
        }
        let budget = Budget::new(
            None,
            Some(0.001),
            Some(Price {
                input: 1000.0,
                output: 1000.0,
            }),
        )
        .set_by(SetBy {
            tokens: "--max-tokens",
            cost: "the pipeline's provider.maxCost",
        });
        let over = budget
            .over(
                Usage {
                    prompt_tokens: 2,
                    completion_tokens: 0,
                    requests: 1,
                },
                "",
            )
            .expect("over");
        assert_eq!(
            over.message,
            "the run spent $0.002, over its budget of $0.001 (the pipeline's provider.maxCost)"
        );
    }
    use super::*;

    fn usage(p: u64, c: u64) -> Usage {
        Usage {
            prompt_tokens: p,
            completion_tokens: c,
            requests: 1,
        }
    }

    #[test]
    fn the_response_that_crosses_the_token_budget_trips_the_meter_once() {
        let b = Budget::new(Some(100), None, None);
        b.record(usage(60, 40));
        assert!(b.allows_request(), "exactly at the budget is not over it");
        b.record(usage(1, 0));
        assert!(!b.allows_request());
        let r = b.report();
        assert_eq!(r.spent_tokens, 101);
        assert_eq!(r.exceeded.as_deref(), Some("Budget/TokensExceeded"));
        b.record(usage(500, 0));
        assert_eq!(b.report().spent_tokens, 601, "later usage still counts");
    }

    #[test]
    fn cost_is_priced_per_million_tokens_in_and_out() {
        let price = Price {
            input: 1.0,
            output: 4.0,
        };
        let b = Budget::new(None, Some(0.01), Some(price));
        b.record(usage(2_000, 1_000));
        assert!(b.allows_request());
        assert_eq!(b.report().spent_cost, Some(0.006));
        b.record(usage(2_000, 1_000));
        assert!(!b.allows_request());
        assert_eq!(b.report().exceeded.as_deref(), Some("Budget/CostExceeded"));
    }

    #[test]
    fn a_resumed_run_carries_its_earlier_usage_and_is_refused_when_it_is_over() {
        let b = Budget::new(Some(100), None, None);
        b.carry_over(usage(50, 30)).expect("80 of 100 is within");
        assert!(b.allows_request());
        assert_eq!(b.report().spent_tokens, 80);
        b.record(usage(15, 10));
        assert_eq!(
            b.report().exceeded.as_deref(),
            Some("Budget/TokensExceeded")
        );

        let b = Budget::new(Some(100), None, None);
        let over = b.carry_over(usage(90, 20)).expect_err("110 is over 100");
        assert_eq!(over.code, "TokensExceeded");
        assert!(
            over.message.contains("110 tokens in its earlier sessions"),
            "{}",
            over.message
        );
        assert!(b.allows_request(), "the refusal leaves the meter untripped");
        assert_eq!(b.report().spent_tokens, 0, "and unchanged");

        let price = Price {
            input: 1.0,
            output: 1.0,
        };
        let b = Budget::new(None, Some(0.001), Some(price));
        let over = b
            .carry_over(usage(1_000, 1_000))
            .expect_err("$0.002 is over $0.001");
        assert_eq!(over.code, "CostExceeded");
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_the_meter_trips() {
        let b = std::sync::Arc::new(Budget::new(Some(10), None, None));
        let waiter = tokio::spawn({
            let b = std::sync::Arc::clone(&b);
            async move { b.tripped().await }
        });
        tokio::task::yield_now().await;
        b.record(usage(20, 0));
        let over = waiter.await.expect("the waiter ends");
        assert_eq!(over.code, "TokensExceeded");
    }
}
