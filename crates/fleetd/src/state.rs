//! The state dir: the SQLite database and the leads' token files, private to the user.
//!
//! Layout: `fleet.db` (+ WAL files), `leads/<name>.token` (0600, the bearer token in plain text,
//! like an SSH key: the daemon itself keeps only its hash).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The state dir of one gateway.
#[derive(Clone, Debug)]
pub struct StateDir {
    /// Its root.
    root: PathBuf,
}

impl StateDir {
    /// Picks the state dir: `--state-dir`, else `gateway.state_dir`, else
    /// `$XDG_STATE_HOME/fleetd`, else `~/.local/state/fleetd`.
    pub fn resolve(flag: Option<&Path>, configured: Option<&Path>) -> Result<Self, String> {
        if let Some(dir) = flag.or(configured) {
            return Ok(Self {
                root: expand_home(dir)?,
            });
        }
        if let Some(xdg) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
            return Ok(Self {
                root: PathBuf::from(xdg).join("fleetd"),
            });
        }
        let home = std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .ok_or("neither --state-dir, gateway.state_dir, XDG_STATE_HOME nor HOME is set")?;
        Ok(Self {
            root: PathBuf::from(home).join(".local/state/fleetd"),
        })
    }

    /// Creates the dir (and `leads/`) readable by the user only.
    pub fn prepare(&self) -> std::io::Result<()> {
        for dir in [
            self.root.clone(),
            self.root.join("leads"),
            self.root.join("operators"),
        ] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }

    /// The same dir by its resolved path (links followed): what a sandbox template names and
    /// what a worker's directory is compared with. The dir must exist ([`StateDir::prepare`]).
    pub fn resolved(self) -> std::io::Result<Self> {
        Ok(Self {
            root: fs::canonicalize(&self.root)?,
        })
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.root.join("fleet.db")
    }

    /// Where a serving gateway writes the base URL it answers at on this host, for the
    /// operator commands (`fleetd ls`) to find it.
    pub fn serving_path(&self) -> PathBuf {
        self.root.join("serving")
    }

    /// The token file of lead `name`.
    pub fn lead_token_path(&self, name: &str) -> PathBuf {
        self.root.join("leads").join(format!("{name}.token"))
    }

    /// The token file of operator `name` (`[operators.NAME]`).
    pub fn operator_token_path(&self, name: &str) -> PathBuf {
        self.root.join("operators").join(format!("{name}.token"))
    }

    /// A tmux socket name unique to this state dir, so two gateways never share a server.
    pub fn tmux_socket_name(&self) -> String {
        let root = fs::canonicalize(&self.root).unwrap_or_else(|_| self.root.clone());
        let digest = Sha256::digest(root.as_os_str().as_encoded_bytes());
        format!("fleetd-{}", hex::encode(&digest[..6]))
    }
}

/// `path` with a leading `~` replaced by the user's home.
pub fn expand_home(path: &Path) -> Result<PathBuf, String> {
    match path.strip_prefix("~") {
        Ok(rest) => {
            let home = std::env::var_os("HOME")
                .ok_or_else(|| format!("{} starts with ~ but HOME is not set", path.display()))?;
            Ok(PathBuf::from(home).join(rest))
        }
        Err(_) => Ok(path.to_path_buf()),
    }
}

/// The text of `path`, none if there is no such file.
pub fn read_if_there(path: &Path) -> std::io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `contents` to `path` readable by the user only, replacing it atomically.
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_and_home_expands() {
        let dir = StateDir::resolve(Some(Path::new("/x")), Some(Path::new("/y"))).unwrap();
        assert_eq!(dir.root(), Path::new("/x"));
        let dir = StateDir::resolve(None, Some(Path::new("~/s"))).unwrap();
        assert!(dir.root().ends_with("s") && !dir.root().starts_with("~"));
    }

    #[test]
    fn private_files_and_dirs_are_user_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::resolve(Some(&tmp.path().join("state")), None).unwrap();
        dir.prepare().unwrap();
        let mode = fs::metadata(dir.root()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let token = dir.lead_token_path("alice");
        write_private(&token, "secret").unwrap();
        let mode = fs::metadata(&token).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(fs::read_to_string(&token).unwrap(), "secret");
    }

    #[test]
    fn socket_names_differ_per_state_dir() {
        let a = StateDir::resolve(Some(Path::new("/tmp/a")), None).unwrap();
        let b = StateDir::resolve(Some(Path::new("/tmp/b")), None).unwrap();
        assert_ne!(a.tmux_socket_name(), b.tmux_socket_name());
        assert!(a.tmux_socket_name().starts_with("fleetd-"));
    }
}
