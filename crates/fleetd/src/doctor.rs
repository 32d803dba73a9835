//! `fleetd doctor`: what would keep this host's fleetd from working, each check with how to fix
//! what it found — the config, the state dir, the pane host, every profile's program, the
//! broker (login, vhost, TLS), the other hosts' clocks against this one's (from their signed
//! heartbeats), and whether a gateway serves the state dir now.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::config::{Config, ProfileKind};
use crate::launch::locate_program;
use crate::mux::{MuxChoice, choose};
use crate::ops::{OpsError, alive, printable, read_serving};
use crate::paths::Paths;
use crate::state::StateDir;

/// How long the broker may take to let fleetd in.
const BROKER_WITHIN: Duration = Duration::from_secs(10);
/// How long a serving gateway may take to answer `/healthz`.
const HEALTH_WITHIN: Duration = Duration::from_secs(5);

/// What a check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Fine, with what was seen.
    Ok(String),
    /// Works, but not as meant: why, and what to do.
    Warn(String),
    /// Will not work: why, and what to do.
    Fail(String),
}

/// One check: what was looked at, and what was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was looked at.
    pub what: String,
    /// What was found.
    pub verdict: Verdict,
}

impl Check {
    fn new(what: impl Into<String>, verdict: Verdict) -> Self {
        Self {
            what: what.into(),
            verdict,
        }
    }
}

/// The report, a line per check (`ok`, `warn`, `FAIL`), coloured when `colour`.
pub fn render(checks: &[Check], colour: bool) -> String {
    let mut out = String::new();
    for check in checks {
        let (word, code, said) = match &check.verdict {
            Verdict::Ok(said) => ("ok  ", "32", said),
            Verdict::Warn(said) => ("warn", "33", said),
            Verdict::Fail(said) => ("FAIL", "31", said),
        };
        let word = if colour {
            format!("\x1b[{code}m{word}\x1b[0m")
        } else {
            word.to_string()
        };
        out.push_str(&format!("{word} {}: {}\n", check.what, printable(said)));
    }
    out
}

/// The exit status the report gives: 1 if any check failed.
pub fn exit_status(checks: &[Check]) -> u8 {
    u8::from(checks.iter().any(|c| matches!(c.verdict, Verdict::Fail(_))))
}

/// The programs each profile runs, found or not: its agent (its kind's default when its argv
/// is empty), and for a sandbox also the sandbox's runtime.
fn profiles(config: &Config) -> Vec<Check> {
    let here = std::env::current_dir().unwrap_or_default();
    config
        .profiles
        .iter()
        .map(|profile| {
            let mut programs = Vec::new();
            if profile.kind == ProfileKind::Sandbox {
                programs.extend(profile.runtime.first().cloned());
            }
            programs.extend(profile.program().first().cloned());
            // As a pane would: the profile's PATH, else fleetd's; a relative path from its cwd.
            let path = profile
                .env
                .get("PATH")
                .map(std::ffi::OsString::from)
                .or_else(|| std::env::var_os("PATH"));
            let cwd = profile.cwd.as_deref().unwrap_or(&here);
            let mut found = Vec::new();
            for program in &programs {
                match locate_program(program, path.as_deref(), cwd) {
                    Some(at) => found.push(at.display().to_string()),
                    None => {
                        let place = if program.contains('/') {
                            "an executable file"
                        } else {
                            "on PATH"
                        };
                        return Check::new(
                            format!("profile '{}'", profile.name),
                            Verdict::Fail(format!(
                                "its program '{}' is not {place}: install it, or give its path in the profile",
                                printable(program)
                            )),
                        );
                    }
                }
            }
            let verdict = if found.is_empty() {
                Verdict::Fail("it names no program: set its argv".into())
            } else {
                Verdict::Ok(format!("runs {}", found.join(" and ")))
            };
            Check::new(format!("profile '{}'", profile.name), verdict)
        })
        .collect()
}

/// The config's own warnings: what `serve` would warn of, or refuse.
fn config_checks(config: &Config) -> Vec<Check> {
    let mut checks = Vec::new();
    let env = |key: &str| std::env::var(key).ok();
    checks.push(Check::new(
        "logins",
        match config.check_logins(&env) {
            Ok(()) => Verdict::Ok("every isolated agent can log in".into()),
            Err(e) => Verdict::Fail(e),
        },
    ));
    if config.gateway.workdir_roots.is_empty()
        && config
            .profiles
            .iter()
            .any(|p| p.kind == ProfileKind::Sandbox)
    {
        checks.push(Check::new(
            "gateway.workdir_roots",
            Verdict::Warn(
                "sandbox profiles but no workdir_roots: a lead may give a sandboxed worker any directory fleetd can reach as its cwd (~/.ssh, say), which the sandbox then sees; set workdir_roots".into(),
            ),
        ));
    }
    checks
}

