//! Gateway signatures on cross-host messages (spec 10 §2.1, §10): what is signed, exactly, and
//! how a signature and a public key are written.
//!
//! **The signed bytes** ([`signed_bytes`]) are, in this order: the domain tag
//! `fleetd-envelope-sig-v1` followed by one zero byte; then each envelope field in this fixed
//! order — `v`, `kind`, `msgId`, `traceId`, `from`, `to`, `turnId`, `spawnId`, `inReplyTo`,
//! `fromName`, `fromHost`, `ts`, `expiresAt` — each as a one-byte presence flag (1 present,
//! 0 absent; an absent field ends there) then, when present, its text as a 4-byte big-endian
//! length and its UTF-8 bytes; texts are the header values as [`Envelope::encode`] writes them
//! (`ts` and `expiresAt` as decimal millisecond integers); last, the 32-byte SHA-256 of the
//! body. Every field is length-prefixed, so no two different envelopes share their bytes.
//!
//! **The signature** is Ed25519 over those bytes, written as standard base64 (with padding) in
//! the header `sig`; the signer's key is named by its fingerprint in `keyId`. **A public key**
//! is written `ed25519:<base64 of its 32 bytes>`; its **fingerprint** is the first 8 bytes of
//! the SHA-256 of those 32 bytes, in lowercase hex.
//!
//! Nothing here reads a clock or a random source: the key comes in from the gateway's key file.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::Signer;
pub use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::envelope::Envelope;

/// The domain tag the signed bytes start with (a signature for anything else never verifies).
pub const DOMAIN: &[u8] = b"fleetd-envelope-sig-v1\0";
/// The AMQP header that carries the signature.
pub const SIG_HEADER: &str = "sig";
/// The AMQP header that names the signer's key (its fingerprint).
pub const KEY_ID_HEADER: &str = "keyId";
/// How a public key's text starts.
const KEY_PREFIX: &str = "ed25519:";

/// Why a signature or a key was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SignatureError {
    /// The signature text is not base64 of 64 bytes.
    #[error("the signature is not base64 of an Ed25519 signature (64 bytes)")]
    Malformed,
    /// The signature does not match the envelope, the body and the key.
    #[error("the signature does not match the message and the key")]
    Mismatch,
    /// A public key's text is not `ed25519:<base64 of 32 bytes>` of a valid key.
    #[error("'{0}' is not a public key: write it as ed25519:<base64 of its 32 bytes>")]
    BadKey(String),
}

/// The bytes a gateway signs for `envelope` carrying `body` (see the module documentation).
pub fn signed_bytes(envelope: &Envelope, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(DOMAIN);
    let mut field = |value: Option<&str>| match value {
        Some(text) => {
            out.push(1);
            // A header value is at most a few hundred bytes (decode refuses more); a length
            // past u32 cannot be built, and would saturate rather than wrap if it were.
            let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        None => out.push(0),
    };
    field(Some(&envelope.version.to_string()));
    field(Some(envelope.kind.as_str()));
    field(Some(&envelope.msg_id.to_string()));
    field(Some(&envelope.trace_id.to_string()));
    field(Some(&envelope.from.to_string()));
    field(Some(&envelope.to));
    field(envelope.turn_id.as_deref());
    field(envelope.spawn_id.map(|g| g.to_string()).as_deref());
    field(envelope.in_reply_to.map(|m| m.to_string()).as_deref());
    field(envelope.from_name.as_deref());
    field(envelope.from_host.as_deref());
    field(Some(&envelope.ts_ms.to_string()));
    field(Some(&envelope.expires_at_ms.to_string()));
    out.extend_from_slice(&Sha256::digest(body));
    out
}

/// The signature of `envelope` carrying `body` by `key`, as the `sig` header writes it.
pub fn sign(key: &SigningKey, envelope: &Envelope, body: &[u8]) -> String {
    STANDARD.encode(key.sign(&signed_bytes(envelope, body)).to_bytes())
}

/// A signature as it travels with a message: the `sig` and `keyId` headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The signature ([`sign`]).
    pub sig: String,
    /// The signer's key fingerprint ([`fingerprint`]).
    pub key_id: String,
}

/// `envelope` carrying `body` signed by `key`, with the key named.
pub fn signature(key: &SigningKey, envelope: &Envelope, body: &[u8]) -> Signature {
    Signature {
        sig: sign(key, envelope, body),
        key_id: fingerprint(&key.verifying_key()),
    }
}

