//! The gateway: this host's fleetd. It owns the roster of local entities and their sessions,
//! decides where each message goes, and runs the loops that deliver them: one pump per
//! pane-bound entity, a pane watcher, and a nudger per lead.
//!
//! The store is the truth for messages; memory holds only what is live (session status, who is
//! waiting in which call), and is rebuilt from nothing at start: a restart reaps the previous
//! run's panes and keeps every held message.
//!
//! Four types: [`Gateway`], the thin front the HTTP, MCP and web layers call (`front`);
//! `LocalPlane`, this host's leads, sessions and deliveries (every file here but
//! `federation/` and the views'); `OperatorViews`, what the operator surfaces read
//! (`operator`, `feed`, `scrape`), through the local plane; and [`Federation`], the broker
//! side, whose methods take the local plane as a parameter. The local plane holds no
//! federation: it reaches other hosts only through its seam, `afar`, which the federation
//! implements. Outside `federation/`, only the front names the federation's type, and only
//! `coord` (a plane of its own) borrows its link helpers.
//!
//! This file declares the types and builds the local plane. The base the rest stands on: `db`
//! (the store), `inboxes` (what a waiting call wakes on), `sessions` (one lock over the leads
//! and sessions), `loops`.

mod adoption;
mod afar;
#[cfg(test)]
mod afar_tests;
mod asks;
mod bounds;
mod broadcast;
mod calls;
mod commits;
mod consult;
mod coord;
mod db;
mod delivery;
mod dialogs;
mod ending;
mod federation;
mod feed;
mod front;
mod inboxes;
mod interrupted;
mod lead;
mod lifecycle;
mod listing;
#[cfg(test)]
mod local_tests;
mod loops;
mod messages;
mod nudge;
mod operator;
mod prune;
mod reply;
mod reports;
mod scrape;
mod session;
mod sessions;
mod spawn;
mod stall;
mod start_dialogs;
mod starting;
mod straight;
#[cfg(test)]
mod testing;
mod typing;
mod views;
mod watch;
mod workdir;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use fleet_core::{Entity, FleetError, Gid};
use fleet_mux::PaneHost;
use fleet_store::Store;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::health::{Health, STORE_PROBE_EVERY};
use crate::lane::Lane;
use crate::launch::Launchers;
use crate::listener::ListenerStats;
use crate::metrics::Metrics;

pub use consult::{ConsultRequest, ConsultResult, DEFAULT_WAIT as DEFAULT_CONSULT_WAIT};
pub use coord::Coordinator;
pub use federation::{Federation, sealed};
pub use feed::{Event, LiveStatus, MessageHistory, Screen, ToldLive, merged};
pub use listing::ListFilter;
pub use nudge::NudgeTarget;
pub use operator::{MessagePage, MessageRow, MessagesQuery, RosterRow, RosterView, Viewer};
pub use spawn::SpawnRequest;
pub use views::{
    AskResult, AskView, BroadcastResult, Delivered, DialogView, HostView, ListResult, PollResult,
    ReplyResult, RosterEntry, SendResult, SpawnResult, StopResult,
};
pub use workdir::Workdirs;

use db::{Db, store_error};
use inboxes::Inboxes;
use sessions::{CalledIn, Shared};

/// The threads that prepare launches: as many spawns as that prepare at once.
const LAUNCH_THREADS: usize = 4;
/// The threads that resolve spawns' working directories.
const CWD_THREADS: usize = 2;

/// fleetd on this host, as the HTTP, MCP and web layers see it: a thin front over the local
/// plane and (with a broker) the federation (see `front`).
pub struct Gateway {
    /// This host's leads, sessions and deliveries.
    local: Arc<LocalPlane>,
    /// What the operator surfaces read.
    views: OperatorViews,
    /// The federated plane, when a broker is configured.
    federation: Option<Arc<Federation>>,
}

/// The operator views: what `/api/v1`, `/metrics`, the web view and the CLI read (the roster
/// with what waits for each entity, the messages and their states, the live feed, a message's
/// history, a worker's screen, the metrics). They only read, through the local plane.
struct OperatorViews {
    local: Arc<LocalPlane>,
}

