//! The federated plane's orchestration against the in-memory broker (`fleet_amqp::fake`): a
//! real gateway (its store on disk, an empty in-memory pane host) whose link is the fake, so
//! that what it makes of each delivery — how it is settled, what is held, what is published
//! back — is seen directly.
//! The same flows against the real RabbitMQ are in the `federation` integration tests.

use std::sync::Arc;
use std::time::Duration;

use fleet_amqp::fake::{FakeBroker, Settled};
use fleet_amqp::topology::inbox_queue;
use fleet_amqp::{Broker, Table};
use fleet_core::admission::Settlement;
use fleet_core::envelope::{Envelope, VERSION};
use fleet_core::presence::{Account, EntityState, Round};
use fleet_core::roster::{GONE, Presence};
use fleet_core::signing::{SigningKey, key_text, signature};
use fleet_core::{Entity, Gid, Kind, Message, MsgId, MsgState, Role, TraceId};
use fleet_mux::fake::FakePanes;

use super::super::LocalPlane;
use super::super::afar::Afar;
use super::super::delivery::Taken;
use super::super::testing::gateway_on;
use super::{Federation, outgoing};
use crate::config::{BrokerConfig, Config, FederationConfig, TrustEntry};

/// How long a test waits for the gateway to act on what the fake delivered.
const LIMIT: Duration = Duration::from_secs(10);

/// A gateway of `hosta` with lead alice, its link the fake, alice's inbox consumed; `hostb`
/// and `hostc` are pinned to their test keys, and carol is a lead on `hostc`.
struct Harness {
    gateway: Arc<LocalPlane>,
    fed: Arc<Federation>,
    broker: Arc<FakeBroker>,
    alice: Entity,
    carol: Gid,
    _dir: tempfile::TempDir,
}

/// A test host's key: `hostb` and `hostc` are pinned by the harness, any other host is not.
fn host_key(host: &str) -> SigningKey {
    let seed = match host {
        "hostb" => 2,
        "hostc" => 3,
        _ => 9,
    };
    SigningKey::from_bytes(&[seed; 32])
}

/// `envelope` with `body` as headers signed by its sending host's test key.
fn signed(envelope: &Envelope, body: &[u8]) -> Table {
    let host = envelope.from_host.as_deref().unwrap_or_default();
    Table::of_signed(envelope, &signature(&host_key(host), envelope, body))
}

/// A lead of `host`, as its heartbeats tell.
fn lead_of(host: &str) -> Entity {
    Entity {
        gid: Gid::mint(),
        name: "carol".into(),
        host: host.into(),
        role: Role::Lead,
        profile: None,
        sandbox: None,
        profile_role: None,
        groups: Vec::new(),
        parent: None,
    }
}

async fn harness(max_held: usize) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::embedded();
    config.gateway.max_held_per_recipient = max_held;
    let broker_config = BrokerConfig {
        uris: vec!["amqp://127.0.0.1:1/fake".into()],
        password_env: "FLEETD_TEST_NO_SUCH_VAR".into(),
        heartbeat_s: 10,
        prefetch: 32,
        ca_file: None,
        cert_file: None,
        key_file: None,
        queue_type: fleet_amqp::topology::QueueType::Classic,
        failover_wait_s: 0,
    };
    let trust = ["hostb", "hostc"]
        .into_iter()
        .map(|h| {
            let key = key_text(&host_key(h).verifying_key());
            (h.to_string(), TrustEntry::Key(key))
        })
        .collect();
    let federation = Federation::new(
        broker_config,
        FederationConfig {
            trust,
            ..FederationConfig::default()
        },
        dir.path(),
        "hosta",
        SigningKey::from_bytes(&[1; 32]),
    )
    .unwrap();
    let (front, alice) = gateway_on(
        dir.path(),
        config,
        Arc::new(FakePanes::new()),
        Some(federation),
    )
    .await;
    let gateway = Arc::clone(&front.local);
    let fed = front.federation.clone().unwrap();
    let broker = Arc::new(FakeBroker::new());
    let link: Arc<dyn Broker> = broker.clone();
    fed.link.send_replace(Some(link));
    fed.attach_inbox(&gateway, broker.as_ref(), &alice)
        .await
        .unwrap();
    let carol = lead_of("hostc");
    let heard = Presence {
        families: Default::default(),
        account: None,
        entity: Some(carol.clone()),
        status: "idle".into(),
        profiles: Vec::new(),
    };
    let now = tokio::time::Instant::now().into_std();
    fed.lock().roster.hear("hostc", heard, now, 0);
    Harness {
        gateway,
        fed,
        broker,
        alice,
        carol: carol.gid,
        _dir: dir,
    }
}

/// An envelope as another host's gateway writes one, of `kind` from `from` to `to`.
fn envelope(kind: Kind, from: Gid, to: &str) -> Envelope {
    let now = u64::try_from(fleet_core::clock::now_ms()).unwrap();
    Envelope {
        version: VERSION,
        kind,
        msg_id: MsgId::mint(),
        trace_id: TraceId::mint(),
        from,
        to: to.into(),
        turn_id: None,
        spawn_id: None,
        in_reply_to: None,
        from_name: Some("carol".into()),
        from_host: Some("hostc".into()),
        ts_ms: now,
        expires_at_ms: now + 60_000,
    }
}

