//! `fleetd serve`: wires the store, the pane host, the gateway and the HTTP front together,
//! and owns the one shutdown story: the first SIGINT/SIGTERM drains (open calls end; the
//! workers keep running for the next start, or with `on_exit = "stop"` their panes close), a
//! second one exits at once.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, bail};
use fleet_mux::PaneHost;
use fleet_mux::herdr::host::Herdr;
use fleet_mux::tmux::spread::Spread;
use fleet_store::SqliteStore;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::authority::{AllowedHosts, Authority};
use crate::config::{CLAUDE_CREDENTIALS, Config};
use crate::gateway::{Coordinator, Federation, Gateway, Parts, Workdirs};
use crate::health::{FAULT_VAR, Fault, Health};
use crate::http::{CallerCaps, app};
use crate::identity::GatewayKey;
use crate::launch::{HostFacts, Launchers};
use crate::listen::Listen;
use crate::mux::{MuxChoice, choose};
use crate::notify::{NotifyTarget, STOPPING, notify, ready_message};
use crate::state::StateDir;

/// Everything `serve` needs, resolved from the command line and the config.
pub struct ServeOptions {
    /// The configuration.
    pub config: Config,
    /// The state dir.
    pub state: StateDir,
    /// Where to listen: `gateway.listen`, or a socket already bound (`--listen-fd`).
    pub listen: Listen,
    /// The service manager to tell when fleetd serves and stops (`NOTIFY_SOCKET`).
    pub notify: Option<NotifyTarget>,
}

/// This host's id: from config, else the machine's hostname made into a valid name.
pub fn host_id(config: &Config) -> String {
    if let Some(id) = &config.gateway.host_id {
        return id.clone();
    }
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let cleaned: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let cleaned = cleaned.trim_start_matches(['-', '.']).to_string();
    if cleaned.is_empty() {
        "localhost".into()
    } else {
        cleaned
            .chars()
            .take(fleet_core::entity::MAX_NAME_LEN)
            .collect()
    }
}

/// The MCP URL workers (and, through `mcp-config`, leads) are given: `gateway.advertise_url`,
/// else `http://<listening>/mcp`. `serve` passes the address its socket is bound to;
/// `mcp-config`, which has no socket, `gateway.listen`.
pub fn mcp_url(config: &Config, listening: SocketAddr) -> String {
    config
        .gateway
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("http://{listening}/mcp"))
}

/// Writes `text` to `path` whole or not at all: a reader never sees half of it.
fn write_whole(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

/// The base URL a command on this host reaches a gateway bound to `bound` at: its own address,
/// or loopback for a wildcard one.
pub fn local_base(bound: SocketAddr) -> String {
    let ip = match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, bound.port()))
}

/// The pane host fleetd drives, for what only serve does with it: say where panes are, and
/// clean up at shutdown.
enum Host {
    /// Private tmux servers.
    Tmux(Arc<Spread>),
    /// A herdr server.
    Herdr(Arc<Herdr>),
}

impl Host {
    fn pane_host(&self) -> Arc<dyn PaneHost> {
        match self {
            Host::Tmux(tmux) => Arc::clone(tmux) as Arc<dyn PaneHost>,
            Host::Herdr(herdr) => Arc::clone(herdr) as Arc<dyn PaneHost>,
        }
    }

    fn describe(&self) -> String {
        match self {
            Host::Tmux(tmux) => tmux.attach_hint(),
            Host::Herdr(herdr) => format!("herdr at {}", herdr.socket().display()),
        }
    }

    /// After the loops ended: herdr's workspace shell closes (the workers' panes, in tabs of
    /// their own, stay); tmux's private servers go only with the workers (`stops_workers`): they
    /// hold their panes.
    async fn shut_down(&self, stops_workers: bool) {
        let done = match self {
            Host::Tmux(tmux) if stops_workers => tmux.kill_servers().await,
            Host::Tmux(_) => Ok(()),
            Host::Herdr(herdr) => herdr.close_workspace().await,
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "cannot clean up the pane host");
        }
    }
}

/// The listening socket, bound here to `gateway.listen` or given ready.
async fn listener(listen: Listen) -> anyhow::Result<tokio::net::TcpListener> {
    match listen {
        Listen::Bind(addr) => tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (gateway.listen)")),
        Listen::Bound(listener) => {
            listener
                .set_nonblocking(true)
                .context("cannot make the given socket non-blocking")?;
            tokio::net::TcpListener::from_std(listener).context("cannot serve on the given socket")
        }
    }
}

