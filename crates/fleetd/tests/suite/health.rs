//! The gateway stays up and honest on the real binary: a stderr whose reader died or stopped
//! reading takes nothing down, Ctrl-C still drains and stops it within its bound, and a restart
//! serves; a dead loop or a store that takes no writes turns `/healthz` to 503.

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

/// What became of whatever read fleetd's stderr.
#[derive(Clone, Copy, Debug)]
enum Reader {
    /// It died (`fleetd serve 2>&1 | tee log`, then tee gets Ctrl-C): writes fail.
    Died,
    /// It stopped reading (`| less` past a screen, a terminal on Ctrl-S): writes block.
    Stopped,
}

/// With its stderr's reader gone either way, fleetd still spawns, types, answers and checks
/// healthy, says in /metrics that it lost log lines, stops on SIGINT well within its bound, and
/// a restart serves.
async fn stderr_trouble_takes_nothing_down(reader: Reader) -> anyhow::Result<()> {
    let mut fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    assert!(fleet.terminate().await?, "{}", fleet.log());
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
    let _held = match reader {
        Reader::Died => {
            drop(lines);
            None
        }
        Reader::Stopped => {
            // The smallest pipe there is: a few lines fill it.
            rustix::pipe::fcntl_setpipe_size(lines.get_ref().get_ref(), 4096)?;
            Some(lines)
        }
    };

    // Everything that logs from now on fails, or would wait; all of it still works. Tasks go
    // round until fleetd says it lost log lines (so its log was in trouble all along).
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let lost = || fleet.metric("lead", "fleetd_log_write_failures_total");
    let rounds = tokio::time::timeout(LIMIT * 3, async {
        lead.spawn("sim", "w1").await?;
        for n in 0.. {
            let sent = lead.send("w1", &format!("still here? {n}"), 20).await?;
            anyhow::ensure!(sent["status"] == "replied", "{sent}");
            anyhow::ensure!(
                sent["reply"]["text"] == format!("echo: still here? {n}"),
                "{sent}"
            );
            if lost().await.is_some_and(|lost| lost > 0.0) && n >= 2 {
                return Ok(n + 1);
            }
        }
        Ok(0)
    })
    .await
    .map_err(|_| {
        anyhow::anyhow!("{reader:?}: tasks stopped going round (or no line was lost)")
    })??;
    assert!(rounds >= 3, "{rounds}");
    assert_eq!(health(&fleet).await.map(|h| h.0), Some(200));

    // Ctrl-C drains and stops it, well within the drain's bound.
    let asked = Instant::now();
    let status = fleet.stop_by("INT").await?;
    let took = asked.elapsed();
    assert!(status.success(), "{reader:?}: {status}");
    assert!(
        took < Duration::from_secs(10),
        "{reader:?}: stopped after {took:?}"
    );

    // A restart serves, and takes back the worker the stop left running.
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(lead.names().await?, vec!["lead", "w1"]);
    let sent = lead.send("w1", "after the restart", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: after the restart", "{sent}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stderr_pipe_takes_nothing_down_and_ctrl_c_still_stops_it() -> anyhow::Result<()> {
    stderr_trouble_takes_nothing_down(Reader::Died).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_nobody_reads_takes_nothing_down_and_ctrl_c_still_stops_it() -> anyhow::Result<()>
{
    stderr_trouble_takes_nothing_down(Reader::Stopped).await
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
    // Two probes in a row must fail (each waits out the store's 5 s lock wait), 5 s apart.
    let (_, said) = fleet_testkit::wait::until("healthz to turn 503", LIMIT * 2, || async {
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
