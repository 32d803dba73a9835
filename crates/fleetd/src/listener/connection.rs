//! One connection's life: wait for its first byte, serve its requests with hyper under the
//! listener's timeouts, and give its place back however it ends (a panic in a handler too).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::table::{ConnId, Table};
use super::{Limits, ListenerStats};

/// The most a connection's read buffer holds: a request's head must fit (fleetd's clients send
/// a few hundred bytes of headers), so a stranger's unfinished head pins no more than this.
pub const MAX_BUF: usize = 16 * 1024;

/// TCP keep-alive: a connection silent this long is probed...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// ...this often...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ...this many times before the kernel gives it up: a peer that vanished (a laptop that slept,
/// a network that dropped) is found within about a minute, and its streams end.
const KEEPALIVE_PROBES: u32 = 3;
/// How long data may go unacknowledged before the kernel gives the connection up, in ms: a
/// stream writing into a peer that is gone ends within a minute rather than fifteen.
const UNACKED_MS: u32 = 60_000;

/// The connections held, each with the token that evicts it.
pub type Conns = Mutex<Table<CancellationToken>>;

/// The table's lock.
pub fn lock(table: &Conns) -> MutexGuard<'_, Table<CancellationToken>> {
    // Counts and sets only: nothing a panic half-way could leave inconsistent.
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What ends connections at shutdown.
#[derive(Clone)]
pub struct Stop {
    /// The gateway stops: strangers close, the others end what they do.
    pub shutdown: CancellationToken,
    /// Their share of the drain is over: every connection closes.
    pub force: CancellationToken,
}

/// The shared state of one connection, as the requests on it see it (in their extensions):
/// authentication marks it proven, so it is never evicted for a stranger.
#[derive(Clone)]
pub struct Conn(Arc<ConnShared>);

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

impl Conn {
    /// Connection `id` of `table`, closed when `evict` is cancelled.
    pub fn new(id: ConnId, table: Arc<Conns>, evict: CancellationToken) -> Self {
        Self(Arc::new(ConnShared {
            id,
            table,
            proven: AtomicBool::new(false),
            started: AtomicBool::new(false),
            evict,
        }))
    }

    /// Notes that a request on this connection authenticated.
    pub fn proven(&self) {
        if !self.0.proven.swap(true, Ordering::Relaxed) {
            lock(&self.0.table).proven(self.0.id);
        }
    }

    fn is_proven(&self) -> bool {
        self.0.proven.load(Ordering::Relaxed)
    }

    fn started(&self) -> bool {
        self.0.started.load(Ordering::Relaxed)
    }
}

/// Gives a connection's place back when its task ends, however it ends.
struct Closing {
    conn: Conn,
    stats: Arc<ListenerStats>,
}

impl Drop for Closing {
    fn drop(&mut self) {
        // Gone from the table already if it was evicted.
        lock(&self.conn.0.table).closed(self.conn.0.id);
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection to serve.
pub struct Connection {
    /// Its shared state.
    pub conn: Conn,
    /// What serves its requests.
    pub router: Router,
    /// How hyper serves it.
    pub http: Arc<http1::Builder>,
    /// Its timeouts.
    pub limits: Limits,
    /// Where what happens to it is counted.
    pub stats: Arc<ListenerStats>,
    /// What ends it at shutdown.
    pub stop: Stop,
}

/// Keeps a vanished peer from holding a connection for long (see [`KEEPALIVE_IDLE`]); and
/// replies go out without waiting on Nagle (a client that keeps its connection alive would
/// otherwise see a response's second segment held for the delayed ACK of its first, ~40 ms).
fn tune(stream: &TcpStream) {
    use rustix::net::sockopt;
    let tuned = (|| {
        sockopt::set_tcp_nodelay(stream, true)?;
        sockopt::set_socket_keepalive(stream, true)?;
        sockopt::set_tcp_keepidle(stream, KEEPALIVE_IDLE)?;
        sockopt::set_tcp_keepintvl(stream, KEEPALIVE_INTERVAL)?;
        sockopt::set_tcp_keepcnt(stream, KEEPALIVE_PROBES)?;
        sockopt::set_tcp_user_timeout(stream, UNACKED_MS)
    })();
    if let Err(e) = tuned {
        tracing::debug!(error = %e, "cannot tune a connection's socket");
    }
}

impl Connection {
    /// Serves the connection until it ends.
    pub async fn run(self, stream: TcpStream) {
        let _closing = Closing {
            conn: self.conn.clone(),
            stats: Arc::clone(&self.stats),
        };
        tune(&stream);
        let opened = Instant::now();
        let first_head = opened + self.limits.header_timeout;
        // Until the client sends something, the connection is only its socket and this small
        // wait: hyper, its buffers and its state come with the first bytes, so a flood of
        // silent connections costs little. A peek, not `readable()`, which may answer at once
        // for a socket that has nothing.
        let mut first_byte = [0u8; 1];
        tokio::select! {
            sent = stream.peek(&mut first_byte) => {
                if !matches!(sent, Ok(1)) {
                    return;
                }
            }
            () = tokio::time::sleep_until(first_head) => {
                ListenerStats::count(&self.stats.header_timeouts);
                return;
            }
            () = self.conn.0.evict.cancelled() => return,
            () = self.stop.shutdown.cancelled() => return,
        }
        Box::pin(self.serve(stream, opened)).await;
    }

    /// Serves the connection's requests; it was opened at `opened`.
    async fn serve(self, stream: TcpStream, opened: Instant) {
        let Connection {
            conn,
            router,
            http,
            limits,
            stats,
            stop,
        } = self;
        let on_request = conn.clone();
        let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
            on_request.0.started.store(true, Ordering::Relaxed);
            req.extensions_mut().insert(on_request.clone());
            router.clone().oneshot(req.map(axum::body::Body::new))
        });
        let serving = http.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(serving);
        let first_head = tokio::time::sleep_until(opened + limits.header_timeout);
        tokio::pin!(first_head);
        let lifetime = tokio::time::sleep_until(opened + limits.idle_timeout);
        tokio::pin!(lifetime);
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
                    return;
                }
                () = conn.0.evict.cancelled() => return,
                () = stop.force.cancelled() => return,
                () = &mut first_head, if !conn.started() => {
                    if !conn.started() {
                        ListenerStats::count(&stats.header_timeouts);
                        return;
                    }
                }
                () = &mut lifetime, if !conn.is_proven() => {
                    if !conn.is_proven() {
                        ListenerStats::count(&stats.stranger_timeouts);
                        return;
                    }
                }
                () = stop.shutdown.cancelled(), if !draining => {
                    // A stranger's request is nothing to wait for; a lead's or a worker's is.
                    if !conn.is_proven() {
                        return;
                    }
                    draining = true;
                    serving.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
