//! The session's own rules, at explicit times.

use std::time::Duration;

use fleet_core::{Gid, MsgId, SessionEvent, TraceId};

use super::super::testing::{alice, worker_session};
use super::*;
use crate::config::ProfileKind;

/// A worker's session of a plain command's profile (any call-in makes it ready), capped at
/// `cap` tasks.
fn session(cap: Option<u64>) -> PaneSession {
    let mut profile = ProfileConfig::command("sim", vec!["sim".into()]);
    profile.context_cap = cap;
    profile.role = Some("frontend".into());
    worker_session(&alice(), profile)
}

/// An idle session, its pane open.
fn idle() -> PaneSession {
    let mut s = session(None);
    assert!(!s.pane_opened(PaneId("%1".into())));
    assert_eq!(s.called_in(false, 1), Some(true));
    assert_eq!(s.status(), WorkerStatus::Idle);
    s
}

fn task(text: &str) -> Message {
    Message::task(Gid::mint(), Gid::mint(), text.into(), TraceId::mint(), 1)
}

#[test]
fn a_worker_that_calls_in_before_its_pane_is_known_turns_ready_with_the_pane() {
    let mut s = session(None);
    assert_eq!(s.called_in(true, 5), Some(false));
    assert_eq!(s.status(), WorkerStatus::Spawning);
    assert_eq!(s.last_seen_ms(), Some(5));
    assert!(s.pane_opened(PaneId("%1".into())));
    assert_eq!(s.status(), WorkerStatus::Idle);

    // A sign given before a fresh session's token counts for nothing.
    let mut s = session(None);
    assert_eq!(s.called_in(false, 5), Some(false));
    s.forget_early_readiness();
    assert!(!s.pane_opened(PaneId("%1".into())));
    assert_eq!(s.status(), WorkerStatus::Spawning);
}

#[test]
fn a_claude_code_worker_is_ready_only_once_it_lists_the_tools() {
    let mut s = session(None);
    let mut profile = (**s.profile()).clone();
    profile.kind = ProfileKind::ClaudeCode;
    s.profile = Arc::new(profile);
    s.pane_opened(PaneId("%1".into()));
    assert_eq!(s.called_in(false, 1), Some(false));
    assert_eq!(s.status(), WorkerStatus::Spawning);
    assert!(s.listed_tools());
    assert_eq!(s.status(), WorkerStatus::Idle);
}

#[test]
fn one_claimant_at_a_time_and_one_turned_away_is_woken_when_the_claim_goes() {
    let mut s = idle();
    let mut kicks = s.kicks();
    kicks.borrow_and_update();
    // Not free (the rule said no): no claim, no one to wake.
    assert!(!s.claim(false));
    assert!(!s.claiming());
    assert!(s.claim(true));
    // A second claimant is turned away while the claim is held.
    assert!(!s.claim(true));
    assert!(!kicks.has_changed().unwrap());
    s.unclaim();
    assert!(!s.claiming());
    assert!(kicks.has_changed().unwrap(), "the one turned away is woken");
    kicks.borrow_and_update();
    // A claim let go with no one turned away wakes nobody (the pump would wake itself).
    assert!(s.claim(true));
    s.unclaim();
    assert!(!kicks.has_changed().unwrap());
}

#[test]
fn a_task_started_is_in_flight_until_its_turn_ends_and_only_its_own_answer_takes_it() {
    let mut s = idle();
    assert!(s.claim(true));
    let first = task("first");
    s.start_task(first.clone()).unwrap();
    assert!(!s.claiming(), "starting a task lets go of the claim");
    assert_eq!(s.status(), WorkerStatus::Busy);
    assert_eq!(s.tasks_started(), 1);
    assert_eq!(s.current().map(|t| t.msg_id), Some(first.msg_id));
    // A second task cannot start while the first is in flight.
    assert!(s.start_task(task("second")).is_err());
    assert_eq!(s.current().map(|t| t.msg_id), Some(first.msg_id));
    // An answer to another task takes nothing.
    assert!(s.take_current(MsgId::mint()).is_none());
    let taken = s.take_current(first.msg_id).unwrap();
    assert!(s.current().is_none());
    // Put back (its reply could not be held), unless another took its place.
    s.restore_current(taken.clone());
    assert_eq!(s.current().map(|t| t.msg_id), Some(first.msg_id));
    s.take_current(first.msg_id);
    s.restore_current(task("other"));
    s.restore_current(taken);
    assert_ne!(s.current().map(|t| t.msg_id), Some(first.msg_id));
    s.end_turn().unwrap();
    assert_eq!(s.status(), WorkerStatus::Idle);
    // A turn ends once.
    assert!(s.end_turn().is_err());
}

