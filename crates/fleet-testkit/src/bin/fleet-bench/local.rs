//! `fleet-bench local`: the single-host figures.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_core::{Gid, Kind, Message, MsgId, MsgState, TraceId};
use fleet_mux::herdr::driver::Driver;
use fleet_mux::herdr::host::Herdr;
use fleet_mux::tmux::{Socket, Tmux};
use fleet_mux::{PaneHost, PaneSpec};
use fleet_store::{SqliteStore, Store};
use fleet_testkit::bins::binary;
use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{
    Fleet, bwrap_agent_profile, bwrap_profile, claude_binary, claude_profile, opencode_binary,
    opencode_profile, sim_profile, stop_tmux,
};
use fleet_testkit::herdr::RealHerdr;
use fleet_testkit::inherit::inherit;
use fleet_testkit::model::ModelSim;
use serde_json::json;

use super::{BENCH_HELD, cpu_seconds, percentiles, rss_mb, runs, sent_and_drained, trips_to};

/// Round trips through fleetd: send → inject → the scripted agent replies at once → result.
pub(super) async fn round_trips(fleet: &Fleet, trips: usize) -> anyhow::Result<Vec<Duration>> {
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.ok("fleet_spawn", json!({"profile": "sim", "name": "w1"}))
        .await?;
    trips_to(&lead, "w1", trips).await
}

/// The bare cost of what injection is built on: one paste plus one Enter through tmux into a
/// pane running `cat`, with nothing of fleetd in between; over `tmux`'s control connection (as
/// fleetd drives its server) when `control`, else with one `tmux` client process per command
/// (as a script would).
pub(super) async fn bare_paste_enter(trips: usize, control: bool) -> anyhow::Result<Vec<Duration>> {
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
pub(super) async fn bare_paste_enter_on(
    host: &dyn PaneHost,
    trips: usize,
) -> anyhow::Result<Vec<Duration>> {
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
            expires_ms: None,
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

/// Spawn-to-ready of the command, claude-code and opencode (on the scripted model) and sandbox
/// kinds (bwrap, podman), each where it can run here.
async fn spawn_figures(spawns: usize) -> anyhow::Result<()> {
    let mut figures = Vec::new();
    let mut command = spawn_to_ready(
        &Fleet::start("", &sim_profile("sim", &[])?).await?,
        "sim",
        spawns,
    )
    .await?;
    figures.push(("command (scripted agent)", percentiles(&mut command).0));
    let claude = claude_figures(spawns).await?;
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
    if let Some(p50) = in_podman(spawns, None).await? {
        figures.push(("sandbox (podman around the scripted agent)", p50));
    }
    let base = figures.first().map_or(1.0, |(_, p50)| *p50);
    for (kind, p50) in figures {
        println!(
            "spawn → ready, {spawns} spawns, {kind}: p50 {p50:.1} ms ({:.2}x command)",
            p50 / base
        );
    }
    let unboxed = claude.first().map_or(1.0, |(_, p50)| *p50);
    for (kind, p50) in claude {
        println!(
            "spawn → ready, {spawns} spawns, {kind}: p50 {p50:.1} ms ({:.2}x command, {:.2}x unsandboxed Claude Code)",
            p50 / base,
            p50 / unboxed
        );
    }
    Ok(())
}

/// Spawn-to-ready of a real Claude Code on the scripted model: unsandboxed, in bubblewrap and
/// in podman (each in a home of its own), where each can run here; unsandboxed first.
async fn claude_figures(spawns: usize) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let mut figures = Vec::new();
    if !runs(&claude_binary()) {
        println!(
            "spawn → ready, claude-code: not measured (no Claude Code: set FLEET_TEST_CLAUDE)"
        );
        return Ok(figures);
    }
    let model = ModelSim::start().await?;
    let fleet = Fleet::start("", &claude_profile("claude", &model.base_url())).await?;
    let mut claude = spawn_to_ready(&fleet, "claude", spawns).await?;
    figures.push((
        "claude-code (real Claude Code, scripted model)",
        percentiles(&mut claude).0,
    ));
    if runs("bwrap") {
        let workdir = tempfile::tempdir()?;
        let profile = bwrap_agent_profile(
            "boxed",
            "claude-code",
            &claude_binary(),
            workdir.path(),
            &model.base_url(),
        );
        let fleet = Fleet::start("", &profile).await?;
        let mut boxed = spawn_to_ready(&fleet, "boxed", spawns).await?;
        figures.push((
            "claude-code in bwrap (real Claude Code, scripted model)",
            percentiles(&mut boxed).0,
        ));
    }
    if let Some(p50) = in_podman(spawns, Some(&model.base_url())).await? {
        figures.push((
            "claude-code in podman (real Claude Code, scripted model)",
            p50,
        ));
    }
    Ok(figures)
}

/// Spawn-to-ready p50 (ms) in a podman container on a prepared root: of the scripted agent, or
/// (`claude` names the scripted model's URL) of a real Claude Code; `None` where podman runs no
/// container here (said why).
async fn in_podman(spawns: usize, claude: Option<&str>) -> anyhow::Result<Option<f64>> {
    if let Err(e) = fleet_testkit::podman::oci_runtime() {
        println!("spawn → ready in podman: not measured ({e:#})");
        return Ok(None);
    }
    let podman = fleet_testkit::podman::Podman::new()?;
    let workdir = tempfile::tempdir()?;
    let (agent, real) = match claude {
        Some(url) => (claude_binary(), Some(("claude-code", url))),
        None => (binary("fleet-agent-sim")?.display().to_string(), None),
    };
    let profile = podman.profile("boxed", workdir.path(), &agent, real)?;
    let fleet = Fleet::start("", &profile).await?;
    let mut samples = spawn_to_ready(&fleet, "boxed", spawns).await?;
    Ok(Some(percentiles(&mut samples).0))
}

pub(super) async fn local(trips: usize, workers: usize, messages: usize) -> anyhow::Result<()> {
    println!(
        "fleet-bench local ({} build of fleetd at {})",
        super::BUILD,
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
        "  round trip / bare = {:.2}x (control), {:.2}x (CLI); fleetd's share (round trip p50 - bare control p50) = {:.2} ms  [target ≤ 2 ms]",
        rtt50 / bare50,
        rtt50 / cli50,
        rtt50 - bare50
    );
    super::steps::cut(super::steps::traced_on_tmux().await?, trips, rtt50).await?;

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
