//! A persistent tmux control-mode client (`tmux -C`): each command is a line on a pipe and its
//! answer a `%begin … %end` block, instead of a tmux process per command (~0.1 ms against
//! ~2 ms). The client attaches to a session of its own ([`CONTROL_SESSION`]) whose pane does
//! nothing. A reader task takes every line tmux writes: answers go to the command waiting on
//! them, `%output` of a watched pane wakes its watchers ([`Control::watch`]), and every other
//! notification (the output of panes nobody watches) is skipped.
//!
//! [`Control`] owns the process; the lines it writes and reads are [`super::codec::control`]'s
//! (pure), whose command lines never hold a control character.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::JoinHandle;

use super::codec::classify_failure;
use super::codec::control::{
    Blocks, CONTROL_SESSION, CONTROL_WINDOW, Seen, is_linked, line, link_args, linked_panes_args,
    linked_sessions_args, name, output_pane,
};
use crate::{MuxError, OutputWatch, PaneId};

/// The error of a command tmux did not answer within `limit`: it names the command only.
fn no_answer<S: AsRef<str>>(words: &[S], limit: Duration) -> MuxError {
    MuxError::Command {
        command: name(words),
        stderr: format!("tmux did not answer within {limit:?}"),
    }
}

/// An answer block as the reader saw it end.
enum Answer {
    /// `%end`: its lines.
    Done(Vec<String>),
    /// `%error`: its lines (the message).
    Failed(Vec<String>),
}

/// Who waits on which pane's output, across connections.
#[derive(Debug, Default)]
struct Watchers {
    /// Each watched pane's write count, and how many watches hold it.
    panes: HashMap<String, (watch::Sender<u64>, usize)>,
    /// Panes whose window is known to be linked into the control session.
    linked: HashSet<String>,
}

type Shared = Arc<std::sync::Mutex<Watchers>>;

fn lock(watchers: &Shared) -> std::sync::MutexGuard<'_, Watchers> {
    watchers.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A live control-mode connection.
struct Connection {
    /// The `tmux -C` process; killed when dropped.
    _child: Child,
    /// Where commands go.
    stdin: ChildStdin,
    /// The answers, in the order of the commands; closed when the client left.
    answers: mpsc::UnboundedReceiver<Answer>,
    /// Reads every line; aborted with the connection.
    reader: JoinHandle<()>,
    /// Who waits on which pane's output: woken when the connection goes.
    watchers: Shared,
    /// A command was written and its answer not yet read: a caller gave up half-way (its
    /// future was dropped), and the next answer on the pipe belongs to nobody. Such a
    /// connection is replaced rather than reused.
    unread: bool,
}

impl Drop for Connection {
    /// What this connection's reader had not yet read when it is stopped is never heard (the
    /// next connection hears only what comes once it is attached): every watcher looks once
    /// more.
    fn drop(&mut self) {
        self.reader.abort();
        wake_all(&self.watchers);
    }
}

