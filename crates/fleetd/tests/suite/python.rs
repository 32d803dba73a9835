//! A second, independent MCP client: the Python `mcp` SDK (installed by `./test.sh`, found via
//! `FLEET_TEST_PYTHON`), as a lead over both protocols, with progress notifications.

use std::path::Path;
use std::process::Command;

use fleet_testkit::fleet::{Fleet, sim_profile};
use serde_json::Value;

async fn drive(mode: &str, expected_protocol: &str) -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/lead.py");
    let worker = format!("py-{mode}");
    let (url, token) = (fleet.url(), fleet.token("lead")?);
    let out = tokio::task::spawn_blocking({
        let worker = worker.clone();
        let mode = mode.to_string();
        move || {
            Command::new(super::python())
                .arg(script)
                .args([&url, &token, &mode, &worker])
                .output()
        }
    })
    .await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.success(),
        "the Python lead failed (is the mcp SDK installed? ./test.sh installs it):\n{stderr}\n{}",
        fleet.log()
    );
    let seen: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(seen["protocol"], expected_protocol, "{seen}");
    for tool in [
        "fleet_list",
        "fleet_poll",
        "fleet_reply",
        "fleet_send",
        "fleet_spawn",
        "fleet_stop",
    ] {
        assert!(
            seen["tools"]
                .as_array()
                .is_some_and(|t| t.contains(&Value::from(tool))),
            "{seen}"
        );
    }
    assert_eq!(seen["spawned"]["name"], worker.as_str());
    assert_eq!(seen["sent"]["status"], "replied");
    assert_eq!(
        seen["sent"]["reply"]["text"],
        format!("echo: hello from python {mode}")
    );
    assert_eq!(seen["bad_is_error"], true);
    assert_eq!(seen["bad"]["code"], "unknown_recipient");
    // A long send reports progress while it waits.
    assert_eq!(seen["slow"]["reply"]["text"], "echo: patience", "{seen}");
    let progress = seen["progress"].as_array().cloned().unwrap_or_default();
    assert!(
        progress.iter().any(|m| m
            .as_str()
            .unwrap_or_default()
            .starts_with("fleet_send: still waiting")),
        "{seen}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_lead_on_the_session_protocol() -> anyhow::Result<()> {
    drive("legacy", "2025-11-25").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_lead_on_the_stateless_protocol() -> anyhow::Result<()> {
    drive("auto", "2026-07-28").await
}
