//! The cross-host message envelope (spec 10 §2.1) and its codec to and from AMQP headers.
//!
//! A broker hop has no connection identity, so every cross-host message carries a small envelope
//! in its AMQP headers (never a JSON wrapper; the body stays opaque bytes). This module is the
//! pure codec: it turns an [`Envelope`] into a header list and a header list back into an
//! [`Envelope`]. It does no I/O, reads no clock and knows nothing of the AMQP client: the broker
//! layer maps its field values to and from [`HeaderValue`]s. The signature header (`sig`) is the
//! broker layer's business and is ignored here like any other unknown header.
//!
//! Decoding rules (spec 10 §10 "Schema version"):
//!
//! - `v` is checked first. A missing `v` is [`EnvelopeError::Missing`], an unparsable one
//!   [`EnvelopeError::Bad`]. A major above [`VERSION`]'s is [`EnvelopeError::NewerMajor`] and
//!   nothing else is decoded (the caller dead-letters it with a loud log line, never half-parsed).
//!   The same major with any minor is accepted; an older major is [`EnvelopeError::Bad`].
//! - Header names are matched exactly (case-sensitive), as AMQP table keys are.
//! - Unknown headers are ignored: broker-added ones (`x-death`, `x-first-death-queue`, …), the
//!   signature, and fields a newer minor version adds.
//! - A header the codec knows that appears more than once is an error
//!   ([`EnvelopeError::Bad`] naming it): an AMQP table cannot hold a key twice, so a repeat means a
//!   forged or broken list, and picking one copy could let the signed value and the used value
//!   differ. Repeats of unknown headers are ignored with them.
//! - A text header may arrive as [`HeaderValue::Str`] or as UTF-8 [`HeaderValue::Bytes`] (some
//!   clients hand AMQP long strings over as bytes). A time header (`ts`, `expiresAt`) may arrive
//!   as a non-negative [`HeaderValue::Int`] or as a decimal string (either text form).
//! - Decoding checks syntax, not the rules of a flow: which kinds carry `turnId` or `spawnId`, and
//!   whether `expiresAt` is after `ts`, are the gateway's to judge.
//! - [`Envelope::decode`] never panics, whatever the input.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::ids::{Gid, MsgId, TraceId};
use crate::message::{Kind, Message, MsgState};

/// A header value as the codec sees it; the AMQP layer maps its field values to and from these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderValue {
    /// A string (an AMQP short or long string).
    Str(String),
    /// A signed integer (any AMQP integer type that fits).
    Int(i64),
    /// Raw bytes: a byte array, or a long string some clients hand over undecoded.
    Bytes(Vec<u8>),
    /// Any other field value (boolean, float, decimal, timestamp, table, array, void): the codec
    /// accepts none of them for a header it knows.
    Other,
}

/// An envelope schema version, written `MAJOR.MINOR` (for example `1.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    /// Bumped on an incompatible change; a receiver refuses a newer major.
    pub major: u32,
    /// Bumped on a compatible change (new optional headers); any minor of a known major is read.
    pub minor: u32,
}

/// The envelope version this codec writes and reads.
pub const VERSION: Version = Version { major: 1, minor: 0 };

/// The longest `to` and other text tokens may be, in bytes (the AMQP short-string limit, which is
/// also the routing-key limit).
pub const MAX_TOKEN_BYTES: usize = 255;

/// The names of the headers the codec knows, in the order [`Envelope::encode`] writes them.
pub const HEADERS: [&str; 13] = [
    "v",
    "kind",
    "msgId",
    "traceId",
    "from",
    "to",
    "turnId",
    "spawnId",
    "inReplyTo",
    "fromName",
    "fromHost",
    "ts",
    "expiresAt",
];

// Indexes into `HEADERS`.
const V: usize = 0;
const KIND: usize = 1;
const MSG_ID: usize = 2;
const TRACE_ID: usize = 3;
const FROM: usize = 4;
const TO: usize = 5;
const TURN_ID: usize = 6;
const SPAWN_ID: usize = 7;
const IN_REPLY_TO: usize = 8;
const FROM_NAME: usize = 9;
const FROM_HOST: usize = 10;
const TS: usize = 11;
const EXPIRES_AT: usize = 12;

