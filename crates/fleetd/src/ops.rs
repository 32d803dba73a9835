//! The operator commands against a running gateway: `fleetd ls` (the roster across hosts),
//! `hosts`, `msgs`, `send`, `answer` and `stop`. The gateway is found through the state dir
//! (the `serving` file its `serve` writes; `gateway.listen` when there is none) and asked over
//! `/api/v1` as a lead, or an operator (`--operator`), with its token file. Tables fit the
//! terminal and are coloured only on one; `--json` prints what the API answered.

use std::fmt;
use std::io::{IsTerminal, Read};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use serde::Deserialize;
use serde_json::Value;

use crate::config::Config;
use crate::paths::Paths;
use crate::state::StateDir;

/// The exit status when no gateway answers.
pub const EXIT_UNREACHABLE: u8 = 3;
/// The exit status when the gateway refuses the token.
pub const EXIT_REFUSED: u8 = 4;
/// How long a gateway may take to answer an operator command.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(15);

/// What every operator command takes.
#[derive(Debug, Args)]
pub struct OpsArgs {
    /// The lead to ask as (`[leads.NAME]`); the only one declared when left out.
    #[arg(long, value_name = "NAME", conflicts_with = "operator")]
    pub lead: Option<String>,
    /// Ask as this operator (`[operators.NAME]`) instead of a lead: it sees the whole fleet
    /// and may stop workers (unless read-only), never a message's text; it sends nothing.
    #[arg(long, value_name = "NAME")]
    pub operator: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A failure with the exit status a script can rely on.
#[derive(Debug)]
pub struct OpsError {
    /// The exit status.
    pub exit: u8,
    /// What went wrong, and what to do.
    pub message: String,
}

impl fmt::Display for OpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpsError {}

/// One entity as `GET /api/v1/roster` gives it.
#[derive(Clone, Debug, Deserialize)]
pub struct Row {
    /// Its gid.
    #[serde(default)]
    pub gid: Option<String>,
    /// Name.
    pub name: String,
    /// Host.
    pub host: String,
    /// Role.
    pub role: String,
    /// Profile.
    #[serde(default)]
    pub profile: Option<String>,
    /// The sandbox runtime it runs in (`bwrap`); none when unsandboxed.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// The role its profile declares (`backend`).
    #[serde(default)]
    pub profile_role: Option<String>,
    /// Session status.
    pub status: String,
    /// What the pane host says its agent does.
    #[serde(default)]
    pub agent_status: Option<String>,
    /// Pane.
    #[serde(default)]
    pub pane: Option<String>,
    /// Messages held for it (this host's only).
    #[serde(default)]
    pub held: Option<usize>,
    /// Messages queued for it (this host's only).
    #[serde(default)]
    pub queued: Option<usize>,
    /// When it last called in, Unix ms.
    #[serde(default)]
    pub last_seen_ms: Option<i64>,
    /// For a worker or architect of this host: its owner (`name`, or `name@host` for a lead of
    /// another host).
    #[serde(default)]
    pub owner: Option<String>,
}

/// One host as `GET /api/v1/roster` gives it.
#[derive(Clone, Debug, Deserialize)]
pub struct Host {
    /// Host id.
    pub host: String,
    /// `up` or `unknown`.
    pub status: String,
    /// The profiles it can spawn.
    #[serde(default)]
    pub profiles: Vec<String>,
    /// When it was last heard of, Unix ms; none for the gateway asked.
    #[serde(default)]
    pub last_seen_ms: Option<i64>,
}

/// `GET /api/v1/roster`.
#[derive(Clone, Debug, Deserialize)]
struct Roster {
    /// Who asked: a lead (none for an operator).
    #[serde(default)]
    you: Option<Row>,
    entities: Vec<Row>,
    hosts: Vec<Host>,
}

/// `then_ms` as time before `now_ms`: `4s ago`, `12m ago`, `3h ago`, `2d ago`; `-` for never.
pub fn ago(now_ms: i64, then_ms: Option<i64>) -> String {
    let Some(then) = then_ms else {
        return "-".into();
    };
    let s = (now_ms - then).max(0) / 1000;
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86_400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

/// The ANSI colour of a status: green for ready, yellow for at work, red for trouble.
fn status_colour(status: &str) -> Option<&'static str> {
    match status {
        "idle" | "up" => Some("32"),
        "busy" | "asking" | "spawning" | "working" => Some("33"),
        "stopping" | "gone" | "unknown" | "unreachable" | "blocked" => Some("31"),
        _ => None,
    }
}

/// One cell: its text, and the colour it gets on a terminal.
struct Cell {
    text: String,
    colour: Option<&'static str>,
}

impl Cell {
    fn plain(text: impl AsRef<str>) -> Self {
        Self {
            text: printable(text.as_ref()),
            colour: None,
        }
    }

    fn status(text: &str) -> Self {
        Self {
            text: printable(text),
            colour: status_colour(text),
        }
    }
}

/// `text` with every control character shown as `?`: what another host announced (a name, a
/// status) reaches the terminal as text, never as an escape sequence. So are the invisible
/// characters that change how text around them reads (bidirectional overrides and isolates,
/// zero-width ones), which could make a name or a reason look like another.
pub fn printable(text: &str) -> String {
    text.chars().map(|c| mark(c, false)).collect()
}

/// `c` as a terminal may show it: `?` for a control or invisible character (line breaks and
/// tabs kept when `lines`).
fn mark(c: char, lines: bool) -> char {
    match c {
        '\n' | '\t' if lines => c,
        c if c.is_control() || invisible(c) => '?',
        c => c,
    }
}

/// Whether `c` is a format character that is not shown but changes how text reads.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}'
    )
}

