//! The federated plane (spec 10): this gateway's side of the broker. It keeps the link up
//! (connecting again after an outage and declaring everything anew), consumes the inboxes of
//! its local entities and its roster queue, publishes messages to remote entities, presence
//! for its own, and the `INJECTED` receipts of remote briefs.
//!
//! Forward path (a brief into a local worker): at most once. The brief stays unacknowledged
//! on the broker while the worker is busy, is acknowledged when the worker turns idle, then
//! goes into the local plane to be typed in; once the submit is verified (or the brief is
//! handed to the worker blocked in `fleet_poll`) the sender's gateway gets `INJECTED`. Pull
//! path (anything held for an entity): at least once — acknowledged only after the local
//! store holds it, duplicates dropped by message id.
//!
//! The rules live in `fleet_core` (admission, the remote roster, the receipt bound) and the
//! AMQP in `fleet_amqp`; this module orchestrates: lock, call the rule, act. By concern:
//! [`link`] keeps the link and the inbox consumers, [`inbox`] admits and settles deliveries,
//! [`take`] holds messages and takes briefs, [`presence`] runs the roster, [`reaped`] clears the
//! inboxes a previous run's workers left, [`publish`] sends,
//! [`receipts`] fails overdue briefs, [`dead`] tells the senders of this host's dead letters,
//! [`control`] spawns and stops workers across hosts, [`turns`] carries asks across hosts,
//! [`trust`] signs what goes out and checks what comes in (the rules are `fleet_core::trust`'s).
//!
//! Everything here is a method of [`Federation`], which holds the broker side's own state; a
//! method that needs the local plane takes the gateway as `g` (its store, sessions and loops,
//! and the few local acts a delivery ends in: hold, deliver, fail, spawn, stop). The local
//! plane calls in only through [`Afar`](super::afar::Afar), which `port` implements.

mod checks;
mod control;
mod dead;
mod inbox;
mod link;
mod outbox;
mod port;
mod presence;
mod publish;
mod reaped;
mod receipts;
mod settle;
mod take;
#[cfg(test)]
mod tests;
mod trust;
mod turns;
mod waiting;

pub(in crate::gateway) use link::{keep_up, link_settings};
pub(in crate::gateway) use publish::outgoing;
pub(in crate::gateway) use settle::settle;
pub use trust::sealed;
pub(in crate::gateway) use trust::{loud, message_window, remember_until, seal_of};

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use fleet_amqp::{AmqpError, Broker, Published};
use fleet_core::bounds::RosterCaps;
use fleet_core::delivery::carried;
use fleet_core::envelope::Envelope;
use fleet_core::ownership::AllowTable;
use fleet_core::presence::Ledger;
use fleet_core::receipts::Receipts;
use fleet_core::roster::Roster;
use fleet_core::signing::{Signature, SigningKey, signature};
use fleet_core::trust::Trust;
use fleet_core::{Entity, ErrorCode, FleetError, Gid, Kind, Message, MsgId};
use fleet_store::SentBetween;
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;

use super::LocalPlane;
use crate::audit::{AuditLog, AuditWriter};
use crate::config::{BrokerConfig, FederationConfig};

/// How many remote senders' names are kept (then forgotten all at once).
const MAX_SENDER_NAMES: usize = 10_000;

/// Where a published message went: its id, its recipient's host, its sender, and its
/// recipient (none for a broadcast's own records).
pub(super) type Sent = (MsgId, String, Gid, Option<Gid>);

/// The broker side of a gateway.
pub struct Federation {
    broker: BrokerConfig,
    config: FederationConfig,
    /// The live link; `None` while the broker is unreachable.
    link: tokio_watch::Sender<Option<Arc<dyn Broker>>>,
    /// Which of the broker's nodes the next connection tries first.
    next_node: AtomicUsize,
    /// The gid this gateway's own presence entry is published under.
    gateway_gid: Gid,
    state: Mutex<FedState>,
    /// The audit log: one line per broker hop, never a message's text.
    audit: AuditWriter,
    /// This gateway's key pair: it signs everything it publishes.
    key: SigningKey,
    /// The hosts whose signatures are taken (this one's own key among them).
    trust: Trust,
    /// What other hosts' leads may do here (`[federation.allow]`).
    allow: AllowTable,
    /// Bumped whenever a heartbeat adds to the roster: a message from a sender not yet
    /// announced waits on it a while.
    roster_heard: tokio_watch::Sender<u64>,
    /// Something may wait in the store's outbox for the broker (set when something is kept,
    /// and at start: a previous run may have left some).
    outbox_waiting: AtomicBool,
    /// Held by the outbox's flush: one at a time.
    flushing: tokio::sync::Mutex<()>,
    /// What this gateway told the others of its entities; held while a heartbeat is made and
    /// published, so they go out in the order they were made.
    ledger: tokio::sync::Mutex<Ledger>,
    /// This federation, for the tasks it starts.
    me: Weak<Federation>,
}

