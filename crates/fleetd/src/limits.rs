//! What one caller may hold open at the MCP front: long calls per caller
//! (`gateway.max_long_calls_per_caller`) and sessions of the older protocol per token
//! (`gateway.max_sessions_per_token`). The rule is `fleet_core::bounds::admit`; this module
//! only counts, and gives a place back when a call or session ends. It never refuses what it
//! already let in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fleet_core::bounds::{Full, LONG_CALLS_KEY, SESSIONS_KEY, admit};
use fleet_core::{ErrorCode, FleetError, Gid};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};

/// The long calls each caller has open.
pub struct CallSlots {
    /// The most one caller may have open.
    cap: usize,
    /// Open calls per caller; a caller with none has no entry.
    open: Mutex<HashMap<Gid, usize>>,
}

/// One open long call's place, given back when dropped (the call returned, failed or was
/// cancelled).
pub struct CallSlot {
    slots: Arc<CallSlots>,
    gid: Gid,
}

impl CallSlots {
    /// Slots for at most `cap` long calls per caller.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Gid, usize>> {
        // A count per caller: nothing a panic half-way could leave inconsistent.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place for a long call of `gid` (`tool`), or `too_many` naming the cap.
    pub fn take(self: &Arc<Self>, gid: Gid, tool: &str) -> Result<CallSlot, FleetError> {
        let mut open = self.lock();
        let count = open.get(&gid).copied().unwrap_or(0);
        admit(count, self.cap, LONG_CALLS_KEY).map_err(|full| {
            FleetError::new(
                ErrorCode::TooMany,
                format!(
                    "{tool} was not started: you already have {} long calls open (fleet_send or fleet_poll with a wait, fleet_ask, fleet_spawn), the most allowed ({full}); wait for one to return, or send with wait_s: 0 and collect the answers with fleet_poll",
                    full.count
                ),
            )
        })?;
        open.insert(gid, count + 1);
        Ok(CallSlot {
            slots: Arc::clone(self),
            gid,
        })
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let mut open = self.slots.lock();
        if let Some(count) = open.get_mut(&self.gid) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.gid);
            }
        }
    }
}

/// The hash of the bearer token a request was authenticated with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenHash(pub [u8; 32]);

/// The live MCP sessions opened with each token (a token, not its entity: a recycled worker's
/// new token is not held to what its old program left lingering). rmcp's session manager knows
/// which sessions still live (a session ends by DELETE, by its idle timeout or at shutdown): the
/// ledger asks it rather than following every end.
pub struct SessionLedger {
    /// The most live sessions one token may hold.
    cap: usize,
    /// The sessions themselves.
    manager: Arc<LocalSessionManager>,
    /// The sessions opened with each token, ended ones forgotten at the next opening. Held
    /// across the manager's answers, so two openings at once cannot both take the last place.
    by_token: tokio::sync::Mutex<HashMap<TokenHash, Vec<SessionId>>>,
}

impl SessionLedger {
    /// A ledger of `manager`'s sessions, at most `cap` per token.
    pub fn new(cap: usize, manager: Arc<LocalSessionManager>) -> Self {
        Self {
            cap,
            manager,
            by_token: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Notes that session `id` was opened with `token`; if the token already held as many
    /// live sessions as the cap, the new one is closed again and the cap is the answer.
    pub async fn opened(&self, token: TokenHash, id: SessionId) -> Result<(), Full> {
        let mut by_token = self.by_token.lock().await;
        // Forget the sessions that ended, every token's (a revoked one's would linger).
        for ids in by_token.values_mut() {
            let mut live = Vec::with_capacity(ids.len());
            for id in ids.drain(..) {
                if self.manager.has_session(&id).await.unwrap_or(false) {
                    live.push(id);
                }
            }
            *ids = live;
        }
        by_token.retain(|_, ids| !ids.is_empty());
        let held = by_token.get(&token).map_or(0, Vec::len);
        if let Err(full) = admit(held, self.cap, SESSIONS_KEY) {
            drop(by_token);
            if let Err(e) = self.manager.close_session(&id).await {
                tracing::warn!(error = %e, "cannot close a session over the cap");
            }
            return Err(full);
        }
        by_token.entry(token).or_default().push(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_holds_at_most_the_cap_and_a_finished_call_gives_its_place_back() {
        let slots = CallSlots::new(2);
        let (me, other) = (Gid::mint(), Gid::mint());
        let first = slots.take(me, "fleet_poll").unwrap();
        let second = slots.take(me, "fleet_poll").unwrap();
        let err = slots.take(me, "fleet_ask").err().unwrap();
        assert_eq!(err.code, ErrorCode::TooMany);
        assert!(
            err.message.contains("fleet_ask")
                && err.message.contains("2 long calls")
                && err
                    .message
                    .contains("gateway.max_long_calls_per_caller = 2"),
            "{err}"
        );
        // Another caller has places of its own.
        let _theirs = slots.take(other, "fleet_send").unwrap();
        drop(first);
        let third = slots.take(me, "fleet_poll").unwrap();
        drop(third);
        drop(second);
        assert!(
            slots.lock().get(&me).is_none(),
            "an idle caller is forgotten"
        );
    }
}
