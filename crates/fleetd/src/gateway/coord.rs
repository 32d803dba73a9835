//! Lead-to-lead coordination (spec 10 "Lead-to-lead"): each local lead's durable mailbox on the
//! coordinator's vhost, apart from the fleet's, addressed by its coordination id.
//! `fleet_send{coord_id}` publishes there (signed, confirmed, `mandatory`: an id nobody has is
//! `unknown_recipient`); what arrives in a local lead's mailbox passes the trust checks, is held
//! for the lead's pull (acknowledged only once stored, deduplicated by message id) and surfaces
//! through `fleet_poll` with its sender's coordination id. It carries coordination only: it is
//! never typed into a pane and never becomes a task.
//!
//! The rules are `fleet_core::coord`'s, `fleet_core::admission`'s and `fleet_core::trust`'s; the
//! link is kept up by the federated plane's `keep_up`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fleet_amqp::topology::mailbox_queue;
use fleet_amqp::{AmqpError, Broker, Deliveries, Delivery, Link, Outgoing, Published};
use fleet_core::admission::{self, Admission, Arrival, Handled};
use fleet_core::authz::check_coordinate;
use fleet_core::clock::now_ms;
use fleet_core::coord::{check_claim, check_coordination, validate_coord_id};
use fleet_core::envelope::Envelope;
use fleet_core::message::check_size;
use fleet_core::signing::{SigningKey, signature};
use fleet_core::trust::{Refusal, Trust, check_replay, check_seal, check_time};
use fleet_core::{ErrorCode, FleetError, Gid, Kind, MsgId, TraceId};
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;

use super::federation::{
    keep_up, link_settings, loud, message_window, not_taken, outgoing, publish_outcome,
    remember_until, seal_of, settle,
};
use super::views::SendResult;
use super::{Caller, LocalPlane};
use crate::audit::{AuditLog, AuditWriter};
use crate::config::{CoordinatorConfig, FederationConfig};

/// The coordinator side of a gateway: its link to the coordinator's vhost and its leads'
/// mailboxes there.
pub struct Coordinator {
    config: CoordinatorConfig,
    /// The windows, caps and trust settings messages are judged by (`[federation]`'s).
    federation: FederationConfig,
    /// Each local lead's coordination id, by lead name.
    ids: BTreeMap<String, String>,
    /// This host's id.
    host_id: String,
    /// The live link; `None` while the coordinator cannot be reached.
    link: tokio_watch::Sender<Option<Arc<Link>>>,
    /// Which of the coordinator's nodes the next connection tries first.
    next_node: AtomicUsize,
    /// This gateway's key pair: it signs every coordination message it publishes.
    key: SigningKey,
    /// The hosts whose signatures are taken: `[federation.trust]`'s keys (no broker logins:
    /// a host publishes on this vhost under another login than on the fleet's), and this
    /// gateway's own key and coordinator login.
    trust: Trust,
    /// The mailbox consumers running on the current link.
    consumers: Mutex<Vec<CancellationToken>>,
    /// How many coordination messages the checks refused (for thinning their log lines).
    refused: Mutex<u64>,
    /// The audit log of coordination (`<state_dir>/coord-audit.jsonl`): one line per message
    /// published or taken off a mailbox, never its text.
    audit: AuditWriter,
}

impl Coordinator {
    /// The coordinator side of the gateway of host `host_id`, its leads' coordination ids by
    /// lead name in `ids`, signing with `key` and writing its audit log into `state_dir`; an
    /// error names what is wrong with the trust table.
    pub fn new(
        config: CoordinatorConfig,
        federation: FederationConfig,
        ids: BTreeMap<String, String>,
        (host_id, state_dir): (&str, &Path),
        key: SigningKey,
    ) -> Result<Self, String> {
        let mut trust = federation.trust_table()?.keys_only();
        trust.pin_own(host_id, key.verifying_key(), config.link.login());
        let audit = AuditLog::open(
            state_dir.join("coord-audit.jsonl"),
            federation.audit_max_bytes,
            federation.audit_keep_files,
        );
        let audit = AuditWriter::start(audit)
            .map_err(|e| format!("cannot start the audit log's writer: {e}"))?;
        Ok(Self {
            audit,
            config,
            federation,
            ids,
            host_id: host_id.to_string(),
            link: tokio_watch::channel(None).0,
            next_node: AtomicUsize::new(0),
            key,
            trust,
            consumers: Mutex::new(Vec::new()),
            refused: Mutex::new(0),
        })
    }

