//! The web view's sign-in: a lead (or an operator) pastes its token once and gets a session
//! made of two secrets, both random and kept here only as hashes:
//!
//! - a cookie (`HttpOnly`, `SameSite=Strict`), which no script can read;
//! - a key, given once in the sign-in's answer to the page that signed in, which keeps it in
//!   its own storage and sends it back in [`KEY_HEADER`] with every request, read or action.
//!
//! Neither opens anything alone. Browsers send a cookie to every port of a host, so a program
//! listening on another loopback port that the user is led to open gets the cookie; it never
//! gets the key (a page's storage is its own origin's, port included, and nothing hands the key
//! out again). A page of another site can neither read the key nor send the header without a
//! CORS preflight fleetd never answers, which is also what keeps it from signing the browser in
//! (the sign-in takes JSON only).
//!
//! A session stands for the token it was opened with, checked again at every request (so
//! rotating the token ends it), lasts at most [`SESSION_LIFE`], and lives only in this
//! process's memory: a restart signs everyone out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::token;

/// The cookie's name.
pub const COOKIE: &str = "fleetd_session";
/// The header a page sends its session key in.
pub const KEY_HEADER: &str = "x-fleet-session-key";
/// How long a session lasts after sign-in.
pub const SESSION_LIFE: Duration = Duration::from_secs(12 * 3600);
/// The most sessions one token keeps at once; its oldest goes to make room.
pub const MAX_SESSIONS_PER_TOKEN: usize = 8;
/// The most sessions kept at once; the oldest goes to make room.
pub const MAX_SESSIONS: usize = 64;

/// One signed-in browser.
#[derive(Clone, Debug)]
pub struct WebSession {
    /// The hash of the token it was opened with (checked again at every request, so a rotated
    /// token ends it).
    pub token_hash: [u8; 32],
    /// The hash of the key the page sends with every request.
    key_hash: [u8; 32],
    /// When it was opened.
    pub opened: Instant,
}

/// The sessions of this process, by the hash of their cookie.
#[derive(Debug, Default)]
pub struct WebSessions {
    sessions: Mutex<HashMap<[u8; 32], WebSession>>,
}

/// A fresh session's secrets, given out once.
pub struct Opened {
    /// The cookie's value.
    pub cookie: String,
    /// The key the page must send with every request.
    pub key: String,
}

/// Why a request's session does not open anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No such session (never was, signed out, expired, or fleetd restarted).
    Ended,
    /// The cookie is a session's, the key is not (missing, or another's).
    WrongKey,
}

impl WebSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], WebSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens a session for the token hashing to `token_hash`, at `now`. Past its token's cap
    /// the token's own oldest session goes, past the cap of all the oldest of all: a token
    /// cannot push out more than its own.
    pub fn open(&self, token_hash: [u8; 32], now: Instant) -> Result<Opened, getrandom::Error> {
        let opened = Opened {
            cookie: token::mint()?,
            key: token::mint()?,
        };
        let mut sessions = self.lock();
        sessions.retain(|_, s| live(s, now));
        let oldest = |sessions: &HashMap<[u8; 32], WebSession>, of: Option<[u8; 32]>| {
            sessions
                .iter()
                .filter(|(_, s)| of.is_none_or(|hash| s.token_hash == hash))
                .min_by_key(|(_, s)| s.opened)
                .map(|(cookie, _)| *cookie)
        };
        let own = |sessions: &HashMap<[u8; 32], WebSession>| {
            sessions
                .values()
                .filter(|s| s.token_hash == token_hash)
                .count()
        };
        while own(&sessions) >= MAX_SESSIONS_PER_TOKEN {
            let Some(cookie) = oldest(&sessions, Some(token_hash)) else {
                break;
            };
            sessions.remove(&cookie);
        }
        while sessions.len() >= MAX_SESSIONS {
            let Some(cookie) = oldest(&sessions, None) else {
                break;
            };
            sessions.remove(&cookie);
        }
        sessions.insert(
            token::hash(&opened.cookie),
            WebSession {
                token_hash,
                key_hash: token::hash(&opened.key),
                opened: now,
            },
        );
        Ok(opened)
    }

    /// The live session whose cookie is `cookie`, if `key` is its key, at `now`.
    pub fn find(
        &self,
        cookie: &str,
        key: Option<&str>,
        now: Instant,
    ) -> Result<WebSession, Refused> {
        let cookie = token::hash(cookie);
        let mut sessions = self.lock();
        let session = match sessions.get(&cookie) {
            Some(session) if live(session, now) => session.clone(),
            Some(_) => {
                sessions.remove(&cookie);
                return Err(Refused::Ended);
            }
            None => return Err(Refused::Ended),
        };
        let given = key.map(token::hash);
        match given {
            Some(given) if same(&given, &session.key_hash) => Ok(session),
            _ => Err(Refused::WrongKey),
        }
    }

    /// The live session among `cookies` whose key is `key`, and its cookie: a browser may
    /// send several of one name (one more set by a program on another port of the host must
    /// not lock the user out).
    pub fn find_any(
        &self,
        cookies: &[String],
        key: Option<&str>,
        now: Instant,
    ) -> Result<(String, WebSession), Refused> {
        let mut refused = Refused::Ended;
        for cookie in cookies {
            match self.find(cookie, key, now) {
                Ok(session) => return Ok((cookie.clone(), session)),
                Err(Refused::WrongKey) => refused = Refused::WrongKey,
                Err(Refused::Ended) => {}
            }
        }
        Err(refused)
    }

    /// Ends the session whose cookie is `cookie` (nothing if there is none).
    pub fn close(&self, cookie: &str) {
        self.lock().remove(&token::hash(cookie));
    }
}

