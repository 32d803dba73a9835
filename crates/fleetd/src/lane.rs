//! Blocking work in its own place: a lane is a few OS threads of its own that run blocking jobs
//! in the order they come, so one kind of blocking work never waits behind another. A spawn's
//! file-system work (its cwd resolved, its launch prepared, which can wait seconds on Claude
//! Code's settings lock) runs on one, so it takes no thread of tokio's blocking pool, which is
//! the store's. (The store stays on that pool: a paused test clock stops only for tokio's own
//! blocking tasks, and would run ahead of a store call made on a lane.)

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// A job, as the lane's threads take it.
type Job = Box<dyn FnOnce() + Send>;

/// Threads of their own for one kind of blocking work. Dropping it lets its threads end once
/// they have run what was queued.
pub struct Lane {
    name: &'static str,
    jobs: mpsc::Sender<Job>,
}

/// The lane could not run a job: its threads are gone, or the job panicked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost(pub String);

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Lane {
    /// A lane named `name` (its threads are `fleetd-<name>`) of `threads` threads, at least one.
    pub fn new(name: &'static str, threads: usize) -> std::io::Result<Lane> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..threads.max(1) {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("fleetd-{name}"))
                .spawn(move || take_jobs(&queue))?;
        }
        Ok(Lane { name, jobs })
    }

    /// Runs `job` on one of the lane's threads and waits for what it returns. A caller that
    /// goes away does not stop the job: it runs to its end, and what it returns is dropped.
    pub async fn run<T, F>(&self, job: F) -> Result<T, Lost>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                // Nobody waits for it any more: nothing to do with it.
                let _ = answer.send(job());
            }))
            .map_err(|_| Lost(format!("the {} threads are gone", self.name)))?;
        answered
            .await
            .map_err(|_| Lost(format!("a job on the {} threads failed", self.name)))
    }
}

/// One thread of a lane: takes the next job until the lane is dropped. A job that panics
/// takes only itself down (its caller hears that it failed); the thread goes on.
fn take_jobs(queue: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let next = {
            let queue = queue
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            queue.recv()
        };
        let Ok(job) = next else { return };
        if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!(thread = ?std::thread::current().name(), "a blocking job panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_job_runs_on_the_lanes_own_thread_and_returns_its_value() {
        let lane = Lane::new("test", 1).unwrap();
        let name = lane
            .run(|| std::thread::current().name().map(String::from))
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("fleetd-test"));
    }

    #[tokio::test]
    async fn a_job_that_panics_fails_alone_and_the_lane_goes_on() {
        let lane = Lane::new("test", 1).unwrap();
        let failed = lane.run(|| -> u8 { panic!("on purpose") }).await;
        assert_eq!(failed, Err(Lost("a job on the test threads failed".into())));
        assert_eq!(lane.run(|| 7).await, Ok(7));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lane_blocked_to_its_last_thread_holds_up_no_other_lane() {
        let slow = Arc::new(Lane::new("slow", 2).unwrap());
        let quick = Lane::new("quick", 1).unwrap();
        // Both of the slow lane's threads are taken, and wait until the quick lane has answered.
        let (started, gate) = (Arc::new(Barrier::new(3)), Arc::new(Barrier::new(3)));
        let mut waiting = Vec::new();
        for _ in 0..2 {
            let (started, gate, slow) =
                (Arc::clone(&started), Arc::clone(&gate), Arc::clone(&slow));
            waiting.push(tokio::spawn(async move {
                slow.run(move || {
                    started.wait();
                    gate.wait();
                })
                .await
            }));
        }
        tokio::task::spawn_blocking({
            let started = Arc::clone(&started);
            move || started.wait()
        })
        .await
        .unwrap();
        let answered =
            tokio::time::timeout(Duration::from_secs(10), quick.run(|| "answered")).await;
        assert_eq!(answered.ok(), Some(Ok("answered")));
        gate.wait();
        for job in waiting {
            assert_eq!(job.await.unwrap(), Ok(()));
        }
        // And the slow lane takes work again once its threads are free.
        let again = tokio::time::timeout(Duration::from_secs(10), slow.run(|| 1)).await;
        assert_eq!(again.ok(), Some(Ok(1)));
    }
}
