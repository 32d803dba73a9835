//! What one caller may hold open at the MCP front: long calls per caller
//! (`gateway.max_long_calls_per_caller`), event streams per token
//! (`gateway.max_streams_per_token`) and sessions of the older protocol per token
//! (`gateway.max_sessions_per_token`). The rules are `fleet_core::bounds`' (`admit`,
//! `sessions_to_close`); this module only counts, gives a place back when a call, stream or
//! session ends, and closes the sessions the rule names. It never refuses what it already let
//! in, and it never closes a session with a call in flight.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use fleet_core::bounds::{Full, LONG_CALLS_KEY, SessionUse, admit, sessions_to_close};
use fleet_core::{ErrorCode, FleetError, Gid};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};
use tokio_util::sync::CancellationToken;

/// Places counted per key (a caller, a token), at most `cap` each.
pub struct Slots<K: Hash + Eq + Clone> {
    /// The most one key may hold.
    cap: usize,
    /// The config key that sets the cap.
    key: &'static str,
    /// Places held per key; a key with none has no entry.
    open: Mutex<HashMap<K, usize>>,
}

/// One place, given back when dropped (the call returned, the stream closed).
pub struct Slot<K: Hash + Eq + Clone> {
    slots: Arc<Slots<K>>,
    held_by: K,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Counts only: nothing a panic half-way could leave inconsistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<K: Hash + Eq + Clone> Slots<K> {
    /// Places for at most `cap` per key, the cap set by config key `key`.
    fn with(cap: usize, key: &'static str) -> Arc<Self> {
        Arc::new(Self {
            cap,
            key,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for `held_by`, or the cap it is at.
    pub fn take(self: &Arc<Self>, held_by: K) -> Result<Slot<K>, Full> {
        let mut open = lock(&self.open);
        let count = open.get(&held_by).copied().unwrap_or(0);
        admit(count, self.cap, self.key)?;
        open.insert(held_by.clone(), count + 1);
        Ok(Slot {
            slots: Arc::clone(self),
            held_by,
        })
    }

    #[cfg(test)]
    fn held(&self, by: &K) -> usize {
        lock(&self.open).get(by).copied().unwrap_or(0)
    }
}

impl<K: Hash + Eq + Clone> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut open = lock(&self.slots.open);
        if let Some(count) = open.get_mut(&self.held_by) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.held_by);
            }
        }
    }
}

/// The long calls each caller has open.
pub struct CallSlots(Arc<Slots<Gid>>);

/// One open long call's place, given back when dropped (the call returned, failed or was
/// cancelled).
pub type CallSlot = Slot<Gid>;

impl CallSlots {
    /// Slots for at most `cap` long calls per caller.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self(Slots::with(cap, LONG_CALLS_KEY)))
    }

    /// A place for a long call of `gid` (`tool`), or `too_many` naming the cap.
    pub fn take(&self, gid: Gid, tool: &str) -> Result<CallSlot, FleetError> {
        self.0.take(gid).map_err(|full| {
            FleetError::new(
                ErrorCode::TooMany,
                format!(
                    "{tool} was not started: you already have {} long calls open (fleet_send or fleet_poll with a wait, fleet_ask, fleet_spawn), the most allowed ({full}); wait for one to return, or send with wait_s: 0 and collect the answers with fleet_poll",
                    full.count
                ),
            )
        })
    }
}

/// The hash of the bearer token a request was authenticated with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenHash(pub [u8; 32]);

/// The event streams (`/api/v1/events`, MCP's listening GET stream) each token holds open, at
/// most `cap` each: one more ends the token's oldest, which may well be a stream whose client
/// is gone (a closed laptop's), and a client whose stream ended opens another.
pub struct StreamSlots {
    /// The most one token may hold.
    cap: usize,
    /// Each token's open streams, oldest first, with what ends each; and the next number.
    open: Mutex<(HashMap<TokenHash, OpenStreams>, u64)>,
}

/// One token's open streams, oldest first: each one's number, and what ends it.
type OpenStreams = VecDeque<(u64, CancellationToken)>;

/// One open stream's place: its stream ends when `ended` is cancelled (a newer stream of its
/// token took its place); given back when dropped.
pub struct StreamSlot {
    slots: Arc<StreamSlots>,
    token: TokenHash,
    id: u64,
    /// Cancelled when the stream must end.
    pub ended: CancellationToken,
}

