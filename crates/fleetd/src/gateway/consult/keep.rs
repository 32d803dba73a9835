//! An architect after its answer: stopped once it answered, or kept `keep_s` after its last
//! answer for follow-ups (here, or on another host as that host announces it), and the
//! caller's architect left from an earlier consult retired before a slot starts afresh.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::clock::now_ms;
use fleet_core::{Gid, Role};
use tokio::time::Instant;

use super::super::{Caller, LocalPlane};
use crate::config::SlotConfig;

/// How soon a kept architect on another host that its host announces busy is looked at again.
const KEPT_RECHECK: Duration = Duration::from_secs(1);

impl LocalPlane {
    /// Stops the caller's architect that still holds `slot`'s name on the slot's host, if any
    /// (kept from an earlier consult). Anyone else's of that name is left alone: the spawn then
    /// fails, naming it.
    pub(super) async fn retire_slot(self: &Arc<Self>, caller: &Caller, slot: &SlotConfig) {
        let host = slot.host.as_deref().unwrap_or(&self.host_id);
        let holder = self
            .resolve_route(&format!("{}@{host}", slot.name))
            .ok()
            .map(|route| route.entity().clone())
            .filter(|e| e.role == Role::Architect && e.parent == Some(caller.entity.gid));
        if let Some(architect) = holder
            && let Err(e) = self.stop(caller, &architect.gid.to_string()).await
        {
            tracing::warn!(name = %architect.name, error = %e, "cannot stop an earlier architect of a slot");
        }
    }

    /// Stops architect `gid` (of `slot`) once it is done: `keep_s` after its last answer (a
    /// follow-up answered meanwhile keeps it longer), or, while it is still working on its
    /// brief (`answered` false), once another `wait` has passed without its answer.
    pub(in crate::gateway) fn retire_later(
        self: &Arc<Self>,
        caller: &Caller,
        slot: &SlotConfig,
        gid: Gid,
        answered: bool,
        wait: Duration,
    ) {
        let (gateway, caller) = (Arc::clone(self), caller.clone());
        let keep = Duration::from_secs(slot.keep_s);
        self.tasks.spawn(async move {
            if !answered
                && tokio::time::timeout(wait, gateway.until_answered(caller.entity.gid, gid))
                    .await
                    .is_err()
            {
                tracing::info!(%gid, "an architect did not answer within another wait: stopped");
            } else if !gateway.until_kept(caller.entity.gid, gid, keep).await {
                return;
            }
            // Gone already (stopped by the lead, say): nothing to do.
            let _ = gateway.stop(&caller, &gid.to_string()).await;
        });
    }

    /// Returns once architect `gid` has been kept `keep` since its last answer to `lead` (and
    /// since the lead had it: the consult returned now), with nothing in flight, or is gone:
    /// true; false when the gateway shuts down first.
    pub(super) async fn until_kept(&self, lead: Gid, gid: Gid, keep: Duration) -> bool {
        if self.sessions.lock().panes.contains_key(&gid) {
            self.until_idle_for(gid, keep, std::time::Instant::now())
                .await
        } else {
            self.until_kept_afar(lead, gid, keep).await
        }
    }

    /// [`LocalPlane::until_kept`] for an architect of this host: idle (its last answer given,
    /// nothing in flight) for `keep`, and nothing queued for it within `keep`, counted from
    /// `handed` at the earliest (when the lead had its answer: one that answered long before a
    /// slower architect is still kept `keep` for a follow-up).
    pub(super) async fn until_idle_for(
        &self,
        gid: Gid,
        keep: Duration,
        handed: std::time::Instant,
    ) -> bool {
        let Some(mut kick) = self.sessions.lock().panes.get(&gid).map(|s| s.kicks()) else {
            return true;
        };
        loop {
            kick.borrow_and_update();
            // Counted from its last answer, or from the last task queued for it if that came
            // later (a follow-up it has yet to pull).
            let idle_for = match self.sessions.lock().panes.get(&gid) {
                Some(session) if session.status().is_live() => {
                    session.idle_for(Instant::now()).map(|idle| {
                        let idle = idle.min(handed.elapsed());
                        session
                            .last_queued()
                            .map_or(idle, |q| idle.min(q.elapsed()))
                    })
                }
                _ => return true,
            };
            let nap = match idle_for {
                Some(idle) if idle >= keep => return true,
                Some(idle) => Some(keep - idle),
                // Working on a follow-up (or asking): looked at again when that changes.
                None => None,
            };
            let napping = async {
                match nap {
                    Some(nap) => tokio::time::sleep(nap).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = kick.changed() => if changed.is_err() { return true },
                () = napping => {}
                () = self.shutdown.cancelled() => return false,
            }
        }
    }

    /// [`LocalPlane::until_kept`] for an architect on another host, whose idle time only its host
    /// knows: looked at when `keep` is up, it is kept on while its host announces it busy, and
    /// for `keep` after an answer it gave `lead` meanwhile.
    pub(super) async fn until_kept_afar(&self, lead: Gid, gid: Gid, keep: Duration) -> bool {
        let mut due = Instant::now() + keep;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = self.shutdown.cancelled() => return false,
            }
            let busy = match self.afar.as_deref().and_then(|afar| afar.busy(gid)) {
                Some(busy) => busy,
                None => return true,
            };
            if busy {
                due = Instant::now() + KEPT_RECHECK;
                continue;
            }
            let since = match self.db.run(move |s| s.last_answer_ms(lead, gid)).await {
                Ok(Some(at)) => {
                    Duration::from_millis(u64::try_from(now_ms().saturating_sub(at)).unwrap_or(0))
                }
                _ => return true,
            };
            if since >= keep {
                return true;
            }
            due = Instant::now() + (keep - since);
        }
    }

    /// Returns once `from` has answered `to` (see [`fleet_store::Store::last_answer_ms`]) or is
    /// gone: looked at again whenever something is held for `to`, or an answer is handed to a
    /// send of its (a follow-up waiting for it).
    pub(in crate::gateway) async fn until_answered(&self, to: Gid, from: Gid) {
        let mut inbox = self.inboxes.watch(to);
        let mut handed = self.inboxes.watch_handed(to);
        loop {
            inbox.borrow_and_update();
            handed.borrow_and_update();
            let answered = self.db.run(move |s| s.last_answer_ms(to, from)).await;
            let gone = self.resolve_route(&from.to_string()).is_err();
            if gone || answered.map_or(true, |at| at.is_some()) {
                return;
            }
            let closed = tokio::select! {
                changed = inbox.changed() => changed.is_err(),
                changed = handed.changed() => changed.is_err(),
            };
            if closed {
                return;
            }
        }
    }
}
