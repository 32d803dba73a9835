//! `fleet-bench submits`: tasks of every shape typed by fleetd into real agent workers (Claude
//! Code, or opencode) on the scripted model, which answers each with the digest of exactly what
//! reached it ([`ModelSim::digesting`]). Each task opens with a tag of its own, so the counts
//! follow: a task whose tag reached the model in no turn was swallowed, one in two turns was
//! submitted twice, one in a turn with another tag was merged, and one alone in its turn whose
//! digest is not that of the text sent was altered. Beside it, from the same run: the round trip
//! of the same tasks through the scripted command agent.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_core::typed::typeable;
use fleet_mux::tmux::spread;
use fleet_testkit::bins::binary;
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{
    Fleet, claude_binary, claude_profile, opencode_binary, opencode_profile, sim_profile,
};
use fleet_testkit::model::{Digest, ModelSim, Received, tag};
use serde_json::json;

use super::{percentiles, runs};

/// Its options.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Tasks to send.
    #[arg(short = 'n', long = "tasks", default_value_t = 1000)]
    tasks: usize,
    /// The real agent the workers run.
    #[arg(long, value_enum, default_value_t = Agent::ClaudeCode)]
    profile: Agent,
    /// Workers taking tasks in parallel, each in a closed loop of its own.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// One task in this many is sent right behind the one before it, to the same worker, while
    /// that one is still in flight: fleetd queues it and types it once the worker is idle again.
    #[arg(long, default_value_t = 4)]
    behind_every: usize,
    /// Seconds a task may take from its send to its reply (a worker answers in about one);
    /// after that its worker is stopped and started afresh, which fails what it held.
    #[arg(long, default_value_t = 30)]
    deadline_s: u64,
    /// Tasks per session (the profile's `context_cap`): a worker then gets a fresh session, and
    /// its next task is typed into a program just started.
    #[arg(long, default_value_t = 50)]
    context_cap: u64,
    /// Round trips of the same tasks through the scripted command agent, the baseline.
    #[arg(long, default_value_t = 60)]
    baseline: usize,
}

/// A real agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Agent {
    /// Claude Code (`FLEET_TEST_CLAUDE`, else `claude`).
    ClaudeCode,
    /// opencode (`FLEET_TEST_OPENCODE`, else `opencode`).
    Opencode,
}

/// The shapes of task, spread in turn over the tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    Short,
    Long,
    MultiLine,
    Quotes,
    Unicode,
    Shell,
}

/// Every shape, in the order the tasks take them.
const SHAPES: [Shape; 6] = [
    Shape::Short,
    Shape::Long,
    Shape::MultiLine,
    Shape::Quotes,
    Shape::Unicode,
    Shape::Shell,
];

impl Shape {
    /// Its name in the report.
    fn name(self) -> &'static str {
        match self {
            Shape::Short => "short",
            Shape::Long => "long",
            Shape::MultiLine => "multi-line",
            Shape::Quotes => "quotes",
            Shape::Unicode => "unicode",
            Shape::Shell => "shell",
        }
    }
}

/// The shortest long task, in characters.
const LONG_CHARS: usize = 2_000;

/// Bodies of the quote tasks, in turn.
const QUOTES: [&str; 4] = [
    r#"it's "quoted" and 'single' and `backticks` too"#,
    r#"nested "double 'single' inside" and 'single "double" inside'"#,
    r#"unbalanced ' and " and ` left open"#,
    r#"code: `let s = "a 'b' c";` then ''' and """ and ``` fences"#,
];

/// Bodies of the unicode tasks, in turn: accents, CJK, emoji (a skin tone, a family joined by
/// zero-width joiners, flags), right-to-left scripts, symbols.
const UNICODE: [&str; 5] = [
    "café naïve façade Ünïcødé — “curly” ‘quotes’ … «guillemets» ß",
    "日本語のテキスト、中文字符，한국어 문장입니다",
    "emoji 🚀🎉👍🏽 and a family 👨‍👩‍👧 and flags 🇫🇷🇯🇵",
    "right to left: עברית ושלום, العربية مرحبا, mixed with ltr 123",
    "maths ∑∫√∞ ≠ ≤ ≥ ± µ, arrows ← → ⇒, a box ┌─┐└─┘",
];