impl StreamSlots {
    /// Slots for at most `cap` streams per token (at least one).
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            open: Mutex::new((HashMap::new(), 0)),
        })
    }

    /// A place for one more stream of `token`, ending the token's oldest if it holds the cap.
    pub fn take(self: &Arc<Self>, token: TokenHash) -> StreamSlot {
        let mut open = lock(&self.open);
        let (streams, next) = &mut *open;
        let id = *next;
        *next += 1;
        let held = streams.entry(token).or_default();
        while held.len() >= self.cap {
            if let Some((_, oldest)) = held.pop_front() {
                oldest.cancel();
            }
        }
        let ended = CancellationToken::new();
        held.push_back((id, ended.clone()));
        StreamSlot {
            slots: Arc::clone(self),
            token,
            id,
            ended,
        }
    }

    #[cfg(test)]
    fn held(&self, token: &TokenHash) -> usize {
        lock(&self.open).0.get(token).map_or(0, VecDeque::len)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = lock(&self.slots.open);
        if let Some(held) = open.0.get_mut(&self.token) {
            held.retain(|(id, _)| *id != self.id);
            if held.is_empty() {
                open.0.remove(&self.token);
            }
        }
    }
}

/// Whether a request on an MCP session is a call in flight (the session is busy while it
/// lasts): a POST, or a GET resuming a call's own stream — its `Last-Event-ID` names the call's
/// request (`index/request`); one naming only an index resumes the session's listening stream,
/// which a merely listening client holds open.
pub fn is_a_call(post: bool, last_event_id: Option<&str>) -> bool {
    post || last_event_id.is_some_and(|id| id.trim().contains('/'))
}

/// A live MCP session as the ledger knows it.
struct Held {
    /// The token that opened it: no other may use it.
    token: TokenHash,
    /// When it was last used (the ledger's own clock).
    last_used: u64,
    /// Calls in flight on it (see [`is_a_call`]).
    open: usize,
    /// It is being closed to make room: no request may start on it.
    closing: bool,
}

/// The live MCP sessions opened with each token (a token, not its entity: a recycled worker's
/// new token is not held to what its old program left lingering), when each was last used and
/// whether a call is in flight on it. rmcp's session manager knows which sessions still live (a
/// session ends by DELETE, by its idle timeout, at shutdown, or closed here): the ledger asks it
/// rather than following every end.
pub struct SessionLedger {
    /// The most live sessions one token may hold.
    cap: usize,
    /// The sessions themselves.
    manager: Arc<LocalSessionManager>,
    /// Every session opened, by id, and the ledger's clock; never held across an await.
    sessions: Mutex<(HashMap<SessionId, Held>, u64)>,
    /// Held across an opening's look at the manager, so two openings at once cannot both take
    /// the last place.
    opening: tokio::sync::Mutex<()>,
}

/// A request in flight on a session: while it lives (the response's body with it), the session
/// is busy; when it ends, the session was just used.
pub struct InFlight {
    ledger: Arc<SessionLedger>,
    id: SessionId,
    /// Whether it is a call (counted as open while it lives).
    busy: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut sessions = lock(&self.ledger.sessions);
        let (held, clock) = &mut *sessions;
        *clock += 1;
        if let Some(session) = held.get_mut(&self.id) {
            session.open = session.open.saturating_sub(usize::from(self.busy));
            session.last_used = *clock;
        }
    }
}

/// Why a request may not use the session it names: another token opened it, or it is being
/// closed.
#[derive(Debug, PartialEq, Eq)]
pub struct NotYours;

impl SessionLedger {
    /// A ledger of `manager`'s sessions, at most `cap` per token.
    pub fn new(cap: usize, manager: Arc<LocalSessionManager>) -> Arc<Self> {
        Arc::new(Self {
            cap,
            manager,
            sessions: Mutex::new((HashMap::new(), 0)),
            opening: tokio::sync::Mutex::new(()),
        })
    }

    /// Notes a request of `token` on session `id` — a call (`busy`: the session is busy until
    /// the returned guard drops) or a client listening for what the server may send (not
    /// busy: a client that is only listening is idle) — refused when another token opened the
    /// session. A session the ledger does not know (ended, or never opened) is the session
    /// manager's to refuse.
    pub fn using(
        self: &Arc<Self>,
        token: TokenHash,
        id: SessionId,
        busy: bool,
    ) -> Result<InFlight, NotYours> {
        let mut sessions = lock(&self.sessions);
        let (held, clock) = &mut *sessions;
        *clock += 1;
        if let Some(session) = held.get_mut(&id) {
            // Another token's, or one being closed (a call started now would be cut).
            if session.token != token || session.closing {
                return Err(NotYours);
            }
            session.open += usize::from(busy);
            session.last_used = *clock;
        }
        Ok(InFlight {
            ledger: Arc::clone(self),
            id,
            busy,
        })
    }

