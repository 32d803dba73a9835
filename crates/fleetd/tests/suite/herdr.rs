//! fleetd on herdr: the real fleetd binary driving, in turn, the herdr stand-in
//! (`fleet-herdr-standin`: herdr's protocol with the panes in tmux — a stand-in, since herdr
//! cannot be built in CI) and a real herdr, the binary `HERDR_BIN` names (built without
//! `HERDR_BIN`, those tests are ignored, with the reason); the scripted agent in its panes, the
//! rmcp client as the lead.

use std::time::Duration;

use fleet_mux::AgentState;
use fleet_mux::herdr::codec;
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, Keys, sim_profile};
use fleet_testkit::herdr::{RealHerdr, TestHerdr};
use fleet_testkit::wait::until;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(20);

async fn fleet_on(herdr: &TestHerdr) -> anyhow::Result<(Fleet, Client)> {
    let fleet = Fleet::start_herdr(&herdr.socket(), &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    Ok((fleet, lead))
}

/// Waits until herdr shows fleetd's own report that the pane's worker is idle: `idle`, or
/// after a turn `done` (herdr's word for a finished turn nobody has looked at yet).
async fn fleetd_reported_idle(herdr: &TestHerdr, pane: &str) -> anyhow::Result<()> {
    until("fleetd to report the worker idle", LIMIT, || async {
        let (agent, status) = herdr_sees(herdr, pane).await?;
        (agent == "fleetd" && (status == "idle" || status == "done")).then_some(())
    })
    .await
}

/// What herdr shows of the pane's agent: (agent, status).
async fn herdr_sees(herdr: &TestHerdr, pane: &str) -> Option<(String, String)> {
    let pane = herdr.driver().call(codec::pane_get(pane)).await.ok()?;
    Some((
        pane["pane"]["agent"].as_str()?.to_string(),
        pane["pane"]["agent_status"].as_str()?.to_string(),
    ))
}

async fn a_round_trip_through_herdr_with_fleetd_reporting_its_state(
    herdr: TestHerdr,
) -> anyhow::Result<()> {
    let (fleet, lead) = fleet_on(&herdr).await?;
    let spawned = lead.spawn("sim", "w1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    assert!(pane.contains(":p"), "a herdr pane id: {pane}");
    let sent = lead.send("w1", "hello through herdr", 20).await?;
    assert_eq!(
        sent["reply"]["text"],
        "echo: hello through herdr",
        "{sent}\n{}",
        fleet.log()
    );
    // herdr does not recognise the scripted agent, so fleetd reports its session state.
    fleetd_reported_idle(&herdr, &pane).await?;
    lead.send("w1", "/slow 3000 busy a while", 0).await?;
    until("fleetd to report w1 working", LIMIT, || async {
        herdr_sees(&herdr, &pane)
            .await
            .filter(|seen| seen.1 == "working")
    })
    .await?;
    Ok(())
}

async fn an_agent_herdr_sees_working_or_blocked_gets_no_task(
    herdr: TestHerdr,
) -> anyhow::Result<()> {
    let (_fleet, lead) = fleet_on(&herdr).await?;
    let pane = lead.spawn("sim", "w1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // fleetd's own report first: herdr shows whichever report came last.
    fleetd_reported_idle(&herdr, &pane).await?;
    let detect = |state| codec::report_agent(&pane, "herdr", "claude", state);
    // herdr recognises the agent and sees it blocked on a human: fleet_list shows it.
    herdr.driver().call(detect(AgentState::Blocked)).await?;
    until("fleet_list to show w1 blocked", LIMIT, || async {
        let entry = lead.entry("w1").await.ok()?;
        (entry["agent_status"] == "blocked" && entry["agent"] == "claude").then_some(())
    })
    .await?;
    // While herdr sees it working, a task waits in the queue.
    herdr.driver().call(detect(AgentState::Working)).await?;
    until("fleet_list to show w1 working", LIMIT, || async {
        (lead.entry("w1").await.ok()?["agent_status"] == "working").then_some(())
    })
    .await?;
    let sent = lead.send("w1", "wait for me", 1).await?;
    assert_eq!(sent["status"], "pending");
    assert_eq!(sent["state"], "queued", "{sent}");
    // Once herdr sees it idle, the task goes in and is answered.
    herdr.driver().call(detect(AgentState::Idle)).await?;
    let answers = lead.poll(20).await?;
    assert_eq!(answers[0]["text"], "echo: wait for me", "{answers:?}");
    Ok(())
}

async fn herdr_gone_reads_unknown_fails_sends_fast_keeps_held_and_comes_back(
    mut herdr: TestHerdr,
) -> anyhow::Result<()> {
    let (fleet, lead) = fleet_on(&herdr).await?;
    lead.spawn("sim", "w1").await?;
    // A reply held for the lead before herdr goes.
    lead.send("w1", "/slow 200 kept", 0).await?;
    until("the reply to be held", LIMIT, || async {
        let log = fleet.log();
        log.contains("kind=REPLY").then_some(())
    })
    .await?;

    herdr.kill9().await?;
    until("w1 to read unknown", LIMIT, || async {
        (lead.entry("w1").await.ok()?["status"] == "unknown").then_some(())
    })
    .await?;
    let started = std::time::Instant::now();
    let refused = lead
        .call(
            "fleet_send",
            json!({"to": "w1", "message": "are you there", "wait_s": 30}),
        )
        .await?
        .expect_err("a send to a worker on a gone herdr");
    assert_eq!(refused.code, "pane_host");
    assert!(refused.message.contains("not reachable"), "{refused}");
    // Refused at once, not after waiting out its 30 s (the bound is loose for a busy machine).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "failed slowly: {:?}",
        started.elapsed()
    );
    // Nothing held was lost.
    let held = lead.poll(0).await?;
    assert_eq!(held[0]["text"], "echo: kept");

    // herdr comes back (a fresh server: its old panes are gone): fleetd reattaches.
    herdr.launch().await?;
    until("w1's session to end with its pane", LIMIT, || async {
        let names = lead.names().await.ok()?;
        (!names.contains(&"w1".to_string())).then_some(())
    })
    .await?;
    lead.spawn("sim", "w2").await?;
    let sent = lead.send("w2", "after herdr came back", 20).await?;
    assert_eq!(
        sent["reply"]["text"],
        "echo: after herdr came back",
        "{sent}\n{}",
        fleet.log()
    );
    Ok(())
}

async fn a_worker_mid_task_on_herdr_survives_kill_9_of_fleetd(
    herdr: TestHerdr,
) -> anyhow::Result<()> {
    let (mut fleet, lead) = fleet_on(&herdr).await?;
    let spawned = lead.spawn("sim", "w1").await?;
    let gate = fleet.gate();
    let sent = lead.send("w1", &gate.task("over the restart"), 0).await?;
    fleet.injected(&sent).await?;
    lead.close().await?;

    fleet.kill9().await?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let entry = lead.entry("w1").await?;
    assert_eq!(
        (&entry["gid"], &entry["pane"], &entry["status"]),
        (&spawned["gid"], &spawned["pane"], &json!("busy")),
        "{entry}\n{}",
        fleet.log()
    );
    gate.open()?;
    let answers = lead.poll(20).await?;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["in_reply_to"], sent["msg_id"]);
    assert_eq!(answers[0]["text"], "echo: over the restart");
    let again = lead.send("w1", "after the restart", 20).await?;
    assert_eq!(again["reply"]["text"], "echo: after the restart", "{again}");
    assert_eq!(lead.poll(0).await?, Vec::<serde_json::Value>::new());
    Ok(())
}

async fn a_task_fleetd_died_typing_on_herdr_is_read_off_the_pane_as_taken(
    herdr: TestHerdr,
) -> anyhow::Result<()> {
    let (mut fleet, lead) = fleet_on(&herdr).await?;
    lead.spawn("sim", "w1").await?;
    let gate = fleet.gate();
    let sent = lead
        .send("w1", &gate.task("typed before the kill"), 0)
        .await?;
    fleet.injected(&sent).await?;
    lead.close().await?;
    fleet.kill9().await?;
    // The kill came between the submit and fleetd's record of it: only the pane can tell.
    fleet.as_if_killed_while_typing(sent["msg_id"].as_str().unwrap_or_default(), Keys::Entered)?;
    fleet.launch().await?;
    fleet.logged("verdict=Submitted").await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(lead.entry("w1").await?["status"], "busy");
    gate.open()?;
    let answers = lead.poll(20).await?;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["in_reply_to"], sent["msg_id"]);
    assert_eq!(answers[0]["text"], "echo: typed before the kill");
    assert_eq!(lead.poll(0).await?, Vec::<serde_json::Value>::new());
    Ok(())
}

/// Each case above, once on the stand-in and once on the real herdr `HERDR_BIN` names.
macro_rules! on_every_herdr {
    ($($case:ident),* $(,)?) => {
        mod standin {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    super::$case(super::TestHerdr::standin().await?).await
                }
            )*
        }
        mod real {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(not(herdr_bin), ignore = "needs a real herdr: set HERDR_BIN to its binary")]
                async fn $case() -> anyhow::Result<()> {
                    let herdr = super::RealHerdr::required().await?;
                    super::$case(super::TestHerdr::Real(herdr)).await
                }
            )*
        }
    };
}

on_every_herdr!(
    a_round_trip_through_herdr_with_fleetd_reporting_its_state,
    an_agent_herdr_sees_working_or_blocked_gets_no_task,
    herdr_gone_reads_unknown_fails_sends_fast_keeps_held_and_comes_back,
    a_worker_mid_task_on_herdr_survives_kill_9_of_fleetd,
    a_task_fleetd_died_typing_on_herdr_is_read_off_the_pane_as_taken,
);