    /// The coordination id of the local lead called `lead`.
    pub fn coord_id(&self, lead: &str) -> Option<&str> {
        self.ids.get(lead).map(String::as_str)
    }

    /// One audit line: what moved, never its text.
    fn audit(&self, envelope: &Envelope, size: usize, outcome: &str) {
        self.audit.hop(envelope, size, outcome);
    }

    fn link(&self) -> Option<Arc<Link>> {
        self.link.borrow().clone().filter(|l| l.is_up())
    }

    fn consumers(&self) -> std::sync::MutexGuard<'_, Vec<CancellationToken>> {
        self.consumers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stops every mailbox consumer of the current link.
    fn stop_consumers(&self) {
        for token in self.consumers().drain(..) {
            token.cancel();
        }
    }

    /// Counts a refusal; whether to log it, and the count.
    fn loud(&self) -> (bool, u64) {
        let mut refused = self
            .refused
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *refused += 1;
        (loud(*refused), *refused)
    }

    /// The checks a coordination message off the mailbox of `owner` passes once admitted (in
    /// `fleet_core::trust`'s order: seal, time, then the coordination rules and the sender's
    /// claimed id); its sender's coordination id.
    fn check<'a>(
        &self,
        envelope: &'a Envelope,
        delivery: &Delivery,
        owner: &str,
    ) -> Result<&'a str, Refusal> {
        if !self.federation.insecure_unsigned {
            check_seal(&self.trust, envelope, delivery.body(), seal_of(delivery))?;
        }
        let now = u64::try_from(now_ms()).unwrap_or(0);
        check_time(envelope, now, message_window(&self.federation))?;
        let from = check_coordination(envelope, owner)?;
        // The seal passed: a sending host is named (only an unsigned lab leaves it out).
        let from_host = envelope.from_host.as_deref().unwrap_or_default();
        let local = self.ids.values().any(|id| id == from);
        check_claim(from, from_host, &self.host_id, local)?;
        Ok(from)
    }
}

/// Why a coordination message was not stored now.
enum NotHeld {
    /// It broke a rule: dead-lettered.
    Refused(String),
    /// The store failed: the broker keeps it.
    NotStored(FleetError),
}

impl LocalPlane {
    fn coordinator(&self) -> Option<&Coordinator> {
        self.coordinator.as_ref()
    }

    /// The coordination id of `caller`, a local lead (none for anyone else, or without a
    /// coordinator).
    pub(super) fn coord_id_of(&self, caller: &Caller) -> Option<String> {
        if caller.entity.role != fleet_core::Role::Lead {
            return None;
        }
        self.coordinator()?
            .coord_id(&caller.entity.name)
            .map(String::from)
    }

    /// Connects to the coordinator (a coordinator that refuses this gateway is a start-up
    /// error; one that cannot be reached, or holds a mailbox for a crashed run a while, is
    /// retried in the background) and keeps the link up.
    pub(super) async fn start_coordinator(self: &Arc<Self>) -> Result<(), FleetError> {
        let Some(coordinator) = self.coordinator() else {
            return Ok(());
        };
        tracing::info!(uri = %coordinator.config.link.shown(), leads = ?coordinator.ids, "lead-to-lead coordination on");
        match self.connect_coordinator().await {
            Ok(()) => {}
            Err(e) if !e.retry() && !e.is_held() => {
                return Err(FleetError::internal(format!("coordinator: {e}")));
            }
            Err(e) => {
                tracing::warn!(error = %e, "the coordinator cannot be reached yet (or holds a mailbox of this gateway's leads); coordination sends fail fast meanwhile, retrying");
            }
        }
        let gateway = Arc::clone(self);
        self.tasks.spawn(async move {
            let Some(coordinator) = gateway.coordinator() else {
                return;
            };
            let down = || {
                tracing::warn!("the coordinator link is down; coordination sends fail fast");
                coordinator.stop_consumers();
            };
            keep_up(
                &coordinator.link,
                &coordinator.next_node,
                &gateway.shutdown,
                || gateway.connect_coordinator(),
                down,
                |link: Arc<Link>| async move { link.close().await },
            )
            .await;
        });
        Ok(())
    }

