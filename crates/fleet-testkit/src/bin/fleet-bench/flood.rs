//! `fleet-bench flood` (issue 29): connections that never authenticate, beside the same run
//! without them. A lead runs round trips to scripted workers (one lane each) while `/healthz` is
//! probed on a fresh connection, as a monitor does; first with nothing else (the baseline), then
//! while the bench holds `--idle` connections that send nothing and `--drip` that send a request
//! head one byte a second and never finish it, then once more after the flood is let go.
//!
//! It prints each figure beside its baseline: the round trip's and `/healthz`'s p50/p99, what
//! became of every flood connection (closed by fleetd, and after how long; refused; still open
//! at the end of the hold), fleetd's descriptors and RSS before, during and after, and whether
//! every round trip got its reply. It never waits without a bound: every connect, probe and
//! call has a limit, and one that runs out is counted as a figure rather than waited on, so a
//! fleetd that never closes anything (or stops answering) still gets a full report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use fleet_testkit::bins::binary;
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, agent_workdir, sim_profile};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{percentiles, rss_mb, trips_to};

/// Its options.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Flood connections that connect and send nothing.
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// Flood connections that send a request head one byte a second, never finishing it.
    #[arg(long, default_value_t = 200)]
    drip: usize,
    /// How long the flood is held once opened, round trips and probes running, in seconds
    /// (longer than the header timeout, so its closes show).
    #[arg(long, default_value_t = 20)]
    hold_s: u64,
    /// How long the baseline's round trips and probes run, in seconds.
    #[arg(long, default_value_t = 15)]
    baseline_s: u64,
    /// How long the same run after the flood, in seconds.
    #[arg(long, default_value_t = 5)]
    after_s: u64,
    /// How many flood connections are opened per second. On loopback a connect completes
    /// before fleetd wakes to accept it, so connects as fast as they go overflow the listening
    /// socket's backlog (128: the harness binds it with std's default): the kernel drops SYNs,
    /// retried one and three seconds later, which smears the opening over tens of seconds, and
    /// handshakes' last ACKs, which leaves connections open here that fleetd never took in.
    #[arg(long, default_value_t = 2_000)]
    open_per_s: usize,
    /// Scripted workers, each with one lane of round trips from the lead.
    #[arg(long, default_value_t = 10)]
    workers: usize,
    /// The soft open-file limit fleetd is started with, as a service manager would give it
    /// (systemd's default is 1024); by default it inherits this process's. The bench's own is
    /// raised to its hard limit after fleetd has started, either way.
    #[arg(long)]
    fleetd_nofile: Option<u64>,
    /// fleetd's `[gateway] header_timeout_s`, written into its config; when not given fleetd
    /// keeps its default and the closes are sorted against that default (10 s).
    #[arg(long)]
    header_timeout_s: Option<u64>,
}

/// fleetd's default `header_timeout_s`: the flood's closes are sorted against it.
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How much earlier than the header timeout a close still counts as the timeout's (the
/// connection's clock here starts when its connect returns, a little after fleetd's).
const TIMEOUT_EARLY: Duration = Duration::from_secs(1);

/// How much later than the header timeout a close still counts as the timeout's (a loaded
/// machine runs fleetd's timers late).
const TIMEOUT_LATE: Duration = Duration::from_secs(3);

/// How long one `/healthz` probe may take, connect to the end of its response: a monitor's
/// usual bound. One that runs out counts as failed.
const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// The pause between two probes (they run one at a time).
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// How long fleetd may hold a round trip's call for the worker's reply (`wait_s`).
const TRIP_WAIT_S: u64 = 10;

/// How long the lead waits for a round trip's call before giving it up as failed.
const TRIP_LIMIT: Duration = Duration::from_secs(TRIP_WAIT_S + 5);

/// The pause after a failed round trip, so a lane whose calls fail at once does not spin.
const TRIP_BACKOFF: Duration = Duration::from_millis(100);

