//! The delivery pump: one task per pane-bound entity that types its queued messages into its
//! pane, one at a time, only while it is idle.
//!
//! Forward path, at-most-once: a brief is taken off the queue (`injecting`) *before* it is
//! typed, so a crash in between never types it twice: the restart reads off the worker's pane
//! what became of it (`adoption.rs`, [`fleet_mux::interrupted`]) and fails it, telling the
//! sender, only where the pane cannot tell.
//!
//! An architect gets only its brief typed in: what comes for it later stays queued for its own
//! `fleet_poll`, and the pump types a nudge saying so instead (see
//! [`fleet_core::delivery::handover`]).

use std::sync::Arc;
use std::time::Duration;

use fleet_core::clock::now_ms;
use fleet_core::delivery::{Taker, WAITED_TOO_LONG};
use fleet_core::lifecycle::{nudge_line, nudge_wait};
use fleet_core::{FleetError, Gid, Message, MsgState};
use fleet_mux::inject::{InjectOutcome, Reached, Steps, inject, inject_noting};
use tokio::time::Instant;
use tracing::Instrument;

use super::LocalPlane;
use super::typing::{inject_options, typed_text};
use crate::logs::{self, message_span};
use crate::metrics::InjectEnd;

/// How long the pump waits before looking at its queue again after the store failed.
const STORE_RETRY: Duration = Duration::from_secs(1);
/// What the pump does next.
enum Step {
    /// Look again at once.
    Again,
    /// Nothing to do until kicked.
    Wait,
    /// Look again after this long (or a kick).
    Later(Duration),
    /// The session is over.
    Done,
}

/// What [`LocalPlane::dequeue`] took off a queue.
pub(super) enum Taken {
    /// The next task, to be handed over.
    Task(Message),
    /// A task past its expiry, failed to its sender.
    Expired,
    /// Nothing was queued.
    Nothing,
}

/// The typing of one task, noted in the store step by step ([`fleet_mux::inject::Steps`]).
struct Noted<'a> {
    plane: &'a LocalPlane,
    msg_id: fleet_core::MsgId,
    trace_id: fleet_core::TraceId,
    /// The Enter under the task was noted going in.
    entered: std::sync::atomic::AtomicBool,
}

impl Noted<'_> {
    /// Notes `step` (true: the Enter, false: the first key) going in; false if it may not go:
    /// the task is no longer being typed (failed before its Enter, as its session or its turn
    /// ended), or the store failed.
    async fn note(&self, enter: bool) -> bool {
        let (msg_id, trace_id) = (self.msg_id, self.trace_id);
        let noted = self
            .plane
            .db
            .run(move |s| {
                if enter {
                    s.enter_sent(msg_id)
                } else {
                    s.keys_sent(msg_id)
                }
            })
            .await;
        match noted {
            Ok(going) => going,
            Err(e) => {
                tracing::error!(%trace_id, %msg_id, enter, error = %e, "cannot note a step of typing a task: withheld");
                false
            }
        }
    }
}

impl Steps for Noted<'_> {
    async fn keys_going(&self) -> bool {
        self.note(false).await
    }
    async fn enter_going(&self) -> bool {
        let going = self.note(true).await;
        self.entered
            .store(going, std::sync::atomic::Ordering::Relaxed);
        going
    }
    fn reached(&self, step: Reached) {
        crate::logs::step(self.msg_id, step.as_str());
    }
}

impl LocalPlane {
    /// Starts the pump of `gid`.
    pub(super) fn start_pump(self: &Arc<Self>, gid: Gid) {
        let gateway = Arc::clone(self);
        let name = {
            let mut sessions = self.sessions.lock();
            if let Some(session) = sessions.panes.get_mut(&gid) {
                session.pump_started();
            }
            sessions.pane_name(gid)
        };
        let span = crate::logs::session_task_span(gid, &name);
        self.tasks
            .spawn(async move { gateway.pump(gid).await }.instrument(span));
    }

