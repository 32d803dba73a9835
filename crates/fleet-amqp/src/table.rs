//! AMQP field tables without lapin's types: message headers and queue arguments as the daemon
//! and the tests write them, and the envelope codec's header values read off a delivery.

use std::collections::BTreeMap;

use fleet_core::envelope::{Envelope, HeaderValue};
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
}

impl From<&str> for Field {
    fn from(value: &str) -> Self {
        Field::Text(value.to_string())
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
}
