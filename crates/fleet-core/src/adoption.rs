//! A restart takes back what still runs. At start-up, each worker and architect a previous
//! run of this gateway left is either adopted (same gid, name, owner, token, queue and task in
//! flight) or ended, as decided here from what is known of it: what the store says it was
//! doing and which program it was started as, what the pane host says of its pane, and which
//! program runs there now. Pure: the gateway reads the facts and acts on the verdict.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::WorkerStatus;

/// A program as the kernel knows it: a pid alone is reused, a pid with its start time on one
/// boot is not. What fleetd records when it starts a worker, and compares at the next start
/// with what runs in the worker's pane (a pane host that restarted numbers its panes afresh:
/// the same pane id may hold another program).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramId {
    /// Its process id.
    pub pid: u32,
    /// When it started, in clock ticks after boot (`/proc/PID/stat`, field 22).
    pub started: u64,
    /// The boot it started on (`/proc/sys/kernel/random/boot_id`).
    pub boot: String,
}

/// The start time (field 22, clock ticks after boot) in the text of `/proc/PID/stat`. The
/// program's name (field 2, in parentheses) may hold spaces and parentheses itself: fields are
/// counted after its last `)`.
pub fn start_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name: state (3), ppid (4), … starttime (22) is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether a process environment (`/proc/PID/environ`: `KEY=VALUE` entries, each ended by a
/// NUL) sets `key` to exactly `value`. How a worker started by a run that recorded no
/// [`ProgramId`] (a build before the store's schema 9) is known: fleetd starts every worker's
/// program with `FLEET_GID` set to its gid.
pub fn environ_sets(environ: &[u8], key: &str, value: &str) -> bool {
    environ.split(|b| *b == 0).any(|entry| {
        entry
            .strip_prefix(key.as_bytes())
            .and_then(|rest| rest.strip_prefix(b"="))
            == Some(value.as_bytes())
    })
}

/// What the pane host says of a session's pane now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaneNow {
    /// The host holds no such pane.
    Missing,
    /// The pane is there but its program exited.
    Exited,
    /// The pane is there and its program runs.
    Running,
}

/// What is known at start-up of one session a previous run left.
#[derive(Clone, Debug)]
pub struct Leftover<'a> {
    /// Its status, as the previous run last stored it.
    pub status: WorkerStatus,
    /// The program the previous run started for it, if it recorded one.
    pub started_as: Option<&'a ProgramId>,
    /// Its pane now.
    pub pane: PaneNow,
    /// The program running in its pane now, if it could be read.
    pub running: Option<&'a ProgramId>,
    /// Whether its profile is still configured.
    pub profile_known: bool,
    /// How long no gateway ran before this start (since the previous run was last seen
    /// alive), when known.
    pub unattended: Option<Duration>,
    /// The longest a fleet may have run without its gateway and still be taken back
    /// (`[gateway] adopt_within_s`).
    pub adopt_within: Duration,
}

/// What becomes of a session a previous run left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Take it back as it is.
    Adopt,
    /// End it, for this reason (said to the senders of what it held).
    End(String),
}

/// Whether a session a previous run left is taken back, or why not.
pub fn adopt(left: &Leftover<'_>) -> Verdict {
    let end = |why: String| Verdict::End(why);
    match left.status {
        WorkerStatus::Spawning => {
            return end("it was still starting when fleetd stopped".into());
        }
        WorkerStatus::Stopping | WorkerStatus::Gone => {
            return end("it was being stopped when fleetd stopped".into());
        }
        _ => {}
    }
    if left.adopt_within.is_zero() {
        return end("[gateway] adopt_within_s = 0: a start takes nothing back".into());
    }
    if let Some(unattended) = left.unattended
        && unattended > left.adopt_within
    {
        return end(format!(
            "it ran {} s without a gateway, longer than [gateway] adopt_within_s = {}",
            unattended.as_secs(),
            left.adopt_within.as_secs()
        ));
    }
    match left.pane {
        PaneNow::Missing => return end("its pane is gone".into()),
        PaneNow::Exited => return end("its program exited".into()),
        PaneNow::Running => {}
    }
    let Some(started_as) = left.started_as else {
        return end("the run that started it recorded no program to know it by".into());
    };
    match left.running {
        None => return end("the program in its pane cannot be read".into()),
        Some(running) if running != started_as => {
            return end(format!(
                "its pane runs another program now (pid {} started at tick {}, not pid {} at tick {})",
                running.pid, running.started, started_as.pid, started_as.started
            ));
        }
        Some(_) => {}
    }
    if !left.profile_known {
        return end("its profile is no longer configured".into());
    }
    Verdict::Adopt
}