/// Column widths for `natural` ones within `limit` characters (a space between columns):
/// the widest column gives a character at a time, none below its header's width or 4.
fn fit(natural: &[usize], headers: &[&str], limit: Option<usize>) -> Vec<usize> {
    let mut widths = natural.to_vec();
    let Some(limit) = limit else {
        return widths;
    };
    let total = |w: &[usize]| w.iter().sum::<usize>() + w.len().saturating_sub(1);
    while total(&widths) > limit {
        let floor = |i: usize| headers.get(i).map_or(4, |h| h.chars().count().max(4));
        let widest = widths
            .iter()
            .enumerate()
            .filter(|(i, w)| **w > floor(*i))
            .max_by_key(|(_, w)| **w)
            .map(|(i, _)| i);
        match widest {
            Some(i) => widths[i] -= 1,
            None => break,
        }
    }
    widths
}

/// `text` in `width` characters: cut with `…`, else padded.
fn fitted(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        format!("{text}{}", " ".repeat(width - n))
    } else {
        let cut: String = text.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// A table of `rows` under `headers`, within `width` characters when given, coloured when
/// `colour`.
fn table(headers: &[&str], rows: &[Vec<Cell>], width: Option<usize>, colour: bool) -> String {
    let natural: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.text.chars().count())
                .chain([h.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let widths = fit(&natural, headers, width);
    let line = |cells: Vec<(String, Option<&'static str>)>| {
        let last = cells.len().saturating_sub(1);
        let parts: Vec<String> = cells
            .into_iter()
            .enumerate()
            .map(|(i, (text, paint))| {
                let w = widths.get(i).copied().unwrap_or(0);
                let text = fitted(&text, w);
                let text = if i == last {
                    text.trim_end().to_string()
                } else {
                    text
                };
                match paint {
                    Some(code) if colour => format!("\x1b[{code}m{text}\x1b[0m"),
                    _ => text,
                }
            })
            .collect();
        parts.join(" ").trim_end().to_string()
    };
    let mut out = line(headers.iter().map(|h| (h.to_string(), None)).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(
            row.iter().map(|c| (c.text.clone(), c.colour)).collect(),
        ));
        out.push('\n');
    }
    out
}

/// `fleetd ls`'s table: besides its profile, what each runs in (`SANDBOX`) and the role its
/// profile declares (`FOR`).
pub fn ls_table(rows: &[Row], now_ms: i64, width: Option<usize>, colour: bool) -> String {
    let count = |n: Option<usize>| n.map_or("-".to_string(), |n| n.to_string());
    let cells: Vec<Vec<Cell>> = rows
        .iter()
        .map(|r| {
            vec![
                Cell::plain(&r.name),
                Cell::plain(&r.host),
                Cell::plain(&r.role),
                Cell::plain(r.profile.as_deref().unwrap_or("-")),
                Cell::plain(r.sandbox.as_deref().unwrap_or("-")),
                Cell::plain(r.profile_role.as_deref().unwrap_or("-")),
                Cell::status(&r.status),
                match &r.agent_status {
                    Some(agent) => Cell::status(agent),
                    None => Cell::plain("-"),
                },
                Cell::plain(r.pane.as_deref().unwrap_or("-")),
                Cell::plain(count(r.held)),
                Cell::plain(count(r.queued)),
                Cell::plain(ago(now_ms, r.last_seen_ms)),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "HOST",
            "ROLE",
            "PROFILE",
            "SANDBOX",
            "FOR",
            "STATUS",
            "AGENT",
            "PANE",
            "HELD",
            "QUEUED",
            "LAST SEEN",
        ],
        &cells,
        width,
        colour,
    )
}

/// `fleetd hosts`'s table.
pub fn hosts_table(hosts: &[Host], now_ms: i64, width: Option<usize>, colour: bool) -> String {
    let cells: Vec<Vec<Cell>> = hosts
        .iter()
        .map(|h| {
            vec![
                Cell::plain(&h.host),
                Cell::status(&h.status),
                Cell::plain(match h.last_seen_ms {
                    Some(_) => ago(now_ms, h.last_seen_ms),
                    None => "(this one)".into(),
                }),
                Cell::plain(if h.profiles.is_empty() {
                    "-".into()
                } else {
                    h.profiles.join(",")
                }),
            ]
        })
        .collect();
    table(
        &["HOST", "STATUS", "LAST SEEN", "PROFILES"],
        &cells,
        width,
        colour,
    )
}

/// The lead to ask as: the one named, or the only one declared.
fn pick_lead(config: &Config, named: Option<&str>) -> anyhow::Result<String> {
    let declared: Vec<&str> = config.leads.keys().map(String::as_str).collect();
    match (named, declared.as_slice()) {
        (Some(name), _) => Ok(name.to_string()),
        (None, [only]) => Ok((*only).to_string()),
        // The config always declares one at least (a default one when it names none).
        (None, many) => anyhow::bail!(
            "several leads are declared ({}): say which to ask as with --lead NAME",
            many.join(", ")
        ),
    }
}

/// What a serving gateway wrote of itself: the base URL it answers at, and its pid.
pub fn read_serving(text: &str) -> Option<(String, Option<i32>)> {
    let mut lines = text.lines();
    let url = lines
        .next()
        .map(str::trim)
        .filter(|s| s.starts_with("http://") || s.starts_with("https://"))?;
    let pid = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("pid "))
        .and_then(|p| p.parse().ok());
    Some((url.to_string(), pid))
}

/// Where the gateway of this state dir answers: what its `serve` wrote, else `gateway.listen`.
/// A gateway that wrote it and is gone since answers nowhere: exit status 3, saying so.
fn base_url(config: &Config, state: &StateDir) -> anyhow::Result<String> {
    let written = std::fs::read_to_string(state.serving_path())
        .ok()
        .and_then(|text| read_serving(&text));
    match written {
        Some((url, Some(pid))) if !alive(pid) => Err(OpsError {
            exit: EXIT_UNREACHABLE,
            message: format!(
                "no fleetd is serving the state dir {}: the one that served at {url} (pid {pid}) is gone; start it with `fleetd serve`",
                state.root().display()
            ),
        }
        .into()),
        Some((url, _)) => Ok(url),
        None => Ok(crate::serve::local_base(config.gateway.listen)),
    }
}

/// Whether process `pid` is alive.
pub fn alive(pid: i32) -> bool {
    rustix::process::Pid::from_raw(pid)
        .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok())
}

