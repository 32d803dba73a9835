//! `fleet-bench scale`: fleetd with many agents (issue 16, item 3). Three parts, each figure
//! printed beside a baseline measured in the same run:
//!
//! - **idle**: one gateway holding `--workers` idle cheap workers (a `sh` that prints a ready
//!   marker and becomes `cat`: a tiny process per pane, ready by its screen). fleetd's and,
//!   apart, its tmux servers' RSS and CPU beside the same gateway with no workers; how long
//!   the spawns took; the host's presence traffic beside the rate its interval promises (one
//!   heartbeat a round for the host and all its entities) and a heartbeat per entity; what
//!   another gateway lists of it; `fleet_list` latency beside a handful of entries.
//! - **loop**: `--loop-workers` scripted agents, each with one task in flight from the lead at
//!   all times (round trips/s, p50/p99) beside a single lane, and beside a loop of
//!   `--loop-small` run first with only its own panes (round trips/s and CPU per round trip,
//!   each beside its target); fleetd's CPU during the loop
//!   beside idle; the cost of fleetd's periodic screen looks (a busy worker's screen every
//!   500 ms for dialogs, every 1 s for stalls, when its profile asks for them): the same loop,
//!   and the same workers held busy, with profiles that ask for them and without.
//! - **roster**: convergence of `--gateways` × `--entities` beside 3 × `--entities`, with each
//!   host's presence traffic, the gateways' CPU and `fleet_list` with every entry.
//!
//! It never waits without a bound: a part that does not converge fails naming what did not.
//! Every fleetd, tmux server and vhost it starts goes with its guard when it ends.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use fleet_amqp::Table;
use fleet_amqp::topology::ROSTER_EXCHANGE;
use fleet_core::admission::Settlement;
use fleet_mux::tmux::spread;
use fleet_testkit::bins::binary;
use fleet_testkit::broker::{Broker, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, agent_workdir, sim_profile};
use fleet_testkit::keys;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{cpu_seconds, percentiles, rss_mb, trips_to};

/// Its options.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Idle workers on the one gateway of the idle part.
    #[arg(long, default_value_t = 1000)]
    workers: usize,
    /// Gateways of the roster part.
    #[arg(long, default_value_t = 10)]
    gateways: usize,
    /// Entities (leads: no panes) per gateway of the roster part.
    #[arg(long, default_value_t = 1000)]
    entities: usize,
    /// Scripted agents in the closed loop, one task in flight each.
    #[arg(long, default_value_t = 100)]
    loop_workers: usize,
    /// Scripted agents of the small closed loop run first, alone on the gateway, as the
    /// baseline the big one is held to (at least as many round trips/s, no more CPU each).
    #[arg(long, default_value_t = 10)]
    loop_small: usize,
    /// How long the closed loop is timed, in seconds (after a warm-up of 2 s).
    #[arg(long, default_value_t = 10)]
    loop_s: u64,
    /// How long each CPU figure is measured over, in seconds.
    #[arg(long, default_value_t = 10)]
    window_s: u64,
    /// The idle gateway's `presence_interval_s` (fleetd's default).
    #[arg(long, default_value_t = 5)]
    presence_interval_s: u64,
    /// The roster part's `presence_interval_s` (as `fleet-bench federation`'s convergence).
    #[arg(long, default_value_t = 1)]
    roster_interval_s: u64,
    /// `fleet_spawn` calls in flight at once while the workers are spawned.
    #[arg(long, default_value_t = 16)]
    spawn_lanes: usize,
    /// `fleet_list` calls timed for each latency figure.
    #[arg(long, default_value_t = 100)]
    list_calls: usize,
    /// `[mux] panes_per_server` of the gateways of the idle and loop parts (unset: fleetd's
    /// default; a count past every pane puts them all on one server).
    #[arg(long)]
    panes_per_server: Option<usize>,
    /// Round trips of the single-lane baseline (after 20 untimed).
    #[arg(long, default_value_t = 200)]
    trips: usize,
    /// Seconds to keep the idle gateway up after its figures, its workers idle (for a profiler).
    #[arg(long, default_value_t = 0)]
    linger_s: u64,
    /// Only these parts (comma-separated); all three when not given.
    #[arg(long, value_enum, value_delimiter = ',')]
    parts: Vec<Part>,
}

/// A part of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// Many idle workers on one gateway.
    Idle,
    /// The closed loop, and the screen looks' cost.
    Loop,
    /// Roster convergence over many gateways.
    Roster,
}

/// The ready marker of the cheap worker.
const TINY_READY: &str = "TINY-READY";

/// `profile` (a `[[profiles]]` block, the last table so far) working in a directory of its
/// own: wherever the bench runs from (fleetd's own working directory is a worker's default,
/// and may hold the state dir).
fn in_workdir(profile: &str) -> String {
    format!("{profile}cwd = {:?}\n", agent_workdir())
}

/// The cheap worker: a shell that prints its ready marker and becomes `cat` (one small process
/// per pane that reads its terminal and never calls in).
fn tiny_profile(name: &str) -> String {
    in_workdir(&format!(
        "[[profiles]]\nname = \"{name}\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo {TINY_READY}; exec cat\"]\nready_marker = \"{TINY_READY}\"\nready_timeout_s = 60\n"
    ))
}

/// A marker no screen of the benchmark shows: a profile with it is looked at for dialogs.
const NEVER_SHOWN: &str = "fleet-bench: a dialog never shown";

/// The scripted agent with fleetd's periodic screen looks turned on: for dialogs (a blocked
/// marker) and for stalls (a stall bound far longer than the benchmark).
fn watched_sim_profile(name: &str) -> anyhow::Result<String> {
    Ok(format!(
        "{}blocked_markers = [\"{NEVER_SHOWN}\"]\nstall_after_s = 3600\n",
        in_workdir(&sim_profile(name, &[])?)
    ))
}

/// How often fleetd looks at a busy worker's screen when its profile asks for both looks:
/// every 500 ms for a dialog (`DIALOG_LOOK`), every 1 s for a stall (`STALL_LOOK`).
const LOOKS_PER_BUSY_WORKER_PER_S: f64 = 3.0;

/// The most remote roster entries a gateway keeps per host by default
/// (`federation.max_remote_entities_per_host`).
const DEFAULT_REMOTE_ENTITIES_CAP: usize = 256;

/// How long the closed loop runs untimed before it is timed.
const LOOP_WARMUP: Duration = Duration::from_secs(2);

/// How long a lane's trips may take to finish once the timed window is over.
const LOOP_DRAIN: Duration = Duration::from_secs(60);

/// How long the workers sent a slow task have to all show busy.
const BUSY_LIMIT: Duration = Duration::from_secs(60);

/// How much longer than the window a held-busy worker's task lasts: time to type every task
/// in before the window and to spare after it.
const HOLD_MARGIN: Duration = Duration::from_secs(10);

/// How long the roster may take to converge before the part fails.
const CONVERGENCE_LIMIT: Duration = Duration::from_secs(120);

/// How long to wait between two looks at every gateway's `fleet_list` for convergence.
const CONVERGENCE_POLL: Duration = Duration::from_millis(50);

/// How many heartbeat rounds of a host a presence figure is measured over.
const BEAT_ROUNDS: usize = 2;

