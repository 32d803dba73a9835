//! Pauses shorter than tokio's timers can tell: its driver wakes on whole milliseconds, so a
//! 1 ms pause takes 1 to 2 ms. The pause that tells a paste has shown on screen is one such
//! millisecond, on every task's way. A Linux timer descriptor (`timerfd`) wakes within tens of
//! microseconds instead; where one cannot be had, tokio's timer serves.

use std::time::Duration;

use rustix::fd::OwnedFd;
use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
    timerfd_settime,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Sleeps `span`, to within tens of microseconds where the system allows. It never ends before
/// tokio's clock has moved `span` on: on a running clock that is the real one, which the
/// descriptor watches; on a paused one (a test's) tokio's own timer ends it, when the test's
/// clock gets there.
pub async fn sleep(span: Duration) {
    if span.is_zero() {
        return;
    }
    let end = tokio::time::Instant::now() + span;
    let coarse = tokio::time::sleep_until(end);
    tokio::pin!(coarse);
    match armed(span) {
        Ok(timer) => {
            tokio::select! {
                biased;
                () = &mut coarse => {}
                woke = timer.readable() => {
                    // A paused clock not there yet, or a descriptor that failed: tokio's time.
                    if woke.is_err() || tokio::time::Instant::now() < end {
                        coarse.await;
                    }
                }
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "no timer descriptor; sleeping on tokio's timer");
            coarse.await;
        }
    }
}

/// A timer descriptor that turns readable `span` from now.
fn armed(span: Duration) -> std::io::Result<AsyncFd<OwnedFd>> {
    let fd = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    let too_long = |_| std::io::Error::other("a pause too long for a timer descriptor");
    let value = Timespec {
        tv_sec: span.as_secs().try_into().map_err(too_long)?,
        tv_nsec: span.subsec_nanos().into(),
    };
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let spec = Itimerspec {
        it_interval: zero,
        it_value: value,
    };
    timerfd_settime(&fd, TimerfdTimerFlags::empty(), &spec)?;
    // SAFETY: `fd` is an `OwnedFd`, open and owned by the `AsyncFd` for its whole life: its
    // raw descriptor is always the same, and nothing else holds or closes it.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pause_lasts_at_least_its_span_and_none_at_all_returns_at_once() {
        // How much sooner than tokio's timer it wakes is a figure of `fleet-bench steps`.
        for span in [Duration::from_micros(300), Duration::from_millis(2)] {
            let began = std::time::Instant::now();
            sleep(span).await;
            assert!(began.elapsed() >= span, "{span:?}: {:?}", began.elapsed());
        }
        let began = std::time::Instant::now();
        sleep(Duration::ZERO).await;
        assert!(began.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_paused_clock_a_pause_moves_the_clock_on_and_not_the_wall() {
        let (began, wall) = (tokio::time::Instant::now(), std::time::Instant::now());
        sleep(Duration::from_secs(3_600)).await;
        assert!(began.elapsed() >= Duration::from_secs(3_600));
        assert!(
            wall.elapsed() < Duration::from_secs(60),
            "{:?}",
            wall.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_paused_clock_held_back_a_pause_waits_for_it_not_for_the_wall() {
        // A blocking task holds the paused clock where it is while the wall clock passes the
        // pause's span: the pause still ends only once the paused clock gets there.
        let span = Duration::from_millis(5);
        let began = tokio::time::Instant::now();
        let holding = tokio::task::spawn_blocking(move || std::thread::sleep(span * 4));
        sleep(span).await;
        assert!(began.elapsed() >= span, "{:?}", began.elapsed());
        holding.await.unwrap();
    }
}
