//! The command line as a user meets it: help, tokens, the MCP config to paste, config errors.

use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fleet_testkit::bins::binary;
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, stop_tmux};
use fleet_testkit::inherit::inherit;
use fleet_testkit::wait::until;
use serde_json::Value;

fn fleetd(args: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(Command::new(binary("fleetd")?).args(args).output()?)
}

#[test]
fn help_is_everywhere() -> anyhow::Result<()> {
    for args in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["token", "--help"],
        vec!["mcp-config", "--help"],
        vec!["ls", "--help"],
        vec!["hosts", "--help"],
    ] {
        let out = fleetd(&args)?;
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8(out.stdout)?;
        assert!(
            text.contains("--config") && text.contains("--state-dir"),
            "{args:?}: {text}"
        );
    }
    let out = fleetd(&["serve", "--bogus"])?;
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr)?.contains("--bogus"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_live_in_a_user_only_file_and_leads_must_be_declared() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "[leads.alice]\n").await?;
    let token = fleet.token("alice")?;
    assert!(token.starts_with("fleet_"));
    let file = fleet.state_dir().join("leads/alice.token");
    assert_eq!(std::fs::read_to_string(&file)?.trim(), token);
    assert_eq!(
        std::fs::metadata(&file)?.permissions().mode() & 0o777,
        0o600
    );
    let out = fleet.cli(&["token", "mallory"])?;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr)?;
    assert!(err.contains("'mallory'") && err.contains("alice"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_config_prints_what_claude_code_needs() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "[leads.alice]\n").await?;
    let out = fleet.cli(&["mcp-config", "alice", "--json"])?;
    assert!(out.status.success());
    let config: Value = serde_json::from_slice(&out.stdout)?;
    let server = &config["mcpServers"]["fleet"];
    assert_eq!(server["type"], "http");
    assert_eq!(server["url"], fleet.url());
    assert_eq!(server["headers"]["Authorization"], "Bearer ${FLEET_TOKEN}");
    assert_eq!(server["headers"]["X-Fleet-Pane"], "${TMUX_PANE:-}");
    let out = fleet.cli(&["mcp-config", "alice", "--json", "--literal"])?;
    assert!(out.status.success());
    let config: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        config["mcpServers"]["fleet"]["headers"]["Authorization"],
        format!("Bearer {}", fleet.token("alice")?)
    );
    assert!(String::from_utf8(out.stderr)?.contains("holds the token itself"));
    Ok(())
}

/// Runs `script` in `sh` with `bin` first on `PATH`; returns its stdout.
fn sh(script: &str, bin: &Path) -> anyhow::Result<String> {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH")?);
    let out = Command::new("sh")
        .args(["-c", script])
        .env("PATH", path)
        .env("FLEET_TOKEN", "from-the-callers-environment")
        .output()?;
    anyhow::ensure!(out.status.success(), "{script}: {out:?}");
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn mcp_config_keeps_the_token_out_of_what_it_prints() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("fleetd.toml");
    std::fs::write(&config, "[leads.alice]\n")?;
    // A state dir whose path a shell would split or expand if it were not quoted.
    let state = dir.path().join("it's a \"state\" $HOME dir");
    let run = |extra: &[&str]| -> anyhow::Result<String> {
        let out = Command::new(binary("fleetd")?)
            .args(["mcp-config", "alice", "--config"])
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .args(extra)
            .output()?;
        anyhow::ensure!(out.status.success(), "{out:?}");
        Ok(String::from_utf8(out.stdout)?)
    };
    let text = run(&[])?;
    let token = std::fs::read_to_string(state.join("leads/alice.token"))?
        .trim()
        .to_string();
    assert!(token.starts_with("fleet_"));
    assert!(!text.contains(&token), "{text}");
    // It opens with the JSON config.
    let mut stream = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
    let json = stream
        .next()
        .ok_or(anyhow::anyhow!("no JSON in {text}"))??;
    assert_eq!(
        json["mcpServers"]["fleet"]["headers"]["Authorization"],
        "Bearer ${FLEET_TOKEN}"
    );
    // The export line, run by a shell, sets FLEET_TOKEN to the token.
    let export = text
        .lines()
        .find(|l| l.starts_with("export FLEET_TOKEN="))
        .ok_or(anyhow::anyhow!("no export line in {text}"))?;
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin)?;
    assert_eq!(
        sh(&format!("{export}\nprintf %s \"$FLEET_TOKEN\""), &bin)?,
        token
    );
    // The claude mcp add line hands claude `${FLEET_TOKEN}` itself, for claude to expand: the
    // shell expands nothing (a stand-in claude prints its arguments).
    let add = text
        .lines()
        .find(|l| l.starts_with("claude mcp add"))
        .ok_or(anyhow::anyhow!("no claude line in {text}"))?;
    let claude = bin.join("claude");
    std::fs::write(&claude, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n")?;
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755))?;
    let args = sh(add, &bin)?;
    assert!(
        args.lines()
            .any(|a| a == "Authorization: Bearer ${FLEET_TOKEN}"),
        "{args}"
    );
    assert!(!args.contains("from-the-callers-environment"), "{args}");
    // --literal writes the token, in the JSON and the claude line alike.
    let literal = run(&["--literal"])?;
    assert!(
        literal.contains(&format!("--header 'Authorization: Bearer {token}'")),
        "{literal}"
    );
    assert!(!literal.contains("export FLEET_TOKEN"), "{literal}");
    Ok(())
}