/// Checks the signature text `sig` of `envelope` carrying `body` against `key`.
pub fn verify(
    key: &VerifyingKey,
    envelope: &Envelope,
    body: &[u8],
    sig: &str,
) -> Result<(), SignatureError> {
    let bytes = STANDARD
        .decode(sig.trim())
        .map_err(|_| SignatureError::Malformed)?;
    let bytes: [u8; 64] = bytes.try_into().map_err(|_| SignatureError::Malformed)?;
    let signature = ed25519_dalek::Signature::from_bytes(&bytes);
    key.verify_strict(&signed_bytes(envelope, body), &signature)
        .map_err(|_| SignatureError::Mismatch)
}

/// A public key as a person pins it: `ed25519:<base64>`.
pub fn key_text(key: &VerifyingKey) -> String {
    format!("{KEY_PREFIX}{}", STANDARD.encode(key.as_bytes()))
}

/// Reads a public key written by [`key_text`]; the error quotes (a short, escaped part of) what
/// was given.
pub fn parse_key(text: &str) -> Result<VerifyingKey, SignatureError> {
    let bad = || {
        SignatureError::BadKey(
            text.chars()
                .take(64)
                .flat_map(char::escape_default)
                .collect(),
        )
    };
    let encoded = text.trim().strip_prefix(KEY_PREFIX).ok_or_else(bad)?;
    let bytes = STANDARD.decode(encoded).map_err(|_| bad())?;
    let bytes: [u8; 32] = bytes.try_into().map_err(|_| bad())?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| bad())
}

