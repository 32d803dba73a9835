//! What comes off a queue: a typed delivery (its body, routing key, redelivered flag, the
//! header values the envelope codec reads and, for a dead letter, what its `x-death` says)
//! whose settlement returns a `Result`, and the consumer it comes from. Nothing here decides what a delivery means or how to settle it.

use fleet_core::admission::Settlement;
use fleet_core::dead::Death;
use fleet_core::envelope::{Envelope, EnvelopeError, HeaderValue};
use futures_util::{FutureExt, StreamExt};
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions};

use crate::error::AmqpError;
use crate::table::{death_of, header_values};

/// One message off a queue.
pub struct Delivery {
    /// The message body, as sent.
    body: Vec<u8>,
    /// The routing key it was published with.
    routing_key: String,
    /// Whether the broker delivered it before (to a consumer that did not settle it).
    redelivered: bool,
    /// Its headers, as the envelope codec reads them.
    headers: Vec<(String, HeaderValue)>,
    /// What its `x-death` header says (unknown for a message that was never dead-lettered).
    death: Death,
    /// The broker login that published it (its AMQP `user_id`, which RabbitMQ checks), if set.
    login: Option<String>,
    /// Settles it on the channel it came on (a no-op for an auto-acknowledged queue).
    acker: Acker,
    /// The channel it came on, kept open until it is dropped (for one taken by a get, whose
    /// channel nothing else holds).
    _channel: Option<lapin::Channel>,
    /// For one off a consumer: its channel and the consumer's prefetch, for a round trip that
    /// shows the broker has taken what was sent on the channel before ([`Delivery::ack_surely`]).
    sync: Option<(lapin::Channel, u16)>,
}

/// How long [`Delivery::ack_surely`] waits for the broker to show it took an acknowledgement.
const SURE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Who a delivery is settled with.
pub(crate) enum Acker {
    /// The broker, on the delivery's channel.
    Lapin(lapin::Acker),
    /// A test's record.
    #[cfg(feature = "fake")]
    Fake(Box<dyn Record>),
}

/// What settles a delivery that did not come from lapin (the fake broker's record).
#[cfg(feature = "fake")]
pub(crate) trait Record: Send + Sync {
    /// Settles it, once.
    fn settle(&self, how: Settlement, through: bool) -> Result<(), AmqpError>;
    /// Whether the broker was seen to take what was settled.
    fn seen(&self) -> Result<(), AmqpError>;
}

impl Delivery {
    pub(crate) fn from_lapin(delivery: lapin::message::Delivery) -> Self {
        Self {
            headers: header_values(delivery.properties.headers().as_ref()),
            death: death_of(delivery.properties.headers().as_ref()),
            login: delivery
                .properties
                .user_id()
                .as_ref()
                .map(|u| u.as_str().to_string()),
            body: delivery.data,
            routing_key: delivery.routing_key.as_str().to_string(),
            redelivered: delivery.redelivered,
            acker: Acker::Lapin(delivery.acker),
            _channel: None,
            sync: None,
        }
    }

    /// A delivery taken by a get on `channel`, which stays open as long as it does.
    pub(crate) fn got_on(delivery: lapin::message::Delivery, channel: lapin::Channel) -> Self {
        Self {
            _channel: Some(channel),
            ..Self::from_lapin(delivery)
        }
    }

