//! A scripted stand-in for the Anthropic Messages API, so the real Claude Code binary can run
//! as a fleet worker with no internet. Only the model is fake: Claude Code, its MCP client
//! and its screen are real.
//!
//! The script, decided from the latest user turn:
//! - a typed task `ask: QUESTION` → call `fleet_ask{question}`; when the answer comes back,
//!   call `fleet_reply` with `asked QUESTION, heard: ANSWER`;
//! - a typed task `run: COMMAND` → call the agent's own shell tool (`Bash`) with `COMMAND`
//!   (which may need the user's permission: a dialog on the agent's screen); when its result
//!   comes back, call `fleet_reply` with `ran COMMAND: RESULT`;
//! - any other typed task → call `fleet_reply` with `echo: TASK` (the whole task, so a test can
//!   see it arrived intact); or, started [`ModelSim::digesting`], with a [`Digest`] of exactly
//!   what arrived (`sha256=HEX bytes=N tags=[#t0001]`: a long benchmark's answers stay small,
//!   and it can still tell a task altered, merged with another or submitted twice);
//! - fleetd's nudge (`[fleet] N messages waiting for you: call fleet_poll …`) → call
//!   `fleet_poll`, then answer each message it returned, one a turn, with `fleet_reply{message:
//!   "echo: TEXT", in_reply_to: its msg_id}`;
//! - the result of that `fleet_reply` → end the turn with a short text (unless a task was typed
//!   meanwhile and came along with the result: that task is answered as above);
//! - a lead's typed `call: TOOL {ARGS}` → call the tool named `TOOL` (or `…__TOOL`) with the
//!   JSON arguments; its result → end the turn with `Done: RESULT` (no such tool: say so);
//! - a request without tools (Claude Code's title request) → a JSON `{"title": …}` text.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running scripted model server; stops when dropped.
pub struct ModelSim {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Value>>>,
    /// How many model requests it has answered (kept apart from `seen`, which a digesting
    /// model leaves empty).
    answered: Arc<AtomicUsize>,
    /// What a digesting model received, one entry per typed task it answered.
    received: Arc<Mutex<Vec<Received>>>,
    stalled: Arc<AtomicBool>,
    held: Arc<watch::Sender<bool>>,
    holding: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl ModelSim {
    /// Starts it on a free loopback port.
    pub async fn start() -> anyhow::Result<Self> {
        Self::voiced("").await
    }

    /// [`ModelSim::start`], every answer it gives through `fleet_reply` opening with `voice`:
    /// two scripted models a test tells apart.
    pub async fn voiced(voice: &str) -> anyhow::Result<Self> {
        Self::scripted(Script::Echo(Arc::from(voice))).await
    }

    /// [`ModelSim::start`], answering every typed task (one that is no `ask:`, `run:` or nudge)
    /// with the [`Digest`] of what arrived instead of its echo, and keeping each such text
    /// ([`ModelSim::received`]). It keeps no requests ([`ModelSim::saw`] is always false): a
    /// benchmark of thousands of tasks would hold every request's whole conversation.
    pub async fn digesting() -> anyhow::Result<Self> {
        Self::scripted(Script::Digest).await
    }

    async fn scripted(script: Script) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answered = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let stalled = Arc::new(AtomicBool::new(false));
        let held = Arc::new(watch::channel(false).0);
        let holding = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .fallback(any(|| async { StatusCode::OK }))
            .with_state(Shared {
                seen: Arc::clone(&seen),
                answered: Arc::clone(&answered),
                received: Arc::clone(&received),
                script,
                stalled: Arc::clone(&stalled),
                held: Arc::clone(&held),
                holding: Arc::clone(&holding),
            });
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("the scripted model server stopped: {e}");
            }
        });
        Ok(Self {
            addr,
            seen,
            answered,
            received,
            stalled,
            held,
            holding,
            task,
        })
    }

    /// While `stalled`, a request with tools (an agent's turn) is seen but never answered: the
    /// agent stays busy on it, as on a model that hangs.
    pub fn stall(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
    }

    /// While `held`, a request the model would answer with `fleet_reply` (an agent's turn on a
    /// task, about to answer it) waits, and is answered as scripted once the hold is let go: a
    /// task that lasts as long as a test needs (over a restart of fleetd, say).
    pub fn hold(&self, held: bool) {
        self.held.send_replace(held);
    }

    /// How many agents' turns wait at the hold now.
    pub fn holding(&self) -> usize {
        self.holding.load(Ordering::SeqCst)
    }

    /// Its base URL, for `ANTHROPIC_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether any request it answered holds `text` (in its system prompt, say).
    pub fn saw(&self, text: &str) -> bool {
        self.seen
            .lock()
            .map(|seen| seen.iter().any(|r| r.to_string().contains(text)))
            .unwrap_or_default()
    }

    /// How many model requests it has answered.
    pub fn requests(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// What a digesting model received, in the order it answered: one entry per typed task.
    pub fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .map(|received| received.clone())
            .unwrap_or_default()
    }
}

