//! The control plane (U4, spec 10 §7.2): `fleet_spawn` and `fleet_stop` for another host.
//!
//! The caller's gateway publishes a `SPAWN` to `fleet.control` keyed by the host id (the
//! request in its body, the worker's gid as its `spawnId`) and waits for the answer, a `REPLY`
//! from that gid to the lead's inbox, which goes to the waiting call instead of being held.
//! The host's gateway consumes its own `control.<host>` queue: it checks each request as it
//! checks a task (signed, from a lead the roster knows, in time), runs its own launcher and
//! readiness gate (or stops its worker), and answers with the entity or the error, as a local
//! call would have. A request delivered twice spawns once: the gid is taken only once.

use std::sync::Arc;
use std::time::Duration;

use fleet_amqp::topology::CONTROL_EXCHANGE;
use fleet_amqp::{Deliveries, Delivery, Outgoing, Published};
use fleet_core::admission::Handled;
use fleet_core::clock::now_ms;
use fleet_core::control::{
    ControlAnswer, ControlRequest, Target, check_request, read_answer, read_request, spawn_target,
};
use fleet_core::envelope::Envelope;
use fleet_core::ownership::{Action, Principal, RemoteAction, check, parse_shares};
use fleet_core::{
    Entity, ErrorCode, FleetError, Gid, Kind, Message, MsgId, MsgState, Role, TraceId, WorkerStatus,
};
use tokio::sync::oneshot;

use super::super::LocalPlane;
use super::super::spawn::SpawnRequest;
use super::super::start_dialogs::start_dialog_note;
use super::super::views::{DialogView, SpawnResult, StopResult, Surfaced};
use super::settle::settle;
use super::trust::Patience;
use super::{Federation, Sent, not_taken, outgoing, publish_outcome, unavailable};
use crate::gateway::Caller;
use tokio_util::sync::CancellationToken;

/// The most control requests whose answers are watched for at once; past it, those whose
/// calls gave up are forgotten (a late answer to one is then held as it came).
const MAX_CONTROL_CALLS: usize = 10_000;

/// A control request this gateway published, by its message id.
pub(super) struct ControlCall {
    /// Its call, waiting for the answer; `None` once it stopped waiting (a late answer is held
    /// for the lead, in words).
    waiting: Option<oneshot::Sender<(Envelope, String)>>,
    /// It asked for an architect: one started after its consult stopped waiting is stopped.
    architect: bool,
}

/// Marks a control call given up however it ends (answered calls are gone from the table
/// already).
struct CallGuard<'a> {
    fed: &'a Federation,
    msg_id: MsgId,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.fed.lock();
        if let Some(call) = state.control.get_mut(&self.msg_id) {
            call.waiting = None;
        }
    }
}

impl Federation {
    /// Where a spawn asked for `requested` (another host than this one, if any) goes: here,
    /// or a host whose gateway the roster hears from.
    pub(in crate::gateway) fn spawn_target(
        &self,
        g: &LocalPlane,
        requested: Option<&str>,
    ) -> Result<Target, FleetError> {
        let Some(_) = requested else {
            return Ok(Target::Here);
        };
        if self.link().is_none() && !self.fails_over() {
            return Err(unavailable("nothing can be spawned on another host now"));
        }
        let now = now_ms();
        let state = self.lock();
        let (mut known, mut quiet) = (Vec::new(), Vec::new());
        for (host, h) in state.roster.hosts() {
            if h.unreachable_since_ms.is_some() {
                let silent_s = now.saturating_sub(h.heard_ms).max(0) / 1000;
                quiet.push((host, u64::try_from(silent_s).unwrap_or(0)));
            } else {
                known.push(host);
            }
        }
        spawn_target(requested, &g.host_id, &known, &quiet)
    }

