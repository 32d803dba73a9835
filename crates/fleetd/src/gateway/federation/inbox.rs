//! An inbox consumer: deliveries come off `owner`'s inbox in batches, are admitted (or
//! dead-lettered, loudly) by `fleet_core::admission`, and go to be held or taken; and the one
//! function that tells the broker how a delivery was settled.

use std::sync::Arc;

use fleet_amqp::{Deliveries, Delivery};
use fleet_core::admission::{self, Admission, Arrival, Handled, Refusal, held_kind};
use fleet_core::entity::validate_name;
use fleet_core::envelope::{Envelope, EnvelopeError, VERSION};
use fleet_core::trust::Refusal as TrustRefusal;
use fleet_core::{Gid, Kind};
use tokio_util::sync::CancellationToken;

use super::super::LocalPlane;
use super::Federation;
use super::settle::{Incoming, settle};
use super::trust::{Patience, Vouched};
use super::waiting::{Waiting, until_due};
use fleet_core::clock::now_ms;
use fleet_core::delivery::WAITED_TOO_LONG;

/// The most deliveries taken off an inbox at once (held ones are stored together).
const DELIVERY_BATCH: usize = 64;

impl Federation {
    /// Consumes `owner`'s inbox until the link or the entity goes. Briefs for a busy worker
    /// wait here unacknowledged, in their order, while everything behind them goes on: an
    /// answer to the worker's own ask, a notice or a reply is never stuck behind a task. One
    /// that expires while it waits is failed to its sender then, never typed late.
    pub(super) async fn consume_inbox(
        self: Arc<Self>,
        g: Arc<LocalPlane>,
        owner: Gid,
        mut deliveries: Deliveries,
        stop: CancellationToken,
    ) {
        let g = &g;
        let mut waiting = Waiting::default();
        loop {
            let due = waiting.due();
            let mut next = tokio::select! {
                next = deliveries.next() => next,
                () = g.until_injectable(owner), if !waiting.is_empty() => {
                    if !self.take_next_brief(g, owner, &mut waiting).await {
                        return;
                    }
                    continue;
                }
                () = until_due(due), if due.is_some() => {
                    self.fail_expired(g, owner, &mut waiting).await;
                    continue;
                }
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
                match deliveries.next_now() {
                    Some(more) => next = more,
                    None => break false,
                }
            };
            if !self
                .on_deliveries(g, owner, batch, &mut waiting, &stop)
                .await
                || ended
            {
                return;
            }
        }
    }

    /// Fails every brief in `waiting` that expired meanwhile: its sender is told, it is never
    /// typed.
    async fn fail_expired(&self, g: &Arc<LocalPlane>, owner: Gid, waiting: &mut Waiting) {
        let now = u64::try_from(now_ms()).unwrap_or(u64::MAX);
        for brief in waiting.expired(now) {
            self.refuse_and_tell(
                g,
                owner,
                &brief.envelope,
                &brief.delivery,
                "expired",
                WAITED_TOO_LONG,
            )
            .await;
        }
    }

    /// Takes the first brief waiting, now that its worker is free (or gone, when it fails as
    /// any other would), unless it expired; false if the consumer is to stop.
    async fn take_next_brief(
        &self,
        g: &Arc<LocalPlane>,
        owner: Gid,
        waiting: &mut Waiting,
    ) -> bool {
        self.fail_expired(g, owner, waiting).await;
        match waiting.next() {
            Some(brief) => self.take_brief(g, owner, brief).await,
            None => true,
        }
    }

    /// Messages off `owner`'s inbox, in their order; false if the consumer is to stop (what
    /// is left of the batch stays unacknowledged, for the broker to deliver again).
    async fn on_deliveries(
        &self,
        g: &Arc<LocalPlane>,
        owner: Gid,
        batch: Vec<Delivery>,
        waiting: &mut Waiting,
        stop: &CancellationToken,
    ) -> bool {
        // One wait for senders not yet announced, for the whole batch.
        let patience = Patience {
            until: tokio::time::Instant::now() + self.patience(),
            stop,
        };
        let mut admitted = Vec::with_capacity(batch.len());
        for delivery in batch {
            if let Some((envelope, body)) = self.admit(g, owner, &delivery, &patience).await {
                admitted.push(Vouched {
                    delivery,
                    envelope,
                    body,
                });
            }
        }
        let mut held = Vec::new();
        for Vouched {
            delivery,
            envelope,
            mut body,
        } in self.check_batch(g, owner, admitted).await
        {
            // The answer to a spawn or stop on another host goes to the call awaiting it.
            if self.control_answered(g, owner, &envelope, &mut body) {
                self.audit(&envelope, delivery.body().len(), "control: answered");
                settle(&delivery, Handled::Noted, false).await;
                continue;
            }
            // A name from another host is shown and typed (a reply's label): kept only if
            // valid, and only from a message that passed every check.
            if let Some(name) = &envelope.from_name
                && validate_name("sender name", name).is_ok()
            {
                self.remember_remote_name(g, envelope.from, name, envelope.from_host.as_deref());
            }
            // An ask's conversation with another host is live: never held.
            if matches!(
                envelope.kind,
                Kind::Ask | Kind::Answer | Kind::NoWaiter | Kind::Abandoned
            ) && self.ask_flow(g, owner, &envelope, &body).await
            {
                self.audit(&envelope, delivery.body().len(), "ask: handled");
                settle(&delivery, Handled::Noted, false).await;
                continue;
            }
            let to_pane = g.sessions.lock().panes.contains_key(&owner);
            if held_kind(envelope.kind, to_pane) {
                held.push(Incoming {
                    message: envelope.held_for(owner, body, now_ms()),
                    envelope,
                    delivery,
                });
                continue;
            }
            self.hold_all(g, std::mem::take(&mut held), waiting.is_empty())
                .await;
            let vouched = Vouched {
                delivery,
                envelope,
                body,
            };
            if !self.on_delivery(g, owner, vouched, waiting).await {
                return false;
            }
        }
        self.hold_all(g, held, waiting.is_empty()).await;
        true
    }

