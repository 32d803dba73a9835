//! tmux as a pane host: a private tmux server per gateway (`tmux -L <name>`), one session per
//! pane.
//!
//! [`codec`] builds the command lines and reads tmux's answers (pure). [`Tmux::private`] drives
//! the gateway's own server over one persistent control-mode connection ([`control`]), so
//! typing and looking cost a pipe round trip; spawning and stopping the server run the `tmux`
//! client once. [`Tmux::new`] drives somebody else's server (a lead's, for nudges) with the
//! client alone, never starting a server or a session there. [`spread::Spread`] spreads a big
//! fleet over several private servers.

pub mod codec;
pub mod control;
pub mod spread;

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use fleet_core::dialog::Key;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::{
    AgentState, MuxError, OutputWatch, PaneHost, PaneId, PaneLife, PaneSpec, PaneState, Snapshot,
};
use control::Control;

/// How long one tmux command may take: a wedged server or client must not hold up the pump or
/// the nudger for ever.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a killed server may take to go away.
const SERVER_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Which tmux server to talk to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Socket {
    /// A named socket in tmux's socket dir (`-L name`): fleetd's private server.
    Name(String),
    /// A socket by path (`-S path`): someone else's server, such as a lead's.
    Path(PathBuf),
}

/// A tmux server driven through the `tmux` client, and for a private server also through a
/// control-mode connection.
#[derive(Debug)]
pub struct Tmux {
    /// The tmux client binary.
    program: PathBuf,
    /// The server.
    socket: Socket,
    /// The control connection and the private dir where pastes are staged for it (task text
    /// stays readable by the user only). None: one client process per command.
    control: Option<(Control, PathBuf)>,
}

impl Tmux {
    /// A driver for somebody else's server at `socket`, one client process per command.
    pub fn new(socket: Socket) -> Self {
        Self {
            program: PathBuf::from("tmux"),
            socket,
            control: None,
        }
    }

    /// The pid of the server, while one runs on the socket (none is started for the asking).
    pub async fn server_pid(&self) -> Result<u32, MuxError> {
        let out = self.exec(&[codec::server_pid_args()]).await?;
        out.trim().parse().map_err(|_| MuxError::Protocol {
            command: "display-message #{pid}".into(),
            answer: out,
        })
    }

    /// A driver for the private server `name`, over a control-mode connection; pastes are
    /// staged in `scratch` (created user-only).
    pub fn private(name: String, scratch: PathBuf) -> Self {
        let program = PathBuf::from("tmux");
        Self {
            control: Some((
                Control::new(program.clone(), name.clone(), COMMAND_TIMEOUT),
                scratch,
            )),
            program,
            socket: Socket::Name(name),
        }
    }

    /// The server this driver talks to.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// Whether the server runs and holds fleetd's control session (asked with a client, this
    /// starts no server): a server of fleetd's, not somebody else's of the same name.
    pub async fn holds_control_session(&self) -> bool {
        self.run(&codec::control::has_control_session_args(), None)
            .await
            .is_ok()
    }

