//! The pane-host test suite, run against every host: tmux (a real private tmux server, and
//! panes spread over several), the
//! herdr stand-in (`fleet_testkit::standin`: herdr's protocol, panes in tmux — a stand-in, not
//! herdr), and a real herdr, on the binary `HERDR_BIN` names (built without `HERDR_BIN`, those
//! tests are ignored, with the reason: see build.rs).

// A test may unwrap: a panic is how it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::dialog::Key;
use fleet_mux::herdr::driver::Driver;
use fleet_mux::herdr::{codec, host::Herdr};
use fleet_mux::inject::{InjectOptions, InjectOutcome, inject};
use fleet_mux::tmux::Tmux;
use fleet_mux::tmux::spread::Spread;
use fleet_mux::{AgentState, PaneHost, PaneId, PaneLife, PaneSpec};
use fleet_testkit::fleet::stop_tmux;
use fleet_testkit::herdr::RealHerdr;
use fleet_testkit::standin::StandIn;
use fleet_testkit::wait::until;
use tokio::sync::watch;

const LIMIT: Duration = Duration::from_secs(10);

/// A host under test and what it can tell.
struct Fixture {
    host: Arc<dyn PaneHost>,
    /// Whether the host reports a program's exit status (tmux does; herdr's panes just vanish).
    exit_status: bool,
    /// herdr's socket, for tests that talk to herdr beside the host.
    herdr: Option<PathBuf>,
    /// Stops what the fixture started, when the test ends.
    _cleanup: Cleanup,
}

/// Kills a private tmux server and a child process, aborts a task, removes a temp dir.
struct Cleanup {
    tmux: Option<String>,
    herdr: Option<RealHerdr>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        self.herdr.take();
        if let Some(name) = &self.tmux {
            stop_tmux(name);
        }
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// A fixture of `host`, on private tmux servers named after `name`, staging in `dir`.
fn on_tmux(host: Arc<dyn PaneHost>, name: String, dir: tempfile::TempDir) -> Fixture {
    Fixture {
        host,
        exit_status: true,
        herdr: None,
        _cleanup: Cleanup {
            tmux: Some(name),
            herdr: None,
            task: None,
            _dir: dir,
        },
    }
}

async fn tmux() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let name = unique("fleet-panehost");
    let host = Tmux::private(name.clone(), dir.path().join("paste"));
    on_tmux(Arc::new(host), name, dir)
}

/// tmux with a server per pane: fleetd's panes spread over several private servers
/// ([`Spread`]). Server 1 holds a pane of the fixture's, so each pane of a case is on a
/// server after it (its id names the server).
async fn tmux_spread() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let name = unique("fleet-spread");
    let host = Spread::open(name.clone(), dir.path().join("paste"), 1).await;
    let first = host.spawn(&spec("first", "exec sleep 600")).await.unwrap();
    assert!(first.0.starts_with('%'), "{first}");
    on_tmux(Arc::new(host), name, dir)
}

async fn wait_for_socket(socket: &std::path::Path) {
    until("the herdr socket", LIMIT, || async {
        Driver::new(socket.to_path_buf()).ping().await.ok()
    })
    .await
    .unwrap();
}

async fn herdr_standin() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let name = unique("fleet-standin");
    // Every third answer stalls ~100 ms, as herdr's do now and then.
    let task = tokio::spawn(StandIn::serve(
        socket.clone(),
        name.clone(),
        dir.path().join("paste"),
        Some(3),
    ));
    wait_for_socket(&socket).await;
    let host = Herdr::connect(&socket, "fleet").await.unwrap();
    Fixture {
        host: Arc::new(host),
        exit_status: false,
        herdr: Some(socket),
        _cleanup: Cleanup {
            tmux: Some(name),
            herdr: None,
            task: Some(task),
            _dir: dir,
        },
    }
}

async fn herdr_real() -> Fixture {
    let herdr = RealHerdr::required().await.unwrap();
    let socket = herdr.socket();
    let host = Herdr::connect(&socket, "fleet").await.unwrap();
    Fixture {
        host: Arc::new(host),
        exit_status: false,
        herdr: Some(socket),
        _cleanup: Cleanup {
            tmux: None,
            herdr: Some(herdr),
            task: None,
            _dir: tempfile::tempdir().unwrap(),
        },
    }
}

fn spec(label: &str, script: &str) -> PaneSpec {
    PaneSpec {
        label: label.into(),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: BTreeMap::from([("FLEET_PROBE".to_string(), "from-env;".to_string())]),
        cwd: std::env::temp_dir(),
    }
}

/// Waits until the pane's output (unwrapped) shows `needle`.
async fn wait_for_text(host: &dyn PaneHost, pane: &PaneId, needle: &str) -> String {
    let found = until(&format!("the pane to show {needle:?}"), LIMIT, || async {
        host.history(pane, 200)
            .await
            .ok()
            .filter(|t| t.contains(needle))
    })
    .await;
    match found {
        Ok(text) => text,
        Err(e) => panic!(
            "{e}; it shows:\n{}",
            host.history(pane, 200).await.unwrap_or_default()
        ),
    }
}

