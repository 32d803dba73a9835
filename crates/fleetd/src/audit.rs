//! The audit log's file: JSON lines appended to `<state_dir>/audit.jsonl`, rotated by size
//! (`federation.audit_max_bytes`) into `audit.jsonl.1` (the newest) … `audit.jsonl.<keep>`
//! (`federation.audit_keep_files`), the oldest going when a new one comes.
//!
//! What a line holds is its caller's business (ids, kinds, sizes, outcomes: never a message's
//! text nor a token); this module only appends whole lines and rotates. It must never lose a
//! line: each goes whole, in one write, into the live file, after a rotation when it would take
//! that file over the cap ([`fleet_core::bounds::rotate_before`] decides); if the rotation
//! fails, the line still goes into the file at hand, over the cap, and the log says so loudly.
//!
//! Callers never touch the file: they hand their line to an [`AuditWriter`], whose one thread
//! writes the lines in the order they were handed over, through a bounded queue (a disk that
//! stalls holds up no async thread; a queue that fills up loses the line loudly), the lines
//! waiting together in one write ([`crate::gather`]).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use fleet_core::bounds::rotate_before;
use fleet_core::clock::now_ms;
use fleet_core::envelope::Envelope;
use fleet_core::{Gid, Kind, MsgId, TraceId};
use serde::Serialize;

use crate::gather::{Batch, GATHERED_LINES, Job, write_gathered};

/// An append-only, size-rotated log of lines.
pub struct AuditLog {
    /// The live file's path; rotated files are this path with `.1` … `.<keep>` appended.
    path: PathBuf,
    /// The live file; none while it cannot be opened (tried again at the next line).
    file: Option<File>,
    /// How long the live file is, in bytes.
    len: u64,
    /// The size past which the live file is rotated.
    max_bytes: u64,
    /// How many rotated files are kept.
    keep: usize,
    /// The lines gathered for the next write, each with its newline.
    pending: Vec<u8>,
    /// How many lines `pending` holds.
    pending_lines: usize,
}

impl AuditLog {
    /// The log at `path` (appended to if it exists), rotated past `max_bytes` with `keep`
    /// rotated files kept.
    pub fn open(path: PathBuf, max_bytes: u64, keep: usize) -> Self {
        let mut log = Self {
            path,
            file: None,
            len: 0,
            max_bytes,
            keep,
            pending: Vec::new(),
            pending_lines: 0,
        };
        if let Err(e) = log.open_live() {
            tracing::error!(path = %log.path.display(), error = %e, "cannot open the audit log");
        }
        log
    }

    /// Opens the live file for appending and learns its length.
    fn open_live(&mut self) -> io::Result<()> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.len = file.metadata()?.len();
        self.file = Some(file);
        Ok(())
    }

    /// Appends `line` (without its newline) as one line, now.
    #[cfg(test)]
    pub fn append(&mut self, line: &str) {
        self.add(line.to_string());
        self.write();
    }

    /// Writes the lines gathered, in one write into the live file.
    fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let lines = std::mem::take(&mut self.pending_lines);
        match self.file.as_mut().map(|file| file.write_all(&self.pending)) {
            Some(Ok(())) => {
                let size = u64::try_from(self.pending.len()).unwrap_or(u64::MAX);
                self.len = self.len.saturating_add(size);
            }
            Some(Err(e)) => {
                tracing::error!(path = %self.path.display(), lines, error = %e, "AUDIT LINES LOST: cannot write the audit log");
            }
            None => {
                tracing::error!(path = %self.path.display(), lines, "AUDIT LINES LOST: the audit log is not open");
            }
        }
        self.pending.clear();
    }

    /// Shifts the rotated files up by one (the oldest goes), moves the live file to `.1` and
    /// opens a fresh one. Until the fresh one is open, lines go on into the file at hand.
    fn rotate(&mut self) -> io::Result<()> {
        remove_if_there(&rotated(&self.path, self.keep))?;
        for n in (1..self.keep).rev() {
            rename_if_there(&rotated(&self.path, n), &rotated(&self.path, n + 1))?;
        }
        std::fs::rename(&self.path, rotated(&self.path, 1))?;
        let kept = self.file.take();
        let len = self.len;
        if let Err(e) = self.open_live() {
            self.file = kept;
            self.len = len;
            return Err(e);
        }
        Ok(())
    }
}

