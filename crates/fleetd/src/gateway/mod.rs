//! The gateway: this host's fleetd. It owns the roster of local entities and their sessions,
//! decides where each message goes, and runs the loops that deliver them: one pump per
//! pane-bound entity, a pane watcher, and a nudger per lead.
//!
//! The store is the truth for messages; memory holds only what is live (session status, who is
//! waiting in which call), and is rebuilt from nothing at start: a restart reaps the previous
//! run's panes and keeps every held message.

mod afar;
mod asks;
mod bounds;
mod broadcast;
mod calls;
mod commits;
mod consult;
mod coord;
mod delivery;
mod dialogs;
mod ending;
mod federation;
mod feed;
mod lead;
mod lifecycle;
#[cfg(test)]
mod local_tests;
mod messages;
mod nudge;
mod operator;
mod prune;
mod reply;
mod scrape;
mod session;
mod sessions;
mod spawn;
mod stall;
#[cfg(test)]
mod testing;
mod views;
mod watch;
mod workdir;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fleet_core::ownership::Principal;
use fleet_core::{Entity, ErrorCode, FleetError, Gid};
use fleet_mux::PaneHost;
use fleet_store::{Store, StoreError, StoreResult};
use futures_util::future::BoxFuture;
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::health::{Health, STORE_PROBE_EVERY};
use crate::lane::Lane;
use crate::launch::Launchers;
use crate::listener::ListenerStats;
use crate::metrics::Metrics;

pub use consult::{ConsultRequest, ConsultResult};
pub use coord::Coordinator;
pub use federation::{Federation, sealed};
pub use feed::{Event, MessageHistory, Screen};
pub use nudge::NudgeTarget;
pub use operator::{MessageRow, MessagesQuery, RosterRow, RosterView, Viewer};
pub use spawn::SpawnRequest;
pub use views::{
    AskResult, AskView, BroadcastResult, Delivered, HostView, ListResult, PollResult, ReplyResult,
    RosterEntry, SendResult, SpawnResult, StopResult,
};
pub use workdir::Workdirs;

use sessions::Sessions;

/// The threads that prepare launches: as many spawns as that prepare at once.
const LAUNCH_THREADS: usize = 4;
/// The threads that resolve spawns' working directories.
const CWD_THREADS: usize = 2;

/// The one object behind every tool call and loop.
pub struct Gateway {
    /// The configuration, fixed for the life of the process.
    config: Arc<Config>,
    /// This host's id.
    host_id: String,
    /// The MCP URL handed to workers.
    mcp_url: String,
    /// Durable state.
    store: Arc<dyn Store>,
    /// Where the panes live.
    panes: Arc<dyn PaneHost>,
    /// How profiles become panes.
    launchers: Arc<Launchers>,
    /// Live sessions and leads; a std mutex, never held across an await.
    sessions: Mutex<Sessions>,
    /// Per-entity inbox versions: bumped whenever a message is held for the entity, so a
    /// long-poll or blocked send wakes and looks.
    inboxes: Mutex<HashMap<Gid, tokio_watch::Sender<u64>>>,
    /// Cancelled at shutdown; every loop watches it.
    shutdown: CancellationToken,
    /// Every background task, so shutdown can wait for them.
    tasks: TaskTracker,
    /// The federated plane, when a broker is configured.
    federation: Option<Federation>,
    /// Lead-to-lead coordination, when a coordinator is configured.
    coordinator: Option<Coordinator>,
    /// Where workers may work.
    workdirs: Arc<Workdirs>,
    /// What `/metrics` shows.
    metrics: Metrics,
    /// Stores messages, many callers' in one transaction when they come together.
    commits: commits::Commits,
    /// The launchers' preparation, which may wait seconds on Claude Code's settings lock: on
    /// threads of its own, so it never holds up a store call.
    launch_lane: Lane,
    /// A spawn's cwd, resolved on disk: apart from the preparations, so a spawn waiting on
    /// Claude Code's lock holds up no other's check of its directory.
    cwd_lane: Lane,
    /// Whether its loops and its store are alive, for `/healthz`.
    health: Arc<Health>,
    /// What the HTTP listener in front of it has done, for `/metrics`.
    listener: Arc<ListenerStats>,
}

/// The caller of a tool, as its bearer token resolved it.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Who is calling.
    pub entity: Entity,
}

