//! Dialogs: a worker's own program stopped on a choice (a permission prompt, a trust dialog, a
//! plan approval) while working on a task. The rules of reading one off the screen, of the
//! choices it offers, and of the keys an answer may press.
//!
//! A choice is never free text: the lead names one of the choices read off the dialog, and
//! what gets typed is that choice's key from a fixed safe set ([`Key`]): a digit, `y`, `n`,
//! Enter or Esc. An option of a cursor menu (options without numbers, the current one marked
//! `❯`) is named by a word of its own text (`yes`, `no`, …); answering it presses the arrows
//! fleetd computes from where the cursor is ([`Dialog::moves_to`]), then Enter. Nothing from the
//! screen or from the lead becomes a key any other way.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::FleetError;

/// The most lines of a dialog handed to the lead as its prompt.
pub const MAX_PROMPT_LINES: usize = 40;
/// The most characters of a dialog's prompt.
pub const MAX_PROMPT_CHARS: usize = 4_000;
/// The most characters of one choice's label.
pub const MAX_LABEL_CHARS: usize = 200;
/// The most choices a dialog may offer (digits 1-9 or a menu's options, `y`, `n`, Enter, Esc).
pub const MAX_CHOICES: usize = 16;
/// The most options a cursor menu may have to be read as one.
pub const MAX_OPTIONS: usize = 12;
/// The most characters of a menu option's name (`yes-and-dont-ask-again`), its `-2` included.
pub const MAX_OPTION_NAME: usize = 40;
/// How many lines below its marker a menu's first option may start (the dialog's text between
/// them): a menu further down is transcript, not the dialog's.
const MENU_REACH: usize = 12;
/// What marks a menu's current option at the start of its line (Claude Code's `❯`, and other
/// programs' arrows).
const CURSORS: [char; 5] = ['❯', '›', '>', '▶', '→'];

/// What Claude Code 2.1.332's dialogs say, one line of each (the catalogue, with a fixture of
/// each, is `fixtures/dialogs/CATALOGUE.md`): permission prompts (a shell command, an MCP tool,
/// a file to create or edit, a fetch), leaving plan mode, auto mode's notice, and the dialogs
/// of a start (folder trust, a project's MCP server, bypass mode's warning, a custom API key).
pub const CLAUDE_CODE_MARKERS: [&str; 11] = [
    "Do you want to proceed?",
    "Do you want to make this edit",
    "Do you want to create",
    "Do you want to allow",
    "Would you like to proceed?",
    "Exit plan mode?",
    "Enter to stay in auto mode",
    "Is this a project you created or one you trust?",
    "New MCP server found in this project",
    "running in Bypass Permissions mode",
    "Do you want to use this API key?",
];
/// What opencode 1.18.33's dialogs say: its permission prompt (for every tool, and repeated
/// calls), the step after "Allow always", and its question tool's hint line.
pub const OPENCODE_MARKERS: [&str; 3] = [
    "△ Permission required",
    "△ Always allow",
    "enter submit  esc dismiss",
];
/// What Claude Code 2.1.332 shows when a dialog's "No" (or Esc) ended its turn: it then waits
/// for what to do instead and does not call its model again.
pub const CLAUDE_CODE_TURN_OVER: [&str; 3] = [
    "Interrupted · What should Claude do instead?",
    "Rejected write to",
    "Rejected Claude's plan",
];

/// A key an answer to a dialog may press: the whole safe set. The arrows are fleetd's own
/// presses, computed to move a menu's cursor; a lead never names one ([`Key::parse`] does not
/// read them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// A digit, 1 to 9: picks a numbered option.
    Digit(u8),
    /// `y`.
    Yes,
    /// `n`.
    No,
    /// Enter.
    Enter,
    /// Esc.
    Escape,
    /// The up arrow.
    Up,
    /// The down arrow.
    Down,
    /// The left arrow.
    Left,
    /// The right arrow.
    Right,
}

impl Key {
    /// The key a choice names (`"1"`…`"9"`, `"y"`, `"n"`, `"enter"`, `"esc"`), if it is one
    /// of the keys a choice may name (never an arrow).
    pub fn parse(name: &str) -> Option<Key> {
        match name {
            "y" => Some(Key::Yes),
            "n" => Some(Key::No),
            "enter" => Some(Key::Enter),
            "esc" => Some(Key::Escape),
            _ => match name.as_bytes() {
                [d @ b'1'..=b'9'] => Some(Key::Digit(d - b'0')),
                _ => None,
            },
        }
    }

    /// The key's name, as a choice names it.
    pub fn name(self) -> String {
        match self {
            Key::Digit(d) => d.to_string(),
            Key::Yes => "y".into(),
            Key::No => "n".into(),
            Key::Enter => "enter".into(),
            Key::Escape => "esc".into(),
            Key::Up => "up".into(),
            Key::Down => "down".into(),
            Key::Left => "left".into(),
            Key::Right => "right".into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// One way out of a dialog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Choice {
    /// What to answer with (`fleet_send{turn_id, choice}`): the key it presses, `"1"`…`"9"`,
    /// `"y"`, `"n"`, `"enter"` or `"esc"`; or, for an option of a cursor menu, a name made of
    /// its text (`"yes"`, `"no"`, `"yes-and-dont-ask-again"`): fleetd moves the cursor there and
    /// presses Enter.
    pub choice: String,
    /// What the dialog says it does.
    pub label: String,
}

/// Which way a cursor menu's options run: the arrows that move its cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// One option per line (Claude Code's `❯ No` / `Yes`): Up and Down.
    Vertical,
    /// Options side by side on one line, the current one shown only in colour (opencode's
    /// `Allow once   Allow always   Reject`): Left and Right.
    Horizontal,
}

/// Where a cursor menu's cursor is, as read off the screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// How its options run.
    pub axis: Axis,
    /// The choice it is on (an index into [`Dialog::choices`]).
    pub at: usize,
}

/// What answering a choice does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Presses this key.
    Press(Key),
    /// Moves a menu's cursor to this choice (an index into [`Dialog::choices`]), then presses
    /// Enter.
    Select(usize),
}

/// A dialog as read off a screen.
///
/// Two readings are the same dialog when they say the same and offer the same, wherever the
/// cursor of its menu is (`==` ignores [`Dialog::cursor`]: the prompt does not show it).
#[derive(Clone, Debug, Eq, Serialize, Deserialize)]
pub struct Dialog {
    /// Its text, as the screen shows it (box drawing and the menu's cursor mark taken off).
    pub prompt: String,
    /// The choices it offers.
    pub choices: Vec<Choice>,
    /// For a cursor menu, where its cursor is: read on the worker's host, never sent.
    #[serde(skip)]
    pub cursor: Option<Cursor>,
    /// It has a row of options whose current one shows only in colour: read off the screen
    /// with its colours ([`read_dialog_styled`]), its cursor is known; off plain text, it is
    /// not, and none of its options can be chosen.
    #[serde(skip)]
    pub in_colour: bool,
}

