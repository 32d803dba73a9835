//! The broker link of one gateway (spec 10 §3, §4, §8): one connection (to the first of the
//! broker's nodes that answers), the shared exchanges, per-entity inboxes, this host's roster
//! and dead-letter queues, and a publish channel with confirms, `mandatory` and returns. It
//! knows envelopes and queues, not sessions: the gateway decides what a delivery means.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use fleet_core::Gid;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use percent_encoding::percent_decode_str;

use crate::broker::{Broker, Outgoing, Published};
use crate::delivery::{Deliveries, Delivery};
use crate::error::AmqpError;
use crate::table::Table;
use crate::tls::TlsFiles;
use crate::topology::{
    CONTROL_EXCHANGE, DEAD_EXCHANGE, DEAD_LETTER_EXCHANGE, DEAD_LETTER_QUEUE, InboxLimits,
    MSG_EXCHANGE, QueueType, ROSTER_EXCHANGE, addressed_binding, control_args, control_queue,
    dead_letter_args, dead_letter_binding, dead_letter_queue, inbox_args, inbox_queue, lock_args,
    lock_queue, mailbox_queue, roster_args, roster_queue,
};

/// How many heartbeats the roster consumer may hold unsettled.
const ROSTER_PREFETCH: u16 = 256;
/// How many control requests (spawns, stops) a gateway works on at once.
const CONTROL_PREFETCH: u16 = 8;
/// How long a publish may wait for the broker's confirm before it counts as unavailable.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait for the broker to delete an inbox or to close the connection: a stop or a
/// shutdown never hangs on a slow or confused broker link (seen once: lapin's close waited
/// forever after a channel error).
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often [`Link::closed`] looks at the connection's state between its events.
const CLOSED_POLL: Duration = Duration::from_millis(500);
/// The longest one node may take to let a link in (TCP, TLS and the AMQP handshake): a node
/// that is down but not refusing (its machine gone, a partition) is given up on after this, and
/// the next one tried. Three SYNs go meanwhile (at 0, 1 and 3 s): after a partition heals, the
/// next attempt's SYN is never far off.
const NODE_CONNECT_TIMEOUT: Duration = Duration::from_secs(4);

/// What a link is opened with. No `Debug`: the URIs may hold a password.
#[derive(Clone)]
pub struct LinkSettings {
    /// The broker's nodes: `amqp://` or `amqps://` URIs, each with the same login and vhost
    /// (one for a single node; several for a cluster, any of which will do).
    pub uris: Vec<String>,
    /// Which of `uris` is tried first (an index, wrapping); the others follow in their order.
    pub first: usize,
    /// The environment variable that holds the password, when the URI has none.
    pub password_env: String,
    /// The AMQP heartbeat, in seconds.
    pub heartbeat_s: u16,
    /// How many unacknowledged deliveries one inbox consumer may hold.
    pub prefetch: u16,
    /// The caps of every inbox.
    pub inbox: InboxLimits,
    /// The most messages the dead-letter queue keeps.
    pub dlq_max_length: u64,
    /// The CA to trust and the client certificate of an `amqps://` link.
    pub tls: TlsFiles,
    /// The type of the durable queues the link declares and consumes.
    pub queue_type: QueueType,
}

impl LinkSettings {
    /// The indexes of `uris` in the order they are tried: from `first`, wrapping.
    fn order(&self) -> impl Iterator<Item = usize> + '_ {
        let count = self.uris.len();
        (0..count).map(move |i| (self.first.wrapping_add(i)) % count)
    }
}

/// The connection URI of `uri` with the password from the environment (when the URI has none)
/// and the configured heartbeat.
fn connection_uri(settings: &LinkSettings, uri: &str) -> Result<url::Url, AmqpError> {
    let mut url =
        url::Url::parse(uri).map_err(|e| AmqpError::BadUri(format!("broker.uri: {e}")))?;
    if url.password().is_none()
        && let Ok(password) = std::env::var(&settings.password_env)
    {
        url.set_password(Some(&password))
            .map_err(|()| AmqpError::BadUri("broker.uri cannot carry a password".into()))?;
    }
    if !url.query_pairs().any(|(k, _)| k == "heartbeat") {
        url.query_pairs_mut()
            .append_pair("heartbeat", &settings.heartbeat_s.to_string());
    }
    Ok(url)
}

