//! Bounds: the caps that keep hostile or runaway input from growing fleetd's memory and disk
//! without end. Each rule here is a pure decision over a count its caller took (the store counts
//! the messages waiting for a recipient, the roster its entries, the MCP front its open calls
//! and sessions); the caller acts on the answer. A refusal names the count, the cap and the
//! config key that sets it.
//!
//! Every cap lets the value at the cap through and refuses one more.

use std::fmt;

use crate::message::Kind;

/// The key of the cap on messages waiting for one recipient.
pub const HELD_KEY: &str = "gateway.max_held_per_recipient";
/// The key of the cap on one caller's concurrent long calls.
pub const LONG_CALLS_KEY: &str = "gateway.max_long_calls_per_caller";
/// The key of the cap on one token's live MCP sessions.
pub const SESSIONS_KEY: &str = "gateway.max_sessions_per_token";
/// The key of the cap on the remote hosts the roster holds.
pub const REMOTE_HOSTS_KEY: &str = "federation.max_remote_hosts";
/// The key of the cap on the roster entries of one remote host.
pub const REMOTE_ENTITIES_KEY: &str = "federation.max_remote_entities_per_host";

/// A cap that was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full {
    /// How many there are already.
    pub count: usize,
    /// The cap, as configured.
    pub cap: usize,
    /// The config key that sets the cap.
    pub key: &'static str,
}

impl fmt::Display for Full {
    /// The cap and its key, as a sentence names it: `gateway.max_held_per_recipient = 1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}", self.key, self.cap)
    }
}

/// Whether one more may join `count` under `cap` (set by `key`).
pub fn admit(count: usize, cap: usize, key: &'static str) -> Result<(), Full> {
    if count < cap {
        Ok(())
    } else {
        Err(Full { count, cap, key })
    }
}

/// One of a token's live MCP sessions, as the front knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionUse {
    /// When it was last used, on any clock that only goes forward (a larger value is later).
    pub last_used: u64,
    /// Whether a call is in flight on it (a stream open, a long call running).
    pub busy: bool,
}

/// Which of a token's `held` sessions (by index) to close so that one more may open under
/// `cap`: as few as make room, the least recently used first, never a busy one. A client that
/// restarts or crashes leaves its session behind; its next one must still get in, and a lead's
/// long call in flight must never be cut for it. `Full` only when busy sessions alone fill the
/// cap.
pub fn sessions_to_close(held: &[SessionUse], cap: usize) -> Result<Vec<usize>, Full> {
    let need = (held.len() + 1).saturating_sub(cap);
    if need == 0 {
        return Ok(Vec::new());
    }
    let mut idle: Vec<usize> = (0..held.len()).filter(|&i| !held[i].busy).collect();
    if idle.len() < need {
        return Err(Full {
            count: held.len(),
            cap,
            key: SESSIONS_KEY,
        });
    }
    idle.sort_by_key(|&i| held[i].last_used);
    idle.truncate(need);
    Ok(idle)
}

/// Whether a message of `kind` may wait for a recipient that already has `waiting` messages
/// waiting (held for its pull, or queued for its pane), under `cap`.
///
/// What may be refused, and why nothing accepted is lost:
/// - A new message (a task, a reply, an ask, an answer) stops at the cap. Its sender is refused
///   at once with an error naming the cap (a local call fails `too_many`; one off the broker is
///   dead-lettered and its sender gets a `FAILED` notice) and may send it again once the
///   recipient has taken some: the message was never accepted, so nothing is lost. A worker
///   whose `fleet_reply` is refused keeps its task in flight, so it can reply again.
/// - A notice about the recipient's *own* earlier message (`FAILED`, `TOO_LATE`, `NO_WAITER`,
///   `ABANDONED`, `INJECTED`) has a reserve of as many again. It has no sender to refuse, and
///   it is the only word its recipient gets that a message it sent was not delivered: a
///   recipient that does not collect still learns of its failures up to twice the cap, and a
///   flood of notices (forged ones off the broker among them) still stops there.
pub fn admit_waiting(kind: Kind, waiting: usize, cap: usize) -> Result<(), Full> {
    let limit = if is_notice(kind) {
        cap.saturating_mul(2)
    } else {
        cap
    };
    admit(waiting, limit, HELD_KEY).map_err(|full| Full { cap, ..full })
}

/// Whether `kind` is a notice about its recipient's own earlier message.
fn is_notice(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Failed | Kind::TooLate | Kind::NoWaiter | Kind::Abandoned | Kind::Injected
    )
}

/// The caps on what the roster keeps of other hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RosterCaps {
    /// The most remote hosts.
    pub hosts: usize,
    /// The most entries of one remote host.
    pub entities_per_host: usize,
}

/// What the roster holds, as a heartbeat from a host finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RosterCount {
    /// The remote hosts it knows (by their gateway entry or an entity's).
    pub hosts: usize,
    /// Whether the heartbeat's host is among them.
    pub host_known: bool,
    /// The entries it holds of the heartbeat's host.
    pub entities_of_host: usize,
}

/// Whether a heartbeat may add its host to the roster: a known host always may (its entries
/// are refreshed), a new one while there are fewer hosts than the cap.
pub fn admit_remote_host(count: RosterCount, caps: RosterCaps) -> Result<(), Full> {
    if count.host_known {
        return Ok(());
    }
    admit(count.hosts, caps.hosts, REMOTE_HOSTS_KEY)
}

