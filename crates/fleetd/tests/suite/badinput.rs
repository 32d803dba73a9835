//! Bad input gets a clear error naming what is wrong, and nothing already accepted is lost.

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use serde_json::json;

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
