//! The gateway's identity: an Ed25519 key pair kept in the state dir (`gateway.key`, the
//! 32-byte secret seed, readable by the user only), made at first use. Other gateways pin its
//! public key (`fleetd key` prints it); the gateway signs what it publishes with it
//! (`fleet_core::signing`). The secret is never logged or printed.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use fleet_core::signing::{fingerprint, key_text};

use crate::state::StateDir;

/// The key file's name in the state dir.
const KEY_FILE: &str = "gateway.key";

/// Why the gateway's key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or made.
    #[error("cannot {what} the gateway key {}: {source}", path.display())]
    Io {
        /// What was tried.
        what: &'static str,
        /// The key file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The file is not a key this build wrote.
    #[error("the gateway key {} holds {len} bytes, not a 32-byte Ed25519 seed: restore it from a backup, or remove it to make a new key (every host that pinned the old one must then pin the new one)", path.display())]
    Malformed {
        /// The key file.
        path: PathBuf,
        /// How long it is.
        len: u64,
    },
    /// Someone else could read (or replace) the secret.
    #[error("the gateway key {} is {why}: the secret must be the user's alone (chmod 600, owned by this user)", path.display())]
    Exposed {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// The gateway's key pair.
pub struct GatewayKey {
    secret: SigningKey,
}

impl std::fmt::Debug for GatewayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("GatewayKey")
            .field("public", &self.public_text())
            .finish()
    }
}

impl GatewayKey {
    /// The key in `state`'s dir, made there (from the system's random source) if there is none
    /// yet. Returns it, and whether it was made now.
    pub fn load_or_create(state: &StateDir) -> Result<(GatewayKey, bool), KeyError> {
        let path = state.root().join(KEY_FILE);
        match fs::symlink_metadata(&path) {
            Ok(_) => Ok((Self::load(&path)?, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Self::create(&path)?, true)),
            Err(source) => Err(KeyError::Io {
                what: "look at",
                path,
                source,
            }),
        }
    }

    fn load(path: &Path) -> Result<GatewayKey, KeyError> {
        let io = |what| {
            move |source| KeyError::Io {
                what,
                path: path.to_path_buf(),
                source,
            }
        };
        let meta = fs::symlink_metadata(path).map_err(io("look at"))?;
        if let Some(why) = exposure(&meta, rustix::process::getuid().as_raw()) {
            return Err(KeyError::Exposed {
                path: path.to_path_buf(),
                why,
            });
        }
        let malformed = || KeyError::Malformed {
            path: path.to_path_buf(),
            len: meta.len(),
        };
        if meta.len() != 32 {
            return Err(malformed());
        }
        let bytes = fs::read(path).map_err(io("read"))?;
        let seed: [u8; 32] = bytes.try_into().map_err(|_| malformed())?;
        Ok(GatewayKey {
            secret: SigningKey::from_bytes(&seed),
        })
    }

    fn create(path: &Path) -> Result<GatewayKey, KeyError> {
        let io = |what| {
            move |source| KeyError::Io {
                what,
                path: path.to_path_buf(),
                source,
            }
        };
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| KeyError::Io {
            what: "make (no random source)",
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
        // Made whole under another name, then moved into place without replacing anything: two
        // starts at once keep one key, and a crash leaves no half-written one.
        let tmp = path.with_extension("key.new");
        let _ = fs::remove_file(&tmp);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("make"))?;
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(io("make"))?;
        file.write_all(&seed).map_err(io("write"))?;
        file.sync_all().map_err(io("write"))?;
        drop(file);
        let placed = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match placed {
            Ok(()) => Ok(GatewayKey {
                secret: SigningKey::from_bytes(&seed),
            }),
            // Another start made one first: that one is the key.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Self::load(path),
            Err(source) => Err(KeyError::Io {
                what: "make",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// The key pair, for signing what this gateway publishes.
    pub fn signing_key(&self) -> SigningKey {
        self.secret.clone()
    }

    /// The public key as other hosts pin it (`ed25519:<base64>`).
    pub fn public_text(&self) -> String {
        key_text(&self.secret.verifying_key())
    }

    /// The public key's short fingerprint (the `keyId` of what this gateway signs).
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.secret.verifying_key())
    }
}

/// What is wrong with a key file's metadata for user `uid`, if anything: it must be a plain
/// file of this user's that nobody else may read or write.
fn exposure(meta: &fs::Metadata, uid: u32) -> Option<String> {
    if !meta.file_type().is_file() {
        return Some("not a plain file (a symlink or something else)".into());
    }
    if meta.uid() != uid {
        return Some(format!(
            "owned by uid {}, not this user ({uid})",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o777;
    (mode & 0o077 != 0).then(|| format!("open to others (mode {mode:o})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> (tempfile::TempDir, StateDir) {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::resolve(Some(&tmp.path().join("state")), None).unwrap();
        state.prepare().unwrap();
        (tmp, state)
    }

    #[test]
    fn a_key_is_made_once_user_only_and_kept() {
        let (_tmp, state) = state();
        let (first, made) = GatewayKey::load_or_create(&state).unwrap();
        assert!(made);
        let path = state.root().join(KEY_FILE);
        let meta = fs::metadata(&path).unwrap();
        assert_eq!((meta.len(), meta.mode() & 0o777), (32, 0o600));
        let (again, made) = GatewayKey::load_or_create(&state).unwrap();
        assert!(!made);
        assert_eq!(again.public_text(), first.public_text());
        assert!(first.public_text().starts_with("ed25519:"));
        assert_eq!(first.fingerprint().len(), 16);
        // The secret never shows in a debug print.
        let shown = format!("{first:?}");
        let secret = first.secret.to_bytes();
        let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, secret);
        assert!(!shown.contains(&b64), "{shown}");
    }

    #[test]
    fn a_key_others_can_read_or_of_the_wrong_size_is_refused_by_name() {
        let (_tmp, state) = state();
        GatewayKey::load_or_create(&state).unwrap();
        let path = state.root().join(KEY_FILE);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = GatewayKey::load_or_create(&state).unwrap_err().to_string();
        assert!(
            err.contains("mode 644") && err.contains("gateway.key"),
            "{err}"
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, b"short").unwrap();
        let err = GatewayKey::load_or_create(&state).unwrap_err().to_string();
        assert!(err.contains("holds 5 bytes"), "{err}");
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        let err = GatewayKey::load_or_create(&state).unwrap_err().to_string();
        assert!(err.contains("not a plain file"), "{err}");
    }
}
