//! The stall watchdog: a worker of a profile with `stall_after_s = 1` whose program stops
//! moving mid-task (the scripted agent's `/never`: it prints a line and never replies) has
//! stalled; its lead is told, and with `on_stall = "recycle"` its task fails and it starts
//! afresh.

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(20);

/// The first message `lead` polls (within 15 s), which must be the notice that `worker` stalled
/// on the task `sent` started, with the end of its screen (`Screen::Shown`: `lead` is its owner)
/// or without it (`Screen::Withheld`: another's worker, shared with it); `logs` says what
/// happened if not.
async fn stall_notice(
    lead: &Client,
    worker: &str,
    sent: &Value,
    screen: Screen,
    logs: impl Fn() -> String,
) -> anyhow::Result<Value> {
    let told = lead.poll(15).await?;
    let first = told.first().cloned().unwrap_or_default();
    let text = first["text"].as_str().unwrap_or_default();
    let screen_as_due = match screen {
        Screen::Shown => text.contains("its screen ends:") && text.contains("[not replying]"),
        Screen::Withheld => {
            text.ends_with("its screen is its owner's") && !text.contains("[not replying]")
        }
    };
    anyhow::ensure!(
        text.starts_with(&format!("[fleet] '{worker}' has stalled"))
            && text.contains(sent["msg_id"].as_str().unwrap_or("?"))
            && screen_as_due,
        "{told:?}\n{}",
        logs()
    );
    Ok(first)
}

/// Whether a stall notice quotes the worker's screen.
#[derive(Clone, Copy)]
enum Screen {
    /// To its owner.
    Shown,
    /// To anyone else.
    Withheld,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_worker_is_reported_to_its_lead_once_with_its_screen() -> anyhow::Result<()> {
    let profile = format!("{}stall_after_s = 1\n", sim_profile("sim", &[])?);
    let fleet = Fleet::start("", &profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    assert!(lead.entry("w1").await?.get("stalled_since").is_none());
    let sent = lead.send("w1", "/never", 0).await?;
    let told = stall_notice(&lead, "w1", &sent, Screen::Shown, || fleet.log()).await?;
    assert!(
        told["text"]
            .as_str()
            .unwrap_or_default()
            .contains("no change on its screen and no call for 1 s"),
        "{told}"
    );
    let entry = lead.entry("w1").await?;
    assert!(entry["stalled_since"].is_i64(), "{entry}");
    assert_eq!(entry["status"], "busy");
    // Told once: nothing more while it stays stalled.
    let again = lead.ok("fleet_poll", json!({"wait_s": 3})).await?;
    assert_eq!(again["messages"], json!([]), "{again}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_worker_set_to_recycle_fails_its_task_and_starts_afresh() -> anyhow::Result<()> {
    let profile = format!(
        "{}stall_after_s = 1\non_stall = \"recycle\"\n",
        sim_profile("sim", &[])?
    );
    let fleet = Fleet::start("", &profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("sim", "w1").await?;
    let failed = lead.send("w1", "/never", 20).await?;
    assert_eq!(failed["status"], "failed", "{failed}\n{}", fleet.log());
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("'w1' has stalled") && reason.contains("it was recycled"),
        "{reason}"
    );
    // A fresh session in a new pane under the same name and gid, which answers.
    let fresh = until("w1's fresh session to be idle", LIMIT, || async {
        lead.entry("w1")
            .await
            .ok()
            .filter(|e| e["status"] == "idle" && e["pane"] != spawned["pane"])
    })
    .await?;
    assert_eq!(fresh["gid"], spawned["gid"]);
    assert!(fresh.get("stalled_since").is_none(), "{fresh}");
    let sent = lead.send("w1", "hello again", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello again", "{sent}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_on_another_host_is_told_to_the_lead_whose_task_it_was() -> anyhow::Result<()> {
    use fleet_testkit::broker::Broker;

    use super::federation::sees;
    use fleet_testkit::hosts::TwoHosts;

    let slow = format!("{}stall_after_s = 1\n", sim_profile("slow", &[])?);
    let TwoHosts {
        vhost: _vhost,
        a,
        b,
        alice,
        bob,
    } = TwoHosts::each(&Broker::find().await?, "", &slow).await?;
    bob.spawn("slow", "wb").await?;
    sees(&alice, "wb").await?;
    // alice's task stalls bob's worker on hostb (shared with her): alice, whose task it was,
    // is told, without its screen, which is bob's.
    let sent = alice.send("wb", "/never", 0).await?;
    let told = stall_notice(&alice, "wb", &sent, Screen::Withheld, || {
        format!("hostb's log:\n{}\nhosta's log:\n{}", b.log(), a.log())
    })
    .await?;
    assert_eq!(told["from_name"], "wb");
    assert!(bob.poll(0).await?.is_empty(), "bob's was not the task");
    // A worker of alice's own on hostb: its stall reaches her with its screen.
    alice
        .ok(
            "fleet_spawn",
            json!({"profile": "slow", "name": "wa", "host": "hostb"}),
        )
        .await?;
    let sent = alice.send("wa", "/never", 0).await?;
    let told = stall_notice(&alice, "wa", &sent, Screen::Shown, || {
        format!("hostb's log:\n{}\nhosta's log:\n{}", b.log(), a.log())
    })
    .await?;
    assert_eq!(told["from_name"], "wa");
    Ok(())
}
