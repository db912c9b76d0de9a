//! The terminal's approval prompt: asks on stderr, reads `y`/`n` from
//! stdin. The runtime's terminal interactor calls it on a thread of its
//! own.
//!
//! Every line of the terminal is read by one thread ([`read_line`]) for
//! whoever asks next: a prompt, a form, `troupe chat`'s next message. A
//! prompt withdrawn while it waits (its call decided elsewhere, its turn
//! cancelled) stops waiting, so the next line goes to the next asker. Read
//! on the prompt's own thread, that line went to the prompt no one waited
//! on any more, and the chat's next message was lost.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::runtime::interaction::{Answer, FormView, PromptView, Prompter, Wanted};

/// A line of the terminal, or why it could not be read.
pub type Line = Result<String, String>;

/// The terminal's lines: read by a thread of their own (for the process's
/// life: it ends at the end of input), taken by whoever asks next. Each
/// comes with when it was read (when its Enter was pressed): an approval
/// takes only a line typed after it was shown.
struct Input {
    lines: Receiver<(Instant, Line)>,
    /// Lines taken by an asker no longer wanted when they came, or typed
    /// before an approval that passed them over: the next asker's first.
    back: Mutex<VecDeque<(Instant, Line)>>,
}

impl Input {
    /// Lines `next` reads (into the buffer it is given, with when it was
    /// read; `None` at the end), on a thread of their own.
    fn start(
        mut next: impl FnMut(&mut String) -> std::io::Result<Option<Instant>> + Send + 'static,
    ) -> Input {
        let (tx, lines) = crossbeam_channel::unbounded();
        let _ = std::thread::Builder::new()
            .name("troupe-stdin".into())
            .spawn(move || {
                loop {
                    let mut line = String::new();
                    match next(&mut line) {
                        Ok(None) => return,
                        Ok(Some(at)) => {
                            if tx.send((at, Ok(line))).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send((Instant::now(), Err(e.to_string())));
                            return;
                        }
                    }
                }
            });
        Input {
            lines,
            back: Mutex::new(VecDeque::new()),
        }
    }

    /// Lines taken by an asker no longer wanted, the oldest first.
    fn back(&self) -> std::sync::MutexGuard<'_, VecDeque<(Instant, Line)>> {
        self.back
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next line, for as long as `wanted` says it is wanted.
    #[cfg(test)]
    fn read(&self, wanted: impl Fn() -> bool) -> Option<Line> {
        self.read_since(wanted, None)
    }

