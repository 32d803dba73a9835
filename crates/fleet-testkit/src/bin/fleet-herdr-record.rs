//! `fleet-herdr-record`: records a transcript of a real herdr's socket API, for the codec
//! tests in `fleet-mux/tests/data`. It replays the requests of an earlier transcript against a
//! headless `herdr --session NAME server` in a private config, state and home, one request per
//! connection, and writes the answers (and the events of its subscriptions) in that
//! transcript's shape.
//!
//! `cargo run -p fleet-testkit --bin fleet-herdr-record -- --herdr PATH --out FILE`

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// The earlier recording, whose requests are replayed by default.
const MAIN_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fleet-mux/tests/data/herdr-transcript-main-p20.json"
);
/// The working directory the script's requests name; replaced by the recording's own.
const SCRIPT_DIR: &str = "/srv";
/// The fake codex: a program named `codex` that keeps running and echoes its input.
const FAKE_CODEX: &str = "#!/bin/sh\nwhile read l; do echo \"$l\"; done\n";
/// herdr's config: no onboarding, no update checks.
const CONFIG: &str =
    "onboarding = false\n[update]\nversion_check = false\nmanifest_check = false\n";
/// How long the server may take to answer its first ping, or to exit after `server.stop`.
const START_LIMIT: Duration = Duration::from_secs(10);
/// How long one request may take (the script's longest wait is 5 s).
const REQUEST_LIMIT: Duration = Duration::from_secs(20);
/// How long a `pane.get` is retried until it shows the recorded agent and status.
const SETTLE_LIMIT: Duration = Duration::from_secs(3);
/// The pause between those retries.
const SETTLE_POLL: Duration = Duration::from_millis(50);
/// The wait before `server.stop`, for the subscriptions to deliver what is queued (herdr
/// sends one event per subscription every 100 ms).
const DRAIN: Duration = Duration::from_secs(1);

/// Replays a herdr transcript's requests against a real herdr and records its answers.
#[derive(Debug, Parser)]
struct Args {
    /// The herdr binary.
    #[arg(long)]
    herdr: PathBuf,
    /// The transcript whose requests are replayed.
    #[arg(long, default_value = MAIN_SCRIPT)]
    script: PathBuf,
    /// Where the new transcript goes.
    #[arg(long)]
    out: PathBuf,
    /// The pause after each exchange, in ms (the earlier recording went at about this pace).
    #[arg(long, default_value_t = 150)]
    pause_ms: u64,
}

/// A headless herdr server in a private config, state and home.
struct Server {
    /// The herdr binary.
    bin: PathBuf,
    /// Holds its config, state and home.
    root: PathBuf,
    /// Its session name.
    session: String,
    /// The process, while running.
    child: Option<Child>,
}

impl Server {
    /// Its session directory (its socket and saved session).
    fn session_dir(&self) -> PathBuf {
        self.root.join("config/herdr/sessions").join(&self.session)
    }

    /// Its socket.
    fn socket(&self) -> PathBuf {
        self.session_dir().join("herdr.sock")
    }

    /// Starts it with a fresh session and returns its answer to `ping`.
    async fn start(&mut self) -> anyhow::Result<Value> {
        let session_dir = self.session_dir();
        if session_dir.exists() {
            std::fs::remove_dir_all(&session_dir)
                .with_context(|| format!("removing {}", session_dir.display()))?;
        }
        let child = Command::new(&self.bin)
            .args(["--session", &self.session, "server"])
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("XDG_STATE_HOME", self.root.join("state"))
            .env("HOME", self.root.join("home"))
            .env("SHELL", "/bin/bash")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        let ping = json!({"id": "record_ping", "method": "ping", "params": {}});
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Ok(pong) = exchange(&self.socket(), &ping).await
                && pong["result"]["type"] == "pong"
            {
                return Ok(pong);
            }
            if Instant::now() >= deadline {
                bail!("herdr did not answer ping within {START_LIMIT:?}");
            }
            sleep(SETTLE_POLL).await;
        }
    }

    /// Waits for it to exit after `server.stop`, killing it if it does not.
    async fn wait_stopped(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take()
            && timeout(START_LIMIT, child.wait()).await.is_err()
        {
            eprintln!("herdr did not exit within {START_LIMIT:?} of server.stop; killing it");
            child.kill().await?;
        }
        Ok(())
    }
}