/// Where and as whom an operator command asks: the gateway's URL for a path, the lead's
/// token, and what to name in an error.
pub struct Target {
    /// The URL asked.
    pub url: String,
    /// Who asks: `lead 'NAME'` or `operator 'NAME'`.
    pub who: String,
    /// Its token.
    pub token: String,
    /// The state dir the gateway serves, for errors.
    pub state: StateDir,
}

/// The gateway to ask `path?query` of, as the operator or lead picked, with its token.
pub fn target(
    paths: &Paths,
    args: &OpsArgs,
    path: &str,
    query: &[(&str, String)],
) -> anyhow::Result<Target> {
    let (config, state) = paths.resolve()?;
    let (who, name, file) = match &args.operator {
        Some(name) => {
            anyhow::ensure!(
                config.operators.contains_key(name),
                "no operator named '{name}' is declared in config: add an [operators.{name}] block"
            );
            (
                format!("operator '{name}'"),
                name.clone(),
                state.operator_token_path(name),
            )
        }
        None => {
            let lead = pick_lead(&config, args.lead.as_deref())?;
            let file = state.lead_token_path(&lead);
            (format!("lead '{lead}'"), lead, file)
        }
    };
    // Read, never minted: minting would revoke the token in use.
    let token = std::fs::read_to_string(&file)
        .map(|t| t.trim().to_string())
        .with_context(|| {
            format!(
                "no token for {who} at {} (is --state-dir right? `fleetd token {name}` makes one)",
                file.display()
            )
        })?;
    let mut url = url::Url::parse(&base_url(&config, &state)?)
        .and_then(|base| base.join(path))
        .context("the gateway's address")?;
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    Ok(Target {
        url: url.to_string(),
        who,
        token,
        state,
    })
}

/// The error of a gateway that did not answer `url` within `wait`.
pub fn unreachable(target: &Target, wait: std::time::Duration, e: &reqwest::Error) -> OpsError {
    OpsError {
        exit: EXIT_UNREACHABLE,
        message: format!(
            "no fleetd answers at {} (within {} s): is `fleetd serve` running on this state dir ({})? ({e})",
            target.url,
            wait.as_secs(),
            target.state.root().display()
        ),
    }
}

/// The error of a gateway that answered `status` and `text`, not what was asked: exit status
/// 4 for a refused token.
pub fn refusal(target: &Target, status: reqwest::StatusCode, text: &str) -> anyhow::Error {
    let Ok(body) = serde_json::from_str::<Value>(text) else {
        return anyhow::anyhow!("{} answered {status}: {}", target.url, printable(text));
    };
    let said = printable(body["message"].as_str().unwrap_or(status.as_str()));
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return OpsError {
            exit: EXIT_REFUSED,
            message: format!("the gateway refused {}: {said}", target.who),
        }
        .into();
    }
    anyhow::anyhow!("{said}")
}

/// Asks the gateway, as the operator or lead picked: `GET path?query`, or with `body`, `POST path` with it.
fn request(
    paths: &Paths,
    args: &OpsArgs,
    path: &str,
    query: &[(&str, String)],
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let target = target(paths, args, path, query)?;
    let url = &target.url;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // A send waits for its answer as long as it asked to, and then some.
        let wait = body
            .as_ref()
            .and_then(|b| b["wait_s"].as_u64())
            .map_or(ANSWER_WITHIN, |s| {
                ANSWER_WITHIN + std::time::Duration::from_secs(s)
            });
        let client = reqwest::Client::builder().timeout(wait).build()?;
        let request = match &body {
            Some(body) => client.post(url).json(body),
            None => client.get(url),
        };
        let response = request
            .bearer_auth(&target.token)
            .send()
            .await
            .map_err(|e| unreachable(&target, wait, &e))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| OpsError {
            exit: EXIT_UNREACHABLE,
            message: format!(
                "{url} answered {status}, then nothing more within {} s: {e}",
                wait.as_secs()
            ),
        })?;
        if !status.is_success() {
            return Err(refusal(&target, status, &text));
        }
        let body = serde_json::from_str::<Value>(&text)
            .map_err(|_| anyhow::anyhow!("{url} answered {status}: {}", printable(&text)))?;
        Ok(body)
    })
}