#[test]
fn a_malformed_config_is_refused_naming_the_key() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("bad.toml");
    let cases = [
        (
            "[gateway]\nlisten = \"127.0.0.1:0\"\nlisten_port = 1\n".to_string(),
            "listen_port",
        ),
        (
            "[[profiles]]\nname = \"x\"\nkind = \"command\"\nargv = []\n".to_string(),
            "argv",
        ),
        ("[gateway\n".to_string(), "bad.toml"),
    ];
    for (text, needle) in cases {
        std::fs::write(&config, &text)?;
        let state = dir.path().join("state");
        let out = Command::new(binary("fleetd")?)
            .args(["serve", "--config"])
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .output()?;
        assert!(!out.status.success(), "{text}");
        let err = String::from_utf8(out.stderr)?;
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let out = fleetd(&["token", "x", "--config", "/no/such/file.toml"])?;
    assert!(String::from_utf8(out.stderr)?.contains("/no/such/file.toml"));
    Ok(())
}

#[test]
fn an_isolated_claude_code_without_a_login_is_refused_at_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("fleetd.toml");
    std::fs::write(
        &config,
        "[gateway]\nlisten = \"127.0.0.1:0\"\n[[profiles]]\nname = \"sealed\"\nkind = \"claude-code\"\nisolated_home = true\n",
    )?;
    // fleetd's own environment holds no login either (whatever the test's has).
    let out = Command::new(binary("fleetd")?)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr)?;
    for needle in [
        "profiles 'sealed'",
        "Not logged in",
        "add ANTHROPIC_API_KEY",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_state_dir_is_refused() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    let out = Command::new(binary("fleetd")?)
        .arg("serve")
        .arg("--config")
        .arg(fleet.config_path())
        .arg("--state-dir")
        .arg(fleet.state_dir())
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr)?;
    assert!(err.contains("already serving the state dir"), "{err}");
    Ok(())
}

/// `fleetd serve --listen-fd N`, with `fd` passed as N (or N itself when `fd` is a number).
fn serve_on_fd(
    config: &Path,
    state: &Path,
    fd: Result<&dyn std::os::fd::AsFd, u32>,
) -> anyhow::Result<Command> {
    let mut command = Command::new(binary("fleetd")?);
    let number = match fd {
        Ok(fd) => inherit(&mut command, fd)?.to_string(),
        Err(number) => number.to_string(),
    };
    command
        .args(["serve", "--listen-fd", &number, "--config"])
        .arg(config)
        .arg("--state-dir")
        .arg(state);
    Ok(command)
}

