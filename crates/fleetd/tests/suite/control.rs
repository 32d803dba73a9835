//! The control plane (U4): `fleet_spawn` and `fleet_stop` for another host, between real
//! fleetd processes on the real RabbitMQ, each test in a vhost of its own.

use fleet_core::{Gid, Kind, Role};
use fleet_testkit::broker::{Broker, Vhost};
use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::sim_profile;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::federation::{LIMIT, announce, forged, gid_of, hears_host, publish, sees};
use fleet_testkit::hosts::{TwoHosts, gateway, gateway_with};

/// The audit log of a gateway.
fn audit(fleet: &fleet_testkit::fleet::Fleet) -> String {
    std::fs::read_to_string(fleet.state_dir().join("audit.jsonl")).unwrap_or_default()
}

/// Waits until `fleet`'s audit log has two control requests taken (its writer writes a line a
/// moment after the hop), and no more.
async fn taken_twice(fleet: &fleet_testkit::fleet::Fleet) -> anyhow::Result<()> {
    until("two control requests in the audit log", LIMIT, || async {
        (audit(fleet).matches("control: taken").count() >= 2).then_some(())
    })
    .await?;
    assert_eq!(
        audit(fleet).matches("control: taken").count(),
        2,
        "{}",
        audit(fleet)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_spawns_tasks_and_stops_a_worker_on_another_host() -> anyhow::Result<()> {
    let p = TwoHosts::start().await?;
    until("hostb to be heard on hosta", LIMIT, || async {
        p.alice
            .names()
            .await
            .ok()?
            .contains(&"bob".to_string())
            .then_some(())
    })
    .await?;

    let spawned = p
        .alice
        .ok(
            "fleet_spawn",
            json!({"profile": "sim", "name": "far", "host": "hostb", "groups": ["core"]}),
        )
        .await?;
    assert_eq!(
        (
            spawned["host"].as_str(),
            spawned["status"].as_str(),
            spawned["name"].as_str()
        ),
        (Some("hostb"), Some("idle"), Some("far")),
        "{spawned}\n{}",
        p.b.log()
    );
    assert_eq!(spawned["profile"], "sim");
    assert!(
        !spawned["pane"].as_str().unwrap_or_default().is_empty(),
        "{spawned}"
    );
    let gid = gid_of(&spawned);

    // It lives on hostb, as hostb's worker whose lead is alice on hosta.
    let there = p.bob.entry("far").await?;
    assert_eq!(gid_of(&there), gid, "{there}");
    assert_eq!(there["host"], "hostb");
    assert_eq!(p.b.panes()?.len(), 1, "one pane on hostb");
    assert!(p.a.panes()?.is_empty(), "no pane on hosta");

    // The call returned once the worker can be sent to: at once, and it answers alice.
    let sent = p.alice.send("far", "hello over there", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: hello over there", "{sent}");

    // Stop, from hosta: the pane on hostb closes and the roster lets it go.
    let stopped = p.alice.ok("fleet_stop", json!({"to": "far"})).await?;
    assert_eq!(
        (stopped["status"].as_str(), stopped["name"].as_str()),
        (Some("gone"), Some("far")),
        "{stopped}"
    );
    assert_eq!(gid_of(&stopped), gid);
    until("the pane on hostb to close", LIMIT, || async {
        p.b.panes().ok().filter(|panes| panes.is_empty())
    })
    .await?;
    until("far to leave hosta's roster", LIMIT, || async {
        (!p.alice.names().await.ok()?.contains(&"far".to_string())).then_some(())
    })
    .await?;
    // Both requests went by the control plane, audited on hostb.
    taken_twice(&p.b).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_spawn_fails_as_it_would_there_and_an_unknown_host_at_once() -> anyhow::Result<()>
{
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // A request routed to a host just gone (its roster entry not yet let go) times out soon.
    let a = gateway(&vhost.uri(), "hosta", "alice", "control_wait_s = 5\n").await?;
    let mute = sim_profile("mute", &["--mode", "no-mcp"])?
        .replace("ready_timeout_s = 20", "ready_timeout_s = 1");
    // Its stop ends its fleet (on_exit = "stop"), so it leaves the others' rosters at once.
    let b = gateway_with(
        &vhost.uri(),
        "hostb",
        "bob",
        "on_exit = \"stop\"",
        &format!("presence_interval_s = 1\npresence_ttl_s = 3\n{mute}"),
    )
    .await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    until("hostb to be heard on hosta", LIMIT, || async {
        alice
            .names()
            .await
            .ok()?
            .contains(&"bob".to_string())
            .then_some(())
    })
    .await?;
    let spawn = |args: Value| {
        let alice = &alice;
        async move {
            alice
                .call("fleet_spawn", args)
                .await?
                .err()
                .ok_or_else(|| anyhow::anyhow!("the spawn succeeded"))
        }
    };

    // A profile hostb does not have: hostb names its own.
    let err = spawn(json!({"profile": "nope", "host": "hostb"})).await?;
    assert_eq!(err.code, "unknown_profile", "{err}");
    assert!(
        err.message.contains("hostb")
            && err.message.contains("mute")
            && err.message.contains("sim"),
        "{err}"
    );

    // A worker that never calls in there: not_ready, with the screen's tail, its pane closed.
    let err = spawn(json!({"profile": "mute", "name": "m1", "host": "hostb"})).await?;
    assert_eq!(err.code, "not_ready", "{err}\n{}", b.log());
    assert!(
        err.message.contains("sim m1 ready"),
        "the screen's tail: {err}"
    );
    until("the pane on hostb to close", LIMIT, || async {
        b.panes().ok().filter(|p| p.is_empty())
    })
    .await?;

    // A name hosta would refuse is refused before anything is sent.
    let err = spawn(json!({"profile": "sim", "name": "_x", "host": "hostb"})).await?;
    assert_eq!(err.code, "invalid_params", "{err}");

    // A host nobody heard of: at once, naming the hosts there are.
    let started = std::time::Instant::now();
    let err = spawn(json!({"profile": "sim", "host": "hostz"})).await?;
    assert_eq!(err.code, "unknown_recipient", "{err}");
    assert!(err.message.contains("hosta, hostb"), "{err}");
    assert!(started.elapsed() < LIMIT);
    taken_twice(&b).await?;

    // A host that went down: once the roster lets it go, at once too.
    let mut b = b;
    assert!(b.terminate().await?);
    until("hostb to leave hosta's roster", LIMIT, || async {
        (!alice.names().await.ok()?.contains(&"bob".to_string())).then_some(())
    })
    .await?;
    let err = until("a spawn on hostb to fail at once", LIMIT, || async {
        spawn(json!({"profile": "sim", "host": "hostb"}))
            .await
            .ok()
            .filter(|e| e.code == "unknown_recipient")
    })
    .await?;
    assert!(err.message.contains("hosts there now: hosta"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_request_delivered_twice_spawns_once_and_only_a_lead_may_ask() -> anyhow::Result<()>
{
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let b = gateway(&vhost.uri(), "hostb", "bob", "").await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    let client = vhost.connect().await?;
    // A lead and a worker of host hostc (its gateway stood in for by the test, signing with
    // hostc's key).
    let carol = announce(&client, "hostc", "carol", Role::Lead).await?;
    let wc = announce(&client, "hostc", "wc", Role::Worker).await?;
    until("hostc's lead to be heard on hostb", LIMIT, || async {
        bob.names()
            .await
            .ok()?
            .contains(&"carol".to_string())
            .then_some(())
    })
    .await?;

    let worker = Gid::mint();
    let body = json!({"op": "spawn", "profile": "sim", "name": "twice"}).to_string();
    let mut request = forged(Kind::Spawn, carol, "hostc", "hostb")?;
    request.spawn_id = Some(worker);
    // The same request, twice (as the broker redelivers one whose gateway died before its ack).
    publish(&client, "fleet.control", "hostb", &request, body.as_bytes()).await?;
    publish(&client, "fleet.control", "hostb", &request, body.as_bytes()).await?;
    let entry = until("the worker to be ready on hostb", LIMIT, || async {
        bob.entry("twice")
            .await
            .ok()
            .filter(|e| e["status"] == "idle")
    })
    .await?;
    assert_eq!(
        gid_of(&entry),
        worker.to_string(),
        "the worker takes the gid asked for"
    );
    until("both requests to be handled", LIMIT, || async {
        (audit(&b).matches(&request.msg_id.to_string()).count() >= 2).then_some(())
    })
    .await?;
    assert_eq!(b.panes()?.len(), 1, "spawned once:\n{}", b.log());
    let twice = bob
        .names()
        .await?
        .iter()
        .filter(|n| n.starts_with("twice"))
        .count();
    assert_eq!(twice, 1);

    // A worker may not ask for a spawn: refused, dead-lettered, nothing spawned.
    let mut request = forged(Kind::Spawn, wc, "hostc", "hostb")?;
    request.spawn_id = Some(Gid::mint());
    let body = json!({"op": "spawn", "profile": "sim", "name": "never"}).to_string();
    publish(&client, "fleet.control", "hostb", &request, body.as_bytes()).await?;
    // Nor may a request be read that names another host than the queue's.
    let mut elsewhere = forged(Kind::Spawn, carol, "hostc", "hostd")?;
    elsewhere.spawn_id = Some(Gid::mint());
    publish(
        &client,
        "fleet.control",
        "hostb",
        &elsewhere,
        body.as_bytes(),
    )
    .await?;
    until("both to be refused", LIMIT, || async {
        let audit = audit(&b);
        (audit.contains(&format!("\"msg_id\":\"{}\"", request.msg_id))
            && audit.contains(&format!("\"msg_id\":\"{}\"", elsewhere.msg_id)))
        .then_some(audit)
    })
    .await?;
    let audit = audit(&b);
    assert!(audit.contains("refused: not allowed"), "{audit}");
    assert!(audit.contains("refused: control request"), "{audit}");
    assert!(!bob.names().await?.contains(&"never".to_string()));
    assert_eq!(b.panes()?.len(), 1);
    Ok(())
}

/// A worker `wb` bob spawned on hostb, seen from hosta, with the pair.
async fn pair_with_wb() -> anyhow::Result<TwoHosts> {
    let p = TwoHosts::start().await?;
    p.bob.spawn("sim", "wb").await?;
    sees(&p.alice, "wb").await?;
    Ok(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_asks_the_lead_on_another_host_whose_task_it_works_on() -> anyhow::Result<()> {
    let p = pair_with_wb().await?;

    // alice's task reaches bob's worker on hostb; its question surfaces on her open send.
    let sent = p.alice.send("wb", "/ask 20 which port?", 20).await?;
    assert_eq!(sent["status"], "asked", "{sent}\n{}", p.b.log());
    assert_eq!(sent["ask"]["question"], "which port?");
    assert_eq!(sent["ask"]["from_name"], "wb");
    assert_eq!(sent["ask"]["in_task"], sent["msg_id"]);
    // Her answer goes back, and her call waits on for the task's reply, as on one host.
    let turn = sent["ask"]["turn_id"].clone();
    let answered = p
        .alice
        .ok(
            "fleet_send",
            json!({"turn_id": turn, "message": "8080", "wait_s": 20}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}");
    assert_eq!(answered["reply"]["text"], "asked which port?, heard: 8080");
    let again = p
        .alice
        .call(
            "fleet_send",
            json!({"turn_id": turn, "message": "9090", "wait_s": 0}),
        )
        .await?
        .expect_err("a second answer");
    assert_eq!(again.code, "too_late", "{again}");

    // Nobody waiting on hosta: hostb's worker hears no_waiter from hosta's gateway. The reply
    // is waited for through the operator API, a look that never makes alice a waiter (a poll
    // would, and an ask arriving during it would be hers to answer).
    let sent = p.alice.send("wb", "/ask 20 anyone there?", 0).await?;
    assert_eq!(sent["status"], "pending", "{sent}");
    until("the worker's reply held for alice", LIMIT, || async {
        let out =
            p.a.cli(&[
                "msgs", "--lead", "alice", "--json", "--kind", "REPLY", "--state", "held",
            ])
            .ok()?;
        let held: Value = serde_json::from_slice(&out.stdout).ok()?;
        (held.as_array()?.len() == 1).then_some(())
    })
    .await?;
    let replies = p.alice.poll(0).await?;
    assert_eq!(
        replies[0]["text"], "asked anyone there?, got no_waiter",
        "{replies:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_reaches_an_asking_worker_past_the_briefs_queued_for_it() -> anyhow::Result<()> {
    let p = pair_with_wb().await?;

    // wb asks mid-task; meanwhile alice queues two more tasks for it, which wait on the broker
    // in its inbox, ahead of her answer.
    let sent = p.alice.send("wb", "/ask 30 which port?", 20).await?;
    assert_eq!(sent["status"], "asked", "{sent}\n{}", p.b.log());
    for task in ["second", "third"] {
        let queued = p.alice.send("wb", task, 0).await?;
        assert_eq!(queued["status"], "pending", "{queued}");
    }
    // Her answer is not stuck behind them: the worker hears it, finishes, then takes the rest.
    let turn = sent["ask"]["turn_id"].clone();
    let answered = p
        .alice
        .ok(
            "fleet_send",
            json!({"turn_id": turn, "message": "8080", "wait_s": 20}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}\n{}", p.b.log());
    assert_eq!(answered["reply"]["text"], "asked which port?, heard: 8080");
    let texts = std::sync::Mutex::new(Vec::new());
    until("the two queued tasks' replies", LIMIT, || async {
        let got = p.alice.poll(0).await.ok()?;
        let mut texts = texts.lock().ok()?;
        texts.extend(
            got.iter()
                .map(|r| r["text"].as_str().unwrap_or_default().to_owned()),
        );
        (texts.len() >= 2).then_some(())
    })
    .await?;
    assert_eq!(*texts.lock().unwrap(), ["echo: second", "echo: third"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_across_hosts_that_ended_is_over_for_the_lead_and_a_late_answer_hears_too_late()
-> anyhow::Result<()> {
    let p = pair_with_wb().await?;

    // The worker waits 1 s: alice sees the question, the worker gives up, and hosta hears
    // the ask was abandoned, so her answer is too late at once.
    let sent = p.alice.send("wb", "/ask 1 quick?", 20).await?;
    assert_eq!(sent["status"], "asked", "{sent}");
    let turn = sent["ask"]["turn_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let replies = until("the worker's reply", LIMIT, || async {
        let got = p.alice.poll(0).await.ok()?;
        (!got.is_empty()).then_some(got)
    })
    .await?;
    assert_eq!(
        replies[0]["text"], "asked quick?, got timeout",
        "{replies:?}"
    );
    let late = until("hosta to hear the ask is over", LIMIT, || async {
        let got = p
            .alice
            .call(
                "fleet_send",
                json!({"turn_id": turn, "message": "yes", "wait_s": 0}),
            )
            .await
            .ok()?
            .err()?;
        (got.code == "too_late").then_some(got)
    })
    .await?;
    assert!(late.message.contains("stopped waiting"), "{late}");

    // An answer that reaches hostb after the ask ended (signed with hosta's key, as if hosta
    // sent it in the moment before it heard) is never handed to anyone: hostb answers
    // TOO_LATE. hosta, which never sent that answer, refuses the notice as not its own.
    let ask_id = until("the ASK in hostb's audit", LIMIT, || async {
        audit(&p.b)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["kind"] == "ASK" && l["outcome"] == "published")
            .and_then(|l| l["msg_id"].as_str().map(str::to_string))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}:\n{}", audit(&p.b)))?;
    let alice_gid: Gid = gid_of(&p.alice.entry("alice").await?).parse()?;
    let wb = gid_of(&p.alice.entry("wb").await?);
    let mut answer = forged(Kind::Answer, alice_gid, "hosta", &wb)?;
    answer.in_reply_to = Some(ask_id.parse()?);
    answer.turn_id = Some(turn.clone());
    let client = p.vhost.connect().await?;
    publish(&client, "fleet.msg", &wb, &answer, b"too late now").await?;
    let too_late = until("hostb to answer TOO_LATE", LIMIT, || async {
        audit(&p.b)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["kind"] == "TOO_LATE" && l["outcome"] == "published")
    })
    .await?;
    let id = too_late["msg_id"].as_str().unwrap_or_default().to_string();
    until("hosta to refuse it", LIMIT, || async {
        audit(&p.a)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| {
                l["msg_id"] == id.as_str() && l["outcome"] == "refused: answer from another host"
            })
    })
    .await?;
    assert!(p.alice.poll(0).await?.is_empty(), "nothing held for alice");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consult_starts_an_architect_slot_on_another_host_through_the_control_plane()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway(
        &vhost.uri(),
        "hosta",
        "alice",
        "[architects]\nslots = [{ name = \"arch-here\", profile = \"sim\" }, { name = \"arch-far\", profile = \"sim\", host = \"hostb\", keep_s = 600 }]\n",
    )
    .await?;
    // hostb also offers a Claude Code profile: its presence names that profile's model family.
    let b = gateway(
        &vhost.uri(),
        "hostb",
        "bob",
        "[[profiles]]\nname = \"opus\"\nkind = \"claude-code\"\nmodel = \"claude-opus-4\"\n",
    )
    .await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    sees(&alice, "bob").await?;
    // The slot's host itself, not only its lead, is heard (a host's own heartbeat comes apart).
    hears_host(&alice, "hostb").await?;
    let list = alice.ok("fleet_list", json!({})).await?;
    let hostb = list["hosts"]
        .as_array()
        .and_then(|hosts| hosts.iter().find(|h| h["host"] == "hostb"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(hostb["families"], json!({"opus": "anthropic"}), "{list}");
    let brief = "Is one exchange enough?";
    let consult = alice
        .ok("fleet_consult", json!({"brief": brief, "wait_s": 30}))
        .await?;
    let answers = consult["answers"].as_array().cloned().unwrap_or_default();
    let hosts: Vec<(&str, &str, &str)> = answers
        .iter()
        .map(|s| {
            (
                s["architect"].as_str().unwrap_or_default(),
                s["host"].as_str().unwrap_or_default(),
                s["status"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        hosts,
        [
            ("arch-here", "hosta", "answered"),
            ("arch-far", "hostb", "answered")
        ],
        "{consult}\n{}",
        b.log()
    );
    for answer in &answers {
        assert_eq!(answer["text"], format!("echo: {brief}"), "{answer}");
        // A scripted program's family is nobody's to name, here or there.
        assert_eq!(answer["family"], Value::Null, "{answer}");
    }
    // The far one is an architect on its host, kept for a follow-up by name.
    let far = sees(&alice, "arch-far").await?;
    assert_eq!(
        (&far["role"], &far["slot"], &far["host"]),
        (&json!("architect"), &json!("arch-far"), &json!("hostb")),
        "{far}"
    );
    let follow = alice.send("arch-far", "and the cost?", 20).await?;
    assert_eq!(
        follow["reply"]["text"],
        "echo: and the cost?",
        "{follow}\n{}",
        b.log()
    );
    // The near one is stopped once it answered; the far one when its lead stops it.
    alice.ok("fleet_stop", json!({"to": "arch-far"})).await?;
    until("both architects to be stopped", LIMIT, || async {
        let list = alice.ok("fleet_list", json!({})).await.ok()?;
        let left = list["entities"]
            .as_array()?
            .iter()
            .any(|e| e["role"] == "architect");
        (!left).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_architect_started_afar_after_its_consult_gave_up_is_stopped_and_its_lead_told()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway(
        &vhost.uri(),
        "hosta",
        "alice",
        "[architects]\nslots = [{ name = \"arch-far\", profile = \"slow\", host = \"hostb\" }]\n",
    )
    .await?;
    // Its program shows it is ready only after 3 s.
    let slow = "[[profiles]]\nname = \"slow\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"sleep 3; echo SLOW-READY; exec sleep 600\"]\nready_marker = \"SLOW-READY\"\nready_timeout_s = 20\n";
    let b = gateway(&vhost.uri(), "hostb", "bob", slow).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    sees(&alice, "bob").await?;
    // hostb's own heartbeat (its profiles), which a spawn there needs, may come after bob's.
    hears_host(&alice, "hostb").await?;
    // The client gives up while hostb still starts the architect.
    let gave_up = alice
        .call_within(
            "fleet_consult",
            json!({"brief": "advise", "wait_s": 60}),
            std::time::Duration::from_secs(1),
        )
        .await?;
    assert!(gave_up.is_none(), "the consult returned: {gave_up:?}");
    // When hostb answers, the architect nobody will consult is stopped, and alice is told.
    let told = until("alice to be told", LIMIT, || async {
        let held = alice.poll(0).await.ok()?;
        held.into_iter()
            .find(|m| m["text"].as_str().is_some_and(|t| t.contains("arch-far")))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}\n{}", a.log(), b.log()))?;
    let text = told["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("architect 'arch-far'") && text.contains("is being stopped"),
        "{told}"
    );
    until("hostb to have no architect left", LIMIT, || async {
        let list = alice.ok("fleet_list", json!({})).await.ok()?;
        let left = list["entities"]
            .as_array()?
            .iter()
            .any(|e| e["role"] == "architect");
        (!left && b.panes().ok()?.is_empty()).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}: panes {:?}\n{}", b.panes(), b.log()))?;
    Ok(())
}