impl PartialEq for Dialog {
    fn eq(&self, other: &Self) -> bool {
        self.prompt == other.prompt && self.choices == other.choices
    }
}

impl Dialog {
    /// Checks a dialog that came from elsewhere (another host): bounded, printable, and every
    /// choice one of the safe keys, once.
    pub fn check(&self) -> Result<(), FleetError> {
        let wrong = |what: String| FleetError::invalid(format!("a dialog {what}"));
        if self.prompt.chars().count() > MAX_PROMPT_CHARS {
            return Err(wrong(format!(
                "prompt is over {MAX_PROMPT_CHARS} characters"
            )));
        }
        if self.choices.is_empty() || self.choices.len() > MAX_CHOICES {
            return Err(wrong(format!(
                "must offer 1 to {MAX_CHOICES} choices, not {}",
                self.choices.len()
            )));
        }
        for (i, choice) in self.choices.iter().enumerate() {
            if Key::parse(&choice.choice).is_none() && !is_option_name(&choice.choice) {
                return Err(wrong(format!(
                    "offers a choice that is neither a safe key nor an option's name (#{i})"
                )));
            }
            if self.choices[..i].iter().any(|c| c.choice == choice.choice) {
                return Err(wrong(format!(
                    "offers the choice '{}' twice",
                    choice.choice
                )));
            }
            if choice.label.chars().count() > MAX_LABEL_CHARS
                || choice.label.chars().any(char::is_control)
            {
                return Err(wrong(format!(
                    "labels the choice '{}' with control characters or over {MAX_LABEL_CHARS} characters",
                    choice.choice
                )));
            }
        }
        if self
            .prompt
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t')
        {
            return Err(wrong("prompt holds control characters".into()));
        }
        Ok(())
    }

    /// What an answer naming `asked` does: one of the offered choices, else an error that
    /// names them.
    pub fn pick(&self, asked: &str) -> Result<Answer, FleetError> {
        self.choices
            .iter()
            .position(|c| c.choice == asked)
            .and_then(|at| match Key::parse(asked) {
                Some(key) => Some(Answer::Press(key)),
                None => is_option_name(asked).then_some(Answer::Select(at)),
            })
            .ok_or_else(|| {
                FleetError::invalid(format!(
                    "{} is not one of this dialog's choices: answer with one of {}",
                    crate::envelope::preview(asked),
                    self.offered()
                ))
            })
    }

    /// The choices it offers, as a list to read (`1, 2, esc`).
    pub fn offered(&self) -> String {
        let keys: Vec<&str> = self.choices.iter().map(|c| c.choice.as_str()).collect();
        keys.join(", ")
    }

    /// The arrows that move this menu's cursor from where it is to the option `target` (an
    /// index into the choices): none when it is there, `None` when the dialog has no cursor
    /// that was read or `target` is none of its options.
    pub fn moves_to(&self, target: usize) -> Option<Vec<Key>> {
        let cursor = self.cursor?;
        let place = |at: usize| {
            let choice = self.choices.get(at)?;
            is_option_name(&choice.choice).then(|| {
                self.choices[..at]
                    .iter()
                    .filter(|c| is_option_name(&c.choice))
                    .count()
            })
        };
        let (from, to) = (place(cursor.at)?, place(target)?);
        let (back, forth) = match cursor.axis {
            Axis::Vertical => (Key::Up, Key::Down),
            Axis::Horizontal => (Key::Left, Key::Right),
        };
        let key = if to < from { back } else { forth };
        Some(vec![key; from.abs_diff(to)])
    }

    /// Whether this reading shows the cursor on the choice `target`.
    pub fn cursor_on(&self, target: usize) -> bool {
        self.cursor.is_some_and(|c| c.at == target)
    }
}

/// Whether `name` is a menu option's name: lower-case ASCII letters and digits in words joined
/// by `-`, at most [`MAX_OPTION_NAME`] characters, and no key's name.
pub fn is_option_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_OPTION_NAME
        && Key::parse(name).is_none()
        && name.split('-').all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// The name of a menu option labelled `label`: its first words, lower case, joined by `-`