/// The login a connection to `uri` authenticates as: its user, or AMQP's default `guest`.
fn login_of_url(uri: &url::Url) -> String {
    match uri.username() {
        "" => "guest".to_string(),
        user => percent_decode_str(user).decode_utf8_lossy().into_owned(),
    }
}

/// The broker login a link to `uri` publishes as: its user, or AMQP's default `guest` (an
/// unparsable URI never connects; `guest` then).
pub fn login_of(uri: &str) -> String {
    url::Url::parse(uri).map_or_else(|_| "guest".to_string(), |url| login_of_url(&url))
}

/// One live connection with its publish channel.
pub struct Link {
    connection: Connection,
    publish: Channel,
    /// Which of the settings' `uris` it is connected to.
    node: usize,
    /// That node as logs may name it: `host:port`.
    node_name: String,
    /// The type of the durable queues it declares and consumes.
    queue_type: QueueType,
    /// The broker login this link publishes as (the AMQP `user_id` of each message).
    login: String,
    inbox: InboxLimits,
    prefetch: u16,
    /// The most messages a dead-letter queue keeps.
    dlq_max_length: u64,
    /// Set when a publish went unconfirmed for [`CONFIRM_TIMEOUT`]: the link is taken as lost
    /// (a partition, which the AMQP heartbeat takes twice its interval to see), so it reads
    /// down and [`Broker::closed`] returns: its keeper connects anew.
    lost: AtomicBool,
}

impl Link {
    /// Takes the link as lost (once), saying why: it reads down, and its keeper closes it and
    /// connects anew.
    fn lose(&self, why: &str) {
        if !self.lost.swap(true, Ordering::Relaxed) {
            tracing::warn!(node = %self.node_name, why, "the link is taken as lost: connecting anew");
        }
    }

    /// Connects as `fleetd@<host>`, opens the publish channel and declares the shared
    /// exchanges and the dead letter queue.
    pub async fn connect(settings: &LinkSettings, host: &str) -> Result<Link, AmqpError> {
        let link = Link::open(settings, host).await?;
        link.declare_shared().await?;
        Ok(link)
    }

    /// Connects to the coordinator's vhost as `fleetd@coord@<host>`, opens the publish channel
    /// and declares the dead letters (`fleet.dlx` with the capped `fleet.dlq`) that the lead
    /// mailboxes ([`Link::open_mailbox`]) dead-letter to; none of the fleet's exchanges.
    pub async fn connect_coordinator(
        settings: &LinkSettings,
        host: &str,
    ) -> Result<Link, AmqpError> {
        let link = Link::open(settings, &format!("coord@{host}")).await?;
        let channel = link.channel("cannot open a channel").await?;
        link.declare_dead_letters(&channel).await?;
        close_quietly(&channel, "declared").await;
        Ok(link)
    }

    /// Declares the durable mailbox of coordination id `coord_id` (capped and dead-lettered
    /// like an inbox) and starts the one exclusive, manually settled consumer on it, with the
    /// prefetch bound. Messages reach it through the default exchange, keyed by its name.
    pub async fn open_mailbox(&self, coord_id: &str) -> Result<Deliveries, AmqpError> {
        let queue = mailbox_queue(coord_id);
        let channel = self.channel("cannot open a mailbox channel").await?;
        declare_queue(
            &channel,
            &queue,
            true,
            &inbox_args(&self.inbox, self.queue_type),
        )
        .await?;
        self.consume_exclusive(&channel, &queue, &format!("fleetd-{queue}"), self.prefetch)
            .await
    }

