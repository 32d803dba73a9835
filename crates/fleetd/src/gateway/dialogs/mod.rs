//! Dialogs on workers' screens: a busy worker whose own program stopped on a choice (a
//! permission prompt) is `blocked`, and its lead is asked to choose.
//!
//! The watcher looks at each busy worker's screen (of a profile with `blocked_markers`, or
//! whose pane host says its agent is blocked) every [`DIALOG_LOOK`]; a dialog that shows on two
//! looks in a row (it holds still) is read ([`read_dialog`]) and asked of the worker's lead as an
//! ask with choices: it surfaces on the lead's open `fleet_send` or `fleet_poll` (status
//! `blocked`) however long it takes, and a lead on another host is asked through the broker
//! the way asks are. The lead's `fleet_send{turn_id, choice}` presses only that choice's key,
//! from the safe set, and waits for the dialog to go away; a dialog that goes away by itself
//! (a human answered in the pane, the turn ended) is over for the lead too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::asks::whom_to_ask;
use fleet_core::authz::{Tool, check_tool};
use fleet_core::clock::now_ms;
use fleet_core::delivery::Placement;
use fleet_core::dialog::{
    Answer, Dialog, Key, newly_shown, read_dialog, read_dialog_styled, shown_counts,
};
use fleet_core::{ErrorCode, FleetError, Gid, Kind, Message, MsgId, SessionEvent, WorkerStatus};
use fleet_mux::{AgentState, PaneId};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::asks::Waiter;
use super::session::OpenDialog;
use super::sessions::Sessions;
use super::views::{AskView, SendResult};
use super::{Caller, Gateway};

/// How often busy workers' screens are looked at for a dialog.
pub(super) const DIALOG_LOOK: Duration = Duration::from_millis(500);
/// How long a dialog has to go away after its choice's key was pressed.
const GONE_WAIT: Duration = Duration::from_secs(3);
/// How often the screen is looked at meanwhile.
const GONE_LOOK: Duration = Duration::from_millis(50);
/// How long a program has, once its dialog is gone, to show it ended its turn.
const TURN_OVER_WAIT: Duration = Duration::from_secs(1);
/// How long a menu's cursor has to show on the option the arrows moved it to.
const CURSOR_WAIT: Duration = Duration::from_millis(1_500);
/// The longest a dialog asked of a lead on another host is good for there (seconds; never
/// longer than the broker keeps or a gateway admits a message): it is over sooner when it goes
/// away, and asked afresh when it stays longer.
const REMOTE_DIALOG_TTL_S: u64 = 24 * 3600;

/// How a dialog's turn id opens: its `ASK` to another host carries the dialog as JSON, and its
/// answer is a choice.
pub(super) const DIALOG_TURN: &str = "dialog-";

/// Whether `turn` is a dialog's.
pub(super) fn is_dialog_turn(turn: &str) -> bool {
    turn.starts_with(DIALOG_TURN)
}

/// What the watcher needs of one session.
struct Watched {
    gid: Gid,
    pane: PaneId,
    status: WorkerStatus,
    markers: Vec<String>,
    /// The pane host says the agent is blocked.
    forced: bool,
    /// The dialog asked for it, unless that ask is over.
    asked: Option<Asked>,
    /// The profile's `turn_over_markers`.
    turn_over: Vec<String>,
}

/// A dialog asked of a lead, as the watcher looks for it.
struct Asked {
    question: AskView,
    dialog: Dialog,
    turn_over_before: Vec<usize>,
}

