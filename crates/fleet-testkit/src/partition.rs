//! The partition scenario of issue 37 ("a host cut off from the broker heals without a trace"),
//! shared by the test suite and `fleet-bench partition`.
//!
//! Gateway `hostb` (lead bob) runs in a network namespace of its own ([`crate::netns`]) and
//! reaches the broker only through a veth the scenario takes down and up; gateway `hosta` (lead
//! alice) runs beside the test. Both pin each other's key. Alice spawns three scripted workers
//! on hostb and sends them tasks at a steady rate (every `slow_every`th a slow one), without
//! waiting for answers, and collects the answers with `fleet_poll`; in the middle hostb is cut
//! off for a while, then healed. Afterwards every task is accounted for ([`Ledger`]) from what
//! alice saw and what the workers' own task log says was typed, the workers are checked for a
//! `busy` that outlives the task, and the roster's convergence and the recovery are timed from
//! the healing.
//!
//! The scenario waits on conditions, never a fixed time, except the traffic's own schedule;
//! it gives up waiting for tasks to end at the last send plus the inbox TTL, the receipt bound
//! and a margin: a task not ended by then never will be. Everything it makes (vhost, namespace,
//! gateways, tmux servers) is removed when it returns, whatever it returns.

pub mod ledger;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use fleet_core::clock::now_ms;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, Vhost};
use crate::client::{Client, Protocol};
use crate::fleet::{Fleet, sim_profile};
use crate::keys;
use crate::netns::Netns;
use crate::wait::until;
pub use ledger::{Book, Facts, Ledger};

/// The lead's host, beside the test.
pub const HOST_A: &str = "hosta";
/// The host cut off, in its own network namespace.
pub const HOST_B: &str = "hostb";
/// The lead who sends the tasks, on [`HOST_A`].
const ALICE: &str = "alice";
/// [`HOST_B`]'s own lead (who looks at the roster from there).
const BOB: &str = "bob";
/// The workers alice spawns on [`HOST_B`].
pub const WORKERS: [&str; 3] = ["w1", "w2", "w3"];

/// How long the set-up may take at each step: the gateways hearing each other, a spawn, a
/// warm-up task's answer.
const SETUP_LIMIT: Duration = Duration::from_secs(30);
/// How long one `fleet_send` (with `wait_s` 0) may take before it counts as broken.
const SEND_LIMIT: Duration = Duration::from_secs(30);
/// How long a worker's pane may take to show its prompt once the tasks ended.
const PROMPT_LIMIT: Duration = Duration::from_secs(10);
/// How often the roster is sampled from both sides.
const WATCH_EVERY: Duration = Duration::from_millis(200);
/// How many of host-b's last log lines an error quotes.
const LOG_TAIL: usize = 80;

/// The gateways' timings (both get the same).
#[derive(Clone, Debug)]
pub struct Timings {
    /// `broker.heartbeat_s`: a dead link is found after about twice this.
    pub heartbeat_s: u16,
    /// `federation.presence_interval_s`: the roster must converge within one of healing.
    pub presence_interval_s: u64,
    /// `federation.presence_ttl_s`.
    pub presence_ttl_s: u64,
    /// `federation.injected_bound_s`.
    pub injected_bound_s: u64,
    /// `federation.inbox_message_ttl_s`: a task may wait this long on the broker.
    pub inbox_message_ttl_s: u64,
    /// Waited beyond the inbox TTL and the receipt bound for the last tasks to end.
    pub margin: Duration,
    /// How long a worker back at its prompt may still read `busy`.
    pub busy_grace: Duration,
}

impl Default for Timings {
    /// fleetd's presence defaults, the tests' quick broker heartbeat, and an inbox TTL and
    /// receipt bound short enough for a run to end within minutes.
    fn default() -> Self {
        Self {
            heartbeat_s: 5,
            presence_interval_s: 5,
            presence_ttl_s: 15,
            injected_bound_s: 10,
            inbox_message_ttl_s: 30,
            margin: Duration::from_secs(10),
            busy_grace: Duration::from_secs(10),
        }
    }
}

