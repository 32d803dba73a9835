//! The catalogue of the dialogs real agents show (`fixtures/dialogs/CATALOGUE.md`): each screen
//! there was captured from the real program (`tmux capture-pane -p`), and is read here as
//! fleetd reads a worker's screen, with the markers fleetd uses for that program.

use std::path::PathBuf;

use fleet_core::dialog::{
    Answer, Axis, CLAUDE_CODE_MARKERS, CLAUDE_CODE_TURN_OVER, Dialog, Key, OPENCODE_MARKERS,
    newly_shown, read_dialog, read_dialog_styled, shown_counts,
};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/dialogs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn claude_markers() -> Vec<String> {
    CLAUDE_CODE_MARKERS.iter().map(|m| m.to_string()).collect()
}

fn claude(name: &str) -> Option<Dialog> {
    read_dialog(&fixture(name), &claude_markers(), false)
}

fn keys(dialog: &Dialog) -> Vec<&str> {
    dialog.choices.iter().map(|c| c.choice.as_str()).collect()
}

fn label<'a>(dialog: &'a Dialog, choice: &str) -> &'a str {
    dialog
        .choices
        .iter()
        .find(|c| c.choice == choice)
        .map_or("", |c| c.label.as_str())
}

/// Every Claude Code dialog of the catalogue: its fixture, the choices fleetd offers for it,
/// where its menu's cursor starts (for a cursor menu), and words its prompt must hold.
const CLAUDE_DIALOGS: &[(&str, &[&str], Option<usize>, &str)] = &[
    (
        "claude-auto-notice.txt",
        &["enter", "esc"],
        None,
        "Auto mode can't check actions",
    ),
    (
        "claude-auto-prompt.txt",
        &["no", "yes", "esc"],
        Some(0),
        "curl -s http://127.0.0.1:18099/z",
    ),
    (
        "claude-bash.txt",
        &["1", "2", "3", "4", "esc"],
        None,
        "touch proof.txt",
    ),
    (
        "claude-acceptedits-bash.txt",
        &["1", "2", "3", "4", "esc"],
        None,
        "Bash command",
    ),
    (
        "claude-edit.txt",
        &["1", "2", "3", "esc"],
        None,
        "+goodbye world",
    ),
    (
        "claude-write.txt",
        &["1", "2", "3", "esc"],
        None,
        "Do you want to create",
    ),
    (
        "claude-mcp-tool.txt",
        &["1", "2", "3", "esc"],
        None,
        "capmcp",
    ),
    (
        "claude-webfetch.txt",
        &["1", "2", "3"],
        None,
        "Do you want to allow Claude to fetch",
    ),
    (
        "claude-plan-approve.txt",
        &["1", "2", "3"],
        None,
        "Here is Claude's plan:\nPlan: make notes\n1. Create notes.txt\n2. Write hello into it\nClaude has written up a plan",
    ),
    (
        "claude-plan-exit-nofile.txt",
        &["1", "2"],
        None,
        "Exit plan mode?",
    ),
    (
        "claude-trust.txt",
        &["no-exit", "yes-i-trust-this-folder", "esc"],
        Some(0),
        "/tmp/cc-capture/work/trust",
    ),
    (
        "claude-mcp-server-approval.txt",
        &[
            "use-this-mcp-server",
            "use-this-and-all-future-mcp-servers",
            "continue-without-using-this-mcp",
            "esc",
        ],
        Some(2),
        "New MCP server found in this project: capmcp",
    ),
    (
        "claude-bypass.txt",
        &["no-exit", "yes-i-accept", "esc"],
        Some(0),
        "Bypass Permissions mode",
    ),
    (
        "claude-apikey.txt",
        &["yes", "no-recommended", "esc"],
        Some(1),
        "Do you want to use this API key?",
    ),
];

