//! Presence: heartbeats for this host and its entities, the roster queue read into the
//! remote roster (merged, capped and expired by `fleet_core::roster`), and the roster as
//! `fleet_list` shows it.

use std::sync::Arc;
use std::time::Duration;

use fleet_amqp::topology::{ROSTER_EXCHANGE, addressed_key, roster_key, roster_key_of};
use fleet_amqp::{AmqpError, Broker, Deliveries, Delivery, Outgoing};
use fleet_core::admission::Handled;
use fleet_core::envelope::Envelope;
use fleet_core::presence::{Account, Round, sift};
use fleet_core::roster::{GONE, Heard, Presence, UNREACHABLE};
use fleet_core::trust::GATEWAY_ENTRY;
use fleet_core::{Entity, Gid, Kind, MsgId, Role, TraceId};
use tokio::time::Instant;

use super::super::LocalPlane;
use super::super::views::{HostView, RosterEntry, slot_of};
use super::settle::settle;
use super::trust::forget_heartbeats;
use super::{Federation, outgoing};
use fleet_core::clock::now_ms;

/// The largest heartbeat read (a host's whole account of some 100,000 entities); a larger one
/// is refused unread.
const MAX_HEARTBEAT_BYTES: usize = 32 << 20;

/// The least time between two whole accounts sent to the same gateway that asked for them.
pub(super) const WHOLE_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// How long after asking for whole accounts they are still on their way (each other gateway
/// answers at its next tick, at most a second after its last answer to this one).
const ANSWERS_DUE_WITHIN: Duration = Duration::from_secs(3);

/// How often receipts and presence are checked for expiry.
const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

impl Federation {
    /// Heartbeats this host (with its entities) every interval, and expires what went quiet.
    pub(super) async fn presence_loop(self: Arc<Self>, g: Arc<LocalPlane>) {
        let g = &g;
        let interval = Duration::from_secs(self.config.presence_interval_s);
        let mut next_beat = Instant::now() + interval;
        loop {
            tokio::select! {
                () = tokio::time::sleep(SWEEP_INTERVAL) => {}
                () = g.shutdown.cancelled() => return,
            }
            let (askers, resync) = {
                let mut state = self.lock();
                (state.due_askers(), std::mem::take(&mut state.resync_wanted))
            };
            if resync {
                self.ledger.lock().await.ask_resync();
            }
            if Instant::now() >= next_beat {
                self.publish_presence(g, Round::Regular).await;
                if self.link().is_some() && !self.lock().reaped.is_empty() {
                    self.clear_reaped_inboxes(g).await;
                }
                next_beat = Instant::now() + interval;
            } else if resync {
                self.publish_presence(g, Round::Change).await;
            }
            if !askers.is_empty() {
                self.answer_askers(g, &askers).await;
            }
            self.sweep(g).await;
            forget_heartbeats(&self);
            self.flush_when_waiting(g);
        }
    }

    /// Publishes this host's heartbeat for `round`, carrying its entities' account.
    pub(super) async fn publish_presence(&self, g: &LocalPlane, round: Round) {
        let Some(link) = self.link() else {
            return;
        };
        let mut ledger = self.ledger.lock().await;
        if ledger.is_closed() {
            return;
        }
        let entities = local_entities(g);
        let id = MsgId::mint();
        // What this heartbeat tells is told once it is published: a heartbeat not published
        // leaves the ledger as it was.
        let before = ledger.clone();
        let account = ledger.account(id, entities, round);
        let presence = self.host_entry(g, account);
        if !self.announce(g, link.as_ref(), id, &presence, None).await {
            *ledger = before;
        }
    }

    /// Sends a whole account of this host's entities to each of `askers` alone (a host that
    /// came back, or asked); to all, if none was told to all yet.
    pub(super) async fn answer_askers(&self, g: &LocalPlane, askers: &[String]) {
        let Some(link) = self.link() else {
            return;
        };
        let ledger = self.ledger.lock().await;
        if ledger.is_closed() {
            return;
        }
        // To all when addressing was refused, or before any whole account was told to all.
        let addressed = if self.lock().addressing_off {
            None
        } else {
            ledger.snapshot()
        };
        let Some(account) = addressed else {
            drop(ledger);
            self.publish_presence(g, Round::Whole).await;
            return;
        };
        let presence = self.host_entry(g, account);
        for asker in askers {
            self.announce(g, link.as_ref(), MsgId::mint(), &presence, Some(asker))
                .await;
        }
    }