/// Takes the state dir's lock, so two gateways never share one state dir (and its panes).
fn lock_state(state: &StateDir) -> anyhow::Result<File> {
    let path = state.root().join("serve.lock");
    let file = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    if file.try_lock().is_err() {
        bail!(
            "another fleetd is already serving the state dir {}: stop it, or give this one another --state-dir",
            state.root().display()
        );
    }
    Ok(file)
}

/// Runs the gateway until a signal (or `shutdown`) stops it.
pub async fn serve(options: ServeOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let ServeOptions {
        config,
        state,
        listen,
        notify: manager,
    } = options;
    crate::logs::allow_text(config.gateway.log_text);
    let fleetd_env = |key: &str| std::env::var(key).ok();
    config
        .check_logins(&fleetd_env)
        .map_err(|e| anyhow::anyhow!("cannot start: {e}"))?;
    let (state, _lock) = take_state(state)?;
    // Made at first start; other hosts pin its public key (`fleetd key`). A key file others
    // could read is refused here, before anything is served.
    let (key, made) = GatewayKey::load_or_create(&state)?;
    tracing::info!(public = %key.public_text(), fingerprint = %key.fingerprint(), made, "gateway key");
    let store = SqliteStore::open(&state.db_path())
        .with_context(|| format!("cannot open {}", state.db_path().display()))?;
    let (choice, why) =
        choose(&config.mux, |key| std::env::var(key).ok(), &state).map_err(anyhow::Error::msg)?;
    let panes = open_panes(choice, &state).await?;
    tracing::info!(panes = %panes.describe(), why = %why, "pane host chosen");
    let listener = listener(listen).await?;
    let bound = listener.local_addr()?;
    let url = workers_url(&config, bound);
    let host = host_id(&config);
    let extra_hosts = allowed_hosts(&url, bound);

    let limits = listener_limits(&config.gateway);
    let drain = Duration::from_secs(config.gateway.drain_timeout_s);
    let stats = Arc::new(crate::listener::ListenerStats::default());
    let caps = CallerCaps::of(&config.gateway);
    let parts = gateway_parts(
        &config,
        &state,
        (&host, &key),
        store,
        &panes,
        Arc::clone(&stats),
    )?;
    let gateway = Gateway::new(
        Arc::new(config),
        host.clone(),
        url.clone(),
        parts,
        shutdown.child_token(),
    )
    .context("cannot start the gateway's threads")?;
    gateway.start().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let router = app(
        Arc::clone(&gateway),
        AllowedHosts::new(bound.port(), extra_hosts),
        caps,
        &shutdown,
    );

    let drained = watch_signals(shutdown.clone(), drain)?;
    let serving = Serving::say(&state, bound);
    tracing::info!(
        host_id = %host,
        listen = %bound,
        mcp = %url,
        state_dir = %state.root().display(),
        panes = %panes.describe(),
        "fleetd ready"
    );
    let told = tell_manager(manager, &shutdown);
    crate::listener::serve(listener, router, limits, stats, shutdown.clone()).await;
    stopping_told(&shutdown, told).await;
    serving.unsay();
    stop_gateway(&gateway, &panes).await;
    drained.store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::info!("fleetd stopped");
    Ok(())
}

/// Stops the gateway's loops, and (with `on_exit = "stop"`) its workers, then tidies the pane
/// host ([`Host::shut_down`]).
async fn stop_gateway(gateway: &Gateway, panes: &Host) {
    let stops_workers = gateway.stops_workers();
    tracing::info!(stops_workers, "draining");
    gateway.shut_down().await;
    panes.shut_down(stops_workers).await;
}

/// Tells the service manager (if any) that fleetd is ready, and, as the stop begins (not once
/// the drain is over), that it is stopping: the task that does so once `shutdown` is cancelled.
fn tell_manager(
    manager: Option<NotifyTarget>,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    notify(manager.as_ref(), &ready_message(std::process::id()));
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        stopping.cancelled().await;
        notify(manager.as_ref(), STOPPING);
    })
}

/// Once the listener has ended: the stop has begun (whatever ended it), and the service manager
/// hears so before the rest of it, the task that tells it (`told`, from [`tell_manager`]) run to
/// its end (it may not have been polled yet, and would go with the runtime).
async fn stopping_told(shutdown: &CancellationToken, told: tokio::task::JoinHandle<()>) {
    shutdown.cancel();
    if let Err(e) = told.await {
        tracing::warn!(error = %e, "cannot tell the service manager that fleetd is stopping");
    }
}

