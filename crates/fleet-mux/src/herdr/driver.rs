//! The thin async driver of herdr's socket: one connection per request (herdr answers one line
//! and closes), and a long-lived subscription connection that reconnects by itself.
//!
//! herdr reads a request line by polling its new connection, and when the first poll finds
//! nothing it sleeps 100 ms before the next (`CONNECTION_POLL_INTERVAL` in herdr's
//! `api/server.rs`, v0.8.0 and main alike). A client that connects, waits for the event loop to
//! call the socket writable and only then writes loses that race often enough that most round
//! trips paid one such sleep (p50 108 ms against tmux's 11 ms, measured on herdr 0.8.0). So a
//! request is written in the same synchronous step as the connect ([`connect_and_write`]):
//! the line is in herdr's socket buffer before herdr's connection thread first looks.

use std::io;
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
/// The first pause before connecting again when herdr's accept queue is full; doubled up to
/// [`MAX_CONNECT_RETRY`].
const FIRST_CONNECT_RETRY: Duration = Duration::from_millis(1);
/// The longest pause between attempts to connect.
const MAX_CONNECT_RETRY: Duration = Duration::from_millis(100);
/// How long one answer may take. herdr polls for a request every ~100 ms, so stalls of that
/// size are normal; much longer means it is wedged.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read may go unanswered before it is asked again on a second connection: herdr
/// answers in well under a millisecond, unless the request met its 100 ms nap (see the module's
/// note).
const HEDGE_AFTER: Duration = Duration::from_millis(15);
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

    /// Opens a connection and sends `request` on it (see the module's note on why both happen
    /// in one step).
    async fn send(&self, request: &str) -> Result<UnixStream, MuxError> {
        let bytes = request.as_bytes();
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        let mut pause = FIRST_CONNECT_RETRY;
        let (mut stream, written) = loop {
            match connect_and_write(&self.socket, bytes) {
                Ok(sent) => break sent,
                // herdr's accept queue is full (herdr busy or wedged): try again shortly.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if tokio::time::Instant::now() + pause > deadline {
                        return Err(self.unreachable(format!(
                            "its accept queue stayed full for {CONNECT_TIMEOUT:?}"
                        )));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_CONNECT_RETRY);
                }
                Err(e) => return Err(self.unreachable(e)),
            }
        };
        if written < bytes.len() {
            stream
                .write_all(&bytes[written..])
                .await
                .map_err(|e| self.unreachable(e))?;
        }
        Ok(stream)
    }

    /// Sends one request and reads herdr's answer, whatever it says.
    async fn exchange(&self, method: &str, params: Value) -> Result<Answer, MuxError> {
        let id = format!("fleetd-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let stream = self.send(&codec::request(&id, method, params)).await?;
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
        Ok(answer)
    }

    /// Sends one request and returns its result; herdr's errors become [`MuxError`]s
    /// (`pane_not_found` is [`MuxError::NoPane`]).
    pub async fn call(&self, (method, params): (&str, Value)) -> Result<Value, MuxError> {
        let pane = params["pane_id"].as_str().map(String::from);
        let answer = self.exchange(method, params).await?;
        Self::result(method, pane, answer)
    }

    /// [`Driver::call`] for a request that changes nothing (a read). When herdr has not answered
    /// within [`HEDGE_AFTER`] — most likely its connection thread looked before the request
    /// was there and is napping — the same request goes out again on a second connection, and
    /// whichever answer comes first counts.
    pub async fn read(&self, (method, params): (&str, Value)) -> Result<Value, MuxError> {
        let pane = params["pane_id"].as_str().map(String::from);
        let first = self.exchange(method, params.clone());
        tokio::pin!(first);
        let answer = tokio::select! {
            answer = &mut first => answer,
            () = tokio::time::sleep(HEDGE_AFTER) => {
                tracing::debug!(method, "herdr is slow to answer a read: asking again");
                let second = self.exchange(method, params);
                tokio::pin!(second);
                // The first answer that is an answer counts; an error waits for the other.
                tokio::select! {
                    answer = &mut first => match answer {
                        Ok(answer) => Ok(answer),
                        Err(_) => second.await,
                    },
                    answer = &mut second => match answer {
                        Ok(answer) => Ok(answer),
                        Err(_) => first.await,
                    },
                }
            }
        }?;
        Self::result(method, pane, answer)
    }

    /// An answer's result, or its error as a [`MuxError`].
    fn result(method: &str, pane: Option<String>, answer: Answer) -> Result<Value, MuxError> {
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

    /// Checks that this herdr will do: [`Driver::ping`], then every [`codec::probes`] request
    /// and a subscription (opened and dropped). Changes nothing on the server. Returns herdr's
    /// version and protocol number; a herdr that lacks something fleetd needs is refused with
    /// what it lacks and the release to install.
    pub async fn check(&self) -> Result<(String, u64), MuxError> {
        let (version, protocol) = self.ping().await?;
        let lacks = |needs: &'static str, answer: String| MuxError::Protocol {
            command: "a capability check".into(),
            answer: codec::CodecError::Lacks {
                version: version.clone(),
                protocol,
                needs,
                answer,
            }
            .to_string(),
        };
        for probe in codec::probes() {
            let (method, params) = probe.request;
            let answer = self.exchange(method, params).await?;
            if !codec::understood(&answer) {
                return Err(lacks(probe.needs, format!("{answer:?}")));
            }
        }
        let (method, params) = codec::subscribe_lifecycle();
        let stream = self
            .send(&codec::request("fleetd-probe", method, params))
            .await?;
        let mut line = String::new();
        match timeout(ANSWER_TIMEOUT, BufReader::new(stream).read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => return Err(MuxError::Disconnected),
            Ok(Err(e)) => return Err(self.unreachable(e)),
            Err(_) => return Err(lacks("events.subscribe", "no answer".into())),
        }
        match codec::parse_event(&line) {
            Ok(Event::Started) => Ok((version, protocol)),
            _ => Err(lacks(
                "events.subscribe to pane.exited",
                line.trim().to_string(),
            )),
        }
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
        let (method, params) = codec::subscribe_lifecycle();
        let stream = self
            .send(&codec::request("fleetd-events", method, params))
            .await?;
        let mut lines = BufReader::new(stream).lines();
        while let Some(line) = lines.next_line().await.map_err(|e| self.unreachable(e))? {
            match codec::parse_event(&line) {
                Ok(event) => {
                    if events.send(event).await.is_err() {
                        return Ok(());
                    }
                }
                // Not the error: it quotes the line, which may hold a pane's text.
                Err(_) => tracing::warn!(
                    bytes = line.len(),
                    "skipping a herdr line that is not an event"
                ),
            }
        }
        Ok(())
    }
}

/// Connects to `socket` without blocking and writes as much of `request` as the socket takes at
/// once (all of it, for any request but a huge paste); returns the stream and how much was
/// written. `WouldBlock` means herdr's accept queue is full.
fn connect_and_write(socket: &Path, request: &[u8]) -> io::Result<(UnixStream, usize)> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(socket)?)?;
    let written = match rustix::net::send(&fd, request, rustix::net::SendFlags::NOSIGNAL) {
        Ok(n) => n,
        Err(rustix::io::Errno::AGAIN) => 0,
        Err(e) => return Err(e.into()),
    };
    let stream = UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))?;
    Ok((stream, written))
}
