//! Text from outside (a caller's name, a parser's complaint quoting what it was sent, a log
//! field) as fleetd repeats it: its control characters and the characters that end a line or
//! reorder text escaped, so it stays one inert line wherever it is shown (a log, a terminal,
//! an error a lead reads), and, where it is repeated in an answer, cut short.

use std::fmt::{self, Write as _};

/// Whether `c` is shown escaped: the control characters (C0, DEL, C1) and those
/// that end a line or reorder text without being controls (line and paragraph separators, the
/// bidirectional marks, embeddings, overrides and isolates, the byte-order mark).
pub fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// A [`fmt::Write`] that escapes what passes through it into `0`: `\n`, `\r` and `\t` as such,
/// any other character [`escaped`] picks as `\u{…}` (ESC is `\u{1b}`). Nothing else changes,
/// a backslash included: the escapes only keep a line one line.
pub struct Escaping<'a, W: fmt::Write>(pub &'a mut W);

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.find(escaped) {
            self.0.write_str(&rest[..at])?;
            let mut chars = rest[at..].chars();
            let Some(c) = chars.next() else {
                break;
            };
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                c => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
            }
            rest = chars.as_str();
        }
        self.0.write_str(rest)
    }
}

/// `text` with what [`escaped`] picks escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let _ = Escaping(&mut out).write_str(text);
    out
}

/// `text` escaped, cut to at most `max_chars` characters of the escaped text (an ellipsis
/// marks a cut): how an answer repeats text it was given.
pub fn cut(text: &str, max_chars: usize) -> String {
    let escaped = escape(text);
    let mut chars = escaped.chars();
    let mut shown: String = chars.by_ref().take(max_chars).collect();
    if chars.next().is_some() {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_plain_text_alone() {
        assert_eq!(
            escape("w1 is idle, 3 held: ok é ✓"),
            "w1 is idle, 3 held: ok é ✓"
        );
        assert_eq!(
            escape("a\tb\u{7f}c\u{9b}d\u{202e}"),
            "a\\tb\\u{7f}c\\u{9b}d\\u{202e}"
        );
        assert_eq!(escape(""), "");
    }

    #[test]
    fn a_cut_is_escaped_first_and_says_it_was_cut() {
        assert_eq!(cut("w\u{1b}[2J", 64), "w\\u{1b}[2J");
        assert_eq!(cut(&"y".repeat(10), 4), "yyyy…");
        assert_eq!(cut("yyyy", 4), "yyyy");
        // The escapes count: the cut bounds what is shown.
        assert_eq!(cut("\n\n\n", 4), "\\n\\n…");
        assert_eq!(cut("", 4), "");
    }
}
