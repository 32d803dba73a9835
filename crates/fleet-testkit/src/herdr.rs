//! herdr servers for tests and benches: the stand-in (`fleet-herdr-standin`) as a separate
//! process a test can kill and start again, the way a user's herdr might stop and come back
//! (a stand-in, not herdr); and a real herdr when `HERDR_BIN` points at one (the tests that run
//! only on one are built to run with the cfg `herdr_bin`, which build.rs sets when `HERDR_BIN`
//! is set, and are ignored without it).

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
        answering(self.socket(), "the herdr stand-in").await
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

/// Waits until the server on `socket` (`what`) answers a ping.
async fn answering(socket: PathBuf, what: &str) -> anyhow::Result<()> {
    until(&format!("{what} to answer"), START_LIMIT, || {
        let socket = socket.clone();
        async move { Driver::new(socket).ping().await.ok() }
    })
    .await?;
    Ok(())
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
    /// The herdr binary.
    bin: PathBuf,
    /// Its config, state and home.
    dir: tempfile::TempDir,
    /// Its session name.
    session: String,
    /// The server process, while running.
    child: Option<std::process::Child>,
}

impl RealHerdr {
    /// Starts the herdr binary `HERDR_BIN` names; `None` when it is unset (or empty).
    pub async fn from_env() -> anyhow::Result<Option<Self>> {
        match std::env::var_os("HERDR_BIN").filter(|bin| !bin.is_empty()) {
            Some(bin) => Ok(Some(Self::start(PathBuf::from(bin)).await?)),
            None => Ok(None),
        }
    }

    /// Starts the herdr binary `HERDR_BIN` names, for a test that runs only on a real herdr
    /// (built with the cfg `herdr_bin`); an error when it is unset.
    pub async fn required() -> anyhow::Result<Self> {
        Self::from_env().await?.ok_or_else(|| {
            anyhow::anyhow!("HERDR_BIN is not set: point it at a herdr binary to run this test")
        })
    }

    /// Starts the herdr binary `bin`.
    async fn start(bin: PathBuf) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("config");
        std::fs::create_dir_all(config.join("herdr"))?;
        std::fs::write(
            config.join("herdr/config.toml"),
            "onboarding = false\n[update]\nversion_check = false\nmanifest_check = false\n",
        )?;
        let mut herdr = Self {
            bin,
            dir,
            session: format!("fleet-{}", uuid::Uuid::now_v7().simple()),
            child: None,
        };
        herdr.launch().await?;
        Ok(herdr)
    }

    /// Its socket.
    pub fn socket(&self) -> PathBuf {
        self.dir
            .path()
            .join(format!("config/herdr/sessions/{}/herdr.sock", self.session))
    }

    /// What `HERDR_BIN` names.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Starts it (again), with the same session: as a user's herdr coming back.
    pub async fn launch(&mut self) -> anyhow::Result<()> {
        let child = std::process::Command::new(&self.bin)
            .args(["--session", &self.session, "server"])
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("XDG_STATE_HOME", self.dir.path().join("state"))
            .env("HOME", self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        answering(self.socket(), "herdr").await
    }

    /// Kills it abruptly, as a crashed herdr.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }
}

impl Drop for RealHerdr {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A herdr server for a test: the stand-in, or a real herdr.
pub enum TestHerdr {
    /// `fleet-herdr-standin`: herdr's protocol, panes in tmux (a stand-in, not herdr).
    StandIn(StandInProcess),
    /// The herdr binary `HERDR_BIN` names.
    Real(RealHerdr),
}

impl TestHerdr {
    /// The stand-in.
    pub async fn standin() -> anyhow::Result<Self> {
        Ok(Self::StandIn(StandInProcess::start().await?))
    }

    /// The real herdr `HERDR_BIN` names; `None` (after saying so on stderr, so the skip is
    /// visible) when it names none.
    pub async fn real() -> anyhow::Result<Option<Self>> {
        let herdr = RealHerdr::from_env().await?;
        if herdr.is_none() {
            eprintln!("skipped: HERDR_BIN does not point at a herdr binary");
        }
        Ok(herdr.map(Self::Real))
    }

    /// Its socket.
    pub fn socket(&self) -> PathBuf {
        match self {
            Self::StandIn(standin) => standin.socket(),
            Self::Real(herdr) => herdr.socket(),
        }
    }

    /// A client of it, for a test to speak herdr's protocol beside fleetd.
    pub fn driver(&self) -> Driver {
        Driver::new(self.socket())
    }

    /// Kills it abruptly, as a crashed herdr.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        match self {
            Self::StandIn(standin) => standin.kill9().await,
            Self::Real(herdr) => herdr.kill9().await,
        }
    }

    /// Starts it again on the same socket.
    pub async fn launch(&mut self) -> anyhow::Result<()> {
        match self {
            Self::StandIn(standin) => standin.launch().await,
            Self::Real(herdr) => herdr.launch().await,
        }
    }
}