/// What the gateway of `host` (signing with `key`) runs on: its `store`, its `panes`, its
/// launchers and work dirs, its federated plane and coordinator when configured, its health,
/// and the listener's counts (`stats`).
fn gateway_parts(
    config: &Config,
    state: &StateDir,
    (host, key): (&str, &GatewayKey),
    store: SqliteStore,
    panes: &Host,
    stats: Arc<crate::listener::ListenerStats>,
) -> anyhow::Result<Parts> {
    let workdirs = workdirs(config, state)?;
    let fleetd_env = |key: &str| std::env::var(key).ok();
    Ok(Parts {
        store: Arc::new(store),
        panes: panes.pane_host(),
        launchers: Launchers::new(state.root(), host_facts(&workdirs, &fleetd_env)),
        federation: open_federation(config, state, host, key)?,
        coordinator: open_coordinator(config, state, host, key)?,
        workdirs,
        health: Health::new(std::env::var(FAULT_VAR).ok().and_then(|f| Fault::parse(&f))),
        listener: stats,
    })
}

/// The state dir made ready and resolved, and its lock taken (held as long as the file is).
fn take_state(state: StateDir) -> anyhow::Result<(StateDir, File)> {
    state
        .prepare()
        .with_context(|| format!("cannot create the state dir {}", state.root().display()))?;
    let state = state
        .resolved()
        .with_context(|| "cannot resolve the state dir's path")?;
    let lock = lock_state(&state)?;
    Ok((state, lock))
}

/// The MCP URL handed to workers: the socket's own (`bound`), with a warning when
/// `fleetd mcp-config`, which reads `gateway.listen`, would print another.
fn workers_url(config: &Config, bound: SocketAddr) -> String {
    let url = mcp_url(config, bound);
    let configured = mcp_url(config, config.gateway.listen);
    if url != configured {
        tracing::warn!(
            mcp = %url,
            mcp_config = %configured,
            "workers are given the socket's own URL, but `fleetd mcp-config` prints one from gateway.listen: set gateway.listen to the socket's address (or gateway.advertise_url) so leads get the right one"
        );
    }
    url
}

/// Where this gateway answers here, and its pid, as the state dir says it for `fleetd ls` and
/// the other operator commands (gone, the file is stale).
struct Serving {
    path: PathBuf,
    said: String,
}

impl Serving {
    /// Says that this gateway serves at `bound`.
    fn say(state: &StateDir, bound: SocketAddr) -> Self {
        let path = state.serving_path();
        let said = format!("{}\npid {}\n", local_base(bound), std::process::id());
        if let Err(e) = write_whole(&path, &said) {
            tracing::warn!(path = %path.display(), error = %e, "cannot say where this gateway serves: `fleetd ls` may not find it");
        }
        Self { path, said }
    }