    /// A delivery that came from somewhere else than lapin (the fake broker).
    #[cfg(feature = "fake")]
    pub(crate) fn made(
        body: Vec<u8>,
        routing_key: String,
        headers: &lapin::types::FieldTable,
        login: Option<String>,
        acker: Acker,
    ) -> Self {
        Self {
            body,
            routing_key,
            redelivered: false,
            headers: header_values(Some(headers)),
            death: death_of(Some(headers)),
            login,
            acker,
            _channel: None,
            sync: None,
        }
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The routing key it was published with.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// Whether the broker delivered it before.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }

    /// The broker login that published it, as the broker vouches for it (`None`: the
    /// publisher set no `user_id`).
    pub fn login(&self) -> Option<&str> {
        self.login.as_deref()
    }

    /// The text of header `name`, when it is there once and is text (a repeated header reads
    /// as absent: which copy was meant cannot be told).
    pub fn text_header(&self, name: &str) -> Option<&str> {
        let mut found = self.headers.iter().filter(|(k, _)| k == name);
        match (found.next(), found.next()) {
            (Some((_, HeaderValue::Str(text))), None) => Some(text),
            _ => None,
        }
    }

    /// What its `x-death` header says of its latest death: for a dead letter, why (expired,
    /// maxlen, rejected, delivery_limit) and in which queue; unknown when there is none or it
    /// cannot be read.
    pub fn death(&self) -> &Death {
        &self.death
    }

    /// Its envelope, decoded from its headers (spec 10 §4's rules, in `fleet_core::envelope`).
    pub fn envelope(&self) -> Result<Envelope, EnvelopeError> {
        Envelope::decode(self.headers.iter().map(|(k, v)| (k.as_str(), v)))
    }

    /// Acknowledges it, then waits (at most 5 s) for the broker to answer a request sent after
    /// the acknowledgement on the same channel: the broker takes a channel's frames in order, so
    /// its answer shows it took the acknowledgement, and the message will not come again. An
    /// error means that is not known (the link broke, or a partition): the message may come
    /// again, or may not.
    pub async fn ack_surely(&self) -> Result<(), AmqpError> {
        self.settle(Settlement::Ack, false).await?;
        #[cfg(feature = "fake")]
        if let Acker::Fake(recorder) = &self.acker {
            return recorder.seen();
        }
        let Some((channel, prefetch)) = &self.sync else {
            return Ok(());
        };
        // Asking for the prefetch the consumer has already changes nothing, and is answered.
        let answered = channel.basic_qos(*prefetch, BasicQosOptions::default());
        match tokio::time::timeout(SURE_TIMEOUT, answered).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(AmqpError::from_lapin(
                "the broker was not seen to take an acknowledgement",
                &e,
            )),
            Err(_) => Err(AmqpError::Unavailable(format!(
                "the broker was not seen to take an acknowledgement within {} s",
                SURE_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Settles it as `how` says; with `through`, every unsettled delivery before it on its
    /// channel too (one frame for a batch). A dead letter goes to the queue's dead-letter
    /// exchange. An error means the broker was not told (the channel is closed, or it was
    /// settled already): an unsettled delivery comes again on the next consumer.
    pub async fn settle(&self, how: Settlement, through: bool) -> Result<(), AmqpError> {
        let acker = match &self.acker {
            Acker::Lapin(acker) => acker,
            #[cfg(feature = "fake")]
            Acker::Fake(recorder) => return recorder.settle(how, through),
        };
        let (what, done) = match how {
            Settlement::Ack => (
                "acknowledging a delivery",
                acker.ack(BasicAckOptions { multiple: through }).await,
            ),
            Settlement::Requeue => (
                "returning a delivery to its queue",
                acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        multiple: through,
                    })
                    .await,
            ),
            Settlement::DeadLetter if through => (
                "dead-lettering deliveries",
                acker
                    .nack(BasicNackOptions {
                        requeue: false,
                        multiple: true,
                    })
                    .await,
            ),
            Settlement::DeadLetter => (
                "dead-lettering a delivery",
                acker.reject(BasicRejectOptions { requeue: false }).await,
            ),
        };
        match done {
            Ok(true) => Ok(()),
            Ok(false) => Err(AmqpError::Unavailable(format!(
                "{what}: it was settled already, or its channel is closed"
            ))),
            Err(e) => Err(AmqpError::from_lapin(what, &e)),
        }
    }
}

/// The deliveries of one consumer, in the order the broker sent them.
pub struct Deliveries {
    source: Source,
}

/// Where deliveries come from.
enum Source {
    /// A broker consumer, its channel and its prefetch.
    Lapin(Box<(lapin::Consumer, lapin::Channel, u16)>),
    /// The fake broker's queue.
    #[cfg(feature = "fake")]
    Fake(tokio::sync::mpsc::Receiver<Delivery>),
}

impl Deliveries {
    pub(crate) fn new(consumer: lapin::Consumer, channel: lapin::Channel, prefetch: u16) -> Self {
        Self {
            source: Source::Lapin(Box::new((consumer, channel, prefetch))),
        }
    }

    /// Deliveries off the fake broker's queue.
    #[cfg(feature = "fake")]
    pub(crate) fn fake(queue: tokio::sync::mpsc::Receiver<Delivery>) -> Self {
        Self {
            source: Source::Fake(queue),
        }
    }

    /// The next delivery; `None` once the consumer ended (its channel or connection closed,
    /// or the broker cancelled it). Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Delivery, AmqpError>> {
        match &mut self.source {
            Source::Lapin(lapin) => {
                let (consumer, channel, prefetch) = &mut **lapin;
                consumer
                    .next()
                    .await
                    .map(|next| converted(next, channel, *prefetch))
            }
            #[cfg(feature = "fake")]
            Source::Fake(queue) => queue.recv().await.map(Ok),
        }
    }

    /// The next delivery if one has arrived already (`None`: none yet), without waiting.
    pub fn next_now(&mut self) -> Option<Option<Result<Delivery, AmqpError>>> {
        match &mut self.source {
            Source::Lapin(lapin) => {
                let (consumer, channel, prefetch) = &mut **lapin;
                consumer
                    .next()
                    .now_or_never()
                    .map(|n| n.map(|next| converted(next, channel, *prefetch)))
            }
            #[cfg(feature = "fake")]
            Source::Fake(queue) => match queue.try_recv() {
                Ok(delivery) => Some(Some(Ok(delivery))),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => Some(None),
            },
        }
    }
}

fn converted(
    next: Result<lapin::message::Delivery, lapin::Error>,
    channel: &lapin::Channel,
    prefetch: u16,
) -> Result<Delivery, AmqpError> {
    next.map(|delivery| Delivery {
        sync: Some((channel.clone(), prefetch)),
        ..Delivery::from_lapin(delivery)
    })
    .map_err(|e| AmqpError::from_lapin("consuming", &e))
}
