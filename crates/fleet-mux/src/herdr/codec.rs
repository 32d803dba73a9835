//! herdr's socket protocol: newline-delimited JSON, one request and one answer per connection
//! (a subscription keeps its connection and streams events). Pure: requests are built and
//! answers and events read here; no sockets.
//!
//! Tolerant of drift: ids are opaque strings, unknown fields are ignored, unknown agent states
//! read as `unknown`, unknown events are kept by name.
//!
//! Which herdr will do: the protocol number from `ping` must be at least [`MIN_PROTOCOL`], and
//! every [`probes`] request must be understood. herdr's protocol number counts changes to the
//! wire between its own terminal client and server, not to this API (0.8.0 answers 19, main 20
//! after a change to how bells reach the terminal; neither touched the API), so the number is
//! only a first filter and the probes are the real check.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::AgentState;

/// The oldest herdr protocol with every request, field and event fleetd uses: herdr 0.7.0's
/// (`layout.apply` running an argv with env and cwd, and pane ids like `w1:p2`, came with it).
pub const MIN_PROTOCOL: u64 = 14;
/// The herdr release that brought [`MIN_PROTOCOL`]: the one to name when a server is too old.
pub const MIN_RELEASE: &str = "0.7.0";
/// herdr's error code for a workspace it does not have (one it lost when it restarted, say).
pub const WORKSPACE_NOT_FOUND: &str = "workspace_not_found";
/// herdr's error code for a request it could not read: an unknown method, parameter value or
/// shape.
const INVALID_REQUEST: &str = "invalid_request";
/// The pane and workspace id the probes name: herdr's own ids look like `w1` and `w1:p2`, so no
/// pane or workspace ever has it.
const PROBE_TARGET: &str = "fleetd-probe-0";

