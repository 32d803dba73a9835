//! The local plane's durability over a restart of fleetd: held replies survive `kill -9` and
//! are drained exactly once, and the workers the previous run left running are taken back —
//! their task in flight answered, their queue typed in, the same pane — unless their pane or
//! program is gone, or the fleet ran too long without its gateway. A task fleetd was typing
//! when it died is settled from what the pane shows: taken, pasted, never typed, or unknown.

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, Keys, sim_profile};
use fleet_testkit::wait::until;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

/// fleetd (with `[gateway]` lines `gateway`) with one scripted worker, `w1`; the lead and the
/// worker's pane.
async fn fleet_with_worker_and(gateway: &str) -> anyhow::Result<(Fleet, Client, String)> {
    let fleet = Fleet::start(gateway, &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let pane = lead.spawn("sim", "w1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok((fleet, lead, pane))
}

async fn fleet_with_worker() -> anyhow::Result<(Fleet, Client, String)> {
    fleet_with_worker_and("").await
}

/// The notice in `notices` that answers `sent`.
fn answer_to(notices: &[Value], sent: &Value) -> anyhow::Result<Value> {
    notices
        .iter()
        .find(|n| n["in_reply_to"] == sent["msg_id"])
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no answer to {sent}: {notices:?}"))
}

/// Polls `lead` until `count` messages came, then once more for any beyond them.
async fn poll_for(fleet: &Fleet, lead: &Client, count: usize) -> anyhow::Result<Vec<Value>> {
    let got = std::sync::Mutex::new(Vec::new());
    until("the answers to arrive", LIMIT, || async {
        let polled = lead.poll(1).await.ok()?;
        let mut got = got.lock().ok()?;
        got.extend(polled);
        (got.len() >= count).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {:?}\n{}", got.lock().map(|g| g.clone()), fleet.log()))?;
    let mut got = got.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    got.extend(lead.poll(0).await?);
    Ok(got)
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
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_mid_task_over_kill_9_is_taken_back_and_answers_its_task_and_its_queue()
-> anyhow::Result<()> {
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    let gate = fleet.gate();
    let in_flight = lead.send("w1", &gate.task("the first"), 0).await?;
    let queued = lead.send("w1", "behind it", 0).await?;
    assert_eq!(queued["state"], "queued");
    fleet.injected(&in_flight).await?;
    let before = lead.entry("w1").await?;
    lead.close().await?;

    fleet.kill9().await?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    // Taken back as it was: the same worker, in the same pane, still on its task.
    let after = lead.entry("w1").await?;
    for key in ["gid", "pane", "profile", "owner"] {
        assert_eq!(after[key], before[key], "{key}: {after} vs {before}");
    }
    assert_eq!(after["status"], "busy", "{after}");
    assert_eq!(fleet.panes()?, std::slice::from_ref(&pane));
    assert!(
        fleet.log().contains("took back a worker"),
        "{}",
        fleet.log()
    );

    gate.open()?;
    let answers = poll_for(&fleet, &lead, 2).await?;
    assert_eq!(answers.len(), 2, "each task answered once: {answers:?}");
    assert_eq!(answer_to(&answers, &in_flight)?["text"], "echo: the first");
    // The queued task stayed queued and was typed into the same pane once the first was done.
    assert_eq!(answer_to(&answers, &queued)?["text"], "echo: behind it");
    let screen = fleet.screen(&pane)?;
    assert_eq!(screen.matches("[replied]").count(), 2, "{screen}");
    let sent = lead.send("w1", "and after", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: and after");
    Ok(())
}

/// How many tasks the scripted agent in `pane` says it took (it shows `[task N: …]` for each).
fn tasks_taken(fleet: &Fleet, pane: &str) -> anyhow::Result<usize> {
    Ok(fleet.screen(pane)?.matches("[task ").count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_fleetd_died_typing_that_its_worker_took_is_answered_once() -> anyhow::Result<()> {
    // fleetd died after the submit and before it recorded it: the pane shows the agent took
    // the task, so it is the worker's task in flight, and its reply answers it.
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    let gate = fleet.gate();
    let typing = lead
        .send("w1", &gate.task("taken before the kill"), 0)
        .await?;
    fleet.injected(&typing).await?;
    lead.close().await?;
    fleet.kill9().await?;
    fleet
        .as_if_killed_while_typing(typing["msg_id"].as_str().unwrap_or_default(), Keys::Entered)?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(lead.entry("w1").await?["status"], "busy", "{}", fleet.log());
    gate.open()?;
    let answers = poll_for(&fleet, &lead, 1).await?;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(
        answer_to(&answers, &typing)?["text"],
        "echo: taken before the kill"
    );
    assert_eq!(tasks_taken(&fleet, &pane)?, 1, "typed once");
    assert!(fleet.log().contains("verdict=Submitted"), "{}", fleet.log());
    Ok(())
}

/// Kills fleetd with a task taken off the queue (`keys`: none of its keys in, or its paste
/// never arrived) behind one in flight and ahead of another: it goes back where it was.
async fn goes_back_to_the_head_of_its_queue(keys: Keys) -> anyhow::Result<()> {
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    let gate = fleet.gate();
    let first = lead.send("w1", &gate.task("the first"), 0).await?;
    fleet.injected(&first).await?;
    let typing = lead.send("w1", "the second", 0).await?;
    let behind = lead.send("w1", "the third", 0).await?;
    lead.close().await?;
    fleet.kill9().await?;
    fleet.as_if_killed_while_typing(typing["msg_id"].as_str().unwrap_or_default(), keys)?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    gate.open()?;
    let answers = poll_for(&fleet, &lead, 3).await?;
    assert_eq!(answers.len(), 3, "each answered once: {answers:?}");
    let texts: Vec<&str> = answers.iter().filter_map(|a| a["text"].as_str()).collect();
    assert_eq!(
        texts,
        ["echo: the first", "echo: the second", "echo: the third"],
        "in the order sent"
    );
    assert_eq!(answer_to(&answers, &typing)?["text"], "echo: the second");
    assert_eq!(answer_to(&answers, &behind)?["text"], "echo: the third");
    assert_eq!(tasks_taken(&fleet, &pane)?, 3, "each typed once");
    assert!(fleet.log().contains("verdict=NotTyped"), "{}", fleet.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_fleetd_died_before_typing_goes_back_to_the_head_of_its_queue() -> anyhow::Result<()>
{
    // fleetd notes a task's keys going in: without the note, none did.
    goes_back_to_the_head_of_its_queue(Keys::None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_paste_never_reached_the_pane_goes_back_to_the_head_of_its_queue()
-> anyhow::Result<()> {
    // Its keys were noted going in, not its Enter, and the pane shows nothing of it.
    goes_back_to_the_head_of_its_queue(Keys::Pasted).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_fleetd_died_pasting_gets_its_enter_after_the_restart() -> anyhow::Result<()> {
    // fleetd pasted the task and died before its Enter: the task sits in the agent's input
    // line, and the restart submits it.
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    let before = lead.send("w1", "/never", 0).await?;
    fleet.injected(&before).await?;
    let typing = lead.send("w1", "pasted, never entered", 0).await?;
    lead.close().await?;
    fleet.kill9().await?;
    // The first task was answered and the second pasted when fleetd died.
    fleet.as_if_answered(before["msg_id"].as_str().unwrap_or_default())?;
    fleet.as_if_killed_while_typing(typing["msg_id"].as_str().unwrap_or_default(), Keys::Pasted)?;
    fleet.paste(&pane, "pasted, never entered")?;
    until("the paste to show", LIMIT, || async {
        let screen = fleet.screen(&pane).ok()?;
        screen.contains("> pasted, never entered").then_some(())
    })
    .await?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let answers = poll_for(&fleet, &lead, 1).await?;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(
        answer_to(&answers, &typing)?["text"],
        "echo: pasted, never entered"
    );
    assert_eq!(tasks_taken(&fleet, &pane)?, 2, "the paste submitted once");
    assert!(fleet.log().contains("verdict=InInput"), "{}", fleet.log());
    let sent = lead.send("w1", "and after", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: and after");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_fleetd_died_typing_that_the_pane_cannot_tell_about_fails_and_is_not_retyped()
-> anyhow::Result<()> {
    // The worker's screen shows the same text from a task before: whether this one got in
    // cannot be told, so it fails to its sender with why (never typed twice), and the worker
    // takes the task behind it.
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    let before = lead.send("w1", "/never", 0).await?;
    fleet.injected(&before).await?;
    let typing = lead.send("w1", "/never", 0).await?;
    let queued = lead.send("w1", "behind it", 0).await?;
    lead.close().await?;
    fleet.kill9().await?;
    fleet.as_if_answered(before["msg_id"].as_str().unwrap_or_default())?;
    fleet
        .as_if_killed_while_typing(typing["msg_id"].as_str().unwrap_or_default(), Keys::Entered)?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let answers = poll_for(&fleet, &lead, 2).await?;
    assert_eq!(answers.len(), 2, "{answers:?}");
    let failed = answer_to(&answers, &typing)?;
    assert_eq!(failed["kind"], "FAILED", "{failed}");
    let reason = failed["text"].as_str().unwrap_or_default();
    for said in [
        "fleetd stopped while typing it",
        "could not tell whether it got in",
        "typed before into the same worker",
        "not typed again",
    ] {
        assert!(reason.contains(said), "{said}: {failed}");
    }
    assert_eq!(answer_to(&answers, &queued)?["text"], "echo: behind it");
    assert_eq!(
        tasks_taken(&fleet, &pane)?,
        2,
        "the failed task not typed again"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_the_previous_store_schema_takes_back_its_live_workers()
-> anyhow::Result<()> {
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    let gate = fleet.gate();
    let in_flight = lead.send("w1", &gate.task("over the upgrade"), 0).await?;
    fleet.injected(&in_flight).await?;
    let before = lead.entry("w1").await?;
    lead.close().await?;
    fleet.kill9().await?;
    // The store as the previous release (schema 8) left it: nothing recorded of the worker's
    // program, which runs on, started with the worker's gid as every release starts it.
    fleet.as_left_by_schema_8()?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let after = lead.entry("w1").await?;
    for key in ["gid", "pane", "owner"] {
        assert_eq!(after[key], before[key], "{key}: {after}\n{}", fleet.log());
    }
    assert_eq!(after["status"], "busy", "{after}");
    gate.open()?;
    let answers = poll_for(&fleet, &lead, 1).await?;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(
        answer_to(&answers, &in_flight)?["text"],
        "echo: over the upgrade"
    );
    let sent = lead.send("w1", "on the new schema", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: on the new schema");
    assert_eq!(fleet.panes()?, std::slice::from_ref(&pane));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_program_exited_or_was_replaced_is_ended_and_its_senders_told()
-> anyhow::Result<()> {
    let (mut fleet, lead, exits) = fleet_with_worker().await?;
    let replaced = lead.spawn("sim", "w2").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let tasks = [
        lead.send("w1", "/never", 0).await?,
        lead.send("w2", "/never", 0).await?,
    ];
    for task in &tasks {
        fleet.injected(task).await?;
    }
    let queued = lead.send("w2", "behind it", 0).await?;
    assert_eq!(queued["state"], "queued");
    lead.close().await?;
    fleet.kill9().await?;
    // While fleetd is down: w1's program dies; w2's pane gets another program (same pane id).
    fleet.kill_pane_program(&exits)?;
    let respawned = std::process::Command::new("tmux")
        .args([
            "-L",
            fleet.tmux_socket(),
            "respawn-pane",
            "-k",
            "-t",
            &replaced,
        ])
        .args(["sleep", "600"])
        .status()?;
    assert!(respawned.success());
    fleet.launch().await?;

    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let notices = poll_for(&fleet, &lead, 3).await?;
    assert_eq!(notices.len(), 3, "{notices:?}");
    let text = |sent: &Value| -> anyhow::Result<String> {
        let notice = answer_to(&notices, sent)?;
        assert_eq!(notice["kind"], "FAILED", "{notice}");
        Ok(notice["text"].as_str().unwrap_or_default().to_string())
    };
    let w1 = text(&tasks[0])?;
    assert!(
        w1.contains("'w1' never answered") && w1.contains("its program exited"),
        "{w1}"
    );
    let w2 = text(&tasks[1])?;
    assert!(w2.contains("another program"), "{w2}");
    let behind = text(&queued)?;
    assert!(
        behind.contains("'w2' is gone") && behind.contains("did not take it back"),
        "{behind}"
    );
    assert_eq!(lead.names().await?, ["lead"]);
    until("the old panes to be closed", LIMIT, || async {
        fleet.panes().ok().filter(|p| p.is_empty())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_left_without_its_gateway_past_adopt_within_s_is_ended_and_said_so()
-> anyhow::Result<()> {
    let (mut fleet, lead, _) = fleet_with_worker_and("adopt_within_s = 600").await?;
    let task = lead.send("w1", "/never", 0).await?;
    fleet.injected(&task).await?;
    // The store probe records fleetd alive every few seconds: once it has, fleetd goes away
    // for (as far as the store can tell) an hour.
    until("fleetd to be recorded alive", LIMIT, || async {
        fleet.last_alive_ms().ok().flatten()
    })
    .await?;
    lead.close().await?;
    fleet.kill9().await?;
    fleet.pretend_away(Duration::from_secs(3600))?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let notices = poll_for(&fleet, &lead, 1).await?;
    let said = answer_to(&notices, &task)?["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        said.contains("without a gateway, longer than [gateway] adopt_within_s = 600"),
        "{said}"
    );
    assert_eq!(lead.names().await?, ["lead"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_leaves_the_workers_running_unless_told_to_stop_them() -> anyhow::Result<()> {
    // By default a stop is a pause: the worker runs on, and the next start takes it back.
    let (mut fleet, lead, pane) = fleet_with_worker().await?;
    lead.close().await?;
    assert!(fleet.terminate().await?, "{}", fleet.log());
    assert_eq!(
        fleet.panes()?,
        std::slice::from_ref(&pane),
        "the worker's pane stays"
    );
    let program = fleet.pane_pid(&pane)?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let sent = lead.send("w1", "still there?", 20).await?;
    assert_eq!(
        sent["reply"]["text"],
        "echo: still there?",
        "{sent}\n{}",
        fleet.log()
    );
    assert_eq!(fleet.pane_pid(&pane)?, program, "the very same program");

    // `on_exit = "stop"`: fleetd's exit ends its workers.
    let (mut fleet, lead, _) = fleet_with_worker_and("on_exit = \"stop\"").await?;
    lead.close().await?;
    assert!(fleet.terminate().await?, "{}", fleet.log());
    assert_eq!(fleet.panes()?, Vec::<String>::new());
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(lead.names().await?, ["lead"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_touches_only_its_own_panes() -> anyhow::Result<()> {
    let (mut mine, lead, my_pane) = fleet_with_worker().await?;
    let (other, other_lead, other_pane) = fleet_with_worker().await?;
    mine.kill_pane_program(&my_pane)?;
    mine.kill9().await?;
    mine.launch().await?;
    let lead_again = mine.lead("lead", Protocol::Stateless).await?;
    until("my old worker to be ended", LIMIT, || async {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_spread_over_tmux_servers_are_taken_back_after_kill_9_and_stopped_with_them()
-> anyhow::Result<()> {
    // One pane a server: each worker on a tmux server of its own.
    let mut fleet = Fleet::start(
        "on_exit = \"stop\"",
        &format!("panes_per_server = 1\n{}", sim_profile("sim", &[])?),
    )
    .await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let mut panes = Vec::new();
    for name in ["w1", "w2", "w3"] {
        let pane = lead.spawn("sim", name).await?["pane"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        panes.push(pane);
    }
    assert!(panes[0].starts_with('%'), "{panes:?}");
    assert!(panes[1].starts_with("2:%"), "{panes:?}");
    assert!(panes[2].starts_with("3:%"), "{panes:?}");
    let socket = fleet.tmux_socket().to_string();
    let server = |k: usize| format!("{socket}@{k}");
    let running = |name: &str| {
        std::process::Command::new("tmux")
            .args(["-L", name, "list-sessions"])
            .output()
            .is_ok_and(|out| out.status.success())
    };
    assert!(running(&server(3)), "server 3 runs w3");
    for name in ["w1", "w2", "w3"] {
        let sent = lead.send(name, &format!("to {name}"), 20).await?;
        assert_eq!(sent["reply"]["text"], format!("echo: to {name}"));
    }
    lead.close().await?;

    // A restart finds each worker on its server and takes it back.
    fleet.kill9().await?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    for (name, pane) in ["w1", "w2", "w3"].iter().zip(&panes) {
        assert_eq!(lead.entry(name).await?["pane"], pane.as_str());
        let sent = lead.send(name, "after the restart", 20).await?;
        assert_eq!(sent["reply"]["text"], "echo: after the restart");
    }
    let mut listed = fleet.panes()?;
    listed.sort();
    let mut expected = panes.clone();
    expected.sort();
    assert_eq!(listed, expected);

    // Its stop ends the workers on every server, and the servers with them.
    lead.close().await?;
    assert!(fleet.terminate().await?, "{}", fleet.log());
    assert_eq!(fleet.panes()?, Vec::<String>::new());
    for k in [2, 3] {
        assert!(!running(&server(k)), "server {k} still runs");
    }
    Ok(())
}
