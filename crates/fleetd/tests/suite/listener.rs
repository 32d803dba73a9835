//! The listener's limits on the real binary, over raw TCP: connections that send nothing or
//! drip their headers are closed by the timeouts, strangers make way for newcomers at the
//! connection cap so a lead always gets in, a full house of authenticated connections answers
//! `503` at once, and each token holds at most its event streams. (The same under a flood of
//! 10,000 connections: `fleet-bench flood`.)

use std::time::{Duration, Instant};

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::Fleet;
use fleet_testkit::wait::until;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(20);

/// The gateway's address.
fn addr(fleet: &Fleet) -> String {
    fleet.base().trim_start_matches("http://").to_string()
}

/// Waits for the server to close `stream` (a read of nothing, or an error), reading and
/// keeping what it sent first; how long that took from `since`.
async fn closed_by_server(
    stream: &mut TcpStream,
    since: Instant,
) -> anyhow::Result<(Duration, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(LIMIT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    anyhow::ensure!(read.is_ok(), "the server kept the connection open");
    Ok((since.elapsed(), got))
}

/// A raw GET of `path` on `stream` (kept alive); the response's status line and body.
async fn get(
    stream: &mut TcpStream,
    host: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(String, String)> {
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n{auth}\r\n").as_bytes())
        .await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "closed before a whole response");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|n| n.trim().parse::<usize>())
                })
                .transpose()?
                .unwrap_or(0);
            if body.len() >= length {
                let status = head.lines().next().unwrap_or_default().to_string();
                return Ok((status, body.to_string()));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_dripping_and_idle_connections_are_closed_and_a_lead_gets_in_past_them()
-> anyhow::Result<()> {
    let fleet = Fleet::start(
        "header_timeout_s = 3\nidle_timeout_s = 3\nmax_connections = 40",
        "",
    )
    .await?;
    let host = addr(&fleet);
    // 60 strangers that send nothing: the 20 oldest make way at once for the 20 newest.
    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..60 {
        silent.push(TcpStream::connect(&host).await?);
    }
    // The cap holds: a lead, and a monitor's probe, still get in.
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(lead.names().await?, vec!["lead"]);
    let health = reqwest::get(format!("{}/healthz", fleet.base())).await?;
    assert_eq!(health.status().as_u16(), 200);
    // One that drips its request head, a byte at a time.
    let mut drip = TcpStream::connect(&host).await?;
    let dripped = Instant::now();
    let dripping = tokio::spawn(async move {
        for byte in format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\nx-pad: ")
            .bytes()
            .chain(std::iter::repeat(b'a'))
        {
            if drip.write_all(&[byte]).await.is_err() {
                return Ok::<_, anyhow::Error>(dripped.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut peek = [0u8; 1];
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_millis(1), drip.read(&mut peek)).await
            {
                return Ok(dripped.elapsed());
            }
        }
        anyhow::bail!("the drip never ended")
    });
    let mut closed = Vec::new();
    for stream in &mut silent {
        closed.push(closed_by_server(stream, opened).await?.0);
    }
    assert!(
        closed.iter().all(|d| *d < Duration::from_secs(8)),
        "a silent connection outlived the header timeout: {closed:?}"
    );
    let dripped = tokio::time::timeout(LIMIT, dripping).await???;
    assert!(
        dripped >= Duration::from_millis(2900) && dripped < Duration::from_secs(8),
        "a dripping head was closed after {dripped:?}, not after the 3 s header timeout"
    );
    // A connection kept alive after a request is closed once idle for idle_timeout_s.
    let mut kept = TcpStream::connect(addr(&fleet)).await?;
    let (status, _) = get(&mut kept, &addr(&fleet), "/healthz", None).await?;
    assert!(status.contains("200"), "{status}");
    let (idle, _) = closed_by_server(&mut kept, Instant::now()).await?;
    assert!(
        idle >= Duration::from_millis(2900) && idle < Duration::from_secs(8),
        "an idle connection was closed after {idle:?}, not after the 3 s idle timeout"
    );
    // The lead's own connection was never cut for a stranger.
    assert_eq!(lead.names().await?, vec!["lead"]);
    // fleetd counted each: at least 20 strangers evicted (the lead's and the probe's
    // connections came in at the cap too), the rest of the 60 and the drip timed out before
    // their first head, the kept one idle, none refused.
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", fleet.base()))
        .bearer_auth(fleet.token("lead")?)
        .send()
        .await?
        .text()
        .await?;
    let closed = |why: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "fleetd_connections_closed_total{{why=\"{why}\"}} "
                ))
            })
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_default()
    };
    let (evicted, header, idle) = (
        closed("evicted"),
        closed("header_timeout"),
        closed("idle_timeout"),
    );
    assert!(
        evicted >= 20
            && header >= 1
            && evicted + header >= 61
            && idle >= 1
            && closed("refused") == 0,
        "{metrics}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_connection_held_authenticated_a_new_one_is_answered_503_at_once()
-> anyhow::Result<()> {
    let fleet = Fleet::start("max_connections = 3\nidle_timeout_s = 60", "").await?;
    let (host, token) = (addr(&fleet), fleet.token("lead")?);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(&host).await?;
        let (status, body) = get(&mut stream, &host, "/api/v1/hosts", Some(&token)).await?;
        assert!(status.contains("200"), "{status} {body}");
        held.push(stream);
    }
    let mut extra = TcpStream::connect(&host).await?;
    let asked = Instant::now();
    extra
        .write_all(format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n").as_bytes())
        .await?;
    let (took, answer) = closed_by_server(&mut extra, asked).await?;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("gateway.max_connections = 3"),
        "{answer}"
    );
    assert!(took < Duration::from_secs(2), "refused after {took:?}");
    // The held ones still serve; one that closes makes room.
    let (status, _) = get(&mut held[0], &host, "/api/v1/hosts", Some(&token)).await?;
    assert!(status.contains("200"), "{status}");
    drop(held.pop());
    until("room for a new connection", LIMIT, || async {
        let mut stream = TcpStream::connect(&host).await.ok()?;
        let (status, _) = get(&mut stream, &host, "/healthz", None).await.ok()?;
        status.contains("200").then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_holds_at_most_its_event_streams() -> anyhow::Result<()> {
    let fleet = Fleet::start("max_streams_per_token = 2", "[leads.lead]\n[leads.other]\n").await?;
    let token = fleet.token("lead")?;
    let http = reqwest::Client::new();
    let events = || {
        http.get(format!("{}/api/v1/events", fleet.base()))
            .bearer_auth(&token)
            .send()
    };
    let refused_naming_the_cap = |status: u16, body: &serde_json::Value| {
        status == 429
            && body["error"] == "too_many"
            && body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("gateway.max_streams_per_token = 2")
    };
    let first = events().await?;
    let second = events().await?;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let refused = events().await?;
    let status = refused.status().as_u16();
    let body: serde_json::Value = refused.json().await?;
    assert!(refused_naming_the_cap(status, &body), "{status} {body}");
    // Another token has streams of its own.
    let theirs = http
        .get(format!("{}/api/v1/events", fleet.base()))
        .bearer_auth(fleet.token("other")?)
        .send()
        .await?;
    assert_eq!(theirs.status(), 200);
    // A stream that closes gives its place back.
    drop(first);
    let _again = until("a place for a new feed", LIMIT, || async {
        let response = events().await.ok()?;
        (response.status() == 200).then_some(response)
    })
    .await?;
    // MCP's listening stream takes a place too.
    drop(second);
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let session = until("an MCP session's listening stream", LIMIT, || async {
        let opened = http
            .post(fleet.url())
            .bearer_auth(&token)
            .header("accept", "application/json, text/event-stream")
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}),
            )
            .send()
            .await
            .ok()?;
        let id = opened
            .headers()
            .get("mcp-session-id")?
            .to_str()
            .ok()?
            .to_string();
        let stream = http
            .get(fleet.url())
            .bearer_auth(&token)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &id)
            .header("mcp-protocol-version", "2025-06-18")
            .send()
            .await
            .ok()?;
        (stream.status() == 200).then_some(stream)
    })
    .await?;
    let refused = events().await?;
    let status = refused.status().as_u16();
    let body: serde_json::Value = refused.json().await?;
    assert!(refused_naming_the_cap(status, &body), "{status} {body}");
    drop(session);
    // Calls are no streams: they go on throughout.
    assert_eq!(lead.names().await?, vec!["lead", "other"]);
    Ok(())
}
