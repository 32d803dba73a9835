//! Messages: their kinds, their visible states and the rules on both.
//!
//! Every message has a state a user can look up: `queued → injecting → injected` on the forward
//! path into a pane, `held → consumed` on the pull path into an MCP client, or `failed(reason)`.
//! "Sent" is never reported as "delivered".

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, FleetError};
use crate::ids::{Gid, MsgId, TraceId};

/// The default cap on a message body, in bytes (256 KiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// What a message is. The names are those of the cross-host envelope (spec 10 §2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Kind {
    /// A task or message sent to an entity.
    Send,
    /// An answer to a send.
    Reply,
    /// A mid-turn question from a worker.
    Ask,
    /// The answer to an ask.
    Answer,
    /// Notice: an answer arrived after its ask was gone.
    TooLate,
    /// Notice: an ask found nobody waiting.
    NoWaiter,
    /// Notice: a turn was abandoned.
    Abandoned,
    /// Notice: a message could not be delivered; the body says why.
    Failed,
    /// Receipt: a brief was typed into its pane and submitted.
    Injected,
    /// One copy of a broadcast.
    Broadcast,
    /// A presence heartbeat.
    Presence,
    /// A spawn request to another gateway.
    Spawn,
}

impl Kind {
    /// All kinds, in envelope order.
    pub const ALL: [Kind; 12] = [
        Kind::Send,
        Kind::Reply,
        Kind::Ask,
        Kind::Answer,
        Kind::TooLate,
        Kind::NoWaiter,
        Kind::Abandoned,
        Kind::Failed,
        Kind::Injected,
        Kind::Broadcast,
        Kind::Presence,
        Kind::Spawn,
    ];

    /// The kind's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Send => "SEND",
            Kind::Reply => "REPLY",
            Kind::Ask => "ASK",
            Kind::Answer => "ANSWER",
            Kind::TooLate => "TOO_LATE",
            Kind::NoWaiter => "NO_WAITER",
            Kind::Abandoned => "ABANDONED",
            Kind::Failed => "FAILED",
            Kind::Injected => "INJECTED",
            Kind::Broadcast => "BROADCAST",
            Kind::Presence => "PRESENCE",
            Kind::Spawn => "SPAWN",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = FleetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| FleetError::invalid(format!("unknown message kind '{s}'")))
    }
}

/// Where a message is in its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "reason", rename_all = "lowercase")]
pub enum MsgState {
    /// Waiting in the recipient's durable queue for the recipient to turn idle.
    Queued,
    /// Taken off the queue and being typed into the pane (at-most-once: never typed twice; a
    /// restart that finds it here settles it from the pane, and puts it back on its queue only
    /// when none of its keys went in).
    Injecting,
    /// Typed into the pane and the submit verified.
    Injected,
    /// Held durably for an MCP client to pull.
    Held,
    /// Pulled by its recipient.
    Consumed,
    /// Not delivered; the reason says why.
    Failed(String),
}

impl MsgState {
    /// Every state's name, in the order of a message's life.
    pub const NAMES: [&'static str; 6] = [
        "queued",
        "injecting",
        "injected",
        "held",
        "consumed",
        "failed",
    ];

    /// The state's name without its reason.
    pub fn name(&self) -> &'static str {
        match self {
            MsgState::Queued => "queued",
            MsgState::Injecting => "injecting",
            MsgState::Injected => "injected",
            MsgState::Held => "held",
            MsgState::Consumed => "consumed",
            MsgState::Failed(_) => "failed",
        }
    }

    /// The failure reason, if failed.
    pub fn reason(&self) -> Option<&str> {
        match self {
            MsgState::Failed(reason) => Some(reason),
            _ => None,
        }
    }

    /// Rebuilds a state from its name and reason (the store's two columns).
    pub fn from_parts(name: &str, reason: Option<String>) -> Result<Self, FleetError> {
        Ok(match name {
            "queued" => MsgState::Queued,
            "injecting" => MsgState::Injecting,
            "injected" => MsgState::Injected,
            "held" => MsgState::Held,
            "consumed" => MsgState::Consumed,
            "failed" => MsgState::Failed(reason.unwrap_or_default()),
            other => {
                return Err(FleetError::internal(format!(
                    "unknown message state '{other}'"
                )));
            }
        })
    }

    /// Whether a message in this state may move to `next`. Terminal states move nowhere; a
    /// queued brief may be handed to its recipient's open poll (`held`) instead of typed. (The
    /// one way back from `injecting` to `queued` is not a transition: only a restart's proof
    /// that no key went in takes it, `Store::put_back_untyped`.)
    pub fn can_become(&self, next: &MsgState) -> bool {
        use MsgState::*;
        matches!(
            (self, next),
            (Queued, Injecting | Held | Failed(_))
                | (Injecting, Injected | Failed(_))
                | (Held, Consumed | Failed(_))
        )
    }
}

