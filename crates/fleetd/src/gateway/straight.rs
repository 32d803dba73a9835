//! A task for an idle worker goes straight in: when the worker's pump could take a task now
//! and nothing is queued before it, the task is stored already taken (`injecting`) in the
//! transaction that accepts it, and typed in at once, with no stop in the queue (no hop to the
//! store to take it off, no wake of the pump to do so). Otherwise it is queued as any other.
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

use super::LocalPlane;

impl LocalPlane {
    /// Accepts task `message` for its worker `message.to`: taken and typed in at once if the
    /// worker's pump could take it now, queued otherwise; where it went (dead if the session
    /// ended meanwhile).
    pub(super) async fn queue_task(
        self: &Arc<Self>,
        mut message: Message,
    ) -> Result<Placement, FleetError> {
        let to = message.to;
        let at_once = !message.expired(now_ms()) && self.claim_at_once(to);
        message.state = if at_once {
            MsgState::Injecting
        } else {
            MsgState::Queued
        };
        let mut kept = message.clone();
        let stored = self.commits.store(vec![message]).await.map(|mut o| o.pop());
        let inserted = match stored {
            Ok(Some(Ok(inserted))) => inserted,
            failed => {
                if at_once {
                    self.unclaim(to);
                }
                return Err(match failed {
                    Ok(Some(Err(full))) => self.over_cap(to, &full).await,
                    Err(e) => e,
                    _ => FleetError::internal("the store answered for no message"),
                });
            }
        };
        let (msg_id, trace_id, kind) = (kept.msg_id, kept.trace_id, kept.kind);
        let (fresh, taken) = (inserted.fresh(), at_once && inserted == Inserted::New);
        tracing::info!(%trace_id, %msg_id, %kind, %to, fresh, taken, placement = ?Placement::Queue, "accepted");
        if taken {
            return Ok(self.type_at_once(kept).await);
        }
        if at_once {
            self.unclaim(to);
        }
        if !fresh {
            return Ok(Placement::Queue);
        }
        kept.state = MsgState::Queued;
        Ok(self.queued(&kept).await)
    }

    /// Claims `to`'s queue for a task to be typed in at once: as its pump would (the claim free,
    /// the rule letting the pump hand it a task now), and only for a session whose tasks are
    /// typed in (not one that pulls them).
    fn claim_at_once(&self, to: Gid) -> bool {
        let mut sessions = self.sessions.lock();
        if sessions.host_down.is_some() {
            return false;
        }
        let free = sessions.may_take_task(to, Taker::Pump);
        match sessions.panes.get_mut(&to) {
            Some(session) if !session.pulls() => session.claim(free),
            _ => false,
        }
    }

    /// Makes `task`, stored taken under the claim on its worker's queue, the worker's task in
    /// flight, left for the worker's pump to type in (a call that goes away does not take the
    /// typing with it); queued, or dead if the session can no longer take it (failed to its
    /// sender then).
    async fn type_at_once(self: &Arc<Self>, task: Message) -> Placement {
        let (gid, kind) = (task.to, task.kind);
        crate::logs::step(task.msg_id, "claimed");
        // Boxed: a task that cannot start is failed, failing delivers a notice, and delivering
        // comes back here.
        if !Box::pin(self.start_task(gid, task, true)).await {
            self.metrics.accepted(kind, Placement::Dead);
            return Placement::Dead;
        }
        self.metrics.accepted(kind, Placement::Queue);
        Placement::Queue
    }
}