/// Bodies of the shell tasks, in turn; the fourth ends with a backslash.
const SHELL: [&str; 5] = [
    r#"$(rm -rf ~/tmp-x) ; echo "$HOME" | tee out.txt && ls *.rs > list.txt 2>&1"#,
    r#"`whoami` || true & sleep 1; cat < in.txt >> all.txt; echo ${PATH:-none}"#,
    r#"find . -name '*.log' -exec rm {} \; && echo done\n (a literal backslash-n)"#,
    r#"a \\ double backslash, C:\Users\me\path, \t no tab, and a trailing backslash \"#,
    r#"!history ^caret %percent #hash @at ~user {a,b} [x] ?q <(cmd) 2>/dev/null"#,
];

/// One task of the run.
struct Task {
    /// Its number (its tag's).
    n: usize,
    /// Its shape.
    shape: Shape,
    /// The text sent.
    text: String,
    /// Whether it is sent right behind the task before it, to the same worker.
    behind: bool,
}

impl Task {
    /// What should reach the agent: the text as fleetd types it ([`typeable`]: a CR becomes a
    /// newline, by design, as a CR is Enter to a terminal program).
    fn expected(&self) -> String {
        typeable(&self.text)
            .map(|t| t.into_owned())
            .unwrap_or_default()
    }
}

/// The text of task `n` of shape `shape`: its tag, then a body that varies with `n`.
fn task_text(n: usize, shape: Shape) -> String {
    let v = n / SHAPES.len();
    let body = match shape {
        // One in four with a blank at its end.
        Shape::Short => format!(
            "short task {n}: reply ok{}",
            if v % 4 == 3 { " " } else { "" }
        ),
        Shape::Long => {
            // Every other long task on one line, the rest one item a line.
            let (sep, target) = (
                if v.is_multiple_of(2) { ' ' } else { '\n' },
                LONG_CHARS + n * 37 % 700,
            );
            let mut body = format!("long task {n}:{sep}");
            let mut k = 0;
            while body.chars().count() < target {
                body.push_str(&format!(
                    "item {k} of task {n}: read the module, check its tests and note what it does;{sep}"
                ));
                k += 1;
            }
            body.trim_end().to_string()
        }
        Shape::MultiLine => {
            let lines: Vec<String> = (1..=3 + v % 6)
                .map(|i| match i {
                    3 => String::new(),
                    _ if i % 3 == 0 => format!("    indented line {i}"),
                    _ if i % 4 == 0 => format!("\tafter a tab, line {i}"),
                    _ => format!("line {i} of task {n}"),
                })
                .collect();
            // Some with blanks at the end of a line, some with CRLF line ends, some ending in
            // blanks, a newline or two.
            let mut body = format!("multi-line task {n}:");
            body.push_str(if v.is_multiple_of(3) { "  " } else { "" });
            for line in lines {
                body.push_str(if v % 4 == 1 { "\r\n" } else { "\n" });
                body.push_str(&line);
            }
            body.push_str(match v % 5 {
                2 => "  ",
                3 => "\n\n",
                4 => "\n",
                _ => "",
            });
            body
        }
        Shape::Quotes => format!("quotes {n}: {}", QUOTES[v % QUOTES.len()]),
        Shape::Unicode => format!("unicode {n}: {}", UNICODE[v % UNICODE.len()]),
        Shape::Shell => format!("shell {n}: {}", SHELL[v % SHELL.len()]),
    };
    format!("{} {body}", tag(n))
}

/// The run's tasks: shapes in turn, every `behind_every`-th sent behind the one before.
fn plan(tasks: usize, behind_every: usize) -> anyhow::Result<Vec<Task>> {
    (0..tasks)
        .map(|n| {
            let shape = SHAPES[n % SHAPES.len()];
            let text = task_text(n, shape);
            // Only text fleetd takes belongs here (see fleet_core::typed).
            if let Err(c) = typeable(&text) {
                anyhow::bail!("task {n} holds {c}, which fleetd refuses by design");
            }
            let behind = behind_every > 0 && (n + 1).is_multiple_of(behind_every);
            Ok(Task {
                n,
                shape,
                text,
                behind,
            })
        })
        .collect()
}

