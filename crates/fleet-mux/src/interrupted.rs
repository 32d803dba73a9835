//! What became of a task fleetd was typing when it stopped (a crash, `kill -9`), read off the
//! pane by the next start, which took the worker back. fleetd takes a task off its queue before
//! it types it, notes in the store before its first key and before its first Enter go in
//! ([`crate::inject::Steps`]; the first while the screen is first looked at, the second once
//! the paste shows), and records it typed only once the submit was seen; a stop
//! in between leaves it `injecting`. Without the first note, it was never typed (type it
//! again); without the second, it was not submitted (in the input box: press Enter; nowhere:
//! type it again). After its Enter, only the pane can tell: submitted (the worker is on it: its
//! reply answers it) or still in the box. Where the pane cannot tell, nothing is typed again: a
//! task typed twice is work done twice, and the next start says it does not know.

use crate::Snapshot;

/// How Claude Code shows a long or many-line paste in its input box and its transcript,
/// instead of the text.
pub const COLLAPSED_PASTE: &str = "[Pasted text";
/// How many characters of a task's first and last lines are looked for on the screen: enough
/// to tell tasks apart, short enough to fit a narrow pane's row.
const PROBE_CHARS: usize = 24;
/// How many screen rows up from the cursor a paste's last line may have wrapped over.
const WRAPPED_ROWS: usize = 3;

/// What the pane shows of an interrupted task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupted {
    /// The program took it: it shows in what the pane printed, and the input box holds it no
    /// longer.
    Submitted,
    /// It sits in the input box, pasted but not submitted: Enter submits it.
    InInput,
    /// Its keys never went to the pane: it never reached the program.
    NotTyped,
    /// The pane cannot tell, for this reason.
    Unsure(&'static str),
}

/// How far fleetd's notes say the typing of a task got ([`crate::inject::Steps`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// No key went in.
    NoKeys,
    /// Its keys may have gone in; its Enter did not.
    Pasted,
    /// Its Enter may have gone in too.
    Entered,
}

/// What is known of an interrupted task and of its pane.
#[derive(Clone, Copy, Debug)]
pub struct Interruption<'a> {
    /// The text fleetd was typing.
    pub typed: &'a str,
    /// How far its typing got, by fleetd's notes.
    pub stage: Stage,
    /// What the pane shows now.
    pub screen: &'a Snapshot,
    /// The pane's recent output, lines unwrapped, through what the screen shows.
    pub history: &'a str,
    /// The text the program shows in front of its input box, when known (see
    /// [`crate::inject::InjectOptions::submitted_marker`]).
    pub marker: Option<&'a str>,
    /// The texts typed into the same worker before it: seeing a line of it proves nothing if
    /// one of them showed that line too.
    pub earlier: &'a [String],
}

/// What became of the task `it` describes. Without its keys, it was never typed. Pasted
/// without its Enter, it cannot have been submitted: it is in the input box (Enter), or, with
/// nothing of it on the pane, the paste never arrived. Once its Enter may have gone, it is
/// taken or pasted only on what the pane shows of it, and nothing shown is
/// [`Interrupted::Unsure`] (a program that echoes nothing, an alternate screen that scrolled
/// the task away, a box holding a draft typed since).
pub fn what_became_of(it: &Interruption<'_>) -> Interrupted {
    if it.stage == Stage::NoKeys {
        return Interrupted::NotTyped;
    }
    let mut lines = it.typed.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(first) = lines.next() else {
        return Interrupted::Unsure("it is blank");
    };
    let first = first_chars(first, PROBE_CHARS);
    // The line to look for in what the program printed: the first one no task typed before
    // showed (a label line, say, begins many).
    let head = std::iter::once(first)
        .chain(lines.map(|l| first_chars(l, PROBE_CHARS)))
        .find(|line| !it.earlier.iter().any(|text| shows(text, line)));
    let shown = head.is_some_and(|head| shows(it.history, head));
    let unseen = match it.marker {
        Some(marker) => match input_box(it.screen, marker) {
            Some(held) if begins_alike(held, first) || held.contains(COLLAPSED_PASTE) => {
                return Interrupted::InInput;
            }
            Some("") => "nothing on the pane shows it, its input box empty",
            Some(_) => "its input box holds something else",
            None => "the program's input box is not on screen",
        },
        None if cursor_tells(it) && ends_at_cursor(it.screen, it.typed) => {
            return Interrupted::InInput;
        }
        None => "nothing on the pane shows it",
    };
    if it.stage == Stage::Pasted {
        // No Enter went: not in its box, it never arrived (shown elsewhere, it is a puzzle).
        return if shown {
            Interrupted::Unsure("it shows on the pane outside the input box, and no Enter went")
        } else {
            Interrupted::NotTyped
        };
    }
    if shown {
        Interrupted::Submitted
    } else if head.is_none() {
        Interrupted::Unsure("every line of it was in a task typed before into the same worker")
    } else {
        Interrupted::Unsure(unseen)
    }
}

