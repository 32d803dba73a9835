//! The live feed as an operator follows it: `fleetd tail` (its `--json` lines parsed, and its
//! human lines), one message's history and a worker's screen through `/api/v1`.

use std::io::BufRead;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::Fleet;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

/// A `fleetd tail` running against a fleet, its lines read as they come.
struct Tail {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    errors: mpsc::Receiver<String>,
}

/// Sends each line `from` gives to the receiver returned, from a thread of its own.
fn lines_of(from: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Tail {
    async fn start(fleet: &Fleet, args: &[&str]) -> anyhow::Result<Self> {
        let mut child = fleet
            .cli_command(args)?
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            anyhow::bail!("no stdout or stderr");
        };
        let tail = Self {
            child,
            lines: lines_of(stdout),
            seen: Vec::new(),
            errors: lines_of(stderr),
        };
        // The feed is fixed once the gateway answered, which tail says on stderr.
        let said = until("tail to follow the feed", Duration::from_secs(30), || {
            let line = tail.errors.try_recv().ok();
            async move { line }
        })
        .await?;
        anyhow::ensure!(said.contains("following"), "{said}");
        Ok(tail)
    }

    /// Reads lines until `done` holds for what was read so far.
    async fn until(&mut self, what: &str, done: impl Fn(&[String]) -> bool) -> anyhow::Result<()> {
        until(what, Duration::from_secs(30), || {
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            let ok = done(&self.seen);
            async move { ok.then_some(()) }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}; the tail printed:\n{}", self.seen.join("\n")))
    }

    /// The lines read, as JSON.
    fn events(&self) -> Vec<Value> {
        self.seen
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The states `events` show message `msg_id` in, in order.
fn states_of(events: &[Value], msg_id: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["subject"] == "message" && e["msg_id"] == msg_id)
        .filter_map(|e| e["state"].as_str().map(str::to_string))
        .collect()
}

/// The statuses `events` show entity `name` in, in order.
fn statuses_of(events: &[Value], name: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["subject"] == "entity" && e["name"] == name)
        .filter_map(|e| e["status"].as_str().map(str::to_string))
        .collect()
}

async fn get(fleet: &Fleet, token: &str, path: &str) -> anyhow::Result<(u16, Value)> {
    let response = reqwest::Client::new()
        .get(format!("{}{path}", fleet.base()))
        .bearer_auth(token)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follows_a_worker_and_its_task_through_every_state_without_its_text()
-> anyhow::Result<()> {
    let mut fleet = Fleet::start("", &fleet_testkit::fleet::sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let token = fleet.token("lead")?;
    let mut tail = Tail::start(&fleet, &["tail", "--json"]).await?;
    let mut human = Tail::start(&fleet, &["tail"]).await?;
    lead.spawn("sim", "w1").await?;
    tail.until("w1 spawned and idle in the feed", |lines| {
        lines
            .iter()
            .any(|l| l.contains("\"idle\"") && l.contains("\"w1\""))
    })
    .await?;
    let sent = lead
        .ok(
            "fleet_send",
            json!({"to": "w1", "message": "secret words", "wait_s": 20}),
        )
        .await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    let task = sent["msg_id"].as_str().unwrap_or_default().to_string();
    let reply = sent["reply"]["msg_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    tail.until("the reply taken by the lead", |lines| {
        lines
            .iter()
            .any(|l| l.contains(&reply) && l.contains("\"consumed\""))
    })
    .await?;
    // The pump records the task typed beside the reply's way (the reply is the proof of the
    // submit), so the two may reach the feed in either order.
    tail.until("the task recorded as typed", |lines| {
        lines
            .iter()
            .any(|l| l.contains(&task) && l.contains("\"injected\""))
    })
    .await?;
    tail.until("w1 idle again after its task", |lines| {
        let events: Vec<Value> = lines
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        statuses_of(&events, "w1").len() >= 4
    })
    .await?;
    let events = tail.events();
    // Busy with its task and idle after it, told live (the store does not keep them: no seq),
    // each status once.
    assert_eq!(
        statuses_of(&events, "w1")[..4],
        ["spawning", "idle", "busy", "idle"],
        "{events:#?}"
    );
    for e in events
        .iter()
        .filter(|e| e["name"] == "w1" && e["status"] == "busy")
    {
        assert!(e.get("seq").is_none(), "{e}");
    }
    assert_eq!(
        super::from_taken(&states_of(&events, &task)),
        ["injecting", "injected"],
        "every state the task went through, in order: {events:#?}"
    );
    assert_eq!(
        states_of(&events, &reply).last().map(String::as_str),
        Some("consumed")
    );
    let first = events
        .iter()
        .find(|e| e["msg_id"] == task.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&first["kind"], &first["from_name"], &first["to_name"]),
        (&json!("SEND"), &json!("lead"), &json!("w1"))
    );
    let seqs: Vec<i64> = events.iter().filter_map(|e| e["seq"].as_i64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(
        !tail.seen.iter().any(|l| l.contains("secret words")),
        "a message's text never goes into the feed"
    );

    // The same message's history, through the API.
    let (status, history) = get(&fleet, &token, &format!("/api/v1/messages/{task}")).await?;
    assert_eq!(status, 200, "{history}");
    let steps: Vec<&str> = history["history"]
        .as_array()
        .map(|h| h.iter().filter_map(|s| s["state"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        super::from_taken(&steps),
        ["injecting", "injected"],
        "{history}"
    );
    assert_eq!(
        (&history["to_name"], &history["state"]),
        (&json!("w1"), &json!("injected"))
    );
    assert!(history.get("text").is_none(), "{history}");
    for (path, code) in [
        ("/api/v1/messages/not-an-id".to_string(), 400),
        (format!("/api/v1/messages/{}", uuid_like()), 404),
    ] {
        let (status, body) = get(&fleet, &token, &path).await?;
        assert_eq!(status, code, "{path}: {body}");
    }

    // w1's screen, read-only: what the scripted agent printed of its task.
    let (status, screen) = get(&fleet, &token, "/api/v1/screen?name=w1").await?;
    assert_eq!((status, &screen["name"]), (200, &json!("w1")), "{screen}");
    assert!(
        screen["text"]
            .as_str()
            .is_some_and(|t| !t.trim().is_empty()),
        "{screen}"
    );
    let (status, refused) = get(&fleet, &token, "/api/v1/screen?name=lead").await?;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no pane")
    );

    // Stopped: the feed says it went, and the human lines say the same.
    lead.ok("fleet_stop", json!({"to": "w1"})).await?;
    tail.until("w1 gone", |lines| {
        lines
            .iter()
            .any(|l| l.contains("\"w1\"") && l.contains("\"gone\""))
    })
    .await?;
    let statuses = statuses_of(&tail.events(), "w1");
    assert!(
        statuses.windows(2).all(|w| w[0] != w[1]),
        "a status told twice: {statuses:?}"
    );
    human
        .until("w1 gone, in words", |lines| {
            lines
                .iter()
                .any(|l| l.ends_with("entity w1 (worker, sim) gone"))
        })
        .await?;
    assert!(
        human
            .seen
            .iter()
            .any(|l| l.contains(&format!("message SEND lead -> w1 injected {task}"))),
        "{:#?}",
        human.seen
    );
    assert!(
        !human.seen.iter().any(|l| l.contains('\x1b')),
        "no colour when piped"
    );

    // When the gateway goes away, tail says so and exits 3.
    fleet.terminate().await?;
    let status = until("tail to end", Duration::from_secs(20), || {
        let status = tail.child.try_wait().ok().flatten();
        async move { status }
    })
    .await?;
    assert_eq!(status.code(), Some(3));
    Ok(())
}

/// A message id no store holds.
fn uuid_like() -> String {
    "0190f0a0-0000-7000-8000-000000000000".into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_reads_on_from_a_seq_and_is_refused_without_a_leads_token() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &fleet_testkit::fleet::sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    // Without --after the feed starts now; with it, what happened since comes first.
    let mut now = Tail::start(&fleet, &["tail", "--json"]).await?;
    let mut all = Tail::start(&fleet, &["tail", "--json", "--after", "0"]).await?;
    lead.spawn("sim", "w2").await?;
    for tail in [&mut now, &mut all] {
        tail.until("w2 idle", |lines| {
            lines
                .iter()
                .any(|l| l.contains("\"w2\"") && l.contains("\"idle\""))
        })
        .await?;
    }
    assert_eq!(statuses_of(&all.events(), "w1")[..2], ["spawning", "idle"]);
    assert!(
        statuses_of(&now.events(), "w1").is_empty(),
        "{:#?}",
        now.seen
    );
    // A feed ends once its token no longer holds: rotated, an open tail stops (exit 3).
    let out = fleet.cli(&["token", "lead", "--rotate"])?;
    assert!(out.status.success(), "{out:?}");
    let ended = until("the open tail to end", Duration::from_secs(20), || {
        let status = now.child.try_wait().ok().flatten();
        async move { status }
    })
    .await?;
    assert_eq!(ended.code(), Some(3));
    // A token file that is not the gateway's: refused, exit status 4.
    let file = fleet.state_dir().join("leads/lead.token");
    std::fs::write(&file, "fleet_not-the-right-token\n")?;
    let out = fleet.cli(&["tail"])?;
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(String::from_utf8(out.stderr)?.contains("refused lead 'lead'"));
    Ok(())
}
