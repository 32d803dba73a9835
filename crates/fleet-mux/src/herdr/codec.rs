//! herdr's socket protocol: newline-delimited JSON, one request and one answer per connection
//! (a subscription keeps its connection and streams events). Pure: requests are built and
//! answers and events read here; no sockets.
//!
//! Tolerant of drift: ids are opaque strings, unknown fields are ignored, unknown agent states
//! read as `unknown`, unknown events are kept by name. The protocol number from `ping` is
//! checked against [`MIN_PROTOCOL`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::AgentState;

/// The oldest herdr protocol this codec was checked against (herdr 0.8.0 speaks 20).
pub const MIN_PROTOCOL: u64 = 20;

/// A codec failure: a line that is not what it should be.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// Not JSON, or not the shape of an answer or an event.
    #[error("malformed herdr line: {0}")]
    Malformed(String),
    /// herdr speaks an older protocol than we know.
    #[error(
        "herdr {version} speaks protocol {protocol}; fleetd needs protocol {MIN_PROTOCOL} or newer"
    )]
    TooOld {
        /// herdr's version.
        version: String,
        /// Its protocol number.
        protocol: u64,
    },
}

/// One request line (with its newline).
pub fn request(id: &str, method: &str, params: Value) -> String {
    let mut line = json!({"id": id, "method": method, "params": params}).to_string();
    line.push('\n');
    line
}

/// `ping`
pub fn ping() -> (&'static str, Value) {
    ("ping", json!({}))
}

/// `workspace.create`: a workspace for the fleet's panes.
pub fn workspace_create(label: &str, cwd: &Path) -> (&'static str, Value) {
    (
        "workspace.create",
        json!({"label": label, "cwd": cwd, "focus": false}),
    )
}

/// `layout.apply`: a new tab in `workspace_id` holding one pane that runs `argv` with `env`
/// in `cwd`.
pub fn layout_apply(
    workspace_id: &str,
    label: &str,
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: &Path,
) -> (&'static str, Value) {
    (
        "layout.apply",
        json!({
            "workspace_id": workspace_id,
            "tab_label": label,
            "focus": false,
            "root": {"type": "pane", "label": label, "cwd": cwd, "command": argv, "env": env},
        }),
    )
}

/// `pane.send_input`: `text` (a paste if the program asked for bracketed paste), then `keys`.
pub fn send_input(pane_id: &str, text: Option<&str>, keys: &[&str]) -> (&'static str, Value) {
    let mut params = json!({"pane_id": pane_id});
    if let Some(text) = text {
        params["text"] = json!(text);
    }
    if !keys.is_empty() {
        params["keys"] = json!(keys);
    }
    ("pane.send_input", params)
}

/// Where `pane.read` reads from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The visible screen.
    Visible,
    /// Recent output with long lines unwrapped (headless panes are narrow).
    RecentUnwrapped,
}

/// `pane.read`
pub fn pane_read(pane_id: &str, source: Source, lines: Option<usize>) -> (&'static str, Value) {
    let source = match source {
        Source::Visible => "visible",
        Source::RecentUnwrapped => "recent_unwrapped",
    };
    let mut params = json!({"pane_id": pane_id, "source": source});
    if let Some(lines) = lines {
        params["lines"] = json!(lines);
    }
    ("pane.read", params)
}

/// `pane.get`
pub fn pane_get(pane_id: &str) -> (&'static str, Value) {
    ("pane.get", json!({"pane_id": pane_id}))
}

/// `pane.list`
pub fn pane_list() -> (&'static str, Value) {
    ("pane.list", json!({}))
}

/// `pane.close`
pub fn pane_close(pane_id: &str) -> (&'static str, Value) {
    ("pane.close", json!({"pane_id": pane_id}))
}

/// `pane.report_agent` (herdr derives `done` itself and refuses it as a report: it is sent as
/// `idle`).
pub fn report_agent(
    pane_id: &str,
    source: &str,
    agent: &str,
    state: AgentState,
) -> (&'static str, Value) {
    let state = match state {
        AgentState::Idle | AgentState::Done => "idle",
        AgentState::Working => "working",
        AgentState::Blocked => "blocked",
        AgentState::Unknown => "unknown",
    };
    (
        "pane.report_agent",
        json!({"pane_id": pane_id, "source": source, "agent": agent, "state": state}),
    )
}