/// What the input box holds (trimmed): the row nearest the cursor that opens with `marker`
/// (after blanks or a box's border); `None` if no row does.
fn input_box<'t>(screen: &'t Snapshot, marker: &str) -> Option<&'t str> {
    if marker.is_empty() {
        return None;
    }
    let cursor = cursor_row(screen);
    screen
        .text
        .lines()
        .enumerate()
        .filter_map(|(row, line)| {
            let at = line.find(marker)?;
            line[..at]
                .chars()
                .all(|c| c.is_whitespace() || BORDERS.contains(c))
                .then(|| (row.abs_diff(cursor), line[at + marker.len()..].trim()))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, held)| held)
}

/// Whether a line that ends with the task where the cursor is tells that it is still in the
/// input box (of a program with no known box). With a cursor it does: a submit moves the cursor
/// off that line. Where the host tells no cursor (herdr) it does only while no Enter can have
/// gone: after an Enter, a program that has printed nothing since shows the same screen as one
/// whose Enter was lost, and the history decides, as for a program that echoes nothing.
fn cursor_tells(it: &Interruption<'_>) -> bool {
    it.screen.cursor.is_some() || it.stage == Stage::Pasted
}

/// The cursor's row; where the host tells no cursor (herdr), the last row that shows anything:
/// a line-oriented program's input line is the last it drew (a full-screen one with a footer
/// below its box draws the footer last, and there the box is not found this way).
fn cursor_row(screen: &Snapshot) -> usize {
    match screen.cursor {
        Some((_, row)) => usize::try_from(row).unwrap_or(usize::MAX),
        None => screen
            .text
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .last()
            .map_or(0, |(row, _)| row),
    }
}

/// What may stand left of an input box's marker: a box's border.
const BORDERS: &str = "│┃|╭╰║";

/// Whether `held`, the start of what an input box shows, is the start of `head`: the box
/// may wrap the line earlier than `head` ends.
fn begins_alike(held: &str, head: &str) -> bool {
    held.starts_with(head) || (head.starts_with(held) && held.chars().count() >= head_min(head))
}

/// The fewest characters of `head` that tell it apart well enough.
fn head_min(head: &str) -> usize {
    head.chars().count().min(8)
}

/// Whether a row of `history` shows `head`.
fn shows(history: &str, head: &str) -> bool {
    history.lines().any(|line| line.contains(head))
}

/// Whether the screen's text ends, at the cursor, with the end of `typed`: the paste is
/// still on the input line (a program with no known input box).
fn ends_at_cursor(screen: &Snapshot, typed: &str) -> bool {
    let Some(tail) = typed.lines().map(str::trim).rfind(|l| !l.is_empty()) else {
        return false;
    };
    let tail = last_chars(tail, PROBE_CHARS);
    let rows: Vec<&str> = screen.text.lines().collect();
    let at = cursor_row(screen);
    let Some(row) = rows.get(at) else {
        return false;
    };
    if row.trim().is_empty() {
        return false;
    }
    let from = at.saturating_sub(WRAPPED_ROWS - 1);
    let joined: String = rows[from..=at].iter().map(|r| r.trim_end()).collect();
    joined.ends_with(tail)
}

