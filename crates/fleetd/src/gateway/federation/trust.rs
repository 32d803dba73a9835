//! The trust checks on what comes off the broker, in the order `fleet_core::trust` gives
//! them: the facts each rule needs are looked up here (this host's registry, the roster, the
//! store), the rules decide, and a refusal is dead-lettered with a loud log line and an audit
//! line `refused: <reason>`. The gateway carries on.

use std::time::Duration;

use fleet_amqp::Delivery;
use fleet_core::admission::Handled;
use fleet_core::clock::now_ms;
use fleet_core::envelope::Envelope;
use fleet_core::roster::Presence;
use fleet_core::signing::{KEY_ID_HEADER, SIG_HEADER};
use fleet_core::trust::{
    Authority, Place, Refusal, Seal, Window, answered, check_authority, check_presence_key,
    check_replay, check_seal, check_sender, check_time, is_answer, needs_known_sender,
};
use fleet_core::{Entity, Gid, Kind, MsgId};

use super::super::Gateway;
use super::Federation;
use super::inbox::settle;

/// The most heartbeat ids remembered against replay; past it the oldest half is let go (a
/// flood of distinct forged heartbeats is refused by its signatures before it gets here).
const MAX_HEARTBEATS_SEEN: usize = 100_000;

/// A message off an inbox that passed the checks made one by one, waiting for those made
/// against the store for the whole batch.
pub(super) struct Vouched {
    pub(super) delivery: Delivery,
    pub(super) envelope: Envelope,
    pub(super) body: String,
}

impl Federation {
    /// The signature headers and the broker login of `delivery`.
    fn seal_of(delivery: &Delivery) -> Seal<'_> {
        Seal {
            sig: delivery.text_header(SIG_HEADER),
            key_id: delivery.text_header(KEY_ID_HEADER),
            login: delivery.login(),
        }
    }

    /// Check 1, unless this gateway was told to take unsigned messages (a lab).
    fn check_seal(&self, envelope: &Envelope, delivery: &Delivery) -> Result<(), Refusal> {
        if self.config.insecure_unsigned {
            return Ok(());
        }
        check_seal(
            &self.trust,
            envelope,
            delivery.body(),
            Self::seal_of(delivery),
        )
    }

    /// The window messages on an inbox are judged by.
    fn message_window(&self) -> Window {
        Window {
            skew_ms: self.config.clock_skew_s.saturating_mul(1000),
            max_age_ms: self.config.max_message_age_s.saturating_mul(1000),
        }
    }

    /// The window heartbeats are judged by: one older than the roster keeps an entry is no
    /// news, and a replayed one must not bring back what left.
    fn heartbeat_window(&self) -> Window {
        Window {
            skew_ms: self.config.clock_skew_s.saturating_mul(1000),
            max_age_ms: self
                .config
                .presence_ttl_s
                .saturating_add(self.config.clock_skew_s)
                .saturating_mul(1000),
        }
    }

    /// Until when (Unix ms) the id of a message stamped `ts_ms` is remembered: as long as it
    /// could pass [`check_time`].
    fn remember_until(&self, ts_ms: u64) -> i64 {
        let window = self.message_window();
        let until = ts_ms
            .saturating_add(window.max_age_ms)
            .saturating_add(window.skew_ms);
        i64::try_from(until).unwrap_or(i64::MAX)
    }
}

impl Gateway {
    /// Where `gid` is, and who it is: one of this host's, another host's as the roster heard
    /// it, or unknown.
    fn whereabouts(&self, fed: &Federation, gid: Gid) -> (Place, Option<Entity>) {
        let local = {
            let sessions = self.lock();
            sessions
                .leads
                .get(&gid)
                .map(|l| l.entity.clone())
                .or_else(|| sessions.panes.get(&gid).map(|s| s.entity.clone()))
        };
        if let Some(entity) = local {
            return (Place::Here, Some(entity));
        }
        match fed.lock().roster.entity(gid) {
            Some(entry) => (
                Place::There(entry.entity.host.clone()),
                Some(entry.entity.clone()),
            ),
            None => (Place::Unknown, None),
        }
    }

    /// Where the sender of `envelope` is. One not announced yet, of a message that needs its
    /// role, is waited for until a heartbeat could have told (`federation.presence_ttl_s`):
    /// its host announces a new entity before it can send, but heartbeats and messages travel
    /// by different queues.
    async fn sender_of(&self, fed: &Federation, envelope: &Envelope) -> (Place, Option<Entity>) {
        let found = self.whereabouts(fed, envelope.from);
        if found.0 != Place::Unknown || !needs_known_sender(envelope.kind) {
            return found;
        }
        let mut heard = fed.roster_heard.subscribe();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(fed.config.presence_ttl_s);
        loop {
            let found = self.whereabouts(fed, envelope.from);
            if found.0 != Place::Unknown {
                return found;
            }
            tokio::select! {
                changed = heard.changed() => if changed.is_err() { return found },
                () = tokio::time::sleep_until(deadline) => return found,
                () = self.shutdown.cancelled() => return found,
            }
        }
    }