/// Waits until `done` holds of the fake's settlements; they, then.
async fn settled_until(broker: &FakeBroker, done: impl Fn(&[Settled]) -> bool) -> Vec<Settled> {
    tokio::time::timeout(LIMIT, async {
        loop {
            let settled = broker.settled();
            if done(&settled) {
                return settled;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("settlements so far: {:?}", broker.settled()))
}

fn how_of(settled: &[Settled], tag: u64) -> Vec<(Settlement, bool)> {
    settled
        .iter()
        .filter(|s| s.tag == tag)
        .map(|s| (s.how, s.through))
        .collect()
}

#[tokio::test]
async fn garbage_and_misaddressed_deliveries_are_dead_lettered_and_a_good_one_held_once() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        carol,
        _dir,
        ..
    } = harness(10).await;
    let key = alice.gid.to_string();
    let garbage = broker
        .deliver(alice.gid, &key, &Table::new(), b"x", None)
        .await
        .unwrap();
    let elsewhere = envelope(Kind::Send, carol, &Gid::mint().to_string());
    let misaddressed = broker
        .deliver(alice.gid, &key, &signed(&elsewhere, b"x"), b"x", None)
        .await
        .unwrap();
    let good = envelope(Kind::Send, carol, &key);
    let unsigned = broker
        .deliver(alice.gid, &key, &Table::of_envelope(&good), b"hello", None)
        .await
        .unwrap();
    // A signature header of the wrong type (a number) is no signature.
    let wrong_type = envelope(Kind::Send, carol, &key);
    let headers = signed(&wrong_type, b"hello").with(fleet_core::signing::SIG_HEADER, 42);
    let numeric = broker
        .deliver(alice.gid, &key, &headers, b"hello", None)
        .await
        .unwrap();
    let kept = broker
        .deliver(alice.gid, &key, &signed(&good, b"hello"), b"hello", None)
        .await
        .unwrap();
    // The same message again, not flagged redelivered by the broker: a replay.
    let again = broker
        .deliver(alice.gid, &key, &signed(&good, b"hello"), b"hello", None)
        .await
        .unwrap();

    // A replay is refused while its batch is checked, before what is kept is held.
    let settled = settled_until(&broker, |s| {
        [again, kept]
            .iter()
            .all(|tag| s.iter().any(|s| s.tag == *tag))
    })
    .await;
    for refused in [garbage, misaddressed, unsigned, numeric, again] {
        assert_eq!(
            how_of(&settled, refused),
            [(Settlement::DeadLetter, false)],
            "{refused}"
        );
    }
    // Held ones are acknowledged in one frame up to the last of their batch.
    assert_eq!(how_of(&settled, kept), [(Settlement::Ack, true)]);
    let gid = alice.gid;
    let held = gateway.db.run(move |s| s.held_count(gid)).await.unwrap();
    assert_eq!(held, 1);
    let shown = fed.lock().senders.get(&carol).cloned();
    assert_eq!(shown.as_deref(), Some("carol@hostc"));
}

#[tokio::test]
async fn a_reply_for_another_host_is_taken_with_the_broker_down_and_sent_once_it_is_back() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        carol,
        _dir,
        ..
    } = harness(10).await;
    broker.go_down();
    // A reply (here alice's, to carol on hostc) is handed over while the link is down: taken,
    // kept in the outbox. A task for a worker would be refused (its lead decides).
    let task = MsgId::mint();
    let reply = Message {
        in_reply_to: Some(task),
        ..Message::task(alice.gid, carol, "the answer".into(), TraceId::mint(), 0)
    };
    let reply = Message {
        kind: Kind::Reply,
        ..reply
    };
    let placed = fed.carry(&gateway, reply.clone()).await.unwrap();
    assert_eq!(placed, fleet_core::delivery::Placement::Remote);
    let kept = gateway.db.run(|s| s.outbox()).await.unwrap();
    assert_eq!(
        kept.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        [reply.msg_id]
    );
    // Nothing goes while the link is down, however often the presence loop looks.
    fed.flush_when_waiting(&gateway);
    assert_eq!(gateway.db.run(|s| s.outbox()).await.unwrap().len(), 1);
    // A new link: the presence loop's next look sends it, once, and empties the outbox.
    let back = Arc::new(FakeBroker::new());
    back.bind(&carol.to_string());
    fed.link
        .send_replace(Some(Arc::clone(&back) as Arc<dyn Broker>));
    fed.flush_when_waiting(&gateway);
    tokio::time::timeout(LIMIT, async {
        while !gateway.db.run(|s| s.outbox()).await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    let sent: Vec<_> = back
        .published()
        .into_iter()
        .filter(|p| p.envelope.msg_id == reply.msg_id)
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].envelope.kind, Kind::Reply);
    assert_eq!(sent[0].envelope.in_reply_to, Some(task));
    assert_eq!(sent[0].body, b"the answer");
    gateway.shutdown.cancel();
}

/// A brief from carol to alice (standing in for a worker) off a fresh inbox of `broker`.
async fn brief_off(broker: &FakeBroker, alice: Gid, brief: &Envelope) -> super::trust::Vouched {
    let mut inbox = broker.open_inbox(alice, &[]).await.unwrap();
    let key = alice.to_string();
    broker
        .deliver(alice, &key, &signed(brief, b"the task"), b"the task", None)
        .await
        .unwrap();
    let delivery = inbox.next().await.unwrap().unwrap();
    super::trust::Vouched {
        delivery,
        envelope: brief.clone(),
        body: "the task".into(),
    }
}

