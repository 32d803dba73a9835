//! The federated plane (spec 10): this gateway's side of the broker. It keeps the link up
//! (connecting again after an outage and declaring everything anew), consumes the inboxes of
//! its local entities and its roster queue, publishes messages to remote entities, presence
//! for its own, and the `INJECTED` receipts of remote briefs.
//!
//! Forward path (a brief into a local worker): at most once. The brief stays unacknowledged
//! on the broker while the worker is busy, is acknowledged when the worker turns idle, then
//! goes into the local plane to be typed in; once the submit is verified the sender's gateway
//! gets `INJECTED`. Pull path (anything held for an entity): at least once — acknowledged
//! only after the local store holds it, duplicates dropped by message id.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fleet_core::bounds::{Full, RosterCaps, RosterCount, admit_remote_entity, admit_remote_host};
use fleet_core::entity::validate_name;
use fleet_core::envelope::{Envelope, EnvelopeError, VERSION};
use fleet_core::typed::typeable;
use fleet_core::{Entity, ErrorCode, FleetError, Gid, Kind, Message, MsgId, MsgState, TraceId};
use futures_util::{FutureExt, StreamExt};
use lapin::Consumer;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch as tokio_watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Gateway;
use super::messages::Placement;
use super::sessions::now_ms;
use crate::audit::AuditLog;
use crate::broker::{
    BROADCAST_ALL, Link, LinkError, MSG_EXCHANGE, Published, ROSTER_EXCHANGE, broadcast_key,
    decode, roster_key,
};
use crate::config::{BrokerConfig, FederationConfig, redacted_uri};

/// The longest pause between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The first pause after a failed connection attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// How often receipts and presence are checked for expiry.
const SWEEP_INTERVAL: Duration = Duration::from_millis(250);
/// How long an injected remote brief's bookkeeping is kept while its answer is awaited.
const INJECTED_KEPT: Duration = Duration::from_secs(3_600);
/// How many remote senders' names are kept (then forgotten all at once).
const MAX_SENDER_NAMES: usize = 10_000;
/// The most deliveries taken off an inbox at once (held ones are stored together).
const DELIVERY_BATCH: usize = 64;
/// The routing-key name of a host's own roster entry.
const GATEWAY_ENTRY: &str = "_gateway";

/// What a presence heartbeat carries.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Presence {
    /// The entity; none for the host's own entry.
    entity: Option<Entity>,
    /// Its status (`gone` when it leaves).
    status: String,
    /// For the host entry: the profiles it can spawn.
    #[serde(default)]
    profiles: Vec<String>,
}

/// A remote entity as the roster last heard of it.
struct RemoteEntry {
    entity: Entity,
    status: String,
    heard: Instant,
    heard_ms: i64,
}

/// A remote host as its gateway entry last told.
struct RemoteHost {
    profiles: Vec<String>,
    heard: Instant,
    heard_ms: i64,
}

/// A brief this gateway published, awaiting its `INJECTED` receipt.
struct Pending {
    sender: Gid,
    recipient: Gid,
    trace_id: TraceId,
    injected: bool,
    deadline: Instant,
}

/// One host as `fleet_list` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct HostView {
    /// The host id.
    pub host: String,
    /// `up`, or `unknown` while the broker cannot be reached.
    pub status: String,
    /// The profiles it can spawn.
    pub profiles: Vec<String>,
    /// When its gateway was last heard of (Unix ms); none for this host.
    pub last_seen_ms: Option<i64>,
}

/// The broker side of a gateway.
pub struct Federation {
    broker: BrokerConfig,
    config: FederationConfig,
    /// The live link; `None` while the broker is unreachable.
    link: tokio_watch::Sender<Option<Arc<Link>>>,
    /// The gid this gateway's own presence entry is published under.
    gateway_gid: Gid,
    state: Mutex<FedState>,
    /// The audit log: one line per broker hop, never a message's text.
    audit: Mutex<AuditLog>,
}

#[derive(Default)]
struct FedState {
    remote: HashMap<Gid, RemoteEntry>,
    hosts: HashMap<String, RemoteHost>,
    /// How many heartbeats the roster's caps made it ignore (the log says so at powers of two:
    /// loud at first, never a flood of its own).
    ignored_heartbeats: u64,
    pending: HashMap<MsgId, Pending>,
    /// The names remote senders gave in their messages (`name@host`), for showing them.
    senders: HashMap<Gid, String>,
    /// The inbox consumers running on the current link.
    consumers: HashMap<Gid, CancellationToken>,
}

impl FedState {
    /// What the roster holds, as a heartbeat from `host` finds it.
    fn count(&self, host: &str) -> RosterCount {
        let mut hosts: HashSet<&str> = self.hosts.keys().map(String::as_str).collect();
        let mut entities_of_host = 0;
        for entry in self.remote.values() {
            hosts.insert(&entry.entity.host);
            if entry.entity.host == host {
                entities_of_host += 1;
            }
        }
        RosterCount {
            hosts: hosts.len(),
            host_known: hosts.contains(host),
            entities_of_host,
        }
    }

    /// Notes a heartbeat from `host` ignored at the roster's cap `full`.
    fn ignored(&mut self, host: &str, full: &Full) {
        self.ignored_heartbeats += 1;
        let ignored = self.ignored_heartbeats;
        if ignored.is_power_of_two() {
            tracing::error!(%host, cap = %full, ignored, "REFUSED a roster entry over the cap: heartbeat ignored (a flood of forged presence?)");
        }
    }
}