/// What a run does.
#[derive(Clone, Debug)]
pub struct Params {
    /// When host-b is cut off, counted from the first task.
    pub partition_at: Duration,
    /// How long it stays cut off; `None`: never (the baseline).
    pub partition_for: Option<Duration>,
    /// How long tasks are sent for (the partition lies inside it).
    pub traffic_for: Duration,
    /// Tasks per second.
    pub rate: f64,
    /// Every this many-th task is a slow one.
    pub slow_every: u64,
    /// How long a slow task takes its worker, in milliseconds.
    pub slow_ms: u64,
    /// The gateways' timings.
    pub timings: Timings,
}

/// Locks `mutex`, whether or not a holder panicked (the book stays readable).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs the scenario once, on the tests' broker, and adds it up. An error is the harness's
/// (a gateway that did not start, a worker that never answered its warm-up, no `ip`), never
/// a verdict on the tasks: that is the ledger's.
pub async fn run(params: &Params) -> anyhow::Result<Ledger> {
    anyhow::ensure!(params.rate > 0.0, "a rate of {} tasks/s", params.rate);
    if let Some(cut) = params.partition_for {
        anyhow::ensure!(
            params.partition_at + cut <= params.traffic_for,
            "the partition ({:?} from {:?}) must end within the traffic ({:?})",
            cut,
            params.partition_at,
            params.traffic_for
        );
    }
    let broker = Broker::find().await?;
    let vhost = Vhost::create(&broker).await?;
    let upstream = tokio::net::lookup_host((broker.host(), broker.port()))
        .await?
        .next()
        .with_context(|| format!("the broker's host {} has no address", broker.host()))?;
    let netns = Netns::create(upstream).await?;
    let dir = tempfile::tempdir()?;
    let typed_log = dir.path().join("typed.jsonl");
    let t = &params.timings;
    let a = Fleet::start_as(HOST_A, "", &config(&vhost.uri(), ALICE, &typed_log, t)?).await?;
    let wrapper = netns.wrapper();
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let b_uri = through(&vhost.uri(), netns.forward_addr())?;
    // Declared after the namespace, so dropped before it: the namespace goes with its last
    // process.
    // Alice's workers there work under the scripted agents' directory (a spawn for another
    // host's lead goes only under a host's roots).
    let roots = format!("workdir_roots = [{:?}]", crate::fleet::agent_workdir());
    let b = Fleet::start_as_wrapped(
        HOST_B,
        &roots,
        &config(&b_uri, BOB, &typed_log, t)?,
        &wrapper,
    )
    .await
    .with_context(|| format!("starting {HOST_B} in network namespace {}", netns.name()))?;
    let pid = b
        .pid()
        .with_context(|| format!("{HOST_B}'s fleetd has no pid"))?;
    anyhow::ensure!(
        netns.holds(pid)?,
        "{HOST_B}'s fleetd (pid {pid}) is not in network namespace {}",
        netns.name()
    );
    play(&a, &b, &netns, &typed_log, params)
        .await
        .map_err(|e| e.context(format!("{HOST_B}'s log ends:\n{}", tail(&b.log()))))
}

/// A gateway's config: lead `lead`, the scripted agent (logging its tasks to `typed_log`) as
/// profile `sim`, the broker at `uri`, the timings, and both hosts' keys pinned.
fn config(uri: &str, lead: &str, typed_log: &Path, t: &Timings) -> anyhow::Result<String> {
    Ok(format!(
        "[leads.{lead}]\ngroups = []\n\n{}\n[broker]\nuri = \"{uri}\"\nheartbeat_s = {}\n\n[federation]\npresence_interval_s = {}\npresence_ttl_s = {}\ninjected_bound_s = {}\ninbox_message_ttl_s = {}\n{}",
        sim_profile("sim", &["--log-tasks", &typed_log.display().to_string()])?,
        t.heartbeat_s,
        t.presence_interval_s,
        t.presence_ttl_s,
        t.injected_bound_s,
        t.inbox_message_ttl_s,
        keys::admitting(&[HOST_A, HOST_B])
    ))
}

/// `uri` with its host and port those of `addr`: the broker as seen from the namespace.
fn through(uri: &str, addr: SocketAddr) -> anyhow::Result<String> {
    let mut url = url::Url::parse(uri)?;
    url.set_ip_host(addr.ip())
        .map_err(|()| anyhow::anyhow!("cannot set the host of {uri}"))?;
    url.set_port(Some(addr.port()))
        .map_err(|()| anyhow::anyhow!("cannot set the port of {uri}"))?;
    Ok(url.to_string())
}

/// The last [`LOG_TAIL`] lines of `log`.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
}

