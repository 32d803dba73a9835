//! Carrying a message through an outage: one whose gateway carries it (a reply, a notice) is
//! published if the broker confirms it in time, else kept in the store's outbox and sent by the
//! flusher once the link allows; its sender is done at once either way.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fleet_core::clock::now_ms;
use fleet_core::delivery::Placement;
use fleet_core::{ErrorCode, FleetError, Kind, Message, MsgId};
use tokio::time::Instant;

use super::super::LocalPlane;
use super::Federation;
use super::unavailable;

/// How long a carried message's publish is waited for before it is kept in the outbox and its
/// sender let go: a confirm takes milliseconds; a link that died unseen takes seconds to say so.
const CARRY_PATIENCE: Duration = Duration::from_secs(1);

/// How often the presence loop may start a flush of the outbox (a refused message stays there,
/// and is tried again at this pace).
const FLUSH_EVERY: Duration = Duration::from_secs(1);

impl Federation {
    /// Carries `message` (for another host, one [`carried`] says its gateway carries) to its
    /// recipient whatever the link is doing: published if the broker confirms it within
    /// [`CARRY_PATIENCE`], else kept in the store's outbox (the publish left running, the
    /// flusher sending it once the link allows) and taken all the same. Its sender is done at
    /// once either way; a copy that goes twice is dropped by its recipient's gateway. Refused
    /// only when the broker refuses it outright (its recipient is gone), or when it can be
    /// neither published nor kept.
    pub(super) async fn carry(
        &self,
        g: &Arc<LocalPlane>,
        message: Message,
    ) -> Result<Placement, FleetError> {
        let Some(fed) = self.me() else {
            return self.keep_carried(g, &message).await;
        };
        let (gateway, sent) = (Arc::clone(g), message.clone());
        // While its publish runs, the flusher leaves it be (no second copy from there).
        self.lock().carrying.insert(message.msg_id);
        let mut publish = g.tasks.spawn(async move {
            let published = fed.publish_remote(&gateway, &sent).await;
            fed.lock().carrying.remove(&sent.msg_id);
            published
        });
        match tokio::time::timeout(CARRY_PATIENCE, &mut publish).await {
            Ok(Ok(Ok(placement))) => {
                self.carried(g, &message).await;
                Ok(placement)
            }
            // Refused by a broker that is there (its recipient gone, its inbox full): said so.
            Ok(Ok(Err(e))) if !self.link_failed(&e) => Err(e),
            // The link failed under it, or the publish panicked: the outbox has it.
            Ok(_) => self.keep_carried(g, &message).await,
            Err(_slow) => {
                let kept = self.keep_carried(g, &message).await?;
                let (fed, gateway) = (self.me(), Arc::clone(g));
                let (msg_id, kind) = (message.msg_id, message.kind);
                g.tasks.spawn(async move {
                    let Some(fed) = fed else { return };
                    match publish.await {
                        Ok(Ok(_)) => fed.outbox_sent(&gateway, msg_id).await,
                        Ok(Err(e)) if !fed.link_failed(&e) => {
                            tracing::error!(%msg_id, %kind, error = %e, "a carried message cannot be delivered: dropped");
                            fed.outbox_sent(&gateway, msg_id).await;
                        }
                        // The flusher sends it once the link allows.
                        _ => {}
                    }
                });
                Ok(kept)
            }
        }
    }

    /// Whether a publish failed for want of a link (none, or it broke under the publish),
    /// rather than being refused by a broker that is there (an inbox full, or gone).
    fn link_failed(&self, err: &FleetError) -> bool {
        err.code == ErrorCode::BrokerUnavailable && self.link().is_none()
    }

    /// A carried message is taken: counted, and a reply notes its task answered here.
    async fn carried(&self, g: &Arc<LocalPlane>, message: &Message) {
        g.metrics.accepted(message.kind, Placement::Remote);
        self.answered_elsewhere(g, message).await;
    }

    /// Keeps `message` in the outbox until the broker takes it, and takes it; an error only
    /// when the store cannot keep it either (its sender then hears the broker is out of reach).
    async fn keep_carried(
        &self,
        g: &Arc<LocalPlane>,
        message: &Message,
    ) -> Result<Placement, FleetError> {
        let kept = message.clone();
        if let Err(e) = g.db.run(move |s| s.put_outbox(&kept, now_ms())).await {
            tracing::error!(msg_id = %message.msg_id, kind = %message.kind, error = %e, "a message for another host cannot be kept: the broker cannot be reached and the store cannot keep it");
            return Err(unavailable(&format!(
                "this host's store cannot keep the message ({e}); nothing was sent"
            )));
        }
        self.outbox_waiting.store(true, Ordering::Relaxed);
        tracing::info!(msg_id = %message.msg_id, kind = %message.kind, "the broker cannot take it now: kept until it can");
        self.carried(g, message).await;
        Ok(Placement::Remote)
    }

    /// Notes, when `published` (gone to another host) answers a task of this store (a worker's
    /// reply or a failure notice to a lead there), that the task is answered: no copy of the
    /// answer is kept here, and a restart reaping the worker would report it unanswered.
    pub(super) async fn answered_elsewhere(&self, g: &LocalPlane, published: &Message) {
        let (Some(task), Kind::Reply | Kind::Failed) = (published.in_reply_to, published.kind)
        else {
            return;
        };
        let by_reply = published.kind == Kind::Reply;
        if let Err(e) =
            g.db.run(move |s| s.answered_elsewhere(task, by_reply))
                .await
        {
            tracing::warn!(msg_id = %task, error = %e, "a task answered on another host is not noted: a restart reaping its worker would report it unanswered");
        }
    }

