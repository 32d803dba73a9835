//! What waits on an inbox for its turn: a busy worker's briefs, unacknowledged on the broker,
//! in their order, each with its expiry.

use std::collections::VecDeque;
use std::time::Duration;

use fleet_core::clock::now_ms;
use tokio::time::Instant;

use super::trust::Vouched;

/// The farthest a waiting brief's expiry is looked ahead (admitted messages live a day at
/// most; this only keeps the clock's arithmetic far from its end).
const FARTHEST_DUE: Duration = Duration::from_secs(365 * 86_400);

/// Items waiting for their turn, in their order, each with the time it expires (milliseconds
/// since the Unix epoch): the briefs of a busy worker, unacknowledged on the broker.
pub(super) struct Waiting<T = Vouched> {
    items: VecDeque<(u64, T)>,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Waiting {
            items: VecDeque::new(),
        }
    }
}

impl<T> Waiting<T> {
    /// Adds one at the back.
    pub(super) fn push(&mut self, expires_at_ms: u64, item: T) {
        self.items.push_back((expires_at_ms, item));
    }

    /// Whether nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// When the first of them expires.
    pub(super) fn first_expiry(&self) -> Option<u64> {
        self.items.iter().map(|(at, _)| *at).min()
    }

    /// Takes out, in their order, those expired at `now_ms`.
    pub(super) fn expired(&mut self, now_ms: u64) -> Vec<T> {
        let (gone, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.items)
            .into_iter()
            .partition(|(at, _)| now_ms >= *at);
        self.items = kept;
        gone.into_iter().map(|(_, item)| item).collect()
    }

    /// Takes out the first.
    pub(super) fn next(&mut self) -> Option<T> {
        self.items.pop_front().map(|(_, item)| item)
    }

    /// When the first of them expires, on the runtime's clock.
    pub(super) fn due(&self) -> Option<Instant> {
        let at = self.first_expiry()?;
        let now = u64::try_from(now_ms()).unwrap_or(u64::MAX);
        let left = Duration::from_millis(at.saturating_sub(now)).min(FARTHEST_DUE);
        Some(Instant::now() + left)
    }
}

/// Returns at `due` (never, without one).
pub(super) async fn until_due(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::Waiting;

    #[test]
    fn what_waits_keeps_its_order_and_the_expired_leave_from_anywhere() {
        let mut waiting = Waiting::default();
        assert!(waiting.is_empty());
        assert_eq!(waiting.first_expiry(), None);
        waiting.push(300, "first");
        waiting.push(100, "second");
        waiting.push(200, "third");
        waiting.push(400, "fourth");
        assert_eq!(waiting.first_expiry(), Some(100));
        assert_eq!(waiting.expired(99), Vec::<&str>::new());
        assert_eq!(waiting.expired(200), ["second", "third"]);
        assert_eq!(waiting.first_expiry(), Some(300));
        assert_eq!(waiting.next(), Some("first"));
        assert_eq!(waiting.next(), Some("fourth"));
        assert_eq!(waiting.next(), None);
        assert!(waiting.is_empty());
    }
}
