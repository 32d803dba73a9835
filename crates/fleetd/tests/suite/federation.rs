//! Cross-host federation: several real fleetd processes (distinct host ids, state dirs and
//! tmux servers) on the real RabbitMQ, each test in a vhost of its own that it removes.

use std::time::{Duration, Instant};

use fleet_amqp::topology::QueueType;
use fleet_amqp::{InboxLimits, Raw, Table, inbox_args};
use fleet_core::envelope::{Envelope, VERSION};
use fleet_core::{Entity, Gid, Kind, MsgId, Role, TraceId};
use fleet_testkit::broker::{Broker, PrivateNode, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::hosts::{QUICK, TwoHosts, gateway, gateway_with};
use fleet_testkit::keys;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

pub(super) const LIMIT: Duration = Duration::from_secs(30);

/// Waits until `lead` hears the gateway of `host` itself up (a host's own heartbeat comes apart
/// from its lead's), as before spawning there.
pub(super) async fn hears_host(lead: &Client, host: &str) -> anyhow::Result<()> {
    until(&format!("{host} to be heard"), LIMIT, || async {
        let listed = lead.ok("fleet_list", json!({})).await.ok()?;
        listed["hosts"]
            .as_array()?
            .iter()
            .any(|h| h["host"] == host && h["status"] == "up")
            .then_some(())
    })
    .await
}

/// Waits until `lead`'s `fleet_list` shows `name` with its host heard.
pub(super) async fn sees(lead: &Client, name: &str) -> anyhow::Result<Value> {
    until(&format!("the roster to show {name}"), LIMIT, || async {
        lead.heard_entry(name).await.ok()
    })
    .await
}

/// The ids in a gateway's audit log.
fn audited(fleet: &Fleet) -> String {
    std::fs::read_to_string(fleet.state_dir().join("audit.jsonl")).unwrap_or_default()
}

/// An envelope as another host's gateway writes one: `kind` from `from` on `host` to `to`,
/// stamped now, expiring in a minute.
pub(super) fn forged(kind: Kind, from: Gid, host: &str, to: &str) -> anyhow::Result<Envelope> {
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    Ok(Envelope {
        version: VERSION,
        kind,
        msg_id: MsgId::mint(),
        trace_id: TraceId::mint(),
        from,
        to: to.to_string(),
        turn_id: None,
        spawn_id: None,
        in_reply_to: None,
        from_name: None,
        from_host: Some(host.to_string()),
        ts_ms: now_ms,
        expires_at_ms: now_ms + 60_000,
    })
}

/// A message with `headers` and `body`, as a test publishes it.
pub(super) fn raw(headers: Table, body: &[u8]) -> Raw {
    Raw {
        headers,
        body: body.to_vec(),
        ..Raw::default()
    }
}

/// Publishes `body` under `envelope`, signed by the key of the host it names, to `exchange`
/// with routing key `key`.
pub(super) async fn publish(
    client: &fleet_amqp::Client,
    exchange: &str,
    key: &str,
    envelope: &Envelope,
    body: &[u8],
) -> anyhow::Result<()> {
    client
        .publish(exchange, key, &raw(keys::signed(envelope, body), body))
        .await?;
    Ok(())
}

/// Publishes a heartbeat of test host `host` (signed with its key) for a new entity `name`
/// of `role` on it; its gid.
pub(super) async fn announce(
    client: &fleet_amqp::Client,
    host: &str,
    name: &str,
    role: Role,
) -> anyhow::Result<Gid> {
    announce_ahead(client, host, name, role, 0).await
}

/// [`announce`] from a host whose clock is `ahead_ms` ahead of this one's.
pub(super) async fn announce_ahead(
    client: &fleet_amqp::Client,
    host: &str,
    name: &str,
    role: Role,
    ahead_ms: u64,
) -> anyhow::Result<Gid> {
    let gid = Gid::mint();
    let entity = Entity {
        gid,
        name: name.into(),
        host: host.into(),
        role,
        profile: None,
        sandbox: None,
        profile_role: None,
        groups: Vec::new(),
        parent: None,
    };
    let body = json!({"entity": entity, "status": "idle", "profiles": []}).to_string();
    let mut envelope = forged(Kind::Presence, gid, host, "fleet.roster")?;
    envelope.ts_ms += ahead_ms;
    envelope.expires_at_ms += ahead_ms;
    let key = format!("roster.{host}.{gid}");
    publish(client, "fleet.roster", &key, &envelope, body.as_bytes()).await?;
    Ok(gid)
}

/// The gid in a `fleet_list` or `fleet_spawn` entry.
pub(super) fn gid_of(entry: &Value) -> String {
    entry["gid"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_delegates_to_a_worker_on_another_host_both_ways() -> anyhow::Result<()> {
    let TwoHosts {
        vhost,
        a,
        mut b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    bob.spawn("sim", "wb").await?;
    alice.spawn("sim", "wa").await?;

    // U1 A → B: the worker on B answers the lead on A.
    let entry = sees(&alice, "wb").await?;
    assert_eq!(entry["host"], "hostb", "{entry}");
    let sent = alice.send("wb", "hello from hosta", 20).await?;
    assert_eq!(
        sent["reply"]["text"],
        "echo: hello from hosta",
        "{sent}\n{}",
        b.log()
    );
    assert_eq!(sent["reply"]["from_name"], "wb");

    // And B → A.
    sees(&bob, "wa").await?;
    let sent = bob.send("wa@hosta", "hello from hostb", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello from hostb", "{sent}");

    // Lead to lead: held for bob on his host, and the sender is told so.
    let note = alice.send("bob@hostb", "for bob", 0).await?;
    assert_eq!(
        (note["status"].as_str(), note["state"].as_str()),
        (Some("pending"), Some("held")),
        "{note}"
    );
    assert_eq!(texts(&drain(&bob, 1).await?), ["for bob"]);

    // Same-host traffic stays off the broker: a local round trip leaves no audit line.
    let local = alice.send("wa", "local only", 20).await?;
    assert_eq!(local["reply"]["text"], "echo: local only");
    let msg_id = local["msg_id"].as_str().unwrap_or_default().to_string();
    assert!(!msg_id.is_empty());
    assert!(!audited(&a).contains(&msg_id), "{}", audited(&a));
    // The remote one is audited on both sides, without its text.
    let remote_id = sent["msg_id"].as_str().unwrap_or_default().to_string();
    // (Each gateway's audit writer writes its lines a moment after the hop.)
    until("the remote one in both audit logs", LIMIT, || async {
        (audited(&b).contains(&remote_id) && audited(&a).contains(&remote_id)).then_some(())
    })
    .await?;
    assert!(!audited(&a).contains("hello from hostb"));

    // A gateway that stops leaves its workers running, their inboxes (and its lead's) kept on
    // the broker, and its restart takes them back: the same worker answers again.
    let gid = |e: &Value| format!("agent.{}.inbox.v2", e["gid"].as_str().unwrap_or_default());
    let (wb_inbox, bob_inbox) = (gid(&entry), gid(&alice.entry("bob").await?));
    bob.close().await?;
    assert!(b.terminate().await?);
    assert!(vhost.queue(&wb_inbox).await?.is_some(), "{wb_inbox} went");
    assert!(vhost.queue(&bob_inbox).await?.is_some(), "{bob_inbox} went");
    b.launch().await?;
    let sent = alice.send("wb", "after hostb's restart", 20).await?;
    assert_eq!(
        sent["reply"]["text"],
        "echo: after hostb's restart",
        "{sent}\n{}",
        b.log()
    );
    assert_eq!(alice.entry("wb").await?["gid"], entry["gid"]);

    // Ending the fleet is its own act: `fleetd stop --all` stops the lead's workers, whose
    // inboxes go and who leave the other hosts' rosters; the lead's inbox stays.
    let out = b.cli(&["stop", "--all", "--lead", "bob"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "stopped wb\n");
    assert!(
        vhost.queue(&wb_inbox).await?.is_none(),
        "{wb_inbox} outlived wb"
    );
    assert!(vhost.queue(&bob_inbox).await?.is_some(), "{bob_inbox} went");
    until("wb to leave hosta's roster", LIMIT, || async {
        let names = alice.names().await.ok()?;
        (!names.iter().any(|n| n == "wb")).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_remote_reply_is_held_until_polled_and_a_busy_worker_keeps_it_queued()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost: _vhost,
        a,
        b: _b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;

    // The worker is busy for a while: the second brief waits on the broker, reads queued to
    // the sender, and is not failed for want of a receipt while the worker is busy (the
    // bound is 3 s here; the first task takes 5).
    let first = alice.send("wb", "/slow 5000 first", 0).await?;
    assert_eq!(first["status"], "pending", "{first}");
    until("wb to read busy on hosta", LIMIT, || async {
        alice
            .entry("wb")
            .await
            .ok()
            .filter(|e| e["status"] == "busy")
    })
    .await?;
    let second = alice.send("wb", "second", 0).await?;
    assert_eq!(second["state"], "queued", "{second}");

    // U3: both answers outlive the sends' waits and are held until polled, in order.
    let texts = texts(&drain(&alice, 2).await?);
    assert_eq!(texts, ["echo: first", "echo: second"], "{}", a.log());
    assert_eq!(alice.poll(0).await?, Vec::<Value>::new());
    Ok(())
}

/// The heartbeats a queue of the test's own bound to `vhost`'s roster exchange takes, by routing
/// key and body.
struct RosterWatch {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, Value)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RosterWatch {
    /// Watches what `binding` takes off the roster exchange (which a gateway declared).
    async fn start(vhost: &Vhost, binding: &str) -> anyhow::Result<Self> {
        let client = vhost.connect().await?;
        let queue = format!("test.roster-watch.{}", Gid::mint());
        client
            .declare_exclusive_queue(&queue, &Table::new())
            .await?;
        client.bind(&queue, "fleet.roster", binding).await?;
        let mut deliveries = client.consume(&queue, "roster-watch", true).await?;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let _client = client;
            while let Some(Ok(delivery)) = deliveries.next().await {
                let body = serde_json::from_slice(delivery.body()).unwrap_or(Value::Null);
                let key = delivery.routing_key().to_string();
                kept.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((key, body));
                let _ = delivery
                    .settle(fleet_core::admission::Settlement::Ack, false)
                    .await;
            }
        });
        Ok(Self { seen, task })
    }

    /// The whole accounts seen so far under routing key `key`.
    fn wholes_of(&self, key: &str) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(k, body)| *k == key && body["account"]["whole"] == true)
            .count()
    }
}

impl Drop for RosterWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_gateway_that_starts_last_learns_the_others_entities_from_accounts_sent_to_it_alone()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // Rounds far apart: nothing but the accounts sent at start and on asking can tell hostb of
    // alice, or hosta of bob, within the test.
    let slow = "presence_interval_s = 60\npresence_ttl_s = 180\n";
    // A gateway with no part in it declares the roster exchange, so that the watch below sees
    // every heartbeat of hosta's and hostb's from their start.
    let _z = gateway_with(&vhost.uri(), "hostc", "carol", "", slow).await?;
    let all = RosterWatch::start(&vhost, "roster.#").await?;
    let to_b = RosterWatch::start(&vhost, "to.hostb.#").await?;
    let a = gateway_with(&vhost.uri(), "hosta", "alice", "", slow).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    until("hosta's first heartbeat", LIMIT, || async {
        (all.wholes_of("roster.hosta._gateway") > 0).then_some(())
    })
    .await?;
    let b = gateway_with(&vhost.uri(), "hostb", "bob", "", slow).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    // Each sees the other's lead: hosta from hostb's first (whole) heartbeat, hostb from the
    // whole account hosta sent it when it asked.
    let seen = sees(&bob, "alice").await?;
    assert_eq!(seen["host"], "hosta");
    sees(&alice, "bob").await?;
    // Each start was told to all, once; hosta's answer went to hostb alone.
    assert_eq!(all.wholes_of("roster.hosta._gateway"), 1, "{:?}", all.seen);
    assert_eq!(all.wholes_of("roster.hostb._gateway"), 1, "{:?}", all.seen);
    assert_eq!(
        to_b.wholes_of("to.hostb.roster.hosta._gateway"),
        1,
        "{:?}",
        to_b.seen
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_converge_on_one_roster_and_a_dead_one_reads_unreachable()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway(&vhost.uri(), "hosta", "alice", "").await?;
    let b = gateway(&vhost.uri(), "hostb", "bob", "").await?;
    // hostc's worker runs in a bubblewrap sandbox, its profile declaring its role.
    let workdir = tempfile::tempdir_in(fleet_testkit::fleet::agent_workdir())?;
    let boxed = format!(
        "\n{}role = \"backend\"\n",
        fleet_testkit::fleet::bwrap_profile("boxed", workdir.path())?
    );
    let mut c = gateway(&vhost.uri(), "hostc", "carol", &boxed).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let carol = c.lead("carol", Protocol::Stateless).await?;
    carol.spawn("boxed", "wc").await?;

    // Everyone sees everyone, with host and status, and what a worker runs in and is for; and
    // every host, even one without workers, with its profiles.
    for lead in [&alice, &bob] {
        // (Seen first as `spawning`, if a heartbeat of hostc's went out while it started.)
        let wc = until("wc to read idle there", LIMIT, || async {
            let wc = lead.heard_entry("wc").await.ok()?;
            (wc["status"] == "idle").then_some(wc)
        })
        .await?;
        assert_eq!(wc["host"], "hostc");
        assert_eq!(
            (&wc["sandbox"], &wc["profile_role"]),
            (&json!("bwrap"), &json!("backend")),
            "{wc}"
        );
        let carol = sees(lead, "carol").await?;
        assert_eq!(
            (&carol["sandbox"], &carol["profile_role"]),
            (&Value::Null, &Value::Null),
            "{carol}"
        );
    }
    for (lead, others) in [(&alice, ["bob", "carol"]), (&bob, ["alice", "carol"])] {
        for other in others {
            sees(lead, other).await?;
        }
    }
    let list = alice.ok("fleet_list", json!({})).await?;
    let hosts: Vec<&str> = list["hosts"]
        .as_array()
        .map(|h| h.iter().filter_map(|h| h["host"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(hosts, ["hosta", "hostb", "hostc"], "{list}");
    assert_eq!(list["hosts"][1]["profiles"], json!(["sim"]));

    // A gateway killed -9 says nothing: after the presence TTL its entries and its host read
    // unreachable (a partition looks the same: they are kept, and a send to them waits on the
    // broker), and a spawn there fails at once, saying so.
    c.kill9().await?;
    until(
        "hostc's entries to read unreachable on hosta",
        LIMIT,
        || async {
            let list = alice.ok("fleet_list", json!({})).await.ok()?;
            let quiet = |entries: &Value, key: &str, names: &[&str]| {
                entries.as_array().is_some_and(|a| {
                    names.iter().all(|n| {
                        a.iter()
                            .any(|e| e[key] == *n && e["status"] == "unreachable")
                    })
                })
            };
            (quiet(&list["entities"], "name", &["wc", "carol"])
                && quiet(&list["hosts"], "host", &["hostc"]))
            .then_some(())
        },
    )
    .await?;
    let Err(refused) = alice
        .call("fleet_spawn", json!({"profile": "sim", "host": "hostc"}))
        .await?
    else {
        anyhow::bail!("a spawn on hostc went through");
    };
    assert_eq!(refused.code, "broker_unavailable", "{refused:?}");
    assert!(
        refused.message.contains("host \"hostc\" is unreachable"),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_reaches_every_worker_or_one_group_on_every_host() -> anyhow::Result<()> {
    let TwoHosts {
        vhost,
        a: _a,
        b: _b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    alice.spawn("sim", "wa").await?;
    bob.ok(
        "fleet_spawn",
        json!({"profile": "sim", "name": "wb1", "groups": ["core"]}),
    )
    .await?;
    let wb2 = bob.spawn("sim", "wb2").await?["gid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for name in ["wb1", "wb2"] {
        sees(&alice, name).await?;
    }

    let all = alice
        .ok("fleet_broadcast", json!({"message": "everyone: status"}))
        .await?;
    assert_eq!(all["copies"], 3, "{all}");
    let mut from = collect_replies(&alice, 3).await?;
    from.sort();
    assert_eq!(from, ["wa", "wb1", "wb2"]);

    let group = alice
        .ok(
            "fleet_broadcast",
            json!({"message": "core: report", "group": "core"}),
        )
        .await?;
    assert_eq!(group["copies"], 1, "{group}");
    assert_eq!(collect_replies(&alice, 1).await?, ["wb1"]);

    // A worker that joins later gets later broadcasts; a stopped one none.
    let inbox = format!("agent.{wb2}.inbox.v2");
    assert!(vhost.queue(&inbox).await?.is_some(), "no inbox {inbox}");
    bob.ok("fleet_stop", json!({"to": "wb2"})).await?;
    // Its inbox is deleted, and with it its broadcast bindings.
    assert!(vhost.queue(&inbox).await?.is_none(), "{inbox} outlived wb2");
    bob.spawn("sim", "wb3").await?;
    until("hosta to see wb3 and not wb2", LIMIT, || async {
        let names = alice.names().await.ok()?;
        (names.iter().any(|n| n == "wb3") && !names.iter().any(|n| n == "wb2")).then_some(())
    })
    .await?;
    alice
        .ok("fleet_broadcast", json!({"message": "again"}))
        .await?;
    let mut from = collect_replies(&alice, 3).await?;
    from.sort();
    assert_eq!(from, ["wa", "wb1", "wb3"]);
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new());
    Ok(())
}

/// Polls until `n` messages came (or fails after [`LIMIT`]).
pub(super) async fn drain(lead: &Client, n: usize) -> anyhow::Result<Vec<Value>> {
    let deadline = Instant::now() + LIMIT;
    let mut got = Vec::new();
    while got.len() < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {n} messages came: {got:?}",
            got.len()
        );
        got.extend(lead.poll(1).await?);
    }
    Ok(got)
}

/// The `field` of each message.
fn field(messages: &[Value], field: &str) -> Vec<String> {
    messages
        .iter()
        .map(|m| m[field].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The texts of `messages`.
pub(super) fn texts(messages: &[Value]) -> Vec<String> {
    field(messages, "text")
}

/// Polls until `n` replies came; their senders' names.
async fn collect_replies(lead: &Client, n: usize) -> anyhow::Result<Vec<String>> {
    Ok(field(&drain(lead, n).await?, "from_name"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_survive_the_kill_9_of_the_gateway_holding_them_exactly_once() -> anyhow::Result<()>
{
    let TwoHosts {
        vhost: _vhost,
        mut a,
        b: _b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    for name in ["w1", "w2", "w3"] {
        bob.spawn("sim", name).await?;
        sees(&alice, name).await?;
    }
    // Three tasks; the first answer is held on hosta before it dies, the others come while
    // it is down (they wait in its lead's inbox on the broker).
    alice.send("w1", "one", 0).await?;
    until("the first answer to be held on hosta", LIMIT, || async {
        audited(&a).contains("\"held\"").then_some(())
    })
    .await?;
    alice.send("w2", "/slow 1500 two", 0).await?;
    alice.send("w3", "/slow 1500 three", 0).await?;
    alice.close().await?;
    a.kill9().await?;
    a.launch().await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let mut texts = texts(&drain(&alice, 3).await?);
    texts.sort();
    assert_eq!(
        texts,
        ["echo: one", "echo: three", "echo: two"],
        "{}",
        a.log()
    );
    // None twice.
    assert_eq!(alice.poll(2).await?, Vec::<Value>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_dying_between_paste_and_enter_submits_the_brief_once_after_its_restart()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway(&vhost.uri(), "hosta", "alice", "").await?;
    // A long pause between paste and Enter: the window after the ack and before the submit.
    let slow = sim_profile("slowenter", &[])?.replace(
        "ready_timeout_s = 20",
        "ready_timeout_s = 20\nenter_pause_ms = 5000",
    );
    let mut b = gateway(&vhost.uri(), "hostb", "bob", &slow).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    bob.spawn("slowenter", "wb").await?;
    sees(&alice, "wb").await?;
    let sent = alice.send("wb", "type me once", 0).await?;
    let msg_id = sent["msg_id"].as_str().unwrap_or_default().to_string();
    until("hostb to take the brief off the broker", LIMIT, || async {
        b.log()
            .lines()
            .any(|l| l.contains("accepted") && l.contains(&msg_id))
            .then_some(())
    })
    .await?;
    // Taken off the broker is not yet typing (under load it may still be queued); wait for the
    // paste on wb's screen, inside the long pause before Enter.
    until("the brief pasted into wb's pane", LIMIT, || async {
        let panes = b.panes().ok()?;
        panes
            .iter()
            .any(|p| b.screen(p).is_ok_and(|s| s.contains("type me once")))
            .then_some(())
    })
    .await?;
    b.kill9().await?;
    b.launch().await?;
    // The restart finds the brief in wb's input box and submits it; it is never given again
    // by the broker (acknowledged before it was typed), nor typed twice.
    let notice = until("the reply", LIMIT, || async {
        alice
            .poll(1)
            .await
            .ok()?
            .into_iter()
            .find(|m| m["in_reply_to"] == msg_id.as_str())
    })
    .await?;
    assert_eq!(notice["kind"], "REPLY", "{notice}\n{}", b.log());
    assert_eq!(notice["text"], "echo: type me once");
    let restarted = b.log();
    assert!(restarted.contains("verdict=InInput"), "{restarted}");
    let screens: Vec<String> = b.panes()?.iter().filter_map(|p| b.screen(p).ok()).collect();
    assert_eq!(
        screens
            .iter()
            .map(|s| s.matches("[task ").count())
            .sum::<usize>(),
        1,
        "typed once: {screens:?}"
    );
    let after = restarted
        .split("--- restart ---")
        .nth(1)
        .unwrap_or_default();
    assert!(
        !after
            .lines()
            .any(|l| l.contains("accepted") && l.contains(&msg_id)),
        "taken again after the restart:\n{after}"
    );
    assert_eq!(alice.poll(4).await?, Vec::<Value>::new(), "a second notice");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_refuses_to_start_on_an_inbox_another_consumes_or_declared_otherwise()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let mut a = gateway(&vhost.uri(), "hosta", "alice", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let gid = alice.entry("alice").await?["gid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    alice.close().await?;
    assert!(a.terminate().await?);
    let queue = format!("agent.{gid}.inbox.v2");

    // Another consumer holds the lead's inbox exclusively: fleetd says so and stops.
    let other = vhost.connect().await?;
    let _held = other.consume(&queue, "another-gateway", true).await?;
    refused_start(&mut a, &queue, "another gateway").await?;
    other.close().await?;

    // The inbox exists with other arguments: a clear start-up error naming queue and argument.
    let admin = vhost.connect().await?;
    admin.delete_queue(&queue).await?;
    // fleetd's arguments (the defaults) but for the length cap.
    let args = inbox_args(
        &InboxLimits {
            max_length: 5,
            message_ttl_s: 86_400,
            expires_s: 604_800,
        },
        QueueType::Classic,
    );
    admin.declare_queue(&queue, true, &args).await?;
    refused_start(&mut a, &queue, "x-max-length").await?;
    admin.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_waits_for_an_inbox_a_crashed_run_still_holds() -> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let (mut a, alice, gid) = alice_alone(&vhost).await?;
    alice.close().await?;
    assert!(a.terminate().await?);
    // The broker still holds the lead's inbox for a run whose connection it has not timed
    // out yet (a consumer of the test's stands in for it) …
    let queue = format!("agent.{gid}.inbox.v2");
    let other = vhost.connect().await?;
    let _held = other.consume(&queue, "a-crashed-run", true).await?;
    // (A crashed run's connection holds its roster queue too: exclusive, declared first.)
    other
        .declare_exclusive_queue("roster.hosta", &fleet_amqp::topology::roster_args())
        .await?;
    // … and lets go of it once fleetd has started waiting.
    let logs = a
        .state_dir()
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let waiting = || {
        std::fs::read_dir(&logs)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|f| f.file_name().to_string_lossy().starts_with("fleetd-"))
            .any(|f| {
                std::fs::read_to_string(f.path())
                    .unwrap_or_default()
                    .contains("held by another consumer")
            })
    };
    let release = async {
        until("fleetd to wait for the held inbox", LIMIT, || async {
            waiting().then_some(())
        })
        .await?;
        other.close().await?;
        anyhow::Ok(())
    };
    let (started, released) = tokio::join!(a.launch(), release);
    released?;
    started?;
    a.logged("the held inbox was let go").await?;
    // Its lead's inbox is its own again.
    let b = gateway(&vhost.uri(), "hostb", "bob", "").await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    sees(&bob, "alice").await?;
    bob.send("alice@hosta", "after the wait", 0).await?;
    assert_eq!(texts(&drain(&alice, 1).await?), ["after the wait"]);
    Ok(())
}

/// wb on hostb working on a long task from alice, and a second task of hers waiting on the
/// broker behind it: wb's entry, and the two sends.
async fn busy_with_one_waiting(
    alice: &Client,
    bob: &Client,
) -> anyhow::Result<(Value, Value, Value)> {
    let wb = bob.spawn("sim", "wb").await?;
    sees(alice, "wb").await?;
    let first = alice.send("wb", "/slow 60000 never finished", 0).await?;
    until("wb to read busy", LIMIT, || async {
        alice
            .entry("wb")
            .await
            .ok()
            .filter(|e| e["status"] == "busy")
    })
    .await?;
    let second = alice.send("wb", "waits on the broker", 0).await?;
    Ok((wb, first, second))
}

/// Starts `fleet` again and checks that it refuses to, naming `queue` and `why`.
async fn refused_start(fleet: &mut Fleet, queue: &str, why: &str) -> anyhow::Result<()> {
    anyhow::ensure!(fleet.launch().await.is_err(), "fleetd started ({why})");
    let log = fleet.log();
    let last = log.rsplit("--- restart ---").next().unwrap_or_default();
    assert!(last.contains(queue) && last.contains(why), "{last}");
    Ok(())
}

/// A gateway of host `hosta` with lead alice: it, her client, and her gid.
async fn alice_alone(vhost: &Vhost) -> anyhow::Result<(Fleet, Client, String)> {
    let a = gateway(&vhost.uri(), "hosta", "alice", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let gid = alice.entry("alice").await?["gid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok((a, alice, gid))
}

/// How many messages `fleet.dlq` holds.
pub(super) async fn dead_letters(client: &fleet_amqp::Client) -> anyhow::Result<u32> {
    Ok(client.ready("fleet.dlq").await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_for_a_lead_is_held_whole_in_order_and_once_with_garbage_among_it()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let (a, alice, gid) = alice_alone(&vhost).await?;
    // The real broker; the publisher stands in for another host's gateway, writing
    // envelopes as one would, all at once so that they arrive together.
    let client = vhost.connect().await?;
    let carol = announce(&client, "hostc", "carol", Role::Lead).await?;
    sees(&alice, "carol").await?;
    let mut burst = Vec::new();
    for i in 0..150 {
        let body = format!("m{i}");
        let headers = if i == 75 {
            Table::new()
        } else {
            let envelope = Envelope {
                from_name: Some("carol".into()),
                ..forged(Kind::Send, carol, "hostc", &gid)?
            };
            keys::signed(&envelope, body.as_bytes())
        };
        burst.push(raw(headers, body.as_bytes()));
    }
    client.publish_burst("fleet.msg", &gid, &burst).await?;
    let got = drain(&alice, 149).await?;
    let expected: Vec<String> = (0..150)
        .filter(|i| *i != 75)
        .map(|i| format!("m{i}"))
        .collect();
    assert_eq!(texts(&got), expected, "{}", a.log());
    let senders = field(&got, "from_name");
    // Named as her host's heartbeats name her (with her host, once the roster lets her go: the
    // one heartbeat here lives 3 s, and a slow drain outlasts it).
    assert!(
        senders.iter().all(|n| n == "carol" || n == "carol@hostc"),
        "{senders:?}"
    );
    // None twice, and the garbage dead-lettered.
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new());
    assert_eq!(dead_letters(&client).await?, 1);
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_major_and_garbage_go_to_the_dead_letters_and_the_gateway_keeps_going()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let (a, alice, gid) = alice_alone(&vhost).await?;
    let client = vhost.connect().await?;
    let newer = Table::new().with("v", "99.0").with("kind", "REPLY");
    let garbage = Table::new().with("v", "1.0").with("kind", "NONSENSE");
    for headers in [newer, garbage, Table::new()] {
        client
            .publish("fleet.msg", &gid, &raw(headers, b"not for you"))
            .await?;
    }
    until("three dead letters", LIMIT, || async {
        (dead_letters(&client).await.ok()? == 3).then_some(())
    })
    .await?;
    assert!(
        a.log()
            .contains("REFUSED a message of a newer envelope version")
    );
    // And it keeps going.
    alice.spawn("sim", "w1").await?;
    let sent = alice.send("w1", "still here", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: still here");
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_broker_down_local_traffic_works_remote_sends_fail_fast_then_resume()
-> anyhow::Result<()> {
    let mut node = PrivateNode::start().await?;
    let TwoHosts {
        vhost: _vhost,
        a: _a,
        b: _b,
        alice,
        bob,
    } = TwoHosts::on(&node.broker(), "").await?;
    alice.spawn("sim", "wa").await?;
    bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    assert_eq!(
        alice.send("wb", "before", 20).await?["reply"]["text"],
        "echo: before"
    );

    node.stop().await?;
    until("wb to read unreachable", LIMIT, || async {
        alice
            .entry("wb")
            .await
            .ok()
            .filter(|e| e["status"] == "unreachable")
    })
    .await?;
    // Local traffic is untouched.
    assert_eq!(
        alice.send("wa", "local", 20).await?["reply"]["text"],
        "echo: local"
    );
    // A remote send fails at once with broker_unavailable.
    let started = Instant::now();
    let refused = alice
        .call(
            "fleet_send",
            json!({"to": "wb", "message": "during", "wait_s": 20}),
        )
        .await?;
    let took = started.elapsed();
    let error = refused
        .err()
        .ok_or_else(|| anyhow::anyhow!("the send went through"))?;
    assert_eq!(error.code, "broker_unavailable", "{error:?}");
    println!("remote send with the broker down failed in {took:?}");
    // A broadcast still reaches this host's workers, and says the others were not reached.
    let broadcast = alice
        .ok("fleet_broadcast", json!({"message": "to all during"}))
        .await?;
    assert_eq!(broadcast["copies"], 1, "{broadcast}");
    let note = broadcast["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("the other hosts were not reached"),
        "{broadcast}"
    );
    let answers = texts(&drain(&alice, 1).await?);
    assert_eq!(answers, ["echo: to all during"]);

    node.restart().await?;
    let back = until("remote traffic to resume", LIMIT, || async {
        let sent = alice.send("wb", "after", 20).await.ok()?;
        sent["reply"]["text"].as_str().map(str::to_string)
    })
    .await?;
    assert_eq!(back, "echo: after");
    Ok(())
}

/// Every line of a gateway's audit log and its rotated files, oldest first, each parsed.
pub(super) fn audit_lines(fleet: &Fleet) -> anyhow::Result<(usize, Vec<Value>)> {
    let live = fleet.state_dir().join("audit.jsonl");
    let mut files = vec![live.clone()];
    for n in 1.. {
        let rotated = fleet.state_dir().join(format!("audit.jsonl.{n}"));
        if !rotated.exists() {
            break;
        }
        files.push(rotated);
    }
    let mut lines = Vec::new();
    for file in files.iter().rev() {
        for line in std::fs::read_to_string(file)?.lines() {
            lines.push(serde_json::from_str::<Value>(line)?);
        }
    }
    Ok((files.len(), lines))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_its_recipients_size_cap_is_dead_lettered_and_its_sender_told()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway(&vhost.uri(), "hosta", "alice", "").await?;
    // hostb takes smaller messages than hosta sends, and rotates its audit log at 1 KiB.
    let b = gateway_with(
        &vhost.uri(),
        "hostb",
        "bob",
        "max_message_bytes = 1000",
        &format!("{QUICK}audit_max_bytes = 1024\naudit_keep_files = 50\n"),
    )
    .await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    let client = vhost.connect().await?;

    // A task of exactly the cap is typed in (the worker answers with a short file's text).
    let dir = tempfile::tempdir()?;
    let answer = dir.path().join("answer");
    std::fs::write(&answer, "short answer")?;
    let task = |size: usize| format!("{:<size$}", format!("/read {}", answer.display()));
    let at_cap = alice.send("wb", &task(1000), 20).await?;
    assert_eq!(at_cap["reply"]["text"], "short answer", "{at_cap}");

    // One byte more: the sender's send ends failed, naming both sizes and the key.
    let over = alice.send("wb", &task(1001), 20).await?;
    assert_eq!(over["status"], "failed", "{over}\n{}", b.log());
    let reason = over["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("1001 bytes")
            && reason.contains("1000 bytes")
            && reason.contains("gateway.max_message_bytes"),
        "{over}"
    );
    until("the refused message in fleet.dlq", LIMIT, || async {
        (dead_letters(&client).await.ok()? == 1).then_some(())
    })
    .await?;

    // The gateway still serves.
    let after = alice.send("wb", "after", 20).await?;
    assert_eq!(after["reply"]["text"], "echo: after", "{after}");

    // Its audit log rotated, lost no line and holds no text: every hop of the three flows is
    // there, and every line is whole JSON. (A hop is audited once the broker confirmed it,
    // which may be after its recipient saw it.)
    let last = after["reply"]["msg_id"].clone();
    let (files, lines) = until("the last reply's audit line", LIMIT, || async {
        audit_lines(&b)
            .ok()
            .filter(|(_, lines)| lines.iter().any(|l| l["msg_id"] == last))
    })
    .await?;
    assert!(files >= 2, "the audit log did not rotate: {files} file(s)");
    let outcomes = |id: &Value| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["msg_id"] == *id)
            .filter_map(|l| l["outcome"].as_str().map(String::from))
            .collect()
    };
    assert_eq!(outcomes(&at_cap["msg_id"]), ["taken"], "{lines:?}");
    assert_eq!(
        outcomes(&over["msg_id"]),
        ["refused: too large"],
        "{lines:?}"
    );
    assert_eq!(outcomes(&after["msg_id"]), ["taken"], "{lines:?}");
    for id in [&at_cap["reply"]["msg_id"], &after["reply"]["msg_id"]] {
        assert_eq!(outcomes(id), ["published"], "{lines:?}");
    }
    let all = lines.iter().map(Value::to_string).collect::<String>();
    assert!(!all.contains("/read") && !all.contains("short answer") && !all.contains("echo"));
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brief_off_the_broker_holding_a_control_character_is_refused_and_never_typed()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost,
        a,
        b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    let wb = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    let client = vhost.connect().await?;

    // A gateway that does not check (an older one, or a hostile one) publishes the paste
    // breakout as alice's, signed with its own key: hosta itself would refuse to send it.
    let to = gid_of(&wb);
    let from = gid_of(&alice.entry("alice").await?).parse::<Gid>()?;
    let envelope = forged(Kind::Send, from, "hosta", &to)?;
    publish(
        &client,
        "fleet.msg",
        &to,
        &envelope,
        b"echo part-one\x1b[201~\recho smuggled-two\r",
    )
    .await?;

    // hostb refuses it, naming the character, and tells its sender's gateway with a FAILED
    // notice; hosta in turn refuses that notice, for it answers nothing hosta sent. Both are
    // dead-lettered.
    let msg_id = envelope.msg_id.to_string();
    let failed = envelope.msg_id.derived("failed").to_string();
    // What each gateway made of them off its inboxes (not what its dead-letter consumer made of
    // the refused ones coming back: `dead`'s tests).
    let outcomes = |fleet: &Fleet, id: &str| -> Vec<String> {
        audit_lines(fleet)
            .map(|(_, lines)| {
                lines
                    .iter()
                    .filter(|l| l["msg_id"] == id)
                    .filter_map(|l| l["outcome"].as_str().map(String::from))
                    .filter(|o| !o.starts_with("dead letter"))
                    .collect()
            })
            .unwrap_or_default()
    };
    until("both refusals in fleet.dlq", LIMIT, || async {
        (dead_letters(&client).await.ok()? == 2).then_some(())
    })
    .await?;
    assert_eq!(outcomes(&b, &msg_id), ["refused: control character"]);
    assert_eq!(outcomes(&b, &failed), ["published"]);
    let a_saw = until("hosta's refusal of the notice", LIMIT, || async {
        Some(outcomes(&a, &failed)).filter(|o| !o.is_empty())
    })
    .await?;
    assert_eq!(a_saw, ["refused: answer from another host"]);
    assert!(
        b.log().contains("U+001B") && b.log().contains("control character"),
        "{}",
        b.log()
    );
    assert_eq!(alice.poll(0).await?, Vec::<Value>::new());

    // Never typed: the worker takes the next task as its first, and its screen shows neither
    // part of the refused one.
    let after = alice.send("wb", "after", 20).await?;
    assert_eq!(after["reply"]["text"], "echo: after", "{after}");
    let screen = b.screen(wb["pane"].as_str().unwrap_or_default())?;
    assert!(
        screen.contains("[task 1: 5 bytes]") && !screen.contains("task 2"),
        "{screen}"
    );
    assert!(
        !screen.contains("part-one") && !screen.contains("smuggled"),
        "{screen}"
    );
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_off_the_broker_over_a_leads_held_cap_are_dead_lettered_and_their_senders_told()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway_with(
        &vhost.uri(),
        "hosta",
        "alice",
        "max_held_per_recipient = 3",
        QUICK,
    )
    .await?;
    let b = gateway(&vhost.uri(), "hostb", "bob", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    sees(&bob, "alice").await?;
    let client = vhost.connect().await?;

    // Three are held for alice on her host (the cap)...
    for n in 1..=3 {
        let sent = bob.send("alice@hosta", &format!("m{n}"), 0).await?;
        assert_eq!(sent["state"], "held", "{sent}");
    }
    // ...a fourth is refused there: its sender's send ends failed, naming the cap.
    let over = bob.send("alice@hosta", "m4", 20).await?;
    assert_eq!(over["status"], "failed", "{over}\n{}", a.log());
    let reason = over["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("already has 3 messages waiting")
            && reason.contains("gateway.max_held_per_recipient = 3"),
        "{over}"
    );
    until("the refused message in fleet.dlq", LIMIT, || async {
        (dead_letters(&client).await.ok()? == 1).then_some(())
    })
    .await?;

    // Nothing accepted is lost; once taken, there is room again.
    assert_eq!(texts(&drain(&alice, 3).await?), ["m1", "m2", "m3"]);
    assert_eq!(alice.poll(0).await?, Vec::<Value>::new());
    bob.send("alice@hosta", "m5", 0).await?;
    assert_eq!(texts(&drain(&alice, 1).await?), ["m5"]);
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_presence_is_capped_per_host_and_in_hosts() -> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // Entries live long here: what the roster keeps is not what expired.
    let a = gateway_with(
        &vhost.uri(),
        "hosta",
        "alice",
        "",
        "presence_interval_s = 1\npresence_ttl_s = 600\nmax_remote_entities_per_host = 3\nmax_remote_hosts = 2\n",
    )
    .await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let client = vhost.connect().await?;
    // A heartbeat from `host`: its gateway entry, or the entity `name`, of `gid`.
    let beat = |host: &'static str, who: Option<(&'static str, Gid)>, status: &'static str| {
        let client = &client;
        async move {
            let gid = who.map_or_else(Gid::mint, |(_, gid)| gid);
            let entity = who.map(|(name, gid)| Entity {
                gid,
                name: name.into(),
                host: host.into(),
                role: Role::Worker,
                profile: Some("sim".into()),
                sandbox: None,
                profile_role: None,
                groups: Vec::new(),
                parent: None,
            });
            let body = json!({"entity": entity, "status": status, "profiles": ["sim"]});
            let key = format!(
                "roster.{host}.{}",
                who.map_or_else(|| "_gateway".to_string(), |(_, gid)| gid.to_string())
            );
            let envelope = forged(Kind::Presence, gid, host, "fleet.roster")?;
            publish(
                client,
                "fleet.roster",
                &key,
                &envelope,
                body.to_string().as_bytes(),
            )
            .await
        }
    };
    let f: Vec<(&'static str, Gid)> = ["f1", "f2", "f3", "f4"]
        .into_iter()
        .map(|n| (n, Gid::mint()))
        .collect();

    // Four entities of one host: three (the cap) are kept, the fourth ignored. A later
    // refresh of a kept one shows when the roster has read them all (in order).
    beat("hostf", None, "up").await?;
    for entity in &f {
        beat("hostf", Some(*entity), "idle").await?;
    }
    beat("hostf", Some(f[0]), "busy").await?;
    until("f1 to read busy", LIMIT, || async {
        alice
            .entry("f1")
            .await
            .ok()
            .filter(|e| e["status"] == "busy")
    })
    .await?;
    let names = alice.names().await?;
    assert_eq!(names, ["alice", "f1", "f2", "f3"], "{}", a.log());

    // A second host (the cap) is kept; a third is ignored, its entities too.
    beat("hostg", None, "up").await?;
    beat("hosth", None, "up").await?;
    beat("hosth", Some(("h1", Gid::mint())), "idle").await?;
    beat("hostg", Some(("g1", Gid::mint())), "idle").await?;
    sees(&alice, "g1").await?;
    let list = alice.ok("fleet_list", json!({})).await?;
    let hosts: Vec<&str> = list["hosts"]
        .as_array()
        .map(|h| h.iter().filter_map(|h| h["host"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(hosts, ["hosta", "hostf", "hostg"], "{list}");
    assert_eq!(
        alice.names().await?,
        ["alice", "f1", "f2", "f3", "g1"],
        "{list}"
    );

    // Loudly, naming each cap; and the gateway still serves.
    let log = a.log();
    for cap in [
        "federation.max_remote_entities_per_host = 3",
        "federation.max_remote_hosts = 2",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("REFUSED a roster entry over the cap") && l.contains(cap)),
            "{cap}:\n{log}"
        );
    }
    alice.spawn("sim", "wa").await?;
    let sent = alice.send("wa", "still here", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: still here");
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brief_that_expires_while_its_worker_is_busy_is_failed_to_its_sender_then_never_typed()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // hosta's messages live 3 s (its inboxes are declared so too); hostb's are the default.
    let a = gateway(
        &vhost.uri(),
        "hosta",
        "alice",
        "inbox_message_ttl_s = 3\ninbox_expires_s = 600\n",
    )
    .await?;
    let b = gateway(&vhost.uri(), "hostb", "bob", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let wb = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;

    // The first task keeps wb busy for good; the second is sent once hostb says wb is busy,
    // so it waits on the broker.
    alice.send("wb", "/never", 0).await?;
    until("wb to read busy", LIMIT, || async {
        alice
            .entry("wb")
            .await
            .ok()
            .filter(|e| e["status"] == "busy")
    })
    .await?;
    let second = alice.send("wb", "second", 0).await?;
    let second_id = second["msg_id"].as_str().unwrap_or_default().to_string();
    // Its sender hears when it expires, while wb is still busy: not when wb is next free.
    let got = drain(&alice, 1).await?;
    let failed = &got[0];
    assert_eq!(failed["in_reply_to"], second_id.as_str(), "{got:?}");
    assert_eq!(failed["kind"], "FAILED", "{failed}");
    let text = failed["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("expired") && text.contains("not typed"),
        "{failed}"
    );
    assert_eq!(alice.entry("wb").await?["status"], "busy");
    // Never typed: wb's screen shows one task only.
    let screen = b.screen(wb["pane"].as_str().unwrap_or_default())?;
    assert!(
        screen.contains("[task 1") && !screen.contains("[task 2"),
        "{screen}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_tells_the_senders_of_what_waited_for_its_reaped_workers_and_deletes_their_inboxes()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost,
        a: _a,
        mut b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    // One task being worked on, and one waiting on the broker behind it.
    let (wb, first, second) = busy_with_one_waiting(&alice, &bob).await?;

    // hostb crashes, wb's program dies with it, and hostb comes back: wb is not taken back
    // but ended, and so is its inbox.
    b.kill9().await?;
    b.kill_pane_program(wb["pane"].as_str().unwrap_or_default())?;
    b.launch().await?;
    let got = drain(&alice, 2).await?;
    let about = |sent: &Value| {
        got.iter()
            .find(|m| m["in_reply_to"] == sent["msg_id"])
            .cloned()
            .unwrap_or_default()
    };
    let (typed, waiting) = (about(&first), about(&second));
    assert_eq!(typed["kind"], "FAILED", "{got:?}");
    // Being typed in or worked on when its gateway died: either way its sender hears.
    let text = typed["text"].as_str().unwrap_or_default();
    assert!(text.contains("fleetd"), "{typed}");
    assert_eq!(waiting["kind"], "FAILED", "{got:?}");
    assert!(
        waiting["text"]
            .as_str()
            .unwrap_or_default()
            .contains("gateway restarted before"),
        "{waiting}"
    );
    // The inbox goes once what was in it is told of.
    let inbox = format!("agent.{}.inbox.v2", gid_of(&wb));
    until(&format!("{inbox} to go"), LIMIT, || async {
        vhost.queue(&inbox).await.ok().filter(Option::is_none)
    })
    .await?;
    assert!(
        b.log()
            .contains("deleted the inbox of a previous run's worker")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_workers_host_fails_only_the_task_it_left_unanswered_and_its_name_is_free_again()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost: _vhost,
        a: _a,
        mut b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    let old = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    // Answered (its reply went to hosta: hostb keeps no copy of it), then one in flight.
    let answered = alice.send("wb", "answered before", 20).await?;
    assert_eq!(
        answered["reply"]["text"], "echo: answered before",
        "{answered}"
    );
    let open = alice.send("wb", "/slow 60000 in flight", 0).await?;
    until("wb to read busy", LIMIT, || async {
        alice
            .entry("wb")
            .await
            .ok()
            .filter(|e| e["status"] == "busy")
    })
    .await?;

    // The host goes down, and its worker with it (a restart takes back only what still runs).
    b.kill9().await?;
    b.kill_pane_program(old["pane"].as_str().unwrap_or_default())?;
    b.launch().await?;
    let told = drain(&alice, 1).await?;
    assert_eq!(
        (told[0]["kind"].as_str(), &told[0]["in_reply_to"]),
        (Some("FAILED"), &open["msg_id"]),
        "{told:?}"
    );
    // Nothing about the task wb answered.
    assert_eq!(alice.poll(2).await?, Vec::<Value>::new());

    // A new wb at once: alice reaches it by its name, the old one's entry gone.
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let new = bob.spawn("sim", "wb").await?;
    until("alice to see the new wb", LIMIT, || async {
        alice
            .heard_entry("wb")
            .await
            .ok()
            .filter(|e| e["gid"] == new["gid"])
    })
    .await?;
    let names = alice.names().await?;
    assert_eq!(names.iter().filter(|n| *n == "wb").count(), 1, "{names:?}");
    assert_ne!(old["gid"], new["gid"]);
    let again = alice.send("wb", "after the crash", 20).await?;
    assert_eq!(again["reply"]["text"], "echo: after the crash", "{again}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_host_killed_mid_task_takes_it_back_and_its_reply_reaches_the_other_host()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost,
        a: _a,
        mut b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    let wb = bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    let gate = b.gate();
    let open = alice.send("wb", &gate.task("over the restart"), 0).await?;
    let queued = alice.send("wb", "behind it", 0).await?;
    // Typed in, its submit seen (killed while typing, it would fail: another case).
    b.injected(&open).await?;
    bob.close().await?;

    b.kill9().await?;
    b.launch().await?;
    // The worker's inbox was never let go, and the restart took it back as it was.
    let inbox = format!("agent.{}.inbox.v2", wb["gid"].as_str().unwrap_or_default());
    assert!(vhost.queue(&inbox).await?.is_some(), "{inbox} went");
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let entry = bob.entry("wb").await?;
    assert_eq!((&entry["gid"], &entry["pane"]), (&wb["gid"], &wb["pane"]));
    gate.open()?;
    let told = drain(&alice, 2).await?;
    let answer = |sent: &Value| {
        told.iter()
            .find(|m| m["in_reply_to"] == sent["msg_id"])
            .map(|m| (m["kind"].clone(), m["text"].clone()))
    };
    assert_eq!(
        answer(&open),
        Some((json!("REPLY"), json!("echo: over the restart"))),
        "{told:?}\n{}",
        b.log()
    );
    assert_eq!(
        answer(&queued),
        Some((json!("REPLY"), json!("echo: behind it"))),
        "{told:?}"
    );
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new(), "each once");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brief_handed_to_a_worker_blocked_in_fleet_poll_is_receipted_injected()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost: _vhost,
        a,
        b,
        alice,
        bob,
    } = TwoHosts::start().await?;
    let wb = bob.spawn("sim", "wb").await?;
    let pane = wb["pane"].as_str().unwrap_or_default().to_string();
    sees(&alice, "wb").await?;
    // wb answers, then waits in fleet_poll for its next task.
    let polling = alice.send("wb", "/poll 30", 20).await?;
    assert_eq!(polling["reply"]["text"], "polling", "{polling}");
    until("wb to wait in fleet_poll", LIMIT, || async {
        b.screen(&pane).ok().filter(|s| s.contains("[polling]"))
    })
    .await?;
    let sent = alice.send("wb", "handed over", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: handed over", "{sent}");
    // Handed over through the poll, never typed.
    let screen = b.screen(&pane)?;
    assert!(!screen.contains("[task 2"), "{screen}");
    // Its INJECTED receipt came back (else hosta would fail it at the bound).
    let task = sent["msg_id"]
        .as_str()
        .unwrap_or_default()
        .parse::<MsgId>()?;
    let receipt = task.derived("injected").to_string();
    let (_, lines) = until("the receipt in hosta's audit log", LIMIT, || async {
        audit_lines(&a)
            .ok()
            .filter(|(_, lines)| lines.iter().any(|l| l["msg_id"] == receipt.as_str()))
    })
    .await?;
    let outcomes: Vec<&Value> = lines
        .iter()
        .filter(|l| l["msg_id"] == receipt.as_str())
        .map(|l| &l["outcome"])
        .collect();
    assert_eq!(outcomes, [&json!("receipt")], "{lines:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_awaited_across_the_senders_restart_still_fails_its_brief_at_the_bound()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // Its bound is long enough that it cannot run out before the restart.
    let mut a = gateway_with(
        &vhost.uri(),
        "hosta",
        "alice",
        "",
        "presence_interval_s = 1\npresence_ttl_s = 3\ninjected_bound_s = 8\n",
    )
    .await?;
    let mut b = gateway(&vhost.uri(), "hostb", "bob", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    bob.spawn("sim", "wb").await?;
    sees(&alice, "wb").await?;
    // Nobody is left to type the brief in or receipt it.
    b.kill9().await?;
    let sent = alice.send("wb", "never typed", 0).await?;
    assert_eq!(sent["state"], "queued", "{sent}");
    alice.close().await?;
    assert!(a.terminate().await?);
    a.launch().await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let got = drain(&alice, 1).await?;
    assert_eq!(got[0]["kind"], "FAILED", "{got:?}");
    assert_eq!(got[0]["in_reply_to"], sent["msg_id"], "{got:?}");
    let text = got[0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("no INJECTED receipt"), "{text}");
    assert!(
        a.log()
            .contains("awaiting the receipts a previous run awaited")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_broker_down_at_a_restart_its_notices_and_reaped_inboxes_wait_for_the_broker()
-> anyhow::Result<()> {
    let mut node = PrivateNode::start().await?;
    let TwoHosts {
        vhost,
        a: _a,
        mut b,
        alice,
        bob,
    } = TwoHosts::on(&node.broker(), "").await?;
    // One task being worked on, and one waiting on the broker behind it.
    let (wb, first, second) = busy_with_one_waiting(&alice, &bob).await?;

    // hostb crashes (and wb's program with it), and comes back while the broker is down: it
    // ends wb, but cannot reach its inbox until the broker is back.
    b.kill9().await?;
    b.kill_pane_program(wb["pane"].as_str().unwrap_or_default())?;
    node.stop().await?;
    b.launch().await?;
    until("hostb to put off the clearing", LIMIT, || async {
        b.log()
            .contains("the inboxes of a previous run's workers are cleared once it can")
            .then_some(())
    })
    .await?;
    node.restart().await?;
    // Both senders hear: the notice about the task being typed was made while the broker was
    // down, kept, and published once it was back; the waiting brief's once its inbox could be
    // cleared.
    let got = drain(&alice, 2).await?;
    for sent in [&first, &second] {
        let notice = got
            .iter()
            .find(|m| m["in_reply_to"] == sent["msg_id"])
            .ok_or_else(|| anyhow::anyhow!("no notice about {sent}: {got:?}"))?;
        assert_eq!(notice["kind"], "FAILED", "{notice}");
    }
    b.logged("kept until it can").await?;
    let inbox = format!("agent.{}.inbox.v2", gid_of(&wb));
    let gone = until("the reaped inbox to go", LIMIT, || async {
        vhost
            .queue(&inbox)
            .await
            .ok()
            .map(|q| q.is_none())
            .filter(|g| *g)
    })
    .await?;
    assert!(gone);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_with_a_hostile_name_or_status_never_reaches_the_roster() -> anyhow::Result<()>
{
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway(&vhost.uri(), "hosta", "alice", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let client = vhost.connect().await?;
    // Signed by a pinned host, so only what they hold can refuse them.
    announce(&client, "hostc", "evil\u{1b}]0;owned\u{7}", Role::Worker).await?;
    let gid = Gid::mint();
    let entity = json!({"gid": gid, "name": "loud", "host": "hostc", "role": "worker",
                        "profile": null, "groups": [], "parent": null});
    let body = json!({"entity": entity, "status": "idle\u{1b}[2J", "profiles": []}).to_string();
    let envelope = forged(Kind::Presence, gid, "hostc", "fleet.roster")?;
    publish(
        &client,
        "fleet.roster",
        &format!("roster.hostc.{gid}"),
        &envelope,
        body.as_bytes(),
    )
    .await?;
    // A good one after them: once it is in, they were looked at.
    announce(&client, "hostc", "carol", Role::Lead).await?;
    sees(&alice, "carol").await?;
    let names = alice.names().await?;
    assert!(
        !names.iter().any(|n| n.contains("evil") || n == "loud"),
        "{names:?}"
    );
    assert!(
        a.log()
            .contains("a heartbeat holding what no gateway announces was ignored"),
        "{}",
        a.log()
    );
    client.close().await?;
    Ok(())
}
