//! The gateway's loops: each runs on its task set, is watched for `/healthz` (see
//! [`crate::health::Health`]), and ends at shutdown; among them the store's write probe.

use std::sync::Arc;
use std::time::Duration;

use fleet_store::StoreResult;
use futures_util::future::BoxFuture;

use super::{LocalPlane, store_error};

/// How long the store's write probe may take before the store counts as not answering: far
/// longer than any write takes, and than the store's own wait for its lock.
const STORE_PROBE_LIMIT: Duration = Duration::from_secs(10);

impl LocalPlane {
    /// Runs `tick` (with its own `state`) every `interval` until shutdown, on the gateway's
    /// task set, watched as the loop `name` (see [`crate::health::Health`]); a tick that runs
    /// long delays the next one rather than bunching them.
    pub(super) fn every<S, F>(
        self: &Arc<Self>,
        name: &str,
        interval: Duration,
        mut state: S,
        tick: F,
    ) where
        S: Send + 'static,
        F: for<'a> Fn(&'a Arc<LocalPlane>, &'a mut S) -> BoxFuture<'a, ()> + Send + 'static,
    {
        let gateway = Arc::clone(self);
        let watched = self.health.watch(name, Some(interval));
        self.tasks.spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {
                        watched.beat();
                        tick(&gateway, &mut state).await;
                    }
                    () = gateway.shutdown.cancelled() => return watched.ended(),
                }
            }
        });
    }

    /// Runs `work`, a loop that lasts until shutdown, on the gateway's task set, watched as the
    /// loop `name`: if it ends otherwise (a panic), the gateway is unhealthy.
    pub(super) fn run_watched<F>(self: &Arc<Self>, name: &str, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let watched = self.health.watch(name, None);
        self.tasks.spawn(async move {
            work.await;
            watched.ended();
        });
    }

    /// One look at whether the store takes writes, for [`Health`]: a write that changes nothing,
    /// on a blocking thread. One that has not answered within [`STORE_PROBE_LIMIT`] is waited
    /// on again at the next look rather than joined by another (a store that hangs must not take
    /// every blocking thread); [`Health`] counts it late if it stays out.
    pub(super) async fn probe_store(
        &self,
        pending: &mut Option<tokio::task::JoinHandle<StoreResult<()>>>,
    ) {
        let mut probe = pending.take().unwrap_or_else(|| {
            let store = self.db.shared();
            tokio::task::spawn_blocking(move || store.probe_write())
        });
        match tokio::time::timeout(STORE_PROBE_LIMIT, &mut probe).await {
            Ok(Ok(wrote)) => self
                .health
                .store_probed(wrote.map_err(|e| store_error(e).message)),
            Ok(Err(join)) => self
                .health
                .store_probed(Err(format!("the probe failed: {join}"))),
            Err(_) => *pending = Some(probe),
        }
    }
}
