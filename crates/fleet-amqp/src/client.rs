//! A plain AMQP client for tools and tests: one connection with one confirming channel, doing
//! the few things a test does to stand in for another gateway (publish a forged, malformed or
//! raw message) or to look at the broker (count a queue, hold an inbox, declare a queue with
//! other arguments). The daemon never uses it; it goes through [`crate::Link`].

use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, ConfirmSelectOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::broker::Published;
use crate::delivery::{Deliveries, Delivery};
use crate::error::AmqpError;
use crate::link::{confirmed, declare_queue, published};
use crate::table::Table;

/// One connection and its confirming channel.
pub struct Client {
    connection: Connection,
    channel: Channel,
}

/// A message to publish: its headers and body.
#[derive(Clone, Debug, Default)]
pub struct Raw {
    /// Its headers (an envelope's: [`Table::of_envelope`]; or anything at all).
    pub headers: Table,
    /// Its body.
    pub body: Vec<u8>,
    /// Whether it is kept across a broker restart.
    pub persistent: bool,
    /// The broker login it claims to be published by (its AMQP `user_id`; RabbitMQ refuses a
    /// message whose `user_id` is not the connection's login). `None`: not set.
    pub user_id: Option<String>,
}

impl Client {
    /// Connects to `uri` (with its vhost) and opens a channel in confirm mode.
    pub async fn connect(uri: &str) -> Result<Client, AmqpError> {
        let connection = Connection::connect(uri, ConnectionProperties::default())
            .await
            .map_err(|e| AmqpError::from_lapin("cannot connect to the broker", &e))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| AmqpError::from_lapin("cannot open a channel", &e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| AmqpError::from_lapin("cannot turn on publisher confirms", &e))?;
        Ok(Client {
            connection,
            channel,
        })
    }

    /// Publishes `message` to `exchange` with `key` and waits for the broker's confirm.
    pub async fn publish(
        &self,
        exchange: &str,
        key: &str,
        message: &Raw,
    ) -> Result<Published, AmqpError> {
        confirmed(
            &self.channel,
            exchange,
            key,
            &message.body,
            properties(message),
            false,
        )
        .await
    }

    /// Publishes every one of `messages` to `exchange` with `key` before waiting for any
    /// confirm, so that they reach the queue together and in order; where each went.
    pub async fn publish_burst(
        &self,
        exchange: &str,
        key: &str,
        messages: &[Raw],
    ) -> Result<Vec<Published>, AmqpError> {
        let failed = |e: lapin::Error| AmqpError::from_lapin("publishing", &e);
        let mut confirms = Vec::with_capacity(messages.len());
        for message in messages {
            let confirm = self
                .channel
                .basic_publish(
                    exchange.into(),
                    key.into(),
                    lapin::options::BasicPublishOptions::default(),
                    &message.body,
                    properties(message),
                )
                .await
                .map_err(failed)?;
            confirms.push(confirm);
        }
        let mut out = Vec::with_capacity(confirms.len());
        for confirm in confirms {
            out.push(published(&confirm.await.map_err(failed)?));
        }
        Ok(out)
    }

    /// Declares queue `name` with `args` (durable or not).
    pub async fn declare_queue(
        &self,
        name: &str,
        durable: bool,
        args: &Table,
    ) -> Result<(), AmqpError> {
        declare_queue(&self.channel, name, durable, args).await
    }

    /// Declares queue `name` with `args`, exclusive to this client's connection (as a gateway
    /// declares its roster queue).
    pub async fn declare_exclusive_queue(&self, name: &str, args: &Table) -> Result<(), AmqpError> {
        self.channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    exclusive: true,
                    ..QueueDeclareOptions::default()
                },
                args.to_lapin(),
            )
            .await
            .map(|_| ())
            .map_err(|e| AmqpError::from_lapin(&format!("declaring {name}"), &e))
    }

    /// Binds queue `name` to `exchange` with `key`.
    pub async fn bind(&self, name: &str, exchange: &str, key: &str) -> Result<(), AmqpError> {
        self.channel
            .queue_bind(
                name.into(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin(&format!("binding {name}"), &e))
    }

    /// Deletes queue `name`.
    pub async fn delete_queue(&self, name: &str) -> Result<(), AmqpError> {
        self.channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .map(|_| ())
            .map_err(|e| AmqpError::from_lapin(&format!("deleting {name}"), &e))
    }

    /// How many messages queue `name` holds ready (it must exist).
    pub async fn ready(&self, name: &str) -> Result<u32, AmqpError> {
        let queue = self
            .channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin(&format!("looking at {name}"), &e))?;
        Ok(queue.message_count())
    }

    /// Consumes queue `name` as `tag` (manually settled), exclusively if asked.
    pub async fn consume(
        &self,
        name: &str,
        tag: &str,
        exclusive: bool,
    ) -> Result<Deliveries, AmqpError> {
        let consumer = self
            .channel
            .basic_consume(
                name.into(),
                tag.into(),
                BasicConsumeOptions {
                    exclusive,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::from_lapin(&format!("cannot consume {name}"), &e))?;
        // No prefetch was asked for: 0, no limit.
        Ok(Deliveries::new(consumer, self.channel.clone(), 0))
    }

    /// Takes the next message off queue `name`, settled on delivery; `None` if it is empty.
    pub async fn get(&self, name: &str) -> Result<Option<Delivery>, AmqpError> {
        let got = self
            .channel
            .basic_get(name.into(), BasicGetOptions { no_ack: true })
            .await
            .map_err(|e| AmqpError::from_lapin(&format!("getting from {name}"), &e))?;
        Ok(got.map(|got| Delivery::from_lapin(got.delivery)))
    }

    /// Closes the connection.
    pub async fn close(&self) -> Result<(), AmqpError> {
        self.connection
            .close(200, "done".into())
            .await
            .map_err(|e| AmqpError::from_lapin("closing", &e))
    }
}

fn properties(message: &Raw) -> BasicProperties {
    let properties = BasicProperties::default()
        .with_headers(message.headers.to_lapin())
        .with_delivery_mode(if message.persistent { 2 } else { 1 });
    match &message.user_id {
        Some(login) => properties.with_user_id(login.as_str().into()),
        None => properties,
    }
}