    /// Connects to the coordinator's vhost and starts consuming every local lead's mailbox.
    async fn connect_coordinator(self: &Arc<Self>) -> Result<(), AmqpError> {
        let Some(coordinator) = self.coordinator() else {
            return Ok(());
        };
        let settings = fleet_amqp::LinkSettings {
            first: coordinator.next_node.load(Ordering::Relaxed),
            ..link_settings(&coordinator.config.link, &coordinator.federation)
        };
        let link = Arc::new(Link::connect_coordinator(&settings, &self.host_id).await?);
        let leads: Vec<(Gid, String)> = self
            .sessions
            .lock()
            .leads
            .values()
            .filter_map(|lead| {
                let id = coordinator.coord_id(&lead.entity().name)?;
                Some((lead.entity().gid, id.to_string()))
            })
            .collect();
        let mut opened = Vec::with_capacity(leads.len());
        for (lead, coord_id) in leads {
            match link.open_mailbox(&coord_id).await {
                Ok(deliveries) => opened.push((lead, coord_id, deliveries)),
                Err(e) => {
                    link.close().await;
                    return Err(e);
                }
            }
        }
        for (lead, coord_id, deliveries) in opened {
            let token = self.shutdown.child_token();
            coordinator.consumers().push(token.clone());
            let gateway = Arc::clone(self);
            self.tasks.spawn(async move {
                gateway
                    .consume_mailbox(lead, coord_id, deliveries, token)
                    .await;
            });
        }
        coordinator.link.send_replace(Some(link));
        tracing::info!(host_id = %self.host_id, "coordinator link up");
        Ok(())
    }

    /// Consumes the mailbox of local lead `lead` (coordination id `coord_id`) until the link
    /// goes or `stop`.
    async fn consume_mailbox(
        self: Arc<Self>,
        lead: Gid,
        coord_id: String,
        mut deliveries: Deliveries,
        stop: CancellationToken,
    ) {
        loop {
            let next = tokio::select! {
                next = deliveries.next() => next,
                () = stop.cancelled() => return,
            };
            match next {
                Some(Ok(delivery)) => self.take_coordination(lead, &coord_id, &delivery).await,
                Some(Err(e)) => {
                    tracing::warn!(%coord_id, error = %e, "the mailbox consumer failed");
                    return;
                }
                None => return,
            }
        }
    }

    /// Holds a coordination message for `lead` once it passed every check (acknowledged only
    /// then: at least once), or dead-letters it with a loud log line, or leaves it to the broker
    /// when the store fails.
    async fn take_coordination(self: &Arc<Self>, lead: Gid, coord_id: &str, delivery: &Delivery) {
        let handled = match self.hold_coordination(lead, coord_id, delivery).await {
            Ok(()) => Handled::Held,
            Err(NotHeld::NotStored(e)) => {
                tracing::error!(%coord_id, error = %e, "a coordination message could not be stored; the broker keeps it");
                Handled::NotStored
            }
            Err(NotHeld::Refused(why)) => {
                if let Some(coordinator) = self.coordinator() {
                    let envelope = delivery.envelope().ok();
                    if let Some(envelope) = &envelope {
                        coordinator.audit(envelope, delivery.body().len(), "refused");
                    }
                    if let (true, count) = coordinator.loud() {
                        let msg_id = envelope.as_ref().map(|e| e.msg_id);
                        let from_host = envelope.and_then(|e| e.from_host);
                        tracing::error!(%coord_id, ?msg_id, ?from_host, why = %why, refused_so_far = count, "REFUSED a coordination message: dead-lettered");
                    }
                }
                Handled::Refused
            }
        };
        settle(delivery, handled, false).await;
    }