/// The local plane: this host's leads, workers and architects, what they hold, and every tool
/// call and loop that runs here. It reaches other hosts only through `afar`.
struct LocalPlane {
    /// The configuration, fixed for the life of the process.
    config: Arc<Config>,
    /// This host's id.
    host_id: String,
    /// The MCP URL handed to workers.
    mcp_url: String,
    /// Durable state.
    db: Db,
    /// Where the panes live.
    panes: Arc<dyn PaneHost>,
    /// How profiles become panes.
    launchers: Arc<Launchers>,
    /// Live sessions and leads, behind a std mutex never held across an await.
    sessions: Shared,
    /// Per-entity inbox versions, which wake whoever waits on an inbox.
    inboxes: Inboxes,
    /// Cancelled at shutdown; every loop watches it.
    shutdown: CancellationToken,
    /// Every background task, so shutdown can wait for them.
    tasks: TaskTracker,
    /// The other hosts, through the local plane's seam (the federation, with a broker).
    afar: Option<Arc<dyn afar::Afar>>,
    /// Lead-to-lead coordination, when a coordinator is configured.
    coordinator: Option<Coordinator>,
    /// Where workers may work.
    workdirs: Arc<Workdirs>,
    /// What `/metrics` shows.
    metrics: Metrics,
    /// Stores messages, many callers' in one transaction when they come together.
    commits: commits::Commits,
    /// Records where published messages went, likewise.
    sent_rows: commits::Grouped<commits::SentRows>,
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
    /// Who is calling: shared with its session, not copied per call.
    pub entity: Arc<Entity>,
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
    pub federation: Option<Arc<Federation>>,
    /// Lead-to-lead coordination, when a coordinator is configured.
    pub coordinator: Option<Coordinator>,
    /// Where workers may work.
    pub workdirs: Workdirs,
    /// What its loops and the store probe report to.
    pub health: Arc<Health>,
    /// What the HTTP listener in front of it counts.
    pub listener: Arc<ListenerStats>,
}

impl LocalPlane {
    /// The local plane over its opened parts (the federation taken out of them already), with
    /// `afar` its way to other hosts; an error if its threads cannot be started.
    fn new(
        config: Arc<Config>,
        host_id: String,
        mcp_url: String,
        parts: Parts,
        afar: Option<Arc<dyn afar::Afar>>,
        shutdown: CancellationToken,
    ) -> std::io::Result<Arc<Self>> {
        let commits = commits::Commits::new(
            Arc::clone(&parts.store),
            commits::Held {
                cap: config.gateway.max_held_per_recipient,
            },
        );
        let sent_rows = commits::Grouped::new(Arc::clone(&parts.store), commits::SentRows);
        let (launch_lane, cwd_lane) = (
            Lane::new("launch", LAUNCH_THREADS)?,
            Lane::new("cwd", CWD_THREADS)?,
        );
        Ok(Arc::new_cyclic(|plane: &std::sync::Weak<Self>| Self {
            commits,
            sent_rows,
            launch_lane,
            cwd_lane,
            config,
            host_id,
            mcp_url,
            db: Db::new(parts.store),
            panes: parts.panes,
            launchers: Arc::new(parts.launchers),
            sessions: Shared::default(),
            inboxes: Inboxes::new(messages::abandoned_answers(plane.clone())),
            shutdown,
            tasks: TaskTracker::new(),
            afar,
            coordinator: parts.coordinator,
            workdirs: Arc::new(parts.workdirs),
            metrics: Metrics::new(),
            health: parts.health,
            listener: parts.listener,
        }))
    }

    /// Declares the configured leads.
    async fn declare_leads(&self) -> Result<(), FleetError> {
        for (name, lead) in &self.config.leads {
            let (name, host, groups) = (name.clone(), self.host_id.clone(), lead.groups.clone());
            let gid = self
                .db
                .run(move |s| s.ensure_lead(&name, &host, &groups))
                .await?;
            let entity = self
                .db
                .run(move |s| s.entity(gid))
                .await?
                .ok_or_else(|| FleetError::internal("a lead vanished from the store"))?
                .entity;
            self.sessions.lock().add_lead(entity);
            // Where it was last nudged, while the tmux server of that pane still runs: what
            // waits for it (a restart's notices, a reply from a worker taken back) is nudged
            // before it calls again.
            let remembered = self.db.run(move |s| s.lead_pane(gid)).await?;
            if let Some((pane, socket, server)) = remembered
                && let Some(target) =
                    NudgeTarget::from_headers(Some(&pane), Some(&format!("{socket},{server},0")))
                && target.server_runs().await
                && let Some(lead) = self.sessions.lock().leads.get_mut(&gid)
            {
                lead.remember(target);
            }
        }
        Ok(())
    }