#[test]
fn a_task_left_for_the_pump_is_typed_once_and_only_while_it_is_in_flight_on_a_live_session() {
    let mut s = idle();
    let t = task("taken as accepted");
    assert!(s.claim(true));
    let mut kicks = s.kicks();
    kicks.borrow_and_update();
    s.start_task_for_pump(t.clone()).unwrap();
    assert!(kicks.has_changed().unwrap(), "its pump is woken to type it");
    assert!(!s.claiming());
    assert_eq!(s.status(), WorkerStatus::Busy);
    assert_eq!(s.take_to_type().map(|m| m.msg_id), Some(t.msg_id));
    assert!(s.take_to_type().is_none(), "typed once");
    // A task started the pump's own way is not left for it.
    s.end_turn_of(t.msg_id).unwrap();
    s.start_task(task("the pump's own")).unwrap();
    assert!(s.take_to_type().is_none());
    // Out of flight before the pump came (its turn ended, its program exited), or on a session
    // stopping: nothing to type.
    let mut s = idle();
    let t = task("ended first");
    s.start_task_for_pump(t.clone()).unwrap();
    s.end_turn_of(t.msg_id).unwrap();
    assert!(s.take_to_type().is_none());
    let mut s = idle();
    s.start_task_for_pump(task("exited first")).unwrap();
    assert!(s.exited().is_some());
    assert!(s.take_to_type().is_none());
    let mut s = idle();
    s.start_task_for_pump(task("stopping first")).unwrap();
    s.apply(SessionEvent::Stop).unwrap();
    assert!(s.take_to_type().is_none());
    // A session ending takes no task, and says its worker is gone (what the task's sender
    // reads), not which event its state refused.
    let mut s = idle();
    s.apply(SessionEvent::Stop).unwrap();
    let refused = s.start_task_for_pump(task("too late")).unwrap_err();
    assert_eq!(refused.code, fleet_core::ErrorCode::Gone);
    assert_eq!(refused.message, format!("'{}' is gone", s.entity().name));
    assert!(s.current().is_none());
    // One that cannot take a task takes none.
    let mut busy = idle();
    busy.start_task(task("busy")).unwrap();
    assert!(busy.start_task_for_pump(task("another")).is_err());
    assert!(busy.take_to_type().is_none());
}

#[test]
fn a_turn_ends_for_its_own_task_only() {
    let mut s = idle();
    let t = task("typed");
    s.start_task(t.clone()).unwrap();
    assert!(s.end_turn_of(MsgId::mint()).is_none());
    assert_eq!(s.status(), WorkerStatus::Busy);
    assert_eq!(s.end_turn_of(t.msg_id).map(|m| m.msg_id), Some(t.msg_id));
    assert_eq!(s.status(), WorkerStatus::Idle);
    assert!(s.current().is_none());
}

#[test]
fn idleness_is_counted_from_the_moment_the_turn_ended() {
    let mut s = idle();
    s.start_task(task("t")).unwrap();
    let at = Instant::now();
    assert_eq!(s.idle_for(at), None, "a busy worker is not idle");
    s.apply_at(SessionEvent::TurnDone, at).unwrap();
    assert_eq!(
        s.idle_for(at + Duration::from_secs(90)),
        Some(Duration::from_secs(90))
    );
    // A clock read before the turn ended counts nothing.
    assert_eq!(
        s.idle_for(at - Duration::from_secs(1)),
        Some(Duration::ZERO)
    );
}

