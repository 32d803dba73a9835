//! Claude Code's settings file in the user's home (`~/.claude.json`): marking a worker's working
//! directory trusted without losing anyone's edit. Every running Claude Code rewrites that file
//! (at start and as it goes), and parallel spawns edit it at once, so an edit takes Claude
//! Code's own lock on it, reads it afresh, adds the trust, writes a new file beside it under a
//! name of its own, flushes it to disk, renames it over the old one, and lets go.
//!
//! The lock is Claude Code's (proper-lockfile's): a *directory* `<file>.lock`, made by `mkdir`
//! (only one maker wins) and removed to let go; one older than Claude Code's stale limit was
//! left by a holder that died, and is broken, as Claude Code breaks it. An `flock` would not
//! keep Claude Code out, and a lock *file* of that name would break Claude Code's own locking.
//!
//! An edit never writes through a fixed temporary name, never leaves the file half-written,
//! never changes its permissions, and holds the lock for one read-modify-write only.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

/// How old Claude Code takes its lock to be before it breaks it (its default; a live holder
/// touches the lock every 5 s, and sets its time a little ahead when it takes it).
const STALE_LOCK: Duration = Duration::from_secs(10);
/// How long an edit waits for the lock: longer than a lock left by a dead holder stays fresh.
const LOCK_WAIT: Duration = Duration::from_secs(15);
/// The first pause between attempts at the lock (Claude Code holds it for a write, a few ms).
const LOCK_RETRY_FIRST: Duration = Duration::from_millis(2);
/// The longest pause between attempts at the lock.
const LOCK_RETRY_MAX: Duration = Duration::from_millis(50);
/// The permissions of a settings file fleetd creates: the user's only (it holds logins).
const NEW_FILE_MODE: u32 = 0o600;
/// The settings key that records a directory as trusted.
const TRUSTED: &str = "hasTrustDialogAccepted";

/// Marks each of `keys` (working directories, as Claude Code keys its projects) trusted in
/// the settings file `file`, keeping everything else in it.
pub(super) fn trust_directory(file: &Path, keys: &[String]) -> io::Result<()> {
    let lock = SettingsLock::take(file)?;
    let text = match fs::read_to_string(file) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let edited = with_trust(text.as_deref(), keys).map_err(|why| {
        io::Error::other(format!(
            "{} {why}: cannot mark {} trusted for Claude Code",
            file.display(),
            keys.join(", ")
        ))
    })?;
    match edited {
        Some(edited) => replace(file, edited.as_bytes(), || lock.confirm()),
        None => Ok(()),
    }
}