    /// Records where lead `gid` is to be nudged, as its call just said, for a restart: only a
    /// pane whose tmux server is known (its socket, UTF-8, and its pid), which a restart can
    /// check is still the one that holds it.
    async fn remember_lead_pane(&self, gid: Gid) {
        let target = self
            .sessions
            .lock()
            .leads
            .get(&gid)
            .and_then(|l| l.nudge_target().cloned());
        let Some(NudgeTarget {
            socket: Some(socket),
            server: Some(server),
            pane,
        }) = target
        else {
            return;
        };
        let Some(socket) = socket.to_str().map(String::from) else {
            return;
        };
        if let Err(e) = self
            .db
            .run(move |s| s.put_lead_pane(gid, &pane, &socket, server))
            .await
        {
            tracing::warn!(%gid, error = %e, "cannot record where the lead is nudged");
        }
    }

    /// Starts the coordinator's link, ends what a previous run left and this start did not
    /// take back (`back`), fails what it left half-delivered, closes its other panes, and
    /// starts the pumps, the pane watcher and the nudgers.
    async fn start(self: &Arc<Self>, back: adoption::TakenBack) -> Result<(), FleetError> {
        self.start_coordinator().await?;
        self.recover(back).await?;
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

    /// The local side of [`Gateway::problems`].
    fn problems(&self) -> Vec<String> {
        self.health.problems()
    }

    /// The local side of [`Gateway::shut_down`].
    async fn shut_down(self: &Arc<Self>) {
        self.health.stopping();
        self.shutdown.cancel();
        let live: Vec<Gid> = self
            .sessions
            .lock()
            .panes
            .iter()
            .filter(|(_, s)| s.status().is_live())
            .map(|(gid, _)| *gid)
            .collect();
        let running = if self.stops_workers() {
            for gid in live {
                self.end_session(gid, "fleetd stopped", true).await;
            }
            Vec::new()
        } else {
            tracing::info!(
                workers = live.len(),
                "leaving the workers running: the next start takes them back ([gateway] on_exit = \"keep\")"
            );
            live
        };
        self.tasks.close();
        self.tasks.wait().await;
        // The workspaces whose teardown was still to come go now, but for those still in use.
        self.launchers.workspaces.end_leftovers(&running).await;
    }

    /// Whether fleetd's exit ends its workers (`[gateway] on_exit = "stop"`), or leaves them
    /// running for the next start.
    fn stops_workers(&self) -> bool {
        self.config.gateway.on_exit == crate::config::OnExit::Stop
    }

    /// The local side of [`Gateway::host_id`].
    fn host_id(&self) -> &str {
        &self.host_id
    }

    /// The local side of [`Gateway::authenticate`].
    async fn authenticate(
        self: &Arc<Self>,
        hash: [u8; 32],
        nudge: Option<NudgeTarget>,
        acting: bool,
    ) -> Result<Result<Caller, String>, FleetError> {
        // Asked here, not on a blocking thread: a token lookup has a reader of its own that
        // never waits for writers (see `SqliteStore`), and a hop per request costs more.
        let Some(gid) = self
            .db
            .at_once()
            .gid_for_token(&hash)
            .map_err(store_error)?
        else {
            return Ok(Err("unknown, revoked or rotated bearer token: a lead's or operator's current one is what `fleetd token NAME` prints (a Claude Code set up by `fleetd init` reads it when it connects: start it again, or /mcp and Reconnect; one set up by hand: after a rotation, set FLEET_TOKEN again with the export line `fleetd mcp-config NAME` prints, then restart the client: it reads its token when it starts); a worker's ends with its session".into()));
        };
        let called_in = self.sessions.lock().called_in(gid, nudge, acting);
        match called_in {
            Some((entity, changed)) => {
                match changed {
                    CalledIn::BecameReady => self.persist_status(gid).await,
                    CalledIn::PaneNamed => {
                        self.inboxes.bump(gid);
                        self.remember_lead_pane(gid).await;
                    }
                    CalledIn::Nothing => {}
                }
                Ok(Ok(Caller { entity }))
            }
            None => Ok(Err(match self.db.run(move |s| s.entity(gid)).await? {
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

    /// The local side of [`Gateway::listed_tools`].
    async fn listed_tools(&self, caller: &Caller) {
        let gid = caller.entity.gid;
        if self.sessions.lock().listed_tools(gid) {
            self.persist_status(gid).await;
        }
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
