//! Mid-turn asks (U2 on one host): a worker's `fleet_ask` blocks while its question surfaces
//! on its lead's open `fleet_send` or `fleet_poll` (with a `turn_id`); the lead answers with
//! `fleet_send{turn_id}`, and the worker's call returns the answer.
//!
//! Asks are live only: nothing about them is stored. With no lead waiting in a fleet call the
//! ask fails at once (`no_waiter`); an answer after the ask is over (answered, timed out, given
//! up) is not delivered and the lead hears `too_late`. An answer only ever travels back through
//! the worker's blocked call, so it can never be typed into a later, unrelated turn.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::asks::{AskTable, listens_for, whom_to_ask};
use fleet_core::authz::{Tool, check_tool};
use fleet_core::clock::now_ms;
use fleet_core::message::check_size;
use fleet_core::{ErrorCode, FleetError, Gid, Kind, Message, MsgId, SessionEvent, WorkerStatus};
use tokio::sync::oneshot;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::views::{AskResult, AskView, SendResult};
use super::{Caller, LocalPlane};

/// How long past its asker's wait an ask to another host is good for (seconds).
const ASK_GRACE_S: u64 = 5;

/// The open asks of this gateway.
pub(super) type Asks = AskTable<Waiter>;

/// Where an ask's answer goes.
pub(super) enum Waiter {
    /// To the asking call (a worker's `fleet_ask` here; for an ask from another host, what
    /// sends the answer back there), or why there is none.
    Call(oneshot::Sender<Result<String, FleetError>>),
    /// Into the pane of a worker here whose screen shows a dialog: the choice's key is pressed.
    Screen,
}

/// Ends an ask however its call ends (answered, timed out, cancelled): the worker is back to
/// work, and a later answer hears `too_late`.
struct AskGuard {
    gateway: Arc<LocalPlane>,
    worker: Gid,
    turn_id: String,
    /// For an ask of a lead on another host: the ask's message, to tell that lead it is over.
    remote: Option<Message>,
    /// Whether its call heard back (an answer, or that nobody waits).
    heard: bool,
}

impl Drop for AskGuard {
    fn drop(&mut self) {
        {
            let mut sessions = self.gateway.sessions.lock();
            sessions
                .asks
                .close(&self.turn_id, "the worker stopped waiting");
            if let Some(session) = sessions.panes.get_mut(&self.worker)
                && session.status() == WorkerStatus::Asking
            {
                let _ = session.apply(SessionEvent::AskEnded);
            }
        }
        // Unanswered (timed out, cancelled, its session ended): the lead on the other host
        // hears the ask is over.
        if !self.heard
            && let Some(ask) = self.remote.take()
        {
            let gateway = Arc::clone(&self.gateway);
            let turn_id = self.turn_id.clone();
            self.gateway.tasks.spawn(async move {
                if let Some(afar) = gateway.afar.as_deref() {
                    afar.ask_abandoned(&gateway, &ask, &turn_id).await;
                }
            });
        }
    }
}