    /// Takes a sent message out of the outbox.
    async fn outbox_sent(&self, g: &LocalPlane, msg_id: MsgId) {
        if let Err(e) = g.db.run(move |s| s.outbox_sent(msg_id)).await {
            tracing::warn!(%msg_id, error = %e, "a sent message stays in the outbox: it may be sent twice (its receiver drops the copy)");
        }
    }

    /// Keeps `notice` (for a sender on another host) in the store until the broker can take
    /// it: a notice this gateway made has no caller to retry it.
    pub(super) async fn keep_for_broker(&self, g: &LocalPlane, notice: &Message) {
        let kept = notice.clone();
        match g.db.run(move |s| s.put_outbox(&kept, now_ms())).await {
            Ok(()) => {
                self.outbox_waiting.store(true, Ordering::Relaxed);
                tracing::warn!(msg_id = %notice.msg_id, kind = %notice.kind, "the broker cannot be reached: the notice is kept until it can");
            }
            Err(e) => {
                tracing::error!(msg_id = %notice.msg_id, error = %e, "a notice for another host is lost: the broker cannot be reached and the store cannot keep it");
            }
        }
    }

    /// Publishes what was kept for the broker, oldest first, once it can be reached; stops at
    /// the first that finds it gone again (and looks again later). One that can never go (its
    /// recipient's inbox is gone) is dropped, loudly. One flush at a time: another finds this
    /// one at work and leaves it to it.
    pub(super) async fn flush_outbox(&self, g: &LocalPlane) {
        let Ok(_flushing) = self.flushing.try_lock() else {
            return;
        };
        self.outbox_waiting.store(false, Ordering::Relaxed);
        let kept = match g.db.run(|s| s.outbox()).await {
            Ok(kept) => kept,
            Err(e) => {
                tracing::error!(error = %e, "cannot read what waits for the broker");
                self.outbox_waiting.store(true, Ordering::Relaxed);
                return;
            }
        };
        for notice in kept {
            let msg_id = notice.msg_id;
            if self.lock().carrying.contains(&msg_id) {
                self.outbox_waiting.store(true, Ordering::Relaxed);
                continue;
            }
            match self.publish_remote(g, &notice).await {
                Err(e) if self.link_failed(&e) => {
                    self.outbox_waiting.store(true, Ordering::Relaxed);
                    return;
                }
                // An inbox full now may take it later: kept, and what follows goes meanwhile.
                Err(e) if e.code == ErrorCode::BrokerUnavailable => {
                    tracing::warn!(%msg_id, kind = %notice.kind, error = %e, "a kept message was refused: kept, to try again");
                    self.outbox_waiting.store(true, Ordering::Relaxed);
                    continue;
                }
                Err(e) => {
                    tracing::error!(%msg_id, kind = %notice.kind, error = %e, "a kept message cannot be delivered: dropped");
                }
                Ok(_) => {}
            }
            self.outbox_sent(g, msg_id).await;
        }
    }

    /// Starts a flush of the outbox when something waits in it and the link is up, at most once
    /// a second (called by the presence loop, so what was kept goes within a second of the link
    /// coming back, not only at the next connection).
    pub(super) fn flush_when_waiting(&self, g: &Arc<LocalPlane>) {
        if !self.outbox_waiting.load(Ordering::Relaxed) || self.link().is_none() {
            return;
        }
        {
            let mut state = self.lock();
            let now = Instant::now();
            if state
                .flushed
                .is_some_and(|at| now.duration_since(at) < FLUSH_EVERY)
            {
                return;
            }
            state.flushed = Some(now);
        }
        self.start_task(g, |fed, g| async move { fed.flush_outbox(&g).await });
    }

    /// Sends `message`, for a remote recipient, on its way: carried through an outage when its
    /// gateway carries such a message (the rule: [`fleet_core::delivery::carried`]), else
    /// published now or refused. What was taken is counted, and an answer notes its task
    /// answered.
    pub(super) async fn send_remote(
        &self,
        g: &Arc<LocalPlane>,
        message: Message,
    ) -> Result<Placement, FleetError> {
        if self.carries(&message) {
            return self.carry(g, message).await;
        }
        let published = self.publish_remote(g, &message).await;
        if published.is_ok() {
            g.metrics.accepted(message.kind, Placement::Remote);
            self.answered_elsewhere(g, &message).await;
        }
        published
    }

    /// After a brief from a remote sender was typed in and its submit verified: tell the
    /// sender's gateway (carried: the pump types the next task meanwhile).
    pub(super) async fn receipt_injected(&self, g: &Arc<LocalPlane>, task: &Message) {
        let receipt = Message::notice(task, Kind::Injected, String::new(), now_ms());
        if g.placement(&receipt) != Placement::Remote {
            return;
        }
        if let Err(e) = self.carry(g, receipt).await {
            tracing::warn!(trace_id = %task.trace_id, msg_id = %task.msg_id, error = %e, "cannot send the INJECTED receipt");
        }
    }
}
