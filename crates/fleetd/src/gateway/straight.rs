//! A task for an idle worker goes straight to its pump: when the pump could take a task now and
//! nothing is queued before it, the task is stored already taken (`injecting`) in the
//! transaction that accepts it and left for the pump to type in, with no stop in the queue (no
//! second transaction to take it off). Otherwise it is queued as any other.
//!
//! The rule is the pump's own ([`fleet_core::delivery::may_take_task`], under the queue's
//! claim), and the store keeps the order: a task offered taken while another is queued for the
//! same worker is queued behind it instead, in the same transaction. A restart that finds it
//! `injecting` with none of its keys gone in puts it back on the queue, as one the pump took.

use std::sync::Arc;

use fleet_core::clock::now_ms;
use fleet_core::delivery::{Placement, Taker};
use fleet_core::{FleetError, Gid, Message, MsgState};
use fleet_store::Inserted;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::LocalPlane;

impl LocalPlane {
    /// Accepts task `message` for its worker `message.to`: taken and left for the worker's
    /// pump if the pump could take it now, queued otherwise; where it went (dead if the session
    /// ended meanwhile).
    pub(super) async fn queue_task(
        self: &Arc<Self>,
        mut message: Message,
    ) -> Result<Placement, FleetError> {
        let to = message.to;
        if !message.expired(now_ms()) && self.claim_at_once(to) {
            // On a task of the gateway's: a call that goes away as its task is stored (a
            // client gone) leaves neither the claim held nor a task taken that nobody types.
            return match self.take_at_once_on_task(message).await {
                Ok(placed) => placed,
                Err(join) => Err(FleetError::internal(format!(
                    "taking a task for an idle worker failed: {join}"
                ))),
            };
        }
        message.state = MsgState::Queued;
        let kept = message.clone();
        let fresh = self.store_one_within_cap(message).await?;
        let (msg_id, trace_id, kind) = (kept.msg_id, kept.trace_id, kept.kind);
        tracing::info!(%trace_id, %msg_id, %kind, %to, fresh, taken = false, placement = ?Placement::Queue, "accepted");
        if !fresh {
            return Ok(Placement::Queue);
        }
        Ok(self.queued(&kept).await)
    }

    /// [`LocalPlane::take_at_once`], on a task of the gateway's (in the caller's span).
    fn take_at_once_on_task(
        self: &Arc<Self>,
        message: Message,
    ) -> JoinHandle<Result<Placement, FleetError>> {
        let plane = Arc::clone(self);
        self.tasks
            .spawn(async move { plane.take_at_once(message).await }.in_current_span())
    }

    /// Stores task `message`, its worker's queue claimed by [`LocalPlane::claim_at_once`],
    /// taken (`injecting`) and leaves it for the worker's pump; or, something queued before it,
    /// queued behind that. The claim is let go either way.
    async fn take_at_once(self: &Arc<Self>, mut message: Message) -> Result<Placement, FleetError> {
        let to = message.to;
        message.state = MsgState::Injecting;
        let mut kept = message.clone();
        let stored = self.commits.store(vec![message]).await.map(|mut o| o.pop());
        let inserted = match stored {
            Ok(Some(Ok(inserted))) => inserted,
            failed => {
                self.unclaim(to);
                return Err(match failed {
                    Ok(Some(Err(full))) => self.over_cap(to, &full).await,
                    Err(e) => e,
                    _ => FleetError::internal("the store answered for no message"),
                });
            }
        };
        let (msg_id, trace_id, kind) = (kept.msg_id, kept.trace_id, kept.kind);
        let (fresh, taken) = (inserted.fresh(), inserted == Inserted::New);
        tracing::info!(%trace_id, %msg_id, %kind, %to, fresh, taken, placement = ?Placement::Queue, "accepted");
        match inserted {
            Inserted::New => Ok(self.type_at_once(kept).await),
            Inserted::Seen => {
                self.unclaim(to);
                Ok(Placement::Queue)
            }
            Inserted::Queued => {
                self.unclaim(to);
                kept.state = MsgState::Queued;
                Ok(self.queued(&kept).await)
            }
        }
    }

    /// Claims `to`'s queue for a task to be typed in at once: as its pump would (the claim free,
    /// the rule letting the pump hand it a task now), and only for a session whose tasks are
    /// typed in (not one that pulls them) and whose pump runs (a session taken back at a
    /// restart gets none until what the previous run left is settled).
    fn claim_at_once(&self, to: Gid) -> bool {
        let mut sessions = self.sessions.lock();
        if sessions.host_down.is_some() {
            return false;
        }
        let free = sessions.may_take_task(to, Taker::Pump);
        match sessions.panes.get_mut(&to) {
            Some(session) if session.pumped() && !session.pulls() => session.claim(free),
            _ => false,
        }
    }

    /// The task left for `gid`'s pump to type in, once, if there is one (see
    /// [`super::session::PaneSession::take_to_type`]).
    pub(super) fn left_to_type(&self, gid: Gid) -> Option<Message> {
        self.sessions
            .lock()
            .panes
            .get_mut(&gid)
            .and_then(|s| s.take_to_type())
    }

    /// Makes `task`, stored taken under the claim on its worker's queue, the worker's task in
    /// flight, left for the worker's pump to type in; queued, or dead if the session can no
    /// longer take it (failed to its sender then).
    async fn type_at_once(self: &Arc<Self>, task: Message) -> Placement {
        let (gid, kind) = (task.to, task.kind);
        crate::logs::step(task.msg_id, "claimed");
        if !self.start_task(gid, task, true).await {
            self.metrics.accepted(kind, Placement::Dead);
            return Placement::Dead;
        }
        self.metrics.accepted(kind, Placement::Queue);
        Placement::Queue
    }
}
