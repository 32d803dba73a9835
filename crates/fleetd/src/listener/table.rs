//! The listener's rules, without a socket: which connection a new one may take the place of
//! when the gateway holds as many as it may ([`Table`]), how long to wait after a failed accept
//! ([`Backoff`]), and how many connections the open-file limit leaves room for
//! ([`connection_room`]).
//!
//! A connection that has not yet authenticated (no request on it carried a good token or web
//! session) is a stranger: anyone who reaches the port can open thousands. At the cap the
//! oldest stranger makes way for the new connection, so a flood of idle connections can never
//! keep out a lead, a worker or a monitor's probe (the newest connection is the last to go);
//! a connection that proved itself is never closed for another. Only when every connection
//! held has proved itself is a new one refused.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// A connection's number: given in order, so a smaller one is older.
pub type ConnId = u64;

/// What to do with a connection just accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission<T> {
    /// Serve it under this number.
    Serve(ConnId),
    /// Serve it under `id`, and close the oldest stranger (its handle `evicted`) to make room.
    ServeEvicting {
        /// The new connection's number.
        id: ConnId,
        /// The handle of the connection to close.
        evicted: T,
    },
    /// Refuse it: the gateway holds as many as it may, each of them proven.
    Refuse,
}

/// The connections the gateway holds (each with a handle `T` that closes it), and which of
/// them are strangers.
#[derive(Debug)]
pub struct Table<T> {
    /// The most connections held at once.
    cap: usize,
    /// The next number to give.
    next: ConnId,
    /// Every connection held, with what closes it.
    open: HashMap<ConnId, T>,
    /// The strangers among them, oldest first.
    strangers: BTreeSet<ConnId>,
}

impl<T> Table<T> {
    /// An empty table holding at most `cap` connections (at least one).
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            next: 0,
            open: HashMap::new(),
            strangers: BTreeSet::new(),
        }
    }

    /// How many connections are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.len()
    }

    /// Takes a new connection in (a stranger until it authenticates) with what closes it, or
    /// says to refuse it. An evicted connection is forgotten here at once: closing it through
    /// its handle is the caller's.
    pub fn admit(&mut self, handle: T) -> Admission<T> {
        let evicted = if self.open.len() >= self.cap {
            match self
                .strangers
                .pop_first()
                .and_then(|oldest| self.open.remove(&oldest))
            {
                Some(oldest) => Some(oldest),
                None => return Admission::Refuse,
            }
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        self.open.insert(id, handle);
        self.strangers.insert(id);
        match evicted {
            Some(evicted) => Admission::ServeEvicting { id, evicted },
            None => Admission::Serve(id),
        }
    }

    /// Notes that a request on `id` authenticated: it is never evicted for another.
    pub fn proven(&mut self, id: ConnId) {
        self.strangers.remove(&id);
    }

    /// Forgets `id`, which closed (nothing happens if it was already evicted).
    pub fn closed(&mut self, id: ConnId) {
        self.open.remove(&id);
        self.strangers.remove(&id);
    }
}

/// The shortest wait after an accept that failed for want of resources.
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
/// The longest: a listener out of descriptors looks again at least this often.
const BACKOFF_MOST: Duration = Duration::from_secs(1);

/// How long to wait after each failed accept of a run of them: doubling from 5 ms to 1 s, so
/// a listener out of descriptors neither spins nor stays deaf long once some are free.
#[derive(Debug, Default)]
pub struct Backoff {
    /// Failures since the last accept that worked.
    failures: u32,
}

