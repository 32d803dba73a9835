//! The time rules of a worker's life after its spawn (given the time passed as values): when
//! an idle worker is reaped (`idle_ttl`) or given a fresh session (`context_cap`), and when a
//! lead or an architect with messages waiting is nudged.

use std::time::Duration;

use crate::session::WorkerStatus;

/// What a worker's session is due for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turnover {
    /// A fresh session (new process, new token) under the same gid and name: it took as many
    /// tasks as its profile's `context_cap` allows.
    Recycle,
    /// Stopped: idle longer than its profile's `idle_ttl`.
    Reap,
}

/// What decides a worker's turnover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LifeFacts {
    /// Its session's status.
    pub status: WorkerStatus,
    /// Its pump or a poll is taking a task off its queue right now.
    pub claiming: bool,
    /// It took as many tasks as its `context_cap` allows.
    pub cap_reached: bool,
    /// How long it has been idle, while it is.
    pub idle_for: Option<Duration>,
    /// Its profile's `idle_ttl`, if any.
    pub idle_ttl: Option<Duration>,
}

/// What `facts` make the worker due for now, if anything. Only an idle worker that nobody is
/// handing a task to is touched; the cap comes before the idle timer (a recycled worker's
/// timer starts afresh).
pub fn turnover(facts: &LifeFacts) -> Option<Turnover> {
    if facts.status != WorkerStatus::Idle || facts.claiming {
        return None;
    }
    if facts.cap_reached {
        return Some(Turnover::Recycle);
    }
    match (facts.idle_for, facts.idle_ttl) {
        (Some(idle), Some(ttl)) if idle >= ttl => Some(Turnover::Reap),
        _ => None,
    }
}

/// When a lead (or an architect) with messages waiting for it may be nudged next: `None` if
/// now, else how long to wait first. Never while it waits in a fleet call (it gets its messages there; looked at
/// again after `recheck`), and at most once per `interval` (`since_last`: since the last).
pub fn nudge_wait(
    open_calls: usize,
    since_last: Option<Duration>,
    interval: Duration,
    recheck: Duration,
) -> Option<Duration> {
    if open_calls > 0 {
        return Some(recheck);
    }
    match since_last {
        Some(since) if since < interval => Some(interval - since),
        _ => None,
    }
}

/// The nudge typed into a pane when `count` messages wait to be pulled: fleetd's own words and
/// a number, nothing a message put there.
pub fn nudge_line(count: usize) -> String {
    let plural = if count == 1 { "" } else { "s" };
    format!("[fleet] {count} message{plural} waiting for you: call fleet_poll to read them")
}

/// Whether a busy worker has stalled: neither its screen (unchanged for `screen_still`) nor
/// a call of its own (the last `since_call` ago, if any) moved for `after`.
pub fn stalled(
    screen_still: std::time::Duration,
    since_call: Option<std::time::Duration>,
    after: std::time::Duration,
) -> bool {
    screen_still >= after && since_call.is_none_or(|call| call >= after)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    fn idle_for(secs: u64) -> LifeFacts {
        LifeFacts {
            status: WorkerStatus::Idle,
            claiming: false,
            cap_reached: false,
            idle_for: Some(Duration::from_secs(secs)),
            idle_ttl: Some(TTL),
        }
    }

    #[test]
    fn an_idle_worker_is_reaped_at_its_ttl_not_before() {
        assert_eq!(turnover(&idle_for(59)), None);
        assert_eq!(turnover(&idle_for(60)), Some(Turnover::Reap));
        let no_ttl = LifeFacts {
            idle_ttl: None,
            ..idle_for(86_400)
        };
        assert_eq!(turnover(&no_ttl), None);
    }

    #[test]
    fn a_worker_at_its_cap_is_recycled_before_any_reap() {
        let capped = LifeFacts {
            cap_reached: true,
            ..idle_for(600)
        };
        assert_eq!(turnover(&capped), Some(Turnover::Recycle));
    }

    #[test]
    fn a_worker_busy_or_being_handed_a_task_is_left_alone() {
        for status in [
            WorkerStatus::Busy,
            WorkerStatus::Asking,
            WorkerStatus::Blocked,
            WorkerStatus::Spawning,
        ] {
            let facts = LifeFacts {
                status,
                cap_reached: true,
                ..idle_for(600)
            };
            assert_eq!(turnover(&facts), None, "{status}");
        }
        let claimed = LifeFacts {
            claiming: true,
            cap_reached: true,
            ..idle_for(600)
        };
        assert_eq!(turnover(&claimed), None);
    }

    #[test]
    fn a_lead_is_nudged_at_most_once_per_interval_and_never_in_a_call() {
        let (interval, recheck) = (Duration::from_secs(30), Duration::from_secs(1));
        assert_eq!(nudge_wait(0, None, interval, recheck), None);
        assert_eq!(
            nudge_wait(0, Some(Duration::from_secs(10)), interval, recheck),
            Some(Duration::from_secs(20))
        );
        assert_eq!(nudge_wait(0, Some(interval), interval, recheck), None);
        assert_eq!(nudge_wait(1, None, interval, recheck), Some(recheck));
    }

    #[test]
    fn a_nudge_counts_what_waits_in_fleetds_own_words() {
        assert_eq!(
            nudge_line(1),
            "[fleet] 1 message waiting for you: call fleet_poll to read them"
        );
        assert!(nudge_line(3).starts_with("[fleet] 3 messages waiting"));
    }

    #[test]
    fn a_worker_stalls_only_when_neither_its_screen_nor_a_call_moved_for_long_enough() {
        let s = std::time::Duration::from_secs;
        assert!(stalled(s(300), None, s(300)));
        assert!(stalled(s(400), Some(s(301)), s(300)));
        assert!(!stalled(s(299), None, s(300)), "its screen moved");
        assert!(!stalled(s(400), Some(s(10)), s(300)), "it called in");
    }
}
