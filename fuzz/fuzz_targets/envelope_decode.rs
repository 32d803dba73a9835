//! Fuzzes the cross-host envelope decoder: arbitrary bytes become a header list, which
//! `Envelope::decode` must take without panicking; whatever decodes must survive its own
//! encode → decode round trip.
//!
//! The bytes are read as a sequence of records, each a name then a value:
//!
//! - name byte `n`: `n % 16` in 0..=12 picks a known header, 13 is `x-death`, 14 and 15 read a
//!   chunk and use it (lossy UTF-8) as the name;
//! - value byte `k`, by `k % 5`: 0 a chunk as a string (lossy UTF-8), 1 eight bytes as a
//!   little-endian `Int` (missing bytes are zero), 2 a chunk as `Bytes`, 3 `Other`, 4 a string
//!   from a small dictionary of meaningful values (picked by the next byte), so the fuzzer
//!   reaches envelopes that decode;
//! - a chunk is a length then that many bytes (as many as remain): one length byte, and when it
//!   is 255 two more bytes (little-endian) are added to it, so values run up to 65,790 bytes.

#![no_main]

use fleet_core::envelope::{Envelope, HEADERS, HeaderValue};
use libfuzzer_sys::fuzz_target;

const DICTIONARY: [&str; 20] = [
    "1.0",
    "1.7",
    "2.0",
    "0.9",
    "SEND",
    "REPLY",
    "ASK",
    "SPAWN",
    "TOO_LATE",
    "00000000-0000-0000-0000-000000000001",
    "0194c1a2-7b3e-7c00-8a00-000000000002",
    "{00000000-0000-0000-0000-000000000003}",
    "broadcast.all",
    "broadcast.ops",
    "host-a",
    "0",
    "1700000000000",
    "18446744073709551615",
    "18446744073709551616",
    "",
];

/// A cursor over the fuzzer's bytes.
struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.bytes.split_first()?;
        self.bytes = rest;
        Some(first)
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.bytes.len());
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        head
    }

    fn chunk(&mut self) -> &'a [u8] {
        let mut len = usize::from(self.byte().unwrap_or(0));
        if len == 255 {
            let low = self.byte().unwrap_or(0);
            let high = self.byte().unwrap_or(0);
            len += usize::from(u16::from_le_bytes([low, high]));
        }
        self.take(len)
    }
}

/// The header list the bytes describe (deterministic: the same bytes, the same list).
fn headers(bytes: &[u8]) -> Vec<(String, HeaderValue)> {
    let mut input = Input { bytes };
    let mut headers = Vec::new();
    while let Some(n) = input.byte() {
        let name = match usize::from(n % 16) {
            known if known < HEADERS.len() => HEADERS[known].to_owned(),
            13 => "x-death".to_owned(),
            _ => String::from_utf8_lossy(input.chunk()).into_owned(),
        };
        let value = match input.byte().unwrap_or(0) % 5 {
            0 => HeaderValue::Str(String::from_utf8_lossy(input.chunk()).into_owned()),
            1 => {
                let mut le = [0u8; 8];
                for (slot, byte) in le.iter_mut().zip(input.take(8)) {
                    *slot = *byte;
                }
                HeaderValue::Int(i64::from_le_bytes(le))
            }
            2 => HeaderValue::Bytes(input.chunk().to_vec()),
            3 => HeaderValue::Other,
            _ => {
                let pick = usize::from(input.byte().unwrap_or(0)) % DICTIONARY.len();
                HeaderValue::Str(DICTIONARY[pick].to_owned())
            }
        };
        headers.push((name, value));
    }
    headers
}

fuzz_target!(|data: &[u8]| {
    let headers = headers(data);
    let decoded = Envelope::decode(headers.iter().map(|(name, value)| (name.as_str(), value)));
    if let Ok(envelope) = decoded {
        let again = envelope.encode();
        let redecoded = Envelope::decode(again.iter().map(|(name, value)| (name.as_str(), value)));
        assert_eq!(redecoded, Ok(envelope));
    }
});
