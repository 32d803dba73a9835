//! A worker's life after its spawn: opening its pane (at spawn and at each recycle), the
//! `idle_ttl` reap, and the `context_cap` recycle: after that many tasks the worker gets a
//! fresh session (new process, new token) under the same gid and name, so what is queued for
//! it waits and goes to the fresh session.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::lifecycle::{LifeFacts, Turnover, turnover};
use fleet_core::{Gid, SessionEvent};

use super::LocalPlane;

/// How often idle timers and task counts are looked at.
pub(super) const LIFECYCLE_TICK: Duration = Duration::from_millis(250);

/// What the lifecycle loop found to do.
enum LifeStep {
    /// Stop it: idle longer than its profile allows.
    Reap(Gid, Duration),
    /// Give it a fresh session: it took as many tasks as its profile allows.
    Recycle(Gid, u64),
}

impl LocalPlane {
    /// Reaps workers idle past their `idle_ttl` and recycles those at their `context_cap`.
    pub(super) async fn check_lifecycles(self: &Arc<Self>) {
        let due: Vec<LifeStep> = {
            let mut sessions = self.sessions.lock();
            if sessions.host_down.is_some() {
                return;
            }
            let mut due = Vec::new();
            for (gid, session) in sessions.panes.iter_mut() {
                let facts = LifeFacts {
                    status: session.status(),
                    claiming: session.claiming(),
                    cap_reached: session.cap_reached(),
                    idle_for: session.idle_for(tokio::time::Instant::now()),
                    idle_ttl: session.profile().idle_ttl(),
                };
                match (turnover(&facts), session.profile().context_cap) {
                    // Spawning again from here on: the pump types nothing into it meanwhile.
                    (Some(Turnover::Recycle), Some(cap))
                        if session.apply(SessionEvent::Recycle).is_ok() =>
                    {
                        due.push(LifeStep::Recycle(*gid, cap));
                    }
                    (Some(Turnover::Reap), _) => {
                        if let Some(ttl) = facts.idle_ttl
                            && session.apply(SessionEvent::Stop).is_ok()
                        {
                            due.push(LifeStep::Reap(*gid, ttl));
                        }
                    }
                    _ => {}
                }
            }
            due
        };
        for item in due {
            match item {
                LifeStep::Reap(gid, ttl) => {
                    // Said here: the ended session's line shows its reason only summarised.
                    tracing::info!(%gid, idle_ttl_s = ttl.as_secs(), "reaping a worker idle for its profile's idle_ttl_s");
                    let reason = format!("idle for {} s, its profile's idle_ttl_s", ttl.as_secs());
                    self.end_session(gid, &reason, true).await;
                }
                LifeStep::Recycle(gid, cap) => {
                    let gateway = Arc::clone(self);
                    let why = format!("its context_cap of {cap} tasks is reached");
                    self.tasks
                        .spawn(async move { gateway.recycle(gid, &why).await });
                }
            }
        }
    }

    /// Gives `gid` (spawning again, after [`SessionEvent::Recycle`]) a fresh session in a new
    /// pane, because `why`; its queued tasks wait for it. If the fresh session does not become
    /// ready, the worker ends (and the senders of what waited for it are told).
    pub(super) async fn recycle(self: &Arc<Self>, gid: Gid, why: &str) {
        let found = {
            let mut sessions = self.sessions.lock();
            sessions.panes.get_mut(&gid).map(|s| {
                (
                    s.start_afresh(),
                    s.entity().clone(),
                    Arc::clone(s.profile()),
                    s.cwd().to_path_buf(),
                )
            })
        };
        let Some((old, entity, profile, cwd)) = found else {
            return;
        };
        let name = entity.name.clone();
        tracing::info!(%gid, %name, why, "recycling");
        self.persist_status(gid).await;
        if let Err(e) = self.db.run(move |s| s.set_spawned_as(&entity)).await {
            tracing::error!(%gid, error = %e, "cannot record what a recycled session runs as");
        }
        if let Err(e) = self.db.run(move |s| s.revoke_tokens(gid)).await {
            tracing::error!(%gid, error = %e, "cannot revoke a recycled session's token");
        }
        if let Some(old) = &old
            && let Err(e) = self.panes.close(old).await
        {
            tracing::warn!(%gid, pane = %old, error = %crate::logs::mux_error(&e), "cannot close a recycled session's pane");
        }
        self.launchers.finish(gid).await;
        // Through whatever dialogs its program shows while starting, each asked of its owner.
        let fresh = async {
            let pane = self.open_pane(gid, &name, &profile, cwd).await?;
            self.start_on(gid, &pane, &profile).await
        };
        match fresh.await {
            Ok(()) => tracing::info!(%gid, %name, "recycled: a fresh session is ready"),
            Err(e) => {
                // Its error may quote the fresh session's screen.
                tracing::warn!(%gid, %name, why, code = %e.code, error = %crate::logs::summary(&e.message), "a recycled worker's fresh session did not start");
                let reason = format!("its fresh session ({why}) did not start: {e}");
                self.end_session(gid, &reason, true).await;
            }
        }
    }
}
