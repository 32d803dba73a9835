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
    let uri = vhost.uri();
    println!(
        "fleet-bench throughput --messages {messages} --lanes {lanes} --rounds {rounds} ({} build, broker vhost {})",
        super::BUILD,
        vhost.name()
    );
    let (ceiling, _first) = Ceiling::start(None, false).await?;
    let (direct, _first) = Ceiling::start(None, true).await?;
    let here = Fleet::start(BENCH_HELD, "[leads.a]\n[leads.b]\n").await?;
    let a = federated(&uri, "hosta", &["alice".into()]).await?;
    let b = federated(&uri, "hostb", &["bob".into()]).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    // alice must know bob before she can send to him.
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let started = Instant::now();
    while alice.entry("bob").await.is_err() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "hosta never heard of bob"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drainer = here.lead("b", Protocol::Stateless).await?;
    let (mut bare, mut durable, mut same, mut cross) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (ceiling_pid, fleetd_pid) = (
        ceiling.pid().context("the ceiling is not running")?,
        here.pid().context("fleetd is not running")?,
    );
    let direct_pid = direct.pid().context("the direct ceiling is not running")?;
    let (mut unserved, mut unserved_cpu) = (Vec::new(), Vec::new());
    let (a_pid, b_pid) = (
        a.pid().context("hosta's fleetd is not running")?,
        b.pid().context("hostb's fleetd is not running")?,
    );
    // CPU time per call or message, in µs, of each process over its own figure.
    let (mut bare_cpu, mut durable_cpu, mut same_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let (mut sending_cpu, mut taking_cpu, mut broker_cpu) = (Vec::new(), Vec::new(), Vec::new());
    // The machine's broker, whose CPU a cross-host message also costs (when it runs here).
    let broker = broker_pid();
    let per_message = |before: f64, after: f64| (after - before) / messages.max(1) as f64 * 1e6;
    for round in 0..rounds {
        let before = cpu_seconds(ceiling_pid)?;
        let rate = calls(ceiling.client().await?, "empty", messages, lanes).await?;
        bare_cpu.push(per_message(before, cpu_seconds(ceiling_pid)?));
        bare.push(rate);
        let before = cpu_seconds(direct_pid)?;
        let rate = calls(direct.client().await?, "empty", messages, lanes).await?;
        unserved_cpu.push(per_message(before, cpu_seconds(direct_pid)?));
        unserved.push(rate);
        let before = cpu_seconds(ceiling_pid)?;
        let rate = calls(ceiling.client().await?, "commit", messages, lanes).await?;
        durable_cpu.push(per_message(before, cpu_seconds(ceiling_pid)?));
        durable.push(rate);
        let sender = here.lead("a", Protocol::Stateless).await?;
        let before = cpu_seconds(fleetd_pid)?;
        let rate = sent_and_drained(sender, &drainer, "b", messages, lanes).await?;
        same_cpu.push(per_message(before, cpu_seconds(fleetd_pid)?));
        same.push(rate);
        let (sending, taking) = (cpu_seconds(a_pid)?, cpu_seconds(b_pid)?);
        let brokered = broker.map(cpu_seconds).transpose()?;
        let rate = sent_and_drained(
            a.lead("alice", Protocol::Stateless).await?,
            &bob,
            "bob@hostb",
            messages,
            lanes,
        )
        .await?;
        sending_cpu.push(per_message(sending, cpu_seconds(a_pid)?));
        taking_cpu.push(per_message(taking, cpu_seconds(b_pid)?));
        if let (Some(pid), Some(before)) = (broker, brokered) {
            broker_cpu.push(per_message(before, cpu_seconds(pid)?));
        }
        cross.push(rate);
        println!(
            "round {round}: bare MCP {:.0} calls/s, committing {:.0} calls/s, same-host {:.0} msg/s, cross-host {:.0} msg/s",
            bare[round], durable[round], same[round], cross[round]
        );
    }
    let shown = |rates: &[f64]| {
        rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (bare_all, durable_all, same_all, cross_all) =
        (shown(&bare), shown(&durable), shown(&same), shown(&cross));
    let (bare, durable, same, cross) = (
        median(&mut bare),
        median(&mut durable),
        median(&mut same),
        median(&mut cross),
    );
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
    let (unserved_all, unserved_cpu_all) = (shown(&unserved), shown(&unserved_cpu));
    let (unserved, unserved_cpu) = (median(&mut unserved), median(&mut unserved_cpu));
    println!(
        "  the same server answering each tools/call in the HTTP request's own task, without rmcp's per-request service, serve loop and channels (fleet-mcp-ceiling --direct): {unserved:.0} calls/s (median of {unserved_all}) = {:.2}x the ceiling; {unserved_cpu:.0} µs of CPU per call (median of {unserved_cpu_all})",
        unserved / bare
    );
    let (same_cpu_all, bare_cpu_all, durable_cpu_all) =
        (shown(&same_cpu), shown(&bare_cpu), shown(&durable_cpu));
    let (same_cpu, bare_cpu, durable_cpu) = (
        median(&mut same_cpu),
        median(&mut bare_cpu),
        median(&mut durable_cpu),
    );
    println!(
        "  fleetd's CPU per same-host message (its send, hold and the drain's share of the poll): {same_cpu:.0} µs (median of {same_cpu_all})  [target ≤ 100 µs]; the bare server's per empty call: {bare_cpu:.0} µs (median of {bare_cpu_all}), per committing call: {durable_cpu:.0} µs (median of {durable_cpu_all}); fleetd = {:.2}x the committing call  [proposed target ≤ 1.25x]",
        same_cpu / durable_cpu
    );
    println!(
        "  rmcp's per-request service, serve loop and channels: {:.0} µs of CPU per call (the bare server's {bare_cpu:.0} µs less the direct one's {unserved_cpu:.0} µs)",
        bare_cpu - unserved_cpu
    );
    println!(
        "cross-host lead → lead through the broker, the same: {cross:.0}/s (median of {cross_all}) = {:.0} % of same-host  [target ≥ 70 %]",
        cross / same * 100.0
    );
    let (sending_all, taking_all) = (shown(&sending_cpu), shown(&taking_cpu));
    let (sending, taking) = (median(&mut sending_cpu), median(&mut taking_cpu));
    println!(
        "  CPU per cross-host message: the sending gateway's {sending:.0} µs (median of {sending_all}; its send, signed, published, confirmed, where it went recorded), the receiving one's {taking:.0} µs (median of {taking_all}; checked, held, drained), beside fleetd's {same_cpu:.0} µs same-host: {:.2}x and {:.2}x it  [proposed target, each side ≤ 2x]",
        sending / same_cpu,
        taking / same_cpu
    );
    if !broker_cpu.is_empty() {
        let broker_all = shown(&broker_cpu);
        let brokered = median(&mut broker_cpu);
        println!(
            "  the broker's (RabbitMQ's beam.smp, all of it over the figure): {brokered:.0} µs per cross-host message (median of {broker_all}); on one machine a cross-host message costs its cores {:.0} µs against a same-host one's {same_cpu:.0} µs, which bounds the share above",
            sending + taking + brokered
        );
    }
    Ok(())
}