impl Batch for AuditLog {
    type Item = String;

    /// Gathers `line` (without its newline) for the next write; when it would take the live
    /// file over the cap, what was gathered is written first and the file rotated.
    fn add(&mut self, line: String) {
        if self.file.is_none()
            && let Err(e) = self.open_live()
        {
            tracing::error!(path = %self.path.display(), error = %e, "AUDIT LINE LOST: cannot open the audit log");
            return;
        }
        let size = u64::try_from(line.len() + 1).unwrap_or(u64::MAX);
        let gathered = u64::try_from(self.pending.len()).unwrap_or(u64::MAX);
        if rotate_before(self.len.saturating_add(gathered), size, self.max_bytes) {
            self.write_pending();
            if let Err(e) = self.rotate() {
                tracing::error!(path = %self.path.display(), error = %e, "cannot rotate the audit log: it grows past its cap");
            }
        }
        self.pending.extend_from_slice(line.as_bytes());
        self.pending.push(b'\n');
        self.pending_lines += 1;
    }

    fn write(&mut self) {
        self.write_pending();
    }
}

/// How many lines may wait for the audit writer's thread before one is lost.
const AUDIT_QUEUE: usize = 8_192;

/// The queues of every audit writer of the process, for [`flush_all`] (weak: a writer dropped
/// is gone from here too).
static WRITERS: Mutex<Vec<Weak<SyncSender<Job<String>>>>> = Mutex::new(Vec::new());

/// How long a dropped writer waits for its thread to write what was queued.
const LAST_LINES_WITHIN: Duration = Duration::from_secs(2);

/// The audit log on a thread of its own, fed through a bounded queue.
pub struct AuditWriter {
    /// The live file's path, for what is said of a lost line.
    path: PathBuf,
    /// `None` only while it is dropped.
    lines: Option<Arc<SyncSender<Job<String>>>>,
    /// Closed by the writer's thread as it ends, every queued line written (in a mutex only
    /// to be shared between threads; only the drop reads it).
    finished: Mutex<mpsc::Receiver<()>>,
}

/// One broker hop's audit line, its keys in the order they are written.
#[derive(Serialize)]
struct Hop<'a> {
    from: Gid,
    kind: Kind,
    msg_id: MsgId,
    outcome: &'a str,
    size: usize,
    to: &'a str,
    trace_id: TraceId,
    ts_ms: i64,
}

impl AuditWriter {
    /// Starts the thread that writes `log`.
    pub fn start(mut log: AuditLog) -> io::Result<AuditWriter> {
        let (lines, queue) = mpsc::sync_channel(AUDIT_QUEUE);
        let (done, finished) = mpsc::channel::<()>();
        let path = log.path.clone();
        std::thread::Builder::new()
            .name("fleetd-audit".into())
            .spawn(move || {
                write_gathered(&mut log, &queue, GATHERED_LINES);
                drop(done);
            })?;
        let lines = Arc::new(lines);
        lock(&WRITERS).push(Arc::downgrade(&lines));
        Ok(AuditWriter {
            path,
            lines: Some(lines),
            finished: Mutex::new(finished),
        })
    }

