//! Real coding agents in a real sandbox: Claude Code and opencode (the pinned releases
//! `./test.sh` installs) under the bubblewrap recipe of docs/workers.md, started by fleetd with nobody at
//! their screens, in the mode fleetd gives a sandbox, on the scripted model. Each does a round
//! trip through fleetd (its MCP config and charter read inside the sandbox, its reply back),
//! then runs its own shell tool inside the sandbox to look at what the sandbox must hide: the
//! state dir (the lead's token), the user's `~/.claude.json`, another worker's files.

use std::path::{Path, PathBuf};

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{
    Fleet, bwrap_agent_profile, bwrap_profile, claude_binary, opencode_binary,
};
use fleet_testkit::model::ModelSim;
use serde_json::Value;

/// What a sandboxed agent's shell is asked to look at, and what it must find.
pub(super) struct Looks {
    /// Paths that must not be there inside.
    pub(super) hidden: Vec<PathBuf>,
    /// Paths that must be there inside.
    pub(super) seen: Vec<PathBuf>,
}

impl Looks {
    /// One shell line printing `hidden P` or `seen P` for each path.
    pub(super) fn command(&self) -> String {
        let paths: Vec<String> = self
            .hidden
            .iter()
            .chain(&self.seen)
            .map(|p| format!("'{}'", p.display()))
            .collect();
        format!(
            "for p in {}; do if [ -e \"$p\" ]; then echo \"seen $p\"; else echo \"hidden $p\"; fi; done",
            paths.join(" ")
        )
    }

    /// Checks the shell's output `text` (the reply `ran COMMAND: OUTPUT`), line by line.
    pub(super) fn check(&self, text: &str) {
        // Each line as the shell printed it (the first comes after the command it ran).
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.rsplit(": ").next().unwrap_or(l).trim())
            .collect();
        let printed = |line: &str| lines.contains(&line);
        for path in &self.hidden {
            let line = format!("hidden {}", path.display());
            assert!(
                printed(&line),
                "{} is visible inside: {text}",
                path.display()
            );
        }
        for path in &self.seen {
            let line = format!("seen {}", path.display());
            assert!(
                printed(&line),
                "{} is missing inside: {text}",
                path.display()
            );
        }
    }
}

/// Sends `task` to `to`, with its screen and fleetd's log on failure.
async fn ask(
    fleet: &Fleet,
    lead: &Client,
    to: &str,
    pane: &str,
    task: &str,
) -> anyhow::Result<Value> {
    match lead.send(to, task, 90).await {
        Ok(sent) if sent["reply"].is_object() => Ok(sent),
        outcome => anyhow::bail!(
            "{outcome:?}\n{to}'s screen:\n{}\nfleetd's log:\n{}",
            fleet.screen(pane).unwrap_or_default(),
            fleet.log()
        ),
    }
}

