//! What an admitted delivery becomes: messages held for local entities (the pull path, at
//! least once: acknowledged only once stored), briefs taken for local workers (the forward
//! path, at most once: acknowledged before they go near the pane), and receipts.

use std::sync::Arc;

use fleet_amqp::Delivery;
use fleet_core::admission::{Handled, refusal_told};
use fleet_core::clock::now_ms;
use fleet_core::envelope::Envelope;
use fleet_core::typed::typeable;
use fleet_core::{ErrorCode, Gid, Kind, Message, MsgState};
use tokio::time::Instant;

use super::super::LocalPlane;
use super::Federation;
use super::settle::{Incoming, settle};
use super::trust::Vouched;
use super::waiting::Waiting;
use fleet_core::delivery::Placement;
use fleet_core::delivery::WAITED_TOO_LONG;

/// How a brief was kept before its acknowledgement.
enum Kept {
    /// Newly.
    Fresh,
    /// Already, from an earlier delivery of it.
    Again,
}

impl Federation {
    /// One admitted message off `owner`'s inbox that is not simply held: a brief for a local
    /// worker (it joins `waiting`), a receipt, or a kind an inbox does not take. False if the
    /// consumer is to stop.
    pub(super) async fn on_delivery(
        &self,
        g: &Arc<LocalPlane>,
        owner: Gid,
        vouched: Vouched,
        waiting: &mut Waiting,
    ) -> bool {
        let Vouched {
            delivery,
            envelope,
            body,
        } = vouched;
        let (trace_id, msg_id, kind) = (envelope.trace_id, envelope.msg_id, envelope.kind);
        let size = delivery.body().len();
        match kind {
            Kind::Send | Kind::Broadcast => {
                // Typed into a pane: inert text only, refused before it waits for the worker.
                if let Err(found) = typeable(&body) {
                    self.refuse_and_tell(
                        g,
                        owner,
                        &envelope,
                        &delivery,
                        "control character",
                        &format!("it holds {found}"),
                    )
                    .await;
                    return true;
                }
                // Given again, and kept here already (queued ahead of an acknowledgement the
                // broker never had, before a restart): it goes its way from the store, and this
                // copy is dropped now rather than waiting (and expiring) behind it.
                if delivery.redelivered() && self.kept_already(g, msg_id).await {
                    tracing::info!(%trace_id, %msg_id, "a brief given again, kept already: dropped");
                    self.audit(&envelope, size, "dropped: kept already");
                    settle(&delivery, Handled::Noted, false).await;
                    return true;
                }
                // It waits on the broker (unacknowledged) until the worker is free.
                waiting.push(
                    envelope.expires_at_ms,
                    Vouched {
                        delivery,
                        envelope,
                        body,
                    },
                );
            }
            Kind::Injected => {
                if let Some(original) = envelope.in_reply_to {
                    self.lock()
                        .receipts
                        .injected(original, Instant::now().into_std());
                    if let Err(e) = g.db.run(move |s| s.receipts_settled(&[original])).await {
                        tracing::warn!(%original, error = %e, "a receipt stays awaited in the store: a restart fails its brief at the bound");
                    }
                }
                tracing::info!(%trace_id, %msg_id, in_reply_to = ?envelope.in_reply_to, "remote brief injected");
                self.audit(&envelope, size, "receipt");
                settle(&delivery, Handled::Noted, false).await;
            }
            _ => {
                tracing::error!(%trace_id, %msg_id, %kind, "REFUSED a message this inbox does not take: dead-lettered");
                self.audit(&envelope, size, "refused: kind");
                settle(&delivery, Handled::Refused, false).await;
            }
        }
        true
    }

    /// Takes a brief whose worker is free (or gone, when it fails as any other would): one
    /// that expired meanwhile is never typed late, its sender is told. False if the consumer is
    /// to stop.
    pub(super) async fn take_brief(&self, g: &Arc<LocalPlane>, owner: Gid, brief: Vouched) -> bool {
        let Vouched {
            delivery,
            envelope,
            body,
        } = brief;
        if envelope.expired(u64::try_from(now_ms()).unwrap_or(u64::MAX)) {
            self.refuse_and_tell(g, owner, &envelope, &delivery, "expired", WAITED_TOO_LONG)
                .await;
            return true;
        }
        let (trace_id, msg_id) = (envelope.trace_id, envelope.msg_id);
        let message = envelope.brief_for(owner, body, now_ms());
        // Queued first, its worker's queue held until the acknowledgement is seen: a stop
        // between the acknowledgement and the store would otherwise lose it (acknowledged, so
        // never given again; never stored, so never typed). A stop before the acknowledgement
        // leaves it queued for the restart, and the copy the broker gives again is dropped.
        let kept = self.keep_arriving(g, &message).await;
        // At most once, and one story: acknowledged, and the broker seen to take the
        // acknowledgement, before it goes anywhere near the pane. Had the acknowledgement been
        // lost (a partition), the broker would give the brief again, or let it expire and
        // dead-letter it (its sender told it failed) though it was typed.
        if let Err(e) = delivery.ack_surely().await {
            tracing::warn!(%trace_id, %msg_id, error = %e, "a brief's acknowledgement was not seen to reach the broker: failed, not typed");
            // The link is not to be trusted: a new one attaches this inbox again.
            if let Some(link) = self.link() {
                link.give_up();
            }
            match kept {
                Some(Kept::Fresh) => self.fail_kept(g, &message).await,
                // A copy of one kept already, which goes on as it was.
                Some(Kept::Again) => g.arrived(owner),
                None => self.fail_untaken(g, message).await,
            }
            return false;
        }
        self.audit(&envelope, delivery.body().len(), "taken");
        match kept {
            Some(Kept::Fresh) => {
                g.release_taken(&message).await;
                return true;
            }
            Some(Kept::Again) => {
                tracing::info!(%trace_id, %msg_id, "a brief given again, kept already: dropped");
                g.arrived(owner);
                return true;
            }
            None => {}
        }
        if let Err(e) = g.deliver(message.clone()).await {
            // Taken off the broker already (at most once): its sender is told.
            tracing::error!(%trace_id, %msg_id, error = %e, "a taken brief could not be queued");
            g.notify_failed(
                &message,
                &format!("not queued by its recipient's gateway: {}", e.message),
            )
            .await;
        }
        true
    }

