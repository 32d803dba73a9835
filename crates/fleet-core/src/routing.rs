//! The routing decision: is a recipient local, remote, or unknown?
//!
//! Same-host traffic takes the local plane and never touches a broker; a remote recipient is
//! published by its gid; an unknown one is a clear error. The decision is made here, once, for
//! every send, so a second delivery path slots in beside the first instead of replacing it.

use crate::entity::Entity;
use crate::error::{ErrorCode, FleetError};
use crate::ids::Gid;

/// Where a message to a recipient goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// The recipient lives on this gateway's host.
    Local(Entity),
    /// The recipient lives on another host.
    Remote(Entity),
}

impl Route {
    /// The recipient, wherever it lives.
    pub fn entity(&self) -> &Entity {
        match self {
            Route::Local(entity) | Route::Remote(entity) => entity,
        }
    }
}

/// What routing looks up, each by an index (never by walking the whole roster): the live
/// entities of this host and those the remote roster knows.
pub trait Directory {
    /// The entity of `gid`.
    fn by_gid(&self, gid: Gid) -> Option<Entity>;
    /// The entities called `name`, this host's first.
    fn named(&self, name: &str) -> Vec<Entity>;
    /// Every name known, for the error that lists them (an unknown recipient only).
    fn names(&self) -> Vec<String>;
}

/// Resolves `to` (a gid, a name, or `name@host`) in `directory` as seen from `local_host`.
/// A bare name prefers the local entity; a bare name held only by several remote entities is
/// ambiguous and asks for `name@host`.
pub fn resolve(
    directory: &impl Directory,
    local_host: &str,
    to: &str,
) -> Result<Route, FleetError> {
    let to = to.trim();
    let found = if let Ok(gid) = to.parse::<Gid>() {
        directory.by_gid(gid)
    } else if let Some((name, host)) = to.split_once('@') {
        directory.named(name).into_iter().find(|e| e.host == host)
    } else {
        let named = directory.named(to);
        match named.iter().find(|e| e.host == local_host) {
            Some(local) => Some(local.clone()),
            None if named.len() > 1 => {
                return Err(FleetError::invalid(format!(
                    "the name {} is held on several hosts: address it as name@host or by gid",
                    quoted(to)
                )));
            }
            None => named.into_iter().next(),
        }
    };
    match found {
        Some(entity) if entity.host == local_host => Ok(Route::Local(entity)),
        Some(entity) => Ok(Route::Remote(entity)),
        None => Err(unknown_recipient(directory.names(), to)),
    }
}

fn unknown_recipient(names: Vec<String>, to: &str) -> FleetError {
    FleetError::new(
        ErrorCode::UnknownRecipient,
        format!(
            "no entity is named or has the id {} (known: {}); see fleet_list",
            quoted(to),
            listed(names)
        ),
    )
}

/// The most characters of a caller's recipient an error repeats.
const QUOTED: usize = 64;

/// A recipient as the caller gave it, as an error repeats it: in quotes, inert, cut short.
fn quoted(to: &str) -> String {
    format!("'{}'", crate::inert::cut(to, QUOTED))
}

/// The names, sorted, each once, as a sentence lists them ("nobody" for none).
fn listed(mut names: Vec<String>) -> String {
    names.sort_unstable();
    names.dedup();
    if names.is_empty() {
        "nobody".to_string()
    } else {
        names.join(", ")
    }
}

/// The error for a recipient `name` that is not live because it ended at `at_ms` (Unix
/// milliseconds; it is now `now_ms`) for `why` (given only to its owner), with `live` the names
/// known now: still `unknown_recipient`, saying when (and why) it ended, and, to a caller that
/// `may_spawn`, that fleet_spawn starts another.
pub fn ended(
    name: &str,
    at_ms: i64,
    now_ms: i64,
    why: Option<&str>,
    may_spawn: bool,
    live: Vec<String>,
) -> FleetError {
    let why = why.map(|why| format!(" ({why})")).unwrap_or_default();
    let next = if may_spawn {
        "fleet_spawn starts a new worker; "
    } else {
        ""
    };
    FleetError::new(
        ErrorCode::UnknownRecipient,
        format!(
            "'{name}' is gone: it ended at {} UTC, {}{why}; {next}live now: {} (see fleet_list)",
            time_of_day(at_ms),
            ago(now_ms.saturating_sub(at_ms)),
            listed(live)
        ),
    )
}