/// Whether `session` still lives at `now`.
fn live(session: &WebSession, now: Instant) -> bool {
    now.saturating_duration_since(session.opened) < SESSION_LIFE
}

/// Whether two hashes are the same, looking at every byte either way.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// Every value of cookie `name` in a `Cookie` header, in the order sent.
pub fn cookie_values<'a>(header: &'a str, name: &str) -> Vec<&'a str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
        .filter(|value| !value.is_empty())
        .collect()
}

/// The `Set-Cookie` header that gives a browser `value`: only over HTTP requests to this host
/// (`HttpOnly`: no script reads it; `SameSite=Strict`: no other site's page sends it), for the
/// session's life.
pub fn set_cookie(value: &str) -> String {
    format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_LIFE.as_secs()
    )
}

/// The `Set-Cookie` header that makes a browser forget its session.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_opens_only_with_its_cookie_and_its_key_until_it_ends() {
        let sessions = WebSessions::default();
        let start = Instant::now();
        let opened = sessions.open([7; 32], start).unwrap();
        assert!(opened.cookie.len() > 40 && opened.key != opened.cookie);
        let key = Some(opened.key.as_str());
        let found = sessions.find(&opened.cookie, key, start).unwrap();
        assert_eq!(found.token_hash, [7; 32]);
        // The cookie alone (what another port's listener gets) opens nothing.
        assert_eq!(
            sessions.find(&opened.cookie, None, start).unwrap_err(),
            Refused::WrongKey
        );
        assert_eq!(
            sessions
                .find(&opened.cookie, Some(&opened.cookie), start)
                .unwrap_err(),
            Refused::WrongKey
        );
        assert_eq!(
            sessions.find("fleet_guess", key, start).unwrap_err(),
            Refused::Ended
        );
        assert_eq!(
            sessions
                .find(&opened.cookie, key, start + SESSION_LIFE)
                .unwrap_err(),
            Refused::Ended
        );
        // Expired is gone for good.
        assert!(sessions.find(&opened.cookie, key, start).is_err());
        let again = sessions.open([7; 32], start).unwrap();
        sessions.close(&again.cookie);
        assert!(
            sessions
                .find(&again.cookie, Some(&again.key), start)
                .is_err()
        );
    }

    #[test]
    fn a_planted_cookie_beside_the_real_one_locks_nobody_out() {
        let sessions = WebSessions::default();
        let now = Instant::now();
        let opened = sessions.open([3; 32], now).unwrap();
        let sent = ["fleet_planted".to_string(), opened.cookie.clone()];
        let (cookie, _) = sessions.find_any(&sent, Some(&opened.key), now).unwrap();
        assert_eq!(cookie, opened.cookie);
        assert_eq!(
            sessions.find_any(&sent, None, now).unwrap_err(),
            Refused::WrongKey
        );
        assert_eq!(
            sessions
                .find_any(&sent[..1], Some(&opened.key), now)
                .unwrap_err(),
            Refused::Ended
        );
    }

    #[test]
    fn a_token_pushes_out_only_its_own_sessions_and_all_are_capped() {
        let sessions = WebSessions::default();
        let start = Instant::now();
        let at = |i: usize| start + Duration::from_secs(u64::try_from(i).unwrap());
        let lead = sessions.open([1; 32], at(0)).unwrap();
        // A flood from another token: it replaces its own, never the lead's.
        let mut flood = Vec::new();
        for i in 1..=3 * MAX_SESSIONS_PER_TOKEN {
            flood.push(sessions.open([2; 32], at(i)).unwrap());
        }
        let now = at(1000);
        assert!(sessions.find(&lead.cookie, Some(&lead.key), now).is_ok());
        let live = flood
            .iter()
            .filter(|o| sessions.find(&o.cookie, Some(&o.key), now).is_ok())
            .count();
        assert_eq!(live, MAX_SESSIONS_PER_TOKEN);
        let newest = flood.last().unwrap();
        assert!(
            sessions
                .find(&newest.cookie, Some(&newest.key), now)
                .is_ok()
        );
        // Many tokens: the oldest of all goes past the overall cap.
        for i in 0..MAX_SESSIONS {
            let hash = [u8::try_from(10 + i % 200).unwrap(); 32];
            sessions.open(hash, at(2000 + i)).unwrap();
        }
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
        assert!(sessions.find(&lead.cookie, Some(&lead.key), now).is_err());
    }

    #[test]
    fn the_cookie_is_read_from_its_header_and_set_strictly() {
        let header = "theme=dark; fleetd_session=fleet_abc ; other=1; fleetd_session=fleet_2";
        assert_eq!(cookie_values(header, COOKIE), ["fleet_abc", "fleet_2"]);
        assert!(cookie_values("fleetd_session=", COOKIE).is_empty());
        assert!(cookie_values("xfleetd_session=1", COOKIE).is_empty());
        let set = set_cookie("v");
        for part in ["fleetd_session=v", "HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(set.contains(part), "{set}");
        }
        assert!(clear_cookie().contains("Max-Age=0"));
    }
}
