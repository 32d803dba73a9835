//! The host's side of the control plane: its `control.<host>` queue consumed, each request
//! checked as a task is (signed, from a lead the roster knows, in time, granted), carried out by
//! its own launcher and readiness gate (or its own stop), and answered as a local call would be.

use super::*;

impl Federation {
    /// Consumes this host's control queue until the link goes: each request checked, then
    /// carried out in a task of its own.
    pub(in crate::gateway::federation) async fn consume_control(
        self: Arc<Self>,
        g: Arc<LocalPlane>,
        mut deliveries: Deliveries,
    ) {
        let g = &g;
        let stop = g.shutdown.child_token();
        loop {
            let next = tokio::select! {
                next = deliveries.next() => next,
                () = stop.cancelled() => return,
            };
            match next {
                Some(Ok(delivery)) => self.on_control(g, delivery, &stop).await,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "control consumer failed");
                    return;
                }
                None => return,
            }
        }
    }

    /// A request off the control queue: refused (dead-lettered, and its lead told if it is
    /// genuine), or carried out and answered.
    async fn on_control(&self, g: &Arc<LocalPlane>, delivery: Delivery, stop: &CancellationToken) {
        let envelope = match delivery.envelope() {
            Ok(envelope) => envelope,
            Err(e) => {
                let (loud, count) = self.loud();
                if loud {
                    tracing::error!(error = %e, refused_so_far = count, "REFUSED a malformed control request: dead-lettered");
                }
                settle(&delivery, Handled::Refused, false).await;
                return;
            }
        };
        let patience = Patience {
            until: tokio::time::Instant::now() + self.patience(),
            stop,
        };
        let lead = match self.check_control(g, &envelope, &delivery, &patience).await {
            Ok(lead) => lead,
            Err(refusal) => {
                self.refuse_untrusted(&delivery, &envelope, &refusal).await;
                return;
            }
        };
        let size = delivery.body().len();
        let checked = check_request(
            &envelope,
            delivery.routing_key(),
            &g.host_id,
            delivery.body(),
        );
        let (gid, request) = match checked {
            Ok(taken) => taken,
            Err(why) => return self.refuse_request(g, &envelope, &delivery, &why).await,
        };
        if let Err(why) = self.granted(g, &lead, gid, &request) {
            tracing::warn!(trace_id = %envelope.trace_id, msg_id = %envelope.msg_id, %gid, lead = %lead.name, lead_host = %lead.host, why, "REFUSED a control request this host does not grant");
            self.audit(&envelope, size, "refused: not granted");
            let answer = ControlAnswer::Failed {
                code: ErrorCode::Forbidden,
                message: why,
            };
            self.answer_control(g, &envelope, gid, &answer).await;
            settle(&delivery, Handled::Noted, false).await;
            return;
        }
        self.audit(&envelope, size, "control: taken");
        tracing::info!(trace_id = %envelope.trace_id, msg_id = %envelope.msg_id, %gid, lead = %lead.name, lead_host = %lead.host, "control request taken");
        self.start_task(g, move |fed, gateway| async move {
            let answer = fed.carry_out(&gateway, &lead, gid, request).await;
            if let Some(answer) = answer {
                fed.answer_control(&gateway, &envelope, gid, &answer).await;
            }
            settle(&delivery, Handled::Noted, false).await;
        });
    }

    /// Carries out `request` about worker `gid` from `lead` (of another host, its request
    /// checked and granted): what to answer, if anything.
    async fn carry_out(
        &self,
        g: &Arc<LocalPlane>,
        lead: &Entity,
        gid: Gid,
        request: ControlRequest,
    ) -> Option<ControlAnswer> {
        match request {
            ControlRequest::Spawn {
                profile,
                name,
                cwd,
                groups,
                architect,
                share,
            } => {
                let request = SpawnRequest {
                    profile,
                    name,
                    host: None,
                    cwd: cwd.map(Into::into),
                    groups,
                    role: if architect {
                        Role::Architect
                    } else {
                        Role::Worker
                    },
                    // Checked on arrival: each names its host.
                    share: parse_shares(share.iter().map(String::as_str), &lead.host)
                        .unwrap_or_default(),
                };
                self.control_spawn(g, lead, gid, request).await
            }
            ControlRequest::Stop => Some(self.control_stop(g, lead, gid).await),
        }
    }

    /// Dead-letters a control request that does not hold up (`why`), its lead answered when
    /// the request names the worker it is about.
    async fn refuse_request(
        &self,
        g: &Arc<LocalPlane>,
        envelope: &Envelope,
        delivery: &Delivery,
        why: &str,
    ) {
        tracing::error!(trace_id = %envelope.trace_id, msg_id = %envelope.msg_id, why, "REFUSED a control request: dead-lettered");
        self.audit(envelope, delivery.body().len(), "refused: control request");
        if let Some(gid) = envelope.spawn_id {
            let answer = ControlAnswer::Failed {
                code: ErrorCode::InvalidParams,
                message: format!("the request was refused: {why}"),
            };
            self.answer_control(g, envelope, gid, &answer).await;
        }
        settle(delivery, Handled::Refused, false).await;
    }

    /// Whether this host grants `lead` (of another host) `request` about worker `gid`: what
    /// `[federation.allow]` lets its host (or it) do here, a spawn's named directory under
    /// `gateway.workdir_roots`, a stop of its own worker only. Why not, naming the key to set.
    fn granted(
        &self,
        g: &LocalPlane,
        lead: &Entity,
        gid: Gid,
        request: &ControlRequest,
    ) -> Result<(), String> {
        match request {
            ControlRequest::Spawn { profile, .. } => {
                self.allow.check(lead, RemoteAction::Spawn { profile })?;
                if g.workdirs.roots().is_empty() {
                    return Err(format!(
                        "host '{}' starts no worker for a lead of another host: it has no [gateway] workdir_roots to keep one in",
                        g.host_id
                    ));
                }
                Ok(())
            }
            ControlRequest::Stop => {
                self.allow.check(lead, RemoteAction::Stop)?;
                let sessions = g.sessions.lock();
                match sessions.panes.get(&gid) {
                    Some(s) => check(Principal::Lead(lead), Action::Stop, s.entity(), s.owned())
                        .map_err(|e| e.message),
                    // Unknown here: the stop says so.
                    None => Ok(()),
                }
            }
        }
    }

    /// Spawns worker `gid` for `lead` of another host, unless it was spawned already (a
    /// request delivered again): then what became of it, or nothing while that first spawn
    /// still runs (it answers).
    async fn control_spawn(
        &self,
        g: &Arc<LocalPlane>,
        lead: &Entity,
        gid: Gid,
        request: SpawnRequest,
    ) -> Option<ControlAnswer> {
        let known = g.sessions.lock().panes.get(&gid).map(|s| {
            (
                s.status(),
                s.entity().name.clone(),
                s.pane().map(|p| p.0.clone()),
                s.profile().name.clone(),
                s.start_dialog().map(|asked| asked.turn_id.clone()),
            )
        });
        match known {
            Some((WorkerStatus::Spawning, ..)) => return None,
            Some((status, name, pane, profile, dialog)) if status.is_live() => {
                return Some(ControlAnswer::Spawned {
                    name,
                    pane: pane.unwrap_or_default(),
                    profile,
                    dialog,
                });
            }
            Some(_) => return Some(gone_already(gid)),
            None => {}
        }
        if matches!(g.db.run(move |s| s.entity(gid)).await, Ok(Some(_))) {
            return Some(gone_already(gid));
        }
        let ct = g.shutdown.child_token();
        Some(match g.spawn_here(lead, request, gid, &ct).await {
            Ok(spawned) => ControlAnswer::Spawned {
                name: spawned.name,
                pane: spawned.pane,
                profile: spawned.profile,
                dialog: spawned.dialog.map(|d| d.turn_id),
            },
            Err(e) => ControlAnswer::Failed {
                code: e.code,
                message: e.message,
            },
        })
    }

    /// Stops worker `gid` of this host for `lead` of another.
    async fn control_stop(&self, g: &Arc<LocalPlane>, lead: &Entity, gid: Gid) -> ControlAnswer {
        let found = g
            .sessions
            .lock()
            .panes
            .get(&gid)
            .map(|s| (s.entity().name.clone(), s.status()));
        match found {
            Some((name, status)) if status.is_live() => {
                tracing::info!(%gid, lead = %lead.name, lead_host = %lead.host, "stopped by a lead of another host");
                let reason = format!("stopped by lead '{}@{}'", lead.name, lead.host);
                g.end_session(gid, &reason, true).await;
                ControlAnswer::Stopped { name }
            }
            Some((name, _)) => ControlAnswer::Failed {
                code: ErrorCode::Gone,
                message: format!("'{name}' is gone already"),
            },
            None => ControlAnswer::Failed {
                code: ErrorCode::UnknownRecipient,
                message: format!("no worker {gid} is on host '{}'", g.host_id),
            },
        }
    }

    /// Answers the control request under `request` (about worker `gid`) in its lead's inbox;
    /// kept for the broker while it cannot be reached.
    async fn answer_control(
        &self,
        g: &Arc<LocalPlane>,
        request: &Envelope,
        gid: Gid,
        answer: &ControlAnswer,
    ) {
        let body = match serde_json::to_string(answer) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(error = %e, "cannot write a control answer");
                return;
            }
        };
        let reply = Message {
            msg_id: MsgId::mint(),
            trace_id: request.trace_id,
            kind: Kind::Reply,
            from: gid,
            to: request.from,
            in_reply_to: Some(request.msg_id),
            body,
            state: MsgState::Held,
            created_ms: now_ms(),
            expires_ms: None,
        };
        match g.deliver(reply.clone()).await {
            Err(e) if e.code == ErrorCode::BrokerUnavailable => {
                self.keep_for_broker(g, &reply).await
            }
            Err(e) => {
                tracing::error!(trace_id = %request.trace_id, error = %e, "cannot answer a control request");
            }
            Ok(_) => {}
        }
    }
}

/// The answer about a worker spawned here before and gone since.
fn gone_already(gid: Gid) -> ControlAnswer {
    ControlAnswer::Failed {
        code: ErrorCode::Gone,
        message: format!("worker {gid} was spawned here before and is gone"),
    }
}