/// A codec failure: a line that is not what it should be.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// Not JSON, or not the shape of an answer or an event.
    #[error("malformed herdr line: {0}")]
    Malformed(String),
    /// herdr speaks an older protocol than fleetd needs.
    #[error(
        "herdr {version} speaks protocol {protocol}; fleetd needs protocol {MIN_PROTOCOL} or newer: install herdr {MIN_RELEASE} or a later release"
    )]
    TooOld {
        /// herdr's version.
        version: String,
        /// Its protocol number.
        protocol: u64,
    },
    /// herdr did not understand a request fleetd needs.
    #[error(
        "herdr {version} (protocol {protocol}) does not understand {needs} ({answer}); fleetd needs herdr {MIN_RELEASE} or a later release"
    )]
    Lacks {
        /// herdr's version.
        version: String,
        /// Its protocol number.
        protocol: u64,
        /// What fleetd needs that it lacks.
        needs: &'static str,
        /// What herdr said.
        answer: String,
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

/// `pane.read`. Never with `lines`: herdr counts the blank rows below the text among them, so
/// on a headless server (no client sizes its panes) the last lines of a screen that is not full
/// read empty; herdr's default (up to 80 lines) is read and cut here instead.
pub fn pane_read(pane_id: &str, source: Source) -> (&'static str, Value) {
    let source = match source {
        Source::Visible => "visible",
        Source::RecentUnwrapped => "recent_unwrapped",
    };
    ("pane.read", json!({"pane_id": pane_id, "source": source}))
}

/// `pane.read` of the visible screen with its colours (`format: ansi`, herdr 0.5.7 and later).
pub fn pane_read_styled(pane_id: &str) -> (&'static str, Value) {
    (
        "pane.read",
        json!({"pane_id": pane_id, "source": "visible", "format": "ansi"}),
    )
}

/// `pane.get`
pub fn pane_get(pane_id: &str) -> (&'static str, Value) {
    ("pane.get", json!({"pane_id": pane_id}))
}

/// `pane.list`
pub fn pane_list() -> (&'static str, Value) {
    ("pane.list", json!({}))
}

/// `pane.process_info`
pub fn pane_process_info(pane_id: &str) -> (&'static str, Value) {
    ("pane.process_info", json!({"pane_id": pane_id}))
}

/// The pid of the program herdr started in the pane, from `pane.process_info` (its
/// `shell_pid`: the pane's own process, whatever it runs).
pub fn process_pid(result: &Value) -> Result<u32, CodecError> {
    field(result, &["process_info", "shell_pid"])
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

/// `events.subscribe` to the events a gateway acts on: a pane's program exiting (its pane
/// vanishes with no other trace). Agent states are read from `pane.list` instead: herdr sends
/// their changes only to a subscription naming the pane.
pub fn subscribe_lifecycle() -> (&'static str, Value) {
    (
        "events.subscribe",
        json!({"subscriptions": [{"type": "pane.exited"}]}),
    )
}

/// One capability check: a request using something fleetd needs from herdr, aimed at a pane or
/// workspace that does not exist. herdr reads a whole request before it looks anything up, so
/// one that knows the method and its parameters answers "not found" and one that does not
/// answers `invalid_request`; nothing changes on the server either way. (Parameters herdr does
/// not know are ignored rather than refused, so a probe proves the method and its values, not
/// every field: [`MIN_PROTOCOL`] covers the rest.)
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// What fleetd needs, for the error when herdr lacks it.
    pub needs: &'static str,
    /// The request.
    pub request: (&'static str, Value),
}

/// The probes for every request fleetd sends, built by the same functions as the real ones.
/// (The subscription is checked by subscribing; `ping` and `pane.list` are harmless and
/// called for real; `workspace.create` is older than every other method here.)
pub fn probes() -> Vec<Probe> {
    let pane = PROBE_TARGET;
    let mut probes = vec![
        Probe {
            needs: "layout.apply with a pane running an argv with env and cwd",
            request: layout_apply(
                PROBE_TARGET,
                "fleetd-probe",
                &["true".to_string()],
                &BTreeMap::from([("FLEETD_PROBE".to_string(), "1".to_string())]),
                Path::new("/"),
            ),
        },
        Probe {
            needs: "pane.send_input with text and keys",
            request: send_input(pane, Some("x"), &["enter"]),
        },
        Probe {
            needs: "pane.read of the visible screen",
            request: pane_read(pane, Source::Visible),
        },
        Probe {
            needs: "pane.read of recent unwrapped lines",
            request: pane_read(pane, Source::RecentUnwrapped),
        },
        Probe {
            needs: "pane.close",
            request: pane_close(pane),
        },
        Probe {
            needs: "pane.release_agent",
            request: release_agent(pane, "fleetd-probe", "fleetd-probe"),
        },
    ];
    for state in [
        AgentState::Idle,
        AgentState::Working,
        AgentState::Blocked,
        AgentState::Unknown,
    ] {
        probes.push(Probe {
            needs: "pane.report_agent with fleetd's agent states",
            request: report_agent(pane, "fleetd-probe", "fleetd-probe", state),
        });
    }
    probes
}

/// Whether an answer shows herdr understood the request: anything but `invalid_request`.
pub fn understood(answer: &Answer) -> bool {
    !matches!(answer, Answer::Error { code, .. } if code == INVALID_REQUEST)
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

/// The panes `layout.apply` made, as (label, pane id), in layout order. An error never quotes
/// the answer: it echoes each pane's command, whose argv may carry the worker's token.
pub fn applied_panes(result: &Value) -> Result<Vec<(String, String)>, CodecError> {
    fn walk(node: &Value, into: &mut Vec<(String, String)>) -> Result<(), CodecError> {
        match node["type"].as_str() {
            Some("pane") => {
                let id = node["pane_id"].as_str().ok_or_else(|| {
                    CodecError::Malformed("a pane of the layout has no pane_id".into())
                })?;
                let label = node["label"].as_str().unwrap_or_default();
                into.push((label.to_string(), id.to_string()));
                Ok(())
            }
            Some("split") => {
                walk(&node["first"], into)?;
                walk(&node["second"], into)
            }
            other => Err(CodecError::Malformed(format!(
                "a layout node of type {other:?}"
            ))),
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
    Ok(match name {
        "pane_exited" => Event::PaneExited(field(&value["data"], &["pane_id"])?),
        other => Event::Other(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panes_program_pid_is_its_shell_pid() {
        // As herdr 0.8.0 answered (see `shared/herdr/transcript-0.8.0.json`).
        let answer = json!({"type": "pane_process_info", "process_info": {
            "pane_id": "w1:p3", "shell_pid": 27949, "foreground_process_group_id": 27949,
            "foreground_processes": [{"pid": 27949, "name": "cat", "argv": ["cat"]}]}});
        assert_eq!(process_pid(&answer).ok(), Some(27949));
        assert!(process_pid(&json!({"type": "pane_process_info"})).is_err());
        assert_eq!(pane_process_info("w1:p3").1["pane_id"], "w1:p3");
    }

    #[test]
    fn an_unreadable_layout_is_told_without_quoting_its_commands() {
        let pane = |id: Value| {
            json!({"type": "pane", "pane_id": id, "label": "fleet:w1",
                   "command": ["docker", "-e", "FLEET_TOKEN=fleet_s3cret"]})
        };
        let answer = |root: Value| json!({"type": "layout_apply", "layout": {"root": root}});
        for root in [
            pane(Value::Null),
            json!({"type": "grid", "command": ["x", "fleet_s3cret"]}),
            json!({"type": "split", "first": pane(json!("w1:p2")), "second": pane(json!(7))}),
        ] {
            let err = applied_panes(&answer(root)).unwrap_err().to_string();
            assert!(!err.contains("s3cret"), "{err}");
        }
        assert_eq!(
            applied_panes(&answer(pane(json!("w1:p2")))).unwrap(),
            vec![("fleet:w1".to_string(), "w1:p2".to_string())]
        );
    }

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
    fn an_old_protocol_is_refused_naming_the_release_to_install() {
        let err =
            check_pong(&json!({"type": "pong", "version": "0.6.9", "protocol": 13})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "herdr 0.6.9 speaks protocol 13; fleetd needs protocol 14 or newer: install herdr 0.7.0 or a later release"
        );
        // The released 0.8.0 (19) and main after it (20) are both new enough.
        for protocol in [14, 19, 20, 99] {
            assert_eq!(
                check_pong(&json!({"version": "0.8.0", "protocol": protocol})).unwrap(),
                ("0.8.0".to_string(), protocol)
            );
        }
    }

    #[test]
    fn probes_change_nothing_and_only_invalid_request_means_not_understood() {
        for probe in probes() {
            let (method, params) = &probe.request;
            // Every probe names the target no herdr pane or workspace has.
            let target = params
                .get("pane_id")
                .or_else(|| params.get("workspace_id"))
                .and_then(Value::as_str);
            assert_eq!(target, Some(PROBE_TARGET), "{method}");
            assert_ne!(*method, "workspace.create");
        }
        let not_found = Answer::Error {
            code: "pane_not_found".into(),
            message: "pane fleetd-probe-0 not found".into(),
        };
        let unknown = Answer::Error {
            code: "invalid_request".into(),
            message: "invalid request: unknown variant `layout.apply`".into(),
        };
        assert!(understood(&not_found));
        assert!(understood(&Answer::Result(json!({"type": "ok"}))));
        assert!(!understood(&unknown));
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
