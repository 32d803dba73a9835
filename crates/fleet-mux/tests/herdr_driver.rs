//! The herdr driver against small socket servers written here that behave the way herdr 0.8.0
//! was recorded to (one answer per connection, error shapes, an event stream, a stall, lines it
//! cannot read): stand-ins for the protocol's edges, not herdr.

// A test may unwrap: a panic is how it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
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
async fn an_old_herdr_is_refused_naming_the_release_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let socket = serve(&dir, |request| {
        (false, json!({"id": request["id"], "result": {"type": "pong", "version": "0.6.9", "protocol": 13}}).to_string())
    });
    let err = Driver::new(socket).check().await.unwrap_err();
    assert!(err.to_string().contains("protocol 13"), "{err}");
    assert!(err.to_string().contains("needs protocol 14"), "{err}");
    assert!(err.to_string().contains("install herdr 0.7.0"), "{err}");
}

/// Answers as a herdr of `protocol` that knows every method but `missing`: probes get "not
/// found", a subscription starts.
fn herdr_without(missing: &'static str, protocol: u64) -> impl Fn(&Value) -> (bool, String) {
    move |request| {
        let id = request["id"].clone();
        let method = request["method"].as_str().unwrap_or_default();
        let answer = match method {
            m if m == missing => {
                json!({"id": "", "error": {"code": "invalid_request", "message": format!("invalid request: unknown variant `{m}`")}})
            }
            "ping" => {
                json!({"id": id, "result": {"type": "pong", "version": "0.8.0", "protocol": protocol}})
            }
            "events.subscribe" => json!({"id": id, "result": {"type": "subscription_started"}}),
            "layout.apply" => {
                json!({"id": id, "error": {"code": "workspace_not_found", "message": "workspace fleetd-probe-0 not found"}})
            }
            _ => {
                json!({"id": id, "error": {"code": "pane_not_found", "message": "pane fleetd-probe-0 not found"}})
            }
        };
        (false, answer.to_string())
    }
}

#[tokio::test]
async fn a_herdr_that_understands_every_probe_will_do_whatever_its_protocol_above_the_floor() {
    // The released 0.8.0 answers protocol 19, main after it 20.
    for protocol in [19, 20] {
        let dir = tempfile::tempdir().unwrap();
        let socket = serve(&dir, herdr_without("none", protocol));
        assert_eq!(
            Driver::new(socket).check().await.unwrap(),
            ("0.8.0".to_string(), protocol)
        );
    }
}

#[tokio::test]
async fn a_herdr_lacking_a_method_fleetd_uses_is_refused_naming_it() {
    for (missing, named) in [
        ("layout.apply", "layout.apply"),
        ("pane.report_agent", "pane.report_agent"),
        ("events.subscribe", "events.subscribe"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let socket = serve(&dir, herdr_without(missing, 19));
        let err = Driver::new(socket).check().await.unwrap_err().to_string();
        assert!(err.contains(named), "{missing}: {err}");
        assert!(err.contains("herdr 0.7.0 or a later release"), "{err}");
    }
}

#[tokio::test]
async fn a_request_is_written_before_the_call_first_yields() {
    // herdr serves each connection on a thread that looks for the request line at once and,
    // when it is not there yet, naps 100 ms. So the request must be in the socket by the time
    // the connect can wake herdr's thread: written in the same step, before the call yields.
    // A listener that has not accepted yet holds the connection; the call is polled once.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let driver = Driver::new(socket);
    let mut call = std::pin::pin!(driver.call(codec::ping()));
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(call.as_mut().poll(&mut context).is_pending());
    let (mut stream, _) = listener.accept().unwrap();
    stream.set_nonblocking(true).unwrap();
    let mut line = vec![0u8; 4096];
    let n = std::io::Read::read(&mut stream, &mut line)
        .expect("the request should be waiting in the socket after the first poll");
    let request: Value = serde_json::from_slice(line[..n].trim_ascii_end()).unwrap();
    assert_eq!(request["method"], "ping");
    assert_eq!(line[n - 1], b'\n', "the whole line, newline included");
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

#[tokio::test]
async fn a_read_herdr_sits_on_is_asked_again_and_the_first_answer_counts() {
    // The first connection gets no answer (as when herdr's thread naps); later ones do.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let (seen_tx, mut seen) = mpsc::channel(8);
    tokio::spawn(async move {
        let mut held = Vec::new();
        for n in 0.. {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut read = BufReader::new(read);
            read.read_line(&mut line).await.unwrap();
            let request: Value = serde_json::from_str(&line).unwrap();
            seen_tx.send(request["method"].clone()).await.unwrap();
            if n == 0 {
                held.push((read, write));
                continue;
            }
            let answer = json!({"id": request["id"], "result": {"type": "pane_info", "pane": {"pane_id": "w1:p2"}}});
            let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
        }
    });
    let driver = Driver::new(socket);
    let got = tokio::time::timeout(
        Duration::from_secs(5),
        driver.read(codec::pane_get("w1:p2")),
    )
    .await
    .expect("the read was not asked again")
    .unwrap();
    assert_eq!(got["pane"]["pane_id"], "w1:p2");
    assert_eq!(seen.recv().await.unwrap(), "pane.get");
    assert_eq!(seen.recv().await.unwrap(), "pane.get");
}

#[tokio::test]
async fn a_failed_second_ask_does_not_cost_the_first_answer() {
    // The first connection answers late (after the read was asked again); the second one is
    // dropped unanswered: the late answer still counts.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        let (first, _) = listener.accept().await.unwrap();
        let (read, mut write) = first.into_split();
        let mut line = String::new();
        BufReader::new(read).read_line(&mut line).await.unwrap();
        let request: Value = serde_json::from_str(&line).unwrap();
        let (second, _) = listener.accept().await.unwrap();
        drop(second);
        let answer = json!({"id": request["id"], "result": {"type": "pane_list", "panes": []}});
        let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
    });
    let got = Driver::new(socket).read(codec::pane_list()).await.unwrap();
    assert_eq!(got["panes"], json!([]));
}

#[tokio::test]
async fn a_full_accept_queue_is_waited_out() {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
    // A listener with the smallest queue, filled by one client nobody accepts yet.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
    rustix::net::bind(&fd, &SocketAddrUnix::new(&socket).unwrap()).unwrap();
    rustix::net::listen(&fd, 0).unwrap();
    let listener = std::os::unix::net::UnixListener::from(fd);
    let mut fillers = Vec::new();
    loop {
        let filler = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            rustix::net::SocketFlags::NONBLOCK,
            None,
        )
        .unwrap();
        match rustix::net::connect(&filler, &SocketAddrUnix::new(&socket).unwrap()) {
            Ok(()) => fillers.push(filler),
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(fillers.len() < 64, "the queue never filled");
    }
    // herdr comes back to its queue a little later and answers everyone.
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            std::thread::spawn(move || {
                use std::io::{BufRead, Write};
                let mut line = String::new();
                if std::io::BufReader::new(&stream)
                    .read_line(&mut line)
                    .is_ok()
                    && let Ok(request) = serde_json::from_str::<Value>(&line)
                {
                    let answer = json!({"id": request["id"], "result": {"type": "pong", "version": "0.8.0", "protocol": 19}});
                    let _ = stream.write_all(format!("{answer}\n").as_bytes());
                }
            });
        }
    });
    assert_eq!(
        Driver::new(socket).ping().await.unwrap(),
        ("0.8.0".to_string(), 19)
    );
    drop(fillers);
}
