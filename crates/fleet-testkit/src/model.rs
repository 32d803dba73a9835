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
//!   see it arrived intact);
//! - fleetd's nudge (`[fleet] N messages waiting for you: call fleet_poll …`) → call
//!   `fleet_poll`, then answer each message it returned, one a turn, with `fleet_reply{message:
//!   "echo: TEXT", in_reply_to: its msg_id}`;
//! - the result of that `fleet_reply` → end the turn with a short text (unless a task was typed
//!   meanwhile and came along with the result: that task is answered as above);
//! - a request without tools (Claude Code's title request) → a JSON `{"title": …}` text.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A running scripted model server; stops when dropped.
pub struct ModelSim {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Value>>>,
    stalled: Arc<AtomicBool>,
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
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stalled = Arc::new(AtomicBool::new(false));
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .fallback(any(|| async { StatusCode::OK }))
            .with_state(Shared {
                seen: Arc::clone(&seen),
                voice: Arc::from(voice),
                stalled: Arc::clone(&stalled),
            });
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("the scripted model server stopped: {e}");
            }
        });
        Ok(Self {
            addr,
            seen,
            stalled,
            task,
        })
    }

    /// While `stalled`, a request with tools (an agent's turn) is seen but never answered: the
    /// agent stays busy on it, as on a model that hangs.
    pub fn stall(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
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
        self.seen.lock().map(|seen| seen.len()).unwrap_or_default()
    }
}

impl Drop for ModelSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn count_tokens() -> Response {
    axum::Json(json!({"input_tokens": 100})).into_response()
}

async fn messages(
    State(shared): State<Shared>,
    axum::Json(request): axum::Json<Value>,
) -> Response {
    let turn = decide(&request, &shared.voice);
    if let Ok(mut seen) = shared.seen.lock() {
        seen.push(request.clone());
    }
    let with_tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
    if with_tools && shared.stalled.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
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
    /// The requests seen so far.
    seen: Arc<Mutex<Vec<Value>>>,
    /// The voice answers open with.
    voice: Arc<str>,
    /// Whether an agent's turn is left unanswered ([`ModelSim::stall`]).
    stalled: Arc<AtomicBool>,
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

/// Decides the answer to a request, from its tools and its latest user turn; a task's echo
/// opens with `voice`.
fn decide(request: &Value, voice: &str) -> Turn {
    let tools: Vec<&str> = request["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    if tools.is_empty() {
        return Turn::Say(json!({"title": "Fleet task"}).to_string());
    }
    let tool = |suffix: &str| {
        tools
            .iter()
            .find(|name| name.ends_with(suffix))
            .map(|name| name.to_string())
    };
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let Some(last) = messages.iter().rev().find(|m| m["role"] == "user") else {
        return Turn::Say("Nothing to do.".into());
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
        return match called {
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
    }
    let task = typed;
    // fleetd's nudge: what waits is pulled.
    if task.starts_with("[fleet] ")
        && task.contains("call fleet_poll")
        && let Some(poll) = tool("fleet_poll")
    {
        return Turn::Call(poll, json!({"wait_s": 0}));
    }
    if let Some(question) = task.strip_prefix("ask: ")
        && let Some(ask) = tool("fleet_ask")
    {
        return Turn::Call(ask, json!({"question": question}));
    }
    if let Some(command) = task.strip_prefix("run: ")
        && let Some(shell) = tools.iter().find(|t| t.eq_ignore_ascii_case(SHELL_TOOL))
    {
        return Turn::Call(
            shell.to_string(),
            json!({"command": command, "description": "Run the lead's command"}),
        );
    }
    match tool("fleet_reply") {
        Some(reply) => Turn::Call(reply, json!({"message": format!("{voice}echo: {task}")})),
        None => Turn::Say(format!("no fleet_reply tool; the task was: {task}")),
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
