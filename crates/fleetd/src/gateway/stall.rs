//! The stall watchdog: a busy worker (of a profile with `stall_after_s`) whose screen has not
//! changed and that has made no call for that long has stalled — a hung tool, a lost model
//! connection, a wedged screen, a turn that ended without a reply. Its lead (the sender of its
//! task, else the lead that spawned it) is told once, by a message held for it with the end of
//! the worker's screen (so a lead that is not in a call is nudged); `fleet_list` shows
//! `stalled_since` until the worker moves again. With `on_stall = "recycle"` its task fails
//! instead (the lead's open send ends `failed`, the reason carrying the screen's end) and the
//! worker gets a fresh session under its name.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::clock::now_ms;
use fleet_core::lifecycle::stalled;
use fleet_core::ownership::quoting;
use fleet_core::{Gid, Kind, Message, MsgId, SessionEvent, WorkerStatus};
use fleet_mux::PaneId;
use tokio::time::Instant;

use super::LocalPlane;
use super::starting::tail_lines;
use crate::config::OnStall;

/// How often busy workers' screens are looked at for a stall.
pub(super) const STALL_LOOK: Duration = Duration::from_secs(1);
/// How many lines of a stalled worker's screen its lead is shown.
const STALL_TAIL_LINES: usize = 15;

/// What the watchdog remembers of a busy worker: its task, its screen, and since when the
/// screen has shown that.
pub(super) struct Seen {
    task: Option<MsgId>,
    screen: String,
    since: Instant,
}

/// A busy worker to look at.
struct Watched {
    gid: Gid,
    pane: PaneId,
    task: Option<MsgId>,
    after: Duration,
    /// How long ago it last called in.
    since_call: Option<Duration>,
    /// Whether its lead was told of this stall already.
    reported: bool,
    /// When it last called in (Unix ms), as seen at the look.
    last_seen_ms: Option<i64>,
}

impl LocalPlane {
    pub(super) async fn look_for_stalls(self: &Arc<Self>, seen: &mut HashMap<Gid, Seen>) {
        let watched: Vec<Watched> = {
            let sessions = self.sessions.lock();
            let now = now_ms();
            let mut watched = Vec::new();
            // Only a busy worker stalls (one waiting on its lead, asking or blocked, does not).
            for (gid, s) in &sessions.panes {
                let after = s.profile().stall_after_s.map(Duration::from_secs);
                // One waiting in a long fleet call waits on the fleet, not stalled.
                if s.open_calls() > 0 {
                    continue;
                }
                if let (WorkerStatus::Busy, Some(after), Some(pane)) = (s.status(), after, s.pane())
                {
                    watched.push(Watched {
                        gid: *gid,
                        pane: pane.clone(),
                        task: s.current().map(|t| t.msg_id),
                        after,
                        since_call: s
                            .last_seen_ms()
                            .map(|at| Duration::from_millis(u64::try_from(now - at).unwrap_or(0))),
                        reported: s.stalled_since().is_some(),
                        last_seen_ms: s.last_seen_ms(),
                    });
                }
            }
            watched
        };
        seen.retain(|gid, _| watched.iter().any(|w| w.gid == *gid));
        for w in watched {
            let Ok(screen) = self.panes.snapshot(&w.pane).await else {
                continue;
            };
            let moved = match seen.get(&w.gid) {
                Some(before) => before.task != w.task || before.screen != screen.text,
                None => true,
            };
            if moved {
                seen.insert(
                    w.gid,
                    Seen {
                        task: w.task,
                        screen: screen.text,
                        since: Instant::now(),
                    },
                );
            }
            let still = seen
                .get(&w.gid)
                .map_or(Duration::ZERO, |s| s.since.elapsed());
            if stalled(still, w.since_call, w.after) {
                if !w.reported {
                    let tail = seen
                        .get(&w.gid)
                        .map(|s| tail_lines(&s.screen, STALL_TAIL_LINES))
                        .unwrap_or_default();
                    self.stalled(&w, &tail).await;
                }
            } else if w.reported
                && let Some(session) = self.sessions.lock().panes.get_mut(&w.gid)
            {
                tracing::info!(gid = %w.gid, "the stalled worker moves again");
                session.moves_again();
            }
        }
    }

    /// Busy worker `w` has shown `tail` unchanged, and made no call, for its `after`: its
    /// lead hears so, and with `on_stall = "recycle"` its task fails and it starts afresh.
    async fn stalled(self: &Arc<Self>, w: &Watched, tail: &str) {
        let (gid, after) = (w.gid, w.after);
        let (name, lead, task, on_stall, owner) = {
            let mut sessions = self.sessions.lock();
            let Some(session) = sessions.panes.get_mut(&gid) else {
                return;
            };
            // Still as it was looked at: busy on the same task, no call since, none open.
            if session.status() != WorkerStatus::Busy
                || session.current().map(|t| t.msg_id) != w.task
                || session.last_seen_ms() != w.last_seen_ms
                || session.open_calls() > 0
            {
                return;
            }
            session.stalled_at(now_ms());
            let task = session.current().cloned();
            let lead = task.as_ref().map(|t| t.from).or(session.entity().parent);
            (
                session.entity().name.clone(),
                lead,
                task,
                session.profile().on_stall,
                session.entity().parent,
            )
        };
        let public = format!(
            "'{name}' has stalled: no change on its screen and no call for {} s while working{}",
            after.as_secs(),
            task.as_ref()
                .map(|t| format!(" on your task {}", t.msg_id))
                .unwrap_or_default()
        );
        // Its screen is its owner's: a lead it is shared with hears of the stall without it.
        let to_owner = lead.is_some() && lead == owner;
        tracing::warn!(%gid, %name, stall_after_s = after.as_secs(), ?on_stall, screen_tail = %crate::logs::summary(tail), "a worker has stalled");
        crate::logs::trace_text("stall screen tail", tail);
        match (on_stall, &task) {
            (OnStall::Recycle, Some(task)) => {
                let what = quoting(&format!("{public} (so it was recycled)"), tail, to_owner);
                self.recycle_stalled(gid, task, &what).await;
            }
            (OnStall::Recycle, None) | (OnStall::Notify, _) => {
                let Some(lead) = lead else {
                    return;
                };
                // About the task (in its flow): a lead on another host takes it from the worker
                // whose task it sent, as it takes an ask; never the task's answer.
                let notice = Message::about(
                    task.as_ref(),
                    Kind::Send,
                    (gid, lead),
                    format!("[fleet] {}", quoting(&public, tail, to_owner)),
                    now_ms(),
                );
                if let Err(e) = self.deliver(notice).await {
                    tracing::warn!(%gid, error = %e, "cannot tell the lead of a stalled worker");
                }
            }
        }
    }

    /// Fails a stalled worker's task `task` (its lead hears `what`) and gives the worker a
    /// fresh session.
    async fn recycle_stalled(self: &Arc<Self>, gid: Gid, task: &Message, what: &str) {
        let recycling = {
            let mut sessions = self.sessions.lock();
            match sessions.panes.get_mut(&gid) {
                Some(session) => {
                    session.take_current(task.msg_id).is_some()
                        && session.end_turn().is_ok()
                        && session.apply(SessionEvent::Recycle).is_ok()
                }
                _ => false,
            }
        };
        if !recycling {
            return;
        }
        self.turn_failed(task, what).await;
        // On its own: the watchdog goes on looking at the others meanwhile.
        let gateway = Arc::clone(self);
        self.tasks
            .spawn(async move { gateway.recycle(gid, "it stalled").await });
    }
}
