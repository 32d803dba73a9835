//! A worker's start, shared by a spawn and a restart: its pane opened, its program seen ready,
//! and its status kept in the store.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::dialog::{Dialog, read_dialog};
use fleet_core::ownership::quoting;
use fleet_core::{ErrorCode, FleetError, Gid, Role, SessionEvent, WorkerStatus};
use fleet_mux::{PaneId, PaneSpec};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::LocalPlane;
use super::session::{PaneSession, StartState};
use super::start_dialogs::StartAsk;
use super::views::{DialogView, Surfaced};
use crate::config::ProfileConfig;
use crate::launch::Worker;
use crate::token;

/// How often the readiness gate looks for the ready marker on screen.
const MARKER_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How often the readiness gate looks for a dialog of the program's start on screen.
const START_DIALOG_LOOK: Duration = Duration::from_millis(500);
/// How many lines of a failed worker's screen an error quotes.
pub(super) const LAST_WORDS_LINES: usize = 8;

/// The last non-empty lines of a screen.
pub(super) fn tail_lines(text: &str, lines: usize) -> String {
    let kept: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    kept[kept.len().saturating_sub(lines)..].join("\n")
}

/// The dialog a starting program stopped on: one on `screen` that was there, the same, at the
/// look before (`before`), so it holds still and waits for a key.
fn start_dialog(before: Option<&str>, screen: &str, markers: &[String]) -> Option<Dialog> {
    if before != Some(screen) {
        return None;
    }
    read_dialog(screen, markers, false)
}

/// Why a spawn ends on `dialog`, its program's own, shown while it started, when it could not
/// be asked of its owner (and what would have settled it, for the dialogs fleetd knows). The
/// dialog, its choices among it, is screen text: it is quoted for the worker's owner only,
/// never in fleetd's own words.
fn stopped_on(role: Role, profile: &ProfileConfig, dialog: &Dialog) -> FleetError {
    let settle = if dialog.prompt.contains("Bypass Permissions") {
        "fleetd records that consent only in a home of the worker's own: set isolated_home = true"
    } else if dialog.prompt.contains("trust this folder") {
        "fleetd marks a working directory trusted unless the profile says trust_workdir = false, and never one outside gateway.workdir_roots"
    } else {
        "answer it once in that program yourself, or start it in a home fleetd seeds (isolated_home = true)"
    };
    FleetError::new(
        ErrorCode::NotReady,
        quoting(
            &format!(
                "{role} (profile '{}') stopped on a dialog of its own program while starting, which fleetd did not settle ({settle}); its pane was closed",
                profile.name
            ),
            &dialog.prompt,
            true,
        ),
    )
}

impl LocalPlane {
    /// Mints the worker's token, prepares its launch and opens its pane; records the pane.
    pub(super) async fn open_pane(
        &self,
        gid: Gid,
        name: &str,
        profile: &Arc<ProfileConfig>,
        cwd: PathBuf,
    ) -> Result<PaneId, FleetError> {
        let secret = token::mint()
            .map_err(|e| FleetError::internal(format!("no randomness for a token: {e}")))?;
        let hash = token::hash(&secret);
        self.db.run(move |s| s.put_token(gid, &hash, true)).await?;
        // Readiness counts from the new token on (an earlier session's calls do not).
        if let Some(session) = self.sessions.lock().panes.get_mut(&gid) {
            session.forget_early_readiness();
        }
        let role = self
            .sessions
            .lock()
            .panes
            .get(&gid)
            .map_or(Role::Worker, |s| s.entity().role);
        let worker = Worker {
            gid,
            name: name.to_string(),
            role,
            host: self.host_id.clone(),
            token: secret,
            mcp_url: self.mcp_url.clone(),
            cwd,
            dir: self.launchers.dir_of(gid),
        };
        let launch = self.prepare(profile, &worker).await?;
        let spec = PaneSpec {
            label: name.to_string(),
            argv: launch.argv,
            env: launch.env,
            cwd: worker.cwd,
        };
        let pane = self.panes.spawn(&spec).await.map_err(|e| {
            FleetError::new(
                ErrorCode::PaneHost,
                format!("cannot open a pane for '{name}': {e}"),
            )
        })?;
        // A fast worker may have called in before the pane host answered: it turns ready now.
        let status = match self.sessions.lock().panes.get_mut(&gid) {
            Some(session) => {
                session.pane_opened(pane.clone());
                session.stored_status()
            }
            None => WorkerStatus::Spawning,
        };
        let pane_text = pane.0.clone();
        self.db
            .run(move |s| s.set_session(gid, status, Some(&pane_text)))
            .await?;
        self.note_adoptable(gid, &pane).await;
        Ok(pane)
    }

