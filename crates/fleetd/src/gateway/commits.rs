//! Group commit of the messages the gateway stores: every caller's messages that arrive while
//! a transaction is being written wait for it and then go together in the next one, so a
//! busy gateway writes one transaction (one WAL commit) for many sends instead of one each. A
//! caller still returns only once its own messages are committed, and nothing waits for
//! company: an idle gateway writes each at once. The writing runs on a blocking thread of its
//! own, so a caller that goes away (a cancelled call) does not take its messages with it.

use std::sync::{Arc, Mutex, MutexGuard};

use fleet_core::bounds::{Full, admit_waiting};
use fleet_core::{FleetError, Message};
use fleet_store::Store;
use tokio::sync::oneshot;

use super::store_error;

/// For each message of a call: whether it was new, or the cap that refused it.
pub(super) type Outcomes = Vec<Result<bool, Full>>;

/// One caller's messages, and where their outcomes go.
struct Pending {
    messages: Vec<Message>,
    answer: oneshot::Sender<Result<Outcomes, FleetError>>,
}

/// What waits for the writer, and whether one is at work.
#[derive(Default)]
struct Queue {
    waiting: Vec<Pending>,
    writing: bool,
}

/// The gateway's stores of messages, grouped.
pub(super) struct Commits {
    store: Arc<dyn Store>,
    /// `gateway.max_held_per_recipient`.
    cap: usize,
    queue: Arc<Mutex<Queue>>,
}

impl Commits {
    pub(super) fn new(store: Arc<dyn Store>, cap: usize) -> Commits {
        Commits {
            store,
            cap,
            queue: Arc::default(),
        }
    }

    /// Stores `messages` in a transaction (with whatever other callers' messages wait beside
    /// them), each one that is to wait for its recipient only within the cap.
    pub(super) async fn store(&self, messages: Vec<Message>) -> Result<Outcomes, FleetError> {
        let (answer, outcome) = oneshot::channel();
        let start_writer = {
            let mut queue = lock(&self.queue);
            queue.waiting.push(Pending { messages, answer });
            !std::mem::replace(&mut queue.writing, true)
        };
        if start_writer {
            let (store, queue, cap) = (Arc::clone(&self.store), Arc::clone(&self.queue), self.cap);
            tokio::task::spawn_blocking(move || write_until_empty(store.as_ref(), &queue, cap));
        }
        outcome
            .await
            .unwrap_or_else(|_| Err(FleetError::internal("the store's writer went away")))
    }
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    // The queue holds no invariant a panic half-way could break beyond repair.
    queue
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The writer: takes everything waiting, writes it in one transaction and answers each
/// caller, until nothing waits (then it is done, and the next caller starts another).
fn write_until_empty(store: &dyn Store, queue: &Mutex<Queue>, cap: usize) {
    let _unwinding = Writer(queue);
    loop {
        let batch = {
            let mut queue = lock(queue);
            if queue.waiting.is_empty() {
                queue.writing = false;
                return;
            }
            std::mem::take(&mut queue.waiting)
        };
        let lengths: Vec<usize> = batch.iter().map(|p| p.messages.len()).collect();
        let (messages, answers): (Vec<Vec<Message>>, Vec<_>) =
            batch.into_iter().map(|p| (p.messages, p.answer)).unzip();
        let messages: Vec<Message> = messages.into_iter().flatten().collect();
        let written = store
            .insert_messages_within(&messages, &|m, waiting| admit_waiting(m.kind, waiting, cap))
            .map_err(store_error);
        let answered: Vec<Result<Outcomes, FleetError>> = match written {
            Ok(outcomes) => match split(&lengths, outcomes) {
                Some(each) => each.into_iter().map(Ok).collect(),
                None => vec![
                    Err(FleetError::internal(
                        "the store answered for a different number of messages"
                    ));
                    lengths.len()
                ],
            },
            Err(e) => vec![Err(e); lengths.len()],
        };
        for (answer, outcome) in answers.into_iter().zip(answered) {
            // A caller that went away no longer needs its outcome; its messages are stored.
            let _ = answer.send(outcome);
        }
    }
}

/// Marks the writer gone if it panics, so the next caller starts another instead of waiting for
/// one that is gone. Its batch's callers hear so as their answers drop, and so do those that
/// came while it wrote (no writer is coming for them: they would wait until some later caller
/// started one, on an idle gateway for ever).
struct Writer<'a>(&'a Mutex<Queue>);

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let stranded = {
                let mut queue = lock(self.0);
                queue.writing = false;
                std::mem::take(&mut queue.waiting)
            };
            drop(stranded);
        }
    }
}