impl Federation {
    /// The federated plane for `broker`, writing its audit log into `state_dir`.
    pub fn new(broker: BrokerConfig, config: FederationConfig, state_dir: &Path) -> Self {
        let audit = AuditLog::open(
            state_dir.join("audit.jsonl"),
            config.audit_max_bytes,
            config.audit_keep_files,
        );
        Self {
            broker,
            config,
            link: tokio_watch::channel(None).0,
            gateway_gid: Gid::mint(),
            state: Mutex::new(FedState::default()),
            audit: Mutex::new(audit),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FedState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn link(&self) -> Option<Arc<Link>> {
        self.link.borrow().clone().filter(|l| l.is_up())
    }

    /// One audit line: what moved, never its text.
    fn audit(&self, envelope: &Envelope, size: usize, outcome: &str) {
        let line = json!({
            "ts_ms": now_ms(),
            "trace_id": envelope.trace_id,
            "msg_id": envelope.msg_id,
            "kind": envelope.kind,
            "from": envelope.from,
            "to": envelope.to,
            "size": size,
            "outcome": outcome,
        });
        self.audit
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .append(&line.to_string());
    }

    /// Notes a message from another host now held here: an answer ends the wait for its
    /// brief's receipt; and the audit line.
    fn held(&self, envelope: &Envelope, size: usize) {
        if let Some(original) = envelope.in_reply_to
            && matches!(envelope.kind, Kind::Reply | Kind::Failed)
        {
            self.lock().pending.remove(&original);
        }
        self.audit(envelope, size, "held");
    }

    /// The name of a remote entity: as the roster knows it, else as its last message said.
    pub(super) fn remote_name(&self, gid: Gid) -> Option<String> {
        let state = self.lock();
        state
            .remote
            .get(&gid)
            .map(|e| e.entity.name.clone())
            .or_else(|| state.senders.get(&gid).cloned())
    }

    /// The remote entities, for routing.
    pub(super) fn remote_entities(&self) -> Vec<Entity> {
        self.lock()
            .remote
            .values()
            .map(|e| e.entity.clone())
            .collect()
    }

    /// Stops tracking a brief that was not published after all.
    pub(super) fn forget_brief(&self, msg_id: MsgId) {
        self.lock().pending.remove(&msg_id);
    }

    /// The state of a brief this gateway published, if it still tracks it.
    pub(super) fn pending_state(&self, msg_id: MsgId) -> Option<&'static str> {
        self.lock()
            .pending
            .get(&msg_id)
            .map(|p| if p.injected { "injected" } else { "queued" })
    }
}

fn unavailable(what: &str) -> FleetError {
    FleetError::new(
        ErrorCode::BrokerUnavailable,
        format!("the broker cannot be reached, so {what}; same-host traffic still works"),
    )
}

impl Gateway {
    fn fed(&self) -> Option<&Federation> {
        self.federation.as_ref()
    }

    /// Connects to the broker (a broker that refuses our topology is a start-up error; one
    /// that cannot be reached is retried in the background) and starts the link keeper and
    /// the presence loop.
    pub(super) async fn start_federation(self: &Arc<Self>) -> Result<(), FleetError> {
        let Some(fed) = self.fed() else {
            return Ok(());
        };
        tracing::info!(uri = %redacted_uri(&fed.broker.uri), host_id = %self.host_id, "federated plane on");
        match self.connect_link().await {
            Ok(()) => {}
            Err(e) if !e.retry => {
                return Err(FleetError::internal(format!("broker: {}", e.message)));
            }
            Err(e) => {
                tracing::warn!(error = %e, "the broker cannot be reached yet; same-host traffic works, retrying")
            }
        }
        let gateway = Arc::clone(self);
        self.tasks.spawn(async move { gateway.keep_link().await });
        let gateway = Arc::clone(self);
        self.tasks
            .spawn(async move { gateway.presence_loop().await });
        Ok(())
    }

    /// Connects, declares, and attaches the roster and every local inbox.
    async fn connect_link(self: &Arc<Self>) -> Result<(), LinkError> {
        let Some(fed) = self.fed() else {
            return Ok(());
        };
        let link = Arc::new(Link::connect(&fed.broker, &fed.config, &self.host_id).await?);
        let attached = async {
            let roster = link.open_roster(&self.host_id).await?;
            let gateway = Arc::clone(self);
            self.tasks
                .spawn(async move { gateway.consume_roster(roster).await });
            let local = self.lock().entities();
            for entity in &local {
                self.attach_inbox(&link, entity).await?;
            }
            Ok::<usize, LinkError>(local.len())
        };
        match attached.await {
            Ok(inboxes) => {
                fed.link.send_replace(Some(Arc::clone(&link)));
                tracing::info!(host_id = %self.host_id, inboxes, "broker link up");
                self.publish_presence().await;
                Ok(())
            }
            Err(e) => {
                // Half attached: let go of all of it, so the next attempt starts clean.
                for (_, token) in fed.lock().consumers.drain() {
                    token.cancel();
                }
                link.close().await;
                Err(e)
            }
        }
    }