    /// Queues `brief`, for a live worker, before it is acknowledged, its worker's queue held
    /// ([`LocalPlane::arriving`]) until [`LocalPlane::release_taken`] or
    /// [`Federation::fail_kept`]. `None` if it is not for a live worker's queue, or cannot be
    /// stored: it goes the way of any delivery, once acknowledged.
    async fn keep_arriving(&self, g: &Arc<LocalPlane>, brief: &Message) -> Option<Kept> {
        if g.placement(brief) != Placement::Queue || !g.arriving(brief.to) {
            return None;
        }
        let mut kept = brief.clone();
        kept.state = MsgState::Queued;
        match g.store_one_within_cap(kept).await {
            Ok(true) => Some(Kept::Fresh),
            Ok(false) => Some(Kept::Again),
            Err(e) => {
                tracing::warn!(trace_id = %brief.trace_id, msg_id = %brief.msg_id, error = %e.message, "a brief from afar could not be queued before its acknowledgement");
                g.arrived(brief.to);
                None
            }
        }
    }

    /// Whether this gateway's store holds `msg_id` already (a store it cannot read: no).
    async fn kept_already(&self, g: &Arc<LocalPlane>, msg_id: fleet_core::MsgId) -> bool {
        matches!(g.db.run(move |s| s.message(msg_id)).await, Ok(Some(_)))
    }

    /// Fails `brief`, queued by [`Federation::keep_arriving`], whose acknowledgement was not
    /// seen to reach the broker: never typed, its sender told (the notice is carried) once it
    /// is stored failed.
    async fn fail_kept(&self, g: &Arc<LocalPlane>, brief: &Message) {
        let why = "its recipient's gateway lost the broker link as it took the task off the inbox: not typed in, and not retried";
        let (msg_id, failed) = (brief.msg_id, MsgState::Failed(why.into()));
        // Only while it is still queued (its queue was held: nothing can have taken it).
        let stored =
            g.db.run(move |s| match s.message(msg_id)? {
                Some(kept) if kept.state == MsgState::Queued => s.transition(msg_id, &failed),
                _ => Err(fleet_store::StoreError::BadTransition {
                    msg_id,
                    from: "not queued".into(),
                    to: "failed".into(),
                }),
            })
            .await;
        g.arrived(brief.to);
        match stored {
            Ok(()) => g.notify_failed(brief, why).await,
            // Still queued: typed in (once), its sender not told it failed.
            Err(e) => {
                tracing::error!(%msg_id, error = %e, "a brief whose acknowledgement was not seen cannot be marked failed: it stays queued");
            }
        }
    }

    /// Fails a brief whose acknowledgement was not seen to reach the broker: kept here as
    /// failed (should the broker give it again, it is dropped as one handled already) and its
    /// sender told (the notice is carried: the link is likely down). Never typed.
    async fn fail_untaken(&self, g: &Arc<LocalPlane>, mut brief: Message) {
        let why = "its recipient's gateway lost the broker link as it took the task off the inbox: not typed in, and not retried";
        brief.state = MsgState::Failed(why.into());
        let kept = brief.clone();
        if let Err(e) = g.store_one_within_cap(kept).await {
            tracing::error!(msg_id = %brief.msg_id, error = %e, "an untaken brief cannot be kept as failed: should the broker give it again, it is typed then");
        }
        g.notify_failed(&brief, why).await;
    }

