//! The local plane against the in-memory pane host (`fleet_mux::fake`), under a paused tokio
//! clock: a real gateway (its store on disk, no broker) whose workers are fake panes that echo
//! a paste and take it on Enter, so the delivery pump's rules are seen step by step — one task
//! in flight at a time, the next typed only once the first is answered, nothing typed into a
//! worker whose pane host says it is busy. The same flows on real tmux and real agents are in
//! the `suite` integration tests.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::dialog::{CLAUDE_CODE_MARKERS, Key};
use fleet_core::{MsgState, WorkerStatus};
use fleet_mux::fake::{FakePanes, Typed};
use fleet_mux::{AgentState, PaneId};
use tokio_util::sync::CancellationToken;

use super::afar::Afar;
use super::testing::{plane_on, worker_session};
use super::views::SendResult;
use super::{Caller, LocalPlane};
use crate::config::{Config, ProfileConfig};

/// A gateway on fake panes, its lead, and one idle worker `w1` with its pump running.
pub(super) struct Local {
    pub(super) gateway: Arc<LocalPlane>,
    pub(super) panes: Arc<FakePanes>,
    pub(super) lead: Caller,
    pub(super) worker: Caller,
    pub(super) pane: PaneId,
    _dir: tempfile::TempDir,
}

async fn local() -> Local {
    local_with(|_| {}).await
}

/// [`local`], w1's profile changed by `tweak`.
async fn local_with(tweak: impl FnOnce(&mut ProfileConfig)) -> Local {
    local_on(tweak, None).await
}

/// [`local_with`], the other hosts seen through `afar` (a fake of the seam) when given.
pub(super) async fn local_on(
    tweak: impl FnOnce(&mut ProfileConfig),
    afar: Option<Arc<dyn Afar>>,
) -> Local {
    local_built(tweak, afar, true).await
}

/// [`local_on`], w1's pump started only if `pumped`.
async fn local_built(
    tweak: impl FnOnce(&mut ProfileConfig),
    afar: Option<Arc<dyn Afar>>,
    pumped: bool,
) -> Local {
    let dir = tempfile::tempdir().unwrap();
    let panes = Arc::new(FakePanes::new());
    let (gateway, alice) = plane_on(dir.path(), Config::embedded(), panes.clone(), afar).await;
    let mut profile = ProfileConfig::command("sim", vec!["sim".into()]);
    // Typed at once (no pause before Enter, no settling before the first task).
    profile.enter_pause_ms = Some(0);
    tweak(&mut profile);
    let mut session = worker_session(&alice, profile);
    let pane = panes.open();
    session.pane_opened(pane.clone());
    assert_eq!(session.called_in(false, 1), Some(true));
    let worker = session.entity().clone();
    gateway.sessions.lock().add_session(session);
    if pumped {
        gateway.start_pump(worker.gid);
    }
    Local {
        gateway,
        panes,
        lead: Caller {
            entity: alice.into(),
        },
        worker: Caller {
            entity: worker.into(),
        },
        pane,
        _dir: dir,
    }
}

/// Sends `text` from the lead to w1 without waiting; returns its message id.
pub(super) async fn send(l: &Local, text: &str) -> fleet_core::MsgId {
    let ct = CancellationToken::new();
    match l
        .gateway
        .send(&l.lead, "w1", text.into(), Duration::ZERO, &ct)
        .await
        .unwrap()
    {
        SendResult::Pending { msg_id, .. } => msg_id,
        other => panic!("{other:?}"),
    }
}

/// w1 answers its task in flight with `text`, and the gateway's loops run on.
async fn w1_answers(l: &Local, text: &str) {
    l.gateway.reply(&l.worker, text.into(), None).await.unwrap();
    settle().await;
}

/// Lets the gateway's loops run (the paused clock moves on only when they wait).
pub(super) async fn settle() {
    tokio::time::sleep(Duration::from_secs(5)).await;
}

