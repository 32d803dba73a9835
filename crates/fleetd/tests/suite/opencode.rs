//! Real opencode workers (the pinned npm release `./test.sh` installs), spawned by fleetd in
//! real tmux panes, in isolated homes; only the model is scripted (`fleet_testkit::model`).

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, agent_workdir, opencode_profile};
use fleet_testkit::model::ModelSim;

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
/// `OPENCODE_PERMISSION`, in the profile's env) stops on its permission prompt. The lead's send
/// hears `blocked`, with the prompt read off the screen and the one choice in fleetd's safe set
/// opencode takes there (`enter`: it confirms the option picked, "Allow once" as the prompt
/// opens); nothing has run yet. The lead's choice runs the command, and the same call goes on to
/// the worker's reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_opencode_permission_prompt_is_answered_by_its_lead() -> anyhow::Result<()> {
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
    let name = format!("proof-{}", fleet_core::MsgId::mint());
    let proof = std::path::Path::new(&agent_workdir()).join(&name);
    let task = format!("run: touch {name}");
    let blocked = lead.send("o1", &task, 90).await?;
    anyhow::ensure!(
        blocked["status"] == "blocked",
        "{blocked}\no1's screen:\n{}\nfleetd's log:\n{}",
        screen(),
        fleet.log()
    );
    let prompt = blocked["prompt"].as_str().unwrap_or_default();
    assert!(
        prompt.contains("Permission required") && prompt.contains(&format!("touch {name}")),
        "{prompt}"
    );
    assert_eq!(
        blocked["choices"],
        serde_json::json!([{"choice": "enter", "label": "confirm"}]),
        "{blocked}"
    );
    assert!(!proof.exists(), "the command ran before anyone chose");
    let answered = lead
        .ok(
            "fleet_send",
            serde_json::json!({"turn_id": blocked["turn_id"], "choice": "enter", "wait_s": 90}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}\n{}", screen());
    let reply = answered["reply"]["text"].as_str().unwrap_or_default();
    assert!(reply.starts_with(&format!("ran touch {name}")), "{reply}");
    assert!(
        proof.exists(),
        "the command did not run after the lead chose"
    );
    std::fs::remove_file(&proof)?;
    Ok(())
}
