//! The gateway stays up and honest on the real binary: a closed terminal (its stderr a pipe
//! nobody reads any more) takes nothing down, Ctrl-C still drains and stops it within its
//! bound, and a restart serves.

use std::time::{Duration, Instant};

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use tokio::io::{AsyncBufReadExt, BufReader};

const LIMIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stderr_pipe_takes_nothing_down_and_ctrl_c_still_stops_it() -> anyhow::Result<()>
{
    let mut fleet = Fleet::start("drain_timeout_s = 10", &sim_profile("sim", &[])?).await?;
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
    lead.spawn("sim", "w1").await?;
    let sent = lead.send("w1", "still here?", 20).await?;
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
