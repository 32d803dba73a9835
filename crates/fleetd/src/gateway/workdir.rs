//! Where a worker works: the adapter around [`fleet_core::workdir`]. It resolves a requested
//! directory on this host (symlinks and all) and asks the core rule whether a worker may work
//! there.

use std::path::{Path, PathBuf};

use fleet_core::FleetError;
use fleet_core::workdir::{check_place, check_text};

use crate::state::expand_home;

/// fleetd's state dir and the configured roots, resolved once at start.
#[derive(Clone, Debug)]
pub struct Workdirs {
    /// The state dir, resolved.
    state_dir: PathBuf,
    /// `gateway.workdir_roots`, resolved; empty: no roots.
    roots: Vec<PathBuf>,
}

impl Workdirs {
    /// Resolves the state dir and each root (which must exist: a root that does not is a
    /// config error, named).
    pub fn new(state_dir: &Path, roots: &[PathBuf]) -> Result<Self, String> {
        let resolve = |what: &str, path: &Path| {
            std::fs::canonicalize(path).map_err(|e| format!("{what} {}: {e}", path.display()))
        };
        let roots = roots
            .iter()
            .map(|root| resolve("gateway.workdir_roots entry", &expand_home(root)?))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            state_dir: resolve("the state dir", state_dir)?,
            roots,
        })
    }

    /// `gateway.workdir_roots`, resolved (empty: none).
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// The directory a worker may work in for the requested `dir`: plain text, an existing
    /// directory, resolved, and allowed by the core rule.
    pub fn resolve(&self, dir: &Path, host: &str) -> Result<PathBuf, FleetError> {
        let text = dir.to_str().ok_or_else(|| {
            FleetError::invalid(format!("cwd {} is not valid UTF-8", dir.display()))
        })?;
        check_text(text)?;
        let resolved = std::fs::canonicalize(dir).map_err(|e| {
            FleetError::invalid(format!("cwd '{text}' cannot be used on host '{host}': {e}"))
        })?;
        // A link may lead to a name no one would type: the path that is used is checked too.
        check_text(&resolved.to_string_lossy())?;
        if !resolved.is_dir() {
            return Err(FleetError::invalid(format!(
                "cwd '{text}' is not a directory on host '{host}'"
            )));
        }
        check_place(&resolved, &self.state_dir, &self.roots)?;
        Ok(resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::ErrorCode;

    #[test]
    fn links_are_followed_before_the_rule_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let work = dir.path().join("work");
        std::fs::create_dir_all(state.join("leads")).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        std::os::unix::fs::symlink(state.join("leads"), work.join("into-state")).unwrap();
        let workdirs = Workdirs::new(&state, &[]).unwrap();
        let err = workdirs.resolve(&work.join("into-state"), "h").unwrap_err();
        assert!(err.message.contains("state dir"), "{err}");
        assert_eq!(
            workdirs.resolve(&work, "h").unwrap(),
            std::fs::canonicalize(&work).unwrap()
        );
        let missing = workdirs.resolve(&work.join("nope"), "h").unwrap_err();
        assert_eq!(missing.code, ErrorCode::InvalidParams);
        assert!(missing.message.contains("nope"), "{missing}");
    }

    #[test]
    fn a_missing_root_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = Workdirs::new(dir.path(), &[dir.path().join("gone")]).unwrap_err();
        assert!(
            err.contains("workdir_roots") && err.contains("gone"),
            "{err}"
        );
    }
}
