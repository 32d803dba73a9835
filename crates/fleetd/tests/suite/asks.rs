//! Mid-turn asks on one host: the scripted agent's `/ask S question` calls `fleet_ask` and
//! replies with what it heard (or the error code it got); the rmcp client is the lead.

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(20);

async fn fleet_with_w1() -> anyhow::Result<(Fleet, Client)> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    Ok((fleet, lead))
}

/// Waits until w1's status in `fleet_list` is `status`.
async fn until_w1_is(lead: &Client, status: &str) -> anyhow::Result<()> {
    until(&format!("w1 to be {status}"), LIMIT, || async {
        (lead.entry("w1").await.ok()?["status"] == status).then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_surfaces_on_the_blocked_send_and_the_answer_comes_back() -> anyhow::Result<()> {
    let (_fleet, lead) = fleet_with_w1().await?;
    let sent = lead.send("w1", "/ask 20 which port?", 20).await?;
    assert_eq!(sent["status"], "asked", "{sent}");
    assert_eq!(sent["ask"]["question"], "which port?");
    assert_eq!(sent["ask"]["from_name"], "w1");
    assert_eq!(sent["ask"]["in_task"], sent["msg_id"]);
    assert_eq!(lead.entry("w1").await?["status"], "asking");
    // Answering waits on for the task's own reply.
    let turn = sent["ask"]["turn_id"].clone();
    let answered = lead
        .ok(
            "fleet_send",
            json!({"turn_id": turn, "message": "8080", "wait_s": 20}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}");
    assert_eq!(answered["reply"]["text"], "asked which port?, heard: 8080");
    // The same question cannot be answered twice.
    let again = lead
        .call(
            "fleet_send",
            json!({"turn_id": turn, "message": "9090", "wait_s": 0}),
        )
        .await?
        .expect_err("a second answer");
    assert_eq!(again.code, "too_late", "{again}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_surfaces_on_a_poll() -> anyhow::Result<()> {
    let (fleet, lead) = fleet_with_w1().await?;
    // The lead waits in a poll (from a second connection) while its task goes out.
    let poller = fleet.lead("lead", Protocol::Stateless).await?;
    let poll = tokio::spawn(async move { poller.ok("fleet_poll", json!({"wait_s": 20})).await });
    until("the lead to be waiting in its poll", LIMIT, || async {
        let list = lead.ok("fleet_list", json!({})).await.ok()?;
        (list["you"]["open_calls"] == 1).then_some(())
    })
    .await?;
    let sent = lead.send("w1", "/ask 20 may I delete build/?", 0).await?;
    assert_eq!(sent["status"], "pending", "{sent}");
    let polled = poll.await??;
    let ask = &polled["asks"][0];
    assert_eq!(ask["question"], "may I delete build/?", "{polled}");
    let answered = lead
        .ok(
            "fleet_send",
            json!({"turn_id": ask["turn_id"], "message": "yes", "wait_s": 20}),
        )
        .await?;
    assert_eq!(
        answered["reply"]["text"],
        "asked may I delete build/?, heard: yes"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_with_nobody_waiting_fails_at_once_with_no_waiter() -> anyhow::Result<()> {
    let (_fleet, lead) = fleet_with_w1().await?;
    // Sent without waiting: by the time w1 asks, the lead is in no call.
    lead.send("w1", "/ask 20 anyone there?", 0).await?;
    until_w1_is(&lead, "idle").await?;
    let held = lead.poll(0).await?;
    assert_eq!(
        held[0]["text"], "asked anyone there?, got no_waiter",
        "{held:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_after_the_ask_expired_is_too_late_and_never_typed_in() -> anyhow::Result<()> {
    let (_fleet, lead) = fleet_with_w1().await?;
    let sent = lead.send("w1", "/ask 1 quick question?", 20).await?;
    assert_eq!(sent["status"], "asked", "{sent}");
    // w1 waits one second, gives up and replies.
    until_w1_is(&lead, "idle").await?;
    let late = lead
        .call(
            "fleet_send",
            json!({"turn_id": sent["ask"]["turn_id"], "message": "LATE ANSWER", "wait_s": 5}),
        )
        .await?
        .expect_err("an answer after the ask expired");
    assert_eq!(late.code, "too_late", "{late}");
    let held = lead.poll(0).await?;
    assert_eq!(held[0]["text"], "asked quick question?, got timeout");
    // The next task is answered as itself: the late answer went nowhere.
    let next = lead.send("w1", "next task", 20).await?;
    assert_eq!(next["reply"]["text"], "echo: next task");
    // An unknown turn id is not mistaken for a late one.
    let unknown = lead
        .call(
            "fleet_send",
            json!({"turn_id": "turn-nope", "message": "x", "wait_s": 0}),
        )
        .await?
        .expect_err("an unknown turn id");
    assert_eq!(unknown.code, "invalid_params", "{unknown}");
    Ok(())
}
