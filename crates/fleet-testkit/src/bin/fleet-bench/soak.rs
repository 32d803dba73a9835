//! `fleet-bench soak`: crash soak. Two gateways on the broker (alice's host A with a local
//! worker, bob's host B with two), and cycle after cycle mixed traffic from alice (local round
//! trips, cross-host tasks whose replies are held for her, a task whose worker asks her a
//! question mid-task), a `kill -9` of one gateway in the middle of it (A and B in turn) — its
//! workers living on, for the restart to take back (`--workers live`, the default), or killed
//! with it (`--workers die`) — a restart, and an account of every task: answered once, or
//! failed with a `FAILED` notice, or lost. Nothing of fleetd's is trusted for the account: the
//! lead's own polls are. For a task it counts lost, it prints the trail of states each
//! gateway's store recorded for it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_testkit::broker::{Broker, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::keys;
use serde_json::{Value, json};

use super::percentiles;

/// Its options.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Kill-and-restart cycles.
    #[arg(long, default_value_t = 100)]
    cycles: usize,
    /// How long a cycle's tasks have to be answered or failed after the restart, in seconds.
    #[arg(long, default_value_t = 60)]
    settle_s: u64,
    /// What becomes of a killed gateway's workers.
    #[arg(long, value_enum, default_value = "live")]
    workers: Workers,
}

/// What becomes of a killed gateway's workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Workers {
    /// They live on (a crash of fleetd alone): the restart takes them back.
    Live,
    /// They are killed with it (a crash of the host): the restart ends them.
    Die,
}

/// The hosts of the soak's gateways.
const HOSTS: [&str; 2] = ["hosta", "hostb"];

/// How long a gateway's `INJECTED` receipt is awaited (short, so a brief taken by a gateway
/// that dies before typing it fails quickly).
const INJECTED_BOUND_S: u64 = 5;

/// The workers: one on alice's host, two on bob's.
const LOCAL: &str = "wa";
const REMOTE: [&str; 2] = ["wb1", "wb2"];

/// What became of one task, as its lead saw it.
#[derive(Debug, Default)]
struct Fate {
    /// What the task was (for the report).
    what: String,
    /// The ids of the distinct replies that answered it, with how often each came.
    replies: BTreeMap<String, usize>,
    /// How often a `FAILED` notice about it came.
    failed: usize,
    /// What the first `FAILED` notice said.
    why: Option<String>,
}

/// The account of every task sent: the pure part of the soak.
#[derive(Debug, Default)]
struct Ledger {
    tasks: BTreeMap<String, Fate>,
}

/// What the ledger adds up to.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    /// Tasks sent.
    sent: usize,
    /// Answered by exactly one reply, delivered once.
    answered: usize,
    /// Failed with a notice and never answered.
    failed: usize,
    /// Neither answered nor failed: lost without a word.
    lost: usize,
    /// A reply delivered to the lead more than once (the same reply id again).
    duplicated: usize,
    /// Answered by two different replies: the task was typed in twice.
    typed_twice: usize,
    /// Told failed, and answered all the same.
    failed_but_answered: usize,
}

impl Ledger {
    /// Notes task `msg_id` sent.
    fn sent(&mut self, msg_id: &str, what: &str) {
        self.tasks.entry(msg_id.to_string()).or_default().what = what.to_string();
    }

    /// Notes a message the lead got: a reply or a notice about a tracked task (others are
    /// not the ledger's).
    fn got(&mut self, message: &Value) {
        let about = message["in_reply_to"].as_str().unwrap_or_default();
        let Some(fate) = self.tasks.get_mut(about) else {
            return;
        };
        match message["kind"].as_str() {
            Some("REPLY") => {
                let id = message["msg_id"].as_str().unwrap_or_default().to_string();
                *fate.replies.entry(id).or_insert(0) += 1;
            }
            Some("FAILED") => {
                fate.failed += 1;
                if fate.why.is_none() {
                    fate.why = message["text"].as_str().map(str::to_string);
                }
            }
            _ => {}
        }
    }

