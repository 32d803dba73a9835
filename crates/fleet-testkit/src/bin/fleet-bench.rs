//! `fleet-bench local`: prints fleetd's figures on this machine, each beside a baseline
//! measured in the same run. Run it from a release build:
//! `cargo build --release --workspace --bins && target/release/fleet-bench local`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use fleet_core::envelope::{Envelope, VERSION};
use fleet_core::signing;
use fleet_core::{Gid, Kind, Message, MsgId, MsgState, TraceId};
use fleet_mux::herdr::driver::Driver;
use fleet_mux::herdr::host::Herdr;
use fleet_mux::tmux::{Socket, Tmux};
use fleet_mux::{PaneHost, PaneSpec};
use fleet_store::{SqliteStore, Store};
use fleet_testkit::bins::binary;
use fleet_testkit::broker::{Broker, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{
    Fleet, bwrap_profile, claude_binary, claude_profile, opencode_binary, opencode_profile,
    sim_profile, stop_tmux,
};
use fleet_testkit::herdr::RealHerdr;
use fleet_testkit::inherit::inherit;
use fleet_testkit::keys;
use fleet_testkit::model::ModelSim;
use serde_json::json;

/// The throughput figures hold thousands of messages for one lead before it drains them: the
/// gateway's held cap is raised as far as it goes for them.
const BENCH_HELD: &str = "max_held_per_recipient = 1000000";

/// Benchmarks that print figures.
#[derive(Debug, Parser)]
struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// The cross-host figures on the broker (FLEET_TEST_AMQP_URL, else 127.0.0.1:5672, else a
    /// private node): round trip, messages/s and roster convergence, beside bare lapin.
    Federation {
        /// Round trips to time (after a warm-up).
        #[arg(long, default_value_t = 300)]
        trips: usize,
        /// Messages for the throughput figures.
        #[arg(long, default_value_t = 20_000)]
        messages: usize,
        /// Entities per gateway (three gateways) for the convergence figure.
        #[arg(long, default_value_t = 100)]
        entities: usize,
    },
    /// `fleet_consult` of two scripted architects (each thinking `think_ms`), beside the same
    /// done by hand with fleet_spawn, fleet_send and fleet_stop: its overhead.
    Consult {
        /// Consults to time (after two untimed).
        #[arg(long, default_value_t = 30)]
        runs: usize,
        /// How long each scripted architect takes over its answer, in milliseconds.
        #[arg(long, default_value_t = 500)]
        think_ms: u64,
    },
    /// The single-host figures: round trip, held+drained rate, RSS with idle workers, start-up.
    Local {
        /// Round trips to time (after a warm-up).
        #[arg(long, default_value_t = 500)]
        trips: usize,
        /// Idle workers for the RSS figure.
        #[arg(long, default_value_t = 50)]
        workers: usize,
        /// Messages for the held+drained rate.
        #[arg(long, default_value_t = 20_000)]
        messages: usize,
    },
}

/// p50 and p99 of `samples`, in milliseconds.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| {
        let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(index).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    (at(0.50), at(0.99))
}

/// Round trips through fleetd: send → inject → the scripted agent replies at once → result.
async fn round_trips(fleet: &Fleet, trips: usize) -> anyhow::Result<Vec<Duration>> {
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.ok("fleet_spawn", json!({"profile": "sim", "name": "w1"}))
        .await?;
    trips_to(&lead, "w1", trips).await
}

/// `trips` timed round trips from `lead` to the scripted agent `to`, after 20 untimed ones.
async fn trips_to(lead: &Client, to: &str, trips: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(trips);
    for i in 0..trips + 20 {
        let started = Instant::now();
        let sent = lead
            .ok(
                "fleet_send",
                json!({"to": to, "message": format!("trip {i}"), "wait_s": 30}),
            )
            .await?;
        anyhow::ensure!(sent["status"] == "replied", "trip {i}: {sent}");
        if i >= 20 {
            samples.push(started.elapsed());
        }
    }
    Ok(samples)
}

/// The bare cost of what injection is built on: one paste plus one Enter through tmux into a
/// pane running `cat`, with nothing of fleetd in between; over `tmux`'s control connection (as
/// fleetd drives its server) when `control`, else with one `tmux` client process per command
/// (as a script would).
async fn bare_paste_enter(trips: usize, control: bool) -> anyhow::Result<Vec<Duration>> {
    let socket = format!("fleet-bench-{}", uuid::Uuid::now_v7().simple());
    let scratch = tempfile::tempdir()?;
    let tmux = if control {
        Tmux::private(socket, scratch.path().join("paste"))
    } else {
        Tmux::new(Socket::Name(socket))
    };
    let samples = bare_paste_enter_on(&tmux, trips).await;
    tmux.kill_server().await?;
    samples
}

