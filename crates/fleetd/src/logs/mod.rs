//! fleetd's log: how it is set up, what its lines may show, and the spans they carry.
//!
//! - **Set-up** ([`init`]): `tracing_subscriber::fmt` to stderr, text or JSON, through a
//!   bounded queue a thread of its own writes out ([`relay`]): stderr can block (a reader that
//!   stopped reading) or fail (whatever read fleetd's stderr pipe died: `fleetd serve 2>&1 |
//!   tee log`, then Ctrl-C); either way no caller of the log waits, and a line that cannot be
//!   written is dropped and counted ([`write_failures`], shown in `/metrics`) — never reported
//!   with `eprintln!`, which panics on a broken stderr and would take down every task that logs.
//! - **Text stays out** ([`summary`], [`trace_text`]): no task, reply, screen, dialog, ask,
//!   answer, broadcast, brief or coordination message is logged at DEBUG and above; in its
//!   place its length and a digest keyed with a random per-process key (the same text reads the
//!   same within one run, and a short text cannot be guessed from its digest). The text itself
//!   only at TRACE, and only when `[gateway] log_text = true` ([`allow_text`]).
//! - **Every field escaped** ([`EscapedFields`]): in the text output, a field value or message
//!   that holds a line break, ESC or any other control character shows it escaped (`\n`, `\r`,
//!   `\t`, else `\u{1b}`-style), so nothing a worker says can forge a log line or drive the
//!   operator's terminal. The JSON output is escaped by `serde_json` (every control character
//!   below U+0020, so a line break or ESC never reaches the line raw).
//! - **Spans**: a tool call (the tool and its caller, see `mcp`), an HTTP request (see `http`),
//!   a session (its gid and name) and a message (its trace id, which every hop of a flow
//!   shares, and its id).
//!
//! This module must never write to stderr except through the [`relay`].

mod relay;

use std::fmt::{self, Write as _};
use std::io::{self, IsTerminal};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fleet_core::{Gid, Message};
use fleet_mux::MuxError;
pub use relay::{Relay, flush};
use sha2::{Digest, Sha256};
use tracing::Span;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::util::SubscriberInitExt;

/// What is logged when `RUST_LOG` is unset or does not parse.
pub const DEFAULT_FILTER: &str = "info";

/// rmcp's own lines, whatever `RUST_LOG` asks: its DEBUG lines carry whole requests and results
/// (a task, a reply) and its warnings about a bad parameter may quote its value; its errors
/// say what broke.
const RMCP_CAP: &str = "rmcp=error";

/// The most characters of a client's text (a path, a session id, a tool name) a log line shows.
pub const SHOWN_CHARS: usize = 128;

/// How many bytes of the keyed digest a [`Summary`] shows (12 hex characters): enough to tell
/// texts apart in one run's log, too few to be worth attacking.
const DIGEST_BYTES: usize = 6;

/// The size of the per-process digest key.
const KEY_BYTES: usize = 32;

/// Log lines that could not be written (stderr gone), since the process started.
static WRITE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Whether the text of messages and screens may be logged, at TRACE (`[gateway] log_text`).
static TEXT_ALLOWED: AtomicBool = AtomicBool::new(false);

/// Sets up fleetd's log: to stderr through a [`Relay`] (never blocking, never failing),
/// filtered by `RUST_LOG` (else [`DEFAULT_FILTER`]) with rmcp held to errors ([`RMCP_CAP`]),
/// coloured only on a terminal, as JSON lines when `json`. Fails if a subscriber is set already
/// or the writer thread cannot start.
pub fn init(json: bool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let filter = filter.add_directive(RMCP_CAP.parse()?);
    let writer = Relay::start(io::stderr(), relay::QUEUED_LINES, &WRITE_FAILURES)?;
    writer.install();
    if json {
        json_subscriber(filter, writer).try_init()?;
    } else {
        text_subscriber(filter, writer, io::stderr().is_terminal()).try_init()?;
    }
    Ok(())
}

/// The text subscriber: fields through [`EscapedFields`], into `writer`, which must not fail
/// (see [`Relay`]).
fn text_subscriber<W>(
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .fmt_fields(EscapedFields)
        .finish()
}

/// The JSON subscriber (`--log-json`), into `writer`, which must not fail.
fn json_subscriber<W>(
    filter: EnvFilter,
    writer: W,
) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .log_internal_errors(false)
        .json()
        .finish()
}

