//! Real opencode workers (the pinned npm release `./test.sh` installs), spawned by fleetd in
//! real tmux panes, in isolated homes; only the model is scripted (`fleet_testkit::model`).

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, agent_workdir, opencode_profile};
use fleet_testkit::model::ModelSim;
use serde_json::{Value, json};

use super::dialogs::keys;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_opencode_worker_answers_through_fleet_reply() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let fleet = Fleet::start("", &opencode_profile("oc", &model.base_url())).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("oc", "o1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let task = "first line of the task\n  second line, indented\nthird line";
    for text in [task, "and a second task"] {
        let sent = lead.send("o1", text, 90).await?;
        assert_eq!(
            sent["reply"]["text"],
            format!("echo: {text}"),
            "{sent}\no1's screen:\n{}\nfleetd's log:\n{}",
            fleet.screen(&pane).unwrap_or_default(),
            fleet.log()
        );
    }
    Ok(())
}

/// A real opencode worker whose permissions make it ask before a shell command (opencode's own
/// `OPENCODE_PERMISSION`, in the profile's env) stops on its permission prompt, a row of options
/// whose current one shows only in colour: fleetd reads it with its colours and offers each
/// option by name. Each does what it says, seen by the command's effect:
/// - `allow-once` runs the command, and the same call returns the reply;
/// - `allow-always` opens opencode's second step, offered as `confirm` / `cancel`; `confirm`
///   runs it, and the same command does not ask again;
/// - `reject` leaves the command unrun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_opencode_permission_prompt_is_answered_with_each_of_its_options()
-> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let profile = opencode_profile("oc", &model.base_url()).replace(
        "env = { ",
        "env = { OPENCODE_PERMISSION = '{\"bash\": \"ask\"}', ",
    );
    assert!(profile.contains("OPENCODE_PERMISSION"), "{profile}");
    let fleet = Fleet::start("", &profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("oc", "o1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let screen = || fleet.screen(&pane).unwrap_or_default();
    // In its working directory (a path outside it is asked about first, on a prompt of its own).
    let tag = fleet_core::MsgId::mint().to_string();
    let proof = |what: &str| std::path::Path::new(&agent_workdir()).join(format!("{what}-{tag}"));
    let blocked_on = |sent: &Value, offered: &[&str]| -> anyhow::Result<()> {
        anyhow::ensure!(
            sent["status"] == "blocked",
            "{sent}\no1's screen:\n{}\nfleetd's log:\n{}",
            screen(),
            fleet.log()
        );
        anyhow::ensure!(keys(sent) == offered, "{sent}");
        Ok(())
    };
    let choose = |sent: &Value, choice: &str, wait_s: u64| {
        lead.ok(
            "fleet_send",
            json!({"turn_id": sent["turn_id"], "choice": choice, "wait_s": wait_s}),
        )
    };
    let options = ["allow-once", "allow-always", "reject"];

    // Allow once.
    let once = proof("once");
    let sent = lead
        .send("o1", &format!("run: touch {}", once.display()), 90)
        .await?;
    blocked_on(&sent, &options)?;
    let prompt = sent["prompt"].as_str().unwrap_or_default();
    assert!(prompt.contains("Permission required"), "{prompt}");
    assert!(!once.exists(), "the command ran before anyone chose");
    let answered = choose(&sent, "allow-once", 90).await?;
    assert_eq!(answered["status"], "replied", "{answered}\n{}", screen());
    assert!(once.exists(), "allow-once did not run the command");

    // Allow always: its second step, then the same command again without asking.
    let always = proof("always");
    let sent = lead
        .send("o1", &format!("run: touch {}", always.display()), 90)
        .await?;
    blocked_on(&sent, &options)?;
    let step = choose(&sent, "allow-always", 90).await?;
    blocked_on(&step, &["confirm", "cancel"])?;
    assert!(
        step["prompt"]
            .as_str()
            .unwrap_or_default()
            .contains("Always allow"),
        "{step}"
    );
    assert!(!always.exists(), "the command ran before its second step");
    let answered = choose(&step, "confirm", 90).await?;
    assert_eq!(answered["status"], "replied", "{answered}\n{}", screen());
    assert!(always.exists(), "allow-always did not run the command");
    let again = proof("again");
    let sent = lead
        .send("o1", &format!("run: touch {}", again.display()), 90)
        .await?;
    assert_eq!(sent["status"], "replied", "{sent}\n{}", screen());
    assert!(again.exists(), "an always-allowed command did not run");

    // Reject (a command opencode has not been told to allow).
    let rejected = proof("rejected");
    let sent = lead
        .send("o1", &format!("run: mkdir {}", rejected.display()), 90)
        .await?;
    blocked_on(&sent, &options)?;
    let answered = choose(&sent, "reject", 3).await?;
    assert_ne!(answered["status"], "replied", "{answered}");
    assert!(!rejected.exists(), "reject ran the command");
    for path in [once, always, again] {
        std::fs::remove_file(path)?;
    }
    Ok(())
}

/// The `timeout` (ms) of fleetd's MCP server in the opencode config fleetd wrote under
/// `dir`: how long opencode lets a fleet call go without a word from fleetd.
pub(super) fn call_silence(dir: &std::path::Path) -> anyhow::Result<std::time::Duration> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let found = if path.is_dir() {
            call_silence(&path).ok()
        } else if path.file_name().is_some_and(|n| n == "opencode.json") {
            let config: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
            config["mcp"]["fleet"]["timeout"]
                .as_u64()
                .map(std::time::Duration::from_millis)
        } else {
            None
        };
        if let Some(silence) = found {
            return Ok(silence);
        }
    }
    anyhow::bail!(
        "no opencode.json with a fleet timeout under {}",
        dir.display()
    )
}

/// opencode gives up a fleet call that goes quiet for its `timeout` (so one cut by fleetd's
/// death ends: see the restart suite); a call that waits longer than that for its answer hears
/// fleetd's progress meanwhile, and gets the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_opencode_workers_ask_waits_past_its_timeout_while_fleetd_says_it_still_waits()
-> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let fleet = Fleet::start("", &opencode_profile("oc", &model.base_url())).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("oc", "o1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let silence = call_silence(fleet.state_dir())?;
    anyhow::ensure!(
        silence <= std::time::Duration::from_secs(60),
        "opencode gives a silent fleet call {silence:?}"
    );
    let sent = lead.send("o1", "ask: which branch?", 90).await?;
    anyhow::ensure!(
        sent["status"] == "asked",
        "{sent}\no1's screen:\n{}",
        fleet.screen(&pane).unwrap_or_default()
    );
    // The subject: the ask waits past the time opencode gives a silent call.
    tokio::time::sleep(silence + std::time::Duration::from_secs(10)).await;
    let answered = lead
        .ok(
            "fleet_send",
            json!({"turn_id": sent["ask"]["turn_id"], "message": "main", "wait_s": 90}),
        )
        .await?;
    let reply = answered["reply"]["text"].as_str().unwrap_or_default();
    assert!(
        reply.starts_with("asked which branch?, heard: ") && reply.contains("\"answer\":\"main\""),
        "{answered}\no1's screen:\n{}\nfleetd's log:\n{}",
        fleet.screen(&pane).unwrap_or_default(),
        fleet.log()
    );
    Ok(())
}