#[test]
fn a_listen_fd_that_is_not_a_listening_tcp_socket_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("fleetd.toml");
    std::fs::write(&config, "[gateway]\nlisten = \"127.0.0.1:0\"\n")?;
    let state = dir.path().join("state");
    let file = std::fs::File::open(&config)?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let connection = TcpStream::connect(listener.local_addr()?)?;
    let udp = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let cases: [(Result<&dyn std::os::fd::AsFd, u32>, &str); 4] = [
        (Ok(&file), "is not a socket"),
        (Ok(&connection), "is a TCP socket that is not listening"),
        (Ok(&udp), "is not a TCP socket"),
        // Nothing is open under that number in fleetd.
        (Err(1000), "descriptor 1000 is not open"),
    ];
    for (fd, needle) in cases {
        let out = serve_on_fd(&config, &state, fd)?.output()?;
        let err = String::from_utf8(out.stderr)?;
        assert!(!out.status.success(), "{needle}: {err}");
        assert!(
            err.starts_with("fleetd: error: --listen-fd ") && err.contains(needle),
            "{needle}: {err}"
        );
        // Refused before anything was done.
        assert!(!state.exists(), "{needle}: the state dir was made");
    }
    for number in ["-1", "3x"] {
        let out = fleetd(&["serve", &format!("--listen-fd={number}")])?;
        assert!(!out.status.success());
        let err = String::from_utf8(out.stderr)?;
        assert!(
            err.contains(&format!("invalid value '{number}' for '--listen-fd <N>'")),
            "{err}"
        );
    }
    Ok(())
}

/// Stops a test's fleetd (its private tmux server too) however the test ends.
struct Served {
    child: std::process::Child,
    tmux: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        stop_tmux(&self.tmux);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_inherited_socket_workers_are_given_its_address() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let url_file = dir.path().join("url");
    let tmux = format!("fleet-test-fd-{}", std::process::id());
    // gateway.listen names another port, which fleetd must neither bind nor advertise.
    let config = dir.path().join("fleetd.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:9\"\n[mux]\nsocket = \"{tmux}\"\n[[profiles]]\nname = \"spy\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"printf %s \\\"$FLEET_MCP_URL\\\" > '{}'; echo SPY-READY; exec sleep 600\"]\nready_marker = \"SPY-READY\"\n",
            url_file.display()
        ),
    )?;
    let state = dir.path().join("state");
    let log = dir.path().join("fleetd.log");
    let served = Served {
        child: serve_on_fd(&config, &state, Ok(&listener))?
            .env_remove("TMUX")
            .env_remove("TMUX_PANE")
            .stderr(std::fs::File::create(&log)?)
            .spawn()?,
        tmux,
    };
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    until(
        "fleetd to answer on the socket",
        Duration::from_secs(20),
        || {
            let request = http.get(format!("{base}/healthz")).send();
            async move { request.await.ok()?.status().is_success().then_some(()) }
        },
    )
    .await?;
    let token = fleetd(&[
        "token",
        "lead",
        "--config",
        &config.display().to_string(),
        "--state-dir",
        &state.display().to_string(),
    ])?;
    let token = String::from_utf8(token.stdout)?.trim().to_string();
    let lead = Client::connect(&format!("{base}/mcp"), &token, Protocol::Stateless, &[]).await?;
    lead.spawn("spy", "w1").await?;
    assert_eq!(
        std::fs::read_to_string(&url_file)?,
        format!("{base}/mcp"),
        "{}",
        std::fs::read_to_string(&log)?
    );
    // The log says that mcp-config, which reads gateway.listen, prints another URL.
    let logged = std::fs::read_to_string(&log)?;
    assert!(
        logged.contains("mcp-config") && logged.contains("http://127.0.0.1:9/mcp"),
        "{logged}"
    );
    drop(served);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_key_is_made_at_first_start_and_printed_for_pinning() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    // Made by serve, user-only, and the one `fleetd key` prints (again and again).
    let file = fleet.state_dir().join("gateway.key");
    assert_eq!(
        std::fs::metadata(&file)?.permissions().mode() & 0o777,
        0o600
    );
    let printed = |out: std::process::Output| -> anyhow::Result<(String, String)> {
        anyhow::ensure!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout)?;
        let mut lines = text.lines();
        Ok((
            lines.next().unwrap_or_default().to_string(),
            lines.next().unwrap_or_default().to_string(),
        ))
    };
    let (key, fingerprint) = printed(fleet.cli(&["key"])?)?;
    assert!(key.starts_with("ed25519:") && key.len() == 8 + 44, "{key}");
    assert!(fingerprint.starts_with("fingerprint ") && fingerprint.len() == 12 + 16);
    assert_eq!(printed(fleet.cli(&["key"])?)?, (key.clone(), fingerprint));
    assert!(
        fleet.log().contains(&key),
        "serve logs the key it started with:\n{}",
        fleet.log()
    );
    // A key file others may read stops the next start, naming the file and the fix.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640))?;
    let out = fleet.cli(&["key"])?;
    let err = String::from_utf8(out.stderr)?;
    assert!(
        !out.status.success() && err.contains("gateway.key") && err.contains("chmod 600"),
        "{err}"
    );
    Ok(())
}

