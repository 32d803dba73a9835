//! `fleet-agent-sim`: a scripted agent to run in a pane as a fleet worker. It talks to fleetd
//! as a real MCP client (`FLEET_MCP_URL`, `FLEET_TOKEN`), reads its tasks from its terminal the
//! way an agent's input box does (raw mode, bracketed paste, Enter submits), and answers each
//! with `fleet_reply`, as scripted by the task's directive (see `fleet_testkit::sim`).
//!
//! A task `/confirm QUESTION` shows the program's own dialog, `QUESTION (y/n)`, and waits for
//! the key `y` or `n` before it replies `chose y` / `chose n`; `/menu QUESTION | A | B…` shows a
//! cursor menu (`❯ A`, `  B`), moved by the arrows (`/stuckmenu`: not moved), answered by Enter
//! (`chose B`), or left by Esc with no reply (`Interrupted by Esc`).
//!
//! Two flags make it a program whose screen keeps moving: `--draw-after-ready-ms` keeps
//! drawing for a while after it called in and drops the keys typed meanwhile (a TUI that
//! reaches its MCP servers before its input box is up); `--clock-ms` redraws a clock for as
//! long as it runs, taking keys all along.
//!
//! `--start-dialog QUESTION` (as often as wanted) shows `QUESTION (y/n)` while it starts,
//! before it calls in, as an agent's first-run notice does, and waits for `y` (it goes on) or
//! `n` (it exits).
//!
//! `--log-tasks FILE` appends a line to FILE for every task submitted to it, so a test can
//! count what was typed into its workers, and when, without trusting fleetd's account.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::sim::{Directive, Event, LineEditor};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::time::{Instant, interval};

/// How long `/crash` lives on after it showed the task taken.
const CRASH_AFTER: Duration = Duration::from_millis(100);

/// How often a task held at a gate looks whether it is open.
const GATE_LOOK: Duration = Duration::from_millis(20);
/// How often a moving screen is redrawn while it starts.
const FRAME: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    /// Call in, then answer tasks.
    Echo,
    /// Never call in (for readiness tests): only show a screen.
    NoMcp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ProtocolArg {
    /// MCP 2026-07-28, stateless.
    Stateless,
    /// The older session protocol.
    Session,
}

/// A scripted fleet worker.
#[derive(Debug, Parser)]
struct Args {
    /// How to behave.
    #[arg(long, value_enum, default_value = "echo")]
    mode: Mode,
    /// Which MCP protocol to speak.
    #[arg(long, value_enum, default_value = "stateless")]
    protocol: ProtocolArg,
    /// Do not ask the terminal for bracketed paste.
    #[arg(long)]
    no_bracketed_paste: bool,
    /// After calling in, keep drawing the screen this long before reading any key, and drop
    /// the keys typed meanwhile.
    #[arg(long, default_value_t = 0)]
    draw_after_ready_ms: u64,
    /// Redraw a clock on the top line this often, for as long as it runs.
    #[arg(long)]
    clock_ms: Option<u64>,
    /// Think this long over every task before acting on it (a slow model).
    #[arg(long, default_value_t = 0)]
    think_ms: u64,
    /// Append a JSON line `{"ms", "worker", "task"}` to this file for every task submitted
    /// (Unix milliseconds, this worker's name, the task's text).
    #[arg(long)]
    log_tasks: Option<std::path::PathBuf>,
    /// Show this dialog, `QUESTION (y/n)`, while starting, before calling in; `n` exits.
    #[arg(long)]
    start_dialog: Vec<String>,
}

/// Shows `question (y/n)` and waits for its key: whether it was `y` (a closed terminal is `n`).
/// The dialog goes once answered, as a program's notice does.
async fn start_dialog(question: &str) -> anyhow::Result<bool> {
    show(&format!("{question} (y/n) "));
    let mut stdin = tokio::io::stdin();
    let mut chunk = [0u8; 256];
    loop {
        let n = stdin.read(&mut chunk).await?;
        if n == 0 {
            return Ok(false);
        }
        if let Some(key) = chunk[..n].iter().find(|b| matches!(b, b'y' | b'n')) {
            show("\r\x1b[2K");
            return Ok(*key == b'y');
        }
    }
}

/// How long a call that cannot reach fleetd is made again, at most.
const CALL_AGAIN_FOR: Duration = Duration::from_secs(60);
/// The first pause before a call that could not reach fleetd is made again; it doubles up to
/// [`CALL_AGAIN_MAX_PAUSE`].
const CALL_AGAIN_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two tries of a call.
const CALL_AGAIN_MAX_PAUSE: Duration = Duration::from_secs(1);

