//! The partition scenario's account, pure: what the lead saw of every task ([`Book`]: its send,
//! its replies and `FAILED` notices, when each came) and what the workers' own task log says
//! was typed, added up into a [`Ledger`] with what the issue's "done when" forbids
//! ([`Ledger::violations`]). Nothing of fleetd's account is trusted: times are the test's and
//! the workers' clocks (one machine, Unix milliseconds).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use serde_json::Value;

/// How far past one presence interval the roster may take to converge after healing: the
/// watcher's sampling and the machine's load.
pub const CONVERGENCE_SLACK: Duration = Duration::from_secs(1);

/// How many never-ended task numbers the ledger names.
const SAMPLE: usize = 12;

/// What the send of a task returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// The call has not returned yet.
    Open,
    /// Taken: `pending` in this state (or `replied`, `failed`: the answer came with it).
    Accepted(String),
    /// Refused with a tool error.
    Refused {
        /// Its code.
        code: String,
        /// Its sentence.
        message: String,
    },
    /// The call itself broke or took too long: no answer from the lead's gateway.
    Broken(String),
}

/// One task, as the lead and the workers saw it.
#[derive(Clone, Debug)]
pub struct Task {
    /// The worker it was sent to.
    pub worker: String,
    /// When the send was made.
    pub sent_ms: i64,
    /// What the send returned.
    pub send: SendOutcome,
    /// Its message id, once the send returned one.
    pub msg_id: Option<String>,
    /// The replies that came for it: their ids and when each came.
    pub replies: Vec<(String, i64)>,
    /// The `FAILED` notices that came for it: what each said and when it came.
    pub failed: Vec<(String, i64)>,
    /// When a worker's program got it (its task log), as often as it did.
    pub typed: Vec<i64>,
}

impl Task {
    /// Whether it ended: answered, failed, or refused at its send.
    pub fn ended(&self) -> bool {
        !self.replies.is_empty()
            || !self.failed.is_empty()
            || matches!(self.send, SendOutcome::Refused { .. })
    }
}

/// What the lead saw of every task, as it happened.
#[derive(Debug, Default)]
pub struct Book {
    /// The tasks, by number.
    tasks: BTreeMap<u64, Task>,
    /// Task numbers by message id.
    ids: HashMap<String, u64>,
    /// Notices about a message id not yet known (they came before their send returned), with
    /// when each came.
    early: Vec<(Value, i64)>,
    /// Messages the lead got about no task of the scenario.
    stray: usize,
}

/// The task number in a task's text (`task 7`, `/slow 2000 task 7`) or in its echo
/// (`echo: task 7`).
pub fn task_number(text: &str) -> Option<u64> {
    text.rsplit_once("task ")?.1.trim().parse().ok()
}

impl Book {
    /// Notes task `number` sent to `worker` at `at_ms`, its call still open.
    pub fn sent(&mut self, number: u64, worker: &str, at_ms: i64) {
        self.tasks.insert(
            number,
            Task {
                worker: worker.to_string(),
                sent_ms: at_ms,
                send: SendOutcome::Open,
                msg_id: None,
                replies: Vec::new(),
                failed: Vec::new(),
                typed: Vec::new(),
            },
        );
    }

    /// Notes what the send of task `number` returned at `at_ms`: the call's result
    /// (`Ok(result)`, or a tool error's code and sentence), or why there is none.
    pub fn send_returned(
        &mut self,
        number: u64,
        returned: Result<Result<Value, (String, String)>, String>,
        at_ms: i64,
    ) {
        let Some(task) = self.tasks.get_mut(&number) else {
            return;
        };
        match returned {
            Err(why) => task.send = SendOutcome::Broken(why),
            Ok(Err((code, message))) => task.send = SendOutcome::Refused { code, message },
            Ok(Ok(result)) => {
                let status = result["status"].as_str().unwrap_or_default();
                let state = result["state"].as_str().unwrap_or(status);
                task.send = SendOutcome::Accepted(state.to_string());
                if let Some(id) = result["msg_id"].as_str() {
                    task.msg_id = Some(id.to_string());
                    self.ids.insert(id.to_string(), number);
                }
                // An answer may come with the send itself, even with `wait_s` 0.
                match status {
                    "replied" => self.got(&result["reply"], at_ms),
                    "failed" => self.got(
                        &serde_json::json!({
                            "kind": "FAILED",
                            "in_reply_to": result["msg_id"],
                            "text": result["reason"],
                        }),
                        at_ms,
                    ),
                    _ => {}
                }
                // Notices that came before this id was known are about it, perhaps.
                for (message, at) in std::mem::take(&mut self.early) {
                    self.got(&message, at);
                }
            }
        }
    }

