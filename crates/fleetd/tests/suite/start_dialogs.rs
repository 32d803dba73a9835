//! Dialogs a worker's program shows while it starts, before it calls in (a first-run notice
//! fleetd did not settle): the scripted agent's `--start-dialog QUESTION` shows `QUESTION (y/n)`
//! and waits for `y` (it goes on starting) or `n` (it exits); its profile names `(y/n)` as a
//! sign of a dialog. The spawn returns `blocked` with the dialog, the owner's answer starts the
//! worker, here and on another host. (Claude Code's own start dialogs are in `claude.rs`.)

use std::time::Duration;

use fleet_testkit::broker::Broker;
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::hosts::TwoHosts;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::dialogs::keys;
use super::federation::{hears_host, sees};

const LIMIT: Duration = Duration::from_secs(20);

/// The scripted agent as profile `asks`, showing each of `questions` while it starts.
fn asking_profile(questions: &[&str]) -> anyhow::Result<String> {
    let mut args = Vec::new();
    for question in questions {
        args.extend(["--start-dialog", question]);
    }
    Ok(format!(
        "{}blocked_markers = [\"(y/n)\"]\n",
        sim_profile("asks", &args)?
    ))
}

/// Spawns `asks` as `name` (on `host`, when given), which must come back blocked on the dialog
/// `question`: the spawn's answer.
async fn spawn_blocked(
    lead: &Client,
    name: &str,
    host: Option<&str>,
    question: &str,
) -> anyhow::Result<Value> {
    let mut args = json!({"profile": "asks", "name": name});
    if let Some(host) = host {
        args["host"] = json!(host);
    }
    let spawned = lead.ok("fleet_spawn", args).await?;
    assert_eq!(spawned["status"], "blocked", "{spawned}");
    let dialog = &spawned["dialog"];
    assert!(
        dialog["prompt"]
            .as_str()
            .is_some_and(|p| p.contains(&format!("{question} (y/n)"))),
        "{spawned}"
    );
    assert_eq!(keys(dialog), ["y", "n"], "{spawned}");
    // Named as the lead's host knows it (`wb@hostb` until its roster has heard of it).
    let from = dialog["from_name"].as_str().unwrap_or_default();
    assert!(
        from == name || host.is_some_and(|h| from == format!("{name}@{h}")),
        "{spawned}"
    );
    assert!(
        dialog["in_task"].is_null(),
        "no task is in flight: {spawned}"
    );
    assert!(
        spawned["note"]
            .as_str()
            .is_some_and(|n| n.contains("fleet_send")),
        "{spawned}"
    );
    Ok(spawned)
}

/// Answers the dialog of `spawned` (or a send's answer) with `choice`.
async fn answer(lead: &Client, blocked: &Value, choice: &str) -> anyhow::Result<Value> {
    let turn = match blocked["dialog"]["turn_id"].as_str() {
        Some(turn) => turn.to_string(),
        None => blocked["turn_id"].as_str().unwrap_or_default().to_string(),
    };
    lead.ok(
        "fleet_send",
        json!({"turn_id": turn, "choice": choice, "wait_s": 20}),
    )
    .await
}

