//! An in-memory [`Broker`] for tests of the federated plane's logic (feature `fake`): it keeps
//! the trait's contract where a test can see it — inboxes are exclusive, a mandatory publish
//! to a key nothing is bound to comes back unroutable, deliveries come in order and each is
//! settled once — and records every publish and every settlement. No expiry, no dead-lettering
//! (a test puts a dead letter on the dead-letter queue itself), no persistence: what those need
//! is tested against the real RabbitMQ. A settlement `through` a delivery is recorded as such
//! but does not mark the ones before it settled: a test that settles one of those again is not
//! caught here (RabbitMQ would close the channel).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use fleet_core::Gid;
use fleet_core::admission::Settlement;
use fleet_core::envelope::Envelope;
use fleet_core::signing::Signature;
use tokio::sync::{Notify, mpsc};

use crate::broker::{Broker, Outgoing, Published};
use crate::delivery::{Acker, Deliveries, Delivery, Record};
use crate::error::AmqpError;
use crate::table::Table;

/// How many deliveries a fake queue holds before [`FakeBroker::deliver`] waits: more than any
/// test puts in one.
const FAKE_QUEUE_DEPTH: usize = 1_024;

/// A publish the fake took.
#[derive(Clone, Debug)]
pub struct Sent {
    /// The exchange.
    pub exchange: String,
    /// The routing key.
    pub key: String,
    /// The envelope.
    pub envelope: Envelope,
    /// The signature it was published with.
    pub signature: Signature,
    /// The body.
    pub body: Vec<u8>,
    /// Whether it was mandatory.
    pub mandatory: bool,
    /// Whether it was persistent.
    pub persistent: bool,
}

/// A settlement the fake recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The delivery's tag (as [`FakeBroker::deliver`] returned it).
    pub tag: u64,
    /// How it was settled.
    pub how: Settlement,
    /// Whether every delivery before it was settled with it.
    pub through: bool,
}

/// Settles one fake delivery, once.
struct Recorder {
    tag: u64,
    log: Arc<Mutex<Vec<Settled>>>,
    done: AtomicBool,
    /// Whether the broker is seen to take its acknowledgement (see [`FakeBroker::lose_acks`]).
    unseen: Arc<AtomicBool>,
}

impl Record for Recorder {
    fn settle(&self, how: Settlement, through: bool) -> Result<(), AmqpError> {
        if self.done.swap(true, Ordering::SeqCst) {
            return Err(AmqpError::Unavailable(format!(
                "delivery {} was settled already",
                self.tag
            )));
        }
        lock(&self.log).push(Settled {
            tag: self.tag,
            how,
            through,
        });
        Ok(())
    }

    /// Whether the broker was seen to take what was settled (an error once
    /// [`FakeBroker::lose_acks`] was called).
    fn seen(&self) -> Result<(), AmqpError> {
        if self.unseen.load(Ordering::SeqCst) {
            return Err(AmqpError::Unavailable(
                "the broker was not seen to take an acknowledgement".into(),
            ));
        }
        Ok(())
    }
}

/// The in-memory broker.
#[derive(Default)]
pub struct FakeBroker {
    state: Mutex<State>,
    /// Every settlement, in order.
    settled: Arc<Mutex<Vec<Settled>>>,
    /// Whether the link is down.
    down: AtomicBool,
    /// Wakes [`Broker::closed`] when the link goes down.
    went_down: Notify,
    /// Whether acknowledgements are no longer seen to reach the broker (a partition).
    acks_unseen: Arc<AtomicBool>,
}