    /// Checks a delivery: its envelope and body, or it is dead-lettered (malformed, of a newer
    /// version, for another recipient, expired, too large or not text, or failing a trust check
    /// that can be made one message at a time) with a loud log line, and the sender of one
    /// expired or too large told.
    async fn admit(
        &self,
        g: &Arc<LocalPlane>,
        owner: Gid,
        delivery: &Delivery,
        patience: &Patience<'_>,
    ) -> Option<(Envelope, String)> {
        let address = owner.to_string();
        let arrival = Arrival {
            owner: &address,
            routing_key: delivery.routing_key(),
            body: delivery.body(),
        };
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let limit = g.config.gateway.max_message_bytes;
        let (envelope, why) = match admission::admit(arrival, delivery.envelope(), now, limit) {
            Admission::Admitted { envelope, body } => {
                let checked = self
                    .check_one(g, owner, delivery, &envelope, patience)
                    .await;
                return match checked {
                    Ok(()) => Some((envelope, body)),
                    Err(refusal) => {
                        self.refuse_admitted(g, owner, delivery, &envelope, refusal)
                            .await;
                        None
                    }
                };
            }
            Admission::Malformed(e) => {
                let (loud, count) = self.loud();
                match &e {
                    EnvelopeError::NewerMajor { .. } if loud => tracing::error!(
                        %owner, error = %e, supported = %VERSION, refused_so_far = count,
                        "REFUSED a message of a newer envelope version: dead-lettered (upgrade this gateway)"
                    ),
                    _ if loud => {
                        tracing::error!(%owner, error = %e, refused_so_far = count, "REFUSED a malformed message: dead-lettered")
                    }
                    _ => {}
                }
                settle(delivery, Handled::Refused, false).await;
                return None;
            }
            Admission::Refused { envelope, why } => (envelope, why),
        };
        // Nothing is done about an envelope before it is known to be genuine, not even telling
        // its sender: an expired one only has to be signed by its sender's host, the others pass
        // what a message taken would.
        let checked = match why {
            Refusal::Expired => self.check_expired(g, &envelope, delivery),
            _ => {
                self.check_one(g, owner, delivery, &envelope, patience)
                    .await
            }
        };
        match checked {
            Ok(()) => {
                self.refuse_genuine(g, owner, delivery, &envelope, why)
                    .await
            }
            Err(refusal) => self.refuse_untrusted(delivery, &envelope, &refusal).await,
        }
        None
    }

    /// A well-formed delivery that a trust check refused: a broadcast's copy for a worker its
    /// sender may not task is let go quietly, a genuine lead asking what this host does not
    /// grant hears why, anything else is dead-lettered as untrusted.
    async fn refuse_admitted(
        &self,
        g: &Arc<LocalPlane>,
        owner: Gid,
        delivery: &Delivery,
        envelope: &Envelope,
        refusal: TrustRefusal,
    ) {
        match refusal {
            TrustRefusal::NotGranted(_) if envelope.kind == Kind::Broadcast => {
                self.audit(
                    envelope,
                    delivery.body().len(),
                    "skipped: not the sender's worker",
                );
                settle(delivery, Handled::Dropped, false).await;
            }
            TrustRefusal::NotGranted(why) => {
                self.refuse_and_tell(g, owner, envelope, delivery, "not granted", &why)
                    .await;
            }
            refusal => self.refuse_untrusted(delivery, envelope, &refusal).await,
        }
    }

    /// A genuine delivery that admission refused (`why`): dead-lettered, with its sender told
    /// when it waits on it (expired, too large: nothing vanishes) and a loud line otherwise.
    async fn refuse_genuine(
        &self,
        g: &Arc<LocalPlane>,
        owner: Gid,
        delivery: &Delivery,
        envelope: &Envelope,
        why: Refusal,
    ) {
        let (trace_id, msg_id) = (envelope.trace_id, envelope.msg_id);
        let size = delivery.body().len();
        let loud = || self.loud();
        let audit = |outcome: &str| {
            self.audit(envelope, size, outcome);
        };
        match why {
            Refusal::WrongRecipient => {
                let (loud, count) = loud();
                if loud {
                    tracing::error!(%trace_id, %msg_id, %owner, to = %envelope.to, refused_so_far = count, "REFUSED a message whose recipient is not this inbox: dead-lettered");
                }
                audit("refused: recipient mismatch");
            }
            Refusal::Expired => {
                // Its sender is told (the dead letter coming back to its host, refused, is not
                // told of again): nothing vanishes.
                let why = "it expired (expiresAt) before its recipient's gateway could take it: that gateway was down, or its inboxes keep messages longer than the sender's gateway lets them live";
                return self
                    .refuse_and_tell(g, owner, envelope, delivery, "expired", why)
                    .await;
            }
            Refusal::TooLarge { size, limit } => {
                let why = format!(
                    "{size} bytes, over the {limit} bytes its recipient's gateway takes (gateway.max_message_bytes)"
                );
                return self
                    .refuse_and_tell(g, owner, envelope, delivery, "too large", &why)
                    .await;
            }
            Refusal::NotText => {
                let (loud, count) = loud();
                if loud {
                    tracing::error!(%trace_id, %msg_id, refused_so_far = count, "REFUSED a message whose body is not UTF-8: dead-lettered");
                }
                audit("refused: not text");
            }
        }
        settle(delivery, Handled::Refused, false).await;
    }
}
