//! Signed federation on the real RabbitMQ: two real gateways, and a test client standing in for
//! a forger who can publish anything on the fleet's vhost (and holds the keys of hosts it was
//! given: `hostc`'s is pinned everywhere, `hostz`'s nowhere). Each forgery is refused by the
//! gateway it reaches, with its reason in that gateway's audit log, and dead-lettered; genuine
//! traffic flows throughout.

use fleet_amqp::Table;
use fleet_core::envelope::Envelope;
use fleet_core::signing::{KEY_ID_HEADER, SIG_HEADER, Signature};
use fleet_core::{Gid, Kind, MsgId, Role};
use fleet_testkit::broker::{Broker, BrokerUser, Vhost};
use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::keys;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::federation::{
    LIMIT, audit_lines, dead_letters, drain, forged, gid_of, publish, raw, sees, texts,
};
use fleet_testkit::hosts::{SHARED, TwoHosts};

/// The outcomes `fleet`'s audit log gives message `id` off its inboxes and roster (not what its
/// dead-letter consumer makes of a refused one coming back: `dead`'s tests).
fn outcomes(fleet: &Fleet, id: &MsgId) -> Vec<String> {
    let id = id.to_string();
    audit_lines(fleet)
        .map(|(_, lines)| {
            lines
                .iter()
                .filter(|l| l["msg_id"] == id.as_str())
                .filter_map(|l| l["outcome"].as_str().map(String::from))
                .filter(|o| !o.starts_with("dead letter"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `fleet` audits message `id` as refused for `reason`; every outcome it audited
/// for `id`, then.
async fn refused_for(fleet: &Fleet, id: &MsgId, reason: &str) -> anyhow::Result<Vec<String>> {
    let wanted = format!("refused: {reason}");
    let waited = until(
        &format!("{id} to be refused for {reason}"),
        LIMIT,
        || async { Some(outcomes(fleet, id)).filter(|o| o.contains(&wanted)) },
    )
    .await;
    waited.map_err(|e| anyhow::anyhow!("{e}: {:?}\n{}", outcomes(fleet, id), fleet.log()))
}

/// Now, in Unix ms.
fn now_ms() -> u64 {
    u64::try_from(fleet_core::clock::now_ms()).unwrap_or(0)
}

/// A heartbeat of host `host` for `entity`, published with routing key `key` and signed by
/// `signer`'s key; its envelope.
async fn heartbeat(
    client: &fleet_amqp::Client,
    host: &str,
    entity: &fleet_core::Entity,
    key: &str,
    signer: &str,
) -> anyhow::Result<Envelope> {
    let envelope = forged(Kind::Presence, entity.gid, host, "fleet.roster")?;
    let body = json!({"entity": entity, "status": "idle", "profiles": []}).to_string();
    let headers = keys::signed_by(signer, &envelope, body.as_bytes());
    client
        .publish("fleet.roster", key, &raw(headers, body.as_bytes()))
        .await?;
    Ok(envelope)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forgery_is_refused_with_its_reason_and_genuine_traffic_flows() -> anyhow::Result<()>
{
    let TwoHosts {
        vhost,
        a,
        b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    let wb = bob.spawn("sim", "wb").await?;
    let wa = alice.spawn("sim", "wa").await?;
    sees(&alice, "wb").await?;
    sees(&bob, "wa").await?;
    let (alice_gid, wa_gid) = (
        gid_of(&alice.entry("alice").await?).parse::<Gid>()?,
        gid_of(&wa).parse::<Gid>()?,
    );
    let (wb_key, wb_gid) = (gid_of(&wb), gid_of(&wb).parse::<Gid>()?);
    let client = vhost.connect().await?;
    let first = alice.send("wb", "one", 20).await?;
    assert_eq!(first["reply"]["text"], "echo: one", "{first}");
    let task_id = first["msg_id"]
        .as_str()
        .unwrap_or_default()
        .parse::<MsgId>()?;

    // Into wb's inbox, judged by hostb: a task that claims to be alice's …
    let task = || forged(Kind::Send, alice_gid, "hosta", &wb_key);
    let mut expected = Vec::new();
    // … unsigned,
    let unsigned = task()?;
    client
        .publish(
            "fleet.msg",
            &wb_key,
            &raw(Table::of_envelope(&unsigned), b"x"),
        )
        .await?;
    expected.push((&b, unsigned.msg_id, "unsigned"));
    // … its body changed after signing,
    let tampered = task()?;
    let headers = keys::signed(&tampered, b"the task signed");
    client
        .publish("fleet.msg", &wb_key, &raw(headers, b"another task"))
        .await?;
    expected.push((&b, tampered.msg_id, "bad signature"));
    // … a header changed after signing,
    let renamed = task()?;
    let headers = keys::signed(&renamed, b"x").with("fromName", "mallory");
    client
        .publish("fleet.msg", &wb_key, &raw(headers, b"x"))
        .await?;
    expected.push((&b, renamed.msg_id, "bad signature"));
    // … signed by another host's key,
    let wrong_key = task()?;
    let headers = keys::signed_by("hostc", &wrong_key, b"x");
    client
        .publish("fleet.msg", &wb_key, &raw(headers, b"x"))
        .await?;
    expected.push((&b, wrong_key.msg_id, "key not pinned"));
    // … stamped two days ago (still unexpired),
    let stale = Envelope {
        ts_ms: now_ms() - 2 * 86_400_000,
        expires_at_ms: now_ms() + 3_600_000,
        ..task()?
    };
    publish(&client, "fleet.msg", &wb_key, &stale, b"x").await?;
    expected.push((&b, stale.msg_id, "stale"));
    // … from a host nobody pinned,
    let unpinned = forged(Kind::Send, Gid::mint(), "hostz", &wb_key)?;
    publish(&client, "fleet.msg", &wb_key, &unpinned, b"x").await?;
    expected.push((&b, unpinned.msg_id, "unpinned host"));
    // … alice's gid, signed by hostc (pinned, but alice is hosta's),
    let impostor = forged(Kind::Send, alice_gid, "hostc", &wb_key)?;
    publish(&client, "fleet.msg", &wb_key, &impostor, b"x").await?;
    expected.push((&b, impostor.msg_id, "impostor sender"));
    // … a sender hostc never announced (refused once a heartbeat could have told),
    let nobody = forged(Kind::Send, Gid::mint(), "hostc", &wb_key)?;
    publish(&client, "fleet.msg", &wb_key, &nobody, b"x").await?;
    expected.push((&b, nobody.msg_id, "unknown sender"));
    // … and a task from a worker to another lead's worker, signed by its own gateway.
    let from_worker = forged(Kind::Send, wa_gid, "hosta", &wb_key)?;
    publish(&client, "fleet.msg", &wb_key, &from_worker, b"x").await?;
    expected.push((&b, from_worker.msg_id, "not allowed"));

    // Into alice's inbox, judged by hosta: answers about her task from a host it did not go to.
    let alice_key = alice_gid.to_string();
    for kind in [Kind::Reply, Kind::Injected] {
        let answer = Envelope {
            in_reply_to: Some(task_id),
            ..forged(kind, Gid::mint(), "hostc", &alice_key)?
        };
        publish(&client, "fleet.msg", &alice_key, &answer, b"forged").await?;
        expected.push((&a, answer.msg_id, "answer from another host"));
    }
    // A broadcast from a worker reaches every worker's inbox: each gateway refuses it. (What
    // claims hostb is published as hostb's gateway would, under its broker login: hostb takes
    // its own messages from that login only.)
    let login = vhost.broker().user().to_string();
    let as_hostb = |envelope: &Envelope, body: &[u8]| fleet_amqp::Raw {
        user_id: Some(login.clone()),
        ..raw(keys::signed(envelope, body), body)
    };
    let broadcast = forged(Kind::Broadcast, wb_gid, "hostb", "broadcast.all")?;
    client
        .publish("fleet.msg", "broadcast.all", &as_hostb(&broadcast, b"all"))
        .await?;
    expected.push((&a, broadcast.msg_id, "not allowed"));
    expected.push((&b, broadcast.msg_id, "not allowed"));
    // A lead's broadcast stamped from before the workers joined (a replay into newer inboxes),
    // and one for a group wa is not in, into wa's inbox bound to that group behind fleetd's back.
    let bob_gid = gid_of(&bob.entry("bob").await?).parse::<Gid>()?;
    // Stamped a second before the skew allowed (60 s by default) around the older worker's
    // joining.
    let joined = wa_gid
        .minted_ms()
        .unwrap_or_default()
        .min(wb_gid.minted_ms().unwrap_or_default());
    let old = Envelope {
        ts_ms: joined - 61_000,
        ..forged(Kind::Broadcast, bob_gid, "hostb", "broadcast.all")?
    };
    client
        .publish("fleet.msg", "broadcast.all", &as_hostb(&old, b"old"))
        .await?;
    expected.push((&a, old.msg_id, "stray broadcast"));
    expected.push((&b, old.msg_id, "stray broadcast"));
    client
        .bind(
            &format!("agent.{wa_gid}.inbox.v2"),
            "fleet.msg",
            "broadcast.web",
        )
        .await?;
    let other_group = forged(Kind::Broadcast, bob_gid, "hostb", "broadcast.web")?;
    publish(&client, "fleet.msg", "broadcast.web", &other_group, b"web").await?;
    expected.push((&a, other_group.msg_id, "stray broadcast"));
    // Heartbeats, judged by every gateway's roster: hostc speaking for one of hostb's keys,
    // and hostc claiming wb as its own.
    let stranger = fleet_core::Entity {
        gid: Gid::mint(),
        name: "stranger".into(),
        host: "hostb".into(),
        role: Role::Lead,
        profile: None,
        sandbox: None,
        profile_role: None,
        groups: Vec::new(),
        parent: None,
    };
    let key = format!("roster.hostb.{}", stranger.gid);
    let other_host = heartbeat(&client, "hostc", &stranger, &key, "hostc").await?;
    let captured = fleet_core::Entity {
        gid: wb_gid,
        name: "wb".into(),
        host: "hostc".into(),
        role: Role::Worker,
        profile: None,
        sandbox: None,
        profile_role: None,
        groups: Vec::new(),
        parent: None,
    };
    let key = format!("roster.hostc.{wb_gid}");
    let capture = heartbeat(&client, "hostc", &captured, &key, "hostc").await?;
    for gateway in [&a, &b] {
        expected.push((gateway, other_host.msg_id, "presence key"));
        expected.push((gateway, capture.msg_id, "impostor sender"));
    }

    for (gateway, id, reason) in &expected {
        let audited = refused_for(gateway, id, reason).await?;
        assert_eq!(audited, [format!("refused: {reason}")], "{id}");
    }
    let count = u32::try_from(expected.len())?;
    until("every forgery in fleet.dlq", LIMIT, || async {
        (dead_letters(&client).await.ok()? == count).then_some(())
    })
    .await?;
    let log = b.log();
    assert!(
        log.contains("REFUSED a message off the broker that failed a trust check")
            && log.contains("check=\"bad signature\""),
        "{log}"
    );

    // Genuine traffic flows: the task is typed (its worker's second), a lead's message is
    // held, and nothing forged reached anyone.
    let second = alice.send("wb", "two", 20).await?;
    assert_eq!(second["reply"]["text"], "echo: two", "{second}");
    let screen = b.screen(wb["pane"].as_str().unwrap_or_default())?;
    assert!(
        screen.contains("[task 2: 3 bytes]") && !screen.contains("task 3"),
        "{screen}"
    );
    bob.send("alice@hosta", "hi", 0).await?;
    assert_eq!(texts(&drain(&alice, 1).await?), ["hi"]);
    assert_eq!(alice.poll(0).await?, Vec::<Value>::new());
    let wb_entry = alice.entry("wb").await?;
    assert_eq!(wb_entry["host"], "hostb", "{wb_entry}");
    assert!(
        !alice.names().await?.contains(&"stranger".to_string()),
        "a forged heartbeat reached the roster"
    );
    client.close().await?;
    Ok(())
}

/// A message as captured off the broker, published again exactly: headers, signature, body.
async fn replay(
    client: &fleet_amqp::Client,
    key: &str,
    captured: &fleet_amqp::Delivery,
) -> anyhow::Result<MsgId> {
    let envelope = captured.envelope()?;
    let signature = Signature {
        sig: captured.text_header(SIG_HEADER).unwrap_or_default().into(),
        key_id: captured
            .text_header(KEY_ID_HEADER)
            .unwrap_or_default()
            .into(),
    };
    let headers = Table::of_signed(&envelope, &signature);
    client
        .publish("fleet.msg", key, &raw(headers, captured.body()))
        .await?;
    Ok(envelope.msg_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_message_replayed_before_and_after_its_receivers_restart_is_refused()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost,
        mut a,
        b: _b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    sees(&bob, "alice").await?;
    let alice_key = gid_of(&alice.entry("alice").await?);
    // The forger copies everything sent to alice off the exchange.
    let client = vhost.connect().await?;
    client.declare_queue("spy", false, &Table::new()).await?;
    client.bind("spy", "fleet.msg", &alice_key).await?;

    bob.send("alice@hosta", "genuine", 0).await?;
    assert_eq!(texts(&drain(&alice, 1).await?), ["genuine"]);
    let captured = until("a copy of bob's message", LIMIT, || async {
        client.get("spy").await.ok().flatten()
    })
    .await?;

    let id = replay(&client, &alice_key, &captured).await?;
    let audited = refused_for(&a, &id, "replay").await?;
    assert_eq!(audited, ["held", "refused: replay"]);
    assert_eq!(alice.poll(0).await?, Vec::<Value>::new());

    // The seen ids are on disk: a restart forgets none of them.
    alice.close().await?;
    assert!(a.terminate().await?);
    a.launch().await?;
    let alice = a
        .lead("alice", fleet_testkit::client::Protocol::Stateless)
        .await?;
    replay(&client, &alice_key, &captured).await?;
    let refusals = until("the second refusal", LIMIT, || async {
        Some(outcomes(&a, &id)).filter(|o| o.len() == 3)
    })
    .await?;
    assert_eq!(refusals, ["held", "refused: replay", "refused: replay"]);
    assert_eq!(alice.poll(0).await?, Vec::<Value>::new());
    // The broker dead-letters a refusal after the gateway logged it: counted once it has.
    until("both replays in the dead letters", LIMIT, || async {
        dead_letters(&client).await.ok().filter(|n| *n == 2)
    })
    .await?;

    // And bob still reaches her.
    bob.send("alice@hosta", "after", 0).await?;
    assert_eq!(texts(&drain(&alice, 1).await?), ["after"]);
    client.close().await?;
    Ok(())
}

/// A gateway of `host` with lead `lead` logging in to the broker as `user`, pinning `hosta`
/// and `hostb` to their keys and to the logins in `logins`.
async fn logged_in(
    vhost: &Vhost,
    user: &BrokerUser,
    host: &str,
    lead: &str,
    logins: &[(&str, &BrokerUser)],
) -> anyhow::Result<Fleet> {
    let named: Vec<(&str, &str)> = logins.iter().map(|(h, u)| (*h, u.name())).collect();
    let trust = keys::pinned_with_logins(&named);
    Fleet::start_as(
        host,
        "",
        &format!(
            "[leads.{lead}]\ngroups = []\nshare = [{SHARED}]\n\n{}\n[broker]\nuri = \"{}\"\nheartbeat_s = 5\n\n[federation]\npresence_interval_s = 1\npresence_ttl_s = 3\n\n[federation.trust]\n{trust}{}",
            sim_profile("sim", &[])?,
            user.uri(vhost),
            keys::allow_all(&["hosta", "hostb"])
        ),
    )
    .await
}

/// What the broker says to `login` publishing `message` on `exchange` with `key`: its refusal,
/// or an error if it took it.
async fn broker_refusal(
    uri: &str,
    exchange: &str,
    key: &str,
    message: &fleet_amqp::Raw,
) -> anyhow::Result<String> {
    let client = fleet_amqp::Client::connect(uri).await?;
    match client.publish(exchange, key, message).await {
        Ok(taken) => anyhow::bail!("the broker took it ({taken:?})"),
        Err(e) => Ok(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_gateway_broker_logins_keep_each_gateway_to_its_own_place() -> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let (ua, ub) = (
        vhost.add_gateway_user("hosta").await?,
        vhost.add_gateway_user("hostb").await?,
    );
    let logins = [("hosta", &ua), ("hostb", &ub)];
    // The documented permissions are enough for everything a gateway does.
    let a = logged_in(&vhost, &ua, "hosta", "alice", &logins).await?;
    let b = logged_in(&vhost, &ub, "hostb", "bob", &logins).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let wb = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    let first = alice.send("wb", "one", 20).await?;
    assert_eq!(first["reply"]["text"], "echo: one", "{first}");

    // hostb's login cannot publish hosta's heartbeats …
    let alice_gid = gid_of(&alice.entry("alice").await?).parse::<Gid>()?;
    let heartbeat = forged(Kind::Presence, alice_gid, "hosta", "fleet.roster")?;
    let said = broker_refusal(
        &ub.uri(&vhost),
        "fleet.roster",
        &format!("roster.hosta.{alice_gid}"),
        &raw(keys::signed(&heartbeat, b"{}"), b"{}"),
    )
    .await?;
    assert!(said.contains("ACCESS_REFUSED"), "{said}");
    // … nor claim hosta's login as the publisher …
    let to = gid_of(&wb);
    let task = forged(Kind::Send, alice_gid, "hosta", &to)?;
    let claimed = fleet_amqp::Raw {
        user_id: Some(ua.name().into()),
        ..raw(keys::signed(&task, b"x"), b"x")
    };
    let said = broker_refusal(&ub.uri(&vhost), "fleet.msg", &to, &claimed).await?;
    assert!(said.contains("PRECONDITION_FAILED"), "{said}");
    // … nor declare hosta's roster queue.
    let client = fleet_amqp::Client::connect(&ub.uri(&vhost)).await?;
    let said = client
        .declare_queue("roster.hosta", false, &Table::new())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(said.contains("ACCESS_REFUSED"), "{said}");

    // A message signed with hosta's key (stolen, say) but published by hostb's login is
    // refused by its receiver, with or without a user_id.
    let mut expected = Vec::new();
    for user_id in [Some(ub.name().to_string()), None] {
        let task = forged(Kind::Send, alice_gid, "hosta", &to)?;
        let message = fleet_amqp::Raw {
            user_id,
            ..raw(keys::signed(&task, b"x"), b"x")
        };
        let client = fleet_amqp::Client::connect(&ub.uri(&vhost)).await?;
        client.publish("fleet.msg", &to, &message).await?;
        expected.push(task.msg_id);
    }
    for id in &expected {
        let audited = refused_for(&b, id, "broker login").await?;
        assert_eq!(audited, ["refused: broker login"]);
    }
    let admin = vhost.connect().await?;
    until("both in fleet.dlq", LIMIT, || async {
        (dead_letters(&admin).await.ok()? == 2).then_some(())
    })
    .await?;

    // Genuine traffic flows.
    let second = alice.send("wb", "two", 20).await?;
    assert_eq!(second["reply"]["text"], "echo: two", "{second}");
    admin.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_a_broker_and_nobody_to_trust_does_not_start_and_a_lab_says_so_loudly()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let broker = format!("[broker]\nuri = \"{}\"\n", vhost.uri());
    let refused = match Fleet::start("", &broker).await {
        Ok(fleet) => anyhow::bail!("fleetd started:\n{}", fleet.log()),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        refused.contains("[federation.trust] pins no host") && refused.contains("fleetd key"),
        "{refused}"
    );
    let lab = Fleet::start(
        "",
        &format!("{broker}[federation]\ninsecure_unsigned = true\n"),
    )
    .await?;
    let log = lab.log();
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("INSECURE")
            && l.contains("insecure_unsigned")),
        "{log}"
    );
    Ok(())
}
