//! Per-entity inbox versions: bumped whenever something is held for the entity, so that a
//! long-poll or a blocked send waiting on it wakes and looks. And per-message answer watches: a
//! send waiting for the answer to its message wakes when that answer is held, not whenever
//! anything reaches its caller's inbox (a lead with a hundred sends out would otherwise wake a
//! hundred of them, each asking the store, for every answer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fleet_core::{Gid, MsgId};
use tokio::sync::watch;

type Answers = Arc<Mutex<HashMap<MsgId, (watch::Sender<()>, usize)>>>;

/// Every entity's inbox version, by gid, and the answers waited for, by the message they
/// answer.
#[derive(Default)]
pub(super) struct Inboxes {
    versions: Mutex<HashMap<Gid, watch::Sender<u64>>>,
    answers: Answers,
}

/// Woken when an answer to one message is held; the wait ends when this is dropped.
pub(super) struct AnswerWatch {
    held: watch::Receiver<()>,
    msg_id: MsgId,
    answers: Answers,
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
}

impl Drop for AnswerWatch {
    fn drop(&mut self) {
        let mut answers = lock(&self.answers);
        let last = answers.get_mut(&self.msg_id).is_some_and(|(_, held)| {
            *held = held.saturating_sub(1);
            *held == 0
        });
        if last {
            answers.remove(&self.msg_id);
        }
    }
}

/// A map of senders holds no invariant a panic half-way could break.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inboxes {
    /// A receiver that sees every later change of `gid`'s inbox.
    pub(super) fn watch(&self, gid: Gid) -> watch::Receiver<u64> {
        lock(&self.versions)
            .entry(gid)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Tells everyone waiting on `gid`'s inbox to look again.
    pub(super) fn bump(&self, gid: Gid) {
        if let Some(tx) = lock(&self.versions).get(&gid) {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// Drops the inbox of an entity that is gone: anyone still watching it sees it close and
    /// stops waiting.
    pub(super) fn forget(&self, gid: Gid) {
        lock(&self.versions).remove(&gid);
    }

    /// A watch woken by every later answer to `msg_id` held ([`Inboxes::answered`]).
    pub(super) fn watch_answer(&self, msg_id: MsgId) -> AnswerWatch {
        let held = {
            let mut answers = lock(&self.answers);
            let (sender, watching) = answers
                .entry(msg_id)
                .or_insert_with(|| (watch::Sender::new(()), 0));
            *watching += 1;
            sender.subscribe()
        };
        AnswerWatch {
            held,
            msg_id,
            answers: self.answers.clone(),
        }
    }

    /// Tells whoever waits for an answer to `msg_id` that one was held.
    pub(super) fn answered(&self, msg_id: MsgId) {
        if let Some((sender, _)) = lock(&self.answers).get(&msg_id) {
            sender.send_replace(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bump_reaches_the_watchers_of_that_inbox_only_and_a_forgotten_one_closes() {
        let inboxes = Inboxes::default();
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
    fn an_answer_wakes_the_wait_for_it_only_and_a_finished_wait_leaves_nothing() {
        let inboxes = Inboxes::default();
        let (one, other) = (MsgId::mint(), MsgId::mint());
        let mut on_one = inboxes.watch_answer(one);
        let mut on_other = inboxes.watch_answer(other);
        assert!(!on_one.take_news());
        inboxes.answered(one);
        assert!(on_one.take_news());
        assert!(!on_one.take_news(), "news is taken once");
        assert!(!on_other.take_news());
        // Two waits for the same message (a send and a later wait for its answer): both hear,
        // and the entry stays until the last one ends.
        let mut again = inboxes.watch_answer(one);
        inboxes.answered(one);
        assert!(on_one.take_news() && again.take_news());
        drop(on_one);
        assert!(lock(&inboxes.answers).contains_key(&one));
        drop(again);
        drop(on_other);
        assert!(lock(&inboxes.answers).is_empty());
        // An answer nobody waits for is nothing.
        inboxes.answered(MsgId::mint());
    }

    #[tokio::test]
    async fn a_wait_returns_once_its_answer_is_held() {
        let inboxes = Inboxes::default();
        let msg = MsgId::mint();
        let mut watch = inboxes.watch_answer(msg);
        inboxes.answered(msg);
        tokio::time::timeout(std::time::Duration::from_secs(5), watch.held())
            .await
            .expect("woken");
        assert!(!watch.take_news(), "the wait took the news");
    }
}
