//! What is typed into a worker's pane, and how: the last gate before keys (text only, never
//! read as the agent's own command, one line where the program takes one) and the typing's
//! pace for the worker's profile.

use std::time::Duration;

use fleet_core::typed::{first_line_end, opens_a_command, typeable};
use fleet_core::{Kind, Message};
use fleet_mux::inject::{InjectOptions, Settle};

use crate::config::ProfileConfig;

/// How the screen must settle before a session's first task is typed: a program may call in
/// before its screen is up and drop the keys typed while it still draws. Held still this long
/// it is taken to be up; one that never holds still (a clock) gets the task after the limit.
const FIRST_TASK_SETTLE: Settle = Settle {
    still: Duration::from_millis(250),
    limit: Duration::from_secs(3),
};

/// The text typed into the pane for `message`: a task verbatim, unless it opens with one of
/// `prefixes` (what the agent's input box reads as a command: Claude Code's `!` runs a shell
/// command), when a label line comes first; anything else labelled, so the agent can tell an
/// answer from a new task.
fn pane_text(message: &Message, from_name: &str, prefixes: &[char]) -> String {
    match message.kind {
        Kind::Send if opens_a_command(&message.body, prefixes) => {
            format!("[fleet task from {from_name}]\n{}", message.body)
        }
        Kind::Send => message.body.clone(),
        kind => format!(
            "[fleet {kind} from {from_name}, answering {}]\n{}",
            message
                .in_reply_to
                .map(|id| id.to_string())
                .unwrap_or_default(),
            message.body
        ),
    }
}

/// How to type into a pane of `profile`; the screen must settle first before a session's
/// `first` task.
pub(super) fn inject_options(profile: &ProfileConfig, first: bool) -> InjectOptions {
    InjectOptions {
        enter_pause: profile.enter_pause(),
        verify_window: Duration::from_millis(profile.submit_verify_ms),
        submitted_marker: profile.submitted_marker(),
        settle_first: first.then_some(FIRST_TASK_SETTLE),
    }
}

/// What is typed for `task` (from `from_name`) into a pane of `profile`, or why nothing may
/// be: whatever path the task came by (a local send was checked already; one off the broker on
/// arrival), nothing but text reaches the keys, a task is never read as the agent's own command,
/// its last character never turns the Enter after it into a newline, and a program taking one
/// line at a time (`single_line`) gets one line.
pub(super) fn typed_text(
    task: &Message,
    from_name: &str,
    profile: &ProfileConfig,
) -> Result<String, String> {
    let mut text = typeable(&pane_text(task, from_name, profile.command_prefixes()))
        .map_err(|found| format!("it holds {found}"))?
        .into_owned();
    if let Some(continues) = profile.line_continuation()
        && text.ends_with(continues)
    {
        text.push(' ');
    }
    if profile.single_line
        && let Some(offset) = first_line_end(&text)
    {
        return Err(format!(
            "it holds a line break at character {offset}, and the worker's program takes one line at a time (single_line)"
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProfileKind;
    use fleet_core::{Gid, MsgId, TraceId};

    /// A task with `body`.
    fn task(body: &str) -> Message {
        Message::task(Gid::mint(), Gid::mint(), body.into(), TraceId::mint(), 0)
    }

    #[test]
    fn tasks_go_in_verbatim_and_answers_labelled() {
        let mut message = task("line one\nline two");
        assert_eq!(pane_text(&message, "alice", &[]), "line one\nline two");
        let answered = MsgId::mint();
        message.kind = Kind::Reply;
        message.in_reply_to = Some(answered);
        let text = pane_text(&message, "alice", &[]);
        assert!(text.starts_with(&format!("[fleet REPLY from alice, answering {answered}]\n")));
        assert!(text.ends_with("line one\nline two"));
    }

    #[test]
    fn the_last_gate_types_text_only_and_one_line_where_asked() {
        let mut message = task("a\r\nb");
        let sim = ProfileConfig::command("sim", vec!["sim".into()]);
        let mut one_line = sim.clone();
        one_line.single_line = true;
        assert_eq!(typed_text(&message, "alice", &sim).unwrap(), "a\nb");
        let why = typed_text(&message, "alice", &one_line).unwrap_err();
        assert!(why.contains("line break at character 1"), "{why}");
        // A task that got past every earlier check (queued before an upgrade, say).
        message.body = "x\u{1b}[201~y".into();
        let why = typed_text(&message, "alice", &sim).unwrap_err();
        assert!(why.contains("U+001B (ESC)"), "{why}");
        // A reply's label carries its sender's name: a hostile one stops it too.
        message.body = "fine".into();
        message.kind = Kind::Reply;
        message.in_reply_to = Some(MsgId::mint());
        assert!(typed_text(&message, "evil\u{1b}]0;x", &sim).is_err());
    }

    #[test]
    fn a_task_ending_in_claude_codes_line_continuation_gets_a_blank_after_it() {
        let mut claude = ProfileConfig::command("claude", Vec::new());
        claude.kind = ProfileKind::ClaudeCode;
        let sim = ProfileConfig::command("sim", vec!["sim".into()]);
        assert_eq!(
            typed_text(&task("ls \\"), "alice", &claude).unwrap(),
            "ls \\ "
        );
        // Only as the last character, and only for Claude Code.
        assert_eq!(
            typed_text(&task("a \\ b"), "alice", &claude).unwrap(),
            "a \\ b"
        );
        assert_eq!(typed_text(&task("ls \\"), "alice", &sim).unwrap(), "ls \\");
    }

    #[test]
    fn a_task_claude_code_would_read_as_a_command_is_typed_as_a_task() {
        let mut claude = ProfileConfig::command("claude", Vec::new());
        claude.kind = ProfileKind::ClaudeCode;
        let sim = ProfileConfig::command("sim", vec!["sim".into()]);
        for body in ["!touch /tmp/x", "/add-dir /etc", "  #remember this"] {
            let typed = typed_text(&task(body), "alice", &claude).unwrap();
            assert_eq!(typed, format!("[fleet task from alice]\n{body}"));
            // A program fleetd does not know gets it as it is.
            assert_eq!(typed_text(&task(body), "alice", &sim).unwrap(), body);
        }
        assert_eq!(
            typed_text(&task("fix /src/main.rs"), "alice", &claude).unwrap(),
            "fix /src/main.rs"
        );
    }
}
