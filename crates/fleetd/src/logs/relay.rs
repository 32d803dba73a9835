//! The log's way out: lines go into a bounded queue that a thread of their own writes to
//! stderr, so logging never waits on stderr. A reader that stopped reading (`fleetd serve |
//! less` past a screen, a terminal on Ctrl-S, a stalled `tee` or journal) would otherwise block
//! the first thread that logs, then every thread that logs after it — the signal watcher
//! among them. When the queue is full a line is dropped and counted, as a line stderr refuses
//! is ([`super::write_failures`]).
//!
//! This module must never block a caller of the log, nor write anywhere but its sink.

use std::io::{self, Write};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

use crate::gather::{Batch, GATHERED_LINES, Job, write_gathered};

/// How many lines may wait for the writer: a burst of heavy debug logging, a few hundred KB at
/// most; past it the log is behind its reader by more than anyone will read.
pub const QUEUED_LINES: usize = 1_024;

/// A [`MakeWriter`] whose lines are queued for the writer thread (see the module doc).
#[derive(Clone)]
pub struct Relay {
    /// The writer thread's queue.
    queue: SyncSender<Job<Vec<u8>>>,
    /// Counts the lines lost (queue full, thread gone, sink refusing).
    failures: &'static AtomicU64,
}

/// The relay the process's log goes through, for [`flush`].
static RELAY: OnceLock<Relay> = OnceLock::new();

impl Relay {
    /// A relay whose lines a new thread writes into `sink`, at most `capacity` waiting; lines
    /// lost counted in `failures`.
    pub fn start<W: Write + Send + 'static>(
        sink: W,
        capacity: usize,
        failures: &'static AtomicU64,
    ) -> io::Result<Self> {
        let (queue, jobs) = sync_channel(capacity);
        std::thread::Builder::new()
            .name("fleetd-log".into())
            .spawn(move || {
                let mut lines = Lines {
                    sink,
                    batch: Vec::new(),
                    lines: 0,
                    failures,
                };
                write_gathered(&mut lines, &jobs, GATHERED_LINES);
            })?;
        Ok(Self { queue, failures })
    }

    /// Makes this the relay [`flush`] waits on.
    pub fn install(&self) {
        let _ = RELAY.set(self.clone());
    }

    fn send(&self, job: Job<Vec<u8>>) -> bool {
        match self.queue.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// Waits, at most `limit`, until every line queued before the call is written.
    fn flush(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let (done, written) = sync_channel(1);
        let mut job = Job::Flush(done);
        loop {
            match self.queue.try_send(job) {
                Ok(()) => {
                    let _ =
                        written.recv_timeout(deadline.saturating_duration_since(Instant::now()));
                    return;
                }
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    job = back;
                    std::thread::sleep(FLUSH_RETRY);
                }
                Err(_) => return,
            }
        }
    }
}

/// How often a flush looks again for room in a full queue.
const FLUSH_RETRY: Duration = Duration::from_millis(5);

/// The lines gathered for one write into `sink`; a write the sink refuses loses its lines,
/// counted.
struct Lines<W> {
    sink: W,
    /// The lines gathered, each with its newline.
    batch: Vec<u8>,
    /// How many lines `batch` holds.
    lines: u64,
    failures: &'static AtomicU64,
}

impl<W: Write> Batch for Lines<W> {
    type Item = Vec<u8>;

    fn add(&mut self, line: Vec<u8>) {
        self.batch.extend_from_slice(&line);
        self.lines += 1;
    }

    fn write(&mut self) {
        if !self.batch.is_empty() && self.sink.write_all(&self.batch).is_err() {
            self.failures.fetch_add(self.lines, Ordering::Relaxed);
        }
        self.batch.clear();
        self.lines = 0;
    }

    fn flush(&mut self) {
        let _ = self.sink.flush();
    }
}

/// Waits, at most `limit`, until every line logged before the call is written: the last
/// lines of a process that is about to exit.
pub fn flush(limit: Duration) {
    if let Some(relay) = RELAY.get() {
        relay.flush(limit);
    }
}