impl Drop for ModelSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One turn waiting at the hold, counted for as long as it waits (a turn its agent gave up on
/// included: its request is dropped, and so is this).
struct Holding(Arc<AtomicUsize>);

impl Holding {
    fn one(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(count))
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn count_tokens() -> Response {
    axum::Json(json!({"input_tokens": 100})).into_response()
}

async fn messages(
    State(shared): State<Shared>,
    axum::Json(request): axum::Json<Value>,
) -> Response {
    let (turn, received) = respond(&request, &shared.script);
    if let Some(received) = received
        && let Ok(mut log) = shared.received.lock()
    {
        log.push(received);
    }
    if matches!(shared.script, Script::Echo(_))
        && let Ok(mut seen) = shared.seen.lock()
    {
        seen.push(request.clone());
    }
    shared.answered.fetch_add(1, Ordering::SeqCst);
    let with_tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
    if with_tools && shared.stalled.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let answers_a_task = matches!(&turn, Turn::Call(tool, _) if tool.ends_with("fleet_reply"));
    if answers_a_task && *shared.held.borrow() {
        let _counted = Holding::one(&shared.holding);
        let mut held = shared.held.subscribe();
        let _ = held.wait_for(|held| !*held).await;
    }
    if request["stream"].as_bool().unwrap_or(false) {
        (
            [("content-type", "text/event-stream")],
            stream_events(&request, &turn),
        )
            .into_response()
    } else {
        axum::Json(whole_message(&request, &turn)).into_response()
    }
}

/// What every request shares.
#[derive(Clone)]
struct Shared {
    /// The requests seen so far (an echoing model's only).
    seen: Arc<Mutex<Vec<Value>>>,
    /// How many requests were answered.
    answered: Arc<AtomicUsize>,
    /// What a digesting model received.
    received: Arc<Mutex<Vec<Received>>>,
    /// How a typed task is answered.
    script: Script,
    /// Whether an agent's turn is left unanswered ([`ModelSim::stall`]).
    stalled: Arc<AtomicBool>,
    /// Whether an agent's turn waits before it is answered ([`ModelSim::hold`]).
    held: Arc<watch::Sender<bool>>,
    /// How many turns wait there now.
    holding: Arc<AtomicUsize>,
}

/// The agent's own shell tool (Claude Code's `Bash`, opencode's `bash`).
const SHELL_TOOL: &str = "bash";

/// What the scripted model answers with.
#[derive(Debug, PartialEq)]
enum Turn {
    /// Say this and end the turn.
    Say(String),
    /// Call this tool with this input.
    Call(String, Value),
}

/// How the model answers a typed task.
#[derive(Clone, Debug)]
enum Script {
    /// `echo: TASK`, opening with this voice.
    Echo(Arc<str>),
    /// The [`Digest`] of what arrived.
    Digest,
}

impl Script {
    /// What an echo opens with.
    fn voice(&self) -> &str {
        match self {
            Script::Echo(voice) => voice,
            Script::Digest => "",
        }
    }
}

/// Decides the answer to a request, from its tools and its latest user turn; a task's echo
/// opens with `voice`.
#[cfg(test)]
fn decide(request: &Value, voice: &str) -> Turn {
    respond(request, &Script::Echo(Arc::from(voice))).0
}

/// Decides the answer to a request, from its tools and its latest user turn, a typed task
/// answered as `script` says; with what arrived, when that is a digest.
fn respond(request: &Value, script: &Script) -> (Turn, Option<Received>) {
    let voice = script.voice();
    let tools: Vec<&str> = request["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    if tools.is_empty() {
        return (Turn::Say(json!({"title": "Fleet task"}).to_string()), None);
    }
    let tool = |suffix: &str| {
        tools
            .iter()
            .find(|name| name.ends_with(suffix))
            .map(|name| name.to_string())
    };
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let Some(last) = messages.iter().rev().find(|m| m["role"] == "user") else {
        return (Turn::Say("Nothing to do.".into()), None);
    };
    // Text typed while a call ran comes with that call's result (Claude Code, opencode): it is
    // the next task, and takes precedence.
    let typed = typed_text(last);
    // The result of a call this model made: look up which tool it was.
    if let Some(result) = blocks(last).find(|b| b["type"] == "tool_result")
        && typed.is_empty()
    {
        let called = called_tool(
            &messages,
            result["tool_use_id"].as_str().unwrap_or_default(),
        );
        let text = result_text(&result["content"]);
        let turn = match called {
            Some((name, input)) if name.eq_ignore_ascii_case(SHELL_TOOL) => {
                match tool("fleet_reply") {
                    Some(reply) => Turn::Call(
                        reply,
                        json!({"message": format!(
                            "ran {}: {text}",
                            input["command"].as_str().unwrap_or_default()
                        )}),
                    ),
                    None => Turn::Say(format!("ran: {text}")),
                }
            }
            Some((name, input)) if name.ends_with("fleet_ask") => match tool("fleet_reply") {
                Some(reply) => Turn::Call(
                    reply,
                    json!({"message": format!(
                        "asked {}, heard: {text}",
                        input["question"].as_str().unwrap_or_default()
                    )}),
                ),
                None => Turn::Say(format!("heard: {text}")),
            },
            // Pulled messages are answered one a turn, each by its id, until none is left.
            _ => match (next_pulled(&messages), tool("fleet_reply")) {
                (Some((id, body)), Some(reply)) => Turn::Call(
                    reply,
                    json!({"message": format!("{voice}echo: {body}"), "in_reply_to": id}),
                ),
                _ => Turn::Say(format!("Done: {text}")),
            },
        };
        return (turn, None);
    }
    let task = typed;
    // fleetd's nudge: what waits is pulled.
    if task.starts_with("[fleet] ")
        && task.contains("call fleet_poll")
        && let Some(poll) = tool("fleet_poll")
    {
        return (Turn::Call(poll, json!({"wait_s": 0})), None);
    }
    if let Some(question) = task.strip_prefix("ask: ")
        && let Some(ask) = tool("fleet_ask")
    {
        return (Turn::Call(ask, json!({"question": question})), None);
    }
    if let Some(command) = task.strip_prefix("run: ")
        && let Some(shell) = tools.iter().find(|t| t.eq_ignore_ascii_case(SHELL_TOOL))
    {
        let call = Turn::Call(
            shell.to_string(),
            json!({"command": command, "description": "Run the lead's command"}),
        );
        return (call, None);
    }
    if let Some(call) = task.strip_prefix("call: ") {
        return (called(call, &tools), None);
    }
    match (tool("fleet_reply"), script) {
        (Some(reply), Script::Echo(_)) => (
            Turn::Call(reply, json!({"message": format!("{voice}echo: {task}")})),
            None,
        ),
        (Some(reply), Script::Digest) => {
            let received = Received::of(arrived_text(last), raw_text(last));
            let call = Turn::Call(reply, json!({"message": received.digest.to_string()}));
            (call, Some(received))
        }
        (None, _) => (
            Turn::Say(format!("no fleet_reply tool; the task was: {task}")),
            None,
        ),
    }
}

/// A lead's `call: TOOL {ARGS}`: a call of the tool whose name is or ends in `__TOOL`, with the
/// JSON arguments (none: `{}`); said so when there is no such tool or the arguments are not
/// JSON.
fn called(call: &str, tools: &[&str]) -> Turn {
    let (name, args) = call.trim().split_once(' ').unwrap_or((call.trim(), "{}"));
    let suffix = format!("__{name}");
    let Some(tool) = tools.iter().find(|t| **t == name || t.ends_with(&suffix)) else {
        return Turn::Say(format!("no tool {name} among {}", tools.join(", ")));
    };
    match serde_json::from_str(args) {
        Ok(args) => Turn::Call(tool.to_string(), args),
        Err(e) => Turn::Say(format!("bad arguments for {name}: {e}")),
    }
}

/// What arrived of a typed task, for its digest: every text block of the user turn that is not
/// a system reminder (one, unless the agent put several submits together), with Claude Code's
/// paste wrapping taken off as Claude Code itself reads it ([`claude_pastes`]), joined by a
/// newline, and nothing else changed (no trimming: a benchmark decides itself what difference
/// it forgives, and says so).
fn arrived_text(message: &Value) -> String {
    blocks(message)
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str().map(str::to_string))
        .filter(|text| !text.trim_start().starts_with("<system-reminder>"))
        .map(|text| claude_pastes(&text))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` with Claude Code's paste blocks read as Claude Code 2.1.332 reads them back (its own
/// parser of the wrapping it writes): a block opens with `<pasted_content id="ID">` and a
/// newline (ID four lower-case hex digits) and ends at the next newline followed by
/// `</pasted_content id="ID">`; up to two newlines before the opening and after the closing
/// belong to the wrapping; the block stands for what lies between. Text that is no such block
/// is kept as it is.
fn claude_pastes(text: &str) -> String {
    const OPEN: &str = "<pasted_content id=\"";
    let mut out = String::new();
    // `kept`: where the text not yet copied out starts; `from`: where to look for a block.
    let (mut kept, mut from) = (0, 0);
    while let Some(found) = text[from..].find(OPEN) {
        let open = from + found;
        let id_at = open + OPEN.len();
        let id = text.get(id_at..id_at + 4).unwrap_or_default();
        let is_id = id.len() == 4 && id.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
        if !is_id || !text[id_at + 4..].starts_with("\">\n") {
            from = id_at;
            continue;
        }
        let body = id_at + 4 + 3;
        let close = format!("\n</pasted_content id=\"{id}\">");
        // The search starts at the opening's own newline: an empty block is one.
        let Some(found) = text[body - 1..].find(&close) else {
            break;
        };
        let body_end = body - 1 + found;
        let mut before = open;
        for _ in 0..2 {
            if before > kept && text[..before].ends_with('\n') {
                before -= 1;
            }
        }
        out.push_str(&text[kept..before]);
        out.push_str(text.get(body..body_end).unwrap_or_default());
        kept = body_end + close.len();
        for _ in 0..2 {
            if text[kept..].starts_with('\n') {
                kept += 1;
            }
        }
        from = kept;
    }
    out.push_str(&text[kept..]);
    out
}

/// The text blocks of the user turn that are not system reminders, as they arrived (any paste
/// wrapping included), joined by a newline.
fn raw_text(message: &Value) -> String {
    blocks(message)
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str().map(str::to_string))
        .filter(|text| !text.trim_start().starts_with("<system-reminder>"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What opens a task tag: `[#t`, then one or more ASCII digits, then `]` (`[#t0042]`). A
/// benchmark opens each task with its own, and the digest lists every tag it finds, so a
/// submit that holds two tasks shows both.
pub const TAG_OPEN: &str = "[#t";

/// The tag of task `n`: `[#t0042]` (at least four digits).
pub fn tag(n: usize) -> String {
    format!("{TAG_OPEN}{n:04}]")
}

/// Every task tag in `text`, in order.
pub fn tags_in(text: &str) -> Vec<String> {
    let mut tags = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(TAG_OPEN) {
        let after = &rest[at + TAG_OPEN.len()..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 && after[digits..].starts_with(']') {
            tags.push(rest[at..at + TAG_OPEN.len() + digits + 1].to_string());
        }
        rest = after;
    }
    tags
}

/// A compact account of a text: its SHA-256, its length in bytes and the task tags in it.
/// Written `sha256=HEX bytes=N tags=[#t0001],[#t0002]` (`tags=-` for none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    /// The SHA-256 of the text's UTF-8 bytes, in lower-case hex.
    pub sha256: String,
    /// The text's length in bytes.
    pub bytes: usize,
    /// The task tags found in it, in order (see [`tags_in`]).
    pub tags: Vec<String>,
}

impl Digest {
    /// The digest of `text`.
    pub fn of(text: &str) -> Self {
        Self {
            sha256: sha256_hex(text),
            bytes: text.len(),
            tags: tags_in(text),
        }
    }
}

/// The SHA-256 of `text`, in lower-case hex.
pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tags = if self.tags.is_empty() {
            "-".to_string()
        } else {
            self.tags.join(",")
        };
        write!(f, "sha256={} bytes={} tags={tags}", self.sha256, self.bytes)
    }
}

/// Why a text is not a [`Digest`].
#[derive(Debug, PartialEq, Eq)]
pub struct NotADigest(pub String);

impl fmt::Display for NotADigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a digest: {:?}", self.0)
    }
}

