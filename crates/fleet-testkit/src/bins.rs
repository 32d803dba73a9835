//! Finding the workspace's binaries from a test or a bench: they are built beside each other
//! in cargo's target dir.

use std::path::{Path, PathBuf};

/// The path of the workspace binary `name` (`fleetd`, `fleet-agent-sim`), looked up beside
/// the running executable (a bench binary) or one level up from it (a test in `deps/`).
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dirs: Vec<&Path> = Vec::new();
    if let Some(dir) = exe.parent() {
        dirs.push(dir);
        if let Some(up) = dir.parent() {
            dirs.push(up);
        }
    }
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "cannot find the binary '{name}' beside {}: build the workspace first (cargo build --workspace)",
                exe.display()
            )
        })
}
