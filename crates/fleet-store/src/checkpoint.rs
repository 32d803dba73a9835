//! The write-ahead log copied back into the database off the writers' path. Left to itself,
//! SQLite does this in the commit that takes the log past 1,000 pages, and a checkpoint syncs the
//! log and then the database: 11–19 ms on this project's machines (`strace` of a `fleet-bench
//! steps` run), spent inside whichever call of the gateway's hot path made that commit, one
//! round trip in a few dozen. Here a commit past [`WAKE_PAGES`] only wakes a thread of the
//! store's own, whose connection runs a passive checkpoint, which never waits for readers or
//! writers and which writers below [`BOUND_PAGES`] never wait for.
//!
//! Under steady writes such a checkpoint may never copy the whole log (new pages land while it
//! syncs), and the log starts over only once it has: a commit that finds the log past
//! [`BOUND_PAGES`] waits for the thread's checkpoint, if one runs, and then checkpoints the log
//! itself, as SQLite would have, so the log stays bounded.

use std::os::raw::c_int;
use std::path::Path;
use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::Connection;
use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;

use crate::StoreResult;

/// The log's size, in pages, past which a commit wakes the checkpoint thread (SQLite's own
/// auto-checkpoint threshold).
const WAKE_PAGES: c_int = 1000;

/// The log's size, in pages, past which a commit checkpoints it itself: the thread fell behind.
const BOUND_PAGES: c_int = 4 * WAKE_PAGES;

/// What a commit that left the log at some size does about it.
#[derive(Debug, PartialEq, Eq)]
enum AfterCommit {
    /// Nothing: the log is small.
    Nothing,
    /// Wakes the checkpoint thread.
    Wake,
    /// Checkpoints the log itself (and wakes the thread).
    Checkpoint,
}

/// What a commit that left the log at `pages` pages does, with the thread woken past `wake`
/// and the commit checkpointing itself past `bound`.
fn after_commit(pages: c_int, wake: c_int, bound: c_int) -> AfterCommit {
    if pages >= bound {
        AfterCommit::Checkpoint
    } else if pages >= wake {
        AfterCommit::Wake
    } else {
        AfterCommit::Nothing
    }
}

/// Moves the checkpoints of `conn` (a connection to the database at `path`, in WAL mode) to a
/// thread of their own, which ends once `conn` is closed. A thread that cannot be started
/// leaves them to SQLite, in the commits, as before.
pub(crate) fn take_over(path: &Path, conn: &mut Connection) -> StoreResult<()> {
    take_over_past(path, conn, WAKE_PAGES, BOUND_PAGES)
}

/// [`take_over`], the thread woken past `wake` pages and a commit checkpointing past `bound`.
fn take_over_past(
    path: &Path,
    conn: &mut Connection,
    wake: c_int,
    bound: c_int,
) -> StoreResult<()> {
    let own = Connection::open(path)?;
    own.busy_timeout(crate::sqlite::BUSY_TIMEOUT)?;
    own.pragma_update(None, "synchronous", "NORMAL")?;
    let (knock, knocked) = sync_channel::<()>(1);
    // Held by whoever checkpoints: a commit at the bound waits for the thread's checkpoint.
    let turn = Arc::new(Mutex::new(()));
    let theirs = Arc::clone(&turn);
    let started = std::thread::Builder::new()
        .name("fleetd-checkpoint".into())
        .spawn(move || checkpoints(&own, &knocked, &theirs));
    if let Err(e) = started {
        tracing::warn!(error = %e, "cannot start the store's checkpoint thread: commits checkpoint the log themselves");
        return Ok(());
    }
    // The hook takes the place of SQLite's own auto-checkpoint on this connection.
    conn.wal_hook(Some(move |log: &mut Wal, pages: c_int| {
        let action = after_commit(pages, wake, bound);
        if action != AfterCommit::Nothing {
            // A knock already waiting is enough; a thread gone ends nothing here.
            let _ = knock.try_send(());
        }
        if action == AfterCommit::Checkpoint {
            let _turn = turn.lock().unwrap_or_else(PoisonError::into_inner);
            // An error here would fail the call whose commit already stands: the next commit
            // tries again.
            if let Err(e) = log.checkpoint_v2(CheckpointMode::PASSIVE) {
                tracing::debug!(error = %e, pages, "the log's own checkpoint did not run");
            }
        }
        Ok(())
    }))?;
    Ok(())
}

