//! The herdr codec against every exchange recorded from real herdr servers, one transcript
//! per build: main shortly after the 0.8.0 release (it calls itself 0.8.0 and answers protocol
//! 20; copied from the project's shared notes) and the v0.8.0 release tag (protocol 19,
//! recorded with `fleet-herdr-record`, which replays the first one's requests). Every test
//! runs on each.

// A test may unwrap: a panic is how it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_mux::AgentState;
use fleet_mux::herdr::codec::{self, Answer, Event, Source};
use serde_json::{Value, json};

/// Every transcript, with the protocol its herdr answered.
fn transcripts() -> Vec<(&'static str, Value)> {
    [
        (
            "main after 0.8.0",
            include_str!("data/herdr-transcript-main-p20.json"),
        ),
        (
            "the v0.8.0 release",
            include_str!("data/herdr-transcript-v0.8.0-p19.json"),
        ),
    ]
    .into_iter()
    .map(|(name, text)| (name, serde_json::from_str(text).unwrap()))
    .collect()
}

fn exchanges(transcript: &Value) -> Vec<(Value, Value)> {
    transcript["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["request"].clone(), e["response"].clone()))
        .collect()
}

#[test]
fn the_transcripts_are_of_the_builds_they_claim() {
    let protocols: Vec<(String, u64)> = transcripts()
        .iter()
        .map(|(_, t)| {
            let pong = &exchanges(t)[0].1["result"];
            assert_eq!(t["protocol"], pong["protocol"]);
            codec::check_pong(pong).unwrap()
        })
        .collect();
    assert_eq!(
        protocols,
        vec![("0.8.0".to_string(), 20), ("0.8.0".to_string(), 19)]
    );
}

#[test]
fn every_recorded_answer_parses_with_its_id() {
    for (name, transcript) in transcripts() {
        every_answer_parses(name, &transcript);
    }
}

fn every_answer_parses(name: &str, transcript: &Value) {
    let all = exchanges(transcript);
    assert_eq!(all.len(), 58, "{name}");
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
                assert_eq!(codec::check_pong(&r).unwrap().0, "0.8.0", "{name}");
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
                // A read of the last `lines` counts the blank rows below the text: on a
                // headless herdr (no client to size its panes) a screen that is not full reads
                // empty that way, so fleetd never asks for `lines`.
                let text = codec::read_text(&r).unwrap();
                assert!(
                    !text.is_empty() || request["params"].get("lines").is_some(),
                    "{name}: {request}"
                );
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
                    "{name}: {method}: {code} {message}"
                );
                assert!(!message.is_empty());
            }
            (_, Answer::Result(r)) => assert!(r["type"].is_string(), "{name}: {method}: {r}"),
        }
    }
}

#[test]
fn agent_states_read_as_recorded() {
    for (name, transcript) in transcripts() {
        let mut seen = Vec::new();
        for (request, response) in exchanges(&transcript) {
            if request["method"] == "pane.get" {
                let pane = codec::got_pane(&response["result"]).unwrap();
                seen.push((pane.agent, pane.agent_state));
            }
        }
        for expected in [
            (Some("mydaemon".into()), AgentState::Working),
            (Some("mydaemon".into()), AgentState::Blocked),
            (Some("codex".into()), AgentState::Idle),
            (None, AgentState::Unknown),
        ] {
            assert!(seen.contains(&expected), "{name}: {expected:?} in {seen:?}");
        }
    }
}

#[test]
fn every_recorded_event_parses() {
    for (name, transcript) in transcripts() {
        let mut exited = Vec::new();
        let mut others = 0;
        for key in ["events_lifecycle", "events_status"] {
            for entry in transcript[key].as_array().unwrap() {
                match codec::parse_event(&entry["ev"].to_string()).unwrap() {
                    Event::PaneExited(pane) => exited.push(pane),
                    Event::Started => panic!("{name}: an event read as an answer"),
                    Event::Other(_) => others += 1,
                }
            }
        }
        assert_eq!(exited, vec!["w1:p4".to_string()], "{name}");
        assert!(others > 0, "{name}");
        // A subscription's own answer starts the stream.
        let started = exchanges(&transcript)
            .into_iter()
            .find(|(r, _)| r["method"] == "events.subscribe")
            .unwrap()
            .1;
        assert_eq!(
            codec::parse_event(&started.to_string()).unwrap(),
            Event::Started,
            "{name}"
        );
    }
}

#[test]
fn requests_match_the_recorded_ones() {
    for (_, transcript) in transcripts() {
        requests_match(&transcript);
    }
}

fn requests_match(transcript: &Value) {
    let recorded = |id: &str| {
        exchanges(transcript)
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
        codec::pane_read("w1:p2", Source::Visible),
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
        std::path::Path::new(
            recorded("req_layout.apply")["params"]["root"]["first"]["cwd"]
                .as_str()
                .unwrap(),
        ),
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
