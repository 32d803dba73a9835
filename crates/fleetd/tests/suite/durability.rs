//! The local plane's durability: held replies survive `kill -9` of fleetd and are drained
//! exactly once after the restart.

use std::time::Duration;

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_replies_survive_kill_9_and_drain_exactly_once() -> anyhow::Result<()> {
    let mut fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let pane = lead.spawn("sim", "w1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
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
async fn a_task_queued_for_a_worker_of_a_dead_run_fails_visibly() -> anyhow::Result<()> {
    let mut fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    lead.send("w1", "/never", 0).await?;
    let queued = lead.send("w1", "behind it", 0).await?;
    assert_eq!(queued["state"], "queued");
    lead.close().await?;
    fleet.kill9().await?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let polled = lead.ok("fleet_poll", json!({})).await?;
    let notices = polled["messages"].as_array().cloned().unwrap_or_default();
    let notice = notices
        .iter()
        .find(|n| n["in_reply_to"] == queued["msg_id"])
        .ok_or_else(|| anyhow::anyhow!("no notice for the queued task: {polled}"))?;
    assert_eq!(notice["kind"], "FAILED", "{polled}");
    assert!(
        notice["text"]
            .as_str()
            .unwrap_or_default()
            .contains("fleetd restarted")
    );
    Ok(())
}