/// Whether `status` is one of a live worker's (not `unknown`, not on its way out).
fn live(status: &str) -> bool {
    matches!(status, "idle" | "busy" | "asking" | "blocked")
}

/// Whether `list` (a `fleet_list` answer) shows `name` of `host` live.
fn lists_live(list: &Value, name: &str, host: &str) -> bool {
    list["entities"].as_array().is_some_and(|entities| {
        entities.iter().any(|e| {
            e["name"] == name && e["host"] == host && live(e["status"].as_str().unwrap_or(""))
        })
    })
}

/// The scenario, on running gateways.
async fn play(
    a: &Fleet,
    b: &Fleet,
    netns: &Netns,
    typed_log: &Path,
    params: &Params,
) -> anyhow::Result<Ledger> {
    let t = &params.timings;
    let alice = Arc::new(a.lead(ALICE, Protocol::Stateless).await?);
    let bob = b.lead(BOB, Protocol::Stateless).await?;
    until(
        &format!("{HOST_A} and {HOST_B} to hear each other (through the namespace's veth)"),
        SETUP_LIMIT,
        || async {
            let there = alice.ok("fleet_list", json!({})).await.ok()?;
            let here = bob.ok("fleet_list", json!({})).await.ok()?;
            (lists_live(&there, BOB, HOST_B) && lists_live(&here, ALICE, HOST_A)).then_some(())
        },
    )
    .await?;
    let workers = spawn_workers(&alice).await?;
    // The workers call fleetd at 127.0.0.1 of the test's namespace: their panes must be here.
    for (name, pane) in &workers {
        let pid = b.pane_pid(pane)?;
        anyhow::ensure!(
            !netns.holds(pid)?,
            "{name}'s program (pid {pid}) runs inside network namespace {}",
            netns.name()
        );
    }
    for name in WORKERS {
        let sent = alice.send(name, &format!("warm-up {name}"), 20).await?;
        anyhow::ensure!(
            sent["reply"]["text"] == format!("echo: warm-up {name}"),
            "{name} on {HOST_B} did not answer its warm-up: {sent}"
        );
    }

    // Alice's answers are pulled by a client of her own, and the roster is watched from both
    // sides by two more, so neither waits behind the sends.
    let book = Arc::new(Mutex::new(Book::default()));
    let roster = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    // However this returns, the poller and the watcher stop with it.
    let _stop = stop.clone().drop_guard();
    let poller = tokio::spawn(pull(
        a.lead(ALICE, Protocol::Stateless).await?,
        Arc::clone(&book),
        stop.clone(),
    ));
    let watcher = tokio::spawn(watch(
        a.lead(ALICE, Protocol::Stateless).await?,
        b.lead(BOB, Protocol::Stateless).await?,
        Arc::clone(&roster),
        stop.clone(),
    ));
    let label = params
        .partition_for
        .map_or("no partition".to_string(), |d| {
            format!("a {} s partition", d.as_secs())
        });
    eprintln!("partition scenario: traffic with {label}");
    let (down_ms, up_ms, last_send_ms) = traffic(&alice, &book, netns, params).await?;

    // Every task ends by the inbox TTL and the receipt bound after it was sent (and the
    // roster converges once the link is back); past that, what has not never will.
    let bound = Duration::from_secs(t.inbox_message_ttl_s + t.injected_bound_s) + t.margin;
    let left = bound.saturating_sub(Duration::from_millis(
        u64::try_from(now_ms() - last_send_ms).unwrap_or(0),
    ));
    eprintln!("partition scenario: waiting up to {left:?} for every task to end");
    let _ = until("every task to end", left, || async {
        let converged = up_ms.is_none_or(|up| {
            lock(&roster)
                .iter()
                .any(|(at, sees, seen)| *at >= up && *sees && *seen)
        });
        (converged && lock(&book).all_ended()).then_some(())
    })
    .await;
    let settled_ms = now_ms();

    let checks = workers
        .iter()
        .map(|(name, pane)| check_worker(b, &alice, &bob, name, pane, t.busy_grace));
    let wrong: Vec<String> = futures_util::future::join_all(checks)
        .await
        .into_iter()
        .flatten()
        .collect();
    stop.cancel();
    poller.await?;
    watcher.await?;

    let mut book = Arc::try_unwrap(book)
        .map_err(|_| anyhow::anyhow!("the book is still shared"))?
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for line in std::fs::read_to_string(typed_log)
        .unwrap_or_default()
        .lines()
    {
        book.typed(line);
    }
    let log = b.log();
    let facts = Facts {
        partition: params.partition_for,
        down_ms,
        up_ms,
        roster: std::mem::take(&mut *lock(&roster)),
        workers: wrong,
        link_downs: log.matches("the broker link is down").count(),
        link_ups: b.links_up(),
        forwarded: netns.connections(),
        heartbeat: Duration::from_secs(t.presence_interval_s),
        last_send_ms,
        settled_ms,
    };
    Ok(Ledger::of(&book, &facts))
}

