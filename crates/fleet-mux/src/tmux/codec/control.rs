//! tmux control mode's lines (`tmux -C`), the pure half of [`crate::tmux::control`]: the
//! command line a client writes ([`quote`], [`line()`]) and the answer blocks it reads back
//! ([`Blocks`]), and the commands that let it hear a pane's output ([`link_args`]). No
//! processes, no I/O.
//!
//! tmux tells a control client of the output of panes in its own session only, so a worker's
//! window is linked into [`CONTROL_SESSION`] too.
//!
//! A command line is one line: a word holding a newline (or any control character) is refused
//! before anything is written, since what followed the newline would run as a command of its
//! own and every later answer would be read as the answer to the command before it.

use fleet_core::typed::{ControlChar, first_control};

use crate::MuxError;

/// The session the control client lives in; never a worker's, never listed as one.
pub const CONTROL_SESSION: &str = "_fleetd";

/// The name of the control client's own window in [`CONTROL_SESSION`] (whose pane does
/// nothing), to tell it from the workers' windows linked there.
pub const CONTROL_WINDOW: &str = "_fleetd";

/// Quotes `arg` for tmux's command parser: single quotes when it has none, else double quotes
/// with `\`, `"`, `$` and `~` escaped (tmux 3.3a's parser expands a `~` that opens a double-quoted
/// word into a home directory). An `arg` holding a control character has no quoted form.
pub fn quote(arg: &str) -> Result<String, ControlChar> {
    if let Some(found) = first_control(arg) {
        return Err(found);
    }
    if !arg.contains('\'') {
        return Ok(format!("'{arg}'"));
    }
    let mut quoted = String::with_capacity(arg.len() + 2);
    quoted.push('"');
    for c in arg.chars() {
        if matches!(c, '\\' | '"' | '$' | '~') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    Ok(quoted)
}

/// One command line from words, each quoted; refused if a word has no quoted form, naming the
/// command and the word's place (never the word: it may carry a token).
pub fn line<S: AsRef<str>>(words: &[S]) -> Result<String, MuxError> {
    let mut quoted = Vec::with_capacity(words.len());
    for (i, word) in words.iter().enumerate() {
        let word = quote(word.as_ref()).map_err(|found| {
            MuxError::Refused(format!(
                "word {i} of a tmux {} command holds {found}, which would end its command line",
                name(words)
            ))
        })?;
        quoted.push(word);
    }
    Ok(quoted.join(" "))
}

/// The command `words` run, as errors may name it (the rest may carry a token).
pub fn name<S: AsRef<str>>(words: &[S]) -> String {
    words
        .first()
        .map(|w| w.as_ref().escape_debug().to_string())
        .unwrap_or_default()
}

/// Reassembles answer blocks from control-mode lines.
#[derive(Debug, Default)]
pub struct Blocks {
    /// The command number of the open block, and its lines so far.
    open: Option<(String, Vec<String>)>,
}

/// What a line meant.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen<'a> {
    /// Nothing finished yet (a notification, or a line inside a block).
    Nothing,
    /// The pane with this id printed something (`%output`, `%extended-output`).
    Output(&'a str),
    /// A block ended well: its lines.
    Done(Vec<String>),
    /// A block ended in `%error`: its lines (the message).
    Failed(Vec<String>),
    /// The client is leaving (`%exit`: the server stopped or detached us).
    Exit,
}

/// The command number of a `%begin`/`%end`/`%error` line: `%end TIME NUMBER FLAGS`.
fn number(rest: &str) -> Option<&str> {
    rest.split(' ').nth(1)
}

impl Blocks {
    /// Whether a block is open: its lines are an answer's, whatever they look like.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Feeds one line (without its newline).
    pub fn feed<'a>(&mut self, line: &'a str) -> Seen<'a> {
        if let Some((open_number, lines)) = &mut self.open {
            let closing = line
                .strip_prefix("%end ")
                .map(|rest| (rest, true))
                .or_else(|| line.strip_prefix("%error ").map(|rest| (rest, false)));
            if let Some((rest, ok)) = closing
                && number(rest) == Some(open_number.as_str())
            {
                let lines = std::mem::take(lines);
                self.open = None;
                return if ok {
                    Seen::Done(lines)
                } else {
                    Seen::Failed(lines)
                };
            }
            lines.push(line.to_string());
            return Seen::Nothing;
        }
        if let Some(rest) = line.strip_prefix("%begin ") {
            if let Some(n) = number(rest) {
                self.open = Some((n.to_string(), Vec::new()));
            }
            return Seen::Nothing;
        }
        if line == "%exit" || line.starts_with("%exit ") {
            return Seen::Exit;
        }
        match output_pane(line.as_bytes()) {
            Some(pane) => Seen::Output(pane),
            None => Seen::Nothing,
        }
    }
}

