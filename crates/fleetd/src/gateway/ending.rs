//! The end of a session: `fleet_stop`, the end of a session however it comes (stop, exit,
//! shutdown), and at start-up the reap of what a previous run left behind.

use std::sync::Arc;

use fleet_core::authz::{Tool, check_tool};
use fleet_core::ownership::{Action, Principal, check, parts, told};
use fleet_core::routing::Route;
use fleet_core::{Entity, ErrorCode, FleetError, Gid, Message, WorkerStatus};
use fleet_store::EntityRecord;
use tracing::Instrument;

use super::adoption::{TakenBack, Unadopted};
use super::views::StopResult;
use super::{Caller, LocalPlane, Viewer};

/// When an ended session's files are removed again, after its pane closed: an agent that is
/// still exiting may write into its home meanwhile (a start-up would clear what is left).
const LATE_WRITES: [std::time::Duration; 2] = [
    std::time::Duration::from_secs(2),
    std::time::Duration::from_secs(8),
];

/// How many ended sessions stay in memory (for their last words and late replies' names);
/// older ones are forgotten, the store keeps them.
const MAX_GONE_KEPT: usize = 32;

impl LocalPlane {
    /// The local side of [`Gateway::stop`].
    pub(super) async fn stop(
        self: &Arc<Self>,
        caller: &Caller,
        to: &str,
    ) -> Result<StopResult, FleetError> {
        check_tool(&caller.entity, Tool::Stop)?;
        let (entity, remote) = self.stoppable(to, Some(&caller.entity)).await?;
        if remote && let Some(afar) = self.afar.as_deref() {
            return afar.stop(self, caller, &entity).await;
        }
        if let Some(s) = self.sessions.lock().panes.get(&entity.gid) {
            check(
                Principal::Lead(&caller.entity),
                Action::Stop,
                &entity,
                s.owned(),
            )?;
        }
        Ok(self
            .stop_here(entity, &format!("stopped by lead '{}'", caller.entity.name))
            .await)
    }

    /// The local side of [`Gateway::stop_as`].
    pub(super) async fn stop_as(
        self: &Arc<Self>,
        viewer: &Viewer,
        to: &str,
    ) -> Result<StopResult, FleetError> {
        let (name, read_only) = match viewer {
            Viewer::Lead(caller) => return self.stop(caller, to).await,
            Viewer::Operator { name, read_only } => (name, *read_only),
        };
        if read_only {
            return Err(FleetError::new(
                ErrorCode::Forbidden,
                format!(
                    "operator '{name}' is read-only ([operators.{name}] read_only = true): it may not stop anyone"
                ),
            ));
        }
        let (entity, remote) = self.stoppable(to, None).await?;
        if remote {
            return Err(FleetError::invalid(format!(
                "'{}' runs on host '{}': an operator stops it through that host's fleetd",
                entity.name, entity.host
            )));
        }
        tracing::info!(operator = %name, name = %entity.name, "stopped by an operator");
        Ok(self
            .stop_here(entity, &format!("stopped by operator '{name}'"))
            .await)
    }

    /// Who `to` names, if it may be stopped (a lead may not), and whether it is on another
    /// host; `asker` is the lead asking (none: an operator).
    async fn stoppable(
        &self,
        to: &str,
        asker: Option<&Entity>,
    ) -> Result<(fleet_core::Entity, bool), FleetError> {
        let (entity, remote) = match self.resolve_or_ended(to, asker).await? {
            Route::Local(entity) => (entity, false),
            Route::Remote(entity) => (entity, true),
        };
        if !entity.role.is_pane_bound() {
            return Err(FleetError::invalid(format!(
                "'{}' is a lead: leads are declared in config and cannot be stopped",
                entity.name
            )));
        }
        Ok((entity, remote))
    }

    /// Stops `entity`, of this host, for `reason`.
    async fn stop_here(self: &Arc<Self>, entity: fleet_core::Entity, reason: &str) -> StopResult {
        self.end_session(entity.gid, reason, true).await;
        StopResult {
            gid: entity.gid,
            name: entity.name,
            status: WorkerStatus::Gone,
        }
    }

    /// Ends the session of `gid` however it ended: marks it gone, revokes its token, fails
    /// whatever was on its way to it (telling each sender), tells the sender of the task it had
    /// in flight that it ended before replying (a task whose Enter went in as it ended is left
    /// for its typing to record), then closes its pane when `close` (its program may already be
    /// gone).
    pub(super) async fn end_session(self: &Arc<Self>, gid: Gid, reason: &str, close: bool) {
        let name = self.sessions.lock().pane_name(gid);
        let span = crate::logs::session_span(gid, &name);
        self.close_session(gid, reason, close)
            .instrument(span)
            .await;
    }

