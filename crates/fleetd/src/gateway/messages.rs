//! Where a message goes, and its acceptance into the local plane: resolving a recipient (one
//! routing decision, [`Route`]), its placement (the rule is `fleet_core::delivery::place`),
//! holding or queueing it, and telling a sender what was not delivered.
//!
//! A message to a lead is held for its pull; a message to a pane-bound entity is queued for
//! its pump (or held at once when that entity is blocked in a call waiting for exactly it).

use std::sync::{Arc, Weak};

use fleet_core::bounds::Full;
use fleet_core::clock::now_ms;
use fleet_core::delivery::{Placement, place};
use fleet_core::routing::{Directory, Route, ended, resolve};
use fleet_core::{Entity, ErrorCode, FleetError, Gid, Kind, Message, MsgId, MsgState, TraceId};
use tracing::Instrument;

use super::LocalPlane;
use super::inboxes::{Abandoned, Claim};
use super::views::Delivered;
use crate::logs::{self, message_span};

/// How long an answer handed to a send that ended waits before it is tried again when the
/// store refuses to hold it again.
const HELD_AGAIN_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// What routing looks up in a gateway: this host's live entities by the sessions' name index,
/// the remote roster's by its own. Each look takes one lock and lets it go.
struct Known<'a>(&'a LocalPlane);

impl Directory for Known<'_> {
    fn by_gid(&self, gid: Gid) -> Option<Entity> {
        let local = self.0.sessions.lock().live(gid);
        local.or_else(|| self.0.afar.as_deref()?.entity(gid))
    }

    fn named(&self, name: &str) -> Vec<Entity> {
        let mut found = self.0.sessions.lock().live_named(name);
        if let Some(afar) = self.0.afar.as_deref() {
            found.extend(afar.named(name));
        }
        found
    }

    fn names(&self) -> Vec<String> {
        let mut names = self.0.sessions.lock().live_names();
        if let Some(afar) = self.0.afar.as_deref() {
            names.extend(afar.names());
        }
        names
    }
}

impl LocalPlane {
    /// Resolves `to` among the live entities of this host and, with a broker, of the roster's
    /// other hosts: where it lives, or a clear error (a remote recipient without a broker is
    /// one: nothing could reach it).
    pub(super) fn resolve_route(&self, to: &str) -> Result<Route, FleetError> {
        match resolve(&Known(self), &self.host_id, to)? {
            Route::Remote(entity) if self.afar.as_deref().is_none() => Err(FleetError::new(
                ErrorCode::BrokerUnavailable,
                format!(
                    "'{}' lives on host '{}', and this gateway has no broker to reach it",
                    entity.name, entity.host
                ),
            )),
            route => Ok(route),
        }
    }

    /// [`LocalPlane::resolve_route`], where a name of this host that is not live because it
    /// ended is told when, and to `asker` (the calling lead or worker; none for an operator)
    /// why if it owned it (else as unknown as any other name).
    pub(super) async fn resolve_or_ended(
        &self,
        to: &str,
        asker: Option<&Entity>,
    ) -> Result<Route, FleetError> {
        match self.resolve_route(to) {
            Err(err) if err.code == ErrorCode::UnknownRecipient => {
                Err(self.ended(to, asker, err).await)
            }
            found => found,
        }
    }

