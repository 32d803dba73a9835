//! `fleetd tail`: the gateway's live feed (`GET /api/v1/events`) as it happens, one line per
//! change: entities made and changing status, messages made and moving through their states,
//! failures with their reasons. `--json` prints each event as one JSON line. The stream ends
//! with exit status 3 when the gateway goes away.

use std::io::Write;

use anyhow::Context;
use clap::Args;
use serde_json::Value;

use crate::ops::{
    EXIT_UNREACHABLE, OpsArgs, OpsError, printable, refusal, target, terminal_json, unreachable,
};
use crate::paths::Paths;

/// `fleetd tail`
#[derive(Debug, Args)]
pub struct TailArgs {
    /// Who to ask as, and how to print.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// Start after this event number (each `--json` line has its `seq`) instead of now: what
    /// happened since is printed first.
    #[arg(long, value_name = "SEQ")]
    pub after: Option<i64>,
}

/// The most one event may hold; a longer one is dropped whole (a stream gone wrong).
const MAX_EVENT_BYTES: usize = 1 << 20;

/// One server-sent event: its name (`message` unless named) and its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// Its name.
    pub name: String,
    /// Its data lines, joined.
    pub data: String,
}

/// Server-sent events read off a byte stream: whole events come out, however the bytes were
/// cut, lines ended by CRLF, LF or CR alike.
#[derive(Debug, Default)]
pub struct SseReader {
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    /// The last byte was a CR (a LF right after it ends nothing more).
    after_cr: bool,
    /// The data lines of the event being read.
    data: Vec<String>,
    /// Its name, if named.
    name: Option<String>,
    /// How many bytes it holds so far.
    size: usize,
    /// It grew past [`MAX_EVENT_BYTES`]: it is dropped when it ends.
    overflowed: bool,
    /// The line being read lost bytes to the cap (it is not a blank line, whatever is left).
    line_cut: bool,
}

impl SseReader {
    /// Reads `bytes`; returns every event they completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut done = Vec::new();
        for &byte in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\r' | b'\n' => self.end_line(&mut done),
                _ if self.size + self.partial.len() < MAX_EVENT_BYTES => self.partial.push(byte),
                _ => self.line_cut = true,
            }
        }
        done
    }

    fn end_line(&mut self, done: &mut Vec<SseEvent>) {
        let line = String::from_utf8_lossy(&self.partial).into_owned();
        self.partial.clear();
        if std::mem::take(&mut self.line_cut) {
            // What is left of a line cut at the cap is no line to read.
            self.overflowed = true;
            return;
        }
        let line = line.trim_start_matches('\u{feff}');
        if line.is_empty() {
            let name = self.name.take().unwrap_or_else(|| "message".into());
            let data = std::mem::take(&mut self.data);
            let overflowed = std::mem::take(&mut self.overflowed);
            if !data.is_empty() && !overflowed {
                done.push(SseEvent {
                    name,
                    data: data.join("\n"),
                });
            }
            self.size = 0;
        } else if let Some(data) = line.strip_prefix("data:") {
            let data = data.strip_prefix(' ').unwrap_or(data);
            self.size += data.len();
            self.data.push(data.to_string());
        } else if let Some(name) = line.strip_prefix("event:") {
            self.name = Some(name.trim().to_string());
        }
        // `id:`, `retry:` and `:` comments (keep-alives) carry nothing to print.
    }
}

/// `ms` (Unix) as the UTC time of day, `HH:MM:SS.mmm`.
pub fn clock(ms: i64) -> String {
    let day_ms = ms.rem_euclid(86_400_000);
    let (h, m, s, milli) = (
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000,
    );
    format!("{h:02}:{m:02}:{s:02}.{milli:03}")
}

/// The line `fleetd tail` prints for one event; none for one it does not know.
pub fn event_line(event: &Value, colour: bool) -> Option<String> {
    let text = |key: &str| printable(event[key].as_str().unwrap_or("-"));
    let at = clock(event["at_ms"].as_i64()?);
    let paint = |state: &str| {
        let code = match state {
            "failed" | "gone" | "blocked" => "31",
            "queued" | "injecting" | "held" | "spawning" | "busy" | "asking" | "stopping" => "33",
            _ => "32",
        };
        let state = printable(state);
        if colour {
            format!("\x1b[{code}m{state}\x1b[0m")
        } else {
            state
        }
    };
    match event["subject"].as_str()? {
        "message" => {
            let mut line = format!(
                "{at} message {} {} -> {} {} {}",
                text("kind"),
                text("from_name"),
                text("to_name"),
                paint(event["state"].as_str()?),
                text("msg_id"),
            );
            if let Some(reason) = event["reason"].as_str() {
                line.push_str(&format!(": {}", printable(reason)));
            }
            Some(line)
        }
        "entity" => Some(format!(
            "{at} entity {} ({}, {}) {}",
            text("name"),
            text("role"),
            text("profile"),
            paint(event["status"].as_str()?),
        )),
        _ => None,
    }
}

