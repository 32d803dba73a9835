//! The local plane's durability: held replies survive `kill -9` of fleetd and are drained
//! exactly once after the restart.

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

/// fleetd with one scripted worker, `w1`; the lead and the worker's pane.
async fn fleet_with_worker() -> anyhow::Result<(Fleet, Client, String)> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let pane = lead.spawn("sim", "w1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok((fleet, lead, pane))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_replies_survive_kill_9_and_drain_exactly_once() -> anyhow::Result<()> {
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    let count = 5;
    for i in 0..count {
        let sent = lead
            .ok(
                "fleet_send",
                json!({"to": "w1", "message": format!("r{i}"), "wait_s": 0}),
            )
            .await?;
        assert_eq!(sent["status"], "pending");
    }
    until("every reply to be sent", LIMIT, || async {
        fleet
            .screen(&pane)
            .ok()
            .filter(|s| s.matches("[replied]").count() == count)
    })
    .await?;
    lead.close().await?;

    fleet.kill9().await?;
    fleet.launch().await?;

    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let polled = lead.ok("fleet_poll", json!({})).await?;
    let texts: Vec<String> = polled["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|m| m["text"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let expected: Vec<String> = (0..count).map(|i| format!("echo: r{i}")).collect();
    assert_eq!(texts, expected, "{}", fleet.log());
    let again = lead.ok("fleet_poll", json!({})).await?;
    assert_eq!(again["messages"], json!([]));

    // The previous run's worker was reaped: gone from the roster, its pane closed.
    let list = lead.ok("fleet_list", json!({})).await?;
    assert_eq!(list["entities"].as_array().map(Vec::len), Some(1), "{list}");
    until("the old pane to be closed", LIMIT, || async {
        fleet.panes().ok().filter(|p| p.is_empty())
    })
    .await?;
    // And the lead works as before.
    lead.spawn("sim", "w1").await?;
    let sent = lead.send("w1", "after restart", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: after restart");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_in_flight_or_queued_when_fleetd_died_fail_visibly() -> anyhow::Result<()> {
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    let in_flight = lead.send("w1", "/never", 0).await?;
    let queued = lead.send("w1", "behind it", 0).await?;
    assert_eq!(queued["state"], "queued");
    until("the first task to be typed in", LIMIT, || async {
        fleet
            .screen(&pane)
            .ok()
            .filter(|s| s.contains("[not replying]"))
    })
    .await?;
    // The agent has it; wait until fleetd has verified the submit too (else it is a task
    // fleetd died while typing, another case).
    let injected = format!(
        "msg_id={}",
        in_flight["msg_id"].as_str().unwrap_or_default()
    );
    until("fleetd to record the task injected", LIMIT, || async {
        fleet
            .log()
            .lines()
            .any(|l| l.contains(" injected ") && l.contains(&injected))
            .then_some(())
    })
    .await?;
    lead.close().await?;
    fleet.kill9().await?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let notices = lead.poll(0).await?;
    let notice_for = |sent: &serde_json::Value| {
        notices
            .iter()
            .find(|n| n["in_reply_to"] == sent["msg_id"])
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no notice for {sent}: {notices:?}"))
    };
    let orphaned = notice_for(&queued)?;
    assert_eq!(orphaned["kind"], "FAILED");
    assert!(
        orphaned["text"]
            .as_str()
            .unwrap_or_default()
            .contains("fleetd restarted")
    );
    let unanswered = notice_for(&in_flight)?;
    assert_eq!(unanswered["kind"], "FAILED");
    assert!(
        unanswered["text"]
            .as_str()
            .unwrap_or_default()
            .contains("'w1' never answered"),
        "{unanswered}"
    );
    assert_eq!(notices.len(), 2, "{notices:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_reaps_only_its_own_panes() -> anyhow::Result<()> {
    let (mut mine, lead, _) = fleet_with_worker().await?;
    let (other, other_lead, other_pane) = fleet_with_worker().await?;
    mine.kill9().await?;
    mine.launch().await?;
    let lead_again = mine.lead("lead", Protocol::Stateless).await?;
    until("my old worker to be reaped", LIMIT, || async {
        (lead_again.names().await.ok()? == ["lead"]).then_some(())
    })
    .await?;
    drop(lead);
    // The other gateway's worker is untouched and still answers.
    assert_eq!(other.panes()?, [other_pane]);
    let sent = other_lead.send("w1", "still here?", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: still here?");
    Ok(())
}