/// What the federated plane holds in memory.
struct FedState {
    /// The other hosts and their entities, as their heartbeats told.
    roster: Roster,
    /// The briefs this gateway published, awaiting their `INJECTED` receipts.
    receipts: Receipts,
    /// The names remote senders gave in their messages (`name@host`), for showing them.
    senders: HashMap<Gid, String>,
    /// The inbox consumers running on the current link.
    consumers: HashMap<Gid, CancellationToken>,
    /// The stamp and id of the last heartbeat taken from each host for each of its entities
    /// (and itself), until a heartbeat so stamped would be refused as stale anyway: an older
    /// or repeated one is refused.
    heartbeats_last: HashMap<(String, String), (u64, MsgId)>,
    /// The hosts remote senders' checked messages came from, for where an answer to them goes
    /// when the roster no longer knows them.
    sender_hosts: HashMap<Gid, String>,
    /// Where messages just published went (`(msg_id, host)` → from, to), until the store has
    /// it: an answer is matched however soon it comes.
    sent_pending: HashMap<(MsgId, String), SentBetween>,
    /// The control requests this gateway published, awaiting their answers.
    control: HashMap<MsgId, control::ControlCall>,
    /// Workers of a previous run reaped at start whose inboxes are still to be cleared (the
    /// broker could not be reached then).
    reaped: Vec<Entity>,
    /// How many messages off the broker the trust checks refused (their log lines are
    /// thinned out at powers of two, so a flood of forgeries cannot flood the log).
    refused: u64,
    /// The hosts whose gateways want a whole account of this host's entities (they came back,
    /// or asked): the presence loop sends each one its own at its next tick.
    wanted_by: std::collections::BTreeSet<String>,
    /// The hosts sent a whole account they asked for within the last second, and when: they
    /// wait for the next.
    answered: HashMap<String, tokio::time::Instant>,
    /// When this gateway last asked every other for a whole account (its roster queue new).
    asked: Option<tokio::time::Instant>,
    /// Whether the broker refused a heartbeat addressed to one host (the login lacks the
    /// permission): whole accounts asked for go to all.
    addressing_off: bool,
    /// Whether this gateway heard a change built on a whole account it missed: the presence
    /// loop asks the others for whole accounts at its next tick.
    resync_wanted: bool,
    /// Carried messages whose first publish still runs: the outbox's flush leaves them be.
    carrying: std::collections::HashSet<MsgId>,
    /// When the presence loop last started a flush of the outbox.
    flushed: Option<tokio::time::Instant>,
}

/// The most published messages whose way is remembered in memory only (the store failing);
/// past it they are let go.
const MAX_SENT_PENDING: usize = 10_000;

impl FedState {
    /// Notes where `(msg_id, host, from, to)` went, before it goes.
    fn note_sent(&mut self, (msg_id, host, from, to): &Sent) {
        if self.sent_pending.len() >= MAX_SENT_PENDING {
            self.sent_pending.clear();
        }
        self.sent_pending
            .insert((*msg_id, host.clone()), (*from, *to));
    }

    /// The store has where `(msg_id, host, …)` went.
    fn sent_kept(&mut self, (msg_id, host, _, _): &Sent) {
        self.sent_pending.remove(&(*msg_id, host.clone()));
    }

    /// The hosts to send a whole account to now: those that want one and were not sent one
    /// within the last second (at most one a second each, however often it asks).
    fn due_askers(&mut self) -> Vec<String> {
        let now = tokio::time::Instant::now();
        self.answered
            .retain(|_, at| now.duration_since(*at) < presence::WHOLE_AT_MOST_EVERY);
        let due: Vec<String> = self
            .wanted_by
            .iter()
            .filter(|host| !self.answered.contains_key(*host))
            .cloned()
            .collect();
        for host in &due {
            self.wanted_by.remove(host);
            self.answered.insert(host.clone(), now);
        }
        due
    }

    /// Stops every inbox consumer of the current link.
    fn stop_consumers(&mut self) {
        for (_, token) in self.consumers.drain() {
            token.cancel();
        }
    }
}

