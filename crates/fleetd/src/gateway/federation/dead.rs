//! This host's dead letters (spec 10 §10 "Inbox caps"): the broker sorts every dead letter
//! whose `fromHost` is this host into `fleet.dlq.<host>`, and the consumer here tells the
//! sender of a message that expired unread in its recipient's inbox (the recipient's gateway
//! down, say), or of a broadcast's copy a full inbox refused, with one `FAILED` notice, as if
//! from that recipient. What `fleet_core::dead` decides is acted on: a dead letter not sealed
//! by this gateway is dropped with a thinned error line, others quietly; `fleet.dlq` keeps
//! every one.
//!
//! At least once: a dead letter is acknowledged once its notice is stored. The notice's id
//! derives from the message's (`Message::notice`), so a redelivered dead letter, or one whose
//! brief the receipt bound failed meanwhile, finds the notice there and makes no second; a
//! brief awaiting its `INJECTED` receipt stops awaiting it.

use std::sync::Arc;

use fleet_amqp::topology::inbox_owner;
use fleet_amqp::{Deliveries, Delivery};
use fleet_core::admission::Handled;
use fleet_core::clock::now_ms;
use fleet_core::dead::{Candidate, Dropped, Record, confirm, failure, screen};
use fleet_core::delivery::Recipient;
use fleet_core::envelope::Envelope;
use fleet_core::{ErrorCode, FleetError, Gid, Kind, Message, MsgId};

use super::super::LocalPlane;
use super::Federation;
use super::settle::settle;

/// Where a message was recorded as published: `(id, from, to)`.
type Sent = Vec<(MsgId, Gid, Option<Gid>)>;

