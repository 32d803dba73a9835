//! Waiting on a condition instead of sleeping a fixed time.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep};

/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(20);

/// Waits until `check` yields `Some`, giving up with an error naming `what` after `limit`.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("gave up after {limit:?} waiting for {what}");
        }
        sleep(POLL).await;
    }
}