/// How long one flood connect may take before it counts as refused.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// How long the flood's connects may take to settle once the last is started, before the hold
/// starts anyway (each has [`CONNECT_LIMIT`]: this is only a backstop).
const OPEN_LIMIT: Duration = Duration::from_secs(30);

/// How often a batch of flood connects is started (`--open-per-s` sets the batch).
const OPEN_TICK: Duration = Duration::from_millis(10);

/// How often a dripping connection sends its next byte.
const DRIP_EVERY: Duration = Duration::from_secs(1);

/// Descriptors the bench keeps for itself beyond the flood: its own files, fleetd's child
/// pipes, the lead's connections, the probes.
const BENCH_FDS: u64 = 256;

/// How long fleetd's descriptors may take to fall back after the flood is let go.
const SETTLE_LIMIT: Duration = Duration::from_secs(15);

/// How many descriptors over the baseline count as fallen back (probes and pooled connections
/// come and go).
const FD_MARGIN: usize = 20;

/// How often fleetd's descriptors, RSS and the flood's open connections are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// How long the lead polls for replies to round trips that came back `pending`.
const LATE_LIMIT: Duration = Duration::from_secs(10);

/// The flood's timeline is printed every this many samples (and its last).
const TIMELINE_EVERY: usize = 2;

/// How many failures of each phase are printed (the rest are counted).
const SHOWN_FAILURES: usize = 3;

/// How long fleetd's RSS is watched after the run that follows the flood, for it to come
/// within the target (a freed heap is given back to the kernel in its own time).
const RSS_SETTLE: Duration = Duration::from_secs(10);

/// The RSS target after the flood, over the baseline (issue 29), in MB.
const RSS_TARGET_MB: f64 = 20.0;

/// What one phase of round trips and probes measured.
#[derive(Debug, Default)]
struct Phase {
    /// The round trips answered in the call, each from send to reply.
    trips: Vec<Duration>,
    /// Round trips sent.
    sent: usize,
    /// Round trips whose call came back `pending`: their msg ids, for a late reply.
    pending: Vec<String>,
    /// Round trips that failed (an error, a `failed` status, no answer within the limit).
    failed: Vec<String>,
    /// Probes answered 200, each from connect to the end of the response.
    probes: Vec<Duration>,
    /// Probes that failed: what went wrong.
    probe_failures: Vec<String>,
}

/// What became of one flood connection.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fate {
    /// The connect failed or timed out.
    Unconnected(String),
    /// fleetd answered with this status (503: refused), this long after the connect.
    Answered(u16, Duration),
    /// fleetd closed it without a word (or reset it), this long after the connect.
    Closed(Duration),
    /// Still open when the hold ended.
    Held,
}

/// The two kinds of flood connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// Sends nothing.
    Idle,
    /// Sends a request head one byte a second.
    Drip,
}

/// fleetd's state and the flood's, sampled once.
#[derive(Debug)]
struct Sample {
    /// Since the flood began opening.
    at: Duration,
    /// Flood connections open, as the bench sees them.
    open: usize,
    /// fleetd's open descriptors.
    fds: usize,
    /// fleetd's RSS, in MB.
    rss: f64,
}

/// The request line and `Host` of a request to `/healthz` on `port`.
fn healthz_head(port: u16) -> String {
    format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n")
}

/// The status code of an HTTP response that begins with `bytes`, if its status line is there.
fn status_of(bytes: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(bytes.get(..12)?).ok()?;
    line.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()
}

/// One `/healthz` probe on a fresh connection (`Connection: close`): how long it took, or what
/// went wrong.
async fn probe(port: u16) -> Result<Duration, String> {
    let started = Instant::now();
    let request = format!("{}Connection: close\r\n\r\n", healthz_head(port));
    let response = tokio::time::timeout(PROBE_LIMIT, async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        std::io::Result::Ok(response)
    })
    .await;
    match response {
        Err(_) => Err(format!("no answer within {} s", PROBE_LIMIT.as_secs())),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(bytes)) => match status_of(&bytes) {
            Some(200) => Ok(started.elapsed()),
            Some(status) => Err(format!("HTTP {status}")),
            None => Err(format!("not an HTTP response ({} bytes)", bytes.len())),
        },
    }
}

