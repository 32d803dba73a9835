//! The calls that wait: `fleet_send` (for the answer) and `fleet_poll` (for held messages),
//! and how a caller waits. Waiting callers watch their inbox version and re-read the store, so
//! a wake-up can never be lost between a look and a wait.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::authz::{Tool, check_tool};
use fleet_core::clock::now_ms;
use fleet_core::delivery::Placement;
use fleet_core::message::check_size;
use fleet_core::routing::Route;
use fleet_core::send::{SendFacts, SessionFacts, plan_send};
use fleet_core::{
    ErrorCode, FleetError, Gid, Kind, Message, MsgId, MsgState, TraceId, WorkerStatus,
};
use tokio::sync::watch as tokio_watch;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::delivery::Taken;
use super::inboxes::AnswerWatch;
use super::views::{PollResult, SendResult, Surfaced};
use super::{Caller, LocalPlane, store_error};

/// The most messages one poll hands out; the rest wait for the next poll.
const POLL_BATCH: usize = 100;

/// Counts a caller's open call while it lives: leads are not nudged while blocked in one, a
/// lead's open call is where workers' asks surface (`listens`: asks from that worker only, or
/// from anyone), and a pane-bound caller blocked in a poll gets its next task through it.
struct OpenCall {
    gateway: Arc<LocalPlane>,
    gid: Gid,
    poll: bool,
    listens: Option<Gid>,
}

/// What a wait for an answer holds: the open call, the caller's inbox and the awaited
/// message's answers (both watched from before the message could be answered), whether an
/// answer may already be held, and whether the awaited message is held on another host.
struct Waiting {
    open: OpenCall,
    inbox: tokio_watch::Receiver<u64>,
    answer: AnswerWatch,
    look_first: bool,
    /// The message is held for its recipient as far as anything here can tell without
    /// asking the store: held on its host for a lead there, or just held here for a lead
    /// with no wait for it to be taken.
    known_held: bool,
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        let mut sessions = self.gateway.sessions.lock();
        if let Some(lead) = sessions.leads.get_mut(&self.gid) {
            lead.call_closed(self.listens);
        } else if let Some(session) = sessions.panes.get_mut(&self.gid) {
            session.call_closed(self.poll);
        }
    }
}

/// Whether a wait until `deadline` is over. Asked before waiting on the clock: tokio's timer
/// ends a wait only at a tick, the millisecond after its deadline at the soonest, so a call that
/// waits for nothing (`wait_s: 0`) would otherwise return a millisecond or two late.
fn over(deadline: Instant) -> bool {
    Instant::now() >= deadline
}

fn cancelled() -> FleetError {
    FleetError::new(ErrorCode::Cancelled, "the call was cancelled")
}

impl LocalPlane {
    /// Opens a call of `gid`: a poll, or a wait for an answer; a lead's call surfaces asks
    /// from `listens` (anyone when `None`).
    fn open_call(self: &Arc<Self>, gid: Gid, poll: bool, listens: Option<Gid>) -> OpenCall {
        let mut sessions = self.sessions.lock();
        if let Some(lead) = sessions.leads.get_mut(&gid) {
            lead.call_opened(listens);
        } else if let Some(session) = sessions.panes.get_mut(&gid) {
            session.call_opened(poll);
        }
        OpenCall {
            gateway: Arc::clone(self),
            gid,
            poll,
            listens,
        }
    }