    /// Notes a message the lead got at `at_ms`: a reply or a `FAILED` notice about a task
    /// (found by the message it answers, or a reply by its echoed text).
    pub fn got(&mut self, message: &Value, at_ms: i64) {
        let about = message["in_reply_to"].as_str().unwrap_or_default();
        let text = message["text"].as_str().unwrap_or_default();
        let kind = message["kind"].as_str().unwrap_or_default();
        let number = self.ids.get(about).copied().or_else(|| {
            (kind == "REPLY")
                .then(|| task_number(text))
                .flatten()
                .filter(|n| self.tasks.contains_key(n))
        });
        let Some(task) = number.and_then(|n| self.tasks.get_mut(&n)) else {
            if kind == "FAILED" && self.tasks.values().any(|t| t.msg_id.is_none()) {
                self.early.push((message.clone(), at_ms));
            } else {
                self.stray += 1;
            }
            return;
        };
        match kind {
            "REPLY" => {
                let id = message["msg_id"].as_str().unwrap_or_default().to_string();
                task.replies.push((id, at_ms));
            }
            "FAILED" => task.failed.push((text.to_string(), at_ms)),
            _ => self.stray += 1,
        }
    }

    /// Notes a line of the workers' task log (`{"ms", "worker", "task"}`); lines about other
    /// texts (a warm-up) are not the ledger's.
    pub fn typed(&mut self, line: &str) {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            return;
        };
        let (Some(ms), Some(number)) = (
            entry["ms"].as_i64(),
            entry["task"].as_str().and_then(task_number),
        ) else {
            return;
        };
        if let Some(task) = self.tasks.get_mut(&number) {
            task.typed.push(ms);
        }
    }

    /// Whether every task sent has ended.
    pub fn all_ended(&self) -> bool {
        self.tasks.values().all(Task::ended)
    }

    /// The tasks, by number.
    pub fn tasks(&self) -> &BTreeMap<u64, Task> {
        &self.tasks
    }
}

/// What the scenario saw besides the tasks.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// How long host-b was cut off (`None`: the baseline).
    pub partition: Option<Duration>,
    /// When the link went down (Unix ms).
    pub down_ms: Option<i64>,
    /// When the link came up again (Unix ms).
    pub up_ms: Option<i64>,
    /// The roster watcher's samples: when, whether the lead saw every worker live, whether
    /// host-b's lead saw the lead live.
    pub roster: Vec<(i64, bool, bool)>,
    /// Per worker, what the check after the traffic found, when it found anything wrong.
    pub workers: Vec<String>,
    /// How many times host-b logged its broker link down.
    pub link_downs: usize,
    /// How many times host-b logged its broker link up.
    pub link_ups: usize,
    /// Connections the forwarder carried for host-b.
    pub forwarded: usize,
    /// The presence interval: the roster must converge within one of healing.
    pub heartbeat: Duration,
    /// When the last task was sent (Unix ms).
    pub last_send_ms: i64,
    /// When the wait for every task to end stopped (Unix ms).
    pub settled_ms: i64,
}