fn options() -> InjectOptions {
    InjectOptions {
        enter_pause: Duration::ZERO,
        verify_window: Duration::from_millis(600),
        submitted_marker: None,
        settle_first: None,
    }
}

/// Spawns `script` in a pane labelled `label` and waits until the pane shows `shown`.
async fn spawn_showing(host: &dyn PaneHost, label: &str, script: &str, shown: &str) -> PaneId {
    let pane = host.spawn(&spec(label, script)).await.unwrap();
    wait_for_text(host, &pane, shown).await;
    pane
}

/// Injects `text` into a pane whose program makes no MCP calls.
async fn inject_quietly(
    host: &dyn PaneHost,
    pane: &PaneId,
    text: &str,
    options: &InjectOptions,
) -> InjectOutcome {
    let (_tx, mut activity) = watch::channel(0);
    inject(host, pane, text, options, &mut activity)
        .await
        .unwrap()
}

async fn runs_argv_with_env_and_cwd(f: &Fixture) {
    let host = f.host.as_ref();
    let pane = host
        .spawn(&spec(
            "envcheck",
            "echo \"probe=$FLEET_PROBE cwd=$(pwd)\"; exec sleep 60",
        ))
        .await
        .unwrap();
    let cwd = std::env::temp_dir().canonicalize().unwrap();
    wait_for_text(
        host,
        &pane,
        &format!("probe=from-env; cwd={}", cwd.display()),
    )
    .await;
    let state = host.panes().await.unwrap().remove(&pane).unwrap();
    assert_eq!(state.life, PaneLife::Alive);
}

async fn multi_line_pastes_arrive_bracketed(f: &Fixture) {
    let host = f.host.as_ref();
    let pane = spawn_showing(
        host,
        "paste",
        "printf '\\033[?2004h'; stty -echo; echo ready; exec cat -v",
        "ready",
    )
    .await;
    host.paste(&pane, "first line\nsecond line").await.unwrap();
    host.enter(&pane).await.unwrap();
    let text = wait_for_text(host, &pane, "second line^[[201~").await;
    assert!(text.contains("^[[200~first line"), "{text}");
}

/// Each key of the safe set reaches the program as the key it is: a raw-mode reader shows
/// what bytes it got.
async fn the_safe_keys_arrive_as_themselves(f: &Fixture) {
    let host = f.host.as_ref();
    let pane = spawn_showing(
        host,
        "keys",
        "stty raw -echo; echo ready; od -An -tx1 -w1 -v",
        "ready",
    )
    .await;
    for key in [
        Key::Digit(1),
        Key::Digit(9),
        Key::Yes,
        Key::No,
        Key::Escape,
        Key::Up,
        Key::Down,
        Key::Left,
        Key::Right,
    ] {
        host.press(&pane, key).await.unwrap();
    }
    host.press(&pane, Key::Enter).await.unwrap();
    // od prints one byte a line: 1 9 y n Esc, the arrows (ESC [ A, B, D, C), then Enter (a
    // carriage return in raw mode).
    let text = wait_for_text(host, &pane, " 0d").await;
    let bytes: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.len() == 2 && l.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect();
    assert_eq!(
        bytes,
        [
            "31", "39", "79", "6e", "1b", "1b", "5b", "41", "1b", "5b", "42", "1b", "5b", "44",
            "1b", "5b", "43", "0d"
        ],
        "{text}"
    );
}

/// A screen read with its colours holds the text as the plain read does, and the escapes that
/// paint it: a background stays where it was.
async fn a_screen_is_read_with_its_colours(f: &Fixture) {
    let host = f.host.as_ref();
    let pane = spawn_showing(
        host,
        "colours",
        "printf 'plain \\033[48;5;215mlit\\033[0m after\\n'; exec sleep 600",
        "after",
    )
    .await;
    let styled = host.styled(&pane).await.unwrap();
    let line = styled
        .lines()
        .find(|l| l.contains("lit"))
        .unwrap_or_else(|| panic!("{styled:?}"));
    let (before, _) = line.split_once("lit").unwrap();
    let last_escape = before.rsplit('\u{1b}').next().unwrap_or_default();
    assert!(last_escape.contains("48;5;215"), "{line:?}");
    assert!(line.contains("plain") && line.contains("after"), "{line:?}");
}

async fn injected_lines_are_verified(f: &Fixture) {
    let host = f.host.as_ref();
    let pane = spawn_showing(
        host,
        "echoer",
        "echo ready; while read line; do echo \"got:$line\"; done",
        "ready",
    )
    .await;
    let outcome = inject_quietly(host, &pane, "hello there", &options()).await;
    assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
    wait_for_text(host, &pane, "got:hello there").await;
}