/// Sends one request on a connection of its own and reads its one answer line.
async fn exchange(socket: &Path, request: &Value) -> anyhow::Result<Value> {
    let mut lines = send(socket, request).await?;
    next_line(&mut lines).await
}

/// Connects and writes the request line; the answer lines follow on the returned reader.
async fn send(
    socket: &Path,
    request: &Value,
) -> anyhow::Result<tokio::io::Lines<BufReader<UnixStream>>> {
    let mut stream = UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let mut line = serde_json::to_string(request)?;
    line.push('\n');
    stream.write_all(line.as_bytes()).await?;
    Ok(BufReader::new(stream).lines())
}

/// The next answer line, as JSON.
async fn next_line(lines: &mut tokio::io::Lines<BufReader<UnixStream>>) -> anyhow::Result<Value> {
    let line = timeout(REQUEST_LIMIT, lines.next_line())
        .await
        .context("no answer in time")??
        .context("connection closed without an answer")?;
    serde_json::from_str(&line).with_context(|| format!("answer is not JSON: {line}"))
}

/// Keeps reading a subscription's events into `into`, each as `{t, ev}`, until the server
/// closes it.
fn record_events(
    mut lines: tokio::io::Lines<BufReader<UnixStream>>,
    into: Arc<Mutex<Vec<Value>>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| (d.as_millis() as f64) / 1000.0)
                .unwrap_or_default();
            let ev = serde_json::from_str(&line).unwrap_or(Value::String(line));
            if let Ok(mut events) = into.lock() {
                events.push(json!({"t": t, "ev": ev}));
            }
        }
    })
}