async fn state_of(l: &Local, msg_id: fleet_core::MsgId) -> MsgState {
    l.gateway
        .db
        .run(move |s| s.message(msg_id))
        .await
        .unwrap()
        .unwrap()
        .state
}

#[tokio::test(start_paused = true)]
async fn one_task_is_in_flight_at_a_time_and_the_next_is_typed_once_the_first_is_answered() {
    let l = local().await;
    let first = send(&l, "first task").await;
    let second = send(&l, "second task").await;
    settle().await;
    // The first is typed in and submitted; the second waits in the queue, untyped.
    assert_eq!(l.panes.submitted(&l.pane), ["first task"]);
    assert_eq!(state_of(&l, first).await, MsgState::Injected);
    assert_eq!(state_of(&l, second).await, MsgState::Queued);
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["first task"]);

    // The worker answers the first: it is held for the lead, and only now the second goes in.
    w1_answers(&l, "first done").await;
    assert_eq!(l.panes.submitted(&l.pane), ["first task", "second task"]);
    assert_eq!(state_of(&l, second).await, MsgState::Injected);
    let held = l
        .gateway
        .db
        .run({
            let gid = l.lead.entity.gid;
            move |s| s.take_held(gid, None, 10)
        })
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(
        (held[0].body.as_str(), held[0].in_reply_to),
        ("first done", Some(first))
    );
}

#[tokio::test(start_paused = true)]
async fn a_send_or_a_poll_that_waits_for_nothing_returns_without_waiting_on_the_clock() {
    let l = local().await;
    let ct = CancellationToken::new();
    // Between two of the timer's millisecond ticks, as a real clock nearly always is.
    tokio::time::advance(Duration::from_micros(400)).await;
    let started = tokio::time::Instant::now();
    send(&l, "a task, not waited for").await;
    let polled = l
        .gateway
        .poll(&l.lead, None, Duration::ZERO, &ct)
        .await
        .unwrap();
    assert!(polled.messages.is_empty());
    // The paused clock moves only when every task waits on it: a wait already over that still
    // waited for the timer's next tick would have moved it.
    assert_eq!(tokio::time::Instant::now(), started);
}

/// The pane host sees w1's agent in `state`, and the pane watcher tells w1's session so.
async fn host_sees(l: &Local, state: AgentState) {
    l.panes.set_agent(&l.pane, Some(("claude".into(), state)));
    l.gateway.check_panes(&mut Default::default()).await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_typed_into_a_worker_its_pane_host_sees_busy_until_it_is_free_again() {
    let l = local().await;
    host_sees(&l, AgentState::Working).await;
    let task = send(&l, "a task").await;
    settle().await;
    assert!(l.panes.submitted(&l.pane).is_empty());
    assert_eq!(state_of(&l, task).await, MsgState::Queued);
    host_sees(&l, AgentState::Idle).await;
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["a task"]);
}

#[tokio::test(start_paused = true)]
async fn when_a_workers_program_exits_its_task_in_flight_and_its_queue_fail_to_their_sender() {
    let l = local().await;
    let in_flight = send(&l, "in flight").await;
    let queued = send(&l, "queued").await;
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["in flight"]);
    assert_eq!(l.panes.reported(&l.pane), Some(AgentState::Working));
    l.panes.exit(&l.pane, Some(1));
    // The pane watcher sees it: the session ends and its pane is closed.
    l.gateway.check_panes(&mut Default::default()).await;
    settle().await;
    assert!(l.panes.closed(&l.pane));
    // The queued one never goes in; its sender holds a FAILED notice for each.
    assert_eq!(state_of(&l, queued).await.name(), "failed");
    let gid = l.lead.entity.gid;
    let held = l
        .gateway
        .db
        .run(move |s| s.take_held(gid, None, 10))
        .await
        .unwrap();
    let mut failed: Vec<_> = held
        .iter()
        .filter(|m| m.kind == fleet_core::Kind::Failed)
        .filter_map(|m| m.in_reply_to)
        .collect();
    failed.sort();
    let mut expected = vec![in_flight, queued];
    expected.sort();
    assert_eq!(failed, expected, "{held:?}");
    assert_eq!(l.panes.submitted(&l.pane), ["in flight"]);
    // And it is gone from the roster: no task is accepted for it.
    let ct = CancellationToken::new();
    let err = l
        .gateway
        .send(&l.lead, "w1", "too late".into(), Duration::ZERO, &ct)
        .await
        .unwrap_err();
    assert_eq!(err.code, fleet_core::ErrorCode::UnknownRecipient, "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn a_pane_host_slow_to_take_a_report_of_the_state_holds_no_task_back() {
    let l = local_built(|_| {}, None, false).await;
    l.panes.stall_reports();
    l.gateway.start_pump(l.worker.entity.gid);
    send(&l, "first").await;
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["first"]);
    w1_answers(&l, "done").await;
    send(&l, "second").await;
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["first", "second"]);
    assert_eq!(l.panes.reported(&l.pane), None, "no report was answered");
}