    /// Gone, it serves nowhere (unless another has taken the state dir since).
    fn unsay(self) {
        if std::fs::read_to_string(&self.path).is_ok_and(|s| s == self.said) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The pane host `choice` names, opened.
async fn open_panes(choice: MuxChoice, state: &StateDir) -> anyhow::Result<Host> {
    Ok(match choice {
        MuxChoice::Tmux { socket, per_server } => {
            // Pastes are staged here only for the moment of a paste: whatever is left is a
            // crash's.
            let scratch = state.root().join("paste");
            if scratch.exists() {
                std::fs::remove_dir_all(&scratch)
                    .with_context(|| format!("cannot clear {}", scratch.display()))?;
            }
            Host::Tmux(Arc::new(Spread::open(socket, scratch, per_server).await))
        }
        MuxChoice::Herdr { socket, workspace } => Host::Herdr(Arc::new(
            Herdr::connect(&socket, &workspace)
                .await
                .with_context(|| "cannot use herdr (set [mux] kind, socket or session)")?,
        )),
    })
}

/// The hosts a request may name besides loopback at this port: the advertised URL's authority
/// (a sandbox's worker reaches the gateway through it), and the address bound, if it is a
/// real one.
fn allowed_hosts(url: &str, bound: std::net::SocketAddr) -> Vec<Authority> {
    let mut extra_hosts = Vec::new();
    if let Some(advertised) = url::Url::parse(url)
        .ok()
        .and_then(|url| Authority::of_url(&url))
    {
        extra_hosts.push(advertised);
    }
    if !bound.ip().is_loopback() && !bound.ip().is_unspecified() {
        extra_hosts.push(Authority::new(&bound.ip().to_string(), bound.port()));
    }
    extra_hosts
}

/// Where workers may work, from `gateway.workdir_roots`, with a warning where that leaves a
/// sandbox, or a spawn naming no cwd, worse off than a user would expect.
fn workdirs(config: &Config, state: &StateDir) -> anyhow::Result<Workdirs> {
    let workdirs = Workdirs::new(state.root(), &config.gateway.workdir_roots)
        .map_err(|e| anyhow::anyhow!("cannot start: {e}"))?;
    if config.gateway.workdir_roots.is_empty()
        && config
            .profiles
            .iter()
            .any(|p| p.kind == crate::config::ProfileKind::Sandbox)
    {
        tracing::warn!(
            "sandbox profiles but no gateway.workdir_roots: a lead may give a sandboxed worker any directory fleetd can reach as its cwd (~/.ssh, say), which the sandbox then sees; set workdir_roots"
        );
    }
    // Without roots, a spawn naming no cwd (of a profile without one) works in fleetd's own.
    if workdirs.roots().is_empty()
        && let Ok(here) = std::env::current_dir()
        && let Err(e) = workdirs.resolve(&here, "this host")
    {
        tracing::warn!(reason = %e.message, "a spawn with no cwd (from a profile without one) will be refused: fleetd's own working directory may not be a worker's");
    }
    Ok(workdirs)
}

/// The federated plane, when a broker is configured.
fn open_federation(
    config: &Config,
    state: &StateDir,
    host: &str,
    key: &GatewayKey,
) -> anyhow::Result<Option<Arc<Federation>>> {
    Ok(match config.broker.clone() {
        Some(broker) => {
            if config.federation.insecure_unsigned {
                tracing::error!(
                    "INSECURE: [federation] insecure_unsigned = true — messages off the broker are taken without checking who signed them, so anyone who can publish on the vhost can type into this host's workers; for a lab only"
                );
            }
            let federation = Federation::new(
                broker,
                config.federation.clone(),
                state.root(),
                host,
                key.signing_key(),
            )
            .map_err(anyhow::Error::msg)?;
            tracing::info!(pinned_hosts = federation.pinned_hosts(), "federation trust");
            Some(federation)
        }
        None => None,
    })
}

/// Lead-to-lead coordination, when a coordinator is configured.
fn open_coordinator(
    config: &Config,
    state: &StateDir,
    host: &str,
    key: &GatewayKey,
) -> anyhow::Result<Option<Coordinator>> {
    Ok(match config.coordinator.clone() {
        Some(coordinator) => {
            let ids = config
                .coord_ids(host)
                .map_err(|e| anyhow::anyhow!("cannot start: {e}"))?;
            let coordinator = Coordinator::new(
                coordinator,
                config.federation.clone(),
                ids,
                (host, state.root()),
                key.signing_key(),
            )
            .map_err(anyhow::Error::msg)?;
            Some(coordinator)
        }
        None => None,
    })
}

/// What launchers need to know of this host: the user's home and Claude Code's config dir
/// (resolved, as the state dir is: a sandbox template names both), where workers may work,
/// and the credentials found in fleetd's environment.
fn host_facts(workdirs: &Workdirs, fleetd_env: &dyn Fn(&str) -> Option<String>) -> HostFacts {
    HostFacts {
        user_home: std::env::var_os("HOME")
            .map(PathBuf::from)
            .map(|home| std::fs::canonicalize(&home).unwrap_or(home)),
        claude_config_dir: std::env::var_os("CLAUDE_CONFIG_DIR")
            .filter(|dir| !dir.is_empty())
            .map(PathBuf::from),
        workdir_roots: workdirs.roots().to_vec(),
        credentials: CLAUDE_CREDENTIALS
            .iter()
            .filter_map(|key| {
                fleetd_env(key)
                    .filter(|value| !value.is_empty())
                    .map(|value| (key.to_string(), value))
            })
            .collect(),
    }
}

/// The listener's limits from `[gateway]`, its connection cap fitted to the open-file limit
/// (raised to the hard limit first).
fn listener_limits(gateway: &crate::config::GatewayConfig) -> crate::listener::Limits {
    let open_files = crate::listener::raise_open_files(crate::listener::table::files_wanted(
        gateway.max_connections,
    ));
    let max_connections =
        crate::listener::table::connection_room(gateway.max_connections, open_files);
    if max_connections < gateway.max_connections {
        tracing::warn!(
            max_connections,
            configured = gateway.max_connections,
            open_files = open_files.unwrap_or(u64::MAX),
            "the open-file limit leaves room for fewer connections than gateway.max_connections: raise its hard limit (LimitNOFILE= in a systemd unit, ulimit -Hn in a shell)"
        );
    }
    crate::listener::Limits {
        max_connections,
        header_timeout: Duration::from_secs(gateway.header_timeout_s),
        idle_timeout: Duration::from_secs(gateway.idle_timeout_s),
        // Half the drain for connections to end what they are doing, half for the gateway's
        // own (sessions, panes) after them.
        drain: Duration::from_secs(gateway.drain_timeout_s) / 2,
    }
}

/// Watches for SIGINT, SIGTERM and SIGHUP (a closed terminal) on a thread of its own, with a
/// runtime of its own, so a gateway whose runtime is wedged still hears them: the first starts
/// the drain (`shutdown`), which may last `drain` at most — unless the returned flag says it
/// is over — and a second signal exits at once. Nothing between a signal and the drain, or the
/// drain's end and the exit, waits on anything (the log never blocks; see [`crate::logs`]).
fn watch_signals(shutdown: CancellationToken, drain: Duration) -> anyhow::Result<Arc<AtomicBool>> {
    let drained = Arc::new(AtomicBool::new(false));
    let over = Arc::clone(&drained);
    let (installed, told) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("fleetd-signals".into())
        .spawn(move || {
            let watching = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .and_then(|runtime| {
                    let signals = runtime.block_on(async {
                        Ok::<_, std::io::Error>([
                            signal(SignalKind::terminate())?,
                            signal(SignalKind::interrupt())?,
                            signal(SignalKind::hangup())?,
                        ])
                    })?;
                    Ok((runtime, signals))
                });
            let (runtime, [mut term, mut int, mut hup]) = match watching {
                Ok(watching) => {
                    let _ = installed.send(Ok(()));
                    watching
                }
                Err(e) => {
                    let _ = installed.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                    _ = hup.recv() => {}
                }
                shutdown.cancel();
                cut_drain_after(drain, over);
                tracing::info!(
                    drain_timeout_s = drain.as_secs(),
                    "shutting down: draining (a second signal exits at once)"
                );
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                    _ = hup.recv() => {}
                }
                tracing::warn!("second signal: exiting now");
                crate::audit::flush_all(LAST_LINES_WITHIN);
                crate::logs::flush(LAST_LINES_WITHIN);
                std::process::exit(130);
            });
        })
        .context("cannot start the signal watcher")?;
    // Installed before fleetd serves: a signal from now on is never missed.
    told.recv()
        .context("the signal watcher stopped before it started")?
        .context("cannot install signal handlers")?;
    Ok(drained)
}

