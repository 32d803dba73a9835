//! A dialog a worker's program shows while it starts (a notice fleetd did not settle: a folder's
//! trust, a mode's consent) is asked of the worker's owner as a dialog on the spawn, the way a
//! dialog mid-task is: the spawn returns `blocked` with it, and the owner answers with
//! `fleet_send{turn_id, choice}`. The start goes on in the background once it is answered (or
//! answered in the pane): within the profile's `ready_timeout_s` after each dialog, and through
//! as many dialogs as the program shows. The owner's answer waits for what follows: the worker
//! ready, another dialog, or its end.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::dialog::Dialog;
use fleet_core::ownership::quoting;
use fleet_core::{ErrorCode, FleetError, Gid};
use fleet_mux::PaneId;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::LocalPlane;
use super::session::{PaneSession, StartState};
use super::views::{DialogView, SendResult, Surfaced};
use crate::config::ProfileConfig;

/// Where a worker is in its start, as its owner's answer to a start dialog waits on it.
enum Start {
    /// Still starting.
    Starting,
    /// Ready for tasks (or past its start).
    Ready,
    /// Blocked on another dialog of its start, asked of its owner.
    Blocked(Option<DialogView>),
    /// Ended before it was ready: its last words.
    Ended(String),
}

/// How asking a start dialog went.
pub(super) enum StartAsk {
    /// Asked: the dialog as its owner sees it.
    Asked(DialogView),
    /// Asked, and over already (answered in the pane, say, while it was asked afar).
    Over,
    /// Not asked: the worker was not starting (another asked it first), or the ask could not
    /// reach its owner.
    NotAsked,
}

/// What a lead sees of a worker blocked on `dialog` while starting: what to do next.
pub(super) fn start_dialog_note(dialog: &DialogView) -> String {
    format!(
        "'{}' stopped on a dialog of its own program while starting and waits for a key: answer with fleet_send{{turn_id: \"{}\", choice}}, choice one of {}; it goes on starting then, and turns idle once ready (a stop ends it)",
        dialog.from_name,
        dialog.turn_id,
        dialog.choices_in_words()
    )
}

impl LocalPlane {
    /// Asks the owner of starting worker `gid` about `dialog`, its program's, held still on its
    /// screen: it is blocked until the dialog goes. Its inbox is attached and it is announced
    /// first, so an owner on another host can answer it.
    pub(super) async fn ask_start_dialog(self: &Arc<Self>, gid: Gid, dialog: Dialog) -> StartAsk {
        if let Some(afar) = self.afar.as_deref() {
            afar.joined(self, gid).await;
        }
        let Some(turn) = self.dialog_shown(gid, dialog, Vec::new()).await else {
            return StartAsk::NotAsked;
        };
        let sessions = self.sessions.lock();
        let open = sessions
            .panes
            .get(&gid)
            .and_then(|s| s.dialog())
            .filter(|open| open.question.turn_id == turn);
        match open.and_then(|open| Surfaced::from(open.question.clone()).dialog()) {
            Some(asked) => StartAsk::Asked(asked),
            None => StartAsk::Over,
        }
    }

    /// Goes on, in the background, with the start of `gid` in `pane`, blocked on a dialog of
    /// its start: see [`LocalPlane::start_on`]. A start that does not finish ends the worker.
    pub(super) fn start_on_later(
        self: &Arc<Self>,
        gid: Gid,
        pane: PaneId,
        profile: Arc<ProfileConfig>,
    ) {
        let gateway = Arc::clone(self);
        self.tasks.spawn(async move {
            match gateway.start_on(gid, &pane, &profile).await {
                Ok(()) => tracing::info!(%gid, "ready after the dialogs of its start"),
                // fleetd stops: a start half done is not taken back by the next run.
                Err(e) if e.code == ErrorCode::Cancelled => {}
                // Stopped, or its program exited: its session's end said so.
                Err(_) if gateway.has_ended(gid) => {}
                Err(e) => {
                    // Its error may quote the worker's screen.
                    tracing::warn!(%gid, code = %e.code, error = %crate::logs::summary(&e.message), "a worker did not start after a dialog of its start");
                    let reason = format!("it did not start: {e}");
                    gateway.end_session(gid, &reason, true).await;
                }
            }
        });
    }

    /// The start of `gid` in `pane`, through the dialogs its program shows: each one waited out
    /// (however long its owner takes; a stop ends it), then the readiness gate again, until the
    /// worker is ready, fails to be, or fleetd stops.
    pub(super) async fn start_on(
        self: &Arc<Self>,
        gid: Gid,
        pane: &PaneId,
        profile: &ProfileConfig,
    ) -> Result<(), FleetError> {
        loop {
            self.while_blocked_at_start(gid).await?;
            if self
                .await_ready(gid, pane, profile, &self.shutdown)
                .await?
                .is_none()
            {
                // Ready: the store says so (it may have turned ready as its dialog went, which
                // nothing else records), so a restart takes it back.
                self.persist_status(gid).await;
                if let Some(afar) = self.afar.as_deref() {
                    afar.joined(self, gid).await;
                }
                return Ok(());
            }
        }
    }

