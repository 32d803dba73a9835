//! Trust between gateways (spec 10 §2.1, §10): which keys — and which broker login — each host
//! is pinned to, and the checks a message off the broker passes before anything acts on it.
//! Pure: the clock, the roster's answers and the store's answers come in as values.
//!
//! The checks run in this order, each with a refusal of its own ([`Refusal`]):
//! 1. [`check_seal`]: the signature is valid for a key pinned for the envelope's `fromHost`,
//!    and the broker login that published it is the one pinned for that host (when one is);
//! 2. for presence, [`check_presence_key`]: the routing key names `fromHost` and the entity
//!    it speaks for, and the entity is that host's;
//! 3. [`check_sender`]: `from` is not placed on any other host (this one included) and, for a
//!    message that needs its sender's role, is known on `fromHost`;
//! 4. [`check_time`]: `ts` is not ahead of this clock by more than the skew allowed nor older
//!    than the window, `expiresAt` has not passed, and the message does not live longer than
//!    the window (its id is remembered that long, so it cannot be replayed afterwards);
//! 5. the seen-set (the caller's, persistent): a message id seen before for the same
//!    recipient, on a delivery the broker has not flagged as redelivered, is a replay;
//! 6. [`check_authority`]: the rules that hold on one host hold across hosts — a task only
//!    from a lead (or a worker to its own lead), a broadcast only from a lead, an answer
//!    (`REPLY`, `ANSWER` and the notices: `FAILED`, `INJECTED`, `TOO_LATE`, `NO_WAITER`,
//!    `ABANDONED`) only from the host the answered message was sent to.

use std::collections::BTreeMap;
use std::fmt;

use ed25519_dalek::VerifyingKey;

use crate::authz;
use crate::entity::{Entity, Role};
use crate::envelope::Envelope;
use crate::ids::{Gid, MsgId};
use crate::message::Kind;
use crate::signing::{fingerprint, verify};

/// What one host is pinned to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedHost {
    /// Its keys with their fingerprints (two while it rotates).
    keys: Vec<(String, VerifyingKey)>,
    /// The broker login it publishes as, when pinned.
    login: Option<String>,
}

impl PinnedHost {
    /// A host pinned to `keys` and, when given, the broker `login`.
    pub fn new(keys: Vec<VerifyingKey>, login: Option<String>) -> Self {
        let keys = keys.into_iter().map(|k| (fingerprint(&k), k)).collect();
        Self { keys, login }
    }

    /// The key whose fingerprint is `key_id`.
    fn key(&self, key_id: &str) -> Option<&VerifyingKey> {
        self.keys
            .iter()
            .find(|(id, _)| id == key_id)
            .map(|(_, k)| k)
    }
}

/// The pinned hosts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trust {
    hosts: BTreeMap<String, PinnedHost>,
}

impl Trust {
    /// The trust table `hosts`.
    pub fn new(hosts: BTreeMap<String, PinnedHost>) -> Self {
        Self { hosts }
    }

    /// Pins `host` (this gateway's own) to `key` and its own broker `login`, in place of
    /// whatever the table said of it: a gateway trusts what it published itself (its
    /// broadcasts come back to its own workers' inboxes through the broker), and only that.
    pub fn pin_own(&mut self, host: &str, key: VerifyingKey, login: String) {
        self.hosts
            .insert(host.to_string(), PinnedHost::new(vec![key], Some(login)));
    }

    /// The same table with the hosts' keys only, no broker logins: for another vhost (the
    /// coordinator's), on which each host publishes under another login than on the fleet's.
    pub fn keys_only(&self) -> Trust {
        let hosts = self
            .hosts
            .iter()
            .map(|(host, pinned)| {
                let keys = PinnedHost {
                    keys: pinned.keys.clone(),
                    login: None,
                };
                (host.clone(), keys)
            })
            .collect();
        Trust { hosts }
    }

    /// How many hosts are pinned.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether no host is pinned.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }
}

/// What a delivery carries beside its envelope that proves where it came from.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seal<'a> {
    /// The `sig` header.
    pub sig: Option<&'a str>,
    /// The `keyId` header.
    pub key_id: Option<&'a str>,
    /// The broker login that published it (the AMQP `user_id`, which RabbitMQ checks).
    pub login: Option<&'a str>,
}

/// Where the roster (or this host's own registry) places an entity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// On this host (its own gateway knows it).
    Here,
    /// On the named other host, as its signed heartbeats said.
    There(String),
    /// Nowhere this gateway knows of.
    Unknown,
}

/// How old (and how far ahead) a message may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// How far a sender's clock may run ahead of this one, in ms.
    pub skew_ms: u64,
    /// The oldest a message may be when it arrives, and the longest it may live, in ms.
    pub max_age_ms: u64,
}