    /// [`Input::read`], taking only a line read at `since` or later when
    /// given: older ones stay for the next asker. A line typed for a
    /// prompt that was decided elsewhere meanwhile must not answer the
    /// next prompt shown (a `y` meant for one call approving another).
    fn read_since(&self, wanted: impl Fn() -> bool, since: Option<Instant>) -> Option<Line> {
        let fresh = |at: &Instant| since.is_none_or(|s| *at >= s);
        loop {
            if !wanted() {
                return None;
            }
            {
                let mut back = self.back();
                if let Some(i) = back.iter().position(|(at, _)| fresh(at)) {
                    return back.remove(i).map(|(_, line)| line);
                }
            }
            match self.lines.recv_timeout(LOOK) {
                Ok((at, line)) if wanted() && fresh(&at) => return Some(line),
                Ok((at, line)) if wanted() => {
                    // Typed before this asker was shown: the next one's.
                    self.back().push_back((at, line));
                }
                Ok(item) => {
                    // Came as the asker stopped waiting: the next one's.
                    self.back().push_back(item);
                    return None;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}

/// How often a waiting asker looks whether it is still wanted.
const LOOK: Duration = Duration::from_millis(50);

/// The terminal's next line, for as long as `wanted` says it is wanted:
/// `None` at the end of input, or once it is not.
pub fn read_line(wanted: impl Fn() -> bool) -> Option<Line> {
    read_line_since(wanted, None)
}

/// [`read_line`], taking only a line typed at `since` or later when given.
fn read_line_since(wanted: impl Fn() -> bool, since: Option<Instant>) -> Option<Line> {
    stdin_lines().read_since(wanted, since)
}

/// The terminal's lines, their reader started on first use.
fn stdin_lines() -> &'static Input {
    static STDIN: OnceLock<Input> = OnceLock::new();
    // Bytes that are not UTF-8 (a Latin-1 paste, a terminal set to
    // another encoding) are replaced, not the end of input: a line that
    // failed to decode used to end the chat there, and every line after it
    // went unread.
    STDIN.get_or_init(|| {
        let mut reader = StdinReader::default();
        Input::start(move |line| reader.next_line(line))
    })
}

/// Held by the reader while it takes what has arrived and stamps it, and
/// by a prompt while it sets the moment it was shown ([`shown_now`]): a
/// line is stamped before that moment or after it, never read before and
/// stamped after (a reader slowed between its read and its stamp made a
/// `y` typed ahead of the prompt pass as typed after it, and approve).
static GATE: Mutex<()> = Mutex::new(());

/// The moment a prompt or form is shown, for [`Input::read_since`]: what
/// the terminal holds typed and not yet read is dropped, as typed before
/// it (`tcflush`), and everything read so far is stamped before it.
fn shown_now() -> Instant {
    let _gate = GATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let stdin = std::io::stdin();
    if std::io::IsTerminal::is_terminal(&stdin) {
        let _ = nix::sys::termios::tcflush(&stdin, nix::sys::termios::FlushArg::TCIFLUSH);
    }
    Instant::now()
}

/// Reads stdin's lines by hand: `poll` for input, then, under [`GATE`],
/// read what arrived and stamp it. Bytes that are not UTF-8 (a Latin-1
/// paste, a terminal set to another encoding) are replaced, not the end
/// of input: a line that failed to decode used to end the chat there.
#[derive(Default)]
struct StdinReader {
    /// Bytes read and not yet a whole line.
    carry: Vec<u8>,
    /// When the last bytes were read.
    at: Option<Instant>,
    ended: bool,
}

impl StdinReader {
    fn next_line(&mut self, line: &mut String) -> std::io::Result<Option<Instant>> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let stdin = std::io::stdin();
        let mut buf = [0u8; 8192];
        loop {
            let at = self.at.unwrap_or_else(Instant::now);
            if let Some(end) = self.carry.iter().position(|b| *b == b'\n') {
                let rest = self.carry.split_off(end + 1);
                let whole = std::mem::replace(&mut self.carry, rest);
                line.push_str(&String::from_utf8_lossy(&whole));
                return Ok(Some(at));
            }
            if self.ended {
                if self.carry.is_empty() {
                    return Ok(None);
                }
                line.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.carry)));
                return Ok(Some(at));
            }
            let readable = |timeout: PollTimeout| {
                let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, timeout) {
                    Ok(n) => Ok(n > 0),
                    Err(nix::errno::Errno::EINTR) => Ok(false),
                    Err(e) => Err(std::io::Error::from(e)),
                }
            };
            if !readable(PollTimeout::NONE)? {
                continue;
            }
            let _gate = GATE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Looked at again under the gate: a prompt may have dropped
            // what was there meanwhile, and a read now would wait.
            if !readable(PollTimeout::ZERO)? {
                continue;
            }
            match nix::unistd::read(&stdin, &mut buf) {
                Ok(0) => self.ended = true,
                Ok(n) => self.carry.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(std::io::Error::from(e)),
            }
            self.at = Some(Instant::now());
        }
    }
}

/// One question on the terminal at a time: an approval and a server's form
/// may be asked from two threads, and must not read the same lines.
static TERMINAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Prompts on stderr and reads `y`/`n` from stdin. The terminal's reader
/// starts with the first prompt, not with the prompter: a reader running
/// all along would take the lines typed for the shell during the run, and
/// stop a run in the background (`SIGTTIN`). A line typed ahead of a
/// prompt is dropped when it is shown ([`shown_now`]), so starting late
/// lets none pass as typed after it.
#[derive(Debug, Default)]
pub struct StdinPrompter {
    /// The prompt being shown: withdrawn, it stops reading.
    showing: Mutex<Option<Wanted>>,
}

