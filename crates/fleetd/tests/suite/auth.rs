//! Identity and authorisation over real HTTP: bearer tokens, roles, the Host/Origin guard.

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile, token_spy_profile};

use super::as_worker;
use fleet_testkit::wait::until;
use serde_json::{Value, json};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);

/// A minimal MCP POST (the older protocol's `initialize`), enough to reach the guard layers.
async fn post_mcp(fleet: &Fleet, headers: &[(&str, &str)]) -> anyhow::Result<(u16, Value)> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let (status, _, text) = post_raw(fleet, headers, body).await?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_token_get_401() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    // Each refusal names the next step: the command that prints a token.
    let (status, body) = post_mcp(&fleet, &[]).await?;
    assert_eq!(status, 401);
    let said = body["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("bearer") && said.contains("`fleetd token NAME`"),
        "{body}"
    );
    let (status, body) = post_mcp(&fleet, &[("authorization", "Bearer fleet_0000")]).await?;
    assert_eq!(status, 401);
    let said = body["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("`fleetd token NAME`") && said.contains("restart the client"),
        "{body}"
    );
    // A client started without FLEET_TOKEN sends the placeholder: told so.
    let (status, body) = post_mcp(&fleet, &[("authorization", "Bearer ${FLEET_TOKEN}")]).await?;
    assert_eq!(status, 401);
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("without FLEET_TOKEN set"),
        "{body}"
    );
    let token = fleet.token("lead")?;
    let bearer = format!("Bearer {token}");
    let (status, _) = post_mcp(&fleet, &[("authorization", &bearer)]).await?;
    assert_eq!(status, 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_stops_working_at_once() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    let old = fleet.token("lead")?;
    assert_eq!(
        fleet.token("lead")?,
        old,
        "the token is stable until rotated"
    );
    // The old token in use first, so the serving gateway has it resolved (and kept) when
    // `fleetd token`, another process, rotates it.
    let used = Client::connect(&fleet.url(), &old, Protocol::Stateless, &[]).await?;
    for _ in 0..3 {
        assert_eq!(
            used.ok("fleet_list", json!({})).await?["you"]["name"],
            "lead"
        );
    }
    let out = fleet.cli(&["token", "lead", "--rotate"])?;
    assert!(out.status.success());
    let new = String::from_utf8(out.stdout)?.trim().to_string();
    assert_ne!(new, old);
    let old_bearer = format!("Bearer {old}");
    assert_eq!(
        post_mcp(&fleet, &[("authorization", &old_bearer)]).await?.0,
        401
    );
    let refused = used.call("fleet_list", json!({})).await;
    assert!(refused.is_err(), "the old token still lists: {refused:?}");
    let lead = Client::connect(&fleet.url(), &new, Protocol::Stateless, &[]).await?;
    let me = lead.ok("fleet_list", json!({})).await?;
    assert_eq!(me["you"]["name"], "lead");
    assert_eq!(me["you"]["role"], "lead");
    Ok(())
}

