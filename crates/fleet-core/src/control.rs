//! The control plane (spec 10 §7.2, U4): a lead asks the gateway of another host to spawn a
//! worker there, or to stop one of its workers. Pure: where a request goes, the request and
//! answer bodies (JSON), the checks on a request off a control queue, and on its answer.
//!
//! A request is a `SPAWN` message on `fleet.control`, routed by the host id to that host's
//! `control.<host>` queue; its `spawnId` is the worker's gid (minted by the caller for a spawn,
//! so a request delivered twice spawns once; the worker's own for a stop) and its body says
//! which ([`ControlRequest`]). The answer is a `REPLY` to the lead's inbox, from that gid,
//! `inReplyTo` the request, its body a [`ControlAnswer`].

use serde::{Deserialize, Serialize};

use crate::entity::{validate_name, validate_worker_name};
use crate::envelope::Envelope;
use crate::error::{ErrorCode, FleetError};
use crate::ids::Gid;
use crate::message::Kind;
use crate::ownership::MAX_SHARED;

/// The largest control body taken, in bytes (a request or an answer is a few hundred).
pub const MAX_CONTROL_BYTES: usize = 16 * 1024;
/// The longest text an answer's error message or pane may carry, in characters.
const MAX_ANSWER_TEXT: usize = 4096;

/// What a control message asks of the host it goes to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ControlRequest {
    /// Spawn a worker (its gid is the message's `spawnId`).
    Spawn {
        /// The profile, one of that host's.
        profile: String,
        /// A name; `<profile>-<n>` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The working directory on that host; the profile's when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// Extra broadcast groups.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<String>,
        /// An advisory architect (for a consult) rather than a worker.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        architect: bool,
        /// The leads it is shared with, each `name@host`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        share: Vec<String>,
    },
    /// Stop the worker whose gid is the message's `spawnId`.
    Stop,
}

/// How a control request ended, as its host answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ControlAnswer {
    /// The worker is ready for tasks, or blocked on a dialog of its start.
    Spawned {
        /// Its name.
        name: String,
        /// Its pane on that host.
        pane: String,
        /// Its profile.
        profile: String,
        /// The turn id of the dialog its program stopped on while starting, asked of the lead
        /// (its text and choices come as that turn's `ASK`); absent when it is ready.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dialog: Option<String>,
    },
    /// The worker was stopped.
    Stopped {
        /// Its name.
        name: String,
    },
    /// The request failed, as it would have on that host.
    Failed {
        /// The error's code.
        code: ErrorCode,
        /// What went wrong.
        message: String,
    },
}

/// Where a spawn goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// This host.
    Here,
    /// Another host, by id.
    There(String),
}