/// The words of the line of `table` whose first column is `first`.
fn row_of<'a>(table: &'a str, first: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|words| words.first() == Some(&first))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_the_fleet_and_its_hosts_from_the_command_line() -> anyhow::Result<()> {
    let mut fleet = Fleet::start("", &fleet_testkit::fleet::sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("sim", "w1").await?;
    // w1 busy on a task it never answers, a second one queued behind it.
    lead.ok(
        "fleet_send",
        serde_json::json!({"to": "w1", "message": "/never", "wait_s": 0}),
    )
    .await?;
    lead.ok(
        "fleet_send",
        serde_json::json!({"to": "w1", "message": "second", "wait_s": 0}),
    )
    .await?;
    let ls = until(
        "w1 busy with one task queued",
        Duration::from_secs(20),
        || async {
            let out = fleet.cli(&["ls"]).ok()?;
            let text = String::from_utf8(out.stdout).ok()?;
            let w1 = row_of(&text, "w1");
            (out.status.success() && w1.get(6) == Some(&"busy")).then_some(text)
        },
    )
    .await?;
    // Piped, it is a plain table: no colour, a header, a line per entity.
    assert!(!ls.contains('\x1b'), "{ls}");
    assert_eq!(
        row_of(&ls, "NAME"),
        [
            "NAME", "HOST", "ROLE", "PROFILE", "SANDBOX", "FOR", "STATUS", "AGENT", "PANE", "HELD",
            "QUEUED", "LAST", "SEEN"
        ],
        "{ls}"
    );
    let pane = spawned["pane"].as_str().unwrap_or_default();
    let w1 = row_of(&ls, "w1");
    // Unsandboxed, of a profile with no role: `-` for both.
    assert_eq!(
        w1[..11],
        [
            "w1", "testhost", "worker", "sim", "-", "-", "busy", "-", pane, "0", "1"
        ],
        "{ls}"
    );
    assert!(w1[11].ends_with('s') && w1[12] == "ago", "{ls}");
    assert_eq!(
        row_of(&ls, "lead")[..7],
        ["lead", "testhost", "lead", "-", "-", "-", "idle"],
        "{ls}"
    );
    // The same as JSON.
    let out = fleet.cli(&["ls", "--json"])?;
    assert!(out.status.success());
    let entities: Value = serde_json::from_slice(&out.stdout)?;
    let w1 = entities
        .as_array()
        .and_then(|all| all.iter().find(|e| e["name"] == "w1"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&w1["status"], &w1["queued"], &w1["held"], &w1["gid"]),
        (
            &Value::from("busy"),
            &Value::from(1),
            &Value::from(0),
            &spawned["gid"]
        ),
        "{entities}"
    );
    // A look through the operator API is not the lead calling in: its last seen stays.
    let lead_seen = |entities: &Value| {
        entities
            .as_array()
            .and_then(|all| all.iter().find(|e| e["name"] == "lead"))
            .map(|e| e["last_seen_ms"].clone())
    };
    let out = fleet.cli(&["ls", "--json"])?;
    let again: Value = serde_json::from_slice(&out.stdout)?;
    assert!(
        lead_seen(&entities).is_some_and(|seen| seen.is_i64()),
        "{entities}"
    );
    assert_eq!(lead_seen(&again), lead_seen(&entities), "{again}");
    // The hosts: this one, with its profiles.
    let out = fleet.cli(&["hosts"])?;
    let hosts = String::from_utf8(out.stdout)?;
    assert_eq!(
        row_of(&hosts, "testhost"),
        ["testhost", "up", "(this", "one)", "sim"],
        "{hosts}"
    );
    let out = fleet.cli(&["hosts", "--json"])?;
    let hosts: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(hosts[0]["host"], "testhost", "{hosts}");
    // The messages: newest first, their states, their text only when asked for.
    let listed = |args: &[&str]| -> anyhow::Result<Value> {
        let out = fleet.cli(args)?;
        anyhow::ensure!(out.status.success(), "{args:?}: {out:?}");
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let msgs = until(
        "the first task typed in",
        Duration::from_secs(20),
        || async {
            let msgs = listed(&["msgs", "--json"]).ok()?;
            (msgs[1]["state"] == "injected").then_some(msgs)
        },
    )
    .await?;
    let states: Vec<(&str, &str, &str)> = msgs
        .as_array()
        .map(|all| {
            all.iter()
                .map(|m| {
                    (
                        m["kind"].as_str().unwrap_or_default(),
                        m["to_name"].as_str().unwrap_or_default(),
                        m["state"].as_str().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        states,
        [("SEND", "w1", "queued"), ("SEND", "w1", "injected")],
        "{msgs}"
    );
    assert!(msgs[0].get("text").is_none(), "{msgs}");
    let out = fleet.cli(&["msgs"])?;
    let table = String::from_utf8(out.stdout)?;
    assert_eq!(
        row_of(&table, "ID"),
        ["ID", "KIND", "FROM", "TO", "STATE", "AGE", "REASON"],
        "{table}"
    );
    let newest = msgs[0]["msg_id"].as_str().unwrap_or_default();
    assert_eq!(
        row_of(&table, newest)[..5],
        [newest, "SEND", "lead", "w1", "queued"],
        "{table}"
    );
    assert!(
        !table.contains("second"),
        "the text without --text:\n{table}"
    );
    let out = fleet.cli(&["msgs", "--text"])?;
    let table = String::from_utf8(out.stdout)?;
    assert!(row_of(&table, newest).ends_with(&["second"]), "{table}");
    assert_eq!(
        listed(&[
            "msgs", "--json", "--state", "injected", "--to", "w1", "--since", "1h"
        ])?
        .as_array()
        .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        listed(&["msgs", "--json", "--from", "w1"])?
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    for (args, code, says) in [
        (vec!["msgs", "--state", "lost"], 1, "none of queued"),
        (vec!["msgs", "--to", "nobody"], 1, "'nobody'"),
        (vec!["msgs", "--limit", "5000"], 1, "between 1 and 1000"),
        (vec!["msgs", "--since", "5x"], 2, "30s, 10m, 2h or 1d"),
    ] {
        let out = fleet.cli(&args)?;
        let err = String::from_utf8(out.stderr)?;
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // A task sent from the command line, as the lead: its answer printed, or why not.
    lead.spawn("sim", "w2").await?;
    let out = fleet.cli(&["send", "w2", "hello from a terminal"])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout)?,
        "echo: hello from a terminal\n"
    );
    // More than one argument may carry, from stdin.
    let big = "a".repeat(150_000);
    let mut piped = fleet
        .cli_command(&["send", "w2", "-", "--wait", "30"])?
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = piped.stdin.take() {
        use std::io::Write;
        stdin.write_all(format!("{big}\n").as_bytes())?;
    }
    let out = piped.wait_with_output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout)?, format!("echo: {big}\n"));
    let out = fleet.cli(&["send", "w2", "/never", "--wait", "0"])?;
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(String::from_utf8(out.stderr)?.contains("fleet_poll"));
    let out = fleet.cli(&["send", "nobody", "x"])?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8(out.stderr)?.contains("'nobody'"));
    let out = fleet.cli(&["send", "w2", "x", "--wait", "3601"])?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8(out.stderr)?.contains("wait_s is 3601"));
    // A worker that dies on its task: not delivered, exit status 5.
    lead.spawn("sim", "w3").await?;
    let out = fleet.cli(&["send", "w3", "/crash", "--wait", "20"])?;
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let err = String::from_utf8(out.stderr)?;
    assert!(
        err.contains("not delivered: 'w3' ended before replying"),
        "{err}"
    );
    // The failures told to the lead, by kind: the notice, its reason shown without --text.
    let failures = listed(&["msgs", "--json", "--kind", "FAILED"])?;
    let failures = failures.as_array().cloned().unwrap_or_default();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("'w3' ended before replying")),
        "{failures:?}"
    );
    let out = fleet.cli(&["msgs", "--kind", "dead"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains("'dead' is none of SEND"));
    // A worker's question to the lead surfaces on the send; the operator answers it.
    lead.spawn("sim", "w4").await?;
    let asking = fleet.cli(&["send", "w4", "/ask 20 which port?", "--wait", "20"])?;
    assert_eq!(asking.status.code(), Some(6), "{asking:?}");
    let err = String::from_utf8(asking.stderr)?;
    let turn = err
        .split("`fleetd answer ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_default()
        .to_string();
    assert!(
        err.contains("'w4' asks: which port?") && !turn.is_empty(),
        "{err}"
    );
    let out = fleet.cli(&["answer", &turn, "8080"])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout)?,
        "asked which port?, heard: 8080\n"
    );
    // And stopped from it.
    let out = fleet.cli(&["stop", "w2"])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout)?, "stopped w2\n");
    let out = fleet.cli(&["ls"])?;
    assert!(row_of(&String::from_utf8(out.stdout)?, "w2").is_empty());
    // A lead that is not declared is refused, naming those that are.
    let out = fleet.cli(&["ls", "--lead", "mallory"])?;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr)?;
    assert!(err.contains("'mallory'") && err.contains("lead"), "{err}");
    // A token the gateway does not know (the file edited by hand): exit status 4.
    let token_file = fleet.state_dir().join("leads/lead.token");
    let token = std::fs::read_to_string(&token_file)?;
    std::fs::write(&token_file, "fleet_not-the-token")?;
    let out = fleet.cli(&["ls"])?;
    std::fs::write(&token_file, token)?;
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let err = String::from_utf8(out.stderr)?;
    assert!(err.contains("refused lead 'lead'"), "{err}");
    // With the gateway of the state dir gone (killed): exit status 3, saying what to do.
    fleet.kill9().await?;
    let out = fleet.cli(&["ls"])?;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8(out.stderr)?;
    assert!(
        err.contains("no fleetd is serving the state dir") && err.contains("fleetd serve"),
        "{err}"
    );
    Ok(())
}