/// The state dir: there, the user's, and closed to others.
fn state_check(state: &StateDir) -> Check {
    use std::os::unix::fs::MetadataExt;
    let root = state.root();
    let me = rustix::process::geteuid().as_raw();
    let verdict = match root.metadata() {
        Err(_) => Verdict::Warn(format!(
            "{} does not exist yet: `fleetd serve` makes it",
            root.display()
        )),
        Ok(meta) if meta.uid() != me => Verdict::Fail(format!(
            "{} belongs to uid {}, not to this user ({me}): use a state dir of your own",
            root.display(),
            meta.uid()
        )),
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => Verdict::Warn(format!(
            "{} is open to others (mode {:o}): it holds tokens; `fleetd serve` closes it, or chmod 700 it",
            root.display(),
            meta.permissions().mode() & 0o777
        )),
        Ok(_) => Verdict::Ok(format!("{} is the user's own", root.display())),
    };
    Check::new("state dir", verdict)
}

/// The pane host fleetd would choose, and whether it answers.
fn mux_check(config: &Config, state: &StateDir) -> Check {
    let verdict = match choose(&config.mux, |key| std::env::var(key).ok(), state) {
        Err(e) => Verdict::Fail(e),
        Ok((MuxChoice::Tmux { .. }, why)) => {
            match std::process::Command::new("tmux").arg("-V").output() {
                Ok(out) if out.status.success() => Verdict::Ok(format!(
                    "{} ({why})",
                    String::from_utf8_lossy(&out.stdout).trim()
                )),
                _ => Verdict::Fail(
                    "tmux does not run here: install tmux (or run fleetd inside herdr)".into(),
                ),
            }
        }
        Ok((MuxChoice::Herdr { socket, .. }, why)) => {
            match std::os::unix::net::UnixStream::connect(&socket) {
                Ok(_) => Verdict::Ok(format!("herdr at {} ({why})", socket.display())),
                Err(e) => Verdict::Fail(format!(
                    "herdr's socket {} does not answer ({e}): start herdr, or set [mux]",
                    socket.display()
                )),
            }
        }
    };
    Check::new("pane host", verdict)
}

/// Whether a gateway serves the state dir now: its process is there and `/healthz` answers.
async fn serving_check(state: &StateDir) -> Check {
    let written = std::fs::read_to_string(state.serving_path())
        .ok()
        .and_then(|text| read_serving(&text));
    // What `/healthz` says: ok, what is wrong, or nothing at all.
    let health = |url: String| async move {
        let client = reqwest::Client::builder()
            .timeout(HEALTH_WITHIN)
            .build()
            .ok()?;
        let response = client.get(format!("{url}/healthz")).send().await.ok()?;
        if response.status().is_success() {
            return Some(Ok(()));
        }
        let said: serde_json::Value = response.json().await.unwrap_or_default();
        let problems: Vec<String> = said["problems"]
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|p| p.as_str())
                    .map(crate::logs::escape)
                    .collect()
            })
            .unwrap_or_default();
        Some(Err(problems.join("; ")))
    };
    let verdict = match written {
        Some((url, Some(pid))) if alive(pid) => match health(url.clone()).await {
            Some(Ok(())) => Verdict::Ok(format!("serving at {url} (pid {pid})")),
            Some(Err(problems)) => Verdict::Fail(format!(
                "pid {pid} answers at {url}, but cannot really serve: {problems}; restart it (its log says why)"
            )),
            None => Verdict::Fail(format!(
                "pid {pid} runs, but {url}/healthz does not answer within {} s: is it hung? (or the pid was reused)",
                HEALTH_WITHIN.as_secs()
            )),
        },
        Some((url, pid)) => Verdict::Warn(format!(
            "not serving: the last one served at {url}{} and is gone; `fleetd serve` starts it",
            pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
        )),
        None => Verdict::Warn("not serving: `fleetd serve` starts it".into()),
    };
    Check::new("gateway", verdict)
}

