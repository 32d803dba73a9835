//! The operator API (`/api/v1`) as a script would call it: a lead's token only, hostile
//! requests refused with a reason, and the same rules as the MCP tools.

use fleet_testkit::fleet::Fleet;
use serde_json::{Value, json};

use super::{fleet_with_w1_and_spy, worker_token};

/// A request to `path` of `fleet` with `token`: its status and JSON body.
async fn call(
    fleet: &Fleet,
    token: &str,
    path: &str,
    body: Option<Value>,
    origin: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    let client = reqwest::Client::new();
    let url = format!("{}{path}", fleet.base());
    let mut request = match body {
        Some(body) => client.post(url).json(&body),
        None => client.get(url),
    };
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    let response = request.bearer_auth(token).send().await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_api_takes_a_leads_token_and_refuses_what_is_wrong_naming_it()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, lead) = fleet_with_w1_and_spy(&dir).await?;
    let token = fleet.token("lead")?;
    // A send and its answer, as fleet_send gives them.
    let (status, sent) = call(
        &fleet,
        &token,
        "/api/v1/send",
        Some(json!({"to": "w1", "message": "via the api", "wait_s": 20})),
        None,
    )
    .await?;
    assert_eq!(
        (status, &sent["status"]),
        (200, &json!("replied")),
        "{sent}"
    );
    assert_eq!(sent["reply"]["text"], "echo: via the api");
    // Hostile or wrong requests: refused, saying what is wrong; nothing sent.
    let long_before = format!("/api/v1/messages?before={}", "9".repeat(2_000));
    for (path, body, code, says) in [
        (
            "/api/v1/send",
            Some(json!({"to": "w1", "message": "x", "from": "w1"})),
            400,
            "from",
        ),
        (
            "/api/v1/send",
            Some(json!({"to": "w1", "message": 5})),
            400,
            "message",
        ),
        (
            "/api/v1/send",
            Some(json!({"to": "w1", "message": "\u{1b}[2J"})),
            400,
            "control character",
        ),
        (
            "/api/v1/send",
            Some(json!({"to": "nobody", "message": "x"})),
            404,
            "'nobody'",
        ),
        ("/api/v1/messages?state=lost", None, 400, "none of queued"),
        ("/api/v1/messages?colour=red", None, 400, "colour"),
        ("/api/v1/messages?limit=-1", None, 400, "limit"),
        // Hostile page marks and names: refused, naming what, repeated inert.
        ("/api/v1/messages?with=w%1B%5B2J%0A", None, 404, "unknown"),
        ("/api/v1/messages?with=", None, 404, "unknown"),
        ("/api/v1/messages?before=%1B%5B2J", None, 400, "before"),
        (&long_before, None, 400, "before"),
        (
            "/api/v1/send",
            Some(json!({"to": "w1", "message": "x", "a\u{1b}[2J\n": 1})),
            400,
            "unknown field",
        ),
        (
            "/api/v1/messages?before=01a24b24-16c2-70ce-a072-4fcd316d1556",
            None,
            400,
            "no message you may list",
        ),
        ("/api/v1/stop", Some(json!({"to": "lead"})), 400, "lead"),
    ] {
        let (status, body) = call(&fleet, &token, path, body.clone(), None).await?;
        assert_eq!(status, code, "{path} {body}");
        assert!(body.to_string().contains(says), "{path}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(!message.contains(['\u{1b}', '\n']), "{path}: {body}");
        assert!(message.chars().count() <= 600, "{path}: {body}");
    }
    let (_, listed) = call(&fleet, &token, "/api/v1/messages", None, None).await?;
    assert_eq!(
        listed["messages"].as_array().map(Vec::len),
        Some(2),
        "the task and its reply only: {listed}"
    );
    // Another origin (a web page the lead's browser opened) is refused before anything else.
    let (status, _) = call(
        &fleet,
        &token,
        "/api/v1/roster",
        None,
        Some("https://evil.example"),
    )
    .await?;
    assert_eq!(status, 403);
    // Only a lead's token: a worker's is refused.
    let worker_token = worker_token(&lead, &dir, "spy2").await?;
    for path in ["/api/v1/roster", "/api/v1/messages", "/metrics"] {
        let (status, body) = call(&fleet, &worker_token, path, None, None).await?;
        assert_eq!(status, 401, "{path}: {body}");
    }
    let (status, _) = call(
        &fleet,
        &worker_token,
        "/api/v1/stop",
        Some(json!({"to": "w1"})),
        None,
    )
    .await?;
    assert_eq!(status, 401);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_through_the_api_counts_against_the_leads_long_calls() -> anyhow::Result<()> {
    let fleet = Fleet::start(
        "max_long_calls_per_caller = 1\n",
        &fleet_testkit::fleet::sim_profile("sim", &[])?,
    )
    .await?;
    let lead = fleet
        .lead("lead", fleet_testkit::client::Protocol::Stateless)
        .await?;
    lead.spawn("sim", "w1").await?;
    let token = fleet.token("lead")?;
    // One send waits on a task never answered; a second long call is refused while it does.
    let waiting = {
        let (base, token) = (fleet.base(), token.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/api/v1/send"))
                .bearer_auth(token)
                .json(&json!({"to": "w1", "message": "/never", "wait_s": 30}))
                .send()
                .await
        })
    };
    // Once w1 works on that task, the first send is waiting for its answer.
    fleet_testkit::wait::until(
        "w1 busy on the first send's task",
        std::time::Duration::from_secs(20),
        || async { (lead.entry("w1").await.ok()?["status"] == "busy").then_some(()) },
    )
    .await?;
    let (status, refused) = call(
        &fleet,
        &token,
        "/api/v1/send",
        Some(json!({"to": "w1", "message": "again", "wait_s": 5})),
        None,
    )
    .await?;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"], "too_many", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("long calls open")),
        "{refused}"
    );
    // With no wait it is no long call: it goes.
    let (status, queued) = call(
        &fleet,
        &token,
        "/api/v1/send",
        Some(json!({"to": "w1", "message": "later", "wait_s": 0})),
        None,
    )
    .await?;
    assert_eq!(
        (status, &queued["status"]),
        (200, &json!("pending")),
        "{queued}"
    );
    waiting.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_the_whole_fleet_and_may_stop_but_never_reads_a_text_nor_sends()
