//! A persistent tmux control-mode client (`tmux -C`): each command is a line on a pipe and its
//! answer a `%begin … %end` block, instead of a tmux process per command (~0.1 ms against
//! ~2 ms). The client attaches to a session of its own ([`CONTROL_SESSION`]) whose pane does
//! nothing; `%output` is switched off, and every other notification is skipped.
//!
//! [`Control`] owns the process; the lines it writes and reads are [`super::codec::control`]'s
//! (pure), whose command lines never hold a control character.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

use super::codec::classify_failure;
use super::codec::control::{Blocks, CONTROL_SESSION, Seen, line, name};
use crate::MuxError;

/// The error of a command tmux did not answer within `limit`: it names the command only.
fn no_answer<S: AsRef<str>>(words: &[S], limit: Duration) -> MuxError {
    MuxError::Command {
        command: name(words),
        stderr: format!("tmux did not answer within {limit:?}"),
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
                    return Err(classify_failure(command, &lines.join("\n")));
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
    /// How long one command (or opening the connection) may take: a wedged server must not
    /// hold the lock, and every caller behind it, for ever.
    limit: Duration,
    /// The connection; one command at a time, as tmux itself runs them.
    connection: Mutex<Option<Connection>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

impl Control {
    /// A client for the private server `socket`, each command answered within `limit`;
    /// nothing starts until the first command.
    pub fn new(program: PathBuf, socket: String, limit: Duration) -> Self {
        Self {
            program,
            socket,
            limit,
            connection: Mutex::new(None),
        }
    }

    /// Runs `commands` (each as its words, unquoted) one after the other; returns each one's
    /// lines. Stops at the first failure. Nothing is sent when any word cannot be quoted
    /// ([`line()`](super::codec::control::line)). A dead connection, or one a cancelled call
    /// left with an unread answer, is replaced before the first command (so this is
    /// cancel-safe).
    pub async fn run(&self, commands: &[Vec<String>]) -> Result<Vec<Vec<String>>, MuxError> {
        let lines = commands
            .iter()
            .map(|words| line(words))
            .collect::<Result<Vec<_>, _>>()?;
        let mut guard = self.connection.lock().await;
        if guard.as_ref().is_none_or(|c| c.unread) {
            let opened =
                tokio::time::timeout(self.limit, Connection::open(&self.program, &self.socket))
                    .await
                    .map_err(|_| no_answer(&["a control connection"], self.limit))?;
            *guard = Some(opened?);
        }
        let mut answers = Vec::with_capacity(commands.len());
        for (words, command) in commands.iter().zip(&lines) {
            let Some(connection) = guard.as_mut() else {
                return Err(MuxError::Disconnected);
            };
            let answer = tokio::time::timeout(self.limit, connection.run(command)).await;
            let Ok(answer) = answer else {
                // The answer may still come: this connection is done for (it reads as unread).
                return Err(no_answer(words, self.limit));
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
    fn a_command_left_unanswered_is_named_without_its_words() {
        let words = [
            "new-session",
            "-e",
            "FLEET_TOKEN=fleet_s3cret",
            "--",
            "agent",
        ];
        let err = no_answer(&words, Duration::from_secs(10)).to_string();
        assert!(
            err.starts_with("new-session failed: tmux did not answer"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }
}