#[tokio::test(start_paused = true)]
async fn a_state_the_pane_host_failed_to_take_is_told_again_and_a_newer_one_replaces_it() {
    let l = local_built(|_| {}, None, false).await;
    l.panes.fail_reports(1);
    l.gateway.start_pump(l.worker.entity.gid);
    // The first report (idle) failed; it is told again two seconds on, not at once.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(l.panes.reported(&l.pane), None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(l.panes.reported(&l.pane), Some(AgentState::Idle));
    // Busy is not taken; the worker answers before it is told again: idle, the newer state,
    // is told, and busy never after it.
    l.panes.fail_reports(1);
    send(&l, "a task").await;
    let typed = tokio::time::Instant::now();
    while l.panes.reports_to_fail() > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        typed.elapsed() < Duration::from_secs(1),
        "{:?}",
        typed.elapsed()
    );
    assert_eq!(l.panes.submitted(&l.pane), ["a task"]);
    assert_eq!(l.panes.reported(&l.pane), Some(AgentState::Idle));
    l.gateway
        .reply(&l.worker, "done".into(), None)
        .await
        .unwrap();
    settle().await;
    assert_eq!(l.panes.reported(&l.pane), Some(AgentState::Idle));
}

#[tokio::test(start_paused = true)]
async fn a_state_the_worker_leaves_before_it_stood_is_never_told_and_one_that_stands_is() {
    use AgentState::{Idle, Working};
    let stands = super::reports::STANDS;
    let l = local_built(|_| {}, None, false).await;
    l.gateway.start_pump(l.worker.entity.gid);
    settle().await;
    assert_eq!(l.panes.reports(&l.pane), [Idle]);
    // Busy for longer than it takes to stand (a session's first task waits for its screen to
    // hold still first): told once it stood, and idle once that stood in turn.
    send(&l, "first").await;
    let sent = tokio::time::Instant::now();
    while l.panes.reports(&l.pane).len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(sent.elapsed() >= stands, "{:?}", sent.elapsed());
    assert_eq!(l.panes.reports(&l.pane), [Idle, Working]);
    w1_answers(&l, "done").await;
    assert_eq!(l.panes.reports(&l.pane), [Idle, Working, Idle]);
    // Busy for less: the host, which shows idle, is told nothing.
    send(&l, "quick").await;
    let sent = tokio::time::Instant::now();
    while l.panes.submitted(&l.pane).len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    l.gateway
        .reply(&l.worker, "done".into(), None)
        .await
        .unwrap();
    assert!(sent.elapsed() < stands, "{:?}", sent.elapsed());
    settle().await;
    assert_eq!(l.panes.reports(&l.pane), [Idle, Working, Idle]);
}

/// Claude Code's permission prompt before a shell command, as captured from the real program.
const PERMISSION_PROMPT: &str =
    include_str!("../../../fleet-core/fixtures/dialogs/claude-acceptedits-bash.txt");