    /// `fleet_spawn` on `host`: its gateway spawns the worker, and the call returns what it
    /// answers (once the roster knows the worker, so it can be sent to at once).
    pub(in crate::gateway::federation) async fn spawn_remote(
        &self,
        g: &Arc<LocalPlane>,
        caller: &Caller,
        request: SpawnRequest,
        host: &str,
        ct: &CancellationToken,
    ) -> Result<SpawnResult, FleetError> {
        let gid = Gid::mint();
        let cwd = match request.cwd {
            Some(dir) => Some(dir.into_os_string().into_string().map_err(|dir| {
                FleetError::invalid(format!("the cwd {dir:?} is not UTF-8 text"))
            })?),
            None => None,
        };
        let asked = ControlRequest::Spawn {
            profile: request.profile,
            name: request.name,
            cwd,
            groups: request.groups,
            architect: request.role == Role::Architect,
            share: request.share.iter().map(ToString::to_string).collect(),
        };
        match self
            .control_call(g, &caller.entity, host, gid, &asked, ct)
            .await?
        {
            ControlAnswer::Spawned {
                name,
                pane,
                profile,
                dialog,
            } => {
                self.await_announced(g, gid).await;
                let (status, dialog, note) = match dialog {
                    Some(turn) => {
                        let asked = self
                            .await_asked(g, (caller.entity.gid, gid, host), &turn, ct)
                            .await;
                        let note = match &asked {
                            Some(dialog) => start_dialog_note(dialog),
                            None => format!(
                                "'{name}' stopped on a dialog of its own program while starting; it is asked of you as {turn}, which your next fleet call (fleet_poll) shows: answer with fleet_send{{turn_id, choice}}"
                            ),
                        };
                        (WorkerStatus::Blocked, asked, Some(note))
                    }
                    None => (WorkerStatus::Idle, None, None),
                };
                Ok(SpawnResult {
                    gid,
                    name,
                    host: host.to_string(),
                    pane,
                    profile,
                    status,
                    dialog,
                    note,
                })
            }
            ControlAnswer::Failed { code, message } => Err(FleetError::new(
                code,
                format!("on host '{host}': {message}"),
            )),
            ControlAnswer::Stopped { .. } => Err(FleetError::internal(format!(
                "host '{host}' answered a spawn as if it were a stop"
            ))),
        }
    }

    /// `fleet_stop` of `worker`, another host's: its gateway stops it.
    pub(in crate::gateway::federation) async fn stop_remote(
        &self,
        g: &Arc<LocalPlane>,
        caller: &Caller,
        worker: &Entity,
    ) -> Result<StopResult, FleetError> {
        let host = worker.host.as_str();
        let ct = g.shutdown.child_token();
        match self
            .control_call(
                g,
                &caller.entity,
                host,
                worker.gid,
                &ControlRequest::Stop,
                &ct,
            )
            .await?
        {
            ControlAnswer::Stopped { name } => Ok(StopResult {
                gid: worker.gid,
                name,
                status: WorkerStatus::Gone,
            }),
            ControlAnswer::Failed { code, message } => Err(FleetError::new(
                code,
                format!("on host '{host}': {message}"),
            )),
            ControlAnswer::Spawned { .. } => Err(FleetError::internal(format!(
                "host '{host}' answered a stop as if it were a spawn"
            ))),
        }
    }

