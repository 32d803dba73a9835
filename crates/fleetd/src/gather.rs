//! A writer thread's loop that writes what waits together: the log's lines to stderr
//! ([`crate::logs`]), the audit lines to their file ([`crate::audit`]). A busy gateway hands
//! over a line per message; waking the writer for each (a futex wake on the handing thread, a
//! switch and a write on the writer's) costs more than the line, so the writer takes every
//! line waiting into one write and rests [`GATHER`] after it. A line handed over while the
//! writer waits idle goes out at once; one handed over while it rests waits that long at most,
//! unless more wait than one write takes (then it does not rest).

use std::sync::mpsc::{Receiver, SyncSender};
use std::time::Duration;

/// What a writer thread is handed.
pub enum Job<T> {
    /// One item (a line) to write.
    Item(T),
    /// Answered once every item handed over before it is written.
    Flush(SyncSender<()>),
}

/// The most lines a writer gathers into one write.
pub const GATHERED_LINES: usize = 256;

/// How long the writer rests after a write that did not take all it could.
const GATHER: Duration = Duration::from_millis(1);

/// What a writer thread gathers items into and writes.
pub trait Batch {
    /// What it is handed.
    type Item;
    /// Adds `item` to what the next write writes.
    fn add(&mut self, item: Self::Item);
    /// Writes what was added since the last write (perhaps nothing).
    fn write(&mut self);
    /// Makes what was written reach its sink (a flush was asked for).
    fn flush(&mut self) {}
}

/// Runs a writer thread until every sender of `jobs` is gone: the items waiting, at most `most`
/// of them, go into `batch` and out in one write; a flush is answered once what came before it
/// is written.
pub fn write_gathered<B: Batch>(batch: &mut B, jobs: &Receiver<Job<B::Item>>, most: usize) {
    while let Ok(first) = jobs.recv() {
        let mut next = Some(first);
        let mut items = 0;
        while let Some(job) = next.take() {
            match job {
                Job::Item(item) => {
                    batch.add(item);
                    items += 1;
                }
                Job::Flush(done) => {
                    batch.write();
                    batch.flush();
                    let _ = done.send(());
                }
            }
            if items < most {
                next = jobs.try_recv().ok();
            }
        }
        batch.write();
        if items < most {
            std::thread::sleep(GATHER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;
    use std::sync::{Arc, Mutex};

    /// Records each write as the items it held.
    struct Writes {
        adding: Vec<u32>,
        writes: Arc<Mutex<Vec<Vec<u32>>>>,
        flushes: Arc<Mutex<usize>>,
    }

    impl Batch for Writes {
        type Item = u32;
        fn add(&mut self, item: u32) {
            self.adding.push(item);
        }
        fn write(&mut self) {
            if !self.adding.is_empty() {
                self.writes
                    .lock()
                    .unwrap()
                    .push(std::mem::take(&mut self.adding));
            }
        }
        fn flush(&mut self) {
            *self.flushes.lock().unwrap() += 1;
        }
    }

    #[test]
    fn items_waiting_go_out_together_in_order_never_more_than_most_and_a_flush_follows_them() {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let flushes = Arc::new(Mutex::new(0));
        let (jobs, queue) = sync_channel(1_000);
        // Everything is queued before the writer starts: it finds it all waiting.
        for n in 0..250 {
            jobs.send(Job::Item(n)).unwrap();
        }
        let (done, flushed) = sync_channel(1);
        jobs.send(Job::Flush(done)).unwrap();
        jobs.send(Job::Item(250)).unwrap();
        drop(jobs);
        let mut batch = Writes {
            adding: Vec::new(),
            writes: Arc::clone(&writes),
            flushes: Arc::clone(&flushes),
        };
        write_gathered(&mut batch, &queue, 100);
        flushed.try_recv().expect("the flush was answered");
        let writes = writes.lock().unwrap();
        let sizes: Vec<usize> = writes.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![100, 100, 50, 1], "{writes:?}");
        let all: Vec<u32> = writes.iter().flatten().copied().collect();
        assert_eq!(all, (0..=250).collect::<Vec<_>>());
        assert_eq!(*flushes.lock().unwrap(), 1);
    }
}
