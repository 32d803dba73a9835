//! Dead letters (spec 10 §10 "Inbox caps"): a message the broker dead-lettered off an inbox
//! comes back to the gateway of the host that published it (its queue `fleet.dlq.<host>`), and
//! here is decided whether its sender is told with one `FAILED` notice or the dead letter is
//! let go (it stays in `fleet.dlq`, the operators' record). Pure: the seal check, the store's
//! records and the sessions' state come in as values.
//!
//! A dead letter is as hostile as anything else off the broker: anyone who may publish on the
//! vhost can put one on `fleet.dlx`. Only one sealed by this gateway itself (its own key and
//! broker login), naming this host, is looked at; of those only a message one waits on (never
//! a notice: no loops) that the broker dropped by itself — it `expired` in an inbox, hit a
//! quorum queue's `delivery_limit`, or, a broadcast's copy, found its inbox full (`maxlen`).
//! The others were told of already: a message over an inbox's cap made the publisher's confirm
//! a nack and the sending call failed (a broadcast's publish succeeds for the copies that went
//! in, so a refused copy has no other word); a message its recipient's gateway refused
//! (`rejected`) was told of by that gateway, or was not genuine.

use std::fmt;

use crate::envelope::Envelope;
use crate::ids::{Gid, MsgId};
use crate::message::Kind;
use crate::trust::Refusal;

/// Why the broker dead-lettered a message (the `reason` of its `x-death` entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// It waited in its queue past the queue's message TTL (`expired`).
    Expired,
    /// Its queue was at its length cap (`maxlen`).
    MaxLen,
    /// A consumer refused it without requeue (`rejected`).
    Rejected,
    /// A quorum queue delivered it too often (`delivery_limit`).
    DeliveryLimit,
    /// No `x-death`, or one this gateway cannot read.
    Unknown,
}

impl Cause {
    /// The cause the broker's `reason` text names; anything else is [`Cause::Unknown`].
    pub fn from_wire(reason: &str) -> Cause {
        match reason {
            "expired" => Cause::Expired,
            "maxlen" => Cause::MaxLen,
            "rejected" => Cause::Rejected,
            "delivery_limit" => Cause::DeliveryLimit,
            _ => Cause::Unknown,
        }
    }

    /// The broker's name for it (`unknown` for [`Cause::Unknown`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Expired => "expired",
            Cause::MaxLen => "maxlen",
            Cause::Rejected => "rejected",
            Cause::DeliveryLimit => "delivery_limit",
            Cause::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a dead letter's `x-death` header says of its latest death (its first entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Death {
    /// Why.
    pub cause: Cause,
    /// The queue it died in, when named.
    pub queue: Option<String>,
    /// When, in Unix seconds, when given.
    pub time_s: Option<u64>,
}

impl Death {
    /// A dead letter with no readable `x-death`.
    pub fn unknown() -> Death {
        Death {
            cause: Cause::Unknown,
            queue: None,
            time_s: None,
        }
    }
}

/// A dead letter whose sender is to be told, once what this gateway recorded agrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The message the notice is about: the dead letter's own id, or for a broadcast's copy
    /// the copy's (derived from the broadcast's id and its recipient's gid).
    pub original: MsgId,
    /// The dead letter's own id (the broadcast's, for a copy).
    pub msg_id: MsgId,
    /// Its sender, on this host.
    pub sender: Gid,
    /// The entity whose inbox it died in.
    pub recipient: Gid,
    /// Whether it is a broadcast's copy.
    pub broadcast: bool,
}

impl Candidate {
    /// The ids under which this gateway may have recorded where it went.
    pub fn ids(&self) -> Vec<MsgId> {
        if self.broadcast {
            vec![self.msg_id, self.original]
        } else {
            vec![self.msg_id]
        }
    }
}