/// Spawns [`WORKERS`] on [`HOST_B`] from alice's side; their names and panes.
async fn spawn_workers(alice: &Client) -> anyhow::Result<Vec<(String, String)>> {
    let spawns = WORKERS.iter().map(|name| {
        alice.call_within(
            "fleet_spawn",
            json!({"profile": "sim", "name": name, "host": HOST_B}),
            SETUP_LIMIT,
        )
    });
    let mut workers = Vec::new();
    for (name, spawned) in WORKERS
        .iter()
        .zip(futures_util::future::join_all(spawns).await)
    {
        let spawned = spawned?
            .with_context(|| format!("spawning {name} on {HOST_B} took over {SETUP_LIMIT:?}"))?
            .map_err(|e| anyhow::anyhow!("spawning {name} on {HOST_B}: {e}"))?;
        let pane = spawned["pane"]
            .as_str()
            .with_context(|| format!("{name}'s spawn named no pane: {spawned}"))?;
        workers.push((name.to_string(), pane.to_string()));
    }
    Ok(workers)
}

/// Sends tasks from `alice` at the params' rate for their traffic time, taking host-b's link
/// down and up on the way; when the link went down and up, and when the last task was sent
/// (Unix ms). Returns once every send returned.
async fn traffic(
    alice: &Arc<Client>,
    book: &Arc<Mutex<Book>>,
    netns: &Netns,
    params: &Params,
) -> anyhow::Result<(Option<i64>, Option<i64>, i64)> {
    let start = Instant::now();
    let end = start + params.traffic_for;
    let down_at = params.partition_for.map(|_| start + params.partition_at);
    let up_at = params
        .partition_for
        .map(|cut| start + params.partition_at + cut);
    let (mut down_ms, mut up_ms) = (None, None);
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / params.rate));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut sends = JoinSet::new();
    let (mut number, mut last_send_ms) = (0u64, now_ms());
    loop {
        // The next switch of the link, if one is due.
        let switch = if down_ms.is_none() {
            down_at
        } else if up_ms.is_none() {
            up_at
        } else {
            None
        };
        tokio::select! {
            biased;
            () = at(switch) => {
                if down_ms.is_none() {
                    netns.down().await?;
                    down_ms = Some(now_ms());
                    eprintln!("partition scenario: {HOST_B} cut off");
                } else {
                    netns.up().await?;
                    up_ms = Some(now_ms());
                    eprintln!("partition scenario: {HOST_B} healed");
                }
            }
            _ = ticks.tick() => {
                if Instant::now() >= end {
                    break;
                }
                number += 1;
                let worker = WORKERS[usize::try_from(number - 1).unwrap_or(0) % WORKERS.len()];
                let text = if number.is_multiple_of(params.slow_every.max(1)) {
                    format!("/slow {} task {number}", params.slow_ms)
                } else {
                    format!("task {number}")
                };
                last_send_ms = now_ms();
                lock(book).sent(number, worker, last_send_ms);
                let (alice, book) = (Arc::clone(alice), Arc::clone(book));
                sends.spawn(async move {
                    let args = json!({"to": worker, "message": text, "wait_s": 0});
                    let returned = match alice.call_within("fleet_send", args, SEND_LIMIT).await {
                        Ok(Some(Ok(result))) => Ok(Ok(result)),
                        Ok(Some(Err(refused))) => Ok(Err((refused.code, refused.message))),
                        Ok(None) => Err(format!("no answer within {SEND_LIMIT:?}")),
                        Err(e) => Err(format!("{e:#}")),
                    };
                    lock(&book).send_returned(number, returned, now_ms());
                });
            }
        }
    }
    while let Some(sent) = sends.join_next().await {
        sent?;
    }
    Ok((down_ms, up_ms, last_send_ms))
}