/// `fleetd tail`: prints the gateway's changes as they happen, until it goes away.
pub fn tail_command(paths: &Paths, args: &TailArgs) -> anyhow::Result<()> {
    let query: Vec<(&str, String)> = args
        .after
        .map(|after| ("after", after.to_string()))
        .into_iter()
        .collect();
    let target = target(paths, &args.ops, "/api/v1/events", &query)?;
    let colour = !args.ops.json && crate::ops::terminal().1;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let connect = std::time::Duration::from_secs(15);
        // The gateway sends a keep-alive every 15 s: silence three times that long is a
        // connection gone dead.
        let client = reqwest::Client::builder()
            .connect_timeout(connect)
            .read_timeout(std::time::Duration::from_secs(45))
            .build()?;
        let mut response = client
            .get(&target.url)
            .bearer_auth(&target.token)
            .send()
            .await
            .map_err(|e| unreachable(&target, connect, &e))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(refusal(&target, status, &text));
        }
        // The feed starts once the gateway answered: say so, where a script does not parse.
        eprintln!("fleetd: following {} (Ctrl-C to stop)", target.url);
        let mut reader = SseReader::default();
        let mut out = std::io::stdout().lock();
        let mut last = args.after;
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) | Err(_) => break,
            };
            for sse in reader.feed(&chunk) {
                let Ok(event) = serde_json::from_str::<Value>(&sse.data) else {
                    continue;
                };
                if sse.name == "error" {
                    return Err(OpsError {
                        exit: 1,
                        message: printable(event["message"].as_str().unwrap_or("the feed failed")),
                    }
                    .into());
                }
                last = event["seq"].as_i64().or(last);
                let line = if args.ops.json {
                    Some(terminal_json(&event).replace('\n', ""))
                } else {
                    event_line(&event, colour)
                };
                if let Some(line) = line {
                    writeln!(out, "{line}").context("standard output")?;
                    out.flush().context("standard output")?;
                }
            }
        }
        let resume = last.map_or_else(String::new, |seq| {
            format!("; `fleetd tail --after {seq}` reads on from the last event printed")
        });
        Err(OpsError {
            exit: EXIT_UNREACHABLE,
            message: format!(
                "the gateway at {} closed the feed or went silent (was it stopped?){resume}",
                target.url
            ),
        }
        .into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_whole_however_the_bytes_are_cut_and_lines_end() {
        let stream = "\u{feff}: keep-alive\n\nid: 4\ndata: {\"a\":1}\n\nid: 5\r\ndata:{\"b\":2}\r\n\r\nevent: error\rdata: x\rdata: y\r\r";
        let stream = stream.as_bytes();
        let event = |name: &str, data: &str| SseEvent {
            name: name.into(),
            data: data.into(),
        };
        for cut in 0..stream.len() {
            let mut reader = SseReader::default();
            let mut got = reader.feed(&stream[..cut]);
            got.extend(reader.feed(&stream[cut..]));
            assert_eq!(
                got,
                [
                    event("message", "{\"a\":1}"),
                    event("message", "{\"b\":2}"),
                    event("error", "x\ny")
                ],
                "cut at {cut}"
            );
        }
        // An event not yet ended by its blank line is not given out.
        assert!(SseReader::default().feed(b"data: x\n").is_empty());
    }

    #[test]
    fn an_event_past_the_cap_is_dropped_and_the_next_comes_through() {
        let mut reader = SseReader::default();
        let huge = format!("data: {}\n\n", "x".repeat(MAX_EVENT_BYTES + 10));
        assert!(reader.feed(huge.as_bytes()).is_empty());
        assert_eq!(reader.feed(b"data: ok\n\n")[0].data, "ok");
        // Of an event cut at the cap, nothing comes out, not even its tail as an event.
        let cut = format!(
            "data: {}\ndata: tail\n\ndata: next\n\n",
            "x".repeat(MAX_EVENT_BYTES + 10)
        );
        let got = reader.feed(cut.as_bytes());
        assert_eq!(
            got.len(),
            1,
            "{:?}",
            got.iter().map(|e| e.data.len()).collect::<Vec<_>>()
        );
        assert_eq!(got[0].data, "next");
        // A long comment sets nothing off: the next event comes through.
        let comment = format!(": {}\n\ndata: after\n\n", "c".repeat(MAX_EVENT_BYTES + 10));
        assert_eq!(reader.feed(comment.as_bytes())[0].data, "after");
    }

    #[test]
    fn a_line_names_what_changed_and_never_carries_a_control_character() {
        let message = serde_json::json!({
            "seq": 9, "at_ms": 3_723_004_i64, "subject": "message", "msg_id": "m1",
            "kind": "FAILED", "from_name": "w1", "to_name": "lead\u{1b}[2J",
            "state": "failed", "reason": "its worker\u{7} stopped",
        });
        assert_eq!(
            event_line(&message, false).unwrap(),
            "01:02:03.004 message FAILED w1 -> lead?[2J failed m1: its worker? stopped"
        );
        assert!(
            event_line(&message, true)
                .unwrap()
                .contains("\x1b[31mfailed\x1b[0m")
        );
        let entity = serde_json::json!({
            "seq": 10, "at_ms": 0, "subject": "entity", "gid": "g", "name": "w1",
            "role": "worker", "profile": "sim", "status": "idle",
        });
        assert_eq!(
            event_line(&entity, false).unwrap(),
            "00:00:00.000 entity w1 (worker, sim) idle"
        );
        assert!(event_line(&serde_json::json!({"subject": "other", "at_ms": 1}), false).is_none());
    }
}
