mod api;
mod architects;
mod asks;
mod auth;
mod badinput;
mod claude;
mod cli;
mod control;
mod coord;
mod dead;
mod delivery;
mod durability;
mod federation;
mod herdr;
mod hostile;
mod lifecycle;
mod metrics;
mod nudge;
mod opencode;
mod python;
mod sandbox;
mod service;
mod tls;
mod trust;

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::Fleet;
use fleet_testkit::wait::until;
use serde_json::json;

/// Spawns a worker of the profile `spy` (see `token_spy_profile`, writing its token into
/// `dir`) as `name`, and connects as that worker.
async fn as_worker(
    fleet: &Fleet,
    lead: &Client,
    dir: &tempfile::TempDir,
    name: &str,
) -> anyhow::Result<Client> {
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
    Client::connect(&fleet.url(), &token, Protocol::Stateless, &[]).await
}
