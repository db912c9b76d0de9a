//! Interaction arbiter: one question put to several responders at once,
//! first answer wins, the others withdraw their prompt.
//!
//! Like [`crate::FanOut`] it is a synchronous state machine (events in,
//! commands out) that knows nothing of tools or models. The driver owns
//! the responders and the clock:
//!
//! * [`Arbiter::raise`] opens an interaction for an `owner` (for troupe, a
//!   stage execution) and asks every responder. With no responder it is
//!   decided at once as [`Unanswered::NoResponder`].
//! * [`Arbiter::answer`]: the first answer decides; every other responder is
//!   told to withdraw. An answer to a decided interaction is reported as
//!   [`ArbiterCommand::Late`] and changes nothing.
//! * [`Arbiter::time_out`] decides an interaction as [`Unanswered::TimedOut`].
//! * [`Arbiter::withdraw_owner`] decides every open interaction of an owner
//!   as [`Unanswered::Withdrawn`] and withdraws every prompt: no one is asked
//!   to approve work that no longer exists.
//! * [`Arbiter::release`]: a responder will never answer (its input went
//!   away). When the last responder asked lets go, the interaction is
//!   decided as [`Unanswered::Abandoned`] instead of waiting forever.
//!
//! Ids are handed out in order, so an id below the next one that is not
//! open was decided: late answers are told from unknown ids without
//! keeping every decided id for the whole run.
//!
//! Every interaction is decided exactly once; after that, nothing about it
//! is ever asked again.

use std::collections::{BTreeMap, BTreeSet};

/// Identifies an interaction within one arbiter.
pub type InteractionId = u64;
/// Identifies a responder (an index into the driver's responder list).
pub type ResponderId = usize;

/// Why an interaction ended without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unanswered {
    /// There was no responder to ask.
    NoResponder,
    /// No answer came before the deadline.
    TimedOut,
    /// Its owner went away (cancelled) before anyone answered.
    Withdrawn,
    /// Every responder asked let go of it without answering.
    Abandoned,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArbiterCommand<A> {
    /// Put interaction `id` to `responder`.
    Ask {
        id: InteractionId,
        responder: ResponderId,
    },
    /// Take the prompt of `id` away from `responder`.
    Withdraw {
        id: InteractionId,
        responder: ResponderId,
    },
    /// `id` was decided by `responder`'s answer.
    Answered {
        id: InteractionId,
        responder: ResponderId,
        answer: A,
    },
    /// `id` was decided without an answer.
    Unanswered { id: InteractionId, why: Unanswered },
    /// `responder` answered `id` after it was decided; the answer is ignored.
    Late {
        id: InteractionId,
        responder: ResponderId,
        answer: A,
    },
}

#[derive(Debug, Clone)]
struct Open<K> {
    owner: K,
    /// Responders still holding the prompt.
    asked: BTreeSet<ResponderId>,
}

/// The arbiter for all interactions of one run.
#[derive(Debug, Clone)]
pub struct Arbiter<K> {
    next_id: InteractionId,
    open: BTreeMap<InteractionId, Open<K>>,
}

impl<K> Default for Arbiter<K> {
    fn default() -> Self {
        Self {
            next_id: 1,
            open: BTreeMap::new(),
        }
    }
}

impl<K: Clone + PartialEq> Arbiter<K> {
    /// A new arbiter with nothing open.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens an interaction for `owner` and asks each of `responders`.
    pub fn raise<A>(
        &mut self,
        owner: K,
        responders: impl IntoIterator<Item = ResponderId>,
        out: &mut Vec<ArbiterCommand<A>>,
    ) -> InteractionId {
        let id = self.next_id;
        self.next_id += 1;
        let asked: BTreeSet<ResponderId> = responders.into_iter().collect();
        if asked.is_empty() {
            out.push(ArbiterCommand::Unanswered {
                id,
                why: Unanswered::NoResponder,
            });
            return id;
        }
        for &responder in &asked {
            out.push(ArbiterCommand::Ask { id, responder });
        }
        self.open.insert(id, Open { owner, asked });
        id
    }

    /// A responder answered. The first answer decides; the others withdraw.
    /// Answers to unknown ids are ignored.
    pub fn answer<A: Clone>(
        &mut self,
        id: InteractionId,
        responder: ResponderId,
        answer: A,
        out: &mut Vec<ArbiterCommand<A>>,
    ) {
        match self.open.get(&id) {
            Some(open) if open.asked.contains(&responder) => {
                let Some(open) = self.open.remove(&id) else {
                    return;
                };
                out.push(ArbiterCommand::Answered {
                    id,
                    responder,
                    answer,
                });
                for other in open.asked.into_iter().filter(|r| *r != responder) {
                    out.push(ArbiterCommand::Withdraw {
                        id,
                        responder: other,
                    });
                }
            }
            // Open, but this responder was never asked (or already
            // withdrew): not an answer to anything it holds.
            Some(_) => {}
            None if self.was_decided(id) => out.push(ArbiterCommand::Late {
                id,
                responder,
                answer,
            }),
            None => {}
        }
    }