/// (`Yes, and don't ask again` → `yes-and-dont-ask-again`), `option` when it has none; a key's
/// name gets `option-` before it, and a name already `taken` a `-2`, `-3`, … after it.
fn option_name(label: &str, taken: &[Choice]) -> String {
    let mut base = String::new();
    let words = label
        .split(|c: char| {
            c.is_whitespace()
                || (c.is_ascii_punctuation() && c != '\'')
                || (!c.is_ascii() && c != '’')
        })
        .map(|w| {
            w.chars()
                .filter(char::is_ascii_alphanumeric)
                .map(|c| c.to_ascii_lowercase())
                .collect::<String>()
        })
        .filter(|w| !w.is_empty());
    // Leave room for a `-NN` to tell it from a namesake.
    let room = MAX_OPTION_NAME - 3;
    for word in words {
        if base.is_empty() {
            base = word.chars().take(room).collect();
        } else if base.len() + 1 + word.len() <= room {
            base.push('-');
            base.push_str(&word);
        } else {
            break;
        }
    }
    if base.is_empty() {
        base = "option".into();
    }
    if Key::parse(&base).is_some() {
        base = format!("option-{base}");
    }
    let mut name = base.clone();
    let mut n = 2;
    while taken.iter().any(|c| c.choice == name) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

/// How often `screen` shows each of `markers`.
pub fn shown_counts(screen: &str, markers: &[String]) -> Vec<usize> {
    markers
        .iter()
        .map(|m| match m.trim() {
            "" => 0,
            m => screen.matches(m).count(),
        })
        .collect()
}

/// The first of `markers` that `screen` shows more often than the `before` times counted
/// ([`shown_counts`]) on an earlier screen of the same pane: shown anew. (A program's
/// transcript only grows at its end, and what scrolled off does not come back, so an old one
/// never counts twice.)
pub fn newly_shown(screen: &str, markers: &[String], before: &[usize]) -> Option<String> {
    shown_counts(screen, markers)
        .into_iter()
        .zip(markers)
        .enumerate()
        .find(|(i, (now, _))| *now > before.get(*i).copied().unwrap_or(0))
        .map(|(_, (_, marker))| marker.trim().to_string())
}

/// Whether `screen` shows one of `markers` (the profile's signs of a dialog).
pub fn shows_marker(screen: &str, markers: &[String]) -> bool {
    markers
        .iter()
        .any(|m| !m.is_empty() && screen.contains(m.as_str()))
}

/// Reads the dialog on `screen`, when one of `markers` shows on it (or, with no marker on it,
/// when the pane host says the agent is blocked: `forced`). The dialog is the lowest marker on
/// the screen (text above it, a command or a file the dialog shows, may say a marker's words
/// too). Its prompt is the block of text that marker stands in: from the edge of its frame
/// above it (or else the last blank line) to the end of the screen, rules and box drawing taken
/// off, its last [`MAX_PROMPT_LINES`] lines. Its choices are what the dialog offers from the marker down: numbered options, a
/// cursor menu's options ([`read_menu`]), `(y/n)`, and "Enter to …" / "Esc to …" hints (a menu
/// is answered by its options, so its Enter hint is not offered). A marker with no choice below
/// it is not taken for a dialog (a task's text on the screen may hold a marker's words), nor is
/// one that offers a key twice under different labels (which label is true cannot be told); a
/// forced dialog that offers none is offered Enter and Esc.
pub fn read_dialog(screen: &str, markers: &[String], forced: bool) -> Option<Dialog> {
    read(screen, None, markers, forced)
}

/// Reads the dialog on `styled` (a screen with its colours: SGR escapes kept, one line per
/// row) as [`read_dialog`] reads it without them, and besides which option of a row whose
/// current one shows only in colour ([`read_row`]) is current: the one painted unlike the row.
pub fn read_dialog_styled(styled: &str, markers: &[String], forced: bool) -> Option<Dialog> {
    let (screen, paint) = unstyled(styled);
    read(&screen, Some(&paint), markers, forced)
}

/// [`read_dialog`], with each character's background (`paint`, by row) where it is known.
fn read(
    screen: &str,
    paint: Option<&[Vec<Paint>]>,
    markers: &[String],
    forced: bool,
) -> Option<Dialog> {
    let raw: Vec<&str> = screen.lines().collect();
    // A rule reads as a line of its own (`None`), not as a blank one: it does not end a block.
    let read: Vec<Option<String>> = raw
        .iter()
        .map(|l| (!is_rule(l)).then(|| unboxed(l)))
        .collect();
    let lines: Vec<String> = read.iter().map(|l| l.clone().unwrap_or_default()).collect();
    let edges: Vec<Edge> = raw.iter().map(|l| edge(l)).collect();
    let marked = markers
        .iter()
        .map(|m| m.trim())
        .filter(|m| !m.is_empty())
        .filter_map(|m| lines.iter().rposition(|l| l.contains(m)))
        .max();
    let (start, choices_from) = match marked {
        Some(at) => (block_start(&read, &edges, at), at),
        None if forced => {
            let start = block_start(&read, &edges, last_text_line(&lines)?);
            (start, start)
        }
        None => return None,
    };
    // A menu is below its marker (a line that says a marker's words and opens with `❯` is a
    // task quoted in the transcript, not a dialog's option).
    let menu_from = (choices_from + usize::from(marked.is_some())).min(raw.len());
    let row = read_row(&raw, menu_from, paint);
    let in_colour = row.is_some();
    let menu = row
        .or_else(|| read_menu(&raw[menu_from..]))
        .map(|mut menu| {
            if menu.axis == Axis::Vertical {
                for (row, _) in &mut menu.options {
                    *row += menu_from;
                }
            }
            menu
        });
    let (mut choices, cursor) = offered(&lines, choices_from, menu.as_ref())?;
    if choices.is_empty() {
        if !forced {
            return None;
        }
        choices = vec![
            choice(Key::Enter, "press Enter"),
            choice(Key::Escape, "press Esc"),
        ];
    }
    let prompt = prompt_of(read, start, choices_from, menu.as_ref());
    Some(Dialog {
        prompt,
        choices,
        cursor,
        in_colour,
    })
}

/// What a dialog offers from row `choices_from` of `lines` down: a cursor `menu`'s options
/// where the menu is (and where its cursor is), and the numbered options and key hints of the
/// other lines (a menu's Enter hint left out: a menu is answered by its options); `None` when
/// a key is offered twice under different labels (which label is true cannot be told).
fn offered(
    lines: &[String],
    choices_from: usize,
    menu: Option<&Menu>,
) -> Option<(Vec<Choice>, Option<Cursor>)> {
    let mut choices: Vec<Choice> = Vec::new();
    let mut cursor = None;
    for (row, line) in lines.iter().enumerate().skip(choices_from) {
        if let Some(menu) = menu
            && menu.options.iter().any(|(r, _)| *r == row)
        {
            // A menu's options, in order, where its first one is.
            if menu.options.first().is_some_and(|(r, _)| *r == row) {
                for (i, (_, label)) in menu.options.iter().enumerate() {
                    if choices.len() >= MAX_CHOICES {
                        break;
                    }
                    let label = clean_label(label);
                    let name = option_name(&label, &choices);
                    if Some(i) == menu.at {
                        cursor = Some(Cursor {
                            axis: menu.axis,
                            at: choices.len(),
                        });
                    }
                    choices.push(Choice {
                        choice: name,
                        label,
                    });
                }
            }
            continue;
        }
        for choice in choices_in(line) {
            if menu.is_some() && choice.choice == Key::Enter.name() {
                continue;
            }
            match choices.iter().find(|c| c.choice == choice.choice) {
                Some(seen) if seen.label != choice.label => return None,
                Some(_) => {}
                None if choices.len() < MAX_CHOICES => choices.push(choice),
                None => {}
            }
        }
    }
    Some((choices, cursor))
}

/// The prompt of a dialog whose block starts at row `start` of what was `read` (a rule as
/// `None`): its last [`MAX_PROMPT_LINES`] lines of text, at most [`MAX_PROMPT_CHARS`]
/// characters, a menu's cursor taken off its options (and off numbered ones) from row
/// `choices_from` down.
fn prompt_of(
    mut read: Vec<Option<String>>,
    start: usize,
    choices_from: usize,
    menu: Option<&Menu>,
) -> String {
    // The prompt does not say where a menu's cursor is: the same dialog reads the same
    // wherever it is.
    for (row, line) in read.iter_mut().enumerate().skip(choices_from) {
        if let Some(text) = line {
            let is_option = menu.is_some_and(|m| m.options.iter().any(|(r, _)| *r == row));
            if let Some(rest) = uncursored(text)
                && (is_option || is_numbered(rest))
            {
                *text = rest.to_string();
            }
        }
    }
    let block: Vec<&str> = read[start..]
        .iter()
        .flatten()
        .map(|l| l.trim_end())
        .filter(|l| !l.trim().is_empty())
        .collect();
    let kept = block[block.len().saturating_sub(MAX_PROMPT_LINES)..].join("\n");
    let over = kept.chars().count().saturating_sub(MAX_PROMPT_CHARS);
    kept.chars().skip(over).collect()
}

/// A cursor menu read off a screen.
#[derive(Debug)]
struct Menu {
    /// How its options run.
    axis: Axis,
    /// Its options: the row each is on, and its text.
    options: Vec<(usize, String)>,
    /// The option its cursor is on (an index into `options`), where that is known.
    at: Option<usize>,
}

/// What a line is to the menu whose options' text starts at a column.
enum Row<'a> {
    /// An option: its text starts at that column.
    Option(&'a str),
    /// More of the option above: its text starts further right.
    More,
    /// Anything else (a blank line, text further left): the menu ends here.
    End,
}

/// Reads a cursor menu off `lines` (below a dialog's marker): the one line whose text opens
/// with a cursor mark (`❯ No`) and no number, and the lines around it whose text starts in the
/// same column (`  Yes`) are its options; lines further right go with the option above them
/// (its text wrapped), and a blank line or one further left ends it. At least two options, at
/// most [`MAX_OPTIONS`], the first within [`MENU_REACH`] lines; two marked lines are no menu (a menu has one cursor: the others are
/// tasks quoted in a transcript).
fn read_menu(lines: &[&str]) -> Option<Menu> {
    let mut cursors = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| marked(l).is_some_and(|(_, text)| !is_numbered(text)))
        .map(|(row, _)| row);
    let cursor_row = cursors.next()?;
    if cursors.next().is_some() {
        return None;
    }
    let (column, _) = marked(lines[cursor_row])?;
    let row = |line| row_of(line, column);
    let mut first = cursor_row;
    while first > 0 && !matches!(row(lines[first - 1]), Row::End) {
        first -= 1;
    }
    let mut last = cursor_row;
    while last + 1 < lines.len() && !matches!(row(lines[last + 1]), Row::End) {
        last += 1;
    }
    let options: Vec<(usize, String)> = (first..=last)
        .filter_map(|r| match row(lines[r]) {
            Row::Option(text) => Some((r, text.to_string())),
            Row::More | Row::End => None,
        })
        .collect();
    let at = options.iter().position(|(r, _)| *r == cursor_row)?;
    let near = options.first().is_some_and(|(r, _)| *r < MENU_REACH);
    (near && (2..=MAX_OPTIONS).contains(&options.len())).then_some(Menu {
        axis: Axis::Vertical,
        options,
        at: Some(at),
    })
}

