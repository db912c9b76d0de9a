//! The session actor: one per run. It starts the interaction hub (with the
//! run's interactors), the run's arbiters and the scheduler, relays what
//! its owner tells it ([`ToSession`]: start, cancel), enforces
//! `--max-run-time`, ends the run as `Session/AuditLost` when the audit log
//! cannot be written, and when the run is over closes the event bus so
//! every sink (the audit log first) is flushed before it answers.

use actix::prelude::*;
use tokio::sync::oneshot;

use super::audit::{AUDIT_LOST, Sink};
use super::interaction::start_hub;
use super::scheduler::{RunFinished, Scheduler, ToScheduler};
use super::spec::RunSpec;
use super::summary::{RunReport, RunStatus};

/// What the session is told by its owner (the CLI, a test, a library
/// user).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum ToSession {
    /// Start the run; the report arrives on `reply` when it is over.
    Start { reply: oneshot::Sender<RunReport> },
    /// Cancel the run strictly (the first Ctrl-C or signal).
    Cancel,
}

/// One run.
#[derive(Debug)]
pub struct Session {
    /// Until the run is over; then it goes with the sinks (see
    /// `RunFinished`).
    spec: Option<RunSpec>,
    sinks: Vec<Sink>,
    scheduler: Option<Addr<Scheduler>>,
    reply: Option<oneshot::Sender<RunReport>>,
}

impl Session {
    pub fn new(spec: RunSpec, sinks: Vec<Sink>) -> Session {
        Session {
            spec: Some(spec),
            sinks,
            scheduler: None,
            reply: None,
        }
    }

    fn start(&mut self, reply: oneshot::Sender<RunReport>, ctx: &mut Context<Self>) {
        let (None, Some(spec)) = (&self.scheduler, &self.spec) else {
            return;
        };
        self.reply = Some(reply);
        let hub = start_hub(&spec.interactors, spec.approval_timeout, spec.bus.clone());
        // Stage executions spread over one arbiter per thread; with one
        // thread they share the session's (deterministic, paused-time
        // tests run that way).
        let threads = spec.settings.threads;
        let arbiters = if threads > 1 {
            (0..threads).map(|_| Arbiter::new().handle()).collect()
        } else {
            Vec::new()
        };
        let scheduler =
            Scheduler::new(spec.clone(), Some(hub), ctx.address().recipient(), arbiters).start();
        if let Some(limit) = spec.max_run_time {
            let scheduler = scheduler.clone();
            ctx.run_later(limit, move |_act, _ctx| {
                scheduler.do_send(ToScheduler::LimitReached {
                    reason: format!(
                        "Session/RunTimeExceeded: the run took longer than {} (--max-run-time)",
                        crate::definition::duration::format_duration(limit)
                    ),
                });
            });
        }
        // A run that can no longer be recorded stops: it ends failed, as
        // when a limit is reached, with the writer's account of what was
        // lost. A sink that ends normally drops its notice unsent.
        let notices: Vec<_> = self
            .sinks
            .iter_mut()
            .filter_map(Sink::take_failure_notice)
            .collect();
        for notice in notices {
            let scheduler = scheduler.clone();
            ctx.spawn(
                async move {
                    if let Ok(reason) = notice.await {
                        scheduler.do_send(ToScheduler::LimitReached { reason });
                    }
                }
                .into_actor(self),
            );
        }
        self.scheduler = Some(scheduler);
    }
}

impl Actor for Session {
    type Context = Context<Self>;
}

impl Handler<ToSession> for Session {
    type Result = ();

    fn handle(&mut self, msg: ToSession, ctx: &mut Context<Self>) {
        match msg {
            ToSession::Start { reply } => self.start(reply, ctx),
            ToSession::Cancel => {
                if let Some(s) = &self.scheduler {
                    s.do_send(ToScheduler::CancelRun);
                }
            }
        }
    }
}

impl Handler<RunFinished> for Session {
    type Result = ();

    /// Closes the bus and, off this thread, waits for every sink to flush
    /// (nothing is lost) before it answers. The sinks' threads may take
    /// seconds to end (a span exporter gives a slow collector two), and
    /// this thread may be one many runs share (`troupe serve` hosts every
    /// run's session and scheduler on one): joined here, every other run
    /// would stand still meanwhile. The run's spec goes with them, so
    /// that what its settings' last drop does (an MCP pool lets its
    /// servers read their last messages) is not done here either, when
    /// this copy is the last (the scheduler's usually went as it stopped
    /// after reporting the end).
    fn handle(&mut self, msg: RunFinished, ctx: &mut Context<Self>) {
        let spec = self.spec.take();
        if let Some(spec) = &spec {
            spec.bus.close();
        }
        let sinks = std::mem::take(&mut self.sinks);
        let reply = self.reply.take();
        let report = msg.0;
        let finish = move || {
            let report = finished(report, sinks);
            if let Some(reply) = reply {
                let _ = reply.send(report);
            }
            drop(spec);
        };
        // On the runtime's blocking pool, which (unlike a thread of our
        // own) a paused test clock waits for rather than jumping ahead.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(finish)),
            // No runtime (never, under actix): here, as before.
            Err(_) => finish(),
        }
        ctx.stop();
    }
}

/// The report once every sink has flushed. The audit log is the run's
/// record: a run that lost part of it (the last flush failed, after the
/// run's end) has failed, whatever its stages did.
fn finished(mut report: RunReport, sinks: Vec<Sink>) -> RunReport {
    for sink in sinks {
        let path = sink.path.clone();
        match (sink.finish(), &path) {
            (Ok(_), _) => {}
            (Err(e), Some(path)) => {
                let reason = format!("{AUDIT_LOST}: the audit log {}: {e}", path.display());
                if matches!(report.status, RunStatus::Ok) {
                    report.status = RunStatus::Failed {
                        reason: reason.clone(),
                    };
                }
                report.warnings.push(reason);
            }
            (Err(e), None) => report.warnings.push(format!("an event sink failed: {e}")),
        }
        if path.is_some() {
            report.audit_path = path;
        }
    }
    report
}
