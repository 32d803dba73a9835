//! AMQP field tables without lapin's types: message headers and queue arguments as the daemon
//! and the tests write them, the envelope codec's header values read off a delivery, and what a
//! dead letter's `x-death` header says.

use std::collections::BTreeMap;

use fleet_core::dead::{Cause, Death};
use fleet_core::envelope::{Envelope, HeaderValue, MAX_TOKEN_BYTES};
use fleet_core::signing::{KEY_ID_HEADER, SIG_HEADER, Signature};
use lapin::types::{AMQPValue, ByteArray, FieldTable, LongString, ShortString};

/// One value of a [`Table`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Field {
    /// A long string.
    Text(String),
    /// A signed 64-bit integer.
    Int(i64),
    /// A byte array.
    Bytes(Vec<u8>),
    /// A nested table.
    Table(Table),
    /// An array of values (as in a dead letter's `x-death`).
    Array(Vec<Field>),
    /// A boolean (as in a queue's `x-single-active-consumer`).
    Bool(bool),
}

impl From<&str> for Field {
    fn from(value: &str) -> Self {
        Field::Text(value.to_string())
    }
}

impl From<bool> for Field {
    fn from(value: bool) -> Self {
        Field::Bool(value)
    }
}

impl From<i64> for Field {
    fn from(value: i64) -> Self {
        Field::Int(value)
    }
}

/// An AMQP field table: message headers, or a queue's `x-` arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table(BTreeMap<String, Field>);

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table with `name` set to `value`.
    #[must_use]
    pub fn with(mut self, name: &str, value: impl Into<Field>) -> Self {
        self.0.insert(name.to_string(), value.into());
        self
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&Field> {
        self.0.get(name)
    }

    /// `envelope` as message headers.
    pub fn of_envelope(envelope: &Envelope) -> Self {
        let mut table = Table::new();
        for (name, value) in envelope.encode() {
            let value = match value {
                HeaderValue::Str(s) => Field::Text(s),
                HeaderValue::Int(i) => Field::Int(i),
                HeaderValue::Bytes(b) => Field::Bytes(b),
                // The codec never writes one; nothing to put on the wire.
                HeaderValue::Other => continue,
            };
            table.0.insert(name, value);
        }
        table
    }

    /// `envelope` as message headers with `signature`: what a gateway publishes.
    pub fn of_signed(envelope: &Envelope, signature: &Signature) -> Self {
        Table::of_envelope(envelope)
            .with(SIG_HEADER, signature.sig.as_str())
            .with(KEY_ID_HEADER, signature.key_id.as_str())
    }

    /// The table in lapin's terms.
    pub(crate) fn to_lapin(&self) -> FieldTable {
        let mut out = FieldTable::default();
        for (name, value) in &self.0 {
            out.insert(ShortString::from(name.as_str()), field_to_lapin(value));
        }
        out
    }
}