/// Why a message off the broker was refused by a check of this module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// It carries no signature.
    Unsigned,
    /// Its envelope names no sending host.
    NoHost,
    /// Its sending host is not pinned here.
    UnpinnedHost(String),
    /// It is signed by a key not pinned for its sending host.
    UnknownKey {
        /// The sending host.
        host: String,
    },
    /// The signature does not match the message.
    BadSignature,
    /// It was published by another broker login than the one pinned for its host.
    WrongLogin {
        /// The sending host.
        host: String,
        /// The login it came by, if the broker said.
        login: Option<String>,
    },
    /// A heartbeat's routing key does not name its sending host, or the entity it speaks for.
    PresenceKey,
    /// A heartbeat speaks for an entity of another host.
    ForeignEntity {
        /// The host it claims the entity is on.
        claimed: String,
    },
    /// `from` is an entity of another host.
    Impostor {
        /// Where it actually is (`this host` for one of this gateway's own).
        placed: String,
    },
    /// `from` is an entity nobody has announced, and the message needs its sender's role.
    UnknownSender,
    /// `ts` is ahead of this clock by more than the skew allowed.
    Future {
        /// By how much, in ms.
        ahead_ms: u64,
    },
    /// `ts` is older than the window.
    Stale {
        /// How old, in ms.
        age_ms: u64,
    },
    /// `expiresAt` has passed.
    Expired,
    /// It would live longer than the window, past the time its id is remembered.
    TooLongLived,
    /// Its id was seen before for the same recipient.
    Replay,
    /// A heartbeat stamped before the last one taken for the same entity: overtaken by it.
    Overtaken,
    /// The sender may not send it (a rule that holds on one host too).
    Forbidden(String),
    /// A genuine lead of another host asks what this host does not grant it (its
    /// `[federation.allow]`, or the ownership rule: a task to another lead's worker).
    NotGranted(String),
    /// An answer about a message this gateway did not send to the answering host.
    NotTheRecipient,
    /// A broadcast's copy in an inbox not bound to its key, or from before its recipient
    /// joined.
    StrayBroadcast,
}

impl Refusal {
    /// Whether it says only that a genuine message came late: too old, past its expiry, or
    /// overtaken by a newer one. For a message whose seal and sender were checked first, as a
    /// heartbeat's are: a heartbeat that sat in a socket through a partition is late, not
    /// forged. (A replay, the same id again, is not lateness.)
    pub fn late(&self) -> bool {
        matches!(
            self,
            Refusal::Stale { .. } | Refusal::Expired | Refusal::Overtaken
        )
    }

    /// The check, as the audit line (`refused: <reason>`) and the log name it.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::NoHost => "no sending host",
            Refusal::UnpinnedHost(_) => "unpinned host",
            Refusal::UnknownKey { .. } => "key not pinned",
            Refusal::BadSignature => "bad signature",
            Refusal::WrongLogin { .. } => "broker login",
            Refusal::PresenceKey => "presence key",
            Refusal::ForeignEntity { .. } => "presence for another host",
            Refusal::Impostor { .. } => "impostor sender",
            Refusal::UnknownSender => "unknown sender",
            Refusal::Future { .. } => "from the future",
            Refusal::Stale { .. } => "stale",
            Refusal::Expired => "expired",
            Refusal::TooLongLived => "lifetime too long",
            Refusal::Replay => "replay",
            Refusal::Overtaken => "overtaken",
            Refusal::Forbidden(_) => "not allowed",
            Refusal::NotGranted(_) => "not granted",
            Refusal::NotTheRecipient => "answer from another host",
            Refusal::StrayBroadcast => "stray broadcast",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unsigned => f.write_str("it carries no signature"),
            Refusal::NoHost => f.write_str("its envelope names no sending host (fromHost)"),
            Refusal::UnpinnedHost(host) => write!(
                f,
                "its sending host {host:?} is not pinned in [federation.trust]"
            ),
            Refusal::UnknownKey { host } => {
                write!(f, "it is signed by a key not pinned for {host:?}")
            }
            Refusal::BadSignature => f.write_str("its signature does not match it"),
            Refusal::WrongLogin { host, login } => write!(
                f,
                "it was published by broker login {login:?}, not the one pinned for {host:?}"
            ),
            Refusal::PresenceKey => f.write_str(
                "the heartbeat's routing key does not name its sending host and the entity it speaks for",
            ),
            Refusal::ForeignEntity { claimed } => {
                write!(f, "the heartbeat speaks for an entity of {claimed:?}")
            }
            Refusal::Impostor { placed } => {
                write!(f, "its sender is an entity of {placed}, not of its sending host")
            }
            Refusal::UnknownSender => f.write_str(
                "its sender is no entity its sending host has announced, and only a known sender may send this",
            ),
            Refusal::Future { ahead_ms } => write!(
                f,
                "it is stamped {ahead_ms} ms ahead of this clock, more than the skew allowed (federation.clock_skew_s)"
            ),
            Refusal::Stale { age_ms } => write!(
                f,
                "it is stamped {age_ms} ms ago, older than the window (federation.max_message_age_s)"
            ),
            Refusal::Expired => f.write_str("it expired"),
            Refusal::TooLongLived => f.write_str(
                "it would live longer than the window (federation.max_message_age_s), past the time its id is remembered",
            ),
            Refusal::Replay => f.write_str("its id was seen before: a replay"),
            Refusal::Overtaken => {
                f.write_str("a newer heartbeat for the same entity was taken already")
            }
            Refusal::Forbidden(why) | Refusal::NotGranted(why) => f.write_str(why),
            Refusal::NotTheRecipient => f.write_str(
                "it answers a message this gateway did not send to its sending host, or not between these two",
            ),
            Refusal::StrayBroadcast => f.write_str(
                "a broadcast for a group its recipient is not in, or from before its recipient joined",
            ),
        }
    }
}