    /// [`LocalPlane::end_session`], in the session's span.
    async fn close_session(self: &Arc<Self>, gid: Gid, reason: &str, close: bool) {
        let ended = {
            let mut sessions = self.sessions.lock();
            match sessions.panes.get_mut(&gid) {
                Some(session) if session.status() != WorkerStatus::Gone => {
                    let task = session.exited();
                    Some((
                        session.pane().cloned(),
                        task,
                        session.entity().name.clone(),
                        session.entity().clone(),
                    ))
                }
                _ => None,
            }
        };
        let Some((pane, current, name, entity)) = ended else {
            return;
        };
        if let Some(afar) = self.afar.as_deref() {
            afar.left(self, &entity).await;
        }
        self.sessions.lock().asks.close_from(gid);
        // The reason may quote a screen (a fresh session's that did not start, say).
        tracing::info!(%gid, %name, reason = %crate::logs::summary(reason), "session ended");
        crate::logs::trace_text("end reason", reason);
        self.persist_status(gid).await;
        self.note_ended(gid, reason).await;
        if let Err(e) = self.db.run(move |s| s.revoke_tokens(gid)).await {
            tracing::error!(%gid, error = %e, "cannot revoke a token");
        }
        self.tell_senders(gid, &entity, reason, current).await;
        // Only now close the pane: a brief being typed into it fails with the reason above,
        // not with the pane host's complaint about a closed pane.
        if close
            && let Some(pane) = &pane
            && let Err(e) = self.panes.close(pane).await
        {
            tracing::warn!(%gid, %pane, error = %crate::logs::mux_error(&e), "cannot close the pane");
        }
        self.clear_after(gid).await;
        self.sessions.lock().prune_gone(MAX_GONE_KEPT);
        self.inboxes.forget(gid);
    }

    /// Records why `gid` ended (`reason`, less any screen it quotes), for a later send to its
    /// name.
    async fn note_ended(&self, gid: Gid, reason: &str) {
        let why = parts(reason).0.to_string();
        if let Err(e) = self.db.run(move |s| s.note_ended(gid, &why)).await {
            tracing::error!(%gid, error = %e, "cannot record why a session ended");
        }
    }

    /// Tells the senders of what was on its way to `entity` (ended for `reason`), and the
    /// sender of its task in flight (`current`), that it will not be answered. A screen the
    /// reason quotes (a fresh session's that did not start) is told to the worker's owner
    /// alone; what is stored, and told anyone else, withholds it.
    async fn tell_senders(
        self: &Arc<Self>,
        gid: Gid,
        entity: &Entity,
        reason: &str,
        current: Option<Message>,
    ) {
        let (public, screen) = parts(reason);
        let (owner, name) = (entity.parent, &entity.name);
        let why = format!("'{name}' is gone ({public})");
        let stored = told(&why, screen, false);
        // The task whose Enter went in as it ended may have reached it: told below as one it
        // ended before replying to, and recorded by its typing. One only pasted is failed here,
        // and its Enter withheld.
        let in_flight = current.as_ref().map(|t| t.msg_id);
        match self
            .db
            .run(move |s| s.fail_undelivered_to(gid, &stored, in_flight))
            .await
        {
            Ok(failed) => {
                for message in failed {
                    let to_owner = Some(message.from) == owner;
                    self.notify_failed(&message, &told(&why, screen, to_owner))
                        .await;
                }
            }
            Err(e) => tracing::error!(%gid, error = %e, "cannot fail undelivered messages"),
        }
        if let Some(task) = current {
            let why = format!("'{name}' ended before replying ({public})");
            let to_owner = Some(task.from) == owner;
            self.notify_failed(&task, &told(&why, screen, to_owner))
                .await;
        }
    }

    /// What a session leaves behind, cleared: its launch's files now and again a while later
    /// (an agent still exiting may write into its home after its pane closed: opencode and
    /// Claude Code save their state as they go), and its workspace after the first pause,
    /// once what ran in it had time to exit (a teardown under a live program would leave what
    /// it writes after as an orphan); one cut short by fleetd stopping is taken down as
    /// fleetd stops.
    async fn clear_after(&self, gid: Gid) {
        self.launchers.finish(gid).await;
        let (launchers, shutdown) = (Arc::clone(&self.launchers), self.shutdown.clone());
        self.tasks.spawn(async move {
            for (pass, after) in LATE_WRITES.into_iter().enumerate() {
                tokio::select! {
                    () = tokio::time::sleep(after) => launchers.finish(gid).await,
                    () = shutdown.cancelled() => return,
                }
                if pass == 0 {
                    launchers.workspaces.end(gid).await;
                }
            }
        });
    }

