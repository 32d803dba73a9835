//! Sending through the broker: a message to a remote entity's inbox (its outcome decided by
//! the broker's confirm and return), a broadcast, an `INJECTED` receipt, and the envelope of
//! everything this gateway publishes.

use fleet_amqp::topology::{BROADCAST_ALL, MSG_EXCHANGE, QueueType, broadcast_key};
use fleet_amqp::{Outgoing, Published};
use fleet_core::envelope::{Envelope, VERSION};
use fleet_core::{Entity, ErrorCode, FleetError, Gid, Kind, Message, MsgId, TraceId};
use fleet_store::{AwaitedReceipt, SentRecord};
use tokio::time::Instant;

use super::super::LocalPlane;
use super::{Federation, Sent, not_taken, publish_outcome, unavailable};
use crate::gateway::afar::Broadcast;
use fleet_core::clock::now_ms;
use fleet_core::delivery::Placement;

/// What a sender whose message found its recipient's inbox full is told, by the type of the
/// inbox: a classic one dead-letters what it refuses, a quorum one only refuses it.
fn full_inbox(kind: QueueType) -> &'static str {
    match kind {
        QueueType::Classic => {
            "has a full inbox: the broker refused the message (it went to the dead letters)"
        }
        QueueType::Quorum => {
            "has a full inbox: the broker refused the message, which was not delivered"
        }
    }
}

/// Why the broker did not take a message to an inbox (the words follow its recipient's name);
/// `None` when it was routed.
fn refused_why(published: Published, inbox: QueueType) -> Option<(ErrorCode, &'static str)> {
    match published {
        Published::Routed => None,
        Published::Unroutable => Some((
            ErrorCode::Gone,
            "has no inbox on the broker any more: it is gone",
        )),
        Published::Refused => Some((ErrorCode::BrokerUnavailable, full_inbox(inbox))),
    }
}

/// Why copies of a broadcast were refused, as its sender is told.
fn broadcast_refused(published: Published, inbox: QueueType) -> Vec<String> {
    match (published, inbox) {
        (Published::Refused, QueueType::Classic) => vec![
            "an inbox was full and refused its copy (a FAILED notice names it)".to_string(),
        ],
        (Published::Refused, QueueType::Quorum) => vec![
            "an inbox on another host was full and refused its copy (a quorum queue's refusal does not say whose)".to_string(),
        ],
        (Published::Routed | Published::Unroutable, _) => Vec::new(),
    }
}

impl Federation {
    /// Where broadcast `msg_id` from `from` to `group` (every worker when `None`) goes, as
    /// the roster knows: a record for every host and every remote copy (each copy's answers
    /// are taken from its recipient's host only; a copy the roster did not know of is matched
    /// by its id, see `fleet_core::trust::answers_own`), and how many remote workers take one.
    fn broadcast_ways(&self, msg_id: MsgId, from: Gid, group: Option<&str>) -> (Vec<Sent>, usize) {
        let in_group = |e: &Entity| {
            e.role.is_pane_bound() && group.is_none_or(|g| e.groups.iter().any(|x| x == g))
        };
        let remote: Vec<(Gid, String)> = self
            .lock()
            .roster
            .entities()
            .filter(|e| in_group(&e.entity))
            .map(|e| (e.entity.gid, e.entity.host.clone()))
            .collect();
        let hosts: std::collections::BTreeSet<&String> = remote.iter().map(|(_, h)| h).collect();
        let mut sent = vec![(msg_id, "*".to_string(), from, None)];
        sent.extend(hosts.into_iter().map(|h| (msg_id, h.clone(), from, None)));
        sent.extend(remote.iter().map(|(gid, host)| {
            let copy = msg_id.derived(&gid.to_string());
            (copy, host.clone(), from, Some(*gid))
        }));
        (sent, remote.len())
    }
}

impl Federation {
    /// Publishes `message` to its remote recipient's inbox. Unroutable (no such inbox) and
    /// refused (inbox full) are errors, as is an unreachable broker: nothing is buffered.
    pub(super) async fn publish_remote(
        &self,
        g: &LocalPlane,
        message: &Message,
    ) -> Result<Placement, FleetError> {
        self.publish_in_turn(g, message, None).await
    }

