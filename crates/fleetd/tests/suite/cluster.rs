//! Past one broker node: gateways on a three-node RabbitMQ cluster of the test's own (real
//! `rabbitmq-server` nodes on loopback, joined with `rabbitmqctl join_cluster`), their inboxes
//! and control queues quorum queues replicated on all three, and a node killed with SIGKILL in
//! the middle of traffic. The invariants of spec 10 §5 on quorum queues run on the machine's
//! broker (a quorum queue works on one node too).

use std::collections::BTreeMap;
use std::time::Instant;

use fleet_amqp::topology::{inbox_queue, lock_args, lock_queue};
use fleet_core::Gid;
use fleet_testkit::broker::{Broker, Cluster, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::keys;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::federation::{LIMIT, audit_lines, drain, sees, texts};
use fleet_testkit::hosts::{HOSTS, SHARED};

/// A gateway of host `host` with lead `lead` and the scripted agent as `sim`, on the broker
/// nodes `uris` (tried in that order), its queues quorum queues; `broker` and `federation` are
/// more of `[broker]` and `[federation]`.
async fn gateway_on(
    uris: &[String],
    (host, lead): (&str, &str),
    broker: &str,
    federation: &str,
) -> anyhow::Result<Fleet> {
    let uris: Vec<String> = uris.iter().map(|u| format!("{u:?}")).collect();
    Fleet::start_as(
        host,
        "",
        &format!(
            "[leads.{lead}]\ngroups = []\nshare = [{SHARED}]\n\n{}\n[broker]\nuris = [{}]\nqueue_type = \"quorum\"\n{broker}\n\n[federation]\npresence_interval_s = 1\npresence_ttl_s = 5\n{federation}\n{}",
            sim_profile("sim", &[])?,
            uris.join(", "),
            keys::admitting(&HOSTS)
        ),
    )
    .await
}

/// The gid in `entry` (a `fleet_list` entry).
fn gid(entry: &Value) -> anyhow::Result<Gid> {
    Ok(entry["gid"].as_str().unwrap_or_default().parse()?)
}

/// How many times each brief was taken off the broker to be typed in, by message id, as
/// `fleet`'s audit log has it.
fn taken(fleet: &Fleet) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for line in audit_lines(fleet)?.1 {
        if line["outcome"] == "taken" {
            *counts
                .entry(line["msg_id"].as_str().unwrap_or_default().to_string())
                .or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// Sends `tasks` from `lead` to the workers `to`, round robin, without waiting: each task's
/// msg id.
async fn send_all(lead: &Client, to: &[&str], tasks: &[String]) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        let sent = lead.send(to[i % to.len()], task, 0).await?;
        anyhow::ensure!(sent["state"] == "queued", "{task}: {sent}");
        ids.push(sent["msg_id"].as_str().unwrap_or_default().to_string());
    }
    Ok(ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_leading_an_inbox_dies_mid_traffic_and_nothing_is_lost_or_typed_twice()
-> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let vhost = Vhost::create(&cluster.broker()?).await?;
    let uris = cluster.uris(vhost.name());
    // hosta tries the nodes in order, hostb from the second: they sit on different nodes. A
    // receipt may wait out a failover.
    let (heartbeat, quick) = ("heartbeat_s = 5", "injected_bound_s = 30");
    let a = gateway_on(&uris, ("hosta", "alice"), heartbeat, quick).await?;
    let rotated = [uris[1].clone(), uris[2].clone(), uris[0].clone()];
    let b = gateway_on(&rotated, ("hostb", "bob"), heartbeat, quick).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let workers = ["w1", "w2", "w3"];
    for name in workers {
        bob.spawn("sim", name).await?;
        sees(&alice, name).await?;
    }
    // Every inbox is a quorum queue with a member on each node; the lead's is led by the node
    // hosta declared it through.
    let alice_inbox = inbox_queue(gid(&alice.entry("alice").await?)?);
    let (leader, online) = cluster
        .replicas(vhost.name(), &alice_inbox)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{alice_inbox} is no quorum queue"))?;
    assert_eq!(online.len(), 3, "{online:?}");
    let victim = cluster
        .index_of(&leader)
        .ok_or_else(|| anyhow::anyhow!("no node {leader}"))?;
    for w in workers {
        let inbox = inbox_queue(gid(&alice.entry(w).await?)?);
        let replicas = cluster.replicas(vhost.name(), &inbox).await?;
        assert!(
            replicas
                .as_ref()
                .is_some_and(|(_, online)| online.len() == 3),
            "{inbox}: {replicas:?}"
        );
    }

    // Traffic: 36 tasks of 300 ms over three workers (the briefs wait in the workers' inboxes,
    // the replies come to alice's), half sent before the kill and half while it happens.
    let tasks: Vec<String> = (0..36).map(|i| format!("/slow 300 task {i}")).collect();
    let mut ids = send_all(&alice, &workers, &tasks[..18]).await?;
    until("the first replies to be held on hosta", LIMIT, || async {
        audit_lines(&a)
            .ok()?
            .1
            .iter()
            .any(|l| l["outcome"] == "held")
            .then_some(())
    })
    .await?;
    let ups = a.links_up();
    let killed = Instant::now();
    let (killing, sending) = tokio::join!(
        cluster.kill9(victim),
        send_all(&alice, &workers, &tasks[18..])
    );
    killing?;
    ids.extend(sending?);
    // hosta was on the killed node: it connects to a surviving one within seconds.
    let failover = until("hosta to connect to a surviving node", LIMIT, || async {
        (a.links_up() > ups).then(|| killed.elapsed())
    })
    .await?;
    println!("hosta's link was up again {failover:?} after its node was killed");

    // Every reply comes, once; the lead is never told a brief failed.
    let replies = drain(&alice, tasks.len()).await?;
    let mut got = texts(&replies);
    got.sort();
    let mut expected: Vec<String> = (0..36).map(|i| format!("echo: task {i}")).collect();
    expected.sort();
    assert_eq!(got, expected, "{replies:?}\n{}", a.log());
    assert_eq!(alice.poll(2).await?, Vec::<Value>::new(), "a reply twice");
    // No brief was typed twice: each was taken off the broker once.
    until("every brief in hostb's audit log", LIMIT, || async {
        let taken = taken(&b).ok()?;
        ids.iter().all(|id| taken.contains_key(id)).then_some(())
    })
    .await?;
    let taken = taken(&b)?;
    for id in &ids {
        assert_eq!(taken.get(id), Some(&1), "brief {id}: {taken:?}");
    }

    // Presence recovers on both sides, and traffic flows both ways.
    sees(&bob, "alice").await?;
    sees(&alice, "w1").await?;
    let answer = alice.send("w1", "after the failover", 20).await?;
    assert_eq!(
        answer["reply"]["text"], "echo: after the failover",
        "{answer}"
    );

    // The node comes back, rejoins, and its replica of the lead's inbox catches up.
    cluster.restart(victim).await?;
    until(
        "alice's inbox to have its three members again",
        LIMIT,
        || async {
            cluster
                .replicas(vhost.name(), &alice_inbox)
                .await
                .ok()
                .flatten()
                .filter(|(_, online)| online.len() == 3)
        },
    )
    .await?;
    let again = alice.send("w2", "with all three back", 20).await?;
    assert_eq!(
        again["reply"]["text"], "echo: with all three back",
        "{again}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_quorum_queues_a_second_gateway_is_refused_and_a_full_inbox_refuses_loudly()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let uris = [vhost.uri()];
    // A short heartbeat: a held inbox is waited for three of them before fleetd gives up. A
    // short receipt bound: a quorum inbox cannot be drained by a get, so the senders of what a
    // dead worker's inbox held hear of it from their bound, once its host says it is gone.
    let broker = "heartbeat_s = 1";
    let mut a = gateway_on(&uris, ("hosta", "alice"), broker, "injected_bound_s = 5").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let queue = inbox_queue(gid(&alice.entry("alice").await?)?);
    for name in [
        queue.as_str(),
        "control.hosta",
        "fleet.dlq.hosta",
        "fleet.dlq",
    ] {
        let kind = vhost.queue(name).await?.map(|q| q.kind);
        assert_eq!(kind.as_deref(), Some("quorum"), "{name}");
    }
    alice.close().await?;
    assert!(a.terminate().await?);

    // Another gateway holds the inbox's lock (RabbitMQ 3.10 does not make a quorum queue's
    // consumers exclusive): fleetd waits a few heartbeats, then says so and stops.
    let other = vhost.connect().await?;
    other
        .declare_exclusive_queue(&lock_queue(&queue), &lock_args())
        .await?;
    anyhow::ensure!(a.launch().await.is_err(), "fleetd started beside the lock");
    let log = a.log();
    let last = log.rsplit("--- restart ---").next().unwrap_or_default();
    assert!(
        last.contains(&lock_queue(&queue)) && last.contains("another gateway"),
        "{last}"
    );
    other.close().await?;

    // With the lock let go it starts. hostb's inboxes hold one message; with hostb dead,
    // nothing takes what comes into wb's.
    a.launch().await?;
    let mut b = gateway_on(&uris, ("hostb", "bob"), broker, "inbox_max_length = 1").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let wb = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    b.kill9().await?;
    // It takes its one message (a quorum queue on RabbitMQ 3.10 takes one past its cap before
    // it refuses); the next is refused at once, and the sender hears it was not delivered.
    let mut accepted = Vec::new();
    let over = loop {
        let sent = alice
            .call(
                "fleet_send",
                json!({"to": "wb", "message": format!("task {}", accepted.len()), "wait_s": 0}),
            )
            .await?;
        match sent {
            Ok(sent) => {
                assert_eq!(sent["state"], "queued", "{sent}");
                accepted.push(sent["msg_id"].as_str().unwrap_or_default().to_string());
                anyhow::ensure!(accepted.len() <= 2, "the inbox took {accepted:?}");
            }
            Err(refused) => break refused,
        }
    };
    assert!(!accepted.is_empty());
    assert_eq!(over.code, "broker_unavailable", "{over:?}");
    assert!(
        over.message.contains(
            "'wb' has a full inbox: the broker refused the message, which was not delivered"
        ),
        "{over:?}"
    );
    // What the inbox took is kept: still there, then answered once hostb, back, takes its
    // worker back (it ran on through its gateway's death).
    let inbox = inbox_queue(gid(&wb)?);
    // (A quorum queue's counts reach `rabbitmqctl` on the broker's next stats tick.)
    until("wb's inbox to count what it took", LIMIT, || async {
        let waiting = vhost.queue(&inbox).await.ok()??.messages;
        (waiting == accepted.len() as u64).then_some(())
    })
    .await?;
    b.launch().await?;
    let told = drain(&alice, accepted.len()).await?;
    let mut answered: Vec<String> = told
        .iter()
        .filter(|m| m["kind"] == "REPLY")
        .map(|m| m["in_reply_to"].as_str().unwrap_or_default().to_string())
        .collect();
    answered.sort();
    accepted.sort();
    assert_eq!(answered, accepted, "{told:?}");
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new());
    Ok(())
}