    /// The checks, then the store: the sender's coordination id first, then the message held
    /// for `lead` (a duplicate id is taken once).
    async fn hold_coordination(
        self: &Arc<Self>,
        lead: Gid,
        coord_id: &str,
        delivery: &Delivery,
    ) -> Result<(), NotHeld> {
        let coordinator = self
            .coordinator()
            .ok_or_else(|| NotHeld::Refused("no coordinator".into()))?;
        let queue = mailbox_queue(coord_id);
        let arrival = Arrival {
            owner: coord_id,
            routing_key: &queue,
            body: delivery.body(),
        };
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let limit = self.config.gateway.max_message_bytes;
        let (envelope, body) = match admission::admit(arrival, delivery.envelope(), now, limit) {
            Admission::Admitted { envelope, body } => (envelope, body),
            Admission::Malformed(e) => return Err(NotHeld::Refused(e.to_string())),
            Admission::Refused { why, .. } => {
                return Err(NotHeld::Refused(format!("not admitted: {why:?}")));
            }
        };
        let from = coordinator
            .check(&envelope, delivery, coord_id)
            .map_err(|refusal| NotHeld::Refused(format!("{}: {refusal}", refusal.reason())))?
            .to_string();
        let stored = |e: FleetError| NotHeld::NotStored(e);
        let until = remember_until(&coordinator.federation, envelope.ts_ms);
        let msg_id = envelope.msg_id;
        let seen = self
            .db
            .run(move |s| s.see(&[(msg_id, lead, until)]))
            .await
            .map_err(stored)?;
        check_replay(
            seen.first().copied().unwrap_or(false),
            delivery.redelivered(),
        )
        .map_err(|refusal| NotHeld::Refused(refusal.to_string()))?;
        let sender = from.clone();
        self.db
            .run(move |s| s.note_coord_sender(msg_id, &sender, until))
            .await
            .map_err(stored)?;
        let message = envelope.held_for(lead, body, now_ms());
        match self.hold(vec![message]).await.map_err(stored)?.pop() {
            Some(Err(full)) => Err(NotHeld::Refused(format!("the lead's cap: {full}"))),
            _ => {
                coordinator.audit(&envelope, delivery.body().len(), "held");
                tracing::info!(trace_id = %envelope.trace_id, %msg_id, from = %from, to = %coord_id, "coordination held");
                Ok(())
            }
        }
    }

    /// The local side of [`Gateway::coordinate`].
    pub(super) async fn coordinate(
        &self,
        caller: &Caller,
        coord_id: &str,
        text: String,
    ) -> Result<SendResult, FleetError> {
        check_coordinate(&caller.entity)?;
        let coordinator = self.coordinator().ok_or_else(|| {
            FleetError::invalid(
                "coord_id needs a [coordinator] block, and this gateway has none; send to a fleet entity with to",
            )
        })?;
        validate_coord_id("coord_id", coord_id)?;
        check_size(&text, self.config.gateway.max_message_bytes)?;
        let mine = self
            .coord_id_of(caller)
            .ok_or_else(|| FleetError::internal("a lead of this gateway has no coordination id"))?;
        if mine == coord_id {
            return Err(FleetError::invalid(format!(
                "'{coord_id}' is your own coordination id; give a peer lead's"
            )));
        }
        let link = coordinator.link().ok_or_else(|| {
            FleetError::new(
                ErrorCode::BrokerUnavailable,
                "the coordinator cannot be reached, so nothing was sent; retry later",
            )
        })?;
        let envelope = Envelope {
            from_name: Some(mine),
            ..outgoing(
                &self.host_id,
                Kind::Send,
                (MsgId::mint(), TraceId::mint()),
                caller.entity.gid,
                coord_id.to_string(),
                coordinator.federation.inbox_message_ttl_s,
            )
        };
        let body = text.as_bytes();
        let queue = mailbox_queue(coord_id);
        let published = link
            .publish(Outgoing {
                exchange: "",
                key: &queue,
                envelope: &envelope,
                signature: &signature(&coordinator.key, &envelope, body),
                body,
                mandatory: true,
                persistent: true,
            })
            .await;
        let outcome = publish_outcome(&published, "refused: mailbox full");
        coordinator.audit(&envelope, body.len(), outcome);
        let published = published.map_err(not_taken)?;
        let msg_id = envelope.msg_id;
        tracing::info!(trace_id = %envelope.trace_id, %msg_id, to = %coord_id, ?published, "coordination published");
        match published {
            Published::Routed => Ok(SendResult::Pending {
                msg_id,
                state: "queued".into(),
                note: format!(
                    "in the coordination mailbox of '{coord_id}', held for that lead's fleet_poll; coordination never waits for an answer: one comes, if at all, as coordination in your own fleet_poll"
                ),
            }),
            Published::Unroutable => Err(FleetError::new(
                ErrorCode::UnknownRecipient,
                format!(
                    "no lead has the coordination id '{coord_id}': the coordinator has no mailbox of that name (its lead's gateway declares it when it starts)"
                ),
            )),
            Published::Refused => Err(FleetError::new(
                ErrorCode::BrokerUnavailable,
                format!(
                    "the coordination mailbox of '{coord_id}' is full; the message was dead-lettered"
                ),
            )),
        }
    }
}
