//! The broker as the federated plane sees it: the one trait at this I/O boundary, and what a
//! publish comes to.

use async_trait::async_trait;
use fleet_core::Gid;
use fleet_core::envelope::Envelope;
use fleet_core::signing::Signature;

use crate::delivery::{Deliveries, Delivery};
use crate::error::AmqpError;

/// Where a publish went, once the broker confirmed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// The broker took it and routed it to at least one queue (or `mandatory` was off).
    Routed,
    /// No queue is bound to the key: the recipient's inbox does not exist.
    Unroutable,
    /// The broker refused it (the recipient's inbox is full: it went to the dead letters).
    Refused,
}

/// A message to publish: where, under what envelope and signature, and how.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    /// The exchange.
    pub exchange: &'a str,
    /// The routing key.
    pub key: &'a str,
    /// The envelope (the message's AMQP headers).
    pub envelope: &'a Envelope,
    /// The gateway's signature of the envelope and the body (the `sig` and `keyId` headers).
    pub signature: &'a Signature,
    /// The body.
    pub body: &'a [u8],
    /// Returned if no queue is bound to the key.
    pub mandatory: bool,
    /// Kept across a broker restart.
    pub persistent: bool,
}

/// One gateway's link to the broker.
///
/// The contract every implementation keeps:
/// - **Confirms.** [`Broker::publish`] returns only once the broker has answered for the
///   message: [`Published::Routed`] means the broker holds it (persistent ones on disk) in every
///   queue it was routed to; it is never "sent and hoped". No answer within a bounded time is
///   [`AmqpError::Unavailable`], and then the message may or may not have gone: nothing is
///   buffered or retried here.
/// - **Returns.** With `mandatory`, a message no queue is bound for comes back:
///   [`Published::Unroutable`]. Without it, an unroutable message is dropped and reads
///   `Routed` (a broadcast to an empty group is legal silence). A queue at its cap refuses the
///   message into the dead letters: [`Published::Refused`].
/// - **Ordering.** Messages published through one link to one queue arrive in the order
///   their publishes began; publishes from many tasks may be in flight at once.
/// - **Delivery.** An inbox's [`Deliveries`] come in queue order, each settled by the
///   consumer (ack, dead-letter or requeue). One left unsettled when its consumer or the link
///   goes is delivered again (flagged redelivered) to the next consumer: at least once, so the
///   consumer drops duplicates by message id where it must. An inbox has one consumer at a
///   time: a second is refused ([`AmqpError::Refused`]).
/// - **Roster.** The roster queue's deliveries are settled by the consumer like an inbox's:
///   acknowledged once read, dead-lettered when refused.
/// - **Dead letters.** Every dead letter goes to `fleet.dlq`, and to the dead-letter queue of
///   the host its `fromHost` header names, whose consumer (one at a time, like an inbox's) gets
///   it with its `x-death` ([`Delivery::death`]) and settles it like an inbox's delivery.
/// - **Teardown.** [`Broker::close`] and [`Broker::delete_inbox`] give up after a bounded wait:
///   a stop never hangs on a confused broker.
#[async_trait]
pub trait Broker: Send + Sync {
    /// Whether the link still works.
    fn is_up(&self) -> bool;

    /// Which of the broker's nodes the link is on: an index into the URIs it was opened with.
    fn node(&self) -> usize;

    /// Waits until the link fails or is closed. Cancel-safe.
    async fn closed(&self);

    /// Closes the link (giving up after a bounded wait; the socket goes with the process, or
    /// with the next connection attempt).
    async fn close(&self);

    /// Takes the link as lost though it has not failed (the broker did not answer what it had
    /// to, in time): it reads down from now, and [`Broker::closed`] returns.
    fn give_up(&self);

    /// Declares `gid`'s inbox, binds it to its own key and to `broadcast` (a worker's
    /// broadcast keys), and starts the one exclusive, manually settled consumer on it, with
    /// the prefetch bound.
    async fn open_inbox(&self, gid: Gid, broadcast: &[String]) -> Result<Deliveries, AmqpError>;

    /// Deletes `gid`'s inbox (its bindings and messages go with it).
    async fn delete_inbox(&self, gid: Gid) -> Result<(), AmqpError>;

    /// Takes what waits in `gid`'s inbox (at most `limit` messages), each to be settled by the
    /// caller, without consuming it: for an inbox whose entity is gone, before it is deleted.
    async fn drain_inbox(&self, gid: Gid, limit: usize) -> Result<Vec<Delivery>, AmqpError>;

    /// Declares `host`'s roster queue (exclusive, deleted with the link) bound to every
    /// heartbeat sent to all, and to those addressed to `host` alone, and consumes it.
    async fn open_roster(&self, host: &str) -> Result<Deliveries, AmqpError>;

    /// Declares `host`'s durable control queue, bound to the control exchange by the host id,
    /// and starts the one exclusive, manually settled consumer on it.
    async fn open_control(&self, host: &str) -> Result<Deliveries, AmqpError>;
    /// Declares `host`'s dead-letter queue (durable, capped, bound to the dead letters whose
    /// `fromHost` is `host`) and starts the one exclusive, manually settled consumer on it, with
    /// the prefetch bound.
    async fn open_dead_letters(&self, host: &str) -> Result<Deliveries, AmqpError>;

    /// Publishes `message` (signed, under the link's own broker login as the AMQP `user_id`,
    /// which RabbitMQ checks) and waits for the broker's confirm.
    async fn publish(&self, message: Outgoing<'_>) -> Result<Published, AmqpError>;
}
