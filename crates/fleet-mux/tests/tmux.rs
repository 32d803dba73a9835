//! The tmux pane host against a real tmux server (a private one per test, killed at the end).

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_mux::inject::{InjectOptions, InjectOutcome, inject};
use fleet_mux::tmux::control::Control;
use fleet_mux::tmux::{Socket, Tmux};
use fleet_mux::{PaneHost, PaneId, PaneLife, PaneSpec};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

/// A private tmux server (driven over its control connection, as fleetd drives it) that is
/// killed when the test ends, pass or fail.
struct Server {
    tmux: Tmux,
    /// Where its pastes are staged; removed with the server.
    _scratch: tempfile::TempDir,
}

impl Server {
    fn new() -> Self {
        let scratch = tempfile::tempdir().unwrap();
        let name = format!("fleet-mux-test-{}", uuid::Uuid::now_v7().simple());
        Server {
            tmux: Tmux::private(name, scratch.path().join("paste")),
            _scratch: scratch,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Socket::Name(name) = self.tmux.socket() {
            let _ = std::process::Command::new("tmux")
                .args(["-L", name, "kill-server"])
                .output();
        }
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

/// Waits until the pane shows `needle`, or fails the test after 10 s.
async fn wait_for_text(host: &Tmux, pane: &PaneId, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snap = host.snapshot(pane).await.unwrap();
        if snap.text.contains(needle) {
            return snap.text;
        }
        assert!(
            Instant::now() < deadline,
            "pane never showed {needle:?}; it shows:\n{}",
            snap.text
        );
        sleep(Duration::from_millis(20)).await;
    }
}

fn options() -> InjectOptions {
    InjectOptions {
        enter_pause: Duration::ZERO,
        verify_window: Duration::from_millis(400),
        submitted_marker: None,
    }
}

#[tokio::test]
async fn a_pane_runs_argv_with_env_and_cwd() {
    let server = Server::new();
    let pane = server
        .tmux
        .spawn(&spec(
            "envcheck",
            "echo \"probe=$FLEET_PROBE cwd=$(pwd)\"; exec sleep 60",
        ))
        .await
        .unwrap();
    let cwd = std::env::temp_dir().canonicalize().unwrap();
    wait_for_text(
        &server.tmux,
        &pane,
        &format!("probe=from-env; cwd={}", cwd.display()),
    )
    .await;
    assert_eq!(
        server.tmux.panes().await.unwrap().get(&pane),
        Some(&PaneLife::Alive)
    );
}

#[tokio::test]
async fn a_multi_line_paste_arrives_bracketed_when_asked_for() {
    let server = Server::new();
    // Turns on bracketed paste, then shows raw input bytes with cat -v.
    let pane = server
        .tmux
        .spawn(&spec(
            "paste",
            "printf '\\033[?2004h'; stty -echo; echo ready; exec cat -v",
        ))
        .await
        .unwrap();
    wait_for_text(&server.tmux, &pane, "ready").await;
    server
        .tmux
        .paste(&pane, "first line\nsecond line")
        .await
        .unwrap();
    server.tmux.enter(&pane).await.unwrap();
    let text = wait_for_text(&server.tmux, &pane, "second line^[[201~").await;
    assert!(text.contains("^[[200~first line"), "{text}");
}

#[tokio::test]
async fn an_injected_line_is_verified_as_submitted() {
    let server = Server::new();
    let pane = server
        .tmux
        .spawn(&spec(
            "echoer",
            "echo ready; while read line; do echo \"got:$line\"; done",
        ))
        .await
        .unwrap();
    wait_for_text(&server.tmux, &pane, "ready").await;
    let (_tx, mut activity) = watch::channel(0);
    let outcome = inject(
        &server.tmux,
        &pane,
        "hello there",
        &options(),
        &mut activity,
    )
    .await
    .unwrap();
    assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
    wait_for_text(&server.tmux, &pane, "got:hello there").await;
}

#[tokio::test]
async fn an_agent_calling_in_counts_as_a_submit() {
    let server = Server::new();
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("took-it");
    // Reads without echo and prints nothing; it "calls in" by touching a file once it has the
    // line, so only the call-in can prove the submit.
    let script = format!(
        "stty -echo; echo ready; while read line; do touch '{}'; done",
        flag.display()
    );
    let pane = server.tmux.spawn(&spec("silent", &script)).await.unwrap();
    wait_for_text(&server.tmux, &pane, "ready").await;
    let (tx, mut activity) = watch::channel(0u64);
    let caller = tokio::spawn(async move {
        while !flag.exists() {
            sleep(Duration::from_millis(5)).await;
        }
        tx.send_modify(|n| *n += 1);
        tx
    });
    let outcome = inject(&server.tmux, &pane, "task", &options(), &mut activity)
        .await
        .unwrap();
    assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
    drop(caller.await.unwrap());
}

#[tokio::test]
async fn a_program_that_ignores_enter_is_reported_not_submitted() {
    let server = Server::new();
    let pane = server
        .tmux
        .spawn(&spec(
            "deaf",
            "stty -echo -icanon; echo ready; exec sleep 60",
        ))
        .await
        .unwrap();
    wait_for_text(&server.tmux, &pane, "ready").await;
    let (_tx, mut activity) = watch::channel(0);
    let outcome = inject(&server.tmux, &pane, "lost", &options(), &mut activity)
        .await
        .unwrap();
    assert_eq!(outcome, InjectOutcome::NotSubmitted);
}

#[tokio::test]
async fn the_control_connection_and_the_client_see_the_same_screen() {
    let server = Server::new();
    let pane = server
        .tmux
        .spawn(&spec("both", "printf 'one\\ntwo'; exec sleep 60"))
        .await
        .unwrap();
    wait_for_text(&server.tmux, &pane, "two").await;
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    let client = Tmux::new(Socket::Name(name));
    let (a, b) = (
        server.tmux.snapshot(&pane).await.unwrap(),
        client.snapshot(&pane).await.unwrap(),
    );
    assert_eq!(a.cursor, b.cursor);
    assert_eq!(a.text.trim_end(), b.text.trim_end());
    assert_eq!(
        server.tmux.panes().await.unwrap(),
        client.panes().await.unwrap()
    );
    // Typing through a client process works as well as through the control connection.
    client.type_text(&pane, "typed;").await.unwrap();
    client.enter(&pane).await.unwrap();
    wait_for_text(&server.tmux, &pane, "typed;").await;
}

#[tokio::test]
async fn the_control_connection_comes_back_after_the_server_is_killed() {
    let server = Server::new();
    let first = server
        .tmux
        .spawn(&spec("before", "exec sleep 60"))
        .await
        .unwrap();
    assert_eq!(server.tmux.panes().await.unwrap().len(), 1);
    server.tmux.kill_server().await.unwrap();
    // The connection notices the server is gone: an error now, or no panes; never a hang.
    let after = server.tmux.panes().await;
    assert!(after.is_err() || after.as_ref().is_ok_and(|p| !p.contains_key(&first)));
    let second = server
        .tmux
        .spawn(&spec("after", "exec sleep 60"))
        .await
        .unwrap();
    assert_eq!(
        server
            .tmux
            .panes()
            .await
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec![&second]
    );
}

#[tokio::test]
async fn an_exited_program_is_seen_with_its_status_and_close_removes_it() {
    let server = Server::new();
    let pane = server
        .tmux
        // tmux can miss output written in the very instant before exit, so pause briefly.
        .spawn(&spec(
            "quitter",
            "echo last words before exit; sleep 0.2; exit 3",
        ))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let life = server.tmux.panes().await.unwrap().get(&pane).copied();
        if life == Some(PaneLife::Exited(Some(3))) {
            break;
        }
        assert!(Instant::now() < deadline, "exit never seen: {life:?}");
        sleep(Duration::from_millis(20)).await;
    }
    let said = server.tmux.history(&pane, 50).await.unwrap();
    assert!(said.contains("last words before exit"), "{said}");
    server.tmux.close(&pane).await.unwrap();
    assert!(!server.tmux.panes().await.unwrap().contains_key(&pane));
    // Closing again, or a server with no panes left, is not an error.
    server.tmux.close(&pane).await.unwrap();
    assert!(server.tmux.panes().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_pane_in_copy_mode_is_taken_out_of_it_before_typing() {
    let server = Server::new();
    let pane = server
        .tmux
        .spawn(&spec(
            "scrolled",
            "echo ready; while read line; do echo \"got:$line\"; done",
        ))
        .await
        .unwrap();
    wait_for_text(&server.tmux, &pane, "ready").await;
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    // A human scrolling back in the pane.
    let status = std::process::Command::new("tmux")
        .args(["-L", &name, "copy-mode", "-t", &pane.0])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(server.tmux.snapshot(&pane).await.unwrap().in_mode);
    let (_tx, mut activity) = watch::channel(0);
    let outcome = inject(
        &server.tmux,
        &pane,
        "typed anyway",
        &options(),
        &mut activity,
    )
    .await
    .unwrap();
    assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
    wait_for_text(&server.tmux, &pane, "got:typed anyway").await;
}

#[tokio::test]
async fn a_call_given_up_half_way_does_not_mix_up_later_answers() {
    let server = Server::new();
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    let control = Control::new("tmux".into(), name);
    // A command whose answer takes a while (tmux holds later commands until a run-shell ends),
    // abandoned after it was sent.
    let slow = [
        "run-shell 'sleep 0.3'".to_string(),
        "display-message -p 'stale answer'".to_string(),
    ];
    assert!(
        tokio::time::timeout(Duration::from_millis(100), control.run(&slow))
            .await
            .is_err()
    );
    // The next command gets its own answer, not the abandoned one's.
    let answers = control
        .run(&["display-message -p 'fresh answer'".to_string()])
        .await
        .unwrap();
    assert_eq!(answers, vec![vec!["fresh answer".to_string()]]);
}

#[tokio::test]
async fn with_a_marker_nothing_is_typed_until_the_input_box_shows_empty() {
    let server = Server::new();
    // Shows its empty-input marker only when it is waiting for a line.
    let script = "stty -echo; while true; do printf 'EMPTY>'; read line; echo \" got:$line\"; done";
    let pane = server.tmux.spawn(&spec("boxed", script)).await.unwrap();
    wait_for_text(&server.tmux, &pane, "EMPTY>").await;
    let with_marker = InjectOptions {
        submitted_marker: Some("EMPTY>".into()),
        ..options()
    };
    let (_tx, mut activity) = watch::channel(0);
    let outcome = inject(&server.tmux, &pane, "first", &with_marker, &mut activity)
        .await
        .unwrap();
    assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
    wait_for_text(&server.tmux, &pane, "got:first").await;

    // A program busy with something else never shows its empty box: nothing is typed.
    let busy = server
        .tmux
        .spawn(&spec("busy", "stty -echo; echo working; exec sleep 60"))
        .await
        .unwrap();
    wait_for_text(&server.tmux, &busy, "working").await;
    let before = server.tmux.snapshot(&busy).await.unwrap();
    let outcome = inject(&server.tmux, &busy, "second", &with_marker, &mut activity)
        .await
        .unwrap();
    assert_eq!(outcome, InjectOutcome::InputNotEmpty);
    assert_eq!(server.tmux.snapshot(&busy).await.unwrap().text, before.text);
}