/// The status an adopted session starts with: busy while it has a task in flight (whatever
/// dialog or question it was on, the watchers find again), else idle.
pub fn adopted_status(in_flight: bool) -> WorkerStatus {
    if in_flight {
        WorkerStatus::Busy
    } else {
        WorkerStatus::Idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(pid: u32, started: u64) -> ProgramId {
        ProgramId {
            pid,
            started,
            boot: "b1".into(),
        }
    }

    fn left<'a>(started_as: &'a ProgramId, running: &'a ProgramId) -> Leftover<'a> {
        Leftover {
            status: WorkerStatus::Busy,
            started_as: Some(started_as),
            pane: PaneNow::Running,
            running: Some(running),
            profile_known: true,
            unattended: Some(Duration::from_secs(3)),
            adopt_within: Duration::from_secs(3600),
        }
    }

    fn ended(verdict: Verdict) -> String {
        match verdict {
            Verdict::End(why) => why,
            Verdict::Adopt => panic!("adopted"),
        }
    }

    #[test]
    fn the_very_program_fleetd_started_is_taken_back() {
        let p = program(41, 900);
        assert_eq!(adopt(&left(&p, &p.clone())), Verdict::Adopt);
        for status in [
            WorkerStatus::Idle,
            WorkerStatus::Asking,
            WorkerStatus::Blocked,
        ] {
            let l = Leftover {
                status,
                ..left(&p, &p)
            };
            assert_eq!(adopt(&l), Verdict::Adopt, "{status:?}");
        }
        // How long fleetd was away is unknown (no earlier probe): nothing to hold against it.
        let l = Leftover {
            unattended: None,
            ..left(&p, &p)
        };
        assert_eq!(adopt(&l), Verdict::Adopt);
    }

    #[test]
    fn another_program_in_a_pane_of_the_same_id_is_not() {
        let (was, now) = (program(41, 900), program(41, 1200));
        assert!(ended(adopt(&left(&was, &now))).contains("another program"));
        let other_pid = program(77, 900);
        assert!(ended(adopt(&left(&was, &other_pid))).contains("pid 77"));
        let other_boot = ProgramId {
            boot: "b2".into(),
            ..was.clone()
        };
        assert!(ended(adopt(&left(&was, &other_boot))).contains("another program"));
        let unread = Leftover {
            running: None,
            ..left(&was, &was)
        };
        assert!(ended(adopt(&unread)).contains("cannot be read"));
    }

    #[test]
    fn a_gone_pane_an_exited_program_or_no_record_ends_it() {
        let p = program(41, 900);
        let gone = Leftover {
            pane: PaneNow::Missing,
            ..left(&p, &p)
        };
        assert_eq!(ended(adopt(&gone)), "its pane is gone");
        let exited = Leftover {
            pane: PaneNow::Exited,
            ..left(&p, &p)
        };
        assert_eq!(ended(adopt(&exited)), "its program exited");
        let unrecorded = Leftover {
            started_as: None,
            ..left(&p, &p)
        };
        assert!(ended(adopt(&unrecorded)).contains("recorded no program"));
        let unconfigured = Leftover {
            profile_known: false,
            ..left(&p, &p)
        };
        assert!(ended(adopt(&unconfigured)).contains("profile"));
    }

    #[test]
    fn a_session_mid_spawn_or_mid_stop_ends() {
        let p = program(41, 900);
        for (status, said) in [
            (WorkerStatus::Spawning, "still starting"),
            (WorkerStatus::Stopping, "being stopped"),
            (WorkerStatus::Gone, "being stopped"),
        ] {
            let l = Leftover {
                status,
                ..left(&p, &p)
            };
            assert!(ended(adopt(&l)).contains(said), "{status:?}");
        }
    }

    #[test]
    fn a_fleet_left_alone_too_long_ends() {
        let p = program(41, 900);
        let stale = Leftover {
            unattended: Some(Duration::from_secs(3601)),
            ..left(&p, &p)
        };
        assert_eq!(
            ended(adopt(&stale)),
            "it ran 3601 s without a gateway, longer than [gateway] adopt_within_s = 3600"
        );
        let just = Leftover {
            unattended: Some(Duration::from_secs(3600)),
            ..left(&p, &p)
        };
        assert_eq!(adopt(&just), Verdict::Adopt);
        let never = Leftover {
            adopt_within: Duration::ZERO,
            unattended: None,
            ..left(&p, &p)
        };
        assert!(ended(adopt(&never)).contains("adopt_within_s = 0"));
    }

    #[test]
    fn the_start_time_is_read_after_the_programs_name() {
        let stat =
            "4242 (claude) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 7 0 123456 9000 300";
        assert_eq!(start_ticks(stat), Some(123_456));
        // A name with spaces and parentheses does not shift the fields.
        let odd =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 7 0 98765 9000 300";
        assert_eq!(start_ticks(odd), Some(98_765));
        assert_eq!(start_ticks("4242 (short) S 1"), None);
        assert_eq!(start_ticks(""), None);
    }

    #[test]
    fn an_environment_sets_a_key_only_to_its_whole_value() {
        let environ = b"HOME=/root\0FLEET_GID=abc\0FLEET_GIDS=x\0";
        assert!(environ_sets(environ, "FLEET_GID", "abc"));
        assert!(environ_sets(environ, "HOME", "/root"));
        assert!(!environ_sets(environ, "FLEET_GID", "ab"));
        assert!(!environ_sets(environ, "FLEET_GID", "abcd"));
        assert!(!environ_sets(environ, "FLEET", "GID=abc"));
        assert!(!environ_sets(b"XFLEET_GID=abc\0", "FLEET_GID", "abc"));
        assert!(!environ_sets(b"", "FLEET_GID", "abc"));
        // The last entry need not end in a NUL.
        assert!(environ_sets(b"A=1\0FLEET_GID=abc", "FLEET_GID", "abc"));
    }

    #[test]
    fn an_adopted_session_is_busy_only_with_a_task_in_flight() {
        assert_eq!(adopted_status(true), WorkerStatus::Busy);
        assert_eq!(adopted_status(false), WorkerStatus::Idle);
    }
}