impl Gateway {
    /// One look at every busy or blocked worker's screen; `seen` holds each one's screen at the
    /// look before.
    pub(super) async fn look_for_dialogs(self: &Arc<Self>, seen: &mut HashMap<Gid, String>) {
        let (watched, over) = {
            let sessions = self.lock();
            let mut watched = Vec::new();
            let mut over = Vec::new();
            for (gid, s) in &sessions.panes {
                if s.dialog().is_some_and(|d| d.answering) {
                    // An answer is being pressed: its keys and looks are the screen's now.
                    continue;
                }
                let asked = s.dialog().filter(|d| {
                    sessions.asks.is_open(&d.question.turn_id)
                        && d.good_until.is_none_or(|until| Instant::now() < until)
                });
                if let Some(dialog) = &s.dialog()
                    && (s.status() != WorkerStatus::Blocked || asked.is_none())
                {
                    // Its turn ended (or it stopped) with the dialog still asked; or its ask is
                    // over (expired afar, refused there): asked afresh if it stays.
                    over.push((*gid, dialog.question.turn_id.clone()));
                }
                if !matches!(s.status(), WorkerStatus::Busy | WorkerStatus::Blocked) {
                    continue;
                }
                let forced = matches!(s.host_agent(), Some((_, AgentState::Blocked)));
                let markers = s.profile().dialog_markers();
                if markers.is_empty() && !forced {
                    continue;
                }
                if let Some(pane) = s.pane() {
                    watched.push(Watched {
                        gid: *gid,
                        pane: pane.clone(),
                        status: s.status(),
                        markers,
                        forced,
                        asked: asked.and_then(|d| {
                            Some(Asked {
                                question: d.question.clone(),
                                dialog: d.question.dialog()?,
                                turn_over_before: d.turn_over_before.clone(),
                            })
                        }),
                        turn_over: s.profile().turn_over_markers(),
                    });
                }
            }
            (watched, over)
        };
        for (gid, turn) in over {
            self.dialog_gone(gid, &turn, "the worker's turn or its ask ended")
                .await;
        }
        seen.retain(|gid, _| watched.iter().any(|w| w.gid == *gid));
        for w in watched {
            let Ok(screen) = self.panes.snapshot(&w.pane).await else {
                continue;
            };
            let dialog = self
                .dialog_on(&w.pane, &screen.text, &w.markers, w.forced)
                .await;
            match (w.status, dialog, &w.asked) {
                (WorkerStatus::Busy, Some(dialog), _)
                    if seen.get(&w.gid) == Some(&screen.text) && !screen.in_mode =>
                {
                    let before = shown_counts(&screen.text, &w.turn_over);
                    let _ = self.dialog_shown(w.gid, dialog, before).await;
                }
                // Gone, or another in its place (answered in the pane, the next one shown):
                // the lead's answer must not be pressed into it. A new one is asked afresh.
                (WorkerStatus::Blocked, now, Some(asked))
                    if now.as_ref() != Some(&asked.dialog) =>
                {
                    let turn = &asked.question.turn_id;
                    let gone = self.dialog_gone(w.gid, turn, "the dialog went away").await;
                    // Answered in the pane with a choice that ended the program's turn.
                    if gone
                        && now.is_none()
                        && let Some(marker) =
                            newly_shown(&screen.text, &w.turn_over, &asked.turn_over_before)
                    {
                        self.turn_over(&asked.question, &marker).await;
                    }
                }
                _ => {}
            }
            seen.insert(w.gid, screen.text);
        }
    }

    /// A dialog held still on busy worker `gid`'s screen: it is blocked, and its lead is asked
    /// (the ask's turn id, unless the worker is not busy).
    async fn dialog_shown(
        self: &Arc<Self>,
        gid: Gid,
        dialog: Dialog,
        turn_over_before: Vec<usize>,
    ) -> Option<String> {
        let turn_id = format!("{DIALOG_TURN}{}", MsgId::mint());
        let ttl = self.remote_dialog_ttl();
        let (to, remote) = {
            let mut sessions = self.lock();
            let session = sessions.panes.get_mut(&gid)?;
            if session.status() != WorkerStatus::Busy {
                return None;
            }
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
            let remote = (!sessions.is_local(to) && self.afar().is_some()).then(|| {
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
                });
            }
            (to, remote)
        };
        tracing::info!(%gid, %turn_id, lead = %to, remote = remote.is_some(), "the worker's program stopped on a dialog");
        match remote {
            Some(ask) => {
                let sent = match self.afar() {
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
            None => self.bump_inbox(to),
        }
        Some(turn_id)
    }

    /// How long a dialog asked of a lead on another host is good for there.
    fn remote_dialog_ttl(&self) -> Duration {
        let fed = &self.config.federation;
        let kept = fed.inbox_message_ttl_s.min(fed.max_message_age_s);
        Duration::from_secs(REMOTE_DIALOG_TTL_S.min(kept).max(1))
    }

    /// The dialog `turn` asked for `gid` is over (`why`), if it is still the one asked: the
    /// worker is busy again (if it was blocked), and its lead, here or afar, can no longer
    /// answer it.
    pub(super) async fn dialog_over(self: &Arc<Self>, gid: Gid, turn: &str, why: &'static str) {
        self.end_dialog(gid, turn, why, false).await;
    }

    /// [`Gateway::dialog_over`] as the watcher sees it: a dialog whose answer is being pressed
    /// is left to that answer (its screen changes under the keys; it ends the dialog itself).
    async fn dialog_gone(self: &Arc<Self>, gid: Gid, turn: &str, why: &'static str) -> bool {
        self.end_dialog(gid, turn, why, true).await
    }

    /// Ends the dialog `turn` of `gid` (unless `leave_answering` and its answer is being
    /// pressed); whether it ended.
    async fn end_dialog(
        self: &Arc<Self>,
        gid: Gid,
        turn: &str,
        why: &'static str,
        leave_answering: bool,
    ) -> bool {
        let dialog = {
            let mut sessions = self.lock();
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
            if let (Some(ask), Some(afar)) = (dialog.remote, self.afar()) {
                afar.ask_abandoned(self, &ask, turn).await;
            }
        }
        true
    }
}

mod answer;

pub(super) use answer::take_answer;