/// `value` as pretty JSON that is safe on a terminal: JSON escapes the C0 controls, and the
/// other control characters (DEL, C1), which may stand only inside strings, are escaped too.
pub fn terminal_json(value: &Value) -> String {
    format!("{value:#}")
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' {
                format!("\\u{:04x}", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The terminal's width and whether to colour, for standard output.
pub fn terminal() -> (Option<usize>, bool) {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return (None, false);
    }
    let width = rustix::termios::tcgetwinsize(&stdout)
        .ok()
        .map(|size| usize::from(size.ws_col))
        .filter(|w| *w > 0);
    // NO_COLOR set to anything but empty turns colour off.
    let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    (width, !no_colour)
}

fn now_ms() -> i64 {
    fleet_core::clock::now_ms()
}

/// `fleetd msgs`
#[derive(Debug, Args)]
pub struct MsgsArgs {
    /// Who to ask as, and how to print.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// Only messages in this state: queued, injecting, injected, held, consumed or failed.
    #[arg(long)]
    pub state: Option<String>,
    /// Only messages of this kind: SEND, REPLY, FAILED (the failures told to senders, dead
    /// letters among them), …
    #[arg(long)]
    pub kind: Option<String>,
    /// Only messages to this entity (a name, live or gone, or a gid).
    #[arg(long)]
    pub to: Option<String>,
    /// Only messages from this entity (a name, live or gone, or a gid).
    #[arg(long)]
    pub from: Option<String>,
    /// Only messages sent by or to this entity (a name, live or gone, or a gid).
    #[arg(long)]
    pub with: Option<String>,
    /// Only messages older than this one: the next page, as the last listing named it.
    #[arg(long)]
    pub before: Option<String>,
    /// Only messages made this long ago or since: 30s, 10m, 2h, 1d.
    #[arg(long, value_parser = parse_since)]
    pub since: Option<std::time::Duration>,
    /// Show each message's text too (left out unless asked: it may hold anything).
    #[arg(long)]
    pub text: bool,
    /// At most this many, the newest (1 to 1000).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// A time span as `--since` takes it: a whole number and `s`, `m`, `h` or `d`.
pub fn parse_since(text: &str) -> Result<std::time::Duration, String> {
    let unit = text
        .chars()
        .last()
        .ok_or_else(|| "empty: give a span like 10m".to_string())?;
    let seconds = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => {
            return Err(format!(
                "'{text}' has no unit: give a span like 30s, 10m, 2h or 1d"
            ));
        }
    };
    let number: u64 = text[..text.len() - unit.len_utf8()]
        .parse()
        .map_err(|_| format!("'{text}' is not a whole number and a unit, like 10m"))?;
    number
        .checked_mul(seconds)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("'{text}' is too long a span"))
}

/// One message as `GET /api/v1/messages` gives it.
#[derive(Clone, Debug, Deserialize)]
pub struct MessageLine {
    /// Its id.
    pub msg_id: String,
    /// Its kind.
    pub kind: String,
    /// Its sender's name.
    pub from_name: String,
    /// Its recipient's name.
    pub to_name: String,
    /// Its state.
    pub state: String,
    /// Why it failed.
    #[serde(default)]
    pub reason: Option<String>,
    /// How it was answered (`replied`, `failed`), if it was.
    #[serde(default)]
    pub answer: Option<String>,
    /// When it was made, Unix ms.
    pub created_ms: i64,
    /// Its text, when asked for.
    #[serde(default)]
    pub text: Option<String>,
}

/// `GET /api/v1/messages`.
#[derive(Clone, Debug, Deserialize)]
struct Messages {
    messages: Vec<MessageLine>,
    total: usize,
    next: Option<String>,
}

/// What `fleetd msgs` says under a page that is not all there is: how much it showed, and how
/// to ask for the next one.
fn more_hint(shown: usize, total: usize, next: Option<&str>) -> Option<String> {
    let next = next?;
    Some(format!(
        "{shown} of {total} shown; for older ones, add --before {next}"
    ))
}

/// The colour of a message state.
fn state_colour(state: &str) -> Option<&'static str> {
    match state {
        "failed" => Some("31"),
        "queued" | "injecting" | "held" => Some("33"),
        "injected" | "consumed" | "replied" => Some("32"),
        _ => None,
    }
}

/// A message's state as `fleetd msgs` shows it: with how it was answered, as the web view's
/// trail does (`injected→failed`: typed, then its worker ended before replying).
fn shown_state(m: &MessageLine) -> String {
    match m.answer.as_deref() {
        Some(answer) if answer != m.state => format!("{}→{answer}", m.state),
        _ => m.state.clone(),
    }
}

/// `fleetd msgs`'s table (the `TEXT` column with `text`).
pub fn msgs_table(
    lines: &[MessageLine],
    text: bool,
    now_ms: i64,
    width: Option<usize>,
    colour: bool,
) -> String {
    let cells: Vec<Vec<Cell>> = lines
        .iter()
        .map(|m| {
            let mut row = vec![
                Cell::plain(&m.msg_id),
                Cell::plain(&m.kind),
                Cell::plain(&m.from_name),
                Cell::plain(&m.to_name),
                Cell {
                    text: printable(&shown_state(m)),
                    colour: state_colour(m.answer.as_deref().unwrap_or(&m.state)),
                },
                Cell::plain(ago(now_ms, Some(m.created_ms))),
                Cell::plain(m.reason.as_deref().unwrap_or("-")),
            ];
            if text {
                row.push(Cell::plain(m.text.as_deref().unwrap_or("")));
            }
            row
        })
        .collect();
    let mut headers = vec!["ID", "KIND", "FROM", "TO", "STATE", "AGE", "REASON"];
    if text {
        headers.push("TEXT");
    }
    table(&headers, &cells, width, colour)
}