    /// Notes what the send of a task returned: it may carry the task's answer already (one
    /// that came before the send returned, even with `wait_s` 0), which nothing else brings.
    fn send_returned(&mut self, sent: &Value) {
        match sent["status"].as_str() {
            Some("replied") => self.got(&sent["reply"]),
            Some("failed") => self.got(&json!({
                "kind": "FAILED",
                "in_reply_to": sent["msg_id"],
                "text": sent["reason"],
            })),
            _ => {}
        }
    }

    /// Notes what the send of an answer to a worker's question returned: the worker's reply to
    /// its task, when it came before the send returned. (Its failure is the answer's, not the
    /// task's: the task is answered or failed by what follows.)
    fn turn_answered(&mut self, sent: &Value) {
        if sent["status"] == "replied" {
            self.got(&sent["reply"]);
        }
    }

    /// Whether every task of `ids` is answered or failed.
    fn settled(&self, ids: &[String]) -> bool {
        ids.iter().all(|id| {
            self.tasks
                .get(id)
                .is_some_and(|f| !f.replies.is_empty() || f.failed > 0)
        })
    }

    /// What it adds up to.
    fn tally(&self) -> Tally {
        let mut tally = Tally {
            sent: self.tasks.len(),
            ..Tally::default()
        };
        for fate in self.tasks.values() {
            let answered = !fate.replies.is_empty();
            if fate.replies.values().any(|n| *n > 1) {
                tally.duplicated += 1;
            }
            if fate.replies.len() > 1 {
                tally.typed_twice += 1;
            }
            match (answered, fate.failed > 0) {
                (true, true) => tally.failed_but_answered += 1,
                (true, false) => tally.answered += 1,
                (false, true) => tally.failed += 1,
                (false, false) => tally.lost += 1,
            }
        }
        tally
    }

    /// The tasks told failed.
    fn failed(&self) -> Vec<(&String, &Fate)> {
        self.tasks.iter().filter(|(_, f)| f.failed > 0).collect()
    }

    /// The tasks that came to something other than one answer or one failure.
    fn troubled(&self) -> Vec<(&String, &Fate)> {
        self.tasks
            .iter()
            .filter(|(_, f)| {
                f.replies.len() + usize::from(f.failed > 0) != 1
                    || f.replies.values().any(|n| *n > 1)
            })
            .collect()
    }
}

/// A gateway of the soak: `host` with lead `lead` and the scripted agent, quick presence and
/// receipts.
async fn gateway(uri: &str, host: &str, lead: &str) -> anyhow::Result<Fleet> {
    Fleet::start_as(
        host,
        "",
        &format!(
            "[leads.{lead}]\nshare = [\"alice@hosta\", \"bob@hostb\"]\n\n{}\n[broker]\nuri = \"{uri}\"\nheartbeat_s = 5\n\n[federation]\npresence_interval_s = 1\npresence_ttl_s = 3\ninjected_bound_s = {INJECTED_BOUND_S}\n{}",
            sim_profile("sim", &[])?,
            keys::admitting(&HOSTS)
        ),
    )
    .await
}