/// One paste plus one Enter into a pane of `host` running `cat`, `trips` times (after 20
/// untimed), with nothing of fleetd in between.
async fn bare_paste_enter_on(host: &dyn PaneHost, trips: usize) -> anyhow::Result<Vec<Duration>> {
    let pane = host
        .spawn(&PaneSpec {
            label: "bare".into(),
            argv: vec![
                "sh".into(),
                "-c".into(),
                "stty -echo; exec cat > /dev/null".into(),
            ],
            env: BTreeMap::new(),
            cwd: std::env::temp_dir(),
        })
        .await?;
    let mut samples = Vec::with_capacity(trips);
    for i in 0..trips + 20 {
        let started = Instant::now();
        host.paste(&pane, &format!("trip {i}")).await?;
        host.enter(&pane).await?;
        if i >= 20 {
            samples.push(started.elapsed());
        }
    }
    host.close(&pane).await?;
    Ok(samples)
}

/// Holds `count` replies in the local plane's store (one transaction each, as fleetd does) and
/// drains them in polls of 100; returns (seconds holding, seconds draining).
fn hold_and_drain(count: usize) -> anyhow::Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(&dir.path().join("bench.db"))?;
    let (lead, worker) = (Gid::mint(), Gid::mint());
    let started = Instant::now();
    for i in 0..count {
        // Stored as earlier runs stored them (answering nothing, so no answer index is kept),
        // for figures that compare across runs.
        store.insert_message(&Message {
            msg_id: MsgId::mint(),
            trace_id: TraceId::mint(),
            kind: Kind::Reply,
            from: worker,
            to: lead,
            in_reply_to: None,
            body: format!("reply {i}: the answer to the task, a line or two of text"),
            state: MsgState::Held,
            created_ms: 0,
        })?;
    }
    let held = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut drained = 0;
    while drained < count {
        let batch = store.take_held(lead, None, 100)?;
        anyhow::ensure!(!batch.is_empty(), "drained only {drained} of {count}");
        drained += batch.len();
    }
    Ok((held, started.elapsed().as_secs_f64()))
}

/// The same through fleetd's MCP endpoint: one lead sends to another (held for its pull),
/// eight calls at a time, and the other drains with fleet_poll. Returns messages per second.
async fn hold_and_drain_over_mcp(count: usize) -> anyhow::Result<f64> {
    let fleet = Fleet::start(BENCH_HELD, "[leads.a]\n[leads.b]\n").await?;
    let a = fleet.lead("a", Protocol::Stateless).await?;
    let b = fleet.lead("b", Protocol::Stateless).await?;
    sent_and_drained(a, &b, "b", count, 8).await
}

