//! The pending-receipt bound: a brief published to a remote worker awaits its `INJECTED`
//! receipt, and is failed loudly if none comes within the bound of its recipient being free.
//! Time its recipient reads busy or is not heard does not count (the brief waits on the broker
//! meanwhile, and its recipient's gateway may still type it). While its recipient is heard, a
//! brief ends by its lifetime plus the bound: past its lifetime its recipient's gateway never
//! takes it, and the broker dead-letters it (its sender told). While its recipient is not heard
//! (its host cut off, or this gateway's own link down) the cap waits too: a brief its gateway
//! took just as it was cut off is answered or failed by that gateway once it is heard again.
//! Pure: every call takes the time as a value; nothing here reads a clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::{Gid, MsgId, TraceId};

/// How long an injected remote brief's bookkeeping is kept while its answer is awaited.
pub const INJECTED_KEPT: Duration = Duration::from_secs(3_600);

/// A brief this gateway published, awaiting its `INJECTED` receipt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// Who sent it.
    pub sender: Gid,
    /// The remote worker it went to.
    pub recipient: Gid,
    /// Its trace.
    pub trace_id: TraceId,
    /// Whether its receipt came.
    pub injected: bool,
    /// When it is overdue (or, once injected, forgotten).
    pub deadline: Instant,
    /// When it is overdue while its recipient is heard, however busy: its lifetime and a bound
    /// after it was published.
    pub cap: Instant,
}

/// How a brief's recipient stands, for its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Heard and free to take it: the bound runs.
    Free,
    /// Heard and busy (the brief waits its turn on the broker): the bound waits, up to the cap.
    Busy,
    /// Not heard (its host cut off, or this gateway's own link down): the bound and the cap
    /// wait, for whatever its gateway did with the brief is not known until it is heard.
    Unheard,
}

/// The briefs awaiting receipts.
#[derive(Debug)]
pub struct Receipts {
    /// How long a receipt may take once the recipient is free.
    bound: Duration,
    /// How long a brief lives on the broker (and in its recipient's queue).
    lifetime: Duration,
    /// The briefs, by message id.
    pending: HashMap<MsgId, Pending>,
}

impl Receipts {
    /// None pending yet; a receipt may take `bound` once its recipient is free, and a brief
    /// lives `lifetime`.
    pub fn new(bound: Duration, lifetime: Duration) -> Self {
        Self {
            bound,
            lifetime,
            pending: HashMap::new(),
        }
    }

    /// The bound.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Starts awaiting the receipt of brief `msg_id`, published at `now`.
    pub fn track(
        &mut self,
        msg_id: MsgId,
        sender: Gid,
        recipient: Gid,
        trace_id: TraceId,
        now: Instant,
    ) {
        let pending = Pending {
            sender,
            recipient,
            trace_id,
            injected: false,
            deadline: now + self.bound,
            cap: now + self.lifetime + self.bound,
        };
        self.pending.insert(msg_id, pending);
    }

    /// Stops awaiting it (not published after all, or answered).
    pub fn forget(&mut self, msg_id: MsgId) {
        self.pending.remove(&msg_id);
    }

    /// The briefs `sender` sent that are still tracked.
    pub fn sent_by(&self, sender: Gid) -> Vec<MsgId> {
        self.pending
            .iter()
            .filter(|(_, p)| p.sender == sender)
            .map(|(id, _)| *id)
            .collect()
    }