/// `fleetd msgs`: this gateway's messages and their states.
pub fn msgs_command(paths: &Paths, args: &MsgsArgs) -> anyhow::Result<()> {
    let mut query = vec![("limit", args.limit.to_string())];
    for (key, value) in [
        ("state", &args.state),
        ("kind", &args.kind),
        ("to", &args.to),
        ("from", &args.from),
        ("with", &args.with),
        ("before", &args.before),
    ] {
        if let Some(value) = value {
            query.push((key, value.clone()));
        }
    }
    if let Some(since) = args.since {
        let span = i64::try_from(since.as_millis()).unwrap_or(i64::MAX);
        query.push(("since_ms", now_ms().saturating_sub(span).to_string()));
    }
    if args.text {
        query.push(("text", "true".into()));
    }
    let body = request(paths, &args.ops, "/api/v1/messages", &query, None)?;
    if args.ops.json {
        println!("{}", terminal_json(&body["messages"]));
    }
    let listed: Messages = serde_json::from_value(body).context("the messages' shape")?;
    if !args.ops.json {
        let (width, colour) = terminal();
        print!(
            "{}",
            msgs_table(&listed.messages, args.text, now_ms(), width, colour)
        );
    }
    // On stderr: what a script reads stays the page itself.
    if let Some(hint) = more_hint(listed.messages.len(), listed.total, listed.next.as_deref()) {
        eprintln!("{}", printable(&hint));
    }
    Ok(())
}

/// The exit status when a message was not delivered.
pub const EXIT_NOT_DELIVERED: u8 = 5;
/// The exit status when a message has no answer yet (it comes to the lead's `fleet_poll`).
pub const EXIT_NO_ANSWER_YET: u8 = 6;

/// `fleetd send`
#[derive(Debug, Args)]
pub struct SendArgs {
    /// Who to ask as, and how to print.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// The recipient: a name, `name@host`, or a gid.
    pub to: String,
    /// The message: for a worker, the task exactly as it is to be typed; `-` reads it from
    /// stdin (any size the gateway takes; its last line break dropped).
    pub message: String,
    /// Seconds to wait for the answer (0 returns at once; at most 3600).
    #[arg(long, default_value_t = 60)]
    pub wait: u64,
}

/// The most a message read from stdin may hold: more than a gateway takes (whose own limit then
/// refuses it, naming that limit).
const MAX_STDIN_MESSAGE: u64 = 16 * 1024 * 1024;

/// The message given as `arg`, or, for `-`, read from `input` (stdin): UTF-8 text of at most
/// [`MAX_STDIN_MESSAGE`] bytes, its last line break dropped (as a shell's `$(…)` drops it).
fn message_from(arg: &str, input: impl Read) -> anyhow::Result<String> {
    if arg != "-" {
        return Ok(arg.to_string());
    }
    let mut bytes = Vec::new();
    input
        .take(MAX_STDIN_MESSAGE + 1)
        .read_to_end(&mut bytes)
        .context("cannot read the message from stdin")?;
    if bytes.len() as u64 > MAX_STDIN_MESSAGE {
        bail!(
            "the message on stdin is over {} MiB",
            MAX_STDIN_MESSAGE / (1024 * 1024)
        );
    }
    let mut text =
        String::from_utf8(bytes).map_err(|_| anyhow!("the message on stdin is not UTF-8 text"))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// `fleetd answer`
#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// Who to ask as, and how to print.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// The question's turn id (as `fleetd send` printed it).
    pub turn_id: String,
    /// The answer; `-` reads it from stdin (its last line break dropped).
    pub message: String,
    /// Seconds to wait, then, for the worker's reply to the task it asked in (at most 3600).
    #[arg(long, default_value_t = 60)]
    pub wait: u64,
}

/// `fleetd stop`
#[derive(Debug, Args)]
pub struct StopArgs {
    /// Who to ask as, and how to print.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// The worker or architect: a name, `name@host`, or a gid.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub to: Option<String>,
    /// Stop every worker and architect of this host the lead owns (as an operator: every one):
    /// the end of the fleet, which a stop of fleetd itself leaves running.
    #[arg(long)]
    pub all: bool,
}

/// The workers and architects of the gateway asked (the host the roster lists without a last
/// heard time) that are not gone yet and, when a lead asks, that lead's own: what
/// `fleetd stop --all` stops, by gid (a name may be held by one still ending).
fn stoppable(roster: &Roster) -> Vec<String> {
    let here: Vec<&str> = roster
        .hosts
        .iter()
        .filter(|h| h.last_seen_ms.is_none())
        .map(|h| h.host.as_str())
        .collect();
    roster
        .entities
        .iter()
        .filter(|row| matches!(row.role.as_str(), "worker" | "architect"))
        .filter(|row| row.status != "gone" && here.contains(&row.host.as_str()))
        .filter(|row| match &roster.you {
            Some(lead) => row.owner.as_deref() == Some(lead.name.as_str()),
            None => true,
        })
        .map(|row| row.gid.clone().unwrap_or_else(|| row.name.clone()))
        .collect()
}

/// `text` for a terminal as [`printable`] shows it, but its line breaks and tabs kept (an
/// answer may run over several lines).
fn printable_lines(text: &str) -> String {
    text.chars().map(|c| mark(c, true)).collect()
}

/// What `fleetd send` prints for `fleet_send`'s answer, and its exit status: the reply's text
/// (0); why it was not delivered (5); or that no answer came in time, or a worker asks
/// something first (6).
pub fn send_outcome(answer: &Value) -> (String, u8) {
    let text = |key: &str| printable_lines(answer[key].as_str().unwrap_or_default());
    match answer["status"].as_str() {
        Some("replied") => (
            printable_lines(answer["reply"]["text"].as_str().unwrap_or_default()),
            0,
        ),
        Some("failed") => (
            format!("not delivered: {}", text("reason")),
            EXIT_NOT_DELIVERED,
        ),
        Some("answered") => (
            "answered: the worker goes on with a task of someone else's".into(),
            0,
        ),
        Some("asked") => (
            format!(
                "'{}' asks: {} (answer it with `fleetd answer {} MESSAGE`)",
                printable(answer["ask"]["from_name"].as_str().unwrap_or("a worker")),
                printable_lines(answer["ask"]["question"].as_str().unwrap_or_default()),
                printable(answer["ask"]["turn_id"].as_str().unwrap_or_default()),
            ),
            EXIT_NO_ANSWER_YET,
        ),
        _ => (
            format!(
                "no answer yet ({}): it will be held for the lead's fleet_poll",
                text("note")
            ),
            EXIT_NO_ANSWER_YET,
        ),
    }
}

