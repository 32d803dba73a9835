//! The broker helpers against the real RabbitMQ: a vhost of a test's own on the tests' broker,
//! and a private node that stops and restarts with its durable queue.

// A test may unwrap: a panic is how it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use fleet_testkit::broker::{Broker, PrivateNode, Vhost};
use fleet_testkit::wait::until;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

const LIMIT: Duration = Duration::from_secs(30);

/// A durable queue.
fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

#[test]
fn a_broker_url_and_vhost_uris_are_percent_encoded() {
    let broker = Broker::at("amqp://us%40er:p%3Ass@127.0.0.1:5673", Some("n@localhost")).unwrap();
    assert_eq!(broker.user(), "us@er");
    assert_eq!(broker.port(), 5673);
    assert_eq!(broker.node(), Some("n@localhost"));
    assert_eq!(broker.url(), "amqp://us%40er:p%3Ass@127.0.0.1:5673");
    assert_eq!(broker.uri("/"), "amqp://us%40er:p%3Ass@127.0.0.1:5673/%2F");
    assert_eq!(
        broker.uri("fleet-test-a b"),
        "amqp://us%40er:p%3Ass@127.0.0.1:5673/fleet-test-a%20b"
    );
    let defaults = Broker::at("amqp://localhost", None).unwrap();
    assert_eq!(defaults.url(), "amqp://guest:guest@localhost:5672");
    assert!(Broker::at("amqp://localhost/vhost", None).is_err());
}

// Uses the real RabbitMQ: the tests' broker (`Broker::find`).
#[tokio::test]
async fn a_vhost_is_usable_shows_its_topology_and_is_gone_after_drop() -> anyhow::Result<()> {
    let broker = Broker::find().await?;
    let started = Instant::now();
    let vhost = Vhost::create(&broker).await?;
    println!("vhost {} made in {:?}", vhost.name(), started.elapsed());
    let name = vhost.name().to_string();
    assert!(name.starts_with("fleet-test-"));
    assert!(vhost.uri().ends_with(&format!("/{name}")));

    let conn = vhost.connect().await?;
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut arguments = FieldTable::default();
    arguments.insert("x-message-ttl".into(), AMQPValue::LongUInt(60_000));
    let mut nested = FieldTable::default();
    nested.insert("host".into(), AMQPValue::LongString("hosta".into()));
    arguments.insert("x-fleet-test".into(), AMQPValue::FieldTable(nested));
    channel
        .queue_declare("probe".into(), durable(), arguments)
        .await?;
    channel
        .queue_bind(
            "probe".into(),
            "amq.topic".into(),
            "probe.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let confirm = channel
        .basic_publish(
            "amq.topic".into(),
            "probe.one".into(),
            BasicPublishOptions::default(),
            b"hello",
            BasicProperties::default(),
        )
        .await?
        .await?;
    assert!(confirm.is_ack(), "{confirm:?}");

    let queue = until("the queue to hold the message", LIMIT, || async {
        vhost
            .queue("probe")
            .await
            .ok()
            .flatten()
            .filter(|q| q.messages == 1)
    })
    .await?;
    assert!(queue.durable && !queue.auto_delete && !queue.exclusive);
    assert_eq!(
        serde_json::Value::Object(queue.arguments.clone()),
        serde_json::json!({
            "x-message-ttl": 60_000,
            "x-fleet-test": {"host": "hosta"},
        }),
        "{queue:?}"
    );
    assert_eq!(queue.consumers, 0);
    let bindings = vhost.bindings().await?;
    assert!(
        bindings.iter().any(|b| b.source == "amq.topic"
            && b.destination == "probe"
            && b.destination_kind == "queue"
            && b.routing_key == "probe.#"),
        "{bindings:?}"
    );
    let exchanges = vhost.exchanges().await?;
    assert!(
        exchanges
            .iter()
            .any(|e| e.name == "amq.topic" && e.kind == "topic"),
        "{exchanges:?}"
    );

    let mut consumer = channel
        .basic_consume(
            "probe".into(),
            "probe-consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let delivery = tokio::time::timeout(LIMIT, consumer.next())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the consumer ended"))??;
    assert_eq!(delivery.data, b"hello");
    delivery.ack(BasicAckOptions::default()).await?;
    until(
        "the queue to be drained, with its consumer",
        LIMIT,
        || async {
            vhost
                .queue("probe")
                .await
                .ok()
                .flatten()
                .filter(|q| q.messages == 0 && q.consumers == 1)
        },
    )
    .await?;
    conn.close(200, "done".into()).await?;

    let uri = vhost.uri();
    let started = Instant::now();
    drop(vhost);
    println!("vhost deleted in {:?}", started.elapsed());
    let vhosts = broker.rabbitmqctl(&["-q", "list_vhosts"]).await?;
    assert!(!vhosts.lines().any(|l| l.trim() == name), "{vhosts}");
    assert!(
        Connection::connect(&uri, ConnectionProperties::default())
            .await
            .is_err(),
        "a connection to the deleted vhost opened"
    );
    Ok(())
}

// Uses the real RabbitMQ: a private node of its own, started, stopped and restarted (the
// machine's shared broker is not touched).
#[tokio::test]
async fn a_private_node_stops_and_restarts_with_its_durable_queue() -> anyhow::Result<()> {
    let started = Instant::now();
    let mut node = PrivateNode::start().await?;
    println!("private node started in {:?}", started.elapsed());
    let port = node.port();
    assert_ne!(port, 5672);
    let vhost = Vhost::create(&node).await?;

    let conn = vhost.connect().await?;
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    channel
        .queue_declare("kept".into(), durable(), FieldTable::default())
        .await?;
    let confirm = channel
        .basic_publish(
            "".into(),
            "kept".into(),
            BasicPublishOptions::default(),
            b"survives",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?
        .await?;
    assert!(confirm.is_ack(), "{confirm:?}");

    let started = Instant::now();
    node.stop().await?;
    println!("private node stopped in {:?}", started.elapsed());
    assert!(!node.is_running());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(
        Connection::connect(&vhost.uri(), ConnectionProperties::default())
            .await
            .is_err(),
        "a connection to the stopped node opened"
    );
    assert!(node.stop().await.is_err(), "a stopped node stopped again");

    let started = Instant::now();
    node.restart().await?;
    println!("private node restarted in {:?}", started.elapsed());
    assert_eq!(node.port(), port);
    let queue = vhost
        .queue("kept")
        .await?
        .ok_or_else(|| anyhow::anyhow!("the durable queue is gone"))?;
    assert!(queue.durable);
    assert_eq!(queue.messages, 1, "{queue:?}");
    let conn = vhost.connect().await?;
    let channel = conn.create_channel().await?;
    let got = channel
        .basic_get("kept".into(), BasicGetOptions { no_ack: true })
        .await?
        .ok_or_else(|| anyhow::anyhow!("the persistent message is gone"))?;
    assert_eq!(got.delivery.data, b"survives");
    conn.close(200, "done".into()).await?;
    Ok(())
}
