//! What an admitted delivery becomes: messages held for local entities (the pull path, at
//! least once: acknowledged only once stored), briefs taken for local workers (the forward
//! path, at most once: acknowledged before they go near the pane), and receipts.

use std::sync::Arc;

use fleet_amqp::Delivery;
use fleet_core::admission::Handled;
use fleet_core::clock::now_ms;
use fleet_core::delivery::Taker;
use fleet_core::envelope::Envelope;
use fleet_core::typed::typeable;
use fleet_core::{ErrorCode, Gid, Kind};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::Gateway;
use super::inbox::{Incoming, settle};
use fleet_core::delivery::Placement;

impl Gateway {
    /// One admitted message off `owner`'s inbox that is not simply held: a brief for a local
    /// worker, a receipt, or a kind an inbox does not take. False if the consumer is to stop.
    pub(super) async fn on_delivery(
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
        let size = delivery.body().len();
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
                // One that expired meanwhile is never typed late: its sender is told.
                if envelope.expired(u64::try_from(now_ms()).unwrap_or(u64::MAX)) {
                    self.refuse_and_tell(
                        owner,
                        &envelope,
                        &delivery,
                        "expired",
                        "it expired (expiresAt) while it waited for its worker to be free; it was not typed in",
                    )
                    .await;
                    return true;
                }
                // At most once: acknowledged before it goes anywhere near the pane.
                if !settle(&delivery, Handled::Taken, false).await {
                    return false;
                }
                let message = envelope.brief_for(owner, body, now_ms());
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
                if let Some(original) = envelope.in_reply_to {
                    fed.lock()
                        .receipts
                        .injected(original, Instant::now().into_std());
                    if let Err(e) = self.db(move |s| s.receipts_settled(&[original])).await {
                        tracing::warn!(%original, error = %e, "a receipt stays awaited in the store: a restart fails its brief at the bound");
                    }
                }
                tracing::info!(%trace_id, %msg_id, in_reply_to = ?envelope.in_reply_to, "remote brief injected");
                fed.audit(&envelope, size, "receipt");
                settle(&delivery, Handled::Noted, false).await;
            }
            _ => {
                tracing::error!(%trace_id, %msg_id, %kind, "REFUSED a message this inbox does not take: dead-lettered");
                fed.audit(&envelope, size, "refused: kind");
                settle(&delivery, Handled::Refused, false).await;
            }
        }
        true
    }

    /// Holds messages for local entities (the pull path), stored in one transaction and then
    /// acknowledged in one frame: at least once, never acknowledged before the store has them.
    /// One whose recipient has no place to hold it any more goes the ordinary way.
    pub(super) async fn hold_all(self: &Arc<Self>, incoming: Vec<Incoming>) {
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
                Err(e) => {
                    not_stored(&other.envelope, &e);
                    settle(&other.delivery, Handled::NotStored, false).await;
                }
                Ok(()) => {
                    if let Some(original) = fed.held(&other.envelope, other.delivery.body().len()) {
                        self.receipts_settled(vec![original]).await;
                    }
                    settle(&other.delivery, Handled::Held, false).await;
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
            Err(e) => {
                not_stored(&last.envelope, &e);
                settle(&last.delivery, Handled::NotStored, true).await;
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
                    answered.extend(fed.held(&i.envelope, i.delivery.body().len()));
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
        self.receipts_settled(answered).await;
        if let Some(last) = last_held {
            settle(&last.delivery, Handled::Held, true).await;
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
            let ready = {
                let sessions = self.lock();
                match sessions.panes.get(&gid) {
                    Some(s) if s.status.is_live() => sessions.may_take_task(gid, Taker::Broker),
                    _ => true,
                }
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
}

/// The loud line for a message that could not be held now (the broker keeps it).
fn not_stored(envelope: &Envelope, e: &fleet_core::FleetError) {
    let (trace_id, msg_id) = (envelope.trace_id, envelope.msg_id);
    tracing::error!(%trace_id, %msg_id, error = %e, "cannot hold a message; the broker keeps it");
}