/// Waits until `name`'s status in `lead`'s `fleet_list` is `status`.
async fn until_status(lead: &Client, name: &str, status: &str) -> anyhow::Result<()> {
    until(&format!("{name} to be {status}"), LIMIT, || async {
        (lead.entry(name).await.ok()?["status"] == status).then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialog_at_the_start_is_asked_on_the_spawn_and_its_owners_answer_starts_the_worker()
-> anyhow::Result<()> {
    let profiles = format!(
        "[leads.lead]\n[leads.bob]\n{}",
        asking_profile(&["Trust this folder?"])?
    );
    let fleet = Fleet::start("", &profiles).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let bob = fleet.lead("bob", Protocol::Stateless).await?;
    let spawned = spawn_blocked(&lead, "w1", None, "Trust this folder?").await?;
    let turn = spawned["dialog"]["turn_id"].clone();

    // The owner sees it in the list; another lead neither sees it nor may answer it.
    let listed = lead.entry("w1").await?;
    assert_eq!(listed["status"], "blocked", "{listed}");
    assert_eq!(listed["dialog"]["turn_id"], turn, "{listed}");
    let bobs = bob.ok("fleet_list", json!({})).await?;
    assert!(!bobs.to_string().contains("Trust this folder"), "{bobs}");
    let refused = bob
        .call("fleet_send", json!({"turn_id": turn, "choice": "y"}))
        .await?
        .expect_err("another lead's answer");
    assert_eq!(refused.code, "forbidden", "{refused}");

    // A task sent meanwhile waits: it is not typed into the dialog (its `n` would answer it).
    let queued = lead.send("w1", "only then, not now", 0).await?;
    assert_eq!(queued["status"], "pending", "{queued}");

    let answered = answer(&lead, &spawned, "y").await?;
    assert_eq!(
        answered["status"],
        "answered",
        "{answered}\n{}",
        fleet.log()
    );
    assert!(
        answered["note"]
            .as_str()
            .is_some_and(|n| n.contains("ready for tasks")),
        "{answered}"
    );
    // Ready, it takes the task that waited.
    let replies = lead.poll(20).await?;
    assert_eq!(
        replies[0]["text"], "echo: only then, not now",
        "{replies:?}"
    );
    let sent = lead.send("w1", "and a round trip", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: and a round trip", "{sent}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dialog_of_a_start_is_asked_in_turn_and_a_choice_that_ends_the_program_ends_the_worker()
-> anyhow::Result<()> {
    let fleet = Fleet::start(
        "",
        &asking_profile(&["Trust this folder?", "Run unattended?"])?,
    )
    .await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = spawn_blocked(&lead, "w1", None, "Trust this folder?").await?;
    // The first answered, the answer comes back with the next one.
    let next = answer(&lead, &spawned, "y").await?;
    assert_eq!(next["status"], "blocked", "{next}\n{}", fleet.log());
    assert!(
        next.get("msg_id").is_none(),
        "no message of the lead's: {next}"
    );
    assert!(
        next["prompt"]
            .as_str()
            .is_some_and(|p| p.contains("Run unattended? (y/n)")),
        "{next}"
    );
    assert_ne!(next["turn_id"], spawned["dialog"]["turn_id"]);
    // `n` makes the program exit: the worker ends, and the answer says so.
    let ended = lead
        .call(
            "fleet_send",
            json!({"turn_id": next["turn_id"], "choice": "n", "wait_s": 20}),
        )
        .await?
        .expect_err("a worker whose program exited");
    assert_eq!(ended.code, "not_ready", "{ended}");
    assert!(
        ended.message.contains("ended before it was ready") && ended.message.contains("declined"),
        "{ended}"
    );
    until("its pane to close", LIMIT, || async {
        fleet.panes().ok().filter(|panes| panes.is_empty())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_dialog_answered_in_the_pane_is_over_for_the_lead_and_a_stop_ends_one_unanswered()
-> anyhow::Result<()> {
    let fleet = Fleet::start("", &asking_profile(&["Trust this folder?"])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = spawn_blocked(&lead, "w1", None, "Trust this folder?").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    // A human answers in the pane: the worker starts, and the lead's answer comes too late.
    let pressed = std::process::Command::new("tmux")
        .args(["-L", fleet.tmux_socket(), "send-keys", "-t", &pane, "y"])
        .status()?;
    assert!(pressed.success());
    until_status(&lead, "w1", "idle").await?;
    let late = lead
        .call(
            "fleet_send",
            json!({"turn_id": spawned["dialog"]["turn_id"], "choice": "y"}),
        )
        .await?
        .expect_err("an answer to a dialog that is gone");
    assert_eq!(late.code, "too_late", "{late}");
    let sent = lead.send("w1", "hello", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello", "{sent}");

    // One nobody answers waits; a stop ends it, and its dialog with it.
    let waiting = spawn_blocked(&lead, "w2", None, "Trust this folder?").await?;
    lead.ok("fleet_stop", json!({"to": "w2"})).await?;
    let over = lead
        .call(
            "fleet_send",
            json!({"turn_id": waiting["dialog"]["turn_id"], "choice": "y"}),
        )
        .await?
        .expect_err("an answer to a stopped worker's dialog");
    assert_eq!(over.code, "too_late", "{over}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_dialog_on_another_host_is_asked_of_the_lead_and_answered_through_the_broker()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost: _vhost,
        a: _a,
        b,
        alice,
        ..
    } = TwoHosts::each(
        &Broker::find().await?,
        "",
        &asking_profile(&["Trust this folder?"])?,
    )
    .await?;
    hears_host(&alice, "hostb").await?;
    let spawned = spawn_blocked(&alice, "wb", Some("hostb"), "Trust this folder?").await?;
    assert_eq!(spawned["host"], "hostb");
    assert_eq!(spawned["dialog"]["host"], "hostb", "{spawned}");
    sees(&alice, "wb").await?;
    let answered = answer(&alice, &spawned, "y").await?;
    assert_eq!(answered["status"], "answered", "{answered}\n{}", b.log());
    // Pressed on hostb, whose worker goes on starting there: the answer says where to look.
    assert!(
        answered["note"]
            .as_str()
            .is_some_and(|n| n.contains("host 'hostb' presses it")),
        "{answered}"
    );
    until_status(&alice, "wb", "idle").await?;
    let sent = alice.send("wb", "across hosts", 20).await?;
    assert_eq!(
        sent["reply"]["text"],
        "echo: across hosts",
        "{sent}\n{}",
        b.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_architect_blocked_at_its_start_is_reported_by_the_consult_and_answers_once_answered()
-> anyhow::Result<()> {
    let config = format!(
        "{}[architects]\nslots = [{{ name = \"arch-a\", profile = \"asks\", keep_s = 600 }}]\n",
        asking_profile(&["Trust this folder?"])?
    );
    let fleet = Fleet::start("", &config).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    // The consult does not wait out its wait_s for an architect that cannot read its brief.
    let consult = lead
        .ok(
            "fleet_consult",
            json!({"brief": "Assess the plan", "wait_s": 600}),
        )
        .await?;
    let slot = &consult["answers"][0];
    assert_eq!(slot["status"], "blocked", "{consult}\n{}", fleet.log());
    let text = slot["text"].as_str().unwrap_or_default();
    assert!(text.contains("Trust this folder? (y/n)"), "{consult}");
    let turn = text
        .split('"')
        .find(|part| part.starts_with("dialog-"))
        .unwrap_or_default();
    let answered = lead
        .ok(
            "fleet_send",
            json!({"turn_id": turn, "choice": "y", "wait_s": 20}),
        )
        .await?;
    assert_eq!(answered["status"], "answered", "{answered}");
    // Ready, the architect reads the brief that waited for it; its answer is held.
    let held = lead.poll(20).await?;
    assert_eq!(held[0]["text"], "echo: Assess the plan", "{held:?}");
    Ok(())
}