    /// The local side of [`Gateway::send`].
    pub(super) async fn send(
        self: &Arc<Self>,
        caller: &Caller,
        to: &str,
        text: String,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        check_tool(&caller.entity, Tool::Send)?;
        check_size(&text, self.config.gateway.max_message_bytes)?;
        let route = self.resolve_or_ended(to, Some(&caller.entity)).await?;
        let remote = matches!(route, Route::Remote(_));
        let recipient = route.entity();
        // The facts, gathered under the lock; the plan, made outside it (it reads the text).
        let (session, host_down, caller_trace) = {
            let sessions = self.sessions.lock();
            (
                sessions.panes.get(&recipient.gid).map(|s| SessionFacts {
                    owner: s.owned().owner,
                    shared: s.shared().to_vec(),
                    single_line: s.profile().single_line,
                }),
                sessions.host_down.clone(),
                sessions
                    .panes
                    .get(&caller.entity.gid)
                    .and_then(|s| s.current().map(|m| m.trace_id)),
            )
        };
        let plan = plan_send(&SendFacts {
            caller: &caller.entity,
            recipient,
            remote,
            text: &text,
            session,
            host_down: host_down.as_deref(),
            caller_trace,
        })?;
        let trace_id = plan.trace.unwrap_or_else(TraceId::mint);
        let message = Message::task(caller.entity.gid, recipient.gid, text, trace_id, now_ms());
        let msg_id = message.msg_id;
        crate::logs::step(msg_id, "accepted");
        let open = self.open_call(caller.entity.gid, false, Some(recipient.gid));
        // Watched from before the message leaves: until an answer to it is held, the store need
        // not be asked.
        let inbox = self.inboxes.watch(caller.entity.gid);
        let answer = self
            .inboxes
            .watch_answer(caller.entity.gid, msg_id, !wait.is_zero());
        let brief = plan.brief;
        if brief {
            // Tracked before it is published: its receipt may come back at once.
            if let Some(afar) = self.afar.as_deref() {
                afar.brief_going(self, &message).await;
            }
        }
        let placement = self.deliver(message).await;
        if brief
            && !matches!(placement, Ok(Placement::Remote))
            && let Some(afar) = self.afar.as_deref()
        {
            afar.briefs_settled(self, vec![msg_id]).await;
        }
        let placement = placement?;
        if placement == Placement::Dead {
            return Ok(SendResult::Failed {
                msg_id,
                reason: format!("'{}' is gone", recipient.name),
            });
        }
        let waiting = Waiting {
            open,
            inbox,
            answer,
            look_first: false,
            known_held: plan.known_held(placement, !wait.is_zero()),
        };
        self.await_answer(caller, msg_id, wait, ct, waiting).await
    }

    /// Waits up to `wait` for the answer to the caller's earlier message `msg_id` to `to`.
    pub(super) async fn await_reply_to(
        self: &Arc<Self>,
        caller: &Caller,
        to: Gid,
        msg_id: MsgId,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        let waiting = Waiting {
            open: self.open_call(caller.entity.gid, false, Some(to)),
            inbox: self.inboxes.watch(caller.entity.gid),
            answer: self
                .inboxes
                .watch_answer(caller.entity.gid, msg_id, !wait.is_zero()),
            look_first: true,
            known_held: false,
        };
        self.await_answer(caller, msg_id, wait, ct, waiting).await
    }

    async fn await_answer(
        self: &Arc<Self>,
        caller: &Caller,
        msg_id: MsgId,
        wait: Duration,
        ct: &CancellationToken,
        waiting: Waiting,
    ) -> Result<SendResult, FleetError> {
        let Waiting {
            open,
            mut inbox,
            mut answer,
            look_first: mut look,
            known_held,
        } = waiting;
        let me = caller.entity.gid;
        let deadline = Instant::now() + wait;
        loop {
            // An answer held before the wait starts counts too (another host's gateway
            // refusing at once). Anything else that reaches the inbox (an ask to surface) needs
            // no look at the store.
            look |= answer.take_news();
            inbox.borrow_and_update();
            if let Some(handed) = answer.handed() {
                crate::logs::step(msg_id, "lead_woken");
                return self.answered_with(me, msg_id, ct, handed).await;
            }
            if look && let Some(answered) = self.answer_of(me, msg_id, ct).await? {
                crate::logs::step(msg_id, "lead_woken");
                return Ok(answered);
            }
            let asked = self.sessions.lock().asks.surface(me, open.listens);
            if let Some(surfaced) = asked.map(Surfaced::from) {
                return Ok(surfaced_on(msg_id, surfaced));
            }
            if over(deadline) {
                break;
            }
            look = false;
            tokio::select! {
                () = answer.held() => look = true,
                changed = inbox.changed() => if changed.is_err() {
                    break;
                },
                () = sleep_until(deadline) => break,
                () = ct.cancelled() => return Err(cancelled()),
                () = self.shutdown.cancelled() => break,
            }
        }
        // Its answer may have been handed to it as the wait ended.
        if let Some(handed) = answer.handed() {
            crate::logs::step(msg_id, "lead_woken");
            return self.answered_with(me, msg_id, ct, handed).await;
        }
        self.still_pending(me, msg_id, wait, known_held, open.listens)
            .await
    }

