//! `fleet-bench throughput`: messages per second, each against the right ceiling, in one run. A
//! message through fleetd is one MCP tool call (`fleet_send`), so the ceiling of any gateway
//! speaking MCP is a bare MCP tool server on the same stack answering an empty tool to the same
//! client (`fleet-mcp-ceiling`). fleetd's same-host lead → lead rate is measured as a share of
//! that ceiling, and its cross-host rate as a share of the same-host one (what the broker hop
//! costs). The three are measured in turn, three rounds, and the medians compared. Beside them,
//! a second ceiling: the same server committing each call's text as a SQLite row before it
//! answers (`commit`), the least a gateway that keeps what it accepts does per message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_testkit::bins::binary;
use fleet_testkit::broker::{Broker, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::Fleet;
use fleet_testkit::inherit::inherit;
use serde_json::json;

use super::scale::broker_pid;
use super::{BENCH_HELD, cpu_seconds, federated, sent_and_drained};

/// Its options.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Messages (and empty calls) per figure.
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    /// Concurrent senders.
    #[arg(long, default_value_t = 32)]
    lanes: usize,
    /// Rounds of the three figures (their medians are compared).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// How long the ceiling server may take to answer its first call.
const CEILING_START: Duration = Duration::from_secs(10);

/// The bare MCP server, running; killed when dropped.
pub(super) struct Ceiling {
    _child: tokio::process::Child,
    url: String,
    /// Where its `commit` rows go.
    _db: tempfile::TempDir,
}

impl Ceiling {
    /// Starts `fleet-mcp-ceiling` on a loopback socket bound here (its `list` tool answering
    /// the entries of the JSON file `list`, if given; its `tools/call`s answered without rmcp's
    /// per-request service if `direct`), and waits until it answers.
    pub(super) async fn start(
        list: Option<&std::path::Path>,
        direct: bool,
    ) -> anyhow::Result<(Ceiling, Client)> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/mcp", listener.local_addr()?);
        let mut command = tokio::process::Command::new(binary("fleet-mcp-ceiling")?);
        let fd = inherit(command.as_std_mut(), &listener)?;
        let db = tempfile::tempdir()?;
        let child = command
            .args(["--listen-fd", &fd.to_string()])
            .arg("--db")
            .arg(db.path().join("ceiling.db"))
            .args(
                list.iter()
                    .flat_map(|path| [std::ffi::OsStr::new("--list"), path.as_os_str()]),
            )
            .args(direct.then_some("--direct"))
            .kill_on_drop(true)
            .spawn()
            .context("starting fleet-mcp-ceiling")?;
        drop(listener);
        let started = Instant::now();
        loop {
            // Calls wait in the socket's backlog until it serves.
            match Client::connect(&url, "any", Protocol::Stateless, &[]).await {
                Ok(client) => {
                    let ceiling = Ceiling {
                        _child: child,
                        url,
                        _db: db,
                    };
                    return Ok((ceiling, client));
                }
                Err(e) if started.elapsed() > CEILING_START => {
                    return Err(e.context("fleet-mcp-ceiling never answered"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Its process id, while it runs.
    fn pid(&self) -> Option<u32> {
        self._child.id()
    }

    /// A client of its own, as each lead has one.
    async fn client(&self) -> anyhow::Result<Client> {
        Client::connect(&self.url, "any", Protocol::Stateless, &[]).await
    }
}

/// `count` calls of the ceiling's `tool` (`empty`, or `commit` of a text like a message's) in
/// `lanes` concurrent lanes: calls per second.
async fn calls(
    client: Client,
    tool: &'static str,
    count: usize,
    lanes: usize,
) -> anyhow::Result<f64> {
    let client = Arc::new(client);
    let started = Instant::now();
    let mut callers = Vec::new();
    for lane in 0..lanes {
        let client = Arc::clone(&client);
        callers.push(tokio::spawn(async move {
            for i in (lane..count).step_by(lanes) {
                let args = match tool {
                    "commit" => json!({"text": format!("m{i}")}),
                    _ => json!({}),
                };
                client.ok(tool, args).await?;
            }
            anyhow::Ok(())
        }));
    }
    for caller in callers {
        caller.await??;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// The median of `rates`.
fn median(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}

/// What the figures are measured on: the two ceiling servers, fleetd on one host, two
/// federated gateways, and the processes whose CPU is read.
struct Bench {
    ceiling: Ceiling,
    direct: Ceiling,
    here: Fleet,
    drainer: Client,
    a: Fleet,
    bob: Client,
    /// hostb's gateway, kept running as long as the bench.
    _b: Fleet,
    pids: Pids,
}

/// The processes whose CPU a figure costs.
struct Pids {
    ceiling: u32,
    direct: u32,
    fleetd: u32,
    sending: u32,
    taking: u32,
    /// The machine's broker, when it runs here and its CPU can be read.
    broker: Option<u32>,
}

/// Each figure's samples, one a round: rates, and CPU per call or message in µs.
#[derive(Default)]
struct Figures {
    bare: Vec<f64>,
    unserved: Vec<f64>,
    durable: Vec<f64>,
    same: Vec<f64>,
    cross: Vec<f64>,
    bare_cpu: Vec<f64>,
    unserved_cpu: Vec<f64>,
    durable_cpu: Vec<f64>,
    same_cpu: Vec<f64>,
    sending_cpu: Vec<f64>,
    taking_cpu: Vec<f64>,
    broker_cpu: Vec<f64>,
}

/// Runs it.
pub(super) async fn run(args: Args) -> anyhow::Result<()> {
    let Args {
        messages,
        lanes,
        rounds,
    } = args;
    anyhow::ensure!(
        rounds > 0 && lanes > 0,
        "--rounds and --lanes must be above 0"
    );
    let vhost = Vhost::create(&Broker::find().await?).await?;
    println!(
        "fleet-bench throughput --messages {messages} --lanes {lanes} --rounds {rounds} ({} build, broker vhost {})",
        super::BUILD,
        vhost.name()
    );
    let bench = Bench::start(&vhost.uri()).await?;
    let mut figures = Figures::default();
    for round in 0..rounds {
        figures.measure(&bench, messages, lanes).await?;
        println!(
            "round {round}: bare MCP {:.0} calls/s, committing {:.0} calls/s, same-host {:.0} msg/s, cross-host {:.0} msg/s",
            figures.bare[round], figures.durable[round], figures.same[round], figures.cross[round]
        );
    }
    figures.report(messages, lanes);
    Ok(())
}

impl Bench {
    /// Starts every part, the broker's vhost at `uri`, and waits until alice on hosta knows bob
    /// on hostb.
    async fn start(uri: &str) -> anyhow::Result<Bench> {
        let (ceiling, _first) = Ceiling::start(None, false).await?;
        let (direct, _first) = Ceiling::start(None, true).await?;
        let here = Fleet::start(BENCH_HELD, "[leads.a]\n[leads.b]\n").await?;
        let a = federated(uri, "hosta", &["alice".into()]).await?;
        let b = federated(uri, "hostb", &["bob".into()]).await?;
        let bob = b.lead("bob", Protocol::Stateless).await?;
        let alice = a.lead("alice", Protocol::Stateless).await?;
        let started = Instant::now();
        while alice.entry("bob").await.is_err() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "hosta never heard of bob"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pids = Pids {
            ceiling: ceiling.pid().context("the ceiling is not running")?,
            direct: direct.pid().context("the direct ceiling is not running")?,
            fleetd: here.pid().context("fleetd is not running")?,
            sending: a.pid().context("hosta's fleetd is not running")?,
            taking: b.pid().context("hostb's fleetd is not running")?,
            broker: broker_pid(),
        };
        let drainer = here.lead("b", Protocol::Stateless).await?;
        Ok(Bench {
            ceiling,
            direct,
            here,
            drainer,
            a,
            bob,
            _b: b,
            pids,
        })
    }
}

impl Figures {
    /// One round of every figure, `messages` calls or messages each in `lanes` lanes.
    async fn measure(
        &mut self,
        bench: &Bench,
        messages: usize,
        lanes: usize,
    ) -> anyhow::Result<()> {
        let pids = &bench.pids;
        let per_message = |before: f64, after: f64| (after - before) / messages.max(1) as f64 * 1e6;
        let before = cpu_seconds(pids.ceiling)?;
        let rate = calls(bench.ceiling.client().await?, "empty", messages, lanes).await?;
        self.bare_cpu
            .push(per_message(before, cpu_seconds(pids.ceiling)?));
        self.bare.push(rate);
        let before = cpu_seconds(pids.direct)?;
        let rate = calls(bench.direct.client().await?, "empty", messages, lanes).await?;
        self.unserved_cpu
            .push(per_message(before, cpu_seconds(pids.direct)?));
        self.unserved.push(rate);
        let before = cpu_seconds(pids.ceiling)?;
        let rate = calls(bench.ceiling.client().await?, "commit", messages, lanes).await?;
        self.durable_cpu
            .push(per_message(before, cpu_seconds(pids.ceiling)?));
        self.durable.push(rate);
        let sender = bench.here.lead("a", Protocol::Stateless).await?;
        let before = cpu_seconds(pids.fleetd)?;
        let rate = sent_and_drained(sender, &bench.drainer, "b", messages, lanes).await?;
        self.same_cpu
            .push(per_message(before, cpu_seconds(pids.fleetd)?));
        self.same.push(rate);
        let (sending, taking) = (cpu_seconds(pids.sending)?, cpu_seconds(pids.taking)?);
        // The broker's CPU is read where it can be: it is not this bench's process.
        let brokered = pids.broker.and_then(|pid| cpu_seconds(pid).ok());
        let sender = bench.a.lead("alice", Protocol::Stateless).await?;
        let rate = sent_and_drained(sender, &bench.bob, "bob@hostb", messages, lanes).await?;
        self.sending_cpu
            .push(per_message(sending, cpu_seconds(pids.sending)?));
        self.taking_cpu
            .push(per_message(taking, cpu_seconds(pids.taking)?));
        let broker_now = pids.broker.and_then(|pid| cpu_seconds(pid).ok());
        if let (Some(before), Some(after)) = (brokered, broker_now) {
            self.broker_cpu.push(per_message(before, after));
        }
        self.cross.push(rate);
        Ok(())
    }

    /// Prints the figures' medians beside their ceilings and targets.
    fn report(mut self, messages: usize, lanes: usize) {
        let (bare, bare_all) = summed(&mut self.bare);
        let (durable, durable_all) = summed(&mut self.durable);
        let (same, same_all) = summed(&mut self.same);
        println!(
            "ceiling: a bare MCP tool server on the same rmcp + axum stack (fleet-mcp-ceiling), an empty tool, the same client, {messages} calls in {lanes} lanes: {bare:.0} calls/s (median of {bare_all})"
        );
        println!(
            "same-host lead → lead over MCP (fleet_send, held, drained by fleet_poll), {messages} messages in {lanes} lanes: {same:.0}/s (median of {same_all}) = {:.0} % of the ceiling  [target ≥ 70 %]",
            same / bare * 100.0
        );
        println!(
            "  the same server committing each call's text as a SQLite row (WAL, synchronous = NORMAL, a transaction per call) before it answers: {durable:.0} calls/s (median of {durable_all}); same-host = {:.0} % of it  [proposed target ≥ 70 %]",
            same / durable * 100.0
        );
        let (unserved, unserved_all) = summed(&mut self.unserved);
        let (unserved_cpu, unserved_cpu_all) = summed(&mut self.unserved_cpu);
        println!(
            "  the same server answering each tools/call in the HTTP request's own task, without rmcp's per-request service, serve loop and channels (fleet-mcp-ceiling --direct): {unserved:.0} calls/s (median of {unserved_all}) = {:.2}x the ceiling; {unserved_cpu:.0} µs of CPU per call (median of {unserved_cpu_all})",
            unserved / bare
        );
        let (same_cpu, same_cpu_all) = summed(&mut self.same_cpu);
        let (bare_cpu, bare_cpu_all) = summed(&mut self.bare_cpu);
        let (durable_cpu, durable_cpu_all) = summed(&mut self.durable_cpu);
        println!(
            "  fleetd's CPU per same-host message (its send, hold and the drain's share of the poll): {same_cpu:.0} µs (median of {same_cpu_all})  [target ≤ 100 µs]; the bare server's per empty call: {bare_cpu:.0} µs (median of {bare_cpu_all}), per committing call: {durable_cpu:.0} µs (median of {durable_cpu_all}); fleetd = {:.2}x the committing call  [proposed target ≤ 1.25x]",
            same_cpu / durable_cpu
        );
        println!(
            "  rmcp's per-request service, serve loop and channels: {:.0} µs of CPU per call (the bare server's {bare_cpu:.0} µs less the direct one's {unserved_cpu:.0} µs)",
            bare_cpu - unserved_cpu
        );
        self.report_cross(same, same_cpu);
    }

    /// Prints the cross-host figures, against same-host's rate `same` and CPU `same_cpu`.
    fn report_cross(mut self, same: f64, same_cpu: f64) {
        let (cross, cross_all) = summed(&mut self.cross);
        println!(
            "cross-host lead → lead through the broker, the same: {cross:.0}/s (median of {cross_all}) = {:.0} % of same-host  [target ≥ 70 %]",
            cross / same * 100.0
        );
        let (sending, sending_all) = summed(&mut self.sending_cpu);
        let (taking, taking_all) = summed(&mut self.taking_cpu);
        println!(
            "  CPU per cross-host message: the sending gateway's {sending:.0} µs (median of {sending_all}; its send, signed, published, confirmed, where it went recorded), the receiving one's {taking:.0} µs (median of {taking_all}; checked, held, drained), beside fleetd's {same_cpu:.0} µs same-host: {:.2}x and {:.2}x it  [proposed target, each side ≤ 2x]",
            sending / same_cpu,
            taking / same_cpu
        );
        if !self.broker_cpu.is_empty() {
            let (brokered, broker_all) = summed(&mut self.broker_cpu);
            println!(
                "  the broker's (RabbitMQ's Erlang VM, all of it over the figure): {brokered:.0} µs per cross-host message (median of {broker_all}); a cross-host message costs both gateways and the broker {:.0} µs of CPU, {:.1}x a same-host one's {same_cpu:.0} µs, and here the three share one machine's cores (across hosts they would not)",
                sending + taking + brokered,
                (sending + taking + brokered) / same_cpu
            );
        }
    }
}

/// The median of `samples`, and all of them as a list.
fn summed(samples: &mut [f64]) -> (f64, String) {
    let all = samples
        .iter()
        .map(|r| format!("{r:.0}"))
        .collect::<Vec<_>>()
        .join(", ");
    (median(samples), all)
}
