//! The spans fleetd's log lines carry, so each line says what it is about: a tool call (the
//! tool and its caller, see `mcp`), an HTTP request (see `http`), a session (its gid and
//! name) and a message (its trace id, which every hop of a flow shares, and its id).

use fleet_core::{Gid, Message};
use tracing::Span;

/// The most characters of a client's text (a path, a session id, a tool name) a log line shows.
pub const SHOWN_CHARS: usize = 128;

/// A client's `text` as a log line may show it: at most [`SHOWN_CHARS`] characters, anything
/// but visible ASCII shown as `?`, so it can neither forge a line nor flood the log.
pub fn shown(text: &str) -> String {
    text.chars()
        .take(SHOWN_CHARS)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

/// The span of work for the session of `gid`, named `name`, inside whatever called for it (a
/// `fleet_stop`, say).
pub fn session_span(gid: Gid, name: &str) -> Span {
    tracing::info_span!("session", %gid, name = %name)
}

/// The span of a session's own task (its pump): a root, since the task outlives the
/// `fleet_spawn` call that started it.
pub fn session_task_span(gid: Gid, name: &str) -> Span {
    tracing::info_span!(parent: None, "session", %gid, name = %name)
}

/// The span of everything done with `message`: grep a trace id to follow a flow across its
/// hops (and across hosts: the id travels in the envelope).
pub fn message_span(message: &Message) -> Span {
    tracing::info_span!(
        "message",
        trace_id = %message.trace_id,
        msg_id = %message.msg_id,
        kind = %message.kind,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_text_is_shown_inert_and_short() {
        assert_eq!(shown("fleet_send"), "fleet_send");
        assert_eq!(shown("/mcp?x=1"), "/mcp?x=1");
        assert_eq!(
            shown("a\nINFO forged line\u{1b}[31m"),
            "a?INFO?forged?line?[31m"
        );
        assert_eq!(shown(&"x".repeat(100_000)).len(), SHOWN_CHARS);
        assert_eq!(shown(""), "");
    }
}