/// The request with every `/srv` in its strings replaced by `dir`.
fn relocate(value: &Value, dir: &str) -> Value {
    match value {
        Value::String(s) => Value::String(s.replace(SCRIPT_DIR, dir)),
        Value::Array(items) => Value::Array(items.iter().map(|v| relocate(v, dir)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), relocate(v, dir)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A pane answer's agent and status, to compare with the recorded one.
fn agent_state(answer: &Value) -> (Value, Value) {
    let pane = &answer["result"]["pane"];
    (pane["agent"].clone(), pane["agent_status"].clone())
}

/// A JSON string as plain text; `none` for null, other values as JSON.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "none".to_string(),
        other => other.to_string(),
    }
}

/// Makes the recording's working directory and the fake codex in it.
fn make_workdir(root: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join("srv");
    let bin = dir.join("probe/bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::create_dir_all(root.join("home"))?;
    let codex = bin.join("codex");
    std::fs::write(&codex, FAKE_CODEX)?;
    std::fs::set_permissions(&codex, std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let script: Value = serde_json::from_slice(
        &std::fs::read(&args.script)
            .with_context(|| format!("reading {}", args.script.display()))?,
    )
    .with_context(|| format!("parsing {}", args.script.display()))?;
    let steps = script["transcript"]
        .as_array()
        .context("the script has no transcript list")?;

    let root = tempfile::Builder::new().prefix("herdr-rec").tempdir()?;
    let config = root.path().join("config/herdr");
    std::fs::create_dir_all(&config)?;
    std::fs::write(config.join("config.toml"), CONFIG)?;
    let workdir = make_workdir(root.path())?;
    let workdir_str = workdir.to_str().context("recording dir is not UTF-8")?;

    let mut server = Server {
        bin: args.herdr.clone(),
        root: root.path().to_path_buf(),
        session: format!("record-{}", std::process::id()),
        child: None,
    };
    let pong = server.start().await?;
    let version = pong["result"]["version"].clone();
    let protocol = pong["result"]["protocol"].clone();

    let lifecycle = Arc::new(Mutex::new(Vec::new()));
    let status = Arc::new(Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    let mut transcript = Vec::new();
    let mut retried = Vec::new();
    let pause = Duration::from_millis(args.pause_ms);

    for (index, step) in steps.iter().enumerate() {
        let request = relocate(&step["request"], workdir_str);
        let method = request["method"].as_str().unwrap_or_default();
        let id = request["id"].as_str().unwrap_or_default();
        if server.child.is_none() {
            server.start().await?;
        }
        if method == "server.stop" {
            sleep(DRAIN).await;
        }
        let response = if method == "events.subscribe" {
            let mut lines = send(&server.socket(), &request).await?;
            let first = next_line(&mut lines).await?;
            let into = if id == "sub_p2" { &status } else { &lifecycle };
            readers.push(record_events(lines, Arc::clone(into)));
            first
        } else if method == "pane.get" {
            let want = agent_state(&step["response"]);
            let deadline = Instant::now() + SETTLE_LIMIT;
            let mut tries = 1;
            let mut answer = exchange(&server.socket(), &request).await?;
            while agent_state(&answer) != want && Instant::now() < deadline {
                sleep(SETTLE_POLL).await;
                tries += 1;
                answer = exchange(&server.socket(), &request).await?;
            }
            if tries > 1 {
                let got = agent_state(&answer);
                let outcome = if got == want {
                    "matched"
                } else {
                    "never matched"
                };
                retried.push(format!(
                    "#{index} pane.get {} ({tries} tries, {outcome}: agent {}, {})",
                    text(&request["params"]["pane_id"]),
                    text(&want.0),
                    text(&want.1)
                ));
            }
            answer
        } else {
            exchange(&server.socket(), &request).await?
        };
        eprintln!("#{index} {id} {method}: {response}");
        transcript.push(json!({"request": request, "response": response}));
        if method == "server.stop" {
            server.wait_stopped().await?;
        } else {
            sleep(pause).await;
        }
    }
    if server.child.is_some() {
        // The script did not end with server.stop; the server goes with `kill_on_drop`.
        server.child = None;
    }
    for reader in readers {
        if timeout(START_LIMIT, reader).await.is_err() {
            eprintln!("a subscription stayed open after its server stopped");
        }
    }

    let retried = if retried.is_empty() {
        "none".to_string()
    } else {
        retried.join("; ")
    };
    let note = format!(
        "recorded by fleet-herdr-record from {bin} (herdr {version}, protocol {protocol}), \
         started headless with no client attached and a private config (onboarding and update \
         checks off), state and home; the requests of {script} replayed in order, one per \
         connection, ~{pause} ms apart, with {SCRIPT_DIR} replaced by the recording dir \
         {workdir_str} (holding probe/bin/codex, a sh script that echoes its input); events \
         from events.subscribe (sub_lifecycle and sub_burst in events_lifecycle, sub_p2 in \
         events_status); after a server.stop followed by more requests a fresh server (session \
         dir removed); pane.get retried (up to {settle:?}, {poll:?} apart) until agent and \
         agent_status were the recorded ones: {retried}",
        bin = args.herdr.display(),
        version = text(&version),
        script = args
            .script
            .file_name()
            .unwrap_or_default()
            .to_string_lossy(),
        pause = args.pause_ms,
        settle = SETTLE_LIMIT,
        poll = SETTLE_POLL,
    );
    let take = |events: &Arc<Mutex<Vec<Value>>>| -> anyhow::Result<Vec<Value>> {
        let events = events
            .lock()
            .map_err(|_| anyhow::anyhow!("an event reader panicked"))?;
        Ok(events.clone())
    };
    let out = json!({
        "herdr_version": version,
        "protocol": protocol,
        "note": note,
        "transcript": transcript,
        "events_lifecycle": take(&lifecycle)?,
        "events_status": take(&status)?,
    });
    let mut text = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
    let mut ser = serde_json::Serializer::with_formatter(&mut text, formatter);
    serde::Serialize::serialize(&out, &mut ser)?;
    text.push(b'\n');
    std::fs::write(&args.out, text).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote {} exchanges to {}",
        transcript.len(),
        args.out.display()
    );
    Ok(())
}