/// The pane a `%output %N DATA` or `%extended-output %N AGE … : DATA` line is about. Read
/// off the line's bytes: what a pane printed comes raw, not always UTF-8, and may be long.
pub fn output_pane(line: &[u8]) -> Option<&str> {
    let rest = line
        .strip_prefix(b"%output ")
        .or_else(|| line.strip_prefix(b"%extended-output "))?;
    let end = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
    let pane = std::str::from_utf8(&rest[..end]).ok()?;
    (pane.len() > 1 && pane.starts_with('%')).then_some(pane)
}

/// Links the window of `pane` into the control client's session (after the windows there,
/// not made current), so the client hears its output.
pub fn link_args(pane: &str) -> Vec<String> {
    let target = format!("{CONTROL_SESSION}:");
    ["link-window", "-d", "-s", pane, "-t", &target]
        .map(String::from)
        .to_vec()
}

/// Succeeds only on a server holding the control client's session (by its exact name).
pub fn has_control_session_args() -> Vec<String> {
    let target = format!("={CONTROL_SESSION}");
    ["has-session", "-t", &target].map(String::from).to_vec()
}

/// Prints the sessions the window of `pane` is linked into, comma-separated.
pub fn linked_sessions_args(pane: &str) -> Vec<String> {
    [
        "display-message",
        "-p",
        "-t",
        pane,
        "#{window_linked_sessions_list}",
    ]
    .map(String::from)
    .to_vec()
}

/// Whether the answer to [`linked_sessions_args`] names the control client's session.
pub fn is_linked(answer: &[String]) -> bool {
    answer
        .iter()
        .flat_map(|line| line.split(','))
        .any(|session| session == CONTROL_SESSION)
}