#[tokio::test(start_paused = true)]
async fn a_dialog_on_a_busy_workers_screen_is_asked_of_its_lead_and_the_choice_pressed() {
    let l = local_with(|p| {
        p.blocked_markers = Some(CLAUDE_CODE_MARKERS.iter().map(|m| m.to_string()).collect());
    })
    .await;
    let gid = l.worker.entity.gid;
    let task = send(&l, "run the command").await;
    settle().await;
    assert_eq!(state_of(&l, task).await, MsgState::Injected);
    // The program stops on its prompt: two looks at the same screen ask the lead.
    l.panes.show(&l.pane, PERMISSION_PROMPT);
    let mut seen = HashMap::new();
    for _ in 0..2 {
        l.gateway.look_for_dialogs(&mut seen).await;
    }
    let question = {
        let sessions = l.gateway.sessions.lock();
        let session = sessions.panes.get(&gid).unwrap();
        assert_eq!(session.status(), WorkerStatus::Blocked);
        session.dialog().unwrap().question.clone()
    };
    assert_eq!(question.in_task, Some(task));
    let choices: Vec<(&str, &str)> = question
        .choices
        .iter()
        .flatten()
        .map(|c| (c.choice.as_str(), c.label.as_str()))
        .collect();
    assert_eq!(choices.first(), Some(&("1", "Yes")), "{choices:?}");

    // Claude Code takes the key: its prompt goes.
    let (panes, pane) = (Arc::clone(&l.panes), l.pane.clone());
    tokio::spawn(async move {
        while !panes
            .typed(&pane)
            .iter()
            .any(|t| matches!(t, Typed::Press(_)))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panes.show(&pane, "");
    });
    let ct = CancellationToken::new();
    l.gateway
        .choose_for(&l.lead, &question.turn_id, "1", Duration::ZERO, &ct)
        .await
        .unwrap();
    assert_eq!(
        l.panes.typed(&l.pane).last(),
        Some(&Typed::Press(Key::Digit(1)))
    );
    let sessions = l.gateway.sessions.lock();
    let session = sessions.panes.get(&gid).unwrap();
    assert_eq!(session.status(), WorkerStatus::Busy);
    assert!(session.dialog().is_none());
    // Its task is still the one in flight: the reply to it is awaited as before.
    assert_eq!(session.current().map(|t| t.msg_id), Some(task));
}

/// The lead's FAILED notices held for it, each with the task it answers.
async fn failures_held(l: &Local) -> Vec<(fleet_core::MsgId, String)> {
    taken_by_poll(l)
        .await
        .into_iter()
        .filter(|m| m.kind == fleet_core::Kind::Failed)
        .map(|m| (m.in_reply_to.unwrap(), m.body))
        .collect()
}

/// How long w1's pump pauses between a task's paste and its Enter in the tests of a turn that
/// ends as its task goes in.
const SLOW_ENTER: Duration = Duration::from_secs(10);

/// A [`local`] whose w1 pauses [`SLOW_ENTER`] before each Enter, `tweak`ed, and a task sent
/// to it, its paste gone in and its Enter not yet.
async fn pasted_not_entered(tweak: impl FnOnce(&mut ProfileConfig)) -> (Local, fleet_core::MsgId) {
    let l = local_with(|p| {
        p.enter_pause_ms = Some(SLOW_ENTER.as_millis() as u64);
        tweak(p);
    })
    .await;
    let task = send(&l, "run the command").await;
    while l.panes.typed(&l.pane).is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        l.panes.typed(&l.pane),
        [Typed::Paste("run the command".into())]
    );
    assert_eq!(history_of(&l, task).await, ["injecting"]);
    (l, task)
}