/// Round trips from `lead` to worker `to` until `end` (a phase with no probes).
async fn lane(lead: Arc<Client>, to: String, end: Instant) -> Phase {
    let mut phase = Phase::default();
    while Instant::now() < end {
        let started = Instant::now();
        phase.sent += 1;
        let message = format!("flood trip {}", phase.sent);
        let args = json!({"to": to, "message": message, "wait_s": TRIP_WAIT_S});
        let failure = match lead.call_within("fleet_send", args, TRIP_LIMIT).await {
            Ok(Some(Ok(answer))) if answer["status"] == "replied" => {
                phase.trips.push(started.elapsed());
                None
            }
            Ok(Some(Ok(answer))) if answer["status"] == "pending" => {
                let msg_id = answer["msg_id"].as_str().unwrap_or_default();
                phase.pending.push(msg_id.to_string());
                None
            }
            Ok(Some(Ok(answer))) => Some(format!("{to}: {answer}")),
            Ok(Some(Err(e))) => Some(format!("{to}: {e}")),
            Ok(None) => Some(format!("{to}: no answer within {} s", TRIP_LIMIT.as_secs())),
            Err(e) => Some(format!("{to}: {e:#}")),
        };
        if let Some(failure) = failure {
            phase.failed.push(failure);
            tokio::time::sleep(TRIP_BACKOFF).await;
        }
    }
    phase
}

/// Round trips from `lead` to `workers` workers (a lane each) and `/healthz` probes on `port`,
/// both for `window`.
async fn measure(lead: &Arc<Client>, workers: usize, port: u16, window: Duration) -> Phase {
    let end = Instant::now() + window;
    let mut lanes = JoinSet::new();
    for i in 0..workers {
        lanes.spawn(lane(Arc::clone(lead), format!("w{i}"), end));
    }
    let mut phase = Phase::default();
    while Instant::now() < end {
        match probe(port).await {
            Ok(took) => phase.probes.push(took),
            Err(why) => phase.probe_failures.push(why),
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
    while let Some(joined) = lanes.join_next().await {
        match joined {
            Ok(lane) => {
                phase.trips.extend(lane.trips);
                phase.sent += lane.sent;
                phase.pending.extend(lane.pending);
                phase.failed.extend(lane.failed);
            }
            Err(e) => phase.failed.push(format!("a lane ended: {e}")),
        }
    }
    phase
}

/// Holds one flood connection to `port` (dripping a request head when `kind` is `Drip`) until
/// fleetd closes or answers it, or `release` says the hold is over. `connected` gets a permit
/// once this one's connect is settled; `open` counts the connections open.
async fn flood_connection(
    port: u16,
    kind: Kind,
    connected: Arc<Semaphore>,
    open: Arc<AtomicUsize>,
    mut release: watch::Receiver<bool>,
) -> Fate {
    let stream = {
        let stream = tokio::time::timeout(CONNECT_LIMIT, TcpStream::connect(("127.0.0.1", port)))
            .await
            .map_err(|_| format!("connect: no answer within {} s", CONNECT_LIMIT.as_secs()))
            .and_then(|connected| connected.map_err(|e| format!("connect: {e}")));
        connected.add_permits(1);
        match stream {
            Ok(stream) => stream,
            Err(why) => return Fate::Unconnected(why),
        }
    };
    open.fetch_add(1, Ordering::Relaxed);
    let fate = hold(stream, port, kind, &mut release).await;
    open.fetch_sub(1, Ordering::Relaxed);
    fate
}

/// The held part of [`flood_connection`].
async fn hold(
    mut stream: TcpStream,
    port: u16,
    kind: Kind,
    release: &mut watch::Receiver<bool>,
) -> Fate {
    let opened = Instant::now();
    // The head is never finished: past the Host line, a header whose name never ends.
    let mut head = format!("{}X-Drip-", healthz_head(port))
        .into_bytes()
        .into_iter();
    let mut drip = tokio::time::interval_at(opened + DRIP_EVERY, DRIP_EVERY);
    let (mut reader, mut writer) = stream.split();
    let mut bytes = [0u8; 64];
    loop {
        tokio::select! {
            () = released(release) => return Fate::Held,
            read = reader.read(&mut bytes) => return match read {
                Ok(n) if n > 0 => match status_of(bytes.get(..n).unwrap_or_default()) {
                    Some(status) => Fate::Answered(status, opened.elapsed()),
                    None => Fate::Closed(opened.elapsed()),
                },
                _ => Fate::Closed(opened.elapsed()),
            },
            _ = drip.tick(), if kind == Kind::Drip => {
                let byte = head.next().unwrap_or(b'x');
                if writer.write_all(&[byte]).await.is_err() {
                    return Fate::Closed(opened.elapsed());
                }
            }
        }
    }
}

/// Once `release` says the hold is over (or its sender is gone).
async fn released(release: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here: it may not be held across an await.
    let _ = release.wait_for(|over| *over).await;
}

/// fleetd's open descriptors.
fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// `pid`'s soft limit on open files, as `/proc` shows it.
fn open_file_limit(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(String::from))
        })
        .unwrap_or_else(|| "?".into())
}

