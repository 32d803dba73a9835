//! Sending, replying and polling: where each message goes and how a caller waits for it.
//!
//! A message to a lead is held for its pull; a message to a pane-bound entity is queued for
//! its pump (or held at once when that entity is blocked in a call waiting for exactly it).
//! Waiting callers watch their inbox version and re-read the store, so a wake-up can never be
//! lost between a look and a wait.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::authz::{Tool, check_send, check_tool};
use fleet_core::bounds::Full;
use fleet_core::clock::now_ms;
// Re-exported for federation.rs until it names fleet-core's itself.
pub(super) use fleet_core::delivery::Placement;
use fleet_core::delivery::place;
use fleet_core::message::check_size;
use fleet_core::routing::{Route, resolve};
use fleet_core::typed::{first_line_end, multi_line_refusal, typeable};
use fleet_core::{
    Entity, ErrorCode, FleetError, Gid, Kind, Message, MsgId, MsgState, SessionEvent, TraceId,
};
use tokio::sync::watch as tokio_watch;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::views::{AskView, BroadcastResult, Delivered, PollResult, ReplyResult, SendResult};
use super::{Caller, Gateway};

/// The most messages one poll hands out; the rest wait for the next poll.
const POLL_BATCH: usize = 100;

/// Counts a caller's open call while it lives: leads are not nudged while blocked in one, a
/// lead's open call is where workers' asks surface (`listens`: asks from that worker only, or
/// from anyone), and a pane-bound caller blocked in a poll gets its next task through it.
struct OpenCall {
    gateway: Arc<Gateway>,
    gid: Gid,
    poll: bool,
    listens: Option<Gid>,
}

/// What a wait for an answer holds: the open call, the caller's inbox (watched from before the
/// awaited message could be answered), whether an answer may already be held, and whether the
/// awaited message is held on another host.
struct Waiting {
    open: OpenCall,
    inbox: tokio_watch::Receiver<u64>,
    look_first: bool,
    held_remotely: bool,
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        let mut sessions = self.gateway.lock();
        if let Some(lead) = sessions.leads.get_mut(&self.gid) {
            lead.open_calls = lead.open_calls.saturating_sub(1);
            if let Some(at) = lead.listening.iter().position(|l| *l == self.listens) {
                lead.listening.swap_remove(at);
            }
        } else if let Some(session) = sessions.panes.get_mut(&self.gid)
            && self.poll
        {
            session.polls = session.polls.saturating_sub(1);
            session.kick();
        }
    }
}

fn cancelled() -> FleetError {
    FleetError::new(ErrorCode::Cancelled, "the call was cancelled")
}

impl Gateway {
    /// Opens a call of `gid`: a poll, or a wait for an answer; a lead's call surfaces asks
    /// from `listens` (anyone when `None`).
    fn open_call(self: &Arc<Self>, gid: Gid, poll: bool, listens: Option<Gid>) -> OpenCall {
        let mut sessions = self.lock();
        if let Some(lead) = sessions.leads.get_mut(&gid) {
            lead.open_calls += 1;
            lead.listening.push(listens);
        } else if let Some(session) = sessions.panes.get_mut(&gid)
            && poll
        {
            session.polls += 1;
        }
        OpenCall {
            gateway: Arc::clone(self),
            gid,
            poll,
            listens,
        }
    }

    /// Resolves `to` among the live entities of this host and, with a broker, of the roster's
    /// other hosts: where it lives, or a clear error (a remote recipient without a broker is
    /// one: nothing could reach it).
    pub(super) fn resolve_route(&self, to: &str) -> Result<Route, FleetError> {
        let mut roster = self.lock().entities();
        if let Some(fed) = &self.federation {
            roster.extend(fed.remote_entities());
        }
        match resolve(&roster, &self.host_id, to)? {
            Route::Remote(entity) if self.federation.is_none() => Err(FleetError::new(
                ErrorCode::BrokerUnavailable,
                format!(
                    "'{}' lives on host '{}', and this gateway has no broker to reach it",
                    entity.name, entity.host
                ),
            )),
            route => Ok(route),
        }
    }

