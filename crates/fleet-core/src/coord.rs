//! Lead-to-lead coordination (spec 10 "Lead-to-lead"): the rules on coordination ids and on a
//! coordination message taken off a lead's mailbox. Pure.
//!
//! A coordination id addresses one lead's durable mailbox on the coordinator's vhost. It comes
//! from config and from tool calls and other hosts' messages, so it is hostile input until
//! [`validate_coord_id`] passed it. A coordination message carries coordination only: it is
//! held for its lead's pull, never typed into a pane, never a task.

use crate::envelope::Envelope;
use crate::error::FleetError;
use crate::message::Kind;
use crate::trust::Refusal;

/// The longest coordination id: a lead's name and a host id (64 each) joined by `@`, the
/// default shape.
pub const MAX_COORD_ID_LEN: usize = 129;

/// Checks that `id` (the key or parameter `what`) can be a coordination id: 1 to
/// [`MAX_COORD_ID_LEN`] ASCII letters, digits, `-`, `_`, `.` or `@`, starting with a letter or
/// digit. The error names `what` and shows the id only when it is short and printable.
pub fn validate_coord_id(what: &str, id: &str) -> Result<(), FleetError> {
    let chars_ok = id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
    let start_ok = id.starts_with(|c: char| c.is_ascii_alphanumeric());
    if chars_ok && start_ok && id.len() <= MAX_COORD_ID_LEN {
        return Ok(());
    }
    let shown = if chars_ok && id.len() <= MAX_COORD_ID_LEN {
        format!(" '{id}'")
    } else {
        String::new()
    };
    Err(FleetError::invalid(format!(
        "{what}{shown} is not a valid coordination id: use 1-{MAX_COORD_ID_LEN} letters, digits, '-', '_', '.' or '@', starting with a letter or digit"
    )))
}

/// The coordination id of lead `lead` on host `host` when config gives it none.
pub fn default_coord_id(lead: &str, host: &str) -> String {
    format!("{lead}@{host}")
}

/// Checks a coordination message taken off the mailbox of coordination id `owner`, after its
/// seal and times passed: a `SEND` addressed to `owner`, naming its sender's coordination id
/// (`fromName`) validly. Returns that id.
pub fn check_coordination<'a>(envelope: &'a Envelope, owner: &str) -> Result<&'a str, Refusal> {
    if envelope.kind != Kind::Send {
        return Err(Refusal::Forbidden(format!(
            "a {} on a coordination mailbox: only coordination messages (SEND) go there",
            envelope.kind
        )));
    }
    if envelope.to != owner {
        return Err(Refusal::Forbidden(
            "it is addressed to another coordination id than the mailbox it is in".into(),
        ));
    }
    if envelope.turn_id.is_some() || envelope.in_reply_to.is_some() || envelope.spawn_id.is_some() {
        return Err(Refusal::Forbidden(
            "a coordination message carries no turn, answers nothing and spawns nothing".into(),
        ));
    }
    match envelope.from_name.as_deref() {
        Some(from) if validate_coord_id("fromName", from).is_ok() => Ok(from),
        _ => Err(Refusal::Forbidden(
            "it names no valid coordination id of its sender (fromName)".into(),
        )),
    }
}

/// Checks the sender's coordination id `from` that a message signed by `from_host` claims: one
/// of this gateway's own leads' ids (`local`) is claimed by this host (`here`) only. Any other
/// id is what its signing host says of its lead: nothing here can check it further.
pub fn check_claim(from: &str, from_host: &str, here: &str, local: bool) -> Result<(), Refusal> {
    if local && from_host != here {
        return Err(Refusal::Impostor {
            placed: format!("this host (coordination id '{from}')"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use crate::ids::MsgId;

    #[test]
    fn coord_ids_are_short_and_plain() {
        for good in ["alice@laptop", "a", "bob.b-2_x@host.lan", &"x".repeat(129)] {
            assert!(validate_coord_id("coord_id", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "@alice",
            "-a",
            ".a",
            "a b",
            "a/b",
            "a\nb",
            "ä@host",
            "a#b",
            &"x".repeat(130),
        ] {
            let err = validate_coord_id("leads.alice.coord_id", bad).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidParams);
            assert!(
                err.message.starts_with("leads.alice.coord_id"),
                "{}",
                err.message
            );
        }
        // What cannot be shown safely is not echoed.
        let err = validate_coord_id("coord_id", "a\u{1b}[2J").unwrap_err();
        assert!(!err.message.contains('\u{1b}'), "{}", err.message);
        let err = validate_coord_id("coord_id", "@x").unwrap_err();
        assert!(err.message.contains("'@x'"), "{}", err.message);
    }

    #[test]
    fn the_default_is_lead_at_host_and_always_valid() {
        let id = default_coord_id(&"l".repeat(64), &"h".repeat(64));
        assert_eq!(id.len(), MAX_COORD_ID_LEN);
        assert!(validate_coord_id("coord_id", &id).is_ok());
        assert_eq!(default_coord_id("alice", "laptop"), "alice@laptop");
    }

    fn coordination(to: &str, from: Option<&str>) -> Envelope {
        Envelope {
            from_name: from.map(str::to_string),
            ..crate::envelope::sample(Kind::Send, "hosta", to, 10_000)
        }
    }

    #[test]
    fn a_coordination_message_is_a_send_to_the_mailbox_owner_from_a_coord_id() {
        let ok = coordination("bob@hostb", Some("alice@hosta"));
        assert_eq!(check_coordination(&ok, "bob@hostb"), Ok("alice@hosta"));
        assert!(check_coordination(&ok, "carol@hostc").is_err());
        assert!(check_coordination(&coordination("bob@hostb", None), "bob@hostb").is_err());
        assert!(check_coordination(&coordination("bob@hostb", Some("@bad")), "bob@hostb").is_err());
        for kind in [Kind::Reply, Kind::Broadcast, Kind::Ask, Kind::Spawn] {
            let other = Envelope { kind, ..ok.clone() };
            assert!(check_coordination(&other, "bob@hostb").is_err(), "{kind}");
        }
        let answering = Envelope {
            in_reply_to: Some(MsgId::mint()),
            ..ok.clone()
        };
        assert!(check_coordination(&answering, "bob@hostb").is_err());
        let turned = Envelope {
            turn_id: Some("t".into()),
            ..ok
        };
        assert!(check_coordination(&turned, "bob@hostb").is_err());
    }

    #[test]
    fn a_local_leads_id_is_claimed_by_this_host_only() {
        assert!(check_claim("bob@hostb", "hostb", "hostb", true).is_ok());
        assert!(matches!(
            check_claim("bob@hostb", "hosta", "hostb", true),
            Err(Refusal::Impostor { .. })
        ));
        assert!(check_claim("alice@hosta", "hosta", "hostb", false).is_ok());
        // Another host's id is that host's word.
        assert!(check_claim("alice@hostz", "hosta", "hostb", false).is_ok());
    }
}