-> anyhow::Result<()> {
    let config = format!(
        "{}[operators.ops]\n[operators.prom]\nread_only = true\n",
        fleet_testkit::fleet::sim_profile("sim", &[])?
    );
    let fleet = Fleet::start("", &config).await?;
    let lead = fleet
        .lead("lead", fleet_testkit::client::Protocol::Stateless)
        .await?;
    lead.spawn("sim", "w1").await?;
    let sent = lead
        .ok(
            "fleet_send",
            json!({"to": "w1", "message": "the lead's own words", "wait_s": 20}),
        )
        .await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    let token_of = |name: &str| -> anyhow::Result<String> {
        let out = fleet.cli(&["token", name])?;
        anyhow::ensure!(out.status.success(), "{out:?}");
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    };
    let (ops, prom) = (token_of("ops")?, token_of("prom")?);
    assert!(fleet.state_dir().join("operators/ops.token").is_file());
    // An operator's token opens no MCP session: it is no entity.
    let mcp = fleet_testkit::client::Client::connect(
        &fleet.url(),
        &ops,
        fleet_testkit::client::Protocol::Stateless,
        &[],
    )
    .await;
    assert!(mcp.is_err(), "an operator is not an MCP caller");

    // The whole fleet and every message's state, from the command line.
    let out = fleet.cli(&["ls", "--operator", "ops", "--json"])?;
    assert!(out.status.success(), "{out:?}");
    let entities: Value = serde_json::from_slice(&out.stdout)?;
    assert!(entities.to_string().contains("\"w1\""), "{entities}");
    let out = fleet.cli(&["msgs", "--operator", "ops", "--json"])?;
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8(out.stdout)?;
    assert!(
        listed.contains(sent["msg_id"].as_str().unwrap_or("?")),
        "{listed}"
    );
    assert!(!listed.contains("the lead's own words"), "{listed}");
    // Never a text, a screen, or a send.
    for (args, says) in [
        (
            vec!["msgs", "--operator", "ops", "--text"],
            "operator 'ops' may not read a message's text",
        ),
        (
            vec!["send", "--operator", "ops", "w1", "hello"],
            "operator 'ops' may not send",
        ),
        (
            vec!["stop", "--operator", "prom", "w1"],
            "operator 'prom' is read-only",
        ),
        (
            vec!["ls", "--operator", "nobody"],
            "no operator named 'nobody'",
        ),
    ] {
        let out = fleet.cli(&args)?;
        let err = String::from_utf8(out.stderr)?;
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (status, body) = call(&fleet, &ops, "/api/v1/screen?name=w1", None, None).await?;
    assert_eq!(status, 403, "{body}");
    let (status, _) = call(&fleet, &prom, "/metrics", None, None).await?;
    assert_eq!(status, 200, "a read-only operator scrapes");
    let (status, history) = call(
        &fleet,
        &ops,
        &format!(
            "/api/v1/messages/{}",
            sent["msg_id"].as_str().unwrap_or("?")
        ),
        None,
        None,
    )
    .await?;
    assert_eq!(status, 200, "{history}");
    assert!(history.get("text").is_none(), "{history}");

    // An operator that may stop does; the lead sees the worker gone, and why.
    let out = fleet.cli(&["stop", "--operator", "ops", "w1"])?;
    assert!(out.status.success(), "{out:?}");
    let listed = lead.ok("fleet_list", json!({})).await?;
    assert!(!listed.to_string().contains("\"w1\""), "{listed}");
    // Any other token is refused.
    let (status, _) = call(&fleet, "fleet_0000", "/api/v1/roster", None, None).await?;
    assert_eq!(status, 401);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_sign_ins_and_feed_positions_are_refused_or_made_harmless() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, _lead) = fleet_with_w1_and_spy(&dir).await?;
    let http = reqwest::Client::new();
    let sign_in = format!("{}/ui/session", fleet.base());
    // Not JSON (a form another page could post), the wrong type, an unknown field, nothing:
    // refused, saying why, and no cookie set.
    for (content_type, body, status) in [
        (
            "application/x-www-form-urlencoded",
            "token=x".to_string(),
            400,
        ),
        ("application/json", json!({"token": 5}).to_string(), 400),
        (
            "application/json",
            json!({"token": "x", "as": "lead"}).to_string(),
            400,
        ),
        ("application/json", json!({"token": ""}).to_string(), 401),
        (
            "application/json",
            json!({"token": "fleet_\u{1b}[2J"}).to_string(),
            401,
        ),
    ] {
        let response = http
            .post(&sign_in)
            .header("content-type", content_type)
            .body(body.clone())
            .send()
            .await?;
        assert_eq!(response.status().as_u16(), status, "{body}");
        assert!(response.headers().get("set-cookie").is_none(), "{body}");
    }
    // From another origin, even with the lead's token: refused before anything else.
    let response = http
        .post(&sign_in)
        .header("origin", "http://evil.example")
        .json(&json!({"token": fleet.token("lead")?}))
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 403);
    assert!(response.headers().get("set-cookie").is_none());
    // A feed position that is no number is ignored, one past the end is now: either way the
    // feed opens and serves what comes next.
    for (header, value) in [
        ("last-event-id", "abc; drop"),
        ("last-event-id", "999999999999"),
    ] {
        let response = http
            .get(format!("{}/api/v1/events", fleet.base()))
            .bearer_auth(fleet.token("lead")?)
            .header(header, value)
            .send()
            .await?;
        assert_eq!(response.status().as_u16(), 200, "{value}");
    }
    let (status, body) = call(
        &fleet,
        &fleet.token("lead")?,
        "/api/v1/events?after=x",
        None,
        None,
    )
    .await?;
    assert_eq!(status, 400, "{body}");
    Ok(())
}

