//! The HTTP listener: takes connections off the gateway's socket and serves each one (HTTP/1.1,
//! hyper) under the gateway's limits, so no client — with a token or without — can starve it:
//! - a new connection must send its first request's head within `gateway.header_timeout_s`;
//!   until its first byte it is only its socket (a flood of silent connections costs little);
//! - a connection between requests is closed after `gateway.idle_timeout_s` (which also bounds
//!   a later request's head), and one that has not authenticated lives no longer than that in
//!   all (so a stranger cannot hold one open with a request it never finishes);
//! - a request's head, buffered, is at most [`connection::MAX_BUF`];
//! - at most `gateway.max_connections` are held (fewer if the open-file limit, raised as far as
//!   they need at start, leaves less room); over it the oldest connection that has not yet
//!   authenticated makes way (see [`table`]), or, when every one has, the new connection is
//!   answered `503` at once and closed;
//! - TCP keep-alive finds a peer that vanished (a laptop that slept), so its streams end;
//! - an accept that fails for want of descriptors backs off (5 ms doubling to 1 s) instead of
//!   spinning, and says so once per run of failures;
//! - at shutdown, strangers are closed at once and the rest are given [`Limits::drain`] to end
//!   what they are doing, then closed, so the gateway's own drain always has its time.
//!
//! What each request may do is the router's to say; this module never reads a request's text.
//! It must never hold a lock across an await, nor let one connection's trouble reach another.

mod connection;
pub mod table;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use connection::Conn;
use connection::{Connection, Stop};
use table::{Admission, Backoff, Table};

/// What the listener holds each connection to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most connections held at once (already fitted to the open-file limit).
    pub max_connections: usize,
    /// How long a new connection may take to send its first request's head.
    pub header_timeout: Duration,
    /// How long a connection may sit between requests, and a stranger live in all.
    pub idle_timeout: Duration,
    /// How long, after shutdown, connections may take to end what they are doing before they
    /// are closed.
    pub drain: Duration,
}

/// How many refusals (a `503` written, then the connection read to its end so the client sees
/// the answer rather than a reset) may be under way at once; past it, an over-the-cap
/// connection is closed without one.
const MAX_REFUSING: usize = 64;

/// How long a refused connection is read after its `503`, at most.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// What the listener has done, for `/metrics`.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Connections held now.
    pub open: AtomicU64,
    /// Connections taken in, ever.
    pub accepted: AtomicU64,
    /// Connections closed because their first request's head did not come in time.
    pub header_timeouts: AtomicU64,
    /// Connections closed by hyper's own timer: idle between requests, or a later head too slow.
    pub idle_timeouts: AtomicU64,
    /// Connections closed because they had not authenticated within their lifetime.
    pub stranger_timeouts: AtomicU64,
    /// Strangers closed to make room for a newer connection.
    pub evicted: AtomicU64,
    /// Connections refused `503`: every one held had authenticated.
    pub refused: AtomicU64,
    /// Accepts that failed (out of descriptors, say).
    pub accept_errors: AtomicU64,
}

impl ListenerStats {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures now, for `/metrics`.
    pub fn figures(&self) -> crate::metrics::ConnectionFigures {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        crate::metrics::ConnectionFigures {
            open: read(&self.open),
            accepted: read(&self.accepted),
            header_timeouts: read(&self.header_timeouts),
            idle_timeouts: read(&self.idle_timeouts),
            stranger_timeouts: read(&self.stranger_timeouts),
            evicted: read(&self.evicted),
            refused: read(&self.refused),
            accept_errors: read(&self.accept_errors),
        }
    }
}

/// Raises the soft open-file limit as far as `wanted` descriptors, at most to the hard limit,
/// so the connection cap, not the kernel, is what a flood meets; returns the limit now
/// (`None`: unlimited). No further: the tmux server and the agents fleetd starts inherit it, and
/// a program that loops over every possible descriptor, or still uses `select()`, is better off
/// with a modest one.
pub fn raise_open_files(wanted: u64) -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = match (limit.current, limit.maximum) {
        (Some(current), maximum) if current < wanted => {
            maximum.map_or(wanted, |maximum| wanted.min(maximum))
        }
        _ => return limit.current,
    };
    let raise = Rlimit {
        current: Some(raised),
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raise) {
        Ok(()) => Some(raised),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            limit.current
        }
    }
}