#[tokio::test(start_paused = true)]
async fn a_task_whose_turn_a_dialog_ended_as_it_went_in_is_failed_for_good_and_never_entered() {
    let (l, task) = pasted_not_entered(|p| {
        p.blocked_markers = Some(CLAUDE_CODE_MARKERS.iter().map(|m| m.to_string()).collect());
        p.turn_over_markers = Some(vec!["Interrupted · What should Claude do instead?".into()]);
    })
    .await;
    let gid = l.worker.entity.gid;
    l.panes.show(&l.pane, PERMISSION_PROMPT);
    let mut seen = HashMap::new();
    for _ in 0..2 {
        l.gateway.look_for_dialogs(&mut seen).await;
    }
    let asked_in = {
        let sessions = l.gateway.sessions.lock();
        sessions
            .panes
            .get(&gid)
            .unwrap()
            .dialog()
            .unwrap()
            .question
            .in_task
    };
    assert_eq!(asked_in, Some(task));
    // Answered "No" in the pane: the prompt goes and the program waits for what to do instead.
    l.panes
        .show(&l.pane, "⎿  Interrupted · What should Claude do instead?");
    l.gateway.look_for_dialogs(&mut seen).await;
    // Failed in the store as its lead is told: a restart now would not put it back.
    assert!(
        matches!(state_of(&l, task).await, MsgState::Failed(_)),
        "{:?}",
        state_of(&l, task).await
    );
    // Its pump's Enter, due after the notice, is withheld; the lead hears of it once.
    tokio::time::sleep(SLOW_ENTER * 2).await;
    assert_eq!(
        l.panes.typed(&l.pane),
        [Typed::Paste("run the command".into())]
    );
    let failures = failures_held(&l).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, task);
    assert!(failures[0].1.contains("ended its turn"), "{failures:?}");
}

#[tokio::test(start_paused = true)]
async fn a_task_whose_worker_stalled_as_it_went_in_is_failed_for_good() {
    let (l, task) = pasted_not_entered(|p| {
        p.stall_after_s = Some(1);
        p.on_stall = crate::config::OnStall::Recycle;
    })
    .await;
    let mut seen = HashMap::new();
    l.gateway.look_for_stalls(&mut seen).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    l.gateway.look_for_stalls(&mut seen).await;
    assert!(
        matches!(state_of(&l, task).await, MsgState::Failed(_)),
        "{:?}",
        state_of(&l, task).await
    );
    let failures = failures_held(&l).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, task);
    assert!(failures[0].1.contains("stalled"), "{failures:?}");
    // Its Enter, due after the notice, never went in.
    tokio::time::sleep(SLOW_ENTER * 2).await;
    assert!(!l.panes.typed(&l.pane).contains(&Typed::Enter));
    assert!(!history_of(&l, task).await.contains(&"injected".to_string()));
}

/// The lead's send of `text` to w1, waiting for its answer, on a task of its own.
fn waiting_send(l: &Local, text: &str) -> tokio::task::JoinHandle<SendResult> {
    let (gateway, lead, text) = (Arc::clone(&l.gateway), l.lead.clone(), text.to_string());
    tokio::spawn(async move {
        let ct = CancellationToken::new();
        gateway
            .send(&lead, "w1", text, Duration::from_secs(60), &ct)
            .await
            .unwrap()
    })
}

/// What is held for the lead's poll, taken.
async fn taken_by_poll(l: &Local) -> Vec<fleet_core::Message> {
    let lead = l.lead.entity.gid;
    l.gateway
        .db
        .run(move |s| s.take_held(lead, None, 10))
        .await
        .unwrap()
}

/// A wait of the lead's for the answer to `task` that takes one handed to it, as a waiting
/// send's does.
fn hand_for(l: &Local, task: fleet_core::MsgId) -> super::inboxes::AnswerWatch {
    l.gateway
        .inboxes
        .watch_answer(l.lead.entity.gid, task, true)
}

/// What a hold returns: for each message, held, or the cap that refused it.
type HoldOutcome = Result<Vec<Result<(), fleet_core::bounds::Full>>, fleet_core::FleetError>;

