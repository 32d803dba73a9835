//! Nudges: when messages are held for a lead that is not blocked in a fleet call, type a
//! one-line reminder into the lead's own pane, only while that pane is idle and at most once
//! per interval. The lead says where its pane is with `X-Fleet-Pane` (its `$TMUX_PANE`) and,
//! optionally, `X-Fleet-Tmux` (its `$TMUX`, naming its tmux server).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::Gid;
use fleet_core::lifecycle::{nudge_line, nudge_wait};
use fleet_mux::tmux::{Socket, Tmux};
use fleet_mux::{MuxError, PaneHost, PaneId, Snapshot};
use tokio::time::{Instant, sleep};

use super::LocalPlane;
use crate::config::LeadConfig;

/// How soon to look again when a nudge is due but the lead is busy or its pane is not idle.
const NUDGE_RECHECK: Duration = Duration::from_secs(1);
/// The pause between typing a nudge and pressing Enter, so the agent takes the text as typed
/// keys and the Enter as a submit.
const NUDGE_ENTER_PAUSE: Duration = Duration::from_millis(100);

/// Whether the lead's pane may be nudged: it held still between two looks, is not in a mode,
/// and (when `empty_input` is set) shows its empty input box, so no draft of the human's is
/// sent along with the nudge.
fn may_nudge(first: &Snapshot, second: &Snapshot, empty_input: &str) -> bool {
    !first.in_mode
        && first == second
        && (empty_input.is_empty()
            || fleet_mux::inject::shows_empty_input(&second.text, empty_input))
}

/// Where a lead's pane is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NudgeTarget {
    /// The lead's tmux server socket; the user's default server when unknown.
    pub socket: Option<PathBuf>,
    /// The pid of that tmux server, when `TMUX` said: a pane id means nothing past the life of
    /// its server, so a target kept over a restart of fleetd is used only while that server runs.
    pub server: Option<u32>,
    /// The pane, as `%N`.
    pub pane: String,
}

impl NudgeTarget {
    /// Reads the target from the `X-Fleet-Pane` and `X-Fleet-Tmux` header values; `None` when
    /// the pane is absent or not a tmux pane id (a header left unexpanded, say).
    pub fn from_headers(pane: Option<&str>, tmux: Option<&str>) -> Option<Self> {
        let pane = pane?.trim();
        let digits = pane.strip_prefix('%')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut fields = tmux.map(|t| t.split(',').map(str::trim));
        let socket = fields
            .as_mut()
            .and_then(Iterator::next)
            .filter(|s| s.starts_with('/'))
            .map(PathBuf::from);
        let server = fields
            .as_mut()
            .and_then(Iterator::next)
            .and_then(|pid| pid.parse().ok())
            .filter(|_| socket.is_some());
        Some(Self {
            socket,
            server,
            pane: pane.to_string(),
        })
    }

    /// Whether the tmux server it names (by socket and pid) is the one on that socket now: a
    /// pane id means something only for the life of its server.
    pub(super) async fn server_runs(&self) -> bool {
        match self.server {
            Some(pid) => self.tmux().server_pid().await.is_ok_and(|now| now == pid),
            None => false,
        }
    }

    fn tmux(&self) -> Tmux {
        Tmux::new(match &self.socket {
            Some(path) => Socket::Path(path.clone()),
            None => Socket::Name("default".into()),
        })
    }
}

/// What the nudger should do now.
enum NudgeStep {
    /// Nothing is held, or there is nowhere to nudge.
    Nothing,
    /// Look again after this long.
    Later(Duration),
    /// Nudge this pane about this many messages.
    Now(NudgeTarget, usize),
}

pub(super) fn start(gateway: &Arc<LocalPlane>) {
    for (name, lead) in &gateway.config.leads {
        if !lead.nudge {
            continue;
        }
        let gid = gateway
            .sessions
            .lock()
            .leads
            .values()
            .find(|l| &l.entity().name == name)
            .map(|l| l.entity().gid);
        if let Some(gid) = gid {
            let (looping, lead) = (Arc::clone(gateway), lead.clone());
            gateway.run_watched(&format!("nudge of {name}"), async move {
                looping.nudge_loop(gid, lead).await
            });
        }
    }
}