/// How many log lines could not be written since fleetd started (its stderr gone): the
/// `fleetd_log_write_failures` counter.
pub fn write_failures() -> u64 {
    WRITE_FAILURES.load(Ordering::Relaxed)
}

/// Lets [`trace_text`] log the text of messages and screens (at TRACE) when `on`: the config's
/// `[gateway] log_text`, applied once at start.
pub fn allow_text(on: bool) {
    TEXT_ALLOWED.store(on, Ordering::Relaxed);
}

/// Whether [`allow_text`] is on.
pub fn text_allowed() -> bool {
    TEXT_ALLOWED.load(Ordering::Relaxed)
}

/// What a log line shows of a text: its length in bytes and a digest keyed with this process's
/// key, as `len=42 digest=3f9a1c0b2e71`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The text's length in bytes.
    len: usize,
    /// The first bytes of its keyed digest.
    digest: [u8; DIGEST_BYTES],
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "len={} digest=", self.len)?;
        for byte in self.digest {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// The [`Summary`] of `text` under `key`.
fn summary_with(key: &[u8; KEY_BYTES], text: &str) -> Summary {
    let full = keyed_digest(key, text.as_bytes());
    let mut digest = [0; DIGEST_BYTES];
    digest.copy_from_slice(&full[..DIGEST_BYTES]);
    Summary {
        len: text.len(),
        digest,
    }
}

/// What a log line at DEBUG and above shows in place of `text` (a task, a reply, a screen…).
pub fn summary(text: &str) -> Summary {
    summary_with(process_key(), text)
}

/// Logs `text` (what it is: `what`) at TRACE with its [`Summary`], if [`allow_text`] is on;
/// else nothing. The summary ties it to the lines at higher levels that show only that.
pub fn trace_text(what: &'static str, text: &str) {
    if text_allowed() {
        tracing::trace!(what, summary = %summary(text), text, "text");
    }
}

/// HMAC-SHA256 of `text` under `key` (RFC 2104; the key is shorter than SHA-256's block, so it
/// is only padded).
fn keyed_digest(key: &[u8; KEY_BYTES], text: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut inner_pad = [0x36u8; BLOCK];
    let mut outer_pad = [0x5cu8; BLOCK];
    for (i, byte) in key.iter().enumerate() {
        inner_pad[i] ^= byte;
        outer_pad[i] ^= byte;
    }
    let inner = Sha256::new()
        .chain_update(inner_pad)
        .chain_update(text)
        .finalize();
    Sha256::new()
        .chain_update(outer_pad)
        .chain_update(inner)
        .finalize()
        .into()
}

/// This process's digest key: random, made at first use, never written anywhere.
fn process_key() -> &'static [u8; KEY_BYTES] {
    static KEY: OnceLock<[u8; KEY_BYTES]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut key = [0; KEY_BYTES];
        if getrandom::fill(&mut key).is_err() {
            // No OS randomness: std's per-process hash seeds, which come from the same source
            // or from what the platform offers instead.
            use std::hash::{BuildHasher, Hasher};
            let seeds = std::hash::RandomState::new();
            for (n, chunk) in key.chunks_mut(8).enumerate() {
                let mut hasher = seeds.build_hasher();
                hasher.write_usize(n);
                chunk.copy_from_slice(&hasher.finish().to_le_bytes()[..chunk.len()]);
            }
        }
        key
    })
}

/// A pane host error as a log line may show it: a multiplexer's answer or complaint (which may
/// quote a screen, or echo what was typed) only as its [`Summary`]; the rest as it is.
pub fn mux_error(error: &MuxError) -> MuxErrorShown<'_> {
    MuxErrorShown(error)
}

/// See [`mux_error`].
pub struct MuxErrorShown<'a>(&'a MuxError);

impl fmt::Display for MuxErrorShown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            MuxError::Command { command, stderr } => {
                write!(f, "{command} failed: {}", summary(stderr))
            }
            MuxError::Protocol { command, answer } => {
                write!(f, "unexpected answer from {command}: {}", summary(answer))
            }
            other => fmt::Display::fmt(other, f),
        }
    }
}

