//! Asks across hosts (U2, spec 10 §7.4): the conversation of a worker's `fleet_ask` with a lead
//! on another host, carried by `ASK`, `ANSWER`, `NO_WAITER`, `TOO_LATE` and `ABANDONED`, each
//! with the asking turn's id.
//!
//! The lead's gateway decides whether anyone listens: an `ASK` opens the question in its own
//! ask table (it surfaces on the lead's open `fleet_send` or `fleet_poll` as a local one
//! does), or is answered `NO_WAITER` at once. The lead's `fleet_send{turn_id}` goes back as
//! `ANSWER`; the worker's gateway hands it to the asking call only while that call waits (an
//! answer is never typed into a later turn), else answers `TOO_LATE`. A worker that stops
//! waiting sends `ABANDONED`, and the question is over for the lead too. Asks stay live only:
//! nothing of them is stored, and each expires with its asker's wait.
//!
//! A dialog on a worker's screen travels the same way: its turn id opens with `dialog-`, its
//! `ASK` carries the dialog (text and choices) as JSON, checked on arrival, and it waits for
//! the lead whether or not the lead listens now; the `ANSWER` is a choice, which the worker's
//! gateway checks against the dialog's choices before it presses that choice's key. It is
//! `ABANDONED` when the dialog goes away by itself.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::asks::listens_for;
use fleet_core::clock::now_ms;
use fleet_core::dialog::Dialog;
use fleet_core::envelope::Envelope;
use fleet_core::{ErrorCode, FleetError, Gid, Kind, Message, MsgId, MsgState, TraceId};

use super::super::LocalPlane;
use super::super::asks::Waiter;
use super::super::dialogs::{is_dialog_turn, take_answer};
use super::super::views::AskView;
use super::Federation;

/// The longest a turn id may be (this gateway writes `turn-<uuid>`, 41 characters).
const MAX_TURN_ID: usize = 64;

/// A message of an ask's conversation: `kind` from `from` to `to`, about message `about` (in
/// its flow).
fn notice(
    kind: Kind,
    from: Gid,
    to: Gid,
    (about, trace_id): (MsgId, TraceId),
    body: String,
) -> Message {
    Message {
        msg_id: MsgId::mint(),
        trace_id,
        kind,
        from,
        to,
        in_reply_to: Some(about),
        body,
        state: MsgState::Held,
        created_ms: now_ms(),
        expires_ms: None,
    }
}

/// The turn id of `envelope`, if it is one this gateway can use.
fn turn_of(envelope: &Envelope) -> Option<&str> {
    envelope.turn_id.as_deref().filter(|t| {
        !t.is_empty()
            && t.len() <= MAX_TURN_ID
            && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    })
}

/// How long (seconds, at least one) until `envelope` expires.
fn seconds_left(envelope: &Envelope) -> u64 {
    let now = u64::try_from(now_ms()).unwrap_or(0);
    (envelope.expires_at_ms.saturating_sub(now) / 1000).max(1)
}

/// A dialog as a worker's gateway on another host sent it: read, and checked (it came from
/// afar).
fn read_remote_dialog(text: &str) -> Result<Dialog, FleetError> {
    let dialog = serde_json::from_str::<Dialog>(text)
        .map_err(|e| FleetError::invalid(format!("a dialog that does not read: {e}")))?;
    dialog.check()?;
    Ok(dialog)
}

impl Federation {
    /// A checked message of an ask's conversation off `owner`'s inbox: handled here (true), or
    /// not one (false: it is held as any other).
    pub(super) async fn ask_flow(
        &self,
        g: &Arc<LocalPlane>,
        owner: Gid,
        envelope: &Envelope,
        body: &str,
    ) -> bool {
        let is_lead = g.sessions.lock().leads.contains_key(&owner);
        match envelope.kind {
            Kind::Ask if is_lead => self.asked_from_afar(g, owner, envelope, body).await,
            Kind::Abandoned if is_lead => {
                if let Some(turn) = turn_of(envelope) {
                    let over = g.sessions.lock().asks.abandon(turn, envelope.from);
                    tracing::info!(
                        turn_id = turn,
                        over,
                        "a worker on another host stopped waiting for its answer"
                    );
                }
            }
            Kind::Answer if !is_lead => self.answered_from_afar(g, owner, envelope, body).await,
            Kind::NoWaiter if !is_lead => {
                let closed = turn_of(envelope)
                    .and_then(|turn| g.sessions.lock().asks.close(turn, "nobody was waiting"));
                match closed {
                    Some((_, Waiter::Call(call))) => {
                        let lead = g.name_of(envelope.from).await;
                        let _ = call.send(Err(FleetError::new(
                            ErrorCode::NoWaiter,
                            format!(
                                "nobody is waiting for your question: '{lead}' is not waiting for you in a fleet call now. Decide yourself, and say what you decided in your fleet_reply"
                            ),
                        )));
                    }
                    // A dialog the lead's host did not take: asked afresh if it stays.
                    Some((asked, Waiter::Screen)) => {
                        g.dialog_over(
                            asked.from,
                            &asked.turn_id,
                            "its lead's host did not take it",
                        )
                        .await;
                    }
                    None => {}
                }
            }
            _ => return false,
        }
        true
    }