async fn a_call_in_proves_a_submit(f: &Fixture) {
    let host = f.host.as_ref();
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("took-it");
    let script = format!(
        "stty -echo; echo ready; while read line; do touch '{}'; done",
        flag.display()
    );
    let pane = spawn_showing(host, "silent", &script, "ready").await;
    let (tx, mut activity) = watch::channel(0u64);
    let caller = tokio::spawn(async move {
        until("the agent to take the line", LIMIT, || {
            let flag = flag.clone();
            async move { flag.exists().then_some(()) }
        })
        .await
        .unwrap();
        tx.send_modify(|n| *n += 1);
        tx
    });
    let outcome = inject(host, &pane, "task", &options(), &mut activity)
        .await
        .unwrap();
    assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
    drop(caller.await.unwrap());
}

async fn an_ignored_enter_is_not_submitted(f: &Fixture) {
    let host = f.host.as_ref();
    let pane = spawn_showing(
        host,
        "deaf",
        "stty -echo -icanon; echo ready; exec sleep 60",
        "ready",
    )
    .await;
    let outcome = inject_quietly(host, &pane, "lost", &options()).await;
    assert_eq!(outcome, InjectOutcome::NotSubmitted);
}

async fn exits_are_seen_and_close_removes(f: &Fixture) {
    let host = f.host.as_ref();
    // tmux can miss output written in the very instant before exit, so pause briefly.
    let quitter = host
        .spawn(&spec("quitter", "echo last words; sleep 0.3; exit 3"))
        .await
        .unwrap();
    let expected = PaneLife::Exited(f.exit_status.then_some(3));
    until("the exit to be seen", LIMIT, || async {
        host.panes()
            .await
            .ok()
            .and_then(|p| p.get(&quitter).map(|s| s.life))
            .filter(|life| *life == expected)
    })
    .await
    .unwrap();
    let kept = host.spawn(&spec("kept", "exec sleep 60")).await.unwrap();
    host.close(&kept).await.unwrap();
    assert!(!host.panes().await.unwrap().contains_key(&kept));
    // Closing again is not an error.
    host.close(&kept).await.unwrap();
}

async fn a_marker_waits_for_an_empty_input_box(f: &Fixture) {
    let host = f.host.as_ref();
    let script = "stty -echo; while true; do printf 'EMPTY>'; read line; echo \" got:$line\"; done";
    let pane = spawn_showing(host, "boxed", script, "EMPTY>").await;
    let with_marker = InjectOptions {
        submitted_marker: Some("EMPTY>".into()),
        ..options()
    };
    let outcome = inject_quietly(host, &pane, "first", &with_marker).await;
    assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
    wait_for_text(host, &pane, "got:first").await;

    let busy = spawn_showing(
        host,
        "busy",
        "stty -echo; echo working; exec sleep 60",
        "working",
    )
    .await;
    let before = host.history(&busy, 50).await.unwrap();
    let outcome = inject_quietly(host, &busy, "second", &with_marker).await;
    assert_eq!(outcome, InjectOutcome::InputNotEmpty);
    assert_eq!(host.history(&busy, 50).await.unwrap(), before);
}

async fn agents_the_host_sees_are_listed(f: &Fixture) {
    let host = f.host.as_ref();
    let pane = host.spawn(&spec("agent", "exec sleep 60")).await.unwrap();
    // fleetd's own report is shown by the host but is no news to fleetd.
    host.report(&pane, AgentState::Working).await.unwrap();
    let listed = host.panes().await.unwrap().remove(&pane).unwrap();
    assert_eq!(listed.agent, None);
    let Some(socket) = &f.herdr else {
        return;
    };
    // Beside it, an agent herdr recognises (in the stand-in: a report from another source).
    let herdr = Driver::new(socket.clone());
    herdr
        .call(codec::report_agent(
            &pane.0,
            "herdr",
            "claude",
            AgentState::Blocked,
        ))
        .await
        .unwrap();
    let listed = host.panes().await.unwrap().remove(&pane).unwrap();
    assert_eq!(
        listed.agent,
        Some(("claude".to_string(), AgentState::Blocked))
    );
}

/// Every case on every host, each host's tests with the attributes given before it.
macro_rules! suite {
    ($($(#[$attr:meta])* $host:ident),*) => {$(
        mod $host {
            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    $(#[$attr])*
                    async fn $case() {
                        super::$case(&super::$host().await).await;
                    }
                };
            }

            case!(runs_argv_with_env_and_cwd);
            case!(multi_line_pastes_arrive_bracketed);
            case!(injected_lines_are_verified);
            case!(the_safe_keys_arrive_as_themselves);
            case!(a_screen_is_read_with_its_colours);
            case!(a_call_in_proves_a_submit);
            case!(an_ignored_enter_is_not_submitted);
            case!(exits_are_seen_and_close_removes);
            case!(a_marker_waits_for_an_empty_input_box);
            case!(agents_the_host_sees_are_listed);
        }
    )*};
}

suite!(
    tmux,
    tmux_spread,
    herdr_standin,
    #[cfg_attr(
        not(herdr_bin),
        ignore = "needs a real herdr: set HERDR_BIN to its binary"
    )]
    herdr_real
);
