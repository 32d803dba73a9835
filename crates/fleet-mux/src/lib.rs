//! Pane hosts: the terminal multiplexers fleetd spawns workers into and types tasks into.
//!
//! [`PaneHost`] is the one seam; [`tmux::Tmux`] drives a private tmux server. The injection
//! procedure ([`inject::inject`]) is written once over the trait, so every host types, submits
//! and verifies the same way. Nothing here knows about messages or MCP: a pane host moves
//! keystrokes and screens, never meaning.

#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod fine;
pub mod herdr;
pub mod inject;
pub mod interrupted;
pub mod tmux;

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use fleet_core::dialog::Key;
use fleet_core::redact::{EnvNames, ProgramOnly};

/// A pane host's id for one pane (tmux `%3`, herdr `w1:p2`): opaque, host-local.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PaneId(pub String);

impl std::fmt::Display for PaneId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What to run in a new pane. Its `Debug` shows the environment's names and the program only:
/// the values and the arguments carry the worker's token.
#[derive(Clone, PartialEq, Eq)]
pub struct PaneSpec {
    /// A label for the pane (tmux: the session name); unique among the host's live panes.
    pub label: String,
    /// The program and its arguments, run directly (no shell).
    pub argv: Vec<String>,
    /// Extra environment for the program.
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: PathBuf,
}

impl std::fmt::Debug for PaneSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaneSpec")
            .field("label", &self.label)
            .field("argv", &ProgramOnly(&self.argv))
            .field("env", &EnvNames(&self.env))
            .field("cwd", &self.cwd)
            .finish()
    }
}

/// What an agent in a pane is doing, as the pane host sees it (herdr recognises agents and
/// takes reports; tmux knows nothing of the kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentState {
    /// Waiting for input: a task may be typed in.
    Idle,
    /// Busy with a turn.
    Working,
    /// Waiting on a human (a permission prompt, say).
    Blocked,
    /// Finished its turn: a task may be typed in.
    Done,
    /// Not known (and any state a newer host names).
    #[serde(other)]
    Unknown,
}

impl AgentState {
    /// The state's name.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Idle => "idle",
            AgentState::Working => "working",
            AgentState::Blocked => "blocked",
            AgentState::Done => "done",
            AgentState::Unknown => "unknown",
        }
    }
}

/// A pane as the host lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaneState {
    /// Whether its program still runs.
    pub life: PaneLife,
    /// The agent the host sees in it and what it is doing, when the host knows.
    pub agent: Option<(String, AgentState)>,
}

/// Is a pane's program still running?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaneLife {
    /// Running.
    Alive,
    /// Its program exited (with this status, when the host knows it).
    Exited(Option<i32>),
}

/// What a pane shows: its visible text and where the cursor is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Cursor column and row; `None` where the host does not tell it (herdr).
    pub cursor: Option<(u32, u32)>,
    /// The pane is in a mode (tmux copy mode) and would eat keys.
    pub in_mode: bool,
    /// The visible text, one line per row.
    pub text: String,
}

/// A pane host failure.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// The multiplexer's command could not be run at all.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The multiplexer refused a command.
    #[error("{command} failed: {stderr}")]
    Command {
        /// The command.
        command: String,
        /// What it said.
        stderr: String,
    },
    /// The pane is not there (closed, exited).
    #[error("pane {0} is gone")]
    NoPane(PaneId),
    /// The multiplexer's server cannot be reached (not running, socket gone).
    #[error("{0} is not reachable")]
    Unreachable(String),
    /// The connection to the multiplexer closed (its server stopped, say).
    #[error("the connection to the multiplexer closed (was its server stopped?)")]
    Disconnected,
    /// A request fleetd would not send: an argument the multiplexer would misread (a control
    /// character ends a tmux command line; a path that is not UTF-8). Nothing was sent. The
    /// message names the argument, never its value (it may be a token).
    #[error("not sent to the multiplexer: {0}")]
    Refused(String),
    /// The multiplexer answered something we cannot read.
    #[error("unexpected answer from {command}: {answer}")]
    Protocol {
        /// The command.
        command: String,
        /// The answer.
        answer: String,
    },
}

