//! The trust checks as this gateway runs them on what comes off the broker: the facts each
//! rule of `fleet_core::trust` needs, looked up here (this host's registry, the roster, the
//! store), then the rule's answer acted on: passed, or refused with a loud log line and an
//! audit line.

use fleet_amqp::Delivery;
use fleet_core::admission::Handled;
use fleet_core::clock::now_ms;
use fleet_core::envelope::Envelope;
use fleet_core::ownership::{Action, Principal, RemoteAction, check};
use fleet_core::presence::Account;
use fleet_core::roster::Presence;
use fleet_core::trust::{
    Authority, GATEWAY_ENTRY, Place, Refusal, answered, answers_own, check_authority,
    check_broadcast_copy, check_presence_key, check_replay, check_sender, check_time, is_answer,
    needs_known_sender,
};
use fleet_core::{Entity, Gid, Kind, MsgId, Role};
use fleet_store::SentBetween;

use super::super::LocalPlane;
use super::Federation;
use super::settle::settle;
use super::trust::{MAX_HEARTBEAT_SENDERS, Patience, RECENT_BROADCASTS, Vouched};

impl Federation {
    /// Where `gid` is, and who it is: one of this host's, another host's as the roster heard
    /// it (or last heard it, if it left), or unknown.
    fn whereabouts(&self, g: &LocalPlane, gid: Gid) -> (Place, Option<Entity>) {
        let local = {
            let sessions = g.sessions.lock();
            sessions
                .leads
                .get(&gid)
                .map(|l| l.entity().clone())
                .or_else(|| sessions.panes.get(&gid).map(|s| s.entity().clone()))
        };
        if let Some(entity) = local {
            return (Place::Here, Some(entity));
        }
        let state = self.lock();
        let known = state
            .roster
            .entity(gid)
            .map(|entry| &entry.entity)
            .or_else(|| state.roster.departed(gid));
        match known {
            Some(entity) => (Place::There(entity.host.clone()), Some(entity.clone())),
            None => (Place::Unknown, None),
        }
    }

    /// Where the sender of `envelope` is. One not announced yet, of a message that needs its
    /// role, is waited for within `patience`: its host announces a new entity before it can
    /// send, but heartbeats and messages travel by different queues.
    async fn sender_of(
        &self,
        g: &LocalPlane,
        envelope: &Envelope,
        to_pane: bool,
        patience: &Patience<'_>,
    ) -> (Place, Option<Entity>) {
        let found = self.whereabouts(g, envelope.from);
        if found.0 != Place::Unknown || !needs_known_sender(envelope.kind, to_pane) {
            return found;
        }
        let mut heard = self.roster_heard.subscribe();
        loop {
            // Looked at again after subscribing: a heartbeat heard in between is not missed.
            let found = self.whereabouts(g, envelope.from);
            if found.0 != Place::Unknown {
                return found;
            }
            tokio::select! {
                changed = heard.changed() => if changed.is_err() { return found },
                () = tokio::time::sleep_until(patience.until) => return found,
                () = patience.stop.cancelled() => return found,
            }
        }
    }

    /// Checks 1, 3, 4 and, for a task, an ask or a broadcast, the authority rules: what can be
    /// judged one message at a time.
    pub(super) async fn check_one(
        &self,
        g: &LocalPlane,
        owner: Gid,
        delivery: &Delivery,
        envelope: &Envelope,
        patience: &Patience<'_>,
    ) -> Result<(), Refusal> {
        self.check_seal(envelope, delivery)?;
        let to_pane = g.sessions.lock().panes.contains_key(&owner);
        let (place, sender) = self.sender_of(g, envelope, to_pane, patience).await;
        check_sender(envelope, &place, &g.host_id, to_pane)?;
        let now = u64::try_from(now_ms()).unwrap_or(0);
        check_time(envelope, now, self.message_window())?;
        if matches!(envelope.kind, Kind::Send | Kind::Broadcast | Kind::Ask) {
            let (_, recipient) = self.whereabouts(g, owner);
            if envelope.kind == Kind::Broadcast
                && let Some(owner_entity) = &recipient
            {
                check_broadcast_copy(envelope, owner_entity, owner.minted_ms(), self.skew_ms())?;
            }
            let answers_own = matches!(envelope.kind, Kind::Ask | Kind::Send)
                && self.asks_of_own_task(g, owner, envelope).await;
            let facts = Authority {
                sender: sender.as_ref(),
                recipient: recipient.as_ref(),
                answers_own,
            };
            check_authority(envelope.kind, facts)?;
            // A lead's task (or broadcast's copy) for a worker here: its host must be admitted
            // to send, and the worker its own or shared with it, whatever message of the
            // worker's it cites (only a worker's own sends to its lead are about a task).
            if let Some(lead) = sender.as_ref().filter(|s| s.role == Role::Lead)
                && to_pane
                && matches!(envelope.kind, Kind::Send | Kind::Broadcast)
            {
                if lead.host != g.host_id {
                    self.allow
                        .check(lead, RemoteAction::Task)
                        .map_err(Refusal::NotGranted)?;
                }
                let sessions = g.sessions.lock();
                if let Some(s) = sessions.panes.get(&owner) {
                    check(Principal::Lead(lead), Action::Task, s.entity(), s.owned())
                        .map_err(|e| Refusal::NotGranted(e.message))?;
                }
            }
        }
        Ok(())
    }