    /// At start-up, once what still runs was taken back ([`LocalPlane::take_back`], `back`):
    /// ends the sessions of the previous run that were not (their tokens stop working, the
    /// senders of what they held are told why), tells the remote senders of the tasks found
    /// typed, fails the tasks it was typing that the panes could not tell about and what it had
    /// queued for a session that is gone, closes the panes nobody was taken back in,
    /// clears what the ended ones left, and starts the pumps of those taken back. Held
    /// messages stay.
    pub(super) async fn recover(self: &Arc<Self>, back: TakenBack) -> Result<(), FleetError> {
        let TakenBack {
            ended,
            typed,
            unsure,
        } = back;
        for Unadopted { record, why } in ended {
            self.end_leftover(record, &why).await?;
        }
        for task in &typed {
            if let Some(afar) = self.afar_of(task) {
                afar.injected(self, task).await;
            }
        }
        for (task, why) in unsure {
            let reason = format!(
                "interrupted: fleetd stopped while typing it, and after the restart its worker's pane could not tell whether it got in ({why}); it is not typed again"
            );
            self.fail(&task, &reason).await;
        }
        let kept: Vec<Gid> = self.sessions.lock().panes.keys().copied().collect();
        let spared = kept.clone();
        let leftovers = self
            .db
            .run(move |s| {
                s.fail_leftovers(
                    "interrupted: fleetd stopped while typing it; it may or may not have reached the pane, and is not retried",
                    "its recipient is gone: fleetd restarted",
                    &spared,
                )
            })
            .await?;
        for message in &leftovers {
            let reason = message
                .state
                .reason()
                .unwrap_or("fleetd restarted")
                .to_string();
            self.notify_failed(message, &reason).await;
        }
        // Every pane in this gateway's private server that no session was taken back in is a
        // leftover, including one whose spawn died before it was recorded.
        let open = self.kept_panes();
        let leftovers =
            self.panes.panes().await.map_err(|e| {
                FleetError::new(ErrorCode::PaneHost, format!("cannot list panes: {e}"))
            })?;
        for pane in leftovers.keys().filter(|p| !open.contains(*p)) {
            tracing::info!(%pane, "closing a previous run's pane");
            if let Err(e) = self.panes.close(pane).await {
                tracing::warn!(%pane, error = %crate::logs::mux_error(&e), "cannot close a previous run's pane");
            }
        }
        self.launchers.finish_leftovers(&kept).await;
        self.launchers.workspaces.end_leftovers(&kept).await;
        for gid in kept {
            self.start_pump(gid);
        }
        Ok(())
    }

    /// Ends `record`, a session of the previous run not taken back because `why`: marks it
    /// gone, revokes its token, and tells the senders of what it held and of the tasks it
    /// was working on.
    async fn end_leftover(
        self: &Arc<Self>,
        record: EntityRecord,
        why: &str,
    ) -> Result<(), FleetError> {
        let gid = record.entity.gid;
        let name = record.entity.name.clone();
        tracing::info!(%gid, %name, why, "ending a worker the previous run left: it is not taken back");
        let gone = format!("'{name}' is gone: fleetd restarted and did not take it back ({why})");
        let told = gone.clone();
        for message in self
            .db
            .run(move |s| s.fail_undelivered_to(gid, &told, None))
            .await?
        {
            self.notify_failed(&message, &gone).await;
        }
        self.db
            .run(move |s| s.set_session(gid, WorkerStatus::Gone, None))
            .await?;
        self.note_ended(
            gid,
            &format!("fleetd restarted and did not take it back ({why})"),
        )
        .await;
        self.db.run(move |s| s.revoke_tokens(gid)).await?;
        if let Some(afar) = self.afar.as_deref() {
            afar.sender_gone(self, gid).await;
            afar.reaped(self, record.entity.clone());
        }
        let reason =
            format!("'{name}' never answered: fleetd restarted and did not take it back ({why})");
        for task in self.db.run(move |s| s.unanswered_tasks_to(gid)).await? {
            self.notify_failed(&task, &reason).await;
        }
        Ok(())
    }
}
