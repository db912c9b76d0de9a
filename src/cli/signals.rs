//! The signal watcher of `troupe run`: the first SIGINT (Ctrl-C), SIGTERM
//! or SIGHUP cancels the run strictly; a second one, of any of the three,
//! kills what `Bash` calls still run and exits at once. The exit code
//! names the first signal: 130, 143 or 129 (128 + its number).

use std::io::Write;
use std::sync::{Arc, OnceLock};

use super::Exit;
use crate::tools::process_group::kill_all_groups;

/// A signal that cancels a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelSignal {
    /// SIGINT: Ctrl-C.
    Interrupt,
    /// SIGTERM: a service manager, `kill`, a container stop.
    Terminate,
    /// SIGHUP: the terminal went away.
    HangUp,
}

impl CancelSignal {
    /// The process exit code after this signal cancelled the run.
    pub fn exit(self) -> Exit {
        match self {
            CancelSignal::Interrupt => Exit::Interrupted,
            CancelSignal::Terminate => Exit::Terminated,
            CancelSignal::HangUp => Exit::HungUp,
        }
    }

    fn name(self) -> &'static str {
        match self {
            CancelSignal::Interrupt => "interrupt",
            CancelSignal::Terminate => "SIGTERM",
            CancelSignal::HangUp => "SIGHUP",
        }
    }
}

/// Which signal cancelled the run, if any: set once by the watcher, read
/// after the run to pick the exit code. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct FirstSignal(Arc<OnceLock<CancelSignal>>);

impl FirstSignal {
    pub fn get(&self) -> Option<CancelSignal> {
        self.0.get().copied()
    }

    /// The exit code of a cancelled run: the first signal's, or 130 when
    /// the run was cancelled some other way.
    pub fn exit(&self) -> Exit {
        self.get().map_or(Exit::Interrupted, CancelSignal::exit)
    }
}

/// Watches SIGINT, SIGTERM and SIGHUP on a thread of its own, so a busy or
/// blocked actor thread (say, a stalled `--events` reader) can never
/// swallow them. The watcher ends when this guard is dropped, and then
/// kills any `Bash` process group still alive: nothing a run started
/// outlives it.
#[derive(Debug)]
pub struct Interrupts {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A notice on stderr. Never `eprintln!`: after SIGHUP the terminal may be
/// gone, and a failed write must not panic the watcher before it acts.
fn notice(text: &str) {
    let _ = writeln!(std::io::stderr(), "\n{text}");
}

impl Interrupts {
    /// Returns once the handlers are installed: from then on none of the
    /// three signals is lost to its default action (which would end the
    /// process without the audit log's end). The first signal is recorded
    /// in `first`, a notice says what it does (`doing`, e.g. "cancelling
    /// the run"), then `on_first` runs.
    pub fn watch(
        first: FirstSignal,
        doing: &'static str,
        on_first: impl FnOnce() + Send + 'static,
    ) -> Interrupts {
        use tokio::signal::unix::{SignalKind, signal};
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel::<bool>();
        let thread = std::thread::Builder::new()
            .name("troupe-signals".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .build();
                let Ok(rt) = rt else {
                    let _ = ready_tx.send(false);
                    return;
                };
                rt.block_on(async move {
                    let streams = (
                        signal(SignalKind::interrupt()),
                        signal(SignalKind::terminate()),
                        signal(SignalKind::hangup()),
                    );
                    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = streams else {
                        let _ = ready_tx.send(false);
                        return;
                    };
                    let _ = ready_tx.send(true);
                    let mut on_first = Some(on_first);
                    loop {
                        let received = tokio::select! {
                            _ = &mut stopped => return,
                            s = int.recv() => s.map(|()| CancelSignal::Interrupt),
                            s = term.recv() => s.map(|()| CancelSignal::Terminate),
                            s = hup.recv() => s.map(|()| CancelSignal::HangUp),
                        };
                        let Some(signal) = received else { return };
                        match on_first.take() {
                            Some(cancel) => {
                                let _ = first.0.set(signal);
                                let again = match signal {
                                    CancelSignal::Interrupt => "press Ctrl-C again",
                                    _ => "a second signal",
                                };
                                notice(&format!(
                                    "{}: {doing} ({again} to exit at once)",
                                    signal.name()
                                ));
                                cancel();
                            }
                            None => {
                                notice(&format!("{}: exiting at once", signal.name()));
                                // No destructor runs past this point: kill
                                // the shells' groups here, or they outlive us.
                                kill_all_groups();
                                let exit = first.get().unwrap_or(signal).exit();
                                std::process::exit(i32::from(exit.code()));
                            }
                        }
                    }
                });
            })
            .ok();
        if thread.is_none() || !ready.recv().unwrap_or(false) {
            notice(
                "warning: signal handling is unavailable: Ctrl-C, SIGTERM and SIGHUP end the run without its audit log's end",
            );
        }
        Interrupts {
            stop: Some(stop),
            thread,
        }
    }
}

/// The watcher installed before a run is prepared (its folder and store
/// row made, a resume's log repaired), so that a signal then is not lost
/// to its default action, which left a run folder holding only its lock
/// and no record. A signal before the run starts cancels it as soon as it
/// starts ([`EarlyInterrupts::arm`]): the run is recorded, and ends
/// cancelled at once.
pub struct EarlyInterrupts {
    first: FirstSignal,
    slot: Arc<std::sync::Mutex<Early>>,
    _watch: Interrupts,
}

impl std::fmt::Debug for EarlyInterrupts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyInterrupts")
            .field("first", &self.first)
            .finish_non_exhaustive()
    }
}

enum Early {
    Waiting,
    Requested,
    Armed(Box<dyn FnOnce() + Send>),
}

impl EarlyInterrupts {
    /// Installs the watcher; `doing` says what the first signal does.
    pub fn install(doing: &'static str) -> EarlyInterrupts {
        let first = FirstSignal::default();
        let slot = Arc::new(std::sync::Mutex::new(Early::Waiting));
        let on_first = Arc::clone(&slot);
        let watch = Interrupts::watch(first.clone(), doing, move || {
            let mut slot = on_first.lock().unwrap_or_else(|e| e.into_inner());
            if let Early::Armed(cancel) = std::mem::replace(&mut *slot, Early::Requested) {
                drop(slot);
                cancel();
            }
        });
        EarlyInterrupts {
            first,
            slot,
            _watch: watch,
        }
    }

    /// Which signal came first, if one did.
    pub fn first(&self) -> FirstSignal {
        self.first.clone()
    }

    /// What the first signal does once the run has started: now, if one
    /// came before.
    pub fn arm(&self, cancel: impl FnOnce() + Send + 'static) {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match *slot {
            Early::Requested => {
                drop(slot);
                cancel();
            }
            _ => *slot = Early::Armed(Box::new(cancel)),
        }
    }
}

impl Drop for Interrupts {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // The run is over. A cancelled `Bash` call's group dies when the
        // call's future is dropped, and the run's end does not wait for
        // every tool-call actor to be polled once more: make sure.
        kill_all_groups();
    }
}