#[test]
fn a_session_at_its_cap_starts_afresh_with_its_count_at_zero_and_its_pane_given_up() {
    let mut s = idle();
    s.start_task(task("one")).unwrap();
    s.end_turn().unwrap();
    assert!(!s.cap_reached());
    s.start_task(task("two")).unwrap();
    s.end_turn().unwrap();
    // Uncapped: never reached.
    assert!(!s.cap_reached());
    let mut s = session(Some(1));
    s.pane_opened(PaneId("%1".into()));
    s.called_in(false, 1);
    s.start_task(task("one")).unwrap();
    s.end_turn().unwrap();
    assert!(s.cap_reached());
    assert!(s.gate(false).cap_reached);
    s.apply(SessionEvent::Recycle).unwrap();
    // As a restart took it back: spawned in a sandbox, with a role, that its profile no
    // longer gives.
    Arc::make_mut(&mut s.entity).sandbox = Some("bwrap".into());
    Arc::make_mut(&mut s.entity).profile_role = Some("backend".into());
    assert_eq!(s.start_afresh(), Some(PaneId("%1".into())));
    assert!(!s.cap_reached());
    assert_eq!(s.pane(), None);
    assert_eq!(s.last_seen_ms(), None);
    // Its fresh session runs as its profile says now.
    assert_eq!(s.entity().sandbox, None);
    assert_eq!(s.entity().profile_role.as_deref(), Some("frontend"));
    // It stays briefed across the recycle (an architect's next task waits for its poll).
    assert!(s.briefed);
}

#[test]
fn an_open_poll_takes_the_tasks_and_its_end_wakes_the_pump() {
    let mut s = idle();
    let mut kicks = s.kicks();
    kicks.borrow_and_update();
    s.call_opened(true);
    s.call_opened(false);
    assert_eq!(s.open_calls(), 2);
    assert_eq!(s.gate(false).polls_open, 1);
    s.call_closed(false);
    assert!(!kicks.has_changed().unwrap());
    s.call_closed(true);
    assert_eq!((s.open_calls(), s.gate(false).polls_open), (0, 0));
    assert!(kicks.has_changed().unwrap());
    // More closes than opens leave nothing negative.
    s.call_closed(true);
    assert_eq!((s.open_calls(), s.gate(false).polls_open), (0, 0));
}

#[test]
fn a_stall_is_forgotten_once_the_worker_is_no_longer_busy() {
    let mut s = idle();
    let t = task("t");
    s.start_task(t.clone()).unwrap();
    s.stalled_at(1_000);
    assert_eq!(s.stalled_since(), Some(1_000));
    s.moves_again();
    assert_eq!(s.stalled_since(), None);
    s.stalled_at(2_000);
    s.end_turn_of(t.msg_id);
    assert_eq!(s.stalled_since(), None);
}

/// The dialog `turn` asked of `s`'s lead (`at_start`: shown while it started).
fn dialog(s: &PaneSession, turn: &str, at_start: bool) -> OpenDialog {
    OpenDialog {
        question: AskView {
            turn_id: turn.into(),
            from: s.entity().gid,
            from_name: "w1".into(),
            host: "hosta".into(),
            question: "Proceed?".into(),
            choices: None,
            in_task: None,
            asked_ms: 1,
        },
        good_until: None,
        remote: None,
        turn_over_before: vec![],
        answering: false,
        at_start,
    }
}

#[test]
fn a_dialog_over_makes_a_blocked_worker_busy_again() {
    let mut s = idle();
    s.start_task(task("t")).unwrap();
    s.apply(SessionEvent::DialogShown).unwrap();
    s.dialog_asked(dialog(&s, "dlg-1", false));
    assert!(!s.blocked_at_start());
    assert_eq!(s.stored_status(), WorkerStatus::Blocked);
    s.dialog_mut().unwrap().answering = true;
    assert!(s.dialog().is_some_and(|d| d.answering));
    let over = s.dialog_over().unwrap();
    assert_eq!(over.question.turn_id, "dlg-1");
    assert_eq!(s.status(), WorkerStatus::Busy);
    assert!(s.dialog_over().is_none());
}

#[test]
fn an_exit_ends_the_session_and_hands_back_its_task_in_flight() {
    let mut s = idle();
    let t = task("t");
    s.start_task(t.clone()).unwrap();
    assert_eq!(s.exited().map(|m| m.msg_id), Some(t.msg_id));
    assert_eq!(s.status(), WorkerStatus::Gone);
    assert_eq!(s.called_in(false, 9), None, "a gone session takes no call");
}

#[test]
fn a_workspace_is_taken_only_while_spawning() {
    let mut s = session(None);
    assert!(s.work_in(Path::new("/work/ws")));
    assert_eq!(
        (s.cwd(), s.workspace()),
        (Path::new("/work/ws"), Some(Path::new("/work/ws")))
    );
    let mut s = idle();
    assert!(!s.work_in(Path::new("/elsewhere")));
    assert_eq!(s.cwd(), Path::new("/work"));
}