/// Why a dead letter is let go without telling anyone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// Its envelope names another sending host, or none: not this gateway's to answer.
    Foreign,
    /// It names this host but this gateway's own seal does not verify.
    Unsealed(Refusal),
    /// A notice or a receipt (`FAILED`, `INJECTED` …), or a kind no inbox takes: telling of it
    /// would only start a loop.
    Notice(Kind),
    /// Its sender was told already (`maxlen`, but for a broadcast's copy: the publish failed;
    /// `rejected`: by the recipient's gateway, or it was not genuine).
    ToldOtherwise(Cause),
    /// Its `x-death` is missing or names no cause this gateway knows.
    NoCause,
    /// Its `x-death` names no inbox.
    NoInbox,
    /// The inbox it died in is not its recipient's.
    OtherInbox,
    /// This gateway has no record of publishing it to that recipient.
    NotSent,
    /// Its `INJECTED` receipt came: it was typed in, whatever this dead letter says.
    Delivered,
    /// It has its answer (a reply): it cannot have died unread.
    Answered,
    /// Its sender is no longer on this host: nobody to tell.
    SenderGone,
}

impl Dropped {
    /// The audit line's name for it (`dead letter dropped: <reason>`).
    pub fn reason(&self) -> &'static str {
        match self {
            Dropped::Foreign => "another host's",
            Dropped::Unsealed(refusal) => refusal.reason(),
            Dropped::Notice(_) => "a notice",
            Dropped::ToldOtherwise(Cause::MaxLen) => "maxlen",
            Dropped::ToldOtherwise(_) => "rejected",
            Dropped::NoCause => "no cause",
            Dropped::NoInbox => "no inbox",
            Dropped::OtherInbox => "another inbox",
            Dropped::NotSent => "not sent",
            Dropped::Delivered => "delivered",
            Dropped::Answered => "answered",
            Dropped::SenderGone => "sender gone",
        }
    }

    /// Whether it speaks of a forgery or tampering (an error line, thinned), rather than of the
    /// ordinary course of things (a debug line).
    pub fn suspicious(&self) -> bool {
        !matches!(
            self,
            Dropped::Notice(_) | Dropped::ToldOtherwise(_) | Dropped::SenderGone
        )
    }
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dropped::Foreign => f.write_str("it names another sending host, or none"),
            Dropped::Unsealed(refusal) => write!(f, "it is not sealed by this gateway: {refusal}"),
            Dropped::Notice(kind) => write!(f, "it is a {kind}, which is never told of"),
            Dropped::ToldOtherwise(cause) => {
                write!(f, "its sender was told already (dead-lettered as {cause})")
            }
            Dropped::NoCause => f.write_str("its x-death header is missing or unreadable"),
            Dropped::NoInbox => f.write_str("its x-death header names no inbox"),
            Dropped::OtherInbox => f.write_str("it died in an inbox other than its recipient's"),
            Dropped::NotSent => {
                f.write_str("this gateway has no record of publishing it to that recipient")
            }
            Dropped::Delivered => f.write_str("its INJECTED receipt came: it was typed in"),
            Dropped::Answered => {
                f.write_str("it has its answer already: it cannot have died unread")
            }
            Dropped::SenderGone => f.write_str("its sender is no longer on this host"),
        }
    }
}

/// Whether a dead-lettered message of `kind` is one its sender waits on.
fn told_of(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Send | Kind::Reply | Kind::Ask | Kind::Answer | Kind::Broadcast
    )
}

/// The first look at a dead letter under `envelope` that died for `cause` in the inbox of
/// `recipient` (none: its `x-death` names no inbox), with `seal` the check of this gateway's
/// own seal on it, on host `this_host`: a candidate to tell its sender of, or why not. In this
/// order: the seal, the kind, the cause (for the kind), the inbox.
pub fn screen(
    envelope: &Envelope,
    cause: Cause,
    recipient: Option<Gid>,
    seal: Result<(), Refusal>,
    this_host: &str,
) -> Result<Candidate, Dropped> {
    if envelope.from_host.as_deref() != Some(this_host) {
        return Err(Dropped::Foreign);
    }
    seal.map_err(Dropped::Unsealed)?;
    if !told_of(envelope.kind) {
        return Err(Dropped::Notice(envelope.kind));
    }
    let broadcast = envelope.kind == Kind::Broadcast;
    match cause {
        Cause::Expired | Cause::DeliveryLimit => {}
        Cause::MaxLen if broadcast => {}
        Cause::MaxLen | Cause::Rejected => return Err(Dropped::ToldOtherwise(cause)),
        Cause::Unknown => return Err(Dropped::NoCause),
    }
    let recipient = recipient.ok_or(Dropped::NoInbox)?;
    if !broadcast && envelope.to != recipient.to_string() {
        return Err(Dropped::OtherInbox);
    }
    Ok(Candidate {
        original: if broadcast {
            envelope.msg_id.derived(&recipient.to_string())
        } else {
            envelope.msg_id
        },
        msg_id: envelope.msg_id,
        sender: envelope.from,
        recipient,
        broadcast,
    })
}

