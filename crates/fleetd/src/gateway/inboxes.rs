//! Per-entity inbox versions: bumped whenever something is held for the entity, so that a
//! long-poll or a blocked send waiting on it wakes and looks. An answer handed to a waiting send
//! (below) is held for nobody: it bumps only the entity's handed version, which only a wait for
//! any answer from someone watches (a lead with a hundred sends out would otherwise wake all of
//! them, each looking again, for every answer one of them takes). And per-message answer watches: a
//! send waiting for the answer to its message wakes when that answer is held, not whenever
//! anything reaches its caller's inbox (a lead with a hundred sends out would otherwise wake a
//! hundred of them, each asking the store, for every answer).
//!
//! A send that waits also offers a hand: an answer for its caller is then handed to it as it is
//! stored, stored taken in the same transaction (one commit where a hold and a take were two),
//! and the send returns it without asking the store. A hand is claimed before the answer is
//! stored and given once it is; a send that ends meanwhile closes its hand, and whoever holds
//! the answer then (the claim's holder, or the send's watch if it ends with the answer given
//! and not taken) has it held for its recipient's pull again, so no answer is lost between them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fleet_core::{Gid, Message, MsgId};
use tokio::sync::watch;

/// Where an answer handed to a send that ended before it took it goes: held again for its
/// recipient (the gateway's).
pub(super) type Abandoned = Arc<dyn Fn(Message) + Send + Sync>;

/// One waiting send's hand.
enum Hand {
    /// The send waits; no answer is on its way to it.
    Open,
    /// An answer for it is being stored, taken.
    Promised,
    /// Its answer, stored taken, for the send to return.
    Given(Message),
    /// The send is over, or has its answer: nothing more is handed to it.
    Closed,
}

type Slot = Arc<Mutex<Hand>>;

/// What waits for the answers to one message: the watch they wake on, how many watch, and the
/// hands of those that take (by the gid of their caller).
struct Waits {
    held: watch::Sender<()>,
    watching: usize,
    hands: Vec<(Gid, Slot)>,
}

type Answers = Arc<Mutex<HashMap<MsgId, Waits>>>;

/// A version per entity, by gid, that whoever watches it sees change.
#[derive(Default)]
struct Versions(Mutex<HashMap<Gid, watch::Sender<u64>>>);

