//! What an admitted delivery becomes: messages held for local entities (the pull path, at
//! least once: acknowledged only once stored), briefs taken for local workers (the forward
//! path, at most once: acknowledged before they go near the pane), and receipts.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::admission::Handled;
use fleet_core::clock::now_ms;
use fleet_core::envelope::Envelope;
use fleet_core::typed::typeable;
use fleet_core::{ErrorCode, Gid, Kind, Message, MsgState};
use tokio::time::Instant;

use super::super::Gateway;
use super::inbox::{Incoming, settle};
use super::trust::Vouched;
use fleet_core::delivery::Placement;

/// What the sender of a brief that expired while it waited for its worker is told.
pub(super) const WAITED_TOO_LONG: &str =
    "it expired (expiresAt) while it waited for its worker to be free; it was not typed in";

/// How long past its expiry a brief queued here is remembered (one failed otherwise, its
/// session ended say, is never taken off the queue to be forgotten then).
const FORGET_EXPIRY_AFTER_MS: u64 = 3_600_000;

/// The farthest a waiting brief's expiry is looked ahead (admitted messages live a day at
/// most; this only keeps the clock's arithmetic far from its end).
const FARTHEST_DUE: Duration = Duration::from_secs(365 * 86_400);

/// Items waiting for their turn, in their order, each with the time it expires (milliseconds
/// since the Unix epoch): the briefs of a busy worker, unacknowledged on the broker.
pub(super) struct Waiting<T = Vouched> {
    items: VecDeque<(u64, T)>,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Waiting {
            items: VecDeque::new(),
        }
    }
}

impl<T> Waiting<T> {
    /// Adds one at the back.
    pub(super) fn push(&mut self, expires_at_ms: u64, item: T) {
        self.items.push_back((expires_at_ms, item));
    }

    /// Whether nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// When the first of them expires.
    pub(super) fn first_expiry(&self) -> Option<u64> {
        self.items.iter().map(|(at, _)| *at).min()
    }

    /// Takes out, in their order, those expired at `now_ms`.
    pub(super) fn expired(&mut self, now_ms: u64) -> Vec<T> {
        let (gone, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.items)
            .into_iter()
            .partition(|(at, _)| now_ms >= *at);
        self.items = kept;
        gone.into_iter().map(|(_, item)| item).collect()
    }

    /// Takes out the first.
    pub(super) fn next(&mut self) -> Option<T> {
        self.items.pop_front().map(|(_, item)| item)
    }

    /// When the first of them expires, on the runtime's clock.
    pub(super) fn due(&self) -> Option<Instant> {
        let at = self.first_expiry()?;
        let now = u64::try_from(now_ms()).unwrap_or(u64::MAX);
        let left = Duration::from_millis(at.saturating_sub(now)).min(FARTHEST_DUE);
        Some(Instant::now() + left)
    }
}