#[test]
fn every_claude_code_dialog_reads_with_its_choices_and_cursor() {
    for (name, offered, cursor, says) in CLAUDE_DIALOGS {
        let dialog = claude(name).unwrap_or_else(|| panic!("{name}: no dialog read"));
        assert_eq!(keys(&dialog), *offered, "{name}");
        assert_eq!(dialog.cursor.map(|c| c.at), *cursor, "{name}");
        assert!(dialog.prompt.contains(says), "{name}: {}", dialog.prompt);
        assert!(!dialog.prompt.contains('❯'), "{name}: {}", dialog.prompt);
        dialog.check().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn a_claude_code_menu_after_one_down_is_the_same_dialog_with_its_cursor_moved() {
    for (name, down) in [
        ("claude-auto-prompt.txt", "claude-auto-prompt-down.txt"),
        ("claude-trust.txt", "claude-trust-down.txt"),
        ("claude-bypass.txt", "claude-bypass-down.txt"),
    ] {
        let (shown, moved) = (claude(name).unwrap(), claude(down).unwrap());
        assert_eq!(moved, shown, "{down}");
        let at = shown.cursor.unwrap().at;
        assert!(moved.cursor_on(at + 1), "{down}: {:?}", moved.cursor);
        assert_eq!(shown.moves_to(at + 1), Some(vec![Key::Down]), "{name}");
    }
    // The auto-mode prompt: the cursor starts on No; Yes is one Down away, then Enter.
    let prompt = claude("claude-auto-prompt.txt").unwrap();
    assert_eq!(label(&prompt, "yes"), "Yes");
    assert_eq!(prompt.pick("yes"), Ok(Answer::Select(1)));
    assert_eq!(prompt.pick("no"), Ok(Answer::Select(0)));
    assert_eq!(prompt.moves_to(0), Some(vec![]));
    // The MCP server prompt starts on its last option.
    let server = claude("claude-mcp-server-approval.txt").unwrap();
    assert_eq!(server.moves_to(0), Some(vec![Key::Up, Key::Up]));
    assert_eq!(label(&server, "esc"), "reject");
}

#[test]
fn numbered_claude_code_prompts_keep_their_labels() {
    let bash = claude("claude-bash.txt").unwrap();
    assert_eq!(label(&bash, "1"), "Yes");
    assert_eq!(label(&bash, "4"), "No");
    assert_eq!(bash.pick("1"), Ok(Answer::Press(Key::Digit(1))));
    let webfetch = claude("claude-webfetch.txt").unwrap();
    assert!(label(&webfetch, "3").starts_with("No, and tell Claude"));
    let plan = claude("claude-plan-approve.txt").unwrap();
    assert_eq!(label(&plan, "1"), "Yes, and use auto mode");
}

/// What Claude Code shows once a dialog is answered, or idle: no dialog is read off it (a
/// marker's words that stay in its transcript are not taken for a dialog).
#[test]
fn claude_code_screens_without_a_dialog_read_as_none() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/dialogs");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let settled = name.ends_with("-result.txt") || name.ends_with("-ready.txt");
        if name.starts_with("claude-") && settled {
            let dialog = claude(&name);
            assert_eq!(dialog, None, "{name}");
            read += 1;
        }
    }
    assert!(read >= 20, "only {read} settled screens");
}

#[test]
fn a_claude_code_no_shows_that_its_turn_is_over_and_a_yes_does_not() {
    let markers: Vec<String> = CLAUDE_CODE_TURN_OVER
        .iter()
        .map(|m| m.to_string())
        .collect();
    let after = |before: &str, after: &str| {
        newly_shown(
            &fixture(after),
            &markers,
            &shown_counts(&fixture(before), &markers),
        )
    };
    let interrupted = Some("Interrupted · What should Claude do instead?".to_string());
    assert_eq!(
        after("claude-bash.txt", "claude-bash-no-result.txt"),
        interrupted
    );
    assert_eq!(
        after("claude-mcp-tool.txt", "claude-mcp-tool-no-result.txt"),
        interrupted
    );
    assert_eq!(
        after("claude-mcp-tool.txt", "claude-mcp-tool-esc-result.txt"),
        interrupted
    );
    assert_eq!(
        after("claude-write.txt", "claude-write-no-result.txt").as_deref(),
        Some("Rejected write to")
    );
    assert_eq!(
        after(
            "claude-plan-exit-nofile.txt",
            "claude-plan-exit-nofile-no-result.txt"
        )
        .as_deref(),
        Some("Rejected Claude's plan")
    );
    assert_eq!(
        after("claude-write.txt", "claude-write-yes-result.txt"),
        None
    );
}

fn opencode_markers() -> Vec<String> {
    OPENCODE_MARKERS.iter().map(|m| m.to_string()).collect()
}