/// Where a spawn asked for `requested` goes, from `own` host whose roster knows the hosts
/// `known` (their gateways heard from lately) and `quiet` (gone quiet: each with how many
/// seconds since it was last heard). A quiet host fails at once, saying so (nothing answers
/// there now); a host nobody has heard of too, naming those that are there.
pub fn spawn_target(
    requested: Option<&str>,
    own: &str,
    known: &[&str],
    quiet: &[(&str, u64)],
) -> Result<Target, FleetError> {
    let Some(host) = requested.filter(|h| *h != own) else {
        return Ok(Target::Here);
    };
    if known.contains(&host) {
        return Ok(Target::There(host.to_string()));
    }
    if let Some((_, silent_s)) = quiet.iter().find(|(h, _)| *h == host) {
        return Err(FleetError::new(
            ErrorCode::BrokerUnavailable,
            format!(
                "host {} is unreachable: its gateway has not been heard on the broker for {silent_s} s (cut off by a partition, or down); nothing was spawned",
                shown(host)
            ),
        ));
    }
    let mut hosts: Vec<&str> = std::iter::once(own).chain(known.iter().copied()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    Err(FleetError::new(
        ErrorCode::UnknownRecipient,
        format!(
            "no gateway of host {} is heard from (it is down, or no such host is in the fleet); hosts there now: {}",
            shown(host),
            hosts.join(", ")
        ),
    ))
}

/// Checks a message taken off `own` host's control queue (routed there by `routing_key`):
/// a `SPAWN` for this host naming its worker, with a request this host can read. What is
/// wrong is said in a sentence (the message is dead-lettered).
pub fn check_request(
    envelope: &Envelope,
    routing_key: &str,
    own: &str,
    body: &[u8],
) -> Result<(Gid, ControlRequest), String> {
    if envelope.kind != Kind::Spawn {
        return Err(format!(
            "a {} has no place on a control queue",
            envelope.kind
        ));
    }
    if envelope.to != own || routing_key != own {
        return Err(format!(
            "addressed to {} by key {}, not to this host",
            shown(&envelope.to),
            shown(routing_key)
        ));
    }
    let gid = envelope
        .spawn_id
        .ok_or_else(|| "no spawnId names the worker".to_string())?;
    Ok((gid, read_request(body)?))
}

/// The request in a control message's body, checked for what can be checked before its host
/// acts (names; the profile and the directory are that host's to judge).
pub fn read_request(body: &[u8]) -> Result<ControlRequest, String> {
    if body.len() > MAX_CONTROL_BYTES {
        return Err(format!(
            "a request of {} bytes, over the {MAX_CONTROL_BYTES} a control request may have",
            body.len()
        ));
    }
    let request: ControlRequest =
        serde_json::from_slice(body).map_err(|e| format!("the request is not readable: {e}"))?;
    if let ControlRequest::Spawn {
        profile,
        name,
        cwd,
        groups,
        share,
        ..
    } = &request
    {
        validate_name("profile", profile).map_err(|e| e.message)?;
        if share.len() > MAX_SHARED {
            return Err(format!(
                "shared with {} leads, more than the {MAX_SHARED} a worker may be",
                share.len()
            ));
        }
        for lead in share {
            if !lead.contains('@') {
                return Err(format!(
                    "the shared lead {lead:?} names no host (name@host)"
                ));
            }
            crate::ownership::LeadRef::parse(lead, "").map_err(|e| e.message)?;
        }
        if let Some(name) = name {
            validate_worker_name(name).map_err(|e| e.message)?;
        }
        for group in groups {
            validate_name("group", group).map_err(|e| e.message)?;
        }
        if cwd.as_deref().is_some_and(|c| c.contains('\0')) {
            return Err("the cwd holds a NUL byte".into());
        }
    }
    Ok(request)
}

/// The answer in a `REPLY` to a control request, checked: what a host says of its own worker
/// is shown to a lead, so its names must be names and its texts are cut short and made
/// printable.
pub fn read_answer(body: &[u8]) -> Result<ControlAnswer, String> {
    if body.len() > MAX_CONTROL_BYTES {
        return Err(format!(
            "an answer of {} bytes, over the {MAX_CONTROL_BYTES} a control answer may have",
            body.len()
        ));
    }
    let answer: ControlAnswer =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not readable: {e}"))?;
    Ok(match answer {
        ControlAnswer::Spawned {
            name,
            pane,
            profile,
            dialog,
        } => {
            validate_worker_name(&name).map_err(|e| e.message)?;
            validate_name("profile", &profile).map_err(|e| e.message)?;
            if let Some(turn) = &dialog
                && !is_dialog_turn_id(turn)
            {
                return Err(format!(
                    "the dialog of the spawn is no dialog's turn id: {}",
                    printable(turn)
                ));
            }
            ControlAnswer::Spawned {
                name,
                pane: printable(&pane),
                profile,
                dialog,
            }
        }
        ControlAnswer::Stopped { name } => {
            validate_worker_name(&name).map_err(|e| e.message)?;
            ControlAnswer::Stopped { name }
        }
        ControlAnswer::Failed { code, message } => ControlAnswer::Failed {
            code,
            message: printable(&message),
        },
    })
}

impl ControlAnswer {
    /// Whether this answer, come after its call stopped waiting, started an architect
    /// (`architect`: the request asked for one) that nobody will consult: it is to be stopped.
    pub fn orphans(&self, architect: bool) -> bool {
        architect && matches!(self, ControlAnswer::Spawned { .. })
    }

    /// In words, for a lead whose call on `host` stopped waiting before this answer came:
    /// what became of worker `gid` (an architect, if `architect`).
    pub fn late(&self, host: &str, gid: Gid, architect: bool) -> String {
        match self {
            ControlAnswer::Spawned { name, .. } if self.orphans(architect) => format!(
                "host '{host}' answered after your consult stopped waiting: architect '{name}' (gid {gid}) started there, and is being stopped, as no consult will use it"
            ),
            ControlAnswer::Spawned {
                name,
                pane,
                profile,
                dialog: None,
            } => format!(
                "host '{host}' answered after your call stopped waiting: worker '{name}' (gid {gid}, profile {profile}, pane {pane}) is ready for tasks"
            ),
            ControlAnswer::Spawned {
                name,
                pane,
                profile,
                dialog: Some(turn),
            } => format!(
                "host '{host}' answered after your call stopped waiting: worker '{name}' (gid {gid}, profile {profile}, pane {pane}) stopped on a dialog while starting, asked of you as {turn} (fleet_poll shows it)"
            ),
            ControlAnswer::Stopped { name } => format!(
                "host '{host}' answered after your call stopped waiting: worker '{name}' (gid {gid}) is stopped"
            ),
            ControlAnswer::Failed { code, message } => format!(
                "host '{host}' answered after your call stopped waiting: the request for worker {gid} failed ({code}): {message}"
            ),
        }
    }
}

/// Whether `turn` is a dialog's turn id as a gateway mints it (`dialog-` and an id).
fn is_dialog_turn_id(turn: &str) -> bool {
    turn.len() <= 64
        && turn.strip_prefix("dialog-").is_some_and(|id| {
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// `text` cut to [`MAX_ANSWER_TEXT`] characters, its control characters (but newlines and
/// tabs) escaped.
fn printable(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == MAX_ANSWER_TEXT {
            out.push('…');
            break;
        }
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A host id or key as an error shows it: quoted, escaped, cut short.
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(64).collect();
    format!("{cut:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(kind: Kind, to: &str, spawn: Option<Gid>) -> Envelope {
        Envelope {
            spawn_id: spawn,
            ..crate::envelope::sample(kind, "hosta", to, 1_764_547_200_000)
        }
    }

    #[test]
    fn a_spawn_goes_here_there_or_fails_naming_the_hosts_or_the_partition() {
        let quiet = [("q", 42)];
        assert_eq!(
            spawn_target(None, "a", &["b"], &quiet).unwrap(),
            Target::Here
        );
        assert_eq!(
            spawn_target(Some("a"), "a", &[], &[]).unwrap(),
            Target::Here
        );
        assert_eq!(
            spawn_target(Some("b"), "a", &["c", "b"], &quiet).unwrap(),
            Target::There("b".into())
        );
        let err = spawn_target(Some("zz\u{1b}[2J"), "a", &["c", "b"], &quiet).unwrap_err();
        assert_eq!(err.code, ErrorCode::UnknownRecipient);
        assert!(err.message.contains("hosts there now: a, b, c"), "{err}");
        assert!(err.message.contains(r#""zz\u{1b}[2J""#), "{err}");
        let err = spawn_target(Some("q"), "a", &["b"], &quiet).unwrap_err();
        assert_eq!(err.code, ErrorCode::BrokerUnavailable);
        assert!(err.message.contains("host \"q\" is unreachable"), "{err}");
        assert!(err.message.contains("for 42 s"), "{err}");
    }

    #[test]
    fn requests_round_trip_and_unknown_fields_are_ignored() {
        let spawn = ControlRequest::Spawn {
            profile: "claude".into(),
            name: Some("w1".into()),
            cwd: Some("/srv/repo".into()),
            groups: vec!["core".into()],
            architect: true,
            share: vec!["bob@hosta".into()],
        };
        let body = serde_json::to_vec(&spawn).unwrap();
        assert_eq!(read_request(&body).unwrap(), spawn);
        assert_eq!(
            read_request(br#"{"op":"stop","later":1}"#).unwrap(),
            ControlRequest::Stop
        );
        assert_eq!(
            read_request(br#"{"op":"spawn","profile":"p"}"#).unwrap(),
            ControlRequest::Spawn {
                profile: "p".into(),
                name: None,
                cwd: None,
                groups: vec![],
                architect: false,
                share: vec![],
            }
        );
    }

    #[test]
    fn hostile_requests_are_refused_with_what_is_wrong() {
        for (body, says) in [
            (&br#"{"op":"reboot"}"#[..], "not readable"),
            (br#"{"op":"spawn"}"#, "not readable"),
            (br#"{"op":"spawn","profile":"../x"}"#, "profile"),
            (br#"{"op":"spawn","profile":"p","name":"a.b"}"#, "name"),
            (br#"{"op":"spawn","profile":"p","groups":["x y"]}"#, "group"),
            (br#"{"op":"spawn","profile":"p","cwd":"/a\u0000b"}"#, "NUL"),
            (
                br#"{"op":"spawn","profile":"p","share":["bob"]}"#,
                "names no host",
            ),
            (
                br#"{"op":"spawn","profile":"p","share":["b b@h"]}"#,
                "shared lead",
            ),
            (b"\xff\xfe", "not readable"),
        ] {
            let err = read_request(body).unwrap_err();
            assert!(err.contains(says), "{err} should say {says}");
        }
        let huge = vec![b' '; MAX_CONTROL_BYTES + 1];
        assert!(read_request(&huge).unwrap_err().contains("over the"));
    }

    #[test]
    fn only_a_spawn_for_this_host_naming_its_worker_is_taken() {
        let gid = Gid::mint();
        let body = br#"{"op":"stop"}"#;
        let ok = request(Kind::Spawn, "hostb", Some(gid));
        assert_eq!(
            check_request(&ok, "hostb", "hostb", body).unwrap(),
            (gid, ControlRequest::Stop)
        );
        let send = request(Kind::Send, "hostb", Some(gid));
        assert!(
            check_request(&send, "hostb", "hostb", body)
                .unwrap_err()
                .contains("no place")
        );
        let elsewhere = request(Kind::Spawn, "hostc", Some(gid));
        assert!(
            check_request(&elsewhere, "hostb", "hostb", body)
                .unwrap_err()
                .contains("not to this host")
        );
        assert!(
            check_request(&ok, "hostc", "hostb", body)
                .unwrap_err()
                .contains("not to this host")
        );
        let nameless = request(Kind::Spawn, "hostb", None);
        assert!(
            check_request(&nameless, "hostb", "hostb", body)
                .unwrap_err()
                .contains("spawnId")
        );
    }

    #[test]
    fn answers_round_trip_and_hostile_ones_are_tamed() {
        let spawned = ControlAnswer::Spawned {
            name: "w1".into(),
            pane: "%3".into(),
            profile: "claude".into(),
            dialog: None,
        };
        let body = serde_json::to_vec(&spawned).unwrap();
        assert!(
            !String::from_utf8_lossy(&body).contains("dialog"),
            "an older host reads it"
        );
        assert_eq!(read_answer(&body).unwrap(), spawned);
        let blocked = ControlAnswer::Spawned {
            name: "w1".into(),
            pane: "%3".into(),
            profile: "claude".into(),
            dialog: Some("dialog-0190a1b2-c3d4".into()),
        };
        let body = serde_json::to_vec(&blocked).unwrap();
        assert_eq!(read_answer(&body).unwrap(), blocked);
        for turn in ["q-1", "dialog-", "dialog-a b", "dialog-\\u001b[2J"] {
            let body = format!(
                r#"{{"outcome":"spawned","name":"w1","pane":"1","profile":"p","dialog":"{turn}"}}"#
            );
            assert!(read_answer(body.as_bytes()).is_err(), "{turn}");
        }
        assert!(
            read_answer(br#"{"outcome":"spawned","name":"_x","pane":"1","profile":"p"}"#).is_err()
        );
        let failed = read_answer(
            br#"{"outcome":"failed","code":"not_ready","message":"screen:\u001b[2J\nbye"}"#,
        )
        .unwrap();
        assert_eq!(
            failed,
            ControlAnswer::Failed {
                code: ErrorCode::NotReady,
                message: "screen:\\u{1b}[2J\nbye".into()
            }
        );
        let long = format!(
            r#"{{"outcome":"failed","code":"internal","message":"{}"}}"#,
            "x".repeat(MAX_ANSWER_TEXT + 10)
        );
        let ControlAnswer::Failed { message, .. } = read_answer(long.as_bytes()).unwrap() else {
            panic!("a failure")
        };
        assert_eq!(message.chars().count(), MAX_ANSWER_TEXT + 1);
        assert!(read_answer(br#"{"outcome":"failed","code":"made_up","message":""}"#).is_err());
        let gid = Gid::mint();
        let late = spawned.late("hostb", gid, false);
        assert!(
            late.contains("worker 'w1'")
                && late.contains(&gid.to_string())
                && late.contains("ready"),
            "{late}"
        );
        // An architect nobody waits for any more is stopped, and the lead told so.
        assert!(!spawned.orphans(false));
        assert!(spawned.orphans(true));
        let orphan = spawned.late("hostb", gid, true);
        assert!(
            orphan.contains("architect 'w1'") && orphan.contains("is being stopped"),
            "{orphan}"
        );
        let failed = ControlAnswer::Failed {
            code: ErrorCode::NotReady,
            message: "no".into(),
        };
        assert!(!failed.orphans(true));
    }
}