/// Sets this process's soft limit on open files to `soft` (`None`: its hard limit), which the
/// processes it starts from then on inherit: the new soft limit.
fn set_open_files(soft: Option<u64>) -> anyhow::Result<u64> {
    let limit = getrlimit(Resource::Nofile);
    let current = soft.or(limit.maximum);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current,
            maximum: limit.maximum,
        },
    )
    .context("cannot set the open-file limit")?;
    Ok(current.unwrap_or(u64::MAX))
}

/// fleetd's descriptors and RSS and the flood's open connections, every [`SAMPLE_EVERY`] from
/// `started` until `release` says the hold is over.
async fn sample_until(
    pid: u32,
    started: Instant,
    open: Arc<AtomicUsize>,
    mut release: watch::Receiver<bool>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            () = released(&mut release) => return samples,
            _ = every.tick() => samples.push(Sample {
                at: started.elapsed(),
                open: open.load(Ordering::Relaxed),
                fds: fds_of(pid),
                rss: rss_mb(pid).unwrap_or(0.0),
            }),
        }
    }
}

/// What became of the flood, and fleetd meanwhile.
struct Flood {
    /// Each connection's kind and fate.
    fates: Vec<(Kind, Fate)>,
    /// How long opening them all took (connects settled, or [`OPEN_LIMIT`]).
    opening: Duration,
    /// Whether every connect was settled within [`OPEN_LIMIT`].
    all_tried: bool,
    /// The samples over the flood.
    samples: Vec<Sample>,
    /// The round trips and probes while it was held.
    phase: Phase,
}

/// Opens the flood on fleetd (`pid`, serving on `port`), runs the round trips and probes for
/// `--hold-s` while it is held, then lets go of what is still open.
async fn hold_flood(pid: u32, lead: &Arc<Client>, port: u16, args: &Args) -> anyhow::Result<Flood> {
    let (release, released) = watch::channel(false);
    let connected = Arc::new(Semaphore::new(0));
    let open = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let sampler = tokio::spawn(sample_until(
        pid,
        started,
        Arc::clone(&open),
        released.clone(),
    ));
    let mut held = JoinSet::new();
    // The idle ones first: a cap that evicts the oldest evicts them, and the dripping ones
    // meet the header timeout.
    let kinds = std::iter::repeat_n(Kind::Idle, args.idle)
        .chain(std::iter::repeat_n(Kind::Drip, args.drip));
    let batch = (args.open_per_s * OPEN_TICK.as_millis() as usize / 1000).max(1);
    let mut pace = tokio::time::interval(OPEN_TICK);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for (n, kind) in kinds.enumerate() {
        if n % batch == 0 {
            pace.tick().await;
        }
        let connection = flood_connection(
            port,
            kind,
            Arc::clone(&connected),
            Arc::clone(&open),
            released.clone(),
        );
        held.spawn(async move { (kind, connection.await) });
    }
    let total = u32::try_from(args.idle + args.drip).context("too many connections")?;
    // A fleetd that accepts nothing leaves every connect to its limit: the hold starts anyway
    // once this bound is out, the connects still going on.
    let all_settled = tokio::time::timeout(OPEN_LIMIT, connected.acquire_many(total)).await;
    let all_tried = match all_settled {
        Ok(permits) => {
            permits?.forget();
            true
        }
        Err(_) => false,
    };
    let opening = started.elapsed();
    let phase = measure(lead, args.workers, port, Duration::from_secs(args.hold_s)).await;
    release.send_replace(true);
    let mut fates = Vec::with_capacity(held.len());
    while let Some(joined) = held.join_next().await {
        fates.push(joined?);
    }
    Ok(Flood {
        fates,
        opening,
        all_tried,
        samples: sampler.await?,
        phase,
    })
}

