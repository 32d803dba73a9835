//! `fleet-bench consult`: `fleet_consult` beside the same done by hand.

use std::time::{Duration, Instant};

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use serde_json::json;

use super::percentiles;

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

pub(super) async fn consult(runs: usize, think_ms: u64) -> anyhow::Result<()> {
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
        super::BUILD
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