    /// Resolves `to` among this host's live entities: local, or a clear error.
    pub(super) fn resolve_local(&self, to: &str) -> Result<Entity, FleetError> {
        match self.resolve_route(to)? {
            Route::Local(entity) => Ok(entity),
            Route::Remote(entity) => Err(FleetError::invalid(format!(
                "'{}' lives on host '{}': only its own gateway can do that",
                entity.name, entity.host
            ))),
        }
    }

    /// The name of `gid`, live or gone.
    pub(super) async fn name_of(&self, gid: Gid) -> String {
        let live = {
            let sessions = self.lock();
            sessions
                .leads
                .get(&gid)
                .map(|l| l.entity.name.clone())
                .or_else(|| sessions.panes.get(&gid).map(|s| s.entity.name.clone()))
        };
        let remote = || self.federation.as_ref().and_then(|f| f.remote_name(gid));
        match live.or_else(remote) {
            Some(name) => name,
            None => match self.db(move |s| s.entity(gid)).await {
                Ok(Some(record)) => record.entity.name,
                _ => gid.to_string(),
            },
        }
    }

    async fn describe(&self, message: Message) -> Delivered {
        Delivered {
            from_name: self.name_of(message.from).await,
            msg_id: message.msg_id,
            kind: message.kind,
            from: message.from,
            in_reply_to: message.in_reply_to,
            text: message.body,
            sent_ms: message.created_ms,
            trace_id: message.trace_id,
        }
    }

    /// Where `message` goes (the rule: [`place`]).
    pub(super) fn placement(&self, message: &Message) -> Placement {
        let recipient = self.lock().recipient(message.to);
        place(message.kind, recipient, self.federation.is_some())
    }

    /// Accepts `message` into the local plane: held, queued, or failed if its recipient is
    /// gone; returns where it went. Duplicate ids are accepted once.
    pub(super) async fn deliver(
        self: &Arc<Self>,
        mut message: Message,
    ) -> Result<Placement, FleetError> {
        let placement = self.placement(&message);
        message.state = match placement {
            Placement::Hold => {
                message.state = MsgState::Held;
                let to = message.to;
                if let Some(Err(full)) = self.hold(vec![message]).await?.pop() {
                    return Err(self.over_cap(to, &full).await);
                }
                return Ok(placement);
            }
            Placement::Queue => MsgState::Queued,
            Placement::Dead => MsgState::Failed("the recipient is gone".into()),
            // Its own gateway keeps it: nothing of it is stored here.
            Placement::Remote => return self.publish_remote(&message).await,
        };
        let kept = message.clone();
        let fresh = self.store_one_within_cap(message).await?;
        let (to, msg_id, trace_id, kind) = (kept.to, kept.msg_id, kept.trace_id, kept.kind);
        tracing::info!(%trace_id, %msg_id, %kind, %to, fresh, ?placement, "accepted");
        if fresh && placement == Placement::Queue {
            let live = match self.lock().panes.get(&to) {
                Some(session) if session.status.is_live() => {
                    session.kick();
                    true
                }
                _ => false,
            };
            // Its session ended while the message was being stored, after the sweep of what
            // was on its way: fail it here, or it would wait forever.
            if !live {
                let why = format!("'{}' is gone", self.name_of(to).await);
                // Boxed: failing notifies, and notifying delivers (a notice is never queued).
                Box::pin(self.fail(&kept, &why)).await;
                return Ok(Placement::Dead);
            }
        }
        Ok(placement)
    }

