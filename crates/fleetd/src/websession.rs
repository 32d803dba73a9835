//! The web view's sign-in: a lead pastes its token once and gets a session cookie (random,
//! `HttpOnly`, `SameSite=Strict`, kept here only as a hash) that stands for that token from then
//! on, and a CSRF token the page must send back on every action. A session lives as long as
//! its token does (rotating the token ends it), at most [`SESSION_LIFE`], and only in this
//! process's memory: a restart signs everyone out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle_eq::equal;

use crate::token;

/// The cookie's name.
pub const COOKIE: &str = "fleetd_session";
/// The header a page sends its CSRF token in.
pub const CSRF_HEADER: &str = "x-fleet-csrf";
/// How long a session lasts after sign-in.
pub const SESSION_LIFE: Duration = Duration::from_secs(12 * 3600);
/// The most sessions kept at once; the oldest goes to make room.
pub const MAX_SESSIONS: usize = 64;

/// One signed-in browser.
#[derive(Clone, Debug)]
pub struct WebSession {
    /// The hash of the lead's token it was opened with (checked again at every request, so a
    /// rotated token ends it).
    pub token_hash: [u8; 32],
    /// What the page must send in [`CSRF_HEADER`] with each action.
    pub csrf: String,
    /// When it was opened.
    pub opened: Instant,
}

/// The sessions of this process, by the hash of their cookie.
#[derive(Debug, Default)]
pub struct WebSessions {
    sessions: Mutex<HashMap<[u8; 32], WebSession>>,
}

/// A fresh session: the cookie's value to give the browser, and the session kept.
pub struct Opened {
    /// The cookie's value (given once, kept only as a hash).
    pub cookie: String,
    /// The session.
    pub session: WebSession,
}

impl WebSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], WebSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens a session for the lead whose token hashes to `token_hash`, at `now`.
    pub fn open(&self, token_hash: [u8; 32], now: Instant) -> Result<Opened, getrandom::Error> {
        let cookie = token::mint()?;
        let csrf = token::mint()?;
        let session = WebSession {
            token_hash,
            csrf,
            opened: now,
        };
        let mut sessions = self.lock();
        sessions.retain(|_, s| live(s, now));
        while sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, s)| s.opened)
                .map(|(key, _)| *key);
            match oldest {
                Some(key) => sessions.remove(&key),
                None => break,
            };
        }
        sessions.insert(token::hash(&cookie), session.clone());
        Ok(Opened { cookie, session })
    }

    /// The live session whose cookie is `cookie`, at `now`.
    pub fn find(&self, cookie: &str, now: Instant) -> Option<WebSession> {
        let key = token::hash(cookie);
        let mut sessions = self.lock();
        match sessions.get(&key) {
            Some(session) if live(session, now) => Some(session.clone()),
            Some(_) => {
                sessions.remove(&key);
                None
            }
            None => None,
        }
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

/// The value of cookie `name` in a `Cookie` header, if it is there.
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
        .filter(|value| !value.is_empty())
}

/// The `Set-Cookie` header that gives a browser `value`: only over HTTP requests to this origin
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

/// Whether an action may go ahead: the CSRF token it carries is the session's.
pub fn csrf_ok(session: &WebSession, given: Option<&str>) -> bool {
    given.is_some_and(|given| equal(given.as_bytes(), session.csrf.as_bytes()))
}

/// Comparison that takes as long whatever the bytes (a CSRF token is a secret).
mod subtle_eq {
    /// Whether `a` and `b` are the same, looking at every byte either way.
    pub fn equal(a: &[u8], b: &[u8]) -> bool {
        if a.len() != b.len() {
            return false;
        }
        a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_cookie_until_it_ends_or_expires() {
        let sessions = WebSessions::default();
        let start = Instant::now();
        let opened = sessions.open([7; 32], start).unwrap();
        assert!(opened.cookie.len() > 40 && opened.session.csrf != opened.cookie);
        let found = sessions.find(&opened.cookie, start).unwrap();
        assert_eq!(found.token_hash, [7; 32]);
        assert!(sessions.find("fleet_guess", start).is_none());
        assert!(
            sessions
                .find(&opened.cookie, start + SESSION_LIFE)
                .is_none()
        );
        // Expired is gone for good.
        assert!(sessions.find(&opened.cookie, start).is_none());
        let again = sessions.open([7; 32], start).unwrap();
        sessions.close(&again.cookie);
        assert!(sessions.find(&again.cookie, start).is_none());
    }

    #[test]
    fn past_the_cap_the_oldest_session_goes() {
        let sessions = WebSessions::default();
        let start = Instant::now();
        let first = sessions.open([1; 32], start).unwrap();
        let mut last = None;
        for i in 1..=MAX_SESSIONS {
            let at = start + Duration::from_secs(u64::try_from(i).unwrap());
            last = Some(sessions.open([2; 32], at).unwrap());
        }
        let now = start + Duration::from_secs(100);
        assert!(sessions.find(&first.cookie, now).is_none());
        assert!(sessions.find(&last.unwrap().cookie, now).is_some());
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
    }

    #[test]
    fn the_cookie_is_read_from_its_header_and_set_strictly() {
        let header = "theme=dark; fleetd_session=fleet_abc ; other=1";
        assert_eq!(cookie_value(header, COOKIE), Some("fleet_abc"));
        assert_eq!(cookie_value("fleetd_session=", COOKIE), None);
        assert_eq!(cookie_value("xfleetd_session=1", COOKIE), None);
        let set = set_cookie("v");
        for part in ["fleetd_session=v", "HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(set.contains(part), "{set}");
        }
        assert!(clear_cookie().contains("Max-Age=0"));
    }

    #[test]
    fn an_action_needs_the_sessions_csrf_token() {
        let session = WebSession {
            token_hash: [0; 32],
            csrf: "fleet_csrf".into(),
            opened: Instant::now(),
        };
        assert!(csrf_ok(&session, Some("fleet_csrf")));
        assert!(!csrf_ok(&session, Some("fleet_csrg")));
        assert!(!csrf_ok(&session, Some("")));
        assert!(!csrf_ok(&session, None));
    }
}