/// What a gateway runs on: its store, pane host, launchers and (with a broker) federated plane.
pub struct Parts {
    /// Durable state.
    pub store: Arc<dyn Store>,
    /// Where the panes live.
    pub panes: Arc<dyn PaneHost>,
    /// How profiles become panes.
    pub launchers: Launchers,
    /// The federated plane, when a broker is configured.
    pub federation: Option<Federation>,
    /// Lead-to-lead coordination, when a coordinator is configured.
    pub coordinator: Option<Coordinator>,
    /// Where workers may work.
    pub workdirs: Workdirs,
    /// What its loops and the store probe report to.
    pub health: Arc<Health>,
    /// What the HTTP listener in front of it counts.
    pub listener: Arc<ListenerStats>,
}

impl Gateway {
    /// Builds the gateway over its opened parts (an error if its threads cannot be started).
    /// Call [`Gateway::start`] next.
    pub fn new(
        config: Arc<Config>,
        host_id: String,
        mcp_url: String,
        parts: Parts,
        shutdown: CancellationToken,
    ) -> std::io::Result<Arc<Self>> {
        let commits = commits::Commits::new(
            Arc::clone(&parts.store),
            config.gateway.max_held_per_recipient,
        );
        Ok(Arc::new(Self {
            commits,
            launch_lane: Lane::new("launch", LAUNCH_THREADS)?,
            cwd_lane: Lane::new("cwd", CWD_THREADS)?,
            config,
            host_id,
            mcp_url,
            store: parts.store,
            panes: parts.panes,
            launchers: Arc::new(parts.launchers),
            sessions: Mutex::new(Sessions::default()),
            inboxes: Mutex::new(HashMap::new()),
            shutdown,
            tasks: TaskTracker::new(),
            federation: parts.federation,
            coordinator: parts.coordinator,
            workdirs: Arc::new(parts.workdirs),
            metrics: Metrics::new(),
            health: parts.health,
            listener: parts.listener,
        }))
    }

    /// Declares the configured leads, fails what a previous run left half-delivered, reaps its
    /// panes, and starts the pane watcher and the nudgers.
    pub async fn start(self: &Arc<Self>) -> Result<(), FleetError> {
        for (name, lead) in &self.config.leads {
            let (name, host, groups) = (name.clone(), self.host_id.clone(), lead.groups.clone());
            let gid = self
                .db(move |s| s.ensure_lead(&name, &host, &groups))
                .await?;
            let entity = self
                .db(move |s| s.entity(gid))
                .await?
                .ok_or_else(|| FleetError::internal("a lead vanished from the store"))?
                .entity;
            self.lock().add_lead(entity);
        }
        // The broker first: notices about what the previous run left half-delivered may be
        // for senders on other hosts.
        self.start_federation().await?;
        self.start_coordinator().await?;
        self.recover().await?;
        self.every(
            "pane watch",
            watch::PANE_WATCH_INTERVAL,
            HashSet::new(),
            |g, statusless| Box::pin(g.check_panes(statusless)),
        );
        self.every("dialog", dialogs::DIALOG_LOOK, HashMap::new(), |g, seen| {
            Box::pin(g.look_for_dialogs(seen))
        });
        self.every("stall", stall::STALL_LOOK, HashMap::new(), |g, seen| {
            Box::pin(g.look_for_stalls(seen))
        });
        self.every("prune", prune::PRUNE_INTERVAL, (), |g, ()| {
            Box::pin(g.prune())
        });
        nudge::start(self);
        self.every("lifecycle", lifecycle::LIFECYCLE_TICK, (), |g, ()| {
            Box::pin(g.check_lifecycles())
        });
        self.every("store probe", STORE_PROBE_EVERY, None, |g, pending| {
            Box::pin(g.probe_store(pending))
        });
        Ok(())
    }