    /// Holds messages for local entities (the pull path), stored in one transaction and then
    /// acknowledged in one frame: at least once, never acknowledged before the store has them.
    /// One whose recipient has no place to hold it any more goes the ordinary way. With
    /// `together` false (a brief before them on the channel waits, unacknowledged), each is
    /// settled on its own, never through that brief.
    pub(super) async fn hold_all(
        &self,
        g: &Arc<LocalPlane>,
        incoming: Vec<Incoming>,
        together: bool,
    ) {
        let (kept, others): (Vec<Incoming>, Vec<Incoming>) = incoming
            .into_iter()
            .partition(|i| g.placement(&i.message) == Placement::Hold);
        for other in others {
            self.deliver_one(g, other).await;
        }
        let Some(last) = kept.last() else {
            return;
        };
        tracing::debug!(
            count = kept.len(),
            "holding messages off the broker together"
        );
        let outcomes = match g
            .hold(kept.iter().map(|i| i.message.clone()).collect())
            .await
        {
            Ok(outcomes) => outcomes,
            Err(e) => {
                not_stored(&last.envelope, &e);
                if together {
                    settle(&last.delivery, Handled::NotStored, true).await;
                } else {
                    for i in &kept {
                        settle(&i.delivery, Handled::NotStored, false).await;
                    }
                }
                return;
            }
        };
        // Those over the cap are dead-lettered first, one by one; then one frame acknowledges
        // the rest (an acknowledgement covers only what is still unsettled).
        let mut last_held = None;
        let mut answered = Vec::new();
        for (i, outcome) in kept.iter().zip(outcomes) {
            match outcome {
                Ok(()) => {
                    answered.extend(self.held(&i.envelope, i.delivery.body().len()));
                    if !together {
                        settle(&i.delivery, Handled::Held, false).await;
                    }
                    last_held = Some(i);
                }
                Err(full) => {
                    let why = format!(
                        "its recipient already has {} messages waiting, the most allowed ({full})",
                        full.count
                    );
                    self.refuse_and_tell(
                        g,
                        i.message.to,
                        &i.envelope,
                        &i.delivery,
                        "too many",
                        &why,
                    )
                    .await;
                }
            }
        }
        self.receipts_settled(g, answered).await;
        if let Some(last) = last_held
            && together
        {
            settle(&last.delivery, Handled::Held, true).await;
        }
    }

    /// Delivers `other` (off the broker, for an entity that does not hold it) the ordinary
    /// way, and settles it: held, refused for good over a cap (requeued, it would only come
    /// straight back), or left to come again when it could not be stored.
    async fn deliver_one(&self, g: &Arc<LocalPlane>, other: Incoming) {
        let to = other.message.to;
        match g.deliver(other.message).await.map(|_| ()) {
            Err(e) if e.code == ErrorCode::TooMany => {
                self.refuse_and_tell(
                    g,
                    to,
                    &other.envelope,
                    &other.delivery,
                    "too many",
                    &e.message,
                )
                .await;
            }
            Err(e) => {
                not_stored(&other.envelope, &e);
                settle(&other.delivery, Handled::NotStored, false).await;
            }
            Ok(()) => {
                if let Some(original) = self.held(&other.envelope, other.delivery.body().len()) {
                    self.receipts_settled(g, vec![original]).await;
                }
                settle(&other.delivery, Handled::Held, false).await;
            }
        }
    }

    /// Dead-letters a delivery that breaks a rule of this gateway, with a loud log line and an
    /// audit line, and tells its sender with a `FAILED` notice when it is a message one waits
    /// on (not a notice or a receipt, which would only start a loop).
    pub(super) async fn refuse_and_tell(
        &self,
        g: &Arc<LocalPlane>,
        owner: Gid,
        envelope: &Envelope,
        delivery: &Delivery,
        rule: &str,
        why: &str,
    ) {
        let (trace_id, msg_id, kind) = (envelope.trace_id, envelope.msg_id, envelope.kind);
        // Thinned, as every refusal off the broker: a host's lead sending what this host does
        // not grant, again and again, does not flood the log (the audit line is each one's).
        let (loud, count) = self.loud();
        if loud {
            tracing::error!(%trace_id, %msg_id, %kind, %owner, rule, why, refused_so_far = count, "REFUSED a message off the broker: dead-lettered");
        }
        self.audit(envelope, delivery.body().len(), &format!("refused: {rule}"));
        if refusal_told(kind) {
            // A broadcast's copy is told of by the copy's own id (derived from the broadcast's
            // and its recipient's), so each refused copy is a notice of its own.
            let mut original = envelope.held_for(owner, String::new(), now_ms());
            if kind == Kind::Broadcast {
                original = original.with_id(envelope.msg_id.derived(&owner.to_string()));
            }
            g.notify_failed(
                &original,
                &format!("refused by its recipient's gateway: {why}"),
            )
            .await;
        }
        settle(delivery, Handled::Refused, false).await;
    }
}

/// The loud line for a message that could not be held now (the broker keeps it).
fn not_stored(envelope: &Envelope, e: &fleet_core::FleetError) {
    let (trace_id, msg_id) = (envelope.trace_id, envelope.msg_id);
    tracing::error!(%trace_id, %msg_id, error = %e, "cannot hold a message; the broker keeps it");
}
