//! tmux command lines and the answers to them. Pure: no processes, no I/O. The lines of the
//! control-mode connection itself (quoting, answer blocks) are [`control`]'s.
//!
//! What a lead chose (a working directory, a name) or a config holds (environment values,
//! arguments) must reach tmux as itself, never as a command:
//! - tmux splits a command line at any argument that ends in `;` (and turns a trailing `\;`
//!   into a literal `;`), so every argument that carries user text goes through [`escape`] on
//!   the client's command line;
//! - tmux expands formats in some arguments (tried on tmux 3.3a: `new-session -c` and `-s`, and
//!   `load-buffer`'s path; not `-e` values, not the program's argv, not `send-keys -l`), where
//!   `#(cmd)` runs `cmd` and `#S` is the session's name: a path or name goes there through
//!   `format_literal`;
//! - a control character (a newline above all) in any argument is refused (`one_line`): over
//!   the control connection it would end the command line, and what followed would run as a
//!   command of its own.

pub mod control;

use std::collections::BTreeMap;
use std::path::Path;

use fleet_core::dialog::Key;
use fleet_core::typed::first_control;

use crate::{MuxError, PaneId, PaneLife, PaneSpec, Snapshot};

/// The size of a new pane. Agents lay out their screens for this; big enough that a status
/// line and an input box never wrap.
pub const PANE_COLUMNS: u32 = 200;
/// See [`PANE_COLUMNS`].
pub const PANE_ROWS: u32 = 50;

const SEP: &str = ";";

/// Makes `arg` reach tmux verbatim even when it ends in `;`.
pub fn escape(arg: &str) -> String {
    match arg.strip_suffix(';') {
        Some(head) => format!("{head}\\;"),
        None => arg.to_string(),
    }
}

/// Makes `text` mean itself in an argument tmux expands as a format: `#` doubled.
fn format_literal(text: &str) -> String {
    text.replace('#', "##")
}

/// `text`, if it holds no control character; else a refusal naming `what` (never the text: it
/// may be a token).
fn one_line<'a>(what: &str, text: &'a str) -> Result<&'a str, MuxError> {
    match first_control(text) {
        None => Ok(text),
        Some(found) => Err(MuxError::Refused(format!(
            "{what} holds {found}, which would end a tmux command line"
        ))),
    }
}

/// `path` as text, if it is UTF-8 and one line.
fn path_text<'a>(what: &str, path: &'a Path) -> Result<&'a str, MuxError> {
    let text = path.to_str().ok_or_else(|| {
        MuxError::Refused(format!("{what} {:?} is not valid UTF-8", path.as_os_str()))
    })?;
    one_line(what, text)
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Starts the server if needed, keeps exited panes around so their exit is seen, and opens a
/// detached session running `spec.argv`; the last command prints the new pane's id. Refused
/// when any part of `spec` could not reach tmux as itself (see the module doc). Words not yet
/// escaped for a transport: the caller does that (and over the control connection nothing,
/// not even the token in the environment, shows in the process list).
pub fn spawn_commands(spec: &PaneSpec) -> Result<Vec<Vec<String>>, MuxError> {
    let label = one_line("the pane's label", &spec.label)?;
    let cwd = path_text("the working directory", &spec.cwd)?;
    let mut session = strings(&["new-session", "-d", "-s", &format_literal(label)]);
    session.extend(strings(&[
        "-x",
        &PANE_COLUMNS.to_string(),
        "-y",
        &PANE_ROWS.to_string(),
        "-c",
        &format_literal(cwd),
    ]));
    for (key, value) in &spec.env {
        if key.is_empty() || key.contains('=') || first_control(key).is_some() {
            return Err(MuxError::Refused(format!(
                "the environment variable name {key:?} is empty or holds '=' or a control character"
            )));
        }
        one_line(
            &format!("the value of the environment variable {key}"),
            value,
        )?;
        session.push("-e".into());
        session.push(format!("{key}={value}"));
    }
    session.extend(strings(&["-P", "-F", "#{pane_id}", "--"]));
    for (i, arg) in spec.argv.iter().enumerate() {
        session.push(one_line(&format!("argument {i} of the program"), arg)?.to_string());
    }
    Ok(vec![
        strings(&["start-server"]),
        strings(&["set-option", "-g", "remain-on-exit", "on"]),
        session,
    ])
}