impl std::error::Error for NotADigest {}

impl FromStr for Digest {
    type Err = NotADigest;

    /// Reads what [`Digest`]'s `Display` writes, and nothing else.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let wrong = || NotADigest(text.to_string());
        let mut fields = text.split(' ');
        let mut field = |name: &str| {
            fields
                .next()
                .and_then(|f| f.strip_prefix(name))
                .ok_or_else(wrong)
        };
        let sha256 = field("sha256=")?;
        let bytes = field("bytes=")?.parse().map_err(|_| wrong())?;
        let tags = field("tags=")?;
        let tags = match tags {
            "-" => Vec::new(),
            tags => tags.split(',').map(str::to_string).collect(),
        };
        let hex = sha256.len() == 64 && sha256.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
        if !hex || fields.next().is_some() || tags.iter().any(|t| tags_in(t) != [t.clone()]) {
            return Err(wrong());
        }
        Ok(Self {
            sha256: sha256.to_string(),
            bytes,
            tags,
        })
    }
}

/// A typed task as a digesting model received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// What it answered with.
    pub digest: Digest,
    /// The text it digested (see the module doc).
    pub text: String,
    /// The same before Claude Code's paste wrapping was taken off: exactly what arrived.
    pub raw: String,
}

impl Received {
    fn of(text: String, raw: String) -> Self {
        Self {
            digest: Digest::of(&text),
            text,
            raw,
        }
    }
}

