//! Real opencode workers (the pinned npm release `./test.sh` installs), spawned by fleetd in
//! real tmux panes, in isolated homes; only the model is scripted (`fleet_testkit::model`).

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, opencode_profile};
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