/// What a run adds up to.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// How long host-b was cut off (`None`: no partition).
    pub partition: Option<Duration>,
    /// Tasks sent.
    pub sent: usize,
    /// Answered by one reply, delivered once, and not failed.
    pub answered_once: usize,
    /// Replies delivered for it more than once (the same reply again, or several replies).
    pub answered_more: usize,
    /// Failed with a notice, never answered.
    pub failed: usize,
    /// The `FAILED` reasons (numbers and names blanked out), with how many tasks each.
    pub reasons: BTreeMap<String, usize>,
    /// Told `FAILED` more than once.
    pub failed_more: usize,
    /// Told `FAILED` with an empty reason.
    pub failed_without_reason: usize,
    /// Told `FAILED` and answered all the same.
    pub answered_and_failed: usize,
    /// What those were told, by reason (as [`Ledger::reasons`]).
    pub answered_and_failed_reasons: BTreeMap<String, usize>,
    /// Refused at the send, by error code: how many, and one of the sentences.
    pub refused: BTreeMap<String, (usize, String)>,
    /// Sends whose call broke or never returned.
    pub send_broken: usize,
    /// Neither answered nor failed nor refused by the end.
    pub never_ended: usize,
    /// Some of those, by number.
    pub never_ended_sample: Vec<u64>,
    /// Typed into a worker more than once.
    pub typed_twice: usize,
    /// Typed into a worker after its `FAILED` notice reached the lead.
    pub typed_after_failed: usize,
    /// Typed at all.
    pub typed: usize,
    /// Messages the lead got about no task of the run.
    pub stray: usize,
    /// What the check of the workers after the traffic found wrong, per worker.
    pub workers: Vec<String>,
    /// From the link going down to the lead no longer seeing host-b's workers live.
    pub roster_lost: Option<Duration>,
    /// From healing to both leads seeing each other's side live again.
    pub roster_converged: Option<Duration>,
    /// From healing to the first reply to a task sent after it.
    pub recovery: Option<Duration>,
    /// The presence interval.
    pub heartbeat: Duration,
    /// How long after the last send the last task ended (or the wait gave up).
    pub settled_in: Duration,
    /// How many times host-b logged its broker link down.
    pub link_downs: usize,
    /// How many times host-b logged its broker link up.
    pub link_ups: usize,
    /// Connections the forwarder carried for host-b.
    pub forwarded: usize,
}

/// The most characters of a `FAILED` reason a row's label shows.
const REASON_SHOWN: usize = 80;

/// `reason`, cut to [`REASON_SHOWN`] characters (a row's label, beside other runs' figures).
fn shortened(reason: &str) -> String {
    if reason.chars().count() <= REASON_SHOWN {
        return reason.to_string();
    }
    let cut: String = reason.chars().take(REASON_SHOWN - 1).collect();
    format!("{cut}…")
}

/// `later - earlier` milliseconds as a duration (zero if negative).
fn since(earlier: i64, later: i64) -> Duration {
    Duration::from_millis(u64::try_from(later - earlier).unwrap_or(0))
}

/// A `FAILED` reason with what differs between tasks blanked out: quoted names (`'w1@hostb'`,
/// not the apostrophe of `recipient's`) and words holding a digit (numbers, ids).
pub fn reason_kind(reason: &str) -> String {
    let chars: Vec<char> = reason.chars().collect();
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.chars().any(|c| c.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        // A quote after a non-letter opens a name, which a quote before a non-letter closes.
        let opens = c == '\'' && (i == 0 || !chars[i - 1].is_alphanumeric());
        let closing = chars[i + 1..].iter().enumerate().position(|(j, &q)| {
            q == '\''
                && !chars
                    .get(i + j + 2)
                    .is_some_and(|next| next.is_alphanumeric())
        });
        if let (true, Some(len)) = (opens, closing) {
            flush(&mut word, &mut out);
            out.push_str("'…'");
            i += len + 2;
            continue;
        }
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '\'') {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
        i += 1;
    }
    flush(&mut word, &mut out);
    out
}