/// What `line` is to a menu whose options' text starts in `column`.
fn row_of(line: &str, column: usize) -> Row<'_> {
    if let Some((at, text)) = marked(line) {
        return if at == column {
            Row::Option(text)
        } else {
            Row::End
        };
    }
    match content(line) {
        Some((at, text)) if at == column => Row::Option(text),
        Some((at, _)) if at > column => Row::More,
        _ => Row::End,
    }
}

/// A character's background, as an escape set it: `None` for the terminal's own.
type Paint = Option<u32>;

/// Reads a row of options whose current one shows only in colour, below `from`: the lowest line
/// that says its arrows select (`⇆ select`), whose cells (text set apart by two spaces or more)
/// before the first key hint are its options (opencode's `Allow once   Allow always   Reject
/// …  ⇆ select  enter confirm`; a row above it, in a command or a diff the dialog shows, is
/// not it). Which option is current is told by the colours (`paint`): the one option painted
/// unlike the rest of the row; without colours, or with not one such option, it is not known
/// (`at: None`), and no option can be chosen (never a blind Enter).
fn read_row(lines: &[&str], from: usize, paint: Option<&[Vec<Paint>]>) -> Option<Menu> {
    let (row, options) = lines
        .iter()
        .enumerate()
        .skip(from)
        .rev()
        .find_map(|(row, line)| {
            let cells = cells(line);
            let hint = cells.iter().position(|(_, _, text)| is_key_hint(text))?;
            let selects = cells[hint..]
                .iter()
                .any(|(_, _, text)| text.ends_with(" select") && text.starts_with(ARROWS));
            (selects && (2..=MAX_OPTIONS).contains(&hint)).then(|| (row, cells[..hint].to_vec()))
        })?;
    let at = paint
        .and_then(|p| p.get(row))
        .and_then(|paint| painted_apart(paint, &options));
    Some(Menu {
        axis: Axis::Horizontal,
        options: options
            .into_iter()
            .map(|(_, _, text)| (row, text))
            .collect(),
        at,
    })
}

/// The one option of a row painted unlike the rest of the row (what most of the space between
/// its options is painted), if one and only one is.
fn painted_apart(paint: &[Paint], options: &[(usize, usize, String)]) -> Option<usize> {
    let at = |col: usize| paint.get(col).copied().flatten();
    let (first, last) = (options.first()?.0, options.last()?.1);
    let mut gaps: Vec<Paint> = (first..last)
        .filter(|col| !options.iter().any(|(s, e, _)| (*s..*e).contains(col)))
        .map(at)
        .collect();
    gaps.sort_unstable();
    let row_paint = gaps
        .chunk_by(|a, b| a == b)
        .max_by_key(|run| run.len())
        .and_then(|run| run.first().copied())
        .flatten();
    let unlike: Vec<usize> = options
        .iter()
        .enumerate()
        .filter(|(_, (start, _, _))| at(*start) != row_paint)
        .map(|(i, _)| i)
        .collect();
    match unlike.as_slice() {
        [current] => Some(*current),
        _ => None,
    }
}

/// The arrows a hint that the arrows select may open with (`⇆ select`).
const ARROWS: [char; 6] = ['⇆', '↔', '←', '→', '◀', '▶'];

/// Whether a cell of a row is a key hint (`ctrl+f fullscreen`, `⇆ select`, `enter confirm`).
fn is_key_hint(cell: &str) -> bool {
    let lower = cell.to_lowercase();
    cell.starts_with(ARROWS)
        || ["ctrl+", "alt+", "shift+", "enter", "esc", "tab "]
            .iter()
            .any(|key| lower.starts_with(key))
}

/// The cells of a line: runs of text set apart by two spaces or more (box drawing counts as
/// space), each with the columns it spans and its text.
fn cells(line: &str) -> Vec<(usize, usize, String)> {
    let mut cells = Vec::new();
    let mut current: Option<(usize, String)> = None;
    let mut spaces = 0;
    for (col, c) in line.chars().enumerate() {
        let blank = c.is_whitespace() || is_box(c);
        if blank {
            spaces += 1;
            if spaces >= 2
                && let Some((start, text)) = current.take()
            {
                let text = text.trim_end().to_string();
                let end = start + text.chars().count();
                cells.push((start, end, text));
            }
            if let Some((_, text)) = &mut current {
                text.push(' ');
            }
            continue;
        }
        spaces = 0;
        match &mut current {
            Some((_, text)) => text.push(c),
            None => current = Some((col, c.to_string())),
        }
    }
    if let Some((start, text)) = current {
        let text = text.trim_end().to_string();
        let end = start + text.chars().count();
        cells.push((start, end, text));
    }
    cells
}

/// A screen with its colours as plain text, and each character's background by row. Only
/// SGR escapes are read (`ESC [ … m`); other escapes are dropped.
fn unstyled(styled: &str) -> (String, Vec<Vec<Paint>>) {
    let mut text = String::new();
    let mut paint = Vec::new();
    for line in styled.lines() {
        let mut row = Vec::new();
        let (mut background, mut reverse): (Paint, bool) = (None, false);
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '\u{1b}' {
                if !c.is_control() {
                    text.push(c);
                    row.push(if reverse {
                        Some(REVERSED | background.unwrap_or(0))
                    } else {
                        background
                    });
                }
                continue;
            }
            match chars.peek() {
                Some('[') => {}
                // An operating system command (a hyperlink, a title): up to BEL or ESC \.
                Some(']') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' || (c == '\u{1b}' && chars.next_if_eq(&'\\').is_some()) {
                            break;
                        }
                    }
                    continue;
                }
                _ => {
                    chars.next();
                    continue;
                }
            }
            chars.next();
            let mut params = String::new();
            let mut end = None;
            for c in chars.by_ref() {
                if ('\u{40}'..='\u{7e}').contains(&c) {
                    end = Some(c);
                    break;
                }
                params.push(c);
            }
            if end == Some('m') {
                paint_with(&params, &mut background, &mut reverse);
            }
        }
        text.push('\n');
        paint.push(row);
    }
    (text, paint)
}