/// How long a process about to exit waits for its last log lines.
const LAST_LINES_WITHIN: Duration = Duration::from_secs(1);

/// Exits the process `drain` from now, unless `drained` says the drain is over by then (the
/// process is ending on its own). A thread of its own: nothing else may hold it up.
fn cut_drain_after(drain: Duration, drained: Arc<AtomicBool>) {
    let cut = move || {
        std::thread::sleep(drain);
        if drained.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        tracing::error!(
            drain_timeout_s = drain.as_secs(),
            "the drain did not end within gateway.drain_timeout_s: exiting anyway (the next start reaps what is left)"
        );
        crate::audit::flush_all(LAST_LINES_WITHIN);
        crate::logs::flush(LAST_LINES_WITHIN);
        std::process::exit(1);
    };
    if let Err(e) = std::thread::Builder::new()
        .name("fleetd-drain".into())
        .spawn(cut)
    {
        tracing::error!(error = %e, "cannot bound the drain: it may last as long as it takes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_on_this_host_reaches_a_wildcard_bind_through_loopback() {
        let at = |s: &str| local_base(s.parse().unwrap());
        assert_eq!(at("0.0.0.0:8765"), "http://127.0.0.1:8765");
        assert_eq!(at("[::]:9"), "http://[::1]:9");
        assert_eq!(at("127.0.0.1:4000"), "http://127.0.0.1:4000");
        assert_eq!(at("10.1.2.3:80"), "http://10.1.2.3:80");
    }
}
