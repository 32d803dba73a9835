//! The delegate → reply loop on one host: real fleetd, real tmux, the scripted agent in real
//! panes, the rmcp client as the lead.

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(20);

async fn fleet_with_sim(args: &[&str]) -> anyhow::Result<(Fleet, Client)> {
    let fleet = Fleet::start("", &sim_profile("sim", args)?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    Ok((fleet, lead))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_send_and_get_the_reply() -> anyhow::Result<()> {
    let (fleet, lead) = fleet_with_sim(&[]).await?;
    let spawned = lead.spawn("sim", "w1").await?;
    assert_eq!(spawned["name"], "w1");
    assert_eq!(spawned["status"], "idle");
    assert_eq!(spawned["host"], "testhost");
    let sent = lead.send("w1", "hello there", 30).await?;
    assert_eq!(sent["status"], "replied", "{sent}\n{}", fleet.log());
    assert_eq!(sent["reply"]["text"], "echo: hello there");
    assert_eq!(sent["reply"]["from_name"], "w1");
    assert_eq!(sent["reply"]["in_reply_to"], sent["msg_id"]);
    // The task was typed into the pane and submitted.
    let screen = fleet.screen(spawned["pane"].as_str().unwrap_or_default())?;
    assert!(screen.contains("[task 1: 11 bytes]"), "{screen}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_protocol_works_for_lead_and_worker() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &["--protocol", "session"])?).await?;
    let lead = fleet.lead("lead", Protocol::Session).await?;
    assert_eq!(lead.protocol_version().as_deref(), Some("2025-06-18"));
    lead.spawn("sim", "w1").await?;
    let sent = lead.send("w1", "over sessions", 30).await?;
    assert_eq!(sent["reply"]["text"], "echo: over sessions", "{sent}");
    let stateless = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(stateless.protocol_version().as_deref(), Some("2026-07-28"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_answer_in_parallel() -> anyhow::Result<()> {
    let (_fleet, lead) = fleet_with_sim(&[]).await?;
    lead.spawn("sim", "w1").await?;
    lead.spawn("sim", "w2").await?;
    let (a, b) = tokio::join!(
        lead.send("w1", "/slow 300 task for one", 30),
        lead.send("w2", "/slow 300 task for two", 30),
    );
    let (a, b) = (a?, b?);
    assert_eq!(a["reply"]["text"], "echo: task for one");
    assert_eq!(a["reply"]["from_name"], "w1");
    assert_eq!(b["reply"]["text"], "echo: task for two");
    assert_eq!(b["reply"]["from_name"], "w2");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_for_a_busy_worker_waits_queued_then_goes_in() -> anyhow::Result<()> {
    let (fleet, lead) = fleet_with_sim(&[]).await?;
    let pane = lead.spawn("sim", "w1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let first = lead.send("w1", "/slow 1500 first", 0).await?;
    assert_eq!(first["status"], "pending");
    let second = lead.send("w1", "second", 0).await?;
    assert_eq!(second["status"], "pending");
    assert_eq!(second["state"], "queued", "{second}");
    // Only one task is in the pane while the first is in flight.
    let screen = fleet.screen(&pane)?;
    assert!(!screen.contains("[task 2"), "{screen}");
    let mut texts = Vec::new();
    while texts.len() < 2 {
        let polled = lead.ok("fleet_poll", json!({"wait_s": 20})).await?;
        let messages = polled["messages"].as_array().cloned().unwrap_or_default();
        anyhow::ensure!(
            !messages.is_empty(),
            "no reply within the poll\n{}",
            fleet.log()
        );
        texts.extend(messages.iter().map(|m| m["text"].clone()));
    }
    assert_eq!(texts, vec![json!("echo: first"), json!("echo: second")]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranded_reply_is_collected_by_poll() -> anyhow::Result<()> {
    let (_fleet, lead) = fleet_with_sim(&[]).await?;
    lead.spawn("sim", "w1").await?;
    let sent = lead.send("w1", "/slow 1500 late answer", 1).await?;
    assert_eq!(sent["status"], "pending", "{sent}");
    assert!(
        sent["note"]
            .as_str()
            .unwrap_or_default()
            .contains("fleet_poll")
    );
    let polled = lead
        .ok("fleet_poll", json!({"from": "w1", "wait_s": 20}))
        .await?;
    let messages = polled["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(messages.len(), 1, "{polled}");
    assert_eq!(messages[0]["text"], "echo: late answer");
    assert_eq!(messages[0]["in_reply_to"], sent["msg_id"]);
    assert_eq!(messages[0]["kind"], "REPLY");
    // Handed out once.
    let again = lead.ok("fleet_poll", json!({})).await?;
    assert_eq!(again["messages"], json!([]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_multi_line_task_arrives_intact() -> anyhow::Result<()> {
    let (_fleet, lead) = fleet_with_sim(&[]).await?;
    lead.spawn("sim", "w1").await?;
    let mut task = String::from("Refactor the parser:\n\tstep one; keep tabs\n");
    for i in 0..40 {
        task.push_str(&format!(
            "line {i}: ünïcödé — quotes \"x\" and 'y' and $HOME;\n"
        ));
    }
    task.push_str("last line without newline;");
    assert!(task.len() > 1000);
    let sent = lead.send("w1", &task, 30).await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    assert_eq!(sent["reply"]["text"], format!("echo: {task}"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_blocked_in_poll_gets_its_task_through_the_call() -> anyhow::Result<()> {
    let (fleet, lead) = fleet_with_sim(&[]).await?;
    let pane = lead.spawn("sim", "w1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let first = lead.send("w1", "/poll 20", 20).await?;
    assert_eq!(first["reply"]["text"], "polling");
    until("the worker to be polling", LIMIT, || async {
        fleet.screen(&pane).ok().filter(|s| s.contains("[polling]"))
    })
    .await?;
    let second = lead.send("w1", "through the poll", 20).await?;
    assert_eq!(
        second["reply"]["text"], "echo: through the poll",
        "{second}"
    );
    // It came through the call, not the keyboard.
    let screen = fleet.screen(&pane)?;
    assert!(!screen.contains("[task 2"), "{screen}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_worker_fails_its_task_and_leaves_the_roster() -> anyhow::Result<()> {
    let (fleet, lead) = fleet_with_sim(&[]).await?;
    lead.spawn("sim", "w1").await?;
    let sent = lead.send("w1", "/crash", 30).await?;
    assert_eq!(sent["status"], "failed", "{sent}");
    let reason = sent["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("exited with status 3"),
        "{reason}\n{}",
        fleet.log()
    );
    let list = lead.ok("fleet_list", json!({})).await?;
    let names: Vec<&str> = list["entities"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, vec!["lead"]);
    until("the crashed pane to be closed", LIMIT, || async {
        fleet.panes().ok().filter(|p| p.is_empty())
    })
    .await?;
    let late = lead
        .call("fleet_send", json!({"to": "w1", "message": "anyone?"}))
        .await?
        .expect_err("a send to the crashed w1 was taken");
    assert_eq!(late.code, "unknown_recipient", "{late}");
    // It says the worker is gone and when, not only that the name is unknown.
    assert!(
        late.message.starts_with("'w1' is gone: it ended at "),
        "{late}"
    );
    // `fleetd msgs --state failed` lists the task, as the web view shows it: typed (or being
    // typed when the program died), then failed, with the reason its sender was told.
    let out = fleet.cli(&["msgs", "--json", "--state", "failed", "--kind", "SEND"])?;
    assert!(out.status.success(), "{out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let task = &listed[0];
    assert_eq!(task["msg_id"], sent["msg_id"], "{listed}");
    assert!(
        task["state"] == "failed" || task["state"] == "injected" && task["answer"] == "failed",
        "{listed}"
    );
    assert!(
        task["reason"]
            .as_str()
            .is_some_and(|r| r.contains("exited with status 3")),
        "{listed}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_never_takes_the_task_is_reported_not_submitted() -> anyhow::Result<()> {
    // Ready by its screen marker, but it reads nothing and shows nothing: Enter cannot submit.
    let profile = "[[profiles]]\nname = \"deaf\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"stty -echo -icanon; echo DEAF-READY; exec sleep 600\"]\nready_marker = \"DEAF-READY\"\nsubmit_verify_ms = 300\n";
    let fleet = Fleet::start("", profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("deaf", "d1").await?;
    let sent = lead.send("d1", "are you there", 30).await?;
    assert_eq!(sent["status"], "failed", "{sent}");
    assert_eq!(sent["reason"], "not submitted");
    // The worker is idle again and takes the next task (which fails the same way, not queued forever).
    let again = lead.send("d1", "still there?", 30).await?;
    assert_eq!(again["reason"], "not submitted");
    Ok(())
}

/// Sends `task` to w1 and expects its echo, with w1's screen and fleetd's log on failure.
async fn expect_echo(fleet: &Fleet, lead: &Client, pane: &str, task: &str) -> anyhow::Result<()> {
    let sent = lead.send("w1", task, 20).await?;
    anyhow::ensure!(
        sent["reply"]["text"] == format!("echo: {task}"),
        "{sent}\nw1's screen:\n{}\nfleetd's log:\n{}",
        fleet.screen(pane).unwrap_or_default(),
        fleet.log()
    );
    Ok(())
}

/// A worker running the scripted agent with `args` gets its first task and the next.
async fn first_two_tasks_go_in(args: &[&str]) -> anyhow::Result<()> {
    let (fleet, lead) = fleet_with_sim(args).await?;
    let pane = lead.spawn("sim", "w1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    expect_echo(&fleet, &lead, &pane, "the first task").await?;
    expect_echo(&fleet, &lead, &pane, "and the next").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_still_drawing_its_screen_gets_its_first_task() -> anyhow::Result<()> {
    // It calls in (ready), then draws for 1.5 s and drops whatever was typed meanwhile.
    first_two_tasks_go_in(&["--draw-after-ready-ms", "1500"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_screen_never_holds_still_still_gets_its_tasks() -> anyhow::Result<()> {
    // A clock redrawn every 50 ms: the screen never holds still, yet the task goes in.
    first_two_tasks_go_in(&["--clock-ms", "50"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_follows_a_task_by_its_trace_id_and_says_whose_call_it_was() -> anyhow::Result<()> {
    let (fleet, lead) = fleet_with_sim(&[]).await?;
    lead.spawn("sim", "w1").await?;
    let sent = lead.send("w1", "trace me", 30).await?;
    let trace = sent["reply"]["trace_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!trace.is_empty(), "{sent}");
    let needle = format!("trace_id={trace}");
    let lines = |log: &str, what: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains(&needle) && l.contains(what))
            .map(String::from)
            .collect()
    };
    // The send is accepted inside the lead's call; the task is typed in by w1's session; the
    // reply is accepted inside w1's call, in the same flow.
    until("the flow's lines in the log", LIMIT, || {
        let log = fleet.log();
        let found = !lines(&log, "injected").is_empty() && lines(&log, "accepted").len() >= 2;
        async move { found.then_some(()) }
    })
    .await?;
    let log = fleet.log();
    let accepted = lines(&log, "accepted");
    assert!(
        accepted
            .iter()
            .any(|l| l.contains("tool=fleet_send") && l.contains("caller=lead")),
        "{accepted:#?}"
    );
    assert!(
        accepted
            .iter()
            .any(|l| l.contains("tool=fleet_reply") && l.contains("caller=w1")),
        "{accepted:#?}"
    );
    let injected = lines(&log, "injected");
    assert!(
        injected
            .iter()
            .any(|l| l.contains("session{") && l.contains("name=w1")),
        "{injected:#?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_to_another_lead_here_is_held_until_it_polls_and_many_at_once_all_arrive()
-> anyhow::Result<()> {
    let fleet = Fleet::start("", "[leads.alice]\n[leads.bob]\n").await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let bob = fleet.lead("bob", Protocol::Stateless).await?;
    let sent = alice.send("bob", "first", 0).await?;
    assert_eq!(sent["status"], "pending", "{sent}");
    assert_eq!(sent["state"], "held", "{sent}");
    // Sent together, stored together: each send is answered, and each message comes once.
    let sends = (0..40).map(|i| {
        let alice = &alice;
        async move { alice.send("bob", &format!("m{i}"), 0).await }
    });
    for sent in futures_util::future::join_all(sends).await {
        let sent = sent?;
        assert_eq!(sent["state"], "held", "{sent}");
    }
    let mut texts = Vec::new();
    while texts.len() < 41 {
        let got = bob.poll(5).await?;
        anyhow::ensure!(!got.is_empty(), "bob got only {texts:?}");
        texts.extend(
            got.iter()
                .map(|m| m["text"].as_str().unwrap_or_default().to_string()),
        );
    }
    texts.sort();
    let mut expected: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    expected.push("first".into());
    expected.sort();
    assert_eq!(texts, expected);
    assert!(bob.poll(0).await?.is_empty(), "a message came twice");
    Ok(())
}