    /// Whether an ask (or a send) for `owner` is about a task `owner` sent its sender (on the
    /// host it says).
    async fn asks_of_own_task(&self, g: &LocalPlane, owner: Gid, envelope: &Envelope) -> bool {
        match (envelope.in_reply_to, envelope.from_host.clone()) {
            (Some(task), Some(host)) => {
                self.sent_between(g, task, host, owner, envelope.from).await
            }
            _ => false,
        }
    }

    /// Whether this gateway published `msg_id` from `from` to `to` on `host`.
    pub(in crate::gateway) async fn sent_between(
        &self,
        g: &LocalPlane,
        msg_id: MsgId,
        host: String,
        from: Gid,
        to: Gid,
    ) -> bool {
        let key = (msg_id, host);
        let pending = self.lock().sent_pending.get(&key).copied();
        let sent = match pending {
            Some(sent) => Some(sent),
            None => {
                g.db.run(move |s| s.sent_to(&[key]))
                    .await
                    .ok()
                    .and_then(|mut found| found.pop().flatten())
            }
        };
        sent.is_some_and(|(by, went)| by == from && went == Some(to))
    }

    /// Checks 1, 3, 4 and 6 for a request off this host's control queue: signed, from a lead
    /// the roster knows on the host it says, in time. The lead, when it passes.
    pub(super) async fn check_control(
        &self,
        g: &LocalPlane,
        envelope: &Envelope,
        delivery: &Delivery,
        patience: &Patience<'_>,
    ) -> Result<Entity, Refusal> {
        self.check_seal(envelope, delivery)?;
        let (place, sender) = self.sender_of(g, envelope, false, patience).await;
        check_sender(envelope, &place, &g.host_id, false)?;
        let now = u64::try_from(now_ms()).unwrap_or(0);
        check_time(envelope, now, self.message_window())?;
        let facts = Authority {
            sender: sender.as_ref(),
            recipient: None,
            answers_own: false,
        };
        check_authority(Kind::Spawn, facts)?;
        sender.ok_or(Refusal::UnknownSender)
    }

    /// Checks 1, 3 and 4 for a message this gateway will answer but not deliver (one waiting
    /// for a worker a restart reaped): whoever it claims to be from is told only if that is
    /// who sent it.
    pub(super) fn check_genuine(
        &self,
        g: &LocalPlane,
        envelope: &Envelope,
        delivery: &Delivery,
    ) -> Result<(), Refusal> {
        self.check_expired(g, envelope, delivery)?;
        check_time(
            envelope,
            u64::try_from(now_ms()).unwrap_or(0),
            self.message_window(),
        )
    }

    /// Checks 1 and 3 for a message refused as expired, whose sender is told: only if that is
    /// who sent it.
    pub(super) fn check_expired(
        &self,
        g: &LocalPlane,
        envelope: &Envelope,
        delivery: &Delivery,
    ) -> Result<(), Refusal> {
        self.check_seal(envelope, delivery)?;
        let (place, _) = self.whereabouts(g, envelope.from);
        check_sender(envelope, &place, &g.host_id, false)
    }