/// A background painted by reverse video (with the background it had, if any).
const REVERSED: u32 = 1 << 31;
/// A background given as red, green and blue (`48;2;r;g;b`).
const RGB: u32 = 1 << 30;

/// What the SGR parameters `params` (`48;5;215`, `0`, …) do to the background.
fn paint_with(params: &str, background: &mut Paint, reverse: &mut bool) {
    let numbers: Vec<u32> = params
        .split([';', ':'])
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    let mut i = 0;
    while i < numbers.len() {
        match numbers[i] {
            0 => (*background, *reverse) = (None, false),
            7 => *reverse = true,
            27 => *reverse = false,
            n @ 40..=47 => *background = Some(n - 40),
            n @ 100..=107 => *background = Some(n - 100 + 8),
            49 => *background = None,
            kind @ (38 | 48) => {
                let (value, used) = match numbers.get(i + 1) {
                    Some(5) => (numbers.get(i + 2).copied(), 2),
                    Some(2) => {
                        let rgb = numbers.get(i + 2..i + 5).map(|c| {
                            RGB | (c[0] & 0xff) << 16 | (c[1] & 0xff) << 8 | (c[2] & 0xff)
                        });
                        (rgb, 4)
                    }
                    _ => (None, 0),
                };
                if kind == 48 {
                    *background = value;
                }
                i += used;
            }
            _ => {}
        }
        i += 1;
    }
}

/// A line's text and the column it starts in, past the box drawing and spaces on its left
/// (and without those on its right); `None` for a line with no text.
fn content(line: &str) -> Option<(usize, &str)> {
    let (at, _) = line
        .char_indices()
        .find(|(_, c)| !is_box(*c) && !c.is_whitespace())?;
    let text = line[at..].trim_end_matches(|c: char| is_box(c) || c.is_whitespace());
    Some((line[..at].chars().count(), text))
}

/// A line whose text opens with a cursor mark (`❯ No`): the column its text after the mark
/// starts in, and that text.
fn marked(line: &str) -> Option<(usize, &str)> {
    let (at, text) = content(line)?;
    let rest = uncursored(text)?;
    let gap = text.chars().count() - rest.chars().count();
    Some((at + gap, rest))
}

/// `text` without the cursor mark and the spaces that open it (`❯ No` → `No`), if it opens
/// with one and has text after it.
fn uncursored(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(CURSORS)?;
    let after = rest.trim_start();
    (after.len() < rest.len() && !after.is_empty()).then_some(after)
}

/// Whether `text` is a numbered option (`1. Yes`).
fn is_numbered(text: &str) -> bool {
    text.split_once(". ").is_some_and(|(number, label)| {
        matches!(Key::parse(number), Some(Key::Digit(_))) && !label.trim().is_empty()
    })
}

/// `label` as a choice's label: trimmed, control characters shown as `?`, at most
/// [`MAX_LABEL_CHARS`].
fn clean_label(label: &str) -> String {
    label
        .trim()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_LABEL_CHARS)
        .collect()
}

fn choice(key: Key, label: &str) -> Choice {
    Choice {
        choice: key.name(),
        label: clean_label(label),
    }
}

/// The last line with any text on it.
fn last_text_line(lines: &[String]) -> Option<usize> {
    lines.iter().rposition(|l| !l.trim().is_empty())
}

/// Where the block holding line `at` begins: after the nearest edge above it drawn from the
/// screen's first column, else after the nearest edge (a solid rule, a box's top: a dialog's
/// frame) within [`MAX_PROMPT_LINES`] lines, else after the nearest blank line above it (a rule,
/// `None`, is no blank line).
fn block_start(lines: &[Option<String>], edges: &[Edge], at: usize) -> usize {
    // A frame drawn from the screen's edge holds the dialog whole (Claude Code's plan approval
    // frames the plan inside its own, indented rules).
    if let Some(edge) = edges[..at].iter().rposition(|e| *e == Edge::Outer) {
        return edge + 1;
    }
    let reach = at.saturating_sub(MAX_PROMPT_LINES);
    if let Some(edge) = edges[reach..at].iter().rposition(|e| *e != Edge::None) {
        return reach + edge + 1;
    }
    lines[..at]
        .iter()
        .rposition(|l| l.as_ref().is_some_and(|l| l.trim().is_empty()))
        .map_or(0, |i| i + 1)
}

/// What a line is to the frames of a screen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Edge {
    /// No edge.
    None,
    /// A solid rule set in from the screen's edge: a frame inside a dialog.
    Inner,
    /// A solid rule from the screen's first column: a dialog's own frame.
    Outer,
}

/// Whether `line` is a rule drawn solid (`────`, `╭────╮`, `▔▔▔▔`): the edge of a frame, where
/// dashed rules (`╌╌╌╌`) set parts of a dialog apart.
fn edge(line: &str) -> Edge {
    let dashed = line
        .chars()
        .any(|c| matches!(c, '╌' | '╍' | '┄' | '┅' | '┈' | '┉'));
    match (is_rule(line) && !dashed, line.starts_with(' ')) {
        (false, _) => Edge::None,
        (true, true) => Edge::Inner,
        (true, false) => Edge::Outer,
    }
}

/// A line drawn of box-drawing characters only (a rule, a box's top or bottom).
fn is_rule(line: &str) -> bool {
    let line = line.trim();
    line.chars().count() >= 3 && line.chars().all(|c| is_box(c) || c == '▔' || c == ' ')
}

fn is_box(c: char) -> bool {
    ('\u{2500}'..='\u{257F}').contains(&c)
}

