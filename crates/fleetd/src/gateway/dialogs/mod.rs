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
use super::{Caller, LocalPlane};

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

/// What the dialog watcher looks at `now`: every busy or blocked worker whose screen may show
/// a dialog (its profile has dialog markers, or its pane host says it is blocked), with the
/// dialog asked for it if that ask is still open; and the dialogs whose asks are over (the
/// turn ended, the worker stopped, the ask expired or was refused afar), each by its worker
/// and turn. A worker whose answer is being pressed is left to the answer.
fn to_watch(sessions: &Sessions, now: Instant) -> (Vec<Watched>, Vec<(Gid, String)>) {
    let mut watched = Vec::new();
    let mut over = Vec::new();
    for (gid, s) in &sessions.panes {
        if s.dialog().is_some_and(|d| d.answering) {
            continue;
        }
        let asked = s.dialog().filter(|d| {
            sessions.asks.is_open(&d.question.turn_id)
                && d.good_until.is_none_or(|until| now < until)
        });
        if let Some(dialog) = &s.dialog()
            && (s.status() != WorkerStatus::Blocked || asked.is_none())
        {
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
}

impl LocalPlane {
    /// One look at every busy or blocked worker's screen; `seen` holds each one's screen at the
    /// look before.
    pub(super) async fn look_for_dialogs(self: &Arc<Self>, seen: &mut HashMap<Gid, String>) {
        let (watched, over) = to_watch(&self.sessions.lock(), Instant::now());
        for (gid, turn) in over {
            self.dialog_gone(gid, &turn, "the worker's turn or its ask ended")
                .await;
        }
        seen.retain(|gid, _| watched.iter().any(|w| w.gid == *gid));
        for w in watched {
            self.look_at(w, seen).await;
        }
    }

    /// One look at the screen of `w`: a dialog that held still since the look before (`seen`)
    /// on a busy worker is asked of its lead; one asked that went away, or another in its
    /// place, is over.
    async fn look_at(self: &Arc<Self>, w: Watched, seen: &mut HashMap<Gid, String>) {
        let Ok(screen) = self.panes.snapshot(&w.pane).await else {
            return;
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
            // Gone, or another in its place (answered in the pane, the next one shown): the
            // lead's answer must not be pressed into it. A new one is asked afresh.
            (WorkerStatus::Blocked, now, Some(asked)) if now.as_ref() != Some(&asked.dialog) => {
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

mod answer;
mod ask;

pub(super) use answer::take_answer;

#[cfg(test)]
mod tests {
    use fleet_core::{Message, SessionEvent, TraceId};

    use super::super::session::{OpenDialog, PaneSession};
    use super::super::testing::{alice, worker_session};
    use super::*;
    use crate::config::ProfileConfig;

    /// A worker's session with `markers` as its dialog markers, its pane open and idle.
    fn worker(markers: Option<&[&str]>) -> PaneSession {
        let mut profile = ProfileConfig::command("sim", vec!["sim".into()]);
        profile.blocked_markers = markers.map(|m| m.iter().map(|s| s.to_string()).collect());
        let mut s = worker_session(&alice(), profile);
        s.pane_opened(PaneId("%1".into()));
        s.called_in(false, 1);
        s
    }

    fn busy(markers: Option<&[&str]>) -> PaneSession {
        let mut s = worker(markers);
        let task = Message::task(Gid::mint(), s.entity().gid, "t".into(), TraceId::mint(), 1);
        s.start_task(task).unwrap();
        s
    }

    /// The dialog `turn` asked of `s`'s lead, as the session holds it.
    fn asked(s: &PaneSession, turn: &str, good_until: Option<Instant>) -> OpenDialog {
        OpenDialog {
            question: AskView {
                turn_id: turn.into(),
                from: s.entity().gid,
                from_name: s.entity().name.clone(),
                host: "hosta".into(),
                question: "Proceed?".into(),
                choices: None,
                in_task: None,
                asked_ms: 1,
            },
            good_until,
            remote: None,
            turn_over_before: Vec::new(),
            answering: false,
            at_start: false,
        }
    }

    fn add(sessions: &mut Sessions, s: PaneSession) -> Gid {
        let gid = s.entity().gid;
        sessions.panes.insert(gid, s);
        gid
    }

    #[test]
    fn only_busy_or_blocked_workers_that_can_show_a_dialog_are_looked_at() {
        let mut sessions = Sessions::default();
        let watched = add(&mut sessions, busy(Some(&["Proceed?"])));
        add(&mut sessions, worker(Some(&["Proceed?"])));
        add(&mut sessions, busy(None));
        let (looked, over) = to_watch(&sessions, Instant::now());
        let looked: Vec<Gid> = looked.iter().map(|w| w.gid).collect();
        assert_eq!(
            looked,
            vec![watched],
            "idle, and markerless, workers are not looked at"
        );
        assert!(over.is_empty());
    }

    #[test]
    fn a_dialog_whose_ask_is_over_or_whose_turn_ended_is_over_and_one_being_answered_is_left_alone()
    {
        let now = Instant::now();
        let mut sessions = Sessions::default();
        // Blocked, but its ask was closed (refused afar, say).
        let mut closed = busy(Some(&["Proceed?"]));
        closed.apply(SessionEvent::DialogShown).unwrap();
        let dialog = asked(&closed, "dialog-closed", None);
        closed.dialog_asked(dialog);
        let closed = add(&mut sessions, closed);
        // Blocked, its ask open but past its time there.
        let mut expired = busy(Some(&["Proceed?"]));
        expired.apply(SessionEvent::DialogShown).unwrap();
        let dialog = asked(&expired, "dialog-expired", Some(now));
        sessions
            .asks
            .open(dialog.question.clone(), Gid::mint(), Waiter::Screen);
        expired.dialog_asked(dialog);
        let expired = add(&mut sessions, expired);
        // Its answer being pressed: the screen is the answer's.
        let mut answering = busy(Some(&["Proceed?"]));
        answering.apply(SessionEvent::DialogShown).unwrap();
        let mut dialog = asked(&answering, "dialog-answering", None);
        dialog.answering = true;
        answering.dialog_asked(dialog);
        let answering = add(&mut sessions, answering);

        let (looked, mut over) = to_watch(&sessions, now);
        over.sort();
        let mut expected = vec![
            (closed, "dialog-closed".to_string()),
            (expired, "dialog-expired".to_string()),
        ];
        expected.sort();
        assert_eq!(over, expected);
        assert!(looked.iter().all(|w| w.gid != answering));
        assert!(
            looked.iter().all(|w| w.asked.is_none()),
            "an ask that is over is not the one on screen"
        );
    }
}
