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
    // A lead waits in a long call all through the flood.
    let lead = std::sync::Arc::new(fleet.lead("lead", Protocol::Stateless).await?);
    let waiting = {
        let lead = std::sync::Arc::clone(&lead);
        tokio::spawn(async move {
            lead.ok("fleet_poll", serde_json::json!({"wait_s": 8}))
                .await
        })
    };
    until("the lead's poll to be open", LIMIT, || async {
        let me = fleet
            .lead("lead", Protocol::Stateless)
            .await
            .ok()?
            .entry("lead")
            .await
            .ok()?;
        (me["open_calls"] == 1).then_some(())
    })
    .await?;
    // 60 strangers that send nothing: the oldest make way at once for the newest.
    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..60 {
        silent.push(TcpStream::connect(&host).await?);
    }
    // The cap holds: a lead's new connection, and a monitor's probe, still get in.
    let other = fleet.lead("lead", Protocol::Stateless).await?;
    assert_eq!(other.names().await?, vec!["lead"]);
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
    // Every silent one is closed (each read waits at most LIMIT).
    for stream in &mut silent {
        closed_by_server(stream, opened).await?;
    }
    let dripped = tokio::time::timeout(LIMIT, dripping).await???;
    assert!(
        dripped >= Duration::from_millis(2900),
        "a dripping head was closed after {dripped:?}, before the 3 s header timeout"
    );
    // A lead's connection kept alive after a request is closed once idle for idle_timeout_s.
    let token = fleet.token("lead")?;
    let mut kept = TcpStream::connect(addr(&fleet)).await?;
    let (status, _) = get(&mut kept, &addr(&fleet), "/api/v1/hosts", Some(&token)).await?;
    assert!(status.contains("200"), "{status}");
    let (idle, _) = closed_by_server(&mut kept, Instant::now()).await?;
    assert!(
        idle >= Duration::from_millis(2900),
        "an idle connection was closed after {idle:?}, before the 3 s idle timeout"
    );
    // The lead's call in flight was never cut for a stranger: it ends as it would have.
    let polled = waiting.await??;
    assert_eq!(polled["messages"], serde_json::json!([]), "{polled}");
    // fleetd counted each: at least 20 strangers evicted (the leads' and the probe's
    // connections came in at the cap too), the rest of the 60 and the drip timed out before
    // their first head, the kept one idle, none refused.
    let mut closed = std::collections::HashMap::new();
    for why in [
        "evicted",
        "header_timeout",
        "unauthenticated_timeout",
        "idle_timeout",
        "refused",
    ] {
        let sample = format!("fleetd_connections_closed_total{{why=\"{why}\"}}");
        let count = fleet.metric("lead", &sample).await;
        closed.insert(why, count.ok_or_else(|| anyhow::anyhow!("no {sample}"))?);
    }
    let closed = |why: &str| closed[why];
    let (evicted, header, idle) = (
        closed("evicted"),
        closed("header_timeout") + closed("unauthenticated_timeout"),
        closed("idle_timeout"),
    );
    assert!(
        evicted >= 20.0
            && header >= 1.0
            && evicted + header >= 61.0
            && idle >= 1.0
            && closed("refused") == 0.0,
        "evicted {evicted}, before the first head {header}, idle {idle}"
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

/// Reads `response`'s stream until it ends (`Some`), or `None` if it is still open after `wait`.
async fn ends_within(response: reqwest::Response, wait: Duration) -> Option<()> {
    let mut response = response;
    tokio::time::timeout(wait, async {
        while let Ok(Some(_)) = response.chunk().await {}
    })
    .await
    .ok()
}

/// A token holds at most its cap of event streams: one more ends its oldest (which may well be
/// a stream whose client is gone), so a client that comes back is never locked out; MCP's
/// listening stream counts too; another token's streams are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_event_streams_ends_its_oldest() -> anyhow::Result<()> {
    let fleet = Fleet::start("max_streams_per_token = 2", "[leads.lead]\n[leads.other]\n").await?;
    let token = fleet.token("lead")?;
    let http = reqwest::Client::new();
    let events = || {
        http.get(format!("{}/api/v1/events", fleet.base()))
            .bearer_auth(&token)
            .send()
    };
    let first = events().await?;
    let second = events().await?;
    let theirs = http
        .get(format!("{}/api/v1/events", fleet.base()))
        .bearer_auth(fleet.token("other")?)
        .send()
        .await?;
    for stream in [&first, &second, &theirs] {
        assert_eq!(stream.status().as_u16(), 200);
    }
    // A third: served, and the first ends.
    let third = events().await?;
    assert_eq!(third.status().as_u16(), 200);
    assert!(
        ends_within(first, LIMIT).await.is_some(),
        "the oldest stream stayed open"
    );
    // MCP's listening stream takes a place too: the second ends for it.
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
        .await?;
    let id = opened
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| anyhow::anyhow!("no session"))?
        .to_string();
    let listening = http
        .get(fleet.url())
        .bearer_auth(&token)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await?;
    assert_eq!(listening.status().as_u16(), 200);
    assert!(
        ends_within(second, LIMIT).await.is_some(),
        "the second stream stayed open"
    );
    // The other token's stream, and the newest two, go on.
    for stream in [theirs, third, listening] {
        assert!(
            ends_within(stream, Duration::from_millis(300))
                .await
                .is_none()
        );
    }
    Ok(())
}