/// What this gateway knows of a candidate's message.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// What it recorded publishing under the candidate's ids: `(id, from, to)`, `to` none for
    /// a broadcast's own id.
    pub sent: &'a [(MsgId, Gid, Option<Gid>)],
    /// Whether the message's `INJECTED` receipt came.
    pub injected: bool,
    /// Whether it has its answer already (a reply).
    pub answered: bool,
    /// Whether its sender is still an entity of this host.
    pub sender_here: bool,
}

/// The second look, against what this gateway recorded: `Ok` to tell the sender. The record
/// must show the message going from its sender to the inbox it died in (a broadcast's own id
/// from its sender will do for a copy the roster did not know of).
pub fn confirm(candidate: &Candidate, record: Record<'_>) -> Result<(), Dropped> {
    let matches = |(id, from, to): &(MsgId, Gid, Option<Gid>)| {
        *from == candidate.sender
            && ((*id == candidate.original && *to == Some(candidate.recipient))
                || (candidate.broadcast && *id == candidate.msg_id && to.is_none()))
    };
    if !record.sent.iter().any(matches) {
        return Err(Dropped::NotSent);
    }
    if record.injected {
        return Err(Dropped::Delivered);
    }
    if record.answered {
        return Err(Dropped::Answered);
    }
    if !record.sender_here {
        return Err(Dropped::SenderGone);
    }
    Ok(())
}

