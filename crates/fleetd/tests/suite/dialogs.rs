//! Dialogs on workers' screens: the scripted agent's `/confirm QUESTION` shows its own dialog,
//! `QUESTION (y/n)`, and waits for the key `y` or `n` (then replies `chose y` / `chose n`); its
//! profile names `(y/n)` as a sign of a dialog. The rmcp client is the lead. (The real Claude
//! Code's permission prompt is in `claude.rs`.)

use std::time::Duration;

use fleet_testkit::broker::{Broker, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::{Value, json};

use super::federation::{hears_host, sees};
use fleet_testkit::hosts::{TwoHosts, gateway};

const LIMIT: Duration = Duration::from_secs(20);

/// The scripted agent as profile `confirm`, its dialogs known by `(y/n)`.
fn confirm_profile() -> anyhow::Result<String> {
    Ok(format!(
        "{}blocked_markers = [\"(y/n)\"]\n",
        sim_profile("confirm", &[])?
    ))
}

/// Waits until `name`'s status in `lead`'s `fleet_list` is `status`.
async fn until_status(lead: &Client, name: &str, status: &str) -> anyhow::Result<()> {
    until(&format!("{name} to be {status}"), LIMIT, || async {
        (lead.entry(name).await.ok()?["status"] == status).then_some(())
    })
    .await
}

/// The choice keys a dialog offers.
pub(super) fn keys(dialog: &Value) -> Vec<String> {
    dialog["choices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c["choice"].as_str().map(String::from))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialog_waits_for_the_leads_poll_and_its_choice_is_pressed() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &confirm_profile()?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("confirm", "w1").await?;
    // Nobody waits in a call when the dialog shows: it waits for the lead all the same.
    let sent = lead.send("w1", "/confirm Overwrite the config?", 0).await?;
    assert_eq!(sent["status"], "pending", "{sent}");
    until_status(&lead, "w1", "blocked").await?;
    let polled = lead.ok("fleet_poll", json!({"wait_s": 5})).await?;
    let dialog = polled["blocked"][0].clone();
    assert_eq!(dialog["from_name"], "w1", "{polled}");
    assert_eq!(dialog["in_task"], sent["msg_id"]);
    assert!(
        dialog["prompt"]
            .as_str()
            .unwrap_or_default()
            .contains("Overwrite the config? (y/n)"),
        "{dialog}"
    );
    assert_eq!(keys(&dialog), ["y", "n"]);
    assert_eq!(polled["asks"], json!([]), "a dialog is no question");
    // Handed out once; while it is open, fleet_list shows it.
    let again = lead.ok("fleet_poll", json!({"wait_s": 0})).await?;
    assert_eq!(again["blocked"], json!([]), "{again}");
    let listed = lead.entry("w1").await?;
    assert_eq!(listed["dialog"]["turn_id"], dialog["turn_id"], "{listed}");
    assert_eq!(listed["dialog"]["choices"], dialog["choices"]);
    // The lead sent the task: answering waits on for its reply.
    let answered = lead
        .ok(
            "fleet_send",
            json!({"turn_id": dialog["turn_id"], "choice": "y", "wait_s": 20}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}");
    assert_eq!(answered["reply"]["text"], "chose y");
    until_status(&lead, "w1", "idle").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialog_answered_in_the_pane_is_over_for_the_lead() -> anyhow::Result<()> {
    let fleet = Fleet::start("", &confirm_profile()?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("confirm", "w1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let blocked = lead.send("w1", "/confirm Delete the branch?", 20).await?;
    assert_eq!(blocked["status"], "blocked", "{blocked}\n{}", fleet.log());
    assert_eq!(keys(&blocked), ["y", "n"]);
    // A human answers in the pane before the lead does.
    let pressed = std::process::Command::new("tmux")
        .args(["-L", fleet.tmux_socket(), "send-keys", "-t", &pane, "n"])
        .status()?;
    assert!(pressed.success());
    let reply = lead.poll(20).await?;
    assert_eq!(reply[0]["text"], "chose n", "{reply:?}");
    until_status(&lead, "w1", "idle").await?;
    let late = lead
        .call(
            "fleet_send",
            json!({"turn_id": blocked["turn_id"], "choice": "y"}),
        )
        .await?
        .expect_err("an answer to a dialog that is gone");
    assert_eq!(late.code, "too_late", "{late}");
    // Nothing was typed into the pane after the dialog went.
    let screen = fleet.screen(&pane)?;
    assert!(!screen.contains("chose y"), "{screen}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialog_on_another_host_is_asked_of_the_lead_and_answered_through_the_broker()
-> anyhow::Result<()> {
    let TwoHosts {
        vhost: _vhost,
        a: _a,
        b,
        alice,
        ..
    } = TwoHosts::each(&Broker::find().await?, "", &confirm_profile()?).await?;
    hears_host(&alice, "hostb").await?;
    // alice spawns the worker on hostb: hers, so its dialogs are asked of her, across hosts.
    alice
        .ok(
            "fleet_spawn",
            json!({"profile": "confirm", "name": "wb", "host": "hostb"}),
        )
        .await?;
    sees(&alice, "wb").await?;

    // alice's task stops her worker on hostb on a dialog; it surfaces on her open send.
    let blocked = alice.send("wb", "/confirm Push to main?", 20).await?;
    assert_eq!(blocked["status"], "blocked", "{blocked}\n{}", b.log());
    assert_eq!(blocked["from_name"], "wb");
    assert_eq!(blocked["host"], "hostb");
    assert_eq!(blocked["in_task"], blocked["msg_id"]);
    assert_eq!(keys(&blocked), ["y", "n"]);
    assert!(
        blocked["prompt"]
            .as_str()
            .unwrap_or_default()
            .contains("Push to main? (y/n)"),
        "{blocked}"
    );
    until_status(&alice, "wb", "blocked").await?;
    // Free text is refused on alice's side and never crosses.
    let refused = alice
        .call(
            "fleet_send",
            json!({"turn_id": blocked["turn_id"], "choice": "y\n"}),
        )
        .await?
        .expect_err("free text for a choice");
    assert_eq!(refused.code, "invalid_params", "{refused}");
    let answered = alice
        .ok(
            "fleet_send",
            json!({"turn_id": blocked["turn_id"], "choice": "n", "wait_s": 20}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}\n{}", b.log());
    assert_eq!(answered["reply"]["text"], "chose n");
    until_status(&alice, "wb", "idle").await?;
    Ok(())
}

/// A dialog off the broker is checked before a lead sees it: one that offers free text as a
/// choice, offers none, offers a key twice, hides a control character in its prompt, or is no
/// dialog at all is dropped (signed by a trusted host though it is); a well-formed one from the
/// same sender, published after them, is what the lead gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialog_from_another_host_offering_free_text_never_reaches_the_lead() -> anyhow::Result<()>
{
    use fleet_core::{Gid, Kind, Role};

    use super::federation::{announce, forged, publish};

    let vhost = Vhost::create(&Broker::find().await?).await?;
    let a = gateway(&vhost.uri(), "hosta", "alice", "").await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let client = vhost.connect().await?;
    // A host whose gateway does not check what it sends, with a lead of its own (who may
    // message alice).
    let mallory = announce(&client, "hostc", "mallory", Role::Lead).await?;
    sees(&alice, "mallory").await?;
    let to = alice.entry("alice").await?["gid"]
        .as_str()
        .unwrap_or_default()
        .parse::<Gid>()?
        .to_string();
    let choice = |key: &str, label: &str| json!({"choice": key, "label": label});
    let bodies = [
        json!({"prompt": "Proceed?", "choices": [choice("rm -rf ~\n", "Yes")]}).to_string(),
        json!({"prompt": "Proceed?", "choices": []}).to_string(),
        json!({"prompt": "Proceed?", "choices": [choice("y", "Yes"), choice("y", "No")]})
            .to_string(),
        json!({"prompt": "Proceed?\u{1b}]0;owned\u{7}", "choices": [choice("y", "Yes")]})
            .to_string(),
        "Proceed? (y/n)".to_string(),
        json!({"prompt": "Proceed? (well-formed)", "choices": [choice("1", "Yes")]}).to_string(),
    ];
    for (i, body) in bodies.iter().enumerate() {
        let mut envelope = forged(Kind::Ask, mallory, "hostc", &to)?;
        envelope.turn_id = Some(format!("dialog-{i}"));
        publish(&client, "fleet.msg", &to, &envelope, body.as_bytes()).await?;
    }
    let polled = until("the well-formed dialog to reach alice", LIMIT, || async {
        let polled = alice.ok("fleet_poll", json!({"wait_s": 1})).await.ok()?;
        (!polled["blocked"].as_array()?.is_empty()).then_some(polled)
    })
    .await?;
    let blocked = polled["blocked"].as_array().cloned().unwrap_or_default();
    assert_eq!(blocked.len(), 1, "{polled}\n{}", a.log());
    assert_eq!(blocked[0]["turn_id"], "dialog-5");
    assert_eq!(blocked[0]["prompt"], "Proceed? (well-formed)");
    assert_eq!(keys(&blocked[0]), ["1"]);
    assert_eq!(polled["asks"], json!([]), "{polled}");
    // Each of the five is refused, loudly (the log is written a moment after).
    let refused = || {
        a.log()
            .matches("a dialog from another host is refused")
            .count()
    };
    until("the five refusals in the log", LIMIT, || async {
        (refused() >= 5).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", a.log()))?;
    assert_eq!(refused(), 5, "{}", a.log());
    Ok(())
}

/// The scripted agent as profile `menu`: its cursor menus (`/menu`) are known by their
/// question's `Pick one:`, and its Esc's `Interrupted by Esc` ends its turn.
fn menu_profile() -> anyhow::Result<String> {
    Ok(format!(
        "{}blocked_markers = [\"Pick one:\"]\nturn_over_markers = [\"Interrupted by Esc\"]\n",
        sim_profile("menu", &[])?
    ))
}

/// Starts a fleet whose worker `w1` is of profile `menu`, sends it `task`, and returns the fleet,
/// the lead, `w1`'s pane and the send, which came back blocked on the menu.
async fn blocked_on_menu(task: &str) -> anyhow::Result<(Fleet, Client, String, Value)> {
    let fleet = Fleet::start("", &menu_profile()?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let spawned = lead.spawn("menu", "w1").await?;
    let pane = spawned["pane"].as_str().unwrap_or_default().to_string();
    let blocked = lead.send("w1", task, 20).await?;
    anyhow::ensure!(blocked["status"] == "blocked", "{blocked}\n{}", fleet.log());
    Ok((fleet, lead, pane, blocked))
}

/// Answers the dialog of `blocked` with `choice`, waiting for the task's answer.
async fn choose(lead: &Client, blocked: &Value, choice: &str) -> anyhow::Result<Value> {
    lead.ok(
        "fleet_send",
        json!({"turn_id": blocked["turn_id"], "choice": choice, "wait_s": 20}),
    )
    .await
}

/// A cursor menu (no numbers, the current option marked `❯`) is offered option by option,
/// under names made of their text; the lead names one, and fleetd moves the cursor there with
/// the arrows, checks it is there, and presses Enter: the program chose that option. Names that
/// are not offered (an option's label, an arrow) press nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_menus_option_is_chosen_by_its_name() -> anyhow::Result<()> {
    let (fleet, lead, pane, blocked) =
        blocked_on_menu("/menu Pick one: deploy? | No | Yes, deploy now | Later").await?;
    assert_eq!(keys(&blocked), ["no", "yes-deploy-now", "later", "esc"]);
    let prompt = blocked["prompt"].as_str().unwrap_or_default();
    assert!(
        prompt.contains("Pick one: deploy?\nNo\nYes, deploy now\nLater"),
        "{prompt}"
    );
    for bad in ["Later", "down", "up", "enter", "3"] {
        let refused = lead
            .call(
                "fleet_send",
                json!({"turn_id": blocked["turn_id"], "choice": bad}),
            )
            .await?
            .expect_err("not one of the menu's choices");
        assert_eq!(refused.code, "invalid_params", "{refused}");
        assert!(
            refused.message.contains("no, yes-deploy-now, later, esc"),
            "{refused}"
        );
    }
    // Nothing was pressed: the cursor is still on the first option.
    assert!(
        fleet.screen(&pane)?.contains("❯ No"),
        "{}",
        fleet.screen(&pane)?
    );
    let answered = choose(&lead, &blocked, "later").await?;
    assert_eq!(answered["status"], "replied", "{answered}\n{}", fleet.log());
    assert_eq!(answered["reply"]["text"], "chose Later");
    until_status(&lead, "w1", "idle").await?;
    // The option the cursor is on needs no arrow: Enter alone.
    let blocked = lead
        .send("w1", "/menu Pick one: again? | No | Yes", 20)
        .await?;
    let answered = choose(&lead, &blocked, "no").await?;
    assert_eq!(answered["reply"]["text"], "chose No", "{answered}");
    Ok(())
}

/// A choice that ends the program's turn without an answer (its Esc: it shows `Interrupted by
/// Esc`, one of its profile's `turn_over_markers`) ends the task: the lead's call says so, and
/// the worker takes its next task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_choice_that_ends_the_turn_fails_the_task_and_the_worker_goes_on() -> anyhow::Result<()> {
    let (fleet, lead, _, blocked) =
        blocked_on_menu("/menu Pick one: delete it? | No | Yes").await?;
    let answered = choose(&lead, &blocked, "esc").await?;
    assert_eq!(answered["status"], "failed", "{answered}\n{}", fleet.log());
    let reason = answered["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("ended its turn without an answer")
            && reason.contains("Interrupted by Esc"),
        "{reason}"
    );
    until_status(&lead, "w1", "idle").await?;
    let sent = lead.send("w1", "after the menu", 20).await?;
    assert_eq!(sent["reply"]["text"], "echo: after the menu", "{sent}");
    Ok(())
}

/// A menu whose cursor does not move when fleetd presses the arrows: Enter is not pressed (the
/// program chose nothing), the lead hears `not_pressed`, and the dialog, still on the screen, is
/// asked again at once under a new turn id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_that_does_not_reach_the_option_is_not_confirmed() -> anyhow::Result<()> {
    let (_fleet, lead, _, blocked) =
        blocked_on_menu("/stuckmenu Pick one: stuck? | No | Yes").await?;
    let refused = lead
        .call(
            "fleet_send",
            json!({"turn_id": blocked["turn_id"], "choice": "yes"}),
        )
        .await?
        .expect_err("a cursor that did not move");
    assert_eq!(refused.code, "not_pressed", "{refused}");
    assert!(
        refused.message.contains("Enter was not pressed"),
        "{refused}"
    );
    let listed = lead.entry("w1").await?;
    assert_eq!(listed["status"], "blocked", "{listed}");
    let again = listed["dialog"]["turn_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!again.is_empty() && again != blocked["turn_id"], "{listed}");
    assert!(refused.message.contains(&again), "{refused}");
    // The first option needs no arrow: it is confirmed.
    let answered = choose(&lead, &json!({"turn_id": again}), "no").await?;
    assert_eq!(answered["reply"]["text"], "chose No", "{answered}");
    Ok(())
}

/// A cursor menu on a worker of another host: its options reach the lead through the broker,
/// and the option's name comes back, to be checked and turned into keys where the worker is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_menu_on_another_host_is_answered_through_the_broker() -> anyhow::Result<()> {
    let TwoHosts {
        vhost: _vhost,
        a: _a,
        b,
        alice,
        ..
    } = TwoHosts::each(&Broker::find().await?, "", &menu_profile()?).await?;
    hears_host(&alice, "hostb").await?;
    alice
        .ok(
            "fleet_spawn",
            json!({"profile": "menu", "name": "wb", "host": "hostb"}),
        )
        .await?;
    sees(&alice, "wb").await?;
    let blocked = alice
        .send("wb", "/menu Pick one: ship it? | No | Yes, ship", 20)
        .await?;
    assert_eq!(blocked["status"], "blocked", "{blocked}\n{}", b.log());
    assert_eq!(blocked["host"], "hostb");
    assert_eq!(keys(&blocked), ["no", "yes-ship", "esc"]);
    let answered = alice
        .ok(
            "fleet_send",
            json!({"turn_id": blocked["turn_id"], "choice": "yes-ship", "wait_s": 20}),
        )
        .await?;
    assert_eq!(answered["status"], "replied", "{answered}\n{}", b.log());
    assert_eq!(answered["reply"]["text"], "chose Yes, ship");
    Ok(())
}

/// A human answers the menu in the pane with a key that ends the program's turn (Esc: it shows
/// `Interrupted by Esc`): the dialog is over for the lead, the task fails with that reason (the
/// lead's poll gets the notice), and the worker takes its next task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_menu_left_in_the_pane_with_a_key_that_ends_the_turn_fails_the_task() -> anyhow::Result<()>
{
    let (fleet, lead, pane, blocked) =
        blocked_on_menu("/menu Pick one: leave it? | No | Yes").await?;
    let pressed = std::process::Command::new("tmux")
        .args([
            "-L",
            fleet.tmux_socket(),
            "send-keys",
            "-t",
            &pane,
            "Escape",
        ])
        .status()?;
    assert!(pressed.success());
    let notices = lead.poll(20).await?;
    assert_eq!(notices.len(), 1, "{notices:?}\n{}", fleet.log());
    assert_eq!(notices[0]["kind"], "FAILED", "{notices:?}");
    assert_eq!(notices[0]["in_reply_to"], blocked["msg_id"], "{notices:?}");
    let reason = notices[0]["text"].as_str().unwrap_or_default();
    assert!(reason.contains("Interrupted by Esc"), "{reason}");
    until_status(&lead, "w1", "idle").await?;
    let late = lead
        .call(
            "fleet_send",
            json!({"turn_id": blocked["turn_id"], "choice": "yes"}),
        )
        .await?
        .expect_err("an answer to a dialog that is gone");
    assert_eq!(late.code, "too_late", "{late}");
    let sent = lead.send("w1", "after the pane's Esc", 20).await?;
    assert_eq!(
        sent["reply"]["text"], "echo: after the pane's Esc",
        "{sent}"
    );
    Ok(())
}