    /// `unknown`, the error for `to`, told instead when `to` ended if it is a name of this
    /// host's that did (and why, to its owner).
    async fn ended(&self, to: &str, asker: Option<&Entity>, unknown: FleetError) -> FleetError {
        let to = to.trim();
        let name = match to.split_once('@') {
            Some((name, host)) if host == self.host_id => name,
            Some(_) => return unknown,
            None => to,
        };
        let owned = name.to_string();
        match self.db.run(move |s| s.ended_named(&owned)).await {
            Ok(Some(end)) => {
                let owner = asker.is_some_and(|a| end.owner == Some(a.gid));
                ended(
                    name,
                    end.at_ms,
                    now_ms(),
                    end.why.as_deref().filter(|_| owner),
                    asker.is_some_and(|a| a.role == fleet_core::Role::Lead),
                    Known(self).names(),
                )
            }
            Ok(None) => unknown,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look up whether a name ended");
                unknown
            }
        }
    }

    pub(super) async fn describe(&self, message: Message) -> Delivered {
        let from_coord_id = self.coord_sender(&message).await;
        Delivered {
            from_name: match &from_coord_id {
                Some(coord_id) => coord_id.clone(),
                None => self.name_of(message.from).await,
            },
            from_coord_id,
            msg_id: message.msg_id,
            kind: message.kind,
            from: message.from,
            in_reply_to: message.in_reply_to,
            text: message.body,
            sent_ms: message.created_ms,
            trace_id: message.trace_id,
        }
    }

    /// The coordination id `message` came from, if it is coordination from a peer lead (only
    /// a `SEND`, and only with a coordinator, can be).
    pub(super) async fn coord_sender(&self, message: &Message) -> Option<String> {
        if message.kind != Kind::Send || self.config.coordinator.is_none() {
            return None;
        }
        let msg_id = message.msg_id;
        match self.db.run(move |s| s.coord_sender(msg_id)).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(%msg_id, error = %e, "cannot look up a coordination sender");
                None
            }
        }
    }

    /// Where `message` goes (the rule: [`place`]).
    pub(super) fn placement(&self, message: &Message) -> Placement {
        let recipient = self.sessions.lock().recipient(message.to);
        place(message.kind, recipient, self.afar.as_deref().is_some())
    }

    /// Accepts `message` into the local plane: held, queued, or failed if its recipient is
    /// gone; returns where it went. Duplicate ids are accepted once.
    pub(super) async fn deliver(
        self: &Arc<Self>,
        message: Message,
    ) -> Result<Placement, FleetError> {
        let placement = self.placement(&message);
        if placement == Placement::Hold {
            // Its one line (held, or refused at its cap) names the message itself: a span of its
            // own would only say so twice.
            return self.accept(message, placement).await;
        }
        let span = message_span(&message);
        self.accept(message, placement).instrument(span).await
    }

    /// [`LocalPlane::deliver`] of `message`, which goes to `placement`.
    async fn accept(
        self: &Arc<Self>,
        mut message: Message,
        placement: Placement,
    ) -> Result<Placement, FleetError> {
        match placement {
            Placement::Hold => {
                message.state = MsgState::Held;
                let to = message.to;
                if let Some(Err(full)) = self.hold(vec![message]).await?.pop() {
                    return Err(self.over_cap(to, &full).await);
                }
                return Ok(placement);
            }
            Placement::Queue => return self.queue_task(message).await,
            // Its own gateway keeps it: nothing of it is stored here (but what this one carries
            // through an outage, until the broker takes it).
            Placement::Remote => {
                return match self.afar.as_deref() {
                    Some(afar) => afar.send(self, message).await,
                    None => Ok(Placement::Dead),
                };
            }
            Placement::Dead => {}
        }
        message.state = MsgState::Failed("the recipient is gone".into());
        let (to, msg_id, trace_id, kind) =
            (message.to, message.msg_id, message.trace_id, message.kind);
        let fresh = self.store_one_within_cap(message).await?;
        tracing::info!(%trace_id, %msg_id, %kind, %to, fresh, ?placement, "accepted");
        if fresh {
            self.metrics.accepted(kind, placement);
        }
        Ok(placement)
    }

    /// Holds `to`'s queue while a brief from another host is queued for it ahead of its
    /// acknowledgement; false if `to` has no session here, or its pump or a poll holds the
    /// claim on its queue (it may be taking the next task off it already: the brief is then
    /// acknowledged before it is queued, as any other).
    pub(super) fn arriving(&self, to: Gid) -> bool {
        match self.sessions.lock().panes.get_mut(&to) {
            Some(session) if !session.claiming() => {
                session.arriving();
                true
            }
            _ => false,
        }
    }

    /// Lets `to`'s queue go on once a brief [`LocalPlane::arriving`] is settled with the broker.
    pub(super) fn arrived(&self, to: Gid) {
        if let Some(session) = self.sessions.lock().panes.get_mut(&to) {
            session.arrived();
        }
    }

    /// `brief`, a brief off the broker queued ahead of its acknowledgement, now that the
    /// broker is seen to have that: accepted as a delivered one is, its worker's queue let go;
    /// where it went.
    pub(super) async fn release_taken(self: &Arc<Self>, brief: &Message) -> Placement {
        let (msg_id, trace_id, kind, to) = (brief.msg_id, brief.trace_id, brief.kind, brief.to);
        tracing::info!(%trace_id, %msg_id, %kind, %to, fresh = true, placement = ?Placement::Queue, "accepted");
        self.arrived(to);
        self.queued(brief).await
    }

    /// What follows a message newly queued for its worker (`kept`): the worker's pump is
    /// kicked; where it went (dead if the session ended meanwhile).
    pub(super) async fn queued(self: &Arc<Self>, kept: &Message) -> Placement {
        let (to, kind) = (kept.to, kept.kind);
        {
            let (live, pulled) = match self.sessions.lock().panes.get_mut(&to) {
                Some(session) if session.status().is_live() => {
                    session.queued(tokio::time::Instant::now());
                    session.kick();
                    (true, session.pulls())
                }
                _ => (false, false),
            };
            // Queued for its own pull, it is as good as typed in: a sender on another host
            // hears so now, not only once it is pulled (its receipt bound would not wait for
            // the nudge).
            if pulled && let Some(afar) = self.afar_of(kept) {
                afar.injected(self, kept).await;
            }
            // Its session ended while the message was being stored, after the sweep of what
            // was on its way: fail it here, or it would wait forever.
            if !live {
                self.metrics.accepted(kind, Placement::Dead);
                let why = format!("'{}' is gone", self.name_of(to).await);
                // Boxed: failing notifies, and notifying delivers (a notice is never queued).
                Box::pin(self.fail(kept, &why)).await;
                return Placement::Dead;
            }
            self.metrics.accepted(kind, Placement::Queue);
        }
        Placement::Queue
    }

    /// Holds `messages` (each for an entity whose placement is [`Placement::Hold`]) in one
    /// transaction, and wakes their recipients' calls. Duplicate ids are accepted once; one
    /// whose recipient is at `gateway.max_held_per_recipient` is not stored: for each, held,
    /// or the cap that refused it. An answer a send of its recipient waits for is handed to
    /// that send instead: stored taken, in the same transaction (see [`super::inboxes`]).
    pub(super) async fn hold(
        self: &Arc<Self>,
        mut messages: Vec<Message>,
    ) -> Result<Vec<Result<(), Full>>, FleetError> {
        let handing: Vec<Option<(Claim, Message)>> =
            messages.iter_mut().map(|m| self.hand_over(m)).collect();
        if handing.iter().all(Option::is_none) {
            return self.store_and_wake(messages, handing).await;
        }
        // Stored taken, an answer must reach its send or be held again, even if this call is
        // dropped while it is stored (a request whose client went away): on a task of its own.
        let plane = Arc::clone(self);
        // In the caller's span: its log lines say whose call it was.
        let stored = self
            .tasks
            .spawn(async move { plane.store_and_wake(messages, handing).await }.in_current_span());
        stored
            .await
            .unwrap_or_else(|e| Err(FleetError::internal(format!("holding failed: {e}"))))
    }

    /// [`LocalPlane::hold`]'s store, and what follows for each message stored: handed (each
    /// with a hand in `handing`) or held, its recipient woken.
    async fn store_and_wake(
        self: &Arc<Self>,
        messages: Vec<Message>,
        handing: Vec<Option<(Claim, Message)>>,
    ) -> Result<Vec<Result<(), Full>>, FleetError> {
        let ids: Vec<(Gid, MsgId, TraceId, Kind, Option<MsgId>)> = messages
            .iter()
            .map(|m| (m.to, m.msg_id, m.trace_id, m.kind, m.in_reply_to))
            .collect();
        let outcomes = self.store_within_cap(messages).await?;
        for (((to, msg_id, trace_id, kind, answers), outcome), handing) in
            ids.into_iter().zip(&outcomes).zip(handing)
        {
            match outcome {
                Ok(fresh) => {
                    // A duplicate's claim goes unused; an answer comes back if the send it was
                    // for ended while it was stored.
                    let (handed, back) = match handing.filter(|_| *fresh) {
                        Some((claim, answer)) => match claim.give(answer) {
                            None => (true, None),
                            back => (false, back),
                        },
                        None => (false, None),
                    };
                    tracing::info!(%trace_id, %msg_id, %kind, %to, fresh, handed, placement = ?Placement::Hold, "accepted");
                    if !*fresh {
                        continue;
                    }
                    self.metrics.accepted(kind, Placement::Hold);
                    match back {
                        Some(answer) => self.held_again(answer).await,
                        None if handed => self.woken_by_handed(to, answers),
                        None => self.woken_by(to, answers),
                    }
                }
                Err(full) => {
                    tracing::warn!(%trace_id, %msg_id, %kind, %to, cap = %full, waiting = full.count, "REFUSED: its recipient has too many messages waiting");
                }
            }
        }
        Ok(outcomes.into_iter().map(|o| o.map(|_| ())).collect())
    }

    /// A hand for `message` if it answers a message whose sender, its recipient, waits for it
    /// in a send: `message` is then to be stored taken, and a copy handed once it is.
    fn hand_over(&self, message: &mut Message) -> Option<(Claim, Message)> {
        let answers = match (message.kind, message.in_reply_to) {
            (Kind::Reply | Kind::Failed, Some(answers)) => answers,
            _ => return None,
        };
        let claim = self.inboxes.claim(message.to, answers)?;
        message.state = MsgState::Consumed;
        Some((claim, message.clone()))
    }

    /// Wakes what waits for an answer of `to`'s to `answers` that was handed to a send of its,
    /// stored taken: that send, any other wait for that answer, and a wait for any answer to
    /// `to` (`Inboxes::watch_handed`). Nothing was held for `to`, so its calls waiting on its
    /// inbox (its other sends, a poll) are left asleep.
    fn woken_by_handed(&self, to: Gid, answers: Option<MsgId>) {
        self.inboxes.handed_to(to);
        if let Some(answered) = answers {
            self.inboxes.answered(answered);
        }
    }

    /// Wakes the calls of `to` that wait on its inbox (a pane-bound recipient that pulls is
    /// nudged too), and the sends waiting for an answer to `answers`: something for them was
    /// held.
    fn woken_by(&self, to: Gid, answers: Option<MsgId>) {
        self.inboxes.bump(to);
        if let Some(session) = self.sessions.lock().panes.get(&to) {
            session.kick();
        }
        if let Some(answered) = answers {
            self.inboxes.answered(answered);
        }
    }

    /// `answer`, stored taken for a send that ended before it took it, held for its
    /// recipient's pull as any other answer: at once, or (the store refusing) on a task of its
    /// own that tries again every [`HELD_AGAIN_RETRY`] until it can, or the gateway stops.
    async fn held_again(self: &Arc<Self>, answer: Message) {
        if self.hold_again(&answer).await {
            return;
        }
        let plane = Arc::clone(self);
        let later = async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(HELD_AGAIN_RETRY) => {}
                    () = plane.shutdown.cancelled() => {
                        tracing::error!(trace_id = %answer.trace_id, msg_id = %answer.msg_id, to = %answer.to, "an answer handed to a send that ended is left taken: fleetd is stopping and the store would not hold it again");
                        return;
                    }
                }
                if plane.hold_again(&answer).await {
                    return;
                }
            }
        };
        self.tasks.spawn(later.in_current_span());
    }

    /// One try of [`LocalPlane::held_again`]: whether the store took `answer` back as held
    /// (its recipient's calls are then woken).
    async fn hold_again(&self, answer: &Message) -> bool {
        let (to, msg_id, trace_id) = (answer.to, answer.msg_id, answer.trace_id);
        match self.db.run(move |s| s.release(&[msg_id])).await {
            Ok(()) => {
                tracing::info!(%trace_id, %msg_id, %to, "held: the send it was handed to had ended");
                self.woken_by(to, answer.in_reply_to);
                true
            }
            Err(e) => {
                tracing::error!(%trace_id, %msg_id, %to, error = %e, "an answer handed to a send that ended cannot be held for its recipient yet; trying again");
                false
            }
        }
    }

    /// Tells the sender of `original` that it was not delivered, as a held `FAILED` notice
    /// answering it (a blocked send returns it; otherwise `fleet_poll` does). A message gets
    /// one notice however many paths find it failed: the notice's id derives from its id.
    pub(super) async fn notify_failed(self: &Arc<Self>, original: &Message, reason: &str) {
        let notice = Message::notice(original, Kind::Failed, reason.to_string(), now_ms());
        // The reason may quote a screen (a stall's) or a pane host's answer.
        tracing::warn!(trace_id = %original.trace_id, msg_id = %original.msg_id, reason = %logs::summary(reason), "not delivered");
        logs::trace_text("failure reason", reason);
        if let Err(e) = self.deliver(notice.clone()).await {
            if e.code == ErrorCode::BrokerUnavailable
                && let Some(afar) = self.afar.as_deref()
            {
                // For a sender on another host: kept until the broker can take it.
                afar.keep(self, &notice).await;
            } else {
                tracing::error!(msg_id = %original.msg_id, error = %e, "could not record a failure notice");
            }
        }
    }

    /// The gid of a sender named `name` for a poll filter: a live entity, or the newest one
    /// of that name that is gone (its replies may still be held).
    pub(super) async fn resolve_sender(&self, name: &str) -> Result<Gid, FleetError> {
        if let Ok(gid) = name.parse::<Gid>() {
            return Ok(gid);
        }
        if let Ok(route) = self.resolve_route(name) {
            return Ok(route.entity().gid);
        }
        let owned = name.to_string();
        match self.db.run(move |s| s.latest_named(&owned)).await? {
            Some(record) => Ok(record.entity.gid),
            None => Err(self.resolve_route(name).err().unwrap_or_else(|| {
                FleetError::new(
                    ErrorCode::UnknownRecipient,
                    format!("nobody is named '{name}'"),
                )
            })),
        }
    }

    /// Fails `task` with `reason` and tells its sender, unless something else (the end of its
    /// recipient's session, say) failed it first and told them why.
    pub(super) async fn fail(self: &Arc<Self>, task: &Message, reason: &str) {
        let (msg_id, failed) = (task.msg_id, MsgState::Failed(reason.to_string()));
        match self.db.run(move |s| s.transition(msg_id, &failed)).await {
            Ok(()) => self.notify_failed(task, reason).await,
            Err(e) => {
                tracing::warn!(%msg_id, error = %e, reason = %logs::summary(reason), "not failed again");
            }
        }
    }
}

/// Where the gateway's answer watches send an answer handed to a send that ended without taking
/// it: held again for its recipient, on a task of the gateway's (a watch ends in a drop, which
/// cannot wait for the store).
pub(super) fn abandoned_answers(plane: Weak<LocalPlane>) -> Abandoned {
    Arc::new(move |answer: Message| {
        let (Some(plane), Ok(runtime)) = (plane.upgrade(), tokio::runtime::Handle::try_current())
        else {
            tracing::error!(msg_id = %answer.msg_id, "an answer handed to a send that ended is left taken: the gateway is gone");
            return;
        };
        let tasks = plane.tasks.clone();
        tasks.spawn_on(async move { plane.held_again(answer).await }, &runtime);
    })
}
