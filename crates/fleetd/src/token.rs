//! Bearer tokens: 256 random bits, shown once to their owner, kept by the daemon only as a
//! SHA-256 hash.

use fleet_core::Gid;
use fleet_store::Store;
use sha2::{Digest, Sha256};

use std::path::Path;

use crate::state::write_private;

/// Every token starts with this, so a leaked one is recognisable in logs and scanners.
pub const TOKEN_PREFIX: &str = "fleet_";

/// A fresh random token.
pub fn mint() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

/// The hash the daemon stores and compares.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The token of `gid` (a lead's, or an operator's: see [`Gid::of_operator`]) kept in the file
/// at `path`: read from it, or minted (and its hash recorded) on first use or with `rotate`,
/// which makes the old token stop working at once.
pub fn token_in(store: &dyn Store, path: &Path, gid: Gid, rotate: bool) -> anyhow::Result<String> {
    if !rotate && let Ok(existing) = std::fs::read_to_string(path) {
        let existing = existing.trim().to_string();
        if store.gid_for_token(&hash(&existing))? == Some(gid) {
            return Ok(existing);
        }
    }
    let token = mint()?;
    write_private(path, &format!("{token}\n"))?;
    store.put_token(gid, &hash(&token), true)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateDir;
    use fleet_store::SqliteStore;

    #[test]
    fn tokens_are_random_and_prefixed() {
        let a = mint().unwrap();
        let b = mint().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        assert_ne!(hash(&a), hash(&b));
    }

    #[test]
    fn a_lead_token_is_stable_until_rotated() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::resolve(Some(tmp.path()), None).unwrap();
        dir.prepare().unwrap();
        let store = SqliteStore::open(&dir.db_path()).unwrap();
        let gid = store.ensure_lead("alice", "h", &[]).unwrap();
        let path = dir.lead_token_path("alice");
        let first = token_in(&store, &path, gid, false).unwrap();
        assert_eq!(token_in(&store, &path, gid, false).unwrap(), first);
        let rotated = token_in(&store, &path, gid, true).unwrap();
        assert_ne!(rotated, first);
        assert_eq!(store.gid_for_token(&hash(&first)).unwrap(), None);
        assert_eq!(store.gid_for_token(&hash(&rotated)).unwrap(), Some(gid));
    }
}
