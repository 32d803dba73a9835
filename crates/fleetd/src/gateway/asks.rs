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
use fleet_core::{ErrorCode, FleetError, Gid, MsgId, SessionEvent, WorkerStatus};
use tokio::sync::oneshot;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::views::{AskResult, AskView, SendResult};
use super::{Caller, Gateway};

/// The open asks of this gateway; each answer travels back through its asking call.
pub(super) type Asks = AskTable<oneshot::Sender<String>>;

/// Ends an ask however its call ends (answered, timed out, cancelled): the worker is back to
/// work, and a later answer hears `too_late`.
struct AskGuard {
    gateway: Arc<Gateway>,
    worker: Gid,
    turn_id: String,
}

impl Drop for AskGuard {
    fn drop(&mut self) {
        let mut sessions = self.gateway.lock();
        sessions
            .asks
            .close(&self.turn_id, "the worker stopped waiting");
        if let Some(session) = sessions.panes.get_mut(&self.worker)
            && session.status == WorkerStatus::Asking
        {
            let _ = session.apply(SessionEvent::AskEnded);
        }
    }
}

impl Gateway {
    /// `fleet_ask`: asks the lead whose task the caller is working on (else the lead that
    /// spawned it) and waits up to `wait` for the answer.
    pub async fn ask(
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
        let lead = {
            let mut sessions = self.lock();
            let session = sessions.panes.get(&me);
            let task = session.and_then(|s| s.current.clone());
            let to = whom_to_ask(task.as_ref().map(|t| t.from), caller.entity.parent)?;
            let Some(lead) = sessions.leads.get(&to) else {
                return Err(FleetError::new(
                    ErrorCode::NoWaiter,
                    "whoever gave you this task is not a lead on this host, so nobody can answer: decide yourself, and say what you decided in your fleet_reply",
                ));
            };
            let lead_name = lead.entity.name.clone();
            if !listens_for(&lead.listening, me) {
                return Err(FleetError::new(
                    ErrorCode::NoWaiter,
                    format!(
                        "nobody is waiting for your question: '{lead_name}' is not waiting for you in a fleet call now. Decide yourself, and say what you decided in your fleet_reply"
                    ),
                ));
            }
            let question = AskView {
                turn_id: turn_id.clone(),
                from: me,
                from_name: caller.entity.name.clone(),
                question,
                in_task: task.as_ref().map(|t| t.msg_id),
                asked_ms: now_ms(),
            };
            sessions.asks.open(question, to, tx);
            if let Some(session) = sessions.panes.get_mut(&me)
                && session.status == WorkerStatus::Busy
            {
                let _ = session.apply(SessionEvent::Asked);
            }
            tracing::info!(gid = %me, %turn_id, lead = %lead_name, "asked");
            to
        };
        let _guard = AskGuard {
            gateway: Arc::clone(self),
            worker: me,
            turn_id: turn_id.clone(),
        };
        self.bump_inbox(lead);
        tokio::select! {
            answer = rx => match answer {
                Ok(answer) => Ok(AskResult { turn_id, answer }),
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

    /// `fleet_send{turn_id}`: answers a worker's ask, then waits up to `wait` for the reply to
    /// the task it was asked in (if the caller sent that task).
    pub async fn answer(
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
        let (question, answer) = self.lock().asks.take_for_answer(turn_id, me)?;
        let (worker, task) = (question.from, question.in_task);
        if answer.send(text).is_err() {
            return Err(FleetError::new(
                ErrorCode::TooLate,
                format!(
                    "the question {turn_id} is over (the worker stopped waiting); your answer was not delivered"
                ),
            ));
        }
        tracing::info!(gid = %worker, %turn_id, "answered");
        let sent_by_me = match task {
            Some(task) => self
                .db(move |s| s.message(task))
                .await?
                .is_some_and(|m| m.from == me),
            None => false,
        };
        match task {
            Some(task) if sent_by_me => self.await_reply_to(caller, worker, task, wait, ct).await,
            _ => Ok(SendResult::Answered {
                turn_id: turn_id.to_string(),
            }),
        }
    }
}