/// What became of one task, as its lead saw it.
struct Record {
    /// Its number.
    n: usize,
    /// The worker it was sent to.
    worker: String,
    /// The id fleetd gave it.
    msg_id: String,
    /// From its send to each reply to it, and the reply's text.
    replies: Vec<(Duration, String)>,
    /// Its `FAILED` notices, and refusals of its send.
    failed: Vec<String>,
    /// Whether a send that waited for its reply ran out of time first.
    timed_out: bool,
    /// Any other answer to its send (asked, blocked: not expected here).
    other: Vec<String>,
    /// When it was sent.
    sent: Instant,
}

/// One lane: a lead, its worker, and what became of the tasks it sent.
struct Lane {
    /// The lead.
    lead: Client,
    /// Its worker's name.
    worker: String,
    /// Its tasks' records.
    records: Vec<Record>,
    /// Record index by message id, for the answers its polls bring.
    by_id: HashMap<String, usize>,
    /// How many times its worker was stopped and started afresh after a timeout.
    restarts: usize,
    /// The fleet's private tmux server, to read the worker's screen.
    socket: String,
    /// Its worker's screen when a task's wait ran out, by task number.
    screens: HashMap<usize, String>,
}

/// The name of the real agent's profile.
const PROFILE: &str = "agent";

impl Lane {
    /// Sends task `task`, waiting `wait_s` for its reply.
    async fn send(&mut self, task: &Task, wait_s: u64) -> anyhow::Result<()> {
        let sent = Instant::now();
        let answer = self
            .lead
            .call(
                "fleet_send",
                json!({"to": self.worker, "message": task.text, "wait_s": wait_s}),
            )
            .await?;
        let mut record = Record {
            n: task.n,
            worker: self.worker.clone(),
            msg_id: String::new(),
            replies: Vec::new(),
            failed: Vec::new(),
            timed_out: false,
            other: Vec::new(),
            sent,
        };
        match answer {
            Err(refused) => record.failed.push(format!("refused: {refused}")),
            Ok(answer) => {
                record.msg_id = answer["msg_id"].as_str().unwrap_or_default().to_string();
                match answer["status"].as_str().unwrap_or_default() {
                    "replied" => record.replies.push((
                        sent.elapsed(),
                        answer["reply"]["text"].as_str().unwrap_or_default().into(),
                    )),
                    "failed" => record
                        .failed
                        .push(answer["reason"].as_str().unwrap_or_default().into()),
                    "pending" => record.timed_out = wait_s > 0,
                    _ => record.other.push(answer.to_string()),
                }
            }
        }
        self.by_id.insert(record.msg_id.clone(), self.records.len());
        self.records.push(record);
        Ok(())
    }

    /// Takes what is held for the lead (waiting up to `wait_s` for something) into the records.
    async fn poll(&mut self, wait_s: u64) -> anyhow::Result<usize> {
        let messages = self.lead.poll(wait_s).await?;
        for message in &messages {
            let about = message["in_reply_to"].as_str().unwrap_or_default();
            let text = message["text"].as_str().unwrap_or_default().to_string();
            let Some(record) = self.by_id.get(about).and_then(|&i| self.records.get_mut(i)) else {
                continue;
            };
            match message["kind"].as_str().unwrap_or_default() {
                "REPLY" => record.replies.push((record.sent.elapsed(), text)),
                "FAILED" => record.failed.push(text),
                kind => record.other.push(format!("{kind}: {text}")),
            }
        }
        Ok(messages.len())
    }

    /// Its worker's screen (the last lines), headed by `when` and its status.
    async fn screen(&self, when: &str) -> String {
        let Ok(entry) = self.lead.entry(&self.worker).await else {
            return format!("    {} is not listed {when}", self.worker);
        };
        let pane = entry["pane"].as_str().unwrap_or_default();
        let (index, inner) = spread::inner_id(&fleet_mux::PaneId(pane.to_string()))
            .unwrap_or((0, fleet_mux::PaneId(pane.to_string())));
        let server = spread::server_name(&self.socket, index);
        let text = std::process::Command::new("tmux")
            .args(["-L", &server, "capture-pane", "-p", "-J", "-t", &inner.0])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        format!(
            "    {}'s screen {when} ({}, pane {pane}):\n{}",
            self.worker,
            entry["status"],
            screen_tail(&text)
        )
    }

