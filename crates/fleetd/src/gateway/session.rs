//! One pane-bound entity's session (a worker's, an architect's): where it is in its life, the
//! task in flight, the claim on its queue, its open calls, its dialog and its stall. Its fields
//! are its own: every change goes through a method here, named for what happened, so the rules
//! of a session (one claimant at a time, one task in flight, a turn ends once) hold in one
//! place and are tested here, at explicit times. Pure bookkeeping: no I/O.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleet_core::delivery::{Handover, TaskGate, handover};
use fleet_core::ownership::{Action, LeadRef, Owned, Principal, may};
use fleet_core::{Entity, FleetError, Message, MsgId, SessionEvent, WorkerStatus};
use fleet_mux::{AgentState, PaneId};
use tokio::sync::watch;
use tokio::time::Instant;

use super::views::AskView;
use crate::config::{ProfileConfig, ReadyCall};

/// A dialog asked of a worker's lead, while it is open.
pub(super) struct OpenDialog {
    /// The ask, as its lead sees it (its turn id, the dialog's text and choices).
    pub question: AskView,
    /// Until when its lead on another host can answer it (its `ASK`'s life there).
    pub good_until: Option<Instant>,
    /// For a lead on another host: the `ASK` that carried it, to tell that lead it is over.
    pub remote: Option<Message>,
    /// How often each of the profile's `turn_over_markers` showed when it was asked: one shown
    /// more often once it is gone ended the turn.
    pub turn_over_before: Vec<usize>,
    /// Its answer is being pressed: the watcher leaves the screen to it.
    pub answering: bool,
}

/// A pane-bound entity (worker, architect) and its session.
pub(super) struct PaneSession {
    /// Who.
    entity: Entity,
    /// How to type into it.
    profile: Arc<ProfileConfig>,
    /// Where it is in its life.
    status: WorkerStatus,
    /// Its pane, once spawned.
    pane: Option<PaneId>,
    /// Its working directory (a recycled session starts there again).
    cwd: PathBuf,
    /// Since when it has been idle, while it is.
    idle_since: Option<Instant>,
    /// Tasks handed to this session so far (for the profile's `context_cap`).
    tasks_started: u64,
    /// The task in flight, set when a task is handed over and cleared by its reply.
    current: Option<Message>,
    /// Open `fleet_poll` calls: while one is open, tasks go through it, not the keyboard.
    polls: usize,
    /// Its fleet calls open now (a long `fleet_send` or `fleet_poll`): while one is, it waits
    /// on the fleet and has not stalled.
    open_calls: usize,
    /// The pump or a poll is taking the next task off the queue: the other must not, or two
    /// tasks would be in flight at once.
    claiming: bool,
    /// Someone tried to claim while the claim was held; the holder wakes them on letting go.
    claim_missed: bool,
    /// Ticks on every authenticated call; the injector's proof of a submit.
    activity: watch::Sender<u64>,
    /// Ticks whenever the delivery pump or the readiness gate should look again.
    kick: watch::Sender<u64>,
    /// When it last called in.
    last_seen_ms: Option<i64>,
    /// The end of its screen when its program exited, for the error a spawn reports.
    last_words: Option<String>,
    /// The agent the pane host recognises in the pane, and what it is doing (herdr's agent
    /// detection); `None` where the host knows nothing (tmux, or a program herdr does not
    /// recognise). A working or blocked agent gets no task, but through its own open poll.
    host_agent: Option<(String, AgentState)>,
    /// It signalled readiness (called in, or listed the tools) before the pane host had told
    /// us its pane: it is made ready once the pane is known.
    ready_early: bool,
    /// When it was last nudged to pull what waits for it (an architect, past its brief);
    /// forgotten once it takes a task.
    last_nudge: Option<Instant>,
    /// It took a task, in this session or one before a recycle: an architect pulls what comes
    /// after its brief.
    briefed: bool,
    /// When a task was last queued for it.
    last_queued: Option<Instant>,
    /// The dialog on its screen asked of its lead, while the session is blocked on it.
    dialog: Option<OpenDialog>,
    /// Since when (Unix ms) it has stalled, while it has (the stall watchdog).
    stalled_since: Option<i64>,
    /// Its own workspace (its profile's `workspace`), where it runs.
    workspace: Option<PathBuf>,
    /// Its owner, the lead that spawned it, by name and host (the roster shows it).
    owner: LeadRef,
    /// The leads it is shared with: they may send it tasks.
    shared: Vec<LeadRef>,
}