    /// Prepares `worker`'s launch of `profile` on the launch lane: its argv and environment,
    /// or why not (what the launch needs but is not there is `not_ready`).
    async fn prepare(
        &self,
        profile: &Arc<ProfileConfig>,
        worker: &Worker,
    ) -> Result<crate::launch::Launch, FleetError> {
        let (launchers, prepared, ready) = (
            Arc::clone(&self.launchers),
            Arc::clone(profile),
            worker.clone(),
        );
        let launch = self
            .launch_lane
            .run(move || launchers.prepare(&prepared, &ready))
            .await
            .map_err(|e| FleetError::internal(format!("the launch preparation failed: {e}")))?;
        launch.map_err(|e| {
            let why = format!(
                "cannot prepare the launch of '{}' (profile '{}', kind {}): {e}",
                worker.name,
                profile.name,
                profile.kind.as_str()
            );
            // What the launch needs is not there (an agent its sandbox would not see, say).
            if e.kind() == std::io::ErrorKind::NotFound {
                FleetError::new(ErrorCode::NotReady, why)
            } else {
                FleetError::internal(why)
            }
        })
    }

    /// Whether `pane` shows `marker`, its program's sign of readiness: the session of `gid`
    /// turns ready then (its status kept).
    async fn shows_ready(&self, gid: Gid, pane: &PaneId, marker: &str) -> bool {
        let shown =
            matches!(self.panes.snapshot(pane).await, Ok(snap) if snap.text.contains(marker));
        if !shown {
            return false;
        }
        let became_ready = self
            .sessions
            .lock()
            .panes
            .get_mut(&gid)
            .is_some_and(|s| s.apply(SessionEvent::Ready).is_ok());
        if became_ready {
            self.persist_status(gid).await;
        }
        true
    }

    /// Why a worker that did not call in within its profile's `ready_timeout_s` is given up,
    /// quoting the end of its screen.
    async fn not_in_time(&self, pane: &PaneId, role: Role, profile: &ProfileConfig) -> FleetError {
        let screen = self
            .panes
            .history(pane, LAST_WORDS_LINES * 4)
            .await
            .map(|text| tail_lines(&text, LAST_WORDS_LINES))
            .unwrap_or_default();
        FleetError::new(
            ErrorCode::NotReady,
            quoting(
                &format!(
                    "{role} (profile '{}') did not call in within {} s, so its pane was closed",
                    profile.name, profile.ready_timeout_s
                ),
                &screen,
                true,
            ),
        )
    }

    /// The readiness gate: waits until the worker calls in (or shows its ready marker), its
    /// program exits, the profile's timeout passes, or the caller gives up. A dialog its program
    /// stops on meanwhile is asked of its owner: the gate returns it (the worker is blocked;
    /// see [`LocalPlane::start_on`]), or, when it cannot be asked, fails naming it.
    pub(super) async fn await_ready(
        self: &Arc<Self>,
        gid: Gid,
        pane: &PaneId,
        profile: &crate::config::ProfileConfig,
        ct: &CancellationToken,
    ) -> Result<Option<DialogView>, FleetError> {
        let Some((mut kick, role)) = self
            .sessions
            .lock()
            .panes
            .get(&gid)
            .map(|s| (s.kicks(), s.entity().role))
        else {
            return Err(FleetError::new(
                ErrorCode::NotReady,
                "the worker vanished while spawning",
            ));
        };
        let deadline = Instant::now() + Duration::from_secs(profile.ready_timeout_s);
        let ready_marker = profile.ready_marker();
        let markers = profile.dialog_markers();
        let mut looked: Option<(Instant, String)> = None;
        loop {
            kick.borrow_and_update();
            if let Some(over) = self.start_so_far(gid, role, profile) {
                return over;
            }
            if let Some(marker) = &ready_marker
                && self.shows_ready(gid, pane, marker).await
            {
                continue;
            }
            if let Some(dialog) = self
                .look_for_start_dialog(pane, &markers, &mut looked)
                .await
            {
                match self.ask_start_dialog(gid, dialog.clone()).await {
                    StartAsk::Asked(asked) => return Ok(Some(asked)),
                    // Looked at afresh: what shows now is asked in its turn.
                    StartAsk::Over => continue,
                    // Asked by another first, or not askable: unless the worker moved on, its
                    // owner cannot be asked, and it ends naming the dialog.
                    StartAsk::NotAsked => {
                        return self
                            .start_so_far(gid, role, profile)
                            .unwrap_or_else(|| Err(stopped_on(role, profile, &dialog)));
                    }
                }
            }
            let recheck = match (&ready_marker, &looked) {
                (Some(_), _) => Instant::now() + MARKER_CHECK_INTERVAL,
                (None, Some((at, _))) => *at + START_DIALOG_LOOK,
                (None, None) => deadline,
            };
            tokio::select! {
                _ = kick.changed() => {}
                () = sleep_until(recheck.min(deadline)) => {
                    if Instant::now() >= deadline {
                        return Err(self.not_in_time(pane, role, profile).await);
                    }
                }
                () = ct.cancelled() => {
                    return Err(FleetError::new(ErrorCode::Cancelled, "the spawn was cancelled"));
                }
            }
        }
    }

