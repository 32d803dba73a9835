//! A local round trip cut into its steps: fleetd run with its step trace on
//! (`RUST_LOG=fleet_steps=trace`: one line per step of each task, its `round_trip`, `step` and
//! `at_us`), the client's own send and return times beside them, on the same clock; each step's
//! share is the p50 of the time since the step before, over the traced trips.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_mux::herdr::driver::Driver;
use fleet_mux::herdr::host::Herdr;
use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::herdr::RealHerdr;
use serde_json::json;

use super::percentiles;

/// What the traced fleetd logs: its warnings, and the steps.
const TRACED: (&str, Option<&str>) = ("RUST_LOG", Some("warn,fleet_steps=trace"));

/// A round trip's steps, each with the one it follows: the client's send, fleetd's steps, the
/// client's return. Once the submit is seen two things go on at once: the pump records the task
/// `injected`, while the worker's reply comes in (its call is the proof of the submit); the
/// record is a branch beside the round trip, not a step of it.
const STEPS: [(&str, &str); 11] = [
    ("sent (client)", "accepted"),
    ("accepted", "claimed"),
    ("claimed", "pasted"),
    ("pasted", "echo_seen"),
    ("echo_seen", "enter"),
    ("enter", "submit_seen"),
    ("submit_seen", "reply_received"),
    ("reply_received", "reply_held"),
    ("reply_held", "lead_woken"),
    ("lead_woken", "returned (client)"),
    ("submit_seen", "injected_recorded"),
];

/// How many of [`STEPS`] make the round trip (the rest are branches beside it).
const ON_THE_WAY: usize = 10;

/// Trips before the timed ones.
const WARM_UP: usize = 20;

/// Now, in Unix microseconds (the clock fleetd's steps are on).
fn unix_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// The value of `key=` in a step line's own fields (after its target: a span before it, whose
/// fields a client may choose, is not read), quotes taken off.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let (_, fields) = line.rsplit_once(" fleet_steps: ")?;
    let key = format!("{key}=");
    fields
        .split(' ')
        .find_map(|word| word.strip_prefix(key.as_str()))
        .map(|value| value.trim_matches('"'))
}

/// Each traced task's steps (name → Unix µs), from fleetd's log.
fn steps_in(log: &str) -> HashMap<String, HashMap<String, u128>> {
    let mut trips: HashMap<String, HashMap<String, u128>> = HashMap::new();
    for line in log.lines().filter(|l| l.contains("fleet_steps")) {
        let found = (
            field(line, "round_trip"),
            field(line, "step"),
            field(line, "at_us").and_then(|us| us.parse().ok()),
        );
        if let (Some(trip), Some(step), Some(at)) = found {
            // The first time a step is reached counts (a second Enter is the retry's).
            trips
                .entry(trip.to_string())
                .or_default()
                .entry(step.to_string())
                .or_insert(at);
        }
    }
    trips
}

/// `fleet-bench steps`: a bare tmux paste + Enter over the control connection, `trips` untraced
/// round trips, then the traced ones cut into steps; fleetd's share beside its target. The
/// same on herdr, when `HERDR_BIN` names one.
pub(super) async fn run(trips: usize) -> anyhow::Result<()> {
    println!(
        "fleet-bench steps ({} build of fleetd at {})",
        super::BUILD,
        fleet_testkit::bins::binary("fleetd")?.display()
    );
    let bare = super::local::bare_paste_enter(trips, true).await?;
    // Logging as little as the traced run does, but for the steps.
    let fleet = Fleet::start_with_env(&std::env::temp_dir(), "", &sim()?, &QUIET).await?;
    let (rtt50, _) = shares(fleet, bare, trips, ("", "bare tmux paste + Enter")).await?;
    cut(traced_on_tmux().await?, trips, rtt50).await?;
    let Some(herdr) = RealHerdr::from_env().await? else {
        println!("herdr: not measured (set HERDR_BIN to a herdr binary to measure it beside tmux)");
        return Ok(());
    };
    let (version, protocol) = Driver::new(herdr.socket()).ping().await?;
    println!(
        "herdr: {} (herdr {version}, protocol {protocol})",
        herdr.bin().display()
    );
    let host = Herdr::connect(&herdr.socket(), "fleet-bench").await?;
    let bare = super::local::bare_paste_enter_on(&host, trips).await?;
    drop(host);
    let fleet = Fleet::start_herdr_with_env(&herdr.socket(), &sim()?, &QUIET).await?;
    let what = ("herdr: ", "bare paste + Enter over herdr's socket");
    let (rtt50, bare50) = shares(fleet, bare, trips, what).await?;
    // A verified typing asks herdr EXTRA_REQUESTS more times than the bare paste + Enter does,
    // each at about half the bare figure.
    let extra = f64::from(EXTRA_REQUESTS) * bare50 / 2.0;
    println!(
        "herdr: the {EXTRA_REQUESTS} requests a verified typing makes beyond the bare two (the screen before the paste, a look that sees the echo, one that sees it hold still), at half the bare figure each: {extra:.2} ms; fleetd's share less them {:.2} ms  [proposed target ≤ 2 ms]",
        rtt50 - bare50 - extra
    );
    let traced = Fleet::start_herdr_with_env(&herdr.socket(), &sim()?, &[TRACED]).await?;
    cut(traced, trips, rtt50).await
}