/// Spawns (through `lead`) each of `names` the lead's host does not run, and waits until
/// `watcher` (a lead elsewhere, or the same) sees each by its new gid.
async fn ensure_workers(lead: &Client, names: &[&str], watcher: &Client) -> anyhow::Result<()> {
    let running = lead.names().await?;
    for name in names {
        if running.iter().any(|n| n == name) {
            continue;
        }
        let spawned = lead.spawn("sim", name).await?;
        let gid = spawned["gid"].as_str().unwrap_or_default().to_string();
        let started = Instant::now();
        loop {
            let seen = watcher.heard_entry(name).await.ok();
            if seen.is_some_and(|e| e["gid"] == gid.as_str()) {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "'{name}' ({gid}) never showed in the roster"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// One poll of `lead`'s: every message noted, every ask answered (without waiting for the
/// task's reply).
async fn poll_once(lead: &Client, ledger: &mut Ledger) -> anyhow::Result<()> {
    let polled = lead.ok("fleet_poll", json!({"wait_s": 1})).await?;
    for message in polled["messages"].as_array().into_iter().flatten() {
        ledger.got(message);
    }
    for ask in polled["asks"].as_array().into_iter().flatten() {
        // Too late or gone by now is the worker's business: it replies either way. The answer's
        // send may return the worker's reply to its task already (it arrived while the answer
        // was being published): that reply reaches nobody else, so it is noted here.
        let answered = lead
            .call(
                "fleet_send",
                json!({"turn_id": ask["turn_id"], "message": "go on", "wait_s": 0}),
            )
            .await?;
        if let Ok(answered) = answered {
            ledger.turn_answered(&answered);
        }
    }
    Ok(())
}

/// Sends one cycle's traffic from `alice`: two local tasks, four cross-host ones, one that
/// asks her mid-task. Their ids, each noted in `ledger`.
async fn traffic(alice: &Client, cycle: usize, ledger: &mut Ledger) -> anyhow::Result<Vec<String>> {
    let mut tasks = Vec::new();
    for i in 0..2 {
        tasks.push((LOCAL, format!("/slow {} c{cycle} local {i}", 50 + 100 * i)));
    }
    for (i, to) in REMOTE.iter().chain(REMOTE.iter()).enumerate() {
        tasks.push((*to, format!("/slow {} c{cycle} cross {i}", 100 * i)));
    }
    tasks.push((REMOTE[0], format!("/ask 5 c{cycle} may I?")));
    let mut ids = Vec::new();
    for (to, task) in tasks {
        let sent = alice.send(to, &task, 0).await?;
        let id = sent["msg_id"]
            .as_str()
            .with_context(|| format!("{task} to {to}: {sent}"))?
            .to_string();
        ledger.sent(&id, &format!("{task} → {to}"));
        ledger.send_returned(&sent);
        ids.push(id);
    }
    Ok(ids)
}

/// Restarts `fleet` after its kill: how long until it answered `/healthz`, and until its
/// broker link was up again.
async fn restart(fleet: &mut Fleet) -> anyhow::Result<(Duration, Duration)> {
    let ups = fleet.links_up();
    let started = Instant::now();
    fleet.launch().await?;
    let healthy = started.elapsed();
    while fleet.links_up() <= ups {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the restarted gateway's broker link never came up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok((healthy, started.elapsed()))
}

/// Runs it.
pub(super) async fn run(args: Args) -> anyhow::Result<()> {
    let vhost = Vhost::create(&Broker::find().await?).await?;
    let uri = vhost.uri();
    println!(
        "fleet-bench soak --cycles {} --workers {} ({} build; broker vhost {}): each cycle sends 7 tasks from alice on hosta (2 to a local worker, 4 to two workers on hostb, 1 that asks her mid-task), kills -9 hosta or hostb (in turn) while they run ({}), restarts it, and waits up to {} s for every task to be answered or failed",
        args.cycles,
        match args.workers {
            Workers::Live => "live",
            Workers::Die => "die",
        },
        super::BUILD,
        vhost.name(),
        match args.workers {
            Workers::Live => "its workers living on",
            Workers::Die => "its workers killed with it",
        },
        args.settle_s
    );
    let mut a = gateway(&uri, HOSTS[0], "alice").await?;
    let mut b = gateway(&uri, HOSTS[1], "bob").await?;
    let mut alice = a.lead("alice", Protocol::Stateless).await?;
    let mut bob = b.lead("bob", Protocol::Stateless).await?;
    let mut ledger = Ledger::default();
    let (mut healthy, mut linked) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for cycle in 0..args.cycles {
        ensure_workers(&alice, &[LOCAL], &alice).await?;
        ensure_workers(&bob, &REMOTE, &alice).await?;
        let ids = traffic(&alice, cycle, &mut ledger).await?;
        // The kill lands somewhere in the traffic: 0 to 450 ms after it was sent.
        let delay = Duration::from_millis((cycle as u64 * 37) % 450);
        tokio::time::sleep(delay).await;
        let victim = if cycle.is_multiple_of(2) {
            &mut a
        } else {
            &mut b
        };
        victim.kill9().await?;
        if args.workers == Workers::Die {
            for pane in victim.panes()? {
                victim.kill_pane_program(&pane)?;
            }
        }
        let (up, link) = restart(victim).await?;
        healthy.push(up);
        linked.push(link);
        if cycle.is_multiple_of(2) {
            alice = a.lead("alice", Protocol::Stateless).await?;
        } else {
            bob = b.lead("bob", Protocol::Stateless).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(args.settle_s);
        while !ledger.settled(&ids) && Instant::now() < deadline {
            poll_once(&alice, &mut ledger).await?;
        }
        // One more look, for anything that would come twice.
        poll_once(&alice, &mut ledger).await?;
        let tally = ledger.tally();
        println!(
            "cycle {cycle:>3} (killed {}, {} ms in): restart → healthy {} ms, → broker link {} ms; so far {tally:?}",
            HOSTS[cycle % 2],
            delay.as_millis(),
            up.as_millis(),
            link.as_millis()
        );
    }
    // Whatever is still held for alice.
    for _ in 0..3 {
        poll_once(&alice, &mut ledger).await?;
    }
    let tally = ledger.tally();
    let (healthy50, healthy99) = percentiles(&mut healthy);
    let (linked50, linked99) = percentiles(&mut linked);
    let max = |samples: &[Duration]| samples.iter().max().map_or(0, Duration::as_millis);
    println!(
        "soak: {} cycles in {:.0} s, {} tasks",
        args.cycles,
        started.elapsed().as_secs_f64(),
        tally.sent
    );
    println!("  answered once: {}", tally.answered);
    println!(
        "  failed with a FAILED notice (in flight on a killed gateway): {}",
        tally.failed
    );
    println!("  lost without a FAILED: {}  [target 0]", tally.lost);
    if args.workers == Workers::Live {
        println!(
            "  failed though their workers lived: {}  [target 0]",
            tally.failed + tally.failed_but_answered
        );
    }
    println!("  replies duplicated: {}  [target 0]", tally.duplicated);
    println!("  briefs typed twice: {}  [target 0]", tally.typed_twice);
    println!(
        "  told FAILED yet answered: {}  [target 0]",
        tally.failed_but_answered
    );
    println!(
        "  restart → /healthz 200: p50 {healthy50:.0} ms, p99 {healthy99:.0} ms, max {} ms; → broker link up (inboxes attached): p50 {linked50:.0} ms, p99 {linked99:.0} ms, max {} ms",
        max(&healthy),
        max(&linked)
    );
    if args.workers == Workers::Live {
        println!(
            "  being typed at a kill, settled from the pane by the restart: {}",
            settled_typing(&[&a, &b])
        );
    }
    if args.workers == Workers::Live {
        // With the workers living on, a failure is a failure to take back: say each.
        for (id, fate) in ledger.failed().into_iter().take(20) {
            println!(
                "  failed {id}: {} — {}",
                fate.what,
                fate.why.as_deref().unwrap_or("?")
            );
            for (host, fleet) in HOSTS.iter().zip([&a, &b]) {
                println!(
                    "    {host}: {}",
                    fleet.trail(id).unwrap_or_else(|e| e.to_string())
                );
            }
        }
    }
    for (id, fate) in ledger.troubled().into_iter().take(20) {
        println!("  {id}: {} — {fate:?}", fate.what);
        if fate.replies.is_empty() && fate.failed == 0 {
            for (host, fleet) in HOSTS.iter().zip([&a, &b]) {
                println!(
                    "    {host}: {}",
                    fleet.trail(id).unwrap_or_else(|e| e.to_string())
                );
            }
        }
    }
    Ok(())
}

/// How many tasks the restarts of `fleets` found still being typed, by what their panes showed
/// (fleetd logs each such task's verdict).
fn settled_typing(fleets: &[&Fleet]) -> String {
    let mut verdicts = BTreeMap::<String, usize>::new();
    for fleet in fleets {
        for line in fleet.log().lines() {
            if !line.contains("a task the previous run was typing") {
                continue;
            }
            let verdict = line
                .split_whitespace()
                .find_map(|word| word.strip_prefix("verdict="))
                .and_then(|verdict| verdict.split('(').next())
                .unwrap_or("?");
            *verdicts.entry(verdict.to_string()).or_default() += 1;
        }
    }
    let total: usize = verdicts.values().sum();
    let each: Vec<String> = verdicts.iter().map(|(v, n)| format!("{v} {n}")).collect();
    if each.is_empty() {
        "0".to_string()
    } else {
        format!("{total} ({})", each.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(about: &str, id: &str) -> Value {
        json!({"kind": "REPLY", "in_reply_to": about, "msg_id": id})
    }

    fn failed(about: &str) -> Value {
        json!({"kind": "FAILED", "in_reply_to": about, "msg_id": format!("{about}-failed")})
    }

    #[test]
    fn every_task_is_counted_once_by_what_became_of_it() {
        let mut ledger = Ledger::default();
        for id in [
            "ok", "failed", "lost", "dup", "twice", "both", "at once", "refused",
        ] {
            ledger.sent(id, id);
        }
        // Answered before its send returned, and failed at once: the send's result says so.
        ledger.send_returned(
            &json!({"status": "replied", "msg_id": "at once", "reply": reply("at once", "r7")}),
        );
        ledger.send_returned(&json!({"status": "failed", "msg_id": "refused", "reason": "gone"}));
        ledger.send_returned(&json!({"status": "pending", "msg_id": "lost"}));
        // A task whose worker asked: the answer's send returned the task's reply at once.
        ledger.sent("asked", "asked");
        ledger.turn_answered(&json!({"status": "replied", "msg_id": "answer-1",
            "reply": reply("asked", "r8")}));
        ledger.turn_answered(
            &json!({"status": "failed", "msg_id": "answer-2", "reason": "too late"}),
        );
        ledger.got(&reply("ok", "r1"));
        ledger.got(&failed("failed"));
        ledger.got(&reply("dup", "r2"));
        ledger.got(&reply("dup", "r2"));
        ledger.got(&reply("twice", "r3"));
        ledger.got(&reply("twice", "r4"));
        ledger.got(&failed("both"));
        ledger.got(&reply("both", "r5"));
        // Not a task of the ledger's, and a notice of another kind: neither counts.
        ledger.got(&reply("elsewhere", "r6"));
        ledger.got(&json!({"kind": "INJECTED", "in_reply_to": "lost"}));
        assert_eq!(
            ledger.tally(),
            Tally {
                sent: 9,
                answered: 5,
                failed: 2,
                lost: 1,
                duplicated: 1,
                typed_twice: 1,
                failed_but_answered: 1,
            }
        );
        let troubled: Vec<&String> = ledger.troubled().into_iter().map(|(id, _)| id).collect();
        assert_eq!(troubled, ["both", "dup", "lost", "twice"]);
        let failed: Vec<&String> = ledger.failed().into_iter().map(|(id, _)| id).collect();
        assert_eq!(failed, ["both", "failed", "refused"]);
        assert!(!ledger.settled(&["ok".into(), "lost".into()]));
        assert!(ledger.settled(&["ok".into(), "failed".into()]));
        assert!(ledger.settled(&["at once".into(), "refused".into()]));
    }
}