/// The broker, if one is configured: whether fleetd's login gets in, on its vhost, on each of
/// its nodes (one of a cluster's down is a warning: the gateway uses the others); and once in,
/// how the other hosts' clocks stand against this one's.
async fn broker_checks(config: &Config) -> Vec<Check> {
    let Some(broker) = config.broker.as_ref() else {
        return Vec::new();
    };
    let settings = crate::gateway::broker_settings(broker, &config.federation);
    let host = crate::serve::host_id(config);
    let mut links = Vec::new();
    let mut refused = Vec::new();
    for uri in &broker.uris {
        let shown = crate::config::redacted_uri(uri);
        let node = fleet_amqp::LinkSettings {
            uris: vec![uri.clone()],
            first: 0,
            ..settings.clone()
        };
        match tokio::time::timeout(BROKER_WITHIN, fleet_amqp::Link::connect(&node, &host)).await {
            Ok(Ok(link)) => links.push((shown, link)),
            Ok(Err(e)) => refused.push(format!("{shown}: {e}")),
            Err(_) => refused.push(format!(
                "{shown} did not let fleetd in within {} s: is the broker up and reachable?",
                BROKER_WITHIN.as_secs()
            )),
        }
    }
    let Some((_, first)) = links.first() else {
        return vec![Check::new(
            "broker",
            Verdict::Fail(format!(
                "{} (check [broker] uri, the login's password and its permissions on the vhost)",
                refused.join("; ")
            )),
        )];
    };
    let clocks = clock_check(config, &host, first).await;
    let shown: Vec<&str> = links.iter().map(|(shown, _)| shown.as_str()).collect();
    let verdict = if refused.is_empty() {
        Verdict::Ok(format!("{} lets fleetd@{host} in", shown.join(", ")))
    } else {
        Verdict::Warn(format!(
            "{} lets fleetd@{host} in, but {} (the gateway uses the nodes that answer)",
            shown.join(", "),
            refused.join("; ")
        ))
    };
    for (_, link) in &links {
        fleet_amqp::Broker::close(link).await;
    }
    vec![Check::new("broker", verdict), clocks]
}

/// How far each other host's clock is from this one's (ms, ahead positive), as their
/// heartbeats tell it: listens on the roster for a presence interval and a second, keeping
/// only heartbeats sealed by a key `[federation.trust]` pins for their host.
async fn clock_check(config: &Config, host: &str, link: &fleet_amqp::Link) -> Check {
    let listen = Duration::from_secs(config.federation.presence_interval_s.saturating_add(1));
    let allowed_ms = config.federation.clock_skew_s.saturating_mul(1000);
    let trust = match config.federation.trust_table() {
        Ok(trust) => trust,
        Err(why) => return Check::new("clocks", Verdict::Fail(why)),
    };
    // A roster queue of its own, beside the gateway's (if one runs).
    let queue = format!("{host}.doctor-{}", std::process::id());
    let mut heartbeats = match fleet_amqp::Broker::open_roster(link, &queue).await {
        Ok(deliveries) => deliveries,
        Err(e) => {
            return Check::new(
                "clocks",
                Verdict::Warn(format!("cannot listen to the roster: {e}")),
            );
        }
    };
    let mut offsets = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + listen;
    while let Ok(Some(Ok(delivery))) = tokio::time::timeout_at(deadline, heartbeats.next()).await {
        let received_ms = fleet_core::clock::now_ms();
        // Taken at once, so the broker keeps delivering however many entities announce.
        let _ = delivery
            .settle(fleet_core::admission::Settlement::Ack, false)
            .await;
        let Ok(envelope) = delivery.envelope() else {
            continue;
        };
        if envelope.kind != fleet_core::Kind::Presence {
            continue;
        }
        let Some(from) = envelope.from_host.clone() else {
            continue;
        };
        let trusted = config.federation.insecure_unsigned
            || crate::gateway::sealed(&trust, &envelope, &delivery);
        if from == host || !trusted {
            continue;
        }
        let ahead = i64::try_from(envelope.ts_ms)
            .unwrap_or(i64::MAX)
            .saturating_sub(received_ms);
        // Transit only makes a heartbeat look older: the least behind is the truest.
        offsets
            .entry(from)
            .and_modify(|best: &mut i64| *best = (*best).max(ahead))
            .or_insert(ahead);
    }
    Check::new("clocks", clock_verdict(&offsets, allowed_ms, listen))
}