/// The first message the latest `fleet_poll` of the conversation returned that no
/// `fleet_reply` answered yet: its id and text.
fn next_pulled(messages: &[Value]) -> Option<(String, String)> {
    let results: Vec<Value> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .flat_map(blocks)
        .filter(|b| b["type"] == "tool_result")
        .collect();
    let polled = results.iter().rev().find_map(|result| {
        let (name, _) = called_tool(messages, result["tool_use_id"].as_str()?)?;
        name.ends_with("fleet_poll")
            .then(|| serde_json::from_str::<Value>(&result_text(&result["content"])).ok())?
    })?;
    let answered: Vec<Value> = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(blocks)
        .filter(|b| {
            b["type"] == "tool_use"
                && b["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("fleet_reply"))
        })
        .map(|b| b["input"]["in_reply_to"].clone())
        .collect();
    polled["messages"].as_array()?.iter().find_map(|m| {
        let id = m["msg_id"].as_str()?;
        (!answered.contains(&json!(id))).then(|| {
            (
                id.to_string(),
                m["text"].as_str().unwrap_or_default().to_string(),
            )
        })
    })
}

/// The content blocks of a message (a bare string reads as one text block).
fn blocks(message: &Value) -> Box<dyn Iterator<Item = Value> + '_> {
    match &message["content"] {
        Value::String(text) => Box::new(std::iter::once(json!({"type": "text", "text": text}))),
        Value::Array(items) => Box::new(items.iter().cloned()),
        _ => Box::new(std::iter::empty()),
    }
}

