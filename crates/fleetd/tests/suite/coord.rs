//! Lead-to-lead coordination (spec 10 "Lead-to-lead"): gateways on different fleet vhosts that
//! share a third, the coordinator's, on the real RabbitMQ; each test makes its own vhosts.

use fleet_amqp::Table;
use fleet_core::{Gid, Kind};
use fleet_testkit::broker::{Broker, PrivateNode, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile, token_spy_profile};
use fleet_testkit::keys;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::as_worker;
use super::federation::{LIMIT, forged, publish, raw};
use fleet_testkit::hosts::gateway;

/// Two gateways, each on a fleet vhost of its own, sharing the coordinator's vhost `coord`:
/// `hosta` with lead alice, `hostb` with lead bob (coordination ids `alice@hosta`,
/// `bob@hostb`, the defaults).
struct Coordinated {
    a: Fleet,
    b: Fleet,
    alice: Client,
    bob: Client,
    coord: Vhost,
    _fleets: (Vhost, Vhost),
}

/// `[coordinator]` on `coord`'s vhost, then `extra` (more config).
fn coordinator(coord: &Vhost, extra: &str) -> String {
    format!("[coordinator]\nuri = \"{}\"\n{extra}\n", coord.uri())
}

async fn coordinated(extra_b: &str) -> anyhow::Result<Coordinated> {
    let coord = Vhost::create(&Broker::find().await?).await?;
    coordinated_on(coord, extra_b).await
}

/// [`coordinated`], the coordinator on `coord` (the fleets on the shared test broker).
async fn coordinated_on(coord: Vhost, extra_b: &str) -> anyhow::Result<Coordinated> {
    let broker = Broker::find().await?;
    let fleet_a = Vhost::create(&broker).await?;
    let fleet_b = Vhost::create(&broker).await?;
    let a = gateway(&fleet_a.uri(), "hosta", "alice", &coordinator(&coord, "")).await?;
    let b = gateway(
        &fleet_b.uri(),
        "hostb",
        "bob",
        &coordinator(&coord, extra_b),
    )
    .await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    Ok(Coordinated {
        a,
        b,
        alice,
        bob,
        coord,
        _fleets: (fleet_a, fleet_b),
    })
}

/// `fleet_send{coord_id, message}` from `lead`.
async fn coordinate(
    lead: &Client,
    coord_id: &str,
    message: &str,
) -> anyhow::Result<Result<Value, fleet_testkit::client::ToolError>> {
    lead.call(
        "fleet_send",
        json!({"coord_id": coord_id, "message": message}),
    )
    .await
}