    /// The answer to `msg_id` sent by `me`, taken, if it is there: first asked on the store's
    /// reader, and only then taken (a wait woken by an answer that another call took first
    /// pays no write).
    async fn answer_of(
        self: &Arc<Self>,
        me: Gid,
        msg_id: MsgId,
        ct: &CancellationToken,
    ) -> Result<Option<SendResult>, FleetError> {
        if !self
            .db
            .at_once()
            .answer_waits(me, msg_id)
            .map_err(store_error)?
        {
            return Ok(None);
        }
        let Some(answer) = self.db.run(move |s| s.take_answer(me, msg_id)).await? else {
            return Ok(None);
        };
        self.answered_with(me, msg_id, ct, answer).await.map(Some)
    }

    /// What a send of `me` waiting on `msg_id` returns with `answer`, taken for it: given back
    /// if the call was cancelled meanwhile.
    async fn answered_with(
        &self,
        me: Gid,
        msg_id: MsgId,
        ct: &CancellationToken,
        answer: Message,
    ) -> Result<SendResult, FleetError> {
        self.keep_unless_cancelled(ct, me, &[&answer]).await?;
        Ok(match answer.kind {
            Kind::Failed => SendResult::Failed {
                msg_id,
                reason: answer.body,
            },
            _ => SendResult::Replied {
                msg_id,
                reply: self.describe(answer).await,
            },
        })
    }

    /// What a send waiting on `msg_id` returns when its wait is over unanswered: how far the
    /// message got, and (a worker shared with the caller, `listens`, may wait on a dialog only
    /// its owner sees) why it may take a while.
    async fn still_pending(
        &self,
        me: Gid,
        msg_id: MsgId,
        wait: Duration,
        known_held: bool,
        listens: Option<Gid>,
    ) -> Result<SendResult, FleetError> {
        let remote_state = self
            .afar
            .as_deref()
            .and_then(|afar| afar.brief_state(msg_id));
        let state = match remote_state {
            Some(state) => state.to_string(),
            None if known_held => MsgState::Held.to_string(),
            None => self
                .db
                .run(move |s| s.message(msg_id))
                .await?
                .map(|m| m.state.to_string())
                .unwrap_or_else(|| "unknown".into()),
        };
        let owners_dialog = listens.and_then(|w| {
            let sessions = self.sessions.lock();
            let s = sessions.panes.get(&w)?;
            (s.status() == WorkerStatus::Blocked && s.entity().parent != Some(me)).then(|| {
                format!(
                    "; '{}' waits on a dialog of its program, which its owner answers: your task goes on once it does",
                    s.entity().name
                )
            })
        });
        Ok(SendResult::Pending {
            msg_id,
            state,
            note: format!(
                "no answer within {} s; it will be held for you: collect it with fleet_poll{}",
                wait.as_secs(),
                owners_dialog.unwrap_or_default()
            ),
        })
    }

    /// Gives messages just taken for `to`'s call back to `held` if the call was cancelled
    /// meanwhile (the client would never see them), wakes `to`'s other calls to them (a send
    /// waiting for one as its answer too), and reports the cancellation.
    async fn keep_unless_cancelled(
        &self,
        ct: &CancellationToken,
        to: Gid,
        taken: &[&Message],
    ) -> Result<(), FleetError> {
        if !ct.is_cancelled() {
            return Ok(());
        }
        let ids: Vec<MsgId> = taken.iter().map(|m| m.msg_id).collect();
        self.db.run(move |s| s.release(&ids)).await?;
        self.inboxes.bump(to);
        for answered in taken.iter().filter_map(|m| m.in_reply_to) {
            self.inboxes.answered(answered);
        }
        Err(cancelled())
    }

