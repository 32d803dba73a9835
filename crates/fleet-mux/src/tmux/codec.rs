//! tmux command lines and the answers to them. Pure: no processes, no I/O.
//!
//! tmux splits a command line at any argument that ends in `;` (and turns a trailing `\;` into
//! a literal `;`), so every argument that carries user text goes through [`escape`].

use std::collections::BTreeMap;

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

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Starts the server if needed, keeps exited panes around so their exit is seen, and opens a
/// detached session running `spec.argv`; the last command prints the new pane's id. Unescaped
/// words: the caller escapes them for its transport (and over the control connection nothing,
/// not even the token in the environment, shows in the process list).
pub fn spawn_commands(spec: &PaneSpec) -> Vec<Vec<String>> {
    let mut session = strings(&["new-session", "-d", "-s", &spec.label]);
    session.extend(strings(&[
        "-x",
        &PANE_COLUMNS.to_string(),
        "-y",
        &PANE_ROWS.to_string(),
    ]));
    session.push("-c".into());
    session.push(spec.cwd.to_string_lossy().into_owned());
    for (key, value) in &spec.env {
        session.push("-e".into());
        session.push(format!("{key}={value}"));
    }
    session.extend(strings(&["-P", "-F", "#{pane_id}", "--"]));
    session.extend(spec.argv.iter().cloned());
    vec![
        strings(&["start-server"]),
        strings(&["set-option", "-g", "remain-on-exit", "on"]),
        session,
    ]
}

/// Leaves the mode a pane is in (copy mode eats keys).
pub fn leave_mode_args(pane: &PaneId) -> Vec<String> {
    strings(&["send-keys", "-X", "-t", &pane.0, "cancel"])
}

/// Deletes a buffer left behind by a paste that failed half-way.
pub fn delete_buffer_args(buffer: &str) -> Vec<String> {
    strings(&["delete-buffer", "-b", buffer])
}

/// Reads the pane id printed by [`spawn_args`].
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

/// Loads the file at `path` into buffer `buffer` (the control connection's paste path: its
/// commands are lines, so the text cannot ride on stdin).
pub fn load_file_args(buffer: &str, path: &str) -> Vec<String> {
    strings(&["load-buffer", "-b", buffer, path])
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
            cursor: (x, y),
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

/// Every pane of the server, with whether it is dead and how it ended.
pub fn list_args() -> Vec<String> {
    strings(&[
        "list-panes",
        "-a",
        "-F",
        "#{pane_id}\t#{pane_dead}\t#{pane_dead_status}\t#{pane_dead_signal}\t#{session_name}",
    ])
}

/// Reads the answer to [`list_args`]; lines it cannot read are skipped, and so is the control
/// client's own session. A program killed by signal N reads as status 128+N, as in a shell.
pub fn parse_list(out: &str) -> BTreeMap<PaneId, PaneLife> {
    out.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let [id, dead, status, signal, session, ..] = fields.as_slice() else {
                return None;
            };
            if !id.starts_with('%') || *session == super::control::CONTROL_SESSION {
                return None;
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
            Some((PaneId(id.to_string()), life))
        })
        .collect()
}

/// The tmux server's pid.
pub fn server_pid_args() -> Vec<String> {
    strings(&["display-message", "-p", "#{pid}"])
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
/// failure. `command` is the command line, as words or as one quoted line.
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
        let commands = spawn_commands(&spec);
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
        assert_eq!(snap.cursor, (3, 7));
        assert!(!snap.in_mode);
        assert_eq!(snap.text, "> hi\n\n");
        assert!(parse_snapshot(&pane, "garbage").is_err());
        assert!(parse_snapshot(&pane, "1 x 0\n").is_err());
    }

    #[test]
    fn pane_lists_parse_and_skip_junk() {
        let panes = parse_list(
            "%0\t0\t\t\tw0\n%3\t1\t2\t\tw3\njunk\n%4\t1\t\t\tw4\n%5\t1\t\t9\tw5\n%9\t0\t\t\t_fleetd\n",
        );
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
        assert_eq!(panes.len(), 4);
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
    }
}