    /// Waits while `gid` is blocked on a dialog of its start.
    async fn while_blocked_at_start(&self, gid: Gid) -> Result<(), FleetError> {
        let vanished =
            || FleetError::new(ErrorCode::NotReady, "the worker vanished while starting");
        let mut kick = self
            .sessions
            .lock()
            .panes
            .get(&gid)
            .map(|s| s.kicks())
            .ok_or_else(vanished)?;
        loop {
            kick.borrow_and_update();
            let blocked = self
                .sessions
                .lock()
                .panes
                .get(&gid)
                .map(PaneSession::blocked_at_start);
            match blocked {
                None => return Err(vanished()),
                Some(false) => return Ok(()),
                Some(true) => {}
            }
            tokio::select! {
                changed = kick.changed() => if changed.is_err() { return Err(vanished()) },
                () = self.shutdown.cancelled() => {
                    return Err(FleetError::new(ErrorCode::Cancelled, "fleetd is stopping"));
                }
            }
        }
    }

    /// Whether `gid`'s session here ended (or is being ended).
    fn has_ended(&self, gid: Gid) -> bool {
        let sessions = self.sessions.lock();
        let state = sessions.panes.get(&gid).map(PaneSession::start_state);
        matches!(state, None | Some(StartState::Ended(_)))
    }

    /// Whether `gid` is starting (or blocked on a dialog of its start) here.
    pub(super) fn is_starting(&self, gid: Gid) -> bool {
        let sessions = self.sessions.lock();
        let state = sessions.panes.get(&gid).map(PaneSession::start_state);
        matches!(state, Some(StartState::Starting | StartState::Blocked(_)))
    }

    /// What an owner's answer (`turn_id`) to a dialog of `worker`'s start returns: once the
    /// worker is ready, blocked on the next dialog of its start, or ended (`not_ready`, quoting
    /// its last words), or, after `wait`, that it is still starting.
    pub(super) async fn await_started(
        &self,
        lead: Gid,
        worker: Gid,
        turn_id: &str,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        let until = Instant::now() + wait;
        let Some((mut kick, name)) = self
            .sessions
            .lock()
            .panes
            .get(&worker)
            .map(|s| (s.kicks(), s.entity().name.clone()))
        else {
            return Err(ended(&format!("worker {worker}"), ""));
        };
        let answered = |note: String| SendResult::Answered {
            turn_id: turn_id.to_string(),
            note: Some(note),
        };
        loop {
            kick.borrow_and_update();
            match self.start_of(worker, lead) {
                Start::Starting => {}
                Start::Ready => return Ok(answered(format!("'{name}' is ready for tasks"))),
                Start::Blocked(dialog) => {
                    return Ok(match dialog {
                        Some(dialog) => SendResult::Blocked {
                            msg_id: None,
                            note: start_dialog_note(&dialog),
                            dialog,
                        },
                        None => answered(format!(
                            "'{name}' stopped on another dialog while starting; your next fleet call shows it"
                        )),
                    });
                }
                Start::Ended(last_words) => return Err(ended(&name, &last_words)),
            }
            tokio::select! {
                _ = kick.changed() => {}
                () = sleep_until(until) => {
                    return Ok(answered(format!("'{name}' is still starting: fleet_list shows it idle once it is ready, and a dialog it stops on comes up on your next fleet call")));
                }
                () = ct.cancelled() => {
                    return Err(FleetError::new(ErrorCode::Cancelled, "the call was cancelled"));
                }
            }
        }
    }

    /// Where `worker` is in its start (a dialog it is blocked on handed out to `lead`).
    fn start_of(&self, worker: Gid, lead: Gid) -> Start {
        let mut sessions = self.sessions.lock();
        let turn = match sessions.panes.get(&worker).map(PaneSession::start_state) {
            None => return Start::Ended(String::new()),
            Some(StartState::Starting) => return Start::Starting,
            Some(StartState::Past) => return Start::Ready,
            Some(StartState::Ended(words)) => {
                return Start::Ended(words.unwrap_or_default().to_string());
            }
            Some(StartState::Blocked(asked)) => asked.turn_id.clone(),
        };
        Start::Blocked(
            sessions
                .asks
                .hand_out(&turn, lead)
                .and_then(|asked| Surfaced::from(asked).dialog()),
        )
    }

    /// The dialog of `gid`'s start, `view`, handed out to its owner by the spawn's answer (a
    /// later call does not hand it out again).
    pub(super) fn hand_out_start_dialog(&self, gid: Gid, view: &DialogView) {
        let mut sessions = self.sessions.lock();
        let owner = sessions.panes.get(&gid).and_then(|s| s.entity().parent);
        if let Some(owner) = owner {
            sessions.asks.hand_out(&view.turn_id, owner);
        }
    }
}

/// Why an answer to a start dialog ends in error: `name` ended before it was ready (its
/// `last_words`, the screen's, quoted for its owner only).
fn ended(name: &str, last_words: &str) -> FleetError {
    FleetError::new(
        ErrorCode::NotReady,
        quoting(
            &format!(
                "'{name}' ended before it was ready, after the dialog of its start was answered"
            ),
            last_words,
            true,
        ),
    )
}