impl fmt::Display for MsgState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgState::Failed(reason) => write!(f, "failed({reason})"),
            other => f.write_str(other.name()),
        }
    }
}

/// One message as the local plane stores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Unique id; the dedup key.
    pub msg_id: MsgId,
    /// The flow this message belongs to.
    pub trace_id: TraceId,
    /// What it is.
    pub kind: Kind,
    /// Sender.
    pub from: Gid,
    /// Recipient.
    pub to: Gid,
    /// The message this one answers, if any.
    pub in_reply_to: Option<MsgId>,
    /// The text.
    pub body: String,
    /// Where it is in its life.
    pub state: MsgState,
    /// When it was accepted, in milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Until when (Unix ms) it may still be handed over: a brief from another host keeps its
    /// envelope's expiry while it waits in its worker's queue, and one past it fails where it
    /// is taken off the queue, never typed. `None`: it waits as long as it must.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
}

impl Message {
    /// A new task (or plain message) from `from` to `to`, queued for its recipient, in the flow
    /// `trace_id`, accepted at `now_ms`.
    pub fn task(from: Gid, to: Gid, body: String, trace_id: TraceId, now_ms: i64) -> Message {
        Message {
            msg_id: MsgId::mint(),
            trace_id,
            kind: Kind::Send,
            from,
            to,
            in_reply_to: None,
            body,
            state: MsgState::Queued,
            created_ms: now_ms,
            expires_ms: None,
        }
    }

    /// A message of `kind` from `from` to `to` about the task `task` (in its flow; a flow of its
    /// own when there is none): a worker's ask, or a notice about its work.
    pub fn about(
        task: Option<&Message>,
        kind: Kind,
        (from, to): (Gid, Gid),
        body: String,
        now_ms: i64,
    ) -> Message {
        Message {
            kind,
            in_reply_to: task.map(|t| t.msg_id),
            ..Message::task(
                from,
                to,
                body,
                task.map_or_else(TraceId::mint, |t| t.trace_id),
                now_ms,
            )
        }
    }

    /// The answer to `answered`, from its recipient to its sender, in its flow, held for the
    /// sender's pull.
    pub fn reply_to(answered: &Message, body: String, now_ms: i64) -> Message {
        Message {
            msg_id: MsgId::mint(),
            trace_id: answered.trace_id,
            kind: Kind::Reply,
            from: answered.to,
            to: answered.from,
            in_reply_to: Some(answered.msg_id),
            body,
            state: MsgState::Held,
            created_ms: now_ms,
            expires_ms: None,
        }
    }

    /// What the gateway of `original`'s recipient tells its sender about it (`kind` is a
    /// notice or a receipt: `FAILED`, `INJECTED` …), held for the sender. Its id derives from
    /// the original's and the kind, so however many paths report the same thing, the sender
    /// hears it once.
    pub fn notice(original: &Message, kind: Kind, body: String, now_ms: i64) -> Message {
        Message {
            msg_id: original.msg_id.derived(&kind.as_str().to_ascii_lowercase()),
            trace_id: original.trace_id,
            kind,
            from: original.to,
            to: original.from,
            in_reply_to: Some(original.msg_id),
            body,
            state: MsgState::Held,
            created_ms: now_ms,
            expires_ms: None,
        }
    }

    /// Whether it may no longer be handed over at `now_ms` (see [`Message::expires_ms`]).
    pub fn expired(&self, now_ms: i64) -> bool {
        self.expires_ms.is_some_and(|at| now_ms >= at)
    }

    /// The same message under the id `msg_id` (a broadcast's copy, or a brief rebuilt from
    /// what was kept of it).
    pub fn with_id(self, msg_id: MsgId) -> Message {
        Message { msg_id, ..self }
    }
}