#[derive(Default)]
struct State {
    /// Every publish, in order.
    published: Vec<Sent>,
    /// The open inboxes: what feeds each consumer.
    inboxes: HashMap<Gid, mpsc::Sender<Delivery>>,
    /// What feeds the roster consumer.
    roster: Option<mpsc::Sender<Delivery>>,
    /// What feeds the control consumer.
    control: Option<mpsc::Sender<Delivery>>,
    /// What feeds the dead-letter consumer.
    dead_letters: Option<mpsc::Sender<Delivery>>,
    /// Keys bound to queues elsewhere (another host's inboxes).
    bound: HashSet<String>,
    /// The last delivery tag handed out.
    tag: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FakeBroker {
    /// A broker that is up, with nothing declared.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every publish so far, in order.
    pub fn published(&self) -> Vec<Sent> {
        lock(&self.state).published.clone()
    }

    /// Every settlement so far, in order.
    pub fn settled(&self) -> Vec<Settled> {
        lock(&self.settled).clone()
    }

    /// Binds `key` to a queue of another host's, so a mandatory publish to it is routed.
    pub fn bind(&self, key: &str) {
        lock(&self.state).bound.insert(key.to_string());
    }

    /// From now on no acknowledgement is seen to reach the broker (as in a partition, where an
    /// acknowledgement goes into a socket that leads nowhere): [`Delivery::ack_surely`] fails.
    pub fn lose_acks(&self) {
        self.acks_unseen.store(true, Ordering::SeqCst);
    }

    /// The link breaks: [`Broker::closed`] returns, [`Broker::is_up`] reads false.
    pub fn go_down(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.went_down.notify_waiters();
    }

    /// Puts a message with `headers` and `body`, published with `key` by broker login
    /// `login`, on `gid`'s open inbox; its delivery tag.
    pub async fn deliver(
        &self,
        gid: Gid,
        key: &str,
        headers: &Table,
        body: &[u8],
        login: Option<&str>,
    ) -> Result<u64, AmqpError> {
        let queue = lock(&self.state).inboxes.get(&gid).cloned();
        let queue = queue.ok_or_else(|| AmqpError::Refused(format!("no inbox open for {gid}")))?;
        self.send(&queue, key, headers, body, login).await
    }

    /// Puts a heartbeat with `headers` and `body` on the open roster queue; its delivery tag.
    pub async fn beat(&self, key: &str, headers: &Table, body: &[u8]) -> Result<u64, AmqpError> {
        let queue = lock(&self.state).roster.clone();
        let queue = queue.ok_or_else(|| AmqpError::Refused("no roster queue open".into()))?;
        self.send(&queue, key, headers, body, None).await
    }

    /// Puts a dead letter with `headers` (its `x-death` among them) and `body`, published by
    /// broker login `login`, on the open dead-letter queue; its delivery tag.
    pub async fn dead_letter(
        &self,
        headers: &Table,
        body: &[u8],
        login: Option<&str>,
    ) -> Result<u64, AmqpError> {
        let queue = lock(&self.state).dead_letters.clone();
        let queue = queue.ok_or_else(|| AmqpError::Refused("no dead-letter queue open".into()))?;
        self.send(&queue, "", headers, body, login).await
    }

    async fn send(
        &self,
        queue: &mpsc::Sender<Delivery>,
        key: &str,
        headers: &Table,
        body: &[u8],
        login: Option<&str>,
    ) -> Result<u64, AmqpError> {
        let tag = {
            let mut state = lock(&self.state);
            state.tag += 1;
            state.tag
        };
        let recorder = Recorder {
            tag,
            log: Arc::clone(&self.settled),
            done: AtomicBool::new(false),
            unseen: Arc::clone(&self.acks_unseen),
        };
        let delivery = Delivery::made(
            body.to_vec(),
            key.to_string(),
            &headers.to_lapin(),
            login.map(str::to_string),
            Acker::Fake(Box::new(recorder)),
        );
        queue
            .send(delivery)
            .await
            .map_err(|_| AmqpError::Unavailable("the consumer is gone".into()))?;
        Ok(tag)
    }

    fn open(
        &self,
        slot: &mut Option<mpsc::Sender<Delivery>>,
        what: &str,
    ) -> Result<Deliveries, AmqpError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(AmqpError::Unavailable("the fake broker is down".into()));
        }
        if slot.as_ref().is_some_and(|queue| !queue.is_closed()) {
            return Err(AmqpError::Held(format!(
                "cannot consume {what} (is another gateway consuming it?)"
            )));
        }
        let (queue, deliveries) = mpsc::channel(FAKE_QUEUE_DEPTH);
        *slot = Some(queue);
        Ok(Deliveries::fake(deliveries))
    }
}

#[async_trait]
impl Broker for FakeBroker {
    fn is_up(&self) -> bool {
        !self.down.load(Ordering::SeqCst)
    }

    fn node(&self) -> usize {
        0
    }