impl PaneSession {
    /// A session being spawned for `entity` with `profile`, to work in `cwd`, owned by `owner`
    /// and shared with `shared`.
    pub fn spawning(
        entity: Entity,
        profile: Arc<ProfileConfig>,
        cwd: PathBuf,
        owner: LeadRef,
        shared: Vec<LeadRef>,
    ) -> PaneSession {
        PaneSession {
            entity,
            profile,
            status: WorkerStatus::Spawning,
            pane: None,
            cwd,
            idle_since: None,
            tasks_started: 0,
            current: None,
            polls: 0,
            open_calls: 0,
            claiming: false,
            claim_missed: false,
            activity: watch::channel(0).0,
            kick: watch::channel(0).0,
            last_seen_ms: None,
            last_words: None,
            host_agent: None,
            ready_early: false,
            last_nudge: None,
            briefed: false,
            last_queued: None,
            dialog: None,
            stalled_since: None,
            workspace: None,
            owner,
            shared,
        }
    }

    /// Who.
    pub fn entity(&self) -> &Entity {
        &self.entity
    }

    /// Its profile.
    pub fn profile(&self) -> &Arc<ProfileConfig> {
        &self.profile
    }

    /// Where it is in its life.
    pub fn status(&self) -> WorkerStatus {
        self.status
    }

    /// Its pane, once spawned.
    pub fn pane(&self) -> Option<&PaneId> {
        self.pane.as_ref()
    }

    /// Its working directory.
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// Its own workspace, when its profile makes one.
    pub fn workspace(&self) -> Option<&Path> {
        self.workspace.as_deref()
    }

    /// The task in flight.
    pub fn current(&self) -> Option<&Message> {
        self.current.as_ref()
    }

    /// How many tasks this session was handed so far.
    pub fn tasks_started(&self) -> u64 {
        self.tasks_started
    }

    /// How many of its fleet calls are open now.
    pub fn open_calls(&self) -> usize {
        self.open_calls
    }

    /// Whether the pump or a poll holds the claim on its queue.
    pub fn claiming(&self) -> bool {
        self.claiming
    }

    /// When it last called in (Unix ms).
    pub fn last_seen_ms(&self) -> Option<i64> {
        self.last_seen_ms
    }

    /// The end of its screen when its program exited.
    pub fn last_words(&self) -> Option<&str> {
        self.last_words.as_deref()
    }

    /// The agent the pane host sees in its pane, and what it is doing.
    pub fn host_agent(&self) -> Option<&(String, AgentState)> {
        self.host_agent.as_ref()
    }

    /// The dialog asked of its lead, while it is open.
    pub fn dialog(&self) -> Option<&OpenDialog> {
        self.dialog.as_ref()
    }

    /// The open dialog, to be marked (being answered, say).
    pub fn dialog_mut(&mut self) -> Option<&mut OpenDialog> {
        self.dialog.as_mut()
    }

    /// Since when (Unix ms) it has stalled, while it has.
    pub fn stalled_since(&self) -> Option<i64> {
        self.stalled_since
    }

    /// When it was last nudged to pull what waits for it.
    pub fn last_nudge(&self) -> Option<Instant> {
        self.last_nudge
    }

    /// When a task was last queued for it.
    pub fn last_queued(&self) -> Option<Instant> {
        self.last_queued
    }

    /// How long it has been idle at `now`, while it is.
    pub fn idle_for(&self, now: Instant) -> Option<std::time::Duration> {
        self.idle_since
            .map(|since| now.saturating_duration_since(since))
    }

    /// Its owner.
    pub fn owner(&self) -> &LeadRef {
        &self.owner
    }

    /// The leads it is shared with.
    pub fn shared(&self) -> &[LeadRef] {
        &self.shared
    }

    /// A receiver that ticks on every call it makes.
    pub fn activity(&self) -> watch::Receiver<u64> {
        self.activity.subscribe()
    }

    /// A receiver that ticks whenever the pump or the readiness gate should look again.
    pub fn kicks(&self) -> watch::Receiver<u64> {
        self.kick.subscribe()
    }