/// The agent's MCP client. A call that cannot reach fleetd (stopping or restarting under it:
/// a kept connection closed, nobody listening yet) is made again on a fresh connection, as an
/// agent's model calls a tool again after it failed; a tool error is an answer, never retried.
struct Agent {
    url: String,
    token: String,
    protocol: Protocol,
    client: tokio::sync::Mutex<Client>,
}

impl Agent {
    async fn connect(url: String, token: String, protocol: Protocol) -> anyhow::Result<Self> {
        let client = Client::connect(&url, &token, protocol, &[]).await?;
        Ok(Self {
            url,
            token,
            protocol,
            client: tokio::sync::Mutex::new(client),
        })
    }

    /// Calls `tool` with `args`: the structured result, or the tool error.
    async fn call(
        &self,
        tool: &str,
        args: serde_json::Value,
    ) -> anyhow::Result<Result<serde_json::Value, fleet_testkit::client::ToolError>> {
        let started = Instant::now();
        let mut pause = CALL_AGAIN_PAUSE;
        loop {
            let outcome = self.client.lock().await.call(tool, args.clone()).await;
            match outcome {
                Ok(answer) => return Ok(answer),
                Err(e) if started.elapsed() < CALL_AGAIN_FOR => {
                    show(&format!(
                        "[{tool} did not reach fleetd ({e}): calling again]\r\n"
                    ));
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(CALL_AGAIN_MAX_PAUSE);
                    if let Ok(fresh) =
                        Client::connect(&self.url, &self.token, self.protocol, &[]).await
                    {
                        *self.client.lock().await = fresh;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Calls `tool`; a tool error is an error.
    async fn ok(&self, tool: &str, args: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        self.call(tool, args)
            .await?
            .map_err(|e| anyhow::anyhow!("{tool} failed: {e}"))
    }
}

fn env(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run me as a fleet worker"))
}

fn show(text: &str) {
    let mut out = std::io::stdout();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Draws a changing line for `ms`, then drops whatever was typed meanwhile: a program only now
/// starting to read its input.
async fn draw_while_starting(ms: u64) {
    let started = Instant::now();
    let mut frames = interval(FRAME);
    let mut frame = 0u64;
    while started.elapsed() < Duration::from_millis(ms) {
        frames.tick().await;
        frame += 1;
        show(&format!("\r\x1b[2Kstarting: frame {frame}"));
    }
    let _ = rustix::termios::tcflush(
        rustix::stdio::stdin(),
        rustix::termios::QueueSelector::IFlush,
    );
    show("\r\n");
}

fn raw_terminal() {
    let stdin = rustix::stdio::stdin();
    if let Ok(mut termios) = rustix::termios::tcgetattr(stdin) {
        termios.make_raw();
        let _ = rustix::termios::tcsetattr(stdin, rustix::termios::OptionalActions::Now, &termios);
    }
}

/// Notes `task`, submitted to worker `name`, in the task log `path`: one line, written in one
/// append (the workers of a test share the file), before the task is acted on.
fn log_task(path: &std::path::Path, name: &str, task: &str) {
    let line = json!({"ms": fleet_core::clock::now_ms(), "worker": name, "task": task});
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        show(&format!(
            "[cannot log the task to {}: {e}]\r\n",
            path.display()
        ));
    }
}

async fn reply(client: &Agent, text: &str, in_reply_to: Option<&str>) -> anyhow::Result<()> {
    let mut args = json!({ "message": text });
    if let Some(id) = in_reply_to {
        args["in_reply_to"] = json!(id);
    }
    client.ok("fleet_reply", args).await?;
    show("[replied]\r\n");
    Ok(())
}

/// Handles a task; returns whether it now shows a dialog, waiting for `y` or `n`.
/// A dialog on the screen, waiting for its keys.
enum Waiting {
    /// `QUESTION (y/n)`: `y` or `n`.
    Confirm,
    /// A cursor menu: its options, the one the cursor is on, and whether the arrows move it.
    Menu(Vec<String>, usize, bool),
}

/// Draws a menu's options, the cursor on `at`, and its hint.
fn draw_menu(options: &[String], at: usize) {
    let mut screen = String::new();
    for (i, option) in options.iter().enumerate() {
        let mark = if i == at { "❯" } else { " " };
        screen.push_str(&format!("\x1b[2K {mark} {option}\r\n"));
    }
    screen.push_str("\x1b[2K Esc to cancel");
    show(&screen);
}

/// What a menu does with one key: moves its cursor (the arrows, in either of the terminal's
/// modes), or is answered (Enter: the option; Esc: none).
#[derive(Clone, Copy)]
enum MenuKey {
    Up,
    Down,
    Enter,
    Esc,
}

/// The keys in `bytes` (several may come in one read), others left out.
fn menu_keys(mut bytes: &[u8]) -> Vec<MenuKey> {
    let mut keys = Vec::new();
    while let Some(first) = bytes.first() {
        let (key, len) = match bytes {
            [0x1b, b'[' | b'O', b'A', ..] => (Some(MenuKey::Up), 3),
            [0x1b, b'[' | b'O', b'B', ..] => (Some(MenuKey::Down), 3),
            [0x1b, b'[' | b'O', _, ..] => (None, 3),
            [0x1b, ..] => (Some(MenuKey::Esc), 1),
            _ if matches!(first, b'\r' | b'\n') => (Some(MenuKey::Enter), 1),
            _ => (None, 1),
        };
        keys.extend(key);
        bytes = &bytes[len..];
    }
    keys
}

/// Replies `text` to the task in flight, then shows the input line again.
async fn answered(client: Option<&Agent>, text: &str) {
    if let Some(client) = client
        && let Err(e) = reply(client, text, None).await
    {
        show(&format!("[error: {e}]\r\n"));
    }
    show("> ");
}

async fn handle(client: &Agent, task: &str) -> anyhow::Result<Option<Waiting>> {
    match Directive::parse(task) {
        Directive::Confirm(question) => {
            show(&format!("\r\n{question} (y/n) "));
            return Ok(Some(Waiting::Confirm));
        }
        Directive::Menu(question, options, moves) => {
            show(&format!("\r\n{question}\r\n"));
            draw_menu(&options, 0);
            return Ok(Some(Waiting::Menu(options, 0, moves)));
        }
        Directive::Echo(text) => reply(client, &format!("echo: {text}"), None).await?,
        Directive::Slow(ms, rest) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            reply(client, &format!("echo: {rest}"), None).await?;
        }
        Directive::Gate(path, rest) => {
            show("[waiting for the gate]\r\n");
            while !std::path::Path::new(&path).exists() {
                tokio::time::sleep(GATE_LOOK).await;
            }
            reply(client, &format!("echo: {rest}"), None).await?;
        }
        Directive::Never => show("[not replying]\r\n"),
        Directive::Pwd => {
            let here = std::env::current_dir()
                .map(|dir| dir.display().to_string())
                .unwrap_or_else(|e| format!("no working directory: {e}"));
            reply(client, &here, None).await?;
        }
        Directive::Write(path, text) => {
            let said = match std::fs::write(&path, &text) {
                Ok(()) => format!("wrote {path}"),
                Err(e) => format!("cannot write {path}: {e}"),
            };
            reply(client, &said, None).await?;
        }
        Directive::Read(path) => {
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) => format!("cannot read {path}: {e}"),
            };
            reply(client, &text, None).await?;
        }
        Directive::Crash => {
            show("[crashing]\r\n");
            // Mid-turn, as an agent dies: a moment after it took the task (fleetd has seen the
            // submit by then), not in the same instant as the Enter.
            tokio::time::sleep(CRASH_AFTER).await;
            std::process::exit(3);
        }
        Directive::Ask(seconds, question) => {
            show("[asking]\r\n");
            let asked = client
                .call(
                    "fleet_ask",
                    json!({ "question": question, "wait_s": seconds }),
                )
                .await?;
            let text = match asked {
                Ok(answer) => format!(
                    "asked {question}, heard: {}",
                    answer["answer"].as_str().unwrap_or_default()
                ),
                Err(e) => format!("asked {question}, got {}", e.code),
            };
            reply(client, &text, None).await?;
        }
        Directive::Poll(seconds) => {
            reply(client, "polling", None).await?;
            show("[polling]\r\n");
            pull(client, seconds).await?;
        }
        Directive::Pull => {
            show("[pulling]\r\n");
            pull(client, 0).await?;
        }
    }
    Ok(None)
}

/// Waits in `fleet_poll` up to `seconds` and echo-replies to every message it returns.
async fn pull(client: &Agent, seconds: u64) -> anyhow::Result<()> {
    let got = client
        .ok("fleet_poll", json!({ "wait_s": seconds }))
        .await?;
    for message in got["messages"].as_array().cloned().unwrap_or_default() {
        let text = message["text"].as_str().unwrap_or_default();
        let id = message["msg_id"].as_str();
        reply(client, &format!("echo: {text}"), id).await?;
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let name = env("FLEET_NAME")?;
    raw_terminal();
    if !args.no_bracketed_paste {
        show("\x1b[?2004h");
    }
    for question in &args.start_dialog {
        if !start_dialog(question).await? {
            show("declined: exiting\r\n");
            return Ok(());
        }
    }
    let client = match args.mode {
        Mode::NoMcp => None,
        Mode::Echo => {
            let protocol = match args.protocol {
                ProtocolArg::Stateless => Protocol::Stateless,
                ProtocolArg::Session => Protocol::Session,
            };
            let client =
                Agent::connect(env("FLEET_MCP_URL")?, env("FLEET_TOKEN")?, protocol).await?;
            client.ok("fleet_list", json!({})).await?;
            Some(client)
        }
    };
    if args.draw_after_ready_ms > 0 {
        draw_while_starting(args.draw_after_ready_ms).await;
    }
    show(&format!("sim {name} ready\r\n> "));
    let mut editor = LineEditor::new();
    let mut stdin = tokio::io::stdin();
    let mut chunk = [0u8; 4096];
    let mut tasks = 0usize;
    let mut clock = args
        .clock_ms
        .map(|ms| interval(Duration::from_millis(ms.max(1))));
    let started = Instant::now();
    // A dialog on screen that waits for its keys.
    let mut waiting: Option<Waiting> = None;
    loop {
        let tick = async {
            match clock.as_mut() {
                Some(clock) => clock.tick().await,
                None => std::future::pending().await,
            }
        };
        let n = tokio::select! {
            read = stdin.read(&mut chunk) => read?,
            _ = tick => {
                // Save the cursor, draw on the top line, put the cursor back.
                show(&format!("\x1b7\x1b[1;1H\x1b[2Kclock {} ms\x1b8", started.elapsed().as_millis()));
                continue;
            }
        };
        if n == 0 {
            return Ok(());
        }
        match &mut waiting {
            // A dialog takes one key, y or n, and nothing else.
            Some(Waiting::Confirm) => {
                if let Some(key) = chunk[..n].iter().find(|b| matches!(b, b'y' | b'n')) {
                    waiting = None;
                    show(&format!("{}\r\n\r\n", char::from(*key)));
                    answered(client.as_ref(), &format!("chose {}", char::from(*key))).await;
                }
                continue;
            }
            Some(Waiting::Menu(options, at, moves)) => {
                for key in menu_keys(&chunk[..n]) {
                    match key {
                        MenuKey::Up | MenuKey::Down if *moves => {
                            *at = match key {
                                MenuKey::Up => at.saturating_sub(1),
                                _ => (*at + 1).min(options.len() - 1),
                            };
                            // Back to the menu's first line, and draw it again.
                            show(&format!("\r\x1b[{}A", options.len()));
                            draw_menu(options, *at);
                        }
                        MenuKey::Up | MenuKey::Down => {}
                        MenuKey::Enter => {
                            let chose = format!("chose {}", options[*at]);
                            // The menu goes, as a program's dialog does once answered.
                            show(&format!(
                                "\r\x1b[{}A\x1b[J{chose}\r\n\r\n",
                                options.len() + 1
                            ));
                            waiting = None;
                            answered(client.as_ref(), &chose).await;
                            break;
                        }
                        MenuKey::Esc => {
                            show(&format!(
                                "\r\x1b[{}A\x1b[J  Interrupted by Esc\r\n\r\n> ",
                                options.len() + 1
                            ));
                            waiting = None;
                            break;
                        }
                    }
                }
                continue;
            }
            None => {}
        }
        for event in editor.feed(&chunk[..n]) {
            match event {
                Event::Echo(bytes) => show(&String::from_utf8_lossy(&bytes)),
                Event::Submit(task) => {
                    tasks += 1;
                    if let Some(path) = &args.log_tasks {
                        log_task(path, &name, &task);
                    }
                    show(&format!("\r\n[task {tasks}: {} bytes]\r\n", task.len()));
                    if args.think_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(args.think_ms)).await;
                    }
                    if let Some(client) = &client {
                        match handle(client, &task).await {
                            Ok(Some(dialog)) => {
                                waiting = Some(dialog);
                                continue;
                            }
                            Ok(None) => {}
                            Err(e) => show(&format!("[error: {e}]\r\n")),
                        }
                    }
                    show("> ");
                }
            }
        }
    }
}