/// A client's `text` as a log line may show it: at most [`SHOWN_CHARS`] characters, anything
/// but visible ASCII shown as `?`, so it can neither forge a line nor flood the log (the
/// formatter escapes every field on top of that: this keeps a name short and plain).
pub fn shown(text: &str) -> String {
    text.chars()
        .take(SHOWN_CHARS)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

use fleet_core::inert::Escaping;
pub use fleet_core::inert::escape;

/// The field formatter of the text output: `name=value` pairs and the message, like
/// tracing-subscriber's own, with every value and the message passed through [`escape`]. A
/// string field is quoted (as `Debug` shows it), a `%` field is not. A value whose `Debug` or
/// `Display` fails shows what it wrote until then: formatting never fails, since a failure
/// would make tracing-subscriber report it on stderr.
#[derive(Clone, Copy, Debug, Default)]
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = EscapingVisitor {
            writer,
            first: true,
        };
        fields.record(&mut visitor);
        Ok(())
    }
}

/// Writes each field of a line or span, escaped (see [`EscapedFields`]).
struct EscapingVisitor<'writer> {
    /// Where the line is written.
    writer: Writer<'writer>,
    /// No field is written yet (none needs a space before it).
    first: bool,
}

impl Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        // The `log` crate's metadata, which the line shows already.
        if name.starts_with("log.") {
            return;
        }
        if !std::mem::take(&mut self.first) {
            let _ = self.writer.write_char(' ');
        }
        if name != "message" {
            let name = name.strip_prefix("r#").unwrap_or(name);
            let _ = if self.writer.has_ansi_escapes() {
                write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")
            } else {
                write!(self.writer, "{name}=")
            };
        }
        let _ = write!(Escaping(&mut self.writer), "{value:?}");
    }
}

/// The span of work for the session of `gid`, named `name`, inside whatever called for it (a
/// `fleet_stop`, say).
pub fn session_span(gid: Gid, name: &str) -> Span {
    tracing::info_span!("session", %gid, name = %name)
}

/// The span of a session's own task (its pump): a root, since the task outlives the
/// `fleet_spawn` call that started it.
pub fn session_task_span(gid: Gid, name: &str) -> Span {
    tracing::info_span!(parent: None, "session", %gid, name = %name)
}

/// Notes that the round trip of task `round_trip` reached `step`, at TRACE under the target
/// `fleet_steps` (its `at_us`: Unix microseconds), for `fleet-bench local` to cut a round trip
/// into its steps. Off unless asked for (`RUST_LOG=warn,fleet_steps=trace`): nothing of it is
/// computed then but the check.
pub fn step(round_trip: fleet_core::MsgId, step: &'static str) {
    tracing::trace!(target: "fleet_steps", %round_trip, step, at_us = unix_us());
}