impl<'a> MakeWriter<'a> for Relay {
    type Writer = RelayLine<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        RelayLine {
            relay: self,
            line: Vec::new(),
        }
    }
}

/// One log line being written: gathered here, queued whole when dropped.
pub struct RelayLine<'a> {
    relay: &'a Relay,
    line: Vec<u8>,
}

impl Write for RelayLine<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for RelayLine<'_> {
    fn drop(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let line = std::mem::take(&mut self.line);
        if !self.relay.send(Job::Item(line)) {
            self.relay.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A sink for tests that takes nothing until it is let go (a reader that stopped reading).
#[cfg(test)]
struct Stuck {
    /// Held by the test while the sink must block.
    gate: std::sync::Arc<std::sync::Mutex<()>>,
    /// What was written once let go.
    got: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

#[cfg(test)]
impl Write for Stuck {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _open = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        self.got
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_sink_that_takes_nothing_never_blocks_the_log_and_overflow_is_counted() {
        static LOST: AtomicU64 = AtomicU64::new(0);
        let gate = Arc::new(Mutex::new(()));
        let got = Arc::new(Mutex::new(Vec::new()));
        let held = gate.lock().unwrap();
        let sink = Stuck {
            gate: Arc::clone(&gate),
            got: Arc::clone(&got),
        };
        let relay = Relay::start(sink, 4, &LOST).unwrap();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(relay.clone())
            .with_ansi(false)
            .finish();
        let started = Instant::now();
        tracing::subscriber::with_default(subscriber, || {
            for n in 0..100 {
                tracing::info!(n, "a line");
            }
        });
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "logging waited on a stuck sink"
        );
        // The writer holds what it gathered in its write, four more wait: the rest were lost
        // and counted.
        let lost = LOST.load(Ordering::Relaxed);
        assert!(lost > 0, "nothing was lost behind a stuck sink");
        drop(held);
        relay.flush(Duration::from_secs(5));
        let got = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        assert_eq!(got.lines().count(), 100 - lost as usize, "{got}");
        assert!(got.contains("a line n=0"), "{got}");
    }

    #[test]
    fn a_sink_that_refuses_loses_lines_counted() {
        static LOST: AtomicU64 = AtomicU64::new(0);
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let relay = Relay::start(Broken, 16, &LOST).unwrap();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(relay.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                tracing::warn!("lost");
            }
        });
        relay.flush(Duration::from_secs(5));
        assert_eq!(LOST.load(Ordering::Relaxed), 3);
    }

    /// A sink that records each write it is given.
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_logged_together_go_out_in_order_in_fewer_writes_and_a_flush_waits_for_them() {
        static LOST: AtomicU64 = AtomicU64::new(0);
        let writes = Arc::new(Mutex::new(Vec::new()));
        let relay = Relay::start(Writes(Arc::clone(&writes)), 1_024, &LOST).unwrap();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(relay.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for n in 0..600 {
                tracing::info!(n, "a line");
            }
        });
        relay.flush(Duration::from_secs(5));
        let writes = writes.lock().unwrap();
        let text: String = writes
            .iter()
            .map(|w| String::from_utf8(w.clone()).unwrap())
            .collect();
        let numbers: Vec<usize> = text
            .lines()
            .map(|l| l.rsplit_once("n=").unwrap().1.parse().unwrap())
            .collect();
        assert_eq!(numbers, (0..600).collect::<Vec<_>>());
        assert_eq!(LOST.load(Ordering::Relaxed), 0);
        // Every write holds whole lines, at most the gathered number of them.
        for write in writes.iter() {
            assert_eq!(write.last(), Some(&b'\n'));
            let lines = write.iter().filter(|b| **b == b'\n').count();
            assert!((1..=GATHERED_LINES).contains(&lines), "{lines}");
        }
        assert!(writes.len() < 600, "a write per line: {}", writes.len());
    }
}
