//! `fleet-agent-sim`: a scripted agent to run in a pane as a fleet worker. It talks to fleetd
//! as a real MCP client (`FLEET_MCP_URL`, `FLEET_TOKEN`), reads its tasks from its terminal the
//! way an agent's input box does (raw mode, bracketed paste, Enter submits), and answers each
//! with `fleet_reply`, as scripted by the task's directive (see `fleet_testkit::sim`).

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::sim::{Directive, Event, LineEditor};
use serde_json::json;
use tokio::io::AsyncReadExt;

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
}

fn env(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run me as a fleet worker"))
}

fn show(text: &str) {
    let mut out = std::io::stdout();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

fn raw_terminal() {
    let stdin = rustix::stdio::stdin();
    if let Ok(mut termios) = rustix::termios::tcgetattr(stdin) {
        termios.make_raw();
        let _ = rustix::termios::tcsetattr(stdin, rustix::termios::OptionalActions::Now, &termios);
    }
}

async fn reply(client: &Client, text: &str, in_reply_to: Option<&str>) -> anyhow::Result<()> {
    let mut args = json!({ "message": text });
    if let Some(id) = in_reply_to {
        args["in_reply_to"] = json!(id);
    }
    client.ok("fleet_reply", args).await?;
    show("[replied]\r\n");
    Ok(())
}

async fn handle(client: &Client, task: &str) -> anyhow::Result<()> {
    match Directive::parse(task) {
        Directive::Echo(text) => reply(client, &format!("echo: {text}"), None).await?,
        Directive::Slow(ms, rest) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            reply(client, &format!("echo: {rest}"), None).await?;
        }
        Directive::Never => show("[not replying]\r\n"),
        Directive::Pwd => {
            let here = std::env::current_dir()
                .map(|dir| dir.display().to_string())
                .unwrap_or_else(|e| format!("no working directory: {e}"));
            reply(client, &here, None).await?;
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
            let got = client
                .ok("fleet_poll", json!({ "wait_s": seconds }))
                .await?;
            for message in got["messages"].as_array().cloned().unwrap_or_default() {
                let text = message["text"].as_str().unwrap_or_default();
                let id = message["msg_id"].as_str();
                reply(client, &format!("echo: {text}"), id).await?;
            }
        }
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
    let client = match args.mode {
        Mode::NoMcp => None,
        Mode::Echo => {
            let protocol = match args.protocol {
                ProtocolArg::Stateless => Protocol::Stateless,
                ProtocolArg::Session => Protocol::Session,
            };
            let client =
                Client::connect(&env("FLEET_MCP_URL")?, &env("FLEET_TOKEN")?, protocol, &[])
                    .await?;
            client.ok("fleet_list", json!({})).await?;
            Some(client)
        }
    };
    show(&format!("sim {name} ready\r\n> "));
    let mut editor = LineEditor::new();
    let mut stdin = tokio::io::stdin();
    let mut chunk = [0u8; 4096];
    let mut tasks = 0usize;
    loop {
        let n = stdin.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        for event in editor.feed(&chunk[..n]) {
            match event {
                Event::Echo(bytes) => show(&String::from_utf8_lossy(&bytes)),
                Event::Submit(task) => {
                    tasks += 1;
                    show(&format!("\r\n[task {tasks}: {} bytes]\r\n", task.len()));
                    if let Some(client) = &client
                        && let Err(e) = handle(client, &task).await
                    {
                        show(&format!("[error: {e}]\r\n"));
                    }
                    show("> ");
                }
            }
        }
    }
}