    /// This host's entry, carrying `account`.
    fn host_entry(&self, g: &LocalPlane, account: Account) -> Presence {
        Presence {
            entity: None,
            status: "up".into(),
            profiles: g.config.profiles.iter().map(|p| p.name.clone()).collect(),
            // An entry that is up names its profiles' model families.
            families: crate::config::families(&g.config.profiles),
            account: Some(account),
        }
    }

    /// A whole account of this host's entities, asking every other gateway for theirs: its
    /// roster queue is new, so it holds nothing said before.
    pub(super) async fn publish_whole_asking(&self, g: &LocalPlane) {
        self.lock().asked = Some(Instant::now());
        self.ledger.lock().await.ask_resync();
        self.publish_presence(g, Round::Whole).await;
    }

    /// Tells the other gateways this host and its entities are gone.
    pub(super) async fn leave_roster(&self, g: &LocalPlane) {
        let Some(link) = self.link() else {
            return;
        };
        // Nothing is told after this: a heartbeat after it would bring the host back.
        let mut ledger = self.ledger.lock().await;
        ledger.close();
        let gone = Presence {
            entity: None,
            status: GONE.into(),
            profiles: Vec::new(),
            families: Default::default(),
            account: None,
        };
        self.announce(g, link.as_ref(), MsgId::mint(), &gone, None)
            .await;
    }

    /// One presence heartbeat of this host's, of id `id`, to all or addressed `to` one host:
    /// whether it was published.
    async fn announce(
        &self,
        g: &LocalPlane,
        link: &dyn Broker,
        id: MsgId,
        presence: &Presence,
        to: Option<&str>,
    ) -> bool {
        let Ok(body) = serde_json::to_vec(presence) else {
            return false;
        };
        let envelope = outgoing(
            &g.host_id,
            Kind::Presence,
            (id, TraceId::mint()),
            self.gateway_gid,
            ROSTER_EXCHANGE.to_string(),
            self.config.presence_ttl_s,
        );
        let key = match to {
            Some(to) => addressed_key(to, &roster_key(&g.host_id, GATEWAY_ENTRY)),
            None => roster_key(&g.host_id, GATEWAY_ENTRY),
        };
        let signature = self.sign(&envelope, &body);
        let published = link
            .publish(Outgoing {
                exchange: ROSTER_EXCHANGE,
                key: &key,
                envelope: &envelope,
                signature: &signature,
                body: &body,
                mandatory: false,
                persistent: false,
            })
            .await;
        match &published {
            // The broker login lacks the permission to address one host (set before this
            // gateway was upgraded): answers go to all from now on, and the link, whose channel
            // the refusal closed, comes back once, not in a loop.
            Err(e @ AmqpError::Refused(_)) if to.is_some() => {
                tracing::error!(error = %e, "the broker refused a heartbeat addressed to one host: this gateway's broker login lacks the topic permission on fleet.roster for `to.<host>.roster.<this host>._gateway` (see the rabbitmqctl lines of docs/federation.md, Broker logins); whole accounts go to every host until fleetd restarts");
                self.lock().addressing_off = true;
            }
            Err(e) => tracing::debug!(error = %e, "a heartbeat was not published"),
            Ok(_) => {}
        }
        published.is_ok()
    }

