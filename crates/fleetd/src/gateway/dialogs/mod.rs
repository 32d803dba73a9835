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

use fleet_core::authz::{Tool, check_tool};
use fleet_core::dialog::{
    Answer, Dialog, Key, newly_shown, read_dialog, read_dialog_styled, shown_counts,
};
use fleet_core::{ErrorCode, FleetError, Gid, WorkerStatus};
use fleet_mux::{AgentState, PaneId};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::asks::Waiter;
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
            let sessions = self.sessions.lock();
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
}

mod answer;
mod ask;

pub(super) use answer::take_answer;
