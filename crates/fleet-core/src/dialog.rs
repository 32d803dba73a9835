//! Dialogs: a worker's own program stopped on a choice (a permission prompt, a trust dialog, a
//! plan approval) while working on a task. The rules of reading one off the screen, of the
//! choices it offers, and of the keys an answer may press.
//!
//! A choice is never free text: the lead names one of the choices read off the dialog, and
//! what gets typed is that choice's key from a fixed safe set ([`Key`]): a digit, `y`, `n`,
//! Enter or Esc. Nothing from the screen or from the lead becomes a key any other way.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::FleetError;

/// The most lines of a dialog handed to the lead as its prompt.
pub const MAX_PROMPT_LINES: usize = 40;
/// The most characters of a dialog's prompt.
pub const MAX_PROMPT_CHARS: usize = 4_000;
/// The most characters of one choice's label.
pub const MAX_LABEL_CHARS: usize = 200;
/// The most choices a dialog may offer (digits 1-9, `y`, `n`, Enter, Esc).
pub const MAX_CHOICES: usize = 13;

/// A key an answer to a dialog may press: the whole safe set.
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
}

impl Key {
    /// The key a choice names (`"1"`…`"9"`, `"y"`, `"n"`, `"enter"`, `"esc"`), if it is one
    /// of the safe set.
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
    /// `"y"`, `"n"`, `"enter"` or `"esc"`.
    pub choice: String,
    /// What the dialog says it does.
    pub label: String,
}

/// A dialog as read off a screen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dialog {
    /// Its text, as the screen shows it (box drawing taken off).
    pub prompt: String,
    /// The choices it offers.
    pub choices: Vec<Choice>,
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
            if Key::parse(&choice.choice).is_none() {
                return Err(wrong(format!("offers a choice that is no safe key (#{i})")));
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

    /// The key an answer naming `asked` presses: one of the offered choices, else an error
    /// that names them.
    pub fn pick(&self, asked: &str) -> Result<Key, FleetError> {
        self.choices
            .iter()
            .find(|c| c.choice == asked)
            .and_then(|c| Key::parse(&c.choice))
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
/// too). Its prompt is the block of text that marker stands in: from the last blank line above
/// it to the end of the screen, rules and box drawing taken off, its last [`MAX_PROMPT_LINES`]
/// lines. Its choices are what the dialog offers from the marker down: numbered options,
/// `(y/n)`, and "Enter to …" / "Esc to …" hints. A marker with no choice below it is not taken
/// for a dialog (a task's text on the screen may hold a marker's words), nor is one that offers
/// a key twice under different labels (which label is true cannot be told); a forced dialog
/// that offers none is offered Enter and Esc.
pub fn read_dialog(screen: &str, markers: &[String], forced: bool) -> Option<Dialog> {
    // A rule reads as a line of its own (`None`), not as a blank one: it does not end a block.
    let read: Vec<Option<String>> = screen
        .lines()
        .map(|l| (!is_rule(l)).then(|| unboxed(l)))
        .collect();
    let lines: Vec<String> = read.iter().map(|l| l.clone().unwrap_or_default()).collect();
    let marked = markers
        .iter()
        .map(|m| m.trim())
        .filter(|m| !m.is_empty())
        .filter_map(|m| lines.iter().rposition(|l| l.contains(m)))
        .max();
    let (start, choices_from) = match marked {
        Some(at) => (block_start(&read, at), at),
        None if forced => {
            let start = block_start(&read, last_text_line(&lines)?);
            (start, start)
        }
        None => return None,
    };
    let mut choices: Vec<Choice> = Vec::new();
    for line in &lines[choices_from..] {
        for choice in choices_in(line) {
            match choices.iter().find(|c| c.choice == choice.choice) {
                Some(seen) if seen.label != choice.label => return None,
                Some(_) => {}
                None if choices.len() < MAX_CHOICES => choices.push(choice),
                None => {}
            }
        }
    }
    if choices.is_empty() {
        if !forced {
            return None;
        }
        choices = vec![
            choice(Key::Enter, "press Enter"),
            choice(Key::Escape, "press Esc"),
        ];
    }
    let block: Vec<&str> = read[start..]
        .iter()
        .flatten()
        .map(|l| l.trim_end())
        .filter(|l| !l.trim().is_empty())
        .collect();
    let kept = block[block.len().saturating_sub(MAX_PROMPT_LINES)..].join("\n");
    let over = kept.chars().count().saturating_sub(MAX_PROMPT_CHARS);
    let prompt = kept.chars().skip(over).collect();
    Some(Dialog { prompt, choices })
}

fn choice(key: Key, label: &str) -> Choice {
    let label: String = label
        .trim()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_LABEL_CHARS)
        .collect();
    Choice {
        choice: key.name(),
        label,
    }
}

/// The last line with any text on it.
fn last_text_line(lines: &[String]) -> Option<usize> {
    lines.iter().rposition(|l| !l.trim().is_empty())
}

/// Where the block holding line `at` begins: after the nearest blank line above it (a rule,
/// `None`, is no blank line).
fn block_start(lines: &[Option<String>], at: usize) -> usize {
    lines[..at]
        .iter()
        .rposition(|l| l.as_ref().is_some_and(|l| l.trim().is_empty()))
        .map_or(0, |i| i + 1)
}

/// A line drawn of box-drawing characters only (a rule, a box's top or bottom).
fn is_rule(line: &str) -> bool {
    let line = line.trim();
    line.chars().count() >= 3 && line.chars().all(|c| is_box(c) || c == ' ')
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
        .trim_start_matches(['❯', '›', '>', '▶', '→', '*'])
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
    // "⇆ select  enter confirm".
    for part in line.split(['·', '•', '|']).flat_map(|p| p.split("  ")) {
        let part = part.trim();
        let lower = part.to_lowercase();
        for (prefix, key) in [
            ("enter to ", Key::Enter),
            ("enter ", Key::Enter),
            ("esc to ", Key::Escape),
            ("escape to ", Key::Escape),
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
            "0", "10", "Y", "yes", "Enter", "escape", "", " 1", "1\n", "C-c", "\u{1b}",
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
        assert_eq!(dialog.pick("2"), Ok(Key::Digit(2)));
        assert_eq!(dialog.pick("esc"), Ok(Key::Escape));
        let refused = dialog.pick("5").unwrap_err();
        assert!(refused.message.contains("1, 2, 3, 4, esc"), "{refused}");
        assert!(dialog.pick("yes please").is_err());
        dialog.check().unwrap();
        // Boxed dialogs read the same, without their box.
        let boxed =
            "╭────────╮\n│ Do you want to proceed? │\n│ ❯ 1. Yes │\n│   2. No  │\n╰────────╯";
        let dialog = read_dialog(boxed, &markers(&["Do you want to proceed?"]), false).unwrap();
        assert_eq!(keys(&dialog), ["1", "2"]);
        assert_eq!(dialog.prompt, "Do you want to proceed?\n❯ 1. Yes\n2. No");
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

    /// opencode 1.18.33's permission prompt, as tmux showed it (its sidebar's text taken off;
    /// which option is picked shows only in colour: the first, unless moved).
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
    fn opencodes_prompt_offers_enter_to_confirm() {
        let dialog =
            read_dialog(OPENCODE_PROMPT, &markers(&["△ Permission required"]), false).unwrap();
        assert_eq!(keys(&dialog), ["enter"]);
        assert_eq!(dialog.choices[0].label, "confirm");
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
        };
        good.check().unwrap();
        let with = |choices: Vec<Choice>, prompt: &str| Dialog {
            prompt: prompt.into(),
            choices,
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