    /// Reads the roster queue into the union view until the link goes, or fleetd stops
    /// (whether or not the link's close goes through).
    pub(super) async fn consume_roster(
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
                    let (handled, returned) = self.on_presence(g, &delivery);
                    settle(&delivery, handled, false).await;
                    if let Some(host) = returned {
                        self.answer_a_return(&host);
                    }
                }
                _ => return,
            }
        }
    }

    /// A host this gateway did not hear came back (its link healed, or it started), or asked
    /// for whole accounts: at the presence loop's next tick it is sent one of its own, not left
    /// for the next whole round, so both sides' rosters are whole again as soon as its link is.
    fn answer_a_return(&self, host: &str) {
        self.lock().wanted_by.insert(host.to_string());
    }

    /// One heartbeat off the roster queue, how it is settled (taken, or refused to the dead
    /// letters when it fails a check), and whether it is the return of a host this gateway
    /// did not hear (unknown or unreachable).
    fn on_presence(&self, g: &LocalPlane, delivery: &Delivery) -> (Handled, Option<String>) {
        let handled = |h| (h, None);
        let Ok(envelope) = delivery.envelope() else {
            tracing::warn!("a malformed heartbeat was refused");
            return handled(Handled::Refused);
        };
        let Some(host) = envelope.from_host.clone() else {
            tracing::warn!("a heartbeat naming no host was refused");
            return handled(Handled::Refused);
        };
        if host == g.host_id {
            // This gateway's own, back through the exchange.
            return handled(Handled::Noted);
        }
        // Addressed to another host whose id begins with this one's (the binding matched it),
        // or not the sender's own entry: not for this gateway.
        let addressed = delivery.routing_key().starts_with("to.");
        let Some(key) = roster_key_of(delivery.routing_key(), &g.host_id)
            .filter(|key| !addressed || *key == roster_key(&host, GATEWAY_ENTRY))
        else {
            return handled(Handled::Noted);
        };
        if envelope.kind != Kind::Presence {
            tracing::warn!(%host, kind = %envelope.kind, "a message on the roster that is no heartbeat was refused");
            return handled(Handled::Refused);
        }
        // Only a pinned host's heartbeat is read at all.
        if delivery.body().len() > MAX_HEARTBEAT_BYTES {
            tracing::warn!(%host, bytes = delivery.body().len(), "a heartbeat over {MAX_HEARTBEAT_BYTES} bytes was refused");
            return handled(Handled::Refused);
        }
        if let Err(refusal) = self.check_seal(&envelope, delivery) {
            self.note_untrusted(delivery, &envelope, &refusal);
            return handled(Handled::Refused);
        }
        let Ok(mut presence) = serde_json::from_slice::<Presence>(delivery.body()) else {
            tracing::warn!(%host, "a heartbeat with an unreadable body was refused");
            return handled(Handled::Refused);
        };
        match self.check_heartbeat(g, key, &envelope, &presence) {
            Ok(()) => {}
            // Its seal and sender passed: it sat out a partition (or a slow link). A newer one
            // says more; it is dropped, counted, and no forgery is cried.
            Err(refusal) if refusal.late() => {
                g.metrics.heartbeat_late();
                tracing::debug!(%host, check = refusal.reason(), "a late heartbeat was dropped");
                return handled(Handled::Noted);
            }
            Err(refusal) => {
                self.note_untrusted(delivery, &envelope, &refusal);
                return handled(Handled::Refused);
            }
        }
        if let Some(account) = presence.account.as_mut() {
            self.leave_out(g, &envelope, &host, account);
        }
        let now = Instant::now().into_std();
        let asks = presence.account.as_ref().is_some_and(|a| a.resync);
        let (heard, returned) = {
            let mut state = self.lock();
            let heard_before = state.roster.hosts_heard().any(|h| h == host);
            let heard = state.roster.hear(&host, presence, now, now_ms());
            // The host's own entry, from a host not heard until now: it came back, and hears of
            // this one's entities at once. Not its answer to this gateway's asking, nor any
            // heartbeat of its just after this gateway asked: this one is the newcomer, and the
            // other heard it ask (a host that is new too asks as well).
            let just_asked = state
                .asked
                .is_some_and(|at| at.elapsed() < ANSWERS_DUE_WITHIN);
            let returned = !addressed
                && !just_asked
                && !heard_before
                && state.roster.hosts_heard().any(|h| h == host);
            (heard, returned)
        };
        // Only a host this roster holds may ask for whole accounts.
        let answer = returned || (asks && matches!(heard, Heard::Merged | Heard::Stale));
        self.merged(&host, heard);
        (Handled::Noted, answer.then_some(host))
    }

    /// Of `host`'s account (under `envelope`), each state that is not the host's own to
    /// announce is left out, alone, and said (never a flood of it): the rest is taken.
    fn leave_out(&self, g: &LocalPlane, envelope: &Envelope, host: &str, account: &mut Account) {
        let mut left_out = sift(host, account);
        left_out.extend(self.unplaced(g, envelope, account));
        if let Some(first) = left_out.first() {
            let (loud, count) = self.loud();
            if loud {
                tracing::warn!(%host, left_out = left_out.len(), first = %first.escape_debug(), refused_so_far = count, "entities of a host's account were left out");
            }
        }
    }

    /// What a heartbeat of `host`'s did to the roster: whoever waits on the roster is told,
    /// and what was ignored is said (never a flood of it).
    fn merged(&self, host: &str, heard: Heard) {
        match heard {
            Heard::Merged => {
                self.roster_heard.send_modify(|n| *n = n.wrapping_add(1));
            }
            Heard::Stale => {
                self.roster_heard.send_modify(|n| *n = n.wrapping_add(1));
                let mut state = self.lock();
                // Just after asking, the answers are on their way: a change that overtook one
                // is no reason to ask again.
                let answers_due = state
                    .asked
                    .is_some_and(|at| at.elapsed() < ANSWERS_DUE_WITHIN);
                if !answers_due {
                    tracing::debug!(%host, "a change of a host's entities built on a whole account not heard here: asking for one");
                    state.resync_wanted = true;
                }
            }
            Heard::Left => {}
            Heard::NotItsOwn { claimed } => {
                tracing::warn!(%host, claimed = %claimed.escape_debug(), "a heartbeat for an entity of another host was ignored");
            }
            Heard::Malformed(why) => {
                tracing::warn!(%host, why = %why.escape_debug(), "a heartbeat holding what no gateway announces was ignored");
            }
            // Loud at first, never a flood of its own: at powers of two. (Of a host's account,
            // what fit under the cap was kept.)
            Heard::OverCap { full, ignored } => {
                self.roster_heard.send_modify(|n| *n = n.wrapping_add(1));
                if ignored.is_power_of_two() {
                    tracing::error!(%host, cap = %full, ignored, "REFUSED a roster entry over the cap: heartbeat ignored (a flood of forged presence?)");
                }
            }
        }
    }
}