/// opencode's permission prompts, read with their colours (`capture-pane -e`): the fixture's
/// name, its options, and which one is current.
const OPENCODE_ROWS: &[(&str, &[&str], usize)] = &[
    (
        "opencode-bash-once.ansi",
        &["allow-once", "allow-always", "reject"],
        0,
    ),
    (
        "opencode-bash-always.ansi",
        &["allow-once", "allow-always", "reject"],
        1,
    ),
    (
        "opencode-bash-reject.ansi",
        &["allow-once", "allow-always", "reject"],
        2,
    ),
    (
        "opencode-bash-truecolor-once.ansi",
        &["allow-once", "allow-always", "reject"],
        0,
    ),
    (
        "opencode-bash-truecolor-reject.ansi",
        &["allow-once", "allow-always", "reject"],
        2,
    ),
    (
        "opencode-edit.ansi",
        &["allow-once", "allow-always", "reject"],
        0,
    ),
    (
        "opencode-external-read.ansi",
        &["allow-once", "allow-always", "reject"],
        0,
    ),
    (
        "opencode-webfetch.ansi",
        &["allow-once", "allow-always", "reject"],
        0,
    ),
    (
        "opencode-doom-loop.ansi",
        &["allow-once", "allow-always", "reject"],
        0,
    ),
    (
        "opencode-bash-always-confirm.ansi",
        &["confirm", "cancel"],
        0,
    ),
    (
        "opencode-bash-fullscreen.ansi",
        &["allow-once", "allow-always", "reject"],
        0,
    ),
];

#[test]
fn opencodes_permission_options_are_read_with_their_colours() {
    for (name, offered, current) in OPENCODE_ROWS {
        let dialog = read_dialog_styled(&fixture(name), &opencode_markers(), false)
            .unwrap_or_else(|| panic!("{name}: no dialog read"));
        assert_eq!(keys(&dialog), *offered, "{name}");
        let cursor = dialog.cursor.unwrap_or_else(|| panic!("{name}: no cursor"));
        assert_eq!(
            (cursor.axis, cursor.at),
            (Axis::Horizontal, *current),
            "{name}"
        );
        assert!(dialog.in_colour, "{name}");
        dialog.check().unwrap_or_else(|e| panic!("{name}: {e}"));
        // The same dialog as its plain text reads, where its current option cannot be told.
        let plain = name.replace(".ansi", ".txt");
        let without = read_dialog(&fixture(&plain), &opencode_markers(), false).unwrap();
        assert_eq!(without, dialog, "{plain}");
        assert!(without.in_colour && without.cursor.is_none(), "{plain}");
    }
    let once = read_dialog_styled(
        &fixture("opencode-bash-once.ansi"),
        &opencode_markers(),
        false,
    )
    .unwrap();
    assert_eq!(once.moves_to(2), Some(vec![Key::Right, Key::Right]));
    assert_eq!(once.pick("allow-always"), Ok(Answer::Select(1)));
    let reject = read_dialog_styled(
        &fixture("opencode-bash-reject.ansi"),
        &opencode_markers(),
        false,
    )
    .unwrap();
    assert_eq!(reject.moves_to(0), Some(vec![Key::Left, Key::Left]));
    assert_eq!(reject, once, "the same dialog, its cursor elsewhere");
}

/// opencode's question tool: its hint line is the marker; Enter submits the highlighted answer
/// and Esc dismisses the question.
#[test]
fn opencodes_question_offers_submit_and_dismiss() {
    let dialog = read_dialog(
        &fixture("opencode-question.txt"),
        &opencode_markers(),
        false,
    )
    .unwrap();
    assert_eq!(keys(&dialog), ["enter", "esc"]);
    assert_eq!(label(&dialog, "esc"), "dismiss");
}

/// What opencode shows with no dialog up reads as none.
#[test]
fn opencode_screens_without_a_dialog_read_as_none() {
    for name in [
        "opencode-bash-after-once.txt",
        "opencode-bash-after-always.txt",
        "opencode-bash-after-reject.txt",
        "opencode-question-after-dismiss.txt",
        "opencode-first-start.txt",
    ] {
        assert_eq!(
            read_dialog(&fixture(name), &opencode_markers(), false),
            None,
            "{name}"
        );
    }
}
