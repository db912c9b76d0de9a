//! The limit flags of `troupe run` (`--max-run-time`, `--max-tokens`,
//! `--max-cost`, `--price`) and how they combine with the pipeline's
//! `provider:` block into the run's budget.

use std::sync::Arc;
use std::time::Duration;

use crate::definition::duration::parse_positive_duration;
use crate::definition::{Pipeline, Price};
use crate::provider::Usage;
use crate::runtime::limits::{Budget, BudgetExceeded, SetBy};

/// `troupe run`'s limits.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Cancel the run strictly (like Ctrl-C) once it has run this long,
    /// e.g. 30m; it then fails with Session/RunTimeExceeded (exit 1).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub max_run_time: Option<Duration>,
    /// The run's budget in tokens (prompt + completion, all model requests).
    /// When a response takes the total over it, no new request starts and
    /// the run is cancelled strictly: Budget/TokensExceeded (exit 1).
    /// A resumed run counts what its earlier sessions used (a resume
    /// already over it is refused, exit 2). Beats `provider.maxTokens` in
    /// pipeline.yaml.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokens: Option<u64>,
    /// The run's budget in US dollars, priced by --price or the pipeline's
    /// `provider.prices` for the run's model: Budget/CostExceeded (exit 1).
    /// Beats `provider.maxCost`.
    #[arg(long, value_name = "USD", value_parser = parse_dollars)]
    pub max_cost: Option<f64>,
    /// The model's price in US dollars per million input and output
    /// tokens, e.g. 0.15,0.60. Beats `provider.prices.<model>`.
    #[arg(long, value_name = "IN,OUT", value_parser = parse_price)]
    pub price: Option<Price>,
}

impl LimitArgs {
    /// The token limit, the cost limit and the price for `model` (when
    /// known): the flags over the pipeline's `provider:` block.
    fn limits(
        &self,
        pipeline: &Pipeline,
        model: Option<&str>,
    ) -> (Option<u64>, Option<f64>, Option<Price>) {
        let file = pipeline.provider.as_ref();
        let max_tokens = self.max_tokens.or(file.and_then(|f| f.max_tokens));
        let max_cost = self.max_cost.or(file.and_then(|f| f.max_cost));
        let price = self
            .price
            .or_else(|| model.and_then(|m| file.and_then(|f| f.prices.get(m).copied())));
        (max_tokens, max_cost, price)
    }

    /// The run's budget for `model` (flags over the pipeline's block), or
    /// `None` when neither sets a limit nor a price. Errors are messages for
    /// `Validation/InputInvalid`.
    pub fn budget(&self, pipeline: &Pipeline, model: &str) -> Result<Option<Arc<Budget>>, String> {
        let (max_tokens, max_cost, price) = self.limits(pipeline, Some(model));
        if max_cost.is_some() && price.is_none() {
            let prices = pipeline.provider.as_ref().map(|f| &f.prices);
            let known = match prices.filter(|p| !p.is_empty()) {
                None => String::new(),
                Some(p) => format!(
                    " (provider.prices has {})",
                    p.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            };
            return Err(format!(
                "--max-cost needs the price of model `{model}`{known}: pass --price IN,OUT or add `provider.prices.{model}: {{input: …, output: …}}` (US dollars per million tokens)"
            ));
        }
        // A price alone meters the run's cost (the summary, the metrics)
        // without limiting it.
        if max_tokens.is_none() && max_cost.is_none() && price.is_none() {
            return Ok(None);
        }
        let set_by = SetBy {
            tokens: if self.max_tokens.is_some() {
                "--max-tokens"
            } else {
                "the pipeline's provider.maxTokens"
            },
            cost: if self.max_cost.is_some() {
                "--max-cost"
            } else {
                "the pipeline's provider.maxCost"
            },
        };
        Ok(Some(Arc::new(
            Budget::new(max_tokens, max_cost, price).set_by(set_by),
        )))
    }

    /// Why a resumed run whose earlier sessions used `spent` is already
    /// over the budget that can be told before its provider is asked
    /// anything: the token limit, and the cost limit when the price is
    /// known (`--price`, or `model`'s in the pipeline). The whole budget
    /// is checked again once the capability check has settled the model.
    pub fn already_over(
        &self,
        pipeline: &Pipeline,
        model: Option<&str>,
        spent: Usage,
    ) -> Option<BudgetExceeded> {
        self.already_over_from(pipeline, model, spent, " in its earlier sessions")
    }

    /// [`LimitArgs::already_over`], saying where `spent` was spent.
    pub fn already_over_from(
        &self,
        pipeline: &Pipeline,
        model: Option<&str>,
        spent: Usage,
        when: &str,
    ) -> Option<BudgetExceeded> {
        let (max_tokens, max_cost, price) = self.limits(pipeline, model);
        Budget::new(max_tokens, price.and(max_cost), price)
            .carry_over_from(spent, when)
            .err()
    }
}

/// A non-negative number of US dollars; a leading `$` is accepted.
fn parse_dollars(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_prefix('$').unwrap_or(t);
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not an amount of US dollars (e.g. 2.50)")),
    }
}

/// `IN,OUT` dollars per million tokens.
fn parse_price(s: &str) -> Result<Price, String> {
    let (input, output) = s
        .split_once(',')
        .ok_or_else(|| format!("`{s}`: expected IN,OUT (US dollars per million input and output tokens), e.g. 0.15,0.60"))?;
    Ok(Price {
        input: parse_dollars(input)?,
        output: parse_dollars(output)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_and_amounts_parse_or_say_what_is_expected() {
        assert_eq!(
            parse_price("0.15,$0.60"),
            Ok(Price {
                input: 0.15,
                output: 0.60
            })
        );
        assert!(parse_price("0.15").unwrap_err().contains("IN,OUT"));
        assert!(parse_dollars("-1").is_err());
        assert!(parse_dollars("NaN").is_err());
        assert_eq!(parse_dollars("$2.5"), Ok(2.5));
    }
}