/// What the scripted worker `to` reads at `path` through its `/read`: the file's text, or
/// `cannot read PATH: why`.
pub(super) async fn read_inside(lead: &Client, to: &str, path: &Path) -> anyhow::Result<String> {
    let sent = lead
        .send(to, &format!("/read {}", path.display()), 30)
        .await?;
    Ok(sent["reply"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// A fleet started with `profiles` for a user of the test's own: fleetd's `HOME` and its state
/// dir outside /tmp (so only a sandbox's own mounts can hide them), the home holding the user's
/// Claude Code settings with a key of their own.
pub(super) struct UsersFleet {
    /// Its lead (fields drop in order: the lead and the fleet go before the home).
    pub(super) lead: Client,
    pub(super) fleet: Fleet,
    /// The user's `~/.claude.json`.
    pub(super) settings: PathBuf,
    /// The user's home.
    pub(super) home: tempfile::TempDir,
}

impl UsersFleet {
    pub(super) async fn start(profiles: &str) -> anyhow::Result<Self> {
        let home = tempfile::tempdir_in("/var/tmp")?;
        let settings = home.path().join(".claude.json");
        std::fs::write(&settings, r#"{"primaryApiKey": "sk-ant-the-users-own"}"#)?;
        let fleet = Fleet::start_with_env(
            Path::new("/var/tmp"),
            "",
            profiles,
            &[("HOME", Some(&home.path().display().to_string()))],
        )
        .await?;
        let lead = fleet.lead("lead", Protocol::Stateless).await?;
        Ok(Self {
            lead,
            fleet,
            settings,
            home,
        })
    }

    /// Spawns `name` of `profile` (fleetd's log on failure) and checks its pane runs
    /// `runtime`; returns its pane.
    pub(super) async fn spawn_in(
        &self,
        profile: &str,
        name: &str,
        runtime: &str,
    ) -> anyhow::Result<String> {
        let spawned = match self.lead.spawn(profile, name).await {
            Ok(spawned) => spawned,
            Err(e) => anyhow::bail!("{e:#}\nfleetd's log:\n{}", self.fleet.log()),
        };
        assert_eq!(spawned["status"], "idle", "{spawned}");
        let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
        let pid = self.fleet.pane_pid(&pane)?;
        let command = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))?;
        anyhow::ensure!(
            command.starts_with(&format!("{runtime}\0")),
            "the pane runs {command:?}"
        );
        Ok(pane)
    }

    /// The agent `name` in `pane` answers a task, then its own shell takes `looks` and writes
    /// into its working directory `workdir`.
    pub(super) async fn round_trip_and_look(
        &self,
        name: &str,
        pane: &str,
        looks: &Looks,
        workdir: &Path,
    ) -> anyhow::Result<()> {
        let (fleet, lead) = (&self.fleet, &self.lead);
        let sent = ask(fleet, lead, name, pane, "hello from the lead").await?;
        assert_eq!(sent["reply"]["text"], "echo: hello from the lead", "{sent}");
        let made = workdir.join("made-inside");
        let task = format!("run: {} && touch '{}'", looks.command(), made.display());
        let sent = ask(fleet, lead, name, pane, &task).await?;
        looks.check(sent["reply"]["text"].as_str().unwrap_or_default());
        assert!(
            made.is_file(),
            "the agent could not write its working directory: {sent}"
        );
        Ok(())
    }
}

/// A real agent of `agent_kind` (its program `agent`) spawned into bubblewrap by fleetd, with
/// a sandboxed scripted worker beside it: the agent answers a task, and its own shell finds the
/// hidden paths hidden and its own working directory there.
async fn a_real_agent_in_bwrap(agent_kind: &str, agent: &str) -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let workdir = tempfile::tempdir()?;
    let other_workdir = tempfile::tempdir()?;
    let profiles = format!(
        "{}\n{}",
        bwrap_agent_profile(
            "boxed",
            agent_kind,
            agent,
            workdir.path(),
            &model.base_url()
        ),
        bwrap_profile("plain", other_workdir.path())?
    );
    let user = UsersFleet::start(&profiles).await?;
    let other = user.lead.spawn("plain", "other").await?;
    let state = user.fleet.state_dir();
    let other_dir = state
        .join("workers")
        .join(other["gid"].as_str().unwrap_or_default());
    let token = state.join("leads/lead.token");
    assert!(other_dir.is_dir() && token.is_file(), "{other}");

    let pane = user.spawn_in("boxed", "agent", "bwrap").await?;
    let looks = Looks {
        hidden: vec![token, user.settings.clone(), other_dir, state.join("leads")],
        seen: vec![workdir.path().to_path_buf()],
    };
    user.round_trip_and_look("agent", &pane, &looks, workdir.path())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_in_bwrap_answers_unattended_and_sees_nothing_it_should_not()
-> anyhow::Result<()> {
    a_real_agent_in_bwrap("claude-code", &claude_binary()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_opencode_in_bwrap_answers_unattended_and_sees_nothing_it_should_not()
-> anyhow::Result<()> {
    a_real_agent_in_bwrap("opencode", &opencode_binary()).await
}