/// The `FAILED` notice's text for a message sent at `sent_ms` (Unix ms) that died as `death`
/// says in the inbox of `recipient` (its name as shown).
pub fn failure(death: &Death, sent_ms: u64, recipient: &str) -> String {
    let waited = death
        .time_s
        .map(|died| died.saturating_sub(sent_ms / 1000))
        .map_or_else(String::new, |s| format!(" after {s} s"));
    match death.cause {
        Cause::DeliveryLimit => format!(
            "dead-lettered by the broker{waited} from the inbox of '{recipient}' after too many delivery attempts, never taken"
        ),
        Cause::MaxLen => format!(
            "refused: the inbox of '{recipient}' was full (federation.inbox_max_length of its host), so this copy never went in"
        ),
        _ => format!(
            "expired{waited} unread in the inbox of '{recipient}', never taken: its gateway may be down"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn ours(kind: Kind, to: &str) -> Envelope {
        crate::envelope::sample(kind, "hosta", to, NOW)
    }

    fn screened(
        envelope: &Envelope,
        cause: Cause,
        inbox: Option<Gid>,
    ) -> Result<Candidate, Dropped> {
        screen(envelope, cause, inbox, Ok(()), "hosta")
    }

    #[test]
    fn the_wire_names_of_the_causes_round_trip_and_anything_else_is_unknown() {
        for cause in [
            Cause::Expired,
            Cause::MaxLen,
            Cause::Rejected,
            Cause::DeliveryLimit,
        ] {
            assert_eq!(Cause::from_wire(cause.as_str()), cause);
        }
        for text in ["", "EXPIRED", "expired ", "unknown", "x\u{0}"] {
            assert_eq!(Cause::from_wire(text), Cause::Unknown, "{text:?}");
        }
        assert_eq!(Death::unknown().cause, Cause::Unknown);
    }

    #[test]
    fn an_expired_message_of_ours_one_waits_on_is_a_candidate() {
        let recipient = Gid::mint();
        for kind in [Kind::Send, Kind::Reply, Kind::Ask, Kind::Answer] {
            let sent = ours(kind, &recipient.to_string());
            for cause in [Cause::Expired, Cause::DeliveryLimit] {
                let got = screened(&sent, cause, Some(recipient));
                assert_eq!(
                    got,
                    Ok(Candidate {
                        original: sent.msg_id,
                        msg_id: sent.msg_id,
                        sender: sent.from,
                        recipient,
                        broadcast: false,
                    }),
                    "{kind} {cause}"
                );
                assert_eq!(got.map(|c| c.ids()), Ok(vec![sent.msg_id]));
            }
        }
    }

    #[test]
    fn a_broadcast_copy_is_told_of_by_the_copys_own_id_expired_or_refused_by_a_full_inbox() {
        let recipient = Gid::mint();
        let sent = ours(Kind::Broadcast, "broadcast.core");
        let copy = sent.msg_id.derived(&recipient.to_string());
        // The broadcast's publish does not fail for one full inbox among many: the copy that
        // found its inbox full has no other word.
        for cause in [Cause::Expired, Cause::MaxLen] {
            let candidate = screened(&sent, cause, Some(recipient)).unwrap();
            assert_eq!(candidate.original, copy);
            assert!(candidate.broadcast);
            assert_eq!(candidate.ids(), [sent.msg_id, copy]);
        }
    }

    #[test]
    fn only_our_own_sealed_dead_letters_are_looked_at() {
        let recipient = Gid::mint();
        let to = recipient.to_string();
        let mut other = ours(Kind::Send, &to);
        other.from_host = Some("hostb".into());
        assert_eq!(
            screened(&other, Cause::Expired, Some(recipient)),
            Err(Dropped::Foreign)
        );
        other.from_host = None;
        assert_eq!(
            screened(&other, Cause::Expired, Some(recipient)),
            Err(Dropped::Foreign)
        );
        // The seal is judged before anything else the dead letter says.
        let forged = ours(Kind::Failed, &to);
        let got = screen(
            &forged,
            Cause::Unknown,
            None,
            Err(Refusal::BadSignature),
            "hosta",
        );
        assert_eq!(got, Err(Dropped::Unsealed(Refusal::BadSignature)));
        assert!(got.unwrap_err().suspicious());
    }

    #[test]
    fn notices_and_what_was_told_of_already_are_dropped_quietly() {
        let recipient = Gid::mint();
        let to = recipient.to_string();
        for kind in [
            Kind::Failed,
            Kind::Injected,
            Kind::TooLate,
            Kind::NoWaiter,
            Kind::Abandoned,
            Kind::Presence,
            Kind::Spawn,
        ] {
            let got = screened(&ours(kind, &to), Cause::Expired, Some(recipient));
            assert_eq!(got, Err(Dropped::Notice(kind)));
            assert!(!got.unwrap_err().suspicious());
        }
        for kind in [Kind::Send, Kind::Reply, Kind::Ask, Kind::Answer] {
            for cause in [Cause::MaxLen, Cause::Rejected] {
                let got = screened(&ours(kind, &to), cause, Some(recipient));
                assert_eq!(got, Err(Dropped::ToldOtherwise(cause)), "{kind}");
                assert!(!got.unwrap_err().suspicious());
            }
        }
        let copy = ours(Kind::Broadcast, "broadcast.all");
        assert_eq!(
            screened(&copy, Cause::Rejected, Some(recipient)),
            Err(Dropped::ToldOtherwise(Cause::Rejected))
        );
        assert_eq!(
            Dropped::ToldOtherwise(Cause::MaxLen).reason(),
            "maxlen",
            "the audit names the cap"
        );
    }

    #[test]
    fn a_dead_letter_that_does_not_say_where_or_why_it_died_is_dropped_loudly() {
        let recipient = Gid::mint();
        let sent = ours(Kind::Send, &recipient.to_string());
        let why = [
            (Cause::Unknown, Some(recipient), Dropped::NoCause),
            (Cause::Expired, None, Dropped::NoInbox),
            (Cause::Expired, Some(Gid::mint()), Dropped::OtherInbox),
        ];
        for (cause, inbox, dropped) in why {
            let got = screened(&sent, cause, inbox);
            assert_eq!(got, Err(dropped.clone()));
            assert!(dropped.suspicious(), "{dropped}");
        }
    }

    fn candidate(broadcast: bool) -> Candidate {
        let msg_id = MsgId::mint();
        let recipient = Gid::mint();
        Candidate {
            original: if broadcast {
                msg_id.derived(&recipient.to_string())
            } else {
                msg_id
            },
            msg_id,
            sender: Gid::mint(),
            recipient,
            broadcast,
        }
    }

    fn record(sent: &[(MsgId, Gid, Option<Gid>)]) -> Record<'_> {
        Record {
            sent,
            injected: false,
            answered: false,
            sender_here: true,
        }
    }

    #[test]
    fn the_record_must_show_it_going_from_its_sender_to_that_inbox() {
        let c = candidate(false);
        let (id, from, to) = (c.msg_id, c.sender, Some(c.recipient));
        assert_eq!(confirm(&c, record(&[(id, from, to)])), Ok(()));
        assert_eq!(confirm(&c, record(&[])), Err(Dropped::NotSent));
        // From someone else, to someone else, or without a recipient: not this message.
        for wrong in [
            (id, Gid::mint(), to),
            (id, from, Some(Gid::mint())),
            (id, from, None),
            (MsgId::mint(), from, to),
        ] {
            assert_eq!(confirm(&c, record(&[wrong])), Err(Dropped::NotSent));
        }
    }

    #[test]
    fn a_copy_matches_its_own_record_or_its_broadcasts() {
        let c = candidate(true);
        let own = (c.original, c.sender, Some(c.recipient));
        let broadcast = (c.msg_id, c.sender, None);
        assert_eq!(confirm(&c, record(&[own])), Ok(()));
        assert_eq!(confirm(&c, record(&[broadcast])), Ok(()));
        // The broadcast's record is by another sender; another copy's is another recipient's.
        let other_copy = (c.original, c.sender, Some(Gid::mint()));
        let not_ours = (c.msg_id, Gid::mint(), None);
        assert_eq!(
            confirm(&c, record(&[other_copy, not_ours])),
            Err(Dropped::NotSent)
        );
    }

    #[test]
    fn a_message_typed_in_or_whose_sender_is_gone_is_not_told_of() {
        let c = candidate(false);
        let sent = [(c.msg_id, c.sender, Some(c.recipient))];
        let injected = Record {
            injected: true,
            ..record(&sent)
        };
        assert_eq!(confirm(&c, injected), Err(Dropped::Delivered));
        let gone = Record {
            sender_here: false,
            ..record(&sent)
        };
        assert_eq!(confirm(&c, gone), Err(Dropped::SenderGone));
        assert!(!Dropped::SenderGone.suspicious());
        // One answered already (a dead letter forged from a copy of it, say) is not believed.
        let answered = Record {
            answered: true,
            ..record(&sent)
        };
        assert_eq!(confirm(&c, answered), Err(Dropped::Answered));
        assert!(Dropped::Answered.suspicious());
    }

    #[test]
    fn the_failure_says_how_long_it_waited_and_in_whose_inbox() {
        let death = Death {
            cause: Cause::Expired,
            queue: Some("agent.x.inbox.v2".into()),
            time_s: Some(NOW / 1000 + 86_400),
        };
        assert_eq!(
            failure(&death, NOW, "wb@hostb"),
            "expired after 86400 s unread in the inbox of 'wb@hostb', never taken: its gateway may be down"
        );
        // A death stamped before the message was sent (a skewed clock) waited no time; one
        // without a time says nothing of it.
        let early = Death {
            time_s: Some(0),
            ..death.clone()
        };
        assert!(failure(&early, NOW, "wb").starts_with("expired after 0 s unread"));
        let untimed = Death {
            time_s: None,
            ..death
        };
        assert!(failure(&untimed, NOW, "wb").starts_with("expired unread in the inbox of 'wb'"));
        let limit = Death {
            cause: Cause::DeliveryLimit,
            queue: None,
            time_s: None,
        };
        assert!(failure(&limit, NOW, "wb").contains("too many delivery attempts"));
        let full = Death {
            cause: Cause::MaxLen,
            ..limit
        };
        assert!(failure(&full, NOW, "wb").starts_with("refused: the inbox of 'wb' was full"));
    }
}