impl Prompter for StdinPrompter {
    fn ask(&self, view: &PromptView) -> Option<Answer> {
        use std::io::Write;
        let _turn = TERMINAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Only a line typed after this prompt was shown answers it. Marked
        // before it is printed: a person who answers as soon as it shows
        // must not have the answer taken for typed ahead (and dropped).
        let shown_at = shown_now();
        let queued = if view.waiting > 0 {
            format!(" ({} more waiting)", view.waiting)
        } else {
            String::new()
        };
        // Write and release stderr before waiting on stdin: holding its
        // lock while a person thinks would block every other writer
        // (the withdrawal notice, the runtime's own messages).
        {
            let mut err = std::io::stderr().lock();
            // The call's arguments are the model's: shown, not obeyed.
            let shown = format!(
                "\napproval{queued}: stage `{}` ({}) wants to run {} {}\n  allow this one call? [y/N, a = this and every call with the same arguments this run{}] ",
                view.stage_id,
                view.stage_execution_id,
                view.tool,
                view.args_summary,
                if view.tool == "Bash" {
                    ", p = every Bash command of this run that runs the same program and chains nothing"
                } else {
                    ""
                }
            );
            // A shortened summary hides the rest of the call: the whole
            // arguments go first, so what is approved is what was seen.
            if view.args_summary.ends_with('…') {
                let whole = serde_json::from_str::<serde_json::Value>(&view.args_json)
                    .and_then(|v| serde_json::to_string_pretty(&v))
                    .unwrap_or_else(|_| view.args_json.to_string());
                let _ = write!(
                    err,
                    "\nthe whole arguments of the call below:\n{}",
                    super::output::terminal_safe(&whole)
                );
            }
            let _ = write!(err, "{}", super::output::terminal_safe(&shown));
            let _ = err.flush();
        }
        let wanted = Wanted::default();
        *self
            .showing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(wanted.clone());
        let line = read_line_since(|| wanted.still(), Some(shown_at));
        match line {
            None | Some(Err(_)) => None,
            Some(Ok(line)) => match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => Some(Answer::Approve),
                "a" | "all" => Some(Answer::ApproveSame),
                "p" | "prefix" if view.tool == "Bash" => Some(Answer::ApprovePrefix),
                _ => Some(Answer::Deny),
            },
        }
    }

    /// Asks each field of the form on its own line; an empty line skips an
    /// optional field, `-` alone declines the whole form.
    fn fill(&self, form: &FormView) -> Option<serde_json::Value> {
        use serde_json::Value;
        use std::io::Write;
        let _turn = TERMINAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let required: Vec<&str> = form.schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // Only lines typed after the form was shown answer it: not one
        // typed for an approval withdrawn meanwhile, which the person
        // meant for that call (a `y` would answer a yes-or-no field they
        // never saw). Marked before it is printed, as a prompt is.
        let shown_at = shown_now();
        // The server's words, shown, not obeyed.
        let safe = |text: &str| super::output::terminal_safe(text).into_owned();
        say!(
            "\n{} asks: {}\n  (answer each field; `-` declines)",
            safe(&form.asker),
            safe(&form.message)
        );
        let mut content = serde_json::Map::new();
        let empty = serde_json::Map::new();
        let fields = form.schema["properties"].as_object().unwrap_or(&empty);
        for (name, field) in fields {
            let kind = field["type"].as_str().unwrap_or("string");
            let about = field["description"].as_str().unwrap_or("");
            let need = if required.contains(&name.as_str()) {
                ""
            } else {
                ", optional"
            };
            loop {
                {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(
                        err,
                        "  {} ({}{need}) {}: ",
                        safe(name),
                        safe(kind),
                        safe(about)
                    );
                    let _ = err.flush();
                }
                let Some(Ok(line)) = read_line_since(|| form.wanted.still(), Some(shown_at)) else {
                    return None;
                };
                let text = line.trim();
                if text == "-" {
                    return None;
                }
                if text.is_empty() && need.is_empty() {
                    say!("  {name} is required");
                    continue;
                }
                if text.is_empty() {
                    break;
                }
                let value = match kind {
                    "integer" => text.parse::<i64>().ok().map(Value::from),
                    "number" => text.parse::<f64>().ok().map(Value::from),
                    "boolean" => match text {
                        "y" | "yes" | "true" => Some(Value::Bool(true)),
                        "n" | "no" | "false" => Some(Value::Bool(false)),
                        _ => None,
                    },
                    _ => Some(Value::String(text.to_owned())),
                };
                match value {
                    Some(v) => {
                        content.insert(name.clone(), v);
                        break;
                    }
                    None => say!("  not a {kind}; try again"),
                }
            }
        }
        Some(Value::Object(content))
    }

    fn withdrawn(&self, view: &PromptView) {
        // Called for the prompt being shown: it stops reading.
        if let Some(wanted) = self
            .showing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            wanted.drop_it();
        }
        say!(
            "\n(no longer needed: the {} call of stage `{}` was decided or its stage ended; an answer will be ignored)",
            view.tool,
            view.stage_id
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Input that gives `lines` one at a time once the gate's sender is
    /// dropped (typed only then), and the number of lines it has handed
    /// on so far each time it is asked for the next (so the n-th notice
    /// says n lines wait in the channel).
    fn input(
        lines: &[&str],
        gate: crossbeam_channel::Receiver<()>,
    ) -> (Input, crossbeam_channel::Receiver<usize>) {
        let mut lines: VecDeque<String> = lines.iter().map(|l| format!("{l}\n")).collect();
        let (notice, handed) = crossbeam_channel::unbounded();
        let mut sent = 0;
        let input = Input::start(move |buf| {
            let _ = notice.send(sent);
            sent += 1;
            let _ = gate.recv();
            match lines.pop_front() {
                Some(line) => {
                    buf.push_str(&line);
                    Ok(Some(Instant::now()))
                }
                None => Ok(None),
            }
        });
        (input, handed)
    }

    #[test]
    fn an_asker_no_longer_wanted_leaves_the_next_line_to_the_next() {
        let (open, gate) = crossbeam_channel::bounded(0);
        let (input, _) = input(&["for the chat", "then this"], gate);
        // A prompt withdrawn before anything was typed takes nothing.
        assert_eq!(input.read(|| false), None);
        let withdrawn = Wanted::default();
        withdrawn.drop_it();
        assert_eq!(input.read(|| withdrawn.still()), None);
        drop(open);
        assert_eq!(input.read(|| true), Some(Ok("for the chat\n".into())));
        assert_eq!(input.read(|| true), Some(Ok("then this\n".into())));
        // The end of input, to every asker after it.
        assert_eq!(input.read(|| true), None);
        assert_eq!(input.read(|| true), None);
    }

    /// A `y` typed for one approval, which was decided elsewhere before it
    /// came, does not answer the approval shown next: only a line typed
    /// after a prompt was shown answers it, and the older one stays for
    /// the next asker (a chat's message, a form).
    #[test]
    fn an_approval_takes_only_a_line_typed_after_it_was_shown() {
        let (open, gate) = crossbeam_channel::bounded::<()>(1);
        let (input, handed) = input(&["y", "n"], gate);
        // "y" is typed, and read, before the next prompt is shown.
        open.send(()).unwrap();
        while handed.recv().unwrap() < 1 {}
        let shown = Instant::now();
        // That prompt is answered by the line typed after it: "n".
        open.send(()).unwrap();
        assert_eq!(
            input.read_since(|| true, Some(shown)),
            Some(Ok("n\n".into()))
        );
        // The "y" waits for whoever asks without such a bound.
        assert_eq!(input.read(|| true), Some(Ok("y\n".into())));
    }

    #[test]
    fn a_line_that_comes_as_its_asker_stops_waiting_goes_to_the_next() {
        let (open, gate) = crossbeam_channel::bounded::<()>(0);
        drop(open);
        let (input, handed) = input(&["typed"], gate);
        // The line waits in the channel before the asker looks.
        while handed.recv().unwrap() < 1 {}
        // Wanted when it looked, not when the line came.
        let looks = std::cell::Cell::new(0);
        let taken = input.read(|| {
            looks.set(looks.get() + 1);
            looks.get() == 1
        });
        assert_eq!(taken, None);
        assert_eq!(input.read(|| true), Some(Ok("typed\n".into())));
    }
}
