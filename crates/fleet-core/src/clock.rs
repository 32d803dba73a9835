//! The one clock read of the workspace, for the adapters. The rules in this crate never call
//! it: they take the time as a value, so each is tested with explicit times.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now (0 before 1970; saturated far in the future).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
