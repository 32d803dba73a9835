//! Real agents over a restart of fleetd: a real Claude Code worker and a real opencode worker,
//! each mid-task (its scripted model holds the turn), survive `kill -9` of fleetd and its
//! restart. The restarted fleetd takes the worker back; when the model lets the turn go, the
//! agent's `fleet_reply` reaches the new process over an MCP session the old one made — the
//! agent itself finds its way back (Claude Code and opencode start a new session when fleetd
//! answers 404 to the old one) — and the lead gets the reply once; the next task goes through
//! the same pane. A kill that came while fleetd was typing is settled from the real agent's
//! screen: a task it took is its task in flight; one left pasted in its input box is
//! submitted. A call the agent had open when fleetd died (a `fleet_ask` waiting for its answer)
//! ends: at once in Claude Code (the connection reset), after its timeout for a silent call in
//! opencode (which does not notice the cut), and the agent answers its task.

use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, Keys, claude_profile, opencode_profile};
use fleet_testkit::model::ModelSim;
use fleet_testkit::wait::until;
use serde_json::Value;

/// How long a real agent's turn may take here.
const TURN: Duration = Duration::from_secs(90);

/// `fleet_send` to `name` of `task`, waiting for the reply; its text, or the screen and log.
async fn round_trip(
    fleet: &Fleet,
    lead: &Client,
    (name, pane): (&str, &str),
    task: &str,
) -> anyhow::Result<String> {
    let sent = lead.send(name, task, TURN.as_secs()).await?;
    match sent["reply"]["text"].as_str() {
        Some(text) => Ok(text.to_string()),
        None => anyhow::bail!(
            "{sent}\n{name}'s screen:\n{}\nfleetd's log:\n{}",
            fleet.screen(pane).unwrap_or_default(),
            fleet.log()
        ),
    }
}

/// fleetd on `config`, its lead, and `name` of profile `profile` spawned (its pane) and past a
/// first task, so the agent talks to fleetd over a session the old process made.
async fn talking(
    (profile, name): (&str, &str),
    config: &str,
) -> anyhow::Result<(Fleet, Client, String)> {
    let fleet = Fleet::start("", config).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn(profile, name).await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    assert_eq!(
        round_trip(&fleet, &lead, (name, &pane), "before the restart").await?,
        "echo: before the restart"
    );
    Ok((fleet, lead, pane))
}

/// The worker taken back answers the next task, in the same pane.
async fn next_task_goes_through(
    fleet: &Fleet,
    lead: &Client,
    at: (&str, &str),
) -> anyhow::Result<()> {
    assert_eq!(
        round_trip(fleet, lead, at, "after the restart").await?,
        "echo: after the restart"
    );
    Ok(())
}

/// Polls `lead` until something comes (a turn's time at most), then once more for anything
/// beyond it; on the way out, the screen of `name` (in `pane`) and fleetd's log.
async fn replies(fleet: &Fleet, lead: &Client, at: (&str, &str)) -> anyhow::Result<Vec<Value>> {
    polled_until(fleet, lead, at, |got| !got.is_empty()).await
}

/// [`replies`], polling until what came is `enough`.
async fn polled_until(
    fleet: &Fleet,
    lead: &Client,
    (name, pane): (&str, &str),
    enough: impl Fn(&[Value]) -> bool,
) -> anyhow::Result<Vec<Value>> {
    let got = std::sync::Mutex::new(Vec::<Value>::new());
    until("a reply", TURN, || async {
        let polled = lead.poll(1).await.ok()?;
        let mut got = got.lock().ok()?;
        got.extend(polled);
        enough(&got).then_some(())
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\n{name}'s screen:\n{}\nfleetd's log:\n{}",
            fleet.screen(pane).unwrap_or_default(),
            fleet.log()
        )
    })?;
    let mut got = got.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    got.extend(lead.poll(0).await?);
    Ok(got)
}

/// Waits (a turn's time at most) until the screen of `name` (in `pane`) `shows` what it is
/// waited for; on the way out, the screen.
async fn until_screen(
    fleet: &Fleet,
    (name, pane): (&str, &str),
    what: &str,
    shows: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    until(what, TURN, || async {
        shows(&fleet.screen(pane).ok()?).then_some(())
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\n{name}'s screen:\n{}",
            fleet.screen(pane).unwrap_or_default()
        )
    })
}