    /// An `ASK` for lead `lead` here from a worker on another host: open while the lead
    /// listens (its answer goes back as `ANSWER`), else `NO_WAITER` at once.
    async fn asked_from_afar(
        &self,
        g: &Arc<LocalPlane>,
        lead: Gid,
        ask: &Envelope,
        question: &str,
    ) {
        let worker = ask.from;
        let Some(turn) = turn_of(ask).map(str::to_string) else {
            tracing::warn!(msg_id = %ask.msg_id, "an ask from another host carries no usable turn id: dropped");
            return;
        };
        // A dialog on the worker's screen: its text and choices, checked (they came from afar).
        let dialog = if is_dialog_turn(&turn) {
            match read_remote_dialog(question) {
                Ok(dialog) => Some(dialog),
                Err(e) => {
                    // Why it does not read may quote the dialog.
                    tracing::warn!(msg_id = %ask.msg_id, code = %e.code, error = %crate::logs::summary(&e.message), "a dialog from another host is refused");
                    return;
                }
            }
        } else {
            None
        };
        let from_name = g.name_of(worker).await;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let asked = AskView {
            turn_id: turn.clone(),
            from: worker,
            from_name,
            host: ask.from_host.clone().unwrap_or_default(),
            question: question.to_string(),
            choices: None,
            in_task: ask.in_reply_to,
            asked_ms: now_ms(),
        };
        let open = self.open_remote_ask(g, lead, asked, dialog, tx);
        let ttl_s = seconds_left(ask);
        if !open {
            let name = g.name_of(lead).await;
            let body = format!("'{name}' is not waiting for you in a fleet call now");
            let no_waiter = notice(
                Kind::NoWaiter,
                lead,
                worker,
                (ask.msg_id, ask.trace_id),
                body,
            );
            if let Err(e) = self
                .publish_in_turn(g, &no_waiter, Some((&turn, ttl_s)))
                .await
            {
                tracing::warn!(turn_id = %turn, error = %e, "cannot tell a worker on another host that nobody waits");
            }
            return;
        }
        tracing::info!(gid = %worker, turn_id = %turn, %lead, "asked from another host");
        // What is said of the ask from then on is taken from the asker's host, between the two.
        if let Some(host) = ask.from_host.clone() {
            self.lock()
                .note_sent(&(ask.msg_id, host, lead, Some(worker)));
        }
        g.inboxes.bump(lead);
        self.await_lead(g, lead, ask.clone(), turn, rx);
    }

    /// Opens the ask `asked` (from a worker on another host; a `dialog` when it is one) for
    /// `lead`, answered on `tx`: a dialog always (it surfaces on the lead's next call), a
    /// question only while the lead listens for that worker. Whether it opened.
    fn open_remote_ask(
        &self,
        g: &LocalPlane,
        lead: Gid,
        mut asked: AskView,
        dialog: Option<Dialog>,
        tx: tokio::sync::oneshot::Sender<Result<String, FleetError>>,
    ) -> bool {
        let worker = asked.from;
        let mut sessions = g.sessions.lock();
        let listening = dialog.is_some()
            || sessions
                .leads
                .get(&lead)
                .is_some_and(|l| listens_for(l.listening(), worker));
        if !listening {
            return false;
        }
        if let Some(dialog) = dialog {
            // One dialog a worker: a newer one stands for what its screen shows now.
            if let Some(older) = sessions.asks.dialog_from(worker) {
                sessions
                    .asks
                    .close(&older, "a newer dialog of its worker replaced it");
            }
            asked.question = dialog.prompt;
            asked.choices = Some(dialog.choices);
        }
        sessions.asks.open(asked, lead, Waiter::Call(tx));
        true
    }