/// The command line this run was started with, to print beside its figures.
fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// The 1, 5 and 15 minute load averages.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// `tmux -L socket ARGS`: its output, or its error.
fn tmux(socket: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("tmux")
        .args(["-L", socket])
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "tmux -L {socket} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The names of fleetd's tmux servers running: `socket`, and those its panes spread to
/// (`socket-2`, `socket-3` …, up to the first not running).
fn tmux_names(socket: &str) -> Vec<String> {
    let running = |name: &String| tmux(name, &["display-message", "-p", "#{pid}"]).is_ok();
    std::iter::once(socket.to_string())
        .chain((1..spread::MAX_SERVERS).map(|k| spread::server_name(socket, k)))
        .enumerate()
        .take_while(|(k, name)| *k == 0 || running(name))
        .map(|(_, name)| name)
        .filter(running)
        .collect()
}

/// The pids of fleetd's tmux servers ([`tmux_names`]).
fn tmux_servers(socket: &str) -> Vec<u32> {
    tmux_names(socket)
        .iter()
        .filter_map(|name| tmux(name, &["display-message", "-p", "#{pid}"]).ok())
        .filter_map(|pid| pid.trim().parse().ok())
        .collect()
}

/// The pids of the programs in the panes of fleetd's tmux servers (fleetd's own control
/// sessions' included: they run nothing), each once (a worker's window is linked into fleetd's
/// session too, so it is listed twice).
fn pane_pids(socket: &str) -> anyhow::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for name in tmux_names(socket) {
        pids.extend(
            tmux(&name, &["list-panes", "-a", "-F", "#{pane_pid}"])?
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok()),
        );
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// The `[mux]` line `--panes-per-server` asks for (none: fleetd's default), to go first in
/// the config's rest (which follows `[mux]`).
fn spread_line(args: &Args) -> String {
    args.panes_per_server
        .map(|n| format!("panes_per_server = {n}\n"))
        .unwrap_or_default()
}

/// The pid of the broker's Erlang VM on this machine, if there is one: the `beam.smp` that
/// boots RabbitMQ (not one of `rabbitmqctl`'s, say, which are Erlang VMs too).
pub(super) fn broker_pid() -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            // `-s rabbit boot`: the node's own start.
            let boots = args.windows(2).any(|w| w == [&b"rabbit"[..], &b"boot"[..]]);
            (comm.trim() == "beam.smp" && boots).then_some(pid)
        })
}

/// What `pid` holds of the resources many panes need: open descriptors against its limit,
/// threads.
fn held_by(pid: u32) -> String {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    let limit = std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(String::from))
        })
        .unwrap_or_else(|| "?".into());
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .map(|t| t.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    format!("{fds} descriptors open (limit {limit}), {threads} threads")
}

/// What fleetd and its tmux servers hold, and the machine's pseudo-terminals in use: where
/// spawning many panes would run out first.
fn resources(fleetd: u32, socket: &str) -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    let servers = tmux_servers(socket);
    let tmux = match servers.as_slice() {
        [] => "not running".to_string(),
        [pid] => format!("pid {pid}, {}", held_by(*pid)),
        [first, .., last] => format!(
            "{} of them; the first: pid {first}, {}; the last: pid {last}, {}",
            servers.len(),
            held_by(*first),
            held_by(*last)
        ),
    };
    format!(
        "fleetd: {}; tmux servers: {tmux}; pseudo-terminals in use: {} of kernel.pty.max {}",
        held_by(fleetd),
        read("/proc/sys/kernel/pty/nr"),
        read("/proc/sys/kernel/pty/max")
    )
}

/// The CPU time of groups of processes at one instant (each group summed; a process that is
/// gone counts nothing).
struct Mark {
    at: Instant,
    seconds: Vec<f64>,
}

impl Mark {
    fn of(groups: &[Vec<u32>]) -> Mark {
        Mark {
            at: Instant::now(),
            seconds: groups
                .iter()
                .map(|pids| pids.iter().map(|p| cpu_seconds(*p).unwrap_or(0.0)).sum())
                .collect(),
        }
    }

    /// Each group's share of one core from `earlier` to this mark, in per cent.
    fn since(&self, earlier: &Mark) -> Vec<f64> {
        let wall = self.at.duration_since(earlier.at).as_secs_f64().max(1e-9);
        self.seconds
            .iter()
            .zip(&earlier.seconds)
            .map(|(now, then)| (now - then).max(0.0) / wall * 100.0)
            .collect()
    }
}

/// Each group's share of one core over `window`.
async fn cpu_over(groups: &[Vec<u32>], window: Duration) -> Vec<f64> {
    let first = Mark::of(groups);
    tokio::time::sleep(window).await;
    Mark::of(groups).since(&first)
}

/// `future`, or an error naming `what` once `limit` has passed.
async fn within<T>(
    limit: Duration,
    what: &str,
    future: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(limit, future)
        .await
        .map_err(|_| anyhow::anyhow!("gave up after {} s waiting for {what}", limit.as_secs()))?
}

/// Spawns workers `{prefix}{i}` for each `i` of `range`, profile `profile`, from `lead` with
/// `lanes` spawns in flight at once; each spawn's time to ready, by `i`. Fails on the first
/// spawn that fails (the others are abandoned), or when all take longer than `limit`.
async fn spawn_many(
    lead: &Arc<Client>,
    profile: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
    lanes: usize,
    limit: Duration,
) -> anyhow::Result<Vec<(usize, Duration)>> {
    let next = Arc::new(AtomicUsize::new(range.start));
    let mut set = JoinSet::new();
    for _ in 0..lanes.max(1) {
        let (lead, next, profile, prefix) = (
            Arc::clone(lead),
            Arc::clone(&next),
            profile.to_string(),
            prefix.to_string(),
        );
        let end = range.end;
        set.spawn(async move {
            let mut times = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return anyhow::Ok(times);
                }
                let started = Instant::now();
                lead.spawn(&profile, &format!("{prefix}{i}"))
                    .await
                    .with_context(|| {
                        format!(
                            "spawning worker {prefix}{i} ({} ready before it)",
                            times.len()
                        )
                    })?;
                times.push((i, started.elapsed()));
            }
        });
    }
    let all = async {
        let mut times = Vec::new();
        while let Some(joined) = set.join_next().await {
            times.extend(joined??);
        }
        times.sort_unstable();
        anyhow::Ok(times)
    };
    within(
        limit,
        &format!("{} workers of profile {profile} to spawn", range.len()),
        all,
    )
    .await
}

/// `calls` timed `fleet_list` calls of `lead` (after 5 untimed): their latencies, and the
/// entries and bytes of the last answer.
async fn list_latency(
    lead: &Client,
    calls: usize,
) -> anyhow::Result<(Vec<Duration>, usize, usize)> {
    let mut samples = Vec::with_capacity(calls);
    let mut last = Value::Null;
    for i in 0..calls + 5 {
        let started = Instant::now();
        last = lead.ok("fleet_list", json!({})).await?;
        if i >= 5 {
            samples.push(started.elapsed());
        }
    }
    let entries = last["entities"].as_array().map_or(0, Vec::len);
    Ok((samples, entries, last.to_string().len()))
}

/// The `fleet_list` entries of `lead` whose field `field` is `value`.
async fn listed(lead: &Client, field: &str, value: &str) -> anyhow::Result<Vec<Value>> {
    let list = lead.ok("fleet_list", json!({})).await?;
    Ok(list["entities"]
        .as_array()
        .map(|all| all.iter().filter(|e| e[field] == value).cloned().collect())
        .unwrap_or_default())
}

/// p50 and p99 of `samples` as text.
fn p50_p99(samples: &mut [Duration]) -> String {
    let (p50, p99) = percentiles(samples);
    format!("p50 {p50:.2} ms, p99 {p99:.2} ms")
}

/// What one host's heartbeats came to over some whole rounds: a round is what the host
/// publishes from one of its gateway entries (`roster.<host>._gateway`: since this build the
/// only heartbeat of a host; an older one sent it last in each round) to the next.
#[derive(Clone, Copy, Debug, PartialEq)]
struct BeatRate {
    /// Heartbeats per second.
    per_s: f64,
    /// Heartbeats per round.
    per_round: f64,
    /// Seconds from one round to the next.
    period_s: f64,
    /// Bytes of heartbeat bodies per second.
    bytes_per_s: f64,
}

/// Where a host's heartbeats stood when one of its gateway entries came: when, how many had
/// come by then, and how many bytes of bodies.
type RoundMark = (Instant, u64, u64);

/// The rate over the rounds between the first and the last of `rounds`. `None` for fewer
/// than two.
fn beat_rate(rounds: &[RoundMark]) -> Option<BeatRate> {
    let (first, last) = (rounds.first()?, rounds.last()?);
    let n = rounds.len().checked_sub(1).filter(|n| *n > 0)? as f64;
    let period_s = last.0.duration_since(first.0).as_secs_f64() / n;
    let per_round = (last.1 - first.1) as f64 / n;
    let bytes_per_round = (last.2 - first.2) as f64 / n;
    Some(BeatRate {
        per_s: per_round / period_s.max(1e-9),
        per_round,
        period_s,
        bytes_per_s: bytes_per_round / period_s.max(1e-9),
    })
}

