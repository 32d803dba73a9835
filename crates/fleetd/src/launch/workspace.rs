//! A workspace per worker: a profile's `workspace` template (an argv, `{cwd}`, `{dir}`,
//! `{name}` and `{gid}` filled in, run without a shell) makes the directory the worker then
//! runs in — a git worktree, a copy — and its `workspace_teardown` takes it down when the
//! worker's session ends for good (not at a recycle: a fresh session works on in the same
//! place). fleetd never knows what the commands do (spec CB-500 §7: it launches into a
//! placement, it does not manage the toolchain). The filled teardown is kept in the state dir
//! before the workspace is made, so a teardown still runs after a crash, at the next start.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fleet_core::Gid;
use serde::{Deserialize, Serialize};

use super::{fill_template, private_dir, private_file};
use crate::config::ProfileConfig;

/// How long making a workspace may take (a worktree of a big repository, a copy).
const MAKE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a teardown may take.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of a failed command's error output an error quotes.
const STDERR_TAIL: usize = 600;

/// A workspace's teardown, as kept until it ran.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    /// The filled teardown argv.
    argv: Vec<String>,
    /// Where it runs: the worker's `{cwd}`.
    cwd: PathBuf,
}

/// Where workspaces go, and their kept teardowns.
pub struct Workspaces {
    /// `<state>/workspaces`: the default root of workspace directories.
    root: PathBuf,
    /// `<state>/workspace-teardowns`: one file per worker whose workspace awaits its teardown.
    kept: PathBuf,
    /// The workers whose workspace is being made: its maker owns it until it returns (a
    /// session that ends meanwhile leaves the teardown to the spawn that made it).
    making: Mutex<HashSet<Gid>>,
}

/// Marks a workspace as being made while it lives.
struct Making<'a> {
    spaces: &'a Workspaces,
    gid: Gid,
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.spaces.making().remove(&self.gid);
    }
}

impl Workspaces {
    /// The workspaces of the gateway with state dir `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            root: state_dir.join("workspaces"),
            kept: state_dir.join("workspace-teardowns"),
            making: Mutex::new(HashSet::new()),
        }
    }

    fn making(&self) -> std::sync::MutexGuard<'_, HashSet<Gid>> {
        self.making.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the workspace of worker `name` (`gid`) from `cwd`, when `profile` declares one:
    /// its directory, which exists. `Err` says why not (the command's failure, its error
    /// output's end); whatever it made is taken down again.
    pub async fn make(
        &self,
        profile: &ProfileConfig,
        gid: Gid,
        name: &str,
        cwd: &Path,
    ) -> Result<Option<PathBuf>, String> {
        if profile.workspace.is_empty() {
            return Ok(None);
        }
        self.making().insert(gid);
        let made = Making { spaces: self, gid };
        let root = profile
            .workspace_root
            .clone()
            .unwrap_or_else(|| self.root.clone());
        private_dir(&root).map_err(|e| format!("cannot make {}: {e}", root.display()))?;
        let dir = root.join(format!("{name}-{gid}"));
        let value = |placeholder: &str| -> Option<String> {
            Some(match placeholder {
                "cwd" => cwd.display().to_string(),
                "dir" => dir.display().to_string(),
                "name" => name.to_string(),
                "gid" => gid.to_string(),
                _ => return None,
            })
        };
        let fill = |argv: &[String]| -> Vec<String> {
            argv.iter().map(|w| fill_template(w, &value)).collect()
        };
        if !profile.workspace_teardown.is_empty() {
            let kept = Kept {
                argv: fill(&profile.workspace_teardown),
                cwd: cwd.to_path_buf(),
            };
            let text = serde_json::to_string(&kept).map_err(|e| e.to_string())?;
            private_dir(&self.kept)
                .and_then(|()| private_file(&self.file_of(gid), text.as_bytes()))
                .map_err(|e| format!("cannot keep the workspace's teardown: {e}"))?;
        }
        let ran = run(&fill(&profile.workspace), cwd, MAKE_TIMEOUT).await;
        let why = match ran {
            Ok(()) if dir.is_dir() => {
                tracing::info!(%gid, dir = %dir.display(), "made a worker's workspace");
                return Ok(Some(dir));
            }
            Ok(()) => format!(
                "the workspace command ran, but made no directory {}",
                dir.display()
            ),
            Err(why) => format!("the workspace command {why}"),
        };
        drop(made);
        self.end(gid).await;
        Err(why)
    }

    /// Worker `gid`'s session ended for good: its workspace's teardown runs (if one is kept),
    /// unless the workspace is still being made (its spawn takes it down then).
    pub async fn end(&self, gid: Gid) {
        if self.making().contains(&gid) {
            return;
        }
        take_down(&self.file_of(gid)).await;
    }

    /// Runs the teardowns left behind (at start-up, a previous run's; at shutdown, those
    /// still to come), but for the workers in `live` (still running: taken back, or left
    /// running for the next start).
    pub async fn end_leftovers(&self, live: &[Gid]) {
        let Ok(entries) = fs::read_dir(&self.kept) else {
            return;
        };
        let live: Vec<PathBuf> = live.iter().map(|gid| self.file_of(*gid)).collect();
        for entry in entries.flatten() {
            if live.contains(&entry.path()) {
                continue;
            }
            tracing::info!(file = %entry.path().display(), "taking down a previous run's workspace");
            take_down(&entry.path()).await;
        }
    }

    /// Whether a teardown is kept for worker `gid`'s workspace: it has one.
    pub fn keeps(&self, gid: Gid) -> bool {
        self.file_of(gid).is_file()
    }

    fn file_of(&self, gid: Gid) -> PathBuf {
        self.kept.join(format!("{gid}.json"))
    }
}

