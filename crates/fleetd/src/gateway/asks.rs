//! Mid-turn asks (U2 on one host): a worker's `fleet_ask` blocks while its question surfaces
//! on its lead's open `fleet_send` or `fleet_poll` (with a `turn_id`); the lead answers with
//! `fleet_send{turn_id}`, and the worker's call returns the answer.
//!
//! Asks are live only: nothing about them is stored. With no lead waiting in a fleet call the
//! ask fails at once (`no_waiter`); an answer after the ask is over (answered, timed out, given
//! up) is not delivered and the lead hears `too_late`. An answer only ever travels back through
//! the worker's blocked call, so it can never be typed into a later, unrelated turn.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::authz::{Tool, check_tool};
use fleet_core::message::check_size;
use fleet_core::{ErrorCode, FleetError, Gid, MsgId, SessionEvent, WorkerStatus};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::messages::SendResult;
use super::sessions::now_ms;
use super::{Caller, Gateway};

/// How many finished asks are remembered, so a late answer hears `too_late` rather than
/// "unknown turn".
const OVER_KEPT: usize = 256;

/// A question as the lead sees it.
#[derive(Clone, Debug, Serialize)]
pub struct AskView {
    /// Answer it with `fleet_send{turn_id, message}`.
    pub turn_id: String,
    /// The asking worker's gid.
    pub from: Gid,
    /// Its name.
    pub from_name: String,
    /// The question.
    pub question: String,
    /// The task it is working on, if any.
    pub in_task: Option<MsgId>,
    /// When it asked (Unix ms).
    pub asked_ms: i64,
}

/// The answer to `fleet_ask`.
#[derive(Clone, Debug, Serialize)]
pub struct AskResult {
    /// The ask's turn id.
    pub turn_id: String,
    /// The lead's answer.
    pub answer: String,
}

/// An ask waiting for its answer.
struct OpenAsk {
    view: AskView,
    /// The lead it is for.
    to: Gid,
    /// Whether a lead's call has handed it out.
    surfaced: bool,
    /// Where the answer goes: the asking call.
    answer: oneshot::Sender<String>,
}

/// Open asks, oldest first, and the recently finished ones.
#[derive(Default)]
pub(super) struct Asks {
    open: Vec<OpenAsk>,
    /// (turn id, the lead it was for, how it ended).
    over: VecDeque<(String, Gid, &'static str)>,
}

impl Asks {
    /// Hands out the oldest ask for `lead` not yet handed out (from `from` only, if given).
    pub fn surface(&mut self, lead: Gid, from: Option<Gid>) -> Option<AskView> {
        let ask = self
            .open
            .iter_mut()
            .find(|a| a.to == lead && !a.surfaced && from.is_none_or(|f| a.view.from == f))?;
        ask.surfaced = true;
        Some(ask.view.clone())
    }

    /// Ends the ask `turn_id` (if still open), remembering how.
    fn close(&mut self, turn_id: &str, how: &'static str) -> Option<OpenAsk> {
        let at = self.open.iter().position(|a| a.view.turn_id == turn_id)?;
        let ask = self.open.remove(at);
        self.over.push_back((turn_id.to_string(), ask.to, how));
        while self.over.len() > OVER_KEPT {
            self.over.pop_front();
        }
        Some(ask)
    }

    /// Ends every open ask of worker `gid` (its session ended): each asking call returns.
    pub fn close_from(&mut self, gid: Gid) {
        let turns: Vec<String> = self
            .open
            .iter()
            .filter(|a| a.view.from == gid)
            .map(|a| a.view.turn_id.clone())
            .collect();
        for turn in turns {
            self.close(&turn, "its worker's session ended");
        }
    }
}

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
            let Some(to) = task.as_ref().map(|t| t.from).or(caller.entity.parent) else {
                return Err(FleetError::invalid(
                    "you have no task in flight and no lead to ask",
                ));
            };
            let Some(lead) = sessions.leads.get(&to) else {
                return Err(FleetError::new(
                    ErrorCode::NoWaiter,
                    "whoever gave you this task is not a lead on this host, so nobody can answer: decide yourself, and say what you decided in your fleet_reply",
                ));
            };
            let lead_name = lead.entity.name.clone();
            if !lead.listening.iter().any(|l| l.is_none_or(|g| g == me)) {
                return Err(FleetError::new(
                    ErrorCode::NoWaiter,
                    format!(
                        "nobody is waiting for your question: '{lead_name}' is not waiting for you in a fleet call now. Decide yourself, and say what you decided in your fleet_reply"
                    ),
                ));
            }
            sessions.asks.open.push(OpenAsk {
                view: AskView {
                    turn_id: turn_id.clone(),
                    from: me,
                    from_name: caller.entity.name.clone(),
                    question,
                    in_task: task.as_ref().map(|t| t.msg_id),
                    asked_ms: now_ms(),
                },
                to,
                surfaced: false,
                answer: tx,
            });
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
        let ask = {
            let mut sessions = self.lock();
            let asks = &mut sessions.asks;
            match asks.open.iter().find(|a| a.view.turn_id == turn_id) {
                Some(ask) if ask.to != me => {
                    return Err(FleetError::new(
                        ErrorCode::Forbidden,
                        format!("the question {turn_id} was not asked of you"),
                    ));
                }
                Some(_) => asks.close(turn_id, "it was answered"),
                None => {
                    return Err(match asks.over.iter().find(|(t, _, _)| t == turn_id) {
                        Some((_, lead, how)) if *lead == me => FleetError::new(
                            ErrorCode::TooLate,
                            format!(
                                "the question {turn_id} is over ({how}); your answer was not delivered"
                            ),
                        ),
                        _ => FleetError::invalid(format!(
                            "no question with turn_id '{turn_id}' is waiting for your answer"
                        )),
                    });
                }
            }
        };
        let Some(ask) = ask else {
            return Err(FleetError::internal("an open ask vanished"));
        };
        let (worker, task) = (ask.view.from, ask.view.in_task);
        if ask.answer.send(text).is_err() {
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