    /// Checks 1, 3, 4 and, for a task or a broadcast, the sender's authority: what can be
    /// judged one message at a time.
    pub(super) async fn check_one(
        &self,
        owner: Gid,
        delivery: &Delivery,
        envelope: &Envelope,
    ) -> Result<(), Refusal> {
        let Some(fed) = self.fed() else {
            return Ok(());
        };
        fed.check_seal(envelope, delivery)?;
        let (place, sender) = self.sender_of(fed, envelope).await;
        check_sender(envelope, &place, &self.host_id)?;
        let now = u64::try_from(now_ms()).unwrap_or(0);
        check_time(envelope, now, fed.message_window())?;
        if matches!(envelope.kind, Kind::Send | Kind::Broadcast | Kind::Ask) {
            let (_, recipient) = self.whereabouts(fed, owner);
            let facts = Authority {
                sender: sender.as_ref(),
                recipient: recipient.as_ref(),
                answers_own: false,
            };
            check_authority(envelope.kind, facts)?;
        }
        Ok(())
    }

    /// Check 5 and the answers' authority, against the store, for a batch off `owner`'s inbox:
    /// what passes. A refused message is dead-lettered; if the store cannot answer, the batch
    /// goes back to the broker to come again.
    pub(super) async fn check_batch(&self, owner: Gid, batch: Vec<Vouched>) -> Vec<Vouched> {
        let Some(fed) = self.fed() else {
            return batch;
        };
        if batch.is_empty() {
            return batch;
        }
        let arrivals: Vec<(MsgId, Gid, i64)> = batch
            .iter()
            .map(|v| {
                let until = fed.remember_until(v.envelope.ts_ms);
                (v.envelope.msg_id, owner, until)
            })
            .collect();
        // For each answer, whether what it answers went to its sending host.
        let asked: Vec<(MsgId, String)> =
            batch.iter().filter_map(|v| answered(&v.envelope)).collect();
        let looked = self
            .db(move |s| Ok((s.see(&arrivals)?, s.sent_to(&asked)?)))
            .await;
        let (seen, sent) = match looked {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(%owner, error = %e, "cannot check messages off the broker against the store: they go back to the broker");
                for v in &batch {
                    settle(&v.delivery, Handled::NotStored, false).await;
                }
                return Vec::new();
            }
        };
        let mut sent = sent.into_iter();
        let mut passed = Vec::with_capacity(batch.len());
        for (v, seen) in batch.into_iter().zip(seen) {
            let answers_own = answered(&v.envelope).is_some() && sent.next().unwrap_or(false);
            let judged = check_replay(seen, v.delivery.redelivered()).and_then(|()| {
                if is_answer(v.envelope.kind) {
                    let facts = Authority {
                        sender: None,
                        recipient: None,
                        answers_own,
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

    /// Dead-letters `delivery`, refused by a trust check, with a loud log line (thinned out at
    /// powers of two past the first few, so a flood cannot flood the log) and an audit line.
    pub(super) async fn refuse_untrusted(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        refusal: &Refusal,
    ) {
        self.note_untrusted(delivery, envelope, refusal);
        settle(delivery, Handled::Refused, false).await;
    }

    /// The log and audit lines of a refusal (its settlement is the caller's).
    pub(super) fn note_untrusted(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        refusal: &Refusal,
    ) {
        let Some(fed) = self.fed() else {
            return;
        };
        let count = {
            let mut state = fed.lock();
            state.refused += 1;
            state.refused
        };
        if count <= 16 || count.is_power_of_two() {
            let (trace_id, msg_id, kind) = (envelope.trace_id, envelope.msg_id, envelope.kind);
            let host = envelope.from_host.as_deref().unwrap_or("(none)");
            tracing::error!(
                %trace_id, %msg_id, %kind, from = %envelope.from, from_host = ?host,
                check = refusal.reason(), why = %refusal, refused_so_far = count,
                "REFUSED a message off the broker that failed a trust check: dead-lettered"
            );
        }
        fed.audit(
            envelope,
            delivery.body().len(),
            &format!("refused: {}", refusal.reason()),
        );
    }

    /// Checks a heartbeat from another host (`presence`, under `envelope`): its seal, its
    /// routing key and entity, that the entity is no other host's, its time, and that it was
    /// not taken before.
    pub(super) fn check_heartbeat(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        presence: &Presence,
    ) -> Result<(), Refusal> {
        let Some(fed) = self.fed() else {
            return Ok(());
        };
        fed.check_seal(envelope, delivery)?;
        check_presence_key(delivery.routing_key(), envelope, presence.entity.as_ref())?;
        if let Some(entity) = &presence.entity {
            let (place, _) = self.whereabouts(fed, entity.gid);
            check_sender(envelope, &place, &self.host_id)?;
        }
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let window = fed.heartbeat_window();
        check_time(envelope, now, window)?;
        let mut state = fed.lock();
        let until = envelope
            .ts_ms
            .saturating_add(window.max_age_ms)
            .saturating_add(window.skew_ms);
        if state.heartbeats_seen.len() >= MAX_HEARTBEATS_SEEN {
            state.heartbeats_seen.retain(|_, kept| *kept > now);
        }
        if state.heartbeats_seen.len() >= MAX_HEARTBEATS_SEEN {
            state.heartbeats_seen.clear();
        }
        let seen = state
            .heartbeats_seen
            .insert(envelope.msg_id, until)
            .is_some();
        check_replay(seen, false)
    }
}

/// Forgets the heartbeat ids that could no longer pass the time check.
pub(super) fn forget_heartbeats(fed: &Federation) {
    let now = u64::try_from(now_ms()).unwrap_or(0);
    fed.lock().heartbeats_seen.retain(|_, until| *until > now);
}
