//! A persistent tmux control-mode client (`tmux -C`): each command is a line on a pipe and its
//! answer a `%begin … %end` block, instead of a tmux process per command (~0.1 ms against
//! ~2 ms). The client attaches to a session of its own ([`CONTROL_SESSION`]) whose pane does
//! nothing; `%output` is switched off, and every other notification is skipped.
//!
//! [`Blocks`], [`quote`] and [`line()`] are the pure half; [`Control`] owns the process. A command
//! line is one line: a word holding a newline (or any control character) is refused before
//! anything is written, since what followed the newline would run as a command of its own and
//! every later answer would be read as the answer to the command before it.

use std::path::PathBuf;
use std::process::Stdio;

use fleet_core::typed::{ControlChar, first_control};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

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
fn name<S: AsRef<str>>(words: &[S]) -> String {
    words
        .first()
        .map(|w| w.as_ref().escape_debug().to_string())
        .unwrap_or_default()
}

/// The error of a command tmux did not answer in time: it names the command only.
fn no_answer<S: AsRef<str>>(words: &[S]) -> MuxError {
    MuxError::Command {
        command: name(words),
        stderr: format!("tmux did not answer within {:?}", super::COMMAND_TIMEOUT),
    }
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

/// A live control-mode connection.
struct Connection {
    /// The `tmux -C` process; killed when dropped.
    _child: Child,
    /// Where commands go.
    stdin: ChildStdin,
    /// Where answers come from.
    lines: Lines<BufReader<ChildStdout>>,
    /// The block parser.
    blocks: Blocks,
    /// A command was written and its answer not yet read: a caller gave up half-way (its
    /// future was dropped), and the next answer on the pipe belongs to nobody. Such a
    /// connection is replaced rather than reused.
    unread: bool,
}

impl Connection {
    async fn open(program: &PathBuf, socket: &str) -> Result<Self, MuxError> {
        let spawn_err = |source| MuxError::Spawn {
            program: program.display().to_string(),
            source,
        };
        let mut child = Command::new(program)
            .args([
                "-f",
                "/dev/null",
                "-L",
                socket,
                "-C",
                "new-session",
                "-A",
                "-s",
            ])
            .arg(CONTROL_SESSION)
            .args(["sleep", "2147483647"])
            .env_remove("TMUX")
            .env_remove("TMUX_PANE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_err)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(MuxError::Protocol {
                command: "tmux -C".into(),
                answer: "no pipes".into(),
            });
        };
        let mut connection = Self {
            _child: child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            blocks: Blocks::default(),
            unread: false,
        };
        // The attach itself answers with a block; then switch pane output off.
        connection.answer("new-session").await?;
        connection.run("refresh-client -f no-output").await?;
        Ok(connection)
    }

    async fn answer(&mut self, command: &str) -> Result<Vec<String>, MuxError> {
        loop {
            let Ok(Some(line)) = self.lines.next_line().await else {
                return Err(MuxError::Disconnected);
            };
            match self.blocks.feed(&line) {
                Seen::Nothing => {}
                Seen::Done(lines) => return Ok(lines),
                Seen::Failed(lines) => {
                    return Err(super::codec::classify_failure(command, &lines.join("\n")));
                }
                Seen::Exit => return Err(MuxError::Disconnected),
            }
        }
    }

    async fn run(&mut self, command: &str) -> Result<Vec<String>, MuxError> {
        self.unread = true;
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .map_err(|_| MuxError::Disconnected)?;
        let answer = self.answer(command).await;
        self.unread = false;
        answer
    }
}

/// A control-mode client that connects on first use and again after its server went away.
#[derive(Debug)]
pub struct Control {
    /// The tmux binary.
    program: PathBuf,
    /// The private server's socket name.
    socket: String,
    /// The connection; one command at a time, as tmux itself runs them.
    connection: Mutex<Option<Connection>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

impl Control {
    /// A client for the private server `socket`; nothing starts until the first command.
    pub fn new(program: PathBuf, socket: String) -> Self {
        Self {
            program,
            socket,
            connection: Mutex::new(None),
        }
    }

    /// Runs `commands` (each as its words, unquoted) one after the other; returns each one's
    /// lines. Stops at the first failure. Nothing is sent when any word cannot be quoted
    /// ([`line()`]). A dead connection, or one a cancelled call left with an unread answer, is
    /// replaced before the first command (so this is cancel-safe).
    pub async fn run(&self, commands: &[Vec<String>]) -> Result<Vec<Vec<String>>, MuxError> {
        let lines = commands
            .iter()
            .map(|words| line(words))
            .collect::<Result<Vec<_>, _>>()?;
        let mut guard = self.connection.lock().await;
        if guard.as_ref().is_none_or(|c| c.unread) {
            // A wedged server must not hold the lock (and every caller behind it) for ever.
            let opened = tokio::time::timeout(
                super::COMMAND_TIMEOUT,
                Connection::open(&self.program, &self.socket),
            )
            .await
            .map_err(|_| MuxError::Command {
                command: "a control connection".into(),
                stderr: format!("tmux did not answer within {:?}", super::COMMAND_TIMEOUT),
            })?;
            *guard = Some(opened?);
        }
        let mut answers = Vec::with_capacity(commands.len());
        for (words, command) in commands.iter().zip(&lines) {
            let Some(connection) = guard.as_mut() else {
                return Err(MuxError::Disconnected);
            };
            let answer =
                tokio::time::timeout(super::COMMAND_TIMEOUT, connection.run(command)).await;
            let Ok(answer) = answer else {
                // The answer may still come: this connection is done for (it reads as unread).
                return Err(no_answer(words));
            };
            match answer {
                Ok(lines) => answers.push(lines),
                Err(MuxError::Disconnected) => {
                    *guard = None;
                    return Err(MuxError::Disconnected);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(answers)
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
    fn a_command_left_unanswered_is_named_without_its_words() {
        let words = [
            "new-session",
            "-e",
            "FLEET_TOKEN=fleet_s3cret",
            "--",
            "agent",
        ];
        let err = no_answer(&words).to_string();
        assert!(
            err.starts_with("new-session failed: tmux did not answer"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
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