/// `line` without the box drawing at its ends (`│ text │` → `text`), control characters shown
/// as `?`.
fn unboxed(line: &str) -> String {
    let line = line.trim_end();
    let line = line.trim_start_matches(|c: char| is_box(c) || c == ' ');
    let line = line.trim_end_matches(|c: char| is_box(c) || c == ' ');
    line.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The choices one line of a dialog offers.
fn choices_in(line: &str) -> Vec<Choice> {
    let text = line
        .trim()
        .trim_start_matches(CURSORS)
        .trim_start_matches('*')
        .trim_start();
    if let Some((number, label)) = text.split_once(". ")
        && let Some(key @ Key::Digit(_)) = Key::parse(number)
        && !label.trim().is_empty()
    {
        return vec![choice(key, label)];
    }
    let lower = line.to_lowercase();
    if lower.contains("(y/n)") || lower.contains("[y/n]") {
        return vec![choice(Key::Yes, "yes"), choice(Key::No, "no")];
    }
    let mut found = Vec::new();
    // Hints are set apart by a dot, a bar or a run of spaces: "Esc to cancel · Tab to amend",
    // "⇆ select  enter confirm", "enter submit  esc dismiss".
    for part in line.split(['·', '•', '|']).flat_map(|p| p.split("  ")) {
        let part = part.trim();
        let lower = part.to_lowercase();
        for (prefix, key) in [
            ("enter to ", Key::Enter),
            ("enter ", Key::Enter),
            ("esc to ", Key::Escape),
            ("escape to ", Key::Escape),
            ("esc ", Key::Escape),
        ] {
            if lower.starts_with(prefix) {
                found.push(choice(key, &part[prefix.len()..]));
                break;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markers(m: &[&str]) -> Vec<String> {
        m.iter().map(|s| s.to_string()).collect()
    }

    fn keys(dialog: &Dialog) -> Vec<&str> {
        dialog.choices.iter().map(|c| c.choice.as_str()).collect()
    }

    #[test]
    fn only_the_safe_keys_parse() {
        for name in ["1", "9", "y", "n", "enter", "esc"] {
            assert_eq!(Key::parse(name).map(Key::name).as_deref(), Some(name));
        }
        for name in [
            "0", "10", "Y", "yes", "Enter", "escape", "", " 1", "1\n", "C-c", "\u{1b}", "up",
            "down", "left", "right",
        ] {
            assert_eq!(Key::parse(name), None, "{name:?}");
        }
    }

    /// Claude Code 2.1.332's permission prompt for a shell command, as tmux showed it (the rules
    /// shortened).
    const CLAUDE_PROMPT: &str = "\
❯ run: touch proof-file

● Running the lead's command
  ⎿  $ touch proof-file

────────────────────────────────────────
 Bash command
 Tip: auto mode handles these prompts for you — choose \"switch to auto mode\" below
 Run the lead's command
╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌
 touch proof-file
╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌
 Do you want to proceed?
 ❯ 1. Yes
   2. Yes, and always allow access to /tmp/fleet-test-agents from this project
   3. Yes, and switch to auto mode · auto mode handles these prompts for you
   4. No

 Esc to cancel · Tab to amend
";

    #[test]
    fn a_numbered_permission_prompt_reads_as_its_block_and_options() {
        let dialog =
            read_dialog(CLAUDE_PROMPT, &markers(&["Do you want to proceed?"]), false).unwrap();
        assert_eq!(keys(&dialog), ["1", "2", "3", "4", "esc"]);
        assert_eq!(dialog.choices[0].label, "Yes");
        assert_eq!(dialog.choices[3].label, "No");
        assert_eq!(dialog.choices[4].label, "cancel");
        assert!(
            dialog.prompt.starts_with("Bash command\n"),
            "{}",
            dialog.prompt
        );
        assert!(
            dialog
                .prompt
                .contains("touch proof-file\nDo you want to proceed?")
        );
        assert!(dialog.prompt.ends_with("Esc to cancel · Tab to amend"));
        assert!(!dialog.prompt.contains('╌') && !dialog.prompt.contains('─'));
        assert!(!dialog.prompt.contains("Running the lead's command"));
        assert_eq!(dialog.pick("2"), Ok(Answer::Press(Key::Digit(2))));
        assert_eq!(dialog.pick("esc"), Ok(Answer::Press(Key::Escape)));
        let refused = dialog.pick("5").unwrap_err();
        assert!(refused.message.contains("1, 2, 3, 4, esc"), "{refused}");
        assert!(dialog.pick("yes please").is_err());
        dialog.check().unwrap();
        // Boxed dialogs read the same, without their box.
        let boxed =
            "╭────────╮\n│ Do you want to proceed? │\n│ ❯ 1. Yes │\n│   2. No  │\n╰────────╯";
        let dialog = read_dialog(boxed, &markers(&["Do you want to proceed?"]), false).unwrap();
        assert_eq!(keys(&dialog), ["1", "2"]);
        assert_eq!(dialog.prompt, "Do you want to proceed?\n1. Yes\n2. No");
    }

    /// Claude Code 2.1.332's permission prompt in auto mode on a custom endpoint, as the issue
    /// saw it: a cursor menu.
    const CURSOR_MENU: &str = "\
 Bash command
   touch proof-file
 Do you want to proceed?
 ❯ No
   Yes
 Esc to cancel · Tab to amend
";

    #[test]
    fn a_cursor_menu_offers_each_option_by_its_name_and_knows_where_its_cursor_is() {
        let marker = markers(&["Do you want to proceed?"]);
        let dialog = read_dialog(CURSOR_MENU, &marker, false).unwrap();
        assert_eq!(keys(&dialog), ["no", "yes", "esc"]);
        assert_eq!(dialog.choices[1].label, "Yes");
        assert_eq!(
            dialog.cursor,
            Some(Cursor {
                axis: Axis::Vertical,
                at: 0
            })
        );
        // The prompt does not show the cursor: moved, it reads as the same dialog.
        assert!(dialog.prompt.contains("\nNo\nYes\n"), "{}", dialog.prompt);
        assert!(!dialog.prompt.contains('❯'));
        let moved = CURSOR_MENU.replace(" ❯ No\n   Yes", "   No\n ❯ Yes");
        let after = read_dialog(&moved, &marker, false).unwrap();
        assert_eq!(after, dialog);
        assert!(after.cursor_on(1) && !after.cursor_on(0));
        assert!(dialog.cursor_on(0));
        // Answers: an option is selected by its place, a key pressed; the arrows follow from
        // where the cursor is, and none is needed to stay.
        assert_eq!(dialog.pick("yes"), Ok(Answer::Select(1)));
        assert_eq!(dialog.pick("esc"), Ok(Answer::Press(Key::Escape)));
        assert_eq!(dialog.moves_to(1), Some(vec![Key::Down]));
        assert_eq!(dialog.moves_to(0), Some(vec![]));
        assert_eq!(after.moves_to(0), Some(vec![Key::Up]));
        assert_eq!(dialog.moves_to(2), None, "esc is no option");
        // Names only: not the label, not an arrow, not Enter (the options stand for it).
        for bad in ["Yes", "up", "down", "enter", "1", "yes\n"] {
            let refused = dialog.pick(bad).unwrap_err();
            assert!(refused.message.contains("no, yes, esc"), "{refused}");
        }
        dialog.check().unwrap();
        // A dialog from elsewhere carries no cursor, and cannot move one.
        let sent: Dialog = serde_json::from_str(&serde_json::to_string(&dialog).unwrap()).unwrap();
        assert_eq!(sent, dialog);
        assert_eq!(sent.cursor, None);
        assert_eq!(sent.moves_to(1), None);
    }

    #[test]
    fn a_menu_is_its_aligned_lines_around_the_cursor_and_wrapped_lines_go_with_their_option() {
        let screen = "\
Would you like to proceed?

  ❯ Yes, and auto-accept edits
    Yes, and manually approve edits
      (each edit asks first)
    No, keep planning
  Esc to cancel
";
        let dialog = read_dialog(screen, &markers(&["Would you like to proceed?"]), false).unwrap();
        assert_eq!(
            keys(&dialog),
            [
                "yes-and-auto-accept-edits",
                "yes-and-manually-approve-edits",
                "no-keep-planning",
                "esc"
            ]
        );
        let third = dialog
            .choices
            .iter()
            .position(|c| c.choice == "no-keep-planning");
        assert_eq!(
            dialog.moves_to(third.unwrap()),
            Some(vec![Key::Down, Key::Down])
        );
        // Inside a box, the same.
        let boxed = "\
╭──────────────────────────╮
│ Do you want to proceed?  │
│   Yes                    │
│ ❯ No                     │
╰──────────────────────────╯";
        let dialog = read_dialog(boxed, &markers(&["Do you want to proceed?"]), false).unwrap();
        assert_eq!(keys(&dialog), ["yes", "no"]);
        assert!(dialog.cursor_on(1));
        assert_eq!(dialog.prompt, "Do you want to proceed?\nYes\nNo");
        // A marked line far below the marker is the transcript's (a task echoed under the
        // program's prose), not the dialog's.
        let far = format!(
            "Do you want to proceed?\n{}❯ yes, go ahead\n  and run the tests\n",
            "some prose\n".repeat(MENU_REACH)
        );
        assert_eq!(
            read_dialog(&far, &markers(&["Do you want to proceed?"]), false),
            None
        );
        // Two marked lines are no menu: a menu has one cursor.
        let two = "Do you want to proceed?\n❯ one\n  two\n❯ three\n  four\nEsc to cancel";
        let dialog = read_dialog(two, &markers(&["Do you want to proceed?"]), false).unwrap();
        assert_eq!(keys(&dialog), ["esc"]);
        // One marked line is no menu (Claude Code's own input line, a quoted task).
        let lone = "Do you want to proceed?\n❯ run: touch x\nEsc to cancel";
        let dialog = read_dialog(lone, &markers(&["Do you want to proceed?"]), false).unwrap();
        assert_eq!(keys(&dialog), ["esc"]);
        assert_eq!(dialog.cursor, None);
        // A numbered menu is answered by its digits; its cursor mark leaves the prompt too.
        let numbered =
            read_dialog(CLAUDE_PROMPT, &markers(&["Do you want to proceed?"]), false).unwrap();
        assert_eq!(numbered.cursor, None);
        assert!(
            numbered.prompt.contains("\n1. Yes\n"),
            "{}",
            numbered.prompt
        );
    }

    #[test]
    fn a_row_whose_current_option_shows_only_in_colour_is_read_with_its_colours() {
        let marker = markers(&["Pick:"]);
        let row = |first: &str, second: &str, third: &str| {
            format!(
                "Pick:\n\x1b[48;5;234m  {first}Yes\x1b[0;48;5;234m   {second}No\x1b[0;48;5;234m   {third}Later\x1b[0m   ⇆ select  enter confirm\n"
            )
        };
        let (plain, on) = ("\x1b[48;5;234m", "\x1b[48;5;215m");
        let dialog = read_dialog_styled(&row(plain, on, plain), &marker, false).unwrap();
        assert_eq!(keys(&dialog), ["yes", "no", "later"]);
        assert_eq!(
            dialog.cursor,
            Some(Cursor {
                axis: Axis::Horizontal,
                at: 1
            })
        );
        assert_eq!(dialog.moves_to(0), Some(vec![Key::Left]));
        assert_eq!(dialog.moves_to(2), Some(vec![Key::Right]));
        // Reverse video and true colour paint a current option too.
        for on in ["\x1b[7m", "\x1b[48;2;245;167;66m", "\x1b[1;44m"] {
            let dialog = read_dialog_styled(&row(on, plain, plain), &marker, false).unwrap();
            assert!(dialog.cursor_on(0), "{on:?}: {:?}", dialog.cursor);
        }
        // None painted apart, or two: which is current cannot be told; the options are the
        // same dialog's, but no arrow can be worked out (and no blind Enter is offered).
        for styled in [row(plain, plain, plain), row(on, on, plain)] {
            let unknown = read_dialog_styled(&styled, &marker, false).unwrap();
            assert_eq!(unknown, dialog, "{styled:?}");
            assert!(unknown.in_colour && unknown.cursor.is_none());
            assert_eq!(unknown.moves_to(0), None);
        }
        // Without colours, the same.
        let plain_text = "Pick:\n  Yes   No   Later   ⇆ select  enter confirm\n";
        let unknown = read_dialog(plain_text, &marker, false).unwrap();
        assert_eq!(keys(&unknown), ["yes", "no", "later"]);
        assert!(unknown.in_colour && unknown.cursor.is_none());
        // A row above the lowest one (a command or a diff the dialog shows) is not it.
        let fake = format!(
            "Pick:\n+ \x1b[48;5;1mRun\x1b[0m   Skip   ⇆ select\n{}",
            row(plain, on, plain).trim_start_matches("Pick:\n")
        );
        let read = read_dialog_styled(&fake, &marker, false).unwrap();
        assert_eq!(keys(&read), ["yes", "no", "later"]);
        assert!(read.cursor_on(1));
        // A row with no hint that the arrows select is no menu.
        let dialog =
            read_dialog_styled("Pick:\n  Yes   No   enter confirm\n", &marker, false).unwrap();
        assert!(!dialog.in_colour && dialog.cursor.is_none());
        // A hyperlink's or a title's escape is dropped whole, its text with it.
        let (text, _) = unstyled("a\x1b]8;;http://x/\x1b\\b\x1b]8;;\x1b\\c\x1b]0;title\x07d");
        assert_eq!(text, "abcd\n");
        // Broken or hostile escapes read as no paint, never as a panic.
        for styled in [
            "a\x1b[",
            "a\x1b",
            "a\x1b[48;5m",
            "a\x1b[48;2;1m",
            "a\x1b[99999999999999999999;48;5;4294967295m",
            "a\x1b[48;2;999;999;999;48m",
            "\x1b[7m\x1b[48;5;1m",
        ] {
            let (text, paint) = unstyled(styled);
            assert!(
                text.starts_with('a') || text == "\n",
                "{styled:?}: {text:?}"
            );
            assert_eq!(paint.len(), 1, "{styled:?}");
        }
        // Other escapes (a line cleared, a colour of text) are dropped, not read as text.
        let (text, paint) = unstyled("b\x1b[2Kc\x1b[31md\x1b[41me");
        assert_eq!(text, "bcde\n");
        assert_eq!(paint, [vec![None, None, None, Some(1)]]);
    }

    #[test]
    fn option_names_are_words_of_their_text_stable_and_unique() {
        let named = |labels: &[&str]| {
            let mut choices: Vec<Choice> = Vec::new();
            for label in labels {
                let name = option_name(label, &choices);
                assert!(is_option_name(&name), "{name}");
                choices.push(Choice {
                    choice: name,
                    label: label.to_string(),
                });
            }
            choices.into_iter().map(|c| c.choice).collect::<Vec<_>>()
        };
        assert_eq!(
            named(&[
                "Yes, and don't ask again for touch commands in /tmp/fleet-test-agents",
                "Yes, and don’t ask again",
                "No (esc)",
            ]),
            [
                "yes-and-dont-ask-again-for-touch",
                "yes-and-dont-ask-again",
                "no-esc"
            ]
        );
        assert_eq!(named(&["Yes", "Yes", "Yes"]), ["yes", "yes-2", "yes-3"]);
        assert_eq!(
            named(&["y", "1", "enter", "…", "Ja, gern"]),
            ["option-y", "option-1", "option-enter", "option", "ja-gern"]
        );
        let long = named(&[&"x".repeat(300)]);
        assert!(long[0].len() <= MAX_OPTION_NAME, "{long:?}");
        for bad in [
            "",
            "Yes",
            "yes please",
            "-yes",
            "yes-",
            "a--b",
            "y",
            "esc",
            &"a".repeat(41),
        ] {
            assert!(!is_option_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_marker_with_no_choice_below_it_is_no_dialog() {
        // The task on the screen says the marker's words; nothing offers a choice.
        let screen = "❯ ask them: Do you want to proceed?\n\n● Thinking…\n";
        assert_eq!(
            read_dialog(screen, &markers(&["Do you want to proceed?"]), false),
            None
        );
        // Numbered lines above the marker are the transcript's, not the dialog's.
        let screen = "Plan:\n1. Fix it\n2. Test it\nDo you want to proceed?\n(y/n)";
        let dialog = read_dialog(screen, &markers(&["Do you want to proceed?"]), false).unwrap();
        assert_eq!(keys(&dialog), ["y", "n"]);
    }

    #[test]
    fn text_above_the_dialog_cannot_pass_for_it_or_relabel_its_keys() {
        // A command whose text says a marker's words and offers a "1" of its own.
        let screen =
            format!("echo 'Do you want to allow this?'\necho '1. No (deny)'\n{CLAUDE_PROMPT}");
        let markers = markers(&["Do you want to allow", "Do you want to proceed?"]);
        let dialog = read_dialog(&screen, &markers, false).unwrap();
        assert_eq!(dialog.choices[0].label, "Yes");
        // Below the dialog's own marker, a key offered twice under two labels: no dialog.
        let twice = "Do you want to proceed?\n❯ 1. Yes\n  2. No\n  1. No (deny)\n";
        assert_eq!(read_dialog(twice, &markers, false), None);
        // The same key under the same label (a hint repeated) is one choice.
        let again = "Do you want to proceed?\n1. Yes\nEsc to cancel\nEsc to cancel";
        let dialog = read_dialog(again, &markers, false).unwrap();
        assert_eq!(keys(&dialog), ["1", "esc"]);
    }

    /// opencode 1.18.33's permission prompt, as tmux showed it without colours (its sidebar's
    /// text taken off; which option is current shows only in colour).
    const OPENCODE_PROMPT: &str = "\
  ┃
  ┃  △ Permission required
  ┃    # Shell command
  ┃
  ┃  $ touch proof-file-0
  ┃
  ┃   Allow once   Allow always   Reject                        ctrl+f fullscreen  ⇆ select  enter confirm
";

    #[test]
    fn opencodes_prompt_off_plain_text_offers_its_options_without_a_cursor() {
        let dialog =
            read_dialog(OPENCODE_PROMPT, &markers(&["△ Permission required"]), false).unwrap();
        assert_eq!(keys(&dialog), ["allow-once", "allow-always", "reject"]);
        assert!(dialog.in_colour && dialog.cursor.is_none());
        assert!(
            dialog.prompt.starts_with("△ Permission required"),
            "{}",
            dialog.prompt
        );
        assert!(dialog.prompt.contains("$ touch proof-file-0"));
        assert!(dialog.prompt.contains("Allow once   Allow always   Reject"));
    }

    #[test]
    fn key_hints_and_yes_no_become_choices() {
        let screen = "\
Auto mode can't check actions in this session
Enter to stay in auto mode · shift+Tab to leave for accept edits mode and stop · Esc to cancel";
        let dialog =
            read_dialog(screen, &markers(&["Auto mode can't check actions"]), false).unwrap();
        assert_eq!(keys(&dialog), ["enter", "esc"]);
        assert_eq!(dialog.choices[0].label, "stay in auto mode");
        assert_eq!(dialog.choices[1].label, "cancel");
        let yn = read_dialog("Overwrite file? (y/n)", &markers(&["Overwrite"]), false).unwrap();
        assert_eq!(keys(&yn), ["y", "n"]);
    }

    #[test]
    fn no_marker_no_dialog_unless_the_host_says_blocked() {
        let screen = "working on it…\n\nStill thinking\n";
        assert_eq!(read_dialog(screen, &markers(&["Do you want"]), false), None);
        assert_eq!(read_dialog(screen, &[], false), None);
        let forced = read_dialog(screen, &markers(&["Do you want"]), true).unwrap();
        assert_eq!(forced.prompt, "Still thinking");
        assert_eq!(keys(&forced), ["enter", "esc"]);
        assert!(shows_marker(screen, &markers(&["Still"])));
        assert!(!shows_marker(screen, &markers(&[""])));
    }

    #[test]
    fn a_hostile_screen_gives_bounded_printable_text() {
        let mut screen = String::from("Do you want to proceed?\n");
        for i in 0..200 {
            screen.push_str(&format!("line {i} \u{1b}[31m{}\n", "x".repeat(100)));
        }
        screen.push_str("Esc to cancel");
        let dialog = read_dialog(&screen, &markers(&["Do you want"]), false).unwrap();
        assert!(dialog.prompt.lines().count() <= MAX_PROMPT_LINES);
        assert!(dialog.prompt.chars().count() <= MAX_PROMPT_CHARS);
        assert!(!dialog.prompt.contains('\u{1b}'));
        dialog.check().unwrap();
    }

    #[test]
    fn a_dialog_from_elsewhere_is_checked() {
        let good = Dialog {
            prompt: "Proceed?".into(),
            choices: vec![choice(Key::Digit(1), "Yes")],
            cursor: None,
            in_colour: false,
        };
        good.check().unwrap();
        let with = |choices: Vec<Choice>, prompt: &str| Dialog {
            prompt: prompt.into(),
            choices,
            cursor: None,
            in_colour: false,
        };
        let free_text = Choice {
            choice: "rm -rf /\n".into(),
            label: "Yes".into(),
        };
        for bad in [
            with(vec![free_text], "Proceed?"),
            with(vec![], "Proceed?"),
            with(
                vec![choice(Key::Yes, "a"), choice(Key::Yes, "b")],
                "Proceed?",
            ),
            with(vec![choice(Key::Yes, "a")], "bell \u{7}"),
            with(
                vec![choice(Key::Yes, "a")],
                &"x".repeat(MAX_PROMPT_CHARS + 1),
            ),
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
