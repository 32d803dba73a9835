//! What happens to a session, each change a method named for what happened: events applied,
//! call-ins and readiness, the claim on its queue, the task in flight and its turn's end, its
//! calls, its dialog and its stall.

use std::path::Path;
use std::sync::Arc;

use fleet_core::delivery::{Handover, TaskGate, handover};
use fleet_core::{ErrorCode, FleetError, Message, MsgId, SessionEvent, WorkerStatus};
use fleet_mux::{AgentState, PaneId};
use tokio::time::Instant;

use super::{OpenDialog, PaneSession};
use crate::config::ReadyCall;

impl PaneSession {
    /// Applies a session event now, logging the transition.
    pub fn apply(&mut self, event: SessionEvent) -> Result<WorkerStatus, FleetError> {
        self.apply_at(event, Instant::now())
    }

    /// Applies a session event at `now`, logging the transition.
    pub(super) fn apply_at(
        &mut self,
        event: SessionEvent,
        now: Instant,
    ) -> Result<WorkerStatus, FleetError> {
        let next = self.status.on(event)?;
        tracing::info!(gid = %self.entity.gid, name = %self.entity.name, from = %self.status, to = %next, ?event, "session");
        self.status = next;
        self.tell();
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
        if self.blocked_at_start() {
            // Its start dialog is still up: a task would be typed into it. Ready once it goes.
            self.ready_early = true;
            return false;
        }
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
    /// yet, its pane given up (returned, to be closed), and run as its profile says now (the
    /// sandbox and role a restart's profile gives a worker taken back may not be the ones it
    /// was spawned with).
    pub fn start_afresh(&mut self) -> Option<PaneId> {
        self.tasks_started = 0;
        self.last_seen_ms = None;
        let entity = Arc::make_mut(&mut self.entity);
        entity.sandbox = self.profile.sandbox();
        entity.profile_role.clone_from(&self.profile.role);
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
            arriving: self.arriving,
        }
    }

    /// A brief from another host is being queued for it, its acknowledgement on the way:
    /// nothing of its queue is handed over until [`PaneSession::arrived`].
    pub fn arriving(&mut self) {
        self.arriving += 1;
    }

    /// A brief [`PaneSession::arriving`] is settled with the broker (queued for good, or
    /// failed): its queue goes on.
    pub fn arrived(&mut self) {
        self.arriving = self.arriving.saturating_sub(1);
        self.kick();
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
    /// cannot take a task now: one that says its worker is gone if its session is ending (the
    /// reason a task taken for it meanwhile fails with, as its sender reads it).
    pub fn start_task(&mut self, task: Message) -> Result<(), FleetError> {
        self.claiming = false;
        self.claim_missed = false;
        if !self.status.is_live() {
            return Err(FleetError::new(
                ErrorCode::Gone,
                format!("'{}' is gone", self.entity.name),
            ));
        }
        self.apply(SessionEvent::TaskStarted)?;
        self.current = Some(task);
        self.to_type = false;
        Ok(())
    }

    /// Makes `task` its task in flight as [`PaneSession::start_task`] does, left for its pump
    /// to type in ([`PaneSession::take_to_type`]): a task taken as it was accepted.
    pub fn start_task_for_pump(&mut self, task: Message) -> Result<(), FleetError> {
        self.start_task(task)?;
        self.to_type = true;
        Ok(())
    }

    /// Its task in flight, once, if it was left for its pump to type in and is still in flight
    /// (a session stopping meanwhile gets nothing typed in: its end fails the task).
    pub fn take_to_type(&mut self) -> Option<Message> {
        if std::mem::take(&mut self.to_type) && self.status.is_live() {
            self.current.clone()
        } else {
            None
        }
    }

    /// Whether `msg_id` is its task in flight, still waiting for its pump to type it in (its
    /// worker has not seen it: it has nothing of it to answer).
    pub fn awaits_typing(&self, msg_id: MsgId) -> bool {
        self.to_type && self.current.as_ref().is_some_and(|m| m.msg_id == msg_id)
    }

    /// Notes that its delivery pump was started.
    pub fn pump_started(&mut self) {
        self.pumped = true;
    }

    /// Whether its delivery pump was started.
    pub fn pumped(&self) -> bool {
        self.pumped
    }

    /// Takes its task in flight out of flight if that is `answered`.
    pub fn take_current(&mut self, answered: MsgId) -> Option<Message> {
        if self.current.as_ref().is_some_and(|m| m.msg_id == answered) {
            self.to_type = false;
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
        self.to_type = false;
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

    /// Ends its open dialog, returning it: a session blocked on it is busy again, or, on one
    /// its program showed while starting, starting again (ready at once if it signalled
    /// readiness meanwhile).
    pub fn dialog_over(&mut self) -> Option<OpenDialog> {
        if self.blocked_at_start() {
            let _ = self.apply(SessionEvent::StartDialogGone);
            if std::mem::take(&mut self.ready_early) && self.pane.is_some() {
                let _ = self.apply(SessionEvent::Ready);
            }
        } else if self.status == WorkerStatus::Blocked {
            let _ = self.apply(SessionEvent::DialogGone);
        }
        self.dialog.take()
    }
}
