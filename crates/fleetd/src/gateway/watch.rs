//! The pane watcher: notices panes whose program exited or that were closed under fleetd and
//! ends their sessions (its interval bounds how late an exit is seen), and records what the
//! pane host sees of the agent in each.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::{Gid, WorkerStatus};
use fleet_mux::{AgentState, MuxError, PaneLife};

use super::LocalPlane;
use crate::logs;

/// How often the pane host is asked which panes still run.
pub(super) const PANE_WATCH_INTERVAL: Duration = Duration::from_millis(200);
/// How far back to read an ended pane for its last words.
const HISTORY_LINES: usize = 200;

impl LocalPlane {
    /// Records what the pane host sees of the agent in `gid`'s pane; a change wakes the pump
    /// (the agent may have become free for a task).
    fn note_agent(&self, gid: Gid, agent: Option<(String, AgentState)>) {
        let shown = format!("{agent:?}");
        if let Some(session) = self.sessions.lock().panes.get_mut(&gid)
            && session.agent_seen(agent)
        {
            tracing::info!(%gid, agent = %shown, "the pane host sees the agent");
        }
    }

    /// Ends the sessions whose panes ended. `statusless` holds the panes seen dead without an
    /// exit status once: tmux marks a pane dead when its terminal closes and learns the status
    /// a moment later, so such a pane gets one more look before it is reported without one.
    pub(super) async fn check_panes(self: &Arc<Self>, statusless: &mut HashSet<Gid>) {
        let watched: Vec<_> = self
            .sessions
            .lock()
            .panes
            .iter()
            .filter(|(_, s)| s.status().is_live())
            .filter_map(|(gid, s)| s.pane().cloned().map(|p| (*gid, p)))
            .collect();
        statusless.retain(|gid| watched.iter().any(|(w, _)| w == gid));
        if watched.is_empty() {
            return;
        }
        let panes = match self.panes.panes().await {
            Ok(panes) => {
                let mut sessions = self.sessions.lock();
                if let Some(was) = sessions.host_down.take() {
                    tracing::info!(was = %was, "the pane host is back");
                    for session in sessions.panes.values() {
                        session.kick();
                    }
                }
                drop(sessions);
                panes
            }
            Err(e @ (MuxError::Unreachable(_) | MuxError::Disconnected)) => {
                let mut sessions = self.sessions.lock();
                if sessions.host_down.is_none() {
                    tracing::warn!(error = %logs::mux_error(&e), "the pane host is not reachable: workers read unknown, sends to them fail until it is back");
                }
                sessions.host_down = Some(e.to_string());
                return;
            }
            Err(e) => {
                tracing::warn!(error = %logs::mux_error(&e), "cannot list panes");
                return;
            }
        };
        for (gid, pane) in watched {
            let listed = panes
                .get(&pane)
                .map(|state| (state.life, state.agent.clone()));
            // A pane the host no longer lists is not closed again: its id may by then name
            // another pane (a pane host that restarted numbers its panes afresh, and a worker
            // spawned since may have it).
            let close = listed.is_some();
            let reason = match listed {
                Some((PaneLife::Alive, agent)) => {
                    self.note_agent(gid, agent);
                    continue;
                }
                Some((PaneLife::Exited(Some(code)), _)) => {
                    format!("its program exited with status {code}")
                }
                Some((PaneLife::Exited(None), _)) if statusless.insert(gid) => continue,
                Some((PaneLife::Exited(None), _)) => "its program exited".to_string(),
                None => "its pane was closed".to_string(),
            };
            if close && let Ok(history) = self.panes.history(&pane, HISTORY_LINES).await {
                let words =
                    super::starting::tail_lines(&history, super::starting::LAST_WORDS_LINES);
                tracing::info!(%gid, %pane, reason = %reason, last_words = %logs::summary(&words), "pane ended");
                logs::trace_text("last_words", &words);
                if let Some(session) = self.sessions.lock().panes.get_mut(&gid) {
                    session.last_words_were(words);
                }
            }
            statusless.remove(&gid);
            // A session that got a fresh pane meanwhile (a recycle) lives on.
            let over = self
                .sessions
                .lock()
                .panes
                .get(&gid)
                .is_none_or(|s| s.status() == WorkerStatus::Gone || s.pane() != Some(&pane));
            if !over {
                self.end_session(gid, &reason, close).await;
            }
        }
    }
}
