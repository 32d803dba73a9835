//! Issue 37, "a host cut off from the broker heals without a trace": a real network partition.
//! Gateway hostb runs in a network namespace the test makes, its only way to the broker a veth
//! the test takes down and up (`fleet_testkit::netns`); lead alice on hosta sends tasks to
//! three scripted workers on hostb at a steady rate across the partition. What a user would
//! check afterwards: every task answered once or failed with a reason, none typed twice or
//! after its failure, no worker left `busy`, the roster whole again within one heartbeat of
//! healing (`fleet_testkit::partition`). Needs root and iproute2's `ip`, and fails without.

use std::time::Duration;

use fleet_testkit::partition::{Ledger, Params, Timings, run};

/// The scenario with a partition of `cut` (none: the baseline), 2 tasks/s from 5 s before it
/// to 10 s after it.
fn params(cut: Option<Duration>) -> Params {
    let before = Duration::from_secs(5);
    let after = Duration::from_secs(10);
    Params {
        partition_at: before,
        partition_for: cut,
        traffic_for: before + cut.unwrap_or_default() + after,
        rate: 2.0,
        slow_every: 7,
        slow_ms: 2_000,
        timings: Timings::default(),
    }
}

/// Prints `ledger` (shown with the failure, or with `--no-capture`) and fails naming
/// everything it shows wrong.
fn judged(ledger: &Ledger) -> anyhow::Result<()> {
    println!("{ledger}");
    let wrong = ledger.violations();
    anyhow::ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}

/// The harness itself: a partition that did not cut the link would prove nothing.
fn cut_for_real(ledger: &Ledger) -> anyhow::Result<()> {
    anyhow::ensure!(
        ledger.link_downs > 0,
        "hostb never logged its broker link down: the partition cut nothing\n{ledger}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_partition_every_task_is_answered_once() -> anyhow::Result<()> {
    let ledger = run(&params(None)).await?;
    anyhow::ensure!(
        ledger.answered_once == ledger.sent && ledger.sent > 0,
        "{ledger}"
    );
    judged(&ledger)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_s_partition_heals_with_every_task_ended_once() -> anyhow::Result<()> {
    let ledger = run(&params(Some(Duration::from_secs(20)))).await?;
    cut_for_real(&ledger)?;
    judged(&ledger)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_60_s_partition_heals_with_every_task_ended_once() -> anyhow::Result<()> {
    let ledger = run(&params(Some(Duration::from_secs(60)))).await?;
    cut_for_real(&ledger)?;
    judged(&ledger)
}
