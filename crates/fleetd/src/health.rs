//! Whether the gateway can really serve, for `/healthz`: every core loop alive and turning,
//! and the store taking writes. A loop that died (a panic ends its task) or has not come round
//! for far longer than its period, or a store that failed or stopped answering its write probe,
//! makes the gateway unhealthy, named in the answer — so a supervisor or a monitor sees a
//! half-alive fleetd for what it is instead of `ok`.
//!
//! The rule ([`judge`]) is pure, over facts taken at one instant; [`Health`] only records beats
//! and ends. It never holds a lock across an await.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How much longer than its period a periodic loop may take over one round before it counts as
/// stuck: a round that waits on a slow pane host or a busy store for seconds is normal; one
/// that has not come round for half a minute past its time is not.
pub const STUCK_GRACE: Duration = Duration::from_secs(30);

/// What one watched loop has shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopFacts {
    /// How often it comes round; `None`: it waits on events, so only its death counts.
    pub every: Option<Duration>,
    /// When it last came round (or started).
    pub last: Instant,
    /// It ended while the gateway was not stopping.
    pub died: bool,
}

/// What the store's write probe has shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreFacts {
    /// No probe has answered yet, since `since`.
    Unprobed {
        /// When probing began.
        since: Instant,
    },
    /// The last probe took a write at `at`.
    Wrote {
        /// When.
        at: Instant,
    },
    /// The last probes failed, `in_a_row` of them, the last saying why.
    Failed {
        /// Why the last failed.
        why: String,
        /// How many failed in a row.
        in_a_row: u32,
    },
}

/// How many probes in a row must fail before the store counts as taking no writes: one may meet
/// a long write holding the lock past the store's own wait.
pub const STORE_FAILURES: u32 = 2;

/// How often the store's write probe runs.
pub const STORE_PROBE_EVERY: Duration = Duration::from_secs(5);

/// What is wrong, one sentence a problem, in the order of `loops` (by name); none: healthy.
pub fn judge(now: Instant, loops: &BTreeMap<String, LoopFacts>, store: &StoreFacts) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, facts) in loops {
        if facts.died {
            problems.push(format!("the {name} loop died"));
        } else if let Some(every) = facts.every {
            let late = now.saturating_duration_since(facts.last);
            if late > every + STUCK_GRACE {
                problems.push(format!(
                    "the {name} loop has not come round for {} s (it runs every {} ms)",
                    late.as_secs(),
                    every.as_millis()
                ));
            }
        }
    }
    let probe_late =
        |since: Instant| now.saturating_duration_since(since) > STORE_PROBE_EVERY + STUCK_GRACE;
    match store {
        StoreFacts::Failed { why, in_a_row } if *in_a_row >= STORE_FAILURES => {
            problems.push(format!("the store takes no writes: {why}"));
        }
        StoreFacts::Wrote { at } if probe_late(*at) => problems.push(format!(
            "the store has not answered a write for {} s",
            now.saturating_duration_since(*at).as_secs()
        )),
        StoreFacts::Unprobed { since } if probe_late(*since) => {
            problems.push("the store has not answered a write since fleetd started".into());
        }
        _ => {}
    }
    problems
}

/// The gateway's health, as its loops and the store probe report it.
pub struct Health {
    /// Every watched loop, by name.
    loops: Mutex<BTreeMap<String, LoopFacts>>,
    /// The store probe's last word.
    store: Mutex<StoreFacts>,
    /// The gateway is stopping: a loop that ends now ends as it should.
    stopping: AtomicBool,
    /// A fault to inject, for tests of this very check (from [`FAULT_VAR`]; never set outside
    /// tests).
    fault: Option<Fault>,
}

/// The environment variable that injects a fault into a named loop (tests only):
/// `panic:<loop>@<file>` makes the loop `<loop>` panic at its first round once `<file>` exists.
pub const FAULT_VAR: &str = "FLEETD_TEST_FAULT";

/// A fault injected into a loop (see [`FAULT_VAR`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The loop that panics.
    target: String,
    /// It panics once this file exists.
    trigger: std::path::PathBuf,
}