impl Federation {
    /// The federated plane for `broker` of gateway `host_id`, signing with `key` and writing
    /// its audit log into `state_dir`; an error names what is wrong with the trust table. It is
    /// made shared, knowing itself, so the tasks it starts can hold it.
    pub fn new(
        broker: BrokerConfig,
        config: FederationConfig,
        state_dir: &Path,
        host_id: &str,
        key: SigningKey,
    ) -> Result<Arc<Self>, String> {
        let mut trust = config.trust_table()?;
        let allow = config.allow_table()?;
        trust.pin_own(host_id, key.verifying_key(), broker.login());
        let audit = AuditLog::open(
            state_dir.join("audit.jsonl"),
            config.audit_max_bytes,
            config.audit_keep_files,
        );
        let audit = AuditWriter::start(audit)
            .map_err(|e| format!("cannot start the audit log's writer: {e}"))?;
        let caps = RosterCaps {
            hosts: config.max_remote_hosts,
            entities_per_host: config.max_remote_entities_per_host,
        };
        // A quiet host's entries are kept (unreachable) as long as the broker keeps their
        // inboxes unused, so a send to them still waits there; a brief lives on the broker for
        // the message ttl, and ends by then and a bound.
        let lifetime = Duration::from_secs(config.inbox_message_ttl_s);
        let kept = Duration::from_secs(config.inbox_expires_s);
        let state = FedState {
            roster: Roster::new(caps, Duration::from_secs(config.presence_ttl_s), kept),
            receipts: Receipts::new(Duration::from_secs(config.injected_bound_s), lifetime),
            senders: HashMap::new(),
            consumers: HashMap::new(),
            heartbeats_last: HashMap::new(),
            sender_hosts: HashMap::new(),
            sent_pending: HashMap::new(),
            control: HashMap::new(),
            reaped: Vec::new(),
            refused: 0,
            wanted_by: std::collections::BTreeSet::new(),
            answered: HashMap::new(),
            asked: None,
            addressing_off: false,
            resync_wanted: false,
            carrying: std::collections::HashSet::new(),
            flushed: None,
        };
        Ok(Arc::new_cyclic(|me| Self {
            broker,
            config,
            link: tokio_watch::channel(None).0,
            next_node: AtomicUsize::new(0),
            gateway_gid: Gid::mint(),
            state: Mutex::new(state),
            audit,
            key,
            trust,
            allow,
            roster_heard: tokio_watch::channel(0).0,
            outbox_waiting: AtomicBool::new(true),
            flushing: tokio::sync::Mutex::new(()),
            ledger: tokio::sync::Mutex::new(Ledger::new()),
            me: me.clone(),
        }))
    }

    /// This federation, shared, for a task it starts. A federation is only ever made shared
    /// ([`Federation::new`]) and a method runs on a live one, so this is always there; were it
    /// not, that is said loudly.
    fn me(&self) -> Option<Arc<Self>> {
        let me = self.me.upgrade();
        if me.is_none() {
            tracing::error!(
                "the federation was let go while it still ran: a task of it did not start"
            );
        }
        me
    }

