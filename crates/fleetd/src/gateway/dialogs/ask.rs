//! A dialog asked of its worker's lead, and its end: the ask opened when the dialog holds still
//! (here or through the broker), and closed when the dialog goes, however it goes.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::asks::whom_to_ask;
use fleet_core::clock::now_ms;
use fleet_core::delivery::Placement;
use fleet_core::dialog::Dialog;
use fleet_core::{Gid, Kind, Message, MsgId, SessionEvent, WorkerStatus};
use tokio::time::Instant;

use super::super::LocalPlane;
use super::super::asks::Waiter;
use super::super::session::OpenDialog;
use super::super::views::AskView;
use super::{DIALOG_TURN, REMOTE_DIALOG_TTL_S};

impl LocalPlane {
    /// A dialog held still on busy (or starting) worker `gid`'s screen: it is blocked, and its
    /// lead is asked (the ask's turn id, unless the worker is neither).
    pub(in crate::gateway) async fn dialog_shown(
        self: &Arc<Self>,
        gid: Gid,
        dialog: Dialog,
        turn_over_before: Vec<usize>,
    ) -> Option<String> {
        let turn_id = format!("{DIALOG_TURN}{}", MsgId::mint());
        let ttl = self.remote_dialog_ttl();
        let (to, remote) = {
            let mut sessions = self.sessions.lock();
            let session = sessions.panes.get_mut(&gid)?;
            let at_start = match session.status() {
                WorkerStatus::Busy => false,
                WorkerStatus::Spawning => true,
                _ => return None,
            };
            let task = session.current().cloned();
            // Its prompt is screen text: the owner's, whoever's task it works on.
            let to = whom_to_ask(None, session.entity().parent).ok()?;
            let _ = session.apply(SessionEvent::DialogShown);
            let question = AskView {
                turn_id: turn_id.clone(),
                from: gid,
                from_name: session.entity().name.clone(),
                host: session.entity().host.clone(),
                question: dialog.prompt.clone(),
                choices: Some(dialog.choices.clone()),
                in_task: task.as_ref().map(|t| t.msg_id),
                asked_ms: now_ms(),
            };
            let remote = (!sessions.is_local(to) && self.afar.as_deref().is_some()).then(|| {
                Message::about(
                    task.as_ref(),
                    Kind::Ask,
                    (gid, to),
                    serde_json::to_string(&dialog).unwrap_or_default(),
                    now_ms(),
                )
            });
            sessions.asks.open(question.clone(), to, Waiter::Screen);
            if let Some(session) = sessions.panes.get_mut(&gid) {
                session.dialog_asked(OpenDialog {
                    question,
                    good_until: remote.is_some().then(|| Instant::now() + ttl),
                    remote: remote.clone(),
                    turn_over_before,
                    answering: false,
                    at_start,
                });
            }
            (to, remote)
        };
        tracing::info!(%gid, %turn_id, lead = %to, remote = remote.is_some(), "the worker's program stopped on a dialog");
        match remote {
            Some(ask) => {
                let sent = match self.afar.as_deref() {
                    Some(afar) => {
                        afar.send_in_turn(self, &ask, (&turn_id, ttl.as_secs()))
                            .await
                    }
                    None => Ok(Placement::Dead),
                };
                if let Err(e) = sent {
                    tracing::warn!(%gid, %turn_id, error = %e, "cannot ask a lead on another host about a dialog; asked again at the next look");
                    self.dialog_over(gid, &turn_id, "it could not be asked")
                        .await;
                    return None;
                }
            }
            None => self.inboxes.bump(to),
        }
        Some(turn_id)
    }

    /// How long a dialog asked of a lead on another host is good for there.
    pub(super) fn remote_dialog_ttl(&self) -> Duration {
        let fed = &self.config.federation;
        let kept = fed.inbox_message_ttl_s.min(fed.max_message_age_s);
        Duration::from_secs(REMOTE_DIALOG_TTL_S.min(kept).max(1))
    }

    /// The dialog `turn` asked for `gid` is over (`why`), if it is still the one asked: the
    /// worker is busy again (if it was blocked), and its lead, here or afar, can no longer
    /// answer it.
    pub(in crate::gateway) async fn dialog_over(
        self: &Arc<Self>,
        gid: Gid,
        turn: &str,
        why: &'static str,
    ) {
        self.end_dialog(gid, turn, why, false).await;
    }

    /// [`LocalPlane::dialog_over`] as the watcher sees it: a dialog whose answer is being pressed
    /// is left to that answer (its screen changes under the keys; it ends the dialog itself).
    pub(super) async fn dialog_gone(
        self: &Arc<Self>,
        gid: Gid,
        turn: &str,
        why: &'static str,
    ) -> bool {
        self.end_dialog(gid, turn, why, true).await
    }

    /// Ends the dialog `turn` of `gid` (unless `leave_answering` and its answer is being
    /// pressed); whether it ended.
    pub(super) async fn end_dialog(
        self: &Arc<Self>,
        gid: Gid,
        turn: &str,
        why: &'static str,
        leave_answering: bool,
    ) -> bool {
        let dialog = {
            let mut sessions = self.sessions.lock();
            let Some(session) = sessions.panes.get_mut(&gid) else {
                return false;
            };
            match session.dialog() {
                Some(d) if d.question.turn_id == turn && !(leave_answering && d.answering) => {}
                _ => return false,
            }
            let dialog = session.dialog_over();
            sessions.asks.close(turn, why);
            dialog
        };
        if let Some(dialog) = dialog {
            tracing::info!(%gid, turn_id = turn, why, "dialog over");
            if let (Some(ask), Some(afar)) = (dialog.remote, self.afar.as_deref()) {
                afar.ask_abandoned(self, &ask, turn).await;
            }
        }
        true
    }
}
