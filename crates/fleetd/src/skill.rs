//! The Claude Code skill `fleetd init` installs for the lead: how to delegate through the
//! fleet tools (`skills/fleetd/SKILL.md` in Claude Code's directory). Claude Code loads it when
//! it starts and reads it when work fits. A skill of that name the user wrote or changed is
//! never overwritten nor removed.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The skill, as installed.
pub const SKILL: &str = include_str!("skill/SKILL.md");

/// Its name: its directory under `skills/`, and the `name` in its header.
pub const SKILL_NAME: &str = "fleetd";

/// What `fleetd init` does with the skill, given the file there now.
#[derive(Debug, PartialEq, Eq)]
pub enum Install {
    /// None there: write it.
    Write,
    /// This very skill is there already.
    Kept,
    /// Another file of that name (the user's, or one they changed): leave it.
    Theirs,
}

/// What `fleetd init` does with the skill file there now (`existing`, none if none).
pub fn install_action(existing: Option<&str>) -> Install {
    match existing {
        None => Install::Write,
        Some(text) if text == SKILL => Install::Kept,
        Some(_) => Install::Theirs,
    }
}

/// What `fleetd init --undo` does with the skill file there now: remove it only if it is
/// fleetd's, unchanged.
pub fn removes(existing: Option<&str>) -> bool {
    existing == Some(SKILL)
}

/// Where the skill goes in Claude Code's directory `claude_dir`.
pub fn skill_path(claude_dir: &Path) -> PathBuf {
    claude_dir.join("skills").join(SKILL_NAME).join("SKILL.md")
}

/// The file at `path`, if there is one.
fn existing(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Installs the skill in `claude_dir`; says what it did.
pub fn install(claude_dir: &Path) -> anyhow::Result<String> {
    let path = skill_path(claude_dir);
    match install_action(existing(&path)?.as_deref()) {
        Install::Kept => Ok(format!(
            "the skill '{SKILL_NAME}' (delegating through fleetd) is in {} already",
            path.display()
        )),
        Install::Theirs => Ok(format!(
            "{} is not the skill fleetd writes (yours, or changed): left as it is",
            path.display()
        )),
        Install::Write => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            std::fs::write(&path, SKILL)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(format!(
                "gave Claude Code the skill '{SKILL_NAME}' (how a lead delegates through fleetd): {}",
                path.display()
            ))
        }
    }
}

/// Removes the skill from `claude_dir` if it is fleetd's, unchanged; says what it did.
pub fn remove(claude_dir: &Path) -> anyhow::Result<String> {
    let path = skill_path(claude_dir);
    let found = existing(&path)?;
    if found.is_none() {
        return Ok(format!("Claude Code has no skill '{SKILL_NAME}'"));
    }
    if !removes(found.as_deref()) {
        return Ok(format!(
            "{} is not the skill fleetd wrote (yours, or changed): left as it is",
            path.display()
        ));
    }
    std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    // Its directory too, if nothing else is in it.
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(format!(
        "removed the skill '{SKILL_NAME}' from Claude Code ({})",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_skill_is_written_once_and_only_fleetds_own_is_taken_back() {
        assert_eq!(install_action(None), Install::Write);
        assert_eq!(install_action(Some(SKILL)), Install::Kept);
        assert_eq!(install_action(Some("my own notes")), Install::Theirs);
        assert!(removes(Some(SKILL)));
        assert!(!removes(Some(&format!("{SKILL}\nmy addition"))));
        assert!(!removes(None));
    }

    #[test]
    fn the_skill_names_itself_and_every_tool_a_lead_has() {
        let header = SKILL.split("---").nth(1).unwrap_or_default();
        assert!(
            header.contains(&format!("\nname: {SKILL_NAME}\n")),
            "{header}"
        );
        assert!(header.contains("\ndescription: "), "{header}");
        for tool in [
            "fleet_list",
            "fleet_spawn",
            "fleet_send",
            "fleet_poll",
            "fleet_stop",
            "fleet_broadcast",
            "fleet_consult",
        ] {
            assert!(SKILL.contains(&format!("`{tool}")), "{tool}");
        }
    }

    #[test]
    fn install_and_remove_leave_a_changed_skill_alone() {
        let dir = tempfile::tempdir().unwrap();
        let said = install(dir.path()).unwrap();
        assert!(said.starts_with("gave Claude Code the skill"), "{said}");
        let path = skill_path(dir.path());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), SKILL);
        assert!(install(dir.path()).unwrap().contains("already"));
        std::fs::write(&path, "changed").unwrap();
        assert!(install(dir.path()).unwrap().contains("left as it is"));
        assert!(remove(dir.path()).unwrap().contains("left as it is"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "changed");
        std::fs::write(&path, SKILL).unwrap();
        assert!(remove(dir.path()).unwrap().starts_with("removed"));
        assert!(!path.exists() && !path.parent().unwrap().exists());
    }
}
