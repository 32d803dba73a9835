//! `fleet-bench partition` (issue 37): a host cut off from the broker by a real network
//! partition, and how it heals. Runs the partition scenario (`fleet_testkit::partition`: host
//! b in a network namespace whose veth to the broker is taken down, lead alice on host a
//! sending tasks to three scripted workers on host b at a steady rate, every 7th a slow one)
//! first without a partition (the baseline, through the same namespace and forwarder), then
//! with each partition asked for, and prints their ledgers side by side: what became of every
//! task, what was typed twice or after its failure, workers left busy, and the times the
//! roster took to converge and the first reply took to come after healing. Needs root and
//! iproute2's `ip`.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_testkit::partition::{self, Ledger, Params, Timings};

use super::BUILD;

/// Its options.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// The partitions to run, in seconds, each in a run of its own (comma-separated).
    #[arg(long = "partition-s", value_delimiter = ',', default_values_t = [20u64, 60])]
    partitions: Vec<u64>,
    /// Skip the baseline (the same traffic without a partition).
    #[arg(long)]
    no_baseline: bool,
    /// Tasks per second.
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    /// Traffic before the partition, in seconds.
    #[arg(long, default_value_t = 10)]
    before_s: u64,
    /// Traffic after the partition healed, in seconds.
    #[arg(long, default_value_t = 20)]
    after_s: u64,
    /// Every this many-th task is a slow one (`/slow`), taking its worker `slow_ms`.
    #[arg(long, default_value_t = 7)]
    slow_every: u64,
    /// How long a slow task takes, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    slow_ms: u64,
    /// Both gateways' `broker.heartbeat_s`.
    #[arg(long, default_value_t = Timings::default().heartbeat_s)]
    heartbeat_s: u16,
    /// Both gateways' `federation.presence_interval_s` (the roster should converge within one
    /// of healing).
    #[arg(long, default_value_t = Timings::default().presence_interval_s)]
    presence_interval_s: u64,
    /// Both gateways' `federation.presence_ttl_s`.
    #[arg(long, default_value_t = Timings::default().presence_ttl_s)]
    presence_ttl_s: u64,
    /// Both gateways' `federation.injected_bound_s`.
    #[arg(long, default_value_t = Timings::default().injected_bound_s)]
    injected_bound_s: u64,
    /// Both gateways' `federation.inbox_message_ttl_s` (a run waits up to this, the receipt
    /// bound and 10 s for its last tasks to end).
    #[arg(long, default_value_t = Timings::default().inbox_message_ttl_s)]
    inbox_message_ttl_s: u64,
}

pub(super) async fn run(args: Args) -> anyhow::Result<()> {
    let timings = Timings {
        heartbeat_s: args.heartbeat_s,
        presence_interval_s: args.presence_interval_s,
        presence_ttl_s: args.presence_ttl_s,
        injected_bound_s: args.injected_bound_s,
        inbox_message_ttl_s: args.inbox_message_ttl_s,
        ..Timings::default()
    };
    let mut cuts: Vec<Option<Duration>> = Vec::new();
    if !args.no_baseline {
        cuts.push(None);
    }
    cuts.extend(
        args.partitions
            .iter()
            .map(|s| Some(Duration::from_secs(*s))),
    );
    anyhow::ensure!(!cuts.is_empty(), "nothing to run");
    println!(
        "fleet-bench partition ({BUILD} build): {} tasks/s, {} s before and {} s after each partition, every {}th task {} ms; heartbeat {} s, presence {} s (TTL {} s), receipt bound {} s, inbox TTL {} s",
        args.rate,
        args.before_s,
        args.after_s,
        args.slow_every,
        args.slow_ms,
        timings.heartbeat_s,
        timings.presence_interval_s,
        timings.presence_ttl_s,
        timings.injected_bound_s,
        timings.inbox_message_ttl_s,
    );
    let mut ledgers = Vec::new();
    for cut in cuts {
        let before = Duration::from_secs(args.before_s);
        let params = Params {
            partition_at: before,
            partition_for: cut,
            traffic_for: before + cut.unwrap_or_default() + Duration::from_secs(args.after_s),
            rate: args.rate,
            slow_every: args.slow_every,
            slow_ms: args.slow_ms,
            timings: timings.clone(),
        };
        ledgers.push(partition::run(&params).await?);
    }
    print!("{}", side_by_side(&ledgers));
    for ledger in &ledgers {
        let name = heading(ledger);
        let wrong = ledger.violations();
        if wrong.is_empty() {
            println!("\n{name}: as the issue asks");
        } else {
            println!(
                "\n{name}: {} against the issue's \"done when\":",
                wrong.len()
            );
            for line in wrong {
                println!("  - {line}");
            }
        }
        for note in ledger.notes() {
            println!("  ({note})");
        }
    }
    Ok(())
}

/// A run's column heading.
fn heading(ledger: &Ledger) -> String {
    ledger.partition.map_or("no partition".to_string(), |d| {
        format!("{} s partition", d.as_secs())
    })
}

/// The ledgers' rows side by side: every row any of them has, in the order first met, with
/// `—` where a run has none.
fn side_by_side(ledgers: &[Ledger]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut figures: BTreeMap<(String, usize), String> = BTreeMap::new();
    for (i, ledger) in ledgers.iter().enumerate() {
        for (what, figure) in ledger.rows() {
            if !order.contains(&what) {
                order.push(what.clone());
            }
            figures.insert((what, i), figure);
        }
    }
    let headings: Vec<String> = ledgers.iter().map(heading).collect();
    let label = order.iter().map(|w| w.chars().count()).max().unwrap_or(0);
    let width = |i: usize| {
        order
            .iter()
            .filter_map(|w| figures.get(&(w.clone(), i)))
            .map(|f| f.chars().count())
            .chain([headings[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..ledgers.len()).map(width).collect();
    let mut out = format!("\n{:<label$}", "");
    for (heading, width) in headings.iter().zip(&widths) {
        out.push_str(&format!("  {heading:>width$}"));
    }
    out.push('\n');
    for what in &order {
        out.push_str(&format!("{what:<label$}"));
        for (i, width) in widths.iter().enumerate() {
            let figure = figures.get(&(what.clone(), i)).map_or("—", String::as_str);
            out.push_str(&format!("  {figure:>width$}"));
        }
        out.push('\n');
    }
    out
}
