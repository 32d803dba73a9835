//! The AMQP link of the federated plane (spec 10 §3, §4, §8): one connection per gateway, the
//! shared exchanges, per-entity inboxes, this host's roster queue, and a publish channel with
//! confirms, `mandatory` and returns. It knows envelopes and queues, not sessions: the gateway
//! decides what a delivery means.

use std::time::Duration;

use fleet_core::envelope::{Envelope, EnvelopeError, HeaderValue};
use fleet_core::{ErrorCode, FleetError, Gid};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, ByteArray, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer,
    ExchangeKind,
};

use crate::config::{BrokerConfig, FederationConfig};

/// Entity → entity messages and broadcasts; routing key = recipient gid or `broadcast.*`.
pub const MSG_EXCHANGE: &str = "fleet.msg";
/// Presence heartbeats; routing key = `roster.<host>.<gid>`.
pub const ROSTER_EXCHANGE: &str = "fleet.roster";
/// Cross-host control (spawn, stop); routing key = host id.
pub const CONTROL_EXCHANGE: &str = "fleet.control";
/// Where inboxes dead-letter to.
pub const DEAD_LETTER_EXCHANGE: &str = "fleet.dlx";
/// The capped queue behind [`DEAD_LETTER_EXCHANGE`].
pub const DEAD_LETTER_QUEUE: &str = "fleet.dlq";
/// The broadcast key every worker inbox is bound to.
pub const BROADCAST_ALL: &str = "broadcast.all";
/// How long a publish may wait for the broker's confirm before it counts as unavailable.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait for the broker to delete an inbox or to close the connection: a stop or a
/// shutdown never hangs on a slow or confused broker link (seen once: lapin's close waited
/// forever after a channel error).
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The inbox queue of entity `gid` (`.v2`: recipient-keyed, spec 10 §3).
pub fn inbox_queue(gid: Gid) -> String {
    format!("agent.{gid}.inbox.v2")
}

/// The broadcast key of `group`.
pub fn broadcast_key(group: &str) -> String {
    format!("broadcast.{group}")
}

/// This host's roster queue.
pub fn roster_queue(host: &str) -> String {
    format!("roster.{host}")
}

/// The roster routing key of `who` (a gid, or `_gateway` for the host entry) on `host`.
pub fn roster_key(host: &str, who: &str) -> String {
    format!("roster.{host}.{who}")
}

/// A broker call failed: `retry` when the broker is unreachable or the link broke (try again
/// later); otherwise the broker refused what we asked (a configuration problem to report).
#[derive(Debug)]
pub struct LinkError {
    /// What went wrong, as a sentence.
    pub message: String,
    /// Whether a later attempt may succeed on its own.
    pub retry: bool,
}

impl LinkError {
    fn from_lapin(what: &str, err: &lapin::Error) -> Self {
        let retry = !err.is_amqp_soft_error();
        let detail = match err.kind() {
            lapin::ErrorKind::ProtocolError(amqp) => amqp.get_message().to_string(),
            _ => err.to_string(),
        };
        Self {
            message: format!("{what}: {detail}"),
            retry,
        }
    }
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The connection URI with the password from the environment (when the URI has none) and the
/// configured heartbeat.
fn connection_uri(config: &BrokerConfig) -> Result<String, LinkError> {
    let bad = |why: String| LinkError {
        message: why,
        retry: false,
    };
    let mut url = url::Url::parse(&config.uri).map_err(|e| bad(format!("broker.uri: {e}")))?;
    if url.password().is_none()
        && let Ok(password) = std::env::var(&config.password_env)
    {
        url.set_password(Some(&password))
            .map_err(|()| bad("broker.uri cannot carry a password".into()))?;
    }
    if !url.query_pairs().any(|(k, _)| k == "heartbeat") {
        url.query_pairs_mut()
            .append_pair("heartbeat", &config.heartbeat_s.to_string());
    }
    Ok(url.to_string())
}

/// One live connection with its publish channel.
pub struct Link {
    connection: Connection,
    publish: Channel,
    federation: FederationConfig,
    prefetch: u16,
}

/// Where a publish went.
#[derive(Debug, PartialEq, Eq)]
pub enum Published {
    /// The broker took it and routed it to at least one queue (or `mandatory` was off).
    Routed,
    /// No queue is bound to the key: the recipient's inbox does not exist.
    Unroutable,
    /// The broker refused it (the recipient's inbox is full: it went to the dead letters).
    Refused,
}

impl Link {
    /// Connects, opens the publish channel and declares the shared exchanges and the dead
    /// letter queue.
    pub async fn connect(
        config: &BrokerConfig,
        federation: &FederationConfig,
        host: &str,
    ) -> Result<Link, LinkError> {
        let uri = connection_uri(config)?;
        let properties =
            ConnectionProperties::default().with_connection_name(format!("fleetd@{host}").into());
        let connection = Connection::connect(&uri, properties)
            .await
            .map_err(|e| LinkError::from_lapin("cannot connect to the broker", &e))?;
        let publish = connection
            .create_channel()
            .await
            .map_err(|e| LinkError::from_lapin("cannot open a channel", &e))?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| LinkError::from_lapin("cannot turn on publisher confirms", &e))?;
        let link = Link {
            connection,
            publish,
            federation: federation.clone(),
            prefetch: config.prefetch,
        };
        link.declare_shared().await?;
        Ok(link)
    }

