//! Logs are for operators, not for text: every kind of text one host handles — a task, a reply,
//! an ask and its answer, a broadcast, a consult's brief, a dialog's prompt and the choice
//! that answers it, a stalled worker's screen, a worker's last words — carries a secret of its
//! own and, where it may hold a line break, a forged log line. fleetd (with `log_text = true`,
//! its log at DEBUG: the text may only show at TRACE) must log none of the secrets and no line
//! that starts with the forged one, and must still log that the texts were there, as a length
//! and a digest.

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(20);

/// The line a worker's text would forge in the log, were it logged raw.
const FORGED: &str = "INFO fleetd: forged line";

/// `secret` followed by the forged line on a line of its own.
fn with_forged(secret: &str) -> String {
    format!("{secret}\n{FORGED}")
}

/// A program ready by its marker that prints its last words (a secret and the forged line),
/// then sits there until it is killed.
fn last_words_profile(name: &str, secret: &str) -> String {
    format!(
        "[[profiles]]\nname = \"{name}\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo LW-READY; printf '%s\\\\n%s\\\\n' '{secret}' '{FORGED}'; exec sleep 600\"]\nready_marker = \"LW-READY\"\nready_timeout_s = 20\n"
    )
}

/// The pane of `name`, as `lead` sees it.
async fn pane_of(lead: &Client, name: &str) -> anyhow::Result<String> {
    lead.entry(name).await?["pane"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("{name} has no pane"))
}

/// The text of the reply in `sent` (a `fleet_send` that waited for it).
fn reply_text(sent: &Value) -> &str {
    sent["reply"]["text"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_text_of_a_worker_or_a_lead_reaches_the_log() -> anyhow::Result<()> {
    let task = "SECRET-TASK-7f3a";
    let reply = "SECRET-REPLY-2b91";
    let ask = "SECRET-ASK-c04e";
    let answer = "SECRET-ANSWER-58d2";
    let broadcast = "SECRET-BROADCAST-e6a7";
    let brief = "SECRET-BRIEF-13f0";
    let dialog = "SECRET-DIALOG-9a4b";
    let stall = "SECRET-STALL-0d6c";
    let last_words = "SECRET-LASTWORDS-71e5";
    let dir = tempfile::tempdir()?;
    let config = format!(
        "{}{}blocked_markers = [\"(y/n)\"]\n{}stall_after_s = 1\non_stall = \"recycle\"\n{}[architects]\nslots = [{{ name = \"arch\", profile = \"sim\" }}]\n",
        sim_profile("sim", &[])?,
        sim_profile("confirm", &[])?,
        sim_profile("stall", &[])?,
        last_words_profile("last", last_words),
    );
    let fleet = Fleet::start("log_text = true", &config).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;

    // A broadcast, while w1 is the only worker to get it.
    let sent = lead
        .ok(
            "fleet_broadcast",
            json!({"message": with_forged(broadcast)}),
        )
        .await?;
    assert_eq!(sent["copies"], 1, "{sent}");
    let echoed = lead.poll(20).await?;
    assert!(
        echoed[0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains(broadcast),
        "{echoed:?}"
    );
    // A task, and a reply of its own (w1 reads it from a file).
    let sent = lead.send("w1", &with_forged(task), 20).await?;
    assert!(reply_text(&sent).contains(task), "{sent}");
    let file = dir.path().join("reply.txt");
    std::fs::write(&file, with_forged(reply))?;
    let sent = lead
        .send("w1", &format!("/read {}", file.display()), 20)
        .await?;
    assert_eq!(reply_text(&sent), with_forged(reply), "{sent}");
    // An ask and its answer.
    let sent = lead
        .send("w1", &format!("/ask 20 {}", with_forged(ask)), 20)
        .await?;
    assert_eq!(sent["status"], "asked", "{sent}");
    let answered = lead
        .ok(
            "fleet_send",
            json!({"turn_id": sent["ask"]["turn_id"], "message": with_forged(answer), "wait_s": 20}),
        )
        .await?;
    assert!(reply_text(&answered).contains(answer), "{answered}");
    // A consult's brief, to one architect.
    let consulted = lead
        .ok(
            "fleet_consult",
            json!({"brief": with_forged(brief), "wait_s": 20}),
        )
        .await?;
    assert_eq!(consulted["answers"][0]["status"], "answered", "{consulted}");
    // A dialog on a worker's screen, and the choice that answers it.
    lead.spawn("confirm", "wd").await?;
    let blocked = lead.send("wd", &format!("/confirm {dialog}"), 20).await?;
    assert_eq!(blocked["status"], "blocked", "{blocked}");
    let chosen = lead
        .ok(
            "fleet_send",
            json!({"turn_id": blocked["turn_id"], "choice": "y", "wait_s": 20}),
        )
        .await?;
    assert_eq!(reply_text(&chosen), "chose y", "{chosen}");
    // A stalled worker's screen, which fails its task (recycled).
    lead.spawn("stall", "ws").await?;
    let failed = lead
        .send("ws", &format!("/never {}", with_forged(stall)), 20)
        .await?;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(
        failed["reason"]
            .as_str()
            .unwrap_or_default()
            .contains(stall),
        "{failed}"
    );
    // A worker's last words, when its program is killed.
    lead.spawn("last", "wl").await?;
    let pane = pane_of(&lead, "wl").await?;
    fleet.kill_pane_program(&pane)?;
    let ended_line = |log: &str| {
        log.lines()
            .find(|l| l.contains("pane ended") && l.contains(&format!("pane={pane} ")))
            .map(str::to_string)
    };
    let ended = until("wl's pane to be seen ended", LIMIT, || async {
        ended_line(&fleet.log())
    })
    .await?;

    let log = fleet.log();
    for secret in [
        task, reply, ask, answer, broadcast, brief, dialog, stall, last_words,
    ] {
        assert!(!log.contains(secret), "{secret} is in the log:\n{log}");
    }
    let forged: Vec<&str> = log
        .lines()
        .filter(|line| line.trim_start().starts_with(FORGED))
        .collect();
    assert!(
        forged.is_empty(),
        "forged lines {forged:?} in the log:\n{log}"
    );
    // Logging did not simply stop: the texts are there as a length and a digest.
    assert!(
        ended.contains("last_words=len="),
        "wl's last words are not summarised: {ended}"
    );
    assert!(log.contains(" digest="), "{log}");
    Ok(())
}