    /// The node the link is connected to, as `host:port`.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Connects as `fleetd@<host>` to the first node that lets it in (from `settings.first`, in
    /// order), giving each [`NODE_CONNECT_TIMEOUT`], and opens the publish channel. When none
    /// does, the error says what each node answered; it is one to retry only if every node's
    /// was.
    async fn open(settings: &LinkSettings, host: &str) -> Result<Link, AmqpError> {
        let mut failures = Vec::new();
        for node in settings.order() {
            let uri = &settings.uris[node];
            let opened =
                tokio::time::timeout(NODE_CONNECT_TIMEOUT, Link::open_node(settings, uri, host))
                    .await
                    .unwrap_or_else(|_| {
                        Err(AmqpError::Unavailable(format!(
                            "cannot connect to the broker: no answer within {} s",
                            NODE_CONNECT_TIMEOUT.as_secs()
                        )))
                    });
            match opened {
                Ok(mut link) => {
                    link.node = node;
                    if !failures.is_empty() {
                        tracing::info!(node = %link.node_name, "connected to another of the broker's nodes");
                    }
                    return Ok(link);
                }
                Err(e) => failures.push((node_name(uri), e)),
            }
        }
        Err(no_node(failures))
    }

    /// Connects as `fleetd@<host>` to the node at `uri` and opens the publish channel.
    async fn open_node(settings: &LinkSettings, uri: &str, host: &str) -> Result<Link, AmqpError> {
        let uri = connection_uri(settings, uri)?;
        let tls = settings.tls.config(uri.scheme()).await?;
        let properties =
            ConnectionProperties::default().with_connection_name(format!("fleetd@{host}").into());
        let failed = |e: lapin::Error| {
            let broker = uri.host_str().unwrap_or_default();
            (uri.scheme() == "amqps")
                .then(|| settings.tls.failure(&e, broker))
                .flatten()
                .unwrap_or_else(|| AmqpError::from_lapin("cannot connect to the broker", &e))
        };
        let runtime = lapin::runtime::default_runtime().map_err(failed)?;
        let connection = Connection::connect_with_config(uri.as_str(), properties, tls, runtime)
            .await
            .map_err(failed)?;
        let publish = connection
            .create_channel()
            .await
            .map_err(|e| AmqpError::from_lapin("cannot open a channel", &e))?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| AmqpError::from_lapin("cannot turn on publisher confirms", &e))?;
        let link = Link {
            connection,
            publish,
            node: 0,
            node_name: node_name(uri.as_str()),
            queue_type: settings.queue_type,
            login: login_of_url(&uri),
            inbox: settings.inbox,
            prefetch: settings.prefetch,
            dlq_max_length: settings.dlq_max_length,
            lost: AtomicBool::new(false),
        };
        Ok(link)
    }

    async fn channel(&self, what: &str) -> Result<Channel, AmqpError> {
        self.connection
            .create_channel()
            .await
            .map_err(|e| AmqpError::from_lapin(what, &e))
    }

    /// `fleet.dlx` with the capped `fleet.dlq` bound to it.
    async fn declare_dead_letters(&self, channel: &Channel) -> Result<(), AmqpError> {
        declare_exchange(channel, DEAD_LETTER_EXCHANGE, ExchangeKind::Fanout).await?;
        declare_queue(
            channel,
            DEAD_LETTER_QUEUE,
            true,
            &dead_letter_args(self.dlq_max_length, self.queue_type),
        )
        .await?;
        channel
            .queue_bind(
                DEAD_LETTER_QUEUE.into(),
                DEAD_LETTER_EXCHANGE.into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin("binding fleet.dlq", &e))
    }

    /// `fleet.msg`, `fleet.roster`, `fleet.control`, the dead letters, and `fleet.dead` bound
    /// to `fleet.dlx`.
    async fn declare_shared(&self) -> Result<(), AmqpError> {
        let channel = self.channel("cannot open a channel").await?;
        for (name, kind) in [
            (MSG_EXCHANGE, ExchangeKind::Topic),
            (ROSTER_EXCHANGE, ExchangeKind::Topic),
            (CONTROL_EXCHANGE, ExchangeKind::Direct),
            (DEAD_EXCHANGE, ExchangeKind::Headers),
        ] {
            declare_exchange(&channel, name, kind).await?;
        }
        self.declare_dead_letters(&channel).await?;
        channel
            .exchange_bind(
                DEAD_EXCHANGE.into(),
                DEAD_LETTER_EXCHANGE.into(),
                "".into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin("binding fleet.dead to fleet.dlx", &e))?;
        close_quietly(&channel, "declared").await;
        Ok(())
    }
}