    /// Runs one batch of tmux commands with a client process; returns stdout.
    async fn run(&self, args: &[String], stdin: Option<&[u8]>) -> Result<String, MuxError> {
        let mut cmd = Command::new(&self.program);
        match &self.socket {
            Socket::Name(name) => cmd.arg("-f").arg("/dev/null").arg("-L").arg(name),
            Socket::Path(path) => cmd.arg("-S").arg(path),
        };
        cmd.args(args)
            // Talking to another server from inside tmux must not inherit the outer session.
            .env_remove("TMUX")
            .env_remove("TMUX_PANE")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let spawn_err = |source| MuxError::Spawn {
            program: self.program.display().to_string(),
            source,
        };
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input).await.map_err(spawn_err)?;
            drop(pipe);
        }
        let output = match tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output()).await {
            Ok(output) => output.map_err(spawn_err)?,
            // kill_on_drop ends the wedged client.
            Err(_) => {
                return Err(MuxError::Command {
                    command: args.first().cloned().unwrap_or_default(),
                    stderr: format!("tmux did not answer within {COMMAND_TIMEOUT:?}"),
                });
            }
        };
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(codec::classify_failure(
                &args.join(" "),
                &String::from_utf8_lossy(&output.stderr),
            ))
        }
    }

    /// Runs single commands (as words), over the control connection when there is one; returns
    /// their output joined, as one client process would print it.
    async fn exec(&self, commands: &[Vec<String>]) -> Result<String, MuxError> {
        match &self.control {
            Some((control, _)) => {
                let answers = control.run(commands).await?;
                Ok(answers
                    .into_iter()
                    .map(|lines| lines.join("\n") + "\n")
                    .collect())
            }
            None => {
                let mut args = Vec::new();
                for (i, words) in commands.iter().enumerate() {
                    if i > 0 {
                        args.push(";".to_string());
                    }
                    args.extend(words.iter().map(|w| codec::escape(w)));
                }
                self.run(&args, None).await
            }
        }
    }

    /// Types `text` literally, as keys (no paste brackets, no Enter): for one-line nudges.
    pub async fn type_text(&self, pane: &PaneId, text: &str) -> Result<(), MuxError> {
        self.exec(&[codec::type_args(pane, text)]).await.map(drop)
    }

    /// Stops the whole server and every pane in it, and returns once it is gone (a command
    /// sent while it is still shutting down would reach the dying server).
    pub async fn kill_server(&self) -> Result<(), MuxError> {
        match self.run(&codec::kill_server_args(), None).await {
            Ok(_) | Err(MuxError::NoPane(_)) => {}
            Err(e) => return Err(e),
        }
        let deadline = tokio::time::Instant::now() + SERVER_EXIT_WAIT;
        while tokio::time::Instant::now() < deadline {
            match self.run(&codec::list_args(), None).await {
                Err(MuxError::NoPane(_)) => return Ok(()),
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        Err(MuxError::Command {
            command: "kill-server".into(),
            stderr: format!("the server was still running {SERVER_EXIT_WAIT:?} later"),
        })
    }

    /// tmux marks a pane dead when its terminal closes and learns the exit status only when it
    /// reaps the program; now and then it misses the SIGCHLD and the program stays a zombie
    /// (seen on tmux 3.3a), so its status would never be known. A SIGCHLD sent to the server
    /// makes it reap every exited child; the next look at the panes then has the status.
    async fn remind_to_reap(&self) {
        let pid = self
            .server_pid()
            .await
            .ok()
            .and_then(|pid| i32::try_from(pid).ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid
            && let Err(e) = rustix::process::kill_process(pid, rustix::process::Signal::CHILD)
        {
            tracing::debug!(%pid, error = %e, "cannot remind tmux to reap");
        }
    }

    /// Writes `text` to `path`, a user-only file in `scratch`, for `load-buffer` to read.
    fn stage(scratch: &Path, path: &Path, text: &str) -> Result<(), MuxError> {
        let io = |source| MuxError::Spawn {
            program: format!("staging a paste in {}", scratch.display()),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(scratch)
            .map_err(io)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        std::io::Write::write_all(&mut file, text.as_bytes()).map_err(io)
    }
}

#[async_trait]
impl PaneHost for Tmux {
    async fn spawn(&self, spec: &PaneSpec) -> Result<PaneId, MuxError> {
        let out = self.exec(&codec::spawn_commands(spec)?).await?;
        let pane = codec::parse_pane_id(&out)?;
        if let Some((control, _)) = &self.control
            && let Err(e) = control.link_new(&pane).await
        {
            // Its output is then looked at on a timer instead.
            tracing::warn!(%pane, error = %e, "cannot link the new pane into the control session");
        }
        Ok(pane)
    }

    async fn leave_mode(&self, pane: &PaneId) -> Result<(), MuxError> {
        self.exec(&[codec::leave_mode_args(pane)]).await.map(drop)
    }

    async fn paste(&self, pane: &PaneId, text: &str) -> Result<(), MuxError> {
        let buffer = format!("fleet-{}", uuid::Uuid::now_v7().simple());
        match &self.control {
            Some((_, scratch)) => {
                // One line goes on the command line; anything else through a file.
                let (load, staged) = match codec::set_buffer_args(&buffer, text) {
                    Some(set) => (set, None),
                    None => {
                        let path = scratch.join(&buffer);
                        let load = codec::load_file_args(&buffer, &path)?;
                        Self::stage(scratch, &path, text)?;
                        (load, Some(path))
                    }
                };
                let result = self
                    .exec(&[load, codec::paste_buffer_args(pane, &buffer)])
                    .await;
                if let Some(path) = staged {
                    let _ = std::fs::remove_file(&path);
                }
                if result.is_err() {
                    // paste-buffer -d did not run: the buffer would stay (buffer-limit spares
                    // named buffers).
                    let _ = self.exec(&[codec::delete_buffer_args(&buffer)]).await;
                }
                result.map(drop)
            }
            None => self
                .run(&codec::paste_args(pane, &buffer), Some(text.as_bytes()))
                .await
                .map(drop),
        }
    }

    async fn enter(&self, pane: &PaneId) -> Result<(), MuxError> {
        self.exec(&[codec::enter_args(pane)]).await.map(drop)
    }

    async fn press(&self, pane: &PaneId, key: Key) -> Result<(), MuxError> {
        self.exec(&[codec::key_args(pane, key)]).await.map(drop)
    }

    async fn snapshot(&self, pane: &PaneId) -> Result<Snapshot, MuxError> {
        let (cursor, screen) = codec::snapshot_commands(pane);
        let out = self.exec(&[cursor, screen]).await?;
        codec::parse_snapshot(pane, &out)
    }

    async fn styled(&self, pane: &PaneId) -> Result<String, MuxError> {
        self.exec(&[codec::styled_args(pane)]).await
    }

    async fn history(&self, pane: &PaneId, lines: usize) -> Result<String, MuxError> {
        self.exec(&[codec::history_args(pane, lines)]).await
    }

    async fn panes(&self) -> Result<BTreeMap<PaneId, PaneState>, MuxError> {
        let listed = match self.exec(&[codec::list_args()]).await {
            Ok(out) => codec::parse_list(&out),
            // No server running: no panes.
            Err(MuxError::NoPane(_)) => return Ok(BTreeMap::new()),
            Err(e) => return Err(e),
        };
        for pane in &listed.orphans {
            tracing::info!(%pane, "a worker's own tmux session was closed: its pane closes too");
            if let Err(e) = self.close(pane).await {
                tracing::warn!(%pane, error = %e, "cannot close a pane whose session was closed");
            }
        }
        let panes = listed.panes;
        if panes.values().any(|life| *life == PaneLife::Exited(None)) {
            self.remind_to_reap().await;
        }
        Ok(panes
            .into_iter()
            .map(|(pane, life)| (pane, PaneState { life, agent: None }))
            .collect())
    }

    async fn report(&self, _pane: &PaneId, _state: AgentState) -> Result<(), MuxError> {
        Ok(())
    }

    async fn pid(&self, pane: &PaneId) -> Result<u32, MuxError> {
        let out = self.exec(&[codec::pane_pid_args(pane)]).await?;
        codec::parse_pane_pid(pane, &out)
    }

    async fn close(&self, pane: &PaneId) -> Result<(), MuxError> {
        match self.exec(&[codec::close_args(pane)]).await {
            Ok(_) | Err(MuxError::NoPane(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn watch_output(&self, pane: &PaneId) -> Result<OutputWatch, MuxError> {
        match &self.control {
            Some((control, _)) => control.watch(pane).await,
            None => Ok(OutputWatch::none()),
        }
    }
}