/// The line of `fleetd doctor`'s report about `what`.
fn verdict<'a>(report: &'a str, what: &str) -> &'a str {
    report
        .lines()
        .find(|line| line[5..].starts_with(&format!("{what}:")))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_names_what_would_keep_fleetd_from_working() -> anyhow::Result<()> {
    let config = format!(
        "{}[[profiles]]\nname = \"ghost\"\nkind = \"command\"\nargv = [\"no-such-agent-7f3a\"]\n",
        fleet_testkit::fleet::sim_profile("sim", &[])?
    );
    let fleet = Fleet::start("", &config).await?;
    let out = fleet.cli(&["doctor"])?;
    let report = String::from_utf8(out.stdout)?;
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        verdict(&report, "pane host").starts_with("ok   pane host: tmux "),
        "{report}"
    );
    assert!(
        verdict(&report, "profile 'sim'").starts_with("ok   "),
        "{report}"
    );
    assert_eq!(
        verdict(&report, "profile 'ghost'"),
        "FAIL profile 'ghost': its program 'no-such-agent-7f3a' is not on PATH: install it, or give its path in the profile",
        "{report}"
    );
    let pid = fleet.pid().unwrap_or_default();
    assert!(
        verdict(&report, "gateway").starts_with("ok   gateway: serving at http://127.0.0.1:")
            && verdict(&report, "gateway").ends_with(&format!("(pid {pid})")),
        "{report}"
    );
    assert!(verdict(&report, "broker").is_empty(), "{report}");
    assert!(!report.contains('\x1b'), "{report}");
    Ok(())
}