/// A phase's p50 and p99 in milliseconds, of the round trip and of `/healthz` (`None`: nothing
/// answered).
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    /// The round trip's.
    trip: Option<(f64, f64)>,
    /// `/healthz`'s.
    probe: Option<(f64, f64)>,
}

/// "p50 … ms  p99 … ms" of `samples`, each beside `base`'s when given, and the two figures;
/// "none answered" when there are no samples.
fn p50_p99(samples: &mut [Duration], base: Option<(f64, f64)>) -> (String, Option<(f64, f64)>) {
    if samples.is_empty() {
        return ("none answered".into(), None);
    }
    let (p50, p99) = percentiles(samples);
    let beside = |now: f64, then: Option<f64>| match then {
        Some(then) if then > 0.0 => format!(" ({:.2}x baseline)", now / then),
        _ => String::new(),
    };
    let line = format!(
        "p50 {p50:.2} ms{}  p99 {p99:.2} ms{}",
        beside(p50, base.map(|b| b.0)),
        beside(p99, base.map(|b| b.1))
    );
    (line, Some((p50, p99)))
}

/// The round trip and probe lines of `phase` (`name`d, `window` seconds long), each figure
/// beside `base`'s when given: its figures.
fn report_phase(name: &str, window: u64, phase: &mut Phase, base: Option<Figures>) -> Figures {
    let (trips, trip) = p50_p99(&mut phase.trips, base.and_then(|b| b.trip));
    let (probes, probe) = p50_p99(&mut phase.probes, base.and_then(|b| b.probe));
    println!(
        "round trip, {name}: {trips}  ({} answered in the call of {} sent over {window} s)",
        phase.trips.len(),
        phase.sent,
    );
    for failure in phase.failed.iter().take(SHOWN_FAILURES) {
        println!("  round trip failed: {failure}");
    }
    let tried = phase.probes.len() + phase.probe_failures.len();
    println!(
        "/healthz on a fresh connection, {name}: {probes}  ({} of {tried} probes failed, limit {} s)",
        phase.probe_failures.len(),
        PROBE_LIMIT.as_secs(),
    );
    let mut why: BTreeMap<&str, usize> = BTreeMap::new();
    for failure in &phase.probe_failures {
        *why.entry(failure.as_str()).or_default() += 1;
    }
    for (failure, count) in why.iter().take(SHOWN_FAILURES) {
        println!("  /healthz failed {count}x: {failure}");
    }
    Figures { trip, probe }
}