/// `outcomes` cut into runs of `lengths`, in order: `None` unless they add up exactly.
fn split<T>(lengths: &[usize], outcomes: Vec<T>) -> Option<Vec<Vec<T>>> {
    if lengths.iter().sum::<usize>() != outcomes.len() {
        return None;
    }
    let mut rest = outcomes.into_iter();
    Some(
        lengths
            .iter()
            .map(|&n| rest.by_ref().take(n).collect())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use fleet_core::{Gid, MsgState, TraceId};
    use fleet_store::SqliteStore;

    use super::*;

    fn held(from: Gid, to: Gid, body: &str) -> Message {
        Message {
            state: MsgState::Held,
            ..Message::task(from, to, body.into(), TraceId::mint(), 1)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_at_once_each_get_their_own_outcomes_and_everything_is_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("fleet.db")).unwrap());
        let (from, to, capped) = (Gid::mint(), Gid::mint(), Gid::mint());
        let commits = Arc::new(Commits::new(Arc::clone(&store), 32));
        let again = held(from, to, "sent twice");
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..40 {
            let (commits, again) = (Arc::clone(&commits), again.clone());
            calls.spawn(async move {
                let mine = match i % 4 {
                    0 => vec![held(from, to, &format!("m{i}")), again],
                    1 => (0..4)
                        .map(|j| held(from, capped, &format!("c{i}.{j}")))
                        .collect(),
                    _ => vec![held(from, to, &format!("m{i}"))],
                };
                (i, commits.store(mine).await.unwrap())
            });
        }
        let (mut fresh_again, mut capped_in, mut capped_out) = (0, 0, 0);
        while let Some(joined) = calls.join_next().await {
            let (i, outcomes) = joined.unwrap();
            match i % 4 {
                0 => {
                    assert_eq!(outcomes.len(), 2, "call {i}");
                    assert_eq!(outcomes[0], Ok(true), "call {i}");
                    fresh_again += usize::from(outcomes[1] == Ok(true));
                }
                1 => {
                    assert_eq!(outcomes.len(), 4, "call {i}");
                    for outcome in outcomes {
                        match outcome {
                            Ok(fresh) => {
                                assert!(fresh, "call {i}");
                                capped_in += 1;
                            }
                            Err(full) => {
                                assert_eq!(full.cap, 32);
                                capped_out += 1;
                            }
                        }
                    }
                }
                _ => assert_eq!(outcomes, vec![Ok(true)], "call {i}"),
            }
        }
        assert_eq!(fresh_again, 1, "the message sent in ten calls is new once");
        assert_eq!(
            (capped_in, capped_out),
            (32, 8),
            "the cap holds across the group"
        );
        let stored = store.take_held(to, None, 1000).unwrap();
        assert_eq!(stored.len(), 30 + 1);
        assert_eq!(store.take_held(capped, None, 1000).unwrap().len(), 32);
    }

    #[test]
    fn a_writer_that_panics_fails_every_caller_still_waiting_and_lets_the_next_start_one() {
        let queue = Mutex::new(Queue::default());
        let (answer, mut outcome) = oneshot::channel();
        {
            let mut q = lock(&queue);
            q.writing = true;
            // A caller that came while the writer wrote.
            q.waiting.push(Pending {
                messages: vec![held(Gid::mint(), Gid::mint(), "late")],
                answer,
            });
        }
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _unwinding = Writer(&queue);
            panic!("the store broke mid-write");
        }));
        assert!(panicked.is_err());
        let q = lock(&queue);
        assert!(!q.writing, "the next caller starts a writer");
        assert!(q.waiting.is_empty());
        assert!(
            matches!(
                outcome.try_recv(),
                Err(oneshot::error::TryRecvError::Closed)
            ),
            "the waiting caller hears its writer went away"
        );
    }

    #[test]
    fn outcomes_go_back_to_their_callers_in_order_and_a_miscount_is_caught() {
        assert_eq!(
            split(&[1, 0, 3, 2], vec![1, 2, 3, 4, 5, 6]),
            Some(vec![vec![1], vec![], vec![2, 3, 4], vec![5, 6]])
        );
        assert_eq!(split(&[2, 2], vec![1, 2, 3]), None);
        assert_eq!(split(&[1], vec![1, 2]), None);
        assert_eq!(split::<u8>(&[], vec![]), Some(vec![]));
    }
}
