//! Hostile input, one case per row: what a lead relaying web content, a worker's reply or a
//! broker message might hold. Each row is refused with an error that names what is wrong, or
//! reaches the agent as inert text; after every row the gateway still serves, and at the end
//! what was accepted before the rows (a held reply) is still there, exactly once. On a real
//! fleetd with real tmux and the scripted agent in real panes.
//!
//! The same issue's other items, each tested where its machinery lives:
//! - typed text off the broker: `federation.rs` (a forged SEND holding an ESC: FAILED to its
//!   sender, dead-lettered, never typed); tmux's own handling of hostile paths and command
//!   lines: `fleet-mux/tests/tmux.rs`;
//! - secrets: `cli.rs` and `claude.rs` (`mcp-config` keeps the token out of files and argv),
//!   `auth.rs` (a literal `${FLEET_TOKEN}` bearer), `fleet-mux/tests/tmux.rs` (a timeout names
//!   no token), config and launch unit tests (`Debug` masks);
//! - sandboxes hiding the keys: `sandbox.rs`;
//! - Claude Code's trust file: `claude.rs` (parallel spawns keep it whole) and
//!   `launch/trust.rs`;
//! - bounds: `federation.rs` (size off the broker, held cap off the broker, forged presence
//!   flood), `badinput.rs` (held cap), `auth.rs` (long calls, sessions), `audit.rs`;
//! - misconfigurations: `cli.rs` (an isolated claude-code home without a login refused at
//!   start), `delivery.rs` (a worker still drawing its screen gets its first task).

use std::path::Path;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, claude_profile, sim_profile};
use fleet_testkit::herdr::TestHerdr;
use fleet_testkit::model::ModelSim;
use serde_json::{Value, json};

/// The paste breakout of the issue: an end-of-paste marker, a CR that would submit, and a line
/// that would arrive as typed keys.
const BREAKOUT: &str = "echo part-one\u{1b}[201~\recho smuggled-two\r";

/// Sends [`BREAKOUT`] to `to`: refused, naming the escape; then `w` still takes its next task.
async fn breakout_is_refused(lead: &Client, to: &str, wait_s: u64) -> anyhow::Result<Value> {
    let got = lead
        .call("fleet_send", json!({"to": to, "message": BREAKOUT}))
        .await?
        .expect_err("the breakout was accepted");
    anyhow::ensure!(
        got.code == "invalid_params" && got.message.contains("U+001B (ESC), at character 13"),
        "{got}"
    );
    let sent = lead.send(to, "the next task", wait_s).await?;
    anyhow::ensure!(sent["status"] == "replied", "{sent}");
    Ok(sent)
}

/// A row that must be refused: the tool, its arguments, the error code and a fragment of the
/// message that names what is wrong.
struct Refused {
    what: &'static str,
    tool: &'static str,
    args: Value,
    code: &'static str,
    names: String,
}

fn refused(
    what: &'static str,
    tool: &'static str,
    args: Value,
    code: &'static str,
    names: impl Into<String>,
) -> Refused {
    Refused {
        what,
        tool,
        args,
        code,
        names: names.into(),
    }
}

/// The gateway still serves: it lists its fleet, `w1` among it.
async fn still_serves(lead: &Client, after: &str) -> anyhow::Result<()> {
    let names = lead.names().await?;
    anyhow::ensure!(
        names.contains(&"w1".to_string()),
        "after {after}: w1 is missing from {names:?}"
    );
    Ok(())
}