#[test]
fn the_doctor_looks_for_the_programs_a_profile_really_runs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let work = dir.path().join("work");
    std::fs::create_dir(&work)?;
    let config = dir.path().join("fleetd.toml");
    // A Claude Code profile that leaves argv to its kind, and a sandbox (its runtime and its
    // agent are both checked).
    std::fs::write(
        &config,
        format!(
            "[[profiles]]\nname = \"cc\"\nkind = \"claude-code\"\n{}",
            fleet_testkit::fleet::bwrap_profile("boxed", &work)?
        ),
    )?;
    let out = Command::new(binary("fleetd")?)
        .args(["doctor", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("PATH", "/usr/bin:/bin")
        .output()?;
    let report = String::from_utf8(out.stdout)?;
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        verdict(&report, "profile 'cc'")
            .starts_with("FAIL profile 'cc': its program 'claude' is not on PATH"),
        "{report}"
    );
    let boxed = verdict(&report, "profile 'boxed'");
    let bwrap = fleetd::launch::locate_program(
        "bwrap",
        Some(std::ffi::OsStr::new("/usr/bin:/bin")),
        Path::new("/"),
    );
    match bwrap {
        Some(bwrap) => assert!(
            boxed.starts_with(&format!(
                "ok   profile 'boxed': runs {} and /",
                bwrap.display()
            )),
            "{report}"
        ),
        None => assert!(
            boxed.starts_with("FAIL profile 'boxed': its program 'bwrap'"),
            "{report}"
        ),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_tries_the_broker_as_fleetd_would() -> anyhow::Result<()> {
    let vhost =
        fleet_testkit::broker::Vhost::create(&fleet_testkit::broker::Broker::find().await?).await?;
    let fleet = fleet_testkit::hosts::gateway(&vhost.uri(), "hosta", "alice", "").await?;
    let out = fleet.cli(&["doctor"])?;
    let report = String::from_utf8(out.stdout)?;
    assert!(out.status.success(), "{report}");
    assert!(
        verdict(&report, "broker").starts_with("ok   broker: amqp://")
            && verdict(&report, "broker").ends_with("lets fleetd@hosta in"),
        "{report}"
    );
    // Alone on the broker: no other clock to compare with.
    assert!(
        verdict(&report, "clocks").starts_with("warn clocks: heard no other host's heartbeat"),
        "{report}"
    );
    // With another host up, its clock is read off its signed heartbeats.
    let _b = fleet_testkit::hosts::gateway(&vhost.uri(), "hostb", "bob", "").await?;
    let out = fleet.cli(&["doctor"])?;
    let report = String::from_utf8(out.stdout)?;
    let clocks = verdict(&report, "clocks");
    assert!(
        clocks.starts_with("ok   clocks: other hosts' clocks against this one: hostb ")
            && clocks.ends_with(" ms"),
        "{report}"
    );
    // A host whose clock runs ten minutes ahead (its heartbeats signed with its pinned key):
    // the doctor fails, naming it.
    let doctor = fleet
        .cli_command(&["doctor"])?
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let client = vhost.connect().await?;
    let doctor = tokio::task::spawn_blocking(move || doctor.wait_with_output());
    while !doctor.is_finished() {
        super::federation::announce_ahead(
            &client,
            "hostc",
            "ahead",
            fleet_core::Role::Worker,
            600_000,
        )
        .await?;
        // Heartbeats come at a cadence; the doctor listens for a presence interval.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = doctor.await??;
    let report = String::from_utf8(out.stdout)?;
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        verdict(&report, "clocks").starts_with("FAIL clocks: hostc's clock is +600.0 s from this one's, more than federation.clock_skew_s (60 s) allows"),
        "{report}"
    );
    client.close().await?;
    // A broker nobody answers at: the doctor says so, and fails.
    let closed = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("fleetd.toml");
    std::fs::write(
        &config,
        format!(
            "[broker]\nuri = \"amqp://guest@{closed}/fleet\"\n[federation]\ninsecure_unsigned = true\n"
        ),
    )?;
    let out = fleetd(&[
        "doctor",
        "--config",
        config.to_str().unwrap_or_default(),
        "--state-dir",
        dir.path().join("state").to_str().unwrap_or_default(),
    ])?;
    let report = String::from_utf8(out.stdout)?;
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        verdict(&report, "broker")
            .starts_with(&format!("FAIL broker: amqp://guest@{closed}/fleet")),
        "{report}"
    );
    assert!(
        verdict(&report, "gateway").starts_with("warn gateway: not serving"),
        "{report}"
    );
    Ok(())
}

#[test]
fn the_doctor_says_which_config_fleetd_runs_on() -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let doctor = || {
        Command::new(binary("fleetd")?)
            .args(["doctor", "--state-dir"])
            .arg(home.path().join("state"))
            .env("HOME", home.path())
            .env_remove("XDG_CONFIG_HOME")
            .output()
            .map_err(anyhow::Error::from)
    };
    let default = home.path().join(".config/fleetd/fleetd.toml");
    let report = String::from_utf8(doctor()?.stdout)?;
    assert_eq!(
        verdict(&report, "config"),
        format!(
            "ok   config: no file: none named with --config and none at {}, so fleetd runs on its embedded defaults",
            default.display()
        ),
        "{report}"
    );
    std::fs::create_dir_all(home.path().join(".config/fleetd"))?;
    std::fs::write(&default, "[gateway]\n")?;
    let report = String::from_utf8(doctor()?.stdout)?;
    assert_eq!(
        verdict(&report, "config"),
        format!(
            "ok   config: {} loads (the user's default file; --config names another)",
            default.display()
        ),
        "{report}"
    );
    Ok(())
}