/// A key's short fingerprint (the `keyId` header, and what `fleetd key` shows beside the key).
pub fn fingerprint(key: &VerifyingKey) -> String {
    let digest = Sha256::digest(key.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::VERSION;
    use crate::ids::{Gid, MsgId, TraceId};
    use crate::message::Kind;
    use proptest::prelude::*;

    /// The test vectors' key: the seed 32 × 0x07.
    fn key() -> SigningKey {
        SigningKey::from_bytes(&[7; 32])
    }

    /// The test vectors' envelope, every field fixed.
    fn vector() -> Envelope {
        Envelope {
            version: VERSION,
            kind: Kind::Send,
            msg_id: "01a23120-0000-7000-8000-000000000001"
                .parse::<MsgId>()
                .unwrap(),
            trace_id: "01a23120-0000-7000-8000-000000000002"
                .parse::<TraceId>()
                .unwrap(),
            from: "01a23120-0000-7000-8000-000000000003"
                .parse::<Gid>()
                .unwrap(),
            to: "01a23120-0000-7000-8000-000000000004".into(),
            turn_id: None,
            spawn_id: None,
            in_reply_to: None,
            from_name: Some("lead".into()),
            from_host: Some("hosta".into()),
            ts_ms: 1_764_547_200_000,
            expires_at_ms: 1_764_633_600_000,
        }
    }

    /// The signature of the test vector (envelope [`vector`], body `hello`, key [`key`]),
    /// computed apart from this code: the documented bytes built by hand in Python and signed
    /// with the `cryptography` package (48.0).
    const SIGNATURE_VECTOR: &str =
        "9MbOk5Qh7j9cgs7JZnjVQXvN2WX7cVZcLq+n+Bqu5CfHCdIwRurjlOI36fMTeF8C86f/OEml3sLTzr15EmfiCQ==";
    /// The public key of [`key`], computed the same way.
    const KEY_VECTOR: &str = "ed25519:6kpsY+KcUgq+9VB7Ey7F+ZVHdq6+vnuSQh7qaRRG0iw=";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn the_signed_bytes_are_as_documented() {
        let bytes = signed_bytes(&vector(), b"hello");
        let mut expected = DOMAIN.to_vec();
        for field in [
            Some("1.0"),
            Some("SEND"),
            Some("01a23120-0000-7000-8000-000000000001"),
            Some("01a23120-0000-7000-8000-000000000002"),
            Some("01a23120-0000-7000-8000-000000000003"),
            Some("01a23120-0000-7000-8000-000000000004"),
            None,
            None,
            None,
            Some("lead"),
            Some("hosta"),
            Some("1764547200000"),
            Some("1764633600000"),
        ] {
            match field {
                Some(text) => {
                    expected.push(1);
                    expected.extend_from_slice(&u32::try_from(text.len()).unwrap().to_be_bytes());
                    expected.extend_from_slice(text.as_bytes());
                }
                None => expected.push(0),
            }
        }
        // SHA-256("hello"), the well-known value.
        expected.extend_from_slice(
            &(0..32)
                .map(|i| {
                    u8::from_str_radix(
                        &"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
                            [i * 2..i * 2 + 2],
                        16,
                    )
                    .unwrap()
                })
                .collect::<Vec<u8>>(),
        );
        assert_eq!(hex(&bytes), hex(&expected));
    }

    #[test]
    fn test_vector_signature_and_key() {
        let key = key();
        let public = key.verifying_key();
        let sig = sign(&key, &vector(), b"hello");
        // Ed25519 is deterministic: the same key, envelope and body give the same signature.
        assert_eq!(sig, sign(&key, &vector(), b"hello"));
        assert_eq!(verify(&public, &vector(), b"hello", &sig), Ok(()));
        assert_eq!(
            key_text(&public),
            format!("ed25519:{}", STANDARD.encode(public.as_bytes()))
        );
        assert_eq!(parse_key(&key_text(&public)).unwrap(), public);
        assert_eq!(fingerprint(&public), "fe812c12f3ab4ce6");
        // Pinned so a change of the signed bytes cannot pass unnoticed.
        assert_eq!(SIGNATURE_VECTOR, sig);
        assert_eq!(KEY_VECTOR, key_text(&public));
    }

    #[test]
    fn another_key_a_malformed_signature_or_a_bad_key_text_is_refused() {
        let sig = sign(&key(), &vector(), b"hello");
        let other = SigningKey::from_bytes(&[8; 32]).verifying_key();
        assert_eq!(
            verify(&other, &vector(), b"hello", &sig),
            Err(SignatureError::Mismatch)
        );
        let public = key().verifying_key();
        for bad in ["", "not base64!", "AAAA"] {
            assert_eq!(
                verify(&public, &vector(), b"hello", bad),
                Err(SignatureError::Malformed)
            );
        }
        for bad in [
            "",
            "ed25519:",
            "rsa:AAAA",
            "ed25519:AAAA",
            "ed25519:\u{1b}[31m",
        ] {
            let err = parse_key(bad).unwrap_err();
            assert!(!err.to_string().contains('\u{1b}'), "{err}");
        }
    }

    proptest! {
        // Each case signs and verifies several times: fewer cases keep the debug build quick.
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_single_bit_change_fails_verification(
            body in prop::collection::vec(any::<u8>(), 0..64),
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let key = key();
            let public = key.verifying_key();
            let sig = sign(&key, &vector(), &body);
            prop_assert_eq!(verify(&public, &vector(), &body, &sig), Ok(()));
            // A flipped bit in the signed bytes (any header field, or the body's hash input) …
            let signed = signed_bytes(&vector(), &body);
            let mut flipped = signed.clone();
            let i = at.index(flipped.len());
            flipped[i] ^= 1 << bit;
            let signature = ed25519_dalek::Signature::from_bytes(
                &STANDARD.decode(&sig).unwrap().try_into().unwrap(),
            );
            prop_assert!(public.verify_strict(&flipped, &signature).is_err());
            // … in the body itself …
            if !body.is_empty() {
                let mut changed = body.clone();
                let j = at.index(changed.len());
                changed[j] ^= 1 << bit;
                prop_assert_eq!(
                    verify(&public, &vector(), &changed, &sig),
                    Err(SignatureError::Mismatch)
                );
            }
            // … or in the signature.
            let mut raw = STANDARD.decode(&sig).unwrap();
            let k = at.index(raw.len());
            raw[k] ^= 1 << bit;
            prop_assert!(verify(&public, &vector(), &body, &STANDARD.encode(raw)).is_err());
        }

        #[test]
        fn a_change_of_any_field_changes_the_signed_bytes(name in "[a-z]{1,8}", ts in any::<u64>()) {
            let base = signed_bytes(&vector(), b"x");
            let renamed = Envelope { from_name: Some(name.clone()), ..vector() };
            prop_assert_eq!(signed_bytes(&renamed, b"x") == base, name == "lead");
            let moved = Envelope { ts_ms: ts, ..vector() };
            prop_assert_eq!(signed_bytes(&moved, b"x") == base, ts == vector().ts_ms);
            // A field moved into the neighbouring one is a different message.
            let shifted = Envelope { from_name: None, from_host: Some("lead".into()), ..vector() };
            prop_assert_ne!(signed_bytes(&shifted, b"x"), base);
        }
    }
}