/// Returns at `due` (never, without one).
pub(super) async fn until_due(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Gateway {
    /// One admitted message off `owner`'s inbox that is not simply held: a brief for a local
    /// worker (it joins `waiting`), a receipt, or a kind an inbox does not take. False if the
    /// consumer is to stop.
    pub(super) async fn on_delivery(
        self: &Arc<Self>,
        owner: Gid,
        vouched: Vouched,
        waiting: &mut Waiting,
    ) -> bool {
        let Some(fed) = self.fed() else {
            return false;
        };
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
                        owner,
                        &envelope,
                        &delivery,
                        "control character",
                        &format!("it holds {found}"),
                    )
                    .await;
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

    /// Takes a brief whose worker is free (or gone, when it fails as any other would): one
    /// that expired meanwhile is never typed late, its sender is told. False if the consumer is
    /// to stop.
    pub(super) async fn take_brief(self: &Arc<Self>, owner: Gid, brief: Vouched) -> bool {
        let Some(fed) = self.fed() else {
            return false;
        };
        let Vouched {
            delivery,
            envelope,
            body,
        } = brief;
        if envelope.expired(u64::try_from(now_ms()).unwrap_or(u64::MAX)) {
            self.refuse_and_tell(owner, &envelope, &delivery, "expired", WAITED_TOO_LONG)
                .await;
            return true;
        }
        let (trace_id, msg_id) = (envelope.trace_id, envelope.msg_id);
        let message = envelope.brief_for(owner, body, now_ms());
        // At most once, and one story: acknowledged, and the broker seen to take the
        // acknowledgement, before it goes anywhere near the pane. Had the acknowledgement been
        // lost (a partition), the broker would give the brief again, or let it expire and
        // dead-letter it (its sender told it failed) though it was typed.
        if let Err(e) = delivery.ack_surely().await {
            tracing::warn!(%trace_id, %msg_id, error = %e, "a brief's acknowledgement was not seen to reach the broker: failed, not typed");
            // The link is not to be trusted: a new one attaches this inbox again.
            if let Some(link) = fed.link() {
                link.give_up();
            }
            self.fail_untaken(message).await;
            return false;
        }
        fed.audit(&envelope, delivery.body().len(), "taken");
        // Should another task get ahead of it here, its expiry still holds.
        {
            let mut state = fed.lock();
            let now = u64::try_from(now_ms()).unwrap_or(u64::MAX);
            state
                .queued_expiry
                .retain(|_, at| at.saturating_add(FORGET_EXPIRY_AFTER_MS) > now);
            // By the id it is queued under (a broadcast's copy has one of its own).
            state
                .queued_expiry
                .insert(message.msg_id, envelope.expires_at_ms);
        }
        if let Err(e) = self.deliver(message.clone()).await {
            // Taken off the broker already (at most once): its sender is told.
            tracing::error!(%trace_id, %msg_id, error = %e, "a taken brief could not be queued");
            self.notify_failed(
                &message,
                &format!("not queued by its recipient's gateway: {}", e.message),
            )
            .await;
        }
        true
    }

    /// Fails a brief whose acknowledgement was not seen to reach the broker: kept here as
    /// failed (should the broker give it again, it is dropped as one handled already) and its
    /// sender told (the notice is carried: the link is likely down). Never typed.
    async fn fail_untaken(self: &Arc<Self>, mut brief: Message) {
        let why = "its recipient's gateway lost the broker link as it took the task off the inbox: not typed in, and not retried";
        brief.state = MsgState::Failed(why.into());
        let kept = brief.clone();
        if let Err(e) = self.store_one_within_cap(kept).await {
            tracing::error!(msg_id = %brief.msg_id, error = %e, "an untaken brief cannot be kept as failed: should the broker give it again, it is typed then");
        }
        self.notify_failed(&brief, why).await;
    }

    /// Whether `task`, just taken off a local queue, is a brief from another host that expired
    /// while it waited there behind another task: then it is failed to its sender, never typed.
    pub(in crate::gateway) async fn expired_in_queue(self: &Arc<Self>, task: &Message) -> bool {
        let Some(fed) = self.fed() else {
            return false;
        };
        let Some(at) = fed.lock().queued_expiry.remove(&task.msg_id) else {
            return false;
        };
        if u64::try_from(now_ms()).unwrap_or(u64::MAX) < at {
            return false;
        }
        self.fail(task, WAITED_TOO_LONG).await;
        true
    }

    /// Holds messages for local entities (the pull path), stored in one transaction and then
    /// acknowledged in one frame: at least once, never acknowledged before the store has them.
    /// One whose recipient has no place to hold it any more goes the ordinary way. With
    /// `together` false (a brief before them on the channel waits, unacknowledged), each is
    /// settled on its own, never through that brief.
    pub(super) async fn hold_all(self: &Arc<Self>, incoming: Vec<Incoming>, together: bool) {
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
                    answered.extend(fed.held(&i.envelope, i.delivery.body().len()));
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
                    self.refuse_and_tell(i.message.to, &i.envelope, &i.delivery, "too many", &why)
                        .await;
                }
            }
        }
        self.receipts_settled(answered).await;
        if let Some(last) = last_held
            && together
        {
            settle(&last.delivery, Handled::Held, true).await;
        }
    }
}

/// The loud line for a message that could not be held now (the broker keeps it).
fn not_stored(envelope: &Envelope, e: &fleet_core::FleetError) {
    let (trace_id, msg_id) = (envelope.trace_id, envelope.msg_id);
    tracing::error!(%trace_id, %msg_id, error = %e, "cannot hold a message; the broker keeps it");
}

#[cfg(test)]
mod tests {
    use super::Waiting;

    #[test]
    fn what_waits_keeps_its_order_and_the_expired_leave_from_anywhere() {
        let mut waiting = Waiting::default();
        assert!(waiting.is_empty());
        assert_eq!(waiting.first_expiry(), None);
        waiting.push(300, "first");
        waiting.push(100, "second");
        waiting.push(200, "third");
        waiting.push(400, "fourth");
        assert_eq!(waiting.first_expiry(), Some(100));
        assert_eq!(waiting.expired(99), Vec::<&str>::new());
        assert_eq!(waiting.expired(200), ["second", "third"]);
        assert_eq!(waiting.first_expiry(), Some(300));
        assert_eq!(waiting.next(), Some("first"));
        assert_eq!(waiting.next(), Some("fourth"));
        assert_eq!(waiting.next(), None);
        assert!(waiting.is_empty());
    }
}
