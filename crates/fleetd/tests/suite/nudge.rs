//! Nudges into the lead's own pane. The lead's pane is a real tmux pane on a tmux server of the
//! test's own (standing in for the user's), running `cat` (without
//! terminal echo) so each typed line shows once.

use std::process::Command;
use std::time::Duration;

use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::wait::until;
use serde_json::json;
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(20);

/// The lead's screen: Claude Code's empty input box (`❯` and a no-break space, which a nudge
/// waits for), then whatever is typed, shown once.
const LEAD_SCREEN: &str = "printf '\\342\\235\\257\\302\\240\\n'; stty -echo; exec cat";

/// The lead's terminal: a tmux server and pane of the test's own, killed on drop.
struct LeadPane {
    socket: String,
    path: String,
    pane: String,
    /// Its tmux server's pid.
    server: String,
}

impl LeadPane {
    fn start() -> anyhow::Result<Self> {
        let socket = format!("fleet-lead-test-{}", uuid_like());
        let out = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "200",
                "-y",
                "50",
            ])
            .args([
                "-P",
                "-F",
                "#{pane_id} #{socket_path} #{pid}",
                "sh",
                "-c",
                LEAD_SCREEN,
            ])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout)?;
        let [pane, path, server] = text.split_whitespace().collect::<Vec<_>>()[..] else {
            anyhow::bail!("unexpected tmux answer {text:?}");
        };
        Ok(Self {
            socket,
            pane: pane.to_string(),
            path: path.to_string(),
            server: server.to_string(),
        })
    }

    fn screen(&self) -> String {
        Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p", "-t", &self.pane])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Waits until its screen shows `text` (`what`, when it never does).
    async fn shows(&self, what: &str, text: &str) -> anyhow::Result<()> {
        until(what, LIMIT, || async {
            self.screen().contains(text).then_some(())
        })
        .await
    }

    fn nudges(&self) -> usize {
        self.screen().matches("[fleet]").count()
    }

    async fn connect(&self, fleet: &Fleet) -> anyhow::Result<Client> {
        let tmux = format!("{},{},0", self.path, self.server);
        let headers = [
            ("X-Fleet-Pane", self.pane.as_str()),
            ("X-Fleet-Tmux", tmux.as_str()),
        ];
        Client::connect(
            &fleet.url(),
            &fleet.token("lead")?,
            Protocol::Stateless,
            &headers,
        )
        .await
    }
}

impl Drop for LeadPane {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

fn uuid_like() -> String {
    format!("{}-{:?}", std::process::id(), Instant::now())
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_fleetd_nudges_the_lead_in_its_pane_before_it_calls_again() -> anyhow::Result<()>
{
    let leads = "[leads.lead]\nnudge_interval_s = 1\nnudge_quiet_ms = 100\n";
    let mut fleet = Fleet::start("", &format!("{leads}{}", sim_profile("sim", &[])?)).await?;
    let terminal = LeadPane::start()?;
    let lead = terminal.connect(&fleet).await?;
    lead.spawn("sim", "w1").await?;
    let gate = fleet.gate();
    let sent = lead.send("w1", &gate.task("over the restart"), 0).await?;
    fleet.injected(&sent).await?;
    drop(lead);
    fleet.kill9().await?;
    fleet.launch().await?;
    // The lead calls nothing: the reply of the worker taken back is nudged where it was.
    gate.open()?;
    terminal
        .shows(
            "the nudge of the reply after the restart",
            "[fleet] 1 message waiting for you: call fleet_poll",
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_reply_nudges_an_idle_lead_at_most_once_per_interval() -> anyhow::Result<()> {
    let leads = "[leads.lead]\nnudge_interval_s = 2\nnudge_quiet_ms = 100\n";
    let fleet = Fleet::start("", &format!("{leads}{}", sim_profile("sim", &[])?)).await?;
    let terminal = LeadPane::start()?;
    let lead = terminal.connect(&fleet).await?;
    lead.spawn("sim", "w1").await?;

    lead.send("w1", "one", 0).await?;
    terminal
        .shows(
            "the first nudge",
            "[fleet] 1 message waiting for you: call fleet_poll",
        )
        .await?;
    let first = Instant::now();
    lead.send("w1", "two", 0).await?;
    terminal
        .shows("the second nudge", "[fleet] 2 messages waiting")
        .await?;
    assert!(
        first.elapsed() >= Duration::from_millis(1900),
        "two nudges {:?} apart; the interval is 2 s",
        first.elapsed()
    );
    // Collecting the messages stops the nudging.
    let polled = lead.ok("fleet_poll", json!({})).await?;
    assert_eq!(polled["messages"].as_array().map(Vec::len), Some(2));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_blocked_in_a_fleet_call_is_not_nudged() -> anyhow::Result<()> {
    let leads = "[leads.lead]\nnudge_interval_s = 1\nnudge_quiet_ms = 100\n";
    let fleet = Fleet::start("", &format!("{leads}{}", sim_profile("sim", &[])?)).await?;
    let terminal = LeadPane::start()?;
    let lead = terminal.connect(&fleet).await?;
    lead.spawn("sim", "w1").await?;
    lead.spawn("sim", "w2").await?;
    lead.send("w1", "held", 0).await?;
    until("the first nudge", LIMIT, || async {
        (terminal.nudges() == 1).then_some(())
    })
    .await?;
    // Blocked for about four nudge intervals while the held message waits: watched the whole
    // time, no second nudge comes (after the call returns, one may again).
    let send = lead.send("w2", "/slow 4000 long", 20);
    tokio::pin!(send);
    let sent = loop {
        tokio::select! {
            sent = &mut send => break sent?,
            () = tokio::time::sleep(Duration::from_millis(50)) => assert_eq!(
                terminal.nudges(),
                1,
                "nudged while blocked:\n{}",
                terminal.screen()
            ),
        }
    };
    assert_eq!(sent["reply"]["text"], "echo: long");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_held_before_fleetd_knows_the_leads_pane_nudge_it_once_it_names_it()
-> anyhow::Result<()> {
    // As after a restart of fleetd: a reply waits for the lead, and its first request since
    // names its pane. Nothing else arrives, so only that request can start the nudge.
    let leads = "[leads.lead]\nnudge_interval_s = 1\nnudge_quiet_ms = 100\n";
    let fleet = Fleet::start("", &format!("{leads}{}", sim_profile("sim", &[])?)).await?;
    let unnamed = fleet.lead("lead", Protocol::Stateless).await?;
    unnamed.spawn("sim", "w1").await?;
    unnamed.send("w1", "one", 0).await?;
    let held = r#"fleetd_waiting_messages{recipient="lead",state="held"}"#;
    until("the reply held for the lead", LIMIT, || async {
        (fleet.metric("lead", held).await == Some(1.0)).then_some(())
    })
    .await?;
    // Its client connects from its pane: the handshake's own requests name the pane.
    let terminal = LeadPane::start()?;
    let named = terminal.connect(&fleet).await?;
    named.ok("fleet_list", json!({})).await?;
    terminal
        .shows(
            "the nudge of the reply held before",
            "[fleet] 1 message waiting for you: call fleet_poll",
        )
        .await?;
    Ok(())
}
