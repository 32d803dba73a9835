//! The pruner: deletes settled messages older than `gateway.keep_messages_days`, and the ids
//! signed federation remembers once past their time, so the store does not grow without end.

use std::time::Duration;

use fleet_core::clock::now_ms;

use super::LocalPlane;

/// How often settled messages are pruned.
pub(super) const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);
const MS_PER_DAY: i64 = 86_400_000;

impl LocalPlane {
    pub(super) async fn prune(&self) {
        let days = i64::try_from(self.config.gateway.keep_messages_days).unwrap_or(i64::MAX);
        let before = now_ms().saturating_sub(days.saturating_mul(MS_PER_DAY));
        match self.db.run(move |s| s.prune(before)).await {
            Ok(0) => {}
            Ok(pruned) => tracing::info!(pruned, "pruned settled messages"),
            Err(e) => tracing::warn!(error = %e, "cannot prune messages"),
        }
        // What signed federation remembers (message ids against replay, where sends went)
        // goes once it could no longer matter.
        let now = now_ms();
        match self.db.run(move |s| s.forget(now)).await {
            Ok(0) => {}
            Ok(forgotten) => tracing::info!(forgotten, "forgot message ids past their window"),
            Err(e) => tracing::warn!(error = %e, "cannot forget message ids past their window"),
        }
    }
}
