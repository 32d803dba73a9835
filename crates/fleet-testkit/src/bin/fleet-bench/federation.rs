//! `fleet-bench federation`: the cross-host figures.

use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_core::envelope::{Envelope, VERSION};
use fleet_core::signing;
use fleet_core::{Gid, Kind, MsgId, TraceId};
use fleet_testkit::broker::{Broker, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::keys;
use serde_json::json;

use super::{federated, percentiles, sent_and_drained, trips_to};

/// Bare lapin on the same broker: `trips` ping-pong round trips (persistent messages on two
/// durable queues, confirms on, a consumer that answers each ping), and the rate of `count`
/// pipelined publishes with confirms, consumed back.
///
/// Raw lapin on purpose, the one place outside `fleet-amqp` that names it: this is the
/// baseline fleetd's broker path is measured against, so nothing of fleetd's (not even
/// `fleet-amqp`) may sit in it.
async fn bare_lapin(uri: &str, trips: usize, count: usize) -> anyhow::Result<(Vec<Duration>, f64)> {
    use futures_util::StreamExt;
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    let conn = Connection::connect(uri, ConnectionProperties::default()).await?;
    let (ping, pong) = (
        format!("bench.ping.{}", MsgId::mint()),
        format!("bench.pong.{}", MsgId::mint()),
    );
    let publisher = conn.create_channel().await?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    for queue in [&ping, &pong] {
        publisher
            .queue_declare(queue.as_str().into(), durable, FieldTable::default())
            .await?;
    }
    let persistent = || BasicProperties::default().with_delivery_mode(2);
    // The far side: answers every ping with a pong.
    let echo_channel = conn.create_channel().await?;
    echo_channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut pings = echo_channel
        .basic_consume(
            ping.as_str().into(),
            "bench-echo".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let pong_key = pong.clone();
    let echo = tokio::spawn(async move {
        while let Some(Ok(delivery)) = pings.next().await {
            let _ = echo_channel
                .basic_publish(
                    "".into(),
                    pong_key.as_str().into(),
                    BasicPublishOptions::default(),
                    &delivery.data,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await;
            let _ = delivery.ack(BasicAckOptions::default()).await;
        }
    });
    let consumer_channel = conn.create_channel().await?;
    let mut pongs = consumer_channel
        .basic_consume(
            pong.as_str().into(),
            "bench-pong".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut samples = Vec::with_capacity(trips);
    for i in 0..trips + 20 {
        let started = Instant::now();
        publisher
            .basic_publish(
                "".into(),
                ping.as_str().into(),
                BasicPublishOptions::default(),
                format!("ping {i}").as_bytes(),
                persistent(),
            )
            .await?
            .await?;
        let delivery = pongs.next().await.context("the pong consumer ended")??;
        delivery.ack(BasicAckOptions::default()).await?;
        if i >= 20 {
            samples.push(started.elapsed());
        }
    }
    echo.abort();

    // Throughput: pipelined publishes with confirms, consumed and acknowledged as they come.
    let started = Instant::now();
    let consumer = tokio::spawn(async move {
        for _ in 0..count {
            let delivery = pongs.next().await.context("the consumer ended")??;
            delivery.ack(BasicAckOptions::default()).await?;
        }
        anyhow::Ok(())
    });
    for i in 0..count {
        publisher
            .basic_publish(
                "".into(),
                pong.as_str().into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                persistent(),
            )
            .await?;
    }
    publisher.wait_for_confirms().await?;
    consumer.await??;
    let rate = count as f64 / started.elapsed().as_secs_f64();
    for queue in [&ping, &pong] {
        let _ = publisher
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = conn.close(200, "done".into()).await;
    Ok((samples, rate))
}

/// How many workers the federation benchmark spawns on each side.
const SPAWNS: usize = 10;

/// What signing costs a hop: the mean time to sign an envelope with a `size`-byte body, and to
/// verify it, over `rounds` rounds.
fn sign_and_verify(size: usize, rounds: u32) -> (Duration, Duration) {
    let key = keys::host_key("hosta");
    let public = key.verifying_key();
    let body = vec![b'x'; size];
    let now = u64::try_from(fleet_core::clock::now_ms()).unwrap_or(0);
    let envelope = Envelope {
        version: VERSION,
        kind: Kind::Send,
        msg_id: MsgId::mint(),
        trace_id: TraceId::mint(),
        from: Gid::mint(),
        to: Gid::mint().to_string(),
        turn_id: None,
        spawn_id: None,
        in_reply_to: None,
        from_name: Some("alice".into()),
        from_host: Some("hosta".into()),
        ts_ms: now,
        expires_at_ms: now + 86_400_000,
    };
    let started = Instant::now();
    let mut signed = None;
    for _ in 0..rounds {
        signed = Some(signing::signature(&key, &envelope, &body));
    }
    let sign = started.elapsed() / rounds;
    let sig = signed.map(|s| s.sig).unwrap_or_default();
    let started = Instant::now();
    let mut valid = true;
    for _ in 0..rounds {
        valid &= signing::verify(&public, &envelope, &body, &sig).is_ok();
    }
    let verify = started.elapsed() / rounds;
    assert!(valid, "a signature of the benchmark did not verify");
    (sign, verify)
}

/// Concurrent senders for the cross-host throughput figures: a lead's few parallel calls, and
/// a fleet's many (bare lapin pipelines without bound).
const THROUGHPUT_LANES: [usize; 2] = [8, 32];

/// How long `lead`'s `fleet_spawn` of profile `sim` on `host` (this one's when `None`) takes
/// to return a ready worker, `spawns` times (each stopped before the next).
async fn spawns_on(
    lead: &Client,
    host: Option<&str>,
    spawns: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(spawns);
    for i in 0..spawns {
        let name = format!("spawned-{}-{i}", host.unwrap_or("here"));
        let mut args = json!({"profile": "sim", "name": name});
        if let Some(host) = host {
            args["host"] = json!(host);
        }
        let started = Instant::now();
        lead.ok("fleet_spawn", args).await?;
        samples.push(started.elapsed());
        lead.ok("fleet_stop", json!({"to": name})).await?;
    }
    Ok(samples)
}

/// Mid-task asks, `trips` times: `lead` sends `to` a task whose worker asks it a question,
/// answers it, and gets the task's reply; the time from the answer to the reply (the answer's
/// way to the asking call, and the reply's back).
async fn ask_trips(lead: &Client, to: &str, trips: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(trips);
    for _ in 0..trips {
        let asked = lead
            .ok(
                "fleet_send",
                json!({"to": to, "message": "/ask 20 go?", "wait_s": 20}),
            )
            .await?;
        anyhow::ensure!(asked["status"] == "asked", "no ask: {asked}");
        let started = Instant::now();
        let replied = lead
            .ok(
                "fleet_send",
                json!({"turn_id": asked["ask"]["turn_id"], "message": "go", "wait_s": 20}),
            )
            .await?;
        anyhow::ensure!(replied["status"] == "replied", "no reply: {replied}");
        samples.push(started.elapsed());
    }
    Ok(samples)
}

pub(super) async fn federation(
    trips: usize,
    messages: usize,
    entities: usize,
) -> anyhow::Result<()> {
    let broker = Broker::find().await?;
    let vhost = Vhost::create(&broker).await?;
    let uri = vhost.uri();
    println!("fleet-bench federation (broker vhost {})", vhost.name());

    // The bare figures vary between runs on a shared machine: three runs, the median rate.
    let mut bare = Vec::new();
    let mut bare_rates = Vec::new();
    for _ in 0..3 {
        let (samples, rate) = bare_lapin(&uri, trips, messages).await?;
        bare.extend(samples);
        bare_rates.push(rate);
    }
    bare_rates.sort_by(f64::total_cmp);
    let bare_rate = bare_rates[1];
    let a = federated(&uri, "hosta", &["alice".into(), "carol".into()]).await?;
    let b = federated(&uri, "hostb", &["bob".into()]).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    bob.ok("fleet_spawn", json!({"profile": "sim", "name": "wb"}))
        .await?;
    alice
        .ok("fleet_spawn", json!({"profile": "sim", "name": "wa"}))
        .await?;
    while alice.ok("fleet_list", json!({})).await?["entities"]
        .as_array()
        .is_none_or(|e| !e.iter().any(|e| e["name"] == "wb"))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut cross = trips_to(&alice, "wb", trips).await?;
    let mut same = trips_to(&alice, "wa", trips).await?;
    let (bare50, bare99) = percentiles(&mut bare);
    let (cross50, cross99) = percentiles(&mut cross);
    let (same50, same99) = percentiles(&mut same);
    println!(
        "cross-host round trip (lead on A → worker on B → reply), {trips} trips: p50 {cross50:.2} ms  p99 {cross99:.2} ms"
    );
    println!(
        "same-host round trip in the same run:                  p50 {same50:.2} ms  p99 {same99:.2} ms"
    );
    println!(
        "bare lapin ping-pong (2 hops, persistent, confirms):   p50 {bare50:.2} ms  p99 {bare99:.2} ms"
    );
    println!(
        "  fleetd's added cost per broker hop = (cross p50 - same-host p50 - bare p50) / 2 = {:.2} ms  [target ≤ 2 ms]",
        (cross50 - same50 - bare50) / 2.0
    );
    let mut asked_far = ask_trips(&alice, "wb", trips.min(50)).await?;
    let mut asked_here = ask_trips(&alice, "wa", trips.min(50)).await?;
    let (far50, far99) = percentiles(&mut asked_far);
    let (here50, here99) = percentiles(&mut asked_here);
    println!(
        "mid-task ask, answer → reply, worker on B ({} asks):      p50 {far50:.2} ms  p99 {far99:.2} ms",
        asked_far.len()
    );
    println!(
        "the same on one host, same run:                        p50 {here50:.2} ms  p99 {here99:.2} ms"
    );
    let mut far = spawns_on(&alice, Some("hostb"), SPAWNS).await?;
    let mut here = spawns_on(&alice, None, SPAWNS).await?;
    let (far50, far99) = percentiles(&mut far);
    let (here50, here99) = percentiles(&mut here);
    println!(
        "fleet_spawn → ready on host B from a lead on A ({SPAWNS} spawns): p50 {far50:.2} ms  p99 {far99:.2} ms"
    );
    println!(
        "fleet_spawn → ready on the lead's own host, same run:    p50 {here50:.2} ms  p99 {here99:.2} ms"
    );
    for size in [100, 10_000, 256 * 1024] {
        let (sign, verify) = sign_and_verify(size, 500);
        println!(
            "  of which signing + verifying (Ed25519 over the envelope and SHA-256 of a {size}-byte body), per hop: {:.3} ms (sign {:.3} ms, verify {:.3} ms)",
            (sign + verify).as_secs_f64() * 1000.0,
            sign.as_secs_f64() * 1000.0,
            verify.as_secs_f64() * 1000.0
        );
    }

    println!(
        "bare lapin publish with confirms (pipelined) + consume, {messages} messages: {bare_rate:.0}/s (median of {:.0}, {:.0}, {:.0})",
        bare_rates[0], bare_rates[1], bare_rates[2]
    );
    for lanes in THROUGHPUT_LANES {
        let lead = || a.lead("alice", Protocol::Stateless);
        let carol = a.lead("carol", Protocol::Stateless).await?;
        let same = sent_and_drained(lead().await?, &carol, "carol", messages, lanes).await?;
        let rate = sent_and_drained(lead().await?, &bob, "bob@hostb", messages, lanes).await?;
        println!(
            "cross-host messages, {messages} lead→lead sends in {lanes} lanes drained by fleet_poll: {rate:.0}/s = {:.0} % of bare lapin  [target ≥ 50 %]; same-host over MCP: {same:.0}/s",
            rate / bare_rate * 100.0
        );
    }
    drop((alice, bob, a, b));

    // Roster convergence: three gateways of `entities` entities each (leads: no panes needed).
    let names =
        |host: &str| -> Vec<String> { (0..entities).map(|i| format!("{host}-l{i}")).collect() };
    let mut gateways = Vec::new();
    for host in ["ra", "rb", "rc"] {
        gateways.push(federated(&uri, host, &names(host)).await?);
    }
    let started = Instant::now();
    let mut leads = Vec::new();
    for (gateway, host) in gateways.iter().zip(["ra", "rb", "rc"]) {
        leads.push(
            gateway
                .lead(&format!("{host}-l0"), Protocol::Stateless)
                .await?,
        );
    }
    let total = 3 * entities;
    let mut converged = vec![None; leads.len()];
    while converged.iter().any(Option::is_none) {
        for (lead, done) in leads.iter().zip(converged.iter_mut()) {
            if done.is_none() {
                let list = lead.ok("fleet_list", json!({})).await?;
                if list["entities"].as_array().map_or(0, Vec::len) >= total {
                    *done = Some(started.elapsed());
                }
            }
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the roster did not converge within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let slowest = converged.into_iter().flatten().max().unwrap_or_default();
    println!(
        "roster convergence, 3 gateways × {entities} entities (heartbeat 1 s), from the last gateway up: {:.0} ms = {:.2} heartbeat intervals  [target ≤ 2]",
        slowest.as_secs_f64() * 1000.0,
        slowest.as_secs_f64()
    );
    Ok(())
}