/// Leaves the mode a pane is in (copy mode eats keys).
pub fn leave_mode_args(pane: &PaneId) -> Vec<String> {
    strings(&["send-keys", "-X", "-t", &pane.0, "cancel"])
}

/// Deletes a buffer left behind by a paste that failed half-way.
pub fn delete_buffer_args(buffer: &str) -> Vec<String> {
    strings(&["delete-buffer", "-b", buffer])
}

/// Reads the pane id printed by [`spawn_commands`].
pub fn parse_pane_id(out: &str) -> Result<PaneId, MuxError> {
    let id = out.trim();
    if id.starts_with('%') && id.len() > 1 && !id.contains(char::is_whitespace) {
        Ok(PaneId(id.to_string()))
    } else {
        Err(MuxError::Protocol {
            command: "new-session".into(),
            answer: out.to_string(),
        })
    }
}

/// Loads stdin into a named buffer and pastes it into `pane`, bracketed if the program asked
/// for bracketed paste, deleting the buffer after.
pub fn paste_args(pane: &PaneId, buffer: &str) -> Vec<String> {
    strings(&[
        "load-buffer",
        "-b",
        buffer,
        "-",
        SEP,
        "paste-buffer",
        "-p",
        "-d",
        "-b",
        buffer,
        "-t",
        &pane.0,
    ])
}

/// Loads the file at `path` into buffer `buffer`: the control connection's paste path for text
/// [`set_buffer_args`] does not carry (more lines than one, a tab, more than
/// [`LINE_PASTE_MAX`] bytes). Its commands are lines, so text of several cannot ride on them,
/// nor on stdin. tmux expands formats in the path.
pub fn load_file_args(buffer: &str, path: &Path) -> Result<Vec<String>, MuxError> {
    let path = path_text("the staged paste's path", path)?;
    Ok(strings(&[
        "load-buffer",
        "-b",
        buffer,
        &format_literal(path),
    ]))
}

/// The longest text that rides on a command line ([`set_buffer_args`]): every other command of
/// the connection waits while its line is written, where a file is written before.
pub const LINE_PASTE_MAX: usize = 16 * 1024;

/// Sets buffer `buffer` to `text` on the command line itself, where `text` can ride on one (not
/// empty, no control character, `\n` and `\t` included, at most [`LINE_PASTE_MAX`] bytes): the
/// control connection's quick paste path, which spares writing a file and tmux reading it.
/// `None` for any other text, which is staged in a file ([`load_file_args`]). tmux expands no
/// format in the data of `set-buffer`.
pub fn set_buffer_args(buffer: &str, text: &str) -> Option<Vec<String>> {
    (!text.is_empty() && text.len() <= LINE_PASTE_MAX && first_control(text).is_none())
        .then(|| strings(&["set-buffer", "-b", buffer, "--", text]))
}

/// Pastes buffer `buffer` into `pane`, bracketed if the program asked for bracketed paste, and
/// deletes the buffer.
pub fn paste_buffer_args(pane: &PaneId, buffer: &str) -> Vec<String> {
    strings(&["paste-buffer", "-p", "-d", "-b", buffer, "-t", &pane.0])
}

/// Presses Enter.
pub fn enter_args(pane: &PaneId) -> Vec<String> {
    strings(&["send-keys", "-t", &pane.0, "Enter"])
}

/// Presses `key` (tmux's name for it: a digit or letter is itself).
pub fn key_args(pane: &PaneId, key: Key) -> Vec<String> {
    let name = match key {
        Key::Enter => "Enter".to_string(),
        Key::Escape => "Escape".to_string(),
        Key::Up => "Up".to_string(),
        Key::Down => "Down".to_string(),
        Key::Left => "Left".to_string(),
        Key::Right => "Right".to_string(),
        Key::Digit(_) | Key::Yes | Key::No => key.name(),
    };
    strings(&["send-keys", "-t", &pane.0, &name])
}

/// Types `text` literally (unescaped words: the caller escapes for its transport).
pub fn type_args(pane: &PaneId, text: &str) -> Vec<String> {
    strings(&["send-keys", "-t", &pane.0, "-l", "--", text])
}