/// Whether any pane of `fleet` shows `text`.
fn typed_anywhere(fleet: &Fleet, text: &str) -> anyhow::Result<bool> {
    for pane in fleet.panes()? {
        if fleet.screen(&pane)?.contains(text) {
            return Ok(true);
        }
    }
    Ok(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leads_of_two_fleets_coordinate_held_pulled_once_never_typed() -> anyhow::Result<()> {
    let c = coordinated("").await?;
    let listed = c.alice.ok("fleet_list", json!({})).await?;
    assert_eq!(listed["coord_id"], "alice@hosta", "{listed}");
    let listed = c.bob.ok("fleet_list", json!({})).await?;
    assert_eq!(listed["coord_id"], "bob@hostb", "{listed}");
    // A worker of bob's, idle: nothing of the coordination may reach its pane.
    c.bob.spawn("sim", "wb").await?;

    let text = "coordination: I take the parser, you take the docs";
    let sent = coordinate(&c.alice, "bob@hostb", text)
        .await?
        .map_err(|e| anyhow::anyhow!("{e}\n{}", c.a.log()))?;
    assert_eq!(sent["status"], "pending", "{sent}");
    let msg_id = sent["msg_id"].as_str().unwrap_or_default().to_string();

    let got = c.bob.poll(20).await?;
    assert_eq!(got.len(), 1, "{got:?}\n{}", c.b.log());
    assert_eq!(got[0]["msg_id"], msg_id.as_str());
    assert_eq!(got[0]["text"], text);
    assert_eq!(got[0]["kind"], "SEND");
    assert_eq!(got[0]["from_coord_id"], "alice@hosta");
    assert_eq!(got[0]["from_name"], "alice@hosta");
    // Pulled once.
    assert!(c.bob.poll(0).await?.is_empty());
    // Never typed, anywhere on bob's host (nor on alice's).
    assert!(!typed_anywhere(&c.b, text)?);
    assert!(!typed_anywhere(&c.a, text)?);
    // It is no task: fleet_reply refuses it, naming how to answer.
    let reply = c
        .bob
        .call(
            "fleet_reply",
            json!({"message": "ok", "in_reply_to": msg_id}),
        )
        .await?;
    let err = reply.expect_err("a reply to coordination");
    assert_eq!(err.code, "invalid_params", "{err}");
    assert!(err.message.contains("fleet_send{coord_id"), "{err}");

    // Bob answers by coordination; alice pulls it.
    let answer = coordinate(&c.bob, "alice@hosta", "agreed").await?;
    assert!(answer.is_ok(), "{answer:?}");
    let got = c.alice.poll(20).await?;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0]["text"].as_str(), got[0]["from_coord_id"].as_str()),
        (Some("agreed"), Some("bob@hostb"))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordination_refuses_unknown_ids_workers_and_mixed_targets() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let spy = token_spy_profile("spy", &dir.path().join("token"));
    let c = coordinated(&spy).await?;

    let err = coordinate(&c.alice, "nobody@nowhere", "hello")
        .await?
        .expect_err("an unknown coordination id");
    assert_eq!(err.code, "unknown_recipient", "{err}");
    assert!(err.message.contains("'nobody@nowhere'"), "{err}");

    let err = c
        .alice
        .call(
            "fleet_send",
            json!({"to": "bob", "coord_id": "bob@hostb", "message": "x"}),
        )
        .await?
        .expect_err("to and coord_id");
    assert_eq!(err.code, "invalid_params", "{err}");
    assert!(err.message.contains("to and coord_id"), "{err}");

    for bad in ["bob hostb", "@bob", "bob/../x", ""] {
        let err = coordinate(&c.alice, bad, "x")
            .await?
            .expect_err("an invalid coordination id");
        assert_eq!(err.code, "invalid_params", "{bad:?}: {err}");
    }
    let err = coordinate(&c.alice, "alice@hosta", "x")
        .await?
        .expect_err("one's own id");
    assert_eq!(err.code, "invalid_params", "{err}");

    // A worker may not coordinate, even with its own lead's peer.
    let worker = as_worker(&c.b, &c.bob, &dir, "wspy").await?;
    let err = coordinate(&worker, "alice@hosta", "x")
        .await?
        .expect_err("a worker coordinating");
    assert_eq!(err.code, "forbidden", "{err}");
    let listed = worker.ok("fleet_list", json!({})).await?;
    assert!(listed["coord_id"].is_null(), "{listed}");
    // Nothing of all that reached alice.
    assert!(c.alice.poll(0).await?.is_empty());

    // A gateway without a coordinator says so.
    let lone = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = lone.lead("lead", Protocol::Stateless).await?;
    let err = coordinate(&lead, "bob@hostb", "x")
        .await?
        .expect_err("no coordinator");
    assert_eq!(err.code, "invalid_params", "{err}");
    assert!(err.message.contains("[coordinator]"), "{err}");
    let listed = lead.ok("fleet_list", json!({})).await?;
    assert!(listed["coord_id"].is_null(), "{listed}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_unsigned_coordination_message_is_refused_and_not_held() -> anyhow::Result<()> {
    let c = coordinated("").await?;
    let client = c.coord.connect().await?;
    let mailbox = "coord.bob@hostb";
    let coordination = |from_name: Option<&str>| -> anyhow::Result<_> {
        let mut envelope = forged(Kind::Send, Gid::mint(), "hosta", "bob@hostb")?;
        envelope.from_name = from_name.map(str::to_string);
        Ok(envelope)
    };
    // Unsigned.
    let unsigned = coordination(Some("alice@hosta"))?;
    client
        .publish(
            "",
            mailbox,
            &raw(Table::of_envelope(&unsigned), b"unsigned"),
        )
        .await?;
    // Signed by a key not pinned for the host it names.
    let forged_key = coordination(Some("alice@hosta"))?;
    let headers = keys::signed_by("hostz", &forged_key, b"forged");
    client
        .publish("", mailbox, &raw(headers, b"forged"))
        .await?;
    // Signed, but addressed to another mailbox.
    let mut elsewhere = coordination(Some("alice@hosta"))?;
    elsewhere.to = "carol@hostc".into();
    publish(&client, "", mailbox, &elsewhere, b"misaddressed").await?;
    // Signed, naming no coordination id of its sender.
    publish(&client, "", mailbox, &coordination(None)?, b"anonymous").await?;
    // Signed by hosta, claiming to come from bob, a lead of hostb.
    let impostor = coordination(Some("bob@hostb"))?;
    publish(&client, "", mailbox, &impostor, b"impostor").await?;
    // A genuine one, last: it alone is held.
    let genuine = coordination(Some("carol@hosta"))?;
    publish(&client, "", mailbox, &genuine, b"genuine").await?;

    let got = c.bob.poll(20).await?;
    assert_eq!(got.len(), 1, "{got:?}\n{}", c.b.log());
    assert_eq!(got[0]["text"], "genuine");
    assert_eq!(got[0]["from_coord_id"], "carol@hosta");
    // The five refused went to the coordinator's dead letters.
    until("the refused to be dead-lettered", LIMIT, || async {
        (client.ready("fleet.dlq").await.ok()? == 5).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", c.b.log()))?;
    assert!(c.bob.poll(0).await?.is_empty());
    c.b.logged("REFUSED a coordination message").await?;
    // Each has its audit line, none its text.
    let read = || std::fs::read_to_string(c.b.state_dir().join("coord-audit.jsonl"));
    until("the five refused in the audit log", LIMIT, || async {
        (read().ok()?.matches(r#""outcome":"refused""#).count() >= 5).then_some(())
    })
    .await?;
    let audit = read()?;
    assert_eq!(
        audit.matches(r#""outcome":"refused""#).count(),
        5,
        "{audit}"
    );
    assert_eq!(audit.matches(r#""outcome":"held""#).count(), 1, "{audit}");
    assert!(!audit.contains("genuine"), "{audit}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordination_waits_in_the_mailbox_while_its_lead_is_down() -> anyhow::Result<()> {
    let mut c = coordinated("").await?;
    assert!(c.b.terminate().await?);
    let sent = coordinate(&c.alice, "bob@hostb", "while you were out")
        .await?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(sent["status"], "pending", "{sent}");
    c.b.launch().await?;
    let bob = c.b.lead("bob", Protocol::Stateless).await?;
    let got = bob.poll(20).await?;
    assert_eq!(got.len(), 1, "{got:?}\n{}", c.b.log());
    assert_eq!(got[0]["text"], "while you were out");
    assert_eq!(got[0]["from_coord_id"], "alice@hosta");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_coordinator_down_coordination_fails_fast_then_resumes() -> anyhow::Result<()> {
    let mut node = PrivateNode::start().await?;
    let coord = Vhost::create(&node.broker()).await?;
    let c = coordinated_on(coord, "").await?;

    node.stop().await?;
    let refused = until("coordination to fail fast", LIMIT, || async {
        match coordinate(&c.alice, "bob@hostb", "during").await.ok()? {
            Err(e) if e.code == "broker_unavailable" => Some(e),
            _ => None,
        }
    })
    .await?;
    assert!(refused.message.contains("coordinator"), "{refused}");

    node.restart().await?;
    // Both links come back: alice's publishes again, bob's mailbox is consumed again.
    until("coordination to resume", LIMIT, || async {
        coordinate(&c.alice, "bob@hostb", "after").await.ok()?.ok()
    })
    .await?;
    let got = c.bob.poll(20).await?;
    let texts: Vec<&str> = got.iter().filter_map(|m| m["text"].as_str()).collect();
    assert_eq!(texts, ["after"], "{}", c.b.log());
    Ok(())
}