/// `trips` untraced round trips through `fleet` (stopped after), printed beside `bare` (the
/// bare paste + Enter's samples on the same host) with fleetd's share; `what` is the line's
/// prefix and the bare figure's name. Returns the round trip's and the bare figure's p50s (ms).
async fn shares(
    fleet: Fleet,
    mut bare: Vec<Duration>,
    trips: usize,
    (prefix, bare_name): (&str, &str),
) -> anyhow::Result<(f64, f64)> {
    let mut untraced = super::local::round_trips(&fleet, trips).await?;
    drop(fleet);
    let (bare50, _) = percentiles(&mut bare);
    let (rtt50, rtt99) = percentiles(&mut untraced);
    println!(
        "{prefix}round trip send→inject→reply→result, {trips} trips: p50 {rtt50:.2} ms  p99 {rtt99:.2} ms; {bare_name} p50 {bare50:.2} ms; fleetd's share {:.2} ms  [target ≤ 2 ms]",
        rtt50 - bare50
    );
    Ok((rtt50, bare50))
}

/// The requests to herdr a verified typing makes beyond a bare paste and Enter, at the least:
/// the screen before the paste, a look that sees the echo, and one that sees it hold still.
const EXTRA_REQUESTS: u32 = 3;

/// fleetd's environment for an untraced run: its warnings only.
const QUIET: [(&str, Option<&str>); 1] = [("RUST_LOG", Some("warn"))];

/// The scripted agent's profile.
fn sim() -> anyhow::Result<String> {
    sim_profile("sim", &[])
}

/// fleetd on a tmux server of its own, with its step trace on.
pub(super) async fn traced_on_tmux() -> anyhow::Result<Fleet> {
    Fleet::start_with_env(&std::env::temp_dir(), "", &sim()?, &[TRACED]).await
}

/// `trips` round trips through `fleet` (started with its step trace on) to a scripted agent;
/// prints each step's share (p50) beside the traced round trip's p50 and `untraced_p50` (ms,
/// measured before in the same run).
pub(super) async fn cut(fleet: Fleet, trips: usize, untraced_p50: f64) -> anyhow::Result<()> {
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.ok("fleet_spawn", json!({"profile": "sim", "name": "w1"}))
        .await?;
    let mut client = Vec::with_capacity(trips);
    let mut whole = Vec::with_capacity(trips);
    for i in 0..trips + WARM_UP {
        let (sent_us, started) = (unix_us(), Instant::now());
        let sent = lead
            .ok(
                "fleet_send",
                json!({"to": "w1", "message": format!("trip {i}"), "wait_s": 30}),
            )
            .await?;
        let (returned_us, took) = (unix_us(), started.elapsed());
        anyhow::ensure!(sent["status"] == "replied", "trip {i}: {sent}");
        if i >= WARM_UP {
            let msg_id = sent["msg_id"].as_str().unwrap_or_default().to_string();
            client.push((msg_id, sent_us, returned_us));
            whole.push(took);
        }
    }
    // The log is written from fleetd's own thread: wait for the last trip's end in it.
    if let Some((last, ..)) = client.last() {
        fleet
            .logged(&format!("round_trip={last} step=\"lead_woken\""))
            .await?;
    }
    let logged = steps_in(&fleet.log());
    let mut shares: Vec<Vec<Duration>> = vec![Vec::new(); STEPS.len()];
    let mut backwards = vec![0usize; STEPS.len()];
    for (msg_id, sent_us, returned_us) in client {
        let Some(mut at) = logged.get(&msg_id).cloned() else {
            continue;
        };
        at.insert("sent (client)".to_string(), sent_us);
        at.insert("returned (client)".to_string(), returned_us);
        for (i, (from, to)) in STEPS.iter().enumerate() {
            if let (Some(from), Some(to)) = (at.get(*from), at.get(*to)) {
                backwards[i] += usize::from(to < from);
                let us = u64::try_from(to.saturating_sub(*from)).unwrap_or(u64::MAX);
                shares[i].push(Duration::from_micros(us));
            }
        }
    }
    let (traced50, _) = percentiles(&mut whole);
    println!(
        "round trip cut into its steps ({trips} traced trips; p50 and p99 of the time since the step before; a step seen before the one it follows counts 0, and is counted):"
    );
    let mut sum = 0.0;
    for (i, ((from, to), samples)) in STEPS.iter().zip(shares.iter_mut()).enumerate() {
        let seen = samples.len();
        let (p50, p99) = percentiles(samples);
        let beside = if i < ON_THE_WAY {
            sum += p50;
            ""
        } else {
            " (beside the round trip)"
        };
        println!(
            "  {from:>18} → {to:<18} p50 {p50:6.2} ms  p99 {p99:6.2} ms  ({seen} seen, {} before it){beside}",
            backwards[i]
        );
    }
    println!(
        "  sum of the round trip's steps' p50s {sum:.2} ms; traced round trip p50 {traced50:.2} ms, untraced {untraced_p50:.2} ms"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steps_fields_are_read_from_a_log_line_and_the_first_of_a_step_counts() {
        let log = "\
2026-12-05T17:00:00.000001Z TRACE fleet_steps: round_trip=0190-a step=\"enter\" at_us=10
2026-12-05T17:00:00.000002Z TRACE fleet_steps: round_trip=0190-a step=\"enter\" at_us=30
2026-12-05T17:00:00.000003Z TRACE message{msg_id=0190-a}: fleet_steps: round_trip=0190-a step=\"pasted\" at_us=5
2026-12-05T17:00:00.000004Z TRACE http{session=x round_trip=0190-b step=\"enter\" at_us=1}: fleet_steps: round_trip=0190-a step=\"claimed\" at_us=2
2026-12-05T17:00:00.000004Z  INFO fleetd: injected msg_id=0190-a
";
        let trips = steps_in(log);
        assert_eq!(trips["0190-a"]["enter"], 10);
        assert_eq!(trips["0190-a"]["pasted"], 5);
        assert_eq!(trips["0190-a"]["claimed"], 2);
        assert_eq!(trips["0190-a"].len(), 3);
        assert!(
            !trips.contains_key("0190-b"),
            "a span's fields are not the step's"
        );
    }
}
