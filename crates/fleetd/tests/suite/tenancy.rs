//! Ownership (issue 30): every worker belongs to the lead that spawned it. Only its owner may
//! task it, stop it, read its screen, see its dialog and its stall text; a lead it is shared
//! with (`fleet_spawn{share}`, or `[leads.NAME] share` for every spawn of that lead) may task it
//! and gets its own answers, nothing more. Operators see names, states and counts, never text. A
//! task is answered once. Across hosts, a lead of another host may spawn, task and stop on this
//! one only as `[federation.allow.HOST]` (or `."lead@HOST"`) lets it, a spawn in a directory
//! under this host's `workdir_roots`. The last test plants a secret in each kind of text and
//! looks for it in everything the principals refused it are given.
//!
//! One host: real fleetd, tmux and the scripted agent, leads as real MCP clients and the
//! operator API over HTTP. Across hosts: real gateways on the real RabbitMQ, each test in a
//! vhost of its own, as in `federation.rs`.

use std::path::Path;

use fleet_testkit::broker::{Broker, Vhost};
use fleet_testkit::client::{Client, Protocol, ToolError};
use fleet_testkit::fleet::{Fleet, sim_profile, token_spy_profile};
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::as_worker;
use super::federation::{LIMIT, drain, sees, texts};
use fleet_testkit::hosts::{HOSTS, QUICK};

/// The leads and operators of a one-host test: alice spawns the workers, carol is the lead she
/// shares some with, bob a lead she does not; `ops` may stop, `prom` may only read.
const PRINCIPALS: &str = "[leads.alice]\n[leads.bob]\n[leads.carol]\n[operators.ops]\n[operators.prom]\nread_only = true\n";

/// The gateway of test host `host` on the broker at `uri`: its leads `leads` (none sharing
/// anything by default), the scripted agent as `sim`, more `[gateway]` lines `gateway`, every
/// test host's key pinned, and then `extra` (an allow table, a profile): it admits another
/// host's leads to nothing but what `extra` grants. (Its own config, not `federation.rs`'s
/// helpers, whose fleets admit one another.)
async fn host(
    uri: &str,
    host: &str,
    leads: &[&str],
    gateway: &str,
    extra: &str,
) -> anyhow::Result<Fleet> {
    let leads: String = leads.iter().map(|l| format!("[leads.{l}]\n")).collect();
    let rest = format!(
        "{leads}\n{}\n[broker]\nuri = \"{uri}\"\nheartbeat_s = 5\n\n[federation]\n{QUICK}\n{}\n{extra}",
        sim_profile("sim", &[])?,
        fleet_testkit::keys::trust_table(&HOSTS)
    );
    Fleet::start_as(host, gateway, &rest).await
}

/// The scripted agent as profile `name`, with more profile keys `keys`.
fn profile(name: &str, keys: &str) -> anyhow::Result<String> {
    Ok(format!("{}{keys}", sim_profile(name, &[])?))
}

/// The scripted agent as `confirm` (its `/confirm` dialogs known by `(y/n)`), as `stally` (it
/// stalls after 1 s still: its lead is told) and as `recycler` (the same, its task failed).
fn profiles() -> anyhow::Result<String> {
    Ok(format!(
        "{}{}{}{}",
        sim_profile("sim", &[])?,
        profile("confirm", "blocked_markers = [\"(y/n)\"]\n")?,
        profile("stally", "stall_after_s = 1\n")?,
        profile("recycler", "stall_after_s = 1\non_stall = \"recycle\"\n")?,
    ))
}

/// A fleet of [`PRINCIPALS`] and [`profiles`], with alice, bob and carol connected.
async fn one_host() -> anyhow::Result<(Fleet, Client, Client, Client)> {
    let fleet = Fleet::start("", &format!("{PRINCIPALS}{}", profiles()?)).await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let bob = fleet.lead("bob", Protocol::Stateless).await?;
    let carol = fleet.lead("carol", Protocol::Stateless).await?;
    Ok((fleet, alice, bob, carol))
}

/// `lead` spawns `name` of `profile`, shared with `share`.
async fn spawn_shared(
    lead: &Client,
    profile: &str,
    name: &str,
    share: &[&str],
) -> anyhow::Result<Value> {
    lead.ok(
        "fleet_spawn",
        json!({"profile": profile, "name": name, "share": share}),
    )
    .await
}