/// A terminal multiplexer holding the fleet's panes.
///
/// Contract: every method is cancel-safe (dropping the future leaves the host consistent, though
/// keys already sent stay sent); none retries on its own; a pane that is gone yields
/// [`MuxError::NoPane`] where the host can tell.
#[async_trait]
pub trait PaneHost: Send + Sync + 'static {
    /// Starts `spec.argv` in a new pane with `spec.env` and `spec.cwd`; returns its id.
    async fn spawn(&self, spec: &PaneSpec) -> Result<PaneId, MuxError>;

    /// Takes the pane out of whatever mode the host put it in (tmux copy mode, say, entered
    /// by a human scrolling), so typed keys reach the program.
    async fn leave_mode(&self, pane: &PaneId) -> Result<(), MuxError>;

    /// Pastes `text` into the pane, as a bracketed paste if the program asked for one. Does not
    /// press Enter.
    async fn paste(&self, pane: &PaneId, text: &str) -> Result<(), MuxError>;

    /// Presses Enter in the pane.
    async fn enter(&self, pane: &PaneId) -> Result<(), MuxError>;

    /// Presses one key of the safe set in the pane (an answer to a dialog on its screen).
    async fn press(&self, pane: &PaneId, key: Key) -> Result<(), MuxError>;

    /// What the pane shows now.
    async fn snapshot(&self, pane: &PaneId) -> Result<Snapshot, MuxError>;

    /// What the pane shows now with its colours: one line per row, SGR escapes kept (to tell
    /// the option of a dialog that shows as current only in colour).
    async fn styled(&self, pane: &PaneId) -> Result<String, MuxError>;

    /// The last `lines` lines the pane showed, scrollback included (wrapped lines joined):
    /// what a program said before it died.
    async fn history(&self, pane: &PaneId, lines: usize) -> Result<String, MuxError>;

    /// Every pane the host holds for this fleet: whether its program still runs, and what the
    /// host knows of the agent in it.
    async fn panes(&self) -> Result<BTreeMap<PaneId, PaneState>, MuxError>;

    /// Tells the host what fleetd knows of the program in `pane` (its session state), for
    /// hosts that show it (herdr's sidebar). A no-op where the host has no such notion.
    async fn report(&self, pane: &PaneId, state: AgentState) -> Result<(), MuxError>;

    /// The process id of the program the host started in `pane` (its own process, not what
    /// that started in turn), while it runs. With the process's start time, it tells the
    /// program fleetd started from another in a pane of the same id (a host that restarted
    /// numbers its panes afresh).
    async fn pid(&self, pane: &PaneId) -> Result<u32, MuxError>;

    /// Closes the pane, ending its program. Closing a pane that is gone is not an error.
    async fn close(&self, pane: &PaneId) -> Result<(), MuxError>;

    /// Tells of `pane`'s output from now until the watch is dropped, where the host reports
    /// output as it happens (tmux's control mode); elsewhere a watch that never fires
    /// ([`OutputWatch::none`]), and the caller keeps looking at the screen on a timer.
    async fn watch_output(&self, pane: &PaneId) -> Result<OutputWatch, MuxError> {
        let _ = pane;
        Ok(OutputWatch::none())
    }
}

/// A pane's output as its host reports it: [`OutputWatch::changed`] returns once the pane
/// printed something after the last [`OutputWatch::mark_seen`]. What it printed is not
/// carried: a look at the screen tells that.
pub struct OutputWatch {
    /// Counts the pane's writes; `None` where the host reports none.
    writes: Option<tokio::sync::watch::Receiver<u64>>,
    /// Ends the watch when dropped (the host stops telling of the pane's writes).
    _release: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for OutputWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputWatch")
            .field("live", &self.is_live())
            .finish()
    }
}

impl OutputWatch {
    /// A watch that never fires: the host reports no output.
    pub fn none() -> Self {
        Self {
            writes: None,
            _release: None,
        }
    }

    /// A watch on `writes`, which the host bumps at each write of the pane; `release` is
    /// dropped with the watch.
    pub fn new(writes: tokio::sync::watch::Receiver<u64>, release: Box<dyn Send + Sync>) -> Self {
        Self {
            writes: Some(writes),
            _release: Some(release),
        }
    }

    /// Whether the host reports this pane's output: a caller may then wait on
    /// [`Self::changed`] rather than look at the screen again and again. A host whose
    /// connection goes wakes every watch, as a write would; a look on a slow timer stays as
    /// the fallback.
    pub fn is_live(&self) -> bool {
        self.writes
            .as_ref()
            .is_some_and(|w| w.has_changed().is_ok())
    }

    /// Takes in every write so far: [`Self::changed`] waits for the next. Call it *before*
    /// looking at the screen, so a write the look may have missed still counts as new.
    pub fn mark_seen(&mut self) {
        if let Some(writes) = &mut self.writes {
            writes.borrow_and_update();
        }
    }

    /// Returns once the pane wrote something not yet marked seen (or the host's connection
    /// closed: a look then tells what became of it); never, where the host reports no output.
    pub async fn changed(&mut self) {
        let heard = match &mut self.writes {
            Some(writes) => writes.changed().await.is_ok(),
            None => false,
        };
        if !heard {
            std::future::pending::<()>().await;
        }
    }
}