/// Whether a heartbeat may add an entity the roster does not hold yet: its host must be
/// admitted, and hold fewer entries than the cap. (An entry already held is refreshed
/// without asking: a cap never drops what was accepted.)
pub fn admit_remote_entity(count: RosterCount, caps: RosterCaps) -> Result<(), Full> {
    admit_remote_host(count, caps)?;
    admit(
        count.entities_of_host,
        caps.entities_per_host,
        REMOTE_ENTITIES_KEY,
    )
}

/// Whether an audit log `len` bytes long must rotate before a line of `line` bytes goes in,
/// under a cap of `max` bytes: when the line would take it over. A file at exactly the cap
/// is kept; an empty file takes any line whole, so a line is never split or dropped.
pub fn rotate_before(len: u64, line: u64, max: u64) -> bool {
    len > 0 && len.checked_add(line).is_none_or(|total| total > max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_at_the_cap_passes_and_one_more_is_refused() {
        assert!(admit(0, 1, HELD_KEY).is_ok());
        assert!(admit(2, 3, LONG_CALLS_KEY).is_ok());
        let full = admit(3, 3, LONG_CALLS_KEY).unwrap_err();
        assert_eq!(
            full,
            Full {
                count: 3,
                cap: 3,
                key: LONG_CALLS_KEY
            }
        );
        assert_eq!(full.to_string(), "gateway.max_long_calls_per_caller = 3");
    }

    #[test]
    fn a_new_session_over_the_cap_closes_the_least_recently_used_idle_ones() {
        let used = |last_used, busy| SessionUse { last_used, busy };
        // Under the cap: nothing to close.
        assert_eq!(sessions_to_close(&[], 1), Ok(vec![]));
        assert_eq!(
            sessions_to_close(&[used(1, false), used(2, false)], 3),
            Ok(vec![])
        );
        // At the cap: the oldest idle one goes, not the busy older one.
        assert_eq!(
            sessions_to_close(&[used(5, false), used(1, true), used(3, false)], 3),
            Ok(vec![2])
        );
        // Over it (a cap lowered since): as many as make room.
        assert_eq!(
            sessions_to_close(&[used(9, false), used(2, false), used(4, false)], 2),
            Ok(vec![1, 2])
        );
        // Every held one busy: the new one cannot get in.
        let full = sessions_to_close(&[used(1, true), used(2, true)], 2).unwrap_err();
        assert_eq!((full.count, full.cap, full.key), (2, 2, SESSIONS_KEY));
    }

    #[test]
    fn new_messages_stop_at_the_cap_and_notices_have_a_reserve_as_large() {
        for kind in [Kind::Send, Kind::Reply, Kind::Ask, Kind::Answer] {
            assert!(admit_waiting(kind, 9, 10).is_ok(), "{kind}");
            let full = admit_waiting(kind, 10, 10).unwrap_err();
            assert_eq!((full.count, full.cap, full.key), (10, 10, HELD_KEY));
        }
        for kind in [
            Kind::Failed,
            Kind::TooLate,
            Kind::NoWaiter,
            Kind::Abandoned,
            Kind::Injected,
        ] {
            assert!(admit_waiting(kind, 10, 10).is_ok(), "{kind}");
            assert!(admit_waiting(kind, 19, 10).is_ok(), "{kind}");
            let full = admit_waiting(kind, 20, 10).unwrap_err();
            // The refusal names the configured cap, not the reserve.
            assert_eq!((full.count, full.cap), (20, 10));
        }
        assert!(admit_waiting(Kind::Failed, usize::MAX - 1, usize::MAX).is_ok());
    }

    #[test]
    fn the_roster_keeps_known_hosts_and_caps_new_ones_and_their_entries() {
        let caps = RosterCaps {
            hosts: 2,
            entities_per_host: 3,
        };
        let count = |hosts, host_known, entities_of_host| RosterCount {
            hosts,
            host_known,
            entities_of_host,
        };
        assert!(admit_remote_host(count(1, false, 0), caps).is_ok());
        assert_eq!(
            admit_remote_host(count(2, false, 0), caps).map_err(|f| f.key),
            Err(REMOTE_HOSTS_KEY)
        );
        assert!(admit_remote_host(count(2, true, 0), caps).is_ok());
        assert!(admit_remote_entity(count(2, true, 2), caps).is_ok());
        assert_eq!(
            admit_remote_entity(count(2, true, 3), caps).map_err(|f| f.key),
            Err(REMOTE_ENTITIES_KEY)
        );
        // A new host's first entity needs room for the host too.
        assert_eq!(
            admit_remote_entity(count(2, false, 0), caps).map_err(|f| f.key),
            Err(REMOTE_HOSTS_KEY)
        );
        assert!(admit_remote_entity(count(1, false, 0), caps).is_ok());
    }

    #[test]
    fn the_audit_log_rotates_only_when_a_line_would_take_it_over_the_cap() {
        assert!(!rotate_before(0, 500, 100), "an empty file takes any line");
        assert!(!rotate_before(60, 40, 100), "exactly at the cap stays");
        assert!(rotate_before(60, 41, 100));
        assert!(rotate_before(100, 1, 100));
        assert!(rotate_before(u64::MAX, 1, u64::MAX));
    }
}