    /// `queued` or `injected`, while it is tracked.
    pub fn state(&self, msg_id: MsgId) -> Option<&'static str> {
        self.pending
            .get(&msg_id)
            .map(|p| if p.injected { "injected" } else { "queued" })
    }

    /// Its receipt came at `now`: kept [`INJECTED_KEPT`] more while its answer is awaited.
    pub fn injected(&mut self, msg_id: MsgId, now: Instant) {
        if let Some(pending) = self.pending.get_mut(&msg_id) {
            pending.injected = true;
            pending.deadline = now + INJECTED_KEPT;
        }
    }

    /// At `now`, with `standing` telling how each recipient stands: pushes the deadline of a
    /// brief for a busy recipient to at least a whole bound away (never past its cap), and for
    /// one not heard to a whole bound away (its cap too), drops what is past its deadline, and
    /// returns the overdue briefs whose receipt never came (to fail them loudly).
    pub fn sweep(
        &mut self,
        now: Instant,
        standing: impl Fn(Gid) -> Standing,
    ) -> Vec<(MsgId, Pending)> {
        let bound = self.bound;
        for pending in self.pending.values_mut().filter(|p| !p.injected) {
            match standing(pending.recipient) {
                Standing::Free => {}
                Standing::Busy => {
                    pending.deadline = pending.deadline.max(now + bound).min(pending.cap);
                }
                Standing::Unheard => {
                    pending.deadline = pending.deadline.max(now + bound);
                    pending.cap = pending.cap.max(now + bound);
                }
            }
        }
        let due: Vec<MsgId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        due.into_iter()
            .filter_map(|id| self.pending.remove(&id).map(|p| (id, p)))
            .filter(|(_, p)| !p.injected)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(3);
    const LIFETIME: Duration = Duration::from_secs(20);
    const S: Duration = Duration::from_secs(1);

    fn free(_: Gid) -> Standing {
        Standing::Free
    }

    /// `recipient` stands so, every other one is free.
    fn only(recipient: Gid, standing: Standing) -> impl Fn(Gid) -> Standing + Copy {
        move |gid| {
            if gid == recipient {
                standing
            } else {
                Standing::Free
            }
        }
    }

    fn tracked(t0: Instant) -> (Receipts, MsgId, Gid) {
        let mut receipts = Receipts::new(BOUND, LIFETIME);
        let (msg_id, recipient) = (MsgId::mint(), Gid::mint());
        receipts.track(msg_id, Gid::mint(), recipient, TraceId::mint(), t0);
        (receipts, msg_id, recipient)
    }

    #[test]
    fn the_briefs_of_one_sender_are_found_by_it() {
        let t0 = Instant::now();
        let (mut receipts, msg_id, _) = tracked(t0);
        let sender = Gid::mint();
        let other = MsgId::mint();
        receipts.track(other, sender, Gid::mint(), TraceId::mint(), t0);
        assert_eq!(receipts.sent_by(sender), [other]);
        assert!(!receipts.sent_by(sender).contains(&msg_id));
        assert!(receipts.sent_by(Gid::mint()).is_empty());
    }

    #[test]
    fn a_brief_without_a_receipt_is_overdue_at_the_bound_and_only_then() {
        let t0 = Instant::now();
        let (mut receipts, msg_id, _) = tracked(t0);
        assert_eq!(receipts.state(msg_id), Some("queued"));
        assert!(receipts.sweep(t0 + BOUND - S, free).is_empty());
        let overdue = receipts.sweep(t0 + BOUND, free);
        assert_eq!(overdue.len(), 1);
        assert_eq!(overdue[0].0, msg_id);
        assert_eq!(receipts.state(msg_id), None, "failed once, then forgotten");
        assert!(receipts.sweep(t0 + BOUND * 10, free).is_empty());
    }

    #[test]
    fn time_the_recipient_is_busy_does_not_count() {
        let t0 = Instant::now();
        let (mut receipts, msg_id, recipient) = tracked(t0);
        // Busy from 2 s to 10 s: every sweep meanwhile pushes the deadline a bound away.
        let busy = only(recipient, Standing::Busy);
        for s in 2..=10 {
            assert!(receipts.sweep(t0 + S * s, busy).is_empty(), "{s}");
        }
        // Free at 10 s: a whole bound from the last busy sweep.
        assert!(receipts.sweep(t0 + S * 12, free).is_empty());
        assert_eq!(receipts.sweep(t0 + S * 13, free).len(), 1);
        assert_eq!(receipts.state(msg_id), None);
    }

    #[test]
    fn a_brief_ends_by_its_lifetime_and_a_bound_however_long_its_recipient_is_busy() {
        let t0 = Instant::now();
        let (mut receipts, msg_id, recipient) = tracked(t0);
        let busy = only(recipient, Standing::Busy);
        let cap = LIFETIME + BOUND;
        let mut at = S;
        while at < cap {
            assert!(receipts.sweep(t0 + at, busy).is_empty(), "{at:?}");
            at += S / 4;
        }
        let overdue = receipts.sweep(t0 + cap, busy);
        assert_eq!(overdue.len(), 1);
        assert_eq!(overdue[0].0, msg_id);
    }

    #[test]
    fn a_brief_for_a_recipient_not_heard_waits_past_its_cap_then_has_a_bound() {
        let t0 = Instant::now();
        let (mut receipts, msg_id, recipient) = tracked(t0);
        let unheard = only(recipient, Standing::Unheard);
        // Cut off for three lifetimes: never failed meanwhile (its gateway may have taken it).
        let back = LIFETIME * 3;
        let mut at = S;
        while at < back {
            assert!(receipts.sweep(t0 + at, unheard).is_empty(), "{at:?}");
            at += S / 2;
        }
        // Heard again, free: a whole bound from the last sweep that did not hear it, no more.
        let last_unheard = at - S / 2;
        assert!(
            receipts
                .sweep(t0 + last_unheard + BOUND - S, free)
                .is_empty()
        );
        let overdue = receipts.sweep(t0 + last_unheard + BOUND, free);
        assert_eq!(overdue.len(), 1);
        assert_eq!(overdue[0].0, msg_id);
    }

    #[test]
    fn an_injected_brief_is_never_failed_and_is_kept_while_its_answer_is_awaited() {
        let t0 = Instant::now();
        let (mut receipts, msg_id, recipient) = tracked(t0);
        receipts.injected(msg_id, t0 + S);
        assert_eq!(receipts.state(msg_id), Some("injected"));
        assert!(
            receipts
                .sweep(t0 + BOUND * 2, only(recipient, Standing::Busy))
                .is_empty()
        );
        assert_eq!(receipts.state(msg_id), Some("injected"));
        assert!(receipts.sweep(t0 + S + INJECTED_KEPT, free).is_empty());
        assert_eq!(receipts.state(msg_id), None, "forgotten without a failure");
    }

    #[test]
    fn an_answer_or_an_unpublished_brief_is_forgotten() {
        let t0 = Instant::now();
        let (mut receipts, msg_id, _) = tracked(t0);
        receipts.forget(msg_id);
        assert!(receipts.sweep(t0 + BOUND, free).is_empty());
        // A receipt for a brief no longer tracked changes nothing.
        receipts.injected(msg_id, t0);
        assert_eq!(receipts.state(msg_id), None);
    }
}
