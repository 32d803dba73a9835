//! Spawn's readiness gate, stop, and cancellation of long calls.

use std::time::Duration;

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_calls_in_is_not_ready_and_its_pane_is_closed() -> anyhow::Result<()> {
    let profile = sim_profile("mute", &["--mode", "no-mcp"])?
        .replace("ready_timeout_s = 20", "ready_timeout_s = 1");
    let fleet = Fleet::start("", &profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let err = lead
        .call("fleet_spawn", json!({"profile": "mute", "name": "m1"}))
        .await?
        .expect_err("a mute worker became ready");
    assert_eq!(err.code, "not_ready");
    assert!(err.message.contains("did not call in within 1 s"), "{err}");
    assert!(
        err.message.contains("sim m1 ready"),
        "the error quotes its screen: {err}"
    );
    until("the pane to be closed", LIMIT, || async {
        fleet.panes().ok().filter(|p| p.is_empty())
    })
    .await?;
    assert_eq!(lead.names().await?, vec!["lead"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_program_dies_at_start_is_not_ready_at_once() -> anyhow::Result<()> {
    let profile = "[[profiles]]\nname = \"broken\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo cannot start: missing thing; sleep 0.2; exit 7\"]\nready_timeout_s = 20\n";
    let fleet = Fleet::start("", profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let err = lead
        .call("fleet_spawn", json!({"profile": "broken"}))
        .await?
        .expect_err("a dead worker became ready");
    assert_eq!(err.code, "not_ready");
    assert!(err.message.contains("ended before it was ready"), "{err}");
    assert!(err.message.contains("cannot start: missing thing"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_closes_the_pane_and_fails_what_was_on_its_way() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    lead.spawn("sim", "w2").await?;
    lead.send("w1", "/never", 0).await?;
    let queued = lead.send("w1", "never typed", 0).await?;
    let stopped = lead.ok("fleet_stop", json!({"to": "w1"})).await?;
    assert_eq!(stopped["status"], "gone");
    assert_eq!(lead.names().await?, vec!["lead", "w2"]);
    assert_eq!(fleet.panes()?.len(), 1);
    let polled = lead.ok("fleet_poll", json!({})).await?;
    let notices = polled["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        notices.len(),
        2,
        "the task in flight and the queued one: {polled}"
    );
    assert!(notices.iter().all(|n| n["kind"] == "FAILED"));
    assert!(notices.iter().any(|n| n["in_reply_to"] == queued["msg_id"]));
    assert!(notices.iter().all(|n| {
        n["text"]
            .as_str()
            .unwrap_or_default()
            .contains("stopped by lead")
    }));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_spawn_leaves_no_pane_behind() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("mute", &["--mode", "no-mcp"])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let gave_up = lead
        .call_within(
            "fleet_spawn",
            json!({"profile": "mute", "name": "m1"}),
            Duration::from_millis(500),
        )
        .await?;
    assert!(gave_up.is_none(), "the spawn returned: {gave_up:?}");
    until("the cancelled spawn's pane to close", LIMIT, || async {
        fleet.panes().ok().filter(|p| p.is_empty())
    })
    .await?;
    assert_eq!(lead.names().await?, vec!["lead"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_poll_takes_nothing_with_it() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    let gave_up = lead
        .call_within(
            "fleet_poll",
            json!({"wait_s": 60}),
            Duration::from_millis(300),
        )
        .await?;
    assert!(gave_up.is_none());
    lead.send("w1", "after the cancel", 0).await?;
    let polled = lead.ok("fleet_poll", json!({"wait_s": 20})).await?;
    assert_eq!(polled["messages"][0]["text"], "echo: after the cancel");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_spawns_without_names_get_distinct_names() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawn = || lead.ok("fleet_spawn", json!({"profile": "sim"}));
    let (a, b, c, d) = tokio::join!(spawn(), spawn(), spawn(), spawn());
    let mut names: Vec<String> = [a?, b?, c?, d?]
        .iter()
        .map(|s| s["name"].as_str().unwrap_or_default().to_string())
        .collect();
    names.sort();
    assert_eq!(names, vec!["sim-1", "sim-2", "sim-3", "sim-4"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_on_exit_stop_drains_and_leaves_nothing_running() -> anyhow::Result<()> {
    let mut fleet = Fleet::start("on_exit = \"stop\"", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    let in_flight = lead.send("w1", "/never", 0).await?;
    lead.close().await?;
    assert!(fleet.terminate().await?, "unclean exit:\n{}", fleet.log());
    // Its private tmux server, and every worker in it, is gone.
    let server = std::process::Command::new("tmux")
        .args(["-L", fleet.tmux_socket(), "list-sessions"])
        .output()?;
    assert!(!server.status.success(), "tmux server still running");
    // The task in flight was failed, and its sender is told after the restart.
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let notices = lead.poll(0).await?;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["in_reply_to"], in_flight["msg_id"]);
    assert!(
        notices[0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("fleetd stopped")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_is_reaped_after_its_idle_ttl_but_a_busy_one_is_not() -> anyhow::Result<()> {
    let profile = format!("{}idle_ttl_s = 1\n", sim_profile("sim", &[])?);
    let fleet = Fleet::start("", &profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    // Busy for longer than its idle_ttl: still there to answer.
    let sent = lead.send("w1", "/slow 2500 long task", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: long task");
    // Idle: reaped, its pane closed.
    until("the idle worker to be reaped", LIMIT, || async {
        let names = lead.names().await.ok()?;
        (!names.contains(&"w1".to_string())).then_some(())
    })
    .await?;
    until("its pane to be closed", LIMIT, || async {
        fleet.panes().ok().filter(|p| p.is_empty())
    })
    .await?;
    fleet.logged("idle_ttl_s").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_at_its_context_cap_gets_a_fresh_session_under_its_name() -> anyhow::Result<()> {
    let profile = format!("{}context_cap = 2\n", sim_profile("sim", &[])?);
    let fleet = Fleet::start("", &profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let first = lead.spawn("sim", "w1").await?;
    for task in ["one", "two"] {
        let sent = lead.send("w1", task, 20).await?;
        assert_eq!(sent["reply"]["text"], format!("echo: {task}"));
    }
    // Sent while the worker is recycled: they wait for the fresh session.
    let three = lead.send("w1", "three", 0).await?;
    let four = lead.send("w1", "four", 0).await?;
    assert_eq!(three["status"], "pending");
    assert_eq!(four["status"], "pending");
    let deadline = std::time::Instant::now() + LIMIT;
    let mut texts = Vec::new();
    while texts.len() < 2 && std::time::Instant::now() < deadline {
        for message in lead.poll(5).await? {
            texts.push(message["text"].as_str().unwrap_or_default().to_string());
        }
    }
    texts.sort();
    assert_eq!(texts, ["echo: four", "echo: three"], "{}", fleet.log());
    let entry = lead.entry("w1").await?;
    assert_eq!(entry["gid"], first["gid"], "same worker");
    assert_ne!(
        entry["pane"], first["pane"],
        "a fresh session in a new pane"
    );
    let pane = entry["pane"].as_str().unwrap_or_default().to_string();
    until("the old pane closed, the new one alone", LIMIT, || async {
        fleet
            .panes()
            .ok()
            .filter(|panes| panes == std::slice::from_ref(&pane))
    })
    .await?;
    let screen = fleet.screen(&pane)?;
    assert!(
        !screen.contains("echo: one") && !screen.contains("one\n"),
        "the fresh session saw the old tasks:\n{screen}"
    );
    Ok(())
}

/// In a big fleet a lead asks for fewer: `fleet_list` keeps only the entities of a group, a
/// status or a host, every filter given at once; a status no entity can have is refused with
/// the ones it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_lists_only_a_group_a_status_or_a_host() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.ok(
        "fleet_spawn",
        json!({"profile": "sim", "name": "w1", "groups": ["core"]}),
    )
    .await?;
    lead.ok(
        "fleet_spawn",
        json!({"profile": "sim", "name": "w2", "groups": ["ui"]}),
    )
    .await?;
    lead.send("w2", "/never", 0).await?;
    until("w2 to read busy", Duration::from_secs(10), || async {
        let busy = lead
            .ok("fleet_list", json!({"status": "busy"}))
            .await
            .ok()?;
        (names(&busy) == ["w2"]).then_some(())
    })
    .await?;
    let listed = |args| {
        let lead = &lead;
        async move { anyhow::Ok(names(&lead.ok("fleet_list", args).await?)) }
    };
    assert_eq!(listed(json!({})).await?, ["lead", "w1", "w2"]);
    assert_eq!(listed(json!({"group": "core"})).await?, ["w1"]);
    assert_eq!(listed(json!({"status": "idle"})).await?, ["lead", "w1"]);
    assert_eq!(
        listed(json!({"group": "ui", "status": "idle"})).await?,
        Vec::<String>::new()
    );
    assert_eq!(
        listed(json!({"host": "testhost", "group": "ui"})).await?,
        ["w2"]
    );
    assert_eq!(
        listed(json!({"host": "elsewhere"})).await?,
        Vec::<String>::new()
    );
    // A hostile filter is only compared: nothing matches, nothing is refused or echoed.
    let hostile = format!("\u{1b}[2J\n{}", "x".repeat(100_000));
    assert_eq!(
        listed(json!({"group": hostile, "host": hostile})).await?,
        Vec::<String>::new()
    );
    let wrong_type = lead.call("fleet_list", json!({"status": 5})).await;
    assert!(
        !matches!(wrong_type, Ok(Ok(_))),
        "a status that is not text is refused: {wrong_type:?}"
    );
    let you = lead.ok("fleet_list", json!({"group": "none"})).await?;
    assert_eq!(
        you["you"]["name"], "lead",
        "the caller is named whatever it filters"
    );
    let refused = lead
        .call("fleet_list", json!({"status": "idel"}))
        .await?
        .expect_err("a status no entry has is refused");
    assert_eq!(refused.code, "invalid_params");
    assert!(
        refused.message.contains("idle, busy"),
        "{}",
        refused.message
    );
    Ok(())
}

/// The names of a `fleet_list` answer's entities, sorted.
fn names(list: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = list["entities"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// A send to a worker that was stopped says it is gone and when; its owner is told by whom too,
/// and that fleet_spawn starts another — by lead or by operator, and still after a restart.
/// Another lead hears when, not why; a name that never was is unknown as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_a_stopped_worker_says_when_and_by_whom() -> anyhow::Result<()> {
    let config = format!(
        "[leads.alice]\n[leads.bob]\n[operators.ops]\n{}",
        sim_profile("sim", &[])?
    );
    let mut fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let bob = fleet.lead("bob", Protocol::Stateless).await?;
    alice.spawn("sim", "w1").await?;
    alice.spawn("sim", "w2").await?;
    alice.ok("fleet_stop", json!({"to": "w1"})).await?;
    let out = fleet.cli(&["token", "ops"])?;
    assert!(out.status.success(), "{out:?}");
    let out = fleet.cli(&["stop", "--operator", "ops", "w2"])?;
    assert!(out.status.success(), "{out:?}");
    let refused = |lead: &'static str, to: &'static str| {
        let lead = if lead == "alice" { &alice } else { &bob };
        async move {
            lead.call("fleet_send", json!({"to": to, "message": "anyone?"}))
                .await?
                .err()
                .ok_or_else(|| anyhow::anyhow!("a send to {to} was taken"))
        }
    };
    let err = refused("alice", "w1").await?;
    assert_eq!(err.code, "unknown_recipient", "{err}");
    let said = "(stopped by lead 'alice'); fleet_spawn starts a new worker; live now: alice, bob (see fleet_list)";
    assert!(
        err.message.starts_with("'w1' is gone: it ended at ")
            && (err.message.ends_with(&format!(" ago {said}"))
                || err.message.ends_with(&format!(" just now {said}"))),
        "{err}"
    );
    let err = refused("alice", "w2").await?;
    assert!(err.message.contains("(stopped by operator 'ops')"), "{err}");
    // Not its owner: when, not why.
    let err = refused("bob", "w1").await?;
    assert!(
        err.message.starts_with("'w1' is gone: it ended at ")
            && !err.message.contains("stopped by"),
        "{err}"
    );
    // Stopping it again says the same.
    let again = alice
        .call("fleet_stop", json!({"to": "w1"}))
        .await?
        .expect_err("a gone worker was stopped");
    assert!(
        again.message.contains("(stopped by lead 'alice')"),
        "{again}"
    );
    // A name nobody ever had is unknown, as before.
    let never = refused("alice", "w9").await?;
    assert!(
        never
            .message
            .starts_with("no entity is named or has the id 'w9'"),
        "{never}"
    );
    alice.close().await?;
    bob.close().await?;
    // The store keeps it: after a restart the send is told the same.
    assert!(fleet.terminate().await?);
    fleet.launch().await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let err = alice
        .call("fleet_send", json!({"to": "w1", "message": "anyone?"}))
        .await?
        .expect_err("a send to w1 was taken after the restart");
    assert!(err.message.contains("(stopped by lead 'alice')"), "{err}");
    // A new worker of the name is live again.
    alice.spawn("sim", "w1").await?;
    alice
        .ok(
            "fleet_send",
            json!({"to": "w1", "message": "hello", "wait_s": 0}),
        )
        .await?;
    Ok(())
}