/// Cursor and mode, then the visible text, of `pane`: two commands, one answer each.
pub fn snapshot_commands(pane: &PaneId) -> (Vec<String>, Vec<String>) {
    (
        strings(&[
            "display-message",
            "-p",
            "-t",
            &pane.0,
            "#{cursor_x} #{cursor_y} #{pane_in_mode}",
        ]),
        strings(&["capture-pane", "-p", "-t", &pane.0]),
    )
}

/// The visible text of `pane` with its colours (SGR escapes).
pub fn styled_args(pane: &PaneId) -> Vec<String> {
    strings(&["capture-pane", "-p", "-e", "-t", &pane.0])
}

/// Reads the answers to [`snapshot_commands`], one after the other.
pub fn parse_snapshot(pane: &PaneId, out: &str) -> Result<Snapshot, MuxError> {
    let bad = || MuxError::Protocol {
        command: format!("snapshot of {pane}"),
        answer: out.chars().take(200).collect(),
    };
    let (head, text) = out.split_once('\n').ok_or_else(bad)?;
    let mut fields = head.split(' ').map(str::parse::<u32>);
    match (fields.next(), fields.next(), fields.next()) {
        (Some(Ok(x)), Some(Ok(y)), Some(Ok(mode))) => Ok(Snapshot {
            cursor: Some((x, y)),
            in_mode: mode != 0,
            text: text.to_string(),
        }),
        _ => Err(bad()),
    }
}

/// The last `lines` lines of `pane`, scrollback included, wrapped lines joined. (A dead pane's
/// screen is cleared, so what its program said is only in the scrollback.)
pub fn history_args(pane: &PaneId, lines: usize) -> Vec<String> {
    strings(&[
        "capture-pane",
        "-p",
        "-J",
        "-S",
        &format!("-{lines}"),
        "-t",
        &pane.0,
    ])
}

/// Every pane of the server, with whether it is dead and how it ended, and whether its window
/// is the control client's own. Fields are separated by spaces (no control character may go
/// into a command line), the session's name last: it is the only one that may hold a space.
pub fn list_args() -> Vec<String> {
    let own = format!("#{{==:#{{window_name}},{}}}", control::CONTROL_WINDOW);
    vec![
        "list-panes".into(),
        "-a".into(),
        "-F".into(),
        format!(
            "#{{pane_id}} #{{pane_dead}} #{{pane_dead_status}} #{{pane_dead_signal}} {own} #{{session_name}}"
        ),
    ]
}

/// The answer to [`list_args`], read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listed {
    /// The workers' panes, under their own sessions. A program killed by signal N reads as
    /// status 128+N, as in a shell.
    pub panes: BTreeMap<PaneId, PaneLife>,
    /// Panes left only in the control client's session: their own session was closed (by
    /// hand, say), and the link kept their window open. Closing the session is meant to end
    /// its program, as it did before windows were linked.
    pub orphans: Vec<PaneId>,
}

/// Reads the answer to [`list_args`]; lines it cannot read are skipped, and so is the control
/// client's own window.
pub fn parse_list(out: &str) -> Listed {
    let mut listed = Listed::default();
    let mut linked = Vec::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.splitn(6, ' ').collect();
        let [id, dead, status, signal, own, session, ..] = fields.as_slice() else {
            continue;
        };
        if !id.starts_with('%') || *own == "1" {
            continue;
        }
        let pane = PaneId(id.to_string());
        if *session == control::CONTROL_SESSION {
            linked.push(pane);
            continue;
        }
        let life = match *dead {
            "1" => PaneLife::Exited(
                status
                    .trim()
                    .parse()
                    .ok()
                    .or_else(|| signal.trim().parse::<i32>().ok().map(|n| 128 + n)),
            ),
            _ => PaneLife::Alive,
        };
        listed.panes.insert(pane, life);
    }
    listed.orphans = linked
        .into_iter()
        .filter(|pane| !listed.panes.contains_key(pane))
        .collect();
    listed.orphans.sort();
    listed.orphans.dedup();
    listed
}

/// The tmux server's pid.
pub fn server_pid_args() -> Vec<String> {
    strings(&["display-message", "-p", "#{pid}"])
}

