//! `fleetd init`, as a newcomer meets it: a fresh home, one command, then a real Claude Code
//! lead (its model the scripted one) lists, spawns, sends, gets the answer and stops, with no
//! prompt and no file edited by hand; the token rotated, it goes on; undone, the tools are gone.

use std::path::Path;
use std::process::Output;

use fleet_testkit::bins::binary;
use fleet_testkit::fleet::{Fleet, TEST_API_KEY, claude_binary, sim_profile};
use fleet_testkit::model::ModelSim;
use serde_json::Value;

/// `claude ARGS` as the newcomer's lead: in `home`, its model `model`, nothing else set up.
fn lead_command(home: &Path, model: &ModelSim, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(claude_binary());
    command
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        .env_remove("CLAUDE_CONFIG_DIR")
        .env("ANTHROPIC_BASE_URL", model.base_url())
        .env("ANTHROPIC_API_KEY", TEST_API_KEY)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("ENABLE_TOOL_SEARCH", "false")
        .env_remove("FLEET_TOKEN");
    command
}

/// `claude -p PROMPT` as the newcomer's lead.
async fn lead_says(home: &Path, model: &ModelSim, prompt: &str) -> anyhow::Result<String> {
    let out = lead_command(home, model, &["-p", prompt]).output().await?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// What Claude Code's user settings in `home` allow without asking.
fn allowed(home: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(home.join(".claude/settings.json"))?;
    Ok(serde_json::from_str::<Value>(&text)?["permissions"]["allow"].clone())
}

/// `fleetd init ARGS` against `fleet`'s config and state, in `home`.
fn init(fleet: &Fleet, home: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let claude = claude_binary();
    let mut all = vec!["init"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--claude", &claude]);
    let mut command = fleet.cli_command(&all)?;
    command.env("HOME", home).env_remove("CLAUDE_CONFIG_DIR");
    Ok(command.output()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_fleetd_init_a_fresh_claude_code_lead_drives_the_fleet_without_a_prompt()
-> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let model = ModelSim::start().await?;
    let home = tempfile::tempdir()?;
    let home = home.path();
    // Before: Claude Code has no fleet tools.
    let before = lead_says(home, &model, "call: fleet_list").await?;
    assert!(before.contains("no tool fleet_list"), "{before}");

    // A `fleet` server the user registered by hand is left alone: init says so and stops.
    let claude = |args: &[&str]| {
        std::process::Command::new(claude_binary())
            .args(args)
            .env("HOME", home)
            .env_remove("CLAUDE_CONFIG_DIR")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .output()
    };
    let theirs = claude(&[
        "mcp",
        "add",
        "-s",
        "user",
        "--transport",
        "http",
        "fleet",
        "http://127.0.0.1:9/mcp",
    ])?;
    assert!(theirs.status.success(), "{theirs:?}");
    let refused = init(&fleet, home, &[])?;
    assert!(!refused.status.success(), "{refused:?}");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("that fleetd init did not register; fleetd left it as it is"),
        "{why}"
    );
    assert!(std::fs::read_to_string(home.join(".claude.json"))?.contains("http://127.0.0.1:9/mcp"));
    let removed = claude(&["mcp", "remove", "fleet", "-s", "user"])?;
    assert!(removed.status.success(), "{removed:?}");

    let out = init(&fleet, home, &[])?;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for change in [
        "the config",
        "registered fleetd with Claude Code as the MCP server 'fleet'",
        "\"mcp__fleet\" added to permissions.allow",
        "gave Claude Code the skill 'fleetd'",
        "fleetd init --undo",
    ] {
        assert!(said.contains(change), "{change}: {said}");
    }
    assert_eq!(allowed(home)?, serde_json::json!(["mcp__fleet"]));
    // The token is in no file of Claude Code's: its helper reads it at each connection.
    let registered = std::fs::read_to_string(home.join(".claude.json"))?;
    assert!(registered.contains("mcp-headers lead"), "{registered}");
    assert!(!registered.contains(&fleet.token("lead")?), "{registered}");

    let listed = lead_says(home, &model, "call: fleet_list").await?;
    assert!(
        listed.contains("Done: ") && listed.contains("\"name\":\"lead\""),
        "{listed}\n{}",
        fleet.log()
    );
    let spawned = lead_says(
        home,
        &model,
        r#"call: fleet_spawn {"profile": "sim", "name": "w1"}"#,
    )
    .await?;
    assert!(spawned.contains("\"name\":\"w1\""), "{spawned}");
    let sent = lead_says(
        home,
        &model,
        r#"call: fleet_send {"to": "w1", "message": "hello from a newcomer", "wait_s": 30}"#,
    )
    .await?;
    assert!(sent.contains("echo: hello from a newcomer"), "{sent}");

    // A rotated token: the helper reads the new one; nothing to edit, nothing to export.
    let rotated = fleet.cli(&["token", "lead", "--rotate"])?;
    assert!(rotated.status.success(), "{rotated:?}");
    let stopped = lead_says(home, &model, r#"call: fleet_stop {"to": "w1"}"#).await?;
    assert!(
        stopped.contains("\"status\":\"gone\""),
        "{stopped}\n{}",
        fleet.log()
    );

    // Run again, it changes nothing twice.
    let again = init(&fleet, home, &[])?;
    assert!(again.status.success(), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stdout).contains("is kept as it is"));
    assert_eq!(allowed(home)?, serde_json::json!(["mcp__fleet"]));

    // Undone: the registration and the rule are gone, and with them the tools.
    let undone = init(&fleet, home, &["--undo"])?;
    assert!(undone.status.success(), "{undone:?}");
    assert_eq!(allowed(home)?, serde_json::json!([]));
    assert!(
        !home.join(".claude/skills/fleetd").exists(),
        "the skill is gone too"
    );
    let after = lead_says(home, &model, "call: fleet_list").await?;
    assert!(after.contains("no tool fleet_list"), "{after}");
    Ok(())
}

/// Without a config, `fleetd init` writes the starter one where fleetd looks for it; without
/// Claude Code it says what it did and what is left to do, naming the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_writes_the_starter_config_and_says_what_is_left_without_claude_code()
-> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let out = std::process::Command::new(binary("fleetd")?)
        .args(["init", "--claude", "/nonexistent/claude"])
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("XDG_STATE_HOME")
        .output()?;
    assert!(!out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    let config = home.path().join(".config/fleetd/fleetd.toml");
    assert!(
        said.contains(&format!("wrote the config {}", config.display())),
        "{said}"
    );
    assert!(said.contains("the lead 'lead' has its token in"), "{said}");
    assert!(
        err.contains("cannot run Claude Code as '/nonexistent/claude' (--claude PATH names it; then run fleetd init again)"),
        "{err}"
    );
    // The config written is the one fleetd now runs on.
    let doctor = std::process::Command::new(binary("fleetd")?)
        .arg("doctor")
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("XDG_STATE_HOME")
        .output()?;
    let first = String::from_utf8_lossy(&doctor.stdout);
    assert!(first.contains(&config.display().to_string()), "{first}");
    Ok(())
}

/// One Claude Code lead session that runs on: its turns come one by one on its stdin
/// (`--input-format stream-json`), over one connection to fleetd that it keeps.
struct RunningLead {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl RunningLead {
    fn start(home: &Path, model: &ModelSim) -> anyhow::Result<Self> {
        let mut child = lead_command(
            home,
            model,
            &[
                "-p",
                "--input-format",
                "stream-json",
                "--output-format",
                "stream-json",
                "--verbose",
            ],
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        Ok(Self {
            child,
            stdin,
            lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
        })
    }

    /// One turn: `prompt` in, the turn's result out (with every tool result it saw).
    async fn says(&mut self, prompt: &str) -> anyhow::Result<String> {
        use tokio::io::AsyncWriteExt;
        let turn =
            serde_json::json!({"type": "user", "message": {"role": "user", "content": prompt}});
        self.stdin.write_all(format!("{turn}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        let mut seen = String::new();
        let read = async {
            while let Some(line) = self.lines.next_line().await? {
                seen.push_str(&line);
                seen.push('\n');
                let event: Value = serde_json::from_str(&line).unwrap_or_default();
                if event["type"] == "result" {
                    return anyhow::Ok(());
                }
            }
            anyhow::bail!("Claude Code ended")
        };
        tokio::time::timeout(std::time::Duration::from_secs(60), read)
            .await
            .map_err(|_| anyhow::anyhow!("no result in 60 s"))??;
        Ok(seen)
    }
}

/// The docs' promise for a lead set up by `fleetd init` that is running when its token is
/// rotated: it goes on, with no restart and nothing edited. Claude Code 2.1.332, refused once
/// with the old token, runs the header helper again, which reads the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_lead_goes_on_after_its_token_is_rotated() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let model = ModelSim::start().await?;
    let home = tempfile::tempdir()?;
    let home = home.path();
    let out = init(&fleet, home, &[])?;
    assert!(out.status.success(), "{out:?}");
    // Each run of the header helper is counted (the test's own addition to the command init
    // registered): the session keeps its connection, and its token, until refused.
    let registered = home.join(".claude.json");
    let mut known: Value = serde_json::from_str(&std::fs::read_to_string(&registered)?)?;
    let runs = home.join("helper-runs");
    let helper = &mut known["mcpServers"]["fleet"]["headersHelper"];
    let counted = format!(
        "{} && echo ran >> {}",
        helper.as_str().unwrap_or_default(),
        runs.display()
    );
    *helper = Value::String(counted);
    std::fs::write(&registered, known.to_string())?;
    let ran = || {
        std::fs::read_to_string(&runs)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let mut lead = RunningLead::start(home, &model)?;
    // The skill init gave it: Claude Code loaded it.
    let first = lead.says("hello").await?;
    let loaded: Vec<Value> = first
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["subtype"] == "init")
        .collect();
    assert!(
        loaded.iter().any(|e| e["skills"]
            .as_array()
            .is_some_and(|s| s.contains(&Value::from("fleetd")))),
        "{first}"
    );
    for _ in 0..2 {
        let listed = lead.says("call: fleet_list").await?;
        assert!(
            listed.contains(r#"\"name\":\"lead\""#),
            "{listed}\n{}",
            fleet.log()
        );
    }
    assert_eq!(ran(), 1, "one connection, its token read once");
    let before = fleet.token("lead")?;
    let rotated = fleet.cli(&["token", "lead", "--rotate"])?;
    assert!(rotated.status.success(), "{rotated:?}");
    assert_ne!(fleet.token("lead")?, before, "the token changed");
    let spawned = lead
        .says(r#"call: fleet_spawn {"profile": "sim", "name": "w1"}"#)
        .await?;
    assert!(
        spawned.contains(r#"\"name\":\"w1\""#),
        "the running lead did not go on: {spawned}\n{}",
        fleet.log()
    );
    assert_eq!(ran(), 2, "refused once, the helper read the new token");
    lead.child.kill().await?;
    Ok(())
}