#[tokio::test]
async fn a_brief_whose_taking_the_broker_is_not_seen_to_take_is_failed_never_typed_and_dropped_when_it_comes_again()
 {
    let Harness {
        gateway,
        fed,
        alice,
        carol,
        _dir,
        ..
    } = harness(10).await;
    let brief = envelope(Kind::Send, carol, &alice.gid.to_string());
    // A partition: the acknowledgement goes into a socket that leads nowhere.
    let first = Arc::new(FakeBroker::new());
    let vouched = brief_off(&first, alice.gid, &brief).await;
    first.lose_acks();
    fed.link
        .send_replace(Some(Arc::clone(&first) as Arc<dyn Broker>));
    assert!(
        !fed.take_brief(&gateway, alice.gid, vouched).await,
        "the consumer stops"
    );
    assert!(!first.is_up(), "the link is given up, to be connected anew");
    // Kept failed here, never held or queued; its sender's FAILED waits for the broker.
    let id = brief.msg_id;
    let kept = gateway
        .db
        .run(move |s| s.message(id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.state.name(), "failed", "{}", kept.state);
    let gid = alice.gid;
    assert_eq!(gateway.db.run(move |s| s.held_count(gid)).await.unwrap(), 0);
    let outbox = gateway.db.run(|s| s.outbox()).await.unwrap();
    assert_eq!(outbox.len(), 1, "{outbox:?}");
    assert_eq!(
        (outbox[0].kind, outbox[0].in_reply_to, outbox[0].to),
        (Kind::Failed, Some(id), carol)
    );
    assert!(
        outbox[0].body.contains("not typed in"),
        "{}",
        outbox[0].body
    );
    // The broker never had the acknowledgement, and gives the brief again on the next link:
    // taken off the inbox, and dropped as one handled already.
    let second = Arc::new(FakeBroker::new());
    let vouched = brief_off(&second, alice.gid, &brief).await;
    fed.link
        .send_replace(Some(Arc::clone(&second) as Arc<dyn Broker>));
    assert!(fed.take_brief(&gateway, alice.gid, vouched).await);
    assert_eq!(gateway.db.run(move |s| s.held_count(gid)).await.unwrap(), 0);
    let kept = gateway
        .db
        .run(move |s| s.message(id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.state.name(), "failed", "{}", kept.state);
    gateway.shutdown.cancel();
}

/// A worker of `alice`'s on this host (its pump not started: what is queued for it stays
/// queued), and a brief for it from carol off a fresh inbox of `broker`.
async fn worker_and_brief(
    harness: &Harness,
    broker: &FakeBroker,
) -> (Gid, Envelope, super::trust::Vouched) {
    let mut session = super::super::testing::worker_session(
        &harness.alice,
        crate::config::ProfileConfig::command("sim", vec!["sim".into()]),
    );
    session.pane_opened(fleet_mux::PaneId("%1".into()));
    assert_eq!(session.called_in(false, 1), Some(true));
    let worker = session.entity().gid;
    harness.gateway.sessions.lock().add_session(session);
    let brief = envelope(Kind::Send, harness.carol, &worker.to_string());
    let mut inbox = broker.open_inbox(worker, &[]).await.unwrap();
    let key = worker.to_string();
    broker
        .deliver(
            worker,
            &key,
            &signed(&brief, b"the task"),
            b"the task",
            None,
        )
        .await
        .unwrap();
    let delivery = inbox.next().await.unwrap().unwrap();
    let vouched = super::trust::Vouched {
        delivery,
        envelope: brief.clone(),
        body: "the task".into(),
    };
    (worker, brief, vouched)
}

/// Whether `worker`'s pump may take its next task now.
fn pump_may_take(gateway: &LocalPlane, worker: Gid) -> bool {
    let sessions = gateway.sessions.lock();
    sessions.may_take_task(worker, fleet_core::delivery::Taker::Pump)
}

/// The state `msg_id` is stored in, if it is.
async fn stored_state(gateway: &LocalPlane, msg_id: MsgId) -> Option<String> {
    let found = gateway.db.run(move |s| s.message(msg_id)).await.unwrap();
    found.map(|m| m.state.name().to_string())
}

#[tokio::test]
async fn a_brief_for_a_worker_is_queued_once_its_acknowledgement_is_seen() {
    let harness = harness(10).await;
    let broker = Arc::new(FakeBroker::new());
    let (worker, brief, vouched) = worker_and_brief(&harness, &broker).await;
    harness
        .fed
        .link
        .send_replace(Some(Arc::clone(&broker) as Arc<dyn Broker>));
    // While its acknowledgement is on its way, nothing of the worker's queue is handed over.
    harness.gateway.arriving(worker);
    assert!(!pump_may_take(&harness.gateway, worker));
    harness.gateway.arrived(worker);
    assert!(pump_may_take(&harness.gateway, worker));
    assert!(
        harness
            .fed
            .take_brief(&harness.gateway, worker, vouched)
            .await
    );
    assert_eq!(broker.settled().len(), 1, "acknowledged once");
    assert_eq!(
        stored_state(&harness.gateway, brief.msg_id)
            .await
            .as_deref(),
        Some("queued")
    );
    assert!(pump_may_take(&harness.gateway, worker), "its queue goes on");
    harness.gateway.shutdown.cancel();
}

#[tokio::test]
async fn a_brief_given_again_after_a_stop_that_kept_it_is_acknowledged_and_dropped() {
    // A stop between the keeping and the acknowledgement: the restart found the brief kept
    // (and queues it); the broker, never told, gives it again.
    let harness = harness(10).await;
    let broker = Arc::new(FakeBroker::new());
    let (worker, brief, vouched) = worker_and_brief(&harness, &broker).await;
    let mut kept = brief.brief_for(worker, "the task".into(), 0);
    kept.state = MsgState::Queued;
    harness
        .gateway
        .db
        .run(move |s| s.insert_message(&kept))
        .await
        .unwrap();
    harness
        .fed
        .link
        .send_replace(Some(Arc::clone(&broker) as Arc<dyn Broker>));
    assert!(
        harness
            .fed
            .take_brief(&harness.gateway, worker, vouched)
            .await
    );
    assert_eq!(broker.settled().len(), 1, "acknowledged");
    assert_eq!(
        stored_state(&harness.gateway, brief.msg_id)
            .await
            .as_deref(),
        Some("queued"),
        "the copy kept goes on as it was"
    );
    let carol = harness.carol;
    let outbox = harness.gateway.db.run(|s| s.outbox()).await.unwrap();
    assert!(
        outbox.iter().all(|m| m.to != carol),
        "its sender is told nothing: {outbox:?}"
    );
    harness.gateway.shutdown.cancel();
}

#[tokio::test]
async fn a_workers_brief_whose_acknowledgement_is_not_seen_fails_kept_never_queued() {
    let harness = harness(10).await;
    let broker = Arc::new(FakeBroker::new());
    let (worker, brief, vouched) = worker_and_brief(&harness, &broker).await;
    broker.lose_acks();
    harness
        .fed
        .link
        .send_replace(Some(Arc::clone(&broker) as Arc<dyn Broker>));
    assert!(
        !harness
            .fed
            .take_brief(&harness.gateway, worker, vouched)
            .await
    );
    let state = stored_state(&harness.gateway, brief.msg_id).await;
    assert_eq!(
        state.as_deref(),
        Some("failed"),
        "never queued: never typed"
    );
    let outbox = harness.gateway.db.run(|s| s.outbox()).await.unwrap();
    assert_eq!(outbox.len(), 1, "{outbox:?}");
    assert_eq!(
        (outbox[0].kind, outbox[0].in_reply_to, outbox[0].to),
        (Kind::Failed, Some(brief.msg_id), harness.carol)
    );
    assert!(
        outbox[0].body.contains("not typed in"),
        "{}",
        outbox[0].body
    );
    assert!(pump_may_take(&harness.gateway, worker), "its queue goes on");
    harness.gateway.shutdown.cancel();
}

#[tokio::test]
async fn a_message_that_fails_a_trust_check_is_never_answered_whatever_else_is_wrong_with_it() {
    let Harness {
        gateway,
        broker,
        alice,
        carol,
        _dir,
        ..
    } = harness(10).await;
    let key = alice.gid.to_string();
    broker.bind(&carol.to_string());
    // Over the size cap (which a genuine sender is told of), but unsigned; and signed by hostc
    // but claiming alice, this host's own lead, as its sender.
    let big = "x".repeat(gateway.config.gateway.max_message_bytes + 1);
    let unsigned = envelope(Kind::Send, carol, &key);
    let first = broker
        .deliver(
            alice.gid,
            &key,
            &Table::of_envelope(&unsigned),
            big.as_bytes(),
            None,
        )
        .await
        .unwrap();
    let impostor = envelope(Kind::Send, alice.gid, &key);
    let second = broker
        .deliver(
            alice.gid,
            &key,
            &signed(&impostor, big.as_bytes()),
            big.as_bytes(),
            None,
        )
        .await
        .unwrap();
    let settled = settled_until(&broker, |s| s.iter().any(|s| s.tag == second)).await;
    for tag in [first, second] {
        assert_eq!(how_of(&settled, tag), [(Settlement::DeadLetter, false)]);
    }
    assert!(broker.published().is_empty(), "{:?}", broker.published());
    let gid = alice.gid;
    let held = gateway.db.run(move |s| s.held_count(gid)).await.unwrap();
    assert_eq!(held, 0);
}

#[tokio::test]
async fn over_the_held_cap_a_delivery_is_dead_lettered_and_its_sender_told_through_the_broker() {
    let Harness {
        broker,
        alice,
        carol,
        _dir,
        ..
    } = harness(1).await;
    let key = alice.gid.to_string();
    broker.bind(&carol.to_string());
    let first = envelope(Kind::Send, carol, &key);
    let first = broker
        .deliver(alice.gid, &key, &signed(&first, b"m1"), b"m1", None)
        .await
        .unwrap();
    settled_until(&broker, |s| !s.is_empty()).await;
    let over = envelope(Kind::Send, carol, &key);
    let second = broker
        .deliver(alice.gid, &key, &signed(&over, b"m2"), b"m2", None)
        .await
        .unwrap();

    let settled = settled_until(&broker, |s| s.iter().any(|s| s.tag == second)).await;
    assert_eq!(how_of(&settled, first), [(Settlement::Ack, true)]);
    assert_eq!(how_of(&settled, second), [(Settlement::DeadLetter, false)]);
    let notices: Vec<_> = broker
        .published()
        .into_iter()
        .filter(|p| p.envelope.kind == Kind::Failed)
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    let notice = &notices[0];
    assert_eq!(notice.key, carol.to_string());
    assert_eq!(notice.envelope.in_reply_to, Some(over.msg_id));
    assert!(notice.mandatory && notice.persistent);
    // Signed by this gateway's key, over what went out.
    let own = SigningKey::from_bytes(&[1; 32]);
    assert_eq!(
        notice.signature,
        signature(&own, &notice.envelope, &notice.body)
    );
    let text = String::from_utf8_lossy(&notice.body);
    assert!(
        text.contains("gateway.max_held_per_recipient = 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_receipt_marks_the_brief_injected_and_is_acknowledged() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        _dir,
        ..
    } = harness(10).await;
    let worker = Gid::mint();
    let brief = Message {
        msg_id: MsgId::mint(),
        trace_id: TraceId::mint(),
        kind: Kind::Send,
        from: alice.gid,
        to: worker,
        in_reply_to: None,
        body: "task".into(),
        state: MsgState::Queued,
        created_ms: 0,
        expires_ms: None,
    };
    fed.track_remote_brief(&gateway, &brief).await;
    let id = brief.msg_id;
    gateway
        .db
        .run(move |s| {
            s.record_sent(&[fleet_store::SentRecord {
                msg_id: id,
                host: "hostc".into(),
                from: brief.from,
                to: Some(brief.to),
                until_ms: i64::MAX,
            }])
        })
        .await
        .unwrap();
    assert_eq!(fed.brief_state(brief.msg_id), Some("queued"));
    let key = alice.gid.to_string();
    let receipt = Envelope {
        in_reply_to: Some(brief.msg_id),
        ..envelope(Kind::Injected, worker, &key)
    };
    // The same receipt from a host the brief did not go to is refused, and changes nothing.
    let forged = Envelope {
        from_host: Some("hostb".into()),
        msg_id: MsgId::mint(),
        ..receipt.clone()
    };
    let refused = broker
        .deliver(alice.gid, &key, &signed(&forged, b""), b"", None)
        .await
        .unwrap();
    let settled = settled_until(&broker, |s| !s.is_empty()).await;
    assert_eq!(how_of(&settled, refused), [(Settlement::DeadLetter, false)]);
    assert_eq!(fed.brief_state(brief.msg_id), Some("queued"));
    let tag = broker
        .deliver(alice.gid, &key, &signed(&receipt, b""), b"", None)
        .await
        .unwrap();
    let settled = settled_until(&broker, |s| s.iter().any(|s| s.tag == tag)).await;
    assert_eq!(how_of(&settled, tag), [(Settlement::Ack, false)]);
    assert_eq!(fed.brief_state(brief.msg_id), Some("injected"));
}

#[tokio::test]
async fn heartbeats_are_merged_only_when_genuine_and_our_own_ignored() {
    let Harness {
        gateway,
        fed,
        broker,
        _dir,
        ..
    } = harness(10).await;
    let roster = broker.open_roster("hosta").await.unwrap();
    tokio::spawn(fed.consume_roster(Arc::clone(&gateway), roster));
    // A heartbeat of `host` for `entity` (or the host itself), its routing key and body.
    let beat = |host: &str, entity: Option<Entity>, kind: Kind| {
        let from = entity.as_ref().map_or_else(Gid::mint, |e| e.gid);
        let who = entity
            .as_ref()
            .map_or_else(|| "_gateway".to_string(), |e| e.gid.to_string());
        let presence = Presence {
            families: Default::default(),
            account: None,
            entity,
            status: "idle".into(),
            profiles: vec!["sim".into()],
        };
        let envelope = Envelope {
            from_host: Some(host.into()),
            ..envelope(kind, from, "fleet.roster")
        };
        let body = serde_json::to_vec(&presence).unwrap();
        (format!("roster.{host}.{who}"), envelope, body)
    };
    let worker = |name: &str, host: &str| Entity {
        gid: Gid::mint(),
        name: name.into(),
        host: host.into(),
        role: Role::Worker,
        profile: Some("sim".into()),
        sandbox: None,
        profile_role: None,
        groups: Vec::new(),
        parent: None,
    };
    let mut refused = Vec::new();
    let mut taken = Vec::new();
    for (host, entity, kind) in [
        ("hosta", Some(worker("mine", "hosta")), Kind::Presence),
        ("hostb", Some(worker("notpresence", "hostb")), Kind::Send),
        ("hostb", Some(worker("claimed", "hostc")), Kind::Presence),
        ("hostz", Some(worker("unpinned", "hostz")), Kind::Presence),
    ] {
        let (key, envelope, body) = beat(host, entity, kind);
        let tag = broker.beat(&key, &signed(&envelope, &body), &body).await;
        if host == "hosta" {
            taken.push(tag.unwrap());
        } else {
            refused.push(tag.unwrap());
        }
    }
    // Unsigned; by hostb for a key of hostc's; a good one, then its replay.
    let (key, unsigned, body) = beat("hostb", Some(worker("unsigned", "hostb")), Kind::Presence);
    let tag = broker
        .beat(&key, &Table::of_envelope(&unsigned), &body)
        .await;
    refused.push(tag.unwrap());
    let (_, moved, body) = beat("hostb", Some(worker("moved", "hostb")), Kind::Presence);
    let key = format!("roster.hostc.{}", moved.from);
    refused.push(
        broker
            .beat(&key, &signed(&moved, &body), &body)
            .await
            .unwrap(),
    );
    let (key, host, body) = beat("hostb", None, Kind::Presence);
    taken.push(
        broker
            .beat(&key, &signed(&host, &body), &body)
            .await
            .unwrap(),
    );
    let (key, wb, body) = beat("hostb", Some(worker("wb", "hostb")), Kind::Presence);
    taken.push(broker.beat(&key, &signed(&wb, &body), &body).await.unwrap());
    // Late, not forged: one overtaken by wb's (stamped before it), one expired on its way
    // (both held up by a partition). Taken off the queue quietly, and the roster unchanged.
    let overtaken = Envelope {
        msg_id: MsgId::mint(),
        ts_ms: wb.ts_ms - 1_000,
        ..wb.clone()
    };
    taken.push(
        broker
            .beat(&key, &signed(&overtaken, &body), &body)
            .await
            .unwrap(),
    );
    let (late_key, late, late_body) = beat("hostb", Some(worker("late", "hostb")), Kind::Presence);
    let expired = Envelope {
        ts_ms: late.ts_ms - 20_000,
        expires_at_ms: late.ts_ms - 5_000,
        ..late
    };
    taken.push(
        broker
            .beat(&late_key, &signed(&expired, &late_body), &late_body)
            .await
            .unwrap(),
    );
    let replay = broker.beat(&key, &signed(&wb, &body), &body).await.unwrap();
    refused.push(replay);

    let settled = settled_until(&broker, |s| s.iter().any(|s| s.tag == replay)).await;
    for tag in refused {
        assert_eq!(
            how_of(&settled, tag),
            [(Settlement::DeadLetter, false)],
            "{tag}"
        );
    }
    for tag in taken {
        assert_eq!(how_of(&settled, tag), [(Settlement::Ack, false)], "{tag}");
    }
    let (entries, hosts) = gateway.fleet_view();
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["wb", "carol"], "carol is the harness's");
    assert_eq!(entries[0].status, "idle");
    let hosts: Vec<&str> = hosts.iter().map(|h| h.host.as_str()).collect();
    assert_eq!(hosts, ["hosta", "hostb"]);
    gateway.shutdown.cancel();
}

/// A worker of `host`, as its host's account names it.
fn worker_of(name: &str, host: &str) -> Entity {
    Entity {
        gid: Gid::mint(),
        name: name.into(),
        host: host.into(),
        role: Role::Worker,
        profile: Some("sim".into()),
        sandbox: None,
        profile_role: None,
        groups: Vec::new(),
        parent: None,
    }
}

/// `host`'s own heartbeat carrying an account of `states`, built on `base`: its routing key,
/// its envelope and its body.
fn host_beat(
    host: &str,
    base: MsgId,
    whole: bool,
    states: &[(&Entity, &str)],
    resync: bool,
) -> (String, Envelope, Vec<u8>) {
    let presence = Presence {
        entity: None,
        status: "up".into(),
        profiles: vec!["sim".into()],
        families: Default::default(),
        account: Some(Account {
            base,
            whole,
            states: states
                .iter()
                .map(|(e, s)| EntityState {
                    entity: (*e).clone(),
                    status: s.to_string(),
                })
                .collect(),
            resync,
        }),
    };
    let envelope = Envelope {
        from_host: Some(host.into()),
        ..envelope(Kind::Presence, Gid::mint(), "fleet.roster")
    };
    let body = serde_json::to_vec(&presence).unwrap();
    (format!("roster.{host}._gateway"), envelope, body)
}

/// Publishes `(key, envelope, body)` signed on `broker`'s roster and waits until it is settled:
/// how.
async fn beat_settled(
    broker: &FakeBroker,
    (key, envelope, body): (String, Envelope, Vec<u8>),
) -> Vec<(Settlement, bool)> {
    let tag = broker
        .beat(&key, &signed(&envelope, &body), &body)
        .await
        .unwrap();
    let settled = settled_until(broker, |s| s.iter().any(|s| s.tag == tag)).await;
    how_of(&settled, tag)
}

/// The names and statuses `gateway` lists of the remote roster.
fn remote_listed(gateway: &LocalPlane) -> Vec<(String, String)> {
    let (entries, _) = gateway.fleet_view();
    entries
        .into_iter()
        .filter(|e| e.host != "hosta")
        .map(|e| (e.name, e.status))
        .collect()
}

#[tokio::test]
async fn of_a_hosts_account_each_entity_not_its_own_is_left_out_alone_and_the_rest_merged() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        carol,
        _dir,
    } = harness(10).await;
    let roster = broker.open_roster("hosta").await.unwrap();
    tokio::spawn(Arc::clone(&fed).consume_roster(Arc::clone(&gateway), roster));
    let (w1, w2) = (worker_of("w1", "hostb"), worker_of("w2", "hostb"));
    let base = MsgId::mint();
    // Publishes a heartbeat and waits until it is settled: how.
    let send = |beat| beat_settled(&broker, beat);
    let taken = [(Settlement::Ack, false)];
    let listed = |of: &[(&str, &str)]| -> Vec<(String, String)> {
        of.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    let whole = host_beat("hostb", base, true, &[(&w1, "idle"), (&w2, "idle")], false);
    assert_eq!(send(whole).await, taken);
    // (Listed by host, then name.)
    assert_eq!(
        remote_listed(&gateway),
        listed(&[("w1", "idle"), ("w2", "idle"), ("carol", "idle")])
    );
    // hostb was new here: it is answered with this host's whole account; nothing was stale.
    assert!(fed.lock().wanted_by.contains("hostb") && !fed.lock().resync_wanted);
    fed.lock().wanted_by.clear();
    // Naming this host's own lead as hostb's: that entity is left out, the rest taken.
    let mut alice_there = alice.clone();
    alice_there.host = "hostb".into();
    let change = host_beat(
        "hostb",
        base,
        false,
        &[(&w1, "busy"), (&alice_there, "idle")],
        false,
    );
    assert_eq!(send(change).await, taken);
    assert_eq!(
        remote_listed(&gateway),
        listed(&[("w1", "busy"), ("w2", "idle"), ("carol", "idle")])
    );
    // Naming hostc's carol as hostb's, or an entity of hostc's, or a status nobody
    // announces: the same.
    let mut carol_there = lead_of("hostb");
    carol_there.gid = carol;
    let elsewhere = worker_of("x", "hostc");
    let w3 = worker_of("w3", "hostb");
    let change = host_beat(
        "hostb",
        base,
        false,
        &[
            (&w2, "busy"),
            (&carol_there, "idle"),
            (&elsewhere, "idle"),
            (&w3, "dancing\x1b[2J"),
        ],
        false,
    );
    assert_eq!(send(change).await, taken);
    assert_eq!(
        remote_listed(&gateway),
        listed(&[("w1", "busy"), ("w2", "busy"), ("carol", "idle")])
    );
    // A change on the whole one: w2 gone.
    let change = host_beat("hostb", base, false, &[(&w2, GONE), (&w1, "busy")], false);
    assert_eq!(send(change).await, taken);
    assert_eq!(
        remote_listed(&gateway),
        listed(&[("w1", "busy"), ("carol", "idle")])
    );
    assert!(!fed.lock().resync_wanted && fed.lock().wanted_by.is_empty());
    // A change built on a whole account not heard here: merged, and a whole one asked for.
    let stale = host_beat("hostb", MsgId::mint(), false, &[(&w3, "idle")], false);
    assert_eq!(send(stale).await, taken);
    assert!(fed.lock().resync_wanted);
    assert!(remote_listed(&gateway).contains(&("w3".to_string(), "idle".to_string())));
    // Asking for whole accounts from a host not pinned, or in a heartbeat refused: no answer.
    let (key, unpinned, body) = host_beat("hostz", base, true, &[], true);
    let tag = broker
        .beat(&key, &Table::of_envelope(&unpinned), &body)
        .await
        .unwrap();
    settled_until(&broker, |s| s.iter().any(|s| s.tag == tag)).await;
    let (key, envelope, body) = host_beat("hostb", base, false, &[], true);
    let mut asking: Presence = serde_json::from_slice(&body).unwrap();
    asking.profiles = vec!["no such\x1b[2J".into()];
    let body = serde_json::to_vec(&asking).unwrap();
    assert_eq!(
        send((key, envelope, body)).await,
        taken,
        "ignored, not refused"
    );
    assert!(fed.lock().wanted_by.is_empty());
    // Another gateway asking is answered at the next tick.
    let asks = host_beat("hostb", base, false, &[], true);
    assert_eq!(send(asks).await, taken);
    assert!(fed.lock().wanted_by.contains("hostb"));
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn an_answer_addressed_here_is_no_return_and_a_change_overtaking_it_asks_nothing() {
    let Harness {
        gateway,
        fed,
        broker,
        _dir,
        ..
    } = harness(10).await;
    let roster = broker.open_roster("hosta").await.unwrap();
    tokio::spawn(Arc::clone(&fed).consume_roster(Arc::clone(&gateway), roster));
    let send = |beat| beat_settled(&broker, beat);
    // This gateway has just asked (its link came up).
    fed.lock().asked = Some(tokio::time::Instant::now());
    let (w1, w2) = (worker_of("w1", "hostb"), worker_of("w2", "hostb"));
    // hostb's change overtook its answer: merged, and no second asking.
    let base = MsgId::mint();
    send(host_beat("hostb", base, false, &[(&w1, "busy")], false)).await;
    assert!(!fed.lock().resync_wanted);
    // Its answer, addressed here: taken, and hostb is not answered (it knows hosta is here).
    let (key, envelope, body) =
        host_beat("hostb", base, true, &[(&w1, "busy"), (&w2, "idle")], false);
    send((format!("to.hosta.{key}"), envelope, body)).await;
    assert_eq!(
        remote_listed(&gateway),
        [
            ("w1".to_string(), "busy".to_string()),
            ("w2".into(), "idle".into()),
            ("carol".into(), "idle".into())
        ]
    );
    assert!(fed.lock().wanted_by.is_empty());
    // One addressed here under another host's entry, or to another host: not taken.
    let w3 = worker_of("w3", "hostb");
    let (key, envelope, body) = host_beat("hostb", base, true, &[(&w3, "idle")], false);
    send((
        format!("to.hosta.{}", key.replace("hostb", "hostc")),
        envelope.clone(),
        body.clone(),
    ))
    .await;
    send((format!("to.hosta.x.{key}"), envelope, body)).await;
    assert!(!remote_listed(&gateway).iter().any(|(name, _)| name == "w3"));
    // One over 32 MiB, however sealed: refused unread.
    let (key, envelope, mut body) = host_beat("hostb", base, true, &[(&w3, "idle")], false);
    body.resize((32 << 20) + 1, b' ');
    assert_eq!(
        beat_settled(&broker, (key, envelope, body)).await,
        [(Settlement::DeadLetter, false)]
    );
    assert!(!remote_listed(&gateway).iter().any(|(name, _)| name == "w3"));
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn this_hosts_heartbeat_carries_its_entities_in_one_message_per_round() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        _dir,
        ..
    } = harness(10).await;
    let beats = |broker: &FakeBroker| -> Vec<(String, Presence)> {
        broker
            .published()
            .into_iter()
            .filter(|p| p.exchange == "fleet.roster")
            .map(|p| (p.key, serde_json::from_slice(&p.body).unwrap()))
            .collect()
    };
    fed.publish_whole_asking(&gateway).await;
    fed.publish_presence(&gateway, Round::Regular).await;
    let published = beats(&broker);
    assert_eq!(published.len(), 2, "{published:?}");
    assert!(
        published
            .iter()
            .all(|(key, _)| key == "roster.hosta._gateway")
    );
    let (_, whole) = &published[0];
    let account = whole.account.as_ref().unwrap();
    assert!(account.whole && account.resync);
    let named: Vec<Gid> = account.states.iter().map(|s| s.entity.gid).collect();
    assert!(named.contains(&alice.gid), "{named:?}");
    // Nothing changed since: the round's heartbeat names nobody, and builds on the whole one.
    let change = published[1].1.account.as_ref().unwrap();
    assert!(!change.whole && !change.resync && change.states.is_empty());
    assert_eq!(change.base, account.base);
    // A gateway that asked gets a whole account of its own, addressed to it alone, building
    // on the one all heard; once a second at most.
    fed.lock().wanted_by.insert("hostb".into());
    let due = fed.lock().due_askers();
    assert_eq!(due, ["hostb"]);
    fed.lock().wanted_by.insert("hostb".into());
    assert!(
        fed.lock().due_askers().is_empty(),
        "asked again within the second"
    );
    fed.answer_askers(&gateway, &due).await;
    let (key, addressed) = beats(&broker).pop().unwrap();
    assert_eq!(key, "to.hostb.roster.hosta._gateway");
    let snapshot = addressed.account.unwrap();
    assert!(snapshot.whole && snapshot.states.iter().any(|s| s.entity.gid == alice.gid));
    assert_eq!(snapshot.base, account.base);
    // Leaving: the host alone, gone.
    fed.leave_roster(&gateway).await;
    let published = beats(&broker);
    let (key, gone) = published.last().unwrap();
    assert_eq!(
        (key.as_str(), gone.status.as_str()),
        ("roster.hosta._gateway", GONE)
    );
    assert!(gone.entity.is_none() && gone.account.is_none());
    // Nothing after it (a worker ending as fleetd stops, say): it would bring the host back.
    fed.publish_presence(&gateway, Round::Change).await;
    fed.publish_presence(&gateway, Round::Whole).await;
    fed.answer_askers(&gateway, &["hostb".to_string()]).await;
    assert_eq!(beats(&broker).len(), published.len());
    gateway.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_sweep_loop_holds_a_brief_while_its_worker_is_unreachable_then_fails_it_at_the_bound() {
    let Harness {
        gateway,
        fed,
        alice,
        ..
    } = harness(10).await;
    let bound = Duration::from_secs(fed.config.injected_bound_s);
    let ttl = Duration::from_secs(fed.config.presence_ttl_s);
    assert!(ttl < bound, "the entry expires first");
    let worker = Entity {
        gid: Gid::mint(),
        name: "wb".into(),
        host: "hostb".into(),
        role: Role::Worker,
        profile: Some("sim".into()),
        sandbox: None,
        profile_role: None,
        groups: Vec::new(),
        parent: None,
    };
    let heard = Presence {
        families: Default::default(),
        account: None,
        entity: Some(worker.clone()),
        status: "idle".into(),
        profiles: Vec::new(),
    };
    let now = tokio::time::Instant::now().into_std();
    fed.lock().roster.hear("hostb", heard, now, 0);
    let brief = Message {
        msg_id: MsgId::mint(),
        trace_id: TraceId::mint(),
        kind: Kind::Send,
        from: alice.gid,
        to: worker.gid,
        in_reply_to: None,
        body: "task".into(),
        state: MsgState::Queued,
        created_ms: 0,
        expires_ms: None,
    };
    fed.track_remote_brief(&gateway, &brief).await;
    tokio::spawn(Arc::clone(&fed).presence_loop(Arc::clone(&gateway)));

    // Quiet for the ttl: its host is cut off. Kept, unreachable, and its brief waits for it
    // however long (its gateway may still type it).
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    let shown = |gateway: &LocalPlane| {
        let (entries, _) = gateway.fleet_view();
        let wb = entries.into_iter().find(|e| e.name == "wb");
        wb.map(|e| e.status)
    };
    assert_eq!(shown(&gateway).as_deref(), Some("unreachable"));
    tokio::time::sleep(bound * 3).await;
    assert_eq!(fed.brief_state(brief.msg_id), Some("queued"));
    // Heard again, idle, every 5 s: the brief has a whole bound from then, no more.
    let hear = || {
        let back = Presence {
            families: Default::default(),
            account: None,
            entity: Some(worker.clone()),
            status: "idle".into(),
            profiles: Vec::new(),
        };
        let now = tokio::time::Instant::now().into_std();
        fed.lock().roster.hear("hostb", back, now, 0);
    };
    let heard_again = tokio::time::Instant::now();
    hear();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(shown(&gateway).as_deref(), Some("idle"));
    while heard_again.elapsed() < bound - Duration::from_secs(1) {
        assert_eq!(fed.brief_state(brief.msg_id), Some("queued"));
        hear();
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    hear();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fed.brief_state(brief.msg_id), None);
    // Its sender holds the FAILED notice, naming the bound and the recipient.
    let gid = alice.gid;
    let notice = gateway
        .db
        .run(move |s| s.take_held(gid, None, 10))
        .await
        .unwrap();
    assert_eq!(notice.len(), 1, "{notice:?}");
    assert_eq!(notice[0].kind, Kind::Failed);
    assert_eq!(notice[0].in_reply_to, Some(brief.msg_id));
    let expected = format!("no INJECTED receipt from 'wb' within {} s", bound.as_secs());
    assert!(notice[0].body.contains(&expected), "{}", notice[0].body);
    gateway.shutdown.cancel();
}

/// The harness with this host's dead-letter queue consumed.
async fn with_dead_letters() -> Harness {
    let harness = harness(10).await;
    let dead = harness.broker.open_dead_letters("hosta").await.unwrap();
    tokio::spawn(
        harness
            .fed
            .clone()
            .consume_dead_letters(Arc::clone(&harness.gateway), dead),
    );
    harness
}

/// Worker `wb` on hostb, as its heartbeats told hosta.
fn hear_wb(fed: &Federation) -> Gid {
    let wb = Entity {
        gid: Gid::mint(),
        name: "wb".into(),
        host: "hostb".into(),
        role: Role::Worker,
        profile: Some("sim".into()),
        sandbox: None,
        profile_role: None,
        groups: Vec::new(),
        parent: None,
    };
    let heard = Presence {
        families: Default::default(),
        account: None,
        entity: Some(wb.clone()),
        status: "idle".into(),
        profiles: Vec::new(),
    };
    let now = tokio::time::Instant::now().into_std();
    fed.lock().roster.hear("hostb", heard, now, 0);
    wb.gid
}

/// Records that hosta published `(msg_id, host, from, to)`, as `publish_remote` does.
async fn sent_from_here(gateway: &LocalPlane, records: Vec<(MsgId, &str, Gid, Option<Gid>)>) {
    let rows: Vec<fleet_store::SentRecord> = records
        .into_iter()
        .map(|(msg_id, host, from, to)| fleet_store::SentRecord {
            msg_id,
            host: host.into(),
            from,
            to,
            until_ms: i64::MAX,
        })
        .collect();
    gateway.db.run(move |s| s.record_sent(&rows)).await.unwrap();
}

/// `envelope` with `body` sealed by hosta (this gateway), as the broker dead-letters it for
/// `reason` off `queue` a minute after it was sent.
fn dead_letter(
    fed: &Federation,
    envelope: &Envelope,
    body: &[u8],
    reason: &str,
    queue: &str,
) -> Table {
    let died_s = i64::try_from(envelope.ts_ms / 1000 + 60).unwrap();
    let death = Table::new()
        .with("reason", reason)
        .with("queue", queue)
        .with("time", died_s)
        .with("count", 1);
    Table::of_signed(envelope, &fed.sign(envelope, body)).with(
        "x-death",
        fleet_amqp::Field::Array(vec![fleet_amqp::Field::Table(death)]),
    )
}

/// The outcomes of the audit lines in `dir`, in order.
fn audited_outcomes(dir: &tempfile::TempDir) -> Vec<String> {
    std::fs::read_to_string(dir.path().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            line["outcome"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

/// What is held for `gid`, taken.
async fn taken(gateway: &LocalPlane, gid: Gid) -> Vec<Message> {
    gateway
        .db
        .run(move |s| s.take_held(gid, None, 10))
        .await
        .unwrap()
}

#[tokio::test]
async fn an_expired_brief_of_ours_is_told_to_its_sender_once_and_no_longer_awaits_its_receipt() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        _dir: dir,
        ..
    } = with_dead_letters().await;
    let wb = hear_wb(&fed);
    let brief = Message::task(alice.gid, wb, "task".into(), TraceId::mint(), 0);
    fed.track_remote_brief(&gateway, &brief).await;
    sent_from_here(&gateway, vec![(brief.msg_id, "hostb", alice.gid, Some(wb))]).await;
    let sent = outgoing(
        &gateway.host_id,
        Kind::Send,
        (brief.msg_id, brief.trace_id),
        alice.gid,
        wb.to_string(),
        60,
    );
    let headers = dead_letter(&fed, &sent, b"task", "expired", &inbox_queue(wb));
    // The same dead letter twice (the broker delivering it again after a crash, say).
    let first = broker
        .dead_letter(&headers, b"task", Some("guest"))
        .await
        .unwrap();
    let again = broker
        .dead_letter(&headers, b"task", Some("guest"))
        .await
        .unwrap();
    let settled = settled_until(&broker, |s| s.iter().any(|s| s.tag == again)).await;
    for tag in [first, again] {
        assert_eq!(how_of(&settled, tag), [(Settlement::Ack, false)], "{tag}");
    }
    let held = taken(&gateway, alice.gid).await;
    assert_eq!(held.len(), 1, "{held:?}");
    let notice = &held[0];
    assert_eq!(
        (notice.kind, notice.from, notice.in_reply_to),
        (Kind::Failed, wb, Some(brief.msg_id))
    );
    assert_eq!(notice.msg_id, brief.msg_id.derived("failed"));
    assert_eq!(
        notice.body,
        "expired after 60 s unread in the inbox of 'wb@hostb', never taken: its gateway may be down"
    );
    // Its receipt is no longer awaited: the bound will not fail it again.
    assert_eq!(fed.brief_state(brief.msg_id), None);
    let awaited = gateway.db.run(|s| s.awaited_receipts()).await.unwrap();
    assert!(awaited.is_empty(), "{awaited:?}");
    // Nothing goes back through the broker: the sender is here.
    assert!(broker.published().is_empty(), "{:?}", broker.published());
    fed.audit.written();
    assert_eq!(
        audited_outcomes(&dir),
        ["dead letter: expired, sender told"; 2]
    );
}

#[tokio::test]
async fn a_brief_the_bound_failed_already_is_not_failed_again_by_its_dead_letter() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        _dir,
        ..
    } = with_dead_letters().await;
    let wb = hear_wb(&fed);
    let brief = Message::task(alice.gid, wb, "task".into(), TraceId::mint(), 0);
    sent_from_here(&gateway, vec![(brief.msg_id, "hostb", alice.gid, Some(wb))]).await;
    // What the sweep does when the bound runs out; the sender takes the notice.
    gateway
        .notify_failed(&brief, "no INJECTED receipt from 'wb'")
        .await;
    assert_eq!(taken(&gateway, alice.gid).await.len(), 1);
    let sent = outgoing(
        &gateway.host_id,
        Kind::Send,
        (brief.msg_id, brief.trace_id),
        alice.gid,
        wb.to_string(),
        60,
    );
    let headers = dead_letter(&fed, &sent, b"task", "expired", &inbox_queue(wb));
    let tag = broker
        .dead_letter(&headers, b"task", Some("guest"))
        .await
        .unwrap();
    let settled = settled_until(&broker, |s| s.iter().any(|s| s.tag == tag)).await;
    assert_eq!(how_of(&settled, tag), [(Settlement::Ack, false)]);
    assert_eq!(taken(&gateway, alice.gid).await, []);
}

#[tokio::test]
async fn a_broadcast_copy_that_expired_or_found_its_inbox_full_is_told_of_by_the_copys_id() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        _dir,
        ..
    } = with_dead_letters().await;
    let (wb, wc) = (hear_wb(&fed), Gid::mint());
    let (msg_id, trace_id) = (MsgId::mint(), TraceId::mint());
    // As `publish_broadcast` records a broadcast the roster knew no copy of.
    sent_from_here(
        &gateway,
        vec![
            (msg_id, "*", alice.gid, None),
            (msg_id, "hostb", alice.gid, None),
        ],
    )
    .await;
    let sent = outgoing(
        &gateway.host_id,
        Kind::Broadcast,
        (msg_id, trace_id),
        alice.gid,
        "broadcast.all".into(),
        60,
    );
    let expired = dead_letter(&fed, &sent, b"all", "expired", &inbox_queue(wb));
    let full = dead_letter(&fed, &sent, b"all", "maxlen", &inbox_queue(wc));
    broker
        .dead_letter(&expired, b"all", Some("guest"))
        .await
        .unwrap();
    let tag = broker
        .dead_letter(&full, b"all", Some("guest"))
        .await
        .unwrap();
    settled_until(&broker, |s| s.iter().any(|s| s.tag == tag)).await;
    let mut held: Vec<(Kind, Option<MsgId>, MsgId, bool)> = taken(&gateway, alice.gid)
        .await
        .into_iter()
        .map(|m| (m.kind, m.in_reply_to, m.msg_id, m.body.contains("was full")))
        .collect();
    held.sort_by_key(|(_, _, _, full)| *full);
    let copy = |gid: Gid| msg_id.derived(&gid.to_string());
    assert_eq!(
        held,
        [
            (
                Kind::Failed,
                Some(copy(wb)),
                copy(wb).derived("failed"),
                false
            ),
            (
                Kind::Failed,
                Some(copy(wc)),
                copy(wc).derived("failed"),
                true
            ),
        ]
    );
}