    /// Whether every task it sent has an answer (a reply, or a failure).
    fn settled(&self) -> bool {
        self.records
            .iter()
            .all(|r| !r.replies.is_empty() || !r.failed.is_empty())
    }
}

/// Runs one lane until the plan is used up: takes the next task (and the one after, when that
/// is sent behind it), sends it and waits for its reply.
async fn run_lane(
    mut lane: Lane,
    plan: Arc<Vec<Task>>,
    next: Arc<Mutex<usize>>,
    deadline_s: u64,
) -> anyhow::Result<Lane> {
    loop {
        let taken = {
            let mut next = next
                .lock()
                .map_err(|_| anyhow::anyhow!("a lane panicked"))?;
            let first = *next;
            let pair = plan.get(first + 1).is_some_and(|t| t.behind);
            *next = (first + if pair { 2 } else { 1 }).min(plan.len());
            (first..*next).collect::<Vec<_>>()
        };
        let (Some(&first), second) = (taken.first(), taken.get(1)) else {
            break;
        };
        match second {
            // The first returns at once (its reply is held for the lead's poll); the second is
            // queued behind it and waited for.
            Some(&second) => {
                lane.send(&plan[first], 0).await?;
                lane.send(&plan[second], deadline_s).await?;
                lane.poll(0).await?;
            }
            None => lane.send(&plan[first], deadline_s).await?,
        }
        // A worker that let its task's wait run out may never take another (a task it never
        // got stays in flight): as a lead would, stop it and start it afresh. fleetd fails
        // what it held, and tells the lead.
        if let Some(late) = lane.records.last().filter(|r| r.timed_out).map(|r| r.n) {
            let screen = lane.screen("as the wait ran out").await;
            lane.screens.insert(late, screen);
            lane.lead
                .ok("fleet_stop", json!({"to": lane.worker}))
                .await?;
            lane.lead.spawn(PROFILE, &lane.worker).await?;
            lane.restarts += 1;
        }
    }
    // Replies still to come (to tasks sent behind another): wait for them, up to the deadline.
    let until = Instant::now() + Duration::from_secs(deadline_s);
    while !lane.settled() && Instant::now() < until {
        lane.poll(5).await?;
    }
    Ok(lane)
}

/// How long the model must have had no request before the run counts as over (a task typed
/// twice would bring a late turn).
const QUIET: Duration = Duration::from_secs(3);

/// Waits until `model` has had no request for [`QUIET`] (at most `limit`).
async fn model_quiet(model: &ModelSim, limit: Duration) {
    let until = Instant::now() + limit;
    let (mut count, mut since) = (model.requests(), Instant::now());
    while since.elapsed() < QUIET && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = model.requests();
        if now != count {
            (count, since) = (now, Instant::now());
        }
    }
}

/// The baseline: `count` of the plan's tasks, each sent and waited for, through the scripted
/// command agent (`fleet-agent-sim`, which echoes what it read). Their round trips, and how many
/// echoes were not `echo: TASK` with TASK as fleetd types it.
async fn baseline(plan: &[Task], count: usize) -> anyhow::Result<(Vec<Duration>, usize)> {
    let fleet = Fleet::start("", &sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "sim0").await?;
    let (mut samples, mut wrong) = (Vec::with_capacity(count), 0);
    for task in plan.iter().take(count) {
        let started = Instant::now();
        let sent = lead.send("sim0", &task.text, 30).await?;
        samples.push(started.elapsed());
        if sent["reply"]["text"].as_str() != Some(format!("echo: {}", task.expected()).as_str()) {
            wrong += 1;
        }
    }
    Ok((samples, wrong))
}

