//! The bearer-token cache: every request resolves its token, and a token changes only when a
//! lead's is minted or rotated (by `fleetd token`, another process, as often as by fleetd) or a
//! worker's session begins or ends. So the hashes already resolved are kept in memory, and
//! every writer of the tokens table marks the change on a file beside the database (its
//! *mark*) once its transaction is committed. A lookup first reads the mark's stamp (one
//! `fstat` of a file kept open on it, far cheaper than a query, and than a `stat` that walks its
//! path): a stamp unlike the one the cache was filled under empties it, so a rotated token stops
//! working as soon as the rotation's command returns.
//! The cache also empties itself every [`TOKEN_CACHE_FOR`], so a change made without the mark
//! (a writer killed between its commit and the mark, an edit by hand) holds at most that long.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use fleet_core::Gid;

/// How long a filled cache is trusted without a changed mark.
pub const TOKEN_CACHE_FOR: Duration = Duration::from_secs(1);

/// Hashes kept at most; past it the cache starts again (a flood of unknown tokens is never
/// kept: only hashes that resolve are).
const MAX_CACHED: usize = 4096;

/// Past this size the mark is emptied rather than grown (see `mark_changed`).
const MARK_WRAP_BYTES: u64 = 4096;

/// What `stat` (or `fstat`) says of the mark: a writer appends a byte per change, so its size
/// and times differ after every change (the inode too, should the file be replaced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

/// The mark's path for the database at `db`: the database's name with `-tokens` appended, as
/// SQLite names its `-wal` and `-shm` beside it.
fn mark_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-tokens");
    PathBuf::from(name)
}

