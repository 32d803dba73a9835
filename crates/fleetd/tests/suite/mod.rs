mod api;
mod architects;
mod asks;
mod auth;
mod badinput;
mod boxed_agents;
mod claude;
mod cli;
mod cluster;
mod control;
mod coord;
mod dead;
mod delivery;
mod dialogs;
mod direct;
mod durability;
mod federation;
mod feed;
mod health;
mod herdr;
mod hostile;
mod init;
mod lifecycle;
mod listener;
mod logtext;
mod metrics;
mod nudge;
mod openapi;
mod opencode;
mod partition;
mod podman;
mod python;
mod restart;
mod sandbox;
mod service;
mod shape;
mod stall;
mod start_dialogs;
mod tenancy;
mod tls;
mod trust;
mod webview;
mod workspace;

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::Fleet;
use fleet_testkit::wait::until;
use serde_json::json;

/// The Python of the test virtualenv (`FLEET_TEST_PYTHON`, which `./test.sh` sets).
fn python() -> String {
    std::env::var("FLEET_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A task's states from the moment it was taken for typing: a task for an idle worker is
/// taken as it is accepted (its history starts at `injecting`), but one that comes while the
/// worker's pump is looking at its queue waits `queued` for that look to end first.
fn from_taken<S: AsRef<str>>(states: &[S]) -> Vec<&str> {
    let states: Vec<&str> = states.iter().map(AsRef::as_ref).collect();
    match states.split_first() {
        Some((&"queued", rest)) => rest.to_vec(),
        _ => states,
    }
}

/// Runs `tests/python/<script>` with `input` on its standard input; what it printed, and
/// whether it succeeded.
fn run_python(script: &str, input: &str) -> anyhow::Result<std::process::Output> {
    use std::io::Write;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut child = std::process::Command::new(python())
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin"))?
        .write_all(input.as_bytes())?;
    Ok(child.wait_with_output()?)
}

/// Spawns a worker of the profile `spy` (see `token_spy_profile`, writing its token into
/// `dir`) as `name`, and connects as that worker.
async fn as_worker(
    fleet: &Fleet,
    lead: &Client,
    dir: &tempfile::TempDir,
    name: &str,
) -> anyhow::Result<Client> {
    let token = worker_token(lead, dir, name).await?;
    Client::connect(&fleet.url(), &token, Protocol::Stateless, &[]).await
}

/// Spawns a worker of the profile `spy` (writing its token into `dir`) as `name`, and returns
/// its bearer token.
async fn worker_token(
    lead: &Client,
    dir: &tempfile::TempDir,
    name: &str,
) -> anyhow::Result<String> {
    lead.ok("fleet_spawn", json!({"profile": "spy", "name": name}))
        .await?;
    let token = until(
        "the worker to write its token",
        Duration::from_secs(20),
        || async {
            std::fs::read_to_string(dir.path().join("token"))
                .ok()
                .filter(|t| !t.is_empty())
        },
    )
    .await?;
    std::fs::remove_file(dir.path().join("token"))?;
    Ok(token)
}

/// A fleet with the scripted agent as profile `sim` and the token spy as `spy` (writing into
/// `dir`), its lead `lead`, and a `sim` worker `w1` spawned.
async fn fleet_with_w1_and_spy(dir: &tempfile::TempDir) -> anyhow::Result<(Fleet, Client)> {
    let config = format!(
        "{}{}",
        fleet_testkit::fleet::sim_profile("sim", &[])?,
        fleet_testkit::fleet::token_spy_profile("spy", &dir.path().join("token"))
    );
    let fleet = Fleet::start("", &config).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    Ok((fleet, lead))
}