/// Check 1: the signature (over `envelope` and `body`) is valid for a key pinned for the
/// envelope's `fromHost`, and the login is the pinned one when the host has one.
pub fn check_seal(
    trust: &Trust,
    envelope: &Envelope,
    body: &[u8],
    seal: Seal<'_>,
) -> Result<(), Refusal> {
    let Some(sig) = seal.sig else {
        return Err(Refusal::Unsigned);
    };
    let Some(host) = envelope.from_host.as_deref() else {
        return Err(Refusal::NoHost);
    };
    let Some(pinned) = trust.hosts.get(host) else {
        return Err(Refusal::UnpinnedHost(host.to_string()));
    };
    let Some(key) = seal.key_id.and_then(|id| pinned.key(id)) else {
        return Err(Refusal::UnknownKey {
            host: host.to_string(),
        });
    };
    verify(key, envelope, body, sig).map_err(|_| Refusal::BadSignature)?;
    match &pinned.login {
        Some(login) if seal.login != Some(login.as_str()) => Err(Refusal::WrongLogin {
            host: host.to_string(),
            login: seal.login.map(str::to_string),
        }),
        _ => Ok(()),
    }
}

/// The routing-key name of a host's own roster entry.
pub const GATEWAY_ENTRY: &str = "_gateway";

/// Check 2, for a heartbeat published with `routing_key` (`roster.<host>.<who>`): it names
/// the envelope's `fromHost` and the entity the heartbeat speaks for (`entity`, or the
/// host's own entry), and that entity is that host's.
pub fn check_presence_key(
    routing_key: &str,
    envelope: &Envelope,
    entity: Option<&Entity>,
) -> Result<(), Refusal> {
    let host = envelope.from_host.as_deref().ok_or(Refusal::NoHost)?;
    let (key_host, who) = routing_key
        .strip_prefix("roster.")
        .and_then(|rest| rest.rsplit_once('.'))
        .ok_or(Refusal::PresenceKey)?;
    let speaks_for = match entity {
        Some(e) => who == e.gid.to_string() && envelope.from == e.gid,
        None => who == GATEWAY_ENTRY,
    };
    if key_host != host || !speaks_for {
        return Err(Refusal::PresenceKey);
    }
    match entity {
        Some(e) if e.host != host => Err(Refusal::ForeignEntity {
            claimed: e.host.clone(),
        }),
        _ => Ok(()),
    }
}

/// Whether a message of `kind` for a recipient that is pane-bound (`to_pane`: its text is
/// typed in) or not needs its sender's role, so that an unknown sender is refused: a task, an
/// ask or a broadcast typed into a pane. What is only held for a lead needs none (any pinned
/// host could announce a lead of its own).
pub fn needs_known_sender(kind: Kind, to_pane: bool) -> bool {
    match kind {
        Kind::Broadcast | Kind::Spawn => true,
        Kind::Send | Kind::Ask => to_pane,
        _ => false,
    }
}

/// Check 3: `from` (placed at `place`) may speak for the envelope's `fromHost`, which is
/// `this_host` for a message this gateway published itself; `to_pane` as for
/// [`needs_known_sender`].
pub fn check_sender(
    envelope: &Envelope,
    place: &Place,
    this_host: &str,
    to_pane: bool,
) -> Result<(), Refusal> {
    let host = envelope.from_host.as_deref().ok_or(Refusal::NoHost)?;
    let placed = match place {
        Place::Here => this_host,
        Place::There(other) => other.as_str(),
        Place::Unknown if needs_known_sender(envelope.kind, to_pane) => {
            return Err(Refusal::UnknownSender);
        }
        Place::Unknown => return Ok(()),
    };
    if placed == host {
        Ok(())
    } else if placed == this_host {
        Err(Refusal::Impostor {
            placed: "this host".into(),
        })
    } else {
        Err(Refusal::Impostor {
            placed: format!("{placed:?}"),
        })
    }
}

/// For a broadcast's copy in `owner`'s inbox (check 6's part that needs the recipient): its
/// key is one `owner` is bound to (`broadcast.all`, or one of its groups), and it was sent
/// after `owner` joined (`joined_ms`, allowing `skew_ms`): a copy from before could only be a
/// replay into a newer inbox.
pub fn check_broadcast_copy(
    envelope: &Envelope,
    owner: &Entity,
    joined_ms: Option<u64>,
    skew_ms: u64,
) -> Result<(), Refusal> {
    let bound = envelope.to == "broadcast.all"
        || envelope
            .to
            .strip_prefix("broadcast.")
            .is_some_and(|group| owner.groups.iter().any(|g| g == group));
    let after = joined_ms.is_none_or(|joined| envelope.ts_ms.saturating_add(skew_ms) >= joined);
    if bound && after {
        Ok(())
    } else {
        Err(Refusal::StrayBroadcast)
    }
}