/// Shell completions and manual pages come from the command line's own definitions: bash
/// loads the script and completes a subcommand; the pages name every subcommand.
#[test]
fn completions_and_man_pages_are_generated_from_the_command_line() -> anyhow::Result<()> {
    let fleetd = fleet_testkit::bins::binary("fleetd")?;
    let out = std::process::Command::new(&fleetd)
        .args(["completions", "bash"])
        .output()?;
    assert!(out.status.success(), "{out:?}");
    let script = tempfile::NamedTempFile::new()?;
    std::fs::write(script.path(), &out.stdout)?;
    // bash's own completion machinery, asked what `fleetd in<TAB>` completes to.
    let probe = format!(
        "source {}; COMP_WORDS=(fleetd in); COMP_CWORD=1; COMP_LINE='fleetd in'; COMP_POINT=9; _fleetd fleetd in fleetd; echo \"${{COMPREPLY[@]}}\"",
        script.path().display()
    );
    let completed = std::process::Command::new("bash")
        .args(["-c", &probe])
        .output()?;
    let words = String::from_utf8_lossy(&completed.stdout);
    assert_eq!(
        words.split_whitespace().collect::<Vec<_>>(),
        ["init"],
        "{completed:?}"
    );
    for shell in ["zsh", "fish"] {
        let out = std::process::Command::new(&fleetd)
            .args(["completions", shell])
            .output()?;
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("mcp-headers"),
            "{shell}: {out:?}"
        );
    }
    let page = std::process::Command::new(&fleetd).arg("man").output()?;
    let page = String::from_utf8(page.stdout)?;
    assert!(
        page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH fleetd 1"),
        "{page}"
    );
    assert!(
        page.contains("fleetd\\-init") || page.contains("init"),
        "{page}"
    );
    let dir = tempfile::tempdir()?;
    let out = std::process::Command::new(&fleetd)
        .args(["man", "--dir"])
        .arg(dir.path())
        .output()?;
    assert!(out.status.success(), "{out:?}");
    for name in [
        "fleetd.1",
        "fleetd-init.1",
        "fleetd-serve.1",
        "fleetd-mcp-headers.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(name))?;
        assert!(text.contains(".TH"), "{name}: {text}");
    }
    let init = std::fs::read_to_string(dir.path().join("fleetd-init.1"))?;
    assert!(init.contains("\\-\\-undo"), "{init}");
    Ok(())
}