    /// How the readiness gate of `gid` (a `role` of `profile`) ends now, or `None` while it is
    /// still starting: ready, blocked on a dialog of its start asked already (an answer that
    /// did not take asks what shows next), or ended.
    fn start_so_far(
        &self,
        gid: Gid,
        role: Role,
        profile: &ProfileConfig,
    ) -> Option<Result<Option<DialogView>, FleetError>> {
        let sessions = self.sessions.lock();
        let state = sessions
            .panes
            .get(&gid)
            .map_or(StartState::Ended(None), PaneSession::start_state);
        match state {
            StartState::Starting => None,
            StartState::Blocked(asked) => Some(Ok(Surfaced::from(asked.clone()).dialog())),
            StartState::Ended(last_words) => Some(Err(FleetError::new(
                ErrorCode::NotReady,
                quoting(
                    &format!(
                        "{role} (profile '{}') ended before it was ready",
                        profile.name
                    ),
                    last_words.unwrap_or_default(),
                    true,
                ),
            ))),
            StartState::Past => Some(Ok(None)),
        }
    }

    /// A look at a starting worker's screen for a dialog of its program's (its profile's
    /// `markers`), at most every [`START_DIALOG_LOOK`]: one that held still since the look
    /// before (`looked`: when, and what the screen showed) is the dialog it stopped on.
    async fn look_for_start_dialog(
        &self,
        pane: &PaneId,
        markers: &[String],
        looked: &mut Option<(Instant, String)>,
    ) -> Option<Dialog> {
        if markers.is_empty()
            || looked
                .as_ref()
                .is_some_and(|(at, _)| at.elapsed() < START_DIALOG_LOOK)
        {
            return None;
        }
        let before = looked.take().map(|(_, text)| text);
        // A look that could not read the screen counts as one (the next is a look later), with
        // nothing seen.
        let text = match self.panes.snapshot(pane).await {
            Ok(snap) => snap.text,
            Err(_) => String::new(),
        };
        let dialog = start_dialog(before.as_deref(), &text, markers);
        *looked = Some((Instant::now(), text));
        dialog
    }

    /// Writes the in-memory status and pane of `gid` to the store.
    pub(super) async fn persist_status(&self, gid: Gid) {
        let found = self
            .sessions
            .lock()
            .panes
            .get(&gid)
            .map(|s| (s.stored_status(), s.pane().cloned()));
        if let Some((status, pane)) = found {
            let pane = pane.map(|p| p.0);
            if let Err(e) = self
                .db
                .run(move |s| s.set_session(gid, status, pane.as_deref()))
                .await
            {
                tracing::error!(%gid, error = %e, "cannot record a session status");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_dialog_counts_once_it_holds_still_across_two_looks() {
        let markers = vec!["Is this a project you created or one you trust?".to_string()];
        let screen = "Accessing workspace:\n/work/p\nIs this a project you created or one you trust?\n❯ 1. Yes, I trust this folder\n  2. No, exit\nEnter to confirm · Esc to cancel\n";
        assert!(start_dialog(None, screen, &markers).is_none(), "first look");
        assert!(
            start_dialog(Some("loading…"), screen, &markers).is_none(),
            "still changing"
        );
        let dialog = start_dialog(Some(screen), screen, &markers).unwrap();
        let labels: Vec<&str> = dialog.choices.iter().map(|c| c.label.as_str()).collect();
        assert!(labels.contains(&"Yes, I trust this folder"), "{labels:?}");
        let err = stopped_on(
            Role::Worker,
            &ProfileConfig::command("c", Vec::new()),
            &dialog,
        );
        assert_eq!(err.code, ErrorCode::NotReady);
        assert!(
            err.message.contains("trust_workdir") && err.message.contains("No, exit"),
            "{}",
            err.message
        );
        // The dialog (its choices too) is the screen's, quoted for the owner only.
        let (public, screen) = fleet_core::ownership::parts(&err.message);
        assert!(!public.contains("trust this folder"), "{public}");
        assert!(screen.is_some_and(|s| s.contains("No, exit")), "{screen:?}");
        // A screen with no marker, or a marker with no choice under it, is no dialog.
        assert!(start_dialog(Some("ready\n"), "ready\n", &markers).is_none());
        let told = "the task said: Is this a project you created or one you trust?\n";
        assert!(start_dialog(Some(told), told, &markers).is_none());
    }

    #[test]
    fn last_words_skip_blank_lines() {
        assert_eq!(tail_lines("a\n\nb\n  \nc\n\n", 2), "b\nc");
        assert_eq!(tail_lines("", 3), "");
    }
}