/// Host and Origin must name this gateway exactly, port included: a prefix that only begins
/// like loopback, another loopback port, or another program's page on this machine is refused;
/// the web view's own origin may change state, another of the gateway's names only read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_hosts_and_origins_get_403() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    let token = format!("Bearer {}", fleet.token("lead")?);
    let port = url::Url::parse(&fleet.base())?
        .port()
        .ok_or_else(|| anyhow::anyhow!("no port"))?;
    let own = format!("127.0.0.1:{port}");
    let other_port = format!("127.0.0.1:{}", if port == 65535 { 1 } else { port + 1 });
    let message = |body: &Value| body["message"].as_str().unwrap_or_default().to_string();
    for host in [
        "evil.example".to_string(),
        "localhost:80.evil.example".to_string(),
        format!("localhost:{port}.evil.example"),
        other_port.clone(),
        "localhost".to_string(),
    ] {
        let (status, body) =
            post_mcp(&fleet, &[("authorization", &token), ("host", &host)]).await?;
        assert_eq!(status, 403, "Host {host}: {body}");
        assert!(message(&body).contains(&host), "{body}");
    }
    for origin in [
        "https://evil.example".to_string(),
        "http://localhost:80.evil.example".to_string(),
        "http://localhost:3000".to_string(),
        format!("http://{other_port}"),
        "null".to_string(),
    ] {
        let (status, body) =
            post_mcp(&fleet, &[("authorization", &token), ("origin", &origin)]).await?;
        assert_eq!(status, 403, "Origin {origin}: {body}");
    }
    // Another of the gateway's own names is another origin: it may not change state (a POST),
    // while the page's own origin may.
    let (status, body) = post_mcp(
        &fleet,
        &[
            ("authorization", &token),
            ("origin", &format!("http://localhost:{port}")),
        ],
    )
    .await?;
    assert_eq!(status, 403, "{body}");
    assert!(message(&body).contains("not the origin"), "{body}");
    let (status, body) = post_mcp(
        &fleet,
        &[
            ("authorization", &token),
            ("origin", &format!("http://{own}")),
        ],
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let (status, _) = post_mcp(
        &fleet,
        &[
            ("authorization", &token),
            ("host", &format!("localhost:{port}")),
            ("origin", &format!("http://localhost:{port}")),
        ],
    )
    .await?;
    assert_eq!(status, 200);
    for host in [
        "rebind.example".to_string(),
        "localhost:80.evil.example".to_string(),
    ] {
        let health = reqwest::Client::new()
            .get(format!("{}/healthz", fleet.base()))
            .header("host", &host)
            .send()
            .await?;
        assert_eq!(health.status().as_u16(), 403, "{host}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_without_a_token() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    let health: Value = reqwest::get(format!("{}/healthz", fleet.base()))
        .await?
        .json()
        .await?;
    assert_eq!(health["status"], "ok");
    assert_eq!(health["host_id"], "testhost");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_may_not_spawn_stop_or_message_each_other() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let profiles = format!(
        "[leads.alice]\n[leads.bob]\n{}\n{}",
        token_spy_profile("spy", &dir.path().join("token")),
        sim_profile("sim", &[])?
    );
    let fleet = Fleet::start("", &profiles).await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let worker = as_worker(&fleet, &alice, &dir, "spy-1").await?;
    let me = worker.ok("fleet_list", json!({})).await?;
    assert_eq!(me["you"]["name"], "spy-1");
    assert_eq!(me["you"]["role"], "worker");

    let spawn = worker
        .call("fleet_spawn", json!({"profile": "sim"}))
        .await?;
    let err = spawn.expect_err("a worker spawned");
    assert_eq!(err.code, "forbidden");
    assert!(err.message.contains("fleet_spawn"), "{err}");
    let stop = worker.call("fleet_stop", json!({"to": "spy-1"})).await?;
    assert_eq!(stop.expect_err("a worker stopped").code, "forbidden");

    alice
        .ok("fleet_spawn", json!({"profile": "sim", "name": "peer"}))
        .await?;
    let to_peer = worker
        .call("fleet_send", json!({"to": "peer", "message": "hi"}))
        .await?;
    assert_eq!(to_peer.expect_err("worker to worker").code, "forbidden");
    let to_other_lead = worker
        .call("fleet_send", json!({"to": "bob", "message": "hi"}))
        .await?;
    assert_eq!(
        to_other_lead.expect_err("worker to a foreign lead").code,
        "forbidden"
    );

    // To its own lead it may send; the message is held for alice.
    let to_lead = worker.send("alice", "a question", 0).await?;
    assert_eq!(to_lead["status"], "pending");
    let held = alice.ok("fleet_poll", json!({})).await?;
    assert_eq!(held["messages"][0]["text"], "a question");
    assert_eq!(held["messages"][0]["from_name"], "spy-1");
    assert_eq!(held["messages"][0]["kind"], "SEND");

    // The lead's answer to that question is held for the worker's poll, not typed into its
    // pane as if it were a task: the worker stays idle and takes its next task as usual.
    alice
        .ok(
            "fleet_reply",
            json!({"message": "the answer", "in_reply_to": to_lead["msg_id"]}),
        )
        .await?;
    let answers = worker.ok("fleet_poll", json!({"wait_s": 5})).await?;
    assert_eq!(answers["messages"][0]["text"], "the answer", "{answers}");
    assert_eq!(answers["messages"][0]["kind"], "REPLY");
    let me = worker.ok("fleet_list", json!({})).await?;
    assert_eq!(me["you"]["status"], "idle");

    // After a stop, the worker's token is revoked.
    alice.ok("fleet_stop", json!({"to": "spy-1"})).await?;
    assert!(worker.call("fleet_list", json!({})).await.is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_call_that_does_not_notify_is_answered_in_plain_json() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    let bearer = format!("Bearer {}", fleet.token("lead")?);
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "fleet_list", "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}}});
    let response = reqwest::Client::new()
        .post(fleet.url())
        .header("authorization", &bearer)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "fleet_list")
        .json(&body)
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let answer: Value = response.json().await?;
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["you"]["name"], "lead",
        "{answer}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_long_calls_stop_at_the_cap_and_one_that_ends_gives_its_place_back()
-> anyhow::Result<()> {
    let fleet = Fleet::start("max_long_calls_per_caller = 2", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    // Two polls on two more connections of the same lead: the cap is per caller.
    let mut polls = Vec::new();
    for _ in 0..2 {
        let other = fleet.lead("lead", Protocol::Stateless).await?;
        polls.push(tokio::spawn(async move {
            other.ok("fleet_poll", json!({"wait_s": 60})).await
        }));
    }
    let open_calls = || async {
        lead.entry("lead")
            .await
            .ok()
            .and_then(|e| e["open_calls"].as_u64())
    };
    until("both polls to be open (the cap)", LIMIT, || async {
        open_calls().await.filter(|n| *n == 2)
    })
    .await?;

    // One more long call of any kind is refused, naming the cap and its key.
    for (tool, args) in [
        ("fleet_poll", json!({"wait_s": 5})),
        (
            "fleet_send",
            json!({"to": "w1", "message": "x", "wait_s": 5}),
        ),
        ("fleet_spawn", json!({"profile": "sim"})),
    ] {
        let err = lead
            .call(tool, args)
            .await?
            .expect_err(&format!("a third long call ran: {tool}"));
        assert_eq!(err.code, "too_many", "{tool}: {err}");
        assert!(
            err.message.contains(tool)
                && err.message.contains("2 long calls")
                && err
                    .message
                    .contains("gateway.max_long_calls_per_caller = 2"),
            "{err}"
        );
    }
    // Calls that return at once are not long calls: they still work.
    assert_eq!(lead.poll(0).await?, Vec::<Value>::new());
    let sent = lead.send("w1", "for a poll", 0).await?;
    assert_eq!(sent["status"], "pending", "{sent}");

    // The answer ends one of the open polls (nothing was lost), which gives its place back.
    until("one poll to end", LIMIT, || async {
        open_calls().await.filter(|n| *n == 1)
    })
    .await?;
    // Its client hears the answer a moment after the gateway let the call go.
    let ended = until("one poll's client to have its answer", LIMIT, || async {
        polls.iter().position(|p| p.is_finished())
    })
    .await?;
    let polled = polls.swap_remove(ended).await??;
    assert_eq!(
        polled["messages"][0]["text"], "echo: for a poll",
        "{polled}"
    );
    let again = lead.ok("fleet_poll", json!({"wait_s": 1})).await?;
    assert_eq!(again["messages"], json!([]), "{again}");
    for poll in polls {
        poll.abort();
    }
    Ok(())
}

/// A raw MCP POST of `body` with `headers`: the status, the session id it answered with, and
/// the body as text (JSON, or the events of a stream).
async fn post_raw(
    fleet: &Fleet,
    headers: &[(&str, &str)],
    body: Value,
) -> anyhow::Result<(u16, Option<String>, String)> {
    let mut request = reqwest::Client::new()
        .post(fleet.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.json(&body).send().await?;
    let status = response.status().as_u16();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    Ok((status, session, response.text().await?))
}

/// `tools/list` on session `id` (after the `initialized` notice): its status and body.
async fn list_tools_on(fleet: &Fleet, bearer: &str, id: &str) -> anyhow::Result<(u16, String)> {
    let headers = [
        ("authorization", bearer),
        ("mcp-session-id", id),
        ("mcp-protocol-version", "2025-06-18"),
    ];
    post_raw(
        fleet,
        &headers,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;
    let (status, _, body) = post_raw(
        fleet,
        &headers,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await?;
    Ok((status, body))
}

/// A client that restarts, crashes or runs a test suite leaves its sessions open: 50 opened in
/// a row with one token, none closed, and the 50th is served (the least recently used idle
/// ones were closed for it), while the first is gone; a session is no other token's to use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_sessions_opened_with_one_token_and_never_closed_the_fiftieth_is_served()
-> anyhow::Result<()> {
    let fleet = Fleet::start("", "[leads.lead]\n[leads.other]\n").await?;
    let bearer = format!("Bearer {}", fleet.token("lead")?);
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let mut ids = Vec::new();
    for n in 1..=50 {
        let (status, id, body) =
            post_raw(&fleet, &[("authorization", &bearer)], initialize.clone()).await?;
        assert_eq!(status, 200, "session {n}: {body}");
        ids.push(id.ok_or_else(|| anyhow::anyhow!("session {n} has no id"))?);
    }
    let (status, body) = list_tools_on(&fleet, &bearer, &ids[49]).await?;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("fleet_send"), "{body}");
    let (status, body) = list_tools_on(&fleet, &bearer, &ids[0]).await?;
    assert_eq!(
        status, 404,
        "the first, least recently used, was closed: {body}"
    );
    // Another lead naming this lead's session is told it does not exist.
    let theirs = format!("Bearer {}", fleet.token("other")?);
    let (status, body) = list_tools_on(&fleet, &theirs, &ids[49]).await?;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no such MCP session"), "{body}");
    // And the session is still its owner's.
    let (status, _) = list_tools_on(&fleet, &bearer, &ids[49]).await?;
    assert_eq!(status, 200);
    Ok(())
}

/// Over the cap, the least recently used session with no call in flight is closed for the new
/// one, never one with a long call running; only when every one has a call in flight is the
/// new one refused, 429 naming the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_the_cap_closes_the_least_recently_used_idle_one_never_a_busy_one()
-> anyhow::Result<()> {
    let fleet = Fleet::start(
        "max_sessions_per_token = 2",
        "[leads.lead]\n[leads.other]\n",
    )
    .await?;
    let (url, token) = (fleet.url(), fleet.token("lead")?);
    let session = || Client::connect(&url, &token, Protocol::Session, &[]);
    let first = std::sync::Arc::new(session().await?);
    let second = session().await?;
    // The first is busy: a long poll runs on it.
    let busy = {
        let first = std::sync::Arc::clone(&first);
        tokio::spawn(async move { first.ok("fleet_poll", json!({"wait_s": 6})).await })
    };
    let watcher = fleet.lead("lead", Protocol::Stateless).await?;
    until("the first session's poll to be open", LIMIT, || async {
        let lead = watcher.entry("lead").await.ok()?;
        (lead["open_calls"].as_u64() == Some(1)).then_some(())
    })
    .await?;
    // A third: the second (idle) is closed for it (its client would open a new one at its
    // next call, transparently); the first's call goes on.
    let third = session().await?;
    assert_eq!(
        third.ok("fleet_list", json!({})).await?["you"]["name"],
        "lead"
    );
    assert_eq!(
        fleet
            .log()
            .matches("closed the least recently used idle MCP sessions")
            .count(),
        1,
        "{}",
        fleet.log()
    );
    drop(second);
    // Both held are busy now: one more is refused, naming the cap and its key.
    let also_busy = tokio::spawn(async move { third.ok("fleet_poll", json!({"wait_s": 4})).await });
    until("both sessions' polls to be open", LIMIT, || async {
        let lead = watcher.entry("lead").await.ok()?;
        (lead["open_calls"].as_u64() == Some(2)).then_some(())
    })
    .await?;
    let bearer = format!("Bearer {token}");
    let refused = until(
        "a new session refused while both are busy",
        LIMIT,
        || async {
            let (status, body) = post_mcp(&fleet, &[("authorization", &bearer)]).await.ok()?;
            (status == 429).then_some(body)
        },
    )
    .await?;
    assert_eq!(refused["error"], "too_many", "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("each with a call in flight")
            && message.contains("gateway.max_sessions_per_token = 2"),
        "{refused}"
    );
    // The calls in flight end as they would have: nothing was cut.
    assert_eq!(busy.await??["messages"], json!([]));
    assert_eq!(also_busy.await??["messages"], json!([]));
    // Another token has places of its own, and the stateless protocol needs no session.
    let other = fleet.lead("other", Protocol::Session).await?;
    assert_eq!(
        other.ok("fleet_list", json!({})).await?["you"]["name"],
        "other"
    );
    let stateless = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(stateless.names().await?, vec!["lead", "other"]);
    Ok(())
}

/// A long `fleet_send` survives its connection dropping: the client resumes the call's stream
/// with `Last-Event-ID` (both session protocols) and gets the reply, given once; and while the
/// call waits to be resumed, its session is busy: new sessions of the same token over the cap
/// close an idle one, never it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_send_whose_connection_drops_resumes_and_gets_its_reply() -> anyhow::Result<()> {
    for protocol in [Protocol::Session, Protocol::Resumable] {
        let fleet = Fleet::start("max_sessions_per_token = 2", &sim_profile("sim", &[])?).await?;
        let token = fleet.token("lead")?;
        let upstream: std::net::SocketAddr = fleet.base().trim_start_matches("http://").parse()?;
        let proxy = fleet_testkit::proxy::CutProxy::start(upstream).await?;
        let url = format!("http://{}/mcp", proxy.addr());
        // The proxy's port is none of the gateway's: the client names the gateway's own.
        let host = format!("127.0.0.1:{}", upstream.port());
        let lead =
            std::sync::Arc::new(Client::connect(&url, &token, protocol, &[("host", &host)]).await?);
        lead.spawn("sim", "w1").await?;
        let sending = {
            let lead = std::sync::Arc::clone(&lead);
            tokio::spawn(async move {
                lead.ok(
                    "fleet_send",
                    json!({"to": "w1", "message": "/slow 4000 after the drop", "wait_s": 30}),
                )
                .await
            })
        };
        let watcher = fleet.lead("lead", Protocol::Stateless).await?;
        until("w1 to be busy with the task", LIMIT, || async {
            let w1 = watcher.entry("w1").await.ok()?;
            (w1["status"] == "busy").then_some(())
        })
        .await?;
        let http = reqwest::Client::new();
        let open = || async {
            let open = fleet.metric("lead", "fleetd_connections_open").await?;
            Some(open as usize)
        };
        let before = open()
            .await
            .ok_or_else(|| anyhow::anyhow!("no connection count"))?;
        // The network drops, and stays down a while.
        proxy.pass(false);
        let cut = proxy.cut();
        assert!(cut >= 1, "the call's connection was not cut");
        until("fleetd to see the connections gone", LIMIT, || async {
            open().await.filter(|now| *now + cut <= before)
        })
        .await?;
        // Meanwhile the same token opens two sessions more (the cap is 2): the idle one makes
        // way for the second, never the one whose call waits to be resumed.
        let bearer = format!("Bearer {token}");
        for _ in 0..2 {
            let (status, body) = post_mcp(&fleet, &[("authorization", &bearer)]).await?;
            assert_eq!(status, 200, "{protocol:?}: {body}");
        }
        proxy.pass(true);
        let sent = tokio::time::timeout(LIMIT * 2, sending).await???;
        assert_eq!(sent["status"], "replied", "{protocol:?}: {sent}");
        assert!(
            sent["reply"]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("after the drop"),
            "{protocol:?}: {sent}"
        );
        // Resumed, not sent again: w1 was given the task once.
        let tasks: Value = http
            .get(format!("{}/api/v1/messages?to=w1", fleet.base()))
            .bearer_auth(&token)
            .send()
            .await?
            .json()
            .await?;
        let sends = tasks["messages"]
            .as_array()
            .map_or(0, |all| all.iter().filter(|m| m["kind"] == "SEND").count());
        assert_eq!(sends, 1, "{protocol:?}: {tasks}");
    }
    Ok(())
}