/// The text the user typed: the last text block that is not a system reminder, with Claude
/// Code's `<pasted_content …>` wrapping of a paste taken off (a model reads what is inside).
fn typed_text(message: &Value) -> String {
    let text = blocks(message)
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str().map(str::to_string))
        .filter(|text| !text.trim_start().starts_with("<system-reminder>"))
        .last()
        .unwrap_or_default();
    unwrap_pastes(&text).trim().to_string()
}

/// `text` without the `<pasted_content id="…">` / `</pasted_content id="…">` lines around
/// pasted parts.
fn unwrap_pastes(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find("<pasted_content") {
        out.push_str(&rest[..open]);
        let Some(end) = rest[open..].find('>') else {
            break;
        };
        rest = &rest[open + end + 1..];
        rest = rest.strip_prefix('\n').unwrap_or(rest);
        if let Some(close) = rest.find("</pasted_content") {
            out.push_str(rest[..close].strip_suffix('\n').unwrap_or(&rest[..close]));
            rest = match rest[close..].find('>') {
                Some(end) => &rest[close + end + 1..],
                None => "",
            };
        }
    }
    out.push_str(rest);
    out
}

/// The tool (name, input) of the call `id` among the assistant's earlier messages.
fn called_tool(messages: &[Value], id: &str) -> Option<(String, Value)> {
    messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(blocks)
        .find(|b| b["type"] == "tool_use" && b["id"] == id)
        .map(|b| {
            (
                b["name"].as_str().unwrap_or_default().to_string(),
                b["input"].clone(),
            )
        })
}

/// A tool result's text, whether a string or text blocks.
fn result_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn model(request: &Value) -> Value {
    request.get("model").cloned().unwrap_or(json!("scripted"))
}

fn message_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

fn tool_id() -> String {
    format!("toolu_{}", uuid::Uuid::now_v7().simple())
}

/// The answer as one JSON message (a request without `stream`).
fn whole_message(request: &Value, turn: &Turn) -> Value {
    let (content, stop) = match turn {
        Turn::Say(text) => (json!([{"type": "text", "text": text}]), "end_turn"),
        Turn::Call(name, input) => (
            json!([{"type": "tool_use", "id": tool_id(), "name": name, "input": input}]),
            "tool_use",
        ),
    };
    json!({
        "id": message_id(), "type": "message", "role": "assistant", "model": model(request),
        "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 20}
    })
}