impl Versions {
    fn watch(&self, gid: Gid) -> watch::Receiver<u64> {
        lock(&self.0)
            .entry(gid)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    fn bump(&self, gid: Gid) {
        if let Some(tx) = lock(&self.0).get(&gid) {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    fn forget(&self, gid: Gid) {
        lock(&self.0).remove(&gid);
    }
}

/// Every entity's inbox version and handed version, by gid, and the answers waited for, by the
/// message they answer.
pub(super) struct Inboxes {
    versions: Versions,
    handed: Versions,
    answers: Answers,
    abandoned: Abandoned,
}

/// Woken when an answer to one message is held; the wait ends when this is dropped.
pub(super) struct AnswerWatch {
    held: watch::Receiver<()>,
    msg_id: MsgId,
    answers: Answers,
    /// Its hand, if it takes answers handed to it.
    hand: Option<Slot>,
    abandoned: Abandoned,
}

impl AnswerWatch {
    /// Whether an answer was held since the last call (or since the watch began).
    pub(super) fn take_news(&mut self) -> bool {
        let news = self.held.has_changed().unwrap_or(false);
        self.held.mark_unchanged();
        news
    }

    /// Returns once an answer is held that [`Self::take_news`] has not taken yet, and takes
    /// that news itself.
    pub(super) async fn held(&mut self) {
        if self.held.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The answer handed to this watch, stored taken, if one was: its caller's now (the hand
    /// closes).
    pub(super) fn handed(&mut self) -> Option<Message> {
        let mut hand = lock(self.hand.as_ref()?);
        match std::mem::replace(&mut *hand, Hand::Closed) {
            Hand::Given(answer) => Some(answer),
            other => {
                *hand = other;
                None
            }
        }
    }
}

impl Drop for AnswerWatch {
    fn drop(&mut self) {
        let given = self.hand.as_ref().and_then(|hand| {
            match std::mem::replace(&mut *lock(hand), Hand::Closed) {
                Hand::Given(answer) => Some(answer),
                _ => None,
            }
        });
        {
            let mut answers = lock(&self.answers);
            let last = answers.get_mut(&self.msg_id).is_some_and(|waits| {
                if let Some(mine) = &self.hand {
                    waits.hands.retain(|(_, hand)| !Arc::ptr_eq(hand, mine));
                }
                waits.watching = waits.watching.saturating_sub(1);
                waits.watching == 0
            });
            if last {
                answers.remove(&self.msg_id);
            }
        }
        if let Some(answer) = given {
            (self.abandoned)(answer);
        }
    }
}

/// A hand claimed for an answer being stored: [`Claim::give`] it the answer once it is stored
/// taken. Dropped without giving (the answer was not stored), the hand is open again.
pub(super) struct Claim(Slot);

impl Claim {
    /// Hands `answer`, just stored taken, to the send that waits for it; `answer` back if that
    /// send ended meanwhile (it is then its giver's to hold again).
    pub(super) fn give(self, answer: Message) -> Option<Message> {
        let mut hand = lock(&self.0);
        match *hand {
            Hand::Promised => {
                *hand = Hand::Given(answer);
                None
            }
            _ => Some(answer),
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut hand = lock(&self.0);
        if matches!(*hand, Hand::Promised) {
            *hand = Hand::Open;
        }
    }
}

/// A map of senders holds no invariant a panic half-way could break.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inboxes {
    /// No inbox watched yet; an answer handed to a send that ended before it took it goes to
    /// `abandoned`.
    pub(super) fn new(abandoned: Abandoned) -> Self {
        Self {
            versions: Versions::default(),
            handed: Versions::default(),
            answers: Arc::default(),
            abandoned,
        }
    }

    /// A receiver that sees every later change of `gid`'s inbox.
    pub(super) fn watch(&self, gid: Gid) -> watch::Receiver<u64> {
        self.versions.watch(gid)
    }

    /// Tells everyone waiting on `gid`'s inbox to look again.
    pub(super) fn bump(&self, gid: Gid) {
        self.versions.bump(gid);
    }

    /// A receiver that sees every later answer handed to a send of `gid`'s.
    pub(super) fn watch_handed(&self, gid: Gid) -> watch::Receiver<u64> {
        self.handed.watch(gid)
    }

    /// Tells whoever waits for answers to `gid` that one was handed to a send of its.
    pub(super) fn handed_to(&self, gid: Gid) {
        self.handed.bump(gid);
    }

    /// Drops the inbox of an entity that is gone: anyone still watching it sees it close and
    /// stops waiting.
    pub(super) fn forget(&self, gid: Gid) {
        self.versions.forget(gid);
        self.handed.forget(gid);
    }

    /// A watch woken by every later answer to `msg_id` held ([`Inboxes::answered`]); with a
    /// hand that takes an answer for `caller` as it is stored ([`Inboxes::claim`]) if `takes`.
    pub(super) fn watch_answer(&self, caller: Gid, msg_id: MsgId, takes: bool) -> AnswerWatch {
        let hand = takes.then(|| Arc::new(Mutex::new(Hand::Open)));
        let held = {
            let mut answers = lock(&self.answers);
            let waits = answers.entry(msg_id).or_insert_with(|| Waits {
                held: watch::Sender::new(()),
                watching: 0,
                hands: Vec::new(),
            });
            waits.watching += 1;
            if let Some(hand) = &hand {
                waits.hands.push((caller, Arc::clone(hand)));
            }
            waits.held.subscribe()
        };
        AnswerWatch {
            held,
            msg_id,
            answers: Arc::clone(&self.answers),
            hand,
            abandoned: Arc::clone(&self.abandoned),
        }
    }

    /// The open hand of a send of `to` waiting for an answer to `msg_id`, claimed for an
    /// answer about to be stored: none if no such send waits (or each has one on its way).
    pub(super) fn claim(&self, to: Gid, msg_id: MsgId) -> Option<Claim> {
        let answers = lock(&self.answers);
        answers
            .get(&msg_id)?
            .hands
            .iter()
            .filter(|(caller, _)| *caller == to)
            .find_map(|(_, slot)| {
                let mut hand = lock(slot);
                matches!(*hand, Hand::Open).then(|| {
                    *hand = Hand::Promised;
                    Claim(Arc::clone(slot))
                })
            })
    }

    /// Tells whoever waits for an answer to `msg_id` that one was held (or handed).
    pub(super) fn answered(&self, msg_id: MsgId) {
        if let Some(waits) = lock(&self.answers).get(&msg_id) {
            waits.held.send_replace(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::TraceId;

    /// Inboxes whose abandoned answers are kept for the test to see.
    fn inboxes() -> (Inboxes, Arc<Mutex<Vec<Message>>>) {
        let abandoned = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&abandoned);
        let inboxes = Inboxes::new(Arc::new(move |answer| kept.lock().unwrap().push(answer)));
        (inboxes, abandoned)
    }

    /// A reply to `caller`'s task `task`.
    fn answer(caller: Gid, task: MsgId, text: &str) -> Message {
        let mut sent = Message::task(caller, Gid::mint(), "task".into(), TraceId::mint(), 1);
        sent.msg_id = task;
        Message::reply_to(&sent, text.into(), 2)
    }

    #[test]
    fn a_bump_reaches_the_watchers_of_that_inbox_only_and_a_forgotten_one_closes() {
        let (inboxes, _) = inboxes();
        let (a, b) = (Gid::mint(), Gid::mint());
        let mut on_a = inboxes.watch(a);
        let on_b = inboxes.watch(b);
        inboxes.bump(a);
        assert!(on_a.has_changed().unwrap_or(false));
        assert!(!on_b.has_changed().unwrap_or(true));
        on_a.mark_unchanged();
        inboxes.forget(a);
        assert!(on_a.has_changed().is_err(), "a forgotten inbox closes");
        inboxes.bump(b);
        assert!(on_b.has_changed().unwrap_or(false));
        // A bump of an inbox nobody watches is nothing.
        inboxes.bump(Gid::mint());
    }

    #[test]
    fn an_answer_handed_is_told_apart_from_the_inbox_and_a_forgotten_one_closes() {
        let (inboxes, _) = inboxes();
        let (a, b) = (Gid::mint(), Gid::mint());
        let inbox = inboxes.watch(a);
        let mut handed = inboxes.watch_handed(a);
        let other = inboxes.watch_handed(b);
        inboxes.handed_to(a);
        assert!(handed.has_changed().unwrap_or(false));
        assert!(!inbox.has_changed().unwrap_or(true), "the inbox sleeps on");
        assert!(!other.has_changed().unwrap_or(true));
        handed.mark_unchanged();
        inboxes.bump(a);
        assert!(
            !handed.has_changed().unwrap_or(true),
            "a bump is no answer handed"
        );
        inboxes.forget(a);
        assert!(
            handed.has_changed().is_err(),
            "a forgotten entity's watch closes"
        );
        inboxes.handed_to(Gid::mint());
    }

    #[test]
    fn an_answer_wakes_the_wait_for_it_only_and_a_finished_wait_leaves_nothing() {
        let (inboxes, _) = inboxes();
        let me = Gid::mint();
        let (one, other) = (MsgId::mint(), MsgId::mint());
        let mut on_one = inboxes.watch_answer(me, one, true);
        let mut on_other = inboxes.watch_answer(me, other, false);
        assert!(!on_one.take_news());
        inboxes.answered(one);
        assert!(on_one.take_news());
        assert!(!on_one.take_news(), "news is taken once");
        assert!(!on_other.take_news());
        // Two waits for the same message (a send and a later wait for its answer): both hear,
        // and the entry stays until the last one ends.
        let mut again = inboxes.watch_answer(me, one, true);
        inboxes.answered(one);
        assert!(on_one.take_news() && again.take_news());
        drop(on_one);
        assert!(lock(&inboxes.answers).contains_key(&one));
        assert_eq!(
            lock(&inboxes.answers)[&one].hands.len(),
            1,
            "its hand went with it"
        );
        drop(again);
        drop(on_other);
        assert!(lock(&inboxes.answers).is_empty());
        // An answer nobody waits for is nothing.
        inboxes.answered(MsgId::mint());
    }

    #[tokio::test]
    async fn a_wait_returns_once_its_answer_is_held() {
        let (inboxes, _) = inboxes();
        let msg = MsgId::mint();
        let mut watch = inboxes.watch_answer(Gid::mint(), msg, true);
        inboxes.answered(msg);
        tokio::time::timeout(std::time::Duration::from_secs(5), watch.held())
            .await
            .expect("woken");
        assert!(!watch.take_news(), "the wait took the news");
    }

    #[test]
    fn an_answer_is_handed_to_a_send_of_its_recipient_waiting_for_it_and_only_once() {
        let (inboxes, abandoned) = inboxes();
        let (me, someone) = (Gid::mint(), Gid::mint());
        let task = MsgId::mint();
        let mut watch = inboxes.watch_answer(me, task, true);
        assert!(watch.handed().is_none(), "nothing handed yet");
        // Not for an answer to another caller, nor to another message.
        assert!(inboxes.claim(someone, task).is_none());
        assert!(inboxes.claim(me, MsgId::mint()).is_none());
        let claim = inboxes.claim(me, task).expect("the send's hand");
        assert!(
            inboxes.claim(me, task).is_none(),
            "one answer on its way at a time"
        );
        assert!(watch.handed().is_none(), "promised is not given");
        assert!(claim.give(answer(me, task, "done")).is_none());
        let handed = watch.handed().expect("handed");
        assert_eq!(
            (handed.body.as_str(), handed.in_reply_to),
            ("done", Some(task))
        );
        assert!(watch.handed().is_none(), "taken once");
        assert!(
            inboxes.claim(me, task).is_none(),
            "a send that has its answer takes no other"
        );
        drop(watch);
        assert!(abandoned.lock().unwrap().is_empty(), "taken, not abandoned");
    }

    #[test]
    fn a_watch_without_a_hand_is_handed_nothing() {
        let (inboxes, _) = inboxes();
        let (me, task) = (Gid::mint(), MsgId::mint());
        let _watch = inboxes.watch_answer(me, task, false);
        assert!(inboxes.claim(me, task).is_none());
    }

    #[test]
    fn a_claim_dropped_unused_opens_the_hand_again() {
        let (inboxes, _) = inboxes();
        let (me, task) = (Gid::mint(), MsgId::mint());
        let mut watch = inboxes.watch_answer(me, task, true);
        drop(inboxes.claim(me, task).expect("claimed"));
        let claim = inboxes.claim(me, task).expect("open again");
        assert!(claim.give(answer(me, task, "second")).is_none());
        assert_eq!(watch.handed().map(|m| m.body), Some("second".into()));
    }

    #[test]
    fn an_answer_for_a_send_that_ended_before_it_was_stored_comes_back_to_its_giver() {
        let (inboxes, abandoned) = inboxes();
        let (me, task) = (Gid::mint(), MsgId::mint());
        let watch = inboxes.watch_answer(me, task, true);
        let claim = inboxes.claim(me, task).expect("claimed");
        drop(watch);
        let back = claim
            .give(answer(me, task, "late"))
            .expect("the send is over");
        assert_eq!(back.body, "late");
        assert!(abandoned.lock().unwrap().is_empty());
        assert!(lock(&inboxes.answers).is_empty());
    }

    #[test]
    fn an_answer_given_to_a_send_that_ends_without_taking_it_is_abandoned_not_lost() {
        let (inboxes, abandoned) = inboxes();
        let (me, task) = (Gid::mint(), MsgId::mint());
        let watch = inboxes.watch_answer(me, task, true);
        let claim = inboxes.claim(me, task).expect("claimed");
        assert!(claim.give(answer(me, task, "unread")).is_none());
        drop(watch);
        let abandoned = abandoned.lock().unwrap();
        assert_eq!(
            abandoned
                .iter()
                .map(|m| m.body.as_str())
                .collect::<Vec<_>>(),
            ["unread"]
        );
    }

    #[test]
    fn two_sends_waiting_for_the_same_answer_are_each_handed_one() {
        let (inboxes, _) = inboxes();
        let (me, task) = (Gid::mint(), MsgId::mint());
        let mut first = inboxes.watch_answer(me, task, true);
        let mut second = inboxes.watch_answer(me, task, true);
        let one = inboxes.claim(me, task).expect("one hand");
        let two = inboxes.claim(me, task).expect("the other hand");
        assert!(inboxes.claim(me, task).is_none());
        assert!(one.give(answer(me, task, "a")).is_none());
        assert!(two.give(answer(me, task, "b")).is_none());
        let mut got = [first.handed(), second.handed()].map(|m| m.map(|m| m.body));
        got.sort();
        assert_eq!(got, [Some("a".to_string()), Some("b".to_string())]);
    }
}
