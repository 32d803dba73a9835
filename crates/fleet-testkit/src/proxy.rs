//! A loopback TCP proxy in front of a gateway whose connections a test can cut all at once, as
//! a network that drops (a laptop's Wi-Fi, a NAT that forgets) would: the client sees its
//! connections end, and its next ones go through again.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A running proxy; dropped, it stops and cuts what it carries.
pub struct CutProxy {
    /// Where clients connect.
    addr: SocketAddr,
    /// Cancelled to cut the connections carried now; replaced by a fresh one after each cut.
    cut: std::sync::Mutex<CancellationToken>,
    /// Cancelled when the proxy is dropped.
    stop: CancellationToken,
    /// Connections carried now.
    live: std::sync::atomic::AtomicUsize,
    /// Whether new connections go through now; while not, they wait (a network still down).
    passing: tokio::sync::watch::Sender<bool>,
}

impl CutProxy {
    /// A proxy on a loopback port of its own, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<std::sync::Arc<Self>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let proxy = std::sync::Arc::new(Self {
            addr: listener.local_addr()?,
            cut: std::sync::Mutex::new(CancellationToken::new()),
            stop: CancellationToken::new(),
            live: std::sync::atomic::AtomicUsize::new(0),
            passing: tokio::sync::watch::channel(true).0,
        });
        let carrying = std::sync::Arc::clone(&proxy);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = carrying.stop.cancelled() => return,
                };
                let Ok((client, _)) = accepted else { continue };
                let cut = carrying.current();
                let counting = std::sync::Arc::clone(&carrying);
                let mut passing = carrying.passing.subscribe();
                tokio::spawn(async move {
                    if passing.wait_for(|passing| *passing).await.is_err() {
                        return;
                    }
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let mut client = client;
                    counting.live.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        () = cut.cancelled() => {}
                    }
                    counting.live.fetch_sub(1, Ordering::Relaxed);
                });
            }
        });
        Ok(proxy)
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn current(&self) -> CancellationToken {
        self.cut
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Cuts every connection carried now (both ends see them close); later ones go through.
    /// Returns how many it was carrying.
    pub fn cut(&self) -> usize {
        let carried = self.live.load(Ordering::Relaxed);
        let mut cut = self
            .cut
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cut.cancel();
        *cut = CancellationToken::new();
        carried
    }
}

impl CutProxy {
    /// Holds new connections back (`false`: they wait, unanswered) or lets them through.
    pub fn pass(&self, passing: bool) {
        self.passing.send_replace(passing);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.current().cancel();
    }
}
