//! The HTTP listener: takes connections off the gateway's socket and serves each one (HTTP/1.1,
//! hyper) under the gateway's limits, so no client — with a token or without — can starve it:
//! - a new connection must send its first request's head within `gateway.header_timeout_s`;
//! - a connection between requests is closed after `gateway.idle_timeout_s` (which also bounds
//!   a later request's head);
//! - at most `gateway.max_connections` are held (fewer if the open-file limit, raised to its
//!   hard limit at start, leaves less room); over it the oldest connection that has not yet
//!   authenticated makes way (see [`table`]), or, when every one has, the new connection is
//!   answered `503` at once and closed;
//! - an accept that fails for want of descriptors backs off (5 ms doubling to 1 s) instead of
//!   spinning, and says so once per run of failures.
//!
//! What each request may do is the router's to say; this module never reads a request's text.
//! It must never hold a lock across an await, nor let one connection's trouble reach another.

pub mod table;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use table::{Admission, Backoff, ConnId, Table};

/// What the listener holds each connection to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most connections held at once (already fitted to the open-file limit).
    pub max_connections: usize,
    /// How long a new connection may take to send its first request's head.
    pub header_timeout: Duration,
    /// How long a connection may sit between requests.
    pub idle_timeout: Duration,
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
            evicted: read(&self.evicted),
            refused: read(&self.refused),
            accept_errors: read(&self.accept_errors),
        }
    }
}

/// The shared state of one connection, as the requests on it see it (in their extensions):
/// authentication marks it proven, so it is never evicted for a stranger.
#[derive(Clone)]
pub struct Conn(Arc<ConnShared>);

/// The connections held, each with the token that evicts it.
type Conns = Mutex<Table<CancellationToken>>;

struct ConnShared {
    id: ConnId,
    table: Arc<Conns>,
    /// A request on it authenticated (noted in the table once).
    proven: AtomicBool,
    /// A request's head arrived on it: the first-request timer is over.
    started: AtomicBool,
    /// Cancelled when a newer connection takes its place.
    evict: CancellationToken,
}

fn lock(table: &Conns) -> MutexGuard<'_, Table<CancellationToken>> {
    // Counts and sets only: nothing a panic half-way could leave inconsistent.
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Conn {
    /// Notes that a request on this connection authenticated.
    pub fn proven(&self) {
        if !self.0.proven.swap(true, Ordering::Relaxed) {
            lock(&self.0.table).proven(self.0.id);
        }
    }

    fn started(&self) -> bool {
        self.0.started.load(Ordering::Relaxed)
    }

    /// The connection closed: its place is free (it was already, if it was evicted).
    fn closed(&self, stats: &ListenerStats) {
        lock(&self.0.table).closed(self.0.id);
        stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The raised soft open-file limit (`None`: unlimited): fleetd takes all the hard limit allows,
/// so the connection cap, not the kernel, is what a flood meets.
pub fn raise_open_files() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => limit.current = limit.maximum,
            Err(e) => {
                tracing::warn!(error = %e, "cannot raise the open-file limit to its hard limit")
            }
        }
    }
    limit.current
}

/// Serves `router` on `listener` until `shutdown`; then takes no more connections, lets each
/// open one finish what it is doing (the router's own streams end with `shutdown`) and returns
/// once all are closed.
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
        .keep_alive(true);
    let http = Arc::new(http);
    let refusal = Arc::new(refusal(limits.max_connections));
    let refusing = Arc::new(tokio::sync::Semaphore::new(MAX_REFUSING));
    let tasks = TaskTracker::new();
    let mut backoff = Backoff::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if transient(&e) => continue,
            Err(e) => {
                ListenerStats::count(&stats.accept_errors);
                let first = !backoff.failing();
                let wait = backoff.failed();
                if first {
                    tracing::warn!(error = %e, "cannot accept connections; backing off until it can");
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = shutdown.cancelled() => break,
                }
                continue;
            }
        };
        let failed = backoff.succeeded();
        if failed > 0 {
            tracing::info!(failed, "accepting connections again");
        }
        // Replies go out without waiting on Nagle: a client that keeps its connection alive
        // would otherwise see a response's second segment held for the delayed ACK of its
        // first (~40 ms).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
        let evict = CancellationToken::new();
        let admission = lock(&table).admit(evict.clone());
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
        let conn = Conn(Arc::new(ConnShared {
            id,
            table: Arc::clone(&table),
            proven: AtomicBool::new(false),
            started: AtomicBool::new(false),
            evict,
        }));
        ListenerStats::count(&stats.accepted);
        stats.open.fetch_add(1, Ordering::Relaxed);
        let connection = Connection {
            conn,
            router: router.clone(),
            http: Arc::clone(&http),
            header_timeout: limits.header_timeout,
            stats: Arc::clone(&stats),
            shutdown: shutdown.clone(),
        };
        tasks.spawn(connection.run(stream));
    }
    // No more connections: the socket's backlog waits for the next start (or is refused).
    drop(listener);
    tasks.close();
    tasks.wait().await;
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

/// One connection being served.
struct Connection {
    conn: Conn,
    router: Router,
    http: Arc<http1::Builder>,
    header_timeout: Duration,
    stats: Arc<ListenerStats>,
    shutdown: CancellationToken,
}

impl Connection {
    async fn run(self, stream: TcpStream) {
        let deadline = tokio::time::Instant::now() + self.header_timeout;
        // Until the client sends something, the connection is only its socket and this small
        // wait: hyper, its buffers and its state come with the first bytes, so a flood of
        // silent connections costs little.
        let mut first_byte = [0u8; 1];
        tokio::select! {
            // A peek, not `readable()`, which may answer at once for a socket that has nothing.
            sent = stream.peek(&mut first_byte) => {
                if !matches!(sent, Ok(1)) {
                    return self.conn.closed(&self.stats);
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                ListenerStats::count(&self.stats.header_timeouts);
                return self.conn.closed(&self.stats);
            }
            () = self.conn.0.evict.cancelled() => return self.conn.closed(&self.stats),
            () = self.shutdown.cancelled() => return self.conn.closed(&self.stats),
        }
        Box::pin(self.serve(stream, deadline)).await;
    }

    /// Serves the connection's requests, its first head due by `deadline`.
    async fn serve(self, stream: TcpStream, deadline: tokio::time::Instant) {
        let Connection {
            conn,
            router,
            http,
            header_timeout: _,
            stats,
            shutdown,
        } = self;
        let first = tokio::time::sleep_until(deadline);
        tokio::pin!(first);
        let on_request = conn.clone();
        let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
            on_request.0.started.store(true, Ordering::Relaxed);
            req.extensions_mut().insert(on_request.clone());
            router.clone().oneshot(req.map(axum::body::Body::new))
        });
        let serving = http.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(serving);
        let mut draining = false;
        loop {
            tokio::select! {
                done = serving.as_mut() => {
                    if let Err(e) = done {
                        if e.is_timeout() {
                            // hyper's timer: before any request, it was the first head's.
                            ListenerStats::count(if conn.started() {
                                &stats.idle_timeouts
                            } else {
                                &stats.header_timeouts
                            });
                        } else {
                            tracing::debug!(error = %e, "a connection ended in error");
                        }
                    }
                    break;
                }
                () = conn.0.evict.cancelled() => break,
                () = &mut first, if !conn.started() => {
                    if !conn.started() {
                        ListenerStats::count(&stats.header_timeouts);
                        break;
                    }
                }
                () = shutdown.cancelled(), if !draining => {
                    draining = true;
                    serving.as_mut().graceful_shutdown();
                }
            }
        }
        conn.closed(&stats);
    }
}