    /// Runs `tick` (with its own `state`) every `interval` until shutdown, on the gateway's
    /// task set, watched as the loop `name` (see [`Health`]); a tick that runs long delays the
    /// next one rather than bunching them.
    fn every<S, F>(self: &Arc<Self>, name: &str, interval: Duration, mut state: S, tick: F)
    where
        S: Send + 'static,
        F: for<'a> Fn(&'a Arc<Gateway>, &'a mut S) -> BoxFuture<'a, ()> + Send + 'static,
    {
        let gateway = Arc::clone(self);
        let watched = self.health.watch(name, Some(interval));
        self.tasks.spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {
                        watched.beat();
                        tick(&gateway, &mut state).await;
                    }
                    () = gateway.shutdown.cancelled() => return watched.ended(),
                }
            }
        });
    }

    /// Runs `work`, a loop that lasts until shutdown, on the gateway's task set, watched as the
    /// loop `name`: if it ends otherwise (a panic), the gateway is unhealthy.
    fn run_watched<F>(self: &Arc<Self>, name: &str, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let watched = self.health.watch(name, None);
        self.tasks.spawn(async move {
            work.await;
            watched.ended();
        });
    }

    /// One look at whether the store takes writes, for [`Health`]: a write that changes nothing,
    /// on a blocking thread. One that has not answered within [`STORE_PROBE_LIMIT`] is waited
    /// on again at the next look rather than joined by another (a store that hangs must not take
    /// every blocking thread); [`Health`] counts it late if it stays out.
    async fn probe_store(&self, pending: &mut Option<tokio::task::JoinHandle<StoreResult<()>>>) {
        let mut probe = pending.take().unwrap_or_else(|| {
            let store = Arc::clone(&self.store);
            tokio::task::spawn_blocking(move || store.probe_write())
        });
        match tokio::time::timeout(STORE_PROBE_LIMIT, &mut probe).await {
            Ok(Ok(wrote)) => self
                .health
                .store_probed(wrote.map_err(|e| store_error(e).message)),
            Ok(Err(join)) => self
                .health
                .store_probed(Err(format!("the probe failed: {join}"))),
            Err(_) => *pending = Some(probe),
        }
    }

    /// Whether the gateway can serve now: what is wrong with it, if anything (see [`Health`]).
    pub fn problems(&self) -> Vec<String> {
        self.health.problems()
    }

    /// Shuts down: stops the loops, ends every live session (closing its pane and telling the
    /// senders of what was on its way), and waits for the loops to finish. Held messages stay.
    pub async fn shut_down(self: &Arc<Self>) {
        self.health.stopping();
        self.shutdown.cancel();
        let live: Vec<Gid> = self
            .lock()
            .panes
            .iter()
            .filter(|(_, s)| s.status().is_live())
            .map(|(gid, _)| *gid)
            .collect();
        for gid in live {
            self.end_session(gid, "fleetd stopped", true).await;
        }
        self.tasks.close();
        self.tasks.wait().await;
        // Every session is over: the workspaces whose teardown was still to come go now.
        self.launchers.workspaces.end_leftovers().await;
    }

    /// The host id.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// Resolves a bearer token's hash to its live caller, and notes that the caller called in
    /// (readiness, last seen; and, when `acting`, proof that a typed task was submitted).
    /// A token that names nobody live gets the reason why.
    pub async fn authenticate(
        self: &Arc<Self>,
        hash: [u8; 32],
        nudge: Option<NudgeTarget>,
        acting: bool,
    ) -> Result<Result<Caller, String>, FleetError> {
        // Asked here, not on a blocking thread: a token lookup has a reader of its own that
        // never waits for writers (see `SqliteStore`), and a hop per request costs more.
        let Some(gid) = self.store.gid_for_token(&hash).map_err(store_error)? else {
            return Ok(Err("unknown, revoked or rotated bearer token".into()));
        };
        let called_in = self.lock().called_in(gid, nudge, acting);
        match called_in {
            Some((entity, became_ready)) => {
                if became_ready {
                    self.persist_status(gid).await;
                }
                Ok(Ok(Caller { entity }))
            }
            None => Ok(Err(match self.db(move |s| s.entity(gid)).await? {
                Some(record) if record.entity.role == fleet_core::Role::Lead => format!(
                    "lead '{}' is no longer declared in this gateway's config",
                    record.entity.name
                ),
                Some(record) => format!(
                    "'{}' is gone; its token no longer works",
                    record.entity.name
                ),
                None => "unknown bearer token".into(),
            })),
        }
    }

    /// Notes that `caller` listed fleetd's tools: the readiness proof of agents that call in
    /// before they have the tools (Claude Code).
    pub async fn listed_tools(&self, caller: &Caller) {
        let gid = caller.entity.gid;
        if self.lock().listed_tools(gid) {
            self.persist_status(gid).await;
        }
    }

    /// The span of the session of `gid` (named as this gateway knows it): a root for the
    /// session's own task (`task`), else inside the current span.
    fn session_span(&self, gid: Gid, task: bool) -> tracing::Span {
        let name = self
            .lock()
            .panes
            .get(&gid)
            .map(|s| s.entity().name.clone())
            .unwrap_or_default();
        if task {
            crate::logs::session_task_span(gid, &name)
        } else {
            crate::logs::session_span(gid, &name)
        }
    }

    /// The other hosts, as the local plane sees them: through its seam, when there is a
    /// broker.
    fn afar(&self) -> Option<&dyn afar::Afar> {
        self.federation.as_ref().map(|f| f as &dyn afar::Afar)
    }

    fn lock(&self) -> MutexGuard<'_, Sessions> {
        // Sessions hold no invariant that a panic half-way could break beyond repair.
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs a store call off the async threads, on tokio's blocking pool: the store's alone
    /// (the launchers' preparation has threads of its own, see [`Lane`]), and the one pool a
    /// paused test clock waits for.
    async fn db<T, F>(&self, f: F) -> Result<T, FleetError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> StoreResult<T> + Send + 'static,
    {
        let store = Arc::clone(&self.store);
        match tokio::task::spawn_blocking(move || f(store.as_ref())).await {
            Ok(result) => result.map_err(store_error),
            Err(join) => Err(FleetError::internal(format!("store call failed: {join}"))),
        }
    }

    /// A receiver that sees every later change of `gid`'s inbox.
    fn inbox(&self, gid: Gid) -> tokio_watch::Receiver<u64> {
        let mut inboxes = self
            .inboxes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        inboxes
            .entry(gid)
            .or_insert_with(|| tokio_watch::channel(0).0)
            .subscribe()
    }

    /// Drops the inbox version of an entity that is gone (anyone still watching it sees it
    /// close and stops waiting).
    fn forget_inbox(&self, gid: Gid) {
        self.inboxes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&gid);
    }

    /// Tells everyone waiting on `gid`'s inbox to look again.
    fn bump_inbox(&self, gid: Gid) {
        let inboxes = self
            .inboxes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(tx) = inboxes.get(&gid) {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// The hosts of the fleet, this one first.
    pub fn hosts(&self) -> Vec<HostView> {
        self.remote_view().1
    }

    /// Every live entity (this host's first) and the hosts: the roster as an operator, who is
    /// in it, sees it.
    pub fn everyone(&self, viewer: Principal<'_>) -> (Vec<RosterEntry>, Vec<HostView>) {
        let mut entities: Vec<RosterEntry> = {
            let sessions = self.lock();
            sessions
                .entities()
                .into_iter()
                .filter_map(|e| sessions.entry(e.gid, viewer))
                .collect()
        };
        let (remote, hosts) = self.remote_view();
        entities.extend(remote);
        (entities, hosts)
    }

    /// `fleet_list`: every live entity, and the caller.
    pub fn list(&self, caller: &Caller) -> Result<ListResult, FleetError> {
        let mut list = self
            .lock()
            .list(&caller.entity)
            .ok_or_else(|| FleetError::new(ErrorCode::Gone, "you are no longer in the roster"))?;
        let (remote, hosts) = self.remote_view();
        list.entities.extend(remote);
        list.hosts = hosts;
        list.coord_id = self.coord_id_of(caller);
        Ok(list)
    }
}

/// How fleetd reaches `broker` (its login, vhost, TLS, inbox limits), for a check of it from
/// outside a gateway (`fleetd doctor`).
pub fn broker_settings(
    broker: &crate::config::BrokerConfig,
    federation: &crate::config::FederationConfig,
) -> fleet_amqp::LinkSettings {
    federation::link_settings(broker, federation)
}

/// How long the store's write probe may take before the store counts as not answering: far
/// longer than any write takes, and than the store's own wait for its lock.
const STORE_PROBE_LIMIT: Duration = Duration::from_secs(10);

/// Maps a store failure onto the domain error.
fn store_error(err: StoreError) -> FleetError {
    match err {
        StoreError::NameTaken(name) => FleetError::invalid(format!(
            "the name '{name}' is taken by a live entity; pick another or stop that one first"
        )),
        other => FleetError::new(ErrorCode::Internal, other.to_string()),
    }
}