/// Rejects a body over `limit` bytes with an error that names both sizes.
pub fn check_size(body: &str, limit: usize) -> Result<(), FleetError> {
    if body.len() > limit {
        return Err(FleetError::new(
            ErrorCode::TooLarge,
            format!(
                "the message is {} bytes; the limit is {limit} bytes (gateway.max_message_bytes)",
                body.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_about_a_task_is_in_its_flow_and_names_it() {
        let (lead, worker) = (Gid::mint(), Gid::mint());
        let task = Message::task(lead, worker, "do it".into(), TraceId::mint(), 1);
        let ask = Message::about(Some(&task), Kind::Ask, (worker, lead), "which?".into(), 2);
        assert_eq!(
            (ask.kind, ask.in_reply_to, ask.trace_id, ask.from, ask.to),
            (Kind::Ask, Some(task.msg_id), task.trace_id, worker, lead)
        );
        assert_ne!(ask.msg_id, task.msg_id);
        let loose = Message::about(None, Kind::Send, (worker, lead), "stalled".into(), 3);
        assert_eq!(loose.in_reply_to, None);
        assert_ne!(loose.trace_id, task.trace_id);
    }

    #[test]
    fn all_twelve_kinds_round_trip() {
        for kind in Kind::ALL {
            assert_eq!(kind.as_str().parse::<Kind>().unwrap(), kind);
        }
        assert!("SHOUT".parse::<Kind>().is_err());
    }

    #[test]
    fn states_round_trip_with_reasons() {
        let failed = MsgState::Failed("not submitted".into());
        assert_eq!(failed.to_string(), "failed(not submitted)");
        let back = MsgState::from_parts(failed.name(), failed.reason().map(String::from)).unwrap();
        assert_eq!(back, failed);
        assert!(MsgState::from_parts("lost", None).is_err());
    }

    #[test]
    fn forward_path_never_goes_back() {
        assert!(MsgState::Queued.can_become(&MsgState::Injecting));
        assert!(MsgState::Injecting.can_become(&MsgState::Injected));
        assert!(!MsgState::Injecting.can_become(&MsgState::Queued));
        assert!(!MsgState::Injected.can_become(&MsgState::Injecting));
        assert!(!MsgState::Consumed.can_become(&MsgState::Held));
        assert!(MsgState::Held.can_become(&MsgState::Consumed));
    }

    #[test]
    fn replies_and_notices_answer_their_message_in_its_flow() {
        let (lead, worker) = (Gid::mint(), Gid::mint());
        let task = Message::task(lead, worker, "do it".into(), TraceId::mint(), 5);
        assert_eq!(
            (task.kind, task.state.clone(), task.created_ms),
            (Kind::Send, MsgState::Queued, 5)
        );
        let reply = Message::reply_to(&task, "done".into(), 9);
        assert_eq!((reply.from, reply.to), (worker, lead));
        assert_eq!(
            (reply.in_reply_to, reply.trace_id),
            (Some(task.msg_id), task.trace_id)
        );
        assert_eq!((reply.kind, reply.state), (Kind::Reply, MsgState::Held));
        assert_ne!(reply.msg_id, task.msg_id);
        let failed = Message::notice(&task, Kind::Failed, "gone".into(), 9);
        assert_eq!(
            (failed.from, failed.to, failed.kind),
            (worker, lead, Kind::Failed)
        );
        assert_eq!(failed.in_reply_to, Some(task.msg_id));
        // One notice of a kind per message, however many paths report it; ids as before.
        assert_eq!(
            failed.msg_id,
            Message::notice(&task, Kind::Failed, "x".into(), 1).msg_id
        );
        assert_eq!(failed.msg_id, task.msg_id.derived("failed"));
        let receipt = Message::notice(&task, Kind::Injected, String::new(), 9);
        assert_eq!(receipt.msg_id, task.msg_id.derived("injected"));
        let copy_id = MsgId::mint();
        assert_eq!(task.clone().with_id(copy_id).msg_id, copy_id);
    }

    #[test]
    fn size_limit_names_both_sizes() {
        assert!(check_size("abc", 3).is_ok());
        let err = check_size("abcd", 3).unwrap_err();
        assert_eq!(err.code, ErrorCode::TooLarge);
        assert!(err.message.contains("4 bytes") && err.message.contains("3 bytes"));
    }
}