/// A request to `path` of `fleet` as `token` (GET, or POST of `body`): its status and JSON.
async fn api(
    fleet: &Fleet,
    token: &str,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<(u16, Value)> {
    let client = reqwest::Client::new();
    let url = format!("{}{path}", fleet.base());
    let request = match body {
        Some(body) => client.post(url).json(&body),
        None => client.get(url),
    };
    let response = request.bearer_auth(token).send().await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// `GET /api/v1/screen?name={name}` as `token`: its status and body.
async fn screen(fleet: &Fleet, token: &str, name: &str) -> anyhow::Result<(u16, Value)> {
    api(fleet, token, &format!("/api/v1/screen?name={name}"), None).await
}

/// The entry of `name` in `GET /api/v1/roster` as `token`.
async fn roster_row(fleet: &Fleet, token: &str, name: &str) -> anyhow::Result<Value> {
    let (status, roster) = api(fleet, token, "/api/v1/roster", None).await?;
    anyhow::ensure!(status == 200, "the roster: {status} {roster}");
    roster["entities"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["name"] == name).cloned())
        .ok_or_else(|| anyhow::anyhow!("{name} is not in the roster: {roster}"))
}

/// The leads in an entry's `shared` (none when it has no such field), a lead of the worker's
/// own host by its name alone whether the entry writes it `name` or `name@host`.
fn shared(entry: &Value) -> Vec<String> {
    let here = format!("@{}", entry["host"].as_str().unwrap_or_default());
    entry["shared"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str())
                .map(|n| n.strip_suffix(here.as_str()).unwrap_or(n).to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// `tool` called by `lead` with `args`, which must fail `forbidden`: the error.
async fn forbidden(lead: &Client, tool: &str, args: Value) -> anyhow::Result<ToolError> {
    match lead.call(tool, args.clone()).await? {
        Ok(done) => anyhow::bail!("{tool} {args} went through: {done}"),
        Err(e) if e.code == "forbidden" => Ok(e),
        Err(e) => anyhow::bail!("{tool} {args} failed otherwise: {e}"),
    }
}

/// `lead`'s task `text` for `to` on another host, which must be refused: a tool error
/// (`forbidden`) if its own gateway refuses it, or a send that ends `failed` if the worker's
/// gateway does and says so; the words of the refusal.
async fn refused_task(lead: &Client, to: &str, text: &str) -> anyhow::Result<String> {
    let args = json!({"to": to, "message": text, "wait_s": 20});
    match lead.call("fleet_send", args).await? {
        Err(e) if e.code == "forbidden" => Ok(e.message),
        Err(e) => anyhow::bail!("the task for {to} failed otherwise: {e}"),
        Ok(sent) if sent["status"] == "failed" => {
            Ok(sent["reason"].as_str().unwrap_or_default().to_string())
        }
        Ok(sent) => anyhow::bail!("the task for {to} went: {sent}"),
    }
}

/// Whether any pane of `fleet` shows `text`: whether it was typed in there.
fn typed(fleet: &Fleet, text: &str) -> anyhow::Result<bool> {
    for pane in fleet.panes()? {
        if fleet.screen(&pane)?.contains(text) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Waits until `name`'s status in `lead`'s `fleet_list` is `status`; its entry then.
async fn until_status(lead: &Client, name: &str, status: &str) -> anyhow::Result<Value> {
    until(&format!("{name} to be {status}"), LIMIT, || async {
        lead.entry(name)
            .await
            .ok()
            .filter(|e| e["status"] == status)
    })
    .await
}

/// The first message `lead` polls within [`LIMIT`] whose text holds `needle`.
async fn polled(lead: &Client, needle: &str) -> anyhow::Result<Value> {
    until(&format!("a message saying {needle:?}"), LIMIT, || async {
        lead.poll(1)
            .await
            .ok()?
            .into_iter()
            .find(|m| m["text"].as_str().is_some_and(|t| t.contains(needle)))
    })
    .await
}

/// The live feed as `token` reads it from its start, as text, read until the entity `last`
/// shows in it: the last thing the test did, so everything before it has been told by then.
async fn feed(fleet: &Fleet, token: &str, last: &str) -> anyhow::Result<String> {
    let mut response = reqwest::Client::new()
        .get(format!("{}/api/v1/events?after=0", fleet.base()))
        .bearer_auth(token)
        .send()
        .await?;
    anyhow::ensure!(response.status() == 200, "the feed: {}", response.status());
    let marker = format!("\"name\":\"{last}\"");
    let mut text = String::new();
    let read = tokio::time::timeout(LIMIT, async {
        while !text.contains(&marker) {
            let Some(chunk) = response.chunk().await? else {
                anyhow::bail!("the feed ended");
            };
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        anyhow::Ok(())
    })
    .await;
    match read {
        Ok(Ok(())) => Ok(text),
        Ok(Err(e)) => Err(anyhow::anyhow!("{e}; it said:\n{text}")),
        Err(_) => anyhow::bail!("{last} never showed in the feed; it said:\n{text}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_lead_may_neither_task_nor_stop_a_worker_it_does_not_own() -> anyhow::Result<()> {
    let (fleet, alice, bob, _carol) = one_host().await?;
    let spawned = alice.spawn("sim", "w1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    // However bob names alice's worker, his task is refused.
    let gid = spawned["gid"].as_str().unwrap_or_default().to_string();
    for to in ["w1", "w1@testhost", gid.as_str()] {
        let message = format!("from bob, to {to}");
        forbidden(&bob, "fleet_send", json!({"to": to, "message": message})).await?;
    }
    // And so are his stop, and the same through the API.
    forbidden(&bob, "fleet_stop", json!({"to": "w1"})).await?;
    let token = fleet.token("bob")?;
    for (path, body) in [
        (
            "/api/v1/send",
            json!({"to": "w1", "message": "from bob's script"}),
        ),
        ("/api/v1/stop", json!({"to": "w1"})),
    ] {
        let (status, answer) = api(&fleet, &token, path, Some(body)).await?;
        assert_eq!(
            (status, &answer["error"]),
            (403, &json!("forbidden")),
            "{path}: {answer}"
        );
    }
    // Nothing of his reached the worker: never typed, still there, still idle, still alice's.
    assert!(
        !fleet.screen(&pane)?.contains("from bob"),
        "bob's task typed"
    );
    let entry = alice.entry("w1").await?;
    assert_eq!(
        (&entry["status"], &entry["owner"]),
        (&json!("idle"), &json!("alice")),
        "{entry}"
    );
    // Its owner tasks and stops it as ever.
    let sent = alice.send("w1", "from alice", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: from alice", "{sent}");
    let stopped = alice.ok("fleet_stop", json!({"to": "w1"})).await?;
    assert_eq!(stopped["status"], "gone", "{stopped}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_lead_sees_a_blocked_workers_state_but_not_its_dialog() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let spy = token_spy_profile("spy", &dir.path().join("token"));
    let fleet = Fleet::start("", &format!("{PRINCIPALS}{}{spy}", profiles()?)).await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let bob = fleet.lead("bob", Protocol::Stateless).await?;
    // A worker of bob's, by its own token: a principal of its own.
    let bobs_worker = as_worker(&fleet, &bob, &dir, "spy-1").await?;
    alice.spawn("confirm", "wd").await?;
    let sent = alice
        .send("wd", "/confirm Drop the orders table?", 0)
        .await?;
    assert_eq!(sent["status"], "pending", "{sent}");
    // Its owner sees the dialog, with its turn id, in fleet_list.
    let mine = until("wd's dialog in alice's fleet_list", LIMIT, || async {
        alice
            .entry("wd")
            .await
            .ok()
            .filter(|e| e["dialog"]["turn_id"].is_string())
    })
    .await?;
    let turn_id = mine["dialog"]["turn_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // bob sees that it is blocked, and nothing of what it asks: no prompt, no turn id.
    let theirs = bob.entry("wd").await?;
    assert_eq!(theirs["status"], "blocked", "{theirs}");
    assert!(theirs.get("dialog").is_none(), "{theirs}");
    let listed = bob.ok("fleet_list", json!({})).await?.to_string();
    let polled = bob
        .ok("fleet_poll", json!({"wait_s": 0}))
        .await?
        .to_string();
    let row = roster_row(&fleet, &fleet.token("bob")?, "wd").await?;
    assert!(row.get("dialog").is_none(), "{row}");
    let workers_list = bobs_worker.ok("fleet_list", json!({})).await?.to_string();
    assert!(workers_list.contains("\"blocked\""), "{workers_list}");
    for seen in [&listed, &polled, &row.to_string(), &workers_list] {
        assert!(
            !seen.contains("orders table") && !seen.contains(&turn_id),
            "bob or his worker was shown alice's dialog: {seen}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_shared_at_spawn_or_by_its_leads_default_takes_the_shared_leads_tasks_only()
-> anyhow::Result<()> {
    // alice shares every worker she spawns with carol, unless her spawn says otherwise.
    let config = format!(
        "[leads.alice]\nshare = [\"carol\"]\n[leads.bob]\n[leads.carol]\n{}",
        sim_profile("sim", &[])?
    );
    let fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let bob = fleet.lead("bob", Protocol::Stateless).await?;
    let carol = fleet.lead("carol", Protocol::Stateless).await?;
    alice.spawn("sim", "w1").await?;
    spawn_shared(&alice, "sim", "w2", &["bob"]).await?;
    // The roster says whose each is and with whom it is shared.
    let w1 = carol.entry("w1").await?;
    assert_eq!(w1["owner"], "alice", "{w1}");
    assert_eq!(shared(&w1), ["carol"], "{w1}");
    let w2 = bob.entry("w2").await?;
    assert_eq!(w2["owner"], "alice", "{w2}");
    assert!(shared(&w2).contains(&"bob".to_string()), "{w2}");

    // carol tasks w1 and gets her own answer; alice is not handed it.
    let sent = carol.send("w1", "carol's question", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: carol's question", "{sent}");
    assert_eq!(alice.poll(0).await?, Vec::<Value>::new());
    // bob tasks w2, shared with him by the spawn itself, but not w1.
    let sent = bob.send("w2", "bob's question", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: bob's question", "{sent}");
    forbidden(
        &bob,
        "fleet_send",
        json!({"to": "w1", "message": "not mine"}),
    )
    .await?;
    // Shared is for tasks only: carol may neither stop w1 nor read its screen.
    forbidden(&carol, "fleet_stop", json!({"to": "w1"})).await?;
    let (status, body) = screen(&fleet, &fleet.token("carol")?, "w1").await?;
    assert_eq!(status, 403, "{body}");
    assert_eq!(until_status(&alice, "w1", "idle").await?["owner"], "alice");
    // A share naming no lead of this host is refused, naming it: a typo shares with nobody.
    let err = alice
        .call(
            "fleet_spawn",
            json!({"profile": "sim", "name": "w3", "share": ["crol"]}),
        )
        .await?
        .expect_err("a share naming no lead");
    assert_eq!(err.code, "invalid_params", "{err}");
    assert!(err.message.contains("'crol'"), "{err}");
    // Hostile shares: a control character, an empty name, too many. (A share of the wrong type
    // is refused by the MCP layer's own parameter check, as every wrong type is.)
    let many: Vec<String> = (0..=64).map(|i| format!("l{i}@h")).collect();
    for (share, says) in [
        (json!(["car\u{1b}[31mol"]), "not a valid name"),
        (json!(["@hostb"]), "not a valid name"),
        (json!(many), "64 leads at most"),
    ] {
        let err = alice
            .call(
                "fleet_spawn",
                json!({"profile": "sim", "name": "w4", "share": share}),
            )
            .await?
            .expect_err("a hostile share");
        assert_eq!(err.code, "invalid_params", "{share}: {err}");
        assert!(err.message.contains(says), "{share}: {err}");
    }
    let names = alice.names().await?;
    assert!(
        !names.iter().any(|n| n == "w3" || n == "w4"),
        "a refused spawn left a worker: {names:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_lead_whose_task_a_worker_works_on_still_may_not_read_its_screen()
-> anyhow::Result<()> {
    let (fleet, alice, _bob, carol) = one_host().await?;
    spawn_shared(&alice, "sim", "w1", &["carol"]).await?;
    // alice's own task first: its text stays on w1's screen.
    alice.send("w1", "the owner's own words", 20).await?;
    // While w1 works on carol's task, the screen is still alice's alone.
    carol.send("w1", "/slow 5000 carol's slow task", 0).await?;
    until_status(&carol, "w1", "busy").await?;
    let (status, body) = screen(&fleet, &fleet.token("carol")?, "w1").await?;
    assert_eq!(status, 403, "carol read w1's screen: {body}");
    assert!(!body.to_string().contains("owner's own words"), "{body}");
    // Her answer is hers.
    let answer = polled(&carol, "carol's slow task").await?;
    assert_eq!(answer["text"], "echo: carol's slow task", "{answer}");
    assert_eq!(alice.poll(0).await?, Vec::<Value>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_told_to_a_shared_lead_carries_none_of_the_owners_screen() -> anyhow::Result<()> {
    let (_fleet, alice, _bob, carol) = one_host().await?;
    spawn_shared(&alice, "stally", "w1", &["carol"]).await?;
    // alice's task, answered at once: its text stays on w1's screen.
    let sent = alice.send("w1", "owner-only-8e21 plans", 20).await?;
    assert_eq!(
        sent["reply"]["text"], "echo: owner-only-8e21 plans",
        "{sent}"
    );
    // carol's task stalls w1: she is told it stalled, and shown none of its screen (where
    // alice's words still are, with the agent's own lines).
    carol.send("w1", "/never carol's task", 0).await?;
    let told = polled(&carol, "has stalled").await?;
    let text = told["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("[fleet] 'w1' has stalled"), "{told}");
    for line in ["owner-only-8e21", "[not replying]", "sim w1 ready"] {
        assert!(
            !text.contains(line),
            "the stall notice shows {line:?}: {text}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_states_and_counts_but_neither_a_dialog_nor_a_stalled_screen()
-> anyhow::Result<()> {
    let (fleet, alice, _bob, _carol) = one_host().await?;
    alice.spawn("confirm", "wd").await?;
    alice.spawn("recycler", "ws").await?;
    // ws stalls on alice's task and is recycled: her send fails with its screen's end (hers).
    let failed = alice.send("ws", "/never stall-screen-4b9d", 20).await?;
    assert_eq!(failed["status"], "failed", "{failed}\n{}", fleet.log());
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("[not replying]"),
        "the owner's reason: {reason}"
    );
    // wd stops on a dialog and stays there.
    alice
        .send("wd", "/confirm Wipe staging-db-6c0f?", 0)
        .await?;
    until("wd's dialog", LIMIT, || async {
        alice
            .entry("wd")
            .await
            .ok()
            .filter(|e| e["dialog"].is_object())
    })
    .await?;
    for operator in ["prom", "ops"] {
        let token = fleet.token(operator)?;
        // Names, states and counts.
        let wd = roster_row(&fleet, &token, "wd").await?;
        assert_eq!(wd["status"], "blocked", "{operator}: {wd}");
        assert!(
            wd["queued"].is_u64() && wd["held"].is_u64(),
            "{operator}: {wd}"
        );
        assert!(
            wd.get("dialog").is_none(),
            "{operator} sees the dialog: {wd}"
        );
        // The failure told to alice is listed, its reason without the screen.
        let (status, failures) = api(&fleet, &token, "/api/v1/messages?kind=FAILED", None).await?;
        assert_eq!(status, 200, "{failures}");
        let notice = failures["messages"][0].clone();
        let said = notice["reason"].as_str().unwrap_or_default();
        assert!(said.contains("'ws' has stalled"), "{operator}: {notice}");
        let (_, everything) = api(&fleet, &token, "/api/v1/messages?limit=1000", None).await?;
        for text in ["stall-screen-4b9d", "[not replying]", "staging-db-6c0f"] {
            assert!(
                !everything.to_string().contains(text) && !wd.to_string().contains(text),
                "{operator} reads {text:?}: {everything}"
            );
        }
    }
    // Only the operator that may stop does; neither reads a screen.
    let (prom, ops) = (fleet.token("prom")?, fleet.token("ops")?);
    for token in [&prom, &ops] {
        assert_eq!(screen(&fleet, token, "wd").await?.0, 403);
    }
    let stop = Some(json!({"to": "wd"}));
    assert_eq!(
        api(&fleet, &prom, "/api/v1/stop", stop.clone()).await?.0,
        403
    );
    let (status, stopped) = api(&fleet, &ops, "/api/v1/stop", stop).await?;
    assert_eq!(status, 200, "{stopped}");
    until("wd to be gone", LIMIT, || async {
        (!alice.names().await.ok()?.contains(&"wd".to_string())).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_reply_to_an_answered_task_is_too_late_and_its_lead_gets_one() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let config = format!(
        "[leads.alice]\n{}",
        token_spy_profile("spy", &dir.path().join("token"))
    );
    let fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    let worker = as_worker(&fleet, &alice, &dir, "spy-1").await?;
    let sent = alice.send("spy-1", "answer me once", 0).await?;
    let task = sent["msg_id"].as_str().unwrap_or_default().to_string();
    let token = fleet.token("alice")?;
    until("the task typed into the worker", LIMIT, || async {
        let (_, history) = api(&fleet, &token, &format!("/api/v1/messages/{task}"), None)
            .await
            .ok()?;
        (history["state"] == "injected").then_some(())
    })
    .await?;
    worker
        .ok(
            "fleet_reply",
            json!({"message": "the one answer", "in_reply_to": task}),
        )
        .await?;
    // The same task answered again: refused, naming it.
    let again = worker
        .call(
            "fleet_reply",
            json!({"message": "a second answer", "in_reply_to": task}),
        )
        .await?
        .expect_err("a second answer to one task");
    assert_eq!(again.code, "too_late", "{again}");
    assert!(again.message.contains(&task), "{again}");
    // The lead hears one answer, once.
    let answers = drain(&alice, 1).await?;
    assert_eq!(texts(&answers), ["the one answer"]);
    assert_eq!(alice.poll(1).await?, Vec::<Value>::new());
    Ok(())
}

/// Who may do what to a worker alice spawned and shared with carol, through the operator API
/// (one fresh worker per row): task it (the answer the sender's own), look at its screen, stop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_may_task_look_at_and_stop_a_shared_worker_a_table() -> anyhow::Result<()> {
    let (fleet, alice, _bob, _carol) = one_host().await?;
    // who, POST /api/v1/send, GET /api/v1/screen, POST /api/v1/stop
    let table: [(&str, u16, u16, u16); 5] = [
        ("alice", 200, 200, 200), // the owner
        ("carol", 200, 403, 403), // shared with
        ("bob", 403, 403, 403),   // another lead
        ("ops", 403, 403, 200),   // an operator that may stop
        ("prom", 403, 403, 403),  // a read-only operator
    ];
    for (who, send, look, stop) in table {
        let worker = format!("w-{who}");
        spawn_shared(&alice, "sim", &worker, &["carol"]).await?;
        let token = fleet.token(who)?;
        let task = format!("{who}'s task");
        let body = json!({"to": worker, "message": task, "wait_s": 20});
        let (status, sent) = api(&fleet, &token, "/api/v1/send", Some(body)).await?;
        assert_eq!(status, send, "{who} tasks {worker}: {sent}");
        if status == 200 {
            assert_eq!(
                sent["reply"]["text"],
                format!("echo: {task}"),
                "{who}: {sent}"
            );
        } else {
            assert_eq!(sent["error"], "forbidden", "{who}: {sent}");
        }
        let (status, shown) = screen(&fleet, &token, &worker).await?;
        assert_eq!(status, look, "{who} looks at {worker}: {shown}");
        let body = Some(json!({"to": worker}));
        let (status, stopped) = api(&fleet, &token, "/api/v1/stop", body).await?;
        assert_eq!(status, stop, "{who} stops {worker}: {stopped}");
        // A stop refused leaves the worker as it was.
        let listed = alice.names().await?.contains(&worker);
        assert_eq!(listed, stop != 200, "{who}: {worker} listed: {listed}");
    }
    Ok(())
}

/// The secrets of [`no_secret_of_any_kind_reaches_a_principal_refused_it`], one per kind of
/// text: a task's, a reply's (never in its task), a screen's (typed in by a task whose answer
/// does not repeat it), a dialog's prompt, a stalled worker's screen tail.
const SECRETS: [&str; 5] = [
    "task-secret-5b1e0c",
    "reply-secret-9c4d2a",
    "screen-secret-2f7a61",
    "dialog-secret-71aa3e",
    "stall-secret-c3d08b",
];

/// The secrets `seen` holds.
fn leaked(seen: &str) -> Vec<&'static str> {
    SECRETS.into_iter().filter(|s| seen.contains(s)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_of_any_kind_reaches_a_principal_refused_it() -> anyhow::Result<()> {
    let (fleet, alice, bob, carol) = one_host().await?;
    spawn_shared(&alice, "sim", "w1", &["carol"]).await?;
    spawn_shared(&alice, "confirm", "wd", &["carol"]).await?;
    alice.spawn("recycler", "ws").await?;
    let [task, reply, on_screen, dialog, stall] = SECRETS;
    // The reply's secret is in a file the worker reads out: its task names only the file.
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), reply)?;

    // Each secret, where alice (the owner) sees it: the proof that it is there to find.
    let mut ids = Vec::new();
    let sent = alice.send("w1", &format!("remember {task}"), 20).await?;
    assert_eq!(
        sent["reply"]["text"],
        format!("echo: remember {task}"),
        "{sent}"
    );
    ids.push(sent["msg_id"].clone());
    let sent = alice
        .send("w1", &format!("/read {}", file.path().display()), 20)
        .await?;
    assert_eq!(sent["reply"]["text"], reply, "{sent}");
    ids.push(sent["msg_id"].clone());
    let sent = alice.send("w1", &format!("/pwd {on_screen}"), 20).await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    ids.push(sent["msg_id"].clone());
    let (status, shown) = screen(&fleet, &fleet.token("alice")?, "w1").await?;
    assert!(
        status == 200
            && shown["text"]
                .as_str()
                .is_some_and(|t| t.contains(on_screen)),
        "{shown}"
    );
    let failed = alice.send("ws", &format!("/never {stall}"), 20).await?;
    let why = failed["reason"].as_str().unwrap_or_default();
    assert!(
        failed["status"] == "failed" && why.contains(stall),
        "{failed}"
    );
    ids.push(failed["msg_id"].clone());
    let sent = alice
        .send("wd", &format!("/confirm Publish {dialog}?"), 0)
        .await?;
    ids.push(sent["msg_id"].clone());
    until("wd's dialog, shown to alice", LIMIT, || async {
        let entry = alice.entry("wd").await.ok()?;
        entry["dialog"]["prompt"]
            .as_str()?
            .contains(dialog)
            .then_some(())
    })
    .await?;
    // carol's own task of the worker shared with her.
    let sent = carol.send("w1", "carol's own words", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: carol's own words", "{sent}");

    // Everything given to those refused these texts, noted with who was given it: bob's list,
    // poll and refusals first.
    let mut given: Vec<(String, String)> = Vec::new();
    let mut note = |who: &str, what: &str, seen: String| {
        given.push((format!("{who}: {what}"), seen));
    };
    note(
        "bob",
        "fleet_list",
        bob.ok("fleet_list", json!({})).await?.to_string(),
    );
    note(
        "bob",
        "fleet_poll",
        bob.ok("fleet_poll", json!({})).await?.to_string(),
    );
    for to in ["w1", "wd", "ws"] {
        let refused = forbidden(&bob, "fleet_send", json!({"to": to, "message": "hi"})).await?;
        note("bob", "a refused send", refused.to_string());
        let refused = forbidden(&bob, "fleet_stop", json!({"to": to})).await?;
        note("bob", "a refused stop", refused.to_string());
    }
    // carol's list and poll, and her looks at the screens of the workers shared with her.
    note(
        "carol",
        "fleet_list",
        carol.ok("fleet_list", json!({})).await?.to_string(),
    );
    note(
        "carol",
        "fleet_poll",
        carol.ok("fleet_poll", json!({})).await?.to_string(),
    );
    let wd = carol.entry("wd").await?;
    assert!(wd.get("dialog").is_none(), "carol sees the dialog: {wd}");
    // The API, as each of those refused: bob, carol, and both operators. The feed is read up
    // to a worker bob spawns now, after everything else (carol's is not read: whether a lead
    // is told of another lead's workers coming and going is not the point here).
    bob.spawn("sim", "mark-bob").await?;
    for who in ["bob", "carol", "ops", "prom"] {
        let token = fleet.token(who)?;
        for name in ["w1", "wd", "ws"] {
            let (status, body) = screen(&fleet, &token, name).await?;
            assert_eq!(status, 403, "{who} looks at {name}: {body}");
            note(who, "a screen", body.to_string());
        }
        for path in ["/api/v1/roster", "/api/v1/messages?limit=1000"] {
            note(
                who,
                path,
                api(&fleet, &token, path, None).await?.1.to_string(),
            );
        }
        for id in ids.iter().filter_map(Value::as_str) {
            let path = format!("/api/v1/messages/{id}");
            note(
                who,
                "a message",
                api(&fleet, &token, &path, None).await?.1.to_string(),
            );
        }
        if who != "carol" {
            note(who, "the feed", feed(&fleet, &token, "mark-bob").await?);
        }
    }
    let found: Vec<String> = given
        .iter()
        .filter(|(_, seen)| !leaked(seen).is_empty())
        .map(|(what, seen)| format!("{what} holds {:?}: {seen}", leaked(seen)))
        .collect();
    assert!(
        found.is_empty(),
        "secrets given away:\n{}",
        found.join("\n")
    );
    Ok(())
}

/// `[gateway]` lines letting workers work only under `roots`.
fn workdir_roots(roots: &Path) -> String {
    format!("workdir_roots = [{:?}]", roots.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_federation_allow_a_remote_lead_may_not_spawn_task_or_stop_but_replies_and_presence_go()
-> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = host(&vhost.uri(), "hosta", &["alice"], "", "").await?;
    let b = host(&vhost.uri(), "hostb", &["bob"], "", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    // Presence goes both ways.
    alice.spawn("sim", "wa").await?;
    // bob shares wb with alice: still no task of hers, as hostb allows hosta nothing.
    spawn_shared(&bob, "sim", "wb", &["alice@hosta"]).await?;
    sees(&alice, "wb").await?;
    sees(&bob, "wa").await?;
    // hostb may hear of wa (a change) before hosta's whole account, which names alice, comes
    // back to its ask: wait for what the send needs.
    sees(&bob, "alice").await?;
    // A word between leads, and its answer, go: they are no worker's task.
    let said = bob.send("alice@hosta", "a word between leads", 0).await?;
    assert_eq!(texts(&drain(&alice, 1).await?), ["a word between leads"]);
    alice
        .ok(
            "fleet_reply",
            json!({"message": "heard you", "in_reply_to": said["msg_id"]}),
        )
        .await?;
    assert_eq!(texts(&drain(&bob, 1).await?), ["heard you"]);

    // alice's task for wb, her spawn and her stop on hostb: each refused, naming the key.
    let why = refused_task(&alice, "wb", "typed-on-hostb-3a7c").await?;
    assert!(why.contains("federation.allow"), "{why}\n{}", b.log());
    let err = forbidden(
        &alice,
        "fleet_spawn",
        json!({"profile": "sim", "host": "hostb"}),
    )
    .await?;
    assert!(err.message.contains("federation.allow"), "{err}");
    let err = forbidden(&alice, "fleet_stop", json!({"to": "wb"})).await?;
    assert!(err.message.contains("federation.allow"), "{err}");
    // Nothing of them reached hostb: one pane, wb's, idle, the task never typed.
    assert_eq!(b.panes()?.len(), 1, "{}", b.log());
    assert!(!typed(&b, "typed-on-hostb-3a7c")?);
    assert_eq!(until_status(&bob, "wb", "idle").await?["owner"], "bob");
    // Nor the other way: hosta allows hostb nothing either.
    let why = refused_task(&bob, "wa", "typed-on-hosta-5d2e").await?;
    assert!(why.contains("federation.allow"), "{why}\n{}", a.log());
    assert!(!typed(&a, "typed-on-hosta-5d2e")?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_spawn_needs_federation_allow_for_its_lead_and_profile_and_a_cwd_under_the_roots()
-> anyhow::Result<()> {
    let roots = tempfile::tempdir()?;
    let app = roots.path().join("app");
    std::fs::create_dir(&app)?;
    let outside = tempfile::tempdir()?;
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let uri = vhost.uri();
    // hosta: alice and erin. hostb allows hosta nothing; hostc lets it spawn `sim` but has no
    // workdir_roots; hostd lets alice@hosta (not erin) spawn `sim` (not `other`) under its roots,
    // and task and stop her workers.
    let a = host(&uri, "hosta", &["alice", "erin"], "", "").await?;
    let b = host(&uri, "hostb", &["bob"], "", "").await?;
    let allow_c = "[federation.allow.hosta]\nspawn = [\"sim\"]\n";
    let c = host(&uri, "hostc", &["carol"], "", allow_c).await?;
    let allow_d = format!(
        "[federation.allow.\"alice@hosta\"]\nspawn = [\"sim\"]\nsend = true\nstop = true\n\n{}",
        sim_profile("other", &[])?
    );
    let d = host(
        &uri,
        "hostd",
        &["dave"],
        &workdir_roots(roots.path()),
        &allow_d,
    )
    .await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let erin = a.lead("erin", Protocol::Stateless).await?;
    for lead in ["bob", "carol", "dave"] {
        sees(&alice, lead).await?;
        sees(&erin, lead).await?;
    }
    let (app, outside) = (
        app.display().to_string(),
        outside.path().display().to_string(),
    );
    // who, where, what, in which directory: refused, the refusal naming what is missing.
    let refused = [
        (&alice, "hostb", "sim", Some(&app), "federation.allow"),
        (&alice, "hostc", "sim", Some(&app), "workdir_roots"),
        (&alice, "hostd", "sim", Some(&outside), "workdir_roots"),
        (&alice, "hostd", "other", Some(&app), "federation.allow"),
        (&erin, "hostd", "sim", Some(&app), "federation.allow"),
    ];
    for (lead, host, profile, cwd, names) in refused {
        let mut args = json!({"profile": profile, "host": host});
        if let Some(cwd) = cwd {
            args["cwd"] = json!(cwd);
        }
        let err = lead
            .call("fleet_spawn", args.clone())
            .await?
            .err()
            .ok_or_else(|| anyhow::anyhow!("spawned: {args}"))?;
        assert_eq!(err.code, "forbidden", "{args}: {err}");
        assert!(err.message.contains(names), "{args}: {err}");
    }
    for (host, fleet) in [("hostb", &b), ("hostc", &c), ("hostd", &d)] {
        assert!(
            fleet.panes()?.is_empty(),
            "a pane on {host}:\n{}",
            fleet.log()
        );
    }
    // Naming no directory (nor its profile one), hostc (no roots) refuses it; hostd starts it
    // in the first of its roots, never in fleetd's own directory.
    let err = alice
        .call("fleet_spawn", json!({"profile": "sim", "host": "hostc"}))
        .await?
        .expect_err("a spawn on a host without roots");
    assert!(err.message.contains("workdir_roots"), "{err}");
    assert!(c.panes()?.is_empty(), "a pane on hostc:\n{}", c.log());
    alice
        .ok(
            "fleet_spawn",
            json!({"profile": "sim", "name": "home", "host": "hostd"}),
        )
        .await?;
    let pwd = alice.send("home", "/pwd", 20).await?;
    assert_eq!(
        pwd["reply"]["text"].as_str(),
        Some(
            std::fs::canonicalize(roots.path())?
                .display()
                .to_string()
                .as_str()
        ),
        "{pwd}"
    );
    alice.ok("fleet_stop", json!({"to": "home"})).await?;
    until("home's pane to close on hostd", LIMIT, || async {
        d.panes().ok().filter(|p| p.is_empty())
    })
    .await?;
    // All there: alice's `sim` under hostd's roots.
    let spawned = alice
        .ok(
            "fleet_spawn",
            json!({"profile": "sim", "name": "far", "host": "hostd", "cwd": app}),
        )
        .await?;
    assert_eq!(
        (&spawned["host"], &spawned["status"]),
        (&json!("hostd"), &json!("idle"))
    );
    assert_eq!(d.panes()?.len(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_federation_allow_a_remote_lead_runs_its_own_workers_there_and_no_other_leads()
-> anyhow::Result<()> {
    let roots = tempfile::tempdir()?;
    let app = roots.path().join("app");
    std::fs::create_dir(&app)?;
    let vhost = Vhost::create(&Broker::find().await?).await?;
    // hostb lets hosta's leads spawn `sim`, task and stop there; hosta allows hostb nothing.
    let a = host(&vhost.uri(), "hosta", &["alice"], "", "").await?;
    let allow = "[federation.allow.hosta]\nspawn = [\"sim\"]\nsend = true\nstop = true\n";
    let roots_b = workdir_roots(roots.path());
    let b = host(&vhost.uri(), "hostb", &["bob"], &roots_b, allow).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    // bob's own workers there (in its roots, like every worker of hostb): wb, and wb2 shared
    // with alice.
    for (name, share) in [("wb", json!([])), ("wb2", json!(["alice@hosta"]))] {
        let args = json!({"profile": "sim", "name": name, "cwd": app, "share": share});
        bob.ok("fleet_spawn", args).await?;
        sees(&alice, name).await?;
    }

    // alice spawns on hostb; hostb's roster names her, with her host, as its owner.
    let far = alice
        .ok(
            "fleet_spawn",
            json!({"profile": "sim", "name": "far", "host": "hostb", "cwd": app}),
        )
        .await?;
    assert_eq!(far["host"], "hostb", "{far}\n{}", b.log());
    let entry = bob.entry("far").await?;
    assert_eq!(entry["owner"], "alice@hosta", "{entry}");
    assert_eq!(bob.entry("wb").await?["owner"], "bob");
    assert_eq!(shared(&bob.entry("wb2").await?), ["alice@hosta"]);
    // Her task: its question comes back to hosta, which allows hostb nothing (asks and replies
    // need no allow), and her answer goes on to the task's reply.
    let asked = alice.send("far", "/ask 20 which port?", 20).await?;
    assert_eq!(asked["status"], "asked", "{asked}\n{}", b.log());
    let turn = asked["ask"]["turn_id"].clone();
    let answered = alice
        .ok(
            "fleet_send",
            json!({"turn_id": turn, "message": "8080", "wait_s": 20}),
        )
        .await?;
    assert_eq!(
        answered["reply"]["text"], "asked which port?, heard: 8080",
        "{answered}"
    );
    // A worker shared with her by name@host takes her task; bob's own does not.
    let sent = alice.send("wb2", "for a shared worker", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: for a shared worker", "{sent}");
    refused_task(&alice, "wb", "not-hers-to-give-0f4b").await?;
    assert!(!typed(&b, "not-hers-to-give-0f4b")?);
    // She stops neither of bob's; her own she does.
    for name in ["wb", "wb2"] {
        forbidden(&alice, "fleet_stop", json!({"to": name})).await?;
    }
    let stopped = alice.ok("fleet_stop", json!({"to": "far"})).await?;
    assert_eq!(stopped["status"], "gone", "{stopped}");
    until("far's pane on hostb to close", LIMIT, || async {
        (b.panes().ok()?.len() == 2).then_some(())
    })
    .await?;
    assert_eq!(until_status(&bob, "wb", "idle").await?["owner"], "bob");

    // The other way, nothing: hosta has no entry for hostb.
    alice.spawn("sim", "wa").await?;
    sees(&bob, "wa").await?;
    let why = refused_task(&bob, "wa", "typed-on-hosta-9b1d").await?;
    assert!(why.contains("federation.allow"), "{why}");
    let err = forbidden(
        &bob,
        "fleet_spawn",
        json!({"profile": "sim", "host": "hosta"}),
    )
    .await?;
    assert!(err.message.contains("federation.allow"), "{err}");
    assert!(!typed(&a, "typed-on-hosta-9b1d")?);
    Ok(())
}

/// A task of a shared lead's that stops its worker on a dialog: the dialog (screen text) is
/// asked of the owner alone; the shared lead's send says who answers it, and the shared lead
/// gets its own reply once the owner has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_leads_task_stopped_on_a_dialog_waits_for_the_owners_choice() -> anyhow::Result<()>
{
    let (fleet, alice, _bob, carol) = one_host().await?;
    spawn_shared(&alice, "confirm", "wd", &["carol"]).await?;
    // carol waits in her send while the dialog shows and stays unanswered.
    let sender = fleet.lead("carol", Protocol::Stateless).await?;
    let sending =
        tokio::spawn(async move { sender.send("wd", "/confirm Ship the release?", 15).await });
    // The owner is asked, with the prompt and its choices.
    let polled = alice.ok("fleet_poll", json!({"wait_s": 10})).await?;
    let dialog = polled["blocked"][0].clone();
    assert_eq!(dialog["from_name"], "wd", "{polled}");
    assert!(
        dialog["prompt"]
            .as_str()
            .unwrap_or_default()
            .contains("Ship the release? (y/n)"),
        "{dialog}"
    );
    // carol's send ends unanswered, saying who answers the dialog, and nothing of it.
    let sent = sending.await??;
    assert_eq!(sent["status"], "pending", "{sent}");
    assert!(
        sent["note"]
            .as_str()
            .unwrap_or_default()
            .contains("which its owner answers"),
        "{sent}"
    );
    assert!(sent.get("dialog").is_none(), "{sent}");
    alice
        .ok(
            "fleet_send",
            json!({"turn_id": dialog["turn_id"], "choice": "y", "wait_s": 0}),
        )
        .await?;
    // The answer to the task is the shared lead's.
    let got = drain(&carol, 1).await?;
    assert_eq!(
        (got[0]["kind"].as_str(), got[0]["text"].as_str()),
        (Some("REPLY"), Some("chose y")),
        "{got:?}"
    );
    assert!(alice.poll(0).await?.is_empty());
    Ok(())
}
