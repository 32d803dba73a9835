//! Per-entity inbox versions: bumped whenever something is held for the entity, so that a
//! long-poll or a blocked send waiting on it wakes and looks.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use fleet_core::Gid;
use tokio::sync::watch;

/// Every entity's inbox version, by gid.
#[derive(Default)]
pub(super) struct Inboxes(Mutex<HashMap<Gid, watch::Sender<u64>>>);

impl Inboxes {
    fn versions(&self) -> MutexGuard<'_, HashMap<Gid, watch::Sender<u64>>> {
        // A map of senders holds no invariant a panic half-way could break.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A receiver that sees every later change of `gid`'s inbox.
    pub(super) fn watch(&self, gid: Gid) -> watch::Receiver<u64> {
        self.versions()
            .entry(gid)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Tells everyone waiting on `gid`'s inbox to look again.
    pub(super) fn bump(&self, gid: Gid) {
        if let Some(tx) = self.versions().get(&gid) {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// Drops the inbox of an entity that is gone: anyone still watching it sees it close and
    /// stops waiting.
    pub(super) fn forget(&self, gid: Gid) {
        self.versions().remove(&gid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bump_reaches_the_watchers_of_that_inbox_only_and_a_forgotten_one_closes() {
        let inboxes = Inboxes::default();
        let (a, b) = (Gid::mint(), Gid::mint());
        let mut on_a = inboxes.watch(a);
        let on_b = inboxes.watch(b);
        inboxes.bump(a);
        assert!(on_a.has_changed().unwrap_or(false));
        assert!(!on_b.has_changed().unwrap_or(true));
        on_a.mark_unchanged();
        inboxes.forget(a);
        assert!(on_a.has_changed().is_err(), "a forgotten inbox closes");
        inboxes.bump(b);
        assert!(on_b.has_changed().unwrap_or(false));
        // A bump of an inbox nobody watches is nothing.
        inboxes.bump(Gid::mint());
    }
}
