//! What may be typed into a pane. fleetd types tasks into programs that can run commands, so
//! whatever a message holds must arrive as inert text: a control character is a key (ESC starts
//! an escape sequence, `ESC [ 2 0 1 ~` ends a bracketed paste early so what follows is typed as
//! keys; Ctrl-C, Shift+Tab, a lone CR submit or switch modes), so none may pass. The one rule
//! lives here: [`typeable`] decides, for every path that types (a local task, a task from the
//! broker, a nudge).

use std::borrow::Cow;
use std::fmt;

use crate::error::FleetError;

/// A character that cannot be typed, and where it stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlChar {
    /// The character.
    pub ch: char,
    /// Its position in the text, counted in characters from 0.
    pub offset: usize,
}

impl fmt::Display for ControlChar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a control character, U+{:04X}{}, at character {}",
            u32::from(self.ch),
            name(self.ch).map(|n| format!(" ({n})")).unwrap_or_default(),
            self.offset
        )
    }
}

impl ControlChar {
    /// The error a sender gets: what was found, where, and what to send instead.
    pub fn refusal(&self) -> FleetError {
        FleetError::invalid(format!(
            "the message holds {self}: messages are typed into a terminal, where control characters act as keys; send plain text (newlines and tabs are fine)"
        ))
    }
}

/// A short name for the controls people meet.
fn name(ch: char) -> Option<&'static str> {
    Some(match ch {
        '\u{0}' => "NUL",
        '\u{3}' => "Ctrl-C",
        '\u{4}' => "Ctrl-D",
        '\u{8}' => "backspace",
        '\t' => "tab",
        '\n' => "newline",
        '\r' => "CR",
        '\u{1b}' => "ESC",
        '\u{7f}' => "DEL",
        '\u{9b}' => "CSI",
        _ => return None,
    })
}

/// Whether `ch` may never be typed: the C0 controls but `\n` and `\t`, DEL, and the C1 controls
/// (U+0080–U+009F; some terminals read U+009B as ESC `[`). `\r` is not here: [`typeable`]
/// turns it into `\n` first.
pub fn is_forbidden(ch: char) -> bool {
    (ch.is_ascii_control() && ch != '\n' && ch != '\t') || ('\u{80}'..='\u{9f}').contains(&ch)
}

/// The first control character of any kind in `text` (`\n` and `\t` included): for text that
/// must stay on one line and mean itself, such as a path or a command-line argument.
pub fn first_control(text: &str) -> Option<ControlChar> {
    text.chars()
        .enumerate()
        .find(|(_, ch)| ch.is_control())
        .map(|(offset, ch)| ControlChar { ch, offset })
}

/// `text` as it may be typed into a pane: `\r\n` and a lone `\r` become `\n` (a CR is Enter to a
/// terminal program), and any other control character (see [`is_forbidden`]) refuses the whole
/// text, naming the first.
pub fn typeable(text: &str) -> Result<Cow<'_, str>, ControlChar> {
    let mut has_cr = false;
    for (offset, ch) in text.chars().enumerate() {
        if ch == '\r' {
            has_cr = true;
        } else if is_forbidden(ch) {
            return Err(ControlChar { ch, offset });
        }
    }
    if !has_cr {
        return Ok(Cow::Borrowed(text));
    }
    Ok(Cow::Owned(text.replace("\r\n", "\n").replace('\r', "\n")))
}

/// Whether `text` opens (after any blank) with one of `prefixes`: the characters an agent's
/// input box reads as a command when they start the input (Claude Code: `!` runs what follows
/// in a shell, `/` a slash command, `#` writes a memory), whatever the rest holds.
pub fn opens_a_command(text: &str, prefixes: &[char]) -> bool {
    text.trim_start()
        .chars()
        .next()
        .is_some_and(|first| prefixes.contains(&first))
}

/// Where the first line ends in `text` (a newline or a CR), counted in characters: for a
/// program that takes one line at a time, what follows would be a submit of its own.
pub fn first_line_end(text: &str) -> Option<usize> {
    text.chars().position(|c| c == '\n' || c == '\r')
}