    /// Notes that session `id` was opened with `token`. If the token already held as many live
    /// sessions as the cap, its least recently used ones with no call in flight are closed to
    /// make room; if every one has a call in flight, the new one is closed again and the cap is
    /// the answer. Returns how many were closed.
    pub async fn opened(&self, token: TokenHash, id: SessionId) -> Result<usize, Full> {
        let _opening = self.opening.lock().await;
        // Forget the sessions that ended, every token's (a revoked one's would linger).
        let known: Vec<SessionId> = lock(&self.sessions).0.keys().cloned().collect();
        let mut ended = Vec::new();
        for known in known {
            if !self.manager.has_session(&known).await.unwrap_or(false) {
                ended.push(known);
            }
        }
        let close = {
            let mut sessions = lock(&self.sessions);
            let (held, clock) = &mut *sessions;
            for gone in &ended {
                held.remove(gone);
            }
            let mine: Vec<(&SessionId, &Held)> = held
                .iter()
                .filter(|(_, s)| s.token == token && !s.closing)
                .collect();
            let uses: Vec<SessionUse> = mine
                .iter()
                .map(|(_, s)| SessionUse {
                    last_used: s.last_used,
                    busy: s.open > 0,
                })
                .collect();
            match sessions_to_close(&uses, self.cap) {
                Ok(close) => {
                    let close: Vec<SessionId> =
                        close.into_iter().map(|i| mine[i].0.clone()).collect();
                    for closing in &close {
                        if let Some(session) = held.get_mut(closing) {
                            session.closing = true;
                        }
                    }
                    *clock += 1;
                    held.insert(
                        id.clone(),
                        Held {
                            token,
                            last_used: *clock,
                            open: 0,
                            closing: false,
                        },
                    );
                    Ok(close)
                }
                Err(full) => Err(full),
            }
        };
        let close = match close {
            Ok(close) => close,
            Err(full) => {
                self.close(&id).await;
                return Err(full);
            }
        };
        for closed in &close {
            self.close(closed).await;
            lock(&self.sessions).0.remove(closed);
        }
        Ok(close.len())
    }

    async fn close(&self, id: &SessionId) {
        if let Err(e) = self.manager.close_session(id).await {
            tracing::warn!(error = %e, "cannot close an MCP session");
        }
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
        assert_eq!(slots.0.held(&me), 0, "an idle caller is forgotten");
    }

    #[test]
    fn a_token_over_its_streams_ends_its_oldest_and_a_closed_one_gives_its_place_back() {
        let slots = StreamSlots::new(2);
        let (mine, theirs) = (TokenHash([1; 32]), TokenHash([2; 32]));
        let first = slots.take(mine);
        let second = slots.take(mine);
        let third = slots.take(mine);
        assert!(first.ended.is_cancelled(), "the oldest goes");
        assert!(!second.ended.is_cancelled() && !third.ended.is_cancelled());
        assert_eq!(slots.held(&mine), 2);
        // Another token's streams are its own.
        let other = slots.take(theirs);
        assert!(!other.ended.is_cancelled() && !second.ended.is_cancelled());
        drop(first);
        assert_eq!(
            slots.held(&mine),
            2,
            "an ended stream's place was given already"
        );
        drop(second);
        assert_eq!(slots.held(&mine), 1);
        let fourth = slots.take(mine);
        assert!(!third.ended.is_cancelled() && !fourth.ended.is_cancelled());
    }

    #[test]
    fn a_post_or_a_resumed_calls_stream_is_a_call_a_listening_stream_is_not() {
        assert!(is_a_call(true, None));
        assert!(is_a_call(false, Some("3/7")));
        assert!(is_a_call(false, Some(" 0/\"abc\" ")));
        // rmcp primes a listening stream with the event id 0: a reconnect names it.
        assert!(!is_a_call(false, Some("0")));
        assert!(!is_a_call(false, Some("12")));
        assert!(!is_a_call(false, None));
    }

    #[test]
    fn a_session_is_used_only_with_the_token_that_opened_it() {
        let ledger = SessionLedger::new(2, Arc::new(LocalSessionManager::default()));
        let (mine, theirs) = (TokenHash([1; 32]), TokenHash([2; 32]));
        let id: SessionId = "s1".into();
        lock(&ledger.sessions).0.insert(
            id.clone(),
            Held {
                token: mine,
                last_used: 0,
                open: 0,
                closing: false,
            },
        );
        let busy = ledger.using(mine, id.clone(), true).unwrap();
        let listening = ledger.using(mine, id.clone(), false).unwrap();
        assert!(matches!(
            ledger.using(theirs, id.clone(), false),
            Err(NotYours)
        ));
        assert_eq!(lock(&ledger.sessions).0[&id].open, 1);
        drop(listening);
        assert_eq!(lock(&ledger.sessions).0[&id].open, 1);
        drop(busy);
        let (open, last_used) = {
            let sessions = lock(&ledger.sessions);
            (sessions.0[&id].open, sessions.0[&id].last_used)
        };
        assert_eq!(open, 0);
        assert!(last_used > 0, "the end of a request is a use");
        // One the ledger never saw is the session manager's to refuse.
        assert!(ledger.using(theirs, "unknown".into(), true).is_ok());
        // One being closed takes no new request, even its owner's.
        lock(&ledger.sessions).0.get_mut(&id).unwrap().closing = true;
        assert!(matches!(
            ledger.using(mine, id.clone(), true),
            Err(NotYours)
        ));
    }
}