impl Fault {
    /// Reads `panic:<loop>@<file>`; anything else is no fault.
    pub fn parse(text: &str) -> Option<Self> {
        let (target, trigger) = text.strip_prefix("panic:")?.split_once('@')?;
        (!target.is_empty() && !trigger.is_empty()).then(|| Self {
            target: target.to_string(),
            trigger: trigger.into(),
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Facts only: nothing a panic half-way could leave inconsistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Health {
    /// A gateway that has just started, with `fault` to inject (see [`FAULT_VAR`]).
    pub fn new(fault: Option<Fault>) -> Arc<Self> {
        Arc::new(Self {
            loops: Mutex::new(BTreeMap::new()),
            store: Mutex::new(StoreFacts::Unprobed {
                since: Instant::now(),
            }),
            stopping: AtomicBool::new(false),
            fault,
        })
    }

    /// Watches the loop `name` (coming round every `every`, or on events): the guard beats
    /// for it, and its drop, unless the gateway is stopping, says it died.
    pub fn watch(self: &Arc<Self>, name: &str, every: Option<Duration>) -> Watched {
        lock(&self.loops).insert(
            name.to_string(),
            LoopFacts {
                every,
                last: Instant::now(),
                died: false,
            },
        );
        Watched {
            health: Arc::clone(self),
            name: name.to_string(),
            ended: false,
        }
    }

    /// The gateway is stopping: loops end now as they should.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// What the store's write probe found.
    pub fn store_probed(&self, outcome: Result<(), String>) {
        let mut store = lock(&self.store);
        *store = match (outcome, &*store) {
            (Ok(()), _) => StoreFacts::Wrote { at: Instant::now() },
            (Err(why), StoreFacts::Failed { in_a_row, .. }) => StoreFacts::Failed {
                why,
                in_a_row: in_a_row.saturating_add(1),
            },
            (Err(why), _) => StoreFacts::Failed { why, in_a_row: 1 },
        };
    }

    /// What is wrong now; none: healthy.
    pub fn problems(&self) -> Vec<String> {
        let loops = lock(&self.loops).clone();
        let store = lock(&self.store).clone();
        judge(Instant::now(), &loops, &store)
    }
}

/// A watched loop's handle: [`Watched::beat`] each round, [`Watched::ended`] when the loop
/// returns as it should; dropped otherwise (a panic unwinding its task), the loop died.
pub struct Watched {
    health: Arc<Health>,
    name: String,
    /// The loop returned as it should.
    ended: bool,
}

impl Watched {
    /// The loop came round. With the fault of this loop injected and triggered, it panics
    /// here instead.
    pub fn beat(&self) {
        if let Some(fault) = &self.health.fault
            && fault.target == self.name
            && fault.trigger.exists()
        {
            panic!("{FAULT_VAR} made the {} loop panic", self.name);
        }
        if let Some(facts) = lock(&self.health.loops).get_mut(&self.name) {
            facts.last = Instant::now();
        }
    }
}

impl Watched {
    /// The loop returned as it should (the gateway stops, its work is over).
    pub fn ended(mut self) {
        self.ended = true;
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut loops = lock(&self.health.loops);
        if self.ended || self.health.stopping.load(Ordering::Relaxed) {
            loops.remove(&self.name);
        } else if let Some(facts) = loops.get_mut(&self.name) {
            facts.died = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(every: Option<u64>, ago_s: u64, died: bool, now: Instant) -> LoopFacts {
        LoopFacts {
            every: every.map(Duration::from_millis),
            last: now - Duration::from_secs(ago_s),
            died,
        }
    }

    #[test]
    fn loops_turning_and_a_store_taking_writes_are_healthy() {
        let now = Instant::now() + Duration::from_secs(3600);
        let loops = BTreeMap::from([
            ("pane watch".to_string(), facts(Some(200), 0, false, now)),
            ("prune".to_string(), facts(Some(60_000), 80, false, now)),
            ("roster".to_string(), facts(None, 3000, false, now)),
        ]);
        let wrote = StoreFacts::Wrote {
            at: now - Duration::from_secs(4),
        };
        assert_eq!(judge(now, &loops, &wrote), Vec::<String>::new());
        // One failed probe is not yet a store that takes no writes.
        let once = StoreFacts::Failed {
            why: "database is locked".into(),
            in_a_row: 1,
        };
        assert_eq!(judge(now, &loops, &once), Vec::<String>::new());
        let starting = StoreFacts::Unprobed {
            since: now - Duration::from_secs(1),
        };
        assert_eq!(judge(now, &loops, &starting), Vec::<String>::new());
    }

    #[test]
    fn a_dead_or_stuck_loop_and_a_store_that_fails_or_hangs_are_named() {
        let now = Instant::now() + Duration::from_secs(3600);
        let loops = BTreeMap::from([
            ("dialogs".to_string(), facts(Some(500), 1, true, now)),
            ("pane watch".to_string(), facts(Some(200), 31, false, now)),
            ("roster".to_string(), facts(None, 1, true, now)),
        ]);
        let failed = StoreFacts::Failed {
            why: "disk I/O error".into(),
            in_a_row: 2,
        };
        assert_eq!(
            judge(now, &loops, &failed),
            [
                "the dialogs loop died",
                "the pane watch loop has not come round for 31 s (it runs every 200 ms)",
                "the roster loop died",
                "the store takes no writes: disk I/O error",
            ]
        );
        let hung = StoreFacts::Wrote {
            at: now - Duration::from_secs(40),
        };
        assert_eq!(
            judge(now, &BTreeMap::new(), &hung),
            ["the store has not answered a write for 40 s"]
        );
        let never = StoreFacts::Unprobed {
            since: now - Duration::from_secs(40),
        };
        assert_eq!(
            judge(now, &BTreeMap::new(), &never),
            ["the store has not answered a write since fleetd started"]
        );
    }

    #[test]
    fn store_probes_count_their_failures_in_a_row() {
        let health = Health::new(None);
        health.store_probed(Err("locked".into()));
        assert_eq!(health.problems(), Vec::<String>::new());
        health.store_probed(Err("still locked".into()));
        assert_eq!(
            health.problems(),
            ["the store takes no writes: still locked"]
        );
        health.store_probed(Ok(()));
        health.store_probed(Err("locked".into()));
        assert_eq!(health.problems(), Vec::<String>::new());
    }

    #[test]
    fn a_loop_that_ends_while_the_gateway_stops_did_not_die() {
        let health = Health::new(None);
        let running = health.watch("pane watch", Some(Duration::from_millis(200)));
        running.beat();
        let panicking = health.watch("dialogs", None);
        // A panic ends a task by dropping what it held.
        let died = std::thread::spawn(move || {
            let _held = panicking;
            panic!("a bug");
        })
        .join();
        assert!(died.is_err());
        assert_eq!(health.problems(), ["the dialogs loop died"]);
        // One that returns as it should is forgotten.
        health.watch("presence", None).ended();
        assert_eq!(health.problems(), ["the dialogs loop died"]);
        health.stopping();
        drop(running);
        assert_eq!(health.problems(), ["the dialogs loop died"]);
    }

    #[test]
    fn the_injected_fault_panics_only_its_own_loop_once_triggered() {
        let dir = tempfile::tempdir().unwrap();
        let trigger = dir.path().join("now");
        let fault = Fault::parse(&format!("panic:dialogs@{}", trigger.display())).unwrap();
        assert_eq!(Fault::parse("panic:dialogs"), None);
        assert_eq!(Fault::parse("stall:dialogs@/x"), None);
        let health = Health::new(Some(fault));
        let pane_watch = health.watch("pane watch", None);
        let dialogs = health.watch("dialogs", None);
        dialogs.beat();
        std::fs::write(&trigger, "").unwrap();
        pane_watch.beat();
        let beat = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dialogs.beat()));
        assert!(beat.is_err());
    }
}
