//! The short way for plain stateless calls (`fleet_send`, `fleet_reply`, `fleet_poll`,
//! `fleet_list` answered in the request's own task, not by rmcp's per-request service): the
//! answer is the JSON rmcp's would be, the real rmcp client's calls take it, a session's
//! do not, and a client that goes away mid-call ends its wait as before. Which way a call went
//! is read off `/metrics` (`fleetd_tool_calls_total{tool, served}`).

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::Fleet;
use fleet_testkit::wait::until;
use reqwest::RequestBuilder;
use serde_json::{Value, json};

use super::metrics::{scraped, value};

const LIMIT: Duration = Duration::from_secs(20);

/// Both answer forms, as clients send them (a call fleetd answers itself).
const PLAIN_ACCEPT: &str = "application/json, text/event-stream";
/// The same with weights, which only rmcp reads: the call goes to rmcp.
const WEIGHTED_ACCEPT: &str = "application/json;q=1, text/event-stream;q=0.9";

/// A stateless (2026-07-28) call of `tool` with `args` by `token`, its `Accept` header `accept`:
/// the answer's status, its head (content type, cache control and proxy buffering, `|` between)
/// and its body.
async fn raw_call(
    fleet: &Fleet,
    token: &str,
    accept: &str,
    tool: &str,
    args: &Value,
) -> anyhow::Result<(u16, String, String)> {
    raw_call_meta(fleet, token, accept, tool, args, json!({})).await
}

/// A stateless call's POST of `body` to `url` by `token`, its `Accept` header `accept` and its
/// `Mcp-Name` header `name`.
fn posted(url: String, token: &str, accept: &str, name: &str, body: &Value) -> RequestBuilder {
    reqwest::Client::new()
        .post(url)
        .header("authorization", format!("Bearer {token}"))
        .header("accept", accept)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .json(body)
        .timeout(Duration::from_secs(30))
}

/// [`raw_call`] with `extra` entries in the request's `_meta` (a progress token, say).
async fn raw_call_meta(
    fleet: &Fleet,
    token: &str,
    accept: &str,
    tool: &str,
    args: &Value,
    extra: Value,
) -> anyhow::Result<(u16, String, String)> {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}});
    for (key, value) in extra.as_object().into_iter().flatten() {
        meta[key] = value.clone();
    }
    let body = json!({"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {
        "name": tool, "arguments": args, "_meta": meta}});
    let response = posted(fleet.url(), token, accept, tool, &body)
        .send()
        .await?;
    let status = response.status().as_u16();
    let head = ["content-type", "cache-control", "x-accel-buffering"]
        .map(|name| {
            let value = response.headers().get(name);
            value.and_then(|v| v.to_str().ok()).unwrap_or("-")
        })
        .join(" | ");
    Ok((status, head, response.text().await?))
}

/// The answer `body` with the value at `pointer` in its result (structured, and the text that
/// writes it) blanked; the value must be there.
fn blanked(body: &str, pointer: &str) -> anyhow::Result<Value> {
    let mut answer: Value = serde_json::from_str(body)?;
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut written: Value = serde_json::from_str(&text)?;
    for tree in [&mut answer["result"]["structuredContent"], &mut written] {
        let value = tree
            .pointer_mut(pointer)
            .ok_or_else(|| anyhow::anyhow!("no {pointer} in {body}"))?;
        anyhow::ensure!(!value.is_null(), "{pointer} is null in {body}");
        *value = Value::Null;
    }
    answer["result"]["content"][0]["text"] = written;
    Ok(answer)
}

/// The calls `name` has open, as `client` sees it in the roster.
async fn open_calls(client: &Client, name: &str) -> Option<u64> {
    let entry = client.entry(name).await.ok()?;
    entry["open_calls"].as_u64()
}

/// How many calls of `tool` `fleet` counted as served `served` (its metrics read with lead
/// `a`'s token).
async fn served(fleet: &Fleet, tool: &str, served: &str) -> anyhow::Result<f64> {
    served_as_seen_by(fleet, "a", tool, served).await
}