    /// The local side of [`Gateway::poll`].
    pub(super) async fn poll(
        self: &Arc<Self>,
        caller: &Caller,
        from: Option<&str>,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<PollResult, FleetError> {
        check_tool(&caller.entity, Tool::Poll)?;
        let from = match from {
            Some(name) => Some(self.resolve_sender(name).await?),
            None => None,
        };
        let me = caller.entity.gid;
        let _open = self.open_call(me, true, from);
        let mut inbox = self.inboxes.watch(me);
        let mut kick = self.sessions.lock().panes.get(&me).map(|s| s.kicks());
        let deadline = Instant::now() + wait;
        loop {
            inbox.borrow_and_update();
            if let Some(kick) = kick.as_mut() {
                kick.borrow_and_update();
            }
            let mut batch = self
                .db
                .run(move |s| s.take_held(me, from, POLL_BATCH))
                .await?;
            if batch.is_empty() && from.is_none() && self.take_task_by_poll(me).await? {
                batch = self
                    .db
                    .run(move |s| s.take_held(me, None, POLL_BATCH))
                    .await?;
            }
            let (mut asks, mut blocked) = (Vec::new(), Vec::new());
            {
                let mut sessions = self.sessions.lock();
                while let Some(ask) = sessions.asks.surface(me, from) {
                    match Surfaced::from(ask) {
                        Surfaced::Question(ask) => asks.push(ask),
                        Surfaced::Dialog(dialog) => blocked.push(dialog),
                    }
                }
            }
            if !batch.is_empty() || !asks.is_empty() || !blocked.is_empty() {
                let taken: Vec<&Message> = batch.iter().collect();
                self.keep_unless_cancelled(ct, me, &taken).await?;
                let mut messages = Vec::with_capacity(batch.len());
                for message in batch {
                    messages.push(self.describe(message).await);
                }
                return Ok(PollResult {
                    messages,
                    asks,
                    blocked,
                });
            }
            if over(deadline) {
                break;
            }
            let kicked = async {
                match kick.as_mut() {
                    Some(kick) => kick.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = inbox.changed() => if changed.is_err() { break },
                alive = kicked => if !alive { break },
                () = sleep_until(deadline) => break,
                () = ct.cancelled() => return Err(cancelled()),
                () = self.shutdown.cancelled() => break,
            }
        }
        Ok(PollResult {
            messages: Vec::new(),
            asks: Vec::new(),
            blocked: Vec::new(),
        })
    }

    /// For an idle pane-bound caller blocked in a poll: takes its next queued task off the
    /// queue and holds it for this poll (a TUI would only queue typed text while the call runs);
    /// a brief from another host is receipted `INJECTED` then, as a typed one would be.
    async fn take_task_by_poll(self: &Arc<Self>, gid: Gid) -> Result<bool, FleetError> {
        if !self.claim(gid, true) {
            return Ok(false);
        }
        let task = loop {
            match self.dequeue(gid, MsgState::Held).await {
                Ok(Taken::Task(task)) => break task,
                // The poll holds the claim and is open: the next one is its to take.
                Ok(Taken::Expired) => {}
                other => {
                    self.unclaim(gid);
                    return other.map(|_| false);
                }
            }
        };
        // Handed over: for a brief from another host, as good as typed in — its sender's
        // gateway hears so, or it would fail the brief at the receipt bound.
        let handed = task.clone();
        if self.start_task(gid, task, false).await
            && let Some(afar) = self.afar_of(&handed)
        {
            afar.injected(self, &handed).await;
        }
        Ok(true)
    }
}

/// What a send waiting on `msg_id` returns when a question or a dialog surfaces on it first.
fn surfaced_on(msg_id: MsgId, surfaced: Surfaced) -> SendResult {
    match surfaced {
        Surfaced::Question(ask) => SendResult::Asked {
            msg_id,
            note: format!(
                "'{}' asks you this mid-task: answer with fleet_send{{turn_id: \"{}\", message}}; the answer to your message {msg_id} is still on its way",
                ask.from_name, ask.turn_id
            ),
            ask,
        },
        Surfaced::Dialog(dialog) => SendResult::Blocked {
            msg_id: Some(msg_id),
            note: format!(
                "'{}' stopped on a dialog of its own program and waits for a key: answer with fleet_send{{turn_id: \"{}\", choice}}, choice one of {}; the answer to your message {msg_id} is still on its way",
                dialog.from_name,
                dialog.turn_id,
                dialog.choices_in_words()
            ),
            dialog,
        },
    }
}