impl Federation {
    /// Consumes this host's dead letters until the link or the gateway goes.
    pub(super) async fn consume_dead_letters(
        self: Arc<Self>,
        g: Arc<LocalPlane>,
        mut deliveries: Deliveries,
    ) {
        let g = &g;
        loop {
            let next = tokio::select! {
                next = deliveries.next() => next,
                () = g.shutdown.cancelled() => return,
            };
            match next {
                Some(Ok(delivery)) => {
                    let handled = self.on_dead_letter(g, &delivery).await;
                    settle(&delivery, handled, false).await;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "dead-letter consumer failed");
                    return;
                }
                None => return,
            }
        }
    }

    /// One dead letter: its sender told, or it let go; how it is settled.
    async fn on_dead_letter(&self, g: &Arc<LocalPlane>, delivery: &Delivery) -> Handled {
        let Ok(envelope) = delivery.envelope() else {
            g.metrics.dead_letter(delivery.death().cause, false);
            let (loud, count) = self.loud();
            if loud {
                tracing::error!(
                    refused_so_far = count,
                    "a dead letter with no envelope this gateway reads: dropped (fleet.dlq keeps it)"
                );
            }
            return Handled::Dropped;
        };
        let death = delivery.death();
        let recipient = death.queue.as_deref().and_then(inbox_owner);
        let seal = self.check_own_seal(&envelope, delivery);
        let candidate = match screen(&envelope, death.cause, recipient, seal, &g.host_id) {
            Ok(candidate) => candidate,
            Err(dropped) => return self.drop_dead_letter(g, delivery, &envelope, &dropped),
        };
        let record = match self.record_of(g, &candidate).await {
            Ok(record) => record,
            Err(e) => {
                tracing::error!(msg_id = %envelope.msg_id, error = %e, "cannot check a dead letter against the store: it goes back to the broker");
                return Handled::NotStored;
            }
        };
        let (sent, injected, answered, sender_here) = record;
        let facts = Record {
            sent: &sent,
            injected,
            answered,
            sender_here,
        };
        if let Err(dropped) = confirm(&candidate, facts) {
            return self.drop_dead_letter(g, delivery, &envelope, &dropped);
        }
        self.tell_dead(g, delivery, &envelope, &candidate).await
    }

    /// What this gateway recorded of `candidate`'s message: where it was published (in the
    /// store, or in memory only, just published or the store failing), whether its `INJECTED`
    /// receipt came, and whether its sender is still here (a lead, or a worker whose session
    /// is live).
    async fn record_of(
        &self,
        g: &LocalPlane,
        candidate: &Candidate,
    ) -> Result<(Sent, bool, bool, bool), FleetError> {
        let ids = candidate.ids();
        let (mut sent, injected) = {
            let state = self.lock();
            let pending: Vec<_> = state
                .sent_pending
                .iter()
                .filter(|((id, _), _)| ids.contains(id))
                .map(|((id, _), (from, to))| (*id, *from, *to))
                .collect();
            let injected = state.receipts.state(candidate.original) == Some("injected");
            (pending, injected)
        };
        let original = candidate.original;
        let (records, answered) =
            g.db.run(move |s| Ok((s.sent_records(&ids)?, s.is_answered(original)?)))
                .await?;
        sent.extend(records);
        let sender_here = matches!(
            g.sessions.lock().recipient(candidate.sender),
            Recipient::Lead | Recipient::Pane { live: true }
        );
        Ok((sent, injected, answered, sender_here))
    }

    /// Lets a dead letter go, with its log line (an error, thinned, when it speaks of a
    /// forgery) and its audit line.
    fn drop_dead_letter(
        &self,
        g: &LocalPlane,
        delivery: &Delivery,
        envelope: &Envelope,
        dropped: &Dropped,
    ) -> Handled {
        let (trace_id, msg_id, kind) = (envelope.trace_id, envelope.msg_id, envelope.kind);
        let cause = delivery.death().cause;
        g.metrics.dead_letter(cause, false);
        if dropped.suspicious() {
            let (loud, count) = self.loud();
            if loud {
                let host = envelope.from_host.as_deref().unwrap_or("(none)");
                tracing::error!(
                    %trace_id, %msg_id, %kind, from_host = ?host, %cause, why = %dropped,
                    refused_so_far = count,
                    "DROPPED a dead letter: its sender is not told (fleet.dlq keeps it)"
                );
            }
        } else {
            tracing::debug!(%trace_id, %msg_id, %kind, %cause, why = %dropped, "a dead letter nobody is to be told of");
        }
        self.audit(
            envelope,
            delivery.body().len(),
            &format!("dead letter dropped: {}", dropped.reason()),
        );
        Handled::Dropped
    }

    /// Tells the sender of `candidate`'s message it died unread, with a held `FAILED` notice
    /// from its recipient; stops awaiting its receipt. Acknowledged once the notice is stored.
    async fn tell_dead(
        &self,
        g: &Arc<LocalPlane>,
        delivery: &Delivery,
        envelope: &Envelope,
        candidate: &Candidate,
    ) -> Handled {
        let death = delivery.death();
        let reason = failure(
            death,
            envelope.ts_ms,
            &self.shown_name(g, candidate.recipient).await,
        );
        let original = envelope
            .held_for(candidate.recipient, String::new(), now_ms())
            .with_id(candidate.original);
        let notice = Message::notice(&original, Kind::Failed, reason.clone(), now_ms());
        let (trace_id, msg_id) = (envelope.trace_id, candidate.original);
        let size = delivery.body().len();
        // The same dead letter delivered again tells nobody twice (the notice's id derives from
        // the message's), and counts once.
        let notice_id = notice.msg_id;
        let told_before = matches!(g.db.run(move |s| s.message(notice_id)).await, Ok(Some(_)));
        match g.deliver(notice).await {
            Ok(_) => {
                if !told_before {
                    g.metrics.dead_letter(death.cause, true);
                }
                self.receipts_settled(g, vec![candidate.original]).await;
                tracing::warn!(%trace_id, %msg_id, cause = %death.cause, reason, "dead-lettered by the broker: its sender is told");
                self.audit(
                    envelope,
                    size,
                    &format!("dead letter: {}, sender told", death.cause),
                );
                Handled::Held
            }
            Err(e) if e.code == ErrorCode::TooMany => {
                g.metrics.dead_letter(death.cause, false);
                tracing::error!(%trace_id, %msg_id, error = %e, "a dead letter's sender cannot be told: it has too many messages waiting");
                self.audit(envelope, size, "dead letter dropped: too many");
                Handled::Dropped
            }
            Err(e) => {
                tracing::error!(%trace_id, %msg_id, error = %e, "cannot store the notice of a dead letter: it goes back to the broker");
                Handled::NotStored
            }
        }
    }

    /// The name of `gid` as a notice shows it: with its host, when it is another host's (one
    /// the roster has let go since, its gateway down, is still named as it was).
    async fn shown_name(&self, g: &LocalPlane, gid: Gid) -> String {
        let departed = {
            let state = self.lock();
            state
                .roster
                .entity(gid)
                .is_none()
                .then(|| state.roster.departed(gid).map(|e| e.name.clone()))
                .flatten()
        };
        let name = match departed {
            Some(name) => name,
            None => g.name_of(gid).await,
        };
        match self.host_of(gid) {
            Some(host) if !name.contains('@') => format!("{name}@{host}"),
            _ => name,
        }
    }
}