/// Waits until `when`, or for ever when there is nothing to wait for.
async fn at(when: Option<Instant>) {
    match when {
        Some(when) => tokio::time::sleep_until(when).await,
        None => std::future::pending().await,
    }
}

/// Pulls alice's messages into `book` until `stop`, each noted with when it came.
async fn pull(alice: Client, book: Arc<Mutex<Book>>, stop: CancellationToken) {
    loop {
        let polled = tokio::select! {
            polled = alice.ok("fleet_poll", json!({"wait_s": 1})) => polled,
            () = stop.cancelled() => return,
        };
        let at = now_ms();
        match polled {
            Ok(polled) => {
                let mut book = lock(&book);
                for message in polled["messages"].as_array().into_iter().flatten() {
                    book.got(message, at);
                }
            }
            // Alice's own gateway is never cut off: a failed poll is tried again, after a
            // pause.
            Err(_) => tokio::select! {
                () = tokio::time::sleep(WATCH_EVERY) => {}
                () = stop.cancelled() => return,
            },
        }
    }
}

/// Samples the roster from both sides until `stop`: whether alice sees every worker live,
/// and whether bob (on the host cut off) sees alice live.
async fn watch(
    alice: Client,
    bob: Client,
    samples: Arc<Mutex<Vec<(i64, bool, bool)>>>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(WATCH_EVERY);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => return,
        }
        let (there, here) = tokio::join!(
            alice.ok("fleet_list", json!({})),
            bob.ok("fleet_list", json!({}))
        );
        let sees = there.is_ok_and(|list| WORKERS.iter().all(|w| lists_live(&list, w, HOST_B)));
        let seen = here.is_ok_and(|list| lists_live(&list, ALICE, HOST_A));
        lock(&samples).push((now_ms(), sees, seen));
    }
}

/// Whether a scripted worker's screen ends at its prompt (`> ` with nothing typed after it).
fn at_prompt(screen: &str) -> bool {
    screen
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .is_some_and(|line| line.trim_end() == ">")
}

/// The status `lead`'s `fleet_list` gives `name` (`absent` when it lists no such entity).
async fn status(lead: &Client, name: &str) -> String {
    lead.entry(name).await.map_or("absent".into(), |entry| {
        entry["status"].as_str().unwrap_or_default().to_string()
    })
}

/// Checks worker `name` once the tasks ended: its pane back at its prompt, then neither side
/// reading it `busy` within `grace`. What is wrong, if anything.
async fn check_worker(
    b: &Fleet,
    alice: &Client,
    bob: &Client,
    name: &str,
    pane: &str,
    grace: Duration,
) -> Option<String> {
    let prompt = until(&format!("{name}'s prompt"), PROMPT_LIMIT, || async {
        b.screen(pane).ok().filter(|screen| at_prompt(screen))
    })
    .await;
    if prompt.is_err() {
        let last = b
            .screen(pane)
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .unwrap_or_default()
            .to_string();
        return Some(format!(
            "{name}: its pane not back at its prompt {} s after the tasks ended (it shows {last:?})",
            PROMPT_LIMIT.as_secs()
        ));
    }
    let idle = until(&format!("{name} to read idle"), grace, || async {
        let (here, there) = tokio::join!(status(bob, name), status(alice, name));
        (here != "busy" && there != "busy").then_some(())
    })
    .await;
    if idle.is_ok() {
        return None;
    }
    let (here, there) = tokio::join!(status(bob, name), status(alice, name));
    Some(format!(
        "{name}: still busy {} s after its pane was back at its prompt ({HOST_B}: {here}, {HOST_A}: {there})",
        grace.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_the_last_line_with_nothing_typed() {
        assert!(at_prompt(
            "sim w1 ready\r\n> task 1\n[task 1: 6 bytes]\n[replied]\n> \n\n"
        ));
        assert!(!at_prompt("[task 2: 6 bytes]\n"));
        assert!(!at_prompt("> task 3\n"));
    }

    #[test]
    fn the_broker_is_reached_through_the_forwarder() -> anyhow::Result<()> {
        let uri = through(
            "amqp://guest:guest@127.0.0.1:5672/fleet-test-0a",
            "10.1.2.1:40000".parse()?,
        )?;
        assert_eq!(uri, "amqp://guest:guest@10.1.2.1:40000/fleet-test-0a");
        Ok(())
    }
}
