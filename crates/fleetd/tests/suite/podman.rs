//! Sandboxed workers in a real container runtime: podman (installed by `./test.sh`), each
//! worker in a container whose root is a directory the test prepares (`podman run --rootfs`,
//! see [`fleet_testkit::podman`]), under the docker recipe of docs/workers.md run through podman's
//! docker-compatible command line. The scripted agent and a real Claude Code each do a round
//! trip through fleetd and look, from inside, at what the container must not show.

use fleet_testkit::bins::binary;
use fleet_testkit::fleet::{Fleet, claude_binary};
use fleet_testkit::model::ModelSim;
use fleet_testkit::podman::Podman;
use fleet_testkit::wait::until;

use super::boxed_agents::{Looks, UsersFleet, read_inside};

const LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Checks that `pane` runs podman.
fn runs_podman(fleet: &Fleet, pane: &str) -> anyhow::Result<()> {
    let command = std::fs::read_to_string(format!("/proc/{}/cmdline", fleet.pane_pid(pane)?))?;
    anyhow::ensure!(command.starts_with("podman\0"), "the pane runs {command:?}");
    Ok(())
}

/// Whether podman still has a container named `name`.
fn container_exists(name: &str) -> anyhow::Result<bool> {
    let output = std::process::Command::new("podman")
        .args(["ps", "-a", "--format", "{{.Names}}", "--filter"])
        .arg(format!("name=^{name}$"))
        .output()?;
    anyhow::ensure!(output.status.success(), "podman ps: {output:?}");
    Ok(!String::from_utf8_lossy(&output.stdout).trim().is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripted_agent_in_podman_round_trips_sees_only_its_own_and_is_torn_down()
-> anyhow::Result<()> {
    let podman = Podman::new()?;
    let workdir = tempfile::tempdir()?;
    let agent = binary("fleet-agent-sim")?.display().to_string();
    let profile = podman.profile("boxed", workdir.path(), &agent, None)?;
    let user = UsersFleet::start(&profile).await?;
    let (fleet, lead, settings) = (&user.fleet, &user.lead, &user.settings);
    let p1 = lead.spawn("boxed", "p1").await?;
    let p2 = lead.spawn("boxed", "p2").await?;
    runs_podman(fleet, p1["pane"].as_str().unwrap_or_default())?;
    let sent = lead.send("p1", "hello container", 30).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello container", "{sent}");

    // From inside: the lead's token, the user's settings and the other worker's files (its
    // env file holds its token) cannot be read; its own working directory can.
    let other = fleet
        .state_dir()
        .join("workers")
        .join(p2["gid"].as_str().unwrap_or_default())
        .join("sandbox.env");
    let token = fleet.state_dir().join("leads/lead.token");
    assert!(other.is_file() && token.is_file());
    for hidden in [&token, settings, &other] {
        let text = read_inside(lead, "p1", hidden).await?;
        assert!(
            text.starts_with(&format!("cannot read {}", hidden.display())),
            "{} is readable in the container: {text}",
            hidden.display()
        );
    }
    let note = workdir.path().join("note.txt");
    std::fs::write(&note, "visible")?;
    assert_eq!(read_inside(lead, "p1", &note).await?, "visible");

    // A stop tears the container down.
    let container = format!("fleet-{}", p1["gid"].as_str().unwrap_or_default());
    assert!(container_exists(&container)?, "no container {container}");
    lead.ok("fleet_stop", serde_json::json!({"to": "p1"}))
        .await?;
    until("the container to be removed", LIMIT, || async {
        matches!(container_exists(&container), Ok(false)).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_in_podman_answers_unattended_and_sees_nothing_it_should_not()
-> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let podman = Podman::new()?;
    let workdir = tempfile::tempdir()?;
    let profile = podman.profile(
        "boxed",
        workdir.path(),
        &claude_binary(),
        Some(("claude-code", &model.base_url())),
    )?;
    let user = UsersFleet::start(&profile).await?;
    let pane = user.spawn_in("boxed", "agent", "podman").await?;
    let looks = Looks {
        hidden: vec![
            user.fleet.state_dir().join("leads/lead.token"),
            user.settings.clone(),
            user.home.path().to_path_buf(),
        ],
        seen: vec![workdir.path().to_path_buf()],
    };
    user.round_trip_and_look("agent", &pane, &looks, workdir.path())
        .await
}