/// Where `kill -9` comes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// With the task in the agent's turn, recorded so.
    InTurn,
    /// With the task in the agent's turn, before fleetd recorded its submit.
    BeforeTheRecord,
}

/// Spawns `name` of profile `profile` (on `model`), holds a task in its turn over `kill -9`
/// (coming as `kill` says) and a restart of fleetd, and checks what the lead gets.
async fn survives_kill_9(
    model: &ModelSim,
    (profile, name): (&str, &str),
    config: &str,
    kill: Kill,
) -> anyhow::Result<()> {
    let (mut fleet, lead, pane) = talking((profile, name), config).await?;
    let at = (name, pane.as_str());
    model.hold(true);
    let sent = lead.send(name, "over the restart", 0).await?;
    // The agent has the task (its answer waits at the model), and fleetd saw it submitted.
    until("the agent to be on the task", TURN, || async {
        (fleet.logged_injected(&sent) && model.holding() > 0).then_some(())
    })
    .await?;
    let before = lead.entry(name).await?;
    lead.close().await?;

    fleet.kill9().await?;
    if kill == Kill::BeforeTheRecord {
        fleet.as_if_killed_while_typing(
            sent["msg_id"].as_str().unwrap_or_default(),
            Keys::Entered,
        )?;
    }
    fleet.launch().await?;
    if kill == Kill::BeforeTheRecord {
        fleet.logged("verdict=Submitted").await?;
    }
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let after = lead.entry(name).await?;
    assert_eq!(
        (&after["gid"], &after["pane"]),
        (&before["gid"], &before["pane"])
    );
    assert_eq!(after["status"], "busy", "{after}");

    model.hold(false);
    let got = replies(&fleet, &lead, (name, &pane)).await?;
    assert_eq!(got.len(), 1, "the reply comes once: {got:?}");
    assert_eq!(got[0]["kind"], "REPLY", "{got:?}");
    assert_eq!(got[0]["in_reply_to"], sent["msg_id"]);
    assert_eq!(got[0]["text"], "echo: over the restart");
    // And the worker takes the next task in the same pane.
    next_task_goes_through(&fleet, &lead, at).await?;
    assert_eq!(fleet.panes()?, [pane]);
    Ok(())
}