/// Lists the panes of the windows in the control client's session (its own, and those
/// linked into it; a window linked twice shows twice).
pub fn linked_panes_args() -> Vec<String> {
    [
        "list-panes",
        "-s",
        "-t",
        CONTROL_SESSION,
        "-F",
        "#{pane_id}",
    ]
    .map(String::from)
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_tmux_syntax() {
        let quoted = |arg: &str| quote(arg).unwrap();
        assert_eq!(quoted("%3"), "'%3'");
        assert_eq!(
            quoted("#{cursor_x} #{cursor_y}"),
            "'#{cursor_x} #{cursor_y}'"
        );
        assert_eq!(quoted("a;b"), "'a;b'");
        assert_eq!(
            quoted("it's $HOME \"x\"\\"),
            "\"it's \\$HOME \\\"x\\\"\\\\\""
        );
        // A `~` opening a double-quoted word would be a home directory.
        assert_eq!(quoted("~/x it's"), "\"\\~/x it's\"");
        assert_eq!(quoted("~/x"), "'~/x'");
        assert_eq!(
            line(&["send-keys", "-t", "%1", "Enter"]).unwrap(),
            "'send-keys' '-t' '%1' 'Enter'"
        );
    }

    #[test]
    fn no_line_ever_holds_a_control_character() {
        // In single quotes and in double quotes alike (a word with a quote takes the latter).
        for arg in [
            "a\nrun-shell touch /tmp/owned",
            "it's\nrun-shell x",
            "\r",
            "\t",
            "\u{85}",
        ] {
            assert!(quote(arg).is_err(), "{arg:?}");
        }
        let err = line(&[
            "new-session",
            "-e",
            "FLEET_TOKEN=fleet_s3cret\nrun-shell 'touch /tmp/owned'",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("word 2 of a tmux new-session command"),
            "{err}"
        );
        assert!(err.contains("U+000A (newline)"), "{err}");
        assert!(
            !err.contains("s3cret") && !err.contains("run-shell"),
            "{err}"
        );
    }

    #[test]
    fn blocks_are_reassembled_output_named_and_notifications_skipped() {
        let transcript = [
            "%begin 1796047536 260 0",
            "%end 1796047536 260 0",
            "%window-add @0",
            "%output %0 hi\\015\\012",
            "%begin 1796047536 268 1",
            "17069 x",
            "%end 1796047536 999 1",
            "%end 1796047536 268 1",
            "%sessions-changed",
            "%begin 1796047538 270 1",
            "parse error: unknown command: bogus-cmd",
            "%error 1796047538 270 1",
            "%exit",
        ];
        let mut blocks = Blocks::default();
        let seen: Vec<Seen> = transcript
            .iter()
            .map(|l| blocks.feed(l))
            .filter(|s| *s != Seen::Nothing)
            .collect();
        assert_eq!(
            seen,
            vec![
                Seen::Done(vec![]),
                Seen::Output("%0"),
                // A line that only looks like the end of another block stays content.
                Seen::Done(vec!["17069 x".into(), "%end 1796047536 999 1".into()]),
                Seen::Failed(vec!["parse error: unknown command: bogus-cmd".into()]),
                Seen::Exit,
            ]
        );
    }

    #[test]
    fn output_outside_a_block_names_its_pane() {
        let mut blocks = Blocks::default();
        assert_eq!(blocks.feed("%output %12 hi\\015\\012"), Seen::Output("%12"));
        assert_eq!(blocks.feed("%output %3 "), Seen::Output("%3"));
        assert_eq!(
            blocks.feed("%extended-output %7 120 : more"),
            Seen::Output("%7")
        );
        // Not a pane id: skipped, as any other notification.
        assert_eq!(blocks.feed("%output x1 hi"), Seen::Nothing);
        assert_eq!(blocks.feed("%output % hi"), Seen::Nothing);
        assert_eq!(blocks.feed("%outputs %1 hi"), Seen::Nothing);
        // What a pane printed comes raw: bytes that are not UTF-8 do not hide the pane.
        assert_eq!(output_pane(b"%output %3 \xff\xfe\x80 tail"), Some("%3"));
        assert_eq!(output_pane(b"%output %3"), Some("%3"));
        // Inside a block, a line that looks like output is the answer's content.
        blocks.feed("%begin 1 5 1");
        assert_eq!(blocks.feed("%output %1 typed by a pane"), Seen::Nothing);
        assert_eq!(
            blocks.feed("%end 1 5 1"),
            Seen::Done(vec!["%output %1 typed by a pane".into()])
        );
    }

    #[test]
    fn a_pane_is_linked_into_the_control_session_once() {
        assert_eq!(
            link_args("%4"),
            ["link-window", "-d", "-s", "%4", "-t", "_fleetd:"]
                .map(String::from)
                .to_vec()
        );
        assert!(is_linked(&["w1,_fleetd".into()]));
        assert!(!is_linked(&["w1".into()]));
        assert!(!is_linked(&["w1,_fleetd2".into()]));
        // Every command is one line tmux reads back as these words.
        for words in [
            link_args("%4"),
            linked_sessions_args("%4"),
            linked_panes_args(),
        ] {
            assert!(line(&words).is_ok(), "{words:?}");
        }
    }
}