/// Check 4: the envelope's times against `now_ms` (Unix ms) and `window`.
pub fn check_time(envelope: &Envelope, now_ms: u64, window: Window) -> Result<(), Refusal> {
    let ts = envelope.ts_ms;
    if ts > now_ms.saturating_add(window.skew_ms) {
        return Err(Refusal::Future {
            ahead_ms: ts - now_ms,
        });
    }
    let age_ms = now_ms.saturating_sub(ts);
    if age_ms > window.max_age_ms {
        return Err(Refusal::Stale { age_ms });
    }
    if envelope.expired(now_ms) {
        return Err(Refusal::Expired);
    }
    if envelope.expires_at_ms.saturating_sub(ts) > window.max_age_ms {
        return Err(Refusal::TooLongLived);
    }
    Ok(())
}

/// Check 5: a message id `seen` before for the same recipient is a replay, unless the broker
/// flagged the delivery `redelivered` (it came again because it was not settled: the store's
/// dedup takes care of it).
pub fn check_replay(seen: bool, redelivered: bool) -> Result<(), Refusal> {
    if seen && !redelivered {
        Err(Refusal::Replay)
    } else {
        Ok(())
    }
}

/// What the authority rules need to know of a message.
#[derive(Clone, Copy, Debug)]
pub struct Authority<'a> {
    /// The sender, as this host or the roster knows it.
    pub sender: Option<&'a Entity>,
    /// The recipient here (none for a broadcast's key).
    pub recipient: Option<&'a Entity>,
    /// For an answer: whether the message it answers was sent by this gateway to the sending
    /// host. For an ask (or a send about a task): whether it is about a task its recipient
    /// sent to its sender.
    pub answers_own: bool,
}

/// Check 6: the rules that hold on one host, across hosts.
pub fn check_authority(kind: Kind, facts: Authority<'_>) -> Result<(), Refusal> {
    match kind {
        // A worker asks the lead whose task it works on, wherever that lead lives; and its
        // gateway tells that lead of it (a stall) the same way.
        Kind::Ask | Kind::Send if facts.answers_own => Ok(()),
        Kind::Send | Kind::Ask => match (facts.sender, facts.recipient) {
            (Some(sender), Some(recipient)) => {
                authz::check_send(sender, recipient).map_err(|e| Refusal::Forbidden(e.message))
            }
            // Held for a lead: nothing is typed, and the sender's host vouches for it.
            (None, Some(recipient)) if !recipient.role.is_pane_bound() => Ok(()),
            _ => Err(Refusal::UnknownSender),
        },
        Kind::Broadcast | Kind::Spawn => match facts.sender {
            Some(sender) if sender.role == Role::Lead => Ok(()),
            Some(sender) => Err(Refusal::Forbidden(format!(
                "{} '{}' may not {}: only a lead may",
                sender.role,
                sender.name,
                if kind == Kind::Spawn {
                    "spawn or stop workers"
                } else {
                    "broadcast"
                }
            ))),
            None => Err(Refusal::UnknownSender),
        },
        kind if is_answer(kind) => {
            if facts.answers_own {
                Ok(())
            } else {
                Err(Refusal::NotTheRecipient)
            }
        }
        _ => Ok(()),
    }
}

/// Whether a message of `kind` answers another (a reply or a notice about it), and so is taken
/// only from the host the answered message went to.
pub fn is_answer(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Reply
            | Kind::Answer
            | Kind::Failed
            | Kind::Injected
            | Kind::TooLate
            | Kind::NoWaiter
            | Kind::Abandoned
    )
}

/// Whether `envelope`, an answer, answers a message this gateway sent to its sending host,
/// between the same two entities: `exact` is the sender and recipient recorded for its
/// `inReplyTo` on that host (the recipient is none for a broadcast's own id); failing that,
/// a broadcast among `broadcasts` (id, sender) whose copy for `from` it answers.
pub fn answers_own(
    envelope: &Envelope,
    exact: Option<(Gid, Option<Gid>)>,
    broadcasts: &[(MsgId, Gid)],
) -> bool {
    let Some(answered) = envelope.in_reply_to else {
        return false;
    };
    let Ok(to) = envelope.to.parse::<Gid>() else {
        return false;
    };
    match exact {
        Some((sender, recipient)) => sender == to && recipient.is_none_or(|r| r == envelope.from),
        None => broadcasts.iter().any(|(id, sender)| {
            *sender == to && id.derived(&envelope.from.to_string()) == answered
        }),
    }
}