/// `pane.release_agent`
pub fn release_agent(pane_id: &str, source: &str, agent: &str) -> (&'static str, Value) {
    (
        "pane.release_agent",
        json!({"pane_id": pane_id, "source": source, "agent": agent}),
    )
}

/// `events.subscribe` to the lifecycle events a gateway watches.
pub fn subscribe_lifecycle() -> (&'static str, Value) {
    (
        "events.subscribe",
        json!({"subscriptions": [
            {"type": "pane.created"},
            {"type": "pane.closed"},
            {"type": "pane.exited"},
            {"type": "pane.agent_detected"},
        ]}),
    )
}

/// An answer: the result, or herdr's error.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// `result`, with its `type`.
    Result(Value),
    /// `error`
    Error {
        /// herdr's code (`pane_not_found`, `timeout`, `invalid_request`, …).
        code: String,
        /// Its sentence.
        message: String,
    },
}

#[derive(Deserialize)]
struct RawAnswer {
    #[serde(default)]
    id: String,
    result: Option<Value>,
    error: Option<RawError>,
}

#[derive(Deserialize)]
struct RawError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Reads an answer line: its id (empty when herdr could not read the request) and what it says.
pub fn parse_answer(line: &str) -> Result<(String, Answer), CodecError> {
    let raw: RawAnswer = serde_json::from_str(line.trim())
        .map_err(|e| CodecError::Malformed(format!("{e}: {line}")))?;
    match (raw.result, raw.error) {
        (Some(result), None) => Ok((raw.id, Answer::Result(result))),
        (None, Some(error)) => Ok((
            raw.id,
            Answer::Error {
                code: error.code,
                message: error.message,
            },
        )),
        _ => Err(CodecError::Malformed(format!(
            "neither result nor error: {line}"
        ))),
    }
}

/// A pane as herdr describes it (only the fields fleetd uses).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Pane {
    /// Its id.
    pub pane_id: String,
    /// Its workspace.
    #[serde(default)]
    pub workspace_id: String,
    /// Its label, when it has one.
    #[serde(default)]
    pub label: Option<String>,
    /// The agent herdr sees in it (detected, or reported by a program).
    #[serde(default)]
    pub agent: Option<String>,
    /// That agent's status.
    #[serde(default = "unknown", rename = "agent_status")]
    pub agent_state: AgentState,
}

fn unknown() -> AgentState {
    AgentState::Unknown
}

fn field<T: for<'de> Deserialize<'de>>(result: &Value, path: &[&str]) -> Result<T, CodecError> {
    let mut at = result;
    for key in path {
        at = at
            .get(key)
            .ok_or_else(|| CodecError::Malformed(format!("no '{}' in {result}", path.join("."))))?;
    }
    T::deserialize(at).map_err(|e| CodecError::Malformed(format!("{}: {e}", path.join("."))))
}

/// Reads `ping`'s answer and checks the protocol: herdr's version and protocol number.
pub fn check_pong(result: &Value) -> Result<(String, u64), CodecError> {
    let version: String = field(result, &["version"])?;
    let protocol: u64 = field(result, &["protocol"])?;
    if protocol < MIN_PROTOCOL {
        return Err(CodecError::TooOld { version, protocol });
    }
    Ok((version, protocol))
}

/// The id of the workspace `workspace.create` made.
pub fn created_workspace(result: &Value) -> Result<String, CodecError> {
    field(result, &["workspace", "workspace_id"])
}

/// The root pane `workspace.create` made (herdr starts a shell there), if it says.
pub fn created_root_pane(result: &Value) -> Option<String> {
    result["root_pane"]["pane_id"].as_str().map(String::from)
}

/// The panes `layout.apply` made, as (label, pane id), in layout order.
pub fn applied_panes(result: &Value) -> Result<Vec<(String, String)>, CodecError> {
    fn walk(node: &Value, into: &mut Vec<(String, String)>) -> Result<(), CodecError> {
        match node["type"].as_str() {
            Some("pane") => {
                let id: String = field(node, &["pane_id"])?;
                into.push((node["label"].as_str().unwrap_or_default().to_string(), id));
                Ok(())
            }
            Some("split") => {
                walk(&node["first"], into)?;
                walk(&node["second"], into)
            }
            _ => Err(CodecError::Malformed(format!("unknown layout node {node}"))),
        }
    }
    let mut panes = Vec::new();
    walk(&result["layout"]["root"], &mut panes)?;
    Ok(panes)
}