    /// Starts `task` on this federation and gateway `g`, among the gateway's tasks.
    fn start_task<T, F>(&self, g: &Arc<LocalPlane>, task: T)
    where
        T: FnOnce(Arc<Self>, Arc<LocalPlane>) -> F,
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if let Some(fed) = self.me() {
            g.tasks.spawn(task(fed, Arc::clone(g)));
        }
    }

    /// How many hosts' keys are taken (this one's own included).
    pub fn pinned_hosts(&self) -> usize {
        self.trust.len()
    }

    /// This gateway's signature of `envelope` carrying `body`.
    fn sign(&self, envelope: &Envelope, body: &[u8]) -> Signature {
        signature(&self.key, envelope, body)
    }

    fn lock(&self) -> MutexGuard<'_, FedState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn link(&self) -> Option<Arc<dyn Broker>> {
        self.link.borrow().clone().filter(|l| l.is_up())
    }

    /// Whether a message that finds the link down waits for the next one
    /// (`broker.failover_wait_s`).
    fn fails_over(&self) -> bool {
        self.broker.failover_wait_s > 0
    }

    /// The live link; when there is none, the next one, waited for `broker.failover_wait_s` (a
    /// cluster's gateway connecting to a surviving node). Nothing is queued meanwhile: the
    /// caller waits, and fails when no link comes.
    async fn link_soon(&self) -> Option<Arc<dyn Broker>> {
        if let Some(link) = self.link() {
            return Some(link);
        }
        if !self.fails_over() {
            return None;
        }
        let mut links = self.link.subscribe();
        let next = async {
            loop {
                let up = links.borrow_and_update().clone().filter(|l| l.is_up());
                if up.is_some() {
                    return up;
                }
                if links.changed().await.is_err() {
                    return None;
                }
            }
        };
        let wait = Duration::from_secs(self.broker.failover_wait_s);
        tokio::time::timeout(wait, next).await.ok().flatten()
    }

    /// Publishes `message` on `link`; when the link broke under it (no confirm came, and it is
    /// down now) and the link fails over, once more on the next link. The first copy may have
    /// reached the broker: its recipient's gateway takes one (it drops a second as a replay).
    async fn publish_over(
        &self,
        link: Arc<dyn Broker>,
        message: fleet_amqp::Outgoing<'_>,
    ) -> Result<Published, AmqpError> {
        match link.publish(message).await {
            Err(e) if e.retry() && !link.is_up() && self.fails_over() => {
                let Some(next) = self.link_soon().await else {
                    return Err(e);
                };
                tracing::warn!(msg_id = %message.envelope.msg_id, error = %e, "the broker link broke under a publish: publishing it again on the next link");
                next.publish(message).await
            }
            published => published,
        }
    }

    /// One audit line: what moved, never its text.
    fn audit(&self, envelope: &Envelope, size: usize, outcome: &str) {
        self.audit.hop(envelope, size, outcome);
    }

    /// Notes a message from another host now held here, with its audit line: an answer ends
    /// the wait for its brief's receipt (the brief it answers, if its record in the store is
    /// then to go).
    fn held(&self, envelope: &Envelope, size: usize) -> Option<MsgId> {
        self.audit(envelope, size, "held");
        let original = envelope.in_reply_to?;
        if !matches!(envelope.kind, Kind::Reply | Kind::Failed) {
            return None;
        }
        let mut state = self.lock();
        // Only a brief still awaiting its receipt has a record in the store to go (a receipt
        // that came settled it already): no store call for every reply.
        let awaited = state.receipts.state(original) == Some("queued");
        state.receipts.forget(original);
        awaited.then_some(original)
    }

    /// The host remote entity `gid` is on: as the roster knows it (or last knew it), else as
    /// its last checked message said.
    fn host_of(&self, gid: Gid) -> Option<String> {
        let state = self.lock();
        state
            .roster
            .entity(gid)
            .map(|e| &e.entity)
            .or_else(|| state.roster.departed(gid))
            .map(|e| e.host.clone())
            .or_else(|| state.sender_hosts.get(&gid).cloned())
    }
}

fn unavailable(what: &str) -> FleetError {
    FleetError::new(
        ErrorCode::BrokerUnavailable,
        format!("the broker cannot be reached, so {what}; same-host traffic still works"),
    )
}

/// A publish's outcome as its audit line names it; `refused` says what refused it.
pub(in crate::gateway) fn publish_outcome(
    published: &Result<Published, AmqpError>,
    refused: &'static str,
) -> &'static str {
    match published {
        Ok(Published::Routed) => "published",
        Ok(Published::Unroutable) => "unroutable",
        Ok(Published::Refused) => refused,
        Err(_) => "broker unavailable",
    }
}

/// A failed publish as the domain sees it: the broker is unavailable (whatever the link said).
pub(in crate::gateway) fn not_taken(err: AmqpError) -> FleetError {
    FleetError::new(ErrorCode::BrokerUnavailable, err.to_string())
}

impl Federation {
    /// Notes the name and host a remote sender gave, for showing its messages.
    fn remember_remote_name(&self, g: &LocalPlane, gid: Gid, name: &str, host: Option<&str>) {
        if g.sessions.lock().is_local(gid) {
            return;
        }
        let mut state = self.lock();
        if state.senders.len() >= MAX_SENDER_NAMES {
            state.senders.clear();
        }
        if state.sender_hosts.len() >= MAX_SENDER_NAMES {
            state.sender_hosts.clear();
        }
        let shown = match host {
            Some(host) => {
                state.sender_hosts.insert(gid, host.to_string());
                format!("{name}@{host}")
            }
            None => name.to_string(),
        };
        state.senders.insert(gid, shown);
    }

    /// Whether `message` (for another host) is this gateway's to carry through a broker outage
    /// (the rule: [`carried`]), its recipient's role as the roster knows or last knew it.
    pub(in crate::gateway) fn carries(&self, message: &Message) -> bool {
        let to_pane = {
            let state = self.lock();
            state
                .roster
                .entity(message.to)
                .map(|e| &e.entity)
                .or_else(|| state.roster.departed(message.to))
                .is_none_or(|e| e.role.is_pane_bound())
        };
        carried(message.kind, to_pane)
    }
}