/// The answer as the server-sent events of a streamed message.
fn stream_events(request: &Value, turn: &Turn) -> String {
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": message_id(), "type": "message", "role": "assistant", "model": model(request),
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 100, "output_tokens": 1}
        }}),
    )];
    let (start, delta, stop) = match turn {
        Turn::Say(text) => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": text}),
            "end_turn",
        ),
        Turn::Call(name, input) => (
            json!({"type": "tool_use", "id": tool_id(), "name": name, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": input.to_string()}),
            "tool_use",
        ),
    };
    events.push((
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": start}),
    ));
    events.push((
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": delta}),
    ));
    events.push((
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": 20}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
        .into_iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voiced_model_opens_its_echo_with_its_voice() {
        let request = json!({"tools": tools(), "messages": [
            {"role": "user", "content": "the brief"}
        ]});
        assert_eq!(
            decide(&request, "[gpt] "),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "[gpt] echo: the brief"})
            )
        );
    }

    fn tools() -> Value {
        json!([{"name": "Bash"}, {"name": "mcp__fleet__fleet_reply"}, {"name": "mcp__fleet__fleet_ask"},
               {"name": "mcp__fleet__fleet_poll"}])
    }

    #[test]
    fn a_leads_call_is_made_as_typed_and_its_result_ends_the_turn() {
        let typed = json!({"role": "user", "content": "call: fleet_poll {\"wait_s\": 3}"});
        let request = json!({"tools": tools(), "messages": [typed.clone()]});
        assert_eq!(
            decide(&request, ""),
            Turn::Call("mcp__fleet__fleet_poll".into(), json!({"wait_s": 3}))
        );
        let none = json!({"tools": tools(), "messages": [
            {"role": "user", "content": "call: fleet_list"}
        ]});
        assert!(
            matches!(decide(&none, ""), Turn::Say(said) if said.starts_with("no tool fleet_list among Bash"))
        );
    }

    #[test]
    fn a_nudge_is_pulled_and_each_pulled_message_answered_by_its_id() {
        let nudge = json!({"role": "user", "content": [
            {"type": "text", "text": "[fleet] 2 messages waiting for you: call fleet_poll to read them"}
        ]});
        let request = json!({"tools": tools(), "messages": [nudge]});
        assert_eq!(
            decide(&request, "[gpt] "),
            Turn::Call("mcp__fleet__fleet_poll".into(), json!({"wait_s": 0}))
        );
        let polled = json!({"messages": [{"msg_id": "m1", "text": "first"},
                                         {"msg_id": "m2", "text": "second"}]});
        let mut messages = vec![
            nudge,
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "p1",
                "name": "mcp__fleet__fleet_poll", "input": {"wait_s": 0}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "p1",
                "content": [{"type": "text", "text": polled.to_string()}]}]}),
        ];
        let answer = |messages: &Vec<Value>| {
            decide(&json!({"tools": tools(), "messages": messages}), "[gpt] ")
        };
        assert_eq!(
            answer(&messages),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "[gpt] echo: first", "in_reply_to": "m1"})
            )
        );
        messages.push(
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "r1",
            "name": "mcp__fleet__fleet_reply", "input": {"message": "x", "in_reply_to": "m1"}}]}),
        );
        messages.push(json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": "r1", "content": "sent"}]}));
        assert_eq!(
            answer(&messages),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "[gpt] echo: second", "in_reply_to": "m2"})
            )
        );
        messages.push(
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "r2",
            "name": "mcp__fleet__fleet_reply", "input": {"message": "y", "in_reply_to": "m2"}}]}),
        );
        messages.push(json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": "r2", "content": "sent"}]}));
        assert!(matches!(answer(&messages), Turn::Say(_)));
    }

    #[test]
    fn a_typed_task_is_echoed_through_fleet_reply_past_system_reminders() {
        let request = json!({"tools": tools(), "messages": [
            {"role": "system", "content": "ignored"},
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                {"type": "text", "text": "line one\nline two\n"}
            ]}
        ]});
        assert_eq!(
            decide(&request, ""),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "echo: line one\nline two"})
            )
        );
    }

    #[test]
    fn a_task_typed_during_a_call_is_taken_up_from_the_calls_result() {
        let request = json!({"tools": tools(), "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t3",
                "name": "mcp__fleet__fleet_reply", "input": {"message": "x"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t3", "content": "ok"},
                {"type": "text", "text": "the next task"}
            ]}
        ]});
        assert_eq!(
            decide(&request, ""),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "echo: the next task"})
            )
        );
    }

    #[test]
    fn a_paste_is_read_without_its_wrapping() {
        let wrapped =
            "<pasted_content id=\"19eb\">\nline one\nline two\n</pasted_content id=\"19eb\">";
        assert_eq!(unwrap_pastes(wrapped), "line one\nline two");
        assert_eq!(
            unwrap_pastes("before <pasted_content id=\"1\">\nx\n</pasted_content id=\"1\"> after"),
            "before x after"
        );
        assert_eq!(unwrap_pastes("plain"), "plain");
    }

    #[test]
    fn an_ask_task_asks_then_replies_with_what_it_heard() {
        let ask = json!({"tools": tools(), "messages": [
            {"role": "user", "content": "ask: which port?"}
        ]});
        assert_eq!(
            decide(&ask, ""),
            Turn::Call(
                "mcp__fleet__fleet_ask".into(),
                json!({"question": "which port?"})
            )
        );
        let answered = json!({"tools": tools(), "messages": [
            {"role": "user", "content": "ask: which port?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                "name": "mcp__fleet__fleet_ask", "input": {"question": "which port?"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                "content": [{"type": "text", "text": "8080"}]}]}
        ]});
        assert_eq!(
            decide(&answered, ""),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "asked which port?, heard: 8080"})
            )
        );
    }

    #[test]
    fn a_run_task_calls_the_shell_then_replies_with_its_result() {
        let run = json!({"tools": tools(), "messages": [
            {"role": "user", "content": "run: touch proof"}
        ]});
        assert_eq!(
            decide(&run, ""),
            Turn::Call(
                "Bash".into(),
                json!({"command": "touch proof", "description": "Run the lead's command"})
            )
        );
        let ran = json!({"tools": tools(), "messages": [
            {"role": "user", "content": "run: touch proof"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "b1",
                "name": "Bash", "input": {"command": "touch proof"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b1",
                "content": "(no output)"}]}
        ]});
        assert_eq!(
            decide(&ran, ""),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "ran touch proof: (no output)"})
            )
        );
        // Without a shell tool, it is a task like any other.
        let toolless = json!({"tools": [{"name": "mcp__fleet__fleet_reply"}], "messages": [
            {"role": "user", "content": "run: touch proof"}
        ]});
        assert_eq!(
            decide(&toolless, ""),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "echo: run: touch proof"})
            )
        );
    }

    #[test]
    fn the_reply_result_ends_the_turn_and_a_toolless_request_gets_a_title() {
        let done = json!({"tools": tools(), "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t2",
                "name": "mcp__fleet__fleet_reply", "input": {"message": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "ok"}]}
        ]});
        assert_eq!(decide(&done, ""), Turn::Say("Done: ok".into()));
        let title = json!({"tools": [], "messages": [{"role": "user", "content": "hi"}]});
        assert!(matches!(decide(&title, ""), Turn::Say(text) if text.contains("title")));
    }

    /// What a digesting model answers `request` with: the `fleet_reply` message, and what it
    /// kept as received.
    fn digested(request: &Value) -> (String, Option<Received>) {
        match respond(request, &Script::Digest) {
            (Turn::Call(name, input), received) if name == "mcp__fleet__fleet_reply" => (
                input["message"].as_str().unwrap_or_default().to_string(),
                received,
            ),
            other => panic!("not a fleet_reply: {other:?}"),
        }
    }

    #[test]
    fn a_digesting_model_answers_a_multi_line_task_with_the_digest_of_exactly_what_arrived() {
        let task = "[#t0042] line one\n  line two, indented \n\nline four\n";
        let request = json!({"tools": tools(), "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                {"type": "text", "text": task}
            ]}
        ]});
        let (message, received) = digested(&request);
        // Nothing trimmed: the trailing newline and blank are part of what arrived.
        let digest = Digest::of(task);
        assert_eq!(message, digest.to_string());
        assert_eq!(digest.bytes, task.len());
        assert_eq!(digest.tags, ["[#t0042]"]);
        assert_eq!(message.parse::<Digest>(), Ok(digest.clone()));
        assert_eq!(
            received,
            Some(Received {
                digest,
                text: task.into(),
                raw: task.into()
            })
        );
        // An echoing model still echoes the same request, trimmed.
        assert_eq!(
            decide(&request, ""),
            Turn::Call(
                "mcp__fleet__fleet_reply".into(),
                json!({"message": "echo: [#t0042] line one\n  line two, indented \n\nline four"})
            )
        );
    }

    #[test]
    fn a_digest_counts_unicode_in_bytes_and_hashes_its_utf8() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let task = "[#t0001] café naïve 日本語 한국어 🚀👍🏽 עברית العربية";
        let request = json!({"tools": tools(), "messages": [{"role": "user", "content": task}]});
        let (message, _) = digested(&request);
        let digest: Digest = message.parse().unwrap();
        assert_eq!(digest.bytes, task.len());
        assert!(digest.bytes > task.chars().count());
        assert_eq!(digest.sha256, sha256_hex(task));
        assert_ne!(digest, Digest::of(&task.replace('é', "e\u{301}")));
    }

    #[test]
    fn a_digest_lists_every_tag_of_a_submit_that_holds_two_tasks() {
        // Two tasks in one text, as a paste merged with another…
        let one = json!({"tools": tools(), "messages": [{"role": "user", "content":
            "[#t0001] first task\n[#t0002] second task"}]});
        let (message, _) = digested(&one);
        assert!(message.ends_with(" tags=[#t0001],[#t0002]"), "{message}");
        // …or in two text blocks of one turn (a queued task sent along with the next), after
        // a call's result: both count, in order, joined by a newline.
        let two = json!({"tools": tools(), "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                "name": "mcp__fleet__fleet_reply", "input": {"message": "x"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                {"type": "text", "text": "[#t0003] third"},
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                {"type": "text", "text": "[#t0004] fourth"}
            ]}
        ]});
        let (message, received) = digested(&two);
        let received = received.unwrap();
        assert_eq!(received.text, "[#t0003] third\n[#t0004] fourth");
        assert_eq!(received.digest.tags, ["[#t0003]", "[#t0004]"]);
        assert_eq!(message, received.digest.to_string());
    }

    #[test]
    fn a_digest_is_of_a_paste_without_its_wrapping_and_other_turns_are_as_before() {
        // As Claude Code 2.1.332 sends a paste (recorded): two newlines, the block, a newline.
        let pasted = json!({"tools": tools(), "messages": [{"role": "user", "content":
            "\n\n<pasted_content id=\"19eb\">\n[#t0009] a\n\tb \n</pasted_content id=\"19eb\">\n"}]});
        let (message, received) = digested(&pasted);
        assert_eq!(message, Digest::of("[#t0009] a\n\tb ").to_string());
        assert!(received.unwrap().raw.starts_with("\n\n<pasted_content"));
        // The end of the turn, an ask and a toolless request are answered as by an echoing
        // model, and keep nothing.
        let done = json!({"tools": tools(), "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t2",
                "name": "mcp__fleet__fleet_reply", "input": {"message": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "ok"}]}
        ]});
        assert_eq!(
            respond(&done, &Script::Digest),
            (Turn::Say("Done: ok".into()), None)
        );
        let ask = json!({"tools": tools(), "messages": [{"role": "user", "content": "ask: why?"}]});
        assert_eq!(respond(&ask, &Script::Digest).1, None);
        let title = json!({"tools": [], "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(respond(&title, &Script::Digest).1, None);
    }

    #[test]
    fn claude_code_pastes_are_read_as_claude_code_reads_them() {
        let block = |id: &str, body: &str| {
            format!("<pasted_content id=\"{id}\">\n{body}\n</pasted_content id=\"{id}\">")
        };
        assert_eq!(
            claude_pastes(&format!("\n\n{}\n", block("0f05", "a\nb"))),
            "a\nb"
        );
        // Typed text around a block keeps all but the wrapping's newlines.
        assert_eq!(
            claude_pastes(&format!("typed\n\n\n{}\n\n\nafter", block("3d27", "x"))),
            "typed\nx\nafter"
        );
        // An empty block, a body holding newlines at its ends, two blocks.
        assert_eq!(claude_pastes(&block("00aa", "")), "");
        assert_eq!(claude_pastes(&block("00aa", "\nmid\n")), "\nmid\n");
        assert_eq!(
            claude_pastes(&format!("{}{}", block("0001", "one"), block("0002", "two"))),
            "onetwo"
        );
        // Not Claude Code's shape (an id not of four hex digits, no closing): kept as it is.
        for kept in [
            "<pasted_content id=\"1\">\nx\n</pasted_content id=\"1\">",
            "<pasted_content id=\"ABCD\">\nx\n</pasted_content id=\"ABCD\">",
            "<pasted_content id=\"abcd\">\nnever closed",
            "plain",
        ] {
            assert_eq!(claude_pastes(kept), kept);
        }
    }

    #[test]
    fn tags_are_found_only_in_their_shape_and_digests_read_back_only_as_written() {
        assert_eq!(tag(42), "[#t0042]");
        assert_eq!(tag(12345), "[#t12345]");
        assert_eq!(
            tags_in("[#t1] x [#t0002]y[#t03]"),
            ["[#t1]", "[#t0002]", "[#t03]"]
        );
        for none in ["", "[#t]", "[#t12", "[#tx1]", "[#T12]", "#t12]", "[#t 12]"] {
            assert!(tags_in(none).is_empty(), "{none:?}");
        }
        assert_eq!(tags_in("[#t[#t5]"), ["[#t5]"]);
        let digest = Digest::of("plain");
        assert!(digest.to_string().ends_with(" tags=-"));
        assert_eq!(digest.to_string().parse::<Digest>(), Ok(digest.clone()));
        let good = digest.to_string();
        for bad in [
            "echo: plain".to_string(),
            good.replace("sha256=", "sha1="),
            good.replace("tags=-", "tags=[#t1],x"),
            format!("{good} more"),
            good.replacen(&digest.sha256, "abc", 1),
            good.replace("bytes=5", "bytes=five"),
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_streamed_tool_call_carries_its_input_as_json_delta() {
        let events = stream_events(
            &json!({"model": "m"}),
            &Turn::Call("t".into(), json!({"a": 1})),
        );
        let order: Vec<&str> = events
            .lines()
            .filter_map(|l| l.strip_prefix("event: "))
            .collect();
        assert_eq!(
            order,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert!(events.contains(r#"\"a\":1"#), "{events}");
    }
}
