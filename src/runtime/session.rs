//! The session actor: one per run. It owns the run's identity and the
//! interactor set (started with the interaction hub), starts the
//! scheduler, relays the CLI's messages (start, cancel) and, when the run is
//! over, closes the event bus so the audit log is flushed before it answers.

use actix::prelude::*;
use tokio::sync::oneshot;

use super::audit::Sink;
use super::interaction::start_hub;
use super::scheduler::{CancelRun, LimitReached, RunFinished, RunSpec, Scheduler};
use super::summary::RunReport;

/// Start the run; the report arrives on `reply` when it is over.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StartRun {
    pub reply: oneshot::Sender<RunReport>,
}

/// Cancel the run strictly (first Ctrl-C).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Cancel;

/// One run.
#[derive(Debug)]
pub struct Session {
    spec: RunSpec,
    sinks: Vec<Sink>,
    scheduler: Option<Addr<Scheduler>>,
    reply: Option<oneshot::Sender<RunReport>>,
}

impl Session {
    pub fn new(spec: RunSpec, sinks: Vec<Sink>) -> Session {
        Session {
            spec,
            sinks,
            scheduler: None,
            reply: None,
        }
    }
}

impl Actor for Session {
    type Context = Context<Self>;
}

impl Handler<StartRun> for Session {
    type Result = ();

    fn handle(&mut self, msg: StartRun, ctx: &mut Context<Self>) {
        if self.scheduler.is_some() {
            return;
        }
        self.reply = Some(msg.reply);
        let hub = start_hub(
            &self.spec.interactors,
            self.spec.approval_timeout,
            self.spec.bus.clone(),
        );
        let scheduler =
            Scheduler::new(self.spec.clone(), Some(hub), ctx.address().recipient()).start();
        if let Some(limit) = self.spec.max_run_time {
            let scheduler = scheduler.clone();
            ctx.run_later(limit, move |_act, _ctx| {
                scheduler.do_send(LimitReached {
                    reason: format!(
                        "Session/RunTimeExceeded: the run took longer than {} (--max-run-time)",
                        crate::definition::duration::format_duration(limit)
                    ),
                });
            });
        }
        self.scheduler = Some(scheduler);
    }
}

impl Handler<Cancel> for Session {
    type Result = ();

    fn handle(&mut self, _msg: Cancel, _ctx: &mut Context<Self>) {
        if let Some(s) = &self.scheduler {
            s.do_send(CancelRun);
        }
    }
}

impl Handler<RunFinished> for Session {
    type Result = ();

    fn handle(&mut self, msg: RunFinished, ctx: &mut Context<Self>) {
        let mut report = msg.0;
        // Close the bus and wait for every sink to flush: nothing is lost.
        self.spec.bus.close();
        for sink in self.sinks.drain(..) {
            let path = sink.path.clone();
            if let Err(e) = sink.finish() {
                eprintln!("warning: event sink failed: {e}");
            }
            if path.is_some() {
                report.audit_path = path;
            }
        }
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(report);
        }
        ctx.stop();
    }
}