/// The flood's lines: what became of each kind of connection.
/// `over`: how many descriptors over its baseline fleetd held at the end of the hold. Returns
/// how many flood connections were still open then.
fn report_fates(fates: &[(Kind, Fate)], timeout: Duration, hold_s: u64, over: usize) -> usize {
    let mut still_open = 0;
    for (kind, name) in [(Kind::Idle, "idle"), (Kind::Drip, "dripping")] {
        let of_kind: Vec<&Fate> = fates
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, f)| f)
            .collect();
        let (mut unconnected, mut refused, mut early, mut at_timeout, mut later, mut held) =
            (0, 0, 0, 0, 0, 0);
        let mut answers: BTreeMap<u16, usize> = BTreeMap::new();
        let mut seconds: BTreeMap<u64, usize> = BTreeMap::new();
        for fate in &of_kind {
            let after = match fate {
                Fate::Unconnected(_) => {
                    unconnected += 1;
                    continue;
                }
                Fate::Held => {
                    held += 1;
                    continue;
                }
                Fate::Answered(503, _) => {
                    refused += 1;
                    continue;
                }
                Fate::Answered(status, after) => {
                    *answers.entry(*status).or_default() += 1;
                    *after
                }
                Fate::Closed(after) => *after,
            };
            *seconds.entry(after.as_secs()).or_default() += 1;
            if after + TIMEOUT_EARLY < timeout {
                early += 1;
            } else if after <= timeout + TIMEOUT_LATE {
                at_timeout += 1;
            } else {
                later += 1;
            }
        }
        let closed = early + at_timeout + later;
        still_open += held;
        println!(
            "flood, {name} ({}): {closed} closed by fleetd — {early} before the header timeout (the cap's eviction), {at_timeout} at the header timeout ({}–{} s), {later} later; {refused} refused 503, {unconnected} refused at connect; {held} still open after the {hold_s} s hold  [target: none still open]",
            of_kind.len(),
            timeout.saturating_sub(TIMEOUT_EARLY).as_secs(),
            (timeout + TIMEOUT_LATE).as_secs(),
        );
        if !answers.is_empty() {
            let answers: Vec<String> = answers
                .iter()
                .map(|(status, n)| format!("{n}x HTTP {status}"))
                .collect();
            println!("  closed with a response: {}", answers.join(", "));
        }
        if !seconds.is_empty() {
            let seconds: Vec<String> = seconds
                .iter()
                .map(|(s, n)| format!("{s}–{} s: {n}", s + 1))
                .collect();
            println!("  closed after (since connect): {}", seconds.join(", "));
        }
        let mut why: BTreeSet<&str> = BTreeSet::new();
        for fate in &of_kind {
            if let Fate::Unconnected(e) = fate {
                why.insert(e);
            }
        }
        for e in why.iter().take(SHOWN_FAILURES) {
            println!("  refused at connect: {e}");
        }
    }
    if still_open > over {
        println!(
            "  fleetd held {over} descriptors over its baseline at the end of the hold: {} of the connections still open were never accepted by it (waiting in the listening socket's backlog, or half-open: a handshake's last ACK dropped by a full backlog)",
            still_open - over
        );
    }
    still_open
}