/// `fleetd send NAME MESSAGE`: `fleet_send` as the lead.
pub fn send_command(paths: &Paths, args: &SendArgs) -> anyhow::Result<()> {
    let message = message_from(&args.message, std::io::stdin().lock())?;
    let body = serde_json::json!({"to": args.to, "message": message, "wait_s": args.wait});
    let answer = request(paths, &args.ops, "/api/v1/send", &[], Some(body))?;
    print_send(&answer, args.ops.json)
}

/// `fleetd answer TURN_ID MESSAGE`: answers a worker's question as the lead, as
/// `fleet_send{turn_id}` does, and prints the reply that follows (exit statuses as for a send).
pub fn answer_command(paths: &Paths, args: &AnswerArgs) -> anyhow::Result<()> {
    let message = message_from(&args.message, std::io::stdin().lock())?;
    let body =
        serde_json::json!({"turn_id": args.turn_id, "message": message, "wait_s": args.wait});
    let answer = request(paths, &args.ops, "/api/v1/send", &[], Some(body))?;
    print_send(&answer, args.ops.json)
}

/// Prints a send's answer (or its JSON), failing with the exit status it calls for.
fn print_send(answer: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", terminal_json(answer));
        return Ok(());
    }
    let (text, exit) = send_outcome(answer);
    if exit == 0 {
        println!("{text}");
        return Ok(());
    }
    Err(OpsError {
        exit,
        message: text,
    }
    .into())
}

/// `fleetd stop NAME`: `fleet_stop` as the lead.
pub fn stop_command(paths: &Paths, args: &StopArgs) -> anyhow::Result<()> {
    let names = match &args.to {
        Some(to) => vec![to.clone()],
        None => {
            let body = request(paths, &args.ops, "/api/v1/roster", &[], None)?;
            stoppable(&serde_json::from_value(body).context("the roster's shape")?)
        }
    };
    let mut refused = 0usize;
    for to in &names {
        let body = serde_json::json!({ "to": to });
        match request(paths, &args.ops, "/api/v1/stop", &[], Some(body)) {
            Ok(answer) if args.ops.json => println!("{}", terminal_json(&answer)),
            Ok(answer) => println!(
                "stopped {}",
                printable(answer["name"].as_str().unwrap_or(to))
            ),
            // One of several refused (another lead's, or stopped meanwhile): said, and the rest
            // still stopped.
            Err(e) if args.all => {
                refused += 1;
                eprintln!("not stopped {}: {e:#}", printable(to));
            }
            Err(e) => return Err(e),
        }
    }
    if args.all && names.is_empty() {
        println!("no worker or architect to stop");
    }
    if refused > 0 {
        anyhow::bail!("{refused} of {} not stopped", names.len());
    }
    Ok(())
}

/// Prints the roster's `part` (`entities` or `hosts`): its JSON, or the table `render` makes.
fn print_roster(
    paths: &Paths,
    args: &OpsArgs,
    part: &str,
    render: fn(&Roster, i64, Option<usize>, bool) -> String,
) -> anyhow::Result<()> {
    let body = request(paths, args, "/api/v1/roster", &[], None)?;
    if args.json {
        println!("{}", terminal_json(&body[part]));
        return Ok(());
    }
    let roster: Roster = serde_json::from_value(body).context("the roster's shape")?;
    let (width, colour) = terminal();
    print!("{}", render(&roster, now_ms(), width, colour));
    Ok(())
}

/// `fleetd ls`: the roster across hosts.
pub fn ls_command(paths: &Paths, args: &OpsArgs) -> anyhow::Result<()> {
    print_roster(paths, args, "entities", |roster, now, width, colour| {
        ls_table(&roster.entities, now, width, colour)
    })
}