impl LocalPlane {
    async fn nudge_loop(self: Arc<Self>, gid: Gid, lead: LeadConfig) {
        let mut inbox = self.inboxes.watch(gid);
        loop {
            inbox.borrow_and_update();
            let wait = match self.nudge_due(gid, &lead).await {
                NudgeStep::Nothing => None,
                NudgeStep::Later(after) => Some(after),
                NudgeStep::Now(target, count) => {
                    if self.nudge(gid, &target, count, &lead).await {
                        Some(Duration::from_secs(lead.nudge_interval_s))
                    } else {
                        Some(NUDGE_RECHECK)
                    }
                }
            };
            let nap = async {
                match wait {
                    Some(after) => sleep(after).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = inbox.changed() => if changed.is_err() { return },
                () = nap => {}
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Whether to nudge `gid` now. What memory answers is looked at first: the held
    /// messages are counted only when a nudge is otherwise due (counting on every arrival made
    /// holding n messages cost O(n²)).
    async fn nudge_due(&self, gid: Gid, lead: &LeadConfig) -> NudgeStep {
        let target = {
            let sessions = self.sessions.lock();
            let Some(state) = sessions.leads.get(&gid) else {
                return NudgeStep::Nothing;
            };
            let Some(target) = state.nudge_target().cloned() else {
                return NudgeStep::Nothing;
            };
            let interval = Duration::from_secs(lead.nudge_interval_s);
            let since_last = state.last_nudge().map(|at| at.elapsed());
            if let Some(wait) = nudge_wait(state.open_calls(), since_last, interval, NUDGE_RECHECK)
            {
                return NudgeStep::Later(wait);
            }
            target
        };
        match self.db.run(move |s| s.held_count(gid)).await {
            Ok(0) => NudgeStep::Nothing,
            Ok(held) => NudgeStep::Now(target, held),
            Err(e) => {
                tracing::warn!(%gid, error = %e, "cannot count held messages");
                NudgeStep::Later(NUDGE_RECHECK)
            }
        }
    }

    /// Types the nudge if the pane may be nudged ([`may_nudge`]) and the lead did not start a
    /// call meanwhile. Returns whether it typed. A pane that is gone is forgotten until the
    /// lead's next request names it again.
    async fn nudge(&self, gid: Gid, target: &NudgeTarget, count: usize, lead: &LeadConfig) -> bool {
        let tmux = target.tmux();
        let pane = PaneId(target.pane.clone());
        let idle = async {
            let first = tmux.snapshot(&pane).await?;
            sleep(Duration::from_millis(lead.nudge_quiet_ms)).await;
            let second = tmux.snapshot(&pane).await?;
            let may = may_nudge(&first, &second, &lead.empty_input_marker);
            if !may {
                tracing::debug!(%gid, pane = %target.pane, in_mode = second.in_mode, still = first == second, "the lead's pane is not idle: no nudge yet");
            }
            Ok::<bool, fleet_mux::MuxError>(may)
        };
        match idle.await {
            Ok(true) => {}
            Ok(false) => return false,
            // The pane or its server is gone: forget it until the lead names it again.
            Err(e @ MuxError::NoPane(_)) => {
                tracing::info!(%gid, pane = %target.pane, error = %crate::logs::mux_error(&e), "the lead's pane is gone; not nudging it until the lead calls again");
                if let Some(state) = self.sessions.lock().leads.get_mut(&gid) {
                    state.nudge_target_gone(target);
                }
                if let Err(e) = self.db.run(move |s| s.forget_lead_pane(gid)).await {
                    tracing::warn!(%gid, error = %e, "cannot forget where the lead was nudged");
                }
                return false;
            }
            Err(e) => {
                tracing::warn!(%gid, pane = %target.pane, error = %crate::logs::mux_error(&e), "cannot look at the lead's pane; trying again later");
                return false;
            }
        }
        {
            let mut sessions = self.sessions.lock();
            let Some(state) = sessions.leads.get_mut(&gid) else {
                return false;
            };
            if !state.nudged(Instant::now()) {
                return false;
            }
        }
        let line = nudge_line(count);
        let typed = async {
            tmux.type_text(&pane, &line).await?;
            sleep(NUDGE_ENTER_PAUSE).await;
            tmux.enter(&pane).await
        };
        match typed.await {
            Ok(()) => {
                self.metrics.nudged("lead");
                tracing::info!(%gid, pane = %target.pane, count, "nudged");
                true
            }
            Err(e) => {
                tracing::warn!(%gid, pane = %target.pane, error = %crate::logs::mux_error(&e), "cannot nudge");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_come_from_tmux_variables() {
        let target =
            NudgeTarget::from_headers(Some("%12"), Some("/tmp/tmux-1000/default,4242,0")).unwrap();
        assert_eq!(target.pane, "%12");
        assert_eq!(target.socket, Some(PathBuf::from("/tmp/tmux-1000/default")));
        assert_eq!(target.server, Some(4242));
        let bare = NudgeTarget::from_headers(Some(" %3 "), None).unwrap();
        assert_eq!(
            (bare.pane.as_str(), bare.socket, bare.server),
            ("%3", None, None)
        );
    }

    #[test]
    fn only_a_still_pane_with_an_empty_input_box_is_nudged() {
        let snap = |text: &str, in_mode| Snapshot {
            cursor: Some((2, 5)),
            in_mode,
            text: text.into(),
        };
        let empty = snap("done.\n❯\u{a0}\n", false);
        assert!(may_nudge(&empty, &empty.clone(), "❯\u{a0}"));
        let draft = snap("done.\n❯ half a thought\n", false);
        assert!(!may_nudge(&draft, &draft.clone(), "❯\u{a0}"));
        // A draft drawn behind the marker is a draft all the same.
        let behind = snap("done.\n❯\u{a0}half a thought\n", false);
        assert!(!may_nudge(&behind, &behind.clone(), "❯\u{a0}"));
        assert!(may_nudge(&draft, &draft.clone(), ""));
        assert!(!may_nudge(&empty, &snap("working…\n", false), "❯\u{a0}"));
        let scrolling = snap("done.\n❯\u{a0}\n", true);
        assert!(!may_nudge(&scrolling, &scrolling.clone(), "❯\u{a0}"));
    }

    #[test]
    fn unexpanded_or_foreign_values_are_ignored() {
        assert!(NudgeTarget::from_headers(Some("${TMUX_PANE}"), None).is_none());
        assert!(NudgeTarget::from_headers(Some("%"), None).is_none());
        assert!(NudgeTarget::from_headers(Some("w1:p2"), None).is_none());
        assert!(NudgeTarget::from_headers(None, Some("/tmp/x,1,0")).is_none());
        let odd = NudgeTarget::from_headers(Some("%1"), Some("relative,1,0")).unwrap();
        assert_eq!((odd.socket, odd.server), (None, None));
        let no_pid = NudgeTarget::from_headers(Some("%1"), Some("/tmp/x,${PID},0")).unwrap();
        assert_eq!(no_pid.server, None);
    }
}
