//! A lead as this process knows it: reached by MCP pull, its open calls (and whose asks they
//! surface), where to nudge it, and when it was last seen and nudged. Its fields are its own:
//! every change goes through a method named for what happened.

use std::sync::Arc;

use fleet_core::{Entity, Gid};
use tokio::time::Instant;

use super::NudgeTarget;

/// A lead, reached by MCP pull.
pub(super) struct LeadState {
    /// Who: shared with each of its calls' [`super::Caller`]s.
    entity: Arc<Entity>,
    /// Fleet calls of this lead now open (a blocked send, a long poll): while any is open the
    /// lead gets its messages through the call and is never nudged.
    open_calls: usize,
    /// Whose asks its open calls surface: one entry per open call, a worker's gid (a send to
    /// it) or `None` (a poll without filter: anyone's).
    listening: Vec<Option<Gid>>,
    /// Where to type a nudge, as the lead's last request said.
    nudge: Option<NudgeTarget>,
    /// The pane last forgotten as gone: named again, it is no news (a pane fleetd cannot reach
    /// is named on every request, and would wake the nudger on each).
    gone: Option<NudgeTarget>,
    /// When it last called in.
    last_seen_ms: Option<i64>,
    /// When it was last nudged.
    last_nudge: Option<Instant>,
}

impl LeadState {
    /// `entity`, not seen yet.
    pub fn new(entity: Entity) -> LeadState {
        LeadState {
            entity: Arc::new(entity),
            open_calls: 0,
            listening: Vec::new(),
            nudge: None,
            gone: None,
            last_seen_ms: None,
            last_nudge: None,
        }
    }

    /// Who.
    pub fn entity(&self) -> &Entity {
        &self.entity
    }

    /// Who, shared (no copy of its names).
    pub fn entity_shared(&self) -> Arc<Entity> {
        Arc::clone(&self.entity)
    }

    /// How many of its fleet calls are open now.
    pub fn open_calls(&self) -> usize {
        self.open_calls
    }

    /// Whose asks its open calls surface (`None`: anyone's).
    pub fn listening(&self) -> &[Option<Gid>] {
        &self.listening
    }

    /// When it last called in (Unix ms).
    pub fn last_seen_ms(&self) -> Option<i64> {
        self.last_seen_ms
    }

    /// Where to type a nudge, as its last request said.
    pub fn nudge_target(&self) -> Option<&NudgeTarget> {
        self.nudge.as_ref()
    }

    /// When it was last nudged.
    pub fn last_nudge(&self) -> Option<Instant> {
        self.last_nudge
    }

    /// Where a previous run of fleetd last nudged it, taken as where to nudge it until a call
    /// of its says otherwise.
    pub fn remember(&mut self, target: NudgeTarget) {
        if self.nudge.is_none() {
            self.nudge = Some(target);
        }
    }

    /// Notes a call of its at `now_ms`, and where to nudge it if the call says; returns whether
    /// that is news: a pane other than the one it is nudged in now (none, as after a restart of
    /// fleetd, or another), and other than the one last found gone.
    pub fn called_in(&mut self, nudge: Option<NudgeTarget>, now_ms: i64) -> bool {
        self.last_seen_ms = Some(now_ms);
        let Some(target) = nudge else {
            return false;
        };
        let news = self.nudge.as_ref() != Some(&target) && self.gone.as_ref() != Some(&target);
        self.nudge = Some(target);
        news
    }

    /// Notes one of its fleet calls opened, surfacing the asks of `listens` (anyone's: `None`).
    pub fn call_opened(&mut self, listens: Option<Gid>) {
        self.open_calls += 1;
        self.listening.push(listens);
    }

    /// Notes that call over.
    pub fn call_closed(&mut self, listens: Option<Gid>) {
        self.open_calls = self.open_calls.saturating_sub(1);
        if let Some(at) = self.listening.iter().position(|l| *l == listens) {
            self.listening.swap_remove(at);
        }
    }

    /// Forgets `target` as where to nudge it (its pane is gone), unless it named another since.
    pub fn nudge_target_gone(&mut self, target: &NudgeTarget) {
        if self.nudge.as_ref() == Some(target) {
            self.nudge = None;
            self.gone = Some(target.clone());
        }
    }

    /// Notes that it is nudged at `now`, unless a call of its is open (then it is not to be);
    /// whether it may be.
    pub fn nudged(&mut self, now: Instant) -> bool {
        if self.open_calls > 0 {
            return false;
        }
        self.last_nudge = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::alice;
    use super::*;

    fn lead() -> LeadState {
        LeadState::new(alice())
    }

    #[test]
    fn a_lead_with_a_call_open_listens_for_its_workers_and_is_not_nudged() {
        let mut l = lead();
        let w = Gid::mint();
        l.call_opened(Some(w));
        l.call_opened(None);
        assert_eq!(l.open_calls(), 2);
        assert_eq!(l.listening(), [Some(w), None]);
        assert!(!l.nudged(Instant::now()));
        assert_eq!(l.last_nudge(), None);
        l.call_closed(Some(w));
        assert_eq!(l.listening(), [None]);
        l.call_closed(None);
        l.call_closed(None);
        assert_eq!((l.open_calls(), l.listening().len()), (0, 0));
        let at = Instant::now();
        assert!(l.nudged(at));
        assert_eq!(l.last_nudge(), Some(at));
    }

    #[test]
    fn where_to_nudge_is_kept_from_the_last_call_that_says_and_forgotten_once_gone() {
        let mut l = lead();
        let here = NudgeTarget {
            pane: "%1".into(),
            socket: Some("/tmp/tmux-0/default".into()),
            server: Some(40),
        };
        assert!(l.called_in(Some(here.clone()), 5), "a first pane is news");
        assert!(!l.called_in(None, 7));
        assert!(
            !l.called_in(Some(here.clone()), 8),
            "the same pane again is not"
        );
        assert_eq!((l.nudge_target(), l.last_seen_ms()), (Some(&here), Some(8)));
        let other = NudgeTarget {
            pane: "%2".into(),
            socket: None,
            server: None,
        };
        l.nudge_target_gone(&other);
        assert_eq!(l.nudge_target(), Some(&here));
        l.nudge_target_gone(&here);
        assert_eq!(l.nudge_target(), None);
        assert!(
            !l.called_in(Some(here.clone()), 9),
            "the pane just found gone, named again, is no news (fleetd may not reach it)"
        );
        assert_eq!(
            l.nudge_target(),
            Some(&here),
            "it is tried again all the same"
        );
        assert!(l.called_in(Some(other.clone()), 10), "another pane is news");
        assert_eq!(l.nudge_target(), Some(&other));
    }
}