/// The hold of `reply`, begun (its hand claimed, its store under way) and left unfinished.
async fn holding_begun(
    l: &Local,
    reply: fleet_core::Message,
) -> Pin<Box<impl Future<Output = HoldOutcome> + '_>> {
    let mut holding = Box::pin(l.gateway.hold(vec![reply]));
    let unfinished = tokio::time::timeout(Duration::ZERO, &mut holding).await;
    assert!(unfinished.is_err(), "the hold waits for its store");
    holding
}

/// The states `msg_id` went through, as its history in the store has them.
async fn history_of(l: &Local, msg_id: fleet_core::MsgId) -> Vec<String> {
    let changes = l.gateway.db.run(move |s| s.history(msg_id)).await.unwrap();
    changes.into_iter().map(|c| c.state).collect()
}

#[tokio::test(start_paused = true)]
async fn an_answer_is_handed_to_the_send_waiting_for_it_as_it_is_stored() {
    let l = local().await;
    let waiting = waiting_send(&l, "the task");
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["the task"]);
    let lead = l.lead.entity.gid;
    let inbox = l.gateway.inboxes.watch(lead);
    let handed = l.gateway.inboxes.watch_handed(lead);
    let replied = l
        .gateway
        .reply(&l.worker, "the answer".into(), None)
        .await
        .unwrap();
    // Nothing was held for the lead: its other calls waiting on its inbox (its other sends, a
    // poll) sleep on; a wait for any answer to it (an architect kept until it answers) hears.
    assert!(
        !inbox.has_changed().unwrap(),
        "the lead's inbox is left alone"
    );
    assert!(
        handed.has_changed().unwrap(),
        "the lead's handed answers are told"
    );
    let SendResult::Replied { reply, .. } = waiting.await.unwrap() else {
        panic!("the send did not return the answer");
    };
    assert_eq!(reply.msg_id, replied.msg_id);
    // Stored taken as it was stored, in one write: it was never held for a pull.
    assert_eq!(history_of(&l, replied.msg_id).await, ["consumed"]);
    let left = taken_by_poll(&l).await;
    assert!(left.is_empty(), "nothing is left for a poll: {left:?}");
}

#[tokio::test(start_paused = true)]
async fn an_answer_handed_to_a_send_that_ended_before_taking_it_is_held_for_a_poll() {
    let l = local().await;
    let task = send(&l, "the task").await;
    settle().await;
    // A wait for the task's answer that ends (its call dropped) once the answer is handed to
    // it, before it takes it.
    let watch = hand_for(&l, task);
    let replied = l
        .gateway
        .reply(&l.worker, "the answer".into(), None)
        .await
        .unwrap();
    assert_eq!(history_of(&l, replied.msg_id).await, ["consumed"], "handed");
    drop(watch);
    settle().await;
    assert_eq!(history_of(&l, replied.msg_id).await, ["consumed", "held"]);
    let held = taken_by_poll(&l).await;
    assert_eq!(
        held.iter()
            .map(|m| (m.body.as_str(), m.in_reply_to))
            .collect::<Vec<_>>(),
        [("the answer", Some(task))]
    );
}

/// The task w1 is working on.
fn task_in_flight(l: &Local) -> fleet_core::Message {
    let sessions = l.gateway.sessions.lock();
    let session = sessions.panes.get(&l.worker.entity.gid).unwrap();
    session.current().cloned().expect("a task in flight")
}

#[tokio::test(start_paused = true)]
async fn an_answer_reaches_the_send_waiting_for_it_even_if_the_call_that_holds_it_goes_away() {
    let l = local().await;
    let waiting = waiting_send(&l, "the task");
    settle().await;
    let reply = fleet_core::Message::reply_to(&task_in_flight(&l), "the answer".into(), 1);
    let msg_id = reply.msg_id;
    // The call holding the answer (a request whose client went away) is dropped once it has
    // begun: the answer is stored taken all the same, and handed.
    drop(holding_begun(&l, reply).await);
    let SendResult::Replied { reply, .. } = waiting.await.unwrap() else {
        panic!("the send did not return the answer");
    };
    assert_eq!((reply.msg_id, reply.text.as_str()), (msg_id, "the answer"));
    assert_eq!(history_of(&l, msg_id).await, ["consumed"]);
}

