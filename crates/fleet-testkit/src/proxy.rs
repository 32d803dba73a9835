//! A loopback TCP proxy in front of a gateway whose connections a test can cut all at once, and
//! hold back, as a network that drops (a laptop's Wi-Fi, a NAT that forgets) would: the client
//! sees its connections end, and its next ones go through once the network is back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What the proxy's tasks share with it.
struct Shared {
    /// Cancelled to cut the connections carried now; replaced by a fresh one after each cut.
    cut: std::sync::Mutex<CancellationToken>,
    /// Connections carried now.
    live: AtomicUsize,
    /// Whether new connections go through now; while not, they wait (a network still down).
    passing: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn current(&self) -> CancellationToken {
        self.cut
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// A running proxy; dropped, it stops and cuts what it carries.
pub struct CutProxy {
    /// Where clients connect.
    addr: SocketAddr,
    /// Shared with its tasks.
    shared: Arc<Shared>,
    /// Cancelled when the proxy is dropped.
    stop: CancellationToken,
}

impl CutProxy {
    /// A proxy on a loopback port of its own, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let proxy = Self {
            addr: listener.local_addr()?,
            shared: Arc::new(Shared {
                cut: std::sync::Mutex::new(CancellationToken::new()),
                live: AtomicUsize::new(0),
                passing: tokio::sync::watch::channel(true).0,
            }),
            stop: CancellationToken::new(),
        };
        let (shared, stop) = (Arc::clone(&proxy.shared), proxy.stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = stop.cancelled() => return,
                };
                let Ok((mut client, _)) = accepted else {
                    continue;
                };
                let cut = shared.current();
                let shared = Arc::clone(&shared);
                let mut passing = shared.passing.subscribe();
                let stop = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        through = passing.wait_for(|passing| *passing) => {
                            if through.is_err() {
                                return;
                            }
                        }
                        () = stop.cancelled() => return,
                    }
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    shared.live.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        () = cut.cancelled() => {}
                    }
                    shared.live.fetch_sub(1, Ordering::Relaxed);
                });
            }
        });
        Ok(proxy)
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts every connection carried now (both ends see them close); later ones go through.
    /// Returns how many it was carrying.
    pub fn cut(&self) -> usize {
        let carried = self.shared.live.load(Ordering::Relaxed);
        let mut cut = self
            .shared
            .cut
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cut.cancel();
        *cut = CancellationToken::new();
        carried
    }

    /// Holds new connections back (`false`: they wait, unanswered) or lets them through.
    pub fn pass(&self, passing: bool) {
        self.shared.passing.send_replace(passing);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.shared.current().cancel();
    }
}