/// Waits (bounded) for fleetd's descriptors to fall to `base` (plus a margin): how long it
/// took, or `None` if they did not.
async fn fds_fall(pid: u32, base: usize) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < SETTLE_LIMIT {
        if fds_of(pid) <= base + FD_MARGIN {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// fleetd's RSS (with the time since `released`) each second, from now until it is within
/// the target of `base` or [`RSS_SETTLE`] has passed: the first reading at once.
async fn rss_settles(pid: u32, base: f64, released: Instant) -> Vec<(Duration, f64)> {
    let mut readings = Vec::new();
    let started = Instant::now();
    loop {
        let rss = rss_mb(pid).unwrap_or(0.0);
        readings.push((released.elapsed(), rss));
        if rss - base <= RSS_TARGET_MB || started.elapsed() >= RSS_SETTLE {
            return readings;
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// Of the round trips that came back `pending`, how many got their reply later (the lead polls
/// for them, bounded).
async fn late_replies(lead: &Client, pending: &[String]) -> usize {
    let waited: BTreeSet<&str> = pending.iter().map(String::as_str).collect();
    let mut got = BTreeSet::new();
    let started = Instant::now();
    while got.len() < waited.len() && started.elapsed() < LATE_LIMIT {
        let Ok(messages) = lead.poll(1).await else {
            break;
        };
        for message in messages {
            let about = message["in_reply_to"].as_str().unwrap_or_default();
            if message["kind"] == "REPLY" && waited.contains(about) {
                got.insert(about.to_string());
            }
        }
    }
    got.len()
}

/// Runs the benchmark and prints its figures.
pub(super) async fn run(args: Args) -> anyhow::Result<()> {
    let timeout = args
        .header_timeout_s
        .map_or(DEFAULT_HEADER_TIMEOUT, Duration::from_secs);
    let gateway = args
        .header_timeout_s
        .map(|s| format!("header_timeout_s = {s}"))
        .unwrap_or_default();
    // The workers work in a directory of their own, wherever the bench runs from (fleetd's
    // working directory, their default, may hold its state dir).
    let profile = format!("{}cwd = {:?}\n", sim_profile("sim", &[])?, agent_workdir());
    if let Some(soft) = args.fleetd_nofile {
        set_open_files(Some(soft))?;
    }
    let fleet = Fleet::start(&gateway, &profile).await?;
    let pid = fleet.pid().context("fleetd is not running")?;
    let port = url::Url::parse(&fleet.base())?
        .port()
        .context("fleetd's base URL has no port")?;
    // The bench's own limit is raised after fleetd started: fleetd keeps the one it was given
    // (or raises its own).
    let limit = set_open_files(None)?;
    let wanted = (args.idle + args.drip) as u64 + BENCH_FDS;
    anyhow::ensure!(
        wanted <= limit,
        "{} flood connections need about {wanted} descriptors here, and this process may open {limit}: lower --idle or --drip, or raise the hard limit (ulimit -Hn)",
        args.idle + args.drip
    );
    println!(
        "fleet-bench flood ({} build of fleetd at {}; fleetd's open-file limit {}, the bench's {limit}{})",
        super::BUILD,
        binary("fleetd")?.display(),
        open_file_limit(pid),
        args.header_timeout_s
            .map_or_else(String::new, |s| format!("; header_timeout_s = {s}")),
    );
    let lead = Arc::new(fleet.lead("lead", Protocol::Stateless).await?);
    for i in 0..args.workers {
        lead.spawn("sim", &format!("w{i}")).await?;
        // Untimed warm-up trips to each (trips_to's own).
        trips_to(&lead, &format!("w{i}"), 0).await?;
    }
    println!(
        "{} scripted workers, one lane of round trips each from one lead (wait_s {TRIP_WAIT_S}, limit {} s); /healthz probed one at a time every {} ms",
        args.workers,
        TRIP_LIMIT.as_secs(),
        PROBE_EVERY.as_millis()
    );

    let mut baseline = measure(
        &lead,
        args.workers,
        port,
        Duration::from_secs(args.baseline_s),
    )
    .await;
    let base_fds = fds_of(pid);
    let base_rss = rss_mb(pid)?;
    let base = report_phase("baseline", args.baseline_s, &mut baseline, None);

    let mut flood = hold_flood(pid, &lead, port, &args).await?;
    let released = Instant::now();
    println!(
        "flood: {} idle + {} dripping connections (opened at {}/s), {} {:.1} s, then held {} s with the round trips and probes running",
        args.idle,
        args.drip,
        args.open_per_s,
        if flood.all_tried {
            "opened in"
        } else {
            "still opening after"
        },
        flood.opening.as_secs_f64(),
        args.hold_s
    );
    report_phase(
        "during the flood",
        args.hold_s,
        &mut flood.phase,
        Some(base),
    );
    let end_fds = flood.samples.last().map_or(0, |s| s.fds);
    let still_open = report_fates(
        &flood.fates,
        timeout,
        args.hold_s,
        end_fds.saturating_sub(base_fds),
    );
    let last = flood.samples.len().saturating_sub(1);
    let timeline: Vec<String> = flood
        .samples
        .iter()
        .enumerate()
        .filter(|(i, _)| i % TIMELINE_EVERY == 0 || *i == last)
        .map(|(_, s)| {
            format!(
                "{:.0} s: {} open/{} fds/{:.0} MB",
                s.at.as_secs_f64(),
                s.open,
                s.fds,
                s.rss
            )
        })
        .collect();
    println!(
        "flood timeline (flood connections open / fleetd's descriptors / fleetd's RSS): {}",
        timeline.join(", ")
    );

    let fell = fds_fall(pid, base_fds).await;
    let after_fds = fds_of(pid);
    let mut rss_after = vec![(released.elapsed(), rss_mb(pid)?)];
    let mut after = measure(&lead, args.workers, port, Duration::from_secs(args.after_s)).await;
    report_phase("after the flood", args.after_s, &mut after, Some(base));
    rss_after.extend(rss_settles(pid, base_rss, released).await);
    let after_rss = rss_after.last().map_or(0.0, |(_, rss)| *rss);
    let peak_fds = flood.samples.iter().map(|s| s.fds).max().unwrap_or(0);
    let peak_rss = flood.samples.iter().map(|s| s.rss).fold(0.0, f64::max);
    let end_rss = flood.samples.last().map_or(0.0, |s| s.rss);
    println!(
        "fleetd descriptors: {base_fds} baseline, peak {peak_fds} during the flood, {after_fds} after it ({})",
        fell.map_or_else(
            || format!(
                "still above {} after {} s",
                base_fds + FD_MARGIN,
                SETTLE_LIMIT.as_secs()
            ),
            |took| format!(
                "back within {FD_MARGIN} of the baseline {:.1} s after the flood was let go",
                took.as_secs_f64()
            )
        )
    );
    // Each reading that moved by a megabyte or more since the last one shown, and the last.
    let mut trail: Vec<String> = Vec::new();
    let mut shown: Option<f64> = None;
    for (i, (at, rss)) in rss_after.iter().enumerate() {
        let moved = shown.is_none_or(|shown| (rss - shown).abs() >= 1.0);
        if moved || i + 1 == rss_after.len() {
            trail.push(format!("{rss:.1} MB at {:.0} s", at.as_secs_f64()));
            shown = Some(*rss);
        }
    }
    println!(
        "fleetd RSS: {base_rss:.1} MB baseline, peak {peak_rss:.1} MB during the flood ({end_rss:.1} MB at its end); after it was let go: {} ({:+.1} MB over the baseline)  [target ≤ +{RSS_TARGET_MB:.0} MB]",
        trail.join(", "),
        after_rss - base_rss,
    );

    let phases = [&baseline, &flood.phase, &after];
    let sent: usize = phases.iter().map(|p| p.sent).sum();
    let at_once: usize = phases.iter().map(|p| p.trips.len()).sum();
    let failed: usize = phases.iter().map(|p| p.failed.len()).sum();
    let pending: Vec<String> = phases
        .iter()
        .flat_map(|p| p.pending.iter().cloned())
        .collect();
    let late = late_replies(&lead, &pending).await;
    let lost = sent.saturating_sub(at_once + late);
    println!(
        "nothing lost: {} — {sent} round trips sent, {} answered ({at_once} in the call, {late} later), {failed} failed, {} pending and never answered  [target: all answered]",
        if lost == 0 {
            "yes".to_string()
        } else {
            format!("NO, {lost} without a reply")
        },
        at_once + late,
        pending.len().saturating_sub(late),
    );
    let yes = |met: bool| if met { "yes" } else { "NO" };
    let failed_probes = flood.phase.probe_failures.len();
    println!(
        "issue 29, in one line: /healthz answered through the flood: {} ({failed_probes} failed); every flood connection closed by fleetd: {} ({still_open} still open); descriptors back: {}; RSS within {RSS_TARGET_MB:.0} MB of the baseline: {} ({:+.1} MB); nothing lost: {}",
        yes(failed_probes == 0),
        yes(still_open == 0),
        yes(fell.is_some()),
        yes(after_rss - base_rss <= RSS_TARGET_MB),
        after_rss - base_rss,
        yes(lost == 0),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_line_gives_its_code() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 503 Service Unavailable"), Some(503));
        assert_eq!(status_of(b"HTTP/1.1 40"), None);
        assert_eq!(status_of(b"garbage that is long"), None);
    }
}