impl Federation {
    /// The remote roster as `fleet_list` shows it: every remote entity (its owner named as
    /// `name@host`, this host's `leads` or another's the roster knows), and the other hosts;
    /// all unreachable while this gateway's own link is down.
    pub(super) fn roster_view(
        &self,
        leads: &std::collections::HashMap<Gid, String>,
    ) -> (Vec<RosterEntry>, Vec<HostView>) {
        let up = self.link().is_some();
        let state = self.lock();
        let owner_of = |parent: Option<Gid>| {
            let parent = parent?;
            leads.get(&parent).cloned().or_else(|| {
                state
                    .roster
                    .entity(parent)
                    .filter(|e| e.entity.role == Role::Lead)
                    .map(|e| format!("{}@{}", e.entity.name, e.entity.host))
            })
        };
        let mut entries: Vec<RosterEntry> = state
            .roster
            .entities()
            .map(|e| RosterEntry {
                gid: e.entity.gid,
                name: e.entity.name.clone(),
                host: e.entity.host.clone(),
                role: e.entity.role,
                slot: slot_of(e.entity.role, &e.entity.name),
                profile: e.entity.profile.clone(),
                sandbox: e.entity.sandbox.clone(),
                profile_role: e.entity.profile_role.clone(),
                // With this gateway's own link down, nobody can be heard.
                status: if up {
                    e.shown_status().to_string()
                } else {
                    UNREACHABLE.into()
                },
                agent: None,
                agent_status: None,
                groups: e.entity.groups.clone(),
                pane: None,
                last_seen_ms: Some(e.heard_ms),
                open_calls: None,
                stalled_since: None,
                workspace: None,
                dialog: None,
                owner: owner_of(e.entity.parent),
                shared: Vec::new(),
            })
            .collect();
        entries.sort_by(|a, b| (&a.host, &a.name).cmp(&(&b.host, &b.name)));
        let mut remote_hosts: Vec<HostView> = state
            .roster
            .hosts()
            .map(|(host, h)| HostView {
                host: host.to_string(),
                status: if up && h.unreachable_since_ms.is_none() {
                    "up".into()
                } else {
                    UNREACHABLE.into()
                },
                profiles: h.profiles.clone(),
                families: h.families.clone(),
                last_seen_ms: Some(h.heard_ms),
            })
            .collect();
        remote_hosts.sort_by(|a, b| a.host.cmp(&b.host));
        (entries, remote_hosts)
    }
}

/// This host's entities, each with the status its heartbeat announces.
fn local_entities(g: &LocalPlane) -> Vec<(Entity, String)> {
    let sessions = g.sessions.lock();
    sessions
        .entities()
        .into_iter()
        .map(|e| {
            let status = sessions.presence_status(e.gid);
            (e, status)
        })
        .collect()
}