#[test]
fn what_the_pane_host_sees_wakes_the_pump_only_when_it_changes() {
    let mut s = idle();
    let mut kicks = s.kicks();
    kicks.borrow_and_update();
    assert!(!s.agent_seen(None));
    assert!(!kicks.has_changed().unwrap());
    assert!(s.agent_seen(Some(("claude".into(), AgentState::Working))));
    assert!(kicks.has_changed().unwrap());
    assert!(s.gate(false).agent_busy);
}

#[test]
fn a_session_taken_back_resumes_where_it_was() {
    let lead = alice();
    let taken = |current: Option<Message>| {
        let was = worker_session(&lead, ProfileConfig::command("sim", vec!["sim".into()]));
        PaneSession::adopted(Adopted {
            entity: was.entity().clone(),
            profile: Arc::clone(was.profile()),
            cwd: PathBuf::from("/work/space"),
            workspace: Some(PathBuf::from("/work/space")),
            owner: was.owner().clone(),
            shared: vec![LeadRef {
                name: "bob".into(),
                host: "hostb".into(),
            }],
            pane: PaneId("%4".into()),
            current,
            tasks_started: 3,
            briefed: true,
        })
    };
    // With a task in flight: busy on it, and its reply ends the turn.
    let first = task("first");
    let mut busy = taken(Some(first.clone()));
    assert_eq!(busy.status(), WorkerStatus::Busy);
    assert_eq!(busy.current().map(|m| m.msg_id), Some(first.msg_id));
    assert_eq!(busy.pane(), Some(&PaneId("%4".into())));
    assert_eq!(busy.idle_for(Instant::now()), None);
    assert_eq!(
        (busy.tasks_started(), busy.shared().len(), busy.workspace()),
        (3, 1, Some(Path::new("/work/space")))
    );
    assert!(busy.take_current(first.msg_id).is_some());
    assert_eq!(busy.end_turn().ok(), Some(WorkerStatus::Idle));
    // With none: idle from now on, and it takes the next task.
    let mut idle = taken(None);
    assert_eq!(idle.status(), WorkerStatus::Idle);
    assert!(idle.idle_for(Instant::now()).is_some());
    assert!(idle.claim(true));
    assert!(idle.start_task(task("next")).is_ok());
    assert_eq!(idle.status(), WorkerStatus::Busy);
}

#[test]
fn a_start_dialog_holds_the_start_and_a_call_in_meanwhile_makes_it_ready_once_it_goes() {
    let mut s = session(None);
    s.pane_opened(PaneId("%1".into()));
    s.apply(SessionEvent::DialogShown).unwrap();
    s.dialog_asked(dialog(&s, "dlg-start", true));
    assert!(s.blocked_at_start());
    assert!(matches!(s.start_state(), StartState::Blocked(asked) if asked.turn_id == "dlg-start"));
    // The store keeps it starting: a restart takes back no half-done start.
    assert_eq!(s.stored_status(), WorkerStatus::Spawning);
    // A call-in while the dialog is up does not make it ready: a task would answer the dialog.
    assert_eq!(s.called_in(false, 2), Some(false));
    assert_eq!(s.status(), WorkerStatus::Blocked);
    assert!(s.dialog_over().is_some());
    assert_eq!(s.status(), WorkerStatus::Idle, "it had called in");

    // Without a call-in, it starts on.
    let mut s = session(None);
    s.pane_opened(PaneId("%1".into()));
    s.apply(SessionEvent::DialogShown).unwrap();
    s.dialog_asked(dialog(&s, "dlg-start", true));
    s.dialog_over();
    assert_eq!(s.status(), WorkerStatus::Spawning);
    assert_eq!(s.start_state(), StartState::Starting);
    assert_eq!(s.called_in(false, 3), Some(true));
    assert_eq!(s.start_state(), StartState::Past);
    // A dialog mid-task is no dialog of the start; a session stopped has ended.
    s.start_task(task("t")).unwrap();
    s.apply(SessionEvent::DialogShown).unwrap();
    s.dialog_asked(dialog(&s, "dlg-task", false));
    assert_eq!(s.start_state(), StartState::Past);
    s.apply(SessionEvent::Stop).unwrap();
    assert_eq!(s.start_state(), StartState::Ended(None));
}
