//! tmux control mode's lines (`tmux -C`), the pure half of [`crate::tmux::control`]: the
//! command line a client writes ([`quote`], [`line()`]) and the answer blocks it reads back
//! ([`Blocks`]). No processes, no I/O.
//!
//! A command line is one line: a word holding a newline (or any control character) is refused
//! before anything is written, since what followed the newline would run as a command of its
//! own and every later answer would be read as the answer to the command before it.

use fleet_core::typed::{ControlChar, first_control};

use crate::MuxError;

/// The session the control client lives in; never a worker's, never listed as one.
pub const CONTROL_SESSION: &str = "_fleetd";

/// Quotes `arg` for tmux's command parser: single quotes when it has none, else double quotes
/// with `\`, `"` and `$` escaped. An `arg` holding a control character has no quoted form.
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
        if matches!(c, '\\' | '"' | '$') {
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
pub enum Seen {
    /// Nothing finished yet (a notification, or a line inside a block).
    Nothing,
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
    /// Feeds one line (without its newline).
    pub fn feed(&mut self, line: &str) -> Seen {
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
        Seen::Nothing
    }
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
    fn blocks_are_reassembled_and_notifications_skipped() {
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
                // A line that only looks like the end of another block stays content.
                Seen::Done(vec!["17069 x".into(), "%end 1796047536 999 1".into()]),
                Seen::Failed(vec!["parse error: unknown command: bogus-cmd".into()]),
                Seen::Exit,
            ]
        );
    }
}