#[async_trait]
impl Broker for Link {
    fn is_up(&self) -> bool {
        !self.lost.load(Ordering::Relaxed)
            && self.connection.status().connected()
            && self.publish.status().connected()
    }

    fn node(&self) -> usize {
        self.node
    }

    async fn closed(&self) {
        use futures_util::StreamExt;
        let mut events = std::pin::pin!(self.connection.events_listener());
        // An error is looked at at once, but only the connection's state ends the link: one
        // channel's error (a queue another connection holds, say) closes that channel only.
        while self.is_up() {
            tokio::select! {
                event = events.next() => if event.is_none() { break },
                () = tokio::time::sleep(CLOSED_POLL) => {}
            }
        }
    }

    fn give_up(&self) {
        self.lose("the broker did not answer in time");
    }

    async fn close(&self) {
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

    async fn open_inbox(&self, gid: Gid, broadcast: &[String]) -> Result<Deliveries, AmqpError> {
        let queue = inbox_queue(gid);
        let channel = self.channel("cannot open an inbox channel").await?;
        declare_queue(
            &channel,
            &queue,
            true,
            &inbox_args(&self.inbox, self.queue_type),
        )
        .await?;
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
                .map_err(|e| AmqpError::from_lapin(&format!("binding {queue} to {key}"), &e))?;
        }
        self.consume_exclusive(&channel, &queue, &format!("fleetd-{gid}"), self.prefetch)
            .await
    }

    async fn delete_inbox(&self, gid: Gid) -> Result<(), AmqpError> {
        let queue = inbox_queue(gid);
        let deleting = async {
            let channel = self.channel("cannot open a channel").await?;
            let mut queues = vec![queue.clone()];
            // Its lock goes with it (else it would stay until the link goes).
            if !self.queue_type.exclusive_consumers() {
                queues.push(lock_queue(&queue));
            }
            for name in &queues {
                channel
                    .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await
                    .map_err(|e| AmqpError::from_lapin(&format!("deleting {name}"), &e))?;
            }
            close_quietly(&channel, "deleted").await;
            Ok(())
        };
        tokio::time::timeout(TEARDOWN_TIMEOUT, deleting)
            .await
            .unwrap_or_else(|_| {
                Err(AmqpError::Unavailable(format!(
                    "deleting {queue}: no answer from the broker within {} s",
                    TEARDOWN_TIMEOUT.as_secs()
                )))
            })
    }

    async fn drain_inbox(&self, gid: Gid, limit: usize) -> Result<Vec<Delivery>, AmqpError> {
        let queue = inbox_queue(gid);
        // A channel of its own: a missing queue closes it, not the publish channel. Each
        // delivery keeps it open until settled and dropped.
        let channel = self.channel("cannot open a channel").await?;
        let mut taken = Vec::new();
        while taken.len() < limit {
            let got = channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                .await
                .map_err(|e| AmqpError::from_lapin(&format!("draining {queue}"), &e))?;
            match got {
                Some(message) => taken.push(Delivery::got_on(message.delivery, channel.clone())),
                None => break,
            }
        }
        Ok(taken)
    }

    async fn open_roster(&self, host: &str) -> Result<Deliveries, AmqpError> {
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
                roster_args().to_lapin(),
            )
            .await
            .map_err(|e| declare_error(&queue, &e).held())?;
        channel
            .queue_bind(
                queue.as_str().into(),
                ROSTER_EXCHANGE.into(),
                "roster.#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin(&format!("binding {queue}"), &e))?;
        // And to what is addressed to this host alone (whole accounts it asked for).
        channel
            .queue_bind(
                queue.as_str().into(),
                ROSTER_EXCHANGE.into(),
                addressed_binding(host).into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin(&format!("binding {queue}"), &e))?;
        // Exclusive itself: its consumer needs no lock.
        consume(
            &channel,
            &queue,
            &format!("fleetd-roster-{host}"),
            ROSTER_PREFETCH,
        )
        .await
    }

