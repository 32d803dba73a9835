//! `fleet-bench`: prints fleetd's figures on this machine, each beside a baseline measured in
//! the same run (see `--help` for the benchmarks). Run it from a release build:
//! `cargo build --release --workspace --bins && target/release/fleet-bench local`.

mod consult;
mod federation;
mod flood;
mod local;
mod partition;
mod scale;
mod soak;
mod steps;
mod submits;
mod throughput;

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use fleet_testkit::client::Client;
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::keys;
use serde_json::json;

/// The throughput figures hold thousands of messages for one lead before it drains them: the
/// gateway's held cap is raised as far as it goes for them.
const BENCH_HELD: &str = "max_held_per_recipient = 1000000";

/// The kind of build this is, printed beside every figure (a debug build's figures mean little).
const BUILD: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

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
    /// A local round trip cut into its steps (fleetd's step trace on), beside the untraced
    /// round trip and a bare tmux paste + Enter, on tmux, in one run (`local` prints it too);
    /// then the same on herdr when `HERDR_BIN` names a herdr binary.
    Steps {
        /// Round trips to time (after a warm-up), untraced and traced.
        #[arg(long, default_value_t = 300)]
        trips: usize,
    },
    /// Idle and header-dripping connections that never authenticate (issue 29), held open
    /// while a lead runs round trips and `/healthz` is probed: the figures beside the same
    /// without them, what fleetd closed and when, its descriptors and RSS after the flood.
    Flood(flood::Args),
    /// A host cut off from the broker by a real network partition (issue 37; needs root and
    /// iproute2): every task's fate, duplicates, workers left busy, roster convergence and
    /// recovery after healing, beside the same traffic without a partition.
    Partition(partition::Args),
    /// Crash soak: cycles of `kill -9` of a gateway in the middle of mixed traffic, each
    /// followed by a restart; counts what was lost, duplicated or typed twice.
    Soak(soak::Args),
    /// Many agents: fleetd's RSS and CPU per 1,000 idle workers, presence traffic, roster
    /// convergence over many gateways, `fleet_list` with 1,000+ entries, a closed loop of many
    /// workers.
    Scale(scale::Args),
    /// Real agent submits: tasks of every shape typed into real agent workers on the scripted
    /// model, counting those swallowed, merged, submitted twice or altered.
    Submits(submits::Args),
    /// Throughput against its ceiling: a bare MCP tool server on the same stack, fleetd's
    /// same-host lead → lead rate as a share of it, cross-host as a share of same-host.
    Throughput(throughput::Args),
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

/// Whether `program --version` runs.
fn runs(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A gateway of host `host` on the broker at `uri`, with `leads` and the scripted agent. Its
/// inboxes take as many messages as a throughput run sends (the default 1,000 is a cap on what
/// may wait, which a run of 20,000 pipelined sends outpaces while the consumer catches up).
async fn federated(uri: &str, host: &str, leads: &[String]) -> anyhow::Result<Fleet> {
    // Each lead tasks the others' workers too (bob's `wb` takes alice's trips).
    let leads: String = leads
        .iter()
        .map(|l| {
            format!("[leads.{l}]\nshare = [\"alice@hosta\", \"carol@hosta\", \"bob@hostb\"]\n")
        })
        .collect();
    Fleet::start_as(
        host,
        // A spawn for another host's lead goes only under a host's roots.
        &format!(
            "{BENCH_HELD}\nworkdir_roots = [{:?}]",
            fleet_testkit::fleet::agent_workdir()
        ),
        &format!(
            "{leads}\n{}\n[broker]\nuri = \"{uri}\"\n\n[federation]\npresence_interval_s = 1\npresence_ttl_s = 5\ninbox_max_length = 1000000\n{}",
            sim_profile("sim", &[])?,
            keys::admitting(&BENCH_HOSTS)
        ),
    )
    .await
}

/// The hosts of the federation benchmark's gateways, each pinning all of them.
const BENCH_HOSTS: [&str; 5] = ["hosta", "hostb", "ra", "rb", "rc"];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Figures of fleetd as users run it, not with the tests' debug lines.
    Fleet::log_as_shipped();
    match Args::parse().what {
        What::Consult { runs, think_ms } => consult::consult(runs, think_ms).await,
        What::Local {
            trips,
            workers,
            messages,
        } => local::local(trips, workers, messages).await,
        What::Federation {
            trips,
            messages,
            entities,
        } => federation::federation(trips, messages, entities).await,
        What::Steps { trips } => steps::run(trips).await,
        What::Flood(args) => flood::run(args).await,
        What::Partition(args) => partition::run(args).await,
        What::Soak(args) => soak::run(args).await,
        What::Scale(args) => scale::run(args).await,
        What::Submits(args) => submits::run(args).await,
        What::Throughput(args) => throughput::run(args).await,
    }
}