#[tokio::test]
async fn dead_letters_that_are_not_ours_or_were_told_of_already_are_acknowledged_and_tell_nobody() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        carol,
        _dir: dir,
    } = with_dead_letters().await;
    let wb = hear_wb(&fed);
    let inbox = inbox_queue(wb);
    // A brief alice really sent, and one whose receipt came (it was typed in).
    let ours = |kind: Kind| {
        outgoing(
            &gateway.host_id,
            kind,
            (MsgId::mint(), TraceId::mint()),
            alice.gid,
            wb.to_string(),
            60,
        )
    };
    let sent = ours(Kind::Send);
    let injected = ours(Kind::Send);
    let notice = Envelope {
        in_reply_to: Some(MsgId::mint()),
        ..ours(Kind::Failed)
    };
    let unrecorded = ours(Kind::Send);
    sent_from_here(
        &gateway,
        [&sent, &injected, &notice]
            .iter()
            .map(|e| (e.msg_id, "hostb", alice.gid, Some(wb)))
            .collect(),
    )
    .await;
    let brief =
        Message::task(alice.gid, wb, "task".into(), injected.trace_id, 0).with_id(injected.msg_id);
    fed.track_remote_brief(&gateway, &brief).await;
    fed.lock()
        .receipts
        .injected(injected.msg_id, tokio::time::Instant::now().into_std());
    let genuine =
        |e: &Envelope, reason: &str, queue: &str| dead_letter(&fed, e, b"x", reason, queue);
    let death = |reason: &str| {
        fleet_amqp::Field::Array(vec![fleet_amqp::Field::Table(
            Table::new()
                .with("reason", reason)
                .with("queue", inbox.as_str()),
        )])
    };
    let mut letters: Vec<(Table, Option<&str>)> = vec![
        // Sealed by another key, unsigned, or published by another broker login.
        (
            Table::of_signed(&sent, &signature(&host_key("hostb"), &sent, b"x"))
                .with("x-death", death("expired")),
            Some("guest"),
        ),
        (
            Table::of_envelope(&sent).with("x-death", death("expired")),
            Some("guest"),
        ),
        (genuine(&sent, "expired", &inbox), Some("mallory")),
        (genuine(&sent, "expired", &inbox), None),
        // Told of already: over the cap, refused by its recipient's gateway.
        (genuine(&sent, "maxlen", &inbox), Some("guest")),
        (genuine(&sent, "rejected", &inbox), Some("guest")),
        // A cause nobody names, no x-death at all, another entity's inbox, or no inbox.
        (genuine(&sent, "eaten", &inbox), Some("guest")),
        (
            Table::of_signed(&sent, &fed.sign(&sent, b"x")),
            Some("guest"),
        ),
        (
            genuine(&sent, "expired", &inbox_queue(Gid::mint())),
            Some("guest"),
        ),
        (genuine(&sent, "expired", "fleet.dlq"), Some("guest")),
        // A notice never is; one this gateway has no record of sending; one typed in.
        (genuine(&notice, "expired", &inbox), Some("guest")),
        (genuine(&unrecorded, "expired", &inbox), Some("guest")),
        (genuine(&injected, "expired", &inbox), Some("guest")),
    ];
    // Another host's message (hostc's lead carol), genuinely sealed by it.
    let theirs = envelope(Kind::Send, carol, &wb.to_string());
    letters.push((
        signed(&theirs, b"x").with("x-death", death("expired")),
        Some("guest"),
    ));
    let mut tags = Vec::new();
    for (headers, login) in &letters {
        tags.push(broker.dead_letter(headers, b"x", *login).await.unwrap());
    }
    let last = *tags.last().unwrap();
    let settled = settled_until(&broker, |s| s.iter().any(|s| s.tag == last)).await;
    for tag in tags {
        assert_eq!(how_of(&settled, tag), [(Settlement::Ack, false)], "{tag}");
    }
    assert_eq!(taken(&gateway, alice.gid).await, []);
    assert!(broker.published().is_empty(), "{:?}", broker.published());
    // Each for its own reason, in the order they came.
    let reasons = [
        "key not pinned",
        "unsigned",
        "broker login",
        "broker login",
        "maxlen",
        "rejected",
        "no cause",
        "no cause",
        "another inbox",
        "no inbox",
        "a notice",
        "not sent",
        "delivered",
        "another host's",
    ];
    let expected: Vec<String> = reasons
        .iter()
        .map(|r| format!("dead letter dropped: {r}"))
        .collect();
    fed.audit.written();
    assert_eq!(audited_outcomes(&dir), expected);
    // The brief that was typed in still awaits its answer.
    assert_eq!(fed.brief_state(injected.msg_id), Some("injected"));
}