    /// Whether the connection still works.
    pub fn is_up(&self) -> bool {
        self.connection.status().connected() && self.publish.status().connected()
    }

    /// Waits until the connection fails (or is closed).
    pub async fn closed(&self) {
        use futures_util::StreamExt;
        let mut events = std::pin::pin!(self.connection.events_listener());
        while self.is_up() {
            tokio::select! {
                event = events.next() => match event {
                    Some(lapin::Event::Error(_)) | None => break,
                    Some(_) => {}
                },
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// Closes the connection (giving up after [`TEARDOWN_TIMEOUT`]: the socket goes with the
    /// process, or with the next connection attempt).
    pub async fn close(&self) {
        let closing = self.connection.close(200, "fleetd stopping".into());
        if tokio::time::timeout(TEARDOWN_TIMEOUT, closing)
            .await
            .is_err()
        {
            tracing::warn!(
                "the broker did not confirm the close within {} s; letting the link go",
                TEARDOWN_TIMEOUT.as_secs()
            );
        }
    }

    async fn channel(&self, what: &str) -> Result<Channel, LinkError> {
        self.connection
            .create_channel()
            .await
            .map_err(|e| LinkError::from_lapin(what, &e))
    }

    /// `fleet.msg`, `fleet.roster`, `fleet.control`, `fleet.dlx` and the capped `fleet.dlq`.
    async fn declare_shared(&self) -> Result<(), LinkError> {
        let channel = self.channel("cannot open a channel").await?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        for (name, kind) in [
            (MSG_EXCHANGE, ExchangeKind::Topic),
            (ROSTER_EXCHANGE, ExchangeKind::Topic),
            (CONTROL_EXCHANGE, ExchangeKind::Direct),
            (DEAD_LETTER_EXCHANGE, ExchangeKind::Fanout),
        ] {
            channel
                .exchange_declare(name.into(), kind, durable, FieldTable::default())
                .await
                .map_err(|e| LinkError::from_lapin(&format!("declaring exchange {name}"), &e))?;
        }
        let mut args = FieldTable::default();
        args.insert(
            "x-max-length".into(),
            AMQPValue::LongLongInt(clamp_i64(self.federation.dlq_max_length)),
        );
        args.insert("x-queue-type".into(), text("classic"));
        channel
            .queue_declare(
                DEAD_LETTER_QUEUE.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                args,
            )
            .await
            .map_err(|e| declare_error(DEAD_LETTER_QUEUE, &e))?;
        channel
            .queue_bind(
                DEAD_LETTER_QUEUE.into(),
                DEAD_LETTER_EXCHANGE.into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| LinkError::from_lapin("binding fleet.dlq", &e))?;
        let _ = channel.close(200, "declared".into()).await;
        Ok(())
    }

    /// Declares `gid`'s inbox, binds it to its keys (its gid, and for a worker the broadcast
    /// keys), and starts the one exclusive, manual-ack consumer on it with the prefetch bound.
    /// A second gateway consuming the same inbox is refused by the broker (403).
    pub async fn open_inbox(&self, gid: Gid, broadcast: &[String]) -> Result<Consumer, LinkError> {
        let queue = inbox_queue(gid);
        let channel = self.channel("cannot open an inbox channel").await?;
        let mut args = FieldTable::default();
        args.insert("x-dead-letter-exchange".into(), text(DEAD_LETTER_EXCHANGE));
        args.insert(
            "x-max-length".into(),
            AMQPValue::LongLongInt(clamp_i64(self.federation.inbox_max_length)),
        );
        args.insert("x-overflow".into(), text("reject-publish-dlx"));
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(clamp_i64(self.federation.inbox_message_ttl_s * 1000)),
        );
        args.insert(
            "x-expires".into(),
            AMQPValue::LongLongInt(clamp_i64(self.federation.inbox_expires_s * 1000)),
        );
        args.insert("x-queue-type".into(), text("classic"));
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                args,
            )
            .await
            .map_err(|e| declare_error(&queue, &e))?;
        let mut keys = vec![gid.to_string()];
        keys.extend(broadcast.iter().cloned());
        for key in keys {
            channel
                .queue_bind(
                    queue.as_str().into(),
                    MSG_EXCHANGE.into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| LinkError::from_lapin(&format!("binding {queue} to {key}"), &e))?;
        }
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| LinkError::from_lapin("setting the prefetch bound", &e))?;
        channel
            .basic_consume(
                queue.as_str().into(),
                format!("fleetd-{gid}").into(),
                BasicConsumeOptions {
                    exclusive: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                let mut err = LinkError::from_lapin(
                    &format!("cannot consume {queue} (is another gateway consuming it?)"),
                    &e,
                );
                err.retry = false;
                err
            })
    }