    async fn open_dead_letters(&self, host: &str) -> Result<Deliveries, AmqpError> {
        let queue = dead_letter_queue(host);
        let channel = self.channel("cannot open the dead-letter channel").await?;
        declare_queue(
            &channel,
            &queue,
            true,
            &dead_letter_args(self.dlq_max_length, self.queue_type),
        )
        .await?;
        channel
            .queue_bind(
                queue.as_str().into(),
                DEAD_EXCHANGE.into(),
                "".into(),
                QueueBindOptions::default(),
                dead_letter_binding(host).to_lapin(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin(&format!("binding {queue}"), &e))?;
        self.consume_exclusive(
            &channel,
            &queue,
            &format!("fleetd-dead-{host}"),
            self.prefetch,
        )
        .await
    }

    async fn open_control(&self, host: &str) -> Result<Deliveries, AmqpError> {
        let queue = control_queue(host);
        let channel = self.channel("cannot open the control channel").await?;
        declare_queue(&channel, &queue, true, &control_args(self.queue_type)).await?;
        channel
            .queue_bind(
                queue.as_str().into(),
                CONTROL_EXCHANGE.into(),
                host.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin(&format!("binding {queue}"), &e))?;
        self.consume_exclusive(
            &channel,
            &queue,
            &format!("fleetd-control-{host}"),
            CONTROL_PREFETCH,
        )
        .await
    }

    async fn publish(&self, message: Outgoing<'_>) -> Result<Published, AmqpError> {
        let (exchange, key, envelope, body) = (
            message.exchange,
            message.key,
            message.envelope,
            message.body,
        );
        let properties = BasicProperties::default()
            .with_headers(Table::of_signed(envelope, message.signature).to_lapin())
            .with_message_id(envelope.msg_id.to_string().into())
            .with_user_id(self.login.as_str().into())
            .with_content_type("text/plain; charset=utf-8".into())
            .with_delivery_mode(if message.persistent { 2 } else { 1 });
        let started = std::time::Instant::now();
        let published = confirmed(
            &self.publish,
            exchange,
            key,
            body,
            properties,
            message.mandatory,
        )
        .await
        .inspect_err(|_| {
            // A broker that blocks publishers (a memory or disk alarm) is alive: it says so,
            // and a new link would be blocked as well.
            if started.elapsed() >= CONFIRM_TIMEOUT && !self.connection.status().blocked() {
                self.lose(&format!(
                    "a publish went unconfirmed for {} s",
                    CONFIRM_TIMEOUT.as_secs()
                ));
            }
        })?;
        tracing::debug!(
            key,
            confirm_us = started.elapsed().as_micros() as u64,
            "confirmed"
        );
        Ok(published)
    }
}

/// Publishes on `channel` (in confirm mode) and waits for the broker's confirm, at most
/// [`CONFIRM_TIMEOUT`].
pub(crate) async fn confirmed(
    channel: &Channel,
    exchange: &str,
    key: &str,
    body: &[u8],
    properties: BasicProperties,
    mandatory: bool,
) -> Result<Published, AmqpError> {
    let unavailable = |e: lapin::Error| {
        AmqpError::Unavailable(format!("the broker did not take the message: {e}"))
    };
    let confirm = async {
        let pending = channel
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
    let confirmation = tokio::time::timeout(CONFIRM_TIMEOUT, confirm)
        .await
        .map_err(|_| {
            AmqpError::Unavailable(format!(
                "the broker did not confirm the message within {} s",
                CONFIRM_TIMEOUT.as_secs()
            ))
        })??;
    Ok(published(&confirmation))
}

/// Where a confirmed publish went: a message returned with its ack was unroutable.
pub(crate) fn published(confirmation: &Confirmation) -> Published {
    match confirmation {
        Confirmation::Ack(Some(_)) => Published::Unroutable,
        Confirmation::Ack(None) | Confirmation::NotRequested => Published::Routed,
        Confirmation::Nack(_) => Published::Refused,
    }
}

impl Link {
    /// Starts the one manually settled consumer (tagged `tag`) on `queue`, with `prefetch`
    /// deliveries unsettled at most, made the only one: an exclusive consumer where the queue's
    /// type has them, else under the queue's [`lock_queue`], declared first on this link. A queue
    /// another connection consumes (or holds the lock of) is [`AmqpError::Held`].
    async fn consume_exclusive(
        &self,
        channel: &Channel,
        queue: &str,
        tag: &str,
        prefetch: u16,
    ) -> Result<Deliveries, AmqpError> {
        if self.queue_type.exclusive_consumers() {
            return consume_with(channel, queue, tag, prefetch, true).await;
        }
        let lock = lock_queue(queue);
        channel
            .queue_declare(
                lock.as_str().into(),
                QueueDeclareOptions {
                    exclusive: true,
                    ..QueueDeclareOptions::default()
                },
                lock_args().to_lapin(),
            )
            .await
            .map_err(|e| {
                AmqpError::from_lapin(
                    &format!(
                        "cannot take {lock}, the lock of {queue} (is another gateway consuming it?)"
                    ),
                    &e,
                )
                .held()
            })?;
        consume_with(channel, queue, tag, prefetch, false).await
    }
}

/// Starts a manually settled consumer (tagged `tag`) on `queue`, a queue only this connection
/// may use (an exclusive one), with `prefetch` deliveries unsettled at most.
async fn consume(
    channel: &Channel,
    queue: &str,
    tag: &str,
    prefetch: u16,
) -> Result<Deliveries, AmqpError> {
    consume_with(channel, queue, tag, prefetch, false).await
}

/// Starts a manually settled consumer (tagged `tag`) on `queue`, `exclusive` or not, with
/// `prefetch` deliveries unsettled at most. A queue another connection consumes exclusively is
/// [`AmqpError::Held`].
async fn consume_with(
    channel: &Channel,
    queue: &str,
    tag: &str,
    prefetch: u16,
    exclusive: bool,
) -> Result<Deliveries, AmqpError> {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .map_err(|e| AmqpError::from_lapin(&format!("setting the prefetch of {queue}"), &e))?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions {
                exclusive,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| {
            AmqpError::from_lapin(
                &format!("cannot consume {queue} (is another gateway consuming it?)"),
                &e,
            )
            .held()
        })?;
    Ok(Deliveries::new(consumer, channel.clone(), prefetch))
}

/// A node as logs name it: the `host:port` of its URI (nothing of the login).
fn node_name(uri: &str) -> String {
    url::Url::parse(uri).map_or_else(
        |_| "(not a URI)".to_string(),
        |url| {
            let host = url.host_str().unwrap_or_default();
            let port = url.port().unwrap_or(match url.scheme() {
                "amqps" => 5671,
                _ => 5672,
            });
            format!("{host}:{port}")
        },
    )
}

/// The error of a link no node let in: each node's answer, named. It is one to retry only when
/// each was (a node refusing the login or the TLS setup is a configuration problem).
fn no_node(mut failures: Vec<(String, AmqpError)>) -> AmqpError {
    if failures.len() == 1
        && let Some((_, only)) = failures.pop()
    {
        return only;
    }
    let retry = failures.iter().all(|(_, e)| e.retry());
    let said = failures
        .iter()
        .map(|(node, e)| format!("{node}: {e}"))
        .collect::<Vec<_>>()
        .join("; ");
    let message = format!("no node of the broker let this gateway in ({said})");
    if retry {
        AmqpError::Unavailable(message)
    } else {
        AmqpError::Refused(message)
    }
}

/// Declares the durable exchange `name` of `kind`.
async fn declare_exchange(
    channel: &Channel,
    name: &str,
    kind: ExchangeKind,
) -> Result<(), AmqpError> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(name.into(), kind, durable, FieldTable::default())
        .await
        .map_err(|e| AmqpError::from_lapin(&format!("declaring exchange {name}"), &e))
}

/// Declares queue `name` with `args`, durable or not.
pub(crate) async fn declare_queue(
    channel: &Channel,
    name: &str,
    durable: bool,
    args: &Table,
) -> Result<(), AmqpError> {
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable,
                ..QueueDeclareOptions::default()
            },
            args.to_lapin(),
        )
        .await
        .map_err(|e| declare_error(name, &e))?;
    Ok(())
}