/// The settings `text` (`None`: no file yet) with every one of `keys` trusted; `None` when
/// they all are already, so there is nothing to write.
fn with_trust(text: Option<&str>, keys: &[String]) -> Result<Option<String>, String> {
    let mut settings: Value = match text {
        Some(text) => serde_json::from_str(text).map_err(|e| format!("is not JSON ({e})"))?,
        None => json!({}),
    };
    let projects = settings
        .as_object_mut()
        .ok_or("is not a JSON object")?
        .entry("projects")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("has a 'projects' that is not an object")?;
    let mut changed = false;
    for key in keys {
        let project = projects
            .entry(key.clone())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| format!("has a project '{key}' that is not an object"))?;
        if project.get(TRUSTED) != Some(&Value::Bool(true)) {
            project.insert(TRUSTED.into(), Value::Bool(true));
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    serde_json::to_string_pretty(&settings)
        .map(Some)
        .map_err(|e| format!("cannot be written again ({e})"))
}

/// Whether a lock last touched at `touched` is stale at `now`: older than Claude Code's limit
/// (a time ahead of `now`, as Claude Code sets it, is fresh).
fn is_stale(touched: SystemTime, now: SystemTime) -> bool {
    now.duration_since(touched)
        .is_ok_and(|age| age > STALE_LOCK)
}

/// Claude Code's lock on a settings file, held while this lives.
struct SettingsLock {
    /// The lock directory, `<file>.lock`.
    dir: PathBuf,
    /// The directory's inode and time when it was made: a lock directory of the same name with
    /// another is someone else's (ours was broken as stale and taken; an inode number may be
    /// reused at once, the time of making is not).
    made: (u64, SystemTime),
}

impl SettingsLock {
    /// Takes the lock on `file`, waiting up to [`LOCK_WAIT`] for its holder to let go.
    fn take(file: &Path) -> io::Result<Self> {
        let mut name = file.as_os_str().to_owned();
        name.push(".lock");
        let dir = PathBuf::from(name);
        let deadline = Instant::now() + LOCK_WAIT;
        let mut pause = LOCK_RETRY_FIRST;
        loop {
            match fs::create_dir(&dir) {
                Ok(()) => {
                    let made = identity(&fs::metadata(&dir)?)?;
                    return Ok(Self { dir, made });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            match fs::metadata(&dir).and_then(|m| m.modified()) {
                // Let go meanwhile: try again at once.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
                Ok(touched) if is_stale(touched, SystemTime::now()) => {
                    tracing::warn!(lock = %dir.display(), "breaking a stale lock on Claude Code's settings");
                    match fs::remove_dir(&dir) {
                        Ok(()) => continue,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e),
                    }
                }
                Ok(_) => {}
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} stayed locked for {} s (Claude Code holds it while it saves its settings)",
                        dir.display(),
                        LOCK_WAIT.as_secs()
                    ),
                ));
            }
            // mkdir is the lock: there is nothing to wait on but time.
            std::thread::sleep(pause);
            pause = (pause * 2).min(LOCK_RETRY_MAX);
        }
    }
}

/// What tells one lock directory from another made under the same name.
fn identity(meta: &fs::Metadata) -> io::Result<(u64, SystemTime)> {
    Ok((meta.ino(), meta.modified()?))
}

impl SettingsLock {
    /// Whether the lock is still this one's and not old enough for another writer to break
    /// it: checked right before the file is replaced, so a hold that outlived the stale limit
    /// never overwrites what the writer who broke it wrote.
    fn confirm(&self) -> io::Result<()> {
        let meta = fs::metadata(&self.dir)?;
        if identity(&meta)? != self.made || is_stale(meta.modified()?, SystemTime::now()) {
            return Err(io::Error::other(format!(
                "the lock {} was held too long and may be another writer's now: the settings were not written",
                self.dir.display()
            )));
        }
        Ok(())
    }
}

impl Drop for SettingsLock {
    fn drop(&mut self) {
        // Only our own lock goes: one of that name with another inode is someone else's.
        match fs::metadata(&self.dir).and_then(|meta| identity(&meta)) {
            Ok(made) if made == self.made => {
                if let Err(e) = fs::remove_dir(&self.dir) {
                    tracing::warn!(lock = %self.dir.display(), error = %e, "cannot let go of the lock on Claude Code's settings");
                }
            }
            _ => {
                tracing::warn!(lock = %self.dir.display(), "the lock on Claude Code's settings was broken while held: left to its new holder")
            }
        }
    }
}

