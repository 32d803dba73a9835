//! The gateway stays up and honest on the real binary: a closed terminal (its stderr a pipe
//! nobody reads any more) takes nothing down, Ctrl-C still drains and stops it within its
//! bound, and a restart serves.

use std::time::{Duration, Instant};

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use tokio::io::{AsyncBufReadExt, BufReader};

const LIMIT: Duration = Duration::from_secs(20);

/// What `/healthz` answers now: its status and body.
async fn health(fleet: &Fleet) -> Option<(u16, serde_json::Value)> {
    let response = reqwest::get(format!("{}/healthz", fleet.base()))
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stderr_pipe_takes_nothing_down_and_ctrl_c_still_stops_it() -> anyhow::Result<()> {
    let mut fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    assert!(fleet.terminate().await?, "{}", fleet.log());
    // `fleetd serve 2>&1 | tee log`, then tee dies.
    let pipe = fleet.launch_piped().await?;
    let mut lines = BufReader::new(pipe).lines();
    let ready = tokio::time::timeout(LIMIT, async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("fleetd ready") {
                return Ok(());
            }
        }
        anyhow::bail!("fleetd's stderr ended before it was ready")
    })
    .await;
    anyhow::ensure!(matches!(ready, Ok(Ok(()))), "{ready:?}");
    drop(lines);

    // Everything that logs from now on writes into a broken pipe; all of it still works.
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let sent = tokio::time::timeout(LIMIT * 2, async {
        lead.spawn("sim", "w1").await?;
        lead.send("w1", "still here?", 20).await
    })
    .await
    .map_err(|_| anyhow::anyhow!("a spawn and a send did not return"))??;
    assert_eq!(sent["status"], "replied", "{sent}");
    assert_eq!(sent["reply"]["text"], "echo: still here?", "{sent}");
    let health = reqwest::get(format!("{}/healthz", fleet.base())).await?;
    assert_eq!(health.status().as_u16(), 200);

    // Ctrl-C drains and stops it, well within the drain's bound.
    let asked = Instant::now();
    let status = fleet.stop_by("INT").await?;
    let took = asked.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(10), "stopped after {took:?}");

    // A restart serves, and the held state is there.
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(lead.names().await?, vec!["lead"]);
    Ok(())
}

/// A core loop that dies (a test hook makes the dialog watcher panic) turns `/healthz` to 503
/// naming it, and `fleetd doctor` says so, where they used to say ok and serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_core_loop_makes_healthz_503_naming_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let trigger = dir.path().join("panic-now");
    let fault = format!("panic:dialog@{}", trigger.display());
    let fleet =
        Fleet::start_with_env(dir.path(), "", "", &[("FLEETD_TEST_FAULT", Some(&fault))]).await?;
    assert_eq!(health(&fleet).await.map(|h| h.0), Some(200));
    std::fs::write(&trigger, "")?;
    let (status, said) = fleet_testkit::wait::until("healthz to turn 503", LIMIT, || async {
        health(&fleet).await.filter(|(status, _)| *status != 200)
    })
    .await?;
    assert_eq!(status, 503, "{said}");
    assert_eq!(said["status"], "unhealthy", "{said}");
    assert_eq!(
        said["problems"],
        serde_json::json!(["the dialog loop died"]),
        "{said}"
    );
    let doctor = fleet.cli(&["doctor"])?;
    let out = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        out.contains("cannot really serve: the dialog loop died"),
        "{out}"
    );
    // The rest still answers: a lead can still collect what is held for it.
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(lead.names().await?, vec!["lead"]);
    Ok(())
}

/// A store that cannot take writes (another process holds its write lock) turns `/healthz` to
/// 503 saying so; once it can again, 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_takes_no_writes_makes_healthz_503_until_it_does() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    let locker = rusqlite::Connection::open(fleet.state_dir().join("fleet.db"))?;
    locker.execute_batch("BEGIN EXCLUSIVE")?;
    let (_, said) = fleet_testkit::wait::until("healthz to turn 503", LIMIT, || async {
        health(&fleet).await.filter(|(status, _)| *status == 503)
    })
    .await?;
    let problems = said["problems"].to_string();
    assert!(
        problems.contains("the store takes no writes") && problems.contains("locked"),
        "{said}"
    );
    locker.execute_batch("COMMIT")?;
    fleet_testkit::wait::until("healthz to turn 200 again", LIMIT, || async {
        health(&fleet).await.filter(|(status, _)| *status == 200)
    })
    .await?;
    Ok(())
}
