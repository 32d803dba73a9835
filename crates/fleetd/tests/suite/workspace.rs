//! A workspace per worker, with real git: the profile's `workspace` template makes a git
//! worktree of the repository the worker is spawned in, the worker (the scripted agent) runs
//! there, and `workspace_teardown` removes it when the worker goes, or after a crash at the next
//! start.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(20);

/// Runs git in `repo`; its output.
fn git(repo: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A repository with one commit of `README.md`.
fn repository(dir: &Path) -> anyhow::Result<PathBuf> {
    let repo = dir.join("repo");
    std::fs::create_dir(&repo)?;
    git(&repo, &["init", "-q", "-b", "main"])?;
    git(&repo, &["config", "user.email", "test@example.invalid"])?;
    git(&repo, &["config", "user.name", "test"])?;
    std::fs::write(repo.join("README.md"), "main\n")?;
    git(&repo, &["add", "README.md"])?;
    git(&repo, &["commit", "-q", "-m", "init"])?;
    Ok(repo)
}

/// The scripted agent as profile `wt`, spawned in `repo`, each worker in a worktree of its own.
fn worktree_profile(repo: &Path) -> anyhow::Result<String> {
    Ok(format!(
        "{}cwd = {:?}\nworkspace = [\"git\", \"-C\", \"{{cwd}}\", \"worktree\", \"add\", \"{{dir}}\", \"-b\", \"fleet/{{name}}-{{gid}}\"]\nworkspace_teardown = [\"git\", \"-C\", \"{{cwd}}\", \"worktree\", \"remove\", \"--force\", \"{{dir}}\"]\n",
        sim_profile("wt", &[])?,
        repo.display().to_string()
    ))
}

/// The worktrees git lists for `repo`.
fn worktrees(repo: &Path) -> anyhow::Result<Vec<String>> {
    Ok(git(repo, &["worktree", "list", "--porcelain"])?
        .lines()
        .filter_map(|l| l.strip_prefix("worktree ").map(String::from))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_from_one_repository_edit_the_same_file_each_in_its_own_worktree()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let repo = repository(dir.path())?;
    let fleet = Fleet::start("", &worktree_profile(&repo)?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("wt", "w1").await?;
    lead.spawn("wt", "w2").await?;
    let workspace =
        |entry: &serde_json::Value| PathBuf::from(entry["workspace"].as_str().unwrap_or_default());
    let (w1, w2) = (
        workspace(&lead.entry("w1").await?),
        workspace(&lead.entry("w2").await?),
    );
    assert_ne!(w1, w2);
    for (space, name) in [(&w1, "w1"), (&w2, "w2")] {
        assert!(
            space.starts_with(fleet.state_dir().join("workspaces")),
            "{}",
            space.display()
        );
        let gid = lead.entry(name).await?["gid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(
            git(space, &["branch", "--show-current"])?.trim(),
            format!("fleet/{name}-{gid}")
        );
    }
    assert_eq!(worktrees(&repo)?.len(), 3, "the checkout and two worktrees");
    // Each runs in its own.
    let pwd = lead.send("w1", "/pwd", 20).await?;
    assert_eq!(pwd["reply"]["text"], w1.display().to_string(), "{pwd}");
    // Both edit the same file: each its own copy, the checkout untouched.
    for (name, text) in [("w1", "from w1"), ("w2", "from w2")] {
        let wrote = lead
            .send(name, &format!("/write README.md {text}"), 20)
            .await?;
        assert_eq!(wrote["reply"]["text"], "wrote README.md", "{wrote}");
    }
    assert_eq!(std::fs::read_to_string(w1.join("README.md"))?, "from w1");
    assert_eq!(std::fs::read_to_string(w2.join("README.md"))?, "from w2");
    assert_eq!(std::fs::read_to_string(repo.join("README.md"))?, "main\n");
    assert_eq!(git(&repo, &["status", "--porcelain"])?, "");
    // Stopped, each takes its worktree along.
    for name in ["w1", "w2"] {
        lead.ok("fleet_stop", json!({"to": name})).await?;
    }
    until("the worktrees to be removed", LIMIT, || async {
        (worktrees(&repo).ok()?.len() == 1).then_some(())
    })
    .await?;
    assert!(!w1.exists() && !w2.exists());
    // The name again: a worktree of its own again (its branch is another: its gid is).
    lead.spawn("wt", "w1").await?;
    let again = workspace(&lead.entry("w1").await?);
    assert!(again.is_dir() && again != w1, "{}", again.display());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_outlives_a_restart_with_its_worker_and_goes_with_a_worker_not_taken_back()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let repo = repository(dir.path())?;
    let mut fleet = Fleet::start("", &worktree_profile(&repo)?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("wt", "w1").await?;
    let space = PathBuf::from(
        lead.entry("w1").await?["workspace"]
            .as_str()
            .unwrap_or_default(),
    );
    assert!(space.is_dir());
    // A restart takes the worker back, and its workspace with it.
    fleet.kill9().await?;
    fleet.launch().await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(
        lead.entry("w1").await?["workspace"].as_str(),
        space.to_str()
    );
    assert_eq!(worktrees(&repo)?.len(), 2, "taken down at the restart");
    // A start after the fleet was left alone too long ends the worker: its workspace goes.
    until("fleetd to be recorded alive", LIMIT, || async {
        fleet.last_alive_ms().ok().flatten()
    })
    .await?;
    fleet.kill9().await?;
    assert_eq!(worktrees(&repo)?.len(), 2, "taken down before the restart");
    fleet.pretend_away(std::time::Duration::from_secs(7200))?;
    fleet.launch().await?;
    until("the orphaned worktree to be removed", LIMIT, || async {
        (worktrees(&repo).ok()?.len() == 1).then_some(())
    })
    .await?;
    assert!(!space.exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_that_cannot_be_made_fails_the_spawn_and_says_why() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Not a repository: git refuses, and the spawn says so.
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain)?;
    let fleet = Fleet::start("", &worktree_profile(&plain)?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let refused = lead
        .call("fleet_spawn", json!({"profile": "wt", "name": "w1"}))
        .await?
        .expect_err("a workspace outside a repository");
    assert_eq!(refused.code, "not_ready", "{refused}");
    assert!(
        refused
            .message
            .contains("cannot make the workspace of 'w1'")
            && refused.message.contains("not a git repository"),
        "{refused}"
    );
    assert!(lead.names().await?.iter().all(|n| n != "w1"));
    assert!(fleet.panes()?.is_empty(), "no pane was opened");
    Ok(())
}