/// `fleetd hosts`: the hosts of the fleet.
pub fn hosts_command(paths: &Paths, args: &OpsArgs) -> anyhow::Result<()> {
    print_roster(paths, args, "hosts", |roster, now, width, colour| {
        hosts_table(&roster.hosts, now, width, colour)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_that_is_not_all_says_how_to_read_on() {
        assert_eq!(more_hint(50, 50, None), None);
        assert_eq!(
            more_hint(50, 812, Some("0193-id")).as_deref(),
            Some("50 of 812 shown; for older ones, add --before 0193-id")
        );
    }

    #[test]
    fn a_message_of_dash_is_read_from_stdin_whole_but_its_last_line_break() {
        assert_eq!(message_from("hi", &b"unread"[..]).unwrap(), "hi");
        let big = format!("{}\nlast\n", "x".repeat(200_000));
        assert_eq!(
            message_from("-", big.as_bytes()).unwrap(),
            big[..big.len() - 1]
        );
        assert_eq!(message_from("-", &b"a\r\n"[..]).unwrap(), "a");
        assert_eq!(message_from("-", &b""[..]).unwrap(), "");
        let err = message_from("-", &[0xff, 0xfe][..]).unwrap_err();
        assert!(err.to_string().contains("not UTF-8"), "{err}");
        let over = std::io::repeat(b'a').take(MAX_STDIN_MESSAGE + 1);
        let err = message_from("-", over).unwrap_err();
        assert!(err.to_string().contains("over 16 MiB"), "{err}");
    }

    #[test]
    fn stop_all_names_the_live_workers_and_architects_of_the_gateway_asked() {
        let entities = serde_json::json!([
            {"gid": "g0", "name": "lead", "host": "a", "role": "lead", "status": "idle"},
            {"gid": "g1", "name": "w1", "host": "a", "role": "worker", "status": "busy", "owner": "lead"},
            {"gid": "g2", "name": "arch", "host": "a", "role": "architect", "status": "idle", "owner": "lead"},
            {"gid": "g3", "name": "old", "host": "a", "role": "worker", "status": "gone", "owner": "lead"},
            {"gid": "g4", "name": "far", "host": "b", "role": "worker", "status": "idle"},
            {"gid": "g5", "name": "hers", "host": "a", "role": "worker", "status": "idle", "owner": "other"}
        ]);
        let hosts = serde_json::json!([
            {"host": "a", "status": "up"},
            {"host": "b", "status": "up", "last_seen_ms": 5}
        ]);
        let as_lead: Roster = serde_json::from_value(serde_json::json!({
            "you": {"gid": "g0", "name": "lead", "host": "a", "role": "lead", "status": "idle"},
            "entities": entities, "hosts": hosts
        }))
        .unwrap();
        assert_eq!(stoppable(&as_lead), ["g1", "g2"]);
        let as_operator: Roster =
            serde_json::from_value(serde_json::json!({"entities": entities, "hosts": hosts}))
                .unwrap();
        assert_eq!(stoppable(&as_operator), ["g1", "g2", "g5"]);
    }

    fn row(name: &str, status: &str, held: Option<usize>) -> Row {
        Row {
            gid: None,
            name: name.into(),
            host: "laptop".into(),
            role: "worker".into(),
            profile: Some("claude".into()),
            sandbox: None,
            profile_role: None,
            status: status.into(),
            agent_status: None,
            pane: Some("%3".into()),
            held,
            queued: held,
            last_seen_ms: Some(1_000),
            owner: None,
        }
    }

    #[test]
    fn a_serving_file_gives_the_url_and_the_pid() {
        assert_eq!(
            read_serving("http://127.0.0.1:5\npid 42\n"),
            Some(("http://127.0.0.1:5".to_string(), Some(42)))
        );
        assert_eq!(
            read_serving("http://127.0.0.1:5\n"),
            Some(("http://127.0.0.1:5".to_string(), None))
        );
        assert_eq!(read_serving("garbage\npid 1\n"), None);
        assert!(alive(i32::try_from(std::process::id()).unwrap()));
    }

    #[test]
    fn a_sends_answer_reads_as_its_text_or_says_why_not_with_its_exit_status() {
        let replied =
            serde_json::json!({"status": "replied", "reply": {"text": "line 1\nok\x1b[2J"}});
        assert_eq!(send_outcome(&replied), ("line 1\nok?[2J".into(), 0));
        let failed = serde_json::json!({"status": "failed", "reason": "'w1' is gone"});
        assert_eq!(
            send_outcome(&failed),
            ("not delivered: 'w1' is gone".into(), EXIT_NOT_DELIVERED)
        );
        let pending = serde_json::json!({"status": "pending", "note": "no answer within 0 s"});
        let (text, exit) = send_outcome(&pending);
        assert_eq!(exit, EXIT_NO_ANSWER_YET);
        assert!(text.contains("fleet_poll"), "{text}");
        let asked = serde_json::json!({"status": "asked", "ask": {"question": "port?", "turn_id": "t1", "from_name": "w1"}});
        let (text, exit) = send_outcome(&asked);
        assert_eq!(exit, EXIT_NO_ANSWER_YET);
        assert!(
            text.contains("'w1' asks: port?") && text.contains("`fleetd answer t1 MESSAGE`"),
            "{text}"
        );
    }

    #[test]
    fn text_for_a_terminal_shows_controls_and_invisible_reorderings_as_marks() {
        assert_eq!(printable("w1\u{1b}[2J\u{7}"), "w1?[2J?");
        // "evil\u{202E}txt.exe" would read "evilexe.txt".
        assert_eq!(printable("evil\u{202E}txt.exe"), "evil?txt.exe");
        assert_eq!(printable("a\u{200B}b\u{2066}c\u{feff}"), "a?b?c?");
        assert_eq!(printable_lines("a\n\u{202E}b\t\u{1b}"), "a\n?b\t?");
        assert_eq!(printable("naïve 名前 → ok"), "naïve 名前 → ok");
    }

    #[test]
    fn json_for_a_terminal_escapes_every_control_character() {
        let value = serde_json::json!({"name": "a\u{7f}b\u{9b}c\u{1b}d", "n": 1});
        let text = terminal_json(&value);
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn spans_read_as_a_number_and_a_unit() {
        assert_eq!(parse_since("30s"), Ok(std::time::Duration::from_secs(30)));
        assert_eq!(parse_since("10m"), Ok(std::time::Duration::from_secs(600)));
        assert_eq!(parse_since("2h"), Ok(std::time::Duration::from_secs(7200)));
        assert_eq!(
            parse_since("1d"),
            Ok(std::time::Duration::from_secs(86_400))
        );
        for bad in ["", "10", "m", "1.5h", "-1m", "10w", "99999999999999999999d"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_message_listing_shows_text_only_when_asked_and_never_raw() {
        let line = MessageLine {
            msg_id: "01a2".into(),
            kind: "SEND".into(),
            from_name: "lead".into(),
            to_name: "w1".into(),
            state: "failed".into(),
            reason: Some("'w1' is gone".into()),
            answer: None,
            created_ms: 1_000,
            text: Some("two\nlines\x1b[2J".into()),
        };
        let plain = msgs_table(std::slice::from_ref(&line), false, 61_000, None, false);
        assert!(!plain.contains("TEXT") && !plain.contains("two"), "{plain}");
        assert!(
            plain.contains("'w1' is gone") && plain.contains("1m ago"),
            "{plain}"
        );
        let shown = msgs_table(&[line], true, 61_000, None, true);
        assert!(shown.contains("two?lines?[2J"), "{shown:?}");
        assert!(shown.contains("\x1b[31mfailed"), "{shown:?}");
    }

    #[test]
    fn a_task_typed_and_then_failed_shows_both_in_the_failures_colour() {
        let line = |state: &str, answer: Option<&str>| MessageLine {
            msg_id: "01a2".into(),
            kind: "SEND".into(),
            from_name: "lead".into(),
            to_name: "w1".into(),
            state: state.into(),
            reason: None,
            answer: answer.map(String::from),
            created_ms: 1_000,
            text: None,
        };
        for (answer, shown) in [
            ("failed", "\x1b[31minjected→failed"),
            ("replied", "\x1b[32minjected→replied"),
        ] {
            let table = msgs_table(&[line("injected", Some(answer))], false, 1_000, None, true);
            assert!(table.contains(shown), "{table:?}");
        }
        // Failed before it was typed: one word, as before.
        let plain = msgs_table(&[line("failed", Some("failed"))], false, 1_000, None, false);
        assert!(
            plain.contains(" failed ") && !plain.contains('→'),
            "{plain:?}"
        );
        let waiting = msgs_table(&[line("queued", None)], false, 1_000, None, false);
        assert!(waiting.contains(" queued "), "{waiting:?}");
    }

    #[test]
    fn times_read_as_how_long_ago() {
        assert_eq!(ago(61_000, Some(1_000)), "1m ago");
        assert_eq!(ago(5_000, Some(1_000)), "4s ago");
        assert_eq!(ago(1_000 + 7_200_000, Some(1_000)), "2h ago");
        assert_eq!(ago(1_000, Some(5_000)), "0s ago");
        assert_eq!(ago(1_000, None), "-");
    }

    #[test]
    fn a_table_lines_its_columns_up_and_colours_only_when_asked() {
        let rows = [row("w1", "idle", Some(2)), row("a-long-name", "busy", None)];
        let text = ls_table(&rows, 5_000, None, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("NAME        HOST   ROLE"), "{text}");
        let status_at = lines[0].find("STATUS").unwrap();
        assert_eq!(&lines[1][status_at..status_at + 4], "idle", "{text}");
        assert_eq!(&lines[2][status_at..status_at + 4], "busy", "{text}");
        assert!(lines[1].ends_with("2    2      4s ago"), "{text}");
        assert!(lines[2].contains(" -    -      4s ago"), "{text}");
        assert!(!text.contains('\x1b'), "{text}");
        let coloured = ls_table(&rows, 5_000, None, true);
        assert!(coloured.contains("\x1b[32midle"), "{coloured}");
        assert!(coloured.contains("\x1b[33mbusy"), "{coloured}");
    }

    #[test]
    fn a_table_shows_what_each_runs_in_and_what_its_profile_is_for() {
        let mut boxed = row("b1", "idle", None);
        boxed.sandbox = Some("bwrap".into());
        boxed.profile_role = Some("backend".into());
        let text = ls_table(&[boxed, row("w1", "idle", None)], 5_000, None, false);
        let lines: Vec<&str> = text.lines().collect();
        let at = |header: &str| lines[0].find(header).unwrap();
        let (sandbox, role) = (at("SANDBOX"), at("FOR"));
        assert!(
            at("PROFILE") < sandbox && sandbox < role && role < at("STATUS"),
            "{text}"
        );
        assert_eq!(&lines[1][sandbox..sandbox + 5], "bwrap", "{text}");
        assert_eq!(&lines[1][role..role + 7], "backend", "{text}");
        assert_eq!(&lines[2][sandbox..sandbox + 2], "- ", "{text}");
        assert_eq!(&lines[2][role..role + 2], "- ", "{text}");
    }

    #[test]
    fn a_table_fits_a_narrow_terminal_by_cutting_its_widest_columns() {
        let mut long = row("w", "idle", Some(1));
        long.name = "a".repeat(60);
        long.profile = Some("p".repeat(40));
        let text = ls_table(&[long], 5_000, Some(80), false);
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{} chars: {line}", line.len());
        }
        assert!(text.contains('…'), "{text}");
        assert!(text.lines().next().unwrap().contains("LAST SEEN"), "{text}");
    }

    #[test]
    fn what_another_host_announced_reaches_the_terminal_as_text() {
        let mut hostile = row("w\x1b]0;pwned\x07", "idle\x1b[2J", None);
        hostile.host = "far\r\nbox".into();
        let text = ls_table(&[hostile], 5_000, None, true);
        assert!(
            !text.contains("\x1b]") && !text.contains("\x1b[2J"),
            "{text:?}"
        );
        assert!(!text.contains('\x07') && !text.contains('\r'), "{text:?}");
        assert!(
            text.contains("w?]0;pwned?") && text.contains("far??box"),
            "{text:?}"
        );
    }

    #[test]
    fn the_lead_to_ask_as_is_the_only_one_or_the_one_named() {
        let config = |toml: &str| {
            crate::config::Config::parse(std::path::Path::new("fleetd.toml"), toml).unwrap()
        };
        let one = config("[leads.alice]\n");
        assert_eq!(pick_lead(&one, None).unwrap(), "alice");
        let two = config("[leads.alice]\n[leads.bob]\n");
        let err = pick_lead(&two, None).unwrap_err().to_string();
        assert!(
            err.contains("alice, bob") && err.contains("--lead"),
            "{err}"
        );
        assert_eq!(pick_lead(&two, Some("bob")).unwrap(), "bob");
    }
}