    /// Deletes `gid`'s inbox (its bindings go with it).
    pub async fn delete_inbox(&self, gid: Gid) -> Result<(), LinkError> {
        let queue = inbox_queue(gid);
        let deleting = async {
            let channel = self.channel("cannot open a channel").await?;
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(|e| LinkError::from_lapin(&format!("deleting {queue}"), &e))?;
            let _ = channel.close(200, "deleted".into()).await;
            Ok(())
        };
        tokio::time::timeout(TEARDOWN_TIMEOUT, deleting)
            .await
            .unwrap_or_else(|_| {
                Err(LinkError {
                    message: format!(
                        "deleting {queue}: no answer from the broker within {} s",
                        TEARDOWN_TIMEOUT.as_secs()
                    ),
                    retry: true,
                })
            })
    }

    /// Declares this host's roster queue (exclusive, auto-delete) bound to `roster.#`, and
    /// consumes it (auto-ack: presence is soft state).
    pub async fn open_roster(&self, host: &str) -> Result<Consumer, LinkError> {
        let queue = roster_queue(host);
        let channel = self.channel("cannot open the roster channel").await?;
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| declare_error(&queue, &e))?;
        channel
            .queue_bind(
                queue.as_str().into(),
                ROSTER_EXCHANGE.into(),
                "roster.#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| LinkError::from_lapin(&format!("binding {queue}"), &e))?;
        channel
            .basic_consume(
                queue.as_str().into(),
                format!("fleetd-roster-{host}").into(),
                BasicConsumeOptions {
                    no_ack: true,
                    exclusive: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| LinkError::from_lapin(&format!("cannot consume {queue}"), &e))
    }

    /// Publishes `body` under `envelope` to `exchange` with `key` and waits for the broker's
    /// confirm (publishes from many tasks are pipelined on the one channel). "Confirmed" is not
    /// "routed": with `mandatory`, a returned message is [`Published::Unroutable`].
    pub async fn publish(
        &self,
        exchange: &str,
        key: &str,
        envelope: &Envelope,
        body: &[u8],
        mandatory: bool,
        persistent: bool,
    ) -> Result<Published, FleetError> {
        let properties = BasicProperties::default()
            .with_headers(headers(envelope))
            .with_message_id(envelope.msg_id.to_string().into())
            .with_content_type("text/plain; charset=utf-8".into())
            .with_delivery_mode(if persistent { 2 } else { 1 });
        let unavailable = |e: lapin::Error| {
            FleetError::new(
                ErrorCode::BrokerUnavailable,
                format!("the broker did not take the message: {e}"),
            )
        };
        let confirm = async {
            let pending = self
                .publish
                .basic_publish(
                    exchange.into(),
                    key.into(),
                    BasicPublishOptions {
                        mandatory,
                        ..BasicPublishOptions::default()
                    },
                    body,
                    properties,
                )
                .await
                .map_err(unavailable)?;
            pending.await.map_err(unavailable)
        };
        let started = std::time::Instant::now();
        let confirmation = tokio::time::timeout(CONFIRM_TIMEOUT, confirm)
            .await
            .map_err(|_| {
                FleetError::new(
                    ErrorCode::BrokerUnavailable,
                    format!(
                        "the broker did not confirm the message within {} s",
                        CONFIRM_TIMEOUT.as_secs()
                    ),
                )
            })??;
        tracing::debug!(
            key,
            confirm_us = started.elapsed().as_micros() as u64,
            "confirmed"
        );
        Ok(match confirmation {
            Confirmation::Ack(Some(_)) => Published::Unroutable,
            Confirmation::Ack(None) | Confirmation::NotRequested => Published::Routed,
            Confirmation::Nack(_) => Published::Refused,
        })
    }
}

/// A declare failure; a 406 names the queue and the argument the broker's copy differs in.
fn declare_error(queue: &str, err: &lapin::Error) -> LinkError {
    let mut out = LinkError::from_lapin(&format!("declaring queue {queue}"), err);
    if out.message.contains("PRECONDITION_FAILED") {
        out.message = format!(
            "the broker already has queue {queue} with other arguments ({}); delete it or match fleetd's [federation] settings",
            out.message
        );
        out.retry = false;
    }
    out
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

fn clamp_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The envelope as AMQP headers.
fn headers(envelope: &Envelope) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in envelope.encode() {
        let value = match value {
            HeaderValue::Str(s) => text(&s),
            HeaderValue::Int(i) => AMQPValue::LongLongInt(i),
            HeaderValue::Bytes(b) => AMQPValue::ByteArray(ByteArray::from(b)),
            HeaderValue::Other => AMQPValue::Void,
        };
        table.insert(ShortString::from(name), value);
    }
    table
}

/// The envelope of a delivery.
pub fn decode(delivery: &lapin::message::Delivery) -> Result<Envelope, EnvelopeError> {
    let headers = header_values(&delivery.properties);
    Envelope::decode(headers.iter().map(|(k, v)| (k.as_str(), v)))
}

/// AMQP headers as the codec reads them.
fn header_values(properties: &BasicProperties) -> Vec<(String, HeaderValue)> {
    let Some(table) = properties.headers() else {
        return Vec::new();
    };
    table
        .inner()
        .iter()
        .map(|(name, value)| {
            let value = match value {
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
            };
            (name.as_str().to_string(), value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uri_gains_the_heartbeat() {
        let config = BrokerConfig {
            uri: "amqp://gw@broker.internal:5672/fleet".into(),
            password_env: "FLEETD_TEST_NO_SUCH_VAR".into(),
            heartbeat_s: 10,
            prefetch: 32,
        };
        let uri = connection_uri(&config).unwrap();
        assert!(uri.ends_with("/fleet?heartbeat=10"), "{uri}");
    }

    #[test]
    fn queue_and_key_names_follow_the_spec() {
        let gid: Gid = "01a22d73-fb25-719f-b332-14b28da5c6c4".parse().unwrap();
        assert_eq!(
            inbox_queue(gid),
            "agent.01a22d73-fb25-719f-b332-14b28da5c6c4.inbox.v2"
        );
        assert_eq!(broadcast_key("core"), "broadcast.core");
        assert_eq!(roster_key("hostA", "_gateway"), "roster.hostA._gateway");
        assert_eq!(roster_queue("hostA"), "roster.hostA");
    }
}