/// Replaces `file` with `bytes` at once: a new file beside it under a name of its own, with the
/// permissions of the file it replaces, flushed to disk and renamed over it; then the directory
/// is flushed. `still_ours` is asked right before the rename (is the lock still held?); when it
/// says no, nothing is replaced. A symlink is followed: the file it points at is replaced, the
/// link kept.
fn replace(file: &Path, bytes: &[u8], still_ours: impl Fn() -> io::Result<()>) -> io::Result<()> {
    let target = match fs::canonicalize(file) {
        Ok(real) => real,
        Err(e) if e.kind() == io::ErrorKind::NotFound => file.to_path_buf(),
        Err(e) => return Err(e),
    };
    let mode = match fs::metadata(&target) {
        Ok(meta) => meta.permissions().mode() & 0o7777,
        Err(e) if e.kind() == io::ErrorKind::NotFound => NEW_FILE_MODE,
        Err(e) => return Err(e),
    };
    let dir = target
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = target
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut temporary = tempfile::Builder::new()
        .prefix(&format!("{name}.fleetd-"))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    temporary
        .as_file()
        .set_permissions(fs::Permissions::from_mode(mode))?;
    temporary.write_all(bytes)?;
    temporary.as_file().sync_all()?;
    still_ours()?;
    temporary.persist(&target).map_err(|e| e.error)?;
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_broken_and_taken_by_another_is_neither_written_under_nor_removed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(".claude.json");
        fs::write(&file, "{}").unwrap();
        let lock = SettingsLock::take(&file).unwrap();
        // Another writer breaks it and takes it: a new directory under the same name.
        let theirs = dir.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        fs::remove_dir(&lock.dir).unwrap();
        fs::rename(&theirs, &lock.dir).unwrap();
        let err = replace(&file, b"{\"x\": 1}", || lock.confirm()).unwrap_err();
        assert!(err.to_string().contains("not written"), "{err}");
        assert_eq!(fs::read_to_string(&file).unwrap(), "{}");
        let held = lock.dir.clone();
        drop(lock);
        assert!(held.is_dir(), "another writer's lock was removed");
    }

    fn keys(list: &[&str]) -> Vec<String> {
        list.iter().map(|k| k.to_string()).collect()
    }

    fn settings(file: &Path) -> Value {
        serde_json::from_str(&fs::read_to_string(file).unwrap()).unwrap()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    /// What is in `dir` besides `keep`.
    fn strays(dir: &Path, keep: &[&str]) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| !keep.contains(&name.as_str()))
            .collect()
    }

    #[test]
    fn trust_is_added_and_everything_else_kept() {
        let text = r#"{"oauthAccount": {"email": "me@example.com"}, "projects": {"/elsewhere": {"x": 1}, "/done": {"hasTrustDialogAccepted": true}}}"#;
        let edited = with_trust(Some(text), &keys(&["/work/a"]))
            .unwrap()
            .unwrap();
        let edited: Value = serde_json::from_str(&edited).unwrap();
        assert_eq!(edited["oauthAccount"]["email"], "me@example.com");
        assert_eq!(edited["projects"]["/elsewhere"]["x"], 1);
        assert_eq!(edited["projects"]["/work/a"][TRUSTED], true);
        // Already trusted: nothing to write.
        assert_eq!(with_trust(Some(text), &keys(&["/done"])), Ok(None));
        // No file yet: one holding the trust only.
        let fresh: Value =
            serde_json::from_str(&with_trust(None, &keys(&["/w"])).unwrap().unwrap()).unwrap();
        assert_eq!(fresh, json!({"projects": {"/w": {TRUSTED: true}}}));
    }

    #[test]
    fn a_file_fleetd_cannot_read_as_settings_is_named_and_left_alone() {
        for (text, why) in [
            ("not json", "is not JSON"),
            ("[1, 2]", "is not a JSON object"),
            (r#"{"projects": []}"#, "'projects' that is not an object"),
            (
                r#"{"projects": {"/w": 3}}"#,
                "project '/w' that is not an object",
            ),
        ] {
            let err = with_trust(Some(text), &keys(&["/w"])).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(".claude.json");
        fs::write(&file, "not json").unwrap();
        let err = trust_directory(&file, &keys(&["/w"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(".claude.json is not JSON") && err.contains("/w"),
            "{err}"
        );
        assert_eq!(fs::read_to_string(&file).unwrap(), "not json");
        assert_eq!(strays(dir.path(), &[".claude.json"]), Vec::<String>::new());
    }

    #[test]
    fn many_editors_at_once_lose_nothing() {
        let home = tempfile::tempdir().unwrap();
        let file = home.path().join(".claude.json");
        fs::write(
            &file,
            r#"{"oauthAccount": {"email": "me@example.com"}, "numStartups": 7, "projects": {"/elsewhere": {"x": 1}}}"#,
        )
        .unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).unwrap();
        let dirs: Vec<String> = (0..24).map(|i| format!("/work/project-{i}")).collect();
        let start = std::sync::Barrier::new(dirs.len());
        std::thread::scope(|scope| {
            for dir in &dirs {
                let (file, start) = (&file, &start);
                scope.spawn(move || {
                    start.wait();
                    trust_directory(file, std::slice::from_ref(dir)).unwrap();
                });
            }
        });
        let settings = settings(&file);
        for dir in &dirs {
            assert_eq!(
                settings["projects"][dir][TRUSTED], true,
                "{dir}: {settings}"
            );
        }
        assert_eq!(settings["oauthAccount"]["email"], "me@example.com");
        assert_eq!(settings["numStartups"], 7);
        assert_eq!(settings["projects"]["/elsewhere"]["x"], 1);
        assert_eq!(mode(&file), 0o640);
        // No temporary file and no lock is left behind.
        assert_eq!(strays(home.path(), &[".claude.json"]), Vec::<String>::new());
    }

    #[test]
    fn a_lock_held_elsewhere_is_waited_for_and_a_stale_one_broken() {
        let home = tempfile::tempdir().unwrap();
        let file = home.path().join(".claude.json");
        fs::write(&file, r#"{"numStartups": 1}"#).unwrap();
        let lock = home.path().join(".claude.json.lock");
        // Claude Code saving its settings holds the lock: the edit waits for it.
        fs::create_dir(&lock).unwrap();
        let editor = {
            let file = file.clone();
            std::thread::spawn(move || trust_directory(&file, &keys(&["/w1"])))
        };
        // Nothing to wait on for "has not written": watch it not happen for a while.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!editor.is_finished());
        assert_eq!(fs::read_to_string(&file).unwrap(), r#"{"numStartups": 1}"#);
        fs::remove_dir(&lock).unwrap();
        editor.join().unwrap().unwrap();
        assert_eq!(settings(&file)["projects"]["/w1"][TRUSTED], true);
        // A lock left by a holder that died, older than Claude Code's limit, is broken.
        fs::create_dir(&lock).unwrap();
        let old = SystemTime::now() - STALE_LOCK - Duration::from_secs(5);
        fs::File::open(&lock).unwrap().set_modified(old).unwrap();
        trust_directory(&file, &keys(&["/w2"])).unwrap();
        assert_eq!(settings(&file)["projects"]["/w2"][TRUSTED], true);
        assert!(!lock.exists());
    }

    #[test]
    fn staleness_follows_claude_codes_limit() {
        let now = SystemTime::now();
        assert!(!is_stale(now, now));
        assert!(!is_stale(now - STALE_LOCK, now));
        assert!(is_stale(now - STALE_LOCK - Duration::from_millis(1), now));
        // Claude Code sets its lock's time a little ahead when it takes it.
        assert!(!is_stale(now + Duration::from_millis(900), now));
    }

    #[test]
    fn a_new_file_is_the_users_only_and_a_linked_one_stays_linked() {
        let home = tempfile::tempdir().unwrap();
        let file = home.path().join(".claude.json");
        trust_directory(&file, &keys(&["/w"])).unwrap();
        assert_eq!(mode(&file), NEW_FILE_MODE);
        // Settings kept elsewhere (a dotfiles checkout) behind a symlink.
        let kept = home.path().join("dotfiles");
        fs::create_dir(&kept).unwrap();
        fs::rename(&file, kept.join("claude.json")).unwrap();
        std::os::unix::fs::symlink(kept.join("claude.json"), &file).unwrap();
        trust_directory(&file, &keys(&["/v"])).unwrap();
        assert!(fs::symlink_metadata(&file).unwrap().is_symlink());
        let settings = settings(&kept.join("claude.json"));
        assert_eq!(settings["projects"]["/w"][TRUSTED], true);
        assert_eq!(settings["projects"]["/v"][TRUSTED], true);
    }
}