/// Lead-to-lead messages from `a` to `to` (whose client is `b`): sent in `lanes` concurrent
/// lanes without waiting for answers, then drained with `fleet_poll`. Messages per second,
/// over the whole.
async fn sent_and_drained(
    a: Client,
    b: &Client,
    to: &str,
    count: usize,
    lanes: usize,
) -> anyhow::Result<f64> {
    let a = std::sync::Arc::new(a);
    let started = Instant::now();
    let mut senders = Vec::new();
    for lane in 0..lanes {
        let (a, to) = (std::sync::Arc::clone(&a), to.to_string());
        senders.push(tokio::spawn(async move {
            for i in (lane..count).step_by(lanes) {
                a.ok(
                    "fleet_send",
                    json!({"to": to, "message": format!("m{i}"), "wait_s": 0}),
                )
                .await?;
            }
            anyhow::Ok(())
        }));
    }
    for sender in senders {
        sender.await??;
    }
    let mut drained = 0;
    while drained < count {
        let polled = b.ok("fleet_poll", json!({"wait_s": 5})).await?;
        let got = polled["messages"].as_array().map_or(0, Vec::len);
        anyhow::ensure!(got > 0, "drained only {drained} of {count}");
        drained += got;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

fn rss_mb(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    Ok(kb / 1024.0)
}

/// fleetd's RSS with no workers, then with `workers` idle ones.
async fn rss_with_workers(fleet: &Fleet, workers: usize) -> anyhow::Result<(f64, f64, f64, f64)> {
    let pid = fleet.pid().context("fleetd is not running")?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.ok("fleet_list", json!({})).await?;
    let empty = rss_mb(pid)?;
    let spawn_all = |round: usize| {
        let lead = &lead;
        async move {
            for i in 0..workers {
                lead.spawn("sim", &format!("r{round}-w{i}")).await?;
            }
            let live = lead.names().await?.len();
            anyhow::ensure!(live == workers + 1, "only {live} entities live");
            anyhow::Ok(())
        }
    };
    spawn_all(1).await?;
    let loaded = rss_mb(pid)?;
    // What the idle workers cost in CPU: nothing should be polling or looping.
    let before = cpu_seconds(pid)?;
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle_cpu = (cpu_seconds(pid)? - before) / IDLE_WINDOW.as_secs_f64() * 100.0;
    // Stop them all and spawn as many again: a leak per worker would show here.
    for i in 0..workers {
        lead.ok("fleet_stop", json!({"to": format!("r1-w{i}")}))
            .await?;
    }
    spawn_all(2).await?;
    Ok((empty, loaded, rss_mb(pid)?, idle_cpu))
}

/// How long fleetd is watched doing nothing, for its idle CPU figure.
const IDLE_WINDOW: Duration = Duration::from_secs(3);

/// The CPU time `pid` has used, in seconds (user + system).
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after its closing ')'.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    Ok((ticks(11) + ticks(12)) / 100.0)
}

/// How long a started fleetd may take to answer `/healthz`.
const START_LIMIT: Duration = Duration::from_secs(10);

/// Time from exec of `fleetd serve` (on a socket it inherits) to its first `/healthz` 200: a
/// request sent at once waits in the socket's backlog until fleetd serves.
async fn start_to_healthy(runs: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(runs);
    let http = reqwest::Client::new();
    for _ in 0..runs {
        let dir = tempfile::tempdir()?;
        // fleetd serves on a socket bound here: no other process can take the port first.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let config = dir.path().join("fleetd.toml");
        std::fs::write(
            &config,
            format!(
                "[gateway]\nlisten = \"127.0.0.1:{port}\"\n[mux]\nsocket = \"fleet-bench-{port}\"\n"
            ),
        )?;
        let mut command = tokio::process::Command::new(binary("fleetd")?);
        let fd = inherit(command.as_std_mut(), &listener)?;
        let started = Instant::now();
        let mut child = command
            .args(["serve", "--listen-fd", &fd.to_string()])
            .arg("--config")
            .arg(&config)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env("RUST_LOG", "warn")
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let url = format!("http://127.0.0.1:{port}/healthz");
        loop {
            // The request waits in the socket's backlog until fleetd takes it: bounded, in case
            // fleetd never does.
            if let Ok(resp) = http.get(&url).timeout(START_LIMIT).send().await
                && resp.status().is_success()
            {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < START_LIMIT,
                "fleetd never became healthy"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        samples.push(started.elapsed());
        // A clean stop, so fleetd also stops its private tmux server.
        if let Some(pid) = child.id() {
            std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()?;
        }
        child.wait().await?;
        // Stopped right after its start, fleetd may not have seen its tmux server up yet.
        stop_tmux(&format!("fleet-bench-{port}"));
    }
    Ok(samples)
}

/// How long `fleet_spawn` of profile `profile` takes to return a ready worker, `spawns` times
/// (each worker stopped before the next).
async fn spawn_to_ready(
    fleet: &Fleet,
    profile: &str,
    spawns: usize,
) -> anyhow::Result<Vec<Duration>> {
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let mut samples = Vec::with_capacity(spawns);
    for i in 0..spawns {
        let name = format!("{profile}-{i}");
        let started = Instant::now();
        lead.ok("fleet_spawn", json!({"profile": profile, "name": name}))
            .await?;
        samples.push(started.elapsed());
        lead.ok("fleet_stop", json!({"to": name})).await?;
    }
    Ok(samples)
}

/// Whether `program --version` runs.
fn runs(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Spawn-to-ready of the command, claude-code and opencode (on the scripted model) and sandbox
/// (bwrap) kinds, each where it can run here.
async fn spawn_figures(spawns: usize) -> anyhow::Result<()> {
    let mut figures = Vec::new();
    let mut command = spawn_to_ready(
        &Fleet::start("", &sim_profile("sim", &[])?).await?,
        "sim",
        spawns,
    )
    .await?;
    figures.push(("command (scripted agent)", percentiles(&mut command).0));
    if runs(&claude_binary()) {
        let model = ModelSim::start().await?;
        let fleet = Fleet::start("", &claude_profile("claude", &model.base_url())).await?;
        let mut claude = spawn_to_ready(&fleet, "claude", spawns).await?;
        figures.push((
            "claude-code (real Claude Code, scripted model)",
            percentiles(&mut claude).0,
        ));
    } else {
        println!(
            "spawn → ready, claude-code: not measured (no Claude Code: set FLEET_TEST_CLAUDE)"
        );
    }
    if runs(&opencode_binary()) {
        let model = ModelSim::start().await?;
        let fleet = Fleet::start("", &opencode_profile("oc", &model.base_url())).await?;
        let mut opencode = spawn_to_ready(&fleet, "oc", spawns).await?;
        figures.push((
            "opencode (real opencode, scripted model)",
            percentiles(&mut opencode).0,
        ));
    } else {
        println!("spawn → ready, opencode: not measured (no opencode: set FLEET_TEST_OPENCODE)");
    }
    if runs("bwrap") {
        let workdir = tempfile::tempdir()?;
        let fleet = Fleet::start("", &bwrap_profile("boxed", workdir.path())?).await?;
        let mut boxed = spawn_to_ready(&fleet, "boxed", spawns).await?;
        figures.push((
            "sandbox (bwrap around the scripted agent)",
            percentiles(&mut boxed).0,
        ));
    } else {
        println!("spawn → ready, sandbox: not measured (no bwrap)");
    }
    let base = figures.first().map_or(1.0, |(_, p50)| *p50);
    for (kind, p50) in figures {
        println!(
            "spawn → ready, {spawns} spawns, {kind}: p50 {p50:.1} ms ({:.2}x command)",
            p50 / base
        );
    }
    Ok(())
}

async fn local(trips: usize, workers: usize, messages: usize) -> anyhow::Result<()> {
    println!(
        "fleet-bench local ({} build of fleetd at {})",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        binary("fleetd")?.display()
    );

    let mut bare_cli = bare_paste_enter(trips, false).await?;
    let mut bare = bare_paste_enter(trips, true).await?;
    let mut rtt = round_trips(&Fleet::start("", &sim_profile("sim", &[])?).await?, trips).await?;
    let (cli50, cli99) = percentiles(&mut bare_cli);
    let (bare50, bare99) = percentiles(&mut bare);
    let (rtt50, rtt99) = percentiles(&mut rtt);
    let tmux_rtt50 = rtt50;
    println!(
        "round trip send→inject→reply→result, {trips} trips: p50 {rtt50:.2} ms  p99 {rtt99:.2} ms"
    );
    println!(
        "bare tmux paste + Enter, control connection:    p50 {bare50:.2} ms  p99 {bare99:.2} ms"
    );
    println!(
        "bare tmux paste + Enter, tmux CLI per command:  p50 {cli50:.2} ms  p99 {cli99:.2} ms"
    );
    println!(
        "  round trip / bare = {:.2}x (control), {:.2}x (CLI); fleetd's share (round trip p50 - bare control p50) = {:.2} ms  [target ≤ 5 ms]",
        rtt50 / bare50,
        rtt50 / cli50,
        rtt50 - bare50
    );

    let (held, drained) = hold_and_drain(messages)?;
    println!(
        "local plane, {messages} replies: held {:.0}/s, drained {:.0}/s, held+drained {:.0}/s  [target ≥ 5,000/s]",
        messages as f64 / held,
        messages as f64 / drained,
        messages as f64 / (held + drained)
    );
    let mcp_count = messages.min(5_000);
    let over_mcp = hold_and_drain_over_mcp(mcp_count).await?;
    println!(
        "  the same through MCP (lead→lead send, then fleet_poll), {mcp_count} messages: {over_mcp:.0}/s"
    );

    let (empty, loaded, again, idle_cpu) =
        rss_with_workers(&Fleet::start("", &sim_profile("sim", &[])?).await?, workers).await?;
    println!(
        "fleetd RSS: {empty:.1} MB idle, {loaded:.1} MB with {workers} idle workers, {again:.1} MB after stopping them and spawning {workers} more  [target ≤ 50 MB]"
    );
    println!("fleetd CPU with {workers} idle workers: {idle_cpu:.1} % of one core");

    let mut starts = start_to_healthy(10).await?;
    let (start50, start99) = percentiles(&mut starts);
    println!(
        "start → /healthz 200, 10 starts: p50 {start50:.1} ms  max {start99:.1} ms  [target ≤ 200 ms]"
    );

    spawn_figures(10).await?;

    match RealHerdr::from_env().await? {
        None => println!(
            "herdr: not measured (set HERDR_BIN to a herdr binary to measure it beside tmux)"
        ),
        Some(herdr) => {
            let (version, protocol) = Driver::new(herdr.socket()).ping().await?;
            println!(
                "herdr: {} (herdr {version}, protocol {protocol})",
                herdr.bin().display()
            );
            let on_herdr =
                || async { Fleet::start_herdr(&herdr.socket(), &sim_profile("sim", &[])?).await };
            let mut rtt = round_trips(&on_herdr().await?, trips).await?;
            let (rtt50, rtt99) = percentiles(&mut rtt);
            println!(
                "herdr: round trip send→inject→reply→result, {trips} trips: p50 {rtt50:.2} ms  p99 {rtt99:.2} ms ({:.2}x tmux's p50 {tmux_rtt50:.2} ms)",
                rtt50 / tmux_rtt50
            );
            let host = Herdr::connect(&herdr.socket(), "fleet-bench").await?;
            let mut bare = bare_paste_enter_on(&host, trips).await?;
            let (bare50, bare99) = percentiles(&mut bare);
            println!(
                "herdr: bare paste + Enter over its socket (two requests):  p50 {bare50:.2} ms  p99 {bare99:.2} ms"
            );
            let (empty, loaded, again, idle_cpu) =
                rss_with_workers(&on_herdr().await?, workers).await?;
            println!(
                "herdr: fleetd RSS {empty:.1} MB idle, {loaded:.1} MB with {workers} idle workers, {again:.1} MB after stopping them and spawning {workers} more; {idle_cpu:.1} % of one core idle"
            );
        }
    }
    Ok(())
}

/// A gateway of host `host` on the broker at `uri`, with `leads` and the scripted agent. Its
/// inboxes take as many messages as a throughput run sends (the default 1,000 is a cap on what
/// may wait, which a run of 20,000 pipelined sends outpaces while the consumer catches up).
async fn federated(uri: &str, host: &str, leads: &[String]) -> anyhow::Result<Fleet> {
    let leads: String = leads.iter().map(|l| format!("[leads.{l}]\n")).collect();
    Fleet::start_as(
        host,
        BENCH_HELD,
        &format!(
            "{leads}\n{}\n[broker]\nuri = \"{uri}\"\n\n[federation]\npresence_interval_s = 1\npresence_ttl_s = 5\ninbox_max_length = 1000000\n{}",
            sim_profile("sim", &[])?,
            keys::trust_table(&BENCH_HOSTS)
        ),
    )
    .await
}

/// Bare lapin on the same broker: `trips` ping-pong round trips (persistent messages on two
/// durable queues, confirms on, a consumer that answers each ping), and the rate of `count`
/// pipelined publishes with confirms, consumed back.
///
/// Raw lapin on purpose, the one place outside `fleet-amqp` that names it: this is the
/// baseline fleetd's broker path is measured against, so nothing of fleetd's (not even
/// `fleet-amqp`) may sit in it.
async fn bare_lapin(uri: &str, trips: usize, count: usize) -> anyhow::Result<(Vec<Duration>, f64)> {
    use futures_util::StreamExt;
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    let conn = Connection::connect(uri, ConnectionProperties::default()).await?;
    let (ping, pong) = (
        format!("bench.ping.{}", MsgId::mint()),
        format!("bench.pong.{}", MsgId::mint()),
    );
    let publisher = conn.create_channel().await?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    for queue in [&ping, &pong] {
        publisher
            .queue_declare(queue.as_str().into(), durable, FieldTable::default())
            .await?;
    }
    let persistent = || BasicProperties::default().with_delivery_mode(2);
    // The far side: answers every ping with a pong.
    let echo_channel = conn.create_channel().await?;
    echo_channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut pings = echo_channel
        .basic_consume(
            ping.as_str().into(),
            "bench-echo".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let pong_key = pong.clone();
    let echo = tokio::spawn(async move {
        while let Some(Ok(delivery)) = pings.next().await {
            let _ = echo_channel
                .basic_publish(
                    "".into(),
                    pong_key.as_str().into(),
                    BasicPublishOptions::default(),
                    &delivery.data,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await;
            let _ = delivery.ack(BasicAckOptions::default()).await;
        }
    });
    let consumer_channel = conn.create_channel().await?;
    let mut pongs = consumer_channel
        .basic_consume(
            pong.as_str().into(),
            "bench-pong".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut samples = Vec::with_capacity(trips);
    for i in 0..trips + 20 {
        let started = Instant::now();
        publisher
            .basic_publish(
                "".into(),
                ping.as_str().into(),
                BasicPublishOptions::default(),
                format!("ping {i}").as_bytes(),
                persistent(),
            )
            .await?
            .await?;
        let delivery = pongs.next().await.context("the pong consumer ended")??;
        delivery.ack(BasicAckOptions::default()).await?;
        if i >= 20 {
            samples.push(started.elapsed());
        }
    }
    echo.abort();

    // Throughput: pipelined publishes with confirms, consumed and acknowledged as they come.
    let started = Instant::now();
    let consumer = tokio::spawn(async move {
        for _ in 0..count {
            let delivery = pongs.next().await.context("the consumer ended")??;
            delivery.ack(BasicAckOptions::default()).await?;
        }
        anyhow::Ok(())
    });
    for i in 0..count {
        publisher
            .basic_publish(
                "".into(),
                pong.as_str().into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                persistent(),
            )
            .await?;
    }
    publisher.wait_for_confirms().await?;
    consumer.await??;
    let rate = count as f64 / started.elapsed().as_secs_f64();
    for queue in [&ping, &pong] {
        let _ = publisher
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = conn.close(200, "done".into()).await;
    Ok((samples, rate))
}

/// How many workers the federation benchmark spawns on each side.
const SPAWNS: usize = 10;

/// The hosts of the federation benchmark's gateways, each pinning all of them.
const BENCH_HOSTS: [&str; 5] = ["hosta", "hostb", "ra", "rb", "rc"];

/// What signing costs a hop: the mean time to sign an envelope with a `size`-byte body, and to
/// verify it, over `rounds` rounds.
fn sign_and_verify(size: usize, rounds: u32) -> (Duration, Duration) {
    let key = keys::host_key("hosta");
    let public = key.verifying_key();
    let body = vec![b'x'; size];
    let now = u64::try_from(fleet_core::clock::now_ms()).unwrap_or(0);
    let envelope = Envelope {
        version: VERSION,
        kind: Kind::Send,
        msg_id: MsgId::mint(),
        trace_id: TraceId::mint(),
        from: Gid::mint(),
        to: Gid::mint().to_string(),
        turn_id: None,
        spawn_id: None,
        in_reply_to: None,
        from_name: Some("alice".into()),
        from_host: Some("hosta".into()),
        ts_ms: now,
        expires_at_ms: now + 86_400_000,
    };
    let started = Instant::now();
    let mut signed = None;
    for _ in 0..rounds {
        signed = Some(signing::signature(&key, &envelope, &body));
    }
    let sign = started.elapsed() / rounds;
    let sig = signed.map(|s| s.sig).unwrap_or_default();
    let started = Instant::now();
    let mut valid = true;
    for _ in 0..rounds {
        valid &= signing::verify(&public, &envelope, &body, &sig).is_ok();
    }
    let verify = started.elapsed() / rounds;
    assert!(valid, "a signature of the benchmark did not verify");
    (sign, verify)
}

/// Concurrent senders for the cross-host throughput figures: a lead's few parallel calls, and
/// a fleet's many (bare lapin pipelines without bound).
const THROUGHPUT_LANES: [usize; 2] = [8, 32];

/// How long `lead`'s `fleet_spawn` of profile `sim` on `host` (this one's when `None`) takes
/// to return a ready worker, `spawns` times (each stopped before the next).
async fn spawns_on(
    lead: &Client,
    host: Option<&str>,
    spawns: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(spawns);
    for i in 0..spawns {
        let name = format!("spawned-{}-{i}", host.unwrap_or("here"));
        let mut args = json!({"profile": "sim", "name": name});
        if let Some(host) = host {
            args["host"] = json!(host);
        }
        let started = Instant::now();
        lead.ok("fleet_spawn", args).await?;
        samples.push(started.elapsed());
        lead.ok("fleet_stop", json!({"to": name})).await?;
    }
    Ok(samples)
}

/// Mid-task asks, `trips` times: `lead` sends `to` a task whose worker asks it a question,
/// answers it, and gets the task's reply; the time from the answer to the reply (the answer's
/// way to the asking call, and the reply's back).
async fn ask_trips(lead: &Client, to: &str, trips: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(trips);
    for _ in 0..trips {
        let asked = lead
            .ok(
                "fleet_send",
                json!({"to": to, "message": "/ask 20 go?", "wait_s": 20}),
            )
            .await?;
        anyhow::ensure!(asked["status"] == "asked", "no ask: {asked}");
        let started = Instant::now();
        let replied = lead
            .ok(
                "fleet_send",
                json!({"turn_id": asked["ask"]["turn_id"], "message": "go", "wait_s": 20}),
            )
            .await?;
        anyhow::ensure!(replied["status"] == "replied", "no reply: {replied}");
        samples.push(started.elapsed());
    }
    Ok(samples)
}

async fn federation(trips: usize, messages: usize, entities: usize) -> anyhow::Result<()> {
    let broker = Broker::find().await?;
    let vhost = Vhost::create(&broker).await?;
    let uri = vhost.uri();
    println!("fleet-bench federation (broker vhost {})", vhost.name());

    // The bare figures vary between runs on a shared machine: three runs, the median rate.
    let mut bare = Vec::new();
    let mut bare_rates = Vec::new();
    for _ in 0..3 {
        let (samples, rate) = bare_lapin(&uri, trips, messages).await?;
        bare.extend(samples);
        bare_rates.push(rate);
    }
    bare_rates.sort_by(f64::total_cmp);
    let bare_rate = bare_rates[1];
    let a = federated(&uri, "hosta", &["alice".into(), "carol".into()]).await?;
    let b = federated(&uri, "hostb", &["bob".into()]).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    bob.ok("fleet_spawn", json!({"profile": "sim", "name": "wb"}))
        .await?;
    alice
        .ok("fleet_spawn", json!({"profile": "sim", "name": "wa"}))
        .await?;
    while alice.ok("fleet_list", json!({})).await?["entities"]
        .as_array()
        .is_none_or(|e| !e.iter().any(|e| e["name"] == "wb"))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut cross = trips_to(&alice, "wb", trips).await?;
    let mut same = trips_to(&alice, "wa", trips).await?;
    let (bare50, bare99) = percentiles(&mut bare);
    let (cross50, cross99) = percentiles(&mut cross);
    let (same50, same99) = percentiles(&mut same);
    println!(
        "cross-host round trip (lead on A → worker on B → reply), {trips} trips: p50 {cross50:.2} ms  p99 {cross99:.2} ms"
    );
    println!(
        "same-host round trip in the same run:                  p50 {same50:.2} ms  p99 {same99:.2} ms"
    );
    println!(
        "bare lapin ping-pong (2 hops, persistent, confirms):   p50 {bare50:.2} ms  p99 {bare99:.2} ms"
    );
    println!(
        "  fleetd's added cost per broker hop = (cross p50 - same-host p50 - bare p50) / 2 = {:.2} ms  [target ≤ 2 ms]",
        (cross50 - same50 - bare50) / 2.0
    );
    let mut asked_far = ask_trips(&alice, "wb", trips.min(50)).await?;
    let mut asked_here = ask_trips(&alice, "wa", trips.min(50)).await?;
    let (far50, far99) = percentiles(&mut asked_far);
    let (here50, here99) = percentiles(&mut asked_here);
    println!(
        "mid-task ask, answer → reply, worker on B ({} asks):      p50 {far50:.2} ms  p99 {far99:.2} ms",
        asked_far.len()
    );
    println!(
        "the same on one host, same run:                        p50 {here50:.2} ms  p99 {here99:.2} ms"
    );
    let mut far = spawns_on(&alice, Some("hostb"), SPAWNS).await?;
    let mut here = spawns_on(&alice, None, SPAWNS).await?;
    let (far50, far99) = percentiles(&mut far);
    let (here50, here99) = percentiles(&mut here);
    println!(
        "fleet_spawn → ready on host B from a lead on A ({SPAWNS} spawns): p50 {far50:.2} ms  p99 {far99:.2} ms"
    );
    println!(
        "fleet_spawn → ready on the lead's own host, same run:    p50 {here50:.2} ms  p99 {here99:.2} ms"
    );
    for size in [100, 10_000, 256 * 1024] {
        let (sign, verify) = sign_and_verify(size, 500);
        println!(
            "  of which signing + verifying (Ed25519 over the envelope and SHA-256 of a {size}-byte body), per hop: {:.3} ms (sign {:.3} ms, verify {:.3} ms)",
            (sign + verify).as_secs_f64() * 1000.0,
            sign.as_secs_f64() * 1000.0,
            verify.as_secs_f64() * 1000.0
        );
    }

    println!(
        "bare lapin publish with confirms (pipelined) + consume, {messages} messages: {bare_rate:.0}/s (median of {:.0}, {:.0}, {:.0})",
        bare_rates[0], bare_rates[1], bare_rates[2]
    );
    for lanes in THROUGHPUT_LANES {
        let lead = || a.lead("alice", Protocol::Stateless);
        let carol = a.lead("carol", Protocol::Stateless).await?;
        let same = sent_and_drained(lead().await?, &carol, "carol", messages, lanes).await?;
        let rate = sent_and_drained(lead().await?, &bob, "bob@hostb", messages, lanes).await?;
        println!(
            "cross-host messages, {messages} lead→lead sends in {lanes} lanes drained by fleet_poll: {rate:.0}/s = {:.0} % of bare lapin  [target ≥ 50 %]; same-host over MCP: {same:.0}/s",
            rate / bare_rate * 100.0
        );
    }
    drop((alice, bob, a, b));

    // Roster convergence: three gateways of `entities` entities each (leads: no panes needed).
    let names =
        |host: &str| -> Vec<String> { (0..entities).map(|i| format!("{host}-l{i}")).collect() };
    let mut gateways = Vec::new();
    for host in ["ra", "rb", "rc"] {
        gateways.push(federated(&uri, host, &names(host)).await?);
    }
    let started = Instant::now();
    let mut leads = Vec::new();
    for (gateway, host) in gateways.iter().zip(["ra", "rb", "rc"]) {
        leads.push(
            gateway
                .lead(&format!("{host}-l0"), Protocol::Stateless)
                .await?,
        );
    }
    let total = 3 * entities;
    let mut converged = vec![None; leads.len()];
    while converged.iter().any(Option::is_none) {
        for (lead, done) in leads.iter().zip(converged.iter_mut()) {
            if done.is_none() {
                let list = lead.ok("fleet_list", json!({})).await?;
                if list["entities"].as_array().map_or(0, Vec::len) >= total {
                    *done = Some(started.elapsed());
                }
            }
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the roster did not converge within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let slowest = converged.into_iter().flatten().max().unwrap_or_default();
    println!(
        "roster convergence, 3 gateways × {entities} entities (heartbeat 1 s), from the last gateway up: {:.0} ms = {:.2} heartbeat intervals  [target ≤ 2]",
        slowest.as_secs_f64() * 1000.0,
        slowest.as_secs_f64()
    );
    Ok(())
}

/// One consult of the two slots, as a lead does it: its whole time, and its time until both
/// architects had the brief (the whole less the slower one's time from brief to answer).
async fn consult_once(lead: &Client, brief: &str) -> anyhow::Result<(Duration, Duration)> {
    let started = Instant::now();
    let consult = lead
        .ok("fleet_consult", json!({"brief": brief, "wait_s": 60}))
        .await?;
    let total = started.elapsed();
    let answers = consult["answers"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(
        answers.len() == 2 && answers.iter().all(|a| a["status"] == "answered"),
        "{consult}"
    );
    let slowest = answers
        .iter()
        .filter_map(|a| a["ms"].as_u64())
        .max()
        .unwrap_or(0);
    Ok((total, total.saturating_sub(Duration::from_millis(slowest))))
}

/// The same by hand: both spawned at once, both sent the brief at once (waiting for the
/// answers), both stopped.
async fn consult_by_hand(lead: &Client, brief: &str, run: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let names = [format!("hand-a-{run}"), format!("hand-b-{run}")];
    let spawns = names
        .iter()
        .zip(["sim-a", "sim-b"])
        .map(|(name, profile)| lead.ok("fleet_spawn", json!({"profile": profile, "name": name})));
    for spawned in futures_util::future::join_all(spawns).await {
        spawned?;
    }
    let sends = names.iter().map(|name| {
        lead.ok(
            "fleet_send",
            json!({"to": name, "message": brief, "wait_s": 60}),
        )
    });
    for sent in futures_util::future::join_all(sends).await {
        let sent = sent?;
        anyhow::ensure!(sent["status"] == "replied", "{sent}");
    }
    let total = started.elapsed();
    for name in &names {
        lead.ok("fleet_stop", json!({"to": name})).await?;
    }
    Ok(total)
}

async fn consult(runs: usize, think_ms: u64) -> anyhow::Result<()> {
    let config = format!(
        "{}{}[architects]\nslots = [{{ name = \"arch-a\", profile = \"sim-a\" }}, {{ name = \"arch-b\", profile = \"sim-b\" }}]\n",
        sim_profile("sim-a", &[])?,
        sim_profile("sim-b", &[])?,
    );
    let fleet = Fleet::start("", &config).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let brief = format!("/slow {think_ms} the brief");
    let (mut totals, mut handed, mut overheads, mut by_hand, mut hand_overheads) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let think = Duration::from_millis(think_ms);
    for run in 0..runs + 2 {
        let (total, briefed) = consult_once(&lead, &brief).await?;
        let hand = consult_by_hand(&lead, &brief, run).await?;
        if run >= 2 {
            totals.push(total);
            handed.push(briefed);
            overheads.push(total.saturating_sub(think));
            by_hand.push(hand);
            hand_overheads.push(hand.saturating_sub(think));
        }
    }
    println!(
        "fleet-bench consult ({} build), {runs} consults of two scripted architects each thinking {think_ms} ms, alternating with the same by hand",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    for (what, samples) in [
        ("fleet_consult, whole call", &mut totals),
        (
            "fleet_consult → both architects have the brief",
            &mut handed,
        ),
        (
            "fleet_consult overhead (whole less the architects' own time)",
            &mut overheads,
        ),
        ("by hand (spawn ×2, send ×2, wait): whole", &mut by_hand),
        ("by hand: overhead", &mut hand_overheads),
    ] {
        let (p50, p99) = percentiles(samples);
        println!("{what}: p50 {p50:.1} ms, p99 {p99:.1} ms");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().what {
        What::Consult { runs, think_ms } => consult(runs, think_ms).await,
        What::Local {
            trips,
            workers,
            messages,
        } => local(trips, workers, messages).await,
        What::Federation {
            trips,
            messages,
            entities,
        } => federation(trips, messages, entities).await,
    }
}
