//! Real Claude Code workers (the pinned npm release `./test.sh` installs), spawned by fleetd in
//! real tmux panes; only the model is scripted (`fleet_testkit::model`: it answers every typed
//! task by calling `fleet_reply` with `echo: <task>`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, TEST_API_KEY, claude_binary, claude_profile};
use fleet_testkit::model::ModelSim;
use serde_json::{Value, json};

use super::dialogs::keys;

/// How often a test looks at the user's settings file while workers start.
const SETTINGS_LOOK: Duration = Duration::from_millis(5);

/// A fleet whose profile `claude` is a real Claude Code on the scripted model, with one such
/// worker `c1` spawned.
async fn fleet_with_claude() -> anyhow::Result<(ModelSim, Fleet, Client, String)> {
    fleet_with_claude_and("").await
}

/// [`fleet_with_claude`], its profile with the `keys` lines added.
async fn fleet_with_claude_and(keys: &str) -> anyhow::Result<(ModelSim, Fleet, Client, String)> {
    let model = ModelSim::start().await?;
    let profile = format!("{}{keys}", claude_profile("claude", &model.base_url()));
    let fleet = Fleet::start("", &profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("claude", "c1").await?;
    assert_eq!(spawned["status"], "idle", "{spawned}");
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    Ok((model, fleet, lead, pane))
}

/// Sends `task` to c1 and returns the result, with c1's screen and fleetd's log on failure.
async fn ask_c1(fleet: &Fleet, lead: &Client, pane: &str, task: &str) -> anyhow::Result<Value> {
    match lead.send("c1", task, 90).await {
        Ok(sent) if sent["reply"].is_object() => Ok(sent),
        outcome => anyhow::bail!(
            "{outcome:?}\nc1's screen:\n{}\nfleetd's log:\n{}",
            fleet.screen(pane).unwrap_or_default(),
            fleet.log()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_worker_answers_through_fleet_reply() -> anyhow::Result<()> {
    let (model, fleet, lead, pane) = fleet_with_claude().await?;
    let sent = ask_c1(&fleet, &lead, &pane, "hello from the lead").await?;
    assert_eq!(sent["reply"]["text"], "echo: hello from the lead");
    assert!(model.requests() >= 1, "the model saw no request");
    // A second task goes into the same session once the first turn is over.
    let sent = ask_c1(&fleet, &lead, &pane, "and a second one").await?;
    assert_eq!(sent["reply"]["text"], "echo: and a second one");
    // Claude Code's calls are plain stateless ones: its answers take the short way.
    let direct = super::direct::served_as_seen_by(&fleet, "lead", "fleet_reply", "direct").await?;
    assert_eq!(direct, 2.0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_multi_line_task_reaches_claude_code_intact() -> anyhow::Result<()> {
    let (_model, fleet, lead, pane) = fleet_with_claude().await?;
    let task: String = (1..=30)
        .map(|n| format!("step {n:02}: check the module and write down what it does, briefly\n"))
        .collect::<String>()
        .trim_end()
        .to_string();
    assert!(task.len() > 1_000, "{}", task.len());
    let sent = ask_c1(&fleet, &lead, &pane, &task).await?;
    assert_eq!(sent["reply"]["text"], format!("echo: {task}"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_ending_in_a_backslash_is_submitted_to_claude_code_as_it_was_sent()
-> anyhow::Result<()> {
    // Claude Code reads a backslash before Enter as "a newline, not a submit".
    let (_model, fleet, lead, pane) = fleet_with_claude().await?;
    for task in [
        "continue the line \\",
        "two lines\nthe second ends in one \\",
    ] {
        let sent = ask_c1(&fleet, &lead, &pane, task).await?;
        assert_eq!(sent["reply"]["text"], format!("echo: {task}"), "{sent}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_worker_asks_mid_task_and_uses_the_answer() -> anyhow::Result<()> {
    let (_model, fleet, lead, pane) = fleet_with_claude().await?;
    let sent = lead
        .send("c1", "ask: which port should the server use?", 90)
        .await?;
    if sent["status"] != "asked" {
        anyhow::bail!(
            "{sent}\nc1's screen:\n{}",
            fleet.screen(&pane).unwrap_or_default()
        );
    }
    assert_eq!(sent["ask"]["question"], "which port should the server use?");
    let answered = lead
        .ok(
            "fleet_send",
            serde_json::json!({"turn_id": sent["ask"]["turn_id"], "message": "8080", "wait_s": 90}),
        )
        .await?;
    // The model read the answer from fleet_ask's result (Claude Code hands it the tool
    // result's JSON text).
    let reply = answered["reply"]["text"].as_str().unwrap_or_default();
    assert!(
        reply.starts_with("asked which port should the server use?, heard: ")
            && reply.contains("8080"),
        "{answered}\nc1's screen:\n{}",
        fleet.screen(&pane).unwrap_or_default()
    );
    Ok(())
}

/// The lead's side, as a user does it: the export line and the `claude mcp add` line that
/// `fleetd mcp-config` prints by default, run in one shell, connect a real Claude Code to fleetd
/// (it expands `${FLEET_TOKEN}` itself), and the token is in no file Claude Code wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_connects_claude_code_with_the_lines_mcp_config_prints() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    let out = fleet.cli(&["mcp-config", "lead"])?;
    let text = String::from_utf8(out.stdout)?;
    let line = |start: &str| {
        text.lines()
            .find(|l| l.starts_with(start))
            .ok_or(anyhow::anyhow!("no '{start}' line in {text}"))
    };
    let script = format!(
        "{}\n{} >/dev/null\nclaude mcp list",
        line("export FLEET_TOKEN=")?,
        line("claude mcp add ")?
    );
    let home = tempfile::tempdir()?;
    let project = home.path().join("project");
    std::fs::create_dir(&project)?;
    let claude = std::path::PathBuf::from(claude_binary());
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(dir) = claude.parent().filter(|d| !d.as_os_str().is_empty()) {
        path = std::env::join_paths(
            std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path)),
        )?;
    }
    let out = tokio::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(&project)
        .env("HOME", home.path())
        .env("PATH", path)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env_remove("FLEET_TOKEN")
        .output()
        .await?;
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("fleet: ") && listed.contains("Connected") && !listed.contains("Failed"),
        "{listed}\n{}\nfleetd's log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        fleet.log()
    );
    let stored = std::fs::read_to_string(home.path().join(".claude.json"))?;
    assert!(stored.contains("Bearer ${FLEET_TOKEN}"), "{stored}");
    assert!(!stored.contains(&fleet.token("lead")?), "{stored}");
    Ok(())
}

/// A profile of real Claude Code workers on the user's own settings (fleetd's `HOME`), their
/// model the scripted one at `base_url`.
fn own_settings_profile(base_url: &str) -> String {
    format!(
        "[[profiles]]\nname = \"claude\"\nkind = \"claude-code\"\nargv = [{:?}]\nbase_url = \"{base_url}\"\nenv = {{ ANTHROPIC_API_KEY = \"{TEST_API_KEY}\" }}\nready_timeout_s = 90\n",
        claude_binary()
    )
}

/// A user's home of its own in `dir` (its `.claude.json`: onboarding done and the key approved,
/// as a user's is, and `note` kept there), `n` project directories under `dir/work`, and a
/// fleetd whose `HOME` it is, with profiles `profiles` and `dir/work` as its root.
async fn fleet_in_a_users_home(
    dir: &Path,
    note: &str,
    n: usize,
    profiles: &str,
) -> anyhow::Result<(PathBuf, Vec<PathBuf>, Fleet)> {
    let home = dir.join("home");
    std::fs::create_dir(&home)?;
    let approved = &TEST_API_KEY[TEST_API_KEY.len() - 20..];
    std::fs::write(
        home.join(".claude.json"),
        serde_json::to_string_pretty(&json!({
            "hasCompletedOnboarding": true,
            "lastOnboardingVersion": "2.1.332",
            "theme": "dark",
            "customApiKeyResponses": {"approved": [approved], "rejected": []},
            "fleetTestNote": note,
        }))?,
    )?;
    let work = dir.join("work");
    let cwds: Vec<PathBuf> = (1..=n).map(|i| work.join(format!("project-{i}"))).collect();
    for cwd in &cwds {
        std::fs::create_dir_all(cwd)?;
    }
    let home_text = home.display().to_string();
    let fleet = Fleet::start_with_env(
        &std::env::temp_dir(),
        &format!("workdir_roots = [{:?}]", work.display().to_string()),
        profiles,
        &[("HOME", Some(&home_text)), ("CLAUDE_CONFIG_DIR", None)],
    )
    .await?;
    Ok((home, cwds, fleet))
}

/// A fleet started in a user's home of the test's own (its profile `claude`: `profile`, with the
/// scripted model's URL for `{base_url}`), whose spawn of `claude` must come back `blocked` on a
/// dialog of Claude Code's start (at once, not after the profile's 90 s), naming what would have
/// settled it: the spawn's answer, the lead, the fleet, the model, the test's directory (the
/// home lives as long as it does), and the home.
struct BlockedAtStart {
    spawned: Value,
    lead: Client,
    fleet: Fleet,
    _model: ModelSim,
    _dir: tempfile::TempDir,
    home: PathBuf,
}

async fn blocked_at_start(profile: &str) -> anyhow::Result<BlockedAtStart> {
    let model = ModelSim::start().await?;
    let dir = tempfile::tempdir()?;
    let profile = profile.replace("{base_url}", &model.base_url());
    let (home, cwds, fleet) = fleet_in_a_users_home(dir.path(), "", 1, &profile).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead
        .ok(
            "fleet_spawn",
            json!({"profile": "claude", "name": "c1", "cwd": cwds[0].display().to_string()}),
        )
        .await?;
    assert_eq!(spawned["status"], "blocked", "{spawned}\n{}", fleet.log());
    assert!(
        spawned["note"]
            .as_str()
            .is_some_and(|n| n.contains("while starting")),
        "{spawned}"
    );
    Ok(BlockedAtStart {
        spawned,
        lead,
        fleet,
        _model: model,
        _dir: dir,
        home,
    })
}

/// The choice whose label holds `label` of the dialog `spawned` stopped on, which must say
/// `prompt`.
fn choice_offered(spawned: &Value, prompt: &str, label: &str) -> String {
    let dialog = &spawned["dialog"];
    assert!(
        dialog["prompt"]
            .as_str()
            .is_some_and(|p| p.contains(prompt)),
        "{spawned}"
    );
    let choice = dialog["choices"]
        .as_array()
        .and_then(|choices| {
            choices
                .iter()
                .find(|c| c["label"].as_str().is_some_and(|l| l.contains(label)))
        })
        .and_then(|c| c["choice"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(!choice.is_empty(), "no choice '{label}': {spawned}");
    choice
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_dialog_fleetd_did_not_settle_is_asked_of_the_lead_whose_answer_starts_the_worker()
-> anyhow::Result<()> {
    // The user's own settings, and a profile that leaves them alone: Claude Code asks whether
    // the folder is trusted, and nobody is at its screen but the lead.
    let profile = format!(
        "{}trust_workdir = false\n",
        own_settings_profile("{base_url}")
    );
    let started = blocked_at_start(&profile).await?;
    let (spawned, lead, fleet) = (&started.spawned, &started.lead, &started.fleet);
    let dialog = &spawned["dialog"];
    let yes = choice_offered(spawned, "trust", "Yes, I trust this folder");
    let answered = lead
        .ok(
            "fleet_send",
            json!({"turn_id": dialog["turn_id"], "choice": yes, "wait_s": 90}),
        )
        .await?;
    let pane = spawned["pane"].as_str().unwrap_or_default();
    assert_eq!(
        answered["status"],
        "answered",
        "{answered}\nc1's screen:\n{}\n{}",
        fleet.screen(pane).unwrap_or_default(),
        fleet.log()
    );
    assert!(
        answered["note"]
            .as_str()
            .is_some_and(|n| n.contains("ready for tasks")),
        "{answered}"
    );
    let sent = ask_c1(fleet, lead, pane, "trusted now").await?;
    assert_eq!(sent["reply"]["text"], "echo: trusted now");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_mode_on_the_users_own_settings_asks_its_warning_and_no_ends_the_worker()
-> anyhow::Result<()> {
    // Bypass mode asked for on the user's own login: fleetd records no consent there, so Claude
    // Code shows its warning (told it is sandboxed, as root it would refuse the mode outright).
    let profile = format!(
        "{}permission_mode = \"bypassPermissions\"\n",
        own_settings_profile("{base_url}").replace(
            "env = { ANTHROPIC_API_KEY",
            "env = { IS_SANDBOX = \"1\", ANTHROPIC_API_KEY"
        )
    );
    let started = blocked_at_start(&profile).await?;
    let (spawned, lead, fleet) = (&started.spawned, &started.lead, &started.fleet);
    let dialog = &spawned["dialog"];
    // The lead declines: Claude Code exits, and so the worker ends, the answer saying so.
    let no = choice_offered(spawned, "Bypass Permissions", "No, exit");
    let ended = lead
        .call(
            "fleet_send",
            json!({"turn_id": dialog["turn_id"], "choice": no, "wait_s": 60}),
        )
        .await?
        .expect_err("a worker whose program exited");
    assert_eq!(ended.code, "not_ready", "{ended}\n{}", fleet.log());
    assert!(
        ended.message.contains("ended before it was ready"),
        "{ended}"
    );
    fleet_testkit::wait::until("its pane to close", Duration::from_secs(20), || async {
        fleet.panes().ok().filter(|panes| panes.is_empty())
    })
    .await?;
    assert!(
        !started.home.join(".claude/settings.json").exists(),
        "the user's settings were given the consent"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_spawns_keep_the_users_settings_whole_and_trust_each_directory()
-> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let dir = tempfile::tempdir()?;
    // The user's home (this test's own).
    let (home, cwds, fleet) = fleet_in_a_users_home(
        dir.path(),
        "the user's own, kept",
        3,
        &own_settings_profile(&model.base_url()),
    )
    .await?;
    let settings = home.join(".claude.json");
    let lead = fleet.lead("lead", Protocol::Stateless).await?;

    // While they start, every read of the file finds it whole.
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = tokio::spawn({
        let (settings, watching) = (settings.clone(), Arc::clone(&watching));
        async move {
            let (mut reads, mut torn) = (0usize, Vec::new());
            let mut looks = tokio::time::interval(SETTINGS_LOOK);
            while watching.load(Ordering::Relaxed) {
                looks.tick().await;
                if let Ok(text) = tokio::fs::read_to_string(&settings).await {
                    reads += 1;
                    if serde_json::from_str::<Value>(&text).is_err() {
                        torn.push(text);
                    }
                }
            }
            (reads, torn)
        }
    });
    let spawn = |i: usize| {
        lead.ok(
            "fleet_spawn",
            json!({"profile": "claude", "name": format!("c{i}"), "cwd": cwds[i - 1]}),
        )
    };
    let spawned = tokio::join!(spawn(1), spawn(2), spawn(3));
    watching.store(false, Ordering::Relaxed);
    let (reads, torn) = watcher.await?;
    for result in [spawned.0, spawned.1, spawned.2] {
        let result = result.with_context(|| fleet.log())?;
        assert_eq!(result["status"], "idle", "{result}");
    }
    assert!(
        reads > 0 && torn.is_empty(),
        "{reads} reads, torn: {torn:?}"
    );

    let now: Value = serde_json::from_str(&std::fs::read_to_string(&settings)?)?;
    assert_eq!(now["fleetTestNote"], "the user's own, kept", "{now}");
    for cwd in &cwds {
        let key = std::fs::canonicalize(cwd)?.display().to_string();
        assert_eq!(
            now["projects"][&key]["hasTrustDialogAccepted"], true,
            "{key}: {now}"
        );
    }
    // None of fleetd's temporary files is left beside it.
    let strays: Vec<String> = std::fs::read_dir(&home)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("fleetd"))
        .collect();
    assert!(strays.is_empty(), "{strays:?}");
    // And the workers work.
    let sent = lead.send("c2", "hello from the lead", 90).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello from the lead", "{sent}");
    Ok(())
}

/// Issue 32: preparing a claude-code worker may wait up to 15 s on Claude Code's lock on the
/// user's settings. Four such spawns at once, all waiting on a lock Claude Code holds, leave
/// a lead's round trip to another worker untouched (it is answered while all four still wait:
/// their preparation has threads of its own, apart from the store's); once the lock goes, all
/// four start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawns_waiting_on_claude_codes_settings_lock_hold_up_no_round_trip() -> anyhow::Result<()>
{
    let model = ModelSim::start().await?;
    let dir = tempfile::tempdir()?;
    let profiles = format!(
        "{}\n{}",
        own_settings_profile(&model.base_url()),
        fleet_testkit::fleet::sim_profile("sim", &[])?
    );
    let (home, cwds, fleet) = fleet_in_a_users_home(dir.path(), "", 4, &profiles).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(lead.spawn("sim", "w1").await?["status"], "idle");

    // Claude Code holds its lock (a live holder's: its time is ahead, so never stale).
    let lock = home.join(".claude.json.lock");
    std::fs::create_dir(&lock)?;
    std::fs::File::open(&lock)?
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(3_600))?;
    let mut spawns = Vec::new();
    for (i, cwd) in cwds.iter().enumerate() {
        let (lead, cwd) = (fleet.lead("lead", Protocol::Stateless).await?, cwd.clone());
        spawns.push(tokio::spawn(async move {
            lead.ok(
                "fleet_spawn",
                json!({"profile": "claude", "name": format!("c{}", i + 1), "cwd": cwd}),
            )
            .await
        }));
    }
    fleet_testkit::wait::until(
        "the four to be spawning",
        Duration::from_secs(30),
        || async {
            let names = lead.names().await.ok()?;
            (1..=4)
                .all(|i| names.contains(&format!("c{i}")))
                .then_some(())
        },
    )
    .await?;

    // A round trip to w1 while all four wait on the lock (they give up after 15 s).
    let sent = lead.send("w1", "a round trip", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: a round trip", "{sent}");
    let waiting = spawns.iter().filter(|s| !s.is_finished()).count();
    assert_eq!(
        waiting,
        4,
        "the round trips waited for the spawns\n{}",
        fleet.log()
    );

    // Claude Code lets go: all four start.
    std::fs::remove_dir(&lock)?;
    for spawn in spawns {
        let spawned = spawn.await?.with_context(|| fleet.log())?;
        assert_eq!(spawned["status"], "idle", "{spawned}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_worker_starts_in_the_permission_mode_its_profile_names()
-> anyhow::Result<()> {
    let (_model, fleet, lead, pane) =
        fleet_with_claude_and("permission_mode = \"dontAsk\"\n").await?;
    // The pane's program was started with the mode, and Claude Code took it (it got ready,
    // and answers below).
    let pid = fleet.pane_pid(&pane)?;
    let argv = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let argv: Vec<String> = argv
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let at = argv
        .iter()
        .position(|a| a == "--permission-mode")
        .with_context(|| format!("no --permission-mode in {argv:?}"))?;
    assert_eq!(argv[at + 1], "dontAsk");
    let sent = ask_c1(&fleet, &lead, &pane, "hello in dontAsk").await?;
    assert_eq!(sent["reply"]["text"], "echo: hello in dontAsk");
    Ok(())
}

/// A real Claude Code worker in manual mode stops on its own permission prompt before a shell
/// command. The lead's open send hears it as `blocked`, with the dialog's text and choices read
/// off the screen; nothing has run yet, and `fleet_list` shows the worker blocked. A choice
/// that is not one of the dialog's (free text, a key name it does not offer) and text instead
/// of a choice are refused, and press nothing. The lead's choice "1" (Yes) presses only that
/// key: the command runs, and the same call goes on to the worker's reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_permission_prompt_is_answered_by_its_lead() -> anyhow::Result<()> {
    let (_model, fleet, lead, pane) =
        fleet_with_claude_and("permission_mode = \"manual\"\n").await?;
    let dir = tempfile::tempdir()?;
    let screen = || fleet.screen(&pane).unwrap_or_default();

    let proof = dir.path().join("proof");
    let task = format!("run: touch {}", proof.display());
    let blocked = lead.send("c1", &task, 90).await?;
    anyhow::ensure!(
        blocked["status"] == "blocked",
        "{blocked}\nc1's screen:\n{}\nfleetd's log:\n{}",
        screen(),
        fleet.log()
    );
    assert_eq!(blocked["from_name"], "c1");
    assert!(!blocked["host"].as_str().unwrap_or_default().is_empty());
    let prompt = blocked["prompt"].as_str().unwrap_or_default();
    assert!(
        prompt.contains("Do you want to proceed?") && prompt.contains("touch"),
        "{prompt}"
    );
    let choices: Vec<(String, String)> = blocked["choices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            (
                c["choice"].as_str().unwrap_or_default().to_string(),
                c["label"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(choices.contains(&("1".into(), "Yes".into())), "{choices:?}");
    assert!(choices.contains(&("4".into(), "No".into())), "{choices:?}");
    assert!(!proof.exists(), "the command ran before anyone chose");
    assert_eq!(lead.entry("c1").await?["status"], "blocked");
    let turn = blocked["turn_id"].clone();
    // Not a choice of this dialog: refused, and nothing is pressed.
    for bad in ["yes; touch /tmp/x", "5", "Enter"] {
        let refused = lead
            .call("fleet_send", json!({"turn_id": turn, "choice": bad}))
            .await?
            .expect_err("a choice the dialog does not offer");
        assert_eq!(refused.code, "invalid_params", "{refused}");
        assert!(refused.message.contains("1, 2, 3, 4"), "{refused}");
    }
    let refused = lead
        .call("fleet_send", json!({"turn_id": turn, "message": "1"}))
        .await?
        .expect_err("text for a dialog");
    assert!(refused.message.contains("choice"), "{refused}");
    assert_eq!(lead.entry("c1").await?["status"], "blocked");
    assert!(!proof.exists(), "a refused answer pressed a key");

    let answered = lead
        .ok(
            "fleet_send",
            json!({"turn_id": turn, "choice": "1", "wait_s": 90}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}\n{}", screen());
    let reply = answered["reply"]["text"].as_str().unwrap_or_default();
    assert!(
        reply.starts_with(&format!("ran touch {}: ", proof.display())),
        "{reply}"
    );
    assert!(
        proof.exists(),
        "the command did not run after the lead said yes"
    );
    // The dialog is over: answering it again is too late.
    let late = lead
        .call("fleet_send", json!({"turn_id": turn, "choice": "1"}))
        .await?
        .expect_err("a dialog answered twice");
    assert_eq!(late.code, "too_late", "{late}");
    assert_eq!(lead.entry("c1").await?["status"], "idle");
    Ok(())
}

/// Claude Code with no `permission_mode` (its own default: auto mode) on a custom endpoint,
/// told to run a command its auto mode would check: it stops on auto mode's notice (answered
/// "stay in auto mode", `enter`), then on its permission prompt, a cursor menu (`❯ No` /
/// `Yes`) offered as `no` and `yes`. `yes` moves the cursor and confirms: the command runs and
/// the same call returns the worker's reply. `no` (the notice is not shown again) ends Claude
/// Code's turn without a reply: the call says so, the command did not run, and the worker takes
/// its next task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_in_auto_mode_is_answered_yes_and_no_through_its_cursor_menu()
-> anyhow::Result<()> {
    let (model, fleet, lead, pane) = fleet_with_claude().await?;
    let dir = tempfile::tempdir()?;
    let screen = || fleet.screen(&pane).unwrap_or_default();
    let mut notices = 0;
    // First a command auto mode lets through by itself (a directory in its working folder):
    // after it, the first command it would check shows its notice (as users meet it).
    let warm = std::path::Path::new(&fleet_testkit::fleet::agent_workdir())
        .join(format!("warm-{}", fleet_core::MsgId::mint()));
    let warmed = lead
        .send("c1", &format!("run: mkdir {}", warm.display()), 90)
        .await?;
    assert_eq!(warmed["status"], "replied", "{warmed}\n{}", screen());
    std::fs::remove_dir(&warm)?;
    for (answer, runs) in [("yes", true), ("no", false)] {
        let proof = dir.path().join(format!("proof-{answer}"));
        let task = format!(
            "run: curl -s -o {} {}/fleet-proof",
            proof.display(),
            model.base_url()
        );
        let mut sent = lead.send("c1", &task, 90).await?;
        // Auto mode's notice (once a session, before the first command it would check): stay
        // in auto mode.
        while sent["status"] == "blocked"
            && sent["prompt"]
                .as_str()
                .unwrap_or_default()
                .contains("Enter to stay in auto mode")
        {
            notices += 1;
            assert_eq!(keys(&sent), ["enter", "esc"], "{sent}");
            sent = lead
                .ok(
                    "fleet_send",
                    json!({"turn_id": sent["turn_id"], "choice": "enter", "wait_s": 90}),
                )
                .await?;
        }
        anyhow::ensure!(
            sent["status"] == "blocked",
            "{sent}\nc1's screen:\n{}\nfleetd's log:\n{}",
            screen(),
            fleet.log()
        );
        assert_eq!(keys(&sent), ["no", "yes", "esc"], "{sent}");
        let prompt = sent["prompt"].as_str().unwrap_or_default();
        assert!(
            prompt.contains("Do you want to proceed?") && prompt.contains("curl -s -o"),
            "{prompt}"
        );
        assert!(!proof.exists(), "the command ran before anyone chose");
        let answered = lead
            .ok(
                "fleet_send",
                json!({"turn_id": sent["turn_id"], "choice": answer, "wait_s": 90}),
            )
            .await?;
        if runs {
            assert_eq!(answered["status"], "replied", "{answered}\n{}", screen());
            let reply = answered["reply"]["text"].as_str().unwrap_or_default();
            assert!(reply.starts_with("ran curl -s -o"), "{reply}");
            assert!(proof.exists(), "the command did not run after yes");
        } else {
            assert_eq!(answered["status"], "failed", "{answered}\n{}", screen());
            let reason = answered["reason"].as_str().unwrap_or_default();
            assert!(
                reason.contains("Interrupted · What should Claude do instead?"),
                "{reason}"
            );
            assert!(!proof.exists(), "the command ran after no");
        }
    }
    assert_eq!(
        notices, 1,
        "auto mode's notice shows once, before its first prompt"
    );
    // After its "no", the worker takes its next task.
    let sent = ask_c1(&fleet, &lead, &pane, "hello after no").await?;
    assert_eq!(sent["reply"]["text"], "echo: hello after no");
    Ok(())
}