#[tokio::test]
async fn a_too_late_about_an_answer_of_ours_is_held_for_the_lead_who_answered() {
    let Harness {
        gateway,
        fed,
        broker,
        alice,
        _dir,
        ..
    } = harness(10).await;
    let wb = hear_wb(&fed);
    // alice answered wb's question; her ANSWER went to hostb.
    let answer = MsgId::mint();
    sent_from_here(&gateway, vec![(answer, "hostb", alice.gid, Some(wb))]).await;
    let key = alice.gid.to_string();
    let too_late = Envelope {
        in_reply_to: Some(answer),
        turn_id: Some("turn-1".into()),
        from_name: Some("wb".into()),
        from_host: Some("hostb".into()),
        ..envelope(Kind::TooLate, wb, &key)
    };
    let body = b"the question turn-1 is over (the worker stopped waiting)";
    // The same notice about an answer hosta never sent is refused, and held nowhere.
    let unknown = Envelope {
        in_reply_to: Some(MsgId::mint()),
        msg_id: MsgId::mint(),
        ..too_late.clone()
    };
    let refused = broker
        .deliver(alice.gid, &key, &signed(&unknown, body), body, None)
        .await
        .unwrap();
    let tag = broker
        .deliver(alice.gid, &key, &signed(&too_late, body), body, None)
        .await
        .unwrap();
    let settled = settled_until(&broker, |s| s.iter().any(|s| s.tag == tag)).await;
    assert_eq!(how_of(&settled, refused), [(Settlement::DeadLetter, false)]);
    assert_eq!(how_of(&settled, tag), [(Settlement::Ack, true)]);
    let held = taken(&gateway, alice.gid).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].kind, held[0].from, held[0].in_reply_to),
        (Kind::TooLate, wb, Some(answer))
    );
    assert_eq!(held[0].body.as_bytes(), body);
}