/// Why a header list is not a usable envelope. Each variant's text is a sentence naming the
/// header and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    /// The message was written by a newer, incompatible envelope version: refuse it whole (the
    /// caller dead-letters it loudly).
    #[error(
        "envelope header `v` is {got}, a newer major version than the supported {supported}; the message was not read"
    )]
    NewerMajor {
        /// The version the message carries.
        got: Version,
        /// The version this codec reads.
        supported: Version,
    },
    /// A required header is absent.
    #[error("envelope header `{0}` is missing")]
    Missing(&'static str),
    /// A header is present but unusable.
    #[error("envelope header `{header}` is invalid: {why}")]
    Bad {
        /// The header's name.
        header: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

/// One cross-host message's envelope (spec 10 §2.1), carried in AMQP headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The schema version the message was written in (`v`); [`VERSION`] for a new message.
    pub version: Version,
    /// What the message is (`kind`).
    pub kind: Kind,
    /// The message's id, the dedup key (`msgId`).
    pub msg_id: MsgId,
    /// The flow's id, carried by every hop (`traceId`).
    pub trace_id: TraceId,
    /// The sender's global id (`from`).
    pub from: Gid,
    /// The recipient (`to`): a gid, a broadcast key (`broadcast.all`, `broadcast.<group>`) or a
    /// host id (control). Non-empty, no control characters, at most [`MAX_TOKEN_BYTES`] bytes.
    pub to: String,
    /// The asking turn, on conversation flows (`turnId`).
    pub turn_id: Option<String>,
    /// The id of the worker a `SPAWN` creates (`spawnId`).
    pub spawn_id: Option<Gid>,
    /// The message this one answers (`inReplyTo`).
    pub in_reply_to: Option<MsgId>,
    /// The sender's display name (`fromName`).
    pub from_name: Option<String>,
    /// The sender's host id (`fromHost`).
    pub from_host: Option<String>,
    /// Publish time, in milliseconds since the Unix epoch (`ts`).
    pub ts_ms: u64,
    /// Expiry enforced by the receiving gateway, in milliseconds since the Unix epoch
    /// (`expiresAt`).
    pub expires_at_ms: u64,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for Version {
    type Err = EnvelopeError;

    /// Parses `MAJOR.MINOR`: two decimal numbers of ASCII digits, no sign, no spaces.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wrong = || {
            bad(
                HEADERS[V],
                format!("expected MAJOR.MINOR such as \"1.0\", got {}", preview(s)),
            )
        };
        let (major, minor) = s.split_once('.').ok_or_else(wrong)?;
        let number = |part: &str| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(wrong());
            }
            part.parse::<u32>().map_err(|_| {
                bad(
                    HEADERS[V],
                    format!("{} has a number too large for 32 bits", preview(s)),
                )
            })
        };
        Ok(Version {
            major: number(major)?,
            minor: number(minor)?,
        })
    }
}

/// Whether this build reads an envelope of `version`: its major, no newer (refused as such,
/// nothing else read) and no older.
fn readable(version: Version) -> Result<(), EnvelopeError> {
    if version.major > VERSION.major {
        return Err(EnvelopeError::NewerMajor {
            got: version,
            supported: VERSION,
        });
    }
    if version.major < VERSION.major {
        return Err(bad(
            HEADERS[V],
            format!("{version} is an older major version than the supported {VERSION}"),
        ));
    }
    Ok(())
}

/// The message kind the `kind` header names.
fn kind_of(kind: &str) -> Result<Kind, EnvelopeError> {
    kind.parse::<Kind>().map_err(|_| {
        bad(
            HEADERS[KIND],
            format!("{} is not a message kind", preview(kind)),
        )
    })
}

impl Envelope {
    /// The envelope as AMQP headers, in [`HEADERS`] order; optional headers are left out when
    /// `None`. `v` is written as a string (`"1.0"`); `ts` and `expiresAt` as integers, or as
    /// decimal strings in the (never expected) case that a value does not fit an `i64`.
    ///
    /// Encoding does not validate: [`Envelope::decode`] refuses text that breaks its rules (an
    /// empty `to`, a control character, more than [`MAX_TOKEN_BYTES`] bytes), so build envelopes
    /// from values that keep them.
    pub fn encode(&self) -> Vec<(String, HeaderValue)> {
        let mut headers = Vec::with_capacity(HEADERS.len());
        let mut put = |index: usize, value: HeaderValue| {
            headers.push((HEADERS[index].to_owned(), value));
        };
        put(V, HeaderValue::Str(self.version.to_string()));
        put(KIND, HeaderValue::Str(self.kind.as_str().to_owned()));
        put(MSG_ID, HeaderValue::Str(self.msg_id.to_string()));
        put(TRACE_ID, HeaderValue::Str(self.trace_id.to_string()));
        put(FROM, HeaderValue::Str(self.from.to_string()));
        put(TO, HeaderValue::Str(self.to.clone()));
        if let Some(turn_id) = &self.turn_id {
            put(TURN_ID, HeaderValue::Str(turn_id.clone()));
        }
        if let Some(spawn_id) = &self.spawn_id {
            put(SPAWN_ID, HeaderValue::Str(spawn_id.to_string()));
        }
        if let Some(in_reply_to) = &self.in_reply_to {
            put(IN_REPLY_TO, HeaderValue::Str(in_reply_to.to_string()));
        }
        if let Some(from_name) = &self.from_name {
            put(FROM_NAME, HeaderValue::Str(from_name.clone()));
        }
        if let Some(from_host) = &self.from_host {
            put(FROM_HOST, HeaderValue::Str(from_host.clone()));
        }
        put(TS, millis_value(self.ts_ms));
        put(EXPIRES_AT, millis_value(self.expires_at_ms));
        headers
    }

