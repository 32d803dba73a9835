//! tmux as a pane host: a private tmux server per gateway (`tmux -L <name>`), one session per
//! pane, driven by running the `tmux` client once per batch of commands.
//!
//! [`codec`] builds the command lines and reads tmux's answers (pure); [`Tmux`] runs them. The
//! same type drives a lead's own tmux server (by socket path) for nudges, where it never starts
//! a server.

pub mod codec;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::{MuxError, PaneHost, PaneId, PaneLife, PaneSpec, Snapshot};

/// Which tmux server to talk to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Socket {
    /// A named socket in tmux's socket dir (`-L name`): fleetd's private server.
    Name(String),
    /// A socket by path (`-S path`): someone else's server, such as a lead's.
    Path(PathBuf),
}

/// A tmux server driven through the `tmux` client.
#[derive(Clone, Debug)]
pub struct Tmux {
    /// The tmux client binary.
    program: PathBuf,
    /// The server.
    socket: Socket,
}

impl Tmux {
    /// A driver for the server at `socket`, using `tmux` from `PATH`.
    pub fn new(socket: Socket) -> Self {
        Self {
            program: PathBuf::from("tmux"),
            socket,
        }
    }

    /// The server this driver talks to.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The command a user runs to look at the fleet's panes.
    pub fn attach_hint(&self) -> String {
        match &self.socket {
            Socket::Name(name) => format!("tmux -L {name} attach"),
            Socket::Path(path) => format!("tmux -S {} attach", path.display()),
        }
    }

    /// Runs one batch of tmux commands; returns stdout.
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
        let output = child.wait_with_output().await.map_err(spawn_err)?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(codec::classify_failure(
                args,
                &String::from_utf8_lossy(&output.stderr),
            ))
        }
    }

    /// Types `text` literally (no paste brackets), then Enter: for one-line nudges.
    pub async fn type_line(&self, pane: &PaneId, text: &str) -> Result<(), MuxError> {
        self.run(&codec::type_line_args(pane, text), None)
            .await
            .map(drop)
    }

    /// Stops the whole server and every pane in it.
    pub async fn kill_server(&self) -> Result<(), MuxError> {
        match self.run(&codec::kill_server_args(), None).await {
            Ok(_) | Err(MuxError::NoPane(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl PaneHost for Tmux {
    async fn spawn(&self, spec: &PaneSpec) -> Result<PaneId, MuxError> {
        let args = codec::spawn_args(spec);
        let out = self.run(&args, None).await?;
        codec::parse_pane_id(&out)
    }

    async fn paste(&self, pane: &PaneId, text: &str) -> Result<(), MuxError> {
        let buffer = format!("fleet-{}", uuid::Uuid::now_v7().simple());
        self.run(&codec::paste_args(pane, &buffer), Some(text.as_bytes()))
            .await
            .map(drop)
    }

    async fn enter(&self, pane: &PaneId) -> Result<(), MuxError> {
        self.run(&codec::enter_args(pane), None).await.map(drop)
    }

    async fn snapshot(&self, pane: &PaneId) -> Result<Snapshot, MuxError> {
        let args = codec::snapshot_args(pane);
        let out = self.run(&args, None).await?;
        codec::parse_snapshot(&args, &out)
    }

    async fn history(&self, pane: &PaneId, lines: usize) -> Result<String, MuxError> {
        self.run(&codec::history_args(pane, lines), None).await
    }

    async fn panes(&self) -> Result<BTreeMap<PaneId, PaneLife>, MuxError> {
        match self.run(&codec::list_args(), None).await {
            Ok(out) => Ok(codec::parse_list(&out)),
            // No server running: no panes.
            Err(MuxError::NoPane(_)) => Ok(BTreeMap::new()),
            Err(e) => Err(e),
        }
    }

    async fn close(&self, pane: &PaneId) -> Result<(), MuxError> {
        match self.run(&codec::close_args(pane), None).await {
            Ok(_) | Err(MuxError::NoPane(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