/// A declare failure; a 406 names the queue and the argument the broker's copy differs in.
fn declare_error(queue: &str, err: &lapin::Error) -> AmqpError {
    let out = AmqpError::from_lapin(&format!("declaring queue {queue}"), err);
    let message = out.to_string();
    if message.contains("PRECONDITION_FAILED") {
        return AmqpError::Refused(format!(
            "the broker already has queue {queue} with other arguments ({message}); delete it, or match fleetd's [broker] queue_type and [federation] settings to the other gateways'"
        ));
    }
    out
}

/// Closes a channel that did its work; a failure only means it is closed already.
pub(crate) async fn close_quietly(channel: &Channel, why: &str) {
    if let Err(e) = channel.close(200, why.into()).await {
        tracing::debug!(error = %e, "a channel was closed already");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(uris: &[&str], first: usize) -> LinkSettings {
        LinkSettings {
            uris: uris.iter().map(|u| u.to_string()).collect(),
            first,
            password_env: "FLEETD_TEST_NO_SUCH_VAR".into(),
            heartbeat_s: 10,
            prefetch: 32,
            inbox: InboxLimits {
                max_length: 1,
                message_ttl_s: 1,
                expires_s: 1,
            },
            dlq_max_length: 1,
            tls: TlsFiles::default(),
            queue_type: QueueType::Classic,
        }
    }

    #[test]
    fn the_uri_gains_the_heartbeat() {
        let settings = settings(&["amqp://gw@broker.internal:5672/fleet"], 0);
        let uri = connection_uri(&settings, &settings.uris[0]).unwrap();
        assert!(uri.as_str().ends_with("/fleet?heartbeat=10"), "{uri}");
        assert!(matches!(
            connection_uri(&settings, "not a uri"),
            Err(AmqpError::BadUri(_))
        ));
    }

    #[test]
    fn the_nodes_are_tried_from_the_first_named_wrapping_round() {
        let nodes = ["amqp://a", "amqp://b", "amqp://c"];
        assert_eq!(settings(&nodes, 0).order().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(settings(&nodes, 2).order().collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(settings(&nodes, 7).order().collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(settings(&nodes[..1], 5).order().collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn a_node_is_named_by_host_and_port_and_never_by_its_login() {
        assert_eq!(
            node_name("amqps://gw:secret@rabbit-2.internal/fleet"),
            "rabbit-2.internal:5671"
        );
        assert_eq!(
            node_name("amqp://gw:secret@10.0.0.2:5673/"),
            "10.0.0.2:5673"
        );
        assert_eq!(node_name("no uri"), "(not a URI)");
    }

    #[test]
    fn no_node_letting_a_link_in_says_what_each_answered() {
        let one = no_node(vec![("a:1".into(), AmqpError::Unavailable("down".into()))]);
        assert_eq!(one.to_string(), "down");
        let down = no_node(vec![
            ("a:1".into(), AmqpError::Unavailable("refused".into())),
            ("b:2".into(), AmqpError::Unavailable("timed out".into())),
        ]);
        assert!(down.retry(), "{down}");
        assert_eq!(
            down.to_string(),
            "no node of the broker let this gateway in (a:1: refused; b:2: timed out)"
        );
        // A node that refuses the login is a configuration problem, not an outage.
        let refused = no_node(vec![
            ("a:1".into(), AmqpError::Unavailable("refused".into())),
            ("b:2".into(), AmqpError::Refused("ACCESS_REFUSED".into())),
        ]);
        assert!(!refused.retry(), "{refused}");
    }

    #[test]
    fn a_returned_message_is_unroutable_and_a_nack_refused() {
        assert_eq!(published(&Confirmation::Ack(None)), Published::Routed);
        assert_eq!(published(&Confirmation::NotRequested), Published::Routed);
        assert_eq!(published(&Confirmation::Nack(None)), Published::Refused);
    }
}