    /// [`Self::publish_remote`], for a message of an ask's conversation: `turn` is the
    /// asking turn's id, and how long (seconds) the message is good for.
    pub(super) async fn publish_in_turn(
        &self,
        g: &LocalPlane,
        message: &Message,
        turn: Option<(&str, u64)>,
    ) -> Result<Placement, FleetError> {
        let Some(link) = self.link_soon().await else {
            return Err(unavailable(&format!(
                "'{}' on another host cannot be reached now; nothing was queued",
                g.name_of(message.to).await
            )));
        };
        let envelope = Envelope {
            in_reply_to: message.in_reply_to,
            turn_id: turn.map(|(id, _)| id.to_string()),
            from_name: Some(g.name_of(message.from).await),
            ..outgoing(
                &g.host_id,
                message.kind,
                (message.msg_id, message.trace_id),
                message.from,
                message.to.to_string(),
                turn.map_or(self.config.inbox_message_ttl_s, |(_, ttl_s)| ttl_s),
            )
        };
        let body = message.body.as_bytes();
        // Where it goes is remembered before it goes (in memory at once, so an answer however
        // quick is matched; in the store alongside the publish, so a restart keeps it): an
        // answer from there is taken, one from anywhere else refused.
        let record = self.going_to(message);
        let signature = self.sign(&envelope, body);
        let publish = async {
            let started = Instant::now();
            let outgoing = Outgoing {
                exchange: MSG_EXCHANGE,
                key: &envelope.to,
                envelope: &envelope,
                signature: &signature,
                body,
                mandatory: true,
                persistent: true,
            };
            let published = self.publish_over(link, outgoing).await;
            g.metrics.published(started.elapsed());
            published
        };
        let remember = async {
            match record.clone() {
                Some(record) => self.remember_sent(g, vec![record]).await,
                None => Ok(()),
            }
        };
        let (published, remembered) = tokio::join!(publish, remember);
        match (remembered, record) {
            (Ok(()), Some(record)) => self.lock().sent_kept(&record),
            (Err(e), Some(_)) => {
                tracing::warn!(msg_id = %message.msg_id, error = %e, "where the message went is remembered in memory only: an answer after a restart will be refused");
            }
            _ => {}
        }
        let outcome = publish_outcome(&published, "refused: inbox full");
        self.audit(&envelope, body.len(), outcome);
        tracing::info!(trace_id = %message.trace_id, msg_id = %message.msg_id, kind = %message.kind, to = %message.to, outcome, "published");
        match refused_why(published.map_err(not_taken)?, self.broker.queue_type) {
            None => Ok(Placement::Remote),
            Some((code, why)) => {
                let to_name = g.name_of(message.to).await;
                Err(FleetError::new(code, format!("'{to_name}' {why}")))
            }
        }
    }

    /// Where `message` goes, noted in memory now (for a kind whose answer is matched to it):
    /// its id, its recipient's host, its sender and recipient; `None` when nothing answers it
    /// or no host is known for its recipient.
    fn going_to(&self, message: &Message) -> Option<Sent> {
        if !matches!(
            message.kind,
            Kind::Send | Kind::Ask | Kind::Reply | Kind::Answer
        ) {
            return None;
        }
        let Some(host) = self.host_of(message.to) else {
            tracing::warn!(msg_id = %message.msg_id, to = %message.to, "no host is known for the recipient: what answers this message will be refused");
            return None;
        };
        let record = (message.msg_id, host, message.from, Some(message.to));
        self.lock().note_sent(&record);
        Some(record)
    }

    /// Remembers a brief published to a remote worker, to fail it loudly if its `INJECTED`
    /// receipt does not come in time — in the store too, so a restart keeps the bound.
    pub(super) async fn track_remote_brief(&self, g: &LocalPlane, message: &Message) {
        self.lock().receipts.track(
            message.msg_id,
            message.from,
            message.to,
            message.trace_id,
            Instant::now().into_std(),
        );
        let brief = AwaitedReceipt {
            msg_id: message.msg_id,
            sender: message.from,
            recipient: message.to,
            trace_id: message.trace_id,
        };
        if let Err(e) = g.db.run(move |s| s.await_receipt(&brief)).await {
            tracing::warn!(msg_id = %message.msg_id, error = %e, "the receipt bound of a brief is kept in memory only: a restart forgets it");
        }
    }

    /// Stops awaiting the receipts of `msg_ids` (come, answered, overdue, or the brief was not
    /// published after all), in memory and in the store.
    pub(super) async fn receipts_settled(&self, g: &LocalPlane, msg_ids: Vec<MsgId>) {
        if msg_ids.is_empty() {
            return;
        }
        {
            let mut state = self.lock();
            for id in &msg_ids {
                if state.receipts.state(*id) == Some("queued") {
                    state.receipts.forget(*id);
                }
            }
        }
        if let Err(e) = g.db.run(move |s| s.receipts_settled(&msg_ids)).await {
            tracing::warn!(error = %e, "settled receipts stay in the store: a restart fails their briefs at the bound");
        }
    }

    /// Stops awaiting the receipts of what `sender` sent (a worker a restart reaped: it is
    /// no longer there to be told).
    pub(super) async fn receipts_sent_by(&self, g: &LocalPlane, sender: Gid) {
        let sent = self.lock().receipts.sent_by(sender);
        self.receipts_settled(g, sent).await;
    }