impl Ledger {
    /// Adds up `book` and `facts`.
    pub fn of(book: &Book, facts: &Facts) -> Ledger {
        let mut ledger = Ledger {
            partition: facts.partition,
            sent: book.tasks.len(),
            stray: book.stray,
            workers: facts.workers.clone(),
            heartbeat: facts.heartbeat,
            settled_in: since(facts.last_send_ms, facts.settled_ms),
            link_downs: facts.link_downs,
            link_ups: facts.link_ups,
            forwarded: facts.forwarded,
            ..Ledger::default()
        };
        for (number, task) in &book.tasks {
            let (answered, failed) = (!task.replies.is_empty(), !task.failed.is_empty());
            match (task.replies.len(), failed) {
                (1, false) => ledger.answered_once += 1,
                (0, true) => ledger.failed += 1,
                _ => {}
            }
            if task.replies.len() > 1 {
                ledger.answered_more += 1;
            }
            if answered && failed {
                ledger.answered_and_failed += 1;
                if let Some((reason, _)) = task.failed.first() {
                    *ledger
                        .answered_and_failed_reasons
                        .entry(reason_kind(reason))
                        .or_default() += 1;
                }
            }
            if task.failed.len() > 1 {
                ledger.failed_more += 1;
            }
            if let Some((reason, told_ms)) = task.failed.first() {
                *ledger.reasons.entry(reason_kind(reason)).or_default() += 1;
                if reason.trim().is_empty() {
                    ledger.failed_without_reason += 1;
                }
                if task.typed.iter().any(|typed| typed > told_ms) {
                    ledger.typed_after_failed += 1;
                }
            }
            match &task.send {
                SendOutcome::Refused { code, message } => {
                    let entry = ledger
                        .refused
                        .entry(code.clone())
                        .or_insert_with(|| (0, message.clone()));
                    entry.0 += 1;
                }
                SendOutcome::Broken(_) | SendOutcome::Open => ledger.send_broken += 1,
                SendOutcome::Accepted(_) => {}
            }
            if !task.ended() {
                ledger.never_ended += 1;
                if ledger.never_ended_sample.len() < SAMPLE {
                    ledger.never_ended_sample.push(*number);
                }
            }
            if !task.typed.is_empty() {
                ledger.typed += 1;
            }
            if task.typed.len() > 1 {
                ledger.typed_twice += 1;
            }
        }
        if let Some(down) = facts.down_ms {
            ledger.roster_lost = facts
                .roster
                .iter()
                .find(|(at, sees, _)| *at >= down && !sees)
                .map(|(at, _, _)| since(down, *at));
        }
        if let Some(up) = facts.up_ms {
            ledger.roster_converged = facts
                .roster
                .iter()
                .find(|(at, sees, seen)| *at >= up && *sees && *seen)
                .map(|(at, _, _)| since(up, *at));
            ledger.recovery = book
                .tasks
                .values()
                .filter(|task| task.sent_ms >= up)
                .filter_map(|task| task.replies.iter().map(|(_, at)| *at).min())
                .min()
                .map(|at| since(up, at));
        }
        ledger
    }

