//! Live progress of fan-outs on the terminal: done / running / waiting /
//! failed / cancelled per parallel group, from the scheduler's `Progress`
//! events, and model requests waiting for a provider slot
//! (`--max-inflight`), drawn on stderr. Only started when stderr is a
//! terminal; it is a bus subscriber like any other, and may lag without harm.

use std::io;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use troupe_actors::{Delivery, EventBus};

use crate::runtime::audit::Sink;
use crate::runtime::events::{Event, EventName};

#[derive(Debug, Default)]
struct Counts {
    running: u64,
    waiting: u64,
    done: u64,
    failed: u64,
    cancelled: u64,
    /// Model requests waiting for a slot of the provider's limit.
    provider_waiting: u64,
    /// MCP calls waiting for a slot of their server's `maxInflight`.
    mcp_waiting: usize,
}

impl Counts {
    fn message(&self) -> String {
        let mut m = format!("running {} · waiting {}", self.running, self.waiting);
        if self.failed > 0 {
            m.push_str(&format!(" · failed {}", self.failed));
        }
        if self.cancelled > 0 {
            m.push_str(&format!(" · cancelled {}", self.cancelled));
        }
        if self.provider_waiting > 0 {
            m.push_str(&format!(
                " · {} waiting for the provider",
                self.provider_waiting
            ));
        }
        if self.mcp_waiting > 0 {
            m.push_str(&format!(" · {} MCP calls waiting", self.mcp_waiting));
        }
        m
    }
}

/// Starts the renderer thread; it ends when the bus closes. With the run's
/// MCP servers, it also shows the calls waiting for a server's slot.
pub fn start_progress(
    bus: &EventBus<Event>,
    mcp: Option<std::sync::Arc<crate::tools::mcp::McpPool>>,
) -> io::Result<Sink> {
    let sub = bus.subscribe("terminal", 4096);
    let handle = std::thread::Builder::new()
        .name("troupe-progress".into())
        .spawn(move || {
            let style = ProgressStyle::with_template(
                "{prefix:.bold} [{bar:30}] {pos}/{len} done · {msg} ({elapsed})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            let mut bar: Option<(ProgressBar, Counts)> = None;
            for delivery in sub.iter() {
                let Delivery::Event(env) = delivery else {
                    continue;
                };
                let e = &env.event;
                match e.name {
                    EventName::SessionTurnStart
                        if e.field("execution").as_ref().and_then(|v| v.as_str())
                            == Some("parallel") =>
                    {
                        let width = e
                            .field("width")
                            .as_ref()
                            .and_then(serde_json::Value::as_u64)
                            .unwrap_or(0);
                        let pb = ProgressBar::with_draw_target(
                            Some(width),
                            ProgressDrawTarget::stderr(),
                        );
                        pb.set_style(style.clone());
                        let stages = e.field("stages");
                        let stages: Vec<&str> = stages
                            .as_ref()
                            .and_then(|v| v.as_array())
                            .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
                            .unwrap_or_default();
                        pb.set_prefix(stages.join(", "));
                        bar = Some((
                            pb,
                            Counts {
                                waiting: width,
                                ..Counts::default()
                            },
                        ));
                    }
                    // A request waiting for (or getting) a provider slot.
                    EventName::Progress if e.field("providerSlot").is_some() => {
                        let waiting = e.field("providerSlot").as_ref().and_then(|v| v.as_str())
                            == Some("waiting");
                        if let Some((pb, c)) = &mut bar {
                            if waiting {
                                c.provider_waiting += 1;
                            } else {
                                c.provider_waiting = c.provider_waiting.saturating_sub(1);
                            }
                            pb.set_message(c.message());
                        }
                    }
                    // The scheduler's own counts; a dropped Progress is
                    // corrected by the next one.
                    EventName::Progress => {
                        if let Some((pb, c)) = &mut bar {
                            let n = |k: &str| {
                                e.field(k)
                                    .as_ref()
                                    .and_then(serde_json::Value::as_u64)
                                    .unwrap_or(0)
                            };
                            c.done = n("done");
                            c.running = n("running");
                            c.waiting = n("waiting");
                            c.failed = n("failed");
                            c.cancelled = n("cancelled");
                            c.mcp_waiting = mcp.as_ref().map_or(0, |p| p.waiting());
                            pb.set_position(c.done);
                            pb.set_message(c.message());
                        }
                    }
                    EventName::SessionTurnEnd | EventName::WorkflowExit => {
                        if let Some((pb, c)) = bar.take() {
                            pb.set_message(c.message());
                            pb.abandon();
                        }
                    }
                    _ => {}
                }
            }
            Ok(0)
        })?;
    Ok(Sink::from_thread(handle))
}