/// Now, in Unix microseconds.
fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// The span of everything done with `message`: grep a trace id to follow a flow across its
/// hops (and across hosts: the id travels in the envelope).
pub fn message_span(message: &Message) -> Span {
    tracing::info_span!(
        "message",
        trace_id = %message.trace_id,
        msg_id = %message.msg_id,
        kind = %message.kind,
    )
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A log kept in memory.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;

        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    /// What `log` logs through the text subscriber at every level, without colours.
    fn text_log(log: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let subscriber = text_subscriber(EnvFilter::new("trace"), buffer.clone(), false);
        tracing::subscriber::with_default(subscriber, log);
        buffer.text()
    }

    #[test]
    fn fields_and_messages_are_escaped_into_one_line() {
        let forged = "ready> echo SECRET\nINFO forged line\r\u{1b}[31mred\u{1b}[0m\u{2028}x";
        let log = text_log(|| {
            let span = tracing::info_span!("session", name = %forged);
            let _entered = span.enter();
            tracing::info!(words = %forged, quoted = forged, count = 3, "message {forged}");
        });
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(!log.contains('\u{1b}') && !log.contains('\r'), "{log:?}");
        let escaped = "ready> echo SECRET\\nINFO forged line\\r\\u{1b}[31mred\\u{1b}[0m\\u{2028}x";
        assert!(log.contains(&format!("session{{name={escaped}}}")), "{log}");
        assert!(log.contains(&format!("message {escaped}")), "{log}");
        assert!(log.contains(&format!("words={escaped}")), "{log}");
        // A string field is quoted, as Debug shows it, and then escaped.
        assert!(log.contains("quoted=\"ready> echo SECRET\\nINFO"), "{log}");
        assert!(log.contains("count=3"), "{log}");
    }

    #[test]
    fn the_json_output_keeps_a_line_one_line() {
        let buffer = Buffer::default();
        let subscriber = json_subscriber(EnvFilter::new("trace"), buffer.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(words = %"a\nINFO forged\r\u{1b}[31m", "said\nINFO forged");
        });
        let log = buffer.text();
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(!log.contains('\u{1b}') && !log.contains('\r'), "{log:?}");
        let line: serde_json::Value = serde_json::from_str(log.trim_end()).unwrap();
        assert_eq!(line["fields"]["words"], "a\nINFO forged\r\u{1b}[31m");
    }

    #[test]
    fn a_summary_shows_length_and_keyed_digest_never_the_text() {
        let key = [7u8; KEY_BYTES];
        let shown = summary_with(&key, "SECRET-TASK-7f3a").to_string();
        assert!(shown.starts_with("len=16 digest="), "{shown}");
        assert_eq!(shown.len(), "len=16 digest=".len() + 2 * DIGEST_BYTES);
        assert!(!shown.contains("SECRET"), "{shown}");
        // The same text under the same key reads the same; another text or key does not.
        assert_eq!(shown, summary_with(&key, "SECRET-TASK-7f3a").to_string());
        assert_ne!(shown, summary_with(&key, "SECRET-TASK-7f3b").to_string());
        assert_ne!(
            shown,
            summary_with(&[8; KEY_BYTES], "SECRET-TASK-7f3a").to_string()
        );
        assert_eq!(summary(""), summary(""));
        assert!(summary("").to_string().starts_with("len=0 digest="));
    }

    #[test]
    fn the_digest_is_hmac_sha256() {
        // RFC 4231, test case 2: the key "Jefe", padded with zeros as HMAC pads it.
        let mut key = [0u8; KEY_BYTES];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex::encode(keyed_digest(&key, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn text_reaches_the_log_only_at_trace_and_only_when_allowed() {
        let secret = "SECRET-REPLY-91c2\nINFO forged";
        let logged = || {
            text_log(|| {
                tracing::info!(text = %summary(secret), "replied");
                trace_text("reply", secret);
            })
        };
        // The only test that turns the switch: off, on, off again.
        allow_text(false);
        let off = logged();
        assert!(!off.contains("SECRET"), "{off}");
        assert!(off.contains(&format!("text={}", summary(secret))), "{off}");
        assert!(!off.contains("TRACE"), "{off}");
        allow_text(true);
        let on = logged();
        allow_text(false);
        let trace: Vec<_> = on.lines().filter(|l| l.contains("SECRET")).collect();
        assert_eq!(trace.len(), 1, "{on}");
        assert!(trace[0].contains("TRACE"), "{on}");
        assert!(
            trace[0].contains("text=\"SECRET-REPLY-91c2\\nINFO forged\""),
            "{on}"
        );
        assert!(
            trace[0].contains(&format!("summary={}", summary(secret))),
            "{on}"
        );
        // Nowhere else, and never at a higher level.
        assert!(
            on.lines()
                .all(|l| !l.contains("SECRET") || l.contains("TRACE"))
        );
    }

    #[test]
    fn a_pane_hosts_answer_is_summarised() {
        let error = MuxError::Protocol {
            command: "snapshot of %3".into(),
            answer: "SECRET-SCREEN\nINFO forged".into(),
        };
        let shown = mux_error(&error).to_string();
        assert!(shown.starts_with("unexpected answer from snapshot of %3: len=25 digest="));
        assert!(!shown.contains("SECRET"), "{shown}");
        let error = MuxError::Command {
            command: "send-keys".into(),
            stderr: "SECRET".into(),
        };
        assert!(!mux_error(&error).to_string().contains("SECRET"));
        let gone = MuxError::NoPane(fleet_mux::PaneId("%3".into()));
        assert_eq!(mux_error(&gone).to_string(), gone.to_string());
    }

    #[test]
    fn a_clients_text_is_shown_inert_and_short() {
        assert_eq!(shown("fleet_send"), "fleet_send");
        assert_eq!(shown("/mcp?x=1"), "/mcp?x=1");
        assert_eq!(
            shown("a\nINFO forged line\u{1b}[31m"),
            "a?INFO?forged?line?[31m"
        );
        assert_eq!(shown(&"x".repeat(100_000)).len(), SHOWN_CHARS);
        assert_eq!(shown(""), "");
    }
}
