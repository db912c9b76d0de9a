//! Letters to the scheduler gathered into one message per batch of
//! commits.
//!
//! The store's answering thread records every execution of a committed
//! batch, and each record ends in a report to the scheduler. Sent one by
//! one, every report was a message of its own: a push onto the
//! scheduler's mailbox and a wake-up of its thread (a system call when
//! the thread sleeps), a fifth of the answering thread's time on 16
//! cores, and on the scheduler's side one handler call, one planner step
//! and one spawn of the next sibling each. Inside [`gathered`], [`post`]
//! keeps the letters instead; when the closure returns (or unwinds) they
//! go out in the order they were posted, those to one scheduler as one
//! [`ToScheduler::Batch`], which the scheduler handles letter by letter
//! in that order before it starts what they freed room for.
//!
//! Outside [`gathered`], [`post`] sends at once: a stage actor that
//! records its own exit (no store, or a failed execution) reports as
//! before.

use std::cell::RefCell;

use actix::Recipient;

use super::protocol::ToScheduler;

/// The letters kept on this thread, grouped by scheduler in the order
/// they were posted; `None` outside [`gathered`].
type Kept = Vec<(Recipient<ToScheduler>, Vec<ToScheduler>)>;

thread_local! {
    static GATHERED: RefCell<Option<Kept>> = const { RefCell::new(None) };
}

/// Sends `letter` to `to`, or keeps it until the end of the [`gathered`]
/// this thread is in.
pub fn post(to: &Recipient<ToScheduler>, letter: ToScheduler) {
    let unsent = GATHERED.with(|gathered| {
        let mut gathered = gathered.borrow_mut();
        let Some(kept) = gathered.as_mut() else {
            return Some(letter);
        };
        match kept.last_mut() {
            Some((same, letters)) if same == to => letters.push(letter),
            _ => kept.push((to.clone(), vec![letter])),
        }
        None
    });
    if let Some(letter) = unsent {
        to.do_send(letter);
    }
}

/// Runs `f`, keeping what it [`post`]s on this thread, and then sends it:
/// one message per run of letters to the same scheduler. Within another
/// `gathered`, the outer one sends.
pub fn gathered<R>(f: impl FnOnce() -> R) -> R {
    let inner = GATHERED.with(|gathered| {
        let mut gathered = gathered.borrow_mut();
        if gathered.is_some() {
            return true;
        }
        *gathered = Some(Vec::new());
        false
    });
    if inner {
        return f();
    }
    // Sent on the way out, also when `f` unwinds: a report kept back
    // would leave its execution unreported and the run hung.
    let _send = SendOnDrop;
    f()
}

struct SendOnDrop;

impl Drop for SendOnDrop {
    fn drop(&mut self) {
        let kept = GATHERED
            .with(|gathered| gathered.borrow_mut().take())
            .unwrap_or_default();
        for (to, mut letters) in kept {
            match letters.len() {
                1 => {
                    if let Some(letter) = letters.pop() {
                        to.do_send(letter);
                    }
                }
                _ => to.do_send(ToScheduler::Batch(letters)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use actix::prelude::*;

    use super::*;

    /// What one scheduler was sent: each message as the list of the
    /// letters in it.
    type Heard = Arc<Mutex<Vec<Vec<String>>>>;

    struct Listener(Heard);

    impl Actor for Listener {
        type Context = Context<Self>;
    }

    impl Handler<ToScheduler> for Listener {
        type Result = ();

        fn handle(&mut self, msg: ToScheduler, _: &mut Context<Self>) {
            let letters = match msg {
                ToScheduler::Batch(letters) => letters,
                one => vec![one],
            };
            let names = letters
                .into_iter()
                .map(|letter| match letter {
                    ToScheduler::LimitReached { reason } => reason,
                    other => format!("{other:?}"),
                })
                .collect();
            self.0.lock().unwrap().push(names);
        }
    }

    fn letter(name: &str) -> ToScheduler {
        ToScheduler::LimitReached {
            reason: name.to_owned(),
        }
    }

    /// Two listeners; `post_all` posts to them, then the test waits for
    /// what each heard.
    fn heard(
        post_all: impl FnOnce(&Recipient<ToScheduler>, &Recipient<ToScheduler>),
    ) -> [Vec<Vec<String>>; 2] {
        actix::System::new().block_on(async move {
            let (a, b) = (Heard::default(), Heard::default());
            let to_a = Listener(Arc::clone(&a)).start();
            let to_b = Listener(Arc::clone(&b)).start();
            post_all(&to_a.clone().recipient(), &to_b.clone().recipient());
            // A message sent after the letters is handled after them.
            to_a.send(letter("end")).await.unwrap();
            to_b.send(letter("end")).await.unwrap();
            let take = |h: &Heard| {
                let mut heard = h.lock().unwrap().clone();
                heard.pop();
                heard
            };
            [take(&a), take(&b)]
        })
    }

    #[test]
    fn outside_gathered_every_letter_is_sent_at_once() {
        let [a, _] = heard(|a, _| {
            post(a, letter("1"));
            post(a, letter("2"));
        });
        assert_eq!(a, [vec!["1"], vec!["2"]]);
    }

    #[test]
    fn gathered_letters_go_as_one_message_per_run_to_the_same_scheduler_in_order() {
        let [a, b] = heard(|a, b| {
            gathered(|| {
                post(a, letter("1"));
                post(a, letter("2"));
                // Within another gathered: still the outer one's.
                gathered(|| post(a, letter("3")));
                post(b, letter("x"));
                post(a, letter("4"));
            });
        });
        assert_eq!(a, [vec!["1", "2", "3"], vec!["4"]]);
        assert_eq!(b, [vec!["x"]]);
    }

    #[test]
    fn letters_gathered_before_a_panic_are_still_sent() {
        let [a, _] = heard(|a, _| {
            let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                gathered(|| {
                    post(a, letter("1"));
                    post(a, letter("2"));
                    panic!("an answer panicked");
                })
            }));
            assert!(unwound.is_err());
            // And the thread posts at once again afterwards.
            post(a, letter("3"));
        });
        assert_eq!(a, [vec!["1", "2"], vec!["3"]]);
    }
}