    async fn closed(&self) {
        let woken = self.went_down.notified();
        if self.is_up() {
            woken.await;
        }
    }

    async fn close(&self) {
        self.go_down();
    }

    fn give_up(&self) {
        self.go_down();
    }

    async fn open_inbox(&self, gid: Gid, _broadcast: &[String]) -> Result<Deliveries, AmqpError> {
        let mut state = lock(&self.state);
        let mut slot = state.inboxes.remove(&gid);
        let opened = self.open(&mut slot, &format!("the inbox of {gid}"));
        if let Some(queue) = slot {
            state.inboxes.insert(gid, queue);
        }
        opened
    }

    async fn delete_inbox(&self, gid: Gid) -> Result<(), AmqpError> {
        lock(&self.state).inboxes.remove(&gid);
        Ok(())
    }

    async fn drain_inbox(&self, _gid: Gid, _limit: usize) -> Result<Vec<Delivery>, AmqpError> {
        // The fake keeps nothing for an inbox nobody consumes.
        Ok(Vec::new())
    }

    async fn open_roster(&self, _host: &str) -> Result<Deliveries, AmqpError> {
        let mut state = lock(&self.state);
        let mut slot = state.roster.take();
        let opened = self.open(&mut slot, "the roster queue");
        state.roster = slot;
        opened
    }

    async fn open_control(&self, _host: &str) -> Result<Deliveries, AmqpError> {
        let mut state = lock(&self.state);
        let mut slot = state.control.take();
        let opened = self.open(&mut slot, "the control queue");
        state.control = slot;
        opened
    }

    async fn open_dead_letters(&self, _host: &str) -> Result<Deliveries, AmqpError> {
        let mut state = lock(&self.state);
        let mut slot = state.dead_letters.take();
        let opened = self.open(&mut slot, "the dead-letter queue");
        state.dead_letters = slot;
        opened
    }

    async fn publish(&self, message: Outgoing<'_>) -> Result<Published, AmqpError> {
        let (exchange, key, envelope, body) = (
            message.exchange,
            message.key,
            message.envelope,
            message.body,
        );
        if !self.is_up() {
            return Err(AmqpError::Unavailable(
                "the broker did not take the message: the fake broker is down".into(),
            ));
        }
        let mut state = lock(&self.state);
        let routed =
            state.bound.contains(key) || state.inboxes.keys().any(|gid| gid.to_string() == key);
        state.published.push(Sent {
            exchange: exchange.to_string(),
            key: key.to_string(),
            envelope: envelope.clone(),
            signature: message.signature.clone(),
            body: body.to_vec(),
            mandatory: message.mandatory,
            persistent: message.persistent,
        });
        Ok(if message.mandatory && !routed {
            Published::Unroutable
        } else {
            Published::Routed
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_inbox_is_exclusive_and_its_deliveries_come_in_order_settled_once() {
        let broker = FakeBroker::new();
        let gid = Gid::mint();
        let key = gid.to_string();
        let mut inbox = broker.open_inbox(gid, &[]).await.unwrap();
        assert!(matches!(
            broker.open_inbox(gid, &[]).await,
            Err(AmqpError::Held(_))
        ));
        let first = broker
            .deliver(gid, &key, &Table::new(), b"one", None)
            .await
            .unwrap();
        broker
            .deliver(gid, &key, &Table::new(), b"two", None)
            .await
            .unwrap();
        let one = inbox.next().await.unwrap().unwrap();
        assert_eq!((one.body(), one.routing_key()), (&b"one"[..], key.as_str()));
        assert!(one.envelope().is_err(), "no headers, no envelope");
        let two = inbox.next_now().unwrap().unwrap().unwrap();
        assert_eq!(two.body(), b"two");
        assert!(inbox.next_now().is_none(), "nothing more has arrived");
        one.settle(Settlement::DeadLetter, false).await.unwrap();
        assert!(one.settle(Settlement::Ack, false).await.is_err());
        assert_eq!(
            broker.settled(),
            [Settled {
                tag: first,
                how: Settlement::DeadLetter,
                through: false
            }]
        );
        // Once its consumer is gone, the inbox may be consumed again.
        drop(inbox);
        assert!(broker.open_inbox(gid, &[]).await.is_ok());
    }
}