/// The checkpoint thread: a passive checkpoint per knock, each holding `turn`, until the
/// connection whose hook knocks is gone. A failure is warned of once until a checkpoint runs
/// again (every commit past the threshold knocks).
fn checkpoints(conn: &Connection, knocked: &Receiver<()>, turn: &Mutex<()>) {
    let mut failing = false;
    while knocked.recv().is_ok() {
        let _turn = turn.lock().unwrap_or_else(PoisonError::into_inner);
        let copied = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
        });
        match copied {
            Ok((logged, copied)) => {
                failing = false;
                tracing::debug!(
                    logged,
                    copied,
                    "the write-ahead log copied into the database"
                );
            }
            Err(e) if failing => {
                tracing::debug!(error = %e, "cannot copy the write-ahead log into the database");
            }
            Err(e) => {
                failing = true;
                tracing::warn!(error = %e, "cannot copy the write-ahead log into the database (warned once until it can)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_commit_wakes_the_thread_past_the_threshold_and_checkpoints_past_the_bound() {
        assert_eq!(after_commit(0, 10, 40), AfterCommit::Nothing);
        assert_eq!(after_commit(9, 10, 40), AfterCommit::Nothing);
        assert_eq!(after_commit(10, 10, 40), AfterCommit::Wake);
        assert_eq!(after_commit(39, 10, 40), AfterCommit::Wake);
        assert_eq!(after_commit(40, 10, 40), AfterCommit::Checkpoint);
        assert_eq!(
            after_commit(WAKE_PAGES, WAKE_PAGES, BOUND_PAGES),
            AfterCommit::Wake
        );
    }

    /// A database in WAL mode at `dir`, its checkpoints taken over past `wake` and `bound`.
    fn database(dir: &Path, wake: c_int, bound: c_int) -> Connection {
        let path = dir.join("db");
        let mut conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        conn.execute("CREATE TABLE t (body BLOB)", []).unwrap();
        take_over_past(&path, &mut conn, wake, bound).unwrap();
        conn
    }

    fn file_pages(path: &Path) -> u64 {
        std::fs::metadata(path).map_or(0, |m| m.len()) / 4096
    }

    #[test]
    fn pages_past_the_threshold_reach_the_database_once_the_writes_stop() {
        let dir = tempfile::tempdir().unwrap();
        let conn = database(dir.path(), 50, 100_000);
        // About 80 pages of new rows: past the threshold, far from the bound.
        for _ in 0..80 {
            conn.execute("INSERT INTO t VALUES (zeroblob(4000))", [])
                .unwrap();
        }
        // Only a checkpoint grows the database's own file.
        let deadline = Instant::now() + Duration::from_secs(10);
        while file_pages(&dir.path().join("db")) < 50 {
            assert!(
                Instant::now() < deadline,
                "no checkpoint copied the log into the database"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn steady_writes_keep_the_log_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let conn = database(dir.path(), 50, 200);
        let mut largest = 0;
        // 4,000 rows without a pause (about 12,000 pages of log, three a row): sixty times the
        // bound, and past SQLite's own threshold (1,000), where a log left to it would reach.
        for _ in 0..4000 {
            conn.execute("INSERT INTO t VALUES (zeroblob(4000))", [])
                .unwrap();
            largest = largest.max(file_pages(&dir.path().join("db-wal")));
        }
        assert!(largest < 500, "the log grew to {largest} pages");
    }
}