/// The host a roster routing key (`roster.<host>.<who>`) is from, and whether it is the host's
/// own gateway entry.
fn beat_of(key: &str) -> Option<(&str, bool)> {
    let (host, who) = key.strip_prefix("roster.")?.split_once('.')?;
    Some((host, who == fleet_core::trust::GATEWAY_ENTRY))
}

/// What [`Heartbeats`] saw of one host.
#[derive(Debug, Default)]
struct HostBeats {
    /// Heartbeats so far.
    total: u64,
    /// Bytes of their bodies so far.
    bytes: u64,
    /// For each gateway entry: when it came, and `total` and `bytes` then.
    rounds: Vec<RoundMark>,
}

/// Counts the presence heartbeats on the roster exchange per host, through a queue of its own
/// bound to `roster.#` (as every gateway's roster queue is).
struct Heartbeats {
    seen: Arc<Mutex<BTreeMap<String, HostBeats>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeats {
    /// Starts counting on `vhost` (whose roster exchange a gateway declared already).
    async fn start(vhost: &Vhost) -> anyhow::Result<Self> {
        let client = vhost.connect().await?;
        let queue = format!("fleet-bench.heartbeats.{}", uuid::Uuid::now_v7().simple());
        client
            .declare_exclusive_queue(&queue, &Table::new())
            .await?;
        client.bind(&queue, ROSTER_EXCHANGE, "roster.#").await?;
        let mut deliveries = client
            .consume(&queue, "fleet-bench-heartbeats", true)
            .await?;
        let seen: Arc<Mutex<BTreeMap<String, HostBeats>>> = Arc::default();
        let counted = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            // The connection lives as long as the count.
            let _client = client;
            while let Some(Ok(delivery)) = deliveries.next().await {
                if let Some((host, gateway)) = beat_of(delivery.routing_key()) {
                    let mut seen = counted.lock().unwrap_or_else(|p| p.into_inner());
                    let beats = seen.entry(host.to_string()).or_default();
                    beats.total += 1;
                    beats.bytes += delivery.body().len() as u64;
                    if gateway {
                        let (total, bytes) = (beats.total, beats.bytes);
                        beats.rounds.push((Instant::now(), total, bytes));
                    }
                }
                let _ = delivery.settle(Settlement::Ack, false).await;
            }
        });
        Ok(Heartbeats { seen, task })
    }

    /// How many rounds of `host` have come so far.
    fn rounds(&self, host: &str) -> usize {
        self.lock().get(host).map_or(0, |b| b.rounds.len())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, HostBeats>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for [`BEAT_ROUNDS`] more whole rounds of every one of `hosts`, and meanwhile
    /// measures the CPU of `groups` from the first host's first round to its last: each host's
    /// rate over its rounds, and each group's share of one core.
    async fn steady(
        &self,
        hosts: &[String],
        groups: &[Vec<u32>],
        limit: Duration,
    ) -> anyhow::Result<(Vec<BeatRate>, Vec<f64>)> {
        let from: Vec<usize> = hosts.iter().map(|h| self.rounds(h)).collect();
        let deadline = Instant::now() + limit;
        let first_host = hosts.first().context("no host to measure")?;
        let mut marks: Vec<Mark> = Vec::new();
        let mut marked = from.first().copied().unwrap_or(0);
        loop {
            // The first host's rounds mark the CPU window, each as soon as it is seen.
            let now = self.rounds(first_host);
            if now > marked && now <= from[0] + BEAT_ROUNDS + 1 {
                marked = now;
                marks.push(Mark::of(groups));
            }
            let done = hosts
                .iter()
                .zip(&from)
                .all(|(h, f)| self.rounds(h) > f + BEAT_ROUNDS);
            if done {
                break;
            }
            if Instant::now() >= deadline {
                let seen: Vec<String> = hosts
                    .iter()
                    .zip(&from)
                    .map(|(h, f)| format!("{h}: {}", self.rounds(h) - f))
                    .collect();
                anyhow::bail!(
                    "gave up after {} s waiting for {} more heartbeat rounds of every host; rounds seen: {}",
                    limit.as_secs(),
                    BEAT_ROUNDS + 1,
                    seen.join(", ")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seen = self.lock();
        let rates = hosts
            .iter()
            .zip(&from)
            .map(|(h, f)| {
                seen.get(h)
                    .and_then(|b| b.rounds.get(*f..=f + BEAT_ROUNDS))
                    .and_then(beat_rate)
                    .with_context(|| format!("no whole heartbeat rounds of {h}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let cpu = match (marks.first(), marks.last()) {
            (Some(first), Some(last)) if marks.len() > 1 => last.since(first),
            _ => anyhow::bail!("the CPU window of {first_host}'s heartbeat rounds was not marked"),
        };
        Ok((rates, cpu))
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `[broker]` and `[federation]` blocks of a gateway of this benchmark on `uri`, trusting
/// `hosts`, heartbeating every `interval_s`, keeping `remote_cap` entries per remote host.
fn federation_blocks(uri: &str, hosts: &[String], interval_s: u64, remote_cap: usize) -> String {
    let ttl = (3 * interval_s).max(5);
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    format!(
        "[broker]\nuri = \"{uri}\"\n\n[federation]\npresence_interval_s = {interval_s}\npresence_ttl_s = {ttl}\nmax_remote_entities_per_host = {remote_cap}\n{}",
        keys::admitting(&hosts)
    )
}

/// The worker counts the idle gateway is measured at, on the way to `n`: none (the
/// baseline), a handful, and on through a tenth, a quarter and a half of `n` to show how the
/// figures grow.
fn stages(n: usize) -> Vec<usize> {
    let mut stages = vec![0, n.min(10), n / 10, n / 4, n / 2, n];
    stages.sort_unstable();
    stages.dedup();
    stages
}

/// What the idle gateway came to at one stage.
struct Stage {
    /// Its workers, all idle.
    workers: usize,
    /// fleetd's RSS, MB.
    rss: f64,
    /// Its tmux servers' RSS, MB (`None`: not running yet).
    tmux_rss: Option<f64>,
    /// The share of one core of fleetd and of its tmux servers: over whole heartbeat rounds on
    /// the broker, over `--window-s` without one.
    cpu: Vec<f64>,
    /// Its presence heartbeats over the same rounds (`None`: no broker).
    rate: Option<BeatRate>,
    /// `fleet_list`: latencies, entries, bytes.
    list: (Vec<Duration>, usize, usize),
    /// The entries of its last `fleet_list`.
    entities: Value,
}

/// One idle gateway brought up stage by stage.
struct IdleRun {
    /// Each stage's figures, from none to every worker.
    stages: Vec<Stage>,
    /// How long all the spawns took.
    spawn_total: Duration,
    /// The panes of its tmux servers with every worker (fleetd's control session's included).
    panes: usize,
    /// What fleetd and tmux held with every worker ([`resources`]).
    held: String,
    /// On the broker: how many of its entities the watching gateway lists, and the watcher's
    /// log line about the ones its cap kept out.
    watched: Option<(usize, Option<String>)>,
}

impl IdleRun {
    /// Its first stage (no workers) and its last (all of them).
    fn ends(&self) -> anyhow::Result<(&Stage, &Stage)> {
        match (self.stages.first(), self.stages.last()) {
            (Some(first), Some(last)) => Ok((first, last)),
            _ => anyhow::bail!("no stage was measured"),
        }
    }
}

/// The hosts of the idle part: the gateway with the workers, and the one watching it.
const IDLE_HOSTS: [&str; 2] = ["scale-big", "scale-obs"];

/// The idle gateway, on `vhost` (heartbeating, watched by another gateway) or with no broker
/// at all (`None`), brought up stage by stage; each stage's figures printed as they come.
async fn idle_run(args: &Args, vhost: Option<&Vhost>) -> anyhow::Result<IdleRun> {
    let n = args.workers;
    let interval = args.presence_interval_s;
    let hosts: Vec<String> = IDLE_HOSTS.iter().map(|h| h.to_string()).collect();
    let federation =
        vhost.map(|v| federation_blocks(&v.uri(), &hosts, interval, DEFAULT_REMOTE_ENTITIES_CAP));
    let big = Fleet::start_as(
        &hosts[0],
        &format!("max_long_calls_per_caller = {}", args.spawn_lanes + 8),
        &format!(
            "{}[leads.lead]\n\n{}\n{}",
            spread_line(args),
            tiny_profile("tiny"),
            federation.clone().unwrap_or_default()
        ),
    )
    .await?;
    let fleetd = big.pid().context("fleetd is not running")?;
    let socket = big.tmux_socket().to_string();
    let lead = Arc::new(big.lead("lead", Protocol::Stateless).await?);
    let watching = match (vhost, &federation) {
        (Some(vhost), Some(federation)) => {
            let beats = Heartbeats::start(vhost).await?;
            let obs =
                Fleet::start_as(&hosts[1], "", &format!("[leads.watcher]\n\n{federation}")).await?;
            let watcher = obs.lead("watcher", Protocol::Stateless).await?;
            // Until the watcher's heartbeats reach it, the big gateway lists only its own lead.
            within(
                Duration::from_secs(4 * interval + 10),
                "the two gateways to list each other",
                async {
                    while listed(&lead, "host", &hosts[1]).await?.is_empty()
                        || listed(&watcher, "host", &hosts[0]).await?.is_empty()
                    {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    anyhow::Ok(())
                },
            )
            .await?;
            Some((beats, obs, watcher))
        }
        _ => None,
    };
    println!(
        "  {} {}: fleetd pid {fleetd}, its panes on `tmux -L {socket}`",
        hosts[0],
        match vhost {
            Some(vhost) => format!(
                "on the broker (vhost {}, presence every {interval} s, watched by {})",
                vhost.name(),
                hosts[1]
            ),
            None => "with no broker (the local plane alone)".to_string(),
        }
    );
    println!(
        "  workers | fleetd RSS, CPU | tmux RSS, CPU | presence heartbeats/s, bytes/s (promised: one a round) | fleet_list entries: latency | spawns of the stage | load average"
    );

    // Stage by stage: spawn up to the stage's count, then measure with all of them idle.
    let limit = Duration::from_secs((BEAT_ROUNDS as u64 + 3) * interval + 20);
    let mut measured: Vec<Stage> = Vec::new();
    let mut spawned = 0;
    let mut spawn_total = Duration::ZERO;
    for workers in stages(n) {
        let started = Instant::now();
        let mut times: Vec<Duration> = if workers > spawned {
            let limit = Duration::from_secs(120 + (workers - spawned) as u64);
            spawn_many(
                &lead,
                "tiny",
                "t",
                spawned..workers,
                args.spawn_lanes,
                limit,
            )
            .await
            .map_err(|e| {
                e.context(format!(
                    "spawning workers {spawned}..{workers} of {n} failed after {:.1} s; {}",
                    started.elapsed().as_secs_f64(),
                    resources(fleetd, &socket)
                ))
            })?
            .into_iter()
            .map(|(_, d)| d)
            .collect()
        } else {
            Vec::new()
        };
        let took = started.elapsed();
        spawn_total += took;
        let added = workers - spawned;
        spawned = workers;
        let tmux_pids = tmux_servers(&socket);
        let groups = vec![vec![fleetd], tmux_pids.clone()];
        let (rate, cpu) = match &watching {
            Some((beats, ..)) => {
                let (rates, cpu) = beats.steady(&hosts[..1], &groups, limit).await?;
                (rates.first().copied(), cpu)
            }
            None => (
                None,
                cpu_over(&groups, Duration::from_secs(args.window_s)).await,
            ),
        };
        let stage = Stage {
            workers,
            rss: rss_mb(fleetd)?,
            tmux_rss: if tmux_pids.is_empty() {
                None
            } else {
                Some(
                    tmux_pids
                        .iter()
                        .map(|pid| rss_mb(*pid))
                        .sum::<anyhow::Result<f64>>()?,
                )
            },
            cpu,
            rate,
            list: list_latency(&lead, args.list_calls).await?,
            entities: lead.ok("fleet_list", json!({})).await?["entities"].take(),
        };
        let at = |i: usize| stage.cpu.get(i).copied().unwrap_or(0.0);
        let mut list = stage.list.0.clone();
        println!(
            "  {workers:>7} | {:.1} MB, {:.1} % | {} | {} | {}: {} | {} | {}",
            stage.rss,
            at(0),
            stage.tmux_rss.map_or_else(
                || "not running".to_string(),
                |mb| format!("{mb:.1} MB, {:.1} %", at(1))
            ),
            rate.map_or_else(
                || "no broker".to_string(),
                |rate| format!(
                    "{:.1}/s, {:.1} KB/s ({:.1}/s), a round every {:.2} s",
                    rate.per_s,
                    rate.bytes_per_s / 1000.0,
                    1.0 / interval as f64,
                    rate.period_s
                )
            ),
            stage.list.1,
            p50_p99(&mut list),
            if added == 0 {
                "none".to_string()
            } else {
                format!(
                    "{added} in {:.1} s, spawn → ready {}",
                    took.as_secs_f64(),
                    p50_p99(&mut times)
                )
            },
            load()
        );
        measured.push(stage);
    }
    let held = resources(fleetd, &socket);
    let panes = pane_pids(&socket)?.len();
    anyhow::ensure!(
        panes > n,
        "the tmux servers hold {panes} panes for {n} workers and fleetd's control sessions"
    );
    let live = listed(&lead, "host", &hosts[0]).await?;
    anyhow::ensure!(
        live.len() == n + 1 && live.iter().all(|e| e["status"] == "idle"),
        "fleet_list shows {} entities of {} (expected {n} idle workers and the lead)",
        live.len(),
        hosts[0]
    );
    let watched = match &watching {
        Some((_, obs, watcher)) => {
            // The watcher's view of it: as many entries as its cap lets in.
            let expected = (n + 1).min(DEFAULT_REMOTE_ENTITIES_CAP);
            let seen = within(
                Duration::from_secs(4 * interval + 20),
                &format!("{} to list {expected} entries of {}", hosts[1], hosts[0]),
                async {
                    loop {
                        let seen = listed(watcher, "host", &hosts[0]).await?.len();
                        if seen >= expected {
                            return anyhow::Ok(seen);
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                },
            )
            .await?;
            // What the watcher said of the entries its cap kept out.
            let capped = obs
                .log()
                .lines()
                .find(|l| l.contains("REFUSED a roster entry over the cap"))
                .map(|l| l.chars().take(400).collect::<String>());
            Some((seen, capped))
        }
        None => None,
    };
    if args.linger_s > 0 {
        println!(
            "  lingering {} s with {n} idle workers (fleetd pid {fleetd}), for a profiler",
            args.linger_s
        );
        tokio::time::sleep(Duration::from_secs(args.linger_s)).await;
    }
    drop(watching);
    // Stopping a fleetd with many panes takes a moment: it is timed, not hidden.
    let stopping = Instant::now();
    drop((lead, big));
    println!(
        "  the gateway and its {panes} panes stopped in {:.1} s",
        stopping.elapsed().as_secs_f64()
    );
    Ok(IdleRun {
        stages: measured,
        spawn_total,
        panes,
        held,
        watched,
    })
}

/// The idle part: many cheap workers on one gateway, first with no broker, then on one.
async fn idle(args: &Args) -> anyhow::Result<()> {
    let n = args.workers;
    let interval = args.presence_interval_s;
    println!(
        "\n== idle: {n} idle workers on one gateway (profile `tiny`: sh -c 'echo {TINY_READY}; exec cat', ready by its screen), spawned {} at a time; first with no broker (the local plane alone), then on the broker with presence every {interval} s and a second gateway (a lead, no workers, fleetd's default cap of {DEFAULT_REMOTE_ENTITIES_CAP} entries per remote host) watching it",
        args.spawn_lanes
    );
    let local = idle_run(args, None).await?;
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let fed = idle_run(args, Some(&vhost)).await?;
    let ((l0, ln), (f0, fn_)) = (local.ends()?, fed.ends()?);
    let per_1000 = |with: f64, without: f64| (with - without) / n.max(1) as f64 * 1000.0;
    let cpu = |s: &Stage, i: usize| s.cpu.get(i).copied().unwrap_or(0.0);
    let tmux_rss = |s: &Stage| s.tmux_rss.unwrap_or(0.0);
    let [big, obs] = IDLE_HOSTS;
    println!(
        "spawn: {n} workers in {:.1} s = {:.1} spawns/s with no broker; in {:.1} s = {:.1} spawns/s on the broker ({} in flight)",
        local.spawn_total.as_secs_f64(),
        n as f64 / local.spawn_total.as_secs_f64().max(1e-9),
        fed.spawn_total.as_secs_f64(),
        n as f64 / fed.spawn_total.as_secs_f64().max(1e-9),
        args.spawn_lanes
    );
    println!("  with {n} workers, no broker: {}", local.held);
    println!("  with {n} workers, on the broker: {}", fed.held);
    for (what, none, all) in [("no broker", l0, ln), ("on the broker", f0, fn_)] {
        println!(
            "fleetd, {what}: RSS {:.1} MB with {n} idle workers, beside {:.1} MB with none = {:.1} MB per 1,000 workers  [docs/benchmarks.md's fleetd target ≤ 50 MB, set at 50 workers]; CPU {:.1} % of one core, beside {:.1} % with none = {:.1} % per 1,000 workers",
            all.rss,
            none.rss,
            per_1000(all.rss, none.rss),
            cpu(all, 0),
            cpu(none, 0),
            per_1000(cpu(all, 0), cpu(none, 0))
        );
        println!(
            "  its tmux servers: RSS {:.1} MB with {} panes, beside {} = {:.1} MB per 1,000 panes; CPU {:.1} % of one core, beside {:.1} % = {:.1} % per 1,000 panes",
            tmux_rss(all),
            local.panes,
            none.tmux_rss.map_or_else(
                || "not running with none".to_string(),
                |mb| format!("{mb:.1} MB with none")
            ),
            per_1000(tmux_rss(all), tmux_rss(none)),
            cpu(all, 1),
            cpu(none, 1),
            per_1000(cpu(all, 1), cpu(none, 1))
        );
    }
    if let (Some(all), Some(none)) = (fn_.rate, f0.rate) {
        println!(
            "presence from {big} with {n} workers: {:.1} heartbeats/s ({:.0} a round, a round every {:.2} s), {:.1} KB/s, beside the {:.1}/s its interval promises (one heartbeat for the host and all its entities) and the {:.1}/s of a heartbeat per entity (before this build) = ({} entities + the host) / {interval} s; with none {:.1}/s, {:.1} KB/s (a round every {:.2} s)",
            all.per_s,
            all.per_round,
            all.period_s,
            all.bytes_per_s / 1000.0,
            1.0 / interval as f64,
            (n + 2) as f64 / interval as f64,
            n + 1,
            none.per_s,
            none.bytes_per_s / 1000.0,
            none.period_s
        );
    }
    if let Some((seen, capped)) = &fed.watched {
        println!(
            "{obs} lists {seen} of the {} entities of {big} (its cap: federation.max_remote_entities_per_host = {DEFAULT_REMOTE_ENTITIES_CAP}, the default){}",
            n + 1,
            capped
                .as_ref()
                .map_or_else(String::new, |l| format!("; its log: {l}"))
        );
    }
    for (what, run, last) in [("no broker", &local, ln), ("on the broker", &fed, fn_)] {
        let few = run.stages.iter().find(|s| s.workers > 0).unwrap_or(last);
        let (mut all, mut some) = (last.list.0.clone(), few.list.0.clone());
        println!(
            "fleet_list, {what}, with {} entries ({} bytes), {} calls: {}, beside {} entries ({} bytes): {}",
            last.list.1,
            last.list.2,
            args.list_calls,
            p50_p99(&mut all),
            few.list.1,
            few.list.2,
            p50_p99(&mut some)
        );
    }
    let mut bare = ceiling_list(&ln.entities, args.list_calls).await?;
    let fleetd_p50 = percentiles(&mut ln.list.0.clone()).0;
    println!(
        "  a bare MCP server on the same rmcp + axum stack (fleet-mcp-ceiling) answering the same {} entries from memory, the same client, {} calls: {}; fleetd's p50 {fleetd_p50:.2} ms = {:.2}x it  [target: fleetd p50 ≤ 3 ms]",
        ln.list.1,
        args.list_calls,
        p50_p99(&mut bare),
        fleetd_p50 / percentiles(&mut bare).0.max(1e-9)
    );
    Ok(())
}

/// `calls` timed calls (after 5 untimed) of `fleet-mcp-ceiling`'s `list`, answering `entities`.
async fn ceiling_list(entities: &Value, calls: usize) -> anyhow::Result<Vec<Duration>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("entities.json");
    std::fs::write(&path, entities.to_string())?;
    let (_ceiling, client) = super::throughput::Ceiling::start(Some(&path), false).await?;
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls + 5 {
        let started = Instant::now();
        let listed = client.ok("list", json!({})).await?;
        anyhow::ensure!(
            listed["entities"].as_array().map(Vec::len) == entities.as_array().map(Vec::len),
            "the bare server answered other entries than it was given"
        );
        if i >= 5 {
            samples.push(started.elapsed());
        }
    }
    Ok(samples)
}

/// What one timed run of the closed loop came to.
struct LoopRun {
    /// Round trips completed in the window.
    trips: usize,
    /// Their rate.
    per_s: f64,
    /// Their latencies.
    samples: Vec<Duration>,
    /// Each group's share of one core over the window.
    cpu: Vec<f64>,
}

/// The closed loop: each worker `{prefix}{i}` of `lanes` always has one task in flight, sent
/// by one of `clients` (a lead's) with a wait for its reply; timed over `window` after
/// [`LOOP_WARMUP`], with the CPU of `groups` over the same window.
async fn closed_loop_run(
    clients: &[Arc<Client>],
    prefix: &str,
    lanes: usize,
    window: Duration,
    groups: &[Vec<u32>],
) -> anyhow::Result<LoopRun> {
    let start = Instant::now() + LOOP_WARMUP;
    let end = start + window;
    let mut set = JoinSet::new();
    for lane in 0..lanes {
        let client = Arc::clone(
            clients
                .get(lane % clients.len().max(1))
                .context("no client")?,
        );
        let to = format!("{prefix}{lane}");
        set.spawn(async move {
            let mut samples = Vec::new();
            for k in 0.. {
                let sent_at = Instant::now();
                if sent_at >= end {
                    break;
                }
                let sent = client
                    .ok(
                        "fleet_send",
                        json!({"to": to, "message": format!("loop {k}"), "wait_s": 30}),
                    )
                    .await
                    .map_err(|e| e.context(LaneFailed(to.clone(), None)))?;
                if sent["status"] != "replied" {
                    let msg_id = sent["msg_id"].as_str().map(str::to_string);
                    return Err(anyhow::anyhow!("{to}, trip {k}: {sent}")
                        .context(LaneFailed(to.clone(), msg_id)));
                }
                let done = Instant::now();
                if done >= start && done <= end {
                    samples.push(done - sent_at);
                }
            }
            anyhow::Ok(samples)
        });
    }
    tokio::time::sleep_until(start).await;
    let first = Mark::of(groups);
    tokio::time::sleep_until(end).await;
    let cpu = Mark::of(groups).since(&first);
    let samples = within(LOOP_DRAIN, "the closed loop's last trips", async {
        let mut samples = Vec::new();
        while let Some(joined) = set.join_next().await {
            samples.extend(joined??);
        }
        anyhow::Ok(samples)
    })
    .await?;
    Ok(LoopRun {
        trips: samples.len(),
        per_s: samples.len() as f64 / window.as_secs_f64(),
        samples,
        cpu,
    })
}

/// The busy workers named `{prefix}*` that `lead` lists.
async fn busy(lead: &Client, prefix: &str) -> anyhow::Result<usize> {
    let list = lead.ok("fleet_list", json!({})).await?;
    Ok(list["entities"].as_array().map_or(0, |all| {
        all.iter()
            .filter(|e| {
                e["status"] == "busy"
                    && e["name"].as_str().is_some_and(|n| {
                        n.strip_prefix(prefix)
                            .is_some_and(|i| i.chars().all(|c| c.is_ascii_digit()))
                    })
            })
            .count()
    }))
}

/// Holds `lanes` workers `{prefix}*` busy (a slow task each) and measures the CPU of `groups`
/// over `window` while they are; then takes their replies, so they are idle again.
async fn held_busy(
    lead: &Client,
    prefix: &str,
    lanes: usize,
    window: Duration,
    groups: &[Vec<u32>],
) -> anyhow::Result<Vec<f64>> {
    let hold = window + HOLD_MARGIN;
    let started = Instant::now();
    for i in 0..lanes {
        let to = format!("{prefix}{i}");
        let sent = lead
            .ok(
                "fleet_send",
                json!({"to": to, "message": format!("/slow {} hold", hold.as_millis()), "wait_s": 0}),
            )
            .await?;
        anyhow::ensure!(sent["msg_id"].is_string(), "{to}: {sent}");
    }
    within(
        BUSY_LIMIT,
        &format!("{lanes} workers {prefix}* to show busy"),
        async {
            while busy(lead, prefix).await? < lanes {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        },
    )
    .await?;
    let cpu = cpu_over(groups, window).await;
    let still = busy(lead, prefix).await?;
    anyhow::ensure!(
        still == lanes,
        "only {still} of {lanes} workers {prefix}* were still busy at the end of the window (the tasks were typed in over {:.1} s of a {} s hold)",
        started.elapsed().as_secs_f64(),
        hold.as_secs()
    );
    within(
        hold + BUSY_LIMIT,
        &format!("the replies of {lanes} workers {prefix}*"),
        async {
            let mut replies = 0;
            while replies < lanes {
                replies += lead.poll(1).await?.len();
            }
            anyhow::Ok(())
        },
    )
    .await?;
    Ok(cpu)
}

/// The worker of a closed loop's lane whose round trip failed, and the message it was sent.
#[derive(Debug)]
struct LaneFailed(String, Option<String>);

impl std::fmt::Display for LaneFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the closed loop's round trip to {} failed", self.0)
    }
}

/// Worker `name`'s listing and screen, as a lead lists it.
async fn lane_screen(lead: &Client, fleet: &Fleet, name: &str) -> String {
    let entry = match lead.entry(name).await {
        Ok(entry) => entry,
        Err(e) => return format!("{name} is not listed: {e:#}"),
    };
    let screen = fleet
        .screen(entry["pane"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| format!("(no screen: {e:#})"));
    format!("{name} is listed as {entry}; its screen:\n{screen}")
}

/// `run`, or its error with the failed lane's worker (its entry and screen) and fleetd's log
/// (its warnings and errors, and the last lines) after it.
async fn logged(
    run: anyhow::Result<LoopRun>,
    fleet: &Fleet,
    lead: &Client,
) -> anyhow::Result<LoopRun> {
    let error = match run {
        Ok(run) => return Ok(run),
        Err(error) => error,
    };
    let failed = error.downcast_ref::<LaneFailed>();
    let lane = match failed {
        Some(LaneFailed(name, _)) => Some(lane_screen(lead, fleet, name).await),
        None => None,
    };
    let msg_id = failed.and_then(|f| f.1.clone());
    let error = match lane {
        Some(lane) => error.context(lane),
        None => error,
    };
    let log = fleet.log();
    let lines: Vec<&str> = log.lines().collect();
    let notable: Vec<&str> = lines
        .iter()
        .filter(|l| {
            l.contains(" WARN ")
                || l.contains(" ERROR ")
                || msg_id.as_deref().is_some_and(|id| l.contains(id))
        })
        .copied()
        .collect();
    let last = &lines[lines.len().saturating_sub(40)..];
    Err(error.context(format!(
        "fleetd's warnings and errors, and its lines naming the message:\n{}\nits last lines:\n{}",
        notable.join("\n"),
        last.join("\n")
    )))
}

/// The loop part: the closed loop, and the screen looks' cost.
async fn closed_loop(args: &Args) -> anyhow::Result<()> {
    let lanes = args.loop_workers;
    let window = Duration::from_secs(args.window_s);
    let loop_window = Duration::from_secs(args.loop_s);
    println!(
        "\n== loop: {lanes} scripted agents, one task in flight each (profile `sim`: no screen looks), then {lanes} more that fleetd looks at while busy (profile `simw`: blocked_markers and stall_after_s set, so every busy one's screen is captured every 500 ms and every 1 s); one gateway, no broker"
    );
    // Every lane's send is a long call of the one lead's: the cap is raised to hold them all.
    let fleet = Fleet::start(
        &format!(
            "max_long_calls_per_caller = {}",
            lanes + args.spawn_lanes + 8
        ),
        &format!(
            "{}[leads.lead]\n\n{}\n{}",
            spread_line(args),
            in_workdir(&sim_profile("sim", &[])?),
            watched_sim_profile("simw")?
        ),
    )
    .await?;
    let fleetd = fleet.pid().context("fleetd is not running")?;
    let socket = fleet.tmux_socket().to_string();
    let lead = Arc::new(fleet.lead("lead", Protocol::Stateless).await?);
    let spawn_limit = Duration::from_secs(120 + lanes as u64);
    let small = args.loop_small.clamp(1, lanes.max(1));
    // A client per ten lanes: the bench's side of the loop is not one connection's queue.
    let mut clients = vec![Arc::clone(&lead)];
    for _ in 1..lanes.div_ceil(10) {
        clients.push(Arc::new(fleet.lead("lead", Protocol::Stateless).await?));
    }
    let spawn = |profile: &'static str, prefix: &'static str, range: std::ops::Range<usize>| {
        let (lead, socket) = (Arc::clone(&lead), socket.clone());
        async move {
            let count = range.len();
            spawn_many(&lead, profile, prefix, range, args.spawn_lanes, spawn_limit)
                .await
                .map_err(|e| {
                    e.context(format!(
                        "spawning {count} workers of profile {profile} failed; {}",
                        resources(fleetd, &socket)
                    ))
                })
        }
    };
    // The small loop first, its agents the only panes, so what more panes cost shows.
    spawn("sim", "p", 0..small).await?;
    let bench = std::process::id();
    let small_groups = vec![
        vec![fleetd],
        tmux_servers(&socket),
        pane_pids(&socket)?,
        vec![bench],
    ];
    let small_run = closed_loop_run(&clients, "p", small, loop_window, &small_groups).await;
    let small_run = logged(small_run, &fleet, &lead).await?;
    let small_load = load();
    let started = Instant::now();
    spawn("sim", "p", small..lanes).await?;
    spawn("simw", "w", 0..lanes).await?;
    println!(
        "spawn: {} scripted agents more in {:.1} s",
        2 * lanes - small,
        started.elapsed().as_secs_f64()
    );
    let servers = tmux_servers(&socket);
    println!(
        "the {} panes are on {} tmux server(s)",
        2 * lanes,
        servers.len()
    );
    let groups = vec![vec![fleetd], servers, pane_pids(&socket)?, vec![bench]];

    let idle_cpu = cpu_over(&groups, window).await;
    let idle_load = load();
    let mut single = trips_to(&lead, "p0", args.trips).await?;
    let single_mean = single.iter().sum::<Duration>().as_secs_f64() / single.len().max(1) as f64;
    let plain = closed_loop_run(&clients, "p", lanes, loop_window, &groups).await;
    let plain = logged(plain, &fleet, &lead).await?;
    let plain_load = load();
    let watched = closed_loop_run(&clients, "w", lanes, loop_window, &groups).await;
    let watched = logged(watched, &fleet, &lead).await?;
    let watched_load = load();
    let held_plain = held_busy(&lead, "p", lanes, window, &groups).await?;
    let held_watched = held_busy(&lead, "w", lanes, window, &groups).await?;
    let held_load = load();

    let at = |cpu: &[f64], i: usize| cpu.get(i).copied().unwrap_or(0.0);
    let cpu_text = |cpu: &[f64]| {
        format!(
            "fleetd {:.1} %, its tmux servers {:.1} %, the agents {:.1} %, this bench {:.1} % of one core",
            at(cpu, 0),
            at(cpu, 1),
            at(cpu, 2),
            at(cpu, 3)
        )
    };
    println!(
        "single lane (lead → p0 → reply), {} trips: {} = {:.0} round trips/s",
        single.len(),
        p50_p99(&mut single),
        1.0 / single_mean.max(1e-9)
    );
    print_scaling(
        (small, &small_run, &small_load),
        (lanes, &plain, &plain_load),
    );
    for (what, mut run, run_load) in [
        ("without screen looks (sim)", plain, plain_load),
        ("with screen looks (simw)", watched, watched_load),
    ] {
        println!(
            "closed loop, {lanes} workers {what}, over {} s: {} round trips = {:.0}/s = {:.2}x the single lane; {}",
            args.loop_s,
            run.trips,
            run.per_s,
            run.per_s * single_mean,
            p50_p99(&mut run.samples)
        );
        println!(
            "  CPU during it: {}; beside idle ({lanes} × 2 idle workers): {}  (load average {run_load}, idle {idle_load})",
            cpu_text(&run.cpu),
            cpu_text(&idle_cpu)
        );
    }
    let looks = lanes as f64 * LOOKS_PER_BUSY_WORKER_PER_S;
    println!(
        "{lanes} workers held busy (a slow task each), over {} s: fleetd {:.1} % of one core and its tmux servers {:.1} % with screen looks (simw: {looks:.0} looks/s due), beside {:.1} % and {:.1} % without (sim), {:.1} % and {:.1} % idle  (load average {held_load})",
        args.window_s,
        at(&held_watched, 0),
        at(&held_watched, 1),
        at(&held_plain, 0),
        at(&held_plain, 1),
        at(&idle_cpu, 0),
        at(&idle_cpu, 1)
    );
    let per_look = |i: usize| {
        (at(&held_watched, i) - at(&held_plain, i)).max(0.0) / 100.0 / looks.max(1.0) * 1e6
    };
    println!(
        "  a screen look costs ≈ {:.0} µs of fleetd's CPU and {:.0} µs of tmux's (if every look due was made); at {lanes} busy workers that is {:.1} % + {:.1} % of one core",
        per_look(0),
        per_look(1),
        (at(&held_watched, 0) - at(&held_plain, 0)).max(0.0),
        (at(&held_watched, 1) - at(&held_plain, 1)).max(0.0)
    );
    Ok(())
}

/// CPU time per round trip, in µs, of a process that used `percent` of one core while the
/// loop made `per_s` round trips a second.
fn per_trip_us(percent: f64, per_s: f64) -> f64 {
    percent / 100.0 / per_s.max(1e-9) * 1e6
}

/// The scaling target, printed beside its figures: the loop of `big` agents against the
/// loop of `small` run first with only its own panes, in round trips/s and in fleetd's and its
/// tmux servers' CPU per round trip.
fn print_scaling(
    (small, small_run, small_load): (usize, &LoopRun, &str),
    (big, big_run, big_load): (usize, &LoopRun, &str),
) {
    let cpu = |run: &LoopRun, i: usize| run.cpu.get(i).copied().unwrap_or(0.0);
    println!(
        "closed loop, {small} workers alone on the gateway (sim), over the same window: {} round trips = {:.0}/s (load average {small_load}); {big} workers (sim, with {} more idle beside): {:.0}/s = {:.2}x  [target ≥ 1.00x]",
        small_run.trips,
        small_run.per_s,
        big,
        big_run.per_s,
        big_run.per_s / small_run.per_s.max(1e-9)
    );
    let (f_small, f_big) = (
        per_trip_us(cpu(small_run, 0), small_run.per_s),
        per_trip_us(cpu(big_run, 0), big_run.per_s),
    );
    let (t_small, t_big) = (
        per_trip_us(cpu(small_run, 1), small_run.per_s),
        per_trip_us(cpu(big_run, 1), big_run.per_s),
    );
    println!(
        "  CPU per round trip: fleetd {f_big:.0} µs at {big} beside {f_small:.0} µs at {small} = {:.2}x  [target ≤ 1.00x]; its tmux servers {t_big:.0} µs beside {t_small:.0} µs = {:.2}x (load average {big_load})",
        f_big / f_small.max(1e-9),
        t_big / t_small.max(1e-9)
    );
}

/// What one roster convergence came to.
struct Converged {
    /// From the last gateway's start until every gateway listed every entity.
    took: Duration,
    /// How long the gateways took to start, one after another.
    starts: Duration,
    /// Each host's heartbeats once converged.
    rates: Vec<BeatRate>,
    /// The gateways' CPU over the same rounds, each, and the broker's (if it runs here).
    cpu: Vec<f64>,
    /// The gateways' RSS, each.
    rss: Vec<f64>,
    /// `fleet_list` on the first gateway: latencies, entries, bytes.
    list: (Vec<Duration>, usize, usize),
}

/// `gateways` gateways of `entities` leads each on a vhost of their own, heartbeating every
/// `interval_s`: how long from the last one's start until every one lists all the entities.
async fn convergence(
    args: &Args,
    tag: &str,
    gateways: usize,
    entities: usize,
    interval_s: u64,
) -> anyhow::Result<Converged> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let hosts: Vec<String> = (0..gateways).map(|g| format!("scale-{tag}{g}")).collect();
    let cap = DEFAULT_REMOTE_ENTITIES_CAP.max(entities + 1);
    let mut fleets = Vec::new();
    let mut beats = None;
    let started = Instant::now();
    for host in &hosts {
        let leads: String = (0..entities)
            .map(|i| format!("[leads.{host}-l{i}]\n"))
            .collect();
        fleets.push(
            Fleet::start_as(
                host,
                "",
                &format!(
                    "{leads}\n{}",
                    federation_blocks(&vhost.uri(), &hosts, interval_s, cap)
                ),
            )
            .await?,
        );
        // The first gateway declared the roster exchange: the count starts there.
        if beats.is_none() {
            beats = Some(Heartbeats::start(&vhost).await?);
        }
    }
    let starts = started.elapsed();
    let started = Instant::now();
    let beats = beats.context("no gateway started")?;
    let total = gateways * entities;
    // Each gateway's roster is read off its `/metrics` (cheap, whatever the roster's size, so
    // the look does not time `fleet_list` of thousands of entries); `fleet_list` confirms it
    // once they all hold every other host's entities.
    let remote = total - entities;
    let names: Vec<String> = hosts.iter().map(|h| format!("{h}-l0")).collect();
    let mut counts = vec![0.0; fleets.len()];
    let mut converged = vec![None; fleets.len()];
    while converged.iter().any(Option::is_none) {
        let looks = fleets
            .iter()
            .zip(&names)
            .map(|(fleet, lead)| async move { fleet.metric(lead, "fleetd_remote_entities").await });
        let seen = futures_util::future::join_all(looks).await;
        for ((count, done), seen) in counts.iter_mut().zip(&mut converged).zip(seen) {
            *count = seen.unwrap_or(0.0);
            if done.is_none() && *count >= remote as f64 {
                *done = Some(started.elapsed());
            }
        }
        anyhow::ensure!(
            started.elapsed() < CONVERGENCE_LIMIT,
            "the roster of {gateways} gateways × {entities} entities did not converge within {} s: the gateways hold {counts:?} of the other hosts' {remote}",
            CONVERGENCE_LIMIT.as_secs()
        );
        tokio::time::sleep(CONVERGENCE_POLL).await;
    }
    // (The leads connect only now, so that the figure does not time their connections.)
    let mut leads = Vec::new();
    for (fleet, host) in fleets.iter().zip(&hosts) {
        leads.push(
            fleet
                .lead(&format!("{host}-l0"), Protocol::Stateless)
                .await?,
        );
    }
    for lead in &leads {
        let list = lead.ok("fleet_list", json!({})).await?;
        let listed = list["entities"].as_array().map_or(0, Vec::len);
        anyhow::ensure!(
            listed >= total,
            "a gateway's metrics said it holds every entity, but its fleet_list shows {listed} of {total}"
        );
    }
    let took = converged.into_iter().flatten().max().unwrap_or_default();
    let mut groups: Vec<Vec<u32>> = fleets
        .iter()
        .map(|f| f.pid().into_iter().collect())
        .collect();
    groups.push(broker_pid().into_iter().collect());
    let limit = Duration::from_secs((BEAT_ROUNDS as u64 + 3) * interval_s + 30);
    let (rates, cpu) = beats.steady(&hosts, &groups, limit).await?;
    let rss = fleets
        .iter()
        .filter_map(Fleet::pid)
        .map(rss_mb)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let first = leads.first().context("no lead")?;
    let list = list_latency(first, args.list_calls).await?;
    Ok(Converged {
        took,
        starts,
        rates,
        cpu,
        rss,
        list,
    })
}

/// The mean of `values` (0 for none).
fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The roster part: convergence over many gateways beside three.
async fn roster(args: &Args) -> anyhow::Result<()> {
    let (g, e, interval) = (args.gateways, args.entities, args.roster_interval_s);
    println!(
        "\n== roster: {g} gateways × {e} entities (leads) beside 3 × {e}, presence every {interval} s; convergence timed from the last gateway's start until every gateway holds every other host's entities (its fleetd_remote_entities, looked at every {} ms; fleet_list then confirms it)",
        CONVERGENCE_POLL.as_millis()
    );
    let base = convergence(args, "b", 3, e, interval).await?;
    let full = convergence(args, "g", g, e, interval).await?;
    for (n, run) in [(3, &base), (g, &full)] {
        let rates: Vec<f64> = run.rates.iter().map(|r| r.per_s).collect();
        let periods: Vec<f64> = run.rates.iter().map(|r| r.period_s).collect();
        let (gateways_cpu, broker_cpu) = run.cpu.split_at(run.cpu.len().saturating_sub(1));
        let (mut list, entries, bytes) = (run.list.0.clone(), run.list.1, run.list.2);
        println!(
            "roster convergence, {n} gateways × {e} entities: {:.0} ms = {:.2} heartbeat intervals  [target ≤ 2]  (the {n} started one after another in {:.1} s)",
            run.took.as_secs_f64() * 1000.0,
            run.took.as_secs_f64() / interval as f64,
            run.starts.as_secs_f64()
        );
        let beat_bytes: f64 = run.rates.iter().map(|r| r.bytes_per_s).sum();
        let (published, delivered) = (
            rates.iter().sum::<f64>(),
            rates.iter().sum::<f64>() * n as f64,
        );
        // A heartbeat per entity and per host each round, as before this build, every gateway's
        // roster queue taking each.
        let per_entity = (e + 1) as f64 / interval as f64 * n as f64;
        println!(
            "  presence per host: {:.2}–{:.2} heartbeats/s (a round every {:.2}–{:.2} s), beside the {:.2}/s the interval promises (one a round); {:.1} KB/s of bodies per host",
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
            periods.iter().copied().fold(f64::INFINITY, f64::min),
            periods.iter().copied().fold(0.0, f64::max),
            1.0 / interval as f64,
            beat_bytes / 1000.0 / n as f64,
        );
        println!(
            "  broker deliveries: {published:.1}/s published in all, {delivered:.1}/s delivered (every gateway's roster queue takes every heartbeat), {:.0} KB/s delivered; a heartbeat per entity (before this build) = ({e} entities + the host) / {interval} s × {n} hosts = {per_entity:.0}/s published, {:.0}/s delivered: now 1/{:.0} of it  [target ≤ 1/100]",
            beat_bytes * n as f64 / 1000.0,
            per_entity * n as f64,
            per_entity * n as f64 / delivered.max(1e-9),
        );
        println!(
            "  CPU once converged: each gateway {:.1}–{:.1} % of one core (mean {:.1} %, {:.0} % for all {n}); the broker {}; each gateway's RSS {:.1}–{:.1} MB",
            gateways_cpu.iter().copied().fold(f64::INFINITY, f64::min),
            gateways_cpu.iter().copied().fold(0.0, f64::max),
            mean(gateways_cpu),
            gateways_cpu.iter().sum::<f64>(),
            broker_cpu.first().map_or_else(
                || "not on this machine".to_string(),
                |c| format!("(the machine's RabbitMQ, shared) {c:.1} %")
            ),
            run.rss.iter().copied().fold(f64::INFINITY, f64::min),
            run.rss.iter().copied().fold(0.0, f64::max)
        );
        println!(
            "  fleet_list on one gateway, {entries} entries ({bytes} bytes), {} calls: {}",
            list.len(),
            p50_p99(&mut list)
        );
    }
    Ok(())
}

/// Runs it.
pub(super) async fn run(args: Args) -> anyhow::Result<()> {
    println!(
        "fleet-bench scale ({} build of fleetd at {}), run as: {}",
        super::BUILD,
        binary("fleetd")?.display(),
        command_line()
    );
    println!(
        "machine: {} cores, load average {} at the start (other work on the machine shows there: every figure shares the cores with it)",
        std::thread::available_parallelism().map_or(0, usize::from),
        load()
    );
    let wants = |part: Part| args.parts.is_empty() || args.parts.contains(&part);
    let started = Instant::now();
    if wants(Part::Idle) {
        idle(&args).await?;
    }
    if wants(Part::Loop) {
        closed_loop(&args).await?;
    }
    if wants(Part::Roster) {
        roster(&args).await?;
    }
    println!(
        "\nfleet-bench scale took {:.0} s; load average {} at the end",
        started.elapsed().as_secs_f64(),
        load()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roster_key_names_its_host_and_whether_it_is_the_gateway_entry() {
        assert_eq!(beat_of("roster.hosta._gateway"), Some(("hosta", true)));
        assert_eq!(
            beat_of("roster.scale-g1.0190c0de-0000-7000-8000-000000000000"),
            Some(("scale-g1", false))
        );
        assert_eq!(beat_of("agent.x.inbox.v2"), None);
        assert_eq!(beat_of("roster.lonely"), None);
    }

    #[test]
    fn the_idle_gateway_is_measured_on_the_way_up() {
        assert_eq!(stages(1000), [0, 10, 100, 250, 500, 1000]);
        assert_eq!(stages(20), [0, 2, 5, 10, 20]);
        assert_eq!(stages(1), [0, 1]);
        assert_eq!(stages(0), [0]);
    }

    #[test]
    fn cpu_per_round_trip_is_the_share_of_a_core_over_the_rate() {
        assert!((per_trip_us(50.0, 1000.0) - 500.0).abs() < 1e-9);
        assert!((per_trip_us(25.0, 250.0) - 1000.0).abs() < 1e-9);
        assert!(per_trip_us(10.0, 0.0).is_finite());
    }

    #[test]
    fn a_beat_rate_counts_whole_rounds_only() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        // Rounds of 101 heartbeats of 1,000 bytes in all, 1.25 s apart.
        let rounds = [
            (at(0), 101, 0),
            (at(1250), 202, 1000),
            (at(2500), 303, 2000),
        ];
        let rate = beat_rate(&rounds).unwrap();
        assert!((rate.per_round - 101.0).abs() < 1e-9);
        assert!((rate.period_s - 1.25).abs() < 1e-9);
        assert!((rate.per_s - 80.8).abs() < 1e-9);
        assert!((rate.bytes_per_s - 800.0).abs() < 1e-9);
        assert_eq!(beat_rate(&rounds[..1]), None);
        assert_eq!(beat_rate(&[]), None);
    }
}