    /// Waits, in the background, for `lead`'s answer to the remote `ask` of turn `turn`
    /// (until the ask expires, or fleetd stops), and sends it back.
    fn await_lead(
        &self,
        g: &Arc<LocalPlane>,
        lead: Gid,
        ask: Envelope,
        turn: String,
        rx: tokio::sync::oneshot::Receiver<Result<String, FleetError>>,
    ) {
        self.start_task(g, move |fed, gateway| async move {
            let expires = Duration::from_millis(
                ask.expires_at_ms
                    .saturating_sub(u64::try_from(now_ms()).unwrap_or(0)),
            );
            tokio::select! {
                answered = rx => {
                    if let Ok(Ok(text)) = answered {
                        fed.answer_afar(&gateway, lead, &ask, &turn, text).await;
                    }
                }
                () = tokio::time::sleep(expires) => {
                    gateway.sessions.lock().asks.close(&turn, "it expired");
                }
                () = gateway.shutdown.cancelled() => {}
            }
        });
    }

    /// The lead's answer to an ask from another host, sent back as `ANSWER`; the lead is told
    /// if it cannot go.
    async fn answer_afar(
        &self,
        g: &Arc<LocalPlane>,
        lead: Gid,
        ask: &Envelope,
        turn: &str,
        text: String,
    ) {
        let answer = notice(
            Kind::Answer,
            lead,
            ask.from,
            (ask.msg_id, ask.trace_id),
            text,
        );
        if let Err(e) = self
            .publish_in_turn(g, &answer, Some((turn, seconds_left(ask))))
            .await
        {
            let why = format!(
                "your answer to the question {turn} could not reach its worker: {}",
                e.message
            );
            Box::pin(g.notify_failed(&answer, &why)).await;
        }
    }

    /// An `ANSWER` for `worker` here: to its asking call while it waits, else `TOO_LATE` back
    /// to the lead.
    async fn answered_from_afar(
        &self,
        g: &Arc<LocalPlane>,
        worker: Gid,
        answer: &Envelope,
        text: &str,
    ) {
        let Some(turn) = turn_of(answer).map(str::to_string) else {
            tracing::warn!(msg_id = %answer.msg_id, "an answer from another host carries no usable turn id: dropped");
            return;
        };
        let taken = {
            let mut sessions = g.sessions.lock();
            // A choice for a dialog here is checked before the ask is taken: one it does not
            // offer leaves the dialog asked, and nothing is pressed.
            let refused = match sessions.asks.for_answer(&turn, answer.from) {
                Ok(asked) => asked.dialog().and_then(|d| d.pick(text).err()),
                Err(_) => None,
            };
            match refused {
                Some(e) => Err(e),
                None => take_answer(&mut sessions, &turn, answer.from),
            }
        };
        let why = match taken {
            Ok((_, Waiter::Call(call))) => match call.send(Ok(text.to_string())) {
                Ok(()) => {
                    tracing::info!(gid = %worker, turn_id = %turn, "answered from another host");
                    return;
                }
                Err(_) => format!(
                    "the question {turn} is over (the worker stopped waiting); your answer was not delivered"
                ),
            },
            Ok((question, Waiter::Screen)) => match g.choose(&question, text.to_string()).await {
                Ok(()) => {
                    tracing::info!(gid = %worker, turn_id = %turn, "a dialog answered from another host");
                    return;
                }
                Err(e) => e.message,
            },
            Err(e) => e.message,
        };
        let too_late = notice(
            Kind::TooLate,
            worker,
            answer.from,
            (answer.msg_id, answer.trace_id),
            why,
        );
        if let Err(e) = self.publish_in_turn(g, &too_late, Some((&turn, 60))).await {
            tracing::warn!(turn_id = %turn, error = %e, "cannot tell a lead on another host its answer came too late");
        }
    }

    /// The asking call of `ask` (to a lead on another host) stopped waiting: that lead hears
    /// the question is over.
    pub(in crate::gateway) async fn ask_abandoned(
        &self,
        g: &LocalPlane,
        ask: &Message,
        turn: &str,
    ) {
        let abandoned = notice(
            Kind::Abandoned,
            ask.from,
            ask.to,
            (ask.msg_id, ask.trace_id),
            "the worker stopped waiting for an answer".into(),
        );
        if let Err(e) = self.publish_in_turn(g, &abandoned, Some((turn, 60))).await {
            tracing::debug!(turn_id = %turn, error = %e, "cannot tell a lead on another host an ask is over (it expires there)");
        }
    }
}