fn field_to_lapin(value: &Field) -> AMQPValue {
    match value {
        Field::Text(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Field::Int(i) => AMQPValue::LongLongInt(*i),
        Field::Bytes(b) => AMQPValue::ByteArray(ByteArray::from(b.clone())),
        Field::Table(t) => AMQPValue::FieldTable(t.to_lapin()),
        Field::Array(a) => {
            AMQPValue::FieldArray(a.iter().map(field_to_lapin).collect::<Vec<_>>().into())
        }
        Field::Bool(b) => AMQPValue::Boolean(*b),
    }
}

/// A count as an AMQP integer (a count past `i64::MAX` is read as "no bound" anyway).
pub(crate) fn clamp_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// AMQP headers as the envelope codec reads them: every integer width as an integer, text
/// that is not UTF-8 as bytes, anything else (tables, arrays, floats) as `Other`.
pub(crate) fn header_values(headers: Option<&FieldTable>) -> Vec<(String, HeaderValue)> {
    let Some(table) = headers else {
        return Vec::new();
    };
    table
        .inner()
        .iter()
        .map(|(name, value)| (name.as_str().to_string(), header_value(value)))
        .collect()
}

fn header_value(value: &AMQPValue) -> HeaderValue {
    match value {
        AMQPValue::LongString(s) => match std::str::from_utf8(s.as_bytes()) {
            Ok(text) => HeaderValue::Str(text.to_string()),
            Err(_) => HeaderValue::Bytes(s.as_bytes().to_vec()),
        },
        AMQPValue::ShortString(s) => HeaderValue::Str(s.as_str().to_string()),
        AMQPValue::ByteArray(b) => HeaderValue::Bytes(b.as_slice().to_vec()),
        AMQPValue::LongLongInt(i) => HeaderValue::Int(*i),
        AMQPValue::LongInt(i) => HeaderValue::Int((*i).into()),
        AMQPValue::LongUInt(i) => HeaderValue::Int((*i).into()),
        AMQPValue::ShortInt(i) => HeaderValue::Int((*i).into()),
        AMQPValue::ShortUInt(i) => HeaderValue::Int((*i).into()),
        AMQPValue::ShortShortInt(i) => HeaderValue::Int((*i).into()),
        AMQPValue::ShortShortUInt(i) => HeaderValue::Int((*i).into()),
        AMQPValue::Timestamp(t) => HeaderValue::Int(clamp_i64(*t)),
        _ => HeaderValue::Other,
    }
}

/// What the `x-death` header the broker adds to a dead letter says of its latest death (its
/// first entry): the cause, the queue and the time. Hostile input is read as far as it makes
/// sense and no further: no header, not an array, a first entry that is no table, or a reason
/// that is not text is an unknown cause; a queue name that is not a short, printable text is
/// none; a time that is no non-negative integer is none. Never panics.
pub(crate) fn death_of(headers: Option<&FieldTable>) -> Death {
    let entry = headers
        .and_then(|h| h.inner().get("x-death"))
        .and_then(|value| match value {
            AMQPValue::FieldArray(entries) => entries.as_slice().first(),
            _ => None,
        })
        .and_then(|first| match first {
            AMQPValue::FieldTable(entry) => Some(entry),
            _ => None,
        });
    let Some(entry) = entry else {
        return Death::unknown();
    };
    let field = |name: &str| entry.inner().get(name);
    let queue = field("queue").and_then(text_of).filter(|q| {
        !q.is_empty() && q.len() <= MAX_TOKEN_BYTES && !q.chars().any(char::is_control)
    });
    Death {
        cause: field("reason")
            .and_then(text_of)
            .map_or(Cause::Unknown, |reason| Cause::from_wire(&reason)),
        queue,
        time_s: field("time").and_then(|time| match header_value(time) {
            HeaderValue::Int(seconds) => u64::try_from(seconds).ok(),
            _ => None,
        }),
    }
}

/// A value's text, when it is UTF-8 text.
fn text_of(value: &AMQPValue) -> Option<String> {
    match header_value(value) {
        HeaderValue::Str(text) => Some(text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{Gid, Kind, MsgId, TraceId};

    #[test]
    fn an_envelope_survives_the_trip_through_amqp_headers() {
        let envelope = Envelope {
            version: fleet_core::envelope::VERSION,
            kind: Kind::Send,
            msg_id: MsgId::mint(),
            trace_id: TraceId::mint(),
            from: Gid::mint(),
            to: "someone".into(),
            turn_id: None,
            spawn_id: None,
            in_reply_to: Some(MsgId::mint()),
            from_name: Some("carol".into()),
            from_host: Some("hostc".into()),
            ts_ms: 1_000,
            expires_at_ms: 61_000,
        };
        let lapin = Table::of_envelope(&envelope).to_lapin();
        let values = header_values(Some(&lapin));
        let back = Envelope::decode(values.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
        assert_eq!(back, envelope);
    }

    #[test]
    fn every_integer_width_reads_as_an_integer_and_bad_text_as_bytes() {
        assert_eq!(header_value(&AMQPValue::ShortUInt(7)), HeaderValue::Int(7));
        assert_eq!(
            header_value(&AMQPValue::Timestamp(u64::MAX)),
            HeaderValue::Int(i64::MAX)
        );
        assert_eq!(
            header_value(&AMQPValue::LongString(LongString::from(vec![0xff, 0xfe]))),
            HeaderValue::Bytes(vec![0xff, 0xfe])
        );
        assert_eq!(header_value(&AMQPValue::Boolean(true)), HeaderValue::Other);
        assert!(header_values(None).is_empty());
    }

    #[test]
    fn nested_tables_go_out_as_tables() {
        let table = Table::new().with("x-fleet", Field::Table(Table::new().with("host", "a")));
        let lapin = table.to_lapin();
        assert!(matches!(
            lapin.inner().get("x-fleet"),
            Some(AMQPValue::FieldTable(inner)) if inner.inner().contains_key("host")
        ));
    }

    /// Headers with `x-death` set to `value`.
    fn with_death(value: AMQPValue) -> FieldTable {
        let mut headers = FieldTable::default();
        headers.insert("x-death".into(), value);
        headers
    }

    /// An `x-death` of one entry with `fields`, as lapin reads it.
    fn one_death(fields: &[(&str, AMQPValue)]) -> FieldTable {
        let mut entry = FieldTable::default();
        for (name, value) in fields {
            entry.insert((*name).into(), value.clone());
        }
        with_death(AMQPValue::FieldArray(
            vec![AMQPValue::FieldTable(entry)].into(),
        ))
    }

    fn text(value: &str) -> AMQPValue {
        AMQPValue::LongString(value.into())
    }

    #[test]
    fn the_latest_death_is_read_off_x_death() {
        // As RabbitMQ writes it: the latest death first, the time a timestamp.
        let mut older = FieldTable::default();
        older.insert("reason".into(), text("rejected"));
        let mut latest = FieldTable::default();
        latest.insert("reason".into(), text("expired"));
        latest.insert("queue".into(), text("agent.x.inbox.v2"));
        latest.insert("time".into(), AMQPValue::Timestamp(1_700_000_000));
        latest.insert("count".into(), AMQPValue::LongLongInt(1));
        let headers = with_death(AMQPValue::FieldArray(
            vec![AMQPValue::FieldTable(latest), AMQPValue::FieldTable(older)].into(),
        ));
        assert_eq!(
            death_of(Some(&headers)),
            Death {
                cause: Cause::Expired,
                queue: Some("agent.x.inbox.v2".into()),
                time_s: Some(1_700_000_000),
            }
        );
        // Written by a test through a [`Table`], it reads the same.
        let written = Table::new().with(
            "x-death",
            Field::Array(vec![Field::Table(
                Table::new()
                    .with("reason", "maxlen")
                    .with("queue", "q")
                    .with("time", 5),
            )]),
        );
        assert_eq!(
            death_of(Some(&written.to_lapin())),
            Death {
                cause: Cause::MaxLen,
                queue: Some("q".into()),
                time_s: Some(5),
            }
        );
    }

    #[test]
    fn a_missing_or_malformed_x_death_is_an_unknown_death() {
        let unknown = Death::unknown();
        assert_eq!(death_of(None), unknown);
        assert_eq!(death_of(Some(&FieldTable::default())), unknown);
        for value in [
            text("expired"),
            AMQPValue::FieldArray(Vec::new().into()),
            AMQPValue::FieldArray(vec![text("expired")].into()),
            AMQPValue::FieldTable(FieldTable::default()),
            AMQPValue::Boolean(true),
        ] {
            assert_eq!(
                death_of(Some(&with_death(value.clone()))),
                unknown,
                "{value:?}"
            );
        }
        // An entry with a reason of another type, or not UTF-8, or of a name nobody uses.
        for reason in [
            AMQPValue::LongLongInt(1),
            AMQPValue::LongString(vec![0xff, 0xfe].into()),
            text("EXPIRED"),
        ] {
            let got = death_of(Some(&one_death(&[("reason", reason.clone())])));
            assert_eq!(got.cause, Cause::Unknown, "{reason:?}");
        }
    }

    #[test]
    fn a_hostile_queue_or_time_is_none_and_the_rest_still_reads() {
        let long = "q".repeat(256);
        for queue in [
            text(""),
            text(&long),
            text("agent.\u{1b}[2J.inbox.v2"),
            AMQPValue::LongLongInt(7),
            AMQPValue::FieldArray(Vec::new().into()),
        ] {
            let got = death_of(Some(&one_death(&[
                ("reason", text("expired")),
                ("queue", queue.clone()),
                ("time", AMQPValue::LongLongInt(-1)),
            ])));
            assert_eq!(
                got,
                Death {
                    cause: Cause::Expired,
                    queue: None,
                    time_s: None,
                },
                "{queue:?}"
            );
        }
        let short = death_of(Some(&one_death(&[(
            "queue",
            AMQPValue::ShortString("fleet.dlq".into()),
        )])));
        assert_eq!(short.queue.as_deref(), Some("fleet.dlq"));
        assert_eq!(short.cause, Cause::Unknown);
    }
}
