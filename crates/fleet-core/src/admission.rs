//! Admission of a message off the broker: the checks a delivery passes before the gateway acts
//! on it, which messages are simply held for their recipient, and the one table of how a
//! handled delivery is settled with the broker. Pure: the clock and the caps come in as values.
//!
//! Every delivery is hostile until [`admit`] lets it through: its envelope must decode, name
//! this inbox (or, for a broadcast, the key it came by), be unexpired, within the size cap, and
//! its body text.

use crate::envelope::{Envelope, EnvelopeError};
use crate::message::Kind;

/// How a delivery is settled with the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// Taken: the broker forgets it.
    Ack,
    /// Refused for good: it goes to the dead letters.
    DeadLetter,
    /// Not taken now: back to its queue, to come again.
    Requeue,
}

/// What the gateway made of a delivery off an inbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// It broke a rule (refused at admission, a control character in a brief, a kind the
    /// inbox does not take, over its recipient's cap).
    Refused,
    /// Stored for its recipient (the pull path: at least once).
    Held,
    /// Could not be stored now (the store failed): the broker keeps it.
    NotStored,
    /// A brief taken for a worker free to take it, before it goes near the pane (the forward
    /// path: at most once).
    Taken,
    /// A receipt or a heartbeat noted, or a control request carried out (or answered with
    /// why not), or its answer handed to the call awaiting it.
    Noted,
    /// Read and let go: a dead letter nobody is to be told of (`fleet.dlq` keeps its copy).
    Dropped,
}

impl Handled {
    /// How the broker is told: the one place this is decided.
    pub fn settlement(self) -> Settlement {
        match self {
            Handled::Held | Handled::Taken | Handled::Noted | Handled::Dropped => Settlement::Ack,
            Handled::Refused => Settlement::DeadLetter,
            Handled::NotStored => Settlement::Requeue,
        }
    }
}

/// Why an envelope that decoded was refused at admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// It names another recipient than the inbox it came off.
    WrongRecipient,
    /// It expired before it was delivered.
    Expired,
    /// Its body is over the cap this gateway takes.
    TooLarge {
        /// Its size in bytes.
        size: usize,
        /// The cap in bytes.
        limit: usize,
    },
    /// Its body is not UTF-8.
    NotText,
}

/// What [`admit`] made of a delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Let through: its envelope and its body as text.
    Admitted {
        /// The envelope.
        envelope: Envelope,
        /// The body.
        body: String,
    },
    /// Its headers are no envelope this gateway reads (malformed, or of a newer version).
    Malformed(EnvelopeError),
    /// An envelope that breaks a rule of this gateway.
    Refused {
        /// The envelope.
        envelope: Envelope,
        /// The rule.
        why: Refusal,
    },
}

/// A delivery as it came off `owner`'s inbox.
#[derive(Clone, Copy, Debug)]
pub struct Arrival<'a> {
    /// The address of the queue it came off: the gid of the entity whose inbox it is, or the
    /// coordination id whose mailbox.
    pub owner: &'a str,
    /// The routing key it was published with.
    pub routing_key: &'a str,
    /// Its body.
    pub body: &'a [u8],
}

/// Checks a delivery at `now_ms` (Unix ms) against a body cap of `max_bytes`, in this order:
/// envelope, recipient, expiry, size, text.
pub fn admit(
    arrival: Arrival<'_>,
    decoded: Result<Envelope, EnvelopeError>,
    now_ms: u64,
    max_bytes: usize,
) -> Admission {
    let envelope = match decoded {
        Ok(envelope) => envelope,
        Err(e) => return Admission::Malformed(e),
    };
    let refused = |envelope, why| Admission::Refused { envelope, why };
    let to_ok = envelope.to == arrival.owner
        || (envelope.kind == Kind::Broadcast
            && envelope.to == arrival.routing_key
            && envelope.to.starts_with("broadcast."));
    if !to_ok {
        return refused(envelope, Refusal::WrongRecipient);
    }
    if envelope.expired(now_ms) {
        return refused(envelope, Refusal::Expired);
    }
    let size = arrival.body.len();
    if size > max_bytes {
        let why = Refusal::TooLarge {
            size,
            limit: max_bytes,
        };
        return refused(envelope, why);
    }
    match String::from_utf8(arrival.body.to_vec()) {
        Ok(body) => Admission::Admitted { envelope, body },
        Err(_) => refused(envelope, Refusal::NotText),
    }
}

/// Whether a message of `kind` is simply held for its recipient (the pull path): anything but
/// a brief for a worker (`to_pane`: typed in), a receipt, or a kind no inbox takes.
pub fn held_kind(kind: Kind, to_pane: bool) -> bool {
    match kind {
        Kind::Send | Kind::Broadcast => !to_pane,
        Kind::Injected | Kind::Ask | Kind::Presence | Kind::Spawn => false,
        _ => true,
    }
}