impl Stamp {
    /// What `meta`, the mark's, says.
    fn of(meta: &Metadata) -> Self {
        let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        Stamp {
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// The mark of one database, as its readers see it: read by `fstat` of a file kept open on it
/// once it exists, so a lookup walks no path. The file is found again by its path once it was
/// unlinked (replaced, or removed by hand), and in any case once it has been held open as long
/// as [`TOKEN_CACHE_FOR`] (a mark renamed away still has a name, and is then no longer the
/// mark); one that cannot be opened is read by its path's `stat`.
#[derive(Debug)]
pub struct Mark {
    path: PathBuf,
    /// The file held open on it, and when it was opened.
    open: Mutex<Option<(File, Instant)>>,
}

impl Mark {
    /// The mark of the database at `db`: the database's name with `-tokens` appended.
    pub fn of(db: &Path) -> Self {
        Self {
            path: mark_path(db),
            open: Mutex::new(None),
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Marks a change of the tokens table: a byte appended (see `mark_changed`).
    pub fn changed(&self) -> std::io::Result<()> {
        mark_changed(&self.path)
    }

    /// The mark's stamp now; `None` while no change was ever marked.
    pub fn stamp(&self) -> Option<Stamp> {
        self.stamp_at(Instant::now())
    }

    /// The mark's stamp, `now`.
    fn stamp_at(&self, now: Instant) -> Option<Stamp> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let held = open
            .as_ref()
            .filter(|(_, opened)| now.saturating_duration_since(*opened) <= TOKEN_CACHE_FOR)
            .and_then(|(file, _)| file.metadata().ok());
        if let Some(meta) = held.filter(|meta| meta.nlink() > 0) {
            return Some(Stamp::of(&meta));
        }
        *open = None;
        match File::open(&self.path) {
            Ok(file) => {
                let meta = file.metadata().ok()?;
                *open = Some((file, now));
                Some(Stamp::of(&meta))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(_) => std::fs::metadata(&self.path)
                .ok()
                .map(|meta| Stamp::of(&meta)),
        }
    }
}

/// Marks a change of the tokens table: one byte appended, or the file emptied once it has
/// grown to [`MARK_WRAP_BYTES`] (its times still change, and a size seen before comes back
/// only after thousands of changes).
fn mark_changed(mark: &Path) -> std::io::Result<()> {
    let wrap = std::fs::metadata(mark).is_ok_and(|m| m.len() >= MARK_WRAP_BYTES);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(!wrap)
        .write(true)
        .truncate(wrap)
        .open(mark)?;
    file.write_all(b".")
}

/// The resolved hashes, and the mark's stamp and the time they were resolved under.
#[derive(Debug)]
pub struct TokenCache {
    stamp: Option<Stamp>,
    filled: Instant,
    gids: HashMap<[u8; 32], Gid>,
    /// Counts the times the cache was emptied: a lookup started before one of them keeps
    /// nothing (this process changed the table while it asked).
    generation: u64,
}

impl TokenCache {
    /// An empty cache, as of `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            stamp: None,
            filled: now,
            gids: HashMap::new(),
            generation: 0,
        }
    }

    /// What a lookup about to ask the store hands back to [`TokenCache::put`].
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The gid `hash` resolved to, if the cache still holds it under the mark's `stamp` read
    /// `now`. A changed stamp, or a cache older than [`TOKEN_CACHE_FOR`], empties it first.
    pub fn get(&mut self, hash: &[u8; 32], stamp: Option<Stamp>, now: Instant) -> Option<Gid> {
        if stamp != self.stamp || now.saturating_duration_since(self.filled) > TOKEN_CACHE_FOR {
            self.clear();
            self.stamp = stamp;
            self.filled = now;
        }
        self.gids.get(hash).copied()
    }

    /// Keeps what the store said of `hash`, looked up after the mark read `stamp` and the
    /// cache was at `generation`: only if the cache is still filled under that stamp and has
    /// not been emptied since (a change made meanwhile may have made the answer stale), and
    /// only a hash that resolved.
    pub fn put(&mut self, hash: [u8; 32], gid: Option<Gid>, stamp: Option<Stamp>, generation: u64) {
        let Some(gid) = gid else { return };
        if stamp != self.stamp || generation != self.generation {
            return;
        }
        if self.gids.len() >= MAX_CACHED {
            self.gids.clear();
        }
        self.gids.insert(hash, gid);
    }

    /// Forgets everything (this process changed the tokens table), and what lookups under
    /// way would keep.
    pub fn clear(&mut self) {
        self.gids.clear();
        self.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid() -> Gid {
        Gid::mint()
    }

    #[test]
    fn a_hash_is_kept_under_the_stamp_it_was_looked_up_under() {
        let start = Instant::now();
        let mut cache = TokenCache::new(start);
        let (h, g) = ([1; 32], gid());
        assert_eq!(cache.get(&h, None, start), None);
        cache.put(h, Some(g), None, cache.generation());
        assert_eq!(cache.get(&h, None, start), Some(g));
        assert_eq!(cache.get(&[2; 32], None, start), None, "only what was put");
    }

    #[test]
    fn a_changed_stamp_empties_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let mark = Mark::of(&dir.path().join("fleet.db"));
        let start = Instant::now();
        let mut cache = TokenCache::new(start);
        let (h, g) = ([1; 32], gid());
        assert_eq!(mark.stamp(), None, "no mark before the first change");
        mark.changed().unwrap();
        let first = mark.stamp();
        assert!(first.is_some());
        cache.get(&h, first, start);
        cache.put(h, Some(g), first, cache.generation());
        assert_eq!(cache.get(&h, mark.stamp(), start), Some(g));
        mark.changed().unwrap();
        let second = mark.stamp();
        assert_ne!(second, first, "every change leaves another stamp");
        assert_eq!(cache.get(&h, second, start), None);
    }

    #[test]
    fn an_answer_looked_up_before_a_change_is_not_kept_after_it() {
        let start = Instant::now();
        let mut cache = TokenCache::new(start);
        let dir = tempfile::tempdir().unwrap();
        let mark = Mark::of(&dir.path().join("fleet.db"));
        let before = mark.stamp();
        cache.get(&[1; 32], before, start);
        let asked = cache.generation();
        // Another request sees the change first and refills the cache under the new stamp.
        mark.changed().unwrap();
        cache.get(&[3; 32], mark.stamp(), start);
        cache.put([1; 32], Some(gid()), before, asked);
        assert_eq!(cache.get(&[1; 32], mark.stamp(), start), None);
    }

    #[test]
    fn an_answer_looked_up_across_a_change_of_this_process_is_not_kept() {
        let start = Instant::now();
        let mut cache = TokenCache::new(start);
        cache.get(&[1; 32], None, start);
        let asked = cache.generation();
        // The store revoked the token meanwhile, its mark not (yet, or ever) written.
        cache.clear();
        cache.put([1; 32], Some(gid()), None, asked);
        assert_eq!(cache.get(&[1; 32], None, start), None);
    }

    #[test]
    fn a_cache_is_trusted_for_a_second_at_most() {
        let start = Instant::now();
        let mut cache = TokenCache::new(start);
        let (h, g) = ([1; 32], gid());
        cache.put(h, Some(g), None, cache.generation());
        let later = start + TOKEN_CACHE_FOR;
        assert_eq!(cache.get(&h, None, later), Some(g));
        let too_late = later + Duration::from_millis(1);
        assert_eq!(cache.get(&h, None, too_late), None);
    }

    #[test]
    fn unknown_hashes_are_never_kept_and_the_cache_is_bounded() {
        let start = Instant::now();
        let mut cache = TokenCache::new(start);
        cache.put([9; 32], None, None, cache.generation());
        assert!(cache.gids.is_empty());
        for i in 0..MAX_CACHED + 10 {
            let mut h = [0; 32];
            h[..8].copy_from_slice(&(i as u64).to_le_bytes());
            cache.put(h, Some(gid()), None, cache.generation());
        }
        assert!(cache.gids.len() <= MAX_CACHED);
    }

    #[test]
    fn the_mark_wraps_and_still_changes_its_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let mark = Mark::of(&dir.path().join("fleet.db"));
        let mut seen = Vec::new();
        for _ in 0..MARK_WRAP_BYTES + 3 {
            mark.changed().unwrap();
            let now = mark.stamp().unwrap();
            assert_ne!(seen.last(), Some(&now));
            seen.push(now);
        }
        assert!(std::fs::metadata(mark.path()).unwrap().len() <= MARK_WRAP_BYTES);
    }

    #[test]
    fn a_mark_held_open_sees_every_change_and_one_replaced_or_removed_is_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let mark = Mark::of(&dir.path().join("fleet.db"));
        mark.changed().unwrap();
        let first = mark.stamp().unwrap();
        assert_eq!(mark.stamp(), Some(first), "no change, the same stamp");
        assert!(
            mark.open.lock().unwrap().is_some(),
            "held open once it exists"
        );
        mark.changed().unwrap();
        let second = mark.stamp().unwrap();
        assert_ne!(second, first, "a change seen through the file held open");
        // Replaced by hand: another file renamed over it.
        let other = dir.path().join("other");
        std::fs::write(&other, b".").unwrap();
        std::fs::rename(&other, mark.path()).unwrap();
        let replaced = mark.stamp().unwrap();
        assert_ne!(replaced, second);
        mark.changed().unwrap();
        assert_ne!(
            mark.stamp().unwrap(),
            replaced,
            "the new file's changes are seen"
        );
        std::fs::remove_file(mark.path()).unwrap();
        assert_eq!(mark.stamp(), None, "removed: no mark");
        mark.changed().unwrap();
        assert!(mark.stamp().is_some(), "made again by the next change");
    }

    #[test]
    fn a_mark_renamed_away_is_left_for_the_one_at_its_path_within_the_caches_trust() {
        let dir = tempfile::tempdir().unwrap();
        let mark = Mark::of(&dir.path().join("fleet.db"));
        mark.changed().unwrap();
        let start = Instant::now();
        let held = mark.stamp_at(start).unwrap();
        std::fs::rename(mark.path(), dir.path().join("kept")).unwrap();
        mark.changed().unwrap();
        // (The rename changed the file's ctime: its stamp changed, but its inode is the same.)
        assert_eq!(
            mark.stamp_at(start).unwrap().ino,
            held.ino,
            "the file held open still has a name"
        );
        let later = start + TOKEN_CACHE_FOR + Duration::from_millis(1);
        let found = mark.stamp_at(later).unwrap();
        assert_ne!(
            found.ino, held.ino,
            "the mark at its path, once the cache is no longer trusted"
        );
        assert_eq!(found, Stamp::of(&std::fs::metadata(mark.path()).unwrap()));
    }

    #[test]
    fn the_mark_sits_beside_the_database() {
        assert_eq!(
            mark_path(Path::new("/s/fleet.db")),
            PathBuf::from("/s/fleet.db-tokens")
        );
    }
}
