//! Advisory architects and `fleet_consult`, with scripted agents (`fleet-agent-sim`) as the
//! architects: one brief to every slot, answers side by side, failures reported per slot, an
//! architect's question answered through the consult, what an architect may not do, and the
//! end of its life.

use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::{
    Fleet, claude_profile, opencode_profile, sim_profile, token_spy_profile,
};
use fleet_testkit::model::ModelSim;
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::as_worker;

const LIMIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long architects kept 15 s after their last answer may take to go.
const KEPT_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A profile whose program is ready at once and exits on the first line typed to it: an
/// architect that crashes mid-consult.
fn crashing_profile(name: &str) -> String {
    format!(
        "[[profiles]]\nname = \"{name}\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo CRASHY-READY; read line; exit 3\"]\nready_marker = \"CRASHY-READY\"\nready_timeout_s = 20\n"
    )
}

/// The live entities of the fleet as `lead` sees them, with their roles.
async fn roles(lead: &fleet_testkit::client::Client) -> anyhow::Result<Vec<(String, String)>> {
    let list = lead.ok("fleet_list", json!({})).await?;
    Ok(list["entities"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                e["role"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// The pane of the live entity `name`, as `lead` sees it in `fleet_list`.
async fn pane_of(lead: &fleet_testkit::client::Client, name: &str) -> anyhow::Result<String> {
    let list = lead.ok("fleet_list", json!({})).await?;
    list["entities"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["name"] == name))
        .and_then(|e| e["pane"].as_str())
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no pane for {name} in {list}"))
}

/// The answer of slot `name` in a consult's result.
fn slot<'a>(consult: &'a Value, name: &str) -> &'a Value {
    consult["answers"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["architect"] == name))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consult_briefs_every_architect_alike_and_returns_each_slots_outcome()
-> anyhow::Result<()> {
    let config = format!(
        "{}{}{}[architects]\nslots = [{{ name = \"arch-a\", profile = \"sim-a\" }}, {{ name = \"arch-b\", profile = \"sim-b\" }}, {{ name = \"arch-crash\", profile = \"crashy\" }}]\n",
        sim_profile("sim-a", &[])?,
        sim_profile("sim-b", &[])?,
        crashing_profile("crashy"),
    );
    let fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("lead", Protocol::Stateless).await?;
    let brief = "Assess the plan:\n  1. split the gateway\n  2. keep the store";
    let consult = alice
        .ok("fleet_consult", json!({"brief": brief, "wait_s": 30}))
        .await?;
    // In slot order, each on its own: both scripted architects got the brief byte for byte,
    // the one that crashed is reported with why, and hides nothing of the others.
    let order: Vec<&str> = consult["answers"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["architect"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(order, ["arch-a", "arch-b", "arch-crash"], "{consult}");
    for name in ["arch-a", "arch-b"] {
        let answer = slot(&consult, name);
        assert_eq!(answer["status"], "answered", "{consult}\n{}", fleet.log());
        assert_eq!(answer["text"], format!("echo: {brief}"), "{answer}");
        assert_eq!(answer["host"], "testhost");
        assert!(answer["ms"].as_u64().is_some(), "{answer}");
    }
    assert_ne!(
        slot(&consult, "arch-a")["gid"],
        slot(&consult, "arch-b")["gid"]
    );
    assert_eq!(
        slot(&consult, "arch-a")["model"],
        "the program of profile 'sim-a'"
    );
    // A program fleetd cannot see into has no family it can name.
    assert_eq!(slot(&consult, "arch-a")["family"], Value::Null);
    let crashed = slot(&consult, "arch-crash");
    assert_eq!(crashed["status"], "failed", "{consult}");
    assert!(
        crashed["text"]
            .as_str()
            .unwrap_or_default()
            .contains("exit"),
        "{crashed}"
    );
    // Afterwards they are gone: stopped once they answered.
    until("the architects to be stopped", LIMIT, || async {
        let roles = roles(&alice).await.ok()?;
        (!roles.iter().any(|(_, role)| role == "architect")).then_some(())
    })
    .await?;
    // A second consult starts them afresh, of the slots asked for only.
    let again = alice
        .ok(
            "fleet_consult",
            json!({"brief": "second", "wait_s": 30, "slots": ["arch-b"]}),
        )
        .await?;
    assert_eq!(
        again["answers"].as_array().map(Vec::len),
        Some(1),
        "{again}"
    );
    assert_eq!(slot(&again, "arch-b")["text"], "echo: second");
    assert_ne!(
        slot(&again, "arch-b")["gid"],
        slot(&consult, "arch-b")["gid"]
    );
    let unknown = alice
        .call("fleet_consult", json!({"brief": "x", "slots": ["arch-z"]}))
        .await?
        .expect_err("an unknown slot");
    assert_eq!(unknown.code, "invalid_params");
    assert!(
        unknown.message.contains("arch-a, arch-b, arch-crash"),
        "{unknown}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_architects_question_surfaces_on_the_consult_and_is_answered_through_it()
-> anyhow::Result<()> {
    let config = format!(
        "{}{}[architects]\nslots = [{{ name = \"arch-a\", profile = \"sim-a\" }}, {{ name = \"arch-b\", profile = \"sim-b\" }}]\n",
        sim_profile("sim-a", &[])?,
        sim_profile("sim-b", &[])?,
    );
    let fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("lead", Protocol::Stateless).await?;
    // Hostile calls are refused, naming what is wrong, before any architect starts.
    for (args, code, says) in [
        (
            json!({"brief": "clear\u{1b}[2J"}),
            "invalid_params",
            "control character",
        ),
        (
            json!({"brief": "x", "wait_s": 3601}),
            "invalid_params",
            "wait_s",
        ),
        (
            json!({"brief": "x".repeat(300_000)}),
            "too_large",
            "max_message_bytes",
        ),
    ] {
        let err = alice.call("fleet_consult", args).await?.expect_err(says);
        assert_eq!(err.code, code, "{says}: {err}");
        assert!(err.message.contains(says), "{says}: {err}");
    }
    // A parameter of the wrong type is refused, saying what it expected.
    let err = alice
        .call("fleet_consult", json!({"brief": "x", "slots": "arch-a"}))
        .await?
        .expect_err("slots as a string");
    assert_eq!(err.code, "invalid_params", "{err}");
    assert!(
        err.message
            .contains("'slots' must be array or null, not a string"),
        "{err}"
    );
    assert!(fleet.panes()?.is_empty(), "an architect started");
    let consult = alice
        .ok(
            "fleet_consult",
            json!({"brief": "/ask 20 which database?", "wait_s": 30, "slots": ["arch-a"]}),
        )
        .await?;
    assert_eq!(slot(&consult, "arch-a")["status"], "asking", "{consult}");
    let ask = &consult["asks"][0];
    assert_eq!(ask["question"], "which database?", "{consult}");
    assert_eq!(ask["from_name"], "arch-a");
    let answered = alice
        .ok(
            "fleet_send",
            json!({"turn_id": ask["turn_id"], "message": "postgres", "wait_s": 20}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}");
    assert_eq!(
        answered["reply"]["text"],
        "asked which database?, heard: postgres"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_architect_may_only_advise_its_lead_and_a_kept_one_takes_a_follow_up_by_name()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = format!(
        "[leads.alice]\n[leads.bob]\n{}{}[architects]\nnudge_interval_s = 1\nslots = [{{ name = \"arch-spy\", profile = \"spy\", keep_s = 600 }}, {{ name = \"arch-a\", profile = \"sim-a\", keep_s = 600 }}]\n",
        token_spy_profile("spy", &dir.path().join("token")),
        sim_profile("sim-a", &[])?,
    );
    let fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    // The spy never answers on its own: its slot runs out of time, the other answers.
    let consult = alice
        .ok("fleet_consult", json!({"brief": "advise", "wait_s": 10}))
        .await?;
    assert_eq!(slot(&consult, "arch-spy")["status"], "timeout", "{consult}");
    assert_eq!(slot(&consult, "arch-a")["status"], "answered", "{consult}");
    let token = std::fs::read_to_string(dir.path().join("token"))?;
    std::fs::remove_file(dir.path().join("token"))?;
    let spy =
        fleet_testkit::client::Client::connect(&fleet.url(), &token, Protocol::Stateless, &[])
            .await?;
    let me = spy.ok("fleet_list", json!({})).await?;
    assert_eq!(me["you"]["role"], "architect", "{me}");
    assert_eq!(me["you"]["slot"], "arch-spy", "{me}");
    // Never spawn, stop, broadcast, consult, nor reach anyone but the lead consulting it.
    for (tool, args) in [
        ("fleet_spawn", json!({"profile": "sim-a"})),
        ("fleet_stop", json!({"to": "arch-a"})),
        ("fleet_broadcast", json!({"message": "hi all"})),
        ("fleet_consult", json!({"brief": "x"})),
        ("fleet_send", json!({"to": "arch-a", "message": "psst"})),
        ("fleet_send", json!({"to": "bob", "message": "psst"})),
    ] {
        let err = spy.call(tool, args.clone()).await?.expect_err(tool);
        assert_eq!(err.code, "forbidden", "{tool} {args}: {err}");
    }
    // Its late answer is held for the lead.
    spy.ok("fleet_reply", json!({"message": "late advice"}))
        .await?;
    let held = until("the late advice", LIMIT, || async {
        let got = alice.poll(0).await.ok()?;
        (!got.is_empty()).then_some(got)
    })
    .await?;
    assert_eq!(held[0]["text"], "late advice");
    assert_eq!(held[0]["from_name"], "arch-spy");
    // Past its brief nothing more is typed to an architect: a follow-up waits for it to pull,
    // and a nudge saying so is typed instead, again each nudge_interval_s until it pulls.
    let nudge = "[fleet] 1 message waiting for you: call fleet_poll to read them";
    alice
        .ok(
            "fleet_send",
            json!({"to": "arch-spy", "message": "and the cost?", "wait_s": 0}),
        )
        .await?;
    let spy_pane = pane_of(&alice, "arch-spy").await?;
    let screen = until("the spy nudged twice", LIMIT, || async {
        let screen = fleet.screen(&spy_pane).ok()?;
        (screen.matches(nudge).count() >= 2).then_some(screen)
    })
    .await?;
    assert!(!screen.contains("and the cost?"), "typed in:\n{screen}");
    let pulled = spy.ok("fleet_poll", json!({"wait_s": 5})).await?;
    let follow_up = &pulled["messages"][0];
    assert_eq!(follow_up["text"], "and the cost?", "{pulled}");
    spy.ok(
        "fleet_reply",
        json!({"message": "cheap", "in_reply_to": follow_up["msg_id"]}),
    )
    .await?;
    let answer = until("the answer to the follow-up", LIMIT, || async {
        let got = alice.poll(0).await.ok()?;
        (!got.is_empty()).then_some(got)
    })
    .await?;
    assert_eq!(answer[0]["text"], "cheap");
    // Kept: a follow-up by name reaches the one that answered, which pulls it when nudged.
    let follow = alice.send("arch-a", "and the risks?", 20).await?;
    assert_eq!(follow["reply"]["text"], "echo: and the risks?", "{follow}");
    let screen = fleet.screen(&pane_of(&alice, "arch-a").await?)?;
    assert!(
        screen.contains(nudge) && !screen.contains("and the risks?"),
        "{screen}"
    );
    let listed = roles(&alice).await?;
    assert!(
        listed.contains(&("arch-a".to_string(), "architect".to_string())),
        "{listed:?}"
    );
    // A worker may not consult.
    let worker = as_worker(&fleet, &alice, &dir, "w1").await?;
    let err = worker
        .call("fleet_consult", json!({"brief": "x"}))
        .await?
        .expect_err("a worker consulted");
    assert_eq!(err.code, "forbidden", "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_architects_a_consult_says_how_to_configure_them() -> anyhow::Result<()> {
    let fleet = Fleet::start("", "").await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let err = lead
        .call("fleet_consult", json!({"brief": "x"}))
        .await?
        .expect_err("a consult without architects");
    assert_eq!(err.code, "invalid_params");
    assert!(err.message.contains("[architects]"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_code_and_opencode_architects_answer_one_brief_each_on_its_own_model()
-> anyhow::Result<()> {
    // Two scripted models, told apart by the voice each answers in.
    let sonnet = ModelSim::voiced("[sonnet] ").await?;
    let gpt = ModelSim::voiced("[gpt] ").await?;
    // Both speak the Anthropic API, the only one the scripted model serves, and opencode takes
    // no other model name under its anthropic provider: both slots are on Claude models, one
    // family, which fleetd starts only when told to.
    let config = format!(
        "{}{}[architects]\nallow_same_family = true\nslots = [{{ name = \"arch-claude\", profile = \"claude\", keep_s = 15 }}, {{ name = \"arch-gpt\", profile = \"opencode-gpt\", keep_s = 15 }}]\n",
        claude_profile("claude", &sonnet.base_url()),
        opencode_profile("opencode-gpt", &gpt.base_url()),
    );
    let fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("lead", Protocol::Stateless).await?;
    let brief = "Should the gateway's inbox consumer own the waiting briefs?";
    let consult = alice
        .ok("fleet_consult", json!({"brief": brief, "wait_s": 180}))
        .await?;
    let claude = slot(&consult, "arch-claude");
    let opencode = slot(&consult, "arch-gpt");
    assert_eq!(claude["status"], "answered", "{consult}\n{}", fleet.log());
    assert_eq!(opencode["status"], "answered", "{consult}\n{}", fleet.log());
    // Each answered on its own model, from the same brief.
    assert_eq!(claude["text"], format!("[sonnet] echo: {brief}"));
    assert_eq!(opencode["text"], format!("[gpt] echo: {brief}"));
    assert_eq!(claude["model"], "the default model of claude-code");
    assert_eq!(opencode["model"], "model 'claude-sonnet-4-5'");
    for answer in [claude, opencode] {
        assert_eq!(answer["family"], "anthropic", "{answer}");
    }
    // Each was told it is an adviser, not a worker.
    for model in [&sonnet, &gpt] {
        assert!(
            model.saw("an advisory architect"),
            "no architect charter reached a model"
        );
    }
    // Kept keep_s after their last answer: a follow-up by name is not typed in but pulled by
    // each, when nudged, and answered on its own model.
    let (to_claude, to_gpt) = tokio::join!(
        alice.send("arch-claude", "and the risks?", 120),
        alice.send("arch-gpt", "and the risks?", 120)
    );
    let (to_claude, to_gpt) = (to_claude?, to_gpt?);
    assert_eq!(
        to_claude["reply"]["text"],
        "[sonnet] echo: and the risks?",
        "{to_claude}\n{}",
        fleet.log()
    );
    assert_eq!(
        to_gpt["reply"]["text"],
        "[gpt] echo: and the risks?",
        "{to_gpt}\n{}",
        fleet.log()
    );
    for model in [&sonnet, &gpt] {
        assert!(
            model.saw("[fleet] 1 message waiting for you: call fleet_poll to read them"),
            "the follow-up reached a model other than by the nudge"
        );
    }
    // Gone afterwards: stopped, their panes closed, their files (tokens among them) removed.
    let files: Vec<_> = [claude, opencode]
        .iter()
        .map(|answer| {
            let gid = answer["gid"].as_str().unwrap_or_default();
            fleet.state_dir().join("workers").join(gid)
        })
        .collect();
    until("the architects to leave the roster", KEPT_LIMIT, || async {
        let roles = roles(&alice).await.ok()?;
        (!roles.iter().any(|(_, role)| role == "architect")).then_some(())
    })
    .await?;
    until("the architects' panes to close", LIMIT, || async {
        fleet.panes().ok().filter(Vec::is_empty)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {:?}", fleet.panes()))?;
    until("the architects' files to go", LIMIT, || async {
        files.iter().all(|f| !f.exists()).then_some(())
    })
    .await
    .map_err(|e| {
        let left: Vec<_> = files
            .iter()
            .filter(|f| f.exists())
            .map(|f| {
                std::fs::read_dir(f).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
            })
            .collect();
        anyhow::anyhow!("{e}: still there: {left:?}")
    })?;
    // A question of a real architect surfaces on the consult and is answered through it.
    let consult = alice
        .ok(
            "fleet_consult",
            json!({"brief": "ask: which database?", "wait_s": 120, "slots": ["arch-claude"]}),
        )
        .await?;
    assert_eq!(
        slot(&consult, "arch-claude")["status"],
        "asking",
        "{consult}"
    );
    let answered = alice
        .ok(
            "fleet_send",
            json!({"turn_id": consult["asks"][0]["turn_id"], "message": "postgres", "wait_s": 120}),
        )
        .await?;
    // The model read the answer from fleet_ask's result (the tool result's JSON text).
    let reply = answered["reply"]["text"].as_str().unwrap_or_default();
    assert!(
        reply.starts_with("asked which database?, heard: ") && reply.contains("postgres"),
        "{answered}"
    );
    // One architect crashing mid-consult: its failure comes with the other's answer. opencode's
    // model hangs on the brief, and its program is killed while the consult waits.
    gpt.stall(true);
    let brief = "Is the store's schema sound?";
    let consulting = alice.ok("fleet_consult", json!({"brief": brief, "wait_s": 120}));
    let crash = async {
        until(
            "the brief to reach opencode's model",
            KEPT_LIMIT,
            || async { gpt.saw(brief).then_some(()) },
        )
        .await?;
        fleet.kill_pane_program(&pane_of(&alice, "arch-gpt").await?)
    };
    let (consult, crashed) = tokio::join!(consulting, crash);
    crashed?;
    let consult = consult?;
    let claude = slot(&consult, "arch-claude");
    let opencode = slot(&consult, "arch-gpt");
    assert_eq!(claude["status"], "answered", "{consult}\n{}", fleet.log());
    assert_eq!(claude["text"], format!("[sonnet] echo: {brief}"));
    assert_eq!(opencode["status"], "failed", "{consult}\n{}", fleet.log());
    // The reason names what happened: killed, status 128 + SIGKILL.
    assert!(
        opencode["text"]
            .as_str()
            .is_some_and(|t| t.contains("ended before replying") && t.contains("137")),
        "{opencode}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consult_its_client_gives_up_on_leaves_no_architect_behind() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = format!(
        "{}[architects]\nslots = [{{ name = \"arch-spy\", profile = \"spy\" }}]\n",
        token_spy_profile("spy", &dir.path().join("token")),
    );
    let fleet = Fleet::start("", &config).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    // The spy never answers: the client gives up while the consult waits.
    let gave_up = lead
        .call_within(
            "fleet_consult",
            json!({"brief": "advise", "wait_s": 600}),
            std::time::Duration::from_secs(3),
        )
        .await?;
    assert!(gave_up.is_none(), "the consult returned: {gave_up:?}");
    assert!(
        dir.path().join("token").exists(),
        "the architect never started"
    );
    until(
        "the abandoned consult's architect to be stopped",
        LIMIT,
        || async {
            let roles = roles(&lead).await.ok()?;
            let panes = fleet.panes().ok()?;
            (!roles.iter().any(|(_, role)| role == "architect") && panes.is_empty()).then_some(())
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_architect_lives_keep_s_after_its_last_answer_then_goes() -> anyhow::Result<()> {
    let config = format!(
        "{}[architects]\nslots = [{{ name = \"arch-a\", profile = \"sim-a\", keep_s = 6 }}]\n",
        sim_profile("sim-a", &[])?,
    );
    let fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("lead", Protocol::Stateless).await?;
    let consult = alice
        .ok("fleet_consult", json!({"brief": "first", "wait_s": 30}))
        .await?;
    let answered = tokio::time::Instant::now();
    assert_eq!(slot(&consult, "arch-a")["status"], "answered", "{consult}");
    // Halfway through its keep_s, a follow-up: pulled on the nudge and answered.
    tokio::time::sleep_until(answered + std::time::Duration::from_secs(3)).await;
    let follow = alice.send("arch-a", "more?", 10).await?;
    assert_eq!(follow["reply"]["text"], "echo: more?", "{follow}");
    let followed = tokio::time::Instant::now();
    // Past keep_s from the consult's answer it is still there: counted from its last answer…
    tokio::time::sleep_until(answered + std::time::Duration::from_secs(7)).await;
    let listed = roles(&alice).await?;
    assert!(
        listed.contains(&("arch-a".to_string(), "architect".to_string())),
        "stopped keep_s after its first answer, not its last: {listed:?}"
    );
    // …and it goes keep_s after that.
    until("the architect to go", LIMIT, || async {
        let roles = roles(&alice).await.ok()?;
        (!roles.iter().any(|(_, role)| role == "architect")).then_some(())
    })
    .await?;
    assert!(
        followed.elapsed() >= std::time::Duration::from_secs(5),
        "gone {:?} after its last answer",
        followed.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_architect_taken_back_by_a_restart_is_still_retired_keep_s_after_its_answer()
-> anyhow::Result<()> {
    let config = format!(
        "{}[architects]\nslots = [{{ name = \"arch-a\", profile = \"sim-a\", keep_s = 2 }}]\n",
        sim_profile("sim-a", &[])?,
    );
    let mut fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("lead", Protocol::Stateless).await?;
    let consult = alice
        .ok("fleet_consult", json!({"brief": "first", "wait_s": 30}))
        .await?;
    assert_eq!(slot(&consult, "arch-a")["status"], "answered", "{consult}");
    // The restart comes before its keep_s is out: the timer that would retire it was the old
    // process's; the new one arms it again.
    fleet.kill9().await?;
    fleet.launch().await?;
    let alice = fleet.lead("lead", Protocol::Stateless).await?;
    assert!(
        roles(&alice)
            .await?
            .contains(&("arch-a".to_string(), "architect".to_string())),
        "taken back"
    );
    until("the architect taken back to go", LIMIT, || async {
        let roles = roles(&alice).await.ok()?;
        (!roles.iter().any(|(_, role)| role == "architect")).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_architect_that_answered_long_before_the_other_is_kept_keep_s_from_the_consults_end()
-> anyhow::Result<()> {
    // arch-b thinks 6 s over the brief, so arch-a has answered 6 s before the consult returns.
    let config = format!(
        "{}{}[architects]\nslots = [{{ name = \"arch-a\", profile = \"sim-a\", keep_s = 3 }}, {{ name = \"arch-b\", profile = \"sim-slow\", keep_s = 3 }}]\n",
        sim_profile("sim-a", &[])?,
        sim_profile("sim-slow", &["--think-ms", "6000"])?,
    );
    let fleet = Fleet::start("", &config).await?;
    let alice = fleet.lead("lead", Protocol::Stateless).await?;
    let started = std::time::Instant::now();
    let consult = alice
        .ok("fleet_consult", json!({"brief": "first", "wait_s": 60}))
        .await?;
    let took = started.elapsed();
    for name in ["arch-a", "arch-b"] {
        assert_eq!(slot(&consult, name)["status"], "answered", "{consult}");
    }
    assert!(
        took > std::time::Duration::from_secs(4),
        "the slow architect was not slow ({took:?}): this proves nothing"
    );
    // The lead could follow up only now, and does after reading the answers a second (well
    // within keep_s): arch-a, idle for longer than its keep_s by then, is still there.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let follow = alice.send("arch-a", "still there?", 10).await?;
    assert_eq!(follow["reply"]["text"], "echo: still there?", "{follow}");
    Ok(())
}