    /// Reads an envelope from AMQP headers, by the rules in the module documentation: `v` first
    /// (a newer major is refused and nothing else is read), unknown headers ignored, a repeated
    /// known header refused. Never panics.
    pub fn decode<'a>(
        headers: impl IntoIterator<Item = (&'a str, &'a HeaderValue)>,
    ) -> Result<Envelope, EnvelopeError> {
        let mut found: [Option<&'a HeaderValue>; HEADERS.len()] = [None; HEADERS.len()];
        let mut repeated = [false; HEADERS.len()];
        for (name, value) in headers {
            if let Some(index) = HEADERS.iter().position(|known| *known == name) {
                match found[index] {
                    Some(_) => repeated[index] = true,
                    None => found[index] = Some(value),
                }
            }
        }
        let optional = |index: usize| -> Result<Option<&'a HeaderValue>, EnvelopeError> {
            if repeated[index] {
                Err(bad(HEADERS[index], "appears more than once".to_owned()))
            } else {
                Ok(found[index])
            }
        };
        let required = |index: usize| -> Result<&'a HeaderValue, EnvelopeError> {
            optional(index)?.ok_or(EnvelopeError::Missing(HEADERS[index]))
        };

        let version: Version = text(V, required(V)?)?.parse()?;
        readable(version)?;

        let kind = kind_of(text(KIND, required(KIND)?)?)?;
        let msg_id = uuid(MSG_ID, required(MSG_ID)?)?;
        let trace_id = uuid(TRACE_ID, required(TRACE_ID)?)?;
        let from = uuid(FROM, required(FROM)?)?;
        let to = token(TO, required(TO)?)?;
        let optional_token = |index: usize| -> Result<Option<String>, EnvelopeError> {
            optional(index)?
                .map(|value| token(index, value))
                .transpose()
        };
        let turn_id = optional_token(TURN_ID)?;
        let spawn_id = optional(SPAWN_ID)?
            .map(|value| uuid(SPAWN_ID, value))
            .transpose()?;
        let in_reply_to = optional(IN_REPLY_TO)?
            .map(|value| uuid(IN_REPLY_TO, value))
            .transpose()?;
        let from_name = optional_token(FROM_NAME)?;
        let from_host = optional_token(FROM_HOST)?;
        let ts_ms = millis(TS, required(TS)?)?;
        let expires_at_ms = millis(EXPIRES_AT, required(EXPIRES_AT)?)?;

        Ok(Envelope {
            version,
            kind,
            msg_id,
            trace_id,
            from,
            to,
            turn_id,
            spawn_id,
            in_reply_to,
            from_name,
            from_host,
            ts_ms,
            expires_at_ms,
        })
    }

    /// Whether the message is past its expiry at `now_ms` (milliseconds since the Unix epoch):
    /// it is expired from `expires_at_ms` on.
    pub fn expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at_ms
    }

    /// The local message this envelope makes for `owner`, its recipient here, held for a pull
    /// (a broadcast is a send like any other once it arrives). Its time is the sender's, or
    /// `now_ms` when that does not fit.
    pub fn held_for(&self, owner: Gid, body: String, now_ms: i64) -> Message {
        Message {
            msg_id: self.msg_id,
            trace_id: self.trace_id,
            kind: if self.kind == Kind::Broadcast {
                Kind::Send
            } else {
                self.kind
            },
            from: self.from,
            to: owner,
            in_reply_to: self.in_reply_to,
            body,
            state: MsgState::Held,
            created_ms: i64::try_from(self.ts_ms).unwrap_or(now_ms),
            expires_ms: None,
        }
    }

    /// The brief this envelope makes for `owner`, a pane-bound recipient here: queued to be
    /// typed in, answering nothing. A broadcast's copy takes an id of its own, derived from the
    /// broadcast's and its recipient, so each copy is accepted once.
    pub fn brief_for(&self, owner: Gid, body: String, now_ms: i64) -> Message {
        let msg_id = if self.kind == Kind::Broadcast {
            self.msg_id.derived(&owner.to_string())
        } else {
            self.msg_id
        };
        Message {
            msg_id,
            in_reply_to: None,
            state: MsgState::Queued,
            // Should another task get ahead of it in its worker's queue, its expiry still holds.
            expires_ms: Some(i64::try_from(self.expires_at_ms).unwrap_or(i64::MAX)),
            ..self.held_for(owner, body, now_ms)
        }
    }
}

