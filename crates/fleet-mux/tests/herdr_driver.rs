//! The herdr driver against small socket servers written here that behave the way herdr 0.8.0
//! was recorded to (one answer per connection, error shapes, an event stream, a stall, lines it
//! cannot read): stand-ins for the protocol's edges, not herdr.

use std::path::PathBuf;
use std::time::Duration;

use fleet_mux::herdr::codec::{self, Event};
use fleet_mux::herdr::driver::Driver;
use fleet_mux::{MuxError, PaneId};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::mpsc;

/// Serves one `answer(request)` per connection, then closes it, as herdr does; when the answer
/// says so, it comes ~100 ms late (herdr's stall).
fn serve<F>(dir: &tempfile::TempDir, answer: F) -> PathBuf
where
    F: Fn(&Value) -> (bool, String) + Send + 'static,
{
    let socket = dir.path().join("herdr.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            BufReader::new(read).read_line(&mut line).await.unwrap();
            let request: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let (stall, reply) = answer(&request);
            if stall {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = write.write_all(format!("{reply}\n").as_bytes()).await;
        }
    });
    socket
}

#[tokio::test]
async fn one_request_per_connection_with_stalls_and_error_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = serve(&dir, |request| {
        let id = request["id"].clone();
        match request["method"].as_str() {
            Some("ping") => (true, json!({"id": id, "result": {"type": "pong", "version": "0.8.0", "protocol": 20}}).to_string()),
            Some("pane.close") => (false, json!({"id": id, "error": {"code": "pane_not_found", "message": "pane w1:p9 not found"}}).to_string()),
            Some("pane.report_agent") => (false, json!({"id": "", "error": {"code": "invalid_request", "message": "invalid request: unknown variant `done`"}}).to_string()),
            _ => (false, json!({"id": "someone-else", "result": {"type": "ok"}}).to_string()),
        }
    });
    let driver = Driver::new(socket);
    // Twice: each request on its own connection, each answered after a stall.
    for _ in 0..2 {
        assert_eq!(driver.ping().await.unwrap(), ("0.8.0".to_string(), 20));
    }
    assert!(matches!(
        driver.call(codec::pane_close("w1:p9")).await,
        Err(MuxError::NoPane(PaneId(p))) if p == "w1:p9"
    ));
    let refused = driver
        .call(codec::report_agent(
            "w1:p1",
            "fleetd",
            "fleetd",
            fleet_mux::AgentState::Idle,
        ))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("invalid_request"), "{refused}");
    let crossed = driver.call(codec::pane_list()).await.unwrap_err();
    assert!(crossed.to_string().contains("someone-else"), "{crossed}");
}

#[tokio::test]
async fn an_old_herdr_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let socket = serve(&dir, |request| {
        (false, json!({"id": request["id"], "result": {"type": "pong", "version": "0.5.1", "protocol": 11}}).to_string())
    });
    let err = Driver::new(socket).ping().await.unwrap_err();
    assert!(err.to_string().contains("protocol 11"), "{err}");
    assert!(err.to_string().contains("needs protocol 20"), "{err}");
}

#[tokio::test]
async fn a_missing_herdr_is_unreachable_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody.sock");
    let err = Driver::new(socket.clone()).ping().await.unwrap_err();
    assert!(matches!(err, MuxError::Unreachable(_)), "{err:?}");
    assert!(err.to_string().contains(&socket.display().to_string()));
}

#[tokio::test]
async fn the_event_stream_skips_bad_lines_and_resubscribes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        // Two subscriptions: the first streams a bad line and an exit, then drops; the second
        // streams another exit.
        for pane in ["w1:p4", "w1:p5"] {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            BufReader::new(read).read_line(&mut line).await.unwrap();
            let request: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(request["method"], "events.subscribe");
            let started = json!({"id": request["id"], "result": {"type": "subscription_started"}});
            let exited = json!({"event": "pane_exited", "data": {"type": "pane_exited", "pane_id": pane, "workspace_id": "w1"}});
            let stream = format!("{started}\nthis is not json\n{{\"event\": 7}}\n{exited}\n");
            write.write_all(stream.as_bytes()).await.unwrap();
        }
    });
    let (tx, mut rx) = mpsc::channel(16);
    let driver = Driver::new(socket);
    let follower = tokio::spawn(async move { driver.follow(tx).await });
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(rx.recv().await.unwrap());
    }
    assert_eq!(
        seen,
        vec![
            Event::Started,
            Event::PaneExited("w1:p4".into()),
            Event::Started,
            Event::PaneExited("w1:p5".into()),
        ]
    );
    drop(rx);
    follower.await.unwrap();
}
