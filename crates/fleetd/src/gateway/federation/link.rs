//! Keeping the broker link: connecting (a broker that refuses our topology is a start-up
//! error, an inbox another consumer holds is waited for a few heartbeats first; one that
//! cannot be reached is retried in the background), attaching the roster and
//! every local inbox, connecting again with backoff after an outage, and an inbox per local
//! entity as entities join and leave.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fleet_amqp::topology::{BROADCAST_ALL, broadcast_key};
use fleet_amqp::{AmqpError, Broker, InboxLimits, Link, LinkSettings};
use fleet_core::clock::now_ms;
use fleet_core::presence::Round;
use fleet_core::{Entity, FleetError, Gid};
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;

use super::super::LocalPlane;
use super::Federation;
use crate::config::{BrokerConfig, FederationConfig};

/// The longest pause between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The first pause after a failed connection attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// How many broker heartbeats an inbox held by another consumer is waited for at start.
const HELD_HEARTBEATS: u64 = 3;
/// The pause between two attempts on a held inbox.
const HELD_RETRY: Duration = Duration::from_millis(500);

/// What a link to `broker` is opened with (its nodes tried from the first named), its queues
/// capped as `[federation]` says.
pub(in crate::gateway) fn link_settings(
    broker: &BrokerConfig,
    config: &FederationConfig,
) -> LinkSettings {
    LinkSettings {
        uris: broker.uris.clone(),
        first: 0,
        queue_type: broker.queue_type,
        password_env: broker.password_env.clone(),
        heartbeat_s: broker.heartbeat_s,
        prefetch: broker.prefetch,
        inbox: InboxLimits {
            max_length: config.inbox_max_length,
            message_ttl_s: config.inbox_message_ttl_s,
            expires_s: config.inbox_expires_s,
        },
        dlq_max_length: config.dlq_max_length,
        tls: broker.tls(),
    }
}