    /// Publishes `request` about worker `gid` to `host`'s control queue, from `lead`, and waits
    /// for its answer (`federation.control_wait_s` at most).
    async fn control_call(
        &self,
        g: &Arc<LocalPlane>,
        lead: &Entity,
        host: &str,
        gid: Gid,
        request: &ControlRequest,
        ct: &CancellationToken,
    ) -> Result<ControlAnswer, FleetError> {
        let body = serde_json::to_vec(request)
            .map_err(|e| FleetError::internal(format!("cannot write the request: {e}")))?;
        // What the host would refuse is refused here first, with the same words.
        read_request(&body).map_err(FleetError::invalid)?;
        let Some(link) = self.link_soon().await else {
            return Err(unavailable(&format!(
                "host '{host}' cannot be asked anything now"
            )));
        };
        let wait_s = self.config.control_wait_s;
        let (msg_id, trace_id) = (MsgId::mint(), TraceId::mint());
        let envelope = Envelope {
            spawn_id: Some(gid),
            from_name: Some(lead.name.clone()),
            ..outgoing(
                &g.host_id,
                Kind::Spawn,
                (msg_id, trace_id),
                lead.gid,
                host.to_string(),
                wait_s,
            )
        };
        // The answer is taken from that host, from that gid, to this lead only.
        let sent = (msg_id, host.to_string(), lead.gid, Some(gid));
        let rx = self.open_control_call(msg_id, request, &sent);
        let _guard = CallGuard { fed: self, msg_id };
        match self.remember_sent(g, vec![sent.clone()]).await {
            Ok(()) => self.lock().sent_kept(&sent),
            Err(e) => {
                tracing::warn!(%msg_id, error = %e, "where the control request went is remembered in memory only");
            }
        }
        let signature = self.sign(&envelope, &body);
        let started = tokio::time::Instant::now();
        let published = link
            .publish(Outgoing {
                exchange: CONTROL_EXCHANGE,
                key: host,
                envelope: &envelope,
                signature: &signature,
                body: &body,
                mandatory: true,
                persistent: true,
            })
            .await;
        g.metrics.published(started.elapsed());
        let outcome = publish_outcome(&published, "refused");
        self.audit(&envelope, body.len(), outcome);
        tracing::info!(%trace_id, %msg_id, %gid, %host, outcome, "control request published");
        control_published(published.map_err(not_taken)?, host)?;
        let answer = self.control_answer(g, rx, host, wait_s, ct).await?;
        read_answer(answer.as_bytes()).map_err(|why| {
            FleetError::internal(format!("host '{host}' answered what cannot be read: {why}"))
        })
    }

    /// Waits for the answer `rx` brings from `host`, `wait_s` at most.
    async fn control_answer(
        &self,
        g: &LocalPlane,
        rx: oneshot::Receiver<(Envelope, String)>,
        host: &str,
        wait_s: u64,
        ct: &CancellationToken,
    ) -> Result<String, FleetError> {
        tokio::select! {
            got = rx => got
                .map(|(_, answer)| answer)
                .map_err(|_| FleetError::internal("the control call was dropped")),
            () = tokio::time::sleep(Duration::from_secs(wait_s)) => Err(FleetError::new(
                ErrorCode::Timeout,
                format!(
                    "host '{host}' did not answer within {wait_s} s (federation.control_wait_s); it may still carry the request out: fleet_list will show what it did"
                ),
            )),
            () = ct.cancelled() => Err(FleetError::new(
                ErrorCode::Cancelled,
                "the call was cancelled; the other host may still carry the request out",
            )),
            () = g.shutdown.cancelled() => {
                Err(FleetError::new(ErrorCode::Gone, "fleetd is shutting down"))
            }
        }
    }

    /// Waits (a heartbeat's time at most) until the roster knows `gid`.
    async fn await_announced(&self, g: &LocalPlane, gid: Gid) {
        let mut heard = self.roster_heard.subscribe();
        let until = tokio::time::Instant::now() + self.patience();
        while self.lock().roster.entity(gid).is_none() {
            tokio::select! {
                changed = heard.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(until) => return,
                () = g.shutdown.cancelled() => return,
            }
        }
    }

    /// The dialog `turn` of the spawn of `worker` on `host` for `lead`, once its `ASK` opened
    /// it here (it comes through the lead's inbox, not with the spawn's answer): a dialog of
    /// that worker's, from that host, or none. `None` if it did not come within the
    /// federation's patience.
    async fn await_asked(
        &self,
        g: &LocalPlane,
        (lead, worker, host): (Gid, Gid, &str),
        turn: &str,
        ct: &CancellationToken,
    ) -> Option<DialogView> {
        let mut bumped = g.inboxes.watch(lead);
        let until = tokio::time::Instant::now() + self.patience();
        loop {
            bumped.borrow_and_update();
            {
                let mut sessions = g.sessions.lock();
                let found = sessions.asks.for_answer(turn, lead).ok().map(|asked| {
                    (asked.from == worker && asked.host == host && asked.choices.is_some())
                        .then(|| asked.clone())
                });
                match found {
                    Some(Some(asked)) => {
                        // The spawn's answer hands it out (unless nobody will read it): the
                        // lead's next call does not again.
                        if !ct.is_cancelled() {
                            sessions.asks.hand_out(turn, lead);
                        }
                        return Surfaced::from(asked).dialog();
                    }
                    // Another's dialog under that turn: not this spawn's.
                    Some(None) => return None,
                    None => {}
                }
            }
            tokio::select! {
                changed = bumped.changed() => if changed.is_err() { return None },
                () = tokio::time::sleep_until(until) => return None,
                () = g.shutdown.cancelled() => return None,
            }
        }
    }