/// `ms` (Unix milliseconds) as the UTC time of day, `HH:MM:SS`.
fn time_of_day(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// How long ago something `ms` milliseconds old was, in its largest whole unit.
fn ago(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0 => "just now".to_string(),
        1..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_recipient_is_repeated_inert_and_short() {
        let err = unknown_recipient(vec!["w1".into()], "w\u{1b}[2J\nx");
        assert_eq!(
            err.message,
            "no entity is named or has the id 'w\\u{1b}[2J\\nx' (known: w1); see fleet_list"
        );
        let long = unknown_recipient(Vec::new(), &"y".repeat(10_000));
        assert!(long.message.contains(&format!("'{}…'", "y".repeat(QUOTED))));
        assert!(long.message.len() < 200, "{}", long.message);
        assert!(
            unknown_recipient(Vec::new(), "w9")
                .message
                .starts_with("no entity is named or has the id 'w9'")
        );
    }

    #[test]
    fn an_ended_recipient_is_told_when_why_and_what_to_do() {
        // 2026-12-06 12:01:07.500 UTC, told 3 min 20 s later.
        let at = 1_796_558_467_500;
        let err = ended(
            "w3",
            at,
            at + 200_000,
            Some("stopped by lead"),
            true,
            vec!["w1".into(), "lead".into(), "w1".into()],
        );
        assert_eq!(err.code, ErrorCode::UnknownRecipient);
        assert_eq!(
            err.message,
            "'w3' is gone: it ended at 12:01:07 UTC, 3 min ago (stopped by lead); fleet_spawn starts a new worker; live now: lead, w1 (see fleet_list)"
        );
        // No cause told (not the owner, or none recorded), a caller that may not spawn, nobody
        // live, a clock that went back.
        let err = ended("w3", at, at - 5_000, None, false, Vec::new());
        assert_eq!(
            err.message,
            "'w3' is gone: it ended at 12:01:07 UTC, just now; live now: nobody (see fleet_list)"
        );
    }

    #[test]
    fn how_long_ago_is_said_in_its_largest_whole_unit() {
        let cases = [
            (999, "just now"),
            (59_999, "59 s ago"),
            (60_000, "1 min ago"),
            (3_599_999, "59 min ago"),
            (3_600_000, "1 h ago"),
            (86_399_999, "23 h ago"),
            (86_400_000 * 3, "3 days ago"),
        ];
        for (ms, said) in cases {
            assert_eq!(ago(ms), said, "{ms}");
        }
        assert_eq!(time_of_day(0), "00:00:00");
        assert_eq!(time_of_day(-1), "23:59:59");
    }
    use crate::entity::Role;

    /// A roster as a plain list, looked up by walking it.
    struct Listed(Vec<Entity>);

    impl Directory for Listed {
        fn by_gid(&self, gid: Gid) -> Option<Entity> {
            self.0.iter().find(|e| e.gid == gid).cloned()
        }
        fn named(&self, name: &str) -> Vec<Entity> {
            self.0.iter().filter(|e| e.name == name).cloned().collect()
        }
        fn names(&self) -> Vec<String> {
            self.0.iter().map(|e| e.name.clone()).collect()
        }
    }

    fn resolve(roster: &[Entity], local_host: &str, to: &str) -> Result<Route, FleetError> {
        super::resolve(&Listed(roster.to_vec()), local_host, to)
    }

    fn entity(name: &str, host: &str) -> Entity {
        Entity {
            gid: Gid::mint(),
            name: name.into(),
            host: host.into(),
            role: Role::Worker,
            profile: None,
            sandbox: None,
            profile_role: None,
            groups: vec![],
            parent: None,
        }
    }

    #[test]
    fn local_by_name_and_gid() {
        let roster = vec![entity("w1", "a"), entity("w2", "a")];
        assert_eq!(
            resolve(&roster, "a", "w2").unwrap(),
            Route::Local(roster[1].clone())
        );
        let by_gid = roster[0].gid.to_string();
        assert_eq!(
            resolve(&roster, "a", &by_gid).unwrap(),
            Route::Local(roster[0].clone())
        );
    }

    #[test]
    fn remote_and_host_qualified() {
        let roster = vec![entity("w1", "a"), entity("w1", "b"), entity("w9", "b")];
        assert_eq!(
            resolve(&roster, "a", "w1").unwrap(),
            Route::Local(roster[0].clone())
        );
        assert_eq!(
            resolve(&roster, "a", "w1@b").unwrap(),
            Route::Remote(roster[1].clone())
        );
        assert_eq!(
            resolve(&roster, "a", "w9").unwrap(),
            Route::Remote(roster[2].clone())
        );
    }

    #[test]
    fn ambiguous_remote_names_ask_for_a_host() {
        let roster = vec![entity("w1", "b"), entity("w1", "c")];
        let err = resolve(&roster, "a", "w1").unwrap_err();
        assert!(err.message.contains("name@host"), "{err}");
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let roster = vec![entity("w2", "a"), entity("w1", "a")];
        let err = resolve(&roster, "a", "ghost").unwrap_err();
        assert_eq!(err.code, ErrorCode::UnknownRecipient);
        assert!(
            err.message.contains("'ghost'") && err.message.contains("w1, w2"),
            "{err}"
        );
    }
}
