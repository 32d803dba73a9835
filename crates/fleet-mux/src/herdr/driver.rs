//! The thin async driver of herdr's socket: one connection per request (herdr answers one line
//! and closes), and a long-lived subscription connection that reconnects by itself.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::codec::{self, Answer, Event};
use crate::{MuxError, PaneId};

/// How long connecting may take before herdr counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one answer may take. herdr polls for a request every ~100 ms, so stalls of that
/// size are normal; much longer means it is wedged.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause before a lost subscription is made again; doubled up to [`MAX_RESUBSCRIBE`].
const FIRST_RESUBSCRIBE: Duration = Duration::from_millis(100);
/// The longest pause between attempts to subscribe again.
const MAX_RESUBSCRIBE: Duration = Duration::from_secs(2);

/// A client of one herdr server.
#[derive(Debug)]
pub struct Driver {
    /// The server's socket.
    socket: PathBuf,
    /// The next request id (ids are opaque to herdr; ours only need to differ).
    next_id: AtomicU64,
}

impl Driver {
    /// A client of the server listening on `socket`.
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            next_id: AtomicU64::new(1),
        }
    }

    /// The server's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn unreachable(&self, why: impl std::fmt::Display) -> MuxError {
        MuxError::Unreachable(format!("herdr at {} ({why})", self.socket.display()))
    }

    async fn connect(&self) -> Result<UnixStream, MuxError> {
        match timeout(CONNECT_TIMEOUT, UnixStream::connect(&self.socket)).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(self.unreachable(e)),
            Err(_) => Err(self.unreachable("connecting timed out")),
        }
    }

    /// Sends one request and returns its result; herdr's errors become [`MuxError`]s
    /// (`pane_not_found` is [`MuxError::NoPane`]).
    pub async fn call(&self, (method, params): (&str, Value)) -> Result<Value, MuxError> {
        let id = format!("fleetd-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let pane = params["pane_id"].as_str().map(String::from);
        let mut stream = self.connect().await?;
        stream
            .write_all(codec::request(&id, method, params).as_bytes())
            .await
            .map_err(|e| self.unreachable(e))?;
        let mut line = String::new();
        let mut reader = BufReader::new(stream);
        match timeout(ANSWER_TIMEOUT, reader.read_line(&mut line)).await {
            Ok(Ok(0)) => return Err(MuxError::Disconnected),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(self.unreachable(e)),
            Err(_) => {
                return Err(MuxError::Command {
                    command: method.to_string(),
                    stderr: format!("herdr did not answer within {ANSWER_TIMEOUT:?}"),
                });
            }
        }
        let protocol = |answer: String| MuxError::Protocol {
            command: method.to_string(),
            answer,
        };
        let (answer_id, answer) =
            codec::parse_answer(&line).map_err(|e| protocol(e.to_string()))?;
        if !answer_id.is_empty() && answer_id != id {
            return Err(protocol(format!(
                "an answer to '{answer_id}', not to '{id}'"
            )));
        }
        match answer {
            Answer::Result(result) => Ok(result),
            Answer::Error { code, .. } if code == "pane_not_found" => {
                Err(MuxError::NoPane(PaneId(pane.unwrap_or_default())))
            }
            Answer::Error { code, message } => Err(MuxError::Command {
                command: method.to_string(),
                stderr: format!("{code}: {message}"),
            }),
        }
    }

    /// Pings herdr and checks its protocol; returns its version and protocol number.
    pub async fn ping(&self) -> Result<(String, u64), MuxError> {
        let result = self.call(codec::ping()).await?;
        codec::check_pong(&result).map_err(|e| MuxError::Protocol {
            command: "ping".into(),
            answer: e.to_string(),
        })
    }

    /// Streams the lifecycle events into `events` until its receiver is dropped, subscribing
    /// again whenever the connection is lost (herdr restarting, say). Lines that cannot be read
    /// are logged and skipped.
    pub async fn follow(&self, events: mpsc::Sender<Event>) {
        let mut pause = FIRST_RESUBSCRIBE;
        loop {
            let followed = tokio::select! {
                result = self.subscription(&events) => result,
                () = events.closed() => return,
            };
            match followed {
                Ok(()) => pause = FIRST_RESUBSCRIBE,
                Err(e) => tracing::debug!(error = %e, "herdr subscription lost"),
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = events.closed() => return,
            }
            pause = (pause * 2).min(MAX_RESUBSCRIBE);
        }
    }

    /// One subscription, until its connection ends.
    async fn subscription(&self, events: &mpsc::Sender<Event>) -> Result<(), MuxError> {
        let mut stream = self.connect().await?;
        let (method, params) = codec::subscribe_lifecycle();
        stream
            .write_all(codec::request("fleetd-events", method, params).as_bytes())
            .await
            .map_err(|e| self.unreachable(e))?;
        let mut lines = BufReader::new(stream).lines();
        while let Some(line) = lines.next_line().await.map_err(|e| self.unreachable(e))? {
            match codec::parse_event(&line) {
                Ok(event) => {
                    if events.send(event).await.is_err() {
                        return Ok(());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "skipping a herdr line"),
            }
        }
        Ok(())
    }
}