/// What is compared, and the one difference forgiven, with why: printed with the counts.
const NORMALISATION: &str = "the SHA-256 of what reached the model (its turn's typed text blocks; a paste block of Claude Code's, `\\n\\n<pasted_content id=\"ID\">\\n…\\n</pasted_content id=\"ID\">\\n`, read back as Claude Code's own parser does) against that of the text sent as fleetd types it (CR and CRLF become LF: fleetd's documented rule). Forgiven, and counted apart: blanks (spaces, tabs, newlines) at the very end of a task, which Claude Code drops when it submits (its prompt is trimmed, and its paste block ends in the newline that a task's own last newline would be). Nothing else: tabs turned into spaces, say, count as altered";

/// Why a task arrived altered, from the text sent (as typed) and what arrived.
fn alteration(expected: &str, arrived: &str) -> &'static str {
    let spaced = expected.replace('\t', "    ");
    if spaced.trim_end() == arrived.trim_end() {
        "tabs arrived as four spaces each"
    } else if arrived.trim() == expected.trim() {
        "blanks at its start"
    } else {
        "other"
    }
}

/// What the counts found, task by task.
#[derive(Default)]
struct Findings {
    /// Tasks whose tag reached the model in no turn.
    swallowed: Vec<usize>,
    /// Tasks whose tag reached it in a turn with another tag (or its own twice).
    merged: Vec<usize>,
    /// Tasks whose tag reached it in more than one turn.
    twice: Vec<usize>,
    /// Tasks alone in their one turn whose text arrived other than sent, beyond blanks at its
    /// very end.
    altered: Vec<usize>,
    /// Tasks alone in their one turn whose text arrived other than sent only in the blanks
    /// (spaces, tabs, newlines) at its very end: forgiven (see [`NORMALISATION`]).
    forgiven: Vec<usize>,
    /// Turns on typed text that held no tag at all.
    untagged: Vec<usize>,
    /// Tasks whose reply (through fleetd, to the lead) was not the digest of their own turn.
    misanswered: Vec<usize>,
}

/// Counts, from what the model received and what the leads got back.
fn findings(plan: &[Task], received: &[Received], records: &[&Record]) -> Findings {
    let mut turns: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut found = Findings::default();
    for (i, r) in received.iter().enumerate() {
        if r.digest.tags.is_empty() {
            found.untagged.push(i);
        }
        for t in &r.digest.tags {
            turns.entry(t.as_str()).or_default().push(i);
        }
    }
    let by_n: HashMap<usize, &Record> = records.iter().map(|r| (r.n, *r)).collect();
    for task in plan {
        let own = tag(task.n);
        let mut hits = turns.get(own.as_str()).cloned().unwrap_or_default();
        let tagged_in = hits.len();
        hits.dedup();
        if tagged_in == 0 {
            found.swallowed.push(task.n);
        }
        if hits.len() > 1 {
            found.twice.push(task.n);
        }
        if tagged_in > hits.len() || hits.iter().any(|&i| received[i].digest.tags.len() > 1) {
            found.merged.push(task.n);
        }
        if let [one] = hits[..]
            && received[one].digest.tags.len() == 1
            && received[one].digest != Digest::of(&task.expected())
        {
            if received[one].text.trim_end() == task.expected().trim_end() {
                found.forgiven.push(task.n);
            } else {
                found.altered.push(task.n);
            }
        }
        let answered = by_n.get(&task.n).and_then(|r| r.replies.first());
        if let Some((_, reply)) = answered
            && let Ok(digest) = reply.parse::<Digest>()
            && digest.tags != [own.clone()]
        {
            found.misanswered.push(task.n);
        }
    }
    found
}

/// `text`, escaped and cut to about `max` characters.
fn excerpt(text: &str, max: usize) -> String {
    let shown: String = text.chars().take(max).collect();
    let cut = if shown.len() < text.len() { "…" } else { "" };
    format!("{shown:?}{cut}")
}

/// Where `a` and `b` first differ, in characters, with a few characters of each from there.
fn first_difference(a: &str, b: &str) -> String {
    let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let from = |s: &str| {
        s.chars()
            .skip(at.saturating_sub(10))
            .take(40)
            .collect::<String>()
    };
    format!(
        "first difference at character {at} of {} sent / {} arrived: sent …{:?}, arrived …{:?}",
        a.chars().count(),
        b.chars().count(),
        from(a),
        from(b)
    )
}

