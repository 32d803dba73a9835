//! The delegate → reply loop on one host.

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_send_and_get_the_reply() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.ok("fleet_spawn", json!({"profile": "sim", "name": "w1"})).await?;
    assert_eq!(spawned["name"], "w1");
    assert_eq!(spawned["status"], "idle");
    let sent = lead
        .ok("fleet_send", json!({"to": "w1", "message": "hello there", "wait_s": 30}))
        .await?;
    assert_eq!(sent["status"], "replied", "{sent}\n{}", fleet.log());
    assert_eq!(sent["reply"]["text"], "echo: hello there");
    assert_eq!(sent["reply"]["from_name"], "w1");
    Ok(())
}