/// Runs the teardown kept in `file`, then forgets it.
async fn take_down(file: &Path) {
    let Ok(text) = fs::read_to_string(file) else {
        return;
    };
    match serde_json::from_str::<Kept>(&text) {
        Ok(kept) => match run(&kept.argv, &kept.cwd, TEARDOWN_TIMEOUT).await {
            Ok(()) => tracing::info!(argv = ?kept.argv, "ran a workspace's teardown"),
            Err(why) => tracing::warn!(argv = ?kept.argv, why, "a workspace's teardown failed"),
        },
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "unreadable workspace teardown")
        }
    }
    if let Err(e) = fs::remove_file(file)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = %file.display(), error = %e, "cannot forget a workspace's teardown");
    }
}

/// Runs `argv` in `cwd` (fleetd's own directory if that is gone) for at most `limit`; `Err`
/// says how it failed, with the end of its error output.
async fn run(argv: &[String], cwd: &Path, limit: Duration) -> Result<(), String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("is empty".into());
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if cwd.is_dir() {
        command.current_dir(cwd);
    }
    match tokio::time::timeout(limit, command.output()).await {
        Ok(Ok(output)) if output.status.success() => Ok(()),
        Ok(Ok(output)) => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stderr = stderr.trim();
            let cut = stderr
                .char_indices()
                .rev()
                .nth(STDERR_TAIL)
                .map_or(0, |(at, _)| at);
            Err(format!(
                "{program} failed ({}): {}",
                output.status,
                &stderr[cut..]
            ))
        }
        Ok(Err(e)) => Err(format!("{program} cannot run: {e}")),
        Err(_) => Err(format!(
            "{program} did not finish within {} s",
            limit.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(make: &[&str], teardown: &[&str]) -> ProfileConfig {
        let mut profile = ProfileConfig::command("p", vec!["x".into()]);
        profile.workspace = make.iter().map(|s| s.to_string()).collect();
        profile.workspace_teardown = teardown.iter().map(|s| s.to_string()).collect();
        profile
    }

    #[tokio::test]
    async fn a_workspace_is_made_from_its_template_and_taken_down_once() {
        let state = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let spaces = Workspaces::new(state.path());
        let gid = Gid::mint();
        // Words are filled, never read by a shell: the `;` stays part of a file name.
        let p = profile(
            &["mkdir", "{dir}"],
            &[
                "sh",
                "-c",
                "rm -r \"$0\"; echo gone > \"$1\"",
                "{dir}",
                "{cwd}/gone-{name}",
            ],
        );
        let dir = spaces
            .make(&p, gid, "w1", cwd.path())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            dir,
            state.path().join("workspaces").join(format!("w1-{gid}"))
        );
        assert!(dir.is_dir());
        spaces.end(gid).await;
        assert!(!dir.exists());
        assert!(cwd.path().join("gone-w1").exists());
        // Once: the kept teardown is forgotten.
        fs::remove_file(cwd.path().join("gone-w1")).unwrap();
        spaces.end(gid).await;
        assert!(!cwd.path().join("gone-w1").exists());
        // No template, no workspace.
        let none = profile(&[], &[]);
        assert_eq!(spaces.make(&none, gid, "w2", cwd.path()).await, Ok(None));
    }

    #[tokio::test]
    async fn a_failed_workspace_says_why_and_is_taken_down() {
        let state = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let spaces = Workspaces::new(state.path());
        let marker = cwd.path().join("torn-down");
        let teardown = ["touch", marker.to_str().unwrap()];
        let failing = profile(&["sh", "-c", "echo no such repo >&2; exit 3"], &teardown);
        let err = spaces
            .make(&failing, Gid::mint(), "w1", cwd.path())
            .await
            .unwrap_err();
        assert!(
            err.contains("exit status: 3") && err.contains("no such repo"),
            "{err}"
        );
        assert!(
            marker.exists(),
            "the teardown of a failed workspace did not run"
        );
        let silent = profile(&["true"], &[]);
        let err = spaces
            .make(&silent, Gid::mint(), "w2", cwd.path())
            .await
            .unwrap_err();
        assert!(err.contains("made no directory"), "{err}");
    }

    #[tokio::test]
    async fn a_previous_runs_teardowns_run_at_the_next_start() {
        let state = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let p = profile(&["mkdir", "{dir}"], &["rmdir", "{dir}"]);
        let dir = Workspaces::new(state.path())
            .make(&p, Gid::mint(), "w1", cwd.path())
            .await
            .unwrap()
            .unwrap();
        // fleetd died here; the next run takes the workspace down.
        Workspaces::new(state.path()).end_leftovers(&[]).await;
        assert!(!dir.exists());
        assert_eq!(
            fs::read_dir(state.path().join("workspace-teardowns"))
                .unwrap()
                .count(),
            0
        );
    }
}