    /// Hands over the line of one broker hop: the message under `envelope` (of `size` bytes)
    /// and its `outcome` — what moved, never its text.
    pub fn hop(&self, envelope: &Envelope, size: usize, outcome: &str) {
        let line = Hop {
            from: envelope.from,
            kind: envelope.kind,
            msg_id: envelope.msg_id,
            outcome,
            size,
            to: &envelope.to,
            trace_id: envelope.trace_id,
            ts_ms: now_ms(),
        };
        match serde_json::to_string(&line) {
            Ok(line) => self.append(line),
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "AUDIT LINE LOST: it could not be written out");
            }
        }
    }

    /// Hands over `line` (without its newline).
    pub fn append(&self, line: String) {
        let Some(lines) = &self.lines else { return };
        match lines.try_send(Job::Item(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::error!(path = %self.path.display(), queued = AUDIT_QUEUE, "AUDIT LINE LOST: the audit log's writer is that far behind");
            }
            Err(TrySendError::Disconnected(_)) => {
                tracing::error!(path = %self.path.display(), "AUDIT LINE LOST: the audit log's writer is gone");
            }
        }
    }

    /// Waits until every line handed over before is written.
    #[cfg(test)]
    pub fn written(&self) {
        if let Some(lines) = &self.lines {
            flush(lines, Duration::from_secs(60));
        }
    }
}

/// Waits (at most `within`) until every line queued on `lines` before now is written; whether
/// they were.
fn flush(lines: &SyncSender<Job<String>>, within: Duration) -> bool {
    let (flushed, wait) = mpsc::sync_channel(1);
    lines.send(Job::Flush(flushed)).is_ok() && wait.recv_timeout(within).is_ok()
}