    /// Holds `messages` (each for an entity whose placement is [`Placement::Hold`]) in one
    /// transaction, and wakes their recipients' calls. Duplicate ids are accepted once; one
    /// whose recipient is at `gateway.max_held_per_recipient` is not stored: for each, held,
    /// or the cap that refused it.
    pub(super) async fn hold(
        &self,
        messages: Vec<Message>,
    ) -> Result<Vec<Result<(), Full>>, FleetError> {
        let ids: Vec<(Gid, MsgId, TraceId, Kind)> = messages
            .iter()
            .map(|m| (m.to, m.msg_id, m.trace_id, m.kind))
            .collect();
        let outcomes = self.store_within_cap(messages).await?;
        for ((to, msg_id, trace_id, kind), outcome) in ids.into_iter().zip(&outcomes) {
            match outcome {
                Ok(fresh) => {
                    tracing::info!(%trace_id, %msg_id, %kind, %to, fresh, placement = ?Placement::Hold, "accepted");
                    if *fresh {
                        self.bump_inbox(to);
                    }
                }
                Err(full) => {
                    tracing::warn!(%trace_id, %msg_id, %kind, %to, cap = %full, waiting = full.count, "REFUSED: its recipient has too many messages waiting");
                }
            }
        }
        Ok(outcomes.into_iter().map(|o| o.map(|_| ())).collect())
    }

    /// Tells the sender of `original` that it was not delivered, as a held `FAILED` notice
    /// answering it (a blocked send returns it; otherwise `fleet_poll` does). A message gets
    /// one notice however many paths find it failed: the notice's id derives from its id.
    pub(super) async fn notify_failed(self: &Arc<Self>, original: &Message, reason: &str) {
        let notice = Message::notice(original, Kind::Failed, reason.to_string(), now_ms());
        tracing::warn!(trace_id = %original.trace_id, msg_id = %original.msg_id, reason, "not delivered");
        if let Err(e) = self.deliver(notice).await {
            tracing::error!(msg_id = %original.msg_id, error = %e, "could not record a failure notice");
        }
    }

