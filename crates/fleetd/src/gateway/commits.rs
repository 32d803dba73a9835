//! Group commit of what the gateway writes most often: every caller's rows that arrive while
//! a transaction is being written wait for it and then go together in the next one, so a
//! busy gateway writes one transaction (one WAL commit) for many sends instead of one each. A
//! caller still returns only once its own rows are committed, and nothing waits for company:
//! an idle gateway writes each at once. The writing runs on a blocking thread of its own, so a
//! caller that goes away (a cancelled call) does not take its rows with it. Two things are
//! written so: the messages the gateway stores ([`Held`]), and where the messages it
//! publishes to other hosts went ([`SentRows`]).

use std::sync::{Arc, Mutex, MutexGuard};

use fleet_core::bounds::{Full, admit_waiting};
use fleet_core::{FleetError, Message};
use fleet_store::{Inserted, SentRecord, Store, StoreResult};
use tokio::sync::oneshot;

use super::store_error;

/// What a group of callers' rows is written as: one transaction for all of them, with an
/// outcome for each row, in order.
pub(super) trait Rows: Send + Sync + 'static {
    /// One row.
    type Row: Send + 'static;
    /// What became of one row.
    type Outcome: Send + 'static;
    /// Writes `rows` in one transaction.
    fn write(&self, store: &dyn Store, rows: &[Self::Row]) -> StoreResult<Vec<Self::Outcome>>;
}

/// Messages, each one that is to wait for its recipient only within the cap
/// (`gateway.max_held_per_recipient`): for each, what became of it, or the cap that refused it.
pub(super) struct Held {
    pub(super) cap: usize,
}

impl Rows for Held {
    type Row = Message;
    type Outcome = Result<Inserted, Full>;
    fn write(&self, store: &dyn Store, rows: &[Message]) -> StoreResult<Vec<Self::Outcome>> {
        let cap = self.cap;
        store.insert_messages_within(rows, &|m, waiting| admit_waiting(m.kind, waiting, cap))
    }
}

/// Where published messages went ([`Store::record_sent`]).
pub(super) struct SentRows;

impl Rows for SentRows {
    type Row = SentRecord;
    type Outcome = ();
    fn write(&self, store: &dyn Store, rows: &[SentRecord]) -> StoreResult<Vec<()>> {
        store.record_sent(rows)?;
        Ok(vec![(); rows.len()])
    }
}

/// One caller's rows, and where their outcomes go.
struct Pending<R: Rows> {
    rows: Vec<R::Row>,
    answer: oneshot::Sender<Result<Vec<R::Outcome>, FleetError>>,
}

/// What waits for the writer, and whether one is at work.
struct Queue<R: Rows> {
    waiting: Vec<Pending<R>>,
    writing: bool,
}

impl<R: Rows> Default for Queue<R> {
    fn default() -> Self {
        Queue {
            waiting: Vec::new(),
            writing: false,
        }
    }
}

/// The gateway's writes of `R`, grouped.
pub(super) struct Grouped<R: Rows> {
    store: Arc<dyn Store>,
    rows: Arc<R>,
    queue: Arc<Mutex<Queue<R>>>,
}

/// The gateway's stores of messages, grouped.
pub(super) type Commits = Grouped<Held>;

impl<R: Rows> Grouped<R> {
    pub(super) fn new(store: Arc<dyn Store>, rows: R) -> Grouped<R> {
        Grouped {
            store,
            rows: Arc::new(rows),
            queue: Arc::default(),
        }
    }

    /// Writes `rows` in a transaction (with whatever other callers' rows wait beside them);
    /// what became of each.
    pub(super) async fn store(&self, rows: Vec<R::Row>) -> Result<Vec<R::Outcome>, FleetError> {
        let (answer, outcome) = oneshot::channel();
        let start_writer = {
            let mut queue = lock(&self.queue);
            queue.waiting.push(Pending { rows, answer });
            !std::mem::replace(&mut queue.writing, true)
        };
        if start_writer {
            let (store, rows, queue) = (
                Arc::clone(&self.store),
                Arc::clone(&self.rows),
                Arc::clone(&self.queue),
            );
            tokio::task::spawn_blocking(move || {
                write_until_empty(store.as_ref(), rows.as_ref(), &queue);
            });
        }
        outcome
            .await
            .unwrap_or_else(|_| Err(FleetError::internal("the store's writer went away")))
    }
}