/// A message the gateway takes gets through the API however big its JSON grows (escaped, it may
/// be several times its size), and one over `max_message_bytes` is refused by that limit, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apis_send_takes_any_message_the_gateway_takes_and_names_its_limit_past_it()
-> anyhow::Result<()> {
    let fleet = Fleet::start(
        "max_message_bytes = 4194304\nmax_held_per_recipient = 10",
        "[leads.a]\n[leads.b]\n",
    )
    .await?;
    let token = fleet.token("a")?;
    // 3 MiB of tabs: 6 MiB as JSON, past axum's default body limit of 2 MiB.
    let big = "\t".repeat(3 * 1024 * 1024);
    let (status, sent) = call(
        &fleet,
        &token,
        "/api/v1/send",
        Some(json!({"to": "b", "message": big, "wait_s": 0})),
        None,
    )
    .await?;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(sent["status"], "pending", "{sent}");
    let over = "x".repeat(4 * 1024 * 1024 + 1);
    let (status, refused) = call(
        &fleet,
        &token,
        "/api/v1/send",
        Some(json!({"to": "b", "message": over, "wait_s": 0})),
        None,
    )
    .await?;
    assert_eq!(
        (status, &refused["error"]),
        (400, &json!("too_large")),
        "{refused}"
    );
    assert!(refused.to_string().contains("4194304"), "{refused}");
    Ok(())
}