    /// At start: awaits again the receipts a previous run was awaiting, their bound counted
    /// from now.
    pub(super) async fn await_receipts_again(&self, g: &LocalPlane) -> Result<(), FleetError> {
        let awaited = g.db.run(|s| s.awaited_receipts()).await?;
        let now = Instant::now().into_std();
        let mut state = self.lock();
        for brief in &awaited {
            state.receipts.track(
                brief.msg_id,
                brief.sender,
                brief.recipient,
                brief.trace_id,
                now,
            );
        }
        if !awaited.is_empty() {
            tracing::info!(
                briefs = awaited.len(),
                "awaiting the receipts a previous run awaited"
            );
        }
        Ok(())
    }

    /// `fleet_broadcast` through the broker: one publish, a copy in every bound inbox.
    /// Returns how many workers may take a copy (this host's the sender may task, and the
    /// other hosts' the roster knows to be bound), and why some got no copy (an inbox that was
    /// full refused its copy, which the publisher's confirm says, not whose).
    pub(super) async fn publish_broadcast(
        &self,
        g: &LocalPlane,
        broadcast: Broadcast<'_>,
    ) -> Result<(usize, Vec<String>), FleetError> {
        let Broadcast {
            from,
            group,
            text,
            ids: (msg_id, trace_id),
        } = broadcast;
        let Some(link) = self.link_soon().await else {
            return Err(unavailable("the broadcast was not sent"));
        };
        let key = group.map_or_else(|| BROADCAST_ALL.to_string(), broadcast_key);
        let envelope = Envelope {
            from_name: Some(from.name.clone()),
            ..outgoing(
                &g.host_id,
                Kind::Broadcast,
                (msg_id, trace_id),
                from.gid,
                key.clone(),
                self.config.inbox_message_ttl_s,
            )
        };
        let (sent, remote) = self.broadcast_ways(msg_id, from.gid, group);
        self.remember_sent(g, sent).await?;
        let signature = self.sign(&envelope, text.as_bytes());
        // An empty group is legal silence: not mandatory.
        let started = Instant::now();
        let outgoing = Outgoing {
            exchange: MSG_EXCHANGE,
            key: &key,
            envelope: &envelope,
            signature: &signature,
            body: text.as_bytes(),
            mandatory: false,
            persistent: true,
        };
        let published = self.publish_over(link, outgoing).await;
        g.metrics.published(started.elapsed());
        self.audit(
            &envelope,
            text.len(),
            if published.is_ok() {
                "published"
            } else {
                "broker unavailable"
            },
        );
        let refused = broadcast_refused(published.map_err(not_taken)?, self.broker.queue_type);
        g.metrics.accepted(Kind::Send, Placement::Remote);
        // This host's copies reach only the workers the sender may task; another host's
        // workers are counted as they are heard of (each host types only its owner's and
        // shared ones' copies: at most this many).
        let local = g.sessions.lock().taskable(from, group).len();
        Ok((local + remote, refused))
    }

    /// Remembers that each `(msg_id, host, from, to)` was published from `from` to `to` (an
    /// entity on `host`), for as long as settled messages are kept
    /// (`gateway.keep_messages_days`): answers about it are taken from that host, between
    /// those two, only.
    pub(super) async fn remember_sent(
        &self,
        g: &LocalPlane,
        sent: Vec<Sent>,
    ) -> Result<(), FleetError> {
        let days = i64::try_from(g.config.gateway.keep_messages_days).unwrap_or(i64::MAX);
        let until_ms = now_ms().saturating_add(days.saturating_mul(86_400_000));
        let rows: Vec<SentRecord> = sent
            .into_iter()
            .map(|(msg_id, host, from, to)| SentRecord {
                msg_id,
                host,
                from,
                to,
                until_ms,
            })
            .collect();
        // Written with other calls' records that come at the same time: one commit for many.
        g.sent_rows.store(rows).await.map(drop)
    }
}

/// An envelope from the gateway of `host`, stamped now and expiring after `ttl_s`.
pub(in crate::gateway) fn outgoing(
    host: &str,
    kind: Kind,
    (msg_id, trace_id): (MsgId, TraceId),
    from: Gid,
    to: String,
    ttl_s: u64,
) -> Envelope {
    let ts_ms = u64::try_from(now_ms()).unwrap_or(0);
    Envelope {
        version: VERSION,
        kind,
        msg_id,
        trace_id,
        from,
        to,
        turn_id: None,
        spawn_id: None,
        in_reply_to: None,
        from_name: None,
        from_host: Some(host.to_string()),
        ts_ms,
        expires_at_ms: ts_ms.saturating_add(ttl_s.saturating_mul(1000)),
    }
}