/// The pid of the program running in `pane`.
pub fn pane_pid_args(pane: &PaneId) -> Vec<String> {
    strings(&[
        "display-message",
        "-p",
        "-t",
        &pane.0,
        "#{pane_dead} #{pane_pid}",
    ])
}

/// Reads the answer to [`pane_pid_args`]: the pid of a pane whose program runs.
pub fn parse_pane_pid(pane: &PaneId, out: &str) -> Result<u32, MuxError> {
    match out.trim().split_once(' ') {
        Some(("0", pid)) => pid.parse().map_err(|_| MuxError::Protocol {
            command: "display-message #{pane_pid}".into(),
            answer: out.to_string(),
        }),
        Some(("1", _)) => Err(MuxError::NoPane(pane.clone())),
        _ => Err(MuxError::Protocol {
            command: "display-message #{pane_pid}".into(),
            answer: out.to_string(),
        }),
    }
}

/// Closes one pane (and with it its session).
pub fn close_args(pane: &PaneId) -> Vec<String> {
    strings(&["kill-pane", "-t", &pane.0])
}

/// Stops the server.
pub fn kill_server_args() -> Vec<String> {
    strings(&["kill-server"])
}

/// Turns a failed command's message into an error: a missing pane or server is
/// [`MuxError::NoPane`] (naming the pane the command targeted), anything else a command
/// failure naming the command only. `command` is the command line, as words or as one quoted
/// line; nothing else of it shows (its `-e` values and argv carry the worker's token), and its
/// target is looked for before `--` only (after it comes the program's argv).
pub fn classify_failure(command: &str, stderr: &str) -> MuxError {
    let stderr = stderr.trim();
    let missing = [
        "can't find pane",
        "no server running",
        "can't find session",
        "no such file",
    ];
    if missing.iter().any(|m| stderr.contains(m)) || stderr.starts_with("error connecting to") {
        let target = command
            .split_whitespace()
            .map(|w| w.trim_matches(['\'', '"']))
            .take_while(|w| *w != "--")
            .skip_while(|w| *w != "-t")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        return MuxError::NoPane(PaneId(target));
    }
    MuxError::Command {
        command: command
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_matches('\'')
            .to_string(),
        stderr: stderr.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pane_pid_is_read_only_while_its_program_runs() {
        let pane = PaneId("%3".into());
        assert_eq!(pane_pid_args(&pane)[3], "%3");
        assert_eq!(parse_pane_pid(&pane, "0 4242\n").ok(), Some(4242));
        assert!(matches!(
            parse_pane_pid(&pane, "1 4242"),
            Err(MuxError::NoPane(p)) if p == pane
        ));
        assert!(matches!(
            parse_pane_pid(&pane, "0 "),
            Err(MuxError::Protocol { .. })
        ));
        assert!(matches!(
            parse_pane_pid(&pane, ""),
            Err(MuxError::Protocol { .. })
        ));
    }

    #[test]
    fn arguments_ending_in_semicolons_survive() {
        assert_eq!(escape("plain"), "plain");
        assert_eq!(escape("a;"), "a\\;");
        assert_eq!(escape("a\\;"), "a\\\\;");
    }

    #[test]
    fn spawn_runs_argv_directly_with_env_and_cwd() {
        let spec = PaneSpec {
            label: "w1".into(),
            argv: vec!["agent".into(), "--flag;".into()],
            env: [("FLEET_NAME".to_string(), "w1".to_string())].into(),
            cwd: "/tmp".into(),
        };
        let commands = spawn_commands(&spec).unwrap();
        assert_eq!(commands[1], ["set-option", "-g", "remain-on-exit", "on"]);
        let session = &commands[2];
        let tail: Vec<&str> = session
            .iter()
            .rev()
            .take(3)
            .rev()
            .map(String::as_str)
            .collect();
        assert_eq!(tail, vec!["--", "agent", "--flag;"]);
        assert!(session.windows(2).any(|w| w == ["-e", "FLEET_NAME=w1"]));
        assert!(session.windows(2).any(|w| w == ["-c", "/tmp"]));
    }

    fn spec_in(cwd: &str) -> PaneSpec {
        PaneSpec {
            label: "w1".into(),
            argv: vec!["sh".into(), "-c".into(), "echo '#S #(id)'".into()],
            env: [
                ("FLEET_TOKEN".to_string(), "fleet_s3cret".to_string()),
                ("PROMPT".to_string(), "#S #(id)".to_string()),
            ]
            .into(),
            cwd: cwd.into(),
        }
    }

    fn session_words(spec: &PaneSpec) -> Vec<String> {
        spawn_commands(spec).unwrap().remove(2)
    }

    fn refusal(result: Result<Vec<Vec<String>>, MuxError>) -> String {
        match result {
            Err(MuxError::Refused(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn paths_reach_tmux_formats_as_themselves() {
        let session = session_words(&spec_in("/src/#(touch owned)/C#Sharp"));
        assert!(
            session
                .windows(2)
                .any(|w| w == ["-c", "/src/##(touch owned)/C##Sharp"]),
            "{session:?}"
        );
        // -e values and the program's argv are not formats: they go as they are.
        assert!(session.windows(2).any(|w| w == ["-e", "PROMPT=#S #(id)"]));
        assert_eq!(session.last().map(String::as_str), Some("echo '#S #(id)'"));
        assert_eq!(format_literal("##"), "####");
        assert_eq!(
            load_file_args("b1", Path::new("/state/C#/paste/b1")).unwrap(),
            ["load-buffer", "-b", "b1", "/state/C##/paste/b1"]
        );
    }

    #[test]
    fn only_one_line_of_text_rides_on_the_command_line() {
        assert_eq!(
            set_buffer_args("b1", "it's $HOME #{pane_id} -x").unwrap(),
            ["set-buffer", "-b", "b1", "--", "it's $HOME #{pane_id} -x"]
        );
        assert!(set_buffer_args("b1", "caf\u{e9} \u{202e}").is_some());
        for staged in [
            "",
            "two\nlines",
            "a\ttab",
            "\u{1b}[31m",
            "c1 \u{85}",
            "cr\r",
        ] {
            assert_eq!(set_buffer_args("b1", staged), None, "{staged:?}");
        }
        assert!(set_buffer_args("b1", &"x".repeat(LINE_PASTE_MAX)).is_some());
        assert_eq!(set_buffer_args("b1", &"x".repeat(LINE_PASTE_MAX + 1)), None);
    }

    #[test]
    fn control_characters_are_refused_naming_the_argument_never_its_value() {
        let why = refusal(spawn_commands(&spec_in(
            "/tmp/x\nrun-shell touch /tmp/owned",
        )));
        assert!(why.contains("the working directory"), "{why}");
        assert!(why.contains("U+000A (newline), at character 6"), "{why}");

        let mut spec = spec_in("/tmp");
        spec.env
            .insert("FLEET_TOKEN".into(), "fleet_s3cret\nrun-shell x".into());
        let why = refusal(spawn_commands(&spec));
        assert!(why.contains("environment variable FLEET_TOKEN"), "{why}");
        assert!(!why.contains("s3cret"), "{why}");

        let mut spec = spec_in("/tmp");
        spec.env.insert("A=B".into(), "x".into());
        assert!(refusal(spawn_commands(&spec)).contains("\"A=B\""));

        let mut spec = spec_in("/tmp");
        spec.argv.push("--token=fleet_s3cret\r".into());
        let why = refusal(spawn_commands(&spec));
        assert!(why.contains("argument 3 of the program"), "{why}");
        assert!(!why.contains("s3cret"), "{why}");

        let mut spec = spec_in("/tmp");
        spec.label = "w\u{1b}1".into();
        assert!(refusal(spawn_commands(&spec)).contains("label"));

        let why = match load_file_args("b1", Path::new("/state\n/b1")) {
            Err(MuxError::Refused(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(why.contains("staged paste"), "{why}");
    }

    #[test]
    fn a_path_that_is_not_utf8_is_refused_not_mangled() {
        use std::os::unix::ffi::OsStrExt;
        let mut spec = spec_in("/tmp");
        spec.cwd = std::ffi::OsStr::from_bytes(b"/tmp/caf\xe9").into();
        let why = refusal(spawn_commands(&spec));
        assert!(why.contains("not valid UTF-8"), "{why}");
    }

    #[test]
    fn pane_ids_are_checked() {
        assert_eq!(parse_pane_id("%12\n").unwrap(), PaneId("%12".into()));
        assert!(parse_pane_id("").is_err());
        assert!(parse_pane_id("oops\n").is_err());
    }

    #[test]
    fn snapshots_parse() {
        let pane = PaneId("%1".into());
        let snap = parse_snapshot(&pane, "3 7 0\n> hi\n\n").unwrap();
        assert_eq!(snap.cursor, Some((3, 7)));
        assert!(!snap.in_mode);
        assert_eq!(snap.text, "> hi\n\n");
        assert!(parse_snapshot(&pane, "garbage").is_err());
        assert!(parse_snapshot(&pane, "1 x 0\n").is_err());
    }

    #[test]
    fn pane_lists_parse_and_skip_junk() {
        let listed = parse_list(
            "%0 0   0 w0\n%3 1 2  0 w3\njunk\n%4 1   0 w4\n%5 1  9 0 w5\n%9 0   1 _fleetd\n%6 0   0 a b\n\
             %3 1 2  0 _fleetd\n%7 0   0 _fleetd\n%7 0   0 _fleetd\n%8 0   1 w8\n",
        );
        let panes = &listed.panes;
        assert_eq!(panes.get(&PaneId("%0".into())), Some(&PaneLife::Alive));
        assert_eq!(
            panes.get(&PaneId("%3".into())),
            Some(&PaneLife::Exited(Some(2)))
        );
        assert_eq!(
            panes.get(&PaneId("%4".into())),
            Some(&PaneLife::Exited(None))
        );
        assert_eq!(
            panes.get(&PaneId("%5".into())),
            Some(&PaneLife::Exited(Some(137)))
        );
        assert_eq!(panes.get(&PaneId("%6".into())), Some(&PaneLife::Alive));
        // The control client's own window is no worker's, wherever it shows.
        assert!(!panes.contains_key(&PaneId("%9".into())));
        assert!(!panes.contains_key(&PaneId("%8".into())));
        assert_eq!(panes.len(), 5);
        // A worker's window linked into the control session is listed once, under its own; one
        // left only there lost its own session, listed once however often it shows.
        assert_eq!(listed.orphans, vec![PaneId("%7".into())]);
    }

    #[test]
    fn each_safe_key_is_one_tmux_key_name() {
        let pane = PaneId("%3".into());
        for (key, name) in [
            (Key::Digit(1), "1"),
            (Key::Digit(9), "9"),
            (Key::Yes, "y"),
            (Key::No, "n"),
            (Key::Enter, "Enter"),
            (Key::Escape, "Escape"),
            (Key::Up, "Up"),
            (Key::Down, "Down"),
            (Key::Left, "Left"),
            (Key::Right, "Right"),
        ] {
            assert_eq!(key_args(&pane, key), ["send-keys", "-t", "%3", name]);
        }
    }

    #[test]
    fn missing_panes_and_servers_are_told_apart_from_failures() {
        let args = enter_args(&PaneId("%9".into())).join(" ");
        assert!(matches!(
            classify_failure(&args, "can't find pane: %9"),
            MuxError::NoPane(PaneId(p)) if p == "%9"
        ));
        let quoted = "'send-keys' '-t' '%9' 'Enter'";
        assert!(matches!(
            classify_failure(quoted, "can't find pane: %9"),
            MuxError::NoPane(PaneId(p)) if p == "%9"
        ));
        assert!(matches!(
            classify_failure(&list_args().join(" "), "no server running on /tmp/tmux-0/x"),
            MuxError::NoPane(_)
        ));
        assert!(matches!(
            classify_failure(&args, "unknown key: Entr"),
            MuxError::Command { command, .. } if command == "send-keys"
        ));
        // A spawn's argv is not searched for a target (it may hold `-t` and then a secret),
        // and a failure names the command only.
        let spawn =
            "'new-session' '-e' 'FLEET_TOKEN=fleet_s3cret' '--' 'docker' '-t' 'fleet_s3cret'";
        assert!(matches!(
            classify_failure(spawn, "no such file or directory"),
            MuxError::NoPane(PaneId(p)) if p.is_empty()
        ));
        let failed = classify_failure(spawn, "duplicate session: w1").to_string();
        assert_eq!(failed, "new-session failed: duplicate session: w1");
    }
}