    /// `fleet_send`: sends `text` to `to` and waits up to `wait` for the answer.
    pub async fn send(
        self: &Arc<Self>,
        caller: &Caller,
        to: &str,
        text: String,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        check_tool(&caller.entity, Tool::Send)?;
        check_size(&text, self.config.gateway.max_message_bytes)?;
        let route = self.resolve_route(to)?;
        let remote = matches!(route, Route::Remote(_));
        let recipient = route.entity();
        if recipient.gid == caller.entity.gid {
            return Err(FleetError::invalid("you cannot send a message to yourself"));
        }
        check_send(&caller.entity, recipient)?;
        if recipient.role.is_injected() {
            // Typed into its pane (here or on its host): inert text only.
            typeable(&text).map_err(|found| found.refusal())?;
            let single_line = self
                .lock()
                .panes
                .get(&recipient.gid)
                .is_some_and(|s| s.profile.single_line);
            if single_line && let Some(offset) = first_line_end(&text) {
                return Err(multi_line_refusal(&recipient.name, offset));
            }
        }
        if !remote
            && recipient.role.is_injected()
            && let Some(down) = self.lock().host_down.clone()
        {
            return Err(FleetError::new(
                ErrorCode::PaneHost,
                format!(
                    "'{}' cannot be reached: {down}; nothing was queued, and messages held for you are kept",
                    recipient.name
                ),
            ));
        }
        let trace_id = self
            .lock()
            .panes
            .get(&caller.entity.gid)
            .and_then(|s| s.current.as_ref().map(|m| m.trace_id))
            .unwrap_or_else(TraceId::mint);
        let message = Message::task(caller.entity.gid, recipient.gid, text, trace_id, now_ms());
        let msg_id = message.msg_id;
        let open = self.open_call(caller.entity.gid, false, Some(recipient.gid));
        // Watched from before the message leaves: until the inbox changes, no answer can be in
        // it, and the store need not be asked.
        let inbox = self.inbox(caller.entity.gid);
        if remote && recipient.role.is_injected() {
            // Tracked before it is published: its receipt may come back at once.
            self.track_remote_brief(&message);
        }
        let placement = self.deliver(message).await;
        if placement.is_err()
            && let Some(fed) = &self.federation
        {
            fed.forget_brief(msg_id);
        }
        if placement? == Placement::Dead {
            return Ok(SendResult::Failed {
                msg_id,
                reason: format!("'{}' is gone", recipient.name),
            });
        }
        let waiting = Waiting {
            open,
            inbox,
            look_first: false,
            // A message to a remote lead is held for it on its host; nothing of it is stored
            // here to ask about.
            held_remotely: remote && !recipient.role.is_injected(),
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
            inbox: self.inbox(caller.entity.gid),
            look_first: true,
            held_remotely: false,
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
            look_first: mut look,
            held_remotely,
        } = waiting;
        let me = caller.entity.gid;
        let deadline = Instant::now() + wait;
        loop {
            // A change seen for the first time here counts too: an answer may come back before
            // the wait starts (another host's gateway refusing at once).
            look |= inbox.has_changed().unwrap_or(true);
            inbox.borrow_and_update();
            if look && let Some(answer) = self.db(move |s| s.take_answer(me, msg_id)).await? {
                self.keep_unless_cancelled(ct, me, &[answer.msg_id]).await?;
                return Ok(match answer.kind {
                    Kind::Failed => SendResult::Failed {
                        msg_id,
                        reason: answer.body,
                    },
                    _ => SendResult::Replied {
                        msg_id,
                        reply: self.describe(answer).await,
                    },
                });
            }
            let asked = self.lock().asks.surface(me, open.listens);
            if let Some(ask) = asked {
                return Ok(SendResult::Asked {
                    msg_id,
                    note: format!(
                        "'{}' asks you this mid-task: answer with fleet_send{{turn_id: \"{}\", message}}; the answer to your message {msg_id} is still on its way",
                        ask.from_name, ask.turn_id
                    ),
                    ask,
                });
            }
            tokio::select! {
                changed = inbox.changed() => match changed {
                    Ok(()) => look = true,
                    Err(_) => break,
                },
                () = sleep_until(deadline) => break,
                () = ct.cancelled() => return Err(cancelled()),
                () = self.shutdown.cancelled() => break,
            }
        }
        let remote_state = self
            .federation
            .as_ref()
            .and_then(|f| f.pending_state(msg_id));
        let state = match remote_state {
            Some(state) => state.to_string(),
            None if held_remotely => MsgState::Held.to_string(),
            None => self
                .db(move |s| s.message(msg_id))
                .await?
                .map(|m| m.state.to_string())
                .unwrap_or_else(|| "unknown".into()),
        };
        Ok(SendResult::Pending {
            msg_id,
            state,
            note: format!(
                "no answer within {} s; it will be held for you: collect it with fleet_poll",
                wait.as_secs()
            ),
        })
    }

    /// `fleet_reply`: answers `in_reply_to`, or the caller's task in flight.
    pub async fn reply(
        self: &Arc<Self>,
        caller: &Caller,
        text: String,
        in_reply_to: Option<MsgId>,
    ) -> Result<ReplyResult, FleetError> {
        check_tool(&caller.entity, Tool::Reply)?;
        check_size(&text, self.config.gateway.max_message_bytes)?;
        let me = caller.entity.gid;
        let answered = match in_reply_to {
            Some(id) => self
                .db(move |s| s.message(id))
                .await?
                .filter(|m| m.to == me)
                .ok_or_else(|| {
                    FleetError::invalid(format!(
                        "in_reply_to {id} is not a message sent to you; fleet_poll shows what you received"
                    ))
                })?,
            None => self
                .lock()
                .panes
                .get(&me)
                .and_then(|s| s.current.clone())
                .ok_or_else(|| {
                    FleetError::invalid(
                        "you have no task in flight to answer: pass in_reply_to (the msg_id you answer)",
                    )
                })?,
        };
        let reply = Message::reply_to(&answered, text, now_ms());
        let msg_id = reply.msg_id;
        if matches!(self.placement(&reply), Placement::Dead) {
            return Err(FleetError::new(
                ErrorCode::Gone,
                format!(
                    "'{}' who sent message {} is gone; your reply has nowhere to go",
                    self.name_of(answered.from).await,
                    answered.msg_id
                ),
            ));
        }
        // Take the task out of flight first, so a session ending while the reply is stored
        // does not also report the task unanswered; put it back if storing fails.
        let ending = self.take_current(me, answered.msg_id);
        if let Err(e) = self.deliver(reply).await {
            if let Some(task) = ending {
                self.restore_current(me, task);
            }
            return Err(e);
        }
        if ending.is_some() {
            self.end_turn(me);
        }
        Ok(ReplyResult {
            msg_id,
            to: answered.from,
            to_name: self.name_of(answered.from).await,
        })
    }

