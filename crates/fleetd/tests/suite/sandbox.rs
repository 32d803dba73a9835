//! Sandboxed workers with a real runtime: bubblewrap (`bwrap`, installed by `./test.sh`)
//! wrapped around the scripted agent, its teardown run when the pane goes.

use std::collections::BTreeSet;
use std::time::Duration;

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, bwrap_profile};
use fleet_testkit::wait::until;

const LIMIT: Duration = Duration::from_secs(20);

/// The process `pid` and all its descendants.
fn process_tree(pid: u32) -> BTreeSet<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // The parent pid is the second field after the parenthesised command name.
            let after = &stat[stat.rfind(')')? + 2..];
            let parent = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((child, parent))
        })
        .collect();
    let mut tree = BTreeSet::from([pid]);
    loop {
        let before = tree.len();
        for (child, parent) in &parents {
            if tree.contains(parent) {
                tree.insert(*child);
            }
        }
        if tree.len() == before {
            return tree;
        }
    }
}

/// Whether `pid` is a live process (a zombie no longer counts: it has let go of everything).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat[stat.rfind(')')? + 2..].to_string();
            after.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bwrap_sandboxed_worker_round_trips_and_its_teardown_leaves_nothing() -> anyhow::Result<()>
{
    let workdir = tempfile::tempdir()?;
    let fleet = Fleet::start("", &bwrap_profile("boxed", workdir.path())?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("boxed", "b1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let sent = lead.send("b1", "hello sandbox", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello sandbox", "{sent}");

    // The pane runs bwrap, and the agent runs inside it.
    let pane_pid = pane_pid(&fleet, &pane)?;
    let command = std::fs::read_to_string(format!("/proc/{pane_pid}/cmdline"))?;
    assert!(command.starts_with("bwrap\0"), "{command:?}");
    let tree = process_tree(pane_pid);
    let sandboxed = tree.iter().any(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == b"FLEET_SANDBOX=b1"))
    });
    assert!(
        sandboxed,
        "no process under the pane has bwrap's FLEET_SANDBOX=b1: {tree:?}"
    );

    lead.ok("fleet_stop", serde_json::json!({"to": "b1"}))
        .await?;
    let log = workdir.path().join("teardown.log");
    until("the teardown to run", LIMIT, || async {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|text| text.trim() == "b1")
    })
    .await?;
    until("every process of the sandbox to be gone", LIMIT, || async {
        (!tree.iter().any(|pid| alive(*pid))).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_next_start_tears_down_the_orphaned_sandbox() -> anyhow::Result<()> {
    let workdir = tempfile::tempdir()?;
    let mut fleet = Fleet::start("", &bwrap_profile("boxed", workdir.path())?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let pane = lead.spawn("boxed", "b1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let tree = process_tree(pane_pid(&fleet, &pane)?);
    fleet.kill9().await?;
    let log = workdir.path().join("teardown.log");
    assert!(!log.exists(), "torn down before the restart");
    fleet.launch().await?;
    until("the orphan's teardown to run", LIMIT, || async {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|text| text.trim() == "b1")
    })
    .await?;
    until(
        "every process of the orphaned sandbox to be gone",
        LIMIT,
        || async { (!tree.iter().any(|pid| alive(*pid))).then_some(()) },
    )
    .await?;
    Ok(())
}

/// The pid of the program `pane` runs.
fn pane_pid(fleet: &Fleet, pane: &str) -> anyhow::Result<u32> {
    let out = std::process::Command::new("tmux")
        .args(["-L", fleet.tmux_socket(), "display", "-p", "-t", pane])
        .arg("#{pane_pid}")
        .output()?;
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}