fn bad(header: &'static str, why: String) -> EnvelopeError {
    EnvelopeError::Bad { header, why }
}

/// A short, escaped rendering of a received value for an error message: at most 48 characters,
/// control characters escaped, so a hostile header cannot flood or forge a log line.
pub(crate) fn preview(value: &str) -> String {
    const LIMIT: usize = 48;
    match value.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &value[..cut], value.len()),
        None => format!("{value:?}"),
    }
}

fn millis_value(ms: u64) -> HeaderValue {
    match i64::try_from(ms) {
        Ok(int) => HeaderValue::Int(int),
        Err(_) => HeaderValue::Str(ms.to_string()),
    }
}

/// A text header's string, from a string or from UTF-8 bytes.
fn text(index: usize, value: &HeaderValue) -> Result<&str, EnvelopeError> {
    let header = HEADERS[index];
    match value {
        HeaderValue::Str(s) => Ok(s),
        HeaderValue::Bytes(bytes) => std::str::from_utf8(bytes).map_err(|_| {
            bad(
                header,
                format!("is {} bytes that are not valid UTF-8 text", bytes.len()),
            )
        }),
        HeaderValue::Int(int) => Err(bad(
            header,
            format!("is the integer {int} where text was expected"),
        )),
        HeaderValue::Other => Err(bad(
            header,
            "has a value type the envelope does not use where text was expected".to_owned(),
        )),
    }
}

/// A text token (`to`, `turnId`, `fromName`, `fromHost`): non-empty, no control characters, at
/// most [`MAX_TOKEN_BYTES`] bytes.
fn token(index: usize, value: &HeaderValue) -> Result<String, EnvelopeError> {
    let header = HEADERS[index];
    let s = text(index, value)?;
    if s.is_empty() {
        return Err(bad(header, "is empty".to_owned()));
    }
    if s.len() > MAX_TOKEN_BYTES {
        return Err(bad(
            header,
            format!(
                "is {} bytes long; the limit is {MAX_TOKEN_BYTES} bytes",
                s.len()
            ),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(bad(
            header,
            format!("contains a control character: {}", preview(s)),
        ));
    }
    Ok(s.to_owned())
}

/// A UUID-typed header ([`Gid`], [`MsgId`], [`TraceId`]).
fn uuid<T: FromStr>(index: usize, value: &HeaderValue) -> Result<T, EnvelopeError> {
    let s = text(index, value)?;
    s.parse::<T>()
        .map_err(|_| bad(HEADERS[index], format!("{} is not a UUID", preview(s))))
}

/// A time header: a non-negative integer, or the same as decimal text.
fn millis(index: usize, value: &HeaderValue) -> Result<u64, EnvelopeError> {
    let header = HEADERS[index];
    match value {
        HeaderValue::Int(int) => u64::try_from(*int).map_err(|_| {
            bad(
                header,
                format!("is {int}; a time in milliseconds cannot be negative"),
            )
        }),
        HeaderValue::Str(_) | HeaderValue::Bytes(_) => {
            let s = text(index, value)?;
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(
                    header,
                    format!("{} is not a decimal number of milliseconds", preview(s)),
                ));
            }
            s.parse::<u64>()
                .map_err(|_| bad(header, format!("{} is too large for 64 bits", preview(s))))
        }
        HeaderValue::Other => Err(bad(
            header,
            "has a value type the envelope does not use where an integer was expected".to_owned(),
        )),
    }
}