    /// What the issue's "done when" forbids that this run did, one line each; empty when the
    /// run passes.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut count = |n: usize, what: &str| {
            if n > 0 {
                out.push(format!("{n} {what}"));
            }
        };
        count(self.never_ended, "tasks never ended (no reply, no FAILED)");
        count(self.answered_more, "tasks answered more than once");
        count(self.answered_and_failed, "tasks told FAILED and answered");
        count(self.failed_more, "tasks told FAILED more than once");
        count(self.failed_without_reason, "tasks FAILED without a reason");
        count(self.typed_twice, "tasks typed twice");
        count(self.typed_after_failed, "tasks typed after their FAILED");
        count(
            self.refused.get("unknown_recipient").map_or(0, |(n, _)| *n),
            "tasks refused as unknown_recipient",
        );
        out.extend(self.workers.iter().cloned());
        if self.partition.is_some() {
            let bound = self.heartbeat + CONVERGENCE_SLACK;
            match self.roster_converged {
                None => out.push("the roster never converged after healing".into()),
                Some(took) if took > bound => out.push(format!(
                    "the roster converged {:.1} s after healing, over one heartbeat ({} s) + {} s",
                    took.as_secs_f64(),
                    self.heartbeat.as_secs(),
                    CONVERGENCE_SLACK.as_secs()
                )),
                Some(_) => {}
            }
        }
        out
    }

    /// Its lines, as (what, figure), in a fixed order (so runs print side by side).
    pub fn rows(&self) -> Vec<(String, String)> {
        let secs = |d: Option<Duration>| {
            d.map_or("—".to_string(), |d| format!("{:.1} s", d.as_secs_f64()))
        };
        let mut rows = vec![
            (
                "partition".to_string(),
                self.partition
                    .map_or("none".to_string(), |d| format!("{} s", d.as_secs())),
            ),
            ("tasks sent".into(), self.sent.to_string()),
            ("answered once".into(), self.answered_once.to_string()),
            (
                "answered more than once".into(),
                self.answered_more.to_string(),
            ),
            ("FAILED (with a notice)".into(), self.failed.to_string()),
            (
                "FAILED and answered".into(),
                self.answered_and_failed.to_string(),
            ),
            ("FAILED more than once".into(), self.failed_more.to_string()),
            (
                "refused at send".into(),
                self.refused
                    .values()
                    .map(|(n, _)| n)
                    .sum::<usize>()
                    .to_string(),
            ),
            ("send call broke".into(), self.send_broken.to_string()),
            ("never ended".into(), self.never_ended.to_string()),
            ("typed".into(), self.typed.to_string()),
            ("typed twice".into(), self.typed_twice.to_string()),
            (
                "typed after FAILED".into(),
                self.typed_after_failed.to_string(),
            ),
            (
                "workers wrong after traffic".into(),
                self.workers.len().to_string(),
            ),
            ("roster lost after down".into(), secs(self.roster_lost)),
            (
                "roster converged after up".into(),
                secs(self.roster_converged),
            ),
            (
                "recovery (first reply to a task sent after up)".into(),
                secs(self.recovery),
            ),
            (
                "last task ended after last send".into(),
                secs(Some(self.settled_in)),
            ),
            (
                "host-b link down / up logged".into(),
                format!("{} / {}", self.link_downs, self.link_ups),
            ),
            ("forwarded connections".into(), self.forwarded.to_string()),
        ];
        for (reason, n) in &self.reasons {
            rows.push((format!("FAILED: {}", shortened(reason)), n.to_string()));
        }
        for (code, (n, _)) in &self.refused {
            rows.push((format!("refused: {code}"), n.to_string()));
        }
        rows
    }

    /// What the rows leave out, one line each: a sentence of each refusal, what the tasks
    /// told `FAILED` and answered were told, and some of the tasks never ended (what was wrong with the workers is in [`Ledger::workers`]).
    pub fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .refused
            .iter()
            .map(|(code, (_, message))| format!("refused {code}, e.g.: {message}"))
            .collect();
        notes.extend(
            self.answered_and_failed_reasons
                .iter()
                .map(|(reason, n)| format!("FAILED and answered, {n} told: {reason}")),
        );
        if !self.never_ended_sample.is_empty() {
            notes.push(format!(
                "never ended, e.g. tasks {:?}",
                self.never_ended_sample
            ));
        }
        notes
    }
}

impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = self.rows();
        let width = rows
            .iter()
            .map(|(what, _)| what.chars().count())
            .max()
            .unwrap_or(0);
        for (what, figure) in rows {
            writeln!(f, "  {what:<width$}  {figure}")?;
        }
        for note in self.notes().iter().chain(&self.workers) {
            writeln!(f, "  {note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn accepted(book: &mut Book, number: u64, id: &str, at: i64) {
        book.sent(number, "w1", at);
        book.send_returned(
            number,
            Ok(Ok(
                json!({"status": "pending", "state": "queued", "msg_id": id}),
            )),
            at,
        );
    }

    fn reply(id: &str, about: &str, text: &str) -> Value {
        json!({"kind": "REPLY", "msg_id": id, "in_reply_to": about, "text": text})
    }

    fn failed(about: &str, why: &str) -> Value {
        json!({"kind": "FAILED", "msg_id": "f", "in_reply_to": about, "text": why})
    }

    #[test]
    fn every_fate_is_counted_once() {
        let mut book = Book::default();
        for n in 1..=7 {
            accepted(&mut book, n, &format!("m{n}"), 1_000);
        }
        book.got(&reply("r1", "m1", "echo: task 1"), 2_000);
        book.got(&reply("r2", "m2", "echo: task 2"), 2_000);
        book.got(&reply("r2", "m2", "echo: task 2"), 2_100);
        book.got(
            &failed("m3", "expired after 30 s unread in the inbox of 'w1@hostb'"),
            3_000,
        );
        book.got(
            &failed("m4", "expired after 31 s unread in the inbox of 'w2@hostb'"),
            3_000,
        );
        book.typed(r#"{"ms": 3500, "worker": "w2", "task": "task 4"}"#);
        book.got(&failed("m5", "no INJECTED receipt"), 3_000);
        book.got(&reply("r5", "m5", "echo: task 5"), 3_100);
        book.typed(r#"{"ms": 1500, "worker": "w1", "task": "/slow 2000 task 6"}"#);
        book.typed(r#"{"ms": 1600, "worker": "w1", "task": "/slow 2000 task 6"}"#);
        book.sent(8, "w2", 1_000);
        book.send_returned(
            8,
            Ok(Err(("unknown_recipient".into(), "no w2".into()))),
            1_000,
        );
        assert!(!book.all_ended());
        let ledger = Ledger::of(&book, &Facts::default());
        assert_eq!(
            (
                ledger.sent,
                ledger.answered_once,
                ledger.answered_more,
                ledger.failed
            ),
            (8, 1, 1, 2)
        );
        assert_eq!(ledger.answered_and_failed, 1);
        assert_eq!(ledger.reasons.len(), 2, "{:?}", ledger.reasons);
        assert_eq!(
            ledger
                .reasons
                .get("expired after # s unread in the inbox of '…'"),
            Some(&2)
        );
        assert_eq!((ledger.typed_after_failed, ledger.typed_twice), (1, 1));
        assert_eq!(
            (ledger.never_ended, ledger.never_ended_sample.clone()),
            (2, vec![6, 7])
        );
        assert_eq!(ledger.refused["unknown_recipient"].0, 1);
        assert_eq!(ledger.violations().len(), 6, "{:?}", ledger.violations());
    }

    #[test]
    fn a_notice_before_its_send_returned_is_kept_for_it() {
        let mut book = Book::default();
        book.sent(1, "w1", 1_000);
        book.got(&failed("m1", "gone"), 1_100);
        book.got(&reply("r9", "m9", "echo: task 9"), 1_100);
        book.send_returned(
            1,
            Ok(Ok(
                json!({"status": "pending", "state": "queued", "msg_id": "m1"}),
            )),
            1_200,
        );
        assert!(book.all_ended());
        assert_eq!(book.stray, 1);
        // An answer that came with the send counts as one.
        book.sent(2, "w2", 2_000);
        book.send_returned(
            2,
            Ok(Ok(json!({"status": "replied", "msg_id": "m2",
                "reply": {"kind": "REPLY", "msg_id": "r2", "in_reply_to": "m2", "text": "echo: task 2"}}))),
            2_100,
        );
        assert_eq!(Ledger::of(&book, &Facts::default()).answered_once, 1);
    }

    #[test]
    fn recovery_and_convergence_are_counted_from_healing() {
        let mut book = Book::default();
        accepted(&mut book, 1, "m1", 10_000);
        accepted(&mut book, 2, "m2", 21_000);
        book.got(&reply("r1", "m1", "echo: task 1"), 22_000);
        book.got(&reply("r2", "m2", "echo: task 2"), 23_500);
        let facts = Facts {
            partition: Some(Duration::from_secs(10)),
            down_ms: Some(10_000),
            up_ms: Some(20_000),
            roster: vec![
                (9_000, true, true),
                (14_000, true, false),
                (16_000, false, false),
                (25_000, true, false),
                (26_500, true, true),
            ],
            heartbeat: Duration::from_secs(5),
            ..Facts::default()
        };
        let ledger = Ledger::of(&book, &facts);
        assert_eq!(ledger.roster_lost, Some(Duration::from_secs(6)));
        assert_eq!(ledger.roster_converged, Some(Duration::from_millis(6_500)));
        assert_eq!(ledger.recovery, Some(Duration::from_millis(3_500)));
        assert_eq!(ledger.violations().len(), 1, "{:?}", ledger.violations());
    }

    #[test]
    fn reasons_are_grouped_without_their_names_and_numbers() {
        assert_eq!(
            reason_kind("expired after 30 s unread in the inbox of 'w1@hostb', never taken"),
            "expired after # s unread in the inbox of '…', never taken"
        );
        assert_eq!(
            reason_kind("refused by its recipient's gateway: replay of 0199-ab"),
            "refused by its recipient's gateway: replay of #"
        );
        assert_eq!(reason_kind("it's 'open"), "it's 'open");
    }

    #[test]
    fn task_numbers_are_read_from_tasks_and_echoes() {
        assert_eq!(task_number("task 12"), Some(12));
        assert_eq!(task_number("/slow 2000 task 14"), Some(14));
        assert_eq!(task_number("echo: task 3"), Some(3));
        assert_eq!(task_number("warm-up"), None);
    }
}
