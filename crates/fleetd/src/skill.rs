//! The Claude Code skill `fleetd init` installs for the lead: how to delegate through the
//! fleet tools (`skills/fleetd/SKILL.md` in Claude Code's directory). Claude Code loads it when
//! it starts and reads it when work fits. A skill of that name the user wrote or changed is
//! never overwritten nor removed.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::state::read_if_there;

/// The skill's text, without the mark `fleetd init` adds as it writes it (see [`written`]).
const SKILL_TEXT: &str = include_str!("skill/SKILL.md");

/// Its name: its directory under `skills/`, and the `name` in its header.
pub const SKILL_NAME: &str = "fleetd";

/// The mark's opening: the rest of its line is the SHA-256 of the file without that line.
const MARK: &str =
    "<!-- Written by `fleetd init`; `fleetd init --undo` removes it unless changed. sha256:";

/// The SHA-256 of `text`, in hex.
fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The skill as `fleetd init` writes it: its header, then the mark of what follows, then the
/// rest. The mark tells a file fleetd wrote and nobody changed, whatever fleetd's version.
pub fn written() -> String {
    let (header, body) = split(SKILL_TEXT);
    let unmarked = format!("{header}{body}");
    format!("{header}{MARK}{} -->\n{body}", digest(&unmarked))
}

/// `text` cut after its header (the `---` lines at its top), none if it has none.
fn split(text: &str) -> (&str, &str) {
    let end = text
        .strip_prefix("---\n")
        .and_then(|rest| rest.find("\n---\n"))
        .map_or(0, |at| at + "---\n".len() + "\n---\n".len());
    text.split_at(end)
}

/// Whether `text` is a skill file `fleetd init` wrote (of this version or another) that is as
/// it was written: its mark holds the digest of the rest.
pub fn is_fleetds(text: &str) -> bool {
    let (header, rest) = split(text);
    let Some(marked) = rest.strip_prefix(MARK) else {
        return false;
    };
    let Some((hash, body)) = marked.split_once(" -->\n") else {
        return false;
    };
    digest(&format!("{header}{body}")) == hash
}

/// What `fleetd init` does with the skill, given the file there now.
#[derive(Debug, PartialEq, Eq)]
pub enum Install {
    /// None there: write it.
    Write,
    /// This very skill is there already.
    Kept,
    /// One an earlier fleetd wrote, unchanged: write this one over it.
    Update,
    /// Another file of that name (the user's, or one they changed): leave it.
    Theirs,
}

/// What `fleetd init` does with the skill file there now (`existing`, none if none).
pub fn install_action(existing: Option<&str>) -> Install {
    match existing {
        None => Install::Write,
        Some(text) if text == written() => Install::Kept,
        Some(text) if is_fleetds(text) => Install::Update,
        Some(_) => Install::Theirs,
    }
}

/// What `fleetd init --undo` does with the skill file there now: remove it only if fleetd
/// wrote it and it is unchanged.
pub fn removes(existing: Option<&str>) -> bool {
    existing.is_some_and(is_fleetds)
}

/// Where the skill goes in Claude Code's directory `claude_dir`.
pub fn skill_path(claude_dir: &Path) -> PathBuf {
    claude_dir.join("skills").join(SKILL_NAME).join("SKILL.md")
}

/// The file at `path`, if there is one.
fn existing(path: &Path) -> anyhow::Result<Option<String>> {
    read_if_there(path).with_context(|| format!("cannot read {}", path.display()))
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
        action @ (Install::Write | Install::Update) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            std::fs::write(&path, written())
                .with_context(|| format!("cannot write {}", path.display()))?;
            let done = if action == Install::Update {
                "updated the skill"
            } else {
                "gave Claude Code the skill"
            };
            Ok(format!(
                "{done} '{SKILL_NAME}' (how a lead delegates through fleetd): {}",
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
    fn the_skill_is_written_once_and_only_fleetds_own_unchanged_is_taken_back() {
        let ours = written();
        assert_eq!(install_action(None), Install::Write);
        assert_eq!(install_action(Some(&ours)), Install::Kept);
        assert_eq!(install_action(Some("my own notes")), Install::Theirs);
        assert!(removes(Some(&ours)));
        assert!(!removes(Some(&format!("{ours}\nmy addition"))));
        assert!(!removes(Some(&ours.replace("fleet_poll", "fleet_pull"))));
        assert!(!removes(None));
        // One an earlier fleetd wrote: updated, and taken back, unless it was changed.
        let (header, body) = split(&ours);
        let (_, rest) = body.split_once(" -->\n").unwrap();
        let older_text = format!("{header}An older text.\n");
        let older = format!(
            "{header}{MARK}{} -->\nAn older text.\n",
            digest(&older_text)
        );
        assert!(rest.contains("fleet_spawn"));
        assert_eq!(install_action(Some(&older)), Install::Update);
        assert!(removes(Some(&older)));
        assert_eq!(
            install_action(Some(&older.replace("older", "edited"))),
            Install::Theirs
        );
        // The header stays first, as Claude Code reads it.
        assert!(ours.starts_with("---\nname: fleetd\n"), "{ours}");
    }

    #[test]
    fn the_skill_names_itself_and_every_tool_a_lead_has() {
        let header = SKILL_TEXT.split("---").nth(1).unwrap_or_default();
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
            assert!(SKILL_TEXT.contains(&format!("`{tool}")), "{tool}");
        }
    }

    #[test]
    fn install_and_remove_leave_a_changed_skill_alone() {
        let dir = tempfile::tempdir().unwrap();
        let said = install(dir.path()).unwrap();
        assert!(said.starts_with("gave Claude Code the skill"), "{said}");
        let path = skill_path(dir.path());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), written());
        assert!(install(dir.path()).unwrap().contains("already"));
        std::fs::write(&path, "changed").unwrap();
        assert!(install(dir.path()).unwrap().contains("left as it is"));
        assert!(remove(dir.path()).unwrap().contains("left as it is"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "changed");
        std::fs::write(&path, written()).unwrap();
        assert!(remove(dir.path()).unwrap().starts_with("removed"));
        assert!(!path.exists() && !path.parent().unwrap().exists());
    }
}