/// The first `n` characters of `text`.
fn first_chars(text: &str, n: usize) -> &str {
    text.char_indices()
        .nth(n)
        .map_or(text, |(at, _)| &text[..at])
}

/// The last `n` characters of `text`.
fn last_chars(text: &str, n: usize) -> &str {
    let count = text.chars().count();
    text.char_indices()
        .nth(count.saturating_sub(n))
        .map_or(text, |(at, _)| &text[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK: &str = "❯\u{a0}";

    /// A screen with the cursor at (column, row).
    fn snap(cursor: (u32, u32), text: &str) -> Snapshot {
        Snapshot {
            cursor: Some(cursor),
            in_mode: false,
            text: text.into(),
        }
    }

    /// What became of `typed`, its keys sent, with `history` the screen's own text.
    fn became(typed: &str, screen: &Snapshot, marker: Option<&str>) -> Interrupted {
        after(typed, screen, &screen.text, marker, &[])
    }

    fn after(
        typed: &str,
        screen: &Snapshot,
        history: &str,
        marker: Option<&str>,
        earlier: &[String],
    ) -> Interrupted {
        what_became_of(&Interruption {
            typed,
            stage: Stage::Entered,
            screen,
            history,
            marker,
            earlier,
        })
    }

    fn unsure(verdict: Interrupted) -> bool {
        matches!(verdict, Interrupted::Unsure(_))
    }

    #[test]
    fn without_its_keys_sent_a_task_was_never_typed_whatever_the_pane_shows() {
        let task = "fix the flaky test";
        let screen = snap((0, 2), "> fix the flaky test\n[task 1: 18 bytes]\n");
        let it = Interruption {
            typed: task,
            stage: Stage::NoKeys,
            screen: &screen,
            history: &screen.text,
            marker: None,
            earlier: &[],
        };
        assert_eq!(what_became_of(&it), Interrupted::NotTyped);
    }

    #[test]
    fn pasted_without_its_enter_a_task_is_in_the_box_or_never_arrived() {
        let task = "refactor the parser";
        let at = |screen: &Snapshot, marker| {
            what_became_of(&Interruption {
                typed: task,
                stage: Stage::Pasted,
                screen,
                history: &screen.text,
                marker,
                earlier: &[],
            })
        };
        let in_box = snap((21, 1), &format!("welcome\n{MARK}refactor the parser\n"));
        assert_eq!(at(&in_box, Some(MARK)), Interrupted::InInput);
        let empty = snap((2, 1), &format!("welcome\n{MARK}\n"));
        assert_eq!(at(&empty, Some(MARK)), Interrupted::NotTyped);
        let on_line = snap((21, 1), "ready\n> refactor the parser");
        assert_eq!(at(&on_line, None), Interrupted::InInput);
        let nothing = snap((2, 1), "ready\n> ");
        assert_eq!(at(&nothing, None), Interrupted::NotTyped);
        // Shown, but not where a paste waits: no Enter went, so it is not taken either.
        let elsewhere = snap((2, 2), "> refactor the parser\n[task 1: 19 bytes]\n> ");
        assert!(unsure(at(&elsewhere, None)));
    }

    #[test]
    fn a_plain_program_shows_a_paste_on_its_input_line_until_enter() {
        let task = "fix the flaky test in crates/store\nand say which";
        // Pasted: the last line of the task ends where the cursor is.
        let screen = snap(
            (13, 2),
            "sim w1 ready\n> fix the flaky test in crates/store\nand say which",
        );
        assert_eq!(became(task, &screen, None), Interrupted::InInput);
        // Submitted: the program printed on, the cursor is past it.
        let screen = snap(
            (2, 4),
            "sim w1 ready\n> fix the flaky test in crates/store\nand say which\n[task 1: 47 bytes]\n> ",
        );
        assert_eq!(became(task, &screen, None), Interrupted::Submitted);
        // Its keys went in, and nothing shows them (a program that echoes nothing): unknown.
        let screen = snap((2, 1), "sim w1 ready\n> ");
        assert!(unsure(became(task, &screen, None)));
    }

    #[test]
    fn a_paste_wrapped_over_rows_is_still_seen_at_the_cursor() {
        let task = format!("do it {}", "x".repeat(40));
        // A 20-column pane: the task's end wrapped over three rows.
        let screen = snap(
            (8, 3),
            "ready\n> do it xxxxxxxxxxxx\nxxxxxxxxxxxxxxxxxxxx\nxxxxxxxx",
        );
        let history = "ready\n> do it xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
        assert_eq!(
            after(&task, &screen, history, None, &[]),
            Interrupted::InInput
        );
    }

    #[test]
    fn where_the_host_tells_no_cursor_the_last_row_drawn_is_the_cursors_until_an_enter_went() {
        let task = "fix the flaky test";
        let cursorless = |text: &str| Snapshot {
            cursor: None,
            in_mode: false,
            text: text.into(),
        };
        let at = |stage: Stage, screen: &Snapshot, marker: Option<&str>| {
            what_became_of(&Interruption {
                typed: task,
                stage,
                screen,
                history: &screen.text,
                marker,
                earlier: &[],
            })
        };
        // herdr's screens: the paste on the last row drawn, blank rows under it. No Enter went:
        // it is in the box (a cursor at (0, 0) read the first row, and failed it as unsure).
        let pasted = cursorless("sim w1 ready\n> fix the flaky test\n\n\n");
        assert_eq!(at(Stage::Pasted, &pasted, None), Interrupted::InInput);
        // Its Enter may have gone: the same screen is also a program that took it and printed
        // nothing since. Its history shows it: taken, never pressed again.
        assert_eq!(at(Stage::Entered, &pasted, None), Interrupted::Submitted);
        // Shown on a row above the last, the program's prompt after it: taken.
        let taken = cursorless("> fix the flaky test\n[task 1: 18 bytes]\n> \n");
        assert_eq!(at(Stage::Entered, &taken, None), Interrupted::Submitted);
        // With no Enter, shown above the last row is not in the box: a puzzle, never typed again.
        assert!(unsure(at(Stage::Pasted, &taken, None)));
        // The box nearest the last row drawn is the one that counts, not the first: here the
        // last box is empty and the first shows the task, so it was taken.
        let boxes = cursorless(&format!("{MARK}fix the flaky test\nout\n{MARK}\n"));
        assert_eq!(
            at(Stage::Entered, &boxes, Some(MARK)),
            Interrupted::Submitted
        );
        let boxes = cursorless(&format!("{MARK}older\nout\n{MARK}fix the flaky test\n"));
        assert_eq!(at(Stage::Entered, &boxes, Some(MARK)), Interrupted::InInput);
    }

    #[test]
    fn a_submitted_task_scrolled_off_the_screen_is_found_in_the_history() {
        let task = "summarise the design doc";
        let screen = snap((2, 2), "line 40 of output\nline 41 of output\n> ");
        let history = "> summarise the design doc\n[task 3: 24 bytes]\nline 1 of output\nline 41 of output\n> ";
        assert_eq!(
            after(task, &screen, history, None, &[]),
            Interrupted::Submitted
        );
        // Scrolled out of the history too (an alternate screen keeps none): unknown, never
        // typed again.
        assert!(unsure(after(task, &screen, &screen.text, None, &[])));
    }

    #[test]
    fn claude_codes_input_box_tells_pasted_from_taken() {
        let task = "refactor the parser so that it streams";
        // In the box: pasted, not submitted.
        let screen = snap(
            (40, 2),
            &format!("welcome\n\n{MARK}refactor the parser so that it streams\n"),
        );
        assert_eq!(became(task, &screen, Some(MARK)), Interrupted::InInput);
        // Collapsed in the box, inside the box's border.
        let screen = snap(
            (30, 1),
            &format!("welcome\n│ {MARK}[Pasted text #1 +12 lines]\n"),
        );
        assert_eq!(became(task, &screen, Some(MARK)), Interrupted::InInput);
        // Taken: the transcript shows it, the box is empty.
        let screen = snap(
            (2, 3),
            &format!("> refactor the parser so that it streams\n\n✻ Working…\n{MARK}\n"),
        );
        assert_eq!(became(task, &screen, Some(MARK)), Interrupted::Submitted);
        // Taken, and a draft typed into the box since.
        let screen = snap(
            (12, 3),
            &format!(
                "> refactor the parser so that it streams\n\n✻ Working…\n{MARK}half a thought\n"
            ),
        );
        assert_eq!(became(task, &screen, Some(MARK)), Interrupted::Submitted);
        // Its keys went in, and neither the box nor the transcript shows them: unknown.
        let screen = snap((2, 1), &format!("welcome\n{MARK}\n"));
        assert!(unsure(became(task, &screen, Some(MARK))));
        let screen = snap((12, 1), &format!("welcome\n{MARK}half a thought\n"));
        assert!(unsure(became(task, &screen, Some(MARK))));
    }

    #[test]
    fn the_marker_counts_only_where_an_input_box_opens_and_nearest_the_cursor() {
        // The task's own text holds the marker mid-line (pasted into the box, on its second
        // row): the box is the row the cursor is in.
        let task = format!("first line of it\nsee {MARK}here");
        let screen = snap(
            (12, 1),
            &format!("> an earlier task\n{MARK}first line of it\n  see {MARK}here\n"),
        );
        assert_eq!(became(&task, &screen, Some(MARK)), Interrupted::InInput);
    }

    #[test]
    fn what_the_screen_cannot_tell_is_unsure_never_typed_again() {
        let task = "run the tests";
        // The box is not on screen (a dialog over it) and nothing shows the task.
        let screen = snap((0, 1), "Do you want to proceed?\n  1. Yes\n");
        assert!(unsure(became(task, &screen, Some(MARK))));
        // ... but a task the transcript shows was taken, dialog or not.
        let screen = snap(
            (0, 2),
            "> run the tests\nDo you want to proceed?\n  1. Yes\n",
        );
        assert_eq!(became(task, &screen, Some(MARK)), Interrupted::Submitted);
        // Collapsed pastes show no text: an empty box with one in the transcript cannot tell.
        let long = "one\ntwo\nthree\nfour";
        let screen = snap((2, 1), &format!("> [Pasted text #1 +3 lines]\n{MARK}\n"));
        assert!(unsure(became(long, &screen, Some(MARK))));
    }

    #[test]
    fn a_first_line_typed_before_proves_nothing() {
        let task = "run the tests again";
        let screen = snap((2, 3), "> run the tests again\n[task 1: 19 bytes]\n\n> ");
        let earlier = vec!["run the tests again".to_string()];
        assert!(unsure(after(task, &screen, &screen.text, None, &earlier)));
        // Still on the input line, it is this one, whatever came before.
        let screen = snap(
            (21, 3),
            "> run the tests again\n[task 1: 19 bytes]\n\n> run the tests again",
        );
        assert_eq!(
            after(task, &screen, &screen.text, None, &earlier),
            Interrupted::InInput
        );
    }

    #[test]
    fn a_label_line_every_task_begins_with_is_passed_over() {
        let task = "[fleet task from alice]\n/ask 5 c54 may I?";
        let earlier = vec!["[fleet task from alice]\n/ask 5 c53 may I?".to_string()];
        let before = "> [fleet task from alice]\n/ask 5 c53 may I?\n[task 1: 40 bytes]\n> ";
        let screen = snap((2, 3), before);
        assert!(unsure(after(task, &screen, before, None, &earlier)));
        let taken =
            format!("{before}[fleet task from alice]\n/ask 5 c54 may I?\n[task 2: 40 bytes]\n");
        let screen = snap((0, 6), &taken);
        assert_eq!(
            after(task, &screen, &taken, None, &earlier),
            Interrupted::Submitted
        );
    }

    #[test]
    fn probes_cut_on_character_boundaries() {
        assert_eq!(first_chars("héllo", 2), "hé");
        assert_eq!(first_chars("hé", 5), "hé");
        assert_eq!(last_chars("héllo wörld", 4), "örld");
        assert_eq!(last_chars("ö", 4), "ö");
    }
}