/// Serves `router` on `listener` until `shutdown`; then takes no more connections, closes the
/// strangers, lets the others end what they are doing (the router's own streams end with
/// `shutdown`) for [`Limits::drain`] at most, closes what is left, and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stats: Arc<ListenerStats>,
    shutdown: CancellationToken,
) {
    let table = Arc::new(Mutex::new(Table::new(limits.max_connections)));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(connection::MAX_BUF)
        .keep_alive(true);
    let http = Arc::new(http);
    let refusal = Arc::new(refusal(limits.max_connections));
    let refusing = Arc::new(tokio::sync::Semaphore::new(MAX_REFUSING));
    let stop = Stop {
        shutdown: shutdown.clone(),
        force: CancellationToken::new(),
    };
    let tasks = TaskTracker::new();
    let mut backoff = Backoff::default();
    while let Some(stream) = accept(&listener, &mut backoff, &stats, &shutdown).await {
        let evict = CancellationToken::new();
        let admission = connection::lock(&table).admit(evict.clone());
        let id = match admission {
            Admission::Refuse => {
                ListenerStats::count(&stats.refused);
                if let Ok(permit) = Arc::clone(&refusing).try_acquire_owned() {
                    let refusal = Arc::clone(&refusal);
                    tasks.spawn(async move {
                        refuse(stream, &refusal).await;
                        drop(permit);
                    });
                }
                continue;
            }
            Admission::Serve(id) => id,
            Admission::ServeEvicting { id, evicted } => {
                ListenerStats::count(&stats.evicted);
                evicted.cancel();
                id
            }
        };
        ListenerStats::count(&stats.accepted);
        stats.open.fetch_add(1, Ordering::Relaxed);
        let connection = Connection {
            conn: Conn::new(id, Arc::clone(&table), evict),
            router: router.clone(),
            http: Arc::clone(&http),
            limits,
            stats: Arc::clone(&stats),
            stop: stop.clone(),
        };
        tasks.spawn(connection.run(stream));
    }
    // No more connections: the socket's backlog waits for the next start (or is refused).
    drop(listener);
    drain(&tasks, limits.drain, &stop).await;
}

/// The next connection `listener` takes; `None` at shutdown. An accept error that is not one
/// connection's (out of descriptors) is counted and backed off from, and said once.
async fn accept(
    listener: &TcpListener,
    backoff: &mut Backoff,
    stats: &ListenerStats,
    shutdown: &CancellationToken,
) -> Option<TcpStream> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return None,
        };
        match accepted {
            Ok((stream, _)) => {
                let failed = backoff.succeeded();
                if failed > 0 {
                    tracing::info!(failed, "accepting connections again");
                }
                return Some(stream);
            }
            Err(e) if transient(&e) => {}
            Err(e) => {
                ListenerStats::count(&stats.accept_errors);
                let first = !backoff.failing();
                let wait = backoff.failed();
                if first {
                    tracing::warn!(error = %e, "cannot accept connections; backing off until it can");
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = shutdown.cancelled() => return None,
                }
            }
        }
    }
}

/// Lets the connections of `tasks` end what they are doing, for `drain` at most; then closes
/// what is left.
async fn drain(tasks: &TaskTracker, drain: Duration, stop: &Stop) {
    tasks.close();
    if tokio::time::timeout(drain, tasks.wait()).await.is_err() {
        tracing::warn!(
            drain_s = drain.as_secs(),
            "connections still busy at the end of their share of the drain: closed"
        );
        stop.force.cancel();
        tasks.wait().await;
    }
}

/// An accept error that concerns one connection only (it went away before it was taken).
fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::Interrupted
    )
}

/// The whole answer to a connection over the cap.
fn refusal(cap: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "error": "too_many",
        "message": format!(
            "fleetd holds as many connections as it may (gateway.max_connections = {cap}), every one of them authenticated: try again shortly, or raise the cap"
        ),
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers `503` and closes: the answer is written, the sending side shut, and what the
/// client sent read and dropped (briefly), so it reads the answer rather than a reset.
async fn refuse(mut stream: TcpStream, refusal: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answered = async {
        stream.write_all(refusal).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, answered).await;
}
