//! What fleetd tells the pane host of each worker's state (for a host that shows it: herdr's
//! sidebar) is told by a task of its own beside the worker's pump. A report is a request to the
//! host, and one may take long (herdr naps 100 ms on a request it did not find waiting), while
//! the pump, which decides the state, must not wait on it to type the worker's next task. The
//! host is told the latest state; one it could not be told is told again after a pause, unless
//! a newer one replaces it first.
//!
//! A change of state is told [`STANDS`] after it, the state then: a round trip the worker goes
//! busy and idle again within is not told at all (the host already shows idle), and a worker
//! whose state changes often puts at most one report per [`STANDS`] on the host. A report told
//! at once went to herdr, as the pump claimed a task, beside the typing's own first look and
//! paste, and a second as the worker answered: two requests a round trip on a host that answers
//! each in a quarter of a millisecond.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::{Gid, WorkerStatus};
use fleet_mux::{AgentState, MuxError, PaneId};
use tokio::sync::watch;
use tracing::Instrument;

use super::LocalPlane;
use crate::logs;

/// How long a report the pane host failed waits before it is tried again.
const RETRY: Duration = Duration::from_secs(2);

/// How long after a change of state the pane host is told the state then.
pub(super) const STANDS: Duration = Duration::from_millis(100);

/// What fleetd reports to the pane host for a session status (shown in herdr's sidebar).
fn reported(status: WorkerStatus) -> Option<AgentState> {
    match status {
        WorkerStatus::Spawning => Some(AgentState::Unknown),
        WorkerStatus::Idle => Some(AgentState::Idle),
        WorkerStatus::Busy => Some(AgentState::Working),
        WorkerStatus::Asking | WorkerStatus::Blocked => Some(AgentState::Blocked),
        WorkerStatus::Stopping | WorkerStatus::Gone => None,
    }
}

/// The state a worker's pane should show, handed to its reporter; the reporter ends once this
/// is dropped (with the pump) and what it last held is told, or at shutdown.
pub(super) struct Reporter {
    wanted: watch::Sender<Option<(PaneId, AgentState)>>,
}

impl LocalPlane {
    /// Starts the reporter of `gid`'s state, in the caller's span (the pump's).
    pub(super) fn start_reporter(self: &Arc<Self>, gid: Gid) -> Reporter {
        let (wanted, told) = watch::channel(None);
        let plane = Arc::clone(self);
        self.tasks
            .spawn(async move { plane.report(gid, told).await }.in_current_span());
        Reporter { wanted }
    }

    /// Hands `reporter` the state of `gid`'s session now; nothing (and nothing still to be told
    /// again) when the host recognises the agent itself (it knows better then) or there is no
    /// state to tell.
    pub(super) fn report_status(&self, gid: Gid, reporter: &Reporter) {
        let found = self.sessions.lock().panes.get(&gid).and_then(|s| {
            let state = reported(s.status())?;
            let pane = s.pane().cloned()?;
            s.host_agent().is_none().then_some((pane, state))
        });
        reporter.wanted.send_if_modified(|wanted| {
            let new = *wanted != found;
            *wanted = found;
            new
        });
    }

    /// Tells the pane host each state `wanted` comes to, until its sender is dropped or fleetd
    /// shuts down.
    async fn report(&self, gid: Gid, mut wanted: watch::Receiver<Option<(PaneId, AgentState)>>) {
        let mut failed = false;
        // What the host last took.
        let mut shown = None;
        loop {
            let retry = async {
                match failed {
                    true => tokio::time::sleep(RETRY).await,
                    false => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = wanted.changed() => {
                    if changed.is_err() { return }
                    // The state a while on (what it last held, if the pump ends meanwhile).
                    tokio::select! {
                        () = tokio::time::sleep(STANDS) => {}
                        () = self.shutdown.cancelled() => return,
                    }
                }
                () = retry => {}
                () = self.shutdown.cancelled() => return,
            }
            // Nothing to show, or what the host shows already.
            let latest = wanted.borrow_and_update().clone();
            let Some((pane, state)) = latest.filter(|l| shown.as_ref() != Some(l)) else {
                failed = false;
                continue;
            };
            let told = tokio::select! {
                told = self.panes.report(&pane, state) => told,
                () = self.shutdown.cancelled() => return,
            };
            failed = match told {
                Ok(()) => {
                    shown = Some((pane, state));
                    false
                }
                // The pane is gone: there is no one to tell.
                Err(MuxError::NoPane(_)) => false,
                Err(e) => {
                    tracing::debug!(%gid, error = %logs::mux_error(&e), "cannot report the session's state");
                    true
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_shows_its_status_and_one_on_its_way_out_shows_none() {
        assert_eq!(reported(WorkerStatus::Idle), Some(AgentState::Idle));
        assert_eq!(reported(WorkerStatus::Busy), Some(AgentState::Working));
        assert_eq!(reported(WorkerStatus::Blocked), Some(AgentState::Blocked));
        assert_eq!(reported(WorkerStatus::Asking), Some(AgentState::Blocked));
        assert_eq!(reported(WorkerStatus::Spawning), Some(AgentState::Unknown));
        assert_eq!(reported(WorkerStatus::Stopping), None);
        assert_eq!(reported(WorkerStatus::Gone), None);
    }
}