/// The error a sender gets for a multi-line message to `name`, whose program takes one line at
/// a time.
pub fn multi_line_refusal(name: &str, offset: usize) -> FleetError {
    FleetError::invalid(format!(
        "the message holds a line break at character {offset}, and '{name}' takes one line at a time (its profile sets single_line): what follows would reach it as a task of its own; send one line"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_paste_breakout_is_refused_at_its_escape() {
        let err = typeable("echo part-one\u{1b}[201~\recho smuggled-two\r").unwrap_err();
        assert_eq!(
            err,
            ControlChar {
                ch: '\u{1b}',
                offset: 13
            }
        );
        let refusal = err.refusal();
        assert_eq!(refusal.code, crate::ErrorCode::InvalidParams);
        assert!(
            refusal.message.contains("U+001B (ESC), at character 13"),
            "{refusal}"
        );
    }

    #[test]
    fn a_command_opening_is_found_behind_blanks_only() {
        let claude = ['!', '/', '#'];
        for opens in ["!touch x", "  /add-dir /etc", "\n\t#remember", "/"] {
            assert!(opens_a_command(opens, &claude), "{opens:?}");
        }
        for plain in ["fix /src/main.rs", "say !hi", "", "   ", "[fleet] !x"] {
            assert!(!opens_a_command(plain, &claude), "{plain:?}");
        }
        assert!(!opens_a_command("!x", &[]));
    }

    #[test]
    fn a_line_break_is_found_wherever_it_is() {
        assert_eq!(first_line_end("one line"), None);
        assert_eq!(first_line_end("ab\ncd"), Some(2));
        assert_eq!(first_line_end("é\rx"), Some(1));
        let refusal = multi_line_refusal("sh1", 2);
        assert!(
            refusal.message.contains("'sh1' takes one line at a time"),
            "{refusal}"
        );
    }

    #[test]
    fn plain_text_passes_unchanged_and_line_ends_become_newlines() {
        assert!(matches!(
            typeable("a task\n\twith lines — ünïcode ✓"),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(
            typeable("one\r\ntwo\rthree\n").unwrap(),
            "one\ntwo\nthree\n"
        );
        assert_eq!(typeable("").unwrap(), "");
    }

    #[test]
    fn every_kind_of_control_is_named_with_its_offset() {
        for (text, ch, offset) in [
            ("\u{3}", '\u{3}', 0),
            ("ab\u{7f}", '\u{7f}', 2),
            ("é\u{9b}201~", '\u{9b}', 1),
            ("x\u{85}", '\u{85}', 1),
            ("\r\n\u{0}", '\u{0}', 2),
            ("shift-tab: \u{1b}[Z", '\u{1b}', 11),
        ] {
            assert_eq!(
                typeable(text).unwrap_err(),
                ControlChar { ch, offset },
                "{text:?}"
            );
        }
    }

    #[test]
    fn any_control_is_found_where_one_line_is_needed() {
        assert_eq!(first_control("/home/me/C#Sharp/ünï ✓"), None);
        let found = first_control("/tmp/x\nrun-shell touch /tmp/owned").unwrap();
        assert_eq!(
            found,
            ControlChar {
                ch: '\n',
                offset: 6
            }
        );
        assert_eq!(
            found.to_string(),
            "a control character, U+000A (newline), at character 6"
        );
        assert_eq!(first_control("a\tb").map(|c| c.offset), Some(1));
        assert_eq!(first_control("é\u{85}").map(|c| c.ch), Some('\u{85}'));
    }

    proptest! {
        /// Whatever the input, what may be typed holds no control character but `\n` and `\t`;
        /// and only an input holding one is refused.
        #[test]
        fn nothing_typed_holds_a_control(text in any::<String>()) {
            match typeable(&text) {
                Ok(typed) => {
                    prop_assert!(typed.chars().all(|c| !c.is_control() || c == '\n' || c == '\t'));
                    prop_assert!(!text.chars().any(is_forbidden));
                }
                Err(found) => {
                    prop_assert!(is_forbidden(found.ch));
                    prop_assert_eq!(text.chars().nth(found.offset), Some(found.ch));
                    prop_assert!(!text.chars().take(found.offset).any(is_forbidden));
                }
            }
        }

        /// Text of the controls that matter most, mixed with plain text.
        #[test]
        fn escapes_and_line_ends_never_pass(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("\u{1b}[201~".to_string()),
                    Just("\r".to_string()),
                    Just("\r\n".to_string()),
                    Just("\u{3}".to_string()),
                    Just("\u{9b}".to_string()),
                    "[a-z !/]{0,8}",
                ],
                0..12,
            )
        ) {
            let text = parts.concat();
            if let Ok(typed) = typeable(&text) {
                let escape = '\u{1b}';
                prop_assert!(!typed.contains('\r') && !typed.contains(escape), "{:?}", typed);
            }
        }
    }
}