/// For an answer: the message it answers and the host it must have gone to (its sender's).
/// `None` for a message that answers nothing, or an answer that names no message or no host
/// (which [`check_authority`] then refuses).
pub fn answered(envelope: &Envelope) -> Option<(MsgId, String)> {
    if !is_answer(envelope.kind) {
        return None;
    }
    Some((envelope.in_reply_to?, envelope.from_host.clone()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::sign;
    use ed25519_dalek::SigningKey;

    const NOW: u64 = 1_764_547_200_000;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn envelope(kind: Kind, host: &str) -> Envelope {
        Envelope {
            from_name: Some("alice".into()),
            ..crate::envelope::sample(kind, host, &Gid::mint().to_string(), NOW)
        }
    }

    fn trust(login: Option<&str>) -> Trust {
        let mut hosts = BTreeMap::new();
        hosts.insert(
            "hostb".to_string(),
            PinnedHost::new(
                vec![key(1).verifying_key(), key(2).verifying_key()],
                login.map(str::to_string),
            ),
        );
        Trust::new(hosts)
    }

    fn sealed<'a>(sig: &'a str, key_id: &'a str, login: Option<&'a str>) -> Seal<'a> {
        Seal {
            sig: Some(sig),
            key_id: Some(key_id),
            login,
        }
    }

    #[test]
    fn a_message_signed_by_either_pinned_key_of_its_host_passes() {
        let trust = trust(None);
        let sent = envelope(Kind::Send, "hostb");
        for seed in [1, 2] {
            let sig = sign(&key(seed), &sent, b"task");
            let id = fingerprint(&key(seed).verifying_key());
            assert_eq!(
                check_seal(&trust, &sent, b"task", sealed(&sig, &id, None)),
                Ok(())
            );
        }
    }

    #[test]
    fn each_forgery_of_the_seal_is_refused_with_its_own_reason() {
        let trust = trust(Some("gw-hostb"));
        let sent = envelope(Kind::Send, "hostb");
        let sig = sign(&key(1), &sent, b"task");
        let id = fingerprint(&key(1).verifying_key());
        let good = sealed(&sig, &id, Some("gw-hostb"));
        assert_eq!(check_seal(&trust, &sent, b"task", good), Ok(()));
        let refused = |envelope: &Envelope, body: &[u8], seal| {
            check_seal(&trust, envelope, body, seal).unwrap_err()
        };
        assert_eq!(refused(&sent, b"task", Seal::default()), Refusal::Unsigned);
        assert_eq!(
            refused(&sent, b"tasK", good),
            Refusal::BadSignature,
            "a tampered body"
        );
        let mut tampered = sent.clone();
        tampered.from_name = Some("mallory".into());
        assert_eq!(refused(&tampered, b"task", good), Refusal::BadSignature);
        let mut elsewhere = sent.clone();
        elsewhere.from_host = Some("hostz".into());
        assert_eq!(
            refused(&elsewhere, b"task", good),
            Refusal::UnpinnedHost("hostz".into())
        );
        let mut nowhere = sent.clone();
        nowhere.from_host = None;
        assert_eq!(refused(&nowhere, b"task", good), Refusal::NoHost);
        // Signed by a key pinned for nobody, naming it or a pinned one.
        let other = sign(&key(9), &sent, b"task");
        let other_id = fingerprint(&key(9).verifying_key());
        let unknown = Refusal::UnknownKey {
            host: "hostb".into(),
        };
        assert_eq!(
            refused(&sent, b"task", sealed(&other, &other_id, Some("gw-hostb"))),
            unknown
        );
        assert_eq!(
            refused(&sent, b"task", sealed(&other, &id, Some("gw-hostb"))),
            Refusal::BadSignature
        );
        assert_eq!(
            refused(&sent, b"task", sealed(&sig, &id, Some("gw-hostc"))),
            Refusal::WrongLogin {
                host: "hostb".into(),
                login: Some("gw-hostc".into())
            }
        );
        assert!(matches!(
            refused(&sent, b"task", sealed(&sig, &id, None)),
            Refusal::WrongLogin { login: None, .. }
        ));
    }

    #[test]
    fn keys_only_drops_the_logins_and_keeps_the_keys() {
        let trust = trust(Some("gw-hostb")).keys_only();
        let sent = envelope(Kind::Send, "hostb");
        let sig = sign(&key(1), &sent, b"task");
        let id = fingerprint(&key(1).verifying_key());
        assert_eq!(
            check_seal(&trust, &sent, b"task", sealed(&sig, &id, Some("coord-b"))),
            Ok(())
        );
        let other = sign(&key(9), &sent, b"task");
        let other_id = fingerprint(&key(9).verifying_key());
        assert!(check_seal(&trust, &sent, b"task", sealed(&other, &other_id, None)).is_err());
    }

    #[test]
    fn hostile_seal_headers_are_refused_and_shown_inert() {
        let trust = trust(None);
        let sent = envelope(Kind::Send, "hostb");
        let id = fingerprint(&key(1).verifying_key());
        let huge = "A".repeat(100_000);
        for garbage in ["", "not base64!", "\u{1b}[31m", huge.as_str()] {
            assert_eq!(
                check_seal(&trust, &sent, b"x", sealed(garbage, &id, None)),
                Err(Refusal::BadSignature),
                "{garbage:.20}"
            );
        }
        let sig = sign(&key(1), &sent, b"x");
        for key_id in ["", "\u{1b}]0;pwned\u{7}", huge.as_str()] {
            assert_eq!(
                check_seal(&trust, &sent, b"x", sealed(&sig, key_id, None)),
                Err(Refusal::UnknownKey {
                    host: "hostb".into()
                })
            );
        }
        // A host name full of control characters is named escaped, never raw.
        let mut forged = sent.clone();
        forged.from_host = Some("evil\u{1b}[2J\nhost".into());
        let refused = check_seal(&trust, &forged, b"x", sealed(&sig, &id, None)).unwrap_err();
        let shown = refused.to_string();
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\n'),
            "{shown}"
        );
        let login = Refusal::WrongLogin {
            host: "hostb".into(),
            login: Some("\u{1b}[31mroot".into()),
        };
        assert!(!login.to_string().contains('\u{1b}'), "{login}");
    }

    #[test]
    fn a_gateway_trusts_its_own_key_beside_the_table() {
        let mut trust = Trust::default();
        assert!(trust.is_empty());
        trust.pin_own("hosta", key(3).verifying_key(), "gw-a".into());
        trust.pin_own("hosta", key(3).verifying_key(), "gw-a".into());
        assert_eq!(trust.len(), 1);
        let sent = envelope(Kind::Broadcast, "hosta");
        let sig = sign(&key(3), &sent, b"all");
        let id = fingerprint(&key(3).verifying_key());
        assert_eq!(
            check_seal(&trust, &sent, b"all", sealed(&sig, &id, Some("gw-a"))),
            Ok(())
        );
        // Its own, published by another login: refused.
        assert!(matches!(
            check_seal(&trust, &sent, b"all", sealed(&sig, &id, Some("gw-b"))),
            Err(Refusal::WrongLogin { .. })
        ));
    }

    #[test]
    fn a_heartbeat_speaks_only_for_its_own_host_and_entity() {
        let mut sent = envelope(Kind::Presence, "hostb");
        let entity = Entity {
            gid: sent.from,
            name: "w".into(),
            host: "hostb".into(),
            role: Role::Worker,
            profile: None,
            sandbox: None,
            profile_role: None,
            groups: vec![],
            parent: None,
        };
        let key = format!("roster.hostb.{}", entity.gid);
        assert_eq!(check_presence_key(&key, &sent, Some(&entity)), Ok(()));
        let other_host = format!("roster.hostc.{}", entity.gid);
        assert_eq!(
            check_presence_key(&other_host, &sent, Some(&entity)),
            Err(Refusal::PresenceKey)
        );
        assert_eq!(
            check_presence_key("roster.hostb._gateway", &sent, Some(&entity)),
            Err(Refusal::PresenceKey)
        );
        assert_eq!(
            check_presence_key("roster.hostb._gateway", &sent, None),
            Ok(())
        );
        assert_eq!(
            check_presence_key("nonsense", &sent, None),
            Err(Refusal::PresenceKey)
        );
        let foreign = Entity {
            host: "hostc".into(),
            ..entity.clone()
        };
        assert_eq!(
            check_presence_key(&key, &sent, Some(&foreign)),
            Err(Refusal::ForeignEntity {
                claimed: "hostc".into()
            })
        );
        // `from` must be the entity itself.
        sent.from = Gid::mint();
        assert_eq!(
            check_presence_key(&key, &sent, Some(&entity)),
            Err(Refusal::PresenceKey)
        );
    }

    #[test]
    fn a_sender_placed_on_another_host_is_an_impostor_and_an_unknown_one_sends_no_task() {
        let send = envelope(Kind::Send, "hostb");
        let at = |host: &str| Place::There(host.into());
        assert_eq!(check_sender(&send, &at("hostb"), "hosta", true), Ok(()));
        assert_eq!(
            check_sender(&send, &at("hostc"), "hosta", true),
            Err(Refusal::Impostor {
                placed: "\"hostc\"".into()
            })
        );
        assert_eq!(
            check_sender(&send, &Place::Here, "hosta", true),
            Err(Refusal::Impostor {
                placed: "this host".into()
            })
        );
        assert_eq!(
            check_sender(&send, &Place::Unknown, "hosta", true),
            Err(Refusal::UnknownSender)
        );
        // Only held for a lead: its host vouches.
        assert_eq!(check_sender(&send, &Place::Unknown, "hosta", false), Ok(()));
        // An answer may come from an entity gone since (its host vouches, the authority rule
        // checks what it answers).
        let reply = envelope(Kind::Reply, "hostb");
        assert_eq!(check_sender(&reply, &Place::Unknown, "hosta", true), Ok(()));
        assert!(check_sender(&reply, &at("hostc"), "hosta", true).is_err());
        // This gateway's own broadcast, back through the broker.
        let own = envelope(Kind::Broadcast, "hosta");
        assert_eq!(check_sender(&own, &Place::Here, "hosta", true), Ok(()));
    }

    #[test]
    fn times_outside_the_window_are_refused() {
        let window = Window {
            skew_ms: 5_000,
            max_age_ms: 600_000,
        };
        let mut sent = envelope(Kind::Send, "hostb");
        assert_eq!(check_time(&sent, NOW, window), Ok(()));
        sent.ts_ms = NOW + 5_000;
        assert_eq!(check_time(&sent, NOW, window), Ok(()), "within the skew");
        sent.ts_ms = NOW + 5_001;
        assert_eq!(
            check_time(&sent, NOW, window),
            Err(Refusal::Future { ahead_ms: 5_001 })
        );
        sent.ts_ms = NOW - 600_001;
        assert_eq!(
            check_time(&sent, NOW, window),
            Err(Refusal::Stale { age_ms: 600_001 })
        );
        sent.ts_ms = NOW - 1_000;
        sent.expires_at_ms = NOW;
        assert_eq!(check_time(&sent, NOW, window), Err(Refusal::Expired));
        sent.expires_at_ms = NOW - 1_000 + 600_001;
        assert_eq!(check_time(&sent, NOW, window), Err(Refusal::TooLongLived));
    }

    #[test]
    fn only_old_expired_or_repeated_is_late_rather_than_untrusted() {
        let late = [
            Refusal::Stale { age_ms: 1 },
            Refusal::Expired,
            Refusal::Overtaken,
        ];
        assert!(late.iter().all(Refusal::late));
        let untrusted = [
            Refusal::Replay,
            Refusal::Future { ahead_ms: 1 },
            Refusal::TooLongLived,
            Refusal::BadSignature,
            Refusal::Unsigned,
            Refusal::PresenceKey,
            Refusal::UnknownKey { host: "h".into() },
            Refusal::ForeignEntity {
                claimed: "h".into(),
            },
        ];
        assert!(!untrusted.iter().any(Refusal::late));
    }

    #[test]
    fn a_broadcast_copy_is_taken_by_an_inbox_bound_to_its_key_after_its_recipient_joined() {
        let worker = Entity {
            groups: vec!["core".into()],
            ..entity(Role::Worker, None)
        };
        let mut copy = envelope(Kind::Broadcast, "hostb");
        for (to, bound) in [
            ("broadcast.all", true),
            ("broadcast.core", true),
            ("broadcast.web", false),
            ("broadcast.", false),
        ] {
            copy.to = to.into();
            assert_eq!(
                check_broadcast_copy(&copy, &worker, Some(NOW - 1_000), 0).is_ok(),
                bound,
                "{to}"
            );
        }
        copy.to = "broadcast.all".into();
        // Sent before its recipient joined: a replay into a newer inbox, unless within the skew.
        let joined = copy.ts_ms + 5_000;
        assert_eq!(
            check_broadcast_copy(&copy, &worker, Some(joined), 1_000),
            Err(Refusal::StrayBroadcast)
        );
        assert_eq!(
            check_broadcast_copy(&copy, &worker, Some(joined), 5_000),
            Ok(())
        );
    }

    #[test]
    fn a_seen_id_is_a_replay_unless_the_broker_delivers_it_again() {
        assert_eq!(check_replay(false, false), Ok(()));
        assert_eq!(check_replay(true, false), Err(Refusal::Replay));
        assert_eq!(check_replay(true, true), Ok(()));
    }

    fn entity(role: Role, parent: Option<Gid>) -> Entity {
        Entity {
            gid: Gid::mint(),
            name: "e".into(),
            host: "hostb".into(),
            role,
            profile: None,
            sandbox: None,
            profile_role: None,
            groups: vec![],
            parent,
        }
    }

    #[test]
    fn the_local_authority_rules_hold_across_hosts() {
        let lead = entity(Role::Lead, None);
        let worker = entity(Role::Worker, Some(lead.gid));
        let stranger = entity(Role::Worker, None);
        let facts = |sender, recipient| Authority {
            sender,
            recipient,
            answers_own: false,
        };
        assert_eq!(
            check_authority(Kind::Send, facts(Some(&lead), Some(&worker))),
            Ok(())
        );
        assert!(matches!(
            check_authority(Kind::Send, facts(Some(&stranger), Some(&worker))),
            Err(Refusal::Forbidden(_))
        ));
        // A worker sends to its own lead.
        assert_eq!(
            check_authority(Kind::Send, facts(Some(&worker), Some(&lead))),
            Ok(())
        );
        assert_eq!(
            check_authority(Kind::Send, facts(None, Some(&worker))),
            Err(Refusal::UnknownSender)
        );
        assert_eq!(
            check_authority(Kind::Send, facts(None, Some(&lead))),
            Ok(()),
            "held for a lead"
        );
        assert_eq!(
            check_authority(Kind::Broadcast, facts(Some(&lead), None)),
            Ok(())
        );
        assert!(matches!(
            check_authority(Kind::Broadcast, facts(Some(&worker), None)),
            Err(Refusal::Forbidden(why)) if why.contains("only a lead")
        ));
        // A spawn or stop on another host: from a lead the roster knows, only.
        assert_eq!(
            check_authority(Kind::Spawn, facts(Some(&lead), None)),
            Ok(())
        );
        assert!(matches!(
            check_authority(Kind::Spawn, facts(Some(&worker), None)),
            Err(Refusal::Forbidden(why)) if why.contains("may not spawn or stop workers")
        ));
        assert_eq!(
            check_authority(Kind::Spawn, facts(None, None)),
            Err(Refusal::UnknownSender)
        );
        assert!(needs_known_sender(Kind::Spawn, false));
        // An ask about a task the lead sent to the worker: taken whoever spawned the worker.
        let about_own_task = Authority {
            answers_own: true,
            ..facts(Some(&stranger), Some(&lead))
        };
        assert_eq!(check_authority(Kind::Ask, about_own_task), Ok(()));
        assert!(matches!(
            check_authority(Kind::Ask, facts(Some(&stranger), Some(&lead))),
            Err(Refusal::Forbidden(_))
        ));
        // So is a notice about it (a stall), and only that: a send about nothing of the lead's
        // is a worker's send to a lead not its own.
        assert_eq!(check_authority(Kind::Send, about_own_task), Ok(()));
        assert!(matches!(
            check_authority(Kind::Send, facts(Some(&stranger), Some(&lead))),
            Err(Refusal::Forbidden(_))
        ));
        for kind in [Kind::Reply, Kind::Failed, Kind::Injected] {
            assert_eq!(
                check_authority(kind, facts(Some(&worker), Some(&lead))),
                Err(Refusal::NotTheRecipient)
            );
            let own = Authority {
                answers_own: true,
                ..facts(None, Some(&lead))
            };
            assert_eq!(check_authority(kind, own), Ok(()));
        }
    }

    #[test]
    fn an_answer_names_what_it_answers_and_where_that_went() {
        let mut reply = envelope(Kind::Reply, "hostb");
        assert_eq!(answered(&reply), None, "no inReplyTo: nothing to look up");
        let task = MsgId::mint();
        reply.in_reply_to = Some(task);
        assert_eq!(answered(&reply), Some((task, "hostb".to_string())));
        let mut send = envelope(Kind::Send, "hostb");
        send.in_reply_to = Some(task);
        assert_eq!(answered(&send), None, "a task answers nothing");
        for kind in [
            Kind::Failed,
            Kind::Injected,
            Kind::Abandoned,
            Kind::NoWaiter,
        ] {
            assert!(is_answer(kind), "{kind}");
        }
        assert!(!is_answer(Kind::Broadcast) && !is_answer(Kind::Presence));
    }

    #[test]
    fn an_answer_is_taken_only_between_the_two_its_message_went_between() {
        let (lead, worker) = (Gid::mint(), Gid::mint());
        let task = MsgId::mint();
        let reply = Envelope {
            from: worker,
            to: lead.to_string(),
            in_reply_to: Some(task),
            ..envelope(Kind::Reply, "hostb")
        };
        assert!(answers_own(&reply, Some((lead, Some(worker))), &[]));
        assert!(
            !answers_own(&reply, Some((Gid::mint(), Some(worker))), &[]),
            "to another lead"
        );
        assert!(
            !answers_own(&reply, Some((lead, Some(Gid::mint()))), &[]),
            "from another"
        );
        assert!(!answers_own(&reply, None, &[]));
        // A broadcast's own id names no recipient; a copy's answer is matched by its id.
        assert!(answers_own(&reply, Some((lead, None)), &[]));
        let broadcast = MsgId::mint();
        let copy = Envelope {
            in_reply_to: Some(broadcast.derived(&worker.to_string())),
            ..reply.clone()
        };
        assert!(answers_own(
            &copy,
            None,
            &[(MsgId::mint(), lead), (broadcast, lead)]
        ));
        assert!(
            !answers_own(&copy, None, &[(broadcast, Gid::mint())]),
            "another's broadcast"
        );
        let stranger = Envelope {
            from: Gid::mint(),
            ..copy.clone()
        };
        assert!(
            !answers_own(&stranger, None, &[(broadcast, lead)]),
            "another worker's copy"
        );
    }

    #[test]
    fn every_refusal_names_its_check_and_says_why() {
        let all = [
            Refusal::Unsigned,
            Refusal::NoHost,
            Refusal::UnpinnedHost("h".into()),
            Refusal::UnknownKey { host: "h".into() },
            Refusal::BadSignature,
            Refusal::WrongLogin {
                host: "h".into(),
                login: None,
            },
            Refusal::PresenceKey,
            Refusal::ForeignEntity {
                claimed: "h".into(),
            },
            Refusal::Impostor { placed: "h".into() },
            Refusal::UnknownSender,
            Refusal::Future { ahead_ms: 1 },
            Refusal::Stale { age_ms: 1 },
            Refusal::Expired,
            Refusal::TooLongLived,
            Refusal::Replay,
            Refusal::Overtaken,
            Refusal::Forbidden("x".into()),
            Refusal::NotTheRecipient,
            Refusal::StrayBroadcast,
        ];
        let reasons: std::collections::HashSet<&str> = all.iter().map(Refusal::reason).collect();
        assert_eq!(reasons.len(), all.len(), "one reason per check");
        assert!(all.iter().all(|r| !r.to_string().is_empty()));
    }
}
