//! herdr servers for tests and benches: the stand-in (`fleet-herdr-standin`) as a separate
//! process a test can kill and start again, the way a user's herdr might stop and come back
//! (a stand-in, not herdr); and a real herdr when `HERDR_BIN` points at one.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fleet_mux::herdr::driver::Driver;
use tokio::process::{Child, Command};

use crate::bins::binary;
use crate::wait::until;

/// How long the stand-in may take to answer its first ping.
const START_LIMIT: Duration = Duration::from_secs(10);

/// A running (or stopped) stand-in.
pub struct StandInProcess {
    /// Holds its socket; removed on drop.
    dir: tempfile::TempDir,
    /// Its private tmux server's name.
    tmux: String,
    /// The process, while running.
    child: Option<Child>,
}

impl StandInProcess {
    /// Starts a stand-in on a socket of its own.
    pub async fn start() -> anyhow::Result<Self> {
        let mut standin = Self {
            dir: tempfile::tempdir()?,
            tmux: format!("fleet-standin-{}", uuid::Uuid::now_v7().simple()),
            child: None,
        };
        standin.launch().await?;
        Ok(standin)
    }

    /// Its socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("herdr.sock")
    }

    /// A client of it, for a test to speak herdr's protocol beside fleetd.
    pub fn driver(&self) -> Driver {
        Driver::new(self.socket())
    }

    /// Starts it (again), on the same socket.
    pub async fn launch(&mut self) -> anyhow::Result<()> {
        let child = Command::new(binary("fleet-herdr-standin")?)
            .arg("--socket")
            .arg(self.socket())
            .arg("--tmux")
            .arg(&self.tmux)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        let socket = self.socket();
        until("the herdr stand-in to answer", START_LIMIT, || {
            let socket = socket.clone();
            async move { Driver::new(socket).ping().await.ok() }
        })
        .await?;
        Ok(())
    }

    /// Kills it abruptly, as a crashed herdr; its socket goes too.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.start_kill()?;
            child.wait().await?;
        }
        remove_socket(&self.socket());
        Ok(())
    }
}

fn remove_socket(socket: &Path) {
    let _ = std::fs::remove_file(socket);
}

impl Drop for StandInProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        crate::fleet::stop_tmux(&self.tmux);
    }
}

/// A real herdr server (`herdr --session NAME server`) with a private config, state and home,
/// stopped when dropped.
pub struct RealHerdr {
    /// Its config, state and home.
    dir: tempfile::TempDir,
    /// Its session name.
    session: String,
    /// The server process.
    child: std::process::Child,
}

impl RealHerdr {
    /// Starts the herdr binary `HERDR_BIN` names; `None` when it names none.
    pub async fn from_env() -> anyhow::Result<Option<Self>> {
        let Some(bin) = std::env::var_os("HERDR_BIN") else {
            return Ok(None);
        };
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("config");
        std::fs::create_dir_all(config.join("herdr"))?;
        std::fs::write(
            config.join("herdr/config.toml"),
            "onboarding = false\n[updates]\ncheck = false\n",
        )?;
        let session = format!("fleet-{}", uuid::Uuid::now_v7().simple());
        let child = std::process::Command::new(bin)
            .args(["--session", &session, "server"])
            .env("XDG_CONFIG_HOME", &config)
            .env("XDG_STATE_HOME", dir.path().join("state"))
            .env("HOME", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let herdr = Self {
            dir,
            session,
            child,
        };
        let socket = herdr.socket();
        until("herdr to answer", START_LIMIT, || {
            let socket = socket.clone();
            async move { Driver::new(socket).ping().await.ok() }
        })
        .await?;
        Ok(Some(herdr))
    }

    /// Its socket.
    pub fn socket(&self) -> PathBuf {
        self.dir
            .path()
            .join(format!("config/herdr/sessions/{}/herdr.sock", self.session))
    }
}

impl Drop for RealHerdr {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
