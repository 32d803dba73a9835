//! Where a worker may work. A lead chooses a worker's working directory (`fleet_spawn{cwd}`),
//! and a lead may relay whatever it read: the path is hostile until checked. It must be plain
//! text ([`check_text`]); once the caller has resolved it (symlinks and all) it must not be
//! fleetd's state dir, inside it or above it (a worker there could read the lead tokens), and
//! when `gateway.workdir_roots` is set it must lie under one of them ([`check_place`]).

use std::path::{Path, PathBuf};

use crate::error::{ErrorCode, FleetError};
use crate::typed::first_control;

/// Refuses a path that is not plain text: a control character (a newline, a tab, an escape)
/// in a path reaches terminals and command lines.
pub fn check_text(path: &str) -> Result<(), FleetError> {
    if path.is_empty() {
        return Err(FleetError::invalid("cwd is empty: give a directory"));
    }
    if let Some(found) = first_control(path) {
        return Err(FleetError::invalid(format!(
            "cwd holds {found}: give a plain path"
        )));
    }
    Ok(())
}

/// Whether the resolved directory `dir` lies under one of the resolved `roots` (`forbidden`
/// if not), or there are no roots.
pub fn check_roots(dir: &Path, roots: &[PathBuf]) -> Result<(), FleetError> {
    if roots.is_empty() || roots.iter().any(|root| dir.starts_with(root)) {
        return Ok(());
    }
    let listed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(FleetError::new(
        ErrorCode::Forbidden,
        format!(
            "cwd {} is outside gateway.workdir_roots ({}): workers may work only under those",
            dir.display(),
            listed.join(", ")
        ),
    ))
}

/// Whether the resolved directory `dir` may be a worker's working directory, given fleetd's
/// resolved `state_dir` and the resolved `roots` (empty: anywhere else).
pub fn check_place(dir: &Path, state_dir: &Path, roots: &[PathBuf]) -> Result<(), FleetError> {
    check_roots(dir, roots)?;
    let shown = dir.display();
    if dir.starts_with(state_dir) {
        return Err(FleetError::invalid(format!(
            "cwd {shown} is fleetd's state dir or inside it (tokens, database, workers' files): pick a directory of your own"
        )));
    }
    if state_dir.starts_with(dir) {
        return Err(FleetError::invalid(format!(
            "cwd {shown} holds fleetd's state dir {} (tokens, database): a worker there could read them; pick a directory below it that does not",
            state_dir.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn the_state_dir_inside_and_above_are_refused() {
        let state = Path::new("/home/me/.local/state/fleetd");
        for dir in [
            "/home/me/.local/state/fleetd",
            "/home/me/.local/state/fleetd/leads",
            "/home/me",
            "/",
        ] {
            let err = check_place(Path::new(dir), state, &[]).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidParams, "{dir}");
            assert!(err.message.contains(dir), "{err}");
        }
        // A sibling whose name only starts the same is fine: components count, not bytes.
        assert!(check_place(Path::new("/home/me/.local/state/fleetd-other"), state, &[]).is_ok());
        assert!(check_place(Path::new("/home/me/src/app"), state, &[]).is_ok());
    }

    #[test]
    fn with_roots_only_what_lies_under_them() {
        let state = Path::new("/var/lib/fleetd");
        let roots = paths(&["/home/me/src", "/srv/work"]);
        assert!(check_place(Path::new("/home/me/src/app"), state, &roots).is_ok());
        assert!(check_place(Path::new("/srv/work"), state, &roots).is_ok());
        for dir in ["/", "/home/me", "/home/me/srcx", "/etc"] {
            let err = check_place(Path::new(dir), state, &roots).unwrap_err();
            assert_eq!(err.code, ErrorCode::Forbidden, "{dir}");
            assert!(err.message.contains("/home/me/src, /srv/work"), "{err}");
        }
    }

    #[test]
    fn paths_must_be_plain_text() {
        assert!(check_text("/home/me/C#Sharp/#(not a command)").is_ok());
        let err = check_text("/tmp/x\nrun-shell touch /tmp/owned").unwrap_err();
        assert!(
            err.message.contains("U+000A (newline), at character 6"),
            "{err}"
        );
        assert!(check_text("/tmp/\u{1b}[201~").is_err());
        assert!(check_text("").is_err());
    }
}