/// Spawns `name` of profile `profile` (on `model`), and kills fleetd as if between the paste
/// of a task and its Enter: the task sits in the agent's input box. The restart submits it,
/// once, and the lead gets its reply.
async fn gets_its_enter_after_kill_9(
    (profile, name): (&str, &str),
    config: &str,
) -> anyhow::Result<()> {
    let mut fleet = Fleet::start("", config).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn(profile, name).await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let at = (name, pane.as_str());
    let sent = lead
        .send(name, "before the restart", TURN.as_secs())
        .await?;
    assert_eq!(sent["reply"]["text"], "echo: before the restart", "{sent}");
    // What the kill leaves in the input box is a task as fleetd types one: into a worker whose
    // turn is over. The reply comes from a tool call inside the turn, before its end, and the
    // agent shows it is still at work until then ("esc interrupt", "esc to interrupt").
    until_screen(&fleet, at, "the first turn's end", |screen| {
        !screen.contains("interrupt")
    })
    .await?;
    lead.close().await?;
    fleet.kill9().await?;
    let text = "pasted before the kill";
    let typing = fleet.as_if_typing_another(sent["msg_id"].as_str().unwrap_or_default(), text)?;
    fleet.paste(&pane, text)?;
    until_screen(&fleet, at, "the paste in the input box", |screen| {
        screen.contains(text)
    })
    .await?;
    fleet.launch().await?;
    fleet.logged("verdict=InInput").await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let got = replies(&fleet, &lead, (name, &pane)).await?;
    assert_eq!(got.len(), 1, "the reply comes once: {got:?}");
    assert_eq!(got[0]["in_reply_to"].as_str(), Some(typing.as_str()));
    assert_eq!(got[0]["text"], format!("echo: {text}"));
    next_task_goes_through(&fleet, &lead, at).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_worker_mid_task_survives_kill_9_of_fleetd() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let config = claude_profile("claude", &model.base_url());
    survives_kill_9(&model, ("claude", "c1"), &config, Kill::InTurn).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_opencode_worker_mid_task_survives_kill_9_of_fleetd() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let config = opencode_profile("oc", &model.base_url());
    survives_kill_9(&model, ("oc", "o1"), &config, Kill::InTurn).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_worker_on_a_task_fleetd_died_recording_keeps_it() -> anyhow::Result<()>
{
    let model = ModelSim::start().await?;
    let config = claude_profile("claude", &model.base_url());
    survives_kill_9(&model, ("claude", "c1"), &config, Kill::BeforeTheRecord).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_opencode_worker_on_a_task_fleetd_died_recording_keeps_it() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let config = opencode_profile("oc", &model.base_url());
    survives_kill_9(&model, ("oc", "o1"), &config, Kill::BeforeTheRecord).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_left_in_a_real_claude_codes_input_box_by_kill_9_is_submitted() -> anyhow::Result<()>
{
    let model = ModelSim::start().await?;
    let config = claude_profile("claude", &model.base_url());
    gets_its_enter_after_kill_9(("claude", "c1"), &config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_left_in_a_real_opencodes_input_box_by_kill_9_is_submitted() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let config = opencode_profile("oc", &model.base_url());
    gets_its_enter_after_kill_9(("oc", "o1"), &config).await
}

/// How an agent learns that fleetd's death cut its call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// At once: the connection reset (Claude Code).
    Seen,
    /// Only when the call has been silent for the timeout fleetd gave it (opencode).
    Unnoticed,
}

/// Spawns `name` of profile `profile`, gives it a task on which the agent asks its lead
/// (`fleet_ask`, a call that waits for the answer), and kills fleetd while that call waits.
/// The agent must not wait on the cut call for ever: the restarted fleetd takes the worker
/// back, the agent's call ends, and the scripted agent answers its task with what its ask
/// heard; the next task goes through the same pane.
async fn an_ask_cut_by_kill_9_ends(
    (profile, name): (&str, &str),
    config: &str,
    cut: Cut,
) -> anyhow::Result<()> {
    let (mut fleet, lead, pane) = talking((profile, name), config).await?;
    let at = (name, pane.as_str());
    let sent = lead
        .send(name, "ask: which branch?", TURN.as_secs())
        .await?;
    if sent["status"] != "asked" {
        anyhow::bail!(
            "{sent}\n{name}'s screen:\n{}",
            fleet.screen(&pane).unwrap_or_default()
        );
    }
    lead.close().await?;
    fleet.kill9().await?;
    fleet.launch().await?;
    let back = std::time::Instant::now();
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let is_reply = |m: &Value| m["kind"] == "REPLY";
    let got = polled_until(&fleet, &lead, at, |got| got.iter().any(is_reply)).await?;
    let answered: Vec<&Value> = got.iter().filter(|m| is_reply(m)).collect();
    let log = || format!("{got:?}\nfleetd's log:\n{}", fleet.log());
    assert_eq!(answered.len(), 1, "{}", log());
    let text = answered[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("asked which branch?, heard: "),
        "{}",
        log()
    );
    assert_eq!(answered[0]["in_reply_to"], sent["msg_id"], "{}", log());
    if cut == Cut::Unnoticed {
        // It ended on opencode's timeout for a silent call, not on some longer one.
        let silence = super::opencode::call_silence(fleet.state_dir())?;
        let took = back.elapsed();
        assert!(took <= silence + Duration::from_secs(15), "{took:?}");
    }
    next_task_goes_through(&fleet, &lead, at).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_codes_ask_cut_by_kill_9_of_fleetd_ends() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let config = claude_profile("claude", &model.base_url());
    an_ask_cut_by_kill_9_ends(("claude", "c1"), &config, Cut::Seen).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_opencodes_ask_cut_by_kill_9_of_fleetd_ends() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    let config = opencode_profile("oc", &model.base_url());
    an_ask_cut_by_kill_9_ends(("oc", "o1"), &config, Cut::Unnoticed).await
}