/// Keeps the broker link in `cell` up until `shutdown`: waits for it to fail, then calls
/// `connect` (which puts a new link in `cell`) again and again, with backoff, until it does.
/// When the link fails, `next_node` is set to the node after the one it was on (a cluster's
/// surviving nodes are tried before the one just lost) and `down` runs; `leave` runs with the
/// link still up at shutdown.
pub(in crate::gateway) async fn keep_up<L, C, Left>(
    cell: &tokio_watch::Sender<Option<Arc<L>>>,
    next_node: &AtomicUsize,
    shutdown: &CancellationToken,
    mut connect: impl FnMut() -> C,
    mut down: impl FnMut(),
    leave: impl FnOnce(Arc<L>) -> Left,
) where
    L: Broker + ?Sized + 'static,
    C: Future<Output = Result<(), AmqpError>>,
    Left: Future<Output = ()>,
{
    let mut backoff = FIRST_BACKOFF;
    loop {
        let up = cell.borrow().clone().filter(|l| l.is_up());
        if let Some(link) = up {
            tokio::select! {
                () = link.closed() => {}
                () = shutdown.cancelled() => {
                    leave(link).await;
                    return;
                }
            }
            cell.send_replace(None);
            next_node.store(link.node().wrapping_add(1), Ordering::Relaxed);
            down();
            // A link taken as lost may still be open (a broker too slow to answer): closed, in
            // the background, so its exclusive queues are let go and the next one can take them.
            tokio::spawn(async move { link.close().await });
            backoff = FIRST_BACKOFF;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => return,
        }
        let connected = tokio::select! {
            connected = connect() => connected,
            () = shutdown.cancelled() => return,
        };
        match connected {
            Ok(()) => backoff = FIRST_BACKOFF,
            Err(e) => {
                if e.retry() {
                    tracing::debug!(error = %e, "the broker is still unreachable");
                } else {
                    // Say so loudly, and keep trying: after a crash the broker may hold a
                    // dead gateway's exclusive consumers until its heartbeat runs out.
                    tracing::error!(error = %e, "the broker refuses this gateway; retrying");
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

impl Federation {
    /// Awaits again the receipts a previous run awaited, connects to the broker (a broker
    /// that refuses our topology is a start-up error, a queue of this host another connection
    /// holds is waited for a few heartbeats first; one that cannot be reached is retried in the
    /// background) and starts the link keeper and the presence loop.
    pub(in crate::gateway) async fn start_federation(
        &self,
        g: &Arc<LocalPlane>,
    ) -> Result<(), FleetError> {
        tracing::info!(uri = %self.broker.shown(), queue_type = self.broker.queue_type.as_str(), host_id = %g.host_id, "federated plane on");
        // Before any inbox is read: a receipt that came while this gateway was down ends its
        // brief's wait.
        self.await_receipts_again(g).await?;
        // An inbox held by another consumer may be a crashed run of this gateway whose
        // connection the broker has not timed out yet (it does after about two heartbeats):
        // waited for a while, then a start-up error (a second gateway of this host).
        let held_until = tokio::time::Instant::now()
            + Duration::from_secs(u64::from(self.broker.heartbeat_s) * HELD_HEARTBEATS);
        let mut waited = false;
        loop {
            match self.connect_link(g).await {
                Ok(()) => {
                    if waited {
                        tracing::info!("the held inbox was let go: the broker link is up");
                    }
                    break;
                }
                Err(e) if e.is_held() && tokio::time::Instant::now() < held_until => {
                    if !waited {
                        tracing::warn!(error = %e, wait_s = u64::from(self.broker.heartbeat_s) * HELD_HEARTBEATS, "an inbox of this host is held by another consumer: waiting for the broker to let a crashed run's connection go");
                        waited = true;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(HELD_RETRY) => {}
                        () = g.shutdown.cancelled() => return Ok(()),
                    }
                }
                Err(e) if !e.retry() => {
                    return Err(FleetError::internal(format!("broker: {e}")));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the broker cannot be reached yet; same-host traffic works, retrying");
                    break;
                }
            }
        }
        if let Some(fed) = self.me() {
            g.run_watched("broker link", Arc::clone(&fed).keep_link(Arc::clone(g)));
            g.run_watched("presence", fed.presence_loop(Arc::clone(g)));
        }
        Ok(())
    }

    /// Connects, declares, and attaches the roster and every local inbox.
    async fn connect_link(&self, g: &Arc<LocalPlane>) -> Result<(), AmqpError> {
        let settings = LinkSettings {
            first: self.next_node.load(Ordering::Relaxed),
            ..link_settings(&self.broker, &self.config)
        };
        let link = Link::connect(&settings, &g.host_id).await?;
        let node = link.node_name().to_string();
        let link: Arc<dyn Broker> = Arc::new(link);
        let attached = async {
            let roster = link.open_roster(&g.host_id).await?;
            self.start_task(g, |fed, g| fed.consume_roster(g, roster));
            let control = link.open_control(&g.host_id).await?;
            self.start_task(g, |fed, g| fed.consume_control(g, control));
            let dead = link.open_dead_letters(&g.host_id).await?;
            self.start_task(g, |fed, g| fed.consume_dead_letters(g, dead));
            let local = g.sessions.lock().entities();
            for entity in &local {
                self.attach_inbox(g, link.as_ref(), entity).await?;
            }
            Ok::<usize, AmqpError>(local.len())
        };
        match attached.await {
            Ok(inboxes) => {
                // Nothing expired while the link was down (nobody could be heard): what went
                // quiet meanwhile reads unreachable before the link reads up, not for a sweep.
                self.lock()
                    .roster
                    .expire(tokio::time::Instant::now().into_std(), now_ms());
                self.link.send_replace(Some(Arc::clone(&link)));
                tracing::info!(host_id = %g.host_id, %node, inboxes, "broker link up");
                // A new roster queue holds nothing said before: whole accounts, both ways.
                self.publish_whole_asking(g).await;
                self.clear_reaped_inboxes(g).await;
                self.flush_outbox(g).await;
                Ok(())
            }
            Err(e) => {
                // Half attached: let go of all of it, so the next attempt starts clean.
                self.lock().stop_consumers();
                link.close().await;
                Err(e)
            }
        }
    }

    /// Keeps the link up: waits for it to fail, then connects again with backoff.
    async fn keep_link(self: Arc<Self>, g: Arc<LocalPlane>) {
        let g = &g;
        let down = || {
            tracing::warn!(
                "the broker link is down; remote entities read unreachable, tasks for them fail fast, replies and notices wait for the link"
            );
            self.lock().stop_consumers();
        };
        let (fed, gateway) = (&self, g);
        let leave = |link: Arc<dyn Broker>| async move {
            // Workers left running for the next start keep their inboxes and their place in
            // the roster: to the other hosts, a restart is a pause in this host's heartbeats.
            if gateway.stops_workers() {
                fed.leave_roster(gateway).await;
                // The workers go with fleetd: so do their inboxes (the leads' stay, holding
                // what arrives for them meanwhile).
                let panes: Vec<Gid> = gateway.sessions.lock().panes.keys().copied().collect();
                for gid in panes {
                    if let Err(e) = link.delete_inbox(gid).await {
                        tracing::debug!(%gid, error = %e, "inbox not deleted");
                    }
                }
            }
            link.close().await;
        };
        keep_up(
            &self.link,
            &self.next_node,
            &g.shutdown,
            || self.connect_link(g),
            down,
            leave,
        )
        .await;
    }

    /// Declares `entity`'s inbox and starts consuming it.
    pub(super) async fn attach_inbox(
        &self,
        g: &Arc<LocalPlane>,
        link: &dyn Broker,
        entity: &Entity,
    ) -> Result<(), AmqpError> {
        let keys: Vec<String> = if entity.role.is_pane_bound() {
            std::iter::once(BROADCAST_ALL.to_string())
                .chain(entity.groups.iter().map(|g| broadcast_key(g)))
                .collect()
        } else {
            Vec::new()
        };
        let deliveries = link.open_inbox(entity.gid, &keys).await?;
        let token = g.shutdown.child_token();
        if let Some(old) = self.lock().consumers.insert(entity.gid, token.clone()) {
            old.cancel();
        }
        let owner = entity.gid;
        self.start_task(g, move |fed, g| {
            fed.consume_inbox(g, owner, deliveries, token)
        });
        Ok(())
    }

    /// A local entity joined (a worker became ready, or stopped on a dialog of its start): give
    /// it an inbox on the broker, unless it has one, and announce it.
    pub(super) async fn federation_joined(&self, g: &Arc<LocalPlane>, gid: Gid) {
        let Some(link) = self.link() else {
            return;
        };
        let found = g
            .sessions
            .lock()
            .entities()
            .into_iter()
            .find(|e| e.gid == gid);
        let Some(entity) = found else {
            return;
        };
        // Joined once already (blocked on a dialog of its start, say): its inbox is there.
        let attached = self.lock().consumers.contains_key(&gid);
        if !attached && let Err(e) = self.attach_inbox(g, link.as_ref(), &entity).await {
            tracing::error!(%gid, error = %e, "cannot attach the inbox");
        }
        // The host's heartbeat, at once, of what changed: the others learn of it now, not at
        // the next round. (A whole round for each one that joins made a burst of n spawns cost
        // n² heartbeats.)
        self.publish_presence(g, Round::Change).await;
    }

    /// A local entity left: its inbox goes (and its broadcast bindings with it), and the other
    /// gateways hear it is gone.
    pub(super) async fn federation_left(&self, g: &Arc<LocalPlane>, entity: &Entity) {
        if let Some(token) = self.lock().consumers.remove(&entity.gid) {
            token.cancel();
        }
        let Some(link) = self.link() else {
            return;
        };
        if let Err(e) = link.delete_inbox(entity.gid).await {
            tracing::warn!(gid = %entity.gid, error = %e, "cannot delete the inbox");
        }
        self.publish_presence(g, Round::Change).await;
    }

    /// Notes a worker a previous run left (reaped at start) whose inbox is to be cleared, and
    /// clears what can be now, in the background (each brief found there is a confirmed
    /// publish: the gateway serves meanwhile).
    pub(in crate::gateway) fn reaped(&self, g: &Arc<LocalPlane>, entity: Entity) {
        self.lock().reaped.push(entity);
        self.start_task(
            g,
            |fed, g| async move { fed.clear_reaped_inboxes(&g).await },
        );
    }
}