/// The panes of `pane.list`.
pub fn listed_panes(result: &Value) -> Result<Vec<Pane>, CodecError> {
    field(result, &["panes"])
}

/// The pane of `pane.get`.
pub fn got_pane(result: &Value) -> Result<Pane, CodecError> {
    field(result, &["pane"])
}

/// The text of `pane.read`.
pub fn read_text(result: &Value) -> Result<String, CodecError> {
    field(result, &["read", "text"])
}

/// An event of a subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The subscription is live (its answer).
    Started,
    /// A pane's program exited; the pane is gone.
    PaneExited(String),
    /// A pane was closed.
    PaneClosed(String),
    /// A pane was made.
    PaneCreated(String),
    /// An agent's status changed.
    AgentStatus {
        /// The pane.
        pane_id: String,
        /// The agent, if any.
        agent: Option<String>,
        /// Its status.
        status: AgentState,
    },
    /// Any other event, by name.
    Other(String),
}

/// Reads one line of a subscription: its answer or an event.
pub fn parse_event(line: &str) -> Result<Event, CodecError> {
    let value: Value = serde_json::from_str(line.trim())
        .map_err(|e| CodecError::Malformed(format!("{e}: {line}")))?;
    if value.get("result").is_some() || value.get("error").is_some() {
        return match parse_answer(line)? {
            (_, Answer::Result(result)) if result["type"] == "subscription_started" => {
                Ok(Event::Started)
            }
            (_, answer) => Err(CodecError::Malformed(format!(
                "not a subscription: {answer:?}"
            ))),
        };
    }
    let name = value["event"]
        .as_str()
        .ok_or_else(|| CodecError::Malformed(format!("no event name: {line}")))?;
    let data = &value["data"];
    let pane_id = || -> Result<String, CodecError> { field(data, &["pane_id"]) };
    Ok(match name {
        "pane_exited" => Event::PaneExited(pane_id()?),
        "pane_closed" => Event::PaneClosed(pane_id()?),
        "pane_created" => Event::PaneCreated(field(data, &["pane", "pane_id"])?),
        "pane.agent_status_changed" => Event::AgentStatus {
            pane_id: pane_id()?,
            agent: data["agent"].as_str().map(String::from),
            status: field(data, &["agent_status"]).unwrap_or(AgentState::Unknown),
        },
        other => Event::Other(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_line_of_json() {
        let (method, params) = send_input("w1:p2", Some("a\nb"), &["enter"]);
        let line = request("fleetd-1", method, params);
        assert!(line.ends_with('\n') && !line.trim_end().contains('\n'));
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["params"]["text"], "a\nb");
        assert_eq!(back["params"]["keys"], json!(["enter"]));
        let (_, only_keys) = send_input("w1:p2", None, &["enter"]);
        assert!(only_keys.get("text").is_none());
    }

    #[test]
    fn unknown_statuses_and_fields_are_tolerated() {
        let pane: Pane = serde_json::from_value(json!({
            "pane_id": "w9:p9", "agent_status": "dreaming", "brand_new_field": 1
        }))
        .unwrap();
        assert_eq!(pane.agent_state, AgentState::Unknown);
        assert_eq!(pane.agent, None);
    }

    #[test]
    fn an_old_protocol_is_refused_by_name() {
        let err =
            check_pong(&json!({"type": "pong", "version": "0.5.0", "protocol": 12})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "herdr 0.5.0 speaks protocol 12; fleetd needs protocol 20 or newer"
        );
        assert_eq!(
            check_pong(&json!({"version": "9.9.9", "protocol": 99})).unwrap(),
            ("9.9.9".to_string(), 99)
        );
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for line in ["", "{", "[]", "{\"id\":\"x\"}", "{\"event\":5}", "\u{0}"] {
            assert!(
                parse_answer(line).is_err() || parse_event(line).is_err(),
                "{line:?}"
            );
            let _ = parse_event(line);
        }
    }
}