/// Issue 36: a busy fleet's messages read a page at a time. Each page says how many there are
/// in all and where the next starts; walking the pages gives every message once, newest first,
/// as one long listing does; `with` keeps those one entity sent or got. A page on from another
/// lead's message, or from no id at all, is refused naming `before`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_page_on_from_the_last_one_listed_and_filter_by_whom_they_involve()
-> anyhow::Result<()> {
    let fleet = Fleet::start(
        "[leads.alice]\n[leads.bob]\n",
        &fleet_testkit::fleet::sim_profile("sim", &[])?,
    )
    .await?;
    let alice = fleet
        .lead("alice", fleet_testkit::client::Protocol::Stateless)
        .await?;
    let bob = fleet
        .lead("bob", fleet_testkit::client::Protocol::Stateless)
        .await?;
    alice.spawn("sim", "w1").await?;
    alice.spawn("sim", "w2").await?;
    bob.spawn("sim", "wb").await?;
    for (to, n) in [("w1", 4), ("w2", 3)] {
        for i in 0..n {
            let sent = alice.send(to, &format!("task {i}"), 20).await?;
            assert_eq!(sent["status"], "replied", "{sent}");
        }
    }
    let sent = bob.send("wb", "bob's", 20).await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    let token = fleet.token("alice")?;
    let ids = |page: &Value| -> Vec<String> {
        page["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["msg_id"].as_str().map(str::to_string))
            .collect()
    };
    let (_, everything) = call(&fleet, &token, "/api/v1/messages?limit=1000", None, None).await?;
    let all = ids(&everything);
    assert_eq!(all.len(), 14, "7 tasks and their replies: {everything}");
    assert_eq!(everything["total"], 14);
    assert_eq!(everything["next"], Value::Null, "one page holds them all");
    let mut walked = Vec::new();
    let mut path = "/api/v1/messages?limit=4".to_string();
    loop {
        let (status, page) = call(&fleet, &token, &path, None, None).await?;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["total"], 14, "every page counts them all: {page}");
        assert_eq!(page["newer"], walked.len(), "the pages before it: {page}");
        walked.extend(ids(&page));
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(walked.last().map(String::as_str), Some(next), "{page}");
                path = format!("/api/v1/messages?limit=4&before={next}");
            }
            None => break,
        }
    }
    assert_eq!(
        walked, all,
        "the pages, one after another, are the whole listing"
    );
    let (_, with_w2) = call(
        &fleet,
        &token,
        "/api/v1/messages?with=w2&limit=2",
        None,
        None,
    )
    .await?;
    assert_eq!(with_w2["total"], 6, "{with_w2}");
    for m in with_w2["messages"].as_array().into_iter().flatten() {
        assert!(m["from_name"] == "w2" || m["to_name"] == "w2", "{m}");
    }
    let (_, failed) = call(
        &fleet,
        &token,
        "/api/v1/messages?with=w1&state=failed",
        None,
        None,
    )
    .await?;
    assert_eq!(
        (failed["total"].clone(), failed["next"].clone()),
        (json!(0), Value::Null),
        "{failed}"
    );
    // Bob's own message is no page mark for alice, and reads as one never stored.
    let bobs = fleet.token("bob")?;
    let (_, his) = call(&fleet, &bobs, "/api/v1/messages", None, None).await?;
    let his_id = ids(&his).first().cloned().unwrap_or_default();
    assert!(!his_id.is_empty(), "bob has messages: {his}");
    // Nor does alice see any of his worker's messages by naming it.
    let (_, with_wb) = call(&fleet, &token, "/api/v1/messages?with=wb", None, None).await?;
    assert_eq!(with_wb["total"], 0, "{with_wb}");
    for before in [his_id.as_str(), "not-an-id"] {
        let (status, refused) = call(
            &fleet,
            &token,
            &format!("/api/v1/messages?before={before}"),
            None,
            None,
        )
        .await?;
        assert_eq!(status, 400, "{refused}");
        assert!(refused.to_string().contains("before"), "{refused}");
        assert!(!refused.to_string().contains("bob's"), "{refused}");
    }
    Ok(())
}