#[tokio::test]
async fn a_brief_from_afar_that_expired_queued_here_behind_another_is_failed_when_its_turn_comes() {
    let Harness {
        gateway,
        broker,
        alice,
        carol,
        _dir,
        ..
    } = harness(10).await;
    broker.bind(&carol.to_string());
    // Three briefs queued here (to alice, standing in for a worker): one from afar that expired
    // meanwhile, one from afar still in time, one that never came through the broker.
    let now = fleet_core::clock::now_ms();
    let expired = Message {
        expires_ms: Some(now - 1),
        ..Message::task(carol, alice.gid, "late".into(), TraceId::mint(), 0)
    };
    let in_time = Message {
        expires_ms: Some(now + 60_000),
        ..Message::task(carol, alice.gid, "on time".into(), TraceId::mint(), 0)
    };
    let local = Message::task(alice.gid, alice.gid, "local".into(), TraceId::mint(), 0);
    for message in [&expired, &in_time, &local] {
        let message = message.clone();
        gateway
            .db
            .run(move |s| s.insert_message(&message))
            .await
            .unwrap();
    }
    let gid = alice.gid;
    let mut typed = Vec::new();
    let mut failed = 0;
    loop {
        match gateway.dequeue(gid, MsgState::Injecting).await.unwrap() {
            Taken::Task(task) => typed.push(task.body),
            Taken::Expired => failed += 1,
            Taken::Nothing => break,
        }
    }
    assert_eq!(failed, 1);
    assert_eq!(typed, ["on time", "local"]);
    let id = expired.msg_id;
    let state = gateway
        .db
        .run(move |s| s.message(id))
        .await
        .unwrap()
        .unwrap()
        .state;
    assert_eq!(state.name(), "failed", "{state}");
    // Its sender hears why, through the broker.
    let notices: Vec<_> = broker
        .published()
        .into_iter()
        .filter(|p| p.envelope.kind == Kind::Failed)
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].envelope.in_reply_to, Some(expired.msg_id));
    let text = String::from_utf8_lossy(&notices[0].body);
    assert!(
        text.contains("expired") && text.contains("not typed"),
        "{text}"
    );
}