    /// Keeps the link up: waits for it to fail, then connects again with backoff.
    async fn keep_link(self: Arc<Self>) {
        let Some(fed) = self.fed() else {
            return;
        };
        let mut backoff = FIRST_BACKOFF;
        loop {
            if let Some(link) = fed.link() {
                tokio::select! {
                    () = link.closed() => {}
                    () = self.shutdown.cancelled() => {
                        self.leave_roster().await;
                        // The workers go with fleetd: so do their inboxes (the leads' stay,
                        // holding what arrives for them meanwhile).
                        let panes: Vec<Gid> = self.lock().panes.keys().copied().collect();
                        for gid in panes {
                            if let Err(e) = link.delete_inbox(gid).await {
                                tracing::debug!(%gid, error = %e, "inbox not deleted");
                            }
                        }
                        link.close().await;
                        return;
                    }
                }
                tracing::warn!(
                    "the broker link is down; remote entities read unknown, remote sends fail fast"
                );
                fed.link.send_replace(None);
                for (_, token) in fed.lock().consumers.drain() {
                    token.cancel();
                }
                backoff = FIRST_BACKOFF;
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.shutdown.cancelled() => return,
            }
            let connected = tokio::select! {
                connected = self.connect_link() => connected,
                () = self.shutdown.cancelled() => return,
            };
            match connected {
                Ok(()) => backoff = FIRST_BACKOFF,
                Err(e) => {
                    if e.retry {
                        tracing::debug!(error = %e, "the broker is still unreachable");
                    } else {
                        // Say so loudly, and keep trying: after a crash the broker may hold a
                        // dead gateway's exclusive consumers until its heartbeat runs out.
                        tracing::error!(error = %e, "the broker refuses this gateway's topology; retrying");
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Declares `entity`'s inbox and starts consuming it.
    async fn attach_inbox(self: &Arc<Self>, link: &Link, entity: &Entity) -> Result<(), LinkError> {
        let Some(fed) = self.fed() else {
            return Ok(());
        };
        let keys: Vec<String> = if entity.role.is_injected() {
            std::iter::once(BROADCAST_ALL.to_string())
                .chain(entity.groups.iter().map(|g| broadcast_key(g)))
                .collect()
        } else {
            Vec::new()
        };
        let consumer = link.open_inbox(entity.gid, &keys).await?;
        let token = self.shutdown.child_token();
        if let Some(old) = fed.lock().consumers.insert(entity.gid, token.clone()) {
            old.cancel();
        }
        let gateway = Arc::clone(self);
        let owner = entity.gid;
        self.tasks.spawn(async move {
            gateway.consume_inbox(owner, consumer, token).await;
        });
        Ok(())
    }

    /// A local entity joined (a worker became ready): give it an inbox on the broker.
    pub(super) async fn federation_joined(self: &Arc<Self>, gid: Gid) {
        let Some(link) = self.fed().and_then(Federation::link) else {
            return;
        };
        let Some(entity) = self.lock().entities().into_iter().find(|e| e.gid == gid) else {
            return;
        };
        if let Err(e) = self.attach_inbox(&link, &entity).await {
            tracing::error!(%gid, error = %e, "cannot attach the inbox");
        }
        self.publish_presence().await;
    }

    /// A local entity left: its inbox goes (and its broadcast bindings with it), and the other
    /// gateways hear it is gone.
    pub(super) async fn federation_left(self: &Arc<Self>, entity: &Entity) {
        let Some(fed) = self.fed() else {
            return;
        };
        if let Some(token) = fed.lock().consumers.remove(&entity.gid) {
            token.cancel();
        }
        let Some(link) = fed.link() else {
            return;
        };
        if let Err(e) = link.delete_inbox(entity.gid).await {
            tracing::warn!(gid = %entity.gid, error = %e, "cannot delete the inbox");
        }
        self.announce(&link, Some(entity.clone()), "gone".into(), Vec::new())
            .await;
    }

    /// Consumes `owner`'s inbox until the link or the entity goes.
    async fn consume_inbox(
        self: Arc<Self>,
        owner: Gid,
        mut consumer: Consumer,
        stop: CancellationToken,
    ) {
        loop {
            let mut next = tokio::select! {
                next = consumer.next() => next,
                () = stop.cancelled() => return,
            };
            // What has arrived already comes along, so that held messages are stored in one
            // transaction and acknowledged in one frame.
            let mut batch = Vec::new();
            let ended = loop {
                match next {
                    Some(Ok(delivery)) => batch.push(delivery),
                    Some(Err(e)) => {
                        tracing::warn!(%owner, error = %e, "inbox consumer failed");
                        break true;
                    }
                    None => break true,
                }
                if batch.len() >= DELIVERY_BATCH {
                    break false;
                }
                match consumer.next().now_or_never() {
                    Some(more) => next = more,
                    None => break false,
                }
            };
            if !self.on_deliveries(owner, batch, &stop).await || ended {
                return;
            }
        }
    }

    /// Messages off `owner`'s inbox, in their order; false if the consumer is to stop (what
    /// is left of the batch stays unacknowledged, for the broker to deliver again).
    async fn on_deliveries(
        self: &Arc<Self>,
        owner: Gid,
        batch: Vec<Delivery>,
        stop: &CancellationToken,
    ) -> bool {
        let mut held = Vec::new();
        for delivery in batch {
            let Some((envelope, body)) = self.admit(owner, &delivery).await else {
                continue;
            };
            let to_pane = self.lock().panes.contains_key(&owner);
            if held_kind(envelope.kind, to_pane) {
                held.push(Incoming {
                    message: incoming(&envelope, owner, body),
                    envelope,
                    delivery,
                });
                continue;
            }
            self.hold_all(std::mem::take(&mut held)).await;
            if !self
                .on_delivery(owner, delivery, envelope, body, stop)
                .await
            {
                return false;
            }
        }
        self.hold_all(held).await;
        true
    }

    /// Checks a delivery: its envelope and body, or it is dead-lettered (malformed, of a newer
    /// version, for another recipient, expired, or not text) with a loud log line.
    async fn admit(
        self: &Arc<Self>,
        owner: Gid,
        delivery: &Delivery,
    ) -> Option<(Envelope, String)> {
        let fed = self.fed()?;
        let envelope = match decode(delivery) {
            Ok(envelope) => envelope,
            Err(e) => {
                match &e {
                    EnvelopeError::NewerMajor { .. } => tracing::error!(
                        %owner, error = %e, supported = %VERSION,
                        "REFUSED a message of a newer envelope version: dead-lettered (upgrade this gateway)"
                    ),
                    _ => {
                        tracing::error!(%owner, error = %e, "REFUSED a malformed message: dead-lettered")
                    }
                }
                reject(delivery).await;
                return None;
            }
        };
        let (trace_id, msg_id, kind) = (envelope.trace_id, envelope.msg_id, envelope.kind);
        let size = delivery.data.len();
        let to_ok = envelope.to == owner.to_string()
            || (envelope.kind == Kind::Broadcast
                && envelope.to == delivery.routing_key.as_str()
                && envelope.to.starts_with("broadcast."));
        if !to_ok {
            tracing::error!(%trace_id, %msg_id, %owner, to = %envelope.to, "REFUSED a message whose recipient is not this inbox: dead-lettered");
            fed.audit(&envelope, size, "refused: recipient mismatch");
            reject(delivery).await;
            return None;
        }
        if envelope.expired(u64::try_from(now_ms()).unwrap_or(0)) {
            tracing::warn!(%trace_id, %msg_id, %kind, "expired before delivery: dead-lettered");
            fed.audit(&envelope, size, "expired");
            reject(delivery).await;
            return None;
        }
        let limit = self.config.gateway.max_message_bytes;
        if size > limit {
            let why = format!(
                "{size} bytes, over the {limit} bytes its recipient's gateway takes (gateway.max_message_bytes)"
            );
            self.refuse_and_tell(owner, &envelope, delivery, "too large", &why)
                .await;
            return None;
        }
        let Ok(body) = String::from_utf8(delivery.data.clone()) else {
            tracing::error!(%trace_id, %msg_id, "REFUSED a message whose body is not UTF-8: dead-lettered");
            reject(delivery).await;
            return None;
        };
        // A name from another host is shown and typed (a reply's label): kept only if valid.
        if let Some(name) = &envelope.from_name
            && validate_name("sender name", name).is_ok()
        {
            self.remember_remote_name(envelope.from, name, envelope.from_host.as_deref());
        }
        Some((envelope, body))
    }

    /// Dead-letters a delivery that breaks a rule of this gateway, with a loud log line and an
    /// audit line, and tells its sender with a `FAILED` notice when it is a message one waits
    /// on (not a notice or a receipt, which would only start a loop).
    async fn refuse_and_tell(
        self: &Arc<Self>,
        owner: Gid,
        envelope: &Envelope,
        delivery: &Delivery,
        rule: &str,
        why: &str,
    ) {
        let (trace_id, msg_id, kind) = (envelope.trace_id, envelope.msg_id, envelope.kind);
        tracing::error!(%trace_id, %msg_id, %kind, %owner, rule, why, "REFUSED a message off the broker: dead-lettered");
        if let Some(fed) = self.fed() {
            fed.audit(envelope, delivery.data.len(), &format!("refused: {rule}"));
        }
        if matches!(
            kind,
            Kind::Send | Kind::Broadcast | Kind::Reply | Kind::Ask | Kind::Answer
        ) {
            let original = incoming(envelope, owner, String::new());
            self.notify_failed(
                &original,
                &format!("refused by its recipient's gateway: {why}"),
            )
            .await;
        }
        reject(delivery).await;
    }

    /// One admitted message off `owner`'s inbox that is not simply held: a brief for a local
    /// worker, a receipt, or a kind an inbox does not take. False if the consumer is to stop.
    async fn on_delivery(
        self: &Arc<Self>,
        owner: Gid,
        delivery: Delivery,
        envelope: Envelope,
        body: String,
        stop: &CancellationToken,
    ) -> bool {
        let Some(fed) = self.fed() else {
            return false;
        };
        let (trace_id, msg_id, kind) = (envelope.trace_id, envelope.msg_id, envelope.kind);
        let size = delivery.data.len();
        match kind {
            Kind::Send | Kind::Broadcast => {
                // Typed into a pane: inert text only, refused before it waits for the worker.
                if let Err(found) = typeable(&body) {
                    self.refuse_and_tell(
                        owner,
                        &envelope,
                        &delivery,
                        "control character",
                        &format!("it holds {found}"),
                    )
                    .await;
                    return true;
                }
                // The brief waits on the broker (unacknowledged) while the worker is busy.
                if !self.await_injectable(owner, stop).await {
                    return false;
                }
                // At most once: acknowledged before it goes anywhere near the pane.
                if delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .is_err()
                {
                    return false;
                }
                let local_id = if kind == Kind::Broadcast {
                    msg_id.derived(&owner.to_string())
                } else {
                    msg_id
                };
                let message = Message {
                    msg_id: local_id,
                    in_reply_to: None,
                    state: MsgState::Queued,
                    ..incoming(&envelope, owner, body)
                };
                fed.audit(&envelope, size, "taken");
                if let Err(e) = self.deliver(message.clone()).await {
                    // Taken off the broker already (at most once): its sender is told.
                    tracing::error!(%trace_id, %msg_id, error = %e, "a taken brief could not be queued");
                    self.notify_failed(
                        &message,
                        &format!("not queued by its recipient's gateway: {}", e.message),
                    )
                    .await;
                }
            }
            Kind::Injected => {
                if let Some(original) = envelope.in_reply_to
                    && let Some(pending) = fed.lock().pending.get_mut(&original)
                {
                    pending.injected = true;
                    pending.deadline = Instant::now() + INJECTED_KEPT;
                }
                tracing::info!(%trace_id, %msg_id, in_reply_to = ?envelope.in_reply_to, "remote brief injected");
                fed.audit(&envelope, size, "receipt");
                let _ = delivery.acker.ack(BasicAckOptions::default()).await;
            }
            _ => {
                tracing::error!(%trace_id, %msg_id, %kind, "REFUSED a message this inbox does not take: dead-lettered");
                fed.audit(&envelope, size, "refused: kind");
                reject(&delivery).await;
            }
        }
        true
    }

    /// Holds messages for local entities (the pull path), stored in one transaction and then
    /// acknowledged in one frame: at least once, never acknowledged before the store has them.
    /// One whose recipient has no place to hold it any more goes the ordinary way.
    async fn hold_all(self: &Arc<Self>, incoming: Vec<Incoming>) {
        let Some(fed) = self.fed() else {
            return;
        };
        let (kept, others): (Vec<Incoming>, Vec<Incoming>) = incoming
            .into_iter()
            .partition(|i| self.placement(&i.message) == Placement::Hold);
        for other in others {
            let to = other.message.to;
            match self.deliver(other.message).await.map(|_| ()) {
                // Over a cap: refused for good (requeued, it would only come straight back).
                Err(e) if e.code == ErrorCode::TooMany => {
                    self.refuse_and_tell(
                        to,
                        &other.envelope,
                        &other.delivery,
                        "too many",
                        &e.message,
                    )
                    .await;
                }
                delivered => {
                    if delivered.is_ok() {
                        fed.held(&other.envelope, other.delivery.data.len());
                    }
                    settle(&other.envelope, &other.delivery, delivered, false).await;
                }
            }
        }
        let Some(last) = kept.last() else {
            return;
        };
        tracing::debug!(
            count = kept.len(),
            "holding messages off the broker together"
        );
        let outcomes = match self
            .hold(kept.iter().map(|i| i.message.clone()).collect())
            .await
        {
            Ok(outcomes) => outcomes,
            Err(e) => return settle(&last.envelope, &last.delivery, Err(e), true).await,
        };
        // Those over the cap are dead-lettered first, one by one; then one frame acknowledges
        // the rest (an acknowledgement covers only what is still unsettled).
        let mut last_held = None;
        for (i, outcome) in kept.iter().zip(outcomes) {
            match outcome {
                Ok(()) => {
                    fed.held(&i.envelope, i.delivery.data.len());
                    last_held = Some(i);
                }
                Err(full) => {
                    let why = format!(
                        "its recipient already has {} messages waiting, the most allowed ({full})",
                        full.count
                    );
                    self.refuse_and_tell(i.message.to, &i.envelope, &i.delivery, "too many", &why)
                        .await;
                }
            }
        }
        if let Some(last) = last_held {
            settle(&last.envelope, &last.delivery, Ok(()), true).await;
        }
    }

    /// Waits until `gid`'s session can take a task (or is gone, when the brief fails as any
    /// other would); false if the consumer stops first.
    async fn await_injectable(&self, gid: Gid, stop: &CancellationToken) -> bool {
        let Some(mut kick) = self.lock().panes.get(&gid).map(|s| s.kick.subscribe()) else {
            return true;
        };
        loop {
            kick.borrow_and_update();
            let ready = match self.lock().panes.get(&gid) {
                Some(s) => !s.status.is_live() || s.takes_task(),
                None => true,
            };
            if ready {
                return true;
            }
            tokio::select! {
                changed = kick.changed() => if changed.is_err() { return true },
                () = stop.cancelled() => return false,
            }
        }
    }

    /// Notes the name and host a remote sender gave, for showing its messages.
    fn remember_remote_name(&self, gid: Gid, name: &str, host: Option<&str>) {
        let Some(fed) = self.fed() else {
            return;
        };
        if self.lock().is_local(gid) {
            return;
        }
        let mut state = fed.lock();
        if state.senders.len() >= MAX_SENDER_NAMES {
            state.senders.clear();
        }
        let shown = match host {
            Some(host) => format!("{name}@{host}"),
            None => name.to_string(),
        };
        state.senders.insert(gid, shown);
    }

    /// Whether messages to `gid` leave through the broker: federation is on and `gid` is not
    /// an entity of this gateway.
    pub(super) fn is_remote(&self, gid: Gid) -> bool {
        self.fed().is_some() && !self.lock().is_local(gid)
    }

    /// Publishes `message` to its remote recipient's inbox. Unroutable (no such inbox) and
    /// refused (inbox full) are errors, as is an unreachable broker: nothing is buffered.
    pub(super) async fn publish_remote(&self, message: &Message) -> Result<Placement, FleetError> {
        let Some(fed) = self.fed() else {
            return Ok(Placement::Dead);
        };
        let Some(link) = fed.link() else {
            return Err(unavailable(&format!(
                "'{}' on another host cannot be reached now; nothing was queued",
                self.name_of(message.to).await
            )));
        };
        let envelope = Envelope {
            in_reply_to: message.in_reply_to,
            from_name: Some(self.name_of(message.from).await),
            ..self.outgoing(
                message.kind,
                (message.msg_id, message.trace_id),
                message.from,
                message.to.to_string(),
                fed.config.inbox_message_ttl_s,
            )
        };
        let body = message.body.as_bytes();
        let published = link
            .publish(MSG_EXCHANGE, &envelope.to, &envelope, body, true, true)
            .await;
        let outcome = match &published {
            Ok(Published::Routed) => "published",
            Ok(Published::Unroutable) => "unroutable",
            Ok(Published::Refused) => "refused: inbox full",
            Err(_) => "broker unavailable",
        };
        fed.audit(&envelope, body.len(), outcome);
        tracing::info!(trace_id = %message.trace_id, msg_id = %message.msg_id, kind = %message.kind, to = %message.to, outcome, "published");
        let refused = match published? {
            Published::Routed => return Ok(Placement::Remote),
            Published::Unroutable => (
                ErrorCode::Gone,
                "has no inbox on the broker any more: it is gone",
            ),
            Published::Refused => (
                ErrorCode::BrokerUnavailable,
                "has a full inbox; the message was dead-lettered",
            ),
        };
        let to_name = self.name_of(message.to).await;
        Err(FleetError::new(
            refused.0,
            format!("'{to_name}' {}", refused.1),
        ))
    }

    /// An envelope from this gateway, stamped now and expiring after `ttl_s`.
    fn outgoing(
        &self,
        kind: Kind,
        (msg_id, trace_id): (MsgId, TraceId),
        from: Gid,
        to: String,
        ttl_s: u64,
    ) -> Envelope {
        let ts_ms = u64::try_from(now_ms()).unwrap_or(0);
        Envelope {
            version: VERSION,
            kind,
            msg_id,
            trace_id,
            from,
            to,
            turn_id: None,
            spawn_id: None,
            in_reply_to: None,
            from_name: None,
            from_host: Some(self.host_id.clone()),
            ts_ms,
            expires_at_ms: ts_ms.saturating_add(ttl_s.saturating_mul(1000)),
        }
    }

    /// Remembers a brief published to a remote worker, to fail it loudly if its `INJECTED`
    /// receipt does not come in time.
    pub(super) fn track_remote_brief(&self, message: &Message) {
        if let Some(fed) = self.fed() {
            let bound = Duration::from_secs(fed.config.injected_bound_s);
            fed.lock().pending.insert(
                message.msg_id,
                Pending {
                    sender: message.from,
                    recipient: message.to,
                    trace_id: message.trace_id,
                    injected: false,
                    deadline: Instant::now() + bound,
                },
            );
        }
    }

    /// After a brief from a remote sender was typed in and its submit verified: tell the
    /// sender's gateway.
    pub(super) async fn receipt_injected(&self, task: &Message) {
        if !self.is_remote(task.from) {
            return;
        }
        let receipt = Message {
            msg_id: task.msg_id.derived("injected"),
            trace_id: task.trace_id,
            kind: Kind::Injected,
            from: task.to,
            to: task.from,
            in_reply_to: Some(task.msg_id),
            body: String::new(),
            state: MsgState::Held,
            created_ms: now_ms(),
        };
        if let Err(e) = self.publish_remote(&receipt).await {
            tracing::warn!(trace_id = %task.trace_id, msg_id = %task.msg_id, error = %e, "cannot send the INJECTED receipt");
        }
    }

    /// `fleet_broadcast` through the broker: one publish, a copy in every bound inbox.
    /// Returns how many workers the roster knows to be bound.
    pub(super) async fn publish_broadcast(
        &self,
        from: &Entity,
        group: Option<&str>,
        text: &str,
        msg_id: MsgId,
        trace_id: TraceId,
    ) -> Result<usize, FleetError> {
        let Some(fed) = self.fed() else {
            return Err(FleetError::internal("no broker"));
        };
        let Some(link) = fed.link() else {
            return Err(unavailable("the broadcast was not sent"));
        };
        let key = group.map_or_else(|| BROADCAST_ALL.to_string(), broadcast_key);
        let envelope = Envelope {
            from_name: Some(from.name.clone()),
            ..self.outgoing(
                Kind::Broadcast,
                (msg_id, trace_id),
                from.gid,
                key.clone(),
                fed.config.inbox_message_ttl_s,
            )
        };
        // An empty group is legal silence: not mandatory.
        let published = link
            .publish(MSG_EXCHANGE, &key, &envelope, text.as_bytes(), false, true)
            .await;
        fed.audit(
            &envelope,
            text.len(),
            if published.is_ok() {
                "published"
            } else {
                "broker unavailable"
            },
        );
        published?;
        let in_group = |e: &Entity| {
            e.role.is_injected() && group.is_none_or(|g| e.groups.iter().any(|x| x == g))
        };
        let local = self.lock().entities().into_iter().filter(in_group).count();
        let remote = fed
            .lock()
            .remote
            .values()
            .filter(|e| in_group(&e.entity))
            .count();
        Ok(local + remote)
    }

    /// Heartbeats every local entity and the host entry, and expires what went quiet.
    async fn presence_loop(self: Arc<Self>) {
        let Some(fed) = self.fed() else {
            return;
        };
        let interval = Duration::from_secs(fed.config.presence_interval_s);
        let mut next_beat = Instant::now() + interval;
        loop {
            tokio::select! {
                () = tokio::time::sleep(SWEEP_INTERVAL) => {}
                () = self.shutdown.cancelled() => return,
            }
            if Instant::now() >= next_beat {
                self.publish_presence().await;
                next_beat = Instant::now() + interval;
            }
            self.sweep().await;
        }
    }

    /// Publishes the presence of every local entity and of this host.
    async fn publish_presence(&self) {
        let Some(link) = self.fed().and_then(Federation::link) else {
            return;
        };
        let entries: Vec<(Entity, String)> = {
            let sessions = self.lock();
            sessions
                .entities()
                .into_iter()
                .map(|e| {
                    let status = sessions
                        .entry(e.gid)
                        .map(|r| r.status)
                        .unwrap_or_else(|| "unknown".into());
                    (e, status)
                })
                .collect()
        };
        let beats = entries
            .into_iter()
            .map(|(entity, status)| self.announce(&link, Some(entity), status, Vec::new()));
        futures_util::future::join_all(beats).await;
        let profiles = self
            .config
            .profiles
            .iter()
            .map(|p| p.name.clone())
            .collect();
        self.announce(&link, None, "up".into(), profiles).await;
    }

    /// Tells the other gateways this host and its entities are gone.
    async fn leave_roster(&self) {
        let Some(link) = self.fed().and_then(Federation::link) else {
            return;
        };
        let local = self.lock().entities();
        let beats = local
            .into_iter()
            .map(|entity| self.announce(&link, Some(entity), "gone".into(), Vec::new()));
        futures_util::future::join_all(beats).await;
        self.announce(&link, None, "gone".into(), Vec::new()).await;
    }

    /// One presence heartbeat.
    async fn announce(
        &self,
        link: &Link,
        entity: Option<Entity>,
        status: String,
        profiles: Vec<String>,
    ) {
        let Some(fed) = self.fed() else {
            return;
        };
        let (from, who) = match &entity {
            Some(e) => (e.gid, e.gid.to_string()),
            None => (fed.gateway_gid, GATEWAY_ENTRY.to_string()),
        };
        let presence = Presence {
            entity,
            status,
            profiles,
        };
        let Ok(body) = serde_json::to_vec(&presence) else {
            return;
        };
        let envelope = self.outgoing(
            Kind::Presence,
            (MsgId::mint(), TraceId::mint()),
            from,
            ROSTER_EXCHANGE.to_string(),
            fed.config.presence_ttl_s,
        );
        let key = roster_key(&self.host_id, &who);
        if let Err(e) = link
            .publish(ROSTER_EXCHANGE, &key, &envelope, &body, false, false)
            .await
        {
            tracing::debug!(error = %e, "a heartbeat was not published");
        }
    }

    /// Reads the roster queue into the union view until the link goes, or fleetd stops
    /// (whether or not the link's close goes through).
    async fn consume_roster(self: Arc<Self>, mut consumer: Consumer) {
        loop {
            let next = tokio::select! {
                next = consumer.next() => next,
                () = self.shutdown.cancelled() => return,
            };
            match next {
                Some(Ok(delivery)) => self.on_presence(&delivery),
                _ => return,
            }
        }
    }

    fn on_presence(&self, delivery: &Delivery) {
        let Some(fed) = self.fed() else {
            return;
        };
        let Ok(envelope) = decode(delivery) else {
            tracing::warn!("a malformed heartbeat was ignored");
            return;
        };
        let Some(host) = envelope.from_host.clone() else {
            return;
        };
        if host == self.host_id || envelope.kind != Kind::Presence {
            return;
        }
        let Ok(presence) = serde_json::from_slice::<Presence>(&delivery.data) else {
            tracing::warn!(%host, "a heartbeat with an unreadable body was ignored");
            return;
        };
        let (now, now_wall) = (Instant::now(), now_ms());
        let caps = RosterCaps {
            hosts: fed.config.max_remote_hosts,
            entities_per_host: fed.config.max_remote_entities_per_host,
        };
        let mut state = fed.lock();
        match presence.entity {
            Some(entity) if entity.host == host => {
                if presence.status == "gone" {
                    state.remote.remove(&entity.gid);
                } else {
                    if !state.remote.contains_key(&entity.gid)
                        && let Err(full) = admit_remote_entity(state.count(&host), caps)
                    {
                        state.ignored(&host, &full);
                        return;
                    }
                    state.remote.insert(
                        entity.gid,
                        RemoteEntry {
                            entity,
                            status: presence.status,
                            heard: now,
                            heard_ms: now_wall,
                        },
                    );
                }
            }
            Some(entity) => {
                tracing::warn!(%host, claimed = %entity.host, "a heartbeat for an entity of another host was ignored");
            }
            None if presence.status == "gone" => {
                state.hosts.remove(&host);
                state.remote.retain(|_, e| e.entity.host != host);
            }
            None => {
                if let Err(full) = admit_remote_host(state.count(&host), caps) {
                    state.ignored(&host, &full);
                    return;
                }
                state.hosts.insert(
                    host,
                    RemoteHost {
                        profiles: presence.profiles,
                        heard: now,
                        heard_ms: now_wall,
                    },
                );
            }
        }
    }

    /// Expires quiet roster entries, and fails remote briefs whose receipt is overdue.
    async fn sweep(self: &Arc<Self>) {
        let Some(fed) = self.fed() else {
            return;
        };
        let ttl = Duration::from_secs(fed.config.presence_ttl_s);
        let bound = Duration::from_secs(fed.config.injected_bound_s);
        let now = Instant::now();
        let overdue: Vec<(MsgId, Pending)> = {
            let mut state = fed.lock();
            let up = fed.link().is_some();
            if up {
                state
                    .remote
                    .retain(|_, e| now.duration_since(e.heard) < ttl);
                state.hosts.retain(|_, h| now.duration_since(h.heard) < ttl);
            }
            let busy: Vec<Gid> = state
                .remote
                .values()
                .filter(|e| matches!(e.status.as_str(), "busy" | "asking" | "spawning"))
                .map(|e| e.entity.gid)
                .collect();
            for pending in state.pending.values_mut() {
                // Time the recipient spends busy does not count: its brief waits on the broker.
                if !pending.injected && busy.contains(&pending.recipient) {
                    pending.deadline = pending.deadline.max(now + bound);
                }
            }
            let due: Vec<MsgId> = state
                .pending
                .iter()
                .filter(|(_, p)| p.deadline <= now)
                .map(|(id, _)| *id)
                .collect();
            due.into_iter()
                .filter_map(|id| state.pending.remove(&id).map(|p| (id, p)))
                .filter(|(_, p)| !p.injected)
                .collect()
        };
        for (msg_id, pending) in overdue {
            let name = self.name_of(pending.recipient).await;
            let reason = format!(
                "no INJECTED receipt from '{name}' within {} s of it being free: the brief may not have been typed in, and is not retried",
                bound.as_secs()
            );
            tracing::warn!(trace_id = %pending.trace_id, %msg_id, "remote brief not confirmed");
            let original = Message {
                msg_id,
                trace_id: pending.trace_id,
                kind: Kind::Send,
                from: pending.sender,
                to: pending.recipient,
                in_reply_to: None,
                body: String::new(),
                state: MsgState::Queued,
                created_ms: now_ms(),
            };
            Box::pin(self.notify_failed(&original, &reason)).await;
        }
    }

    /// The remote entries for `fleet_list`, and the hosts.
    pub(super) fn remote_view(&self) -> (Vec<super::RosterEntry>, Vec<HostView>) {
        let mut hosts = vec![HostView {
            host: self.host_id.clone(),
            status: "up".into(),
            profiles: self
                .config
                .profiles
                .iter()
                .map(|p| p.name.clone())
                .collect(),
            last_seen_ms: None,
        }];
        let Some(fed) = self.fed() else {
            return (Vec::new(), hosts);
        };
        let up = fed.link().is_some();
        let state = fed.lock();
        let mut entries: Vec<super::RosterEntry> = state
            .remote
            .values()
            .map(|e| super::RosterEntry {
                gid: e.entity.gid,
                name: e.entity.name.clone(),
                host: e.entity.host.clone(),
                role: e.entity.role,
                profile: e.entity.profile.clone(),
                status: if up {
                    e.status.clone()
                } else {
                    "unknown".into()
                },
                agent: None,
                agent_status: None,
                groups: e.entity.groups.clone(),
                pane: None,
                last_seen_ms: Some(e.heard_ms),
                open_calls: None,
            })
            .collect();
        entries.sort_by(|a, b| (&a.host, &a.name).cmp(&(&b.host, &b.name)));
        let mut remote_hosts: Vec<HostView> = state
            .hosts
            .iter()
            .map(|(host, h)| HostView {
                host: host.clone(),
                status: if up { "up".into() } else { "unknown".into() },
                profiles: h.profiles.clone(),
                last_seen_ms: Some(h.heard_ms),
            })
            .collect();
        remote_hosts.sort_by(|a, b| a.host.cmp(&b.host));
        hosts.extend(remote_hosts);
        (entries, hosts)
    }
}

/// A message off an inbox, on its way to be held.
struct Incoming {
    delivery: Delivery,
    envelope: Envelope,
    message: Message,
}

/// Whether a message of `kind` is simply held for its recipient (the pull path): anything but
/// a brief for a worker (typed in), a receipt, or a kind no inbox takes.
fn held_kind(kind: Kind, to_pane: bool) -> bool {
    match kind {
        Kind::Send | Kind::Broadcast => !to_pane,
        Kind::Injected | Kind::Ask | Kind::Presence | Kind::Spawn => false,
        _ => true,
    }
}

/// The local message an envelope from a remote sender makes for `owner`, held (a broadcast
/// is a send like any other once it arrives).
fn incoming(envelope: &Envelope, owner: Gid, body: String) -> Message {
    Message {
        msg_id: envelope.msg_id,
        trace_id: envelope.trace_id,
        kind: if envelope.kind == Kind::Broadcast {
            Kind::Send
        } else {
            envelope.kind
        },
        from: envelope.from,
        to: owner,
        in_reply_to: envelope.in_reply_to,
        body,
        state: MsgState::Held,
        created_ms: i64::try_from(envelope.ts_ms).unwrap_or_else(|_| now_ms()),
    }
}

/// Settles a message that was to be held (with `multiple`, every one before it on its channel
/// too): acknowledged once stored; if it could not be, back to the broker to come again.
async fn settle(
    envelope: &Envelope,
    delivery: &Delivery,
    stored: Result<(), FleetError>,
    multiple: bool,
) {
    if let Err(e) = stored {
        let (trace_id, msg_id) = (envelope.trace_id, envelope.msg_id);
        tracing::error!(%trace_id, %msg_id, error = %e, "cannot hold a message; the broker keeps it");
        let _ = delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                multiple,
            })
            .await;
        return;
    }
    let _ = delivery.acker.ack(BasicAckOptions { multiple }).await;
}

/// Dead-letters a delivery: rejected without requeue, so it goes to `fleet.dlx`.
async fn reject(delivery: &Delivery) {
    let _ = delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await;
}