impl LocalPlane {
    /// The local side of [`Gateway::ask`].
    pub(super) async fn ask(
        self: &Arc<Self>,
        caller: &Caller,
        question: String,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<AskResult, FleetError> {
        check_tool(&caller.entity, Tool::Ask)?;
        check_size(&question, self.config.gateway.max_message_bytes)?;
        let me = caller.entity.gid;
        let turn_id = format!("turn-{}", MsgId::mint());
        let (tx, rx) = oneshot::channel();
        let (to, remote_ask) = self.open_ask(caller, question, &turn_id, tx)?;
        let mut guard = AskGuard {
            gateway: Arc::clone(self),
            worker: me,
            turn_id: turn_id.clone(),
            remote: None,
            heard: false,
        };
        match remote_ask {
            // It is good for as long as the worker waits, and a little more: the lead's gateway
            // ends it then should the worker's `ABANDONED` be lost.
            Some(ask) => {
                let ttl_s = wait.as_secs().max(1) + ASK_GRACE_S;
                if let Some(afar) = self.afar.as_deref() {
                    afar.send_in_turn(self, &ask, (&turn_id, ttl_s)).await?;
                }
                guard.remote = Some(ask);
            }
            None => self.inboxes.bump(to),
        }
        tokio::select! {
            answer = rx => match answer {
                Ok(answer) => {
                    guard.heard = true;
                    answer.map(|answer| AskResult { turn_id, answer })
                }
                Err(_) => Err(FleetError::new(
                    ErrorCode::Gone,
                    "your ask ended without an answer (your session is ending)",
                )),
            },
            () = sleep(wait) => Err(FleetError::new(
                ErrorCode::Timeout,
                format!(
                    "no answer within {} s; decide yourself, and say what you decided in your fleet_reply",
                    wait.as_secs()
                ),
            )),
            () = ct.cancelled() => Err(FleetError::new(ErrorCode::Cancelled, "the ask was cancelled")),
            () = self.shutdown.cancelled() => Err(FleetError::new(
                ErrorCode::Gone,
                "fleetd is shutting down",
            )),
        }
    }

    /// Opens `caller`'s ask `turn_id` of whoever gave it its task (else its lead), answered on
    /// `tx`: the lead asked, and what goes to it when it is on another host. Refused when
    /// nobody can answer: no lead here or elsewhere, or one that is not waiting for the caller.
    fn open_ask(
        &self,
        caller: &Caller,
        question: String,
        turn_id: &str,
        tx: oneshot::Sender<Result<String, FleetError>>,
    ) -> Result<(Gid, Option<Message>), FleetError> {
        let me = caller.entity.gid;
        let mut sessions = self.sessions.lock();
        let session = sessions.panes.get(&me);
        let task = session.and_then(|s| s.current().cloned());
        let to = whom_to_ask(task.as_ref().map(|t| t.from), caller.entity.parent)?;
        let remote = !sessions.is_local(to) && self.afar.as_deref().is_some();
        let lead = sessions.leads.get(&to);
        if lead.is_none() && !remote {
            return Err(FleetError::new(
                ErrorCode::NoWaiter,
                "whoever gave you this task is not a lead on this host, so nobody can answer: decide yourself, and say what you decided in your fleet_reply",
            ));
        }
        let lead_name = lead.map_or_else(|| to.to_string(), |l| l.entity().name.clone());
        // A lead on another host: its own gateway decides whether it is waiting.
        if let Some(lead) = lead
            && !listens_for(lead.listening(), me)
        {
            return Err(FleetError::new(
                ErrorCode::NoWaiter,
                format!(
                    "nobody is waiting for your question: '{lead_name}' is not waiting for you in a fleet call now. Decide yourself, and say what you decided in your fleet_reply"
                ),
            ));
        }
        // What goes to a lead on another host: the question, about the task (in its flow).
        let remote_ask = remote.then(|| {
            Message::about(
                task.as_ref(),
                Kind::Ask,
                (me, to),
                question.clone(),
                now_ms(),
            )
        });
        let question = AskView {
            turn_id: turn_id.to_string(),
            from: me,
            from_name: caller.entity.name.clone(),
            host: caller.entity.host.clone(),
            question,
            choices: None,
            in_task: task.as_ref().map(|t| t.msg_id),
            asked_ms: now_ms(),
        };
        sessions.asks.open(question, to, Waiter::Call(tx));
        if let Some(session) = sessions.panes.get_mut(&me)
            && session.status() == WorkerStatus::Busy
        {
            let _ = session.apply(SessionEvent::Asked);
        }
        tracing::info!(gid = %me, %turn_id, lead = %lead_name, remote, "asked");
        self.metrics.asked();
        Ok((to, remote_ask))
    }

    /// The local side of [`Gateway::answer`].
    pub(super) async fn answer(
        self: &Arc<Self>,
        caller: &Caller,
        turn_id: &str,
        text: String,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        check_tool(&caller.entity, Tool::Send)?;
        check_size(&text, self.config.gateway.max_message_bytes)?;
        let me = caller.entity.gid;
        let (question, answer) = {
            let mut sessions = self.sessions.lock();
            if let Some(dialog) = sessions.asks.for_answer(turn_id, me)?.dialog() {
                return Err(FleetError::invalid(format!(
                    "{turn_id} is a dialog on the worker's screen, which takes a key, not text: answer with fleet_send{{turn_id, choice}}, the choice one of {}",
                    dialog.offered()
                )));
            }
            sessions.asks.take_for_answer(turn_id, me)?
        };
        let (worker, task) = (question.from, question.in_task);
        let delivered = match answer {
            Waiter::Call(call) => call.send(Ok(text)).is_ok(),
            Waiter::Screen => false,
        };
        if !delivered {
            return Err(FleetError::new(
                ErrorCode::TooLate,
                format!(
                    "the question {turn_id} is over (the worker stopped waiting); your answer was not delivered"
                ),
            ));
        }
        tracing::info!(gid = %worker, %turn_id, "answered");
        self.after_answer(caller, turn_id, worker, task, wait, ct)
            .await
    }

    /// After an answer to `worker`'s ask `turn_id` (asked in `task`): waits up to `wait` for the
    /// reply to that task if the caller sent it, else says the answer went.
    pub(super) async fn after_answer(
        self: &Arc<Self>,
        caller: &Caller,
        turn_id: &str,
        worker: Gid,
        task: Option<MsgId>,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        let me = caller.entity.gid;
        let sent_by_me = match task {
            Some(task) => match self
                .afar
                .as_deref()
                .and_then(|afar| Some((afar, afar.host(worker)?)))
            {
                // A task to another host's worker is not stored here: where it went is.
                Some((afar, host)) => afar.sent_between(self, task, host, (me, worker)).await,
                None => self
                    .db
                    .run(move |s| s.message(task))
                    .await?
                    .is_some_and(|m| m.from == me),
            },
            None => false,
        };
        match task {
            Some(task) if sent_by_me => self.await_reply_to(caller, worker, task, wait, ct).await,
            _ => Ok(SendResult::Answered {
                turn_id: turn_id.to_string(),
                note: None,
            }),
        }
    }
}