    /// An answer (from the inbox of `lead`, checked) to a control request of this gateway goes
    /// to the call awaiting it: true if it went. An answer whose call gave up is held for the
    /// lead in words (an architect it started is stopped: no consult waits for it); anything
    /// else is not a control answer.
    pub(super) fn control_answered(
        &self,
        g: &Arc<LocalPlane>,
        lead: Gid,
        envelope: &Envelope,
        body: &mut String,
    ) -> bool {
        let Some(original) = envelope.in_reply_to else {
            return false;
        };
        if envelope.kind != Kind::Reply {
            return false;
        }
        let Some(call) = self.lock().control.remove(&original) else {
            return false;
        };
        if let Some(tx) = call.waiting
            && tx.send((envelope.clone(), body.clone())).is_ok()
        {
            return true;
        }
        let host = envelope.from_host.as_deref().unwrap_or("?");
        if let Ok(answer) = read_answer(body.as_bytes()) {
            if answer.orphans(call.architect) {
                self.stop_orphan(g, lead, envelope.from);
            }
            *body = answer.late(host, envelope.from, call.architect);
        }
        false
    }

    /// Stops architect `gid`, started on another host for a consult of `lead`'s that stopped
    /// waiting before it was there: nobody will consult it.
    fn stop_orphan(&self, g: &Arc<LocalPlane>, lead: Gid, gid: Gid) {
        self.start_task(g, move |fed, gateway| async move {
            fed.await_announced(&gateway, gid).await;
            let caller = gateway.sessions.lock().leads.get(&lead).map(|l| Caller {
                entity: l.entity_shared(),
            });
            let Some(caller) = caller else {
                return;
            };
            match gateway.stop(&caller, &gid.to_string()).await {
                Ok(_) => tracing::info!(%gid, "an architect started after its consult stopped waiting is stopped"),
                Err(e) => tracing::warn!(%gid, error = %e, "cannot stop an architect started after its consult stopped waiting"),
            }
        });
    }
}

mod serve;

impl Federation {
    /// Opens the control call `msg_id` for `request`, noting where it went (`sent`): its
    /// answer comes on the receiver.
    fn open_control_call(
        &self,
        msg_id: MsgId,
        request: &ControlRequest,
        sent: &Sent,
    ) -> oneshot::Receiver<(Envelope, String)> {
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        if state.control.len() >= MAX_CONTROL_CALLS {
            state.control.retain(|_, call| call.waiting.is_some());
        }
        let architect = matches!(
            request,
            ControlRequest::Spawn {
                architect: true,
                ..
            }
        );
        let call = ControlCall {
            waiting: Some(tx),
            architect,
        };
        state.control.insert(msg_id, call);
        state.note_sent(sent);
        rx
    }
}

/// What a control request's publish to `host` came to: routed, or why not.
fn control_published(published: Published, host: &str) -> Result<(), FleetError> {
    match published {
        Published::Routed => Ok(()),
        Published::Unroutable => Err(FleetError::new(
            ErrorCode::Gone,
            format!(
                "host '{host}' has no control queue on the broker: its gateway has not run with this fleetd's control plane"
            ),
        )),
        Published::Refused => Err(FleetError::new(
            ErrorCode::BrokerUnavailable,
            format!("the broker refused the request for host '{host}'"),
        )),
    }
}
