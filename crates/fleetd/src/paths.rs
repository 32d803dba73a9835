//! Where every subcommand finds its config and its state dir: the two global options of the
//! command line, and how they resolve.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::config::Config;
use crate::state::StateDir;

/// `--config` and `--state-dir`, which every subcommand takes.
#[derive(Debug, Args)]
pub struct Paths {
    /// The config file (TOML); without it, `~/.config/fleetd/fleetd.toml` if present, else
    /// the embedded defaults.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The state dir (database, token files); overrides `gateway.state_dir`.
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl Paths {
    /// The config and state dir every subcommand starts from.
    pub fn resolve(&self) -> anyhow::Result<(Config, StateDir)> {
        let config = load_config(self.config.as_deref())?;
        let state = StateDir::resolve(
            self.state_dir.as_deref(),
            config.gateway.state_dir.as_deref(),
        )
        .map_err(anyhow::Error::msg)?;
        Ok((config, state))
    }
}

/// Where the user's default config file is looked for: `$XDG_CONFIG_HOME/fleetd/fleetd.toml`,
/// else `~/.config/fleetd/fleetd.toml`.
pub fn default_config_path() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|dir| dir.join("fleetd/fleetd.toml"))
}

/// The file the config comes from: the given one, else the user's default file if it exists;
/// `None`: the embedded defaults.
pub fn config_file(path: Option<&Path>) -> Option<PathBuf> {
    match path {
        Some(path) => Some(path.to_path_buf()),
        None => default_config_path().filter(|path| path.is_file()),
    }
}

/// Loads the config: the given file, else the user's default file if it exists, else the
/// embedded defaults.
pub fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    match config_file(path) {
        Some(path) => Ok(Config::load(&path)?),
        None => Ok(Config::embedded()),
    }
}