    /// Check 5 and the answers' authority, against the store, for a batch off `owner`'s inbox:
    /// what passes. A refused message is dead-lettered; if the store cannot answer, the batch
    /// goes back to the broker to come again.
    pub(super) async fn check_batch(
        &self,
        g: &LocalPlane,
        owner: Gid,
        batch: Vec<Vouched>,
    ) -> Vec<Vouched> {
        if batch.is_empty() {
            return batch;
        }
        let arrivals: Vec<(MsgId, Gid, i64)> = batch
            .iter()
            .map(|v| {
                let until = self.remember_until(v.envelope.ts_ms);
                (v.envelope.msg_id, owner, until)
            })
            .collect();
        // For each answer, what it answers as recorded for its sending host; and, should one
        // find nothing there, this gateway's recent broadcasts (whose copies it may answer).
        let asked: Vec<(MsgId, String)> =
            batch.iter().filter_map(|v| answered(&v.envelope)).collect();
        // Read before the store, for the memory lets go of an entry only once the store has it.
        let pending = self.sent_pending(&asked);
        let in_memory: Vec<bool> = pending.iter().map(Option::is_some).collect();
        let looked =
            g.db.run(move |s| {
                let seen = s.see(&arrivals)?;
                let sent = s.sent_to(&asked)?;
                let unmatched = sent.iter().zip(&in_memory).any(|(s, m)| s.is_none() && !m);
                let broadcasts = if unmatched {
                    s.recent_broadcasts(RECENT_BROADCASTS)?
                } else {
                    Vec::new()
                };
                Ok((seen, sent, broadcasts))
            })
            .await;
        let (seen, sent, broadcasts) = match looked {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(%owner, error = %e, "cannot check messages off the broker against the store: they go back to the broker");
                for v in &batch {
                    settle(&v.delivery, Handled::NotStored, false).await;
                }
                return Vec::new();
            }
        };
        let mut sent = sent.into_iter().zip(pending);
        let mut passed = Vec::with_capacity(batch.len());
        for (v, seen) in batch.into_iter().zip(seen) {
            let exact = answered(&v.envelope)
                .and_then(|_| sent.next())
                .and_then(|(stored, pending)| stored.or(pending));
            let judged = check_replay(seen, v.delivery.redelivered()).and_then(|()| {
                if is_answer(v.envelope.kind) {
                    let facts = Authority {
                        sender: None,
                        recipient: None,
                        answers_own: answers_own(&v.envelope, exact, &broadcasts),
                    };
                    check_authority(v.envelope.kind, facts)
                } else {
                    Ok(())
                }
            });
            match judged {
                Ok(()) => passed.push(v),
                Err(refusal) => {
                    self.refuse_untrusted(&v.delivery, &v.envelope, &refusal)
                        .await;
                }
            }
        }
        passed
    }

    /// Where each of `asked` (`(msg_id, host)`) went, as the memory has it: what was just
    /// published may not be in the store yet.
    fn sent_pending(&self, asked: &[(MsgId, String)]) -> Vec<Option<SentBetween>> {
        let state = self.lock();
        asked
            .iter()
            .map(|key| state.sent_pending.get(key).copied())
            .collect()
    }

    /// Dead-letters `delivery`, refused by a trust check, with its log and audit lines.
    pub(super) async fn refuse_untrusted(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        refusal: &Refusal,
    ) {
        self.note_untrusted(delivery, envelope, refusal);
        settle(delivery, Handled::Refused, false).await;
    }

    /// The log line (thinned out: [`Federation::loud`]) and the audit line of a refusal (its
    /// settlement is the caller's).
    pub(super) fn note_untrusted(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        refusal: &Refusal,
    ) {
        let (loud, count) = self.loud();
        if loud {
            let (trace_id, msg_id, kind) = (envelope.trace_id, envelope.msg_id, envelope.kind);
            let host = envelope.from_host.as_deref().unwrap_or("(none)");
            tracing::error!(
                %trace_id, %msg_id, %kind, from = %envelope.from, from_host = ?host,
                check = refusal.reason(), why = %refusal, refused_so_far = count,
                "REFUSED a message off the broker that failed a trust check: dead-lettered"
            );
        }
        self.audit(
            envelope,
            delivery.body().len(),
            &format!("refused: {}", refusal.reason()),
        );
    }

    /// Takes out of `account` (of the host `envelope` is from) every entity that is this host's
    /// or another host announced, saying why of each.
    pub(super) fn unplaced(
        &self,
        g: &LocalPlane,
        envelope: &Envelope,
        account: &mut Account,
    ) -> Vec<String> {
        let mut why = Vec::new();
        account.states.retain(|s| {
            let (place, _) = self.whereabouts(g, s.entity.gid);
            match check_sender(envelope, &place, &g.host_id, false) {
                Ok(()) => true,
                Err(refusal) => {
                    why.push(format!("{}: {refusal}", s.entity.gid));
                    false
                }
            }
        });
        why
    }

    /// Checks a heartbeat from another host (`presence`, under `envelope`, its seal checked):
    /// its roster key (`key`: its routing key, or the key within one addressed to this host) and
    /// entity, that the entity is no other host's, its time, and that it
    /// is
    /// newer than the last one taken for the same entity (a replayed or delayed one cannot
    /// undo what a later one said). Remembers it as the last, when it passes.
    pub(super) fn check_heartbeat(
        &self,
        g: &LocalPlane,
        key: &str,
        envelope: &Envelope,
        presence: &Presence,
    ) -> Result<(), Refusal> {
        check_presence_key(key, envelope, presence.entity.as_ref())?;
        if let Some(entity) = &presence.entity {
            let (place, _) = self.whereabouts(g, entity.gid);
            check_sender(envelope, &place, &g.host_id, false)?;
        }
        let now = u64::try_from(now_ms()).unwrap_or(0);
        check_time(envelope, now, self.heartbeat_window())?;
        let host = envelope.from_host.clone().unwrap_or_default();
        let who = presence
            .entity
            .as_ref()
            .map_or_else(|| GATEWAY_ENTRY.to_string(), |e| e.gid.to_string());
        let mut state = self.lock();
        let key = (host, who);
        if let Some((ts, id)) = state.heartbeats_last.get(&key) {
            check_replay(*id == envelope.msg_id, false)?;
            if envelope.ts_ms < *ts {
                return Err(Refusal::Overtaken);
            }
        }
        if state.heartbeats_last.len() < MAX_HEARTBEAT_SENDERS
            || state.heartbeats_last.contains_key(&key)
        {
            state
                .heartbeats_last
                .insert(key, (envelope.ts_ms, envelope.msg_id));
        }
        Ok(())
    }
}