/// What the other hosts' clock offsets (ms, ahead positive) mean against the skew a gateway
/// allows (`federation.clock_skew_s`): past it, their signed messages are refused as from the
/// future or too old; past half of it, a warning; no host heard, nothing to compare.
pub fn clock_verdict(
    offsets: &std::collections::BTreeMap<String, i64>,
    allowed_ms: u64,
    listened: Duration,
) -> Verdict {
    if offsets.is_empty() {
        return Verdict::Warn(format!(
            "heard no other host's heartbeat within {} s, so no clock to compare (is another gateway up?)",
            listened.as_secs()
        ));
    }
    let shown = |ms: i64| {
        if ms.unsigned_abs() < 1000 {
            format!("{ms:+} ms")
        } else {
            let tenths = (ms.unsigned_abs() + 50) / 100;
            let sign = if ms < 0 { '-' } else { '+' };
            format!("{sign}{}.{} s", tenths / 10, tenths % 10)
        }
    };
    let allowed = i64::try_from(allowed_ms).unwrap_or(i64::MAX);
    let worst = offsets
        .iter()
        .max_by_key(|(_, ms)| ms.unsigned_abs())
        .map(|(host, ms)| (host.as_str(), *ms));
    let all = offsets
        .iter()
        .map(|(host, ms)| format!("{host} {}", shown(*ms)))
        .collect::<Vec<_>>()
        .join(", ");
    let fix = "keep the clocks in step (chrony or systemd-timesyncd on every host)";
    match worst {
        Some((host, ms)) if ms.unsigned_abs() > allowed_ms => Verdict::Fail(format!(
            "{host}'s clock is {} from this one's, more than federation.clock_skew_s ({} s) allows, so what either sends the other is refused: {fix} ({all})",
            shown(ms),
            allowed / 1000
        )),
        Some((host, ms)) if ms.unsigned_abs() > allowed_ms / 2 => Verdict::Warn(format!(
            "{host}'s clock is {} from this one's, over half of what federation.clock_skew_s ({} s) allows: {fix} ({all})",
            shown(ms),
            allowed / 1000
        )),
        _ => Verdict::Ok(format!("other hosts' clocks against this one: {all}")),
    }
}

/// Which config fleetd runs on: the file named, the user's default file, or (neither) the
/// embedded defaults, saying where a file would be looked for.
fn config_source(paths: &Paths) -> String {
    match (&paths.config, crate::paths::config_file(None)) {
        (Some(path), _) => format!("{} loads", path.display()),
        (None, Some(path)) => format!(
            "{} loads (the user's default file; --config names another)",
            path.display()
        ),
        (None, None) => match crate::paths::default_config_path() {
            Some(default) => format!(
                "no file: none named with --config and none at {}, so fleetd runs on its embedded defaults",
                default.display()
            ),
            None => {
                "no file: none named with --config, so fleetd runs on its embedded defaults".into()
            }
        },
    }
}

/// `fleetd doctor`.
pub fn doctor_command(paths: &Paths) -> anyhow::Result<()> {
    let (config, state) = paths.resolve()?;
    let mut checks = vec![Check::new("config", Verdict::Ok(config_source(paths)))];
    checks.extend(config_checks(&config));
    checks.push(state_check(&state));
    checks.push(mux_check(&config, &state));
    checks.extend(profiles(&config));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    checks.extend(runtime.block_on(broker_checks(&config)));
    checks.push(runtime.block_on(serving_check(&state)));
    let (_, colour) = crate::ops::terminal();
    print!("{}", render(&checks, colour));
    match exit_status(&checks) {
        0 => Ok(()),
        exit => Err(OpsError {
            exit,
            message: "some checks failed: see FAIL above".into(),
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_are_judged_against_the_skew_a_gateway_allows() {
        let listened = Duration::from_secs(6);
        let offsets = |pairs: &[(&str, i64)]| {
            pairs
                .iter()
                .map(|(h, ms)| ((*h).to_string(), *ms))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let verdict = clock_verdict(&offsets(&[("b", 120), ("c", -40)]), 60_000, listened);
        assert_eq!(
            verdict,
            Verdict::Ok("other hosts' clocks against this one: b +120 ms, c -40 ms".into())
        );
        let Verdict::Warn(why) = clock_verdict(&offsets(&[("b", -31_000)]), 60_000, listened)
        else {
            panic!("over half the skew warns");
        };
        assert!(
            why.contains("b's clock is -31.0 s") && why.contains("chrony"),
            "{why}"
        );
        let Verdict::Fail(why) =
            clock_verdict(&offsets(&[("b", 10), ("c", 600_000)]), 60_000, listened)
        else {
            panic!("past the skew fails");
        };
        assert!(
            why.contains("c's clock is +600.0 s") && why.contains("(60 s)"),
            "{why}"
        );
        let Verdict::Warn(why) = clock_verdict(&offsets(&[]), 60_000, listened) else {
            panic!("nothing heard warns");
        };
        assert!(why.contains("within 6 s"), "{why}");
    }

    #[test]
    fn a_report_says_what_failed_and_fails_only_then() {
        let checks = vec![
            Check::new("tmux", Verdict::Ok("tmux 3.3a".into())),
            Check::new("leads", Verdict::Warn("none".into())),
        ];
        assert_eq!(exit_status(&checks), 0);
        assert_eq!(
            render(&checks, false),
            "ok   tmux: tmux 3.3a\nwarn leads: none\n"
        );
        let mut failing = checks;
        failing.push(Check::new("profile 'x'", Verdict::Fail("missing".into())));
        assert_eq!(exit_status(&failing), 1);
        let text = render(&failing, true);
        assert!(
            text.contains("\x1b[31mFAIL\x1b[0m profile 'x': missing"),
            "{text}"
        );
    }
}
