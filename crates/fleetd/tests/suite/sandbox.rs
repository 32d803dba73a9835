//! Sandboxed workers with a real runtime: bubblewrap (`bwrap`, installed by `./test.sh`)
//! wrapped around the scripted agent under the recipe of docs/workers.md, its teardown run when the pane
//! goes. The agent is bound in by its own path, so the tests pass wherever the checkout (and its
//! build) lives: under `/tmp`, behind a symlink, in a path with spaces.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use fleet_testkit::bins::binary;
use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, bwrap_profile, bwrap_profile_of, sim_profile};
use fleet_testkit::wait::until;

use super::boxed_agents::{UsersFleet, read_inside};
use serde_json::{Value, json};

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

/// A bubblewrap sandbox profile `boxed` whose role is `role`, working in `workdir`.
fn boxed_as(role: &str, workdir: &Path) -> anyhow::Result<String> {
    Ok(format!(
        "{}role = \"{role}\"\n",
        bwrap_profile("boxed", workdir)?
    ))
}

/// What `fleet_list` (or the API) says `entry` runs in and is for.
fn spawned_as(entry: &Value) -> (Value, Value) {
    (entry["sandbox"].clone(), entry["profile_role"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bwrap_sandboxed_worker_round_trips_and_its_teardown_leaves_nothing() -> anyhow::Result<()>
{
    let workdir = tempfile::tempdir()?;
    let profiles = format!(
        "{}{}",
        boxed_as("backend", workdir.path())?,
        sim_profile("sim", &[])?
    );
    let fleet = Fleet::start("", &profiles).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("boxed", "b1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let sent = lead.send("b1", "hello sandbox", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello sandbox", "{sent}");

    // fleet_list, the API and `fleetd ls` say what each runs in and what its profile is for:
    // bwrap and backend for b1, nothing for an unsandboxed worker of a profile with no role,
    // nor for a lead.
    lead.spawn("sim", "w1").await?;
    let boxed = (json!("bwrap"), json!("backend"));
    let none = (Value::Null, Value::Null);
    assert_eq!(spawned_as(&lead.entry("b1").await?), boxed);
    assert_eq!(spawned_as(&lead.entry("w1").await?), none);
    assert_eq!(spawned_as(&lead.entry("lead").await?), none);
    let roster: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/roster", fleet.base()))
        .bearer_auth(fleet.token("lead")?)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let api = |name: &str| {
        roster["entities"]
            .as_array()
            .and_then(|all| all.iter().find(|e| e["name"] == name))
            .map(spawned_as)
    };
    assert_eq!(api("b1"), Some(boxed), "{roster}");
    assert_eq!(api("w1"), Some(none), "{roster}");
    let out = fleet.cli(&["ls"])?;
    let ls = String::from_utf8(out.stdout)?;
    let row = |name: &str| -> Vec<String> {
        ls.lines()
            .map(|line| {
                line.split_whitespace()
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .find(|words| words.first().is_some_and(|w| w == name))
            .unwrap_or_default()
    };
    assert_eq!(row("NAME")[3..6], ["PROFILE", "SANDBOX", "FOR"], "{ls}");
    assert_eq!(row("b1")[3..6], ["boxed", "bwrap", "backend"], "{ls}");
    assert_eq!(row("w1")[3..6], ["sim", "-", "-"], "{ls}");

    // The pane runs bwrap, and the agent runs inside it.
    let pane_pid = fleet.pane_pid(&pane)?;
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
async fn a_sandbox_outlives_a_restart_and_one_not_taken_back_is_torn_down() -> anyhow::Result<()> {
    let workdir = tempfile::tempdir()?;
    let mut fleet = Fleet::start("", &boxed_as("backend", workdir.path())?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let pane = lead.spawn("boxed", "b1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let tree = process_tree(fleet.pane_pid(&pane)?);
    let log = workdir.path().join("teardown.log");
    // A restart takes the sandboxed worker back, sandbox and all: still said to run in bwrap
    // as a backend, as it was spawned, though its profile's role changed meanwhile.
    fleet.kill9().await?;
    std::fs::write(
        fleet.config_path(),
        std::fs::read_to_string(fleet.config_path())?
            .replace("role = \"backend\"", "role = \"frontend\""),
    )?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let sent = lead.send("b1", "still boxed?", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: still boxed?", "{sent}");
    assert!(!log.exists(), "torn down at the restart");
    assert_eq!(
        spawned_as(&lead.entry("b1").await?),
        (json!("bwrap"), json!("backend"))
    );
    // A start after the fleet was left alone too long ends it, and tears its sandbox down.
    until("fleetd to be recorded alive", LIMIT, || async {
        fleet.last_alive_ms().ok().flatten()
    })
    .await?;
    fleet.kill9().await?;
    assert!(!log.exists(), "torn down before the restart");
    fleet.pretend_away(std::time::Duration::from_secs(7200))?;
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

/// A copy of the scripted agent under `/tmp` (which the recipe hides), in a directory with a
/// space in its name, reached through a symlink: where a clone's build might be.
fn hidden_agent(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let real = dir.join("a clone/target/debug");
    std::fs::create_dir_all(&real)?;
    std::fs::copy(binary("fleet-agent-sim")?, real.join("fleet-agent-sim"))?;
    std::os::unix::fs::symlink(dir.join("a clone"), dir.join("linked clone"))?;
    Ok(dir.join("linked clone/target/debug/fleet-agent-sim"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_under_a_hidden_path_runs_when_bound_and_is_refused_by_name_when_not()
-> anyhow::Result<()> {
    let workdir = tempfile::tempdir()?;
    let clone = tempfile::tempdir_in("/tmp")?;
    let agent = hidden_agent(clone.path())?;
    let profiles = format!(
        "{}\n{}",
        bwrap_profile_of("bound", workdir.path(), &agent, true)?,
        bwrap_profile_of("unbound", workdir.path(), &agent, false)?
    );
    let fleet = Fleet::start("", &profiles).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;

    let refused = lead
        .call(
            "fleet_spawn",
            serde_json::json!({"profile": "unbound", "name": "u1"}),
        )
        .await?
        .expect_err("a sandbox that hides its agent");
    assert_eq!(refused.code, "not_ready", "{refused}");
    // Named by the path it is started by (the one behind the symlink is hidden as well).
    assert!(
        refused.message.contains(&agent.display().to_string())
            && refused.message.contains("under /tmp")
            && refused.message.contains("--tmpfs"),
        "names the path and the mount that hides it: {refused}"
    );
    assert!(fleet.panes()?.is_empty(), "no pane was opened");

    lead.spawn("bound", "b1").await?;
    let sent = lead.send("b1", "hello from a hidden clone", 20).await?;
    assert_eq!(
        sent["reply"]["text"], "echo: hello from a hidden clone",
        "{sent}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_worker_cannot_read_the_lead_token_or_the_users_claude_settings()
-> anyhow::Result<()> {
    // The state dir and the user's home outside /tmp, so only the recipe's {state_dir} and
    // {home} mounts can hide them; the home is the test's own, holding the user's settings.
    let workdir = tempfile::tempdir()?;
    let user = UsersFleet::start(&bwrap_profile("boxed", workdir.path())?).await?;
    let token = user.fleet.state_dir().join("leads/lead.token");
    assert!(
        token.is_file(),
        "the lead's token file: {}",
        token.display()
    );
    user.lead.spawn("boxed", "b1").await?;
    let got = read_inside(&user.lead, "b1", &token).await?;
    assert!(
        got.starts_with(&format!("cannot read {}", token.display())),
        "the sandbox read the lead's token: {got}"
    );
    // Nor the user's Claude Code settings in the home.
    let got = read_inside(&user.lead, "b1", &user.settings).await?;
    assert!(
        got.starts_with("cannot read"),
        "the sandbox read {}: {got}",
        user.settings.display()
    );
    // The worker's own working directory is there, and it still answers.
    let note = workdir.path().join("note.txt");
    std::fs::write(&note, "visible")?;
    assert_eq!(read_inside(&user.lead, "b1", &note).await?, "visible");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_spawns_a_sandboxed_worker_on_another_host_under_that_hosts_rules()
-> anyhow::Result<()> {
    use fleet_testkit::broker::Broker;
    use fleet_testkit::fleet::agent_workdir;
    use fleet_testkit::hosts::TwoHosts;

    // hostb's "boxed" is a bubblewrap sandbox, working under hostb's roots; hosta has a profile
    // of that name too, unsandboxed, which a spawn on hostb must not use.
    let workdir = tempfile::tempdir_in(agent_workdir())?;
    let here = sim_profile("boxed", &[])?;
    let there = bwrap_profile("boxed", workdir.path())?;
    let p = TwoHosts::each(&Broker::find().await?, &here, &there).await?;
    super::federation::hears_host(&p.alice, "hostb").await?;

    let spawned = p
        .alice
        .ok(
            "fleet_spawn",
            json!({"profile": "boxed", "name": "far", "host": "hostb"}),
        )
        .await?;
    assert_eq!(
        (spawned["host"].as_str(), spawned["status"].as_str()),
        (Some("hostb"), Some("idle")),
        "{spawned}\n{}",
        p.b.log()
    );
    // hostb's runtime: the pane on hostb runs bwrap, the agent inside it.
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let pane_pid = p.b.pane_pid(&pane)?;
    let command = std::fs::read_to_string(format!("/proc/{pane_pid}/cmdline"))?;
    assert!(command.starts_with("bwrap\0"), "{command:?}");
    assert!(p.a.panes()?.is_empty(), "a pane on hosta");

    // A round trip, and a question in the middle of a task, answered from hosta.
    let sent = p.alice.send("far", "hello sandbox afar", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello sandbox afar", "{sent}");
    let sent = p.alice.send("far", "/ask 20 which port?", 20).await?;
    assert_eq!(sent["status"], "asked", "{sent}\n{}", p.b.log());
    let answered = p
        .alice
        .ok(
            "fleet_send",
            json!({"turn_id": sent["ask"]["turn_id"], "message": "8080", "wait_s": 20}),
        )
        .await?;
    assert_eq!(
        answered["reply"]["text"], "asked which port?, heard: 8080",
        "{answered}"
    );
    // Inside, hostb's state dir is hidden as its recipe says.
    let token = p.b.state_dir().join("leads/bob.token");
    let sent = p
        .alice
        .send("far", &format!("/read {}", token.display()), 20)
        .await?;
    assert!(
        sent["reply"]["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("cannot read"),
        "{sent}"
    );

    // hostb's roots decide where it may work: a directory outside them is refused there.
    let outside = tempfile::tempdir_in("/var/tmp")?;
    let refused = p
        .alice
        .call(
            "fleet_spawn",
            json!({"profile": "boxed", "name": "far2", "host": "hostb",
                   "cwd": outside.path().display().to_string()}),
        )
        .await?
        .expect_err("a working directory outside hostb's roots");
    assert_eq!(refused.code, "forbidden", "{refused}");
    assert!(
        refused.message.contains("is outside gateway.workdir_roots"),
        "{refused}"
    );

    // A stop from hosta tears the sandbox down on hostb.
    p.alice.ok("fleet_stop", json!({"to": "far"})).await?;
    until("hostb's teardown to run", LIMIT, || async {
        std::fs::read_to_string(workdir.path().join("teardown.log"))
            .ok()
            .filter(|text| text.trim() == "far")
    })
    .await?;
    Ok(())
}