/// Waits (at most `within` in all) until every audit line of the process handed over before
/// now is written: for an exit that does not wait for the writers to be dropped.
pub fn flush_all(within: Duration) {
    let deadline = std::time::Instant::now() + within;
    let writers: Vec<Arc<SyncSender<Job<String>>>> =
        lock(&WRITERS).iter().filter_map(Weak::upgrade).collect();
    for lines in writers {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if !flush(&lines, left) {
            tracing::error!(
                "audit lines may be lost: the audit log's writer did not catch up before the exit"
            );
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Drop for AuditWriter {
    fn drop(&mut self) {
        // The queue closes; the thread writes what is in it and ends (a disk that stalls holds
        // the drop up no longer than LAST_LINES_WITHIN).
        self.lines = None;
        lock(&WRITERS).retain(|w| w.strong_count() > 0);
        let finished = self
            .finished
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(LAST_LINES_WITHIN) {
            tracing::error!(path = %self.path.display(), "AUDIT LINES MAY BE LOST: the audit log's writer did not finish in time");
        }
    }
}

/// The path of the `n`th rotated file of `path`.
fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn remove_if_there(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn rename_if_there(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::rename(from, to) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 10-byte line (with its newline).
    fn line(n: usize) -> String {
        format!("{{\"n\":{n:03}}}")
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    fn lines(ns: &[usize]) -> String {
        ns.iter().map(|n| line(*n) + "\n").collect()
    }

    #[test]
    fn rotation_keeps_every_line_whole_and_in_order_and_drops_only_the_oldest_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (one, two, three) = (rotated(&path, 1), rotated(&path, 2), rotated(&path, 3));
        let mut log = AuditLog::open(path.clone(), 20, 2);
        // Two lines take the file exactly to its cap: kept as it is.
        log.append(&line(0));
        log.append(&line(1));
        assert_eq!(read(&path), lines(&[0, 1]));
        assert!(!one.exists());
        // One more would take it over: rotated first, and the line starts the fresh file.
        log.append(&line(2));
        assert_eq!((read(&one), read(&path)), (lines(&[0, 1]), lines(&[2])));
        for n in 3..8 {
            log.append(&line(n));
        }
        // Two rotated files kept; the oldest (lines 0 and 1) went, no other line did.
        assert_eq!(read(&two), lines(&[2, 3]));
        assert_eq!(read(&one), lines(&[4, 5]));
        assert_eq!(read(&path), lines(&[6, 7]));
        assert!(!three.exists());
        // A line longer than the cap is never split or dropped: it gets a file of its own.
        let long = "x".repeat(50);
        log.append(&long);
        log.append(&line(8));
        assert_eq!(read(&one), format!("{long}\n"));
        assert_eq!(read(&path), lines(&[8]));
        // Opened again, the log knows how full its live file is.
        drop(log);
        let mut log = AuditLog::open(path.clone(), 20, 2);
        log.append(&line(9));
        assert_eq!(read(&path), lines(&[8, 9]));
        log.append(&line(10));
        assert_eq!((read(&one), read(&path)), (lines(&[8, 9]), lines(&[10])));
    }

    #[test]
    fn the_writer_writes_every_line_handed_over_in_order_and_its_last_ones_as_it_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let writer = AuditWriter::start(AuditLog::open(path.clone(), 1 << 20, 1)).unwrap();
        for n in 0..100 {
            writer.append(line(n));
        }
        writer.written();
        assert_eq!(read(&path), lines(&(0..100).collect::<Vec<_>>()));
        // An exit that does not wait for the drop flushes every writer of the process.
        writer.append(line(100));
        flush_all(Duration::from_secs(60));
        assert_eq!(read(&path), lines(&(0..101).collect::<Vec<_>>()));
        writer.append(line(101));
        drop(writer);
        assert_eq!(read(&path), lines(&(0..102).collect::<Vec<_>>()));
    }

    #[test]
    fn a_hops_line_names_what_moved_in_a_json_object_of_its_own_and_never_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let writer = AuditWriter::start(AuditLog::open(path.clone(), 1 << 20, 1)).unwrap();
        let envelope = Envelope {
            version: fleet_core::envelope::VERSION,
            kind: Kind::Ask,
            msg_id: MsgId::mint(),
            trace_id: TraceId::mint(),
            from: Gid::mint(),
            to: "b\"ob\n".to_string(),
            turn_id: Some("turn secret".to_string()),
            spawn_id: None,
            in_reply_to: Some(MsgId::mint()),
            from_name: Some("alice secret".to_string()),
            from_host: Some("hosta".to_string()),
            ts_ms: 1,
            expires_at_ms: 2,
        };
        let before = now_ms();
        writer.hop(&envelope, 42, "published");
        writer.hop(&envelope, 7, "held");
        writer.written();
        let text = read(&path);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        let ts = lines[0]["ts_ms"].as_i64().unwrap();
        assert!(ts >= before && ts <= now_ms(), "{ts}");
        let want = serde_json::json!({
            "ts_ms": ts,
            "trace_id": envelope.trace_id,
            "msg_id": envelope.msg_id,
            "kind": "ASK",
            "from": envelope.from,
            "to": "b\"ob\n",
            "size": 42,
            "outcome": "published",
        });
        assert_eq!(lines[0], want);
        // Byte for byte as before: its keys in the order a JSON map writes them.
        assert_eq!(text.lines().next(), Some(want.to_string().as_str()));
        assert_eq!(lines[1]["outcome"], "held");
        assert_eq!(lines[1]["size"], 7);
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn lines_gathered_for_one_write_still_rotate_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut log = AuditLog::open(path.clone(), 20, 2);
        log.append(&line(0));
        for n in 1..6 {
            log.add(line(n));
        }
        // Nothing of a gathering is in the file before its write, but a rotation's.
        assert_eq!(read(&rotated(&path, 1)), lines(&[2, 3]));
        assert_eq!(read(&rotated(&path, 2)), lines(&[0, 1]));
        assert_eq!(read(&path), "");
        log.write();
        assert_eq!(read(&path), lines(&[4, 5]));
        log.add(line(6));
        log.write();
        assert_eq!(read(&rotated(&path, 1)), lines(&[4, 5]));
        assert_eq!(read(&path), lines(&[6]));
    }

    #[test]
    fn a_rotation_that_fails_still_writes_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut log = AuditLog::open(path.clone(), 10, 1);
        log.append(&line(0));
        // A directory where the rotated file goes: the rename fails.
        std::fs::create_dir(rotated(&path, 1)).unwrap();
        std::fs::write(rotated(&path, 1).join("x"), "").unwrap();
        log.append(&line(1));
        assert_eq!(read(&path), lines(&[0, 1]));
    }
}