    /// Takes `gid`'s task in flight out of flight if it is `answered`.
    fn take_current(&self, gid: Gid, answered: MsgId) -> Option<Message> {
        let mut sessions = self.lock();
        let session = sessions.panes.get_mut(&gid)?;
        if session
            .current
            .as_ref()
            .is_some_and(|m| m.msg_id == answered)
        {
            session.current.take()
        } else {
            None
        }
    }

    /// Puts a task taken by [`Gateway::take_current`] back in flight.
    fn restore_current(&self, gid: Gid, task: Message) {
        if let Some(session) = self.lock().panes.get_mut(&gid)
            && session.current.is_none()
        {
            session.current = Some(task);
        }
    }

    /// Ends `gid`'s turn: the worker is idle again and its next task may go in.
    fn end_turn(&self, gid: Gid) {
        if let Some(session) = self.lock().panes.get_mut(&gid)
            && let Err(e) = session.apply(SessionEvent::TurnDone)
        {
            tracing::warn!(%gid, error = %e, "reply outside a turn");
        }
    }

    /// Gives messages just taken for `to`'s call back to `held` if the call was cancelled
    /// meanwhile (the client would never see them), wakes `to`'s other calls to them, and
    /// reports the cancellation.
    async fn keep_unless_cancelled(
        &self,
        ct: &CancellationToken,
        to: Gid,
        taken: &[MsgId],
    ) -> Result<(), FleetError> {
        if !ct.is_cancelled() {
            return Ok(());
        }
        let ids = taken.to_vec();
        self.db(move |s| s.release(&ids)).await?;
        self.bump_inbox(to);
        Err(cancelled())
    }

    /// `fleet_poll`: held messages for the caller (only those from `from`, when given),
    /// waiting up to `wait` for the first.
    pub async fn poll(
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
        let mut inbox = self.inbox(me);
        let mut kick = self.lock().panes.get(&me).map(|s| s.kick.subscribe());
        let deadline = Instant::now() + wait;
        loop {
            inbox.borrow_and_update();
            if let Some(kick) = kick.as_mut() {
                kick.borrow_and_update();
            }
            let mut batch = self.db(move |s| s.take_held(me, from, POLL_BATCH)).await?;
            if batch.is_empty() && from.is_none() && self.take_task_by_poll(me).await? {
                batch = self.db(move |s| s.take_held(me, None, POLL_BATCH)).await?;
            }
            let asks: Vec<AskView> = {
                let mut sessions = self.lock();
                std::iter::from_fn(|| sessions.asks.surface(me, from)).collect()
            };
            if !batch.is_empty() || !asks.is_empty() {
                let ids: Vec<MsgId> = batch.iter().map(|m| m.msg_id).collect();
                self.keep_unless_cancelled(ct, me, &ids).await?;
                let mut messages = Vec::with_capacity(batch.len());
                for message in batch {
                    messages.push(self.describe(message).await);
                }
                return Ok(PollResult { messages, asks });
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
        })
    }