/// Tells every watcher its pane may have written: each looks at the screen once more.
fn wake_all(watchers: &Shared) {
    for (writes, _) in lock(watchers).panes.values() {
        writes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Tells the watchers of `pane`, if it has any, that it wrote.
fn wrote(watchers: &Shared, pane: &str) {
    if let Some((writes, _)) = lock(watchers).panes.get(pane) {
        writes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Reads every line of the client: answers to `answers`, output to the pane's watchers. A
/// pane's output comes as raw bytes (tmux escapes only control characters), so lines are
/// bytes first; an answer's are read as UTF-8, lossily.
async fn read_lines(stdout: ChildStdout, answers: mpsc::UnboundedSender<Answer>, watchers: Shared) {
    let mut stdout = BufReader::new(stdout);
    let mut blocks = Blocks::default();
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        match stdout.read_until(b'\n', &mut bytes).await {
            Ok(0) => {
                tracing::debug!("the tmux control client closed its output");
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the tmux control client");
                break;
            }
            Ok(_) => {}
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        }
        // Output of every linked pane comes by: only its pane id is read.
        if !blocks.is_open()
            && let Some(pane) = output_pane(&bytes)
        {
            wrote(&watchers, pane);
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        let answer = match blocks.feed(&text) {
            Seen::Nothing => continue,
            Seen::Output(pane) => {
                wrote(&watchers, pane);
                continue;
            }
            Seen::Done(lines) => Answer::Done(lines),
            Seen::Failed(lines) => Answer::Failed(lines),
            Seen::Exit => {
                tracing::info!(line = %text, "the tmux control client left");
                break;
            }
        };
        if answers.send(answer).is_err() {
            break;
        }
    }
    // Watchers look at the screen at once, and learn there what became of the server.
    wake_all(&watchers);
}

impl Connection {
    async fn open(program: &PathBuf, socket: &str, watchers: &Shared) -> Result<Self, MuxError> {
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
            .arg("-n")
            .arg(CONTROL_WINDOW)
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
        let (sender, answers) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_lines(stdout, sender, watchers.clone()));
        let mut connection = Self {
            _child: child,
            stdin,
            answers,
            reader,
            watchers: watchers.clone(),
            unread: false,
        };
        // The attach itself answers with a block.
        connection.answer("new-session").await?;
        // The links stay from an earlier connection, or an earlier fleetd.
        let listed = connection.run(&line(&linked_panes_args())?).await?;
        lock(watchers).linked = listed.iter().map(|p| p.trim().to_string()).collect();
        Ok(connection)
    }

    async fn answer(&mut self, command: &str) -> Result<Vec<String>, MuxError> {
        match self.answers.recv().await {
            Some(Answer::Done(lines)) => Ok(lines),
            Some(Answer::Failed(lines)) => Err(classify_failure(command, &lines.join("\n"))),
            None => Err(MuxError::Disconnected),
        }
    }

    async fn run(&mut self, command: &str) -> Result<Vec<String>, MuxError> {
        self.send(command).await?;
        let answer = self.answer(command).await;
        self.unread = false;
        answer
    }

    /// Sends one line (a command, or several joined by ` ; `); its answers are then unread
    /// until the caller has read them all.
    async fn send(&mut self, line: &str) -> Result<(), MuxError> {
        self.unread = true;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|_| MuxError::Disconnected)
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
    /// Who waits on which pane's output.
    watchers: Shared,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

/// Ends one watch of a pane when dropped.
struct Release {
    pane: String,
    watchers: Shared,
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut watchers = lock(&self.watchers);
        let last = match watchers.panes.get_mut(&self.pane) {
            Some((_, held)) => {
                *held = held.saturating_sub(1);
                *held == 0
            }
            None => false,
        };
        if last {
            watchers.panes.remove(&self.pane);
        }
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
            watchers: Shared::default(),
        }
    }

    /// Runs `commands` (each as its words, unquoted) one after the other; returns each one's
    /// lines. Stops at the first failure. Nothing is sent when any word cannot be quoted
    /// ([`line()`](super::codec::control::line)). A dead connection, or one a cancelled call
    /// left with an unread answer, is replaced before the first command (so this is
    /// cancel-safe).
    ///
    /// The commands go to tmux as one command list, a line of them joined by ` ; `: tmux runs
    /// them in one turn of its loop (which walks every pane of the server each turn) and
    /// answers each in a block of its own, and a command that fails skips the rest of the
    /// list, as running them one by one and stopping would.
    pub async fn run(&self, commands: &[Vec<String>]) -> Result<Vec<Vec<String>>, MuxError> {
        let lines = commands
            .iter()
            .map(|words| line(words))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(first) = commands.first() else {
            // An empty line would detach the control client.
            return Ok(Vec::new());
        };
        let mut guard = self.connection.lock().await;
        if guard.as_ref().is_none_or(|c| c.unread) {
            let open = Connection::open(&self.program, &self.socket, &self.watchers);
            let opened = tokio::time::timeout(self.limit, open)
                .await
                .map_err(|_| no_answer(&["a control connection"], self.limit))?;
            *guard = Some(opened?);
        }
        let Some(connection) = guard.as_mut() else {
            return Err(MuxError::Disconnected);
        };
        // A server that stopped reading must not hold the lock for ever with a long line
        // half-written: the connection then reads as unread, and is replaced.
        match tokio::time::timeout(self.limit, connection.send(&lines.join(" ; "))).await {
            Err(_) => return Err(no_answer(first, self.limit)),
            Ok(Err(e)) => {
                *guard = None;
                return Err(e);
            }
            Ok(Ok(())) => {}
        }
        let mut answers = Vec::with_capacity(commands.len());
        for (words, command) in commands.iter().zip(&lines) {
            let Some(connection) = guard.as_mut() else {
                return Err(MuxError::Disconnected);
            };
            match tokio::time::timeout(self.limit, connection.answer(command)).await {
                // The answer may still come: this connection is done for (it reads as unread).
                Err(_) => return Err(no_answer(words, self.limit)),
                Ok(Ok(lines)) => answers.push(lines),
                Ok(Err(MuxError::Disconnected)) => {
                    *guard = None;
                    return Err(MuxError::Disconnected);
                }
                // tmux skipped the rest of the list: nothing more comes.
                Ok(Err(e)) => {
                    connection.unread = false;
                    return Err(e);
                }
            }
        }
        if let Some(connection) = guard.as_mut() {
            connection.unread = false;
        }
        Ok(answers)
    }

    /// Links a pane fleetd just opened into the control session.
    pub async fn link_new(&self, pane: &PaneId) -> Result<(), MuxError> {
        self.run(&[link_args(&pane.0)]).await?;
        lock(&self.watchers).linked.insert(pane.0.clone());
        Ok(())
    }

    /// Watches `pane`'s output until the watch is dropped: its window is linked into the
    /// control session if it is not yet.
    ///
    /// A pane's output is never turned off and on again (`refresh-client -A`): tmux 3.3a's
    /// server crashed (a segfault in its control-mode output) within a few hundred tasks that
    /// way, here. So the client hears every linked pane, and drops what nobody waits on.
    pub async fn watch(&self, pane: &PaneId) -> Result<OutputWatch, MuxError> {
        let (writes, linked) = {
            let mut watchers = lock(&self.watchers);
            let linked = watchers.linked.contains(&pane.0);
            let (sender, held) = watchers
                .panes
                .entry(pane.0.clone())
                .or_insert_with(|| (watch::Sender::new(0), 0));
            *held += 1;
            (sender.subscribe(), linked)
        };
        let release = Release {
            pane: pane.0.clone(),
            watchers: self.watchers.clone(),
        };
        if !linked {
            let answer = self.run(&[linked_sessions_args(&pane.0)]).await?;
            if !answer.first().is_some_and(|a| is_linked(a)) {
                self.run(&[link_args(&pane.0)]).await?;
            }
            lock(&self.watchers).linked.insert(pane.0.clone());
        }
        Ok(OutputWatch::new(writes, Box::new(release)))
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