fn lock<R: Rows>(queue: &Mutex<Queue<R>>) -> MutexGuard<'_, Queue<R>> {
    // The queue holds no invariant a panic half-way could break beyond repair.
    queue
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The writer: takes everything waiting, writes it in one transaction and answers each
/// caller, until nothing waits (then it is done, and the next caller starts another).
fn write_until_empty<R: Rows>(store: &dyn Store, rows: &R, queue: &Mutex<Queue<R>>) {
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
        let lengths: Vec<usize> = batch.iter().map(|p| p.rows.len()).collect();
        let (each, answers): (Vec<Vec<R::Row>>, Vec<_>) =
            batch.into_iter().map(|p| (p.rows, p.answer)).unzip();
        let all: Vec<R::Row> = each.into_iter().flatten().collect();
        let written = rows.write(store, &all).map_err(store_error);
        let answered: Vec<Result<Vec<R::Outcome>, FleetError>> = match written {
            Ok(outcomes) => match split(&lengths, outcomes) {
                Some(each) => each.into_iter().map(Ok).collect(),
                None => failed(
                    &FleetError::internal("the store answered for a different number of rows"),
                    lengths.len(),
                ),
            },
            Err(e) => failed(&e, lengths.len()),
        };
        for (answer, outcome) in answers.into_iter().zip(answered) {
            // A caller that went away no longer needs its outcome; its rows are stored.
            let _ = answer.send(outcome);
        }
    }
}

/// `error` for each of `callers`.
fn failed<T>(error: &FleetError, callers: usize) -> Vec<Result<T, FleetError>> {
    (0..callers).map(|_| Err(error.clone())).collect()
}

/// Marks the writer gone if it panics, so the next caller starts another instead of waiting for
/// one that is gone. Its batch's callers hear so as their answers drop, and so do those that
/// came while it wrote (no writer is coming for them: they would wait until some later caller
/// started one, on an idle gateway for ever).
struct Writer<'a, R: Rows>(&'a Mutex<Queue<R>>);

impl<R: Rows> Drop for Writer<'_, R> {
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
        let commits = Arc::new(Commits::new(Arc::clone(&store), Held { cap: 32 }));
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
                    assert_eq!(outcomes[0], Ok(Inserted::New), "call {i}");
                    fresh_again += usize::from(outcomes[1] == Ok(Inserted::New));
                }
                1 => {
                    assert_eq!(outcomes.len(), 4, "call {i}");
                    for outcome in outcomes {
                        match outcome {
                            Ok(inserted) => {
                                assert_eq!(inserted, Inserted::New, "call {i}");
                                capped_in += 1;
                            }
                            Err(full) => {
                                assert_eq!(full.cap, 32);
                                capped_out += 1;
                            }
                        }
                    }
                }
                _ => assert_eq!(outcomes, vec![Ok(Inserted::New)], "call {i}"),
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn where_messages_went_is_recorded_for_every_caller_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("fleet.db")).unwrap());
        let sent = Arc::new(Grouped::new(Arc::clone(&store), SentRows));
        let (from, to) = (Gid::mint(), Gid::mint());
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..40 {
            let sent = Arc::clone(&sent);
            calls.spawn(async move {
                let rows: Vec<SentRecord> = (0..1 + i % 3)
                    .map(|_| SentRecord {
                        msg_id: fleet_core::MsgId::mint(),
                        host: format!("h{i}"),
                        from,
                        to: Some(to),
                        until_ms: i64::MAX,
                    })
                    .collect();
                let asked: Vec<_> = rows.iter().map(|r| (r.msg_id, r.host.clone())).collect();
                let outcomes = sent.store(rows).await.unwrap();
                assert_eq!(outcomes.len(), asked.len(), "call {i}");
                asked
            });
        }
        let mut asked = Vec::new();
        while let Some(joined) = calls.join_next().await {
            asked.extend(joined.unwrap());
        }
        assert_eq!(asked.len(), (0..40).map(|i| 1 + i % 3).sum::<usize>());
        let found = store.sent_to(&asked).unwrap();
        assert!(
            found.iter().all(|f| *f == Some((from, Some(to)))),
            "{found:?}"
        );
    }

    #[test]
    fn a_writer_that_panics_fails_every_caller_still_waiting_and_lets_the_next_start_one() {
        let queue = Mutex::new(Queue::<Held>::default());
        let (answer, mut outcome) = oneshot::channel();
        {
            let mut q = lock(&queue);
            q.writing = true;
            // A caller that came while the writer wrote.
            q.waiting.push(Pending {
                rows: vec![held(Gid::mint(), Gid::mint(), "late")],
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