    /// The deadline of `id` passed. Nothing happens if it was decided.
    pub fn time_out<A>(&mut self, id: InteractionId, out: &mut Vec<ArbiterCommand<A>>) {
        self.close(id, Unanswered::TimedOut, out);
    }

    /// `owner` went away: every open interaction it raised is withdrawn.
    pub fn withdraw_owner<A>(&mut self, owner: &K, out: &mut Vec<ArbiterCommand<A>>) {
        let ids: Vec<InteractionId> = self
            .open
            .iter()
            .filter(|(_, o)| &o.owner == owner)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.close(id, Unanswered::Withdrawn, out);
        }
    }

    /// `responder` will never answer `id` (its input is gone). The last
    /// responder to let go decides it as [`Unanswered::Abandoned`].
    /// Nothing happens if `id` was decided or `responder` was not asked.
    pub fn release<A>(
        &mut self,
        id: InteractionId,
        responder: ResponderId,
        out: &mut Vec<ArbiterCommand<A>>,
    ) {
        let Some(open) = self.open.get_mut(&id) else {
            return;
        };
        if open.asked.remove(&responder) && open.asked.is_empty() {
            self.close(id, Unanswered::Abandoned, out);
        }
    }

    /// Whether `id` was raised and decided: ids are given out in order.
    fn was_decided(&self, id: InteractionId) -> bool {
        id >= 1 && id < self.next_id && !self.open.contains_key(&id)
    }

    fn close<A>(&mut self, id: InteractionId, why: Unanswered, out: &mut Vec<ArbiterCommand<A>>) {
        let Some(open) = self.open.remove(&id) else {
            return;
        };
        out.push(ArbiterCommand::Unanswered { id, why });
        for responder in open.asked {
            out.push(ArbiterCommand::Withdraw { id, responder });
        }
    }

    /// Interactions still waiting for an answer.
    #[must_use]
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Whether `id` is still waiting for an answer.
    #[must_use]
    pub fn is_open(&self, id: InteractionId) -> bool {
        self.open.contains_key(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ArbiterCommand as C;
    use proptest::prelude::*;

    type Cmds = Vec<ArbiterCommand<&'static str>>;

    #[test]
    fn no_responder_is_decided_at_once() {
        let mut a = Arbiter::new();
        let mut out: Cmds = Vec::new();
        let id = a.raise("s1", [], &mut out);
        assert_eq!(
            out,
            [C::Unanswered {
                id,
                why: Unanswered::NoResponder
            }]
        );
        assert_eq!(a.open_count(), 0);
    }

    #[test]
    fn first_answer_wins_and_the_others_withdraw() {
        let mut a = Arbiter::new();
        let mut out: Cmds = Vec::new();
        let id = a.raise("s1", [0, 1, 2], &mut out);
        assert_eq!(out.len(), 3);
        out.clear();
        a.answer(id, 1, "approve", &mut out);
        assert_eq!(
            out,
            [
                C::Answered {
                    id,
                    responder: 1,
                    answer: "approve"
                },
                C::Withdraw { id, responder: 0 },
                C::Withdraw { id, responder: 2 },
            ]
        );
        out.clear();
        a.answer(id, 0, "deny", &mut out);
        assert_eq!(
            out,
            [C::Late {
                id,
                responder: 0,
                answer: "deny"
            }]
        );
        out.clear();
        a.time_out(id, &mut out);
        assert!(out.is_empty(), "a decided interaction cannot time out");
    }

    #[test]
    fn withdrawing_an_owner_closes_only_its_interactions() {
        let mut a = Arbiter::new();
        let mut out: Cmds = Vec::new();
        let mine = a.raise("s1", [0, 1], &mut out);
        let other = a.raise("s2", [0], &mut out);
        out.clear();
        a.withdraw_owner(&"s1", &mut out);
        assert_eq!(
            out,
            [
                C::Unanswered {
                    id: mine,
                    why: Unanswered::Withdrawn
                },
                C::Withdraw {
                    id: mine,
                    responder: 0
                },
                C::Withdraw {
                    id: mine,
                    responder: 1
                },
            ]
        );
        assert!(a.is_open(other));
        out.clear();
        a.answer(mine, 1, "approve", &mut out);
        assert!(matches!(out[..], [C::Late { .. }]));
    }

    #[test]
    fn an_answer_from_someone_never_asked_changes_nothing() {
        let mut a = Arbiter::new();
        let mut out: Cmds = Vec::new();
        let id = a.raise("s1", [0], &mut out);
        out.clear();
        a.answer(id, 5, "approve", &mut out);
        a.answer(99, 0, "approve", &mut out);
        assert!(out.is_empty());
        assert!(a.is_open(id));
    }

    #[test]
    fn the_last_responder_to_let_go_abandons_it() {
        let mut a = Arbiter::new();
        let mut out: Cmds = Vec::new();
        let id = a.raise("s1", [0, 1], &mut out);
        out.clear();
        a.release(id, 0, &mut out);
        a.release(id, 7, &mut out);
        assert!(out.is_empty(), "another responder may still answer");
        a.release(id, 1, &mut out);
        assert_eq!(
            out,
            [C::Unanswered {
                id,
                why: Unanswered::Abandoned
            }],
            "no one holds a prompt to withdraw"
        );
        out.clear();
        a.release(id, 1, &mut out);
        assert!(out.is_empty(), "decided once");
    }

    #[test]
    fn late_answers_are_known_without_remembering_every_decided_id() {
        let mut a = Arbiter::new();
        let mut out: Cmds = Vec::new();
        let first = a.raise("s1", [0], &mut out);
        for _ in 0..10_000 {
            let id = a.raise("s1", [0], &mut out);
            a.time_out(id, &mut out);
        }
        a.time_out(first, &mut out);
        out.clear();
        a.answer(first, 0, "approve", &mut out);
        assert!(matches!(out[..], [C::Late { id, .. }] if id == first));
        out.clear();
        a.answer(0, 0, "approve", &mut out);
        a.answer(first + 10_001, 0, "approve", &mut out);
        assert!(out.is_empty(), "never raised: not late, unknown");
        assert_eq!(a.open_count(), 0);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Raise(u8, u8),
        Answer(u8, u8),
        TimeOut(u8),
        Withdraw(u8),
        Release(u8, u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..3, 0u8..4).prop_map(|(o, n)| Step::Raise(o, n)),
            (0u8..8, 0u8..4).prop_map(|(i, r)| Step::Answer(i, r)),
            (0u8..8).prop_map(Step::TimeOut),
            (0u8..3).prop_map(Step::Withdraw),
            (0u8..8, 0u8..4).prop_map(|(i, r)| Step::Release(i, r)),
        ]
    }

    proptest! {
        /// Every interaction is decided at most once, a responder is told
        /// to withdraw only a prompt it holds, and once decided nobody
        /// holds its prompt any more.
        #[test]
        fn decided_once_and_prompts_balance(steps in proptest::collection::vec(step(), 1..60)) {
            let mut a: Arbiter<u8> = Arbiter::new();
            let mut holding: BTreeSet<(InteractionId, ResponderId)> = BTreeSet::new();
            let mut decided: BTreeSet<InteractionId> = BTreeSet::new();
            let mut ids: Vec<InteractionId> = Vec::new();
            for s in steps {
                let mut out: Vec<ArbiterCommand<u8>> = Vec::new();
                match s {
                    Step::Raise(owner, n) => ids.push(a.raise(owner, 0..usize::from(n), &mut out)),
                    Step::Answer(i, r) => if let Some(&id) = ids.get(usize::from(i)) { a.answer(id, usize::from(r), 1, &mut out) },
                    Step::TimeOut(i) => if let Some(&id) = ids.get(usize::from(i)) { a.time_out(id, &mut out) },
                    Step::Withdraw(owner) => a.withdraw_owner(&owner, &mut out),
                    Step::Release(i, r) => if let Some(&id) = ids.get(usize::from(i)) {
                        // The responder lets go: it holds the prompt no more.
                        holding.remove(&(id, usize::from(r)));
                        a.release(id, usize::from(r), &mut out);
                    },
                }
                for c in out {
                    match c {
                        C::Ask { id, responder } => prop_assert!(holding.insert((id, responder))),
                        C::Withdraw { id, responder } => prop_assert!(holding.remove(&(id, responder))),
                        C::Answered { id, responder, .. } => {
                            prop_assert!(holding.remove(&(id, responder)));
                            prop_assert!(decided.insert(id), "decided twice");
                        }
                        C::Unanswered { id, .. } => prop_assert!(decided.insert(id), "decided twice"),
                        C::Late { id, .. } => prop_assert!(decided.contains(&id)),
                    }
                }
                for (id, _) in &holding {
                    prop_assert!(!decided.contains(id), "a prompt outlived its decision");
                }
            }
        }
    }
}