impl Backoff {
    /// The wait after one more failure.
    pub fn failed(&mut self) -> Duration {
        let wait = BACKOFF_FIRST
            .saturating_mul(1u32.checked_shl(self.failures).unwrap_or(u32::MAX))
            .min(BACKOFF_MOST);
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// Whether the last accept failed (a run of failures is under way).
    pub fn failing(&self) -> bool {
        self.failures > 0
    }

    /// An accept worked: how many failed before it (the run is over).
    pub fn succeeded(&mut self) -> u32 {
        std::mem::take(&mut self.failures)
    }
}

/// Descriptors kept back from connections for everything else fleetd opens: the store, the
/// pane host, the broker, the launchers' files and pipes.
const FILES_RESERVE: u64 = 1_024;

/// How many descriptors `connections` connections need, with fleetd's other files beside them.
pub fn files_wanted(connections: usize) -> u64 {
    u64::try_from(connections)
        .unwrap_or(u64::MAX)
        .saturating_add(FILES_RESERVE)
}

/// How many connections `open_files` (the soft open-file limit; `None`: unlimited) leaves room
/// for beside fleetd's other files, at most `wanted`: the reserve, or half the limit when the
/// limit is small.
pub fn connection_room(wanted: usize, open_files: Option<u64>) -> usize {
    let Some(limit) = open_files else {
        return wanted;
    };
    let reserve = FILES_RESERVE.min(limit / 2);
    let room = usize::try_from(limit.saturating_sub(reserve)).unwrap_or(usize::MAX);
    wanted.min(room).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_the_cap_every_connection_is_served() {
        let mut table = Table::new(3);
        assert_eq!(table.admit("a"), Admission::Serve(0));
        assert_eq!(table.admit("b"), Admission::Serve(1));
        assert_eq!(table.admit("c"), Admission::Serve(2));
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn at_the_cap_the_oldest_stranger_makes_way() {
        let mut table = Table::new(3);
        for handle in ["a", "b", "c"] {
            table.admit(handle);
        }
        // a is a lead that authenticated; b and c are strangers.
        table.proven(0);
        let evicting = |id, evicted| Admission::ServeEvicting { id, evicted };
        assert_eq!(table.admit("d"), evicting(3, "b"));
        assert_eq!(table.admit("e"), evicting(4, "c"));
        // The newest stranger goes last: d before e.
        assert_eq!(table.admit("f"), evicting(5, "d"));
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn when_every_connection_proved_itself_a_new_one_is_refused() {
        let mut table = Table::new(2);
        table.admit("a");
        table.admit("b");
        table.proven(0);
        table.proven(1);
        assert_eq!(table.admit("c"), Admission::Refuse);
        assert_eq!(table.len(), 2);
        // One closes: room again.
        table.closed(1);
        assert_eq!(table.admit("d"), Admission::Serve(2));
    }

    #[test]
    fn an_evicted_connection_closing_later_changes_nothing() {
        let mut table = Table::new(1);
        table.admit("a");
        assert_eq!(
            table.admit("b"),
            Admission::ServeEvicting {
                id: 1,
                evicted: "a"
            }
        );
        table.closed(0);
        table.proven(0);
        assert_eq!(table.len(), 1);
        // b is still a stranger, and still the one to make way.
        assert_eq!(
            table.admit("c"),
            Admission::ServeEvicting {
                id: 2,
                evicted: "b"
            }
        );
    }

    #[test]
    fn a_cap_of_zero_still_serves_one() {
        let mut table = Table::new(0);
        assert_eq!(table.admit("a"), Admission::Serve(0));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn failed_accepts_back_off_doubling_to_a_second_and_start_over_after_one_works() {
        let mut backoff = Backoff::default();
        assert!(!backoff.failing());
        let waits: Vec<u128> = (0..10).map(|_| backoff.failed().as_millis()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        for _ in 0..100 {
            assert_eq!(backoff.failed(), BACKOFF_MOST);
        }
        assert!(backoff.failing());
        assert_eq!(backoff.succeeded(), 110);
        assert!(!backoff.failing());
        assert_eq!(backoff.failed().as_millis(), 5);
    }

    #[test]
    fn the_open_file_limit_leaves_a_reserve() {
        assert_eq!(connection_room(4096, None), 4096);
        assert_eq!(connection_room(4096, Some(1_048_576)), 4096);
        assert_eq!(connection_room(4096, Some(20_000)), 4096);
        assert_eq!(connection_room(4096, Some(4096)), 3072);
        assert_eq!(connection_room(4096, Some(1024)), 512);
        assert_eq!(connection_room(4096, Some(1)), 1);
        assert_eq!(connection_room(4096, Some(files_wanted(4096))), 4096);
    }
}