    /// Whose it is.
    pub fn owned(&self) -> Owned<'_> {
        Owned {
            owner: self.entity.parent,
            shared: &self.shared,
        }
    }

    /// Whether `who` may do `action` to it.
    pub fn allows(&self, who: Principal<'_>, action: Action) -> bool {
        may(who, action, self.owned())
    }

    /// Applies a session event now, logging the transition.
    pub fn apply(&mut self, event: SessionEvent) -> Result<WorkerStatus, FleetError> {
        self.apply_at(event, Instant::now())
    }

    /// Applies a session event at `now`, logging the transition.
    fn apply_at(&mut self, event: SessionEvent, now: Instant) -> Result<WorkerStatus, FleetError> {
        let next = self.status.on(event)?;
        tracing::info!(gid = %self.entity.gid, name = %self.entity.name, from = %self.status, to = %next, ?event, "session");
        self.status = next;
        if event == SessionEvent::TaskStarted {
            self.tasks_started += 1;
            self.last_nudge = None;
            self.briefed = true;
        }
        self.idle_since = (next == WorkerStatus::Idle).then_some(now);
        if next != WorkerStatus::Busy {
            // Only a busy session stalls.
            self.stalled_since = None;
        }
        self.kick();
        Ok(next)
    }

    /// Notes a call of its own: it was seen now (`now_ms`), an acting call ticks its activity
    /// (the injector's proof of a submit), and a spawning session whose profile takes any call
    /// as its sign of readiness may turn ready. Returns whether it did; `None` if it is not
    /// live.
    pub fn called_in(&mut self, acting: bool, now_ms: i64) -> Option<bool> {
        if !self.status.is_live() {
            return None;
        }
        self.last_seen_ms = Some(now_ms);
        if acting {
            self.activity.send_modify(|v| *v = v.wrapping_add(1));
        }
        Some(self.profile.ready_call() == ReadyCall::Any && self.signal_ready())
    }

    /// Notes that it listed fleetd's tools; returns whether that made it ready.
    pub fn listed_tools(&mut self) -> bool {
        self.profile.ready_call() != ReadyCall::None && self.signal_ready()
    }

    /// The worker's own sign of readiness (a call-in, or listing the tools): a spawning session
    /// turns idle now if its pane is known, else as soon as it is — a task must never be
    /// handed to a session that has no pane to type it into. Returns whether it turned idle.
    fn signal_ready(&mut self) -> bool {
        if self.status != WorkerStatus::Spawning {
            return false;
        }
        if self.pane.is_none() {
            self.ready_early = true;
            return false;
        }
        self.apply(SessionEvent::Ready).is_ok()
    }

    /// Forgets a sign of readiness given before now: a new session's readiness counts from its
    /// new token on.
    pub fn forget_early_readiness(&mut self) {
        self.ready_early = false;
    }

    /// Records the session's new pane; a worker that already signalled readiness turns idle.
    /// Returns whether it did.
    pub fn pane_opened(&mut self, pane: PaneId) -> bool {
        self.pane = Some(pane);
        std::mem::take(&mut self.ready_early)
            && self.status == WorkerStatus::Spawning
            && self.apply(SessionEvent::Ready).is_ok()
    }

    /// Starts a fresh session of the same worker (a recycle): no task counted yet, not seen
    /// yet, its pane given up (returned, to be closed).
    pub fn start_afresh(&mut self) -> Option<PaneId> {
        self.tasks_started = 0;
        self.last_seen_ms = None;
        self.pane.take()
    }

    /// Makes `dir`, its own workspace, where it works, while it is still spawning; returns
    /// whether it was.
    pub fn work_in(&mut self, dir: &Path) -> bool {
        if self.status != WorkerStatus::Spawning {
            return false;
        }
        self.cwd = dir.to_path_buf();
        self.workspace = Some(dir.to_path_buf());
        true
    }

    /// Whether what is queued for it waits for its own `fleet_poll` (an architect past its
    /// brief) instead of being typed in.
    pub fn pulls(&self) -> bool {
        handover(self.entity.role, self.briefed) == Handover::Nudge
    }

    /// Whether the session took as many tasks as its profile allows, and must be recycled
    /// before it takes another.
    pub fn cap_reached(&self) -> bool {
        self.profile
            .context_cap
            .is_some_and(|cap| self.tasks_started >= cap)
    }

    /// What decides whether the session takes a task now (`host_down`: the pane host cannot
    /// be reached).
    pub fn gate(&self, host_down: bool) -> TaskGate {
        TaskGate {
            status: self.status,
            cap_reached: self.cap_reached(),
            polls_open: self.polls,
            agent_busy: matches!(
                self.host_agent,
                Some((_, AgentState::Working | AgentState::Blocked))
            ),
            host_down,
        }
    }

    /// Wakes the pump and the readiness gate.
    pub fn kick(&self) {
        self.kick.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Takes the claim on its queue if no one holds it and `free` (the rule lets this taker
    /// hand it a task now); returns whether it did. A claimant turned away because the claim
    /// is held is woken when it is let go.
    pub fn claim(&mut self, free: bool) -> bool {
        if self.claiming {
            // Whoever holds the claim must wake the others when it lets go: something may have
            // arrived that this claimant came for.
            self.claim_missed = true;
            return false;
        }
        self.claiming = free;
        free
    }

    /// Gives up a claim that found nothing to take, waking the pump and polls only if another
    /// claimant was turned away meanwhile (waking them always would wake the pump itself, and
    /// it would look at its empty queue again and again).
    pub fn unclaim(&mut self) {
        self.claiming = false;
        if std::mem::take(&mut self.claim_missed) {
            self.kick();
        }
    }

    /// Makes `task` its task in flight (idle → busy), letting go of the claim; an error if it
    /// cannot take a task now.
    pub fn start_task(&mut self, task: Message) -> Result<(), FleetError> {
        self.claiming = false;
        self.claim_missed = false;
        self.apply(SessionEvent::TaskStarted)?;
        self.current = Some(task);
        Ok(())
    }

    /// Takes its task in flight out of flight if that is `answered`.
    pub fn take_current(&mut self, answered: MsgId) -> Option<Message> {
        if self.current.as_ref().is_some_and(|m| m.msg_id == answered) {
            self.current.take()
        } else {
            None
        }
    }

    /// Puts back in flight a task taken by [`PaneSession::take_current`], unless another took
    /// its place meanwhile.
    pub fn restore_current(&mut self, task: Message) {
        if self.current.is_none() {
            self.current = Some(task);
        }
    }

    /// Ends its turn: it is idle again and its next task may go in.
    pub fn end_turn(&mut self) -> Result<WorkerStatus, FleetError> {
        self.apply(SessionEvent::TurnDone)
    }

    /// Ends the turn of task `msg_id` if that is its task in flight (a task never typed in, or
    /// one its dialog or its stall ended): the task leaves flight and is returned.
    pub fn end_turn_of(&mut self, msg_id: MsgId) -> Option<Message> {
        let task = self.take_current(msg_id)?;
        // A turn already over (a stop) keeps its status.
        let _ = self.end_turn();
        Some(task)
    }

    /// Ends the session: its program is gone. Returns its task in flight, if any.
    pub fn exited(&mut self) -> Option<Message> {
        if self.status != WorkerStatus::Stopping {
            let _ = self.apply(SessionEvent::Stop);
        }
        let _ = self.apply(SessionEvent::Exited);
        self.current.take()
    }

    /// Notes one of its fleet calls opened (`poll`: a `fleet_poll`, through which its tasks
    /// then go).
    pub fn call_opened(&mut self, poll: bool) {
        self.open_calls += 1;
        if poll {
            self.polls += 1;
        }
    }

    /// Notes one of its fleet calls over; a poll's end wakes the pump (tasks go by the
    /// keyboard again).
    pub fn call_closed(&mut self, poll: bool) {
        self.open_calls = self.open_calls.saturating_sub(1);
        if poll {
            self.polls = self.polls.saturating_sub(1);
            self.kick();
        }
    }

    /// Notes that it was nudged at `now` to pull what waits for it.
    pub fn nudged(&mut self, now: Instant) {
        self.last_nudge = Some(now);
    }

    /// Notes that a task was queued for it at `now`.
    pub fn queued(&mut self, now: Instant) {
        self.last_queued = Some(now);
    }

    /// Records what the pane host sees of the agent in its pane; a change wakes the pump (the
    /// agent may have become free for a task). Returns whether it changed.
    pub fn agent_seen(&mut self, agent: Option<(String, AgentState)>) -> bool {
        if self.host_agent == agent {
            return false;
        }
        self.host_agent = agent;
        self.kick();
        true
    }

    /// Keeps the end of its screen as its program exited.
    pub fn last_words_were(&mut self, words: String) {
        self.last_words = Some(words);
    }

    /// Notes that it stalled at `at_ms` (Unix ms).
    pub fn stalled_at(&mut self, at_ms: i64) {
        self.stalled_since = Some(at_ms);
    }

    /// Notes that it moves again.
    pub fn moves_again(&mut self) {
        self.stalled_since = None;
    }

    /// Notes the dialog asked of its lead.
    pub fn dialog_asked(&mut self, dialog: OpenDialog) {
        self.dialog = Some(dialog);
    }

    /// Ends its open dialog, returning it: a session blocked on it is busy again.
    pub fn dialog_over(&mut self) -> Option<OpenDialog> {
        if self.status == WorkerStatus::Blocked {
            let _ = self.apply(SessionEvent::DialogGone);
        }
        self.dialog.take()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fleet_core::{Gid, TraceId};

    use super::super::testing::{alice, worker_session};
    use super::*;
    use crate::config::ProfileKind;

    /// A worker's session of a plain command's profile (any call-in makes it ready), capped at
    /// `cap` tasks.
    fn session(cap: Option<u64>) -> PaneSession {
        let mut profile = ProfileConfig::command("sim", vec!["sim".into()]);
        profile.context_cap = cap;
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
        assert_eq!(s.start_afresh(), Some(PaneId("%1".into())));
        assert!(!s.cap_reached());
        assert_eq!(s.pane(), None);
        assert_eq!(s.last_seen_ms(), None);
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

    #[test]
    fn a_dialog_over_makes_a_blocked_worker_busy_again() {
        let mut s = idle();
        s.start_task(task("t")).unwrap();
        s.apply(SessionEvent::DialogShown).unwrap();
        s.dialog_asked(OpenDialog {
            question: AskView {
                turn_id: "dlg-1".into(),
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
        });
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
}