/// A stranger cannot pin memory or hold a connection with a request it never finishes: a head
/// over 16 KiB is refused at once, a sign-in bigger than a token at once, one whose body drips
/// is closed when its lifetime (idle_timeout_s) is over — and at shutdown a stranger's unfinished
/// request holds nothing up: fleetd stops at once, cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_unfinished_request_pins_nothing_and_holds_no_shutdown() -> anyhow::Result<()> {
    let mut fleet = Fleet::start("header_timeout_s = 3\nidle_timeout_s = 3", "").await?;
    let host = addr(&fleet);
    // A head that never ends, past 16 KiB.
    let mut big = TcpStream::connect(&host).await?;
    big.write_all(format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\nx-pad: ").as_bytes())
        .await?;
    let pad = vec![b'a'; 20 * 1024];
    let _ = big.write_all(&pad).await;
    let (_, answer) = closed_by_server(&mut big, Instant::now()).await?;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // A sign-in far bigger than a token.
    let mut huge = TcpStream::connect(&host).await?;
    huge.write_all(
        format!("POST /ui/session HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: 10000\r\n\r\n").as_bytes(),
    )
    .await?;
    let _ = huge.write_all(&[b' '; 10_000]).await;
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(LIMIT, huge.read(&mut answer)).await??;
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A sign-in whose body drips, a chunk at a time: closed at the end of its lifetime.
    let mut drip = TcpStream::connect(&host).await?;
    let opened = Instant::now();
    drip.write_all(
        format!("POST /ui/session HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n").as_bytes(),
    )
    .await?;
    let dripping = tokio::spawn(async move {
        loop {
            if drip.write_all(b"1\r\n \r\n").await.is_err() {
                return opened.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut peek = [0u8; 1];
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_millis(1), drip.read(&mut peek)).await
            {
                return opened.elapsed();
            }
        }
    });
    let lasted = tokio::time::timeout(LIMIT, dripping).await??;
    assert!(lasted >= Duration::from_millis(2900), "{lasted:?}");
    let expired = fleet
        .metric(
            "lead",
            "fleetd_connections_closed_total{why=\"unauthenticated_timeout\"}",
        )
        .await
        .unwrap_or_default();
    assert!(expired >= 1.0, "{expired}");
    // Another such request open at shutdown: fleetd stops at once, and cleanly.
    let mut held = TcpStream::connect(&host).await?;
    held.write_all(
        format!("POST /ui/session HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{").as_bytes(),
    )
    .await?;
    let asked = Instant::now();
    let status = fleet.stop_by("TERM").await?;
    assert!(status.success(), "{status}\n{}", fleet.log());
    assert!(
        asked.elapsed() < Duration::from_secs(8),
        "{:?}",
        asked.elapsed()
    );
    assert!(fleet.log().contains("fleetd stopped"), "{}", fleet.log());
    Ok(())
}