    async fn pump(self: Arc<Self>, gid: Gid) {
        let Some(mut kick) = self.sessions.lock().panes.get(&gid).map(|s| s.kicks()) else {
            return;
        };
        let reporter = self.start_reporter(gid);
        loop {
            kick.borrow_and_update();
            // A task taken as it was accepted (`straight.rs`) is typed in before anything else:
            // its status is told the pane host once it is, as the pump's own task's is.
            if let Some(task) = self.left_to_type(gid) {
                let span = message_span(&task);
                self.type_task(gid, task).instrument(span).await;
                continue;
            }
            self.report_status(gid, &reporter);
            let nap = match self.pump_step(gid).await {
                Step::Again => continue,
                Step::Wait => None,
                Step::Later(after) => Some(after),
                Step::Done => return,
            };
            let retry = async {
                match nap {
                    Some(after) => tokio::time::sleep(after).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = kick.changed() => if changed.is_err() { return },
                () = retry => {}
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    async fn pump_step(self: &Arc<Self>, gid: Gid) -> Step {
        match self.sessions.lock().panes.get(&gid) {
            Some(s) if s.status().is_live() => {}
            _ => return Step::Done,
        }
        // An open poll takes tasks itself; otherwise only an idle worker gets one.
        if !self.claim(gid, false) {
            return Step::Wait;
        }
        let pulls = self
            .sessions
            .lock()
            .panes
            .get(&gid)
            .is_some_and(|s| s.pulls());
        if pulls {
            // Nothing is taken off the queue: its own poll takes it.
            self.unclaim(gid);
            return self.nudge_to_pull(gid).await;
        }
        let task = match self.dequeue(gid, MsgState::Injecting).await {
            Ok(Taken::Task(task)) => {
                crate::logs::step(task.msg_id, "claimed");
                task
            }
            Ok(Taken::Expired) => {
                self.unclaim(gid);
                return Step::Again;
            }
            Ok(Taken::Nothing) => {
                self.unclaim(gid);
                return Step::Wait;
            }
            Err(e) => {
                self.unclaim(gid);
                tracing::error!(%gid, error = %e, "cannot read the queue");
                return Step::Later(STORE_RETRY);
            }
        };
        if self.start_task(gid, task.clone(), false).await {
            let span = message_span(&task);
            self.type_task(gid, task).instrument(span).await;
        }
        Step::Again
    }

    /// Takes `gid`'s next queued task off its queue into state `next`: the one place a task
    /// leaves a queue. One whose expiry passed while it waited there (a brief from another
    /// host behind another task) is failed to its sender instead, never handed over; the
    /// caller looks again, the worker's state checked afresh (failing it took time).
    pub(super) async fn dequeue(
        self: &Arc<Self>,
        gid: Gid,
        next: MsgState,
    ) -> Result<Taken, FleetError> {
        let Some(task) = self.db.run(move |s| s.dequeue(gid, &next)).await? else {
            return Ok(Taken::Nothing);
        };
        if !task.expired(now_ms()) {
            return Ok(Taken::Task(task));
        }
        self.fail(&task, WAITED_TOO_LONG).await;
        Ok(Taken::Expired)
    }

    /// For an entity that pulls its tasks (an architect past its brief), idle with nothing in
    /// flight: types the nudge into its pane when messages wait for it, at most once per
    /// `architects.nudge_interval_s` until it takes one.
    async fn nudge_to_pull(self: &Arc<Self>, gid: Gid) -> Step {
        let interval = Duration::from_secs(self.config.architects.nudge_interval_s);
        let found = self.sessions.lock().panes.get(&gid).map(|s| {
            (
                s.last_nudge().map(|at| at.elapsed()),
                s.pane().cloned(),
                Arc::clone(s.profile()),
                s.activity(),
            )
        });
        let Some((since_last, Some(pane), profile, mut activity)) = found else {
            return Step::Wait;
        };
        // Not in a call: the pump only gets here for an idle entity with no poll open.
        if let Some(wait) = nudge_wait(0, since_last, interval, interval) {
            return Step::Later(wait);
        }
        let count = match self.db.run(move |s| s.waiting_count(gid)).await {
            Ok(0) => return Step::Wait,
            Ok(count) => count,
            Err(e) => {
                tracing::error!(%gid, error = %e, "cannot count what waits to be pulled");
                return Step::Later(STORE_RETRY);
            }
        };
        if let Some(session) = self.sessions.lock().panes.get_mut(&gid) {
            session.nudged(Instant::now());
        }
        let options = inject_options(&profile, false);
        let line = nudge_line(count);
        match inject(self.panes.as_ref(), &pane, &line, &options, &mut activity).await {
            Ok(InjectOutcome::Submitted { .. }) => {
                self.metrics.nudged("architect");
                tracing::info!(%gid, count, "nudged to pull what waits");
            }
            Ok(outcome) => {
                tracing::warn!(%gid, count, ?outcome, "a nudge to pull was not submitted; trying again after the interval");
            }
            Err(e) => {
                tracing::warn!(%gid, count, error = %logs::mux_error(&e), "cannot nudge to pull")
            }
        }
        Step::Later(interval)
    }

    /// Returns once `gid`'s session can take a task, or is gone (when a brief fails as any
    /// other would).
    pub(super) async fn until_injectable(&self, gid: Gid) {
        let Some(mut kick) = self.sessions.lock().panes.get(&gid).map(|s| s.kicks()) else {
            return;
        };
        loop {
            kick.borrow_and_update();
            let ready = {
                let sessions = self.sessions.lock();
                match sessions.panes.get(&gid) {
                    Some(s) if s.status().is_live() => sessions.may_take_task(gid, Taker::Broker),
                    _ => true,
                }
            };
            if ready || kick.changed().await.is_err() {
                return;
            }
        }
    }

    /// Claims the right to take `gid`'s next task off its queue: only while no one else holds
    /// the claim and the rule ([`fleet_core::delivery::may_take_task`]) lets this taker hand it
    /// a task (idle, under its cap, its agent not busy by the pane host's account unless it is
    /// in its own poll, the pane host up; for the pump, `by_poll` false, no poll open to take
    /// it instead).
    /// [`LocalPlane::start_task`] or [`LocalPlane::unclaim`] releases it.
    pub(super) fn claim(&self, gid: Gid, by_poll: bool) -> bool {
        let mut sessions = self.sessions.lock();
        if sessions.host_down.is_some() {
            return false;
        }
        let taker = if by_poll { Taker::Poll } else { Taker::Pump };
        let free = sessions.may_take_task(gid, taker);
        let Some(s) = sessions.panes.get_mut(&gid) else {
            return false;
        };
        s.claim(free)
    }

    /// Gives up a claim that found nothing to take, waking the pump and polls only if another
    /// claimant was turned away meanwhile (waking them always would wake the pump itself, and
    /// it would look at its empty queue again and again).
    pub(super) fn unclaim(&self, gid: Gid) {
        if let Some(session) = self.sessions.lock().panes.get_mut(&gid) {
            session.unclaim();
        }
    }

    /// Makes `task` the session's task in flight (idle → busy), releasing the claim, and with
    /// `for_pump` left for its pump to type in. If the session can no longer take it, fails
    /// the task and tells its sender; returns whether it was taken.
    pub(super) async fn start_task(
        self: &Arc<Self>,
        gid: Gid,
        task: Message,
        for_pump: bool,
    ) -> bool {
        let refused = {
            let mut sessions = self.sessions.lock();
            let started = |session: &mut super::session::PaneSession| match for_pump {
                true => session.start_task_for_pump(task.clone()),
                false => session.start_task(task.clone()),
            };
            match sessions.panes.get_mut(&gid) {
                Some(session) => started(session).err().map(|e| e.message),
                None => Some("the recipient is gone".to_string()),
            }
        };
        match refused {
            None => true,
            Some(reason) => {
                self.fail(&task, &reason).await;
                false
            }
        }
    }

    /// Types `task` into the pane of `gid` and records how it went.
    async fn type_task(self: &Arc<Self>, gid: Gid, task: Message) {
        let found = self.sessions.lock().panes.get(&gid).map(|s| {
            (
                s.pane().cloned(),
                Arc::clone(s.profile()),
                s.activity(),
                s.tasks_started(),
            )
        });
        // Gone: the end of its session fails what it held.
        let Some((pane, profile, mut activity, tasks_started)) = found else {
            return;
        };
        let from_name = self.name_of(task.from).await;
        // The session's first task (a recycled session counts afresh).
        let options = inject_options(&profile, tasks_started == 1);
        let (trace_id, msg_id) = (task.trace_id, task.msg_id);
        // The last gate before keys.
        let text = match typed_text(&task, &from_name, &profile) {
            Ok(text) => text,
            Err(why) => {
                tracing::error!(%trace_id, %msg_id, %gid, why, "REFUSED to type a task");
                self.untyped(gid, &task, &format!("refused: {why}")).await;
                return;
            }
        };
        let Some(pane) = pane else {
            // Cannot happen (a session turns ready only once its pane is known); loud if it does.
            tracing::error!(%trace_id, %msg_id, %gid, "a task for a session without a pane");
            self.untyped(gid, &task, "its session has no pane to type into")
                .await;
            return;
        };
        let started = Instant::now();
        // A restart that finds the task still `injecting` knows how far it got.
        let steps = Noted {
            plane: self,
            msg_id,
            trace_id,
            entered: false.into(),
        };
        let outcome = inject_noting(
            self.panes.as_ref(),
            &pane,
            &text,
            &options,
            &mut activity,
            &steps,
        )
        .await;
        let entered = steps.entered.into_inner();
        self.record_typing(gid, &task, outcome, started, entered)
            .await;
    }

    /// Records how typing `task` into `gid`'s pane (begun at `started`; its Enter gone in
    /// when `entered`) went: `injected`, or failed to its sender.
    async fn record_typing(
        self: &Arc<Self>,
        gid: Gid,
        task: &Message,
        outcome: Result<InjectOutcome, fleet_mux::MuxError>,
        started: Instant,
        entered: bool,
    ) {
        let (trace_id, msg_id) = (task.trace_id, task.msg_id);
        let end = match &outcome {
            Ok(InjectOutcome::Submitted { retried: false }) => InjectEnd::Submitted,
            Ok(InjectOutcome::Submitted { retried: true }) => InjectEnd::Retried,
            Ok(InjectOutcome::NotSubmitted) => InjectEnd::NotSubmitted,
            Ok(InjectOutcome::InputNotEmpty) => InjectEnd::InputNotEmpty,
            Ok(InjectOutcome::Withheld) => InjectEnd::StoreError,
            Err(_) => InjectEnd::PaneHostError,
        };
        self.metrics.injected(end, started.elapsed());
        let failure = match outcome {
            Ok(InjectOutcome::Submitted { retried }) => {
                tracing::info!(%trace_id, %msg_id, %gid, retried, "injected");
                let injected = self
                    .db
                    .run(move |s| s.transition(msg_id, &MsgState::Injected))
                    .await;
                if injected.is_ok() {
                    crate::logs::step(msg_id, "injected_recorded");
                }
                if let Some(afar) = self.afar_of(task) {
                    afar.injected(self, task).await;
                }
                injected.err().map(|e| e.message)
            }
            Ok(InjectOutcome::NotSubmitted) => Some("not submitted".to_string()),
            Ok(InjectOutcome::InputNotEmpty) => Some(
                "not typed: the worker's input box was not empty (a failed submit or a draft is in it)"
                    .to_string(),
            ),
            Ok(InjectOutcome::Withheld) => Some(
                "not submitted: fleetd could not note in its store how far it got typing it"
                    .to_string(),
            ),
            // Its program ended as the task went in, and the end of its session closed the pane
            // (its sender was told so then).
            Err(fleet_mux::MuxError::NoPane(_)) if entered => Some(format!(
                "'{}' ended before replying (its pane closed as its task went in)",
                self.sessions.lock().pane_name(gid)
            )),
            Err(e) => Some(format!("pane host: {e}")),
        };
        if let Some(reason) = failure {
            self.untyped(gid, task, &reason).await;
        }
    }

    /// Fails `task`, which never reached `gid`: its turn is over before it began.
    async fn untyped(self: &Arc<Self>, gid: Gid, task: &Message, reason: &str) {
        self.fail(task, reason).await;
        if let Some(session) = self.sessions.lock().panes.get_mut(&gid) {
            session.end_turn_of(task.msg_id);
        }
    }

    /// Fails `task`, taken out of flight because its turn ended without an answer (a dialog's
    /// choice ended it, or it stalled), and tells its sender `reason`. A task whose Enter has
    /// not gone in yet (its pump may be typing it this moment) is failed in the store too, so
    /// what is left of its keys is withheld and a restart does not put it back in the queue; one
    /// whose Enter went is left for its typing to record.
    pub(super) async fn turn_failed(self: &Arc<Self>, task: &Message, reason: &str) {
        let (msg_id, why) = (task.msg_id, reason.to_string());
        match self.db.run(move |s| s.fail_untyped(msg_id, &why)).await {
            Ok(true) => {
                tracing::info!(%msg_id, "its turn ended before its Enter went in: failed, the rest of its keys withheld");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%msg_id, error = %e, "a task whose turn ended is not failed in the store: its typing goes on, and a restart may put it back in the queue");
            }
        }
        self.notify_failed(task, reason).await;
    }
}