/// Whether the sender of a refused message of `kind` is told with a `FAILED` notice: when it
/// is a message one waits on, never a notice or a receipt (which would only start a loop).
pub fn refusal_told(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Send | Kind::Broadcast | Kind::Reply | Kind::Ask | Kind::Answer
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gid;

    const NOW: u64 = 1_700_000_000_000;

    fn envelope(kind: Kind, to: &str) -> Envelope {
        crate::envelope::sample(kind, "hostb", to, NOW)
    }

    fn arrival<'a>(owner: &'a str, key: &'a str, body: &'a [u8]) -> Arrival<'a> {
        Arrival {
            owner,
            routing_key: key,
            body,
        }
    }

    #[test]
    fn a_message_for_this_inbox_in_time_and_in_size_is_admitted() {
        let owner = Gid::mint();
        let address = owner.to_string();
        let to = owner.to_string();
        let sent = envelope(Kind::Send, &to);
        let got = admit(arrival(&address, &to, b"hello"), Ok(sent.clone()), NOW, 5);
        assert_eq!(
            got,
            Admission::Admitted {
                envelope: sent,
                body: "hello".into()
            }
        );
    }

    #[test]
    fn a_broadcast_is_admitted_by_the_key_it_came_by_only() {
        let owner = Gid::mint();
        let address = owner.to_string();
        let sent = envelope(Kind::Broadcast, "broadcast.core");
        let ok = admit(
            arrival(&address, "broadcast.core", b"x"),
            Ok(sent.clone()),
            NOW,
            9,
        );
        assert!(matches!(ok, Admission::Admitted { .. }), "{ok:?}");
        let other_key = admit(arrival(&address, "broadcast.all", b"x"), Ok(sent), NOW, 9);
        assert!(matches!(
            other_key,
            Admission::Refused {
                why: Refusal::WrongRecipient,
                ..
            }
        ));
        // A send may not pass itself off as a broadcast by its key.
        let sneaky = envelope(Kind::Send, "broadcast.core");
        let got = admit(
            arrival(&address, "broadcast.core", b"x"),
            Ok(sneaky),
            NOW,
            9,
        );
        assert!(matches!(
            got,
            Admission::Refused {
                why: Refusal::WrongRecipient,
                ..
            }
        ));
    }

    #[test]
    fn the_checks_go_envelope_recipient_expiry_size_text() {
        let owner = Gid::mint();
        let address = owner.to_string();
        let to = owner.to_string();
        let bad = EnvelopeError::Missing("kind");
        assert_eq!(
            admit(arrival(&address, &to, b"x"), Err(bad.clone()), NOW, 9),
            Admission::Malformed(bad)
        );
        let why = |sent: Envelope, body: &[u8], now| match admit(
            arrival(&address, &to, body),
            Ok(sent),
            now,
            4,
        ) {
            Admission::Refused { why, .. } => Some(why),
            _ => None,
        };
        let mut expired = envelope(Kind::Send, "someone else");
        expired.expires_at_ms = NOW;
        // Wrong recipient wins over expiry.
        assert_eq!(
            why(expired.clone(), b"x", NOW),
            Some(Refusal::WrongRecipient)
        );
        expired.to = to.clone();
        // Expiry is at the instant named; over-size and non-text come after it.
        assert_eq!(
            why(expired.clone(), b"\xff\xff\xff\xff\xff", NOW),
            Some(Refusal::Expired)
        );
        assert_eq!(why(expired, b"x", NOW - 1), None);
        let sent = envelope(Kind::Reply, &to);
        assert_eq!(
            why(sent.clone(), b"\xff\xff\xff\xff\xff", NOW),
            Some(Refusal::TooLarge { size: 5, limit: 4 })
        );
        assert_eq!(
            why(sent.clone(), b"\xff\xff\xff\xff", NOW),
            Some(Refusal::NotText)
        );
        assert_eq!(why(sent, b"four", NOW), None, "the value at the cap passes");
    }

    #[test]
    fn briefs_for_a_pane_are_typed_and_the_rest_held_but_receipts_and_control() {
        assert!(!held_kind(Kind::Send, true));
        assert!(!held_kind(Kind::Broadcast, true));
        assert!(held_kind(Kind::Send, false));
        assert!(held_kind(Kind::Broadcast, false));
        for kind in [Kind::Reply, Kind::Answer, Kind::Failed, Kind::TooLate] {
            assert!(held_kind(kind, true) && held_kind(kind, false), "{kind}");
        }
        for kind in [Kind::Injected, Kind::Ask, Kind::Presence, Kind::Spawn] {
            assert!(!held_kind(kind, true) && !held_kind(kind, false), "{kind}");
        }
    }

    #[test]
    fn only_messages_one_waits_on_tell_their_sender_of_a_refusal() {
        for kind in [
            Kind::Send,
            Kind::Broadcast,
            Kind::Reply,
            Kind::Ask,
            Kind::Answer,
        ] {
            assert!(refusal_told(kind), "{kind}");
        }
        for kind in [Kind::Failed, Kind::Injected, Kind::TooLate, Kind::Presence] {
            assert!(!refusal_told(kind), "{kind}");
        }
    }

    #[test]
    fn held_taken_noted_and_dropped_are_acknowledged_refused_dead_lettered_unstored_requeued() {
        assert_eq!(Handled::Held.settlement(), Settlement::Ack);
        assert_eq!(Handled::Taken.settlement(), Settlement::Ack);
        assert_eq!(Handled::Noted.settlement(), Settlement::Ack);
        assert_eq!(Handled::Dropped.settlement(), Settlement::Ack);
        assert_eq!(Handled::Refused.settlement(), Settlement::DeadLetter);
        assert_eq!(Handled::NotStored.settlement(), Settlement::Requeue);
    }
}