/// An envelope for tests of the rules: `kind` from a new gid on `host` to `to`, stamped a
/// second before `now_ms` and expiring a minute after it.
#[cfg(test)]
pub(crate) fn sample(kind: Kind, host: &str, to: &str, now_ms: u64) -> Envelope {
    Envelope {
        version: VERSION,
        kind,
        msg_id: MsgId::mint(),
        trace_id: TraceId::mint(),
        from: Gid::mint(),
        to: to.into(),
        turn_id: None,
        spawn_id: None,
        in_reply_to: None,
        from_name: None,
        from_host: Some(host.into()),
        ts_ms: now_ms - 1_000,
        expires_at_ms: now_ms + 60_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;
    use uuid::Uuid;

    #[test]
    fn an_envelope_makes_a_held_message_or_a_brief_for_its_recipient() {
        let owner = Gid::mint();
        let reply = Envelope {
            kind: Kind::Reply,
            in_reply_to: Some(MsgId::mint()),
            ..sample()
        };
        let held = reply.held_for(owner, "done".into(), 7);
        assert_eq!(
            (held.msg_id, held.trace_id, held.from),
            (reply.msg_id, reply.trace_id, reply.from)
        );
        assert_eq!(
            (held.to, held.kind, held.state.clone()),
            (owner, Kind::Reply, MsgState::Held)
        );
        assert_eq!(held.in_reply_to, reply.in_reply_to);
        assert_eq!(held.created_ms, i64::try_from(reply.ts_ms).unwrap());
        let late = Envelope {
            ts_ms: u64::MAX,
            ..sample()
        };
        assert_eq!(late.held_for(owner, String::new(), 7).created_ms, 7);
        let task = Envelope {
            kind: Kind::Send,
            ..sample()
        };
        let brief = task.brief_for(owner, "do it".into(), 7);
        assert_eq!(
            (brief.msg_id, brief.state, brief.in_reply_to),
            (task.msg_id, MsgState::Queued, None)
        );
        // Each copy of a broadcast is a send with an id of its own.
        let broadcast = Envelope {
            kind: Kind::Broadcast,
            ..sample()
        };
        let (a, b) = (
            broadcast.brief_for(owner, String::new(), 7),
            broadcast.brief_for(Gid::mint(), String::new(), 7),
        );
        assert_eq!(a.kind, Kind::Send);
        assert_ne!(a.msg_id, b.msg_id);
        assert_eq!(
            a.msg_id,
            broadcast.brief_for(owner, String::new(), 9).msg_id
        );
    }

    fn sample() -> Envelope {
        Envelope {
            version: VERSION,
            kind: Kind::Ask,
            msg_id: Uuid::from_u128(1).into(),
            trace_id: Uuid::from_u128(2).into(),
            from: Uuid::from_u128(3).into(),
            to: "broadcast.all".to_owned(),
            turn_id: Some("turn-7".to_owned()),
            spawn_id: Some(Uuid::from_u128(4).into()),
            in_reply_to: Some(Uuid::from_u128(5).into()),
            from_name: Some("lead".to_owned()),
            from_host: Some("host-a".to_owned()),
            ts_ms: 1_000,
            expires_at_ms: 61_000,
        }
    }

    fn decode_owned(headers: &[(String, HeaderValue)]) -> Result<Envelope, EnvelopeError> {
        Envelope::decode(headers.iter().map(|(name, value)| (name.as_str(), value)))
    }

    /// `sample()` encoded, with `name` set to `value` (added if absent).
    fn with(name: &str, value: HeaderValue) -> Vec<(String, HeaderValue)> {
        let mut headers = sample().encode();
        match headers.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => headers.push((name.to_owned(), value)),
        }
        headers
    }

    fn without(name: &str) -> Vec<(String, HeaderValue)> {
        let mut headers = sample().encode();
        headers.retain(|(n, _)| n != name);
        headers
    }

    fn bad_header(result: Result<Envelope, EnvelopeError>) -> &'static str {
        match result {
            Err(EnvelopeError::Bad { header, .. }) => header,
            other => panic!("expected a Bad error, got {other:?}"),
        }
    }

    fn str(s: &str) -> HeaderValue {
        HeaderValue::Str(s.to_owned())
    }

    #[test]
    fn encodes_the_documented_headers() {
        let headers = sample().encode();
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, HEADERS);
        assert_eq!(headers[0].1, str("1.0"));
        assert_eq!(headers[1].1, str("ASK"));
        assert_eq!(headers[11].1, HeaderValue::Int(1_000));
        assert_eq!(headers[12].1, HeaderValue::Int(61_000));
        assert_eq!(decode_owned(&headers), Ok(sample()));
    }

    #[test]
    fn optional_headers_are_left_out_when_none() {
        let envelope = Envelope {
            turn_id: None,
            spawn_id: None,
            in_reply_to: None,
            from_name: None,
            from_host: None,
            ..sample()
        };
        let headers = envelope.encode();
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "v",
                "kind",
                "msgId",
                "traceId",
                "from",
                "to",
                "ts",
                "expiresAt"
            ]
        );
        assert_eq!(decode_owned(&headers), Ok(envelope));
    }

    #[test]
    fn times_beyond_i64_travel_as_decimal_text() {
        let envelope = Envelope {
            expires_at_ms: u64::MAX,
            ..sample()
        };
        let headers = envelope.encode();
        assert_eq!(headers[12].1, str(&u64::MAX.to_string()));
        assert_eq!(decode_owned(&headers), Ok(envelope));
    }

    #[test]
    fn version_text() {
        assert_eq!(VERSION.to_string(), "1.0");
        assert_eq!(
            "12.345".parse::<Version>(),
            Ok(Version {
                major: 12,
                minor: 345
            })
        );
        for wrong in [
            "",
            "1",
            "1.",
            ".0",
            "1.0.0",
            "+1.0",
            "-1.0",
            " 1.0",
            "1.0 ",
            "a.b",
            "4294967296.0",
        ] {
            let err = wrong.parse::<Version>().unwrap_err();
            assert!(
                matches!(err, EnvelopeError::Bad { header: "v", .. }),
                "{wrong:?}: {err:?}"
            );
        }
    }

    #[test]
    fn missing_required_headers_are_named() {
        for name in [
            "v",
            "kind",
            "msgId",
            "traceId",
            "from",
            "to",
            "ts",
            "expiresAt",
        ] {
            let err = decode_owned(&without(name)).unwrap_err();
            assert_eq!(err, EnvelopeError::Missing(name));
            assert_eq!(
                err.to_string(),
                format!("envelope header `{name}` is missing")
            );
        }
    }

    #[test]
    fn v_is_checked_before_anything_else() {
        // Nothing but a missing `v`: that is what is reported, not the missing kind.
        let none: [(&str, &HeaderValue); 0] = [];
        assert_eq!(Envelope::decode(none), Err(EnvelopeError::Missing("v")));
        let only_v = [("v", &str("1.0"))];
        assert_eq!(
            Envelope::decode(only_v),
            Err(EnvelopeError::Missing("kind"))
        );
    }

    #[test]
    fn a_newer_major_is_refused_whatever_else_is_there() {
        let v2 = str("2.7");
        let junk = HeaderValue::Other;
        let headers = [("v", &v2), ("kind", &junk), ("msgId", &junk), ("ts", &junk)];
        let err = Envelope::decode(headers).unwrap_err();
        assert_eq!(
            err,
            EnvelopeError::NewerMajor {
                got: Version { major: 2, minor: 7 },
                supported: VERSION
            }
        );
        assert_eq!(
            err.to_string(),
            "envelope header `v` is 2.7, a newer major version than the supported 1.0; the message was not read"
        );
    }

    #[test]
    fn same_major_any_minor_is_read() {
        let headers = with("v", str("1.99"));
        let envelope = decode_owned(&headers).unwrap();
        assert_eq!(
            envelope.version,
            Version {
                major: 1,
                minor: 99
            }
        );
        assert_eq!(
            Envelope {
                version: VERSION,
                ..envelope
            },
            sample()
        );
    }

    #[test]
    fn bad_or_older_v_is_bad_v() {
        for value in [
            str("one"),
            str("0.9"),
            HeaderValue::Int(1),
            HeaderValue::Other,
            HeaderValue::Bytes(vec![0xff]),
        ] {
            assert_eq!(bad_header(decode_owned(&with("v", value))), "v");
        }
        let err = decode_owned(&with("v", str("0.9"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "envelope header `v` is invalid: 0.9 is an older major version than the supported 1.0"
        );
    }

    #[test]
    fn each_bad_header_is_named() {
        let long = "x".repeat(MAX_TOKEN_BYTES + 1);
        let cases: Vec<(&str, HeaderValue)> = vec![
            ("kind", str("SHOUT")),
            ("kind", HeaderValue::Int(3)),
            ("msgId", str("not-a-uuid")),
            ("traceId", str("")),
            ("from", HeaderValue::Other),
            ("to", str("")),
            ("to", str("a\nb")),
            ("to", str(&long)),
            ("to", HeaderValue::Bytes(vec![0xc3, 0x28])),
            ("turnId", str("t\u{7}")),
            ("spawnId", str("nope")),
            ("inReplyTo", HeaderValue::Int(5)),
            ("fromName", str("")),
            ("fromHost", str("\u{85}host")),
            ("ts", HeaderValue::Int(-1)),
            ("ts", str("12a")),
            ("ts", str("")),
            ("expiresAt", str("-5")),
            ("expiresAt", str("18446744073709551616")),
            ("expiresAt", HeaderValue::Other),
        ];
        for (name, value) in cases {
            let result = decode_owned(&with(name, value.clone()));
            assert_eq!(bad_header(result.clone()), name, "{name} = {value:?}");
            let message = result.unwrap_err().to_string();
            assert!(
                message.starts_with(&format!("envelope header `{name}` is invalid: ")),
                "{message}"
            );
        }
    }

    #[test]
    fn error_sentences_say_what_is_wrong() {
        let err = decode_owned(&with("msgId", str("abc"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "envelope header `msgId` is invalid: \"abc\" is not a UUID"
        );
        let err = decode_owned(&with("ts", HeaderValue::Int(-3))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "envelope header `ts` is invalid: is -3; a time in milliseconds cannot be negative"
        );
        let long = "y".repeat(300);
        let err = decode_owned(&with("to", str(&long))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "envelope header `to` is invalid: is 300 bytes long; the limit is 255 bytes"
        );
        // A hostile value is cut short and escaped in the message.
        let hostile = format!("{}\n{}", "z".repeat(100), "forged log line");
        let err = decode_owned(&with("kind", str(&hostile))).unwrap_err();
        let message = err.to_string();
        assert!(
            !message.contains('\n') && !message.contains("forged"),
            "{message}"
        );
    }

    #[test]
    fn tokens_at_the_limit_are_accepted() {
        let edge = "é".repeat(127) + "x"; // 255 bytes
        assert_eq!(edge.len(), MAX_TOKEN_BYTES);
        let envelope = decode_owned(&with("to", str(&edge))).unwrap();
        assert_eq!(envelope.to, edge);
    }

    #[test]
    fn a_repeated_known_header_is_refused() {
        let mut headers = sample().encode();
        headers.push(("msgId".to_owned(), str(&Uuid::from_u128(1).to_string())));
        let err = decode_owned(&headers).unwrap_err();
        assert_eq!(
            err.to_string(),
            "envelope header `msgId` is invalid: appears more than once"
        );
        let mut headers = sample().encode();
        headers.insert(0, ("v".to_owned(), str("1.0")));
        assert_eq!(bad_header(decode_owned(&headers)), "v");
        // Repeated unknown headers are ignored like any unknown header.
        let mut headers = sample().encode();
        headers.push(("x-death".to_owned(), HeaderValue::Other));
        headers.push(("x-death".to_owned(), HeaderValue::Other));
        assert_eq!(decode_owned(&headers), Ok(sample()));
    }

    #[test]
    fn header_names_are_case_sensitive() {
        let mut headers = without("msgId");
        headers.push(("msgid".to_owned(), str(&Uuid::from_u128(1).to_string())));
        assert_eq!(decode_owned(&headers), Err(EnvelopeError::Missing("msgId")));
    }

    #[test]
    fn text_may_arrive_as_bytes_and_times_as_text() {
        let headers: Vec<(String, HeaderValue)> = sample()
            .encode()
            .into_iter()
            .map(|(name, value)| {
                let value = match value {
                    HeaderValue::Str(s) => HeaderValue::Bytes(s.into_bytes()),
                    HeaderValue::Int(i) => str(&i.to_string()),
                    other => other,
                };
                (name, value)
            })
            .collect();
        assert_eq!(decode_owned(&headers), Ok(sample()));
        let headers = with("ts", HeaderValue::Bytes(b"1000".to_vec()));
        assert_eq!(decode_owned(&headers), Ok(sample()));
    }

    #[test]
    fn expiry_is_inclusive() {
        let envelope = sample();
        assert!(!envelope.expired(60_999));
        assert!(envelope.expired(61_000));
        assert!(envelope.expired(u64::MAX));
    }

    // ---- property tests ----

    fn arb_uuid() -> impl Strategy<Value = Uuid> {
        any::<u128>().prop_map(Uuid::from_u128)
    }

    /// Text that keeps the token rules: 1..=60 non-control characters (at most 240 bytes).
    fn arb_token() -> impl Strategy<Value = String> {
        "[^\\x00-\\x1f\\x7f-\\x9f]{1,60}"
    }

    fn arb_to() -> impl Strategy<Value = String> {
        prop_oneof![
            arb_uuid().prop_map(|u| u.to_string()),
            Just("broadcast.all".to_owned()),
            "broadcast\\.[a-z0-9_-]{1,40}",
            arb_token(),
        ]
    }

    prop_compose! {
        fn arb_envelope()(
            minor in any::<u32>(),
            kind in proptest::sample::select(Kind::ALL.to_vec()),
            ids in (arb_uuid(), arb_uuid(), arb_uuid()),
            to in arb_to(),
            turn_id in proptest::option::of(arb_token()),
            spawn_id in proptest::option::of(arb_uuid()),
            in_reply_to in proptest::option::of(arb_uuid()),
            from_name in proptest::option::of(arb_token()),
            from_host in proptest::option::of(arb_token()),
            ts_ms in any::<u64>(),
            expires_at_ms in any::<u64>(),
        ) -> Envelope {
            Envelope {
                version: Version { major: VERSION.major, minor },
                kind,
                msg_id: ids.0.into(),
                trace_id: ids.1.into(),
                from: ids.2.into(),
                to,
                turn_id,
                spawn_id: spawn_id.map(Gid::from),
                in_reply_to: in_reply_to.map(MsgId::from),
                from_name,
                from_host,
                ts_ms,
                expires_at_ms,
            }
        }
    }

    /// Any header value, including huge and odd ones.
    fn arb_value() -> impl Strategy<Value = HeaderValue> {
        prop_oneof![
            any::<String>().prop_map(HeaderValue::Str),
            any::<i64>().prop_map(HeaderValue::Int),
            prop::collection::vec(any::<u8>(), 0..64).prop_map(HeaderValue::Bytes),
            Just(HeaderValue::Other),
            prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(-1i64), Just(0i64)]
                .prop_map(HeaderValue::Int),
            "[0-9]{0,40}".prop_map(HeaderValue::Str),
            "[0-9]{1,3}\\.[0-9]{1,12}".prop_map(HeaderValue::Str),
            arb_uuid().prop_map(|u| HeaderValue::Str(u.to_string())),
            proptest::sample::select(Kind::ALL.to_vec())
                .prop_map(|k| HeaderValue::Str(k.as_str().to_owned())),
            (0usize..70_000, any::<char>())
                .prop_map(|(n, c)| HeaderValue::Str(std::iter::repeat_n(c, n).collect())),
            (0usize..70_000, any::<u8>()).prop_map(|(n, b)| HeaderValue::Bytes(vec![b; n])),
        ]
    }

    /// Any header name, biased towards the ones the codec knows.
    fn arb_name() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(HEADERS.to_vec()).prop_map(str::to_owned),
            any::<String>(),
            Just("x-death".to_owned()),
        ]
    }

    /// A name the codec does not know.
    fn arb_unknown_name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("x-death".to_owned()),
            Just("sig".to_owned()),
            Just("MSGID".to_owned()),
            any::<String>(),
        ]
        .prop_filter("a known header", |name| !HEADERS.contains(&name.as_str()))
    }

    /// One edit to a valid header list.
    #[derive(Clone, Debug)]
    enum Edit {
        Set(usize, HeaderValue),
        Remove(usize),
        Duplicate(usize),
        Insert(usize, String, HeaderValue),
    }

    fn arb_edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<usize>(), arb_value()).prop_map(|(i, v)| Edit::Set(i, v)),
            any::<usize>().prop_map(Edit::Remove),
            any::<usize>().prop_map(Edit::Duplicate),
            (any::<usize>(), arb_name(), arb_value()).prop_map(|(i, n, v)| Edit::Insert(i, n, v)),
        ]
    }

    fn apply(headers: &mut Vec<(String, HeaderValue)>, edit: Edit) {
        let len = headers.len();
        match edit {
            Edit::Set(i, value) if len > 0 => headers[i % len].1 = value,
            Edit::Remove(i) if len > 0 => {
                headers.remove(i % len);
            }
            Edit::Duplicate(i) if len > 0 => {
                let copy = headers[i % len].clone();
                headers.push(copy);
            }
            Edit::Insert(i, name, value) => headers.insert(i % (len + 1), (name, value)),
            _ => {}
        }
    }

    proptest! {
        #[test]
        fn round_trip(envelope in arb_envelope()) {
            prop_assert_eq!(decode_owned(&envelope.encode()), Ok(envelope));
        }

        #[test]
        fn unknown_headers_change_nothing(
            envelope in arb_envelope(),
            extra in prop::collection::vec((any::<usize>(), arb_unknown_name(), arb_value()), 0..12),
        ) {
            let mut headers = envelope.encode();
            for (at, name, value) in extra {
                let at = at % (headers.len() + 1);
                headers.insert(at, (name, value));
            }
            prop_assert_eq!(decode_owned(&headers), Ok(envelope));
        }

        #[test]
        fn newer_major_is_refused(
            envelope in arb_envelope(),
            major in (VERSION.major + 1)..=u32::MAX,
            minor in any::<u32>(),
            edits in prop::collection::vec(arb_edit(), 0..8),
        ) {
            let mut headers = envelope.encode();
            headers.retain(|(name, _)| name != "v");
            // Whatever else is there, even garbage, is not read.
            for edit in edits {
                apply(&mut headers, edit);
            }
            headers.retain(|(name, _)| name != "v");
            let v = HeaderValue::Str(format!("{major}.{minor}"));
            headers.insert(0, ("v".to_owned(), v));
            prop_assert_eq!(
                decode_owned(&headers),
                Err(EnvelopeError::NewerMajor { got: Version { major, minor }, supported: VERSION })
            );
        }

        #[test]
        fn garbage_never_panics(
            headers in prop::collection::vec((arb_name(), arb_value()), 0..24),
        ) {
            check_decoded(&headers);
        }

        #[test]
        fn damaged_envelopes_never_panic(
            envelope in arb_envelope(),
            edits in prop::collection::vec(arb_edit(), 1..6),
        ) {
            let mut headers = envelope.encode();
            for edit in edits {
                apply(&mut headers, edit);
            }
            check_decoded(&headers);
        }
    }

    /// Decodes `headers`; whatever decodes must survive its own round trip, and an error must be
    /// a sentence that names a header.
    fn check_decoded(headers: &[(String, HeaderValue)]) {
        match decode_owned(headers) {
            Ok(envelope) => assert_eq!(decode_owned(&envelope.encode()), Ok(envelope)),
            Err(err) => {
                let message = err.to_string();
                assert!(message.starts_with("envelope header `"), "{message}");
                assert!(message.len() < 1024, "{message}");
            }
        }
    }
}
