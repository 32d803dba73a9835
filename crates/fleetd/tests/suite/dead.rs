//! Dead letters on the real RabbitMQ: a message that expires unread in a remote inbox (its
//! gateway down), or a broadcast's copy a full inbox refused, comes back to its sender's
//! gateway through `fleet.dead` and `fleet.dlq.<host>`, and its sender gets exactly one
//! `FAILED`, whichever way it went and however often the dead letter comes; a forged dead
//! letter tells nobody.

use fleet_amqp::{Field, Raw, Table};
use fleet_core::dead::{Cause, Death};
use fleet_core::envelope::Envelope;
use fleet_core::signing::{KEY_ID_HEADER, SIG_HEADER, Signature};
use fleet_core::{Gid, Kind, MsgId};
use fleet_store::{SqliteStore, Store};
use fleet_testkit::broker::{Broker, BrokerUser, Vhost};
use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::Fleet;
use fleet_testkit::keys;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::federation::{LIMIT, audit_lines, dead_letters, drain, forged, gid_of, sees};
use super::metrics::{scraped, value};
use fleet_testkit::hosts::{TwoHosts, gateway, gateway_with};

/// The outcomes `fleet`'s audit log gives message `id`.
fn outcomes(fleet: &Fleet, id: &str) -> Vec<String> {
    audit_lines(fleet)
        .map(|(_, lines)| {
            lines
                .iter()
                .filter(|l| l["msg_id"] == id)
                .filter_map(|l| l["outcome"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `fleet`'s audit log gives message `id` the outcome `outcome` `n` times; every
/// outcome of `id`, then.
async fn audited(fleet: &Fleet, id: &str, outcome: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let waited = until(&format!("{id}: {outcome} ×{n}"), LIMIT, || async {
        let all = outcomes(fleet, id);
        (all.iter().filter(|o| *o == outcome).count() >= n).then_some(all)
    })
    .await;
    waited.map_err(|e| anyhow::anyhow!("{e}: {:?}\n{}", outcomes(fleet, id), fleet.log()))
}

/// `x-death` as the broker writes it: one death, for `reason`, in `queue`.
fn x_death(death: &Death) -> Field {
    let mut entry = Table::new()
        .with("reason", death.cause.as_str())
        .with("count", 1);
    if let Some(queue) = &death.queue {
        entry = entry.with("queue", queue.as_str());
    }
    if let Some(time) = death.time_s {
        entry = entry.with("time", i64::try_from(time).unwrap_or(i64::MAX));
    }
    Field::Array(vec![Field::Table(entry)])
}

/// A dead letter with `headers` and `body` as the test publishes it onto `fleet.dlx`, under
/// the broker login the gateways share (the one each pins for itself).
fn as_published(vhost: &Vhost, headers: Table, body: &[u8]) -> Raw {
    Raw {
        headers,
        body: body.to_vec(),
        persistent: false,
        user_id: Some(vhost.broker().user().to_string()),
    }
}

/// An expiry in the inbox of `gid`.
fn expired_in(gid: &str) -> Death {
    Death {
        cause: Cause::Expired,
        queue: Some(format!("agent.{gid}.inbox.v2")),
        time_s: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brief_for_a_worker_whose_gateway_died_is_failed_to_its_sender_once_when_it_expires()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // hostb's inboxes keep a message 3 s; hosta awaits a receipt long enough that only the
    // expiry can fail the brief.
    let a = gateway_with(
        &vhost.uri(),
        "hosta",
        "alice",
        "",
        "presence_interval_s = 1\npresence_ttl_s = 3\ninjected_bound_s = 300\n",
    )
    .await?;
    let mut b = gateway(&vhost.uri(), "hostb", "bob", "inbox_message_ttl_s = 3\n").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let wb = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    let hosts_up = |samples: &[Value]| value(samples, "fleetd_hosts_up", &json!({}));
    assert_eq!(hosts_up(&scraped(&a, "alice").await?), Some(2.0));
    // hostb dies; wb's inbox stays, and nobody takes what comes into it.
    b.kill9().await?;
    let sent = alice.send("wb", "never typed", 0).await?;
    assert_eq!(sent["state"], "queued", "{sent}");
    let id = sent["msg_id"].as_str().unwrap_or_default().to_string();

    let got = drain(&alice, 1).await?;
    assert_eq!(got[0]["kind"], "FAILED", "{got:?}");
    assert_eq!(got[0]["in_reply_to"], id.as_str(), "{got:?}");
    assert_eq!(got[0]["from"], gid_of(&wb), "{got:?}");
    let text = got[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("expired after ")
            && text.contains("unread in the inbox of 'wb@hostb'")
            && text.contains("its gateway may be down"),
        "{text}"
    );
    assert_eq!(
        audited(&a, &id, "dead letter: expired, sender told", 1).await?,
        ["published", "dead letter: expired, sender told"]
    );

    // The same dead letter twice more (as a broker delivering it again would): no second
    // notice. Its copy in fleet.dlq, the operators' record, is the genuine article.
    let admin = vhost.connect().await?;
    let genuine = until("the dead letter in fleet.dlq", LIMIT, || async {
        admin.get("fleet.dlq").await.ok().flatten()
    })
    .await?;
    let envelope = genuine.envelope()?;
    assert_eq!(envelope.msg_id.to_string(), id);
    // As RabbitMQ wrote it: expired in wb's inbox, at a time.
    let death = genuine.death();
    assert_eq!(
        (death.cause, &death.queue),
        (Cause::Expired, &expired_in(&envelope.to).queue),
        "{death:?}"
    );
    assert!(death.time_s.is_some(), "{death:?}");
    let signature = Signature {
        sig: genuine.text_header(SIG_HEADER).unwrap_or_default().into(),
        key_id: genuine
            .text_header(KEY_ID_HEADER)
            .unwrap_or_default()
            .into(),
    };
    let headers = Table::of_signed(&envelope, &signature).with("x-death", x_death(genuine.death()));
    for _ in 0..2 {
        admin
            .publish(
                "fleet.dlx",
                "",
                &as_published(&vhost, headers.clone(), genuine.body()),
            )
            .await?;
    }
    audited(&a, &id, "dead letter: expired, sender told", 3).await?;
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new(), "a second notice");
    // A scraper of hosta's metrics counts the dead letter once, and the publish of the brief.
    let samples = scraped(&a, "alice").await?;
    assert_eq!(
        value(
            &samples,
            "fleetd_dead_letters_total",
            &json!({"cause": "expired", "outcome": "told"})
        ),
        Some(1.0)
    );
    assert!(
        value(
            &samples,
            "fleetd_broker_publish_duration_seconds_count",
            &json!({})
        )
        .is_some_and(|n| n >= 1.0)
    );
    admin.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_expires_while_its_leads_gateway_is_down_is_failed_to_the_worker_that_sent_it()
-> anyhow::Result<()> {
    // hosta's inboxes keep a message 3 s: alice's among them.
    let TwoHosts {
        vhost: _vhost,
        mut a,
        b,
        alice,
        bob,
    } = TwoHosts::each(&Broker::find().await?, "inbox_message_ttl_s = 3\n", "").await?;
    let wb = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    // wb takes the task (its receipt reaches hosta), and answers once hosta is down.
    let sent = alice.send("wb", "/slow 8000 too late", 0).await?;
    let id = sent["msg_id"]
        .as_str()
        .unwrap_or_default()
        .parse::<MsgId>()?;
    audited(&a, &id.derived("injected").to_string(), "receipt", 1).await?;
    alice.close().await?;
    assert!(a.terminate().await?);

    // The answer waits in alice's inbox 3 s and expires: hostb tells wb, its sender, once.
    let reply = until("wb's answer to expire", LIMIT, || async {
        let (_, lines) = audit_lines(&b).ok()?;
        lines
            .iter()
            .find(|l| l["kind"] == "REPLY" && l["outcome"] == "dead letter: expired, sender told")
            .and_then(|l| l["msg_id"].as_str().map(String::from))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", b.log()))?;
    assert_eq!(
        outcomes(&b, &reply),
        ["published", "dead letter: expired, sender told"]
    );
    let store = SqliteStore::open(&b.state_dir().join("fleet.db"))?;
    let notice_id = reply.parse::<MsgId>()?.derived("failed");
    let notice = store
        .message(notice_id)?
        .ok_or_else(|| anyhow::anyhow!("no notice for wb\n{}", b.log()))?;
    assert_eq!(notice.kind, Kind::Failed, "{notice:?}");
    assert_eq!(notice.to.to_string(), gid_of(&wb), "{notice:?}");
    assert_eq!(notice.in_reply_to, Some(reply.parse::<MsgId>()?));
    assert!(
        notice.body.starts_with("expired after ")
            && notice.body.contains("in the inbox of 'alice@hosta'"),
        "{notice:?}"
    );

    // When hosta comes back, nothing arrives late: the answer is gone, its sender told.
    a.launch().await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    assert_eq!(alice.poll(2).await?, Vec::<Value>::new());
    Ok(())
}

/// A pair of hosts on a vhost of their own where alice (hosta) sent bob's worker `wb` (hostb)
/// a brief and got its reply: what a forger could copy off `fleet.msg`.
struct Answered {
    pair: TwoHosts,
    alice: fleet_testkit::client::Client,
    alice_gid: Gid,
    wb_key: String,
    id: MsgId,
}

async fn answered_brief() -> anyhow::Result<Answered> {
    let pair = TwoHosts::start().await?;
    let wb = pair.bob.spawn("sim", "wb").await?;
    let alice = pair.a.lead("alice", Protocol::Stateless).await?;
    sees(&alice, "wb").await?;
    let alice_gid = gid_of(&alice.entry("alice").await?).parse::<Gid>()?;
    let sent = alice.send("wb", "hello", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello", "{sent}");
    let id = sent["msg_id"]
        .as_str()
        .unwrap_or_default()
        .parse::<MsgId>()?;
    Ok(Answered {
        pair,
        alice,
        alice_gid,
        wb_key: gid_of(&wb),
        id,
    })
}

/// hosta (alice) and hostb (bob) on `vhost` under per-gateway broker logins: each publishes as
/// a broker user of its own and pins the other's key and login (its own login is its user's);
/// hostb with more `[federation]` keys `b_extra`. The gateways and their users (a user goes
/// from the broker when it is dropped).
async fn login_pair(
    vhost: &Vhost,
    b_extra: &str,
) -> anyhow::Result<(Fleet, Fleet, [BrokerUser; 2])> {
    let (ua, ub) = (
        vhost.add_gateway_user("hosta").await?,
        vhost.add_gateway_user("hostb").await?,
    );
    let trust = keys::pinned_with_logins(&[("hosta", ua.name()), ("hostb", ub.name())]);
    let start = |(host, lead, user): (&str, &str, &BrokerUser), extra: &str| {
        let config = format!(
            "[leads.{lead}]\ngroups = []\n\n[broker]\nuri = \"{}\"\nheartbeat_s = 5\n\n[federation]\npresence_interval_s = 1\npresence_ttl_s = 3\ninjected_bound_s = 300\n{extra}\n[federation.trust]\n{trust}",
            user.uri(vhost)
        );
        let host = host.to_string();
        async move { Fleet::start_as(&host, "", &config).await }
    };
    let a = start(("hosta", "alice", &ua), "").await?;
    let b = start(("hostb", "bob", &ub), b_extra).await?;
    Ok((a, b, [ua, ub]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_dead_letter_tells_nobody_and_stays_in_the_operators_record() -> anyhow::Result<()>
{
    // A brief alice really sent, answered: its dead letter, were it genuine, would be told.
    let Answered {
        pair: TwoHosts {
            vhost, a, b: _b, ..
        },
        alice,
        alice_gid,
        wb_key,
        id,
    } = answered_brief().await?;
    let admin = vhost.connect().await?;
    let before = dead_letters(&admin).await?;
    // As a forger with broker access would publish it straight onto fleet.dlx, "expired" in
    // wb's inbox: …
    let brief = || -> anyhow::Result<Envelope> {
        Ok(Envelope {
            msg_id: id,
            ..forged(Kind::Send, alice_gid, "hosta", &wb_key)?
        })
    };
    let dead = |headers: Table, body: &[u8]| {
        as_published(
            &vhost,
            headers.with("x-death", x_death(&expired_in(&wb_key))),
            body,
        )
    };
    let mut messages = Vec::new();
    // … signed by another host's key,
    let other_key = brief()?;
    messages.push(dead(keys::signed_by("hostc", &other_key, b"x"), b"x"));
    // … its body changed after hosta's signature,
    let tampered = brief()?;
    messages.push(dead(
        keys::signed(&tampered, b"the brief signed"),
        b"another brief",
    ));
    // … unsigned,
    messages.push(dead(Table::of_envelope(&brief()?), b"x"));
    // … and, with hosta's own key (stolen, say), one alice never sent.
    let never_sent = Envelope {
        msg_id: MsgId::mint(),
        ..brief()?
    };
    messages.push(dead(keys::signed(&never_sent, b"x"), b"x"));
    for message in &messages {
        admin.publish("fleet.dlx", "", message).await?;
    }
    let dropped = |why: &str| format!("dead letter dropped: {why}");
    let got = audited(&a, &id.to_string(), &dropped("unsigned"), 1).await?;
    let got: Vec<&String> = got
        .iter()
        .filter(|o| o.starts_with("dead letter"))
        .collect();
    assert_eq!(
        got,
        [
            &dropped("key not pinned"),
            &dropped("bad signature"),
            &dropped("unsigned")
        ]
    );
    let never = audited(&a, &never_sent.msg_id.to_string(), &dropped("not sent"), 1).await?;
    assert_eq!(never, [dropped("not sent")]);
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new(), "a forged notice");
    a.logged("DROPPED a dead letter").await?;
    a.logged("it is not sealed by this gateway").await?;
    // The operators' record keeps every one.
    let count = before + u32::try_from(messages.len())?;
    until("every forgery in fleet.dlq", LIMIT, || async {
        (dead_letters(&admin).await.ok()? == count).then_some(())
    })
    .await?;
    admin.close().await?;
    Ok(())
}

/// The forgery of issue 30: a signed brief, really sent and answered, copied off `fleet.msg`
/// and published again onto `fleet.dlx` by a third party on the shared login with a made-up
/// `x-death` ("expired"). Its seal and its record of being sent are genuine; it has its answer,
/// so it cannot have died unread: dropped, nobody told, no "sender told" in the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_of_a_message_already_answered_is_not_believed() -> anyhow::Result<()> {
    let Answered {
        pair: TwoHosts {
            vhost, a, b: _b, ..
        },
        alice,
        alice_gid,
        wb_key,
        id,
    } = answered_brief().await?;
    // The very brief alice sent (the test hosts' keys are known, so its copy is signed as
    // hosta signed it), "expired" in wb's inbox, onto fleet.dlx by the shared login.
    let copy = Envelope {
        msg_id: id,
        ..forged(Kind::Send, alice_gid, "hosta", &wb_key)?
    };
    let dead = as_published(
        &vhost,
        keys::signed(&copy, b"hello").with("x-death", x_death(&expired_in(&wb_key))),
        b"hello",
    );
    let admin = vhost.connect().await?;
    admin.publish("fleet.dlx", "", &dead).await?;
    let got = audited(&a, &id.to_string(), "dead letter dropped: answered", 1).await?;
    assert!(
        !got.iter().any(|o| o.contains("sender told")),
        "{got:?}\n{}",
        a.log()
    );
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new(), "a forged notice");
    admin.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_per_gateway_broker_logins_a_dead_letter_keeps_its_publishers_login_and_is_told()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // hostb's inboxes keep a message 3 s.
    let (a, mut b, _users) = login_pair(&vhost, "inbox_message_ttl_s = 3\n").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    sees(&alice, "bob").await?;
    b.kill9().await?;
    let sent = alice.send("bob@hostb", "for a dead gateway", 0).await?;
    let id = sent["msg_id"].as_str().unwrap_or_default().to_string();
    let got = drain(&alice, 1).await?;
    assert_eq!(
        (got[0]["kind"].as_str(), got[0]["in_reply_to"].as_str()),
        (Some("FAILED"), Some(id.as_str())),
        "{got:?}\n{}",
        a.log()
    );
    assert!(
        got[0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("in the inbox of 'bob@hostb'"),
        "{got:?}"
    );
    Ok(())
}

/// Per-gateway broker logins keep a dead letter from being forged by another login: every
/// gateway's login may publish to `fleet.dlx` (declaring an inbox with a dead-letter exchange
/// takes write permission on it), but a dead letter keeps its publisher's login, so one hostb's
/// login publishes there, a signed copy of a message hosta sent and nobody answered, fails
/// hosta's own seal check: dropped, nobody told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_per_gateway_broker_logins_a_dead_letter_another_login_published_is_not_believed()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let (a, _b, [_ua, ub]) = login_pair(&vhost, "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob_gid = gid_of(&sees(&alice, "bob").await?);
    let alice_gid = gid_of(&alice.entry("alice").await?).parse::<Gid>()?;
    // Held for bob, unanswered: a genuine dead letter of it would be told.
    let sent = alice.send("bob@hostb", "hold this", 0).await?;
    let id = sent["msg_id"]
        .as_str()
        .unwrap_or_default()
        .parse::<MsgId>()?;
    let copy = Envelope {
        msg_id: id,
        ..forged(Kind::Send, alice_gid, "hosta", &bob_gid)?
    };
    let dead = Raw {
        headers: keys::signed(&copy, b"hold this").with("x-death", x_death(&expired_in(&bob_gid))),
        body: b"hold this".to_vec(),
        persistent: false,
        user_id: Some(ub.name().to_string()),
    };
    let as_hostb = fleet_amqp::Client::connect(&ub.uri(&vhost)).await?;
    as_hostb.publish("fleet.dlx", "", &dead).await?;
    audited(&a, &id.to_string(), "dead letter dropped: broker login", 1).await?;
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new(), "a forged notice");
    as_hostb.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_copy_a_full_inbox_refused_is_failed_to_its_sender_by_the_copys_id()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway_with(
        &vhost.uri(),
        "hosta",
        "alice",
        "",
        "presence_interval_s = 1\npresence_ttl_s = 3\ninjected_bound_s = 300\n",
    )
    .await?;
    // hostb's inboxes hold one message.
    let mut b = gateway(&vhost.uri(), "hostb", "bob", "inbox_max_length = 1\n").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let wb = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    // hostb dies; one brief fills wb's inbox, and the broadcast's copy finds it full. The
    // broadcast itself goes (there could be other inboxes): only the copy is refused.
    b.kill9().await?;
    let first = alice.send("wb", "fills the inbox", 0).await?;
    assert_eq!(first["state"], "queued", "{first}");
    let all = alice
        .ok("fleet_broadcast", json!({"message": "everyone"}))
        .await?;
    let copy = all["msg_id"]
        .as_str()
        .unwrap_or_default()
        .parse::<MsgId>()?
        .derived(&gid_of(&wb));
    let got = drain(&alice, 1).await?;
    assert_eq!(
        (got[0]["kind"].as_str(), got[0]["in_reply_to"].as_str()),
        (Some("FAILED"), Some(copy.to_string().as_str())),
        "{got:?}\n{}",
        a.log()
    );
    let text = got[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("refused: the inbox of 'wb@hostb' was full"),
        "{text}"
    );
    assert_eq!(
        audited(
            &a,
            all["msg_id"].as_str().unwrap_or_default(),
            "dead letter: maxlen, sender told",
            1
        )
        .await?,
        ["published", "dead letter: maxlen, sender told"]
    );
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_expired_before_its_recipients_gateway_came_back_is_failed_to_its_sender()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // hosta's messages live 3 s; hostb's inboxes keep them a day.
    let a = gateway(&vhost.uri(), "hosta", "alice", "inbox_message_ttl_s = 3\n").await?;
    let mut b = gateway(&vhost.uri(), "hostb", "bob", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    sees(&alice, "bob").await?;
    b.kill9().await?;
    let sent_at = std::time::Instant::now();
    let sent = alice.send("bob@hostb", "read me soon", 0).await?;
    let id = sent["msg_id"].as_str().unwrap_or_default().to_string();
    // hostb comes back once the message's expiresAt has passed (it still waits in bob's
    // inbox): it refuses it, and tells alice; the refused dead letter coming back to hosta
    // makes no second notice.
    until("the message's expiry", LIMIT, || async {
        (sent_at.elapsed() > std::time::Duration::from_millis(3_500)).then_some(())
    })
    .await?;
    b.launch().await?;
    let got = drain(&alice, 1).await?;
    assert_eq!(
        (got[0]["kind"].as_str(), got[0]["in_reply_to"].as_str()),
        (Some("FAILED"), Some(id.as_str())),
        "{got:?}\n{}",
        b.log()
    );
    let text = got[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("expired (expiresAt) before its recipient's gateway could take it"),
        "{text}"
    );
    audited(&a, &id, "dead letter dropped: rejected", 1).await?;
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new(), "a second notice");
    Ok(())
}