#[tokio::test(start_paused = true)]
async fn an_answer_for_a_send_that_ended_while_it_was_stored_is_held_for_a_poll() {
    let l = local().await;
    let task = send(&l, "the task").await;
    settle().await;
    let watch = hand_for(&l, task);
    let reply = fleet_core::Message::reply_to(&task_in_flight(&l), "the answer".into(), 1);
    let msg_id = reply.msg_id;
    // The hand is claimed; the wait ends before the answer is stored.
    let holding = holding_begun(&l, reply).await;
    drop(watch);
    assert!(holding.await.unwrap().iter().all(Result::is_ok));
    assert_eq!(history_of(&l, msg_id).await, ["consumed", "held"]);
    let held = taken_by_poll(&l).await;
    assert_eq!(held.iter().map(|m| m.msg_id).collect::<Vec<_>>(), [msg_id]);
}

#[tokio::test(start_paused = true)]
async fn a_task_for_an_idle_worker_goes_straight_in_and_the_next_waits_its_turn_in_the_queue() {
    let l = local().await;
    let first = send(&l, "first task").await;
    // Taken as it was accepted: the worker is busy with it before the send returns, and it was
    // never queued.
    assert_eq!(task_in_flight(&l).msg_id, first);
    // Its pump may be typing it already.
    assert_eq!(history_of(&l, first).await[0], "injecting");
    let second = send(&l, "second task").await;
    assert_eq!(history_of(&l, second).await, ["queued"]);
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["first task"]);
    assert_eq!(history_of(&l, first).await, ["injecting", "injected"]);
    w1_answers(&l, "first done").await;
    assert_eq!(l.panes.submitted(&l.pane), ["first task", "second task"]);
    assert_eq!(
        history_of(&l, second).await,
        ["queued", "injecting", "injected"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_for_a_worker_just_freed_never_goes_in_ahead_of_one_queued_before_it() {
    let l = local().await;
    host_sees(&l, AgentState::Working).await;
    let first = send(&l, "first task").await;
    assert_eq!(history_of(&l, first).await, ["queued"]);
    // Free again; the next task comes before the pump has looked at the queue.
    host_sees(&l, AgentState::Idle).await;
    let second = send(&l, "second task").await;
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["first task"]);
    assert_eq!(history_of(&l, second).await, ["queued"]);
    w1_answers(&l, "first done").await;
    assert_eq!(l.panes.submitted(&l.pane), ["first task", "second task"]);
}

#[tokio::test(start_paused = true)]
async fn a_task_taken_as_it_was_accepted_goes_in_even_if_the_call_that_sent_it_goes_away() {
    let l = local().await;
    let ct = CancellationToken::new();
    let mut sending = Box::pin(l.gateway.send(
        &l.lead,
        "w1",
        "sent by a client that left".into(),
        Duration::ZERO,
        &ct,
    ));
    let unfinished = tokio::time::timeout(Duration::ZERO, &mut sending).await;
    assert!(unfinished.is_err(), "the send waits for its store");
    let claimed = {
        let sessions = l.gateway.sessions.lock();
        let session = sessions.panes.get(&l.worker.entity.gid).unwrap();
        session.claiming() || session.status() == WorkerStatus::Busy
    };
    assert!(claimed, "w1's queue was claimed for the task");
    drop(sending);
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["sent by a client that left"]);
    // The claim was let go: the next task goes in after the first is answered.
    l.gateway
        .reply(&l.worker, "done".into(), None)
        .await
        .unwrap();
    send(&l, "the next").await;
    settle().await;
    assert_eq!(
        l.panes.submitted(&l.pane),
        ["sent by a client that left", "the next"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_cannot_answer_a_task_not_yet_typed_in_to_it() {
    let l = local().await;
    let task = fleet_core::Message::task(
        l.lead.entity.gid,
        l.worker.entity.gid,
        "not typed yet".into(),
        fleet_core::TraceId::mint(),
        1,
    );
    // Left for the pump, which has not run yet: a stray reply answers nothing.
    {
        let mut sessions = l.gateway.sessions.lock();
        let session = sessions.panes.get_mut(&l.worker.entity.gid).unwrap();
        session.start_task_for_pump(task.clone()).unwrap();
    }
    let refused = l
        .gateway
        .reply(&l.worker, "stray".into(), None)
        .await
        .unwrap_err();
    assert!(
        refused.message.contains("has not been typed in to you yet"),
        "{refused:?}"
    );
    assert_eq!(task_in_flight(&l).msg_id, task.msg_id);
}

#[tokio::test(start_paused = true)]
async fn a_task_for_a_worker_whose_pump_has_not_started_waits_for_it_in_the_queue() {
    let l = local_built(|_| {}, None, false).await;
    let task = send(&l, "before the pump").await;
    assert_eq!(history_of(&l, task).await, ["queued"]);
    l.gateway.start_pump(l.worker.entity.gid);
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["before the pump"]);
    assert_eq!(
        history_of(&l, task).await,
        ["queued", "injecting", "injected"]
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_held_for_a_poll_wakes_the_leads_inbox() {
    let l = local().await;
    send(&l, "the task").await;
    settle().await;
    let inbox = l.gateway.inboxes.watch(l.lead.entity.gid);
    l.gateway
        .reply(&l.worker, "the answer".into(), None)
        .await
        .unwrap();
    assert!(inbox.has_changed().unwrap(), "a poll waiting would look");
    assert_eq!(taken_by_poll(&l).await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_any_answer_of_a_worker_hears_one_handed_to_a_send() {
    let l = local().await;
    let (lead, worker) = (l.lead.entity.gid, l.worker.entity.gid);
    let waiting = waiting_send(&l, "the task");
    settle().await;
    let gateway = Arc::clone(&l.gateway);
    let until = tokio::spawn(async move { gateway.until_answered(lead, worker).await });
    settle().await;
    assert!(!until.is_finished(), "not answered yet");
    let inbox = l.gateway.inboxes.watch(lead);
    w1_answers(&l, "the answer").await;
    let SendResult::Replied { reply, .. } = waiting.await.unwrap() else {
        panic!("the send did not return the answer");
    };
    // Handed, not held: the lead's inbox never heard of it.
    assert_eq!(history_of(&l, reply.msg_id).await, ["consumed"]);
    assert!(!inbox.has_changed().unwrap());
    tokio::time::timeout(Duration::from_secs(60), until)
        .await
        .expect("the wait heard the answer")
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_task_taken_for_a_worker_whose_session_ended_meanwhile_fails_saying_it_is_gone() {
    let l = local().await;
    let gid = l.worker.entity.gid;
    let mut task = fleet_core::Message::task(
        l.lead.entity.gid,
        gid,
        "the task".into(),
        fleet_core::TraceId::mint(),
        1,
    );
    task.state = MsgState::Injecting;
    let stored = task.clone();
    assert!(
        l.gateway
            .db
            .run(move |s| s.insert_message(&stored))
            .await
            .unwrap()
    );
    // The session began to stop while the task was being taken for it.
    let stopped = l
        .gateway
        .sessions
        .lock()
        .panes
        .get_mut(&gid)
        .unwrap()
        .apply(fleet_core::SessionEvent::Stop);
    stopped.unwrap();
    assert!(!l.gateway.start_task(gid, task.clone(), true).await);
    assert_eq!(
        state_of(&l, task.msg_id).await,
        MsgState::Failed("'w1' is gone".into())
    );
    let told = taken_by_poll(&l).await;
    assert_eq!(
        told.iter()
            .map(|m| (m.kind, m.body.as_str()))
            .collect::<Vec<_>>(),
        [(fleet_core::Kind::Failed, "'w1' is gone")]
    );
    assert!(l.panes.submitted(&l.pane).is_empty(), "nothing typed");
}