/// For each of `records`, what fleetd logged about it, and its worker's screen: as it was when
/// the task's wait ran out (before the restart), else as it is now.
async fn diagnose(fleet: &Fleet, lanes: &[Lane], records: &[&Record]) -> HashMap<usize, String> {
    let log = fleet.log();
    let mut seen = HashMap::new();
    for record in records {
        let mut out: Vec<String> = log
            .lines()
            .filter(|l| !record.msg_id.is_empty() && l.contains(&record.msg_id))
            .take(12)
            .map(|l| format!("    fleetd: {l}"))
            .collect();
        let lane = lanes.iter().find(|l| l.worker == record.worker);
        if let Some(screen) = lane.and_then(|l| l.screens.get(&record.n)) {
            out.push(screen.clone());
        } else if let Some(lane) = lane {
            out.push(lane.screen("now").await);
        }
        seen.insert(record.n, out.join("\n"));
    }
    seen
}

/// The last lines of `text` (a worker's screen), those of the input box escaped so a no-break
/// space shows.
fn screen_tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(12)..]
        .iter()
        .map(|l| {
            if l.contains('❯') {
                format!("    | {:?}", l.trim_end())
            } else {
                format!("    | {l}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first version line `program --version` prints.
fn version(program: &str) -> String {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|o| o.lines().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// How many offending tasks are shown for each count.
const SHOWN: usize = 5;

/// Runs it.
pub(super) async fn run(args: Args) -> anyhow::Result<()> {
    let (program, variable) = match args.profile {
        Agent::ClaudeCode => (claude_binary(), "FLEET_TEST_CLAUDE"),
        Agent::Opencode => (opencode_binary(), "FLEET_TEST_OPENCODE"),
    };
    anyhow::ensure!(runs(&program), "no {program} here: set {variable}");
    anyhow::ensure!(args.workers > 0 && args.tasks > 0, "nothing to run");
    let command: Vec<String> = std::env::args().collect();
    println!(
        "fleet-bench submits ({} build of fleetd at {}; {} at {program})",
        super::BUILD,
        binary("fleetd")?.display(),
        version(&program)
    );
    println!(
        "command: {variable}={} {}",
        std::env::var(variable).unwrap_or_default(),
        command.join(" ")
    );
    let plan = Arc::new(plan(args.tasks, args.behind_every)?);

    let (mut base, base_wrong) = baseline(&plan, args.baseline.min(plan.len())).await?;

    let model = ModelSim::digesting().await?;
    let profile = match args.profile {
        Agent::ClaudeCode => claude_profile(PROFILE, &model.base_url()),
        Agent::Opencode => opencode_profile(PROFILE, &model.base_url()),
    };
    let leads: String = (0..args.workers)
        .map(|k| format!("[leads.lead{k}]\n"))
        .collect();
    let fleet = Fleet::start(
        "",
        &format!("{leads}\n{profile}context_cap = {}\n", args.context_cap),
    )
    .await?;
    let mut lanes = Vec::new();
    for k in 0..args.workers {
        let lead = fleet.lead(&format!("lead{k}"), Protocol::Stateless).await?;
        let worker = format!("w{k}");
        lead.spawn(PROFILE, &worker).await?;
        lanes.push(Lane {
            lead,
            worker,
            records: Vec::new(),
            by_id: HashMap::new(),
            restarts: 0,
            socket: fleet.tmux_socket().to_string(),
            screens: HashMap::new(),
        });
    }
    let started = Instant::now();
    let next = Arc::new(Mutex::new(0));
    let running: Vec<_> = lanes
        .into_iter()
        .map(|lane| {
            tokio::spawn(run_lane(
                lane,
                Arc::clone(&plan),
                Arc::clone(&next),
                args.deadline_s,
            ))
        })
        .collect();
    let mut lanes = Vec::new();
    for lane in running {
        lanes.push(lane.await??);
    }
    let wall = started.elapsed();
    // A task typed twice, or a reply late, comes after the last one awaited: let the model
    // fall quiet, then take what is still held.
    model_quiet(&model, Duration::from_secs(args.deadline_s)).await;
    for lane in &mut lanes {
        lane.poll(0).await?;
    }
    let received = model.received();
    let records: Vec<&Record> = lanes.iter().flat_map(|l| &l.records).collect();
    let found = findings(&plan, &received, &records);
    let troubled: Vec<&Record> = records
        .iter()
        .filter(|r| found.swallowed.contains(&r.n) || !r.failed.is_empty() || r.timed_out)
        .take(SHOWN)
        .copied()
        .collect();
    let diagnosed = diagnose(&fleet, &lanes, &troubled).await;
    let restarts = lanes.iter().map(|l| l.restarts).sum();
    report(
        &args, &plan, &received, &records, &found, wall, &diagnosed, restarts,
    );

    let mut alone: Vec<Duration> = records
        .iter()
        .filter(|r| !plan[r.n].behind && plan.get(r.n + 1).is_none_or(|t| !t.behind))
        .filter_map(|r| r.replies.first().map(|(d, _)| *d))
        .collect();
    let mut queued: Vec<Duration> = records
        .iter()
        .filter(|r| plan[r.n].behind)
        .filter_map(|r| r.replies.first().map(|(d, _)| *d))
        .collect();
    let (a50, a99) = percentiles(&mut alone);
    let (q50, q99) = percentiles(&mut queued);
    let (b50, b99) = percentiles(&mut base);
    println!(
        "round trip send → typed → submitted → fleet_reply → result, {} tasks sent alone: p50 {a50:.0} ms  p99 {a99:.0} ms ({:.1}x the scripted agent's p50)",
        alone.len(),
        a50 / b50.max(f64::MIN_POSITIVE)
    );
    println!(
        "  {} tasks sent behind a busy worker's task (their wait behind it included): p50 {q50:.0} ms  p99 {q99:.0} ms",
        queued.len()
    );
    println!(
        "baseline, same run: the first {} tasks through the scripted command agent (fleet-agent-sim): p50 {b50:.2} ms  p99 {b99:.2} ms; echoes not the task as typed: {base_wrong} (of these tasks {} hold a tab and {} end in blanks: the same paste path delivers them intact)",
        base.len(),
        plan.iter()
            .take(base.len())
            .filter(|t| t.text.contains('\t'))
            .count(),
        plan.iter()
            .take(base.len())
            .filter(|t| t.text.trim_end() != t.text)
            .count()
    );
    Ok(())
}

/// Prints the counts, and the first few tasks behind each count that is not 0.
#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    plan: &[Task],
    received: &[Received],
    records: &[&Record],
    found: &Findings,
    wall: Duration,
    diagnosed: &HashMap<usize, String>,
    restarts: usize,
) {
    let mut shapes: BTreeMap<Shape, usize> = BTreeMap::new();
    for task in plan {
        *shapes.entry(task.shape).or_default() += 1;
    }
    let long: Vec<usize> = plan
        .iter()
        .filter(|t| t.shape == Shape::Long)
        .map(|t| t.text.chars().count())
        .collect();
    println!(
        "{} tasks over {} {:?} workers on the scripted model (context_cap {}); shapes: {}; long ones {}–{} characters; {} sent behind a busy worker's task; {} with CRLF line ends",
        plan.len(),
        args.workers,
        args.profile,
        args.context_cap,
        shapes
            .iter()
            .map(|(s, n)| format!("{} {n}", s.name()))
            .collect::<Vec<_>>()
            .join(", "),
        long.iter().min().unwrap_or(&0),
        long.iter().max().unwrap_or(&0),
        plan.iter().filter(|t| t.behind).count(),
        plan.iter().filter(|t| t.text.contains('\r')).count(),
    );
    println!("compared: {NORMALISATION}");
    let replied = records.iter().filter(|r| !r.replies.is_empty()).count();
    let failed = records.iter().filter(|r| !r.failed.is_empty()).count();
    let timed_out = records.iter().filter(|r| r.timed_out).count();
    let extra = records.iter().filter(|r| r.replies.len() > 1).count();
    let other = records.iter().filter(|r| !r.other.is_empty()).count();
    println!("tasks sent:                          {}", records.len());
    println!("replies (tasks answered):            {replied}");
    println!("model turns on typed tasks:          {}", received.len());
    let by_n: HashMap<usize, &Record> = records.iter().map(|r| (r.n, *r)).collect();
    let counts: [(&str, &Vec<usize>); 7] = [
        ("swallowed (tag in no turn)", &found.swallowed),
        ("merged (tag in a turn with another)", &found.merged),
        ("submitted twice (tag in two turns)", &found.twice),
        ("altered (alone, digest differs)", &found.altered),
        ("  forgiven: only end blanks differ", &found.forgiven),
        ("replies answering another task", &found.misanswered),
        ("turns holding no tag", &found.untagged),
    ];
    for (what, tasks) in counts {
        println!("{what:<37}{:>4}  [target 0]", tasks.len());
    }
    let mut causes: BTreeMap<&str, usize> = BTreeMap::new();
    for &n in &found.altered {
        if let Some(turn) = received.iter().find(|r| r.digest.tags == [tag(n)]) {
            *causes
                .entry(alteration(&plan[n].expected(), &turn.text))
                .or_default() += 1;
        }
    }
    for (cause, count) in causes {
        println!("  altered, {cause}: {count}");
    }
    let stopped = records
        .iter()
        .filter(|r| r.failed.iter().any(|f| f.contains("stopped by")))
        .count();
    println!(
        "FAILED notices / refusals:           {failed}  [target 0] ({stopped} of them fleetd's notice that the worker was stopped: the restart below)"
    );
    println!(
        "timeouts (no reply in wait_s {}):    {timed_out}  [target 0]",
        args.deadline_s
    );
    println!("tasks with more than one reply:      {extra}  [target 0]");
    println!("other answers (asked, blocked):      {other}  [target 0]");
    println!("workers stopped and started afresh after a task's wait ran out: {restarts}");
    println!(
        "throughput: {:.2} tasks/s ({} tasks in {:.1} s, {} workers)",
        plan.len() as f64 / wall.as_secs_f64(),
        plan.len(),
        wall.as_secs_f64(),
        args.workers
    );
    let turns_of = |n: usize| -> Vec<&Received> {
        received
            .iter()
            .filter(|r| r.digest.tags.contains(&tag(n)))
            .collect()
    };
    let show = |what: &str, tasks: &[usize]| {
        for &n in tasks.iter().take(SHOWN) {
            let task = &plan[n];
            let record = by_n.get(&n);
            println!(
                "  {what} {} ({}, to {}, msg {}): sent {}",
                tag(n),
                task.shape.name(),
                record.map_or("?", |r| r.worker.as_str()),
                record.map_or("?", |r| r.msg_id.as_str()),
                excerpt(&task.text, 120)
            );
            for turn in turns_of(n) {
                println!("    turn {}: {}", turn.digest, excerpt(&turn.text, 160));
                if what == "altered" || what == "forgiven" {
                    println!("    {}", first_difference(&task.expected(), &turn.text));
                }
                if turn.raw != turn.text {
                    println!("    as it arrived: {}", excerpt(&turn.raw, 200));
                }
            }
            if let Some(r) = record {
                for (took, reply) in &r.replies {
                    println!("    reply after {took:?}: {reply}");
                }
                for f in r.failed.iter().chain(&r.other) {
                    println!("    answer: {}", excerpt(f, 300));
                }
                if r.timed_out {
                    println!("    its send ran out of wait_s {}", args.deadline_s);
                }
                if let Some(seen) = diagnosed.get(&n) {
                    println!("{seen}");
                }
            }
        }
    };
    show("swallowed", &found.swallowed);
    show("merged", &found.merged);
    show("twice", &found.twice);
    show("altered", &found.altered);
    show("forgiven", &found.forgiven);
    show("misanswered", &found.misanswered);
    for &i in found.untagged.iter().take(SHOWN) {
        println!("  untagged turn: {}", excerpt(&received[i].text, 200));
    }
    let failed: Vec<usize> = records
        .iter()
        .filter(|r| !r.failed.is_empty() || r.timed_out || !r.other.is_empty())
        .map(|r| r.n)
        .collect();
    show("failed/timed out", &failed);
}