    /// For an idle pane-bound caller blocked in a poll: takes its next queued task off the
    /// queue and holds it for this poll (a TUI would only queue typed text while the call runs).
    async fn take_task_by_poll(self: &Arc<Self>, gid: Gid) -> Result<bool, FleetError> {
        if !self.claim(gid, true) {
            return Ok(false);
        }
        let task = match self.db(move |s| s.dequeue(gid, &MsgState::Held)).await {
            Ok(Some(task)) => task,
            other => {
                self.unclaim(gid);
                return other.map(|_| false);
            }
        };
        self.start_task(gid, task).await;
        Ok(true)
    }

    /// `fleet_broadcast`: one message to every worker (or those of `group`), each copy
    /// delivered by the normal rules of its worker's gateway. With a broker it is published
    /// once and the broker copies it into every bound inbox; without one, this host's workers
    /// get a copy each.
    pub async fn broadcast(
        self: &Arc<Self>,
        caller: &Caller,
        text: String,
        group: Option<String>,
    ) -> Result<BroadcastResult, FleetError> {
        check_tool(&caller.entity, Tool::Broadcast)?;
        check_size(&text, self.config.gateway.max_message_bytes)?;
        typeable(&text).map_err(|found| found.refusal())?;
        if let Some(group) = &group {
            fleet_core::entity::validate_name("group", group)?;
        }
        let (msg_id, trace_id) = (MsgId::mint(), TraceId::mint());
        let (copies, refused) = if self.federation.is_some() {
            let copies = self
                .publish_broadcast(&caller.entity, group.as_deref(), &text, msg_id, trace_id)
                .await?;
            (copies, Vec::new())
        } else {
            let targets: Vec<Gid> = self
                .lock()
                .entities()
                .into_iter()
                .filter(|e| e.role.is_injected() && e.gid != caller.entity.gid)
                .filter(|e| {
                    group
                        .as_ref()
                        .is_none_or(|g| e.groups.iter().any(|x| x == g))
                })
                .map(|e| e.gid)
                .collect();
            let (mut copies, mut full) = (0, Vec::new());
            for gid in targets {
                let copy = Message::task(caller.entity.gid, gid, text.clone(), trace_id, now_ms())
                    .with_id(msg_id.derived(&gid.to_string()));
                match self.deliver(copy).await {
                    Ok(Placement::Queue) => copies += 1,
                    Ok(_) => {}
                    // A worker at its cap gets no copy; the others still do, and the note says
                    // who did not.
                    Err(e) if e.code == ErrorCode::TooMany => full.push(e.message),
                    Err(e) => return Err(e),
                }
            }
            (copies, full)
        };
        tracing::info!(%trace_id, %msg_id, group = ?group, copies, "broadcast");
        let mut note = String::from(
            "each copy is typed in when its worker is free; their answers come back as ordinary replies (fleet_poll)",
        );
        for why in refused {
            note.push_str("; no copy: ");
            note.push_str(&why);
        }
        Ok(BroadcastResult {
            msg_id,
            copies,
            note,
        })
    }

    /// The gid of a sender named `name` for a poll filter: a live entity, or the newest one
    /// of that name that is gone (its replies may still be held).
    async fn resolve_sender(&self, name: &str) -> Result<Gid, FleetError> {
        if let Ok(gid) = name.parse::<Gid>() {
            return Ok(gid);
        }
        if let Ok(route) = self.resolve_route(name) {
            return Ok(route.entity().gid);
        }
        let owned = name.to_string();
        match self.db(move |s| s.latest_named(&owned)).await? {
            Some(record) => Ok(record.entity.gid),
            None => Err(self.resolve_route(name).err().unwrap_or_else(|| {
                FleetError::new(
                    ErrorCode::UnknownRecipient,
                    format!("nobody is named '{name}'"),
                )
            })),
        }
    }
}
