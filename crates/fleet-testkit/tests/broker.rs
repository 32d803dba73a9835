//! The broker helpers against the real RabbitMQ: a vhost of a test's own on the tests' broker,
//! and a private node that stops and restarts with its durable queue.

// A test may unwrap: a panic is how it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use fleet_amqp::{Client, Field, Published, Raw, Table};
use fleet_core::admission::Settlement;
use fleet_testkit::broker::{Broker, PrivateNode, Vhost};
use fleet_testkit::wait::until;

const LIMIT: Duration = Duration::from_secs(30);

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

    let client = vhost.connect().await?;
    let arguments = Table::new().with("x-message-ttl", 60_000).with(
        "x-fleet-test",
        Field::Table(Table::new().with("host", "hosta")),
    );
    client.declare_queue("probe", true, &arguments).await?;
    client.bind("probe", "amq.topic", "probe.#").await?;
    let message = Raw {
        body: b"hello".to_vec(),
        ..Raw::default()
    };
    let confirm = client.publish("amq.topic", "probe.one", &message).await?;
    assert_eq!(confirm, Published::Routed);

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

    let mut consumer = client.consume("probe", "probe-consumer", false).await?;
    let delivery = tokio::time::timeout(LIMIT, consumer.next())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the consumer ended"))??;
    assert_eq!(delivery.body(), b"hello");
    assert_eq!(delivery.routing_key(), "probe.one");
    assert!(!delivery.redelivered());
    delivery.settle(Settlement::Ack, false).await?;
    // Settled once: a second settlement is an error, not silence.
    assert!(delivery.settle(Settlement::Ack, false).await.is_err());
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
    client.close().await?;

    let uri = vhost.uri();
    let started = Instant::now();
    drop(vhost);
    println!("vhost deleted in {:?}", started.elapsed());
    let vhosts = broker.rabbitmqctl(&["-q", "list_vhosts"]).await?;
    assert!(!vhosts.lines().any(|l| l.trim() == name), "{vhosts}");
    assert!(
        Client::connect(&uri).await.is_err(),
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

    let client = vhost.connect().await?;
    client.declare_queue("kept", true, &Table::new()).await?;
    let message = Raw {
        body: b"survives".to_vec(),
        persistent: true,
        ..Raw::default()
    };
    let confirm = client.publish("", "kept", &message).await?;
    assert_eq!(confirm, Published::Routed);

    let started = Instant::now();
    node.stop().await?;
    println!("private node stopped in {:?}", started.elapsed());
    assert!(!node.is_running());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(
        Client::connect(&vhost.uri()).await.is_err(),
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
    let client = vhost.connect().await?;
    let got = client
        .get("kept")
        .await?
        .ok_or_else(|| anyhow::anyhow!("the persistent message is gone"))?;
    assert_eq!(got.body(), b"survives");
    client.close().await?;
    Ok(())
}
