//! Bad input gets a clear error naming what is wrong, and nothing already accepted is lost.

use std::time::Duration;

use fleet_testkit::client::{Protocol, ToolError};
use fleet_testkit::fleet::{Fleet, sim_profile, token_spy_profile};
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::as_worker;

const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_named_and_lose_nothing() -> anyhow::Result<()> {
    let fleet = Fleet::start("max_message_bytes = 2000", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    // Accept something first: a reply held for the lead.
    let pending = lead.send("w1", "/slow 300 kept", 0).await?;
    assert_eq!(pending["status"], "pending");

    let cases = [
        (
            "fleet_send",
            json!({"to": "w1", "message": "x".repeat(2001)}),
            "too_large",
            "2001 bytes",
        ),
        (
            "fleet_send",
            json!({"to": "nobody", "message": "hi"}),
            "unknown_recipient",
            "'nobody'",
        ),
        (
            "fleet_send",
            json!({"to": "w1", "turn_id": "t", "message": "hi"}),
            "invalid_params",
            "exactly one",
        ),
        (
            "fleet_send",
            json!({"to": "w1", "message": "hi", "wait_s": 99999}),
            "invalid_params",
            "wait_s",
        ),
        (
            "fleet_send",
            json!({"to": "lead", "message": "hi"}),
            "invalid_params",
            "yourself",
        ),
        (
            "fleet_stop",
            json!({"to": "ghost"}),
            "unknown_recipient",
            "'ghost'",
        ),
        (
            "fleet_stop",
            json!({"to": "lead"}),
            "invalid_params",
            "lead",
        ),
        (
            "fleet_spawn",
            json!({"profile": "nope"}),
            "unknown_profile",
            "'nope'",
        ),
        (
            "fleet_spawn",
            json!({"profile": "sim", "name": "w1"}),
            "invalid_params",
            "'w1' is taken",
        ),
        (
            "fleet_spawn",
            json!({"profile": "sim", "name": "bad name"}),
            "invalid_params",
            "bad name",
        ),
        (
            "fleet_spawn",
            json!({"profile": "sim", "host": "elsewhere"}),
            "invalid_params",
            "elsewhere",
        ),
        (
            "fleet_spawn",
            json!({"profile": "sim", "cwd": "/no/such/dir"}),
            "invalid_params",
            "/no/such/dir",
        ),
        (
            "fleet_reply",
            json!({"message": "to nothing"}),
            "invalid_params",
            "in_reply_to",
        ),
        (
            "fleet_reply",
            json!({"message": "x", "in_reply_to": "nonsense"}),
            "invalid_params",
            "nonsense",
        ),
        (
            "fleet_poll",
            json!({"from": "ghost"}),
            "unknown_recipient",
            "ghost",
        ),
    ];
    for (tool, args, code, needle) in cases {
        let err = lead
            .call(tool, args.clone())
            .await?
            .expect_err(&format!("{tool} {args} succeeded"));
        assert_eq!(err.code, code, "{tool} {args}: {err}");
        assert!(err.message.contains(needle), "{tool} {args}: {err}");
    }
    // A malformed argument (wrong type, unknown field) is an error too, not a crash.
    let wrong = lead
        .call("fleet_send", json!({"to": "w1", "message": 5}))
        .await?;
    assert!(wrong.is_err());
    let unknown = lead.call("fleet_list", json!({"verbose": true})).await?;
    assert!(unknown.is_err());

    // What was accepted before is still there.
    let polled = lead.ok("fleet_poll", json!({"wait_s": 20})).await?;
    assert_eq!(polled["messages"][0]["text"], "echo: kept", "{polled}");
    Ok(())
}

/// Whether `err` is the refusal at the cap of messages waiting for `name`, 3 of them.
fn at_the_cap(err: &ToolError, name: &str) -> bool {
    err.code == "too_many"
        && err
            .message
            .contains(&format!("'{name}' already has 3 messages waiting"))
        && err.message.contains("gateway.max_held_per_recipient = 3")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_held_for_a_lead_or_a_worker_stop_at_the_cap_and_none_accepted_is_lost()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let fleet = Fleet::start(
        "max_held_per_recipient = 3",
        &format!(
            "[leads.alice]\n{}",
            token_spy_profile("spy", &dir.path().join("token"))
        ),
    )
    .await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let worker = as_worker(&fleet, &alice, &dir, "spy-1").await?;

    // A worker's messages to its lead are held for her: three (the cap) are taken...
    let mut questions = Vec::new();
    for n in 1..=3 {
        let sent = worker.send("alice", &format!("q{n}"), 0).await?;
        assert_eq!(sent["status"], "pending", "{sent}");
        questions.push(sent["msg_id"].as_str().unwrap_or_default().to_string());
    }
    // ...one more is refused to its sender, naming the cap.
    let over = worker
        .call(
            "fleet_send",
            json!({"to": "alice", "message": "q4", "wait_s": 0}),
        )
        .await?
        .expect_err("a fourth message was held");
    assert!(at_the_cap(&over, "alice"), "{over}");

    // Nothing accepted is lost: the lead gets the three, in order; taken, they make room, and
    // the refused one goes through when sent again.
    let texts = |polled: Value| -> Vec<String> {
        polled["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(|m| m["text"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        texts(alice.ok("fleet_poll", json!({})).await?),
        ["q1", "q2", "q3"]
    );
    let q4 = worker.send("alice", "q4", 0).await?;
    questions.push(q4["msg_id"].as_str().unwrap_or_default().to_string());

    // The same for the lead's replies held for the worker (one per question: a task has one
    // answer): the fourth fleet_reply fails.
    for (n, question) in questions.iter().take(3).enumerate() {
        alice
            .ok(
                "fleet_reply",
                json!({"message": format!("a{}", n + 1), "in_reply_to": question}),
            )
            .await?;
    }
    let over = alice
        .call(
            "fleet_reply",
            json!({"message": "a4", "in_reply_to": questions[3]}),
        )
        .await?
        .expect_err("a fourth reply was held");
    assert!(at_the_cap(&over, "spy-1"), "{over}");
    assert_eq!(
        texts(worker.ok("fleet_poll", json!({})).await?),
        ["a1", "a2", "a3"]
    );
    // Refused, it was never the answer: sent again, it goes through.
    alice
        .ok(
            "fleet_reply",
            json!({"message": "a4", "in_reply_to": questions[3]}),
        )
        .await?;
    assert_eq!(texts(alice.ok("fleet_poll", json!({})).await?), ["q4"]);
    assert_eq!(texts(worker.ok("fleet_poll", json!({})).await?), ["a4"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_queued_for_a_busy_worker_stop_at_the_cap_and_none_accepted_is_lost()
-> anyhow::Result<()> {
    let fleet = Fleet::start("max_held_per_recipient = 3", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    lead.send("w1", "/slow 8000 t1", 0).await?;
    until("w1 to be busy with its first task", LIMIT, || async {
        lead.entry("w1")
            .await
            .ok()
            .filter(|e| e["status"] == "busy")
    })
    .await?;
    // Three wait in its queue (the cap); a fourth is refused to its sender.
    for n in 2..=4 {
        let sent = lead.send("w1", &format!("t{n}"), 0).await?;
        assert_eq!(sent["state"], "queued", "{sent}");
    }
    let over = lead
        .call(
            "fleet_send",
            json!({"to": "w1", "message": "t5", "wait_s": 0}),
        )
        .await?
        .expect_err("a fourth task was queued");
    assert!(at_the_cap(&over, "w1"), "{over}");
    // A broadcast makes no copy for it, and says so.
    let broadcast = lead
        .ok("fleet_broadcast", json!({"message": "to all"}))
        .await?;
    assert_eq!(broadcast["copies"], 0, "{broadcast}");
    let note = broadcast["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("no copy: 'w1' already has 3 messages waiting"),
        "{broadcast}"
    );

    // Every accepted task is typed in and answered, in order; then the queue takes more.
    let mut answers = Vec::new();
    while answers.len() < 4 {
        let polled = lead.ok("fleet_poll", json!({"wait_s": 30})).await?;
        let got = polled["messages"].as_array().cloned().unwrap_or_default();
        anyhow::ensure!(!got.is_empty(), "answers stopped after {answers:?}");
        answers.extend(
            got.iter()
                .filter_map(|m| m["text"].as_str().map(String::from)),
        );
    }
    assert_eq!(answers, ["echo: t1", "echo: t2", "echo: t3", "echo: t4"]);
    let sent = lead.send("w1", "t5", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: t5", "{sent}");
    Ok(())
}

/// Every tool, called with a parameter it does not have, one left out or one of the wrong type,
/// answers in the documented `{code, message}` shape, `invalid_params`, naming what is wrong and
/// the parameters the tool has; nothing is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misnamed_or_mistyped_arguments_name_the_parameters_that_exist() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let tools = lead.tools().await?;
    let names: Vec<&str> = tools.iter().map(|(name, _)| name.as_str()).collect();
    assert!(
        [
            "fleet_list",
            "fleet_spawn",
            "fleet_send",
            "fleet_poll",
            "fleet_stop"
        ]
        .iter()
        .all(|tool| names.contains(tool)),
        "{names:?}"
    );
    for (tool, schema) in &tools {
        let names: Vec<&String> = schema["properties"]
            .as_object()
            .map(|p| p.keys().collect())
            .unwrap_or_default();
        let err = lead
            .call(tool, json!({"bogus_param": 1}))
            .await?
            .expect_err(&format!("{tool} took a bogus parameter"));
        assert_eq!(err.code, "invalid_params", "{tool}: {err}");
        assert!(
            err.message
                .starts_with(&format!("{tool} has no parameter 'bogus_param'; ")),
            "{tool}: {err}"
        );
        for name in &names {
            assert!(
                err.message.contains(name.as_str()),
                "{tool} does not name {name}: {err}"
            );
        }
        if names.is_empty() {
            assert!(
                err.message.ends_with("it takes no parameters"),
                "{tool}: {err}"
            );
        }
    }
    let cases = [
        (
            "fleet_spawn",
            json!({"name": "w1"}),
            "fleet_spawn needs 'profile', which the call left out; its parameters are ",
        ),
        (
            "fleet_send",
            json!({"to": "w1", "message": 5}),
            "fleet_send's 'message' must be string or null, not an integer; its parameters are ",
        ),
        (
            "fleet_send",
            json!({"to": "w1", "message": "hi", "wait_s": -1}),
            "fleet_send cannot take its arguments (invalid value: integer where u64 was expected); its parameters are ",
        ),
    ];
    for (tool, args, start) in cases {
        let err = lead
            .call(tool, args.clone())
            .await?
            .expect_err(&format!("{tool} {args} succeeded"));
        assert_eq!(err.code, "invalid_params", "{tool} {args}: {err}");
        assert!(err.message.starts_with(start), "{tool} {args}: {err}");
    }
    // None of them spawned or sent anything.
    assert_eq!(lead.names().await?, vec!["lead".to_string()]);
    Ok(())
}