/// What `w1`-like worker `name` answers to `task`.
async fn answer(lead: &Client, name: &str, task: &str) -> anyhow::Result<String> {
    let sent = lead.send(name, task, 20).await?;
    anyhow::ensure!(sent["status"] == "replied", "{task}: {sent}");
    Ok(sent["reply"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_paths_and_names_are_refused_or_inert_and_nothing_is_lost()
-> anyhow::Result<()> {
    let profiles = format!(
        "{}{}single_line = true\n",
        sim_profile("sim", &[])?,
        sim_profile("oneline", &[])?
    );
    let fleet = Fleet::start("", &profiles).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("sim", "w1").await?;
    lead.spawn("oneline", "sh1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    // Accepted before the rows: a reply held for the lead.
    let pending = lead.send("w1", "/slow 300 kept", 0).await?;
    assert_eq!(pending["status"], "pending", "{pending}");

    let places = tempfile::tempdir()?;
    let state = std::fs::canonicalize(fleet.state_dir())?;
    std::os::unix::fs::symlink(state.join("leads"), places.path().join("into-state"))?;
    // Refused before tmux sees it (tmux's own refusal is tested in fleet-mux's tmux tests).
    let newline = places.path().join(format!(
        "x\nrun-shell touch {}",
        places.path().join("ran").display()
    ));

    let rows = [
        // 1. Typed text is text.
        refused(
            "a bracketed-paste breakout",
            "fleet_send",
            json!({"to": "w1", "message": BREAKOUT}),
            "invalid_params",
            "U+001B (ESC), at character 13",
        ),
        refused(
            "Ctrl-C",
            "fleet_send",
            json!({"to": "w1", "message": "stop\u{3}"}),
            "invalid_params",
            "U+0003 (Ctrl-C), at character 4",
        ),
        refused(
            "a C1 CSI (ESC [ to many terminals)",
            "fleet_send",
            json!({"to": "w1", "message": "x\u{9b}201~"}),
            "invalid_params",
            "U+009B (CSI), at character 1",
        ),
        refused(
            "DEL",
            "fleet_send",
            json!({"to": "w1", "message": "rm\u{7f}"}),
            "invalid_params",
            "U+007F (DEL)",
        ),
        refused(
            "Shift+Tab in a broadcast",
            "fleet_broadcast",
            json!({"message": "mode switch \u{1b}[Z"}),
            "invalid_params",
            "U+001B (ESC), at character 12",
        ),
        refused(
            "a second line for a program that takes one line at a time",
            "fleet_send",
            json!({"to": "sh1", "message": "ls\nrm -rf ~"}),
            "invalid_params",
            "line break at character 2, and 'sh1' takes one line at a time",
        ),
        // 2. Paths are paths.
        refused(
            "a cwd with a newline and a control-mode command",
            "fleet_spawn",
            json!({"profile": "sim", "cwd": newline}),
            "invalid_params",
            "U+000A",
        ),
        refused(
            "a cwd linking into the state dir",
            "fleet_spawn",
            json!({"profile": "sim", "cwd": places.path().join("into-state")}),
            "invalid_params",
            "state dir",
        ),
        refused(
            "the state dir itself",
            "fleet_spawn",
            json!({"profile": "sim", "cwd": state}),
            "invalid_params",
            "state dir",
        ),
        refused(
            "/ (which holds the state dir)",
            "fleet_spawn",
            json!({"profile": "sim", "cwd": "/"}),
            "invalid_params",
            "holds fleetd's state dir",
        ),
        refused(
            "a cwd that is a file",
            "fleet_spawn",
            json!({"profile": "sim", "cwd": "/etc/hostname"}),
            "invalid_params",
            "not a directory",
        ),
        // 3. Names map one to one.
        refused(
            "a name tmux would fold into another",
            "fleet_spawn",
            json!({"profile": "sim", "name": "w.1"}),
            "invalid_params",
            "'w.1' and 'w_1'",
        ),
        refused(
            "the control session's name",
            "fleet_spawn",
            json!({"profile": "sim", "name": "_fleetd"}),
            "invalid_params",
            "'_fleetd'",
        ),
        refused(
            "a duplicate name",
            "fleet_spawn",
            json!({"profile": "sim", "name": "w1"}),
            "invalid_params",
            format!(
                "taken by worker w1 (gid {}",
                spawned["gid"].as_str().unwrap_or("?")
            ),
        ),
    ];
    for row in rows {
        let got = lead
            .call(row.tool, row.args.clone())
            .await?
            .expect_err(&format!(
                "{}: {} {} was accepted",
                row.what, row.tool, row.args
            ));
        assert_eq!(got.code, row.code, "{}: {got}", row.what);
        assert!(
            got.message.contains(&row.names),
            "{}: the error does not name '{}': {got}",
            row.what,
            row.names
        );
        still_serves(&lead, row.what).await?;
    }
    assert!(
        !fleet.screen(&pane)?.contains("smuggled"),
        "the smuggled line reached the worker"
    );

    // Inert: line ends arrive as one task with newlines.
    assert_eq!(
        answer(&lead, "w1", "line one\r\nline two\rthree").await?,
        "echo: line one\nline two\nthree"
    );
    // Inert: tmux formats in a path are a path (the worker runs there, nothing runs).
    let owned = places.path().join("owned");
    for (name, dir) in [
        (
            "p1",
            places.path().join(format!("#(touch {})", owned.display())),
        ),
        ("p2", places.path().join("C#Sharp")),
        ("p3", places.path().join("#{pane_id} #S ##")),
    ] {
        std::fs::create_dir_all(&dir)?;
        let spawned = lead
            .ok(
                "fleet_spawn",
                json!({"profile": "sim", "name": name, "cwd": dir}),
            )
            .await?;
        assert_eq!(spawned["name"], name);
        assert_eq!(
            answer(&lead, name, "/pwd").await?,
            std::fs::canonicalize(&dir)?.display().to_string(),
            "{name} runs in {}",
            dir.display()
        );
    }
    assert!(!owned.exists(), "a tmux format in a cwd ran a command");

    // What was accepted before the rows is still there, once.
    let held = lead.poll(20).await?;
    let kept: Vec<&Value> = held.iter().filter(|m| m["text"] == "echo: kept").collect();
    assert_eq!(kept.len(), 1, "{held:?}");
    assert!(lead.poll(0).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_workdir_roots_a_cwd_outside_them_is_forbidden() -> anyhow::Result<()> {
    let roots = tempfile::tempdir()?;
    let inside = roots.path().join("app");
    std::fs::create_dir(&inside)?;
    let outside = tempfile::tempdir()?;
    let fleet = Fleet::start(
        &format!("workdir_roots = [{:?}]", roots.path().display().to_string()),
        &sim_profile("sim", &[])?,
    )
    .await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    for dir in [Path::new("/"), outside.path()] {
        let err = lead
            .call("fleet_spawn", json!({"profile": "sim", "cwd": dir}))
            .await?
            .expect_err("a cwd outside the roots");
        assert_eq!(err.code, "forbidden", "{}: {err}", dir.display());
        assert!(err.message.contains("gateway.workdir_roots"), "{err}");
    }
    lead.ok(
        "fleet_spawn",
        json!({"profile": "sim", "name": "w1", "cwd": inside}),
    )
    .await?;
    assert_eq!(
        answer(&lead, "w1", "/pwd").await?,
        std::fs::canonicalize(&inside)?.display().to_string()
    );
    Ok(())
}

/// The breakout on herdr: the stand-in, and the real herdr `HERDR_BIN` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paste_breakout_never_reaches_a_worker_on_herdr() -> anyhow::Result<()> {
    let mut servers = vec![TestHerdr::standin().await?];
    servers.extend(TestHerdr::real().await?);
    for herdr in servers {
        let fleet = Fleet::start_herdr(&herdr.socket(), &sim_profile("sim", &[])?).await?;
        let lead = fleet.lead("lead", Protocol::Stateless).await?;
        let pane = lead.spawn("sim", "w1").await?["pane"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let sent = breakout_is_refused(&lead, "w1", 20).await?;
        assert_eq!(sent["reply"]["text"], "echo: the next task");
        let screen = herdr
            .driver()
            .call(fleet_mux::herdr::codec::pane_read(
                &pane,
                fleet_mux::herdr::codec::Source::RecentUnwrapped,
            ))
            .await?;
        let text = fleet_mux::herdr::codec::read_text(&screen)?;
        assert!(!text.contains("smuggled"), "{text}");
    }
    Ok(())
}

/// The breakout against a real Claude Code worker (on the scripted model): refused, so its
/// model never hears of it, and the worker takes its next task; and tasks that open with
/// Claude Code's command characters reach its model as tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paste_breakout_never_reaches_a_real_claude_code_worker() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let fleet = Fleet::start("", &claude_profile("claude", &model.base_url())).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let pane = lead.spawn("claude", "c1").await?["pane"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let before = model.requests();
    let sent = match breakout_is_refused(&lead, "c1", 90).await {
        Ok(sent) => sent,
        Err(e) => anyhow::bail!("{e}\nc1's screen:\n{}", fleet.screen(&pane)?),
    };
    assert_eq!(sent["reply"]["text"], "echo: the next task");
    assert!(model.requests() > before, "the next task reached the model");
    // A task opening with Claude Code's own command characters is a task, not a command:
    // `!` would run the rest in a shell, `/` a slash command.
    let marker = tempfile::tempdir()?;
    let ran = marker.path().join("ran");
    for task in [format!("!touch {}", ran.display()), "/add-dir /etc".into()] {
        let sent = lead.send("c1", &task, 90).await?;
        assert_eq!(
            sent["reply"]["text"],
            format!("echo: [fleet task from lead]\n{task}"),
            "{sent}\n{}",
            fleet.screen(&pane)?
        );
    }
    assert!(!ran.exists(), "Claude Code ran a task as a shell command");
    assert!(
        !fleet.screen(&pane)?.contains("smuggled"),
        "{}",
        fleet.screen(&pane)?
    );
    Ok(())
}