/// [`served`], the metrics read with `lead`'s token.
pub(super) async fn served_as_seen_by(
    fleet: &Fleet,
    lead: &str,
    tool: &str,
    served: &str,
) -> anyhow::Result<f64> {
    let samples = scraped(fleet, lead).await?;
    Ok(value(
        &samples,
        "fleetd_tool_calls_total",
        &json!({"tool": tool, "served": served}),
    )
    .unwrap_or(0.0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_answered_directly_says_exactly_what_rmcps_answer_says() -> anyhow::Result<()>
{
    let fleet = Fleet::start("", "[leads.a]\n[leads.b]\n").await?;
    let token = fleet.token("a")?;
    // Answers that do not change between two calls: a failure of each kind, an empty poll, a
    // roster, arguments that miss the schema, one that is not a message id.
    let calls = [
        ("fleet_send", json!({"to": "nobody", "message": "hi"})),
        ("fleet_send", json!({"to": 5, "message": "hi"})),
        ("fleet_poll", json!({"wait_s": 0})),
        ("fleet_reply", json!({"message": "no task"})),
        (
            "fleet_reply",
            json!({"message": "x", "in_reply_to": "not-an-id"}),
        ),
        ("fleet_list", json!({"status": "nonsense"})),
    ];
    for (tool, args) in &calls {
        let direct = raw_call(&fleet, &token, PLAIN_ACCEPT, tool, args).await?;
        let by_rmcp = raw_call(&fleet, &token, WEIGHTED_ACCEPT, tool, args).await?;
        assert_eq!(direct.0, 200, "{tool} {args}: {direct:?}");
        assert!(direct.1.starts_with("application/json"), "{direct:?}");
        // The same JSON (the direct answer's structured content keeps its text's order of
        // keys, where rmcp's tree sorts them).
        assert_eq!(
            (direct.0, &direct.1),
            (by_rmcp.0, &by_rmcp.1),
            "{tool} {args}"
        );
        let (direct, by_rmcp): (Value, Value) = (
            serde_json::from_str(&direct.2)?,
            serde_json::from_str(&by_rmcp.2)?,
        );
        assert_eq!(direct, by_rmcp, "{tool} {args}: the two ways differ");
    }
    // Answers that differ only in what the call itself changes: the caller's last call (in
    // the roster) and a held send's new message id.
    for (tool, args, changes) in [
        (
            "fleet_list",
            json!({"host": "elsewhere"}),
            "/you/last_seen_ms",
        ),
        (
            "fleet_send",
            json!({"to": "b", "message": "held", "wait_s": 0}),
            "/msg_id",
        ),
    ] {
        let direct = raw_call(&fleet, &token, PLAIN_ACCEPT, tool, &args).await?;
        let by_rmcp = raw_call(&fleet, &token, WEIGHTED_ACCEPT, tool, &args).await?;
        assert_eq!((direct.0, &direct.1), (by_rmcp.0, &by_rmcp.1));
        let (direct, by_rmcp) = (blanked(&direct.2, changes)?, blanked(&by_rmcp.2, changes)?);
        assert_eq!(direct, by_rmcp, "{tool} {args}: the two ways differ");
    }
    let b = fleet.lead("b", Protocol::Stateless).await?;
    let held = b.poll(0).await?;
    assert_eq!(held.len(), 2, "{held:?}");

    // Which way each went: the plain calls directly, the weighted ones through rmcp.
    assert_eq!(served(&fleet, "fleet_send", "direct").await?, 3.0);
    assert_eq!(served(&fleet, "fleet_send", "rmcp").await?, 3.0);
    assert_eq!(served(&fleet, "fleet_reply", "direct").await?, 2.0);
    assert_eq!(served(&fleet, "fleet_reply", "rmcp").await?, 2.0);
    assert_eq!(served(&fleet, "fleet_list", "rmcp").await?, 2.0);
    assert_eq!(served(&fleet, "fleet_poll", "rmcp").await?, 1.0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rmcp_clients_stateless_calls_go_directly_and_a_sessions_through_rmcp()
-> anyhow::Result<()> {
    let fleet = Fleet::start("", "[leads.a]\n[leads.b]\n").await?;
    let stateless = fleet.lead("a", Protocol::Stateless).await?;
    stateless.ok("fleet_list", json!({})).await?;
    stateless
        .ok(
            "fleet_send",
            json!({"to": "b", "message": "m1", "wait_s": 0}),
        )
        .await?;
    let session = fleet.lead("b", Protocol::Session).await?;
    let held = session.poll(0).await?;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["text"], "m1", "{held:?}");
    assert_eq!(served(&fleet, "fleet_list", "direct").await?, 1.0);
    assert_eq!(served(&fleet, "fleet_send", "direct").await?, 1.0);
    assert_eq!(served(&fleet, "fleet_poll", "rmcp").await?, 1.0);
    // The client asks for progress on every call: a poll that waits goes directly too.
    let polled = stateless.ok("fleet_poll", json!({"wait_s": 1})).await?;
    assert_eq!(polled["messages"], json!([]), "{polled}");
    assert_eq!(served(&fleet, "fleet_poll", "direct").await?, 1.0);
    // A tool fleetd does not have goes to rmcp, which refuses it; the call counts under
    // `other`, never under the name its caller made up.
    let unknown = stateless.call("fleet_nothing", json!({})).await;
    assert!(
        unknown
            .as_ref()
            .is_err_and(|e| e.to_string().contains("tool not found")),
        "{unknown:?}"
    );
    assert_eq!(served(&fleet, "other", "rmcp").await?, 1.0);
    let samples = scraped(&fleet, "a").await?;
    assert!(
        samples
            .iter()
            .all(|s| s["labels"]["tool"] != "fleet_nothing"),
        "a made-up name became a label"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_rmcp_must_refuse_reaches_rmcp_whole_and_gets_its_refusal() -> anyhow::Result<()> {
    let fleet = Fleet::start(
        "",
        "[leads.a]
[leads.b]
",
    )
    .await?;
    let token = fleet.token("a")?;
    // An Mcp-Name header that does not say the body's tool: rmcp's 400, naming both, which it
    // can only write if the body reached it as it came.
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "fleet_list", "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}});
    let response = posted(fleet.url(), &token, PLAIN_ACCEPT, "fleet_poll", &body)
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 400);
    let refusal: Value = response.json().await?;
    assert_eq!(refusal["id"], 9, "{refusal}");
    let said = refusal["error"]["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("fleet_poll") && said.contains("fleet_list"),
        "{refusal}"
    );
    assert_eq!(served(&fleet, "fleet_list", "direct").await?, 0.0);
    assert_eq!(served(&fleet, "fleet_list", "rmcp").await?, 0.0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_call_whose_client_goes_away_ends_its_wait() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "[leads.a]\n[leads.b]\n").await?;
    let token = fleet.token("a")?;
    let a = fleet.lead("a", Protocol::Stateless).await?;
    let open_calls = || open_calls(&a, "a");
    // A long poll, given up by its client once it is open: the connection closes under it.
    let polling = {
        let (url_fleet, token) = (fleet.url(), token.clone());
        tokio::spawn(async move {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "fleet_poll", "arguments": {"wait_s": 600}, "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {}}}});
            posted(url_fleet, &token, PLAIN_ACCEPT, "fleet_poll", &body)
                .send()
                .await
        })
    };
    until("the poll to be open", LIMIT, || async {
        open_calls().await.filter(|n| *n == 1)
    })
    .await?;
    assert_eq!(served(&fleet, "fleet_poll", "direct").await?, 1.0);
    polling.abort();
    assert!(polling.await.is_err_and(|e| e.is_cancelled()));
    until("the given-up poll to close", LIMIT, || async {
        open_calls().await.filter(|n| *n == 0)
    })
    .await?;
    Ok(())
}

/// The messages of an event stream's `body`, each `data:` line's JSON, the progress a notice
/// counts blanked (it is the time the call has taken).
fn streamed(body: &str) -> anyhow::Result<Vec<Value>> {
    let mut messages = Vec::new();
    for data in body.lines().filter_map(|line| line.strip_prefix("data:")) {
        let mut message: Value = serde_json::from_str(data.trim())?;
        if let Some(progress) = message.pointer_mut("/params/progress") {
            anyhow::ensure!(progress.is_number(), "{data}");
            *progress = Value::Null;
        }
        messages.push(message);
    }
    Ok(messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_call_that_waits_past_a_progress_notice_streams_it_as_rmcp_does()
-> anyhow::Result<()> {
    let fleet = Fleet::start("", "[leads.a]\n[leads.b]\n").await?;
    let token = fleet.token("a")?;
    let (args, progress) = (json!({"wait_s": 8}), json!({"progressToken": "t1"}));
    // The two ways at once: each waits 8 s, its one notice due at 5 s.
    let (direct, by_rmcp) = tokio::join!(
        raw_call_meta(
            &fleet,
            &token,
            PLAIN_ACCEPT,
            "fleet_poll",
            &args,
            progress.clone()
        ),
        raw_call_meta(
            &fleet,
            &token,
            WEIGHTED_ACCEPT,
            "fleet_poll",
            &args,
            progress
        ),
    );
    let (direct, by_rmcp) = (direct?, by_rmcp?);
    assert_eq!(served(&fleet, "fleet_poll", "direct").await?, 1.0);
    assert_eq!(served(&fleet, "fleet_poll", "rmcp").await?, 1.0);
    assert_eq!((direct.0, by_rmcp.0), (200, 200));
    assert_eq!(direct.1, "text/event-stream | no-cache | no", "{direct:?}");
    assert_eq!(direct.1, by_rmcp.1);
    let messages = streamed(&direct.2)?;
    assert_eq!(messages, streamed(&by_rmcp.2)?, "{direct:?}\n{by_rmcp:?}");
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["method"], "notifications/progress");
    assert_eq!(messages[0]["params"]["progressToken"], "t1");
    assert_eq!(
        messages[0]["params"]["message"],
        "fleet_poll: still waiting after 5 s"
    );
    assert_eq!(messages[1]["id"], 41);
    assert_eq!(
        messages[1]["result"]["structuredContent"]["messages"],
        json!([])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_call_whose_client_goes_away_mid_stream_ends_its_wait() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "[leads.a]\n[leads.b]\n").await?;
    let token = fleet.token("a")?;
    let a = fleet.lead("a", Protocol::Stateless).await?;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "fleet_poll", "arguments": {"wait_s": 600}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "progressToken": "t2"}}});
    // The stream's head comes with its first notice, 5 s into the wait.
    let mut streaming = posted(fleet.url(), &token, PLAIN_ACCEPT, "fleet_poll", &body)
        .timeout(Duration::from_secs(60))
        .send()
        .await?;
    assert_eq!(streaming.status().as_u16(), 200);
    let mut first = String::new();
    while !first.contains("\n\n") {
        let Some(chunk) = streaming.chunk().await? else {
            anyhow::bail!("the stream ended: {first}");
        };
        first.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(first.contains("still waiting after 5 s"), "{first}");
    assert_eq!(served(&fleet, "fleet_poll", "direct").await?, 1.0);
    let open_calls = || open_calls(&a, "a");
    assert_eq!(open_calls().await, Some(1));
    drop(streaming);
    until("the poll given up mid-stream to close", LIMIT, || async {
        open_calls().await.filter(|n| *n == 0)
    })
    .await?;
    Ok(())
}
