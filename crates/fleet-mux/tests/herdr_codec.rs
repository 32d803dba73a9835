//! The herdr codec against every exchange recorded from a real herdr 0.8.0 server
//! (`tests/data/herdr-transcript-0.8.0.json`, copied from the project's shared notes).

use fleet_mux::AgentState;
use fleet_mux::herdr::codec::{self, Answer, Event, Source};
use serde_json::{Value, json};

fn transcript() -> Value {
    let text = include_str!("data/herdr-transcript-0.8.0.json");
    serde_json::from_str(text).unwrap()
}

fn exchanges() -> Vec<(Value, Value)> {
    transcript()["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["request"].clone(), e["response"].clone()))
        .collect()
}

#[test]
fn every_recorded_answer_parses_with_its_id() {
    let all = exchanges();
    assert_eq!(all.len(), 58);
    for (request, response) in all {
        let (id, answer) = codec::parse_answer(&response.to_string()).unwrap();
        match &answer {
            Answer::Error { code, .. } if code == "invalid_request" => {
                // herdr could not read the request, so it could not echo its id.
                assert_eq!(id, "");
            }
            _ => assert_eq!(id, request["id"].as_str().unwrap()),
        }
        let method = request["method"].as_str().unwrap();
        match (method, answer) {
            ("ping", Answer::Result(r)) => {
                assert_eq!(codec::check_pong(&r).unwrap(), ("0.8.0".to_string(), 20));
            }
            ("workspace.create", Answer::Result(r)) => {
                assert_eq!(codec::created_workspace(&r).unwrap(), "w1");
            }
            ("pane.list", Answer::Result(r)) => {
                let panes = codec::listed_panes(&r).unwrap();
                assert!(!panes.is_empty());
                assert!(panes.iter().all(|p| p.workspace_id == "w1"));
            }
            ("pane.get" | "pane.split", Answer::Result(r)) => {
                let pane = codec::got_pane(&r).unwrap();
                assert!(pane.pane_id.starts_with("w1:p"));
            }
            ("pane.read", Answer::Result(r)) => {
                assert!(!codec::read_text(&r).unwrap().is_empty());
            }
            ("layout.apply", Answer::Result(r)) => {
                assert_eq!(
                    codec::applied_panes(&r).unwrap(),
                    vec![
                        ("catpane".to_string(), "w1:p3".to_string()),
                        ("shortlived".to_string(), "w1:p4".to_string())
                    ]
                );
            }
            (_, Answer::Error { code, message }) => {
                assert!(
                    ["timeout", "invalid_request", "pane_not_found"].contains(&code.as_str()),
                    "{method}: {code} {message}"
                );
                assert!(!message.is_empty());
            }
            (_, Answer::Result(r)) => assert!(r["type"].is_string(), "{method}: {r}"),
        }
    }
}

#[test]
fn agent_states_read_as_recorded() {
    let mut seen = Vec::new();
    for (request, response) in exchanges() {
        if request["method"] == "pane.get" {
            let pane = codec::got_pane(&response["result"]).unwrap();
            seen.push((pane.agent, pane.agent_state));
        }
    }
    assert!(seen.contains(&(Some("mydaemon".into()), AgentState::Working)));
    assert!(seen.contains(&(Some("mydaemon".into()), AgentState::Blocked)));
    assert!(seen.contains(&(Some("codex".into()), AgentState::Idle)));
    assert!(seen.contains(&(None, AgentState::Unknown)));
}

#[test]
fn every_recorded_event_parses() {
    let transcript = transcript();
    let mut exited = Vec::new();
    let mut statuses = Vec::new();
    for key in ["events_lifecycle", "events_status"] {
        for entry in transcript[key].as_array().unwrap() {
            match codec::parse_event(&entry["ev"].to_string()).unwrap() {
                Event::PaneExited(pane) => exited.push(pane),
                Event::AgentStatus {
                    pane_id, status, ..
                } => statuses.push((pane_id, status)),
                Event::Started => panic!("an event read as an answer"),
                Event::PaneClosed(_) | Event::PaneCreated(_) | Event::Other(_) => {}
            }
        }
    }
    assert_eq!(exited, vec!["w1:p4".to_string()]);
    assert!(statuses.contains(&("w1:p2".to_string(), AgentState::Blocked)));
    // A subscription's own answer starts the stream.
    let started = exchanges()
        .into_iter()
        .find(|(r, _)| r["method"] == "events.subscribe")
        .unwrap()
        .1;
    assert_eq!(
        codec::parse_event(&started.to_string()).unwrap(),
        Event::Started
    );
}

#[test]
fn requests_match_the_recorded_ones() {
    let recorded = |id: &str| {
        exchanges()
            .into_iter()
            .map(|(r, _)| r)
            .find(|r| r["id"] == id && r["params"]["pane_id"] != "w1:p3")
            .unwrap()
    };
    let same = |built: (&str, Value), recorded: Value| {
        assert_eq!(built.0, recorded["method"].as_str().unwrap());
        for (key, value) in built.1.as_object().unwrap() {
            assert_eq!(&recorded["params"][key], value, "{key} of {}", built.0);
        }
    };
    same(
        codec::send_input(
            "w1:p2",
            Some("echo split=$SPLIT_VAR ws=$PROBE_VAR id=$HERDR_PANE_ID"),
            &["enter"],
        ),
        recorded("req_pane.send_input"),
    );
    same(codec::pane_get("w1:p2"), recorded("req_pane.get"));
    same(codec::pane_list(), recorded("req_pane.list"));
    same(codec::pane_close("w1:p2"), recorded("req_pane.close"));
    same(
        codec::pane_read("w1:p2", Source::Visible, None),
        recorded("req_pane.read"),
    );
    same(
        codec::report_agent(
            "w1:p2",
            "custom:acceptance",
            "mydaemon",
            AgentState::Working,
        ),
        recorded("req_pane.report_agent"),
    );
    same(
        codec::release_agent("w1:p2", "custom:acceptance", "mydaemon"),
        recorded("req_pane.release_agent"),
    );
    let (method, params) = codec::layout_apply(
        "w1",
        "catpane",
        &[
            "bash".into(),
            "-c".into(),
            "echo LAUNCHED:$FOO; exec cat".into(),
        ],
        &[("FOO".to_string(), "bar".to_string())].into(),
        std::path::Path::new("/srv"),
    );
    let layout = recorded("req_layout.apply");
    assert_eq!(method, "layout.apply");
    assert_eq!(params["workspace_id"], layout["params"]["workspace_id"]);
    assert_eq!(params["focus"], json!(false));
    let ours = &params["root"];
    let theirs = &layout["params"]["root"]["first"];
    for key in ["type", "label", "cwd", "command", "env"] {
        assert_eq!(ours[key], theirs[key], "{key}");
    }
}
