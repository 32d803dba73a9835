//! What is particular to the tmux pane host, against a real private tmux server per test (the
//! behaviour every host shares is the pane-host suite in fleet-testkit's tests).

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_mux::inject::{InjectOptions, InjectOutcome, inject};
use fleet_mux::tmux::control::Control;
use fleet_mux::tmux::{Socket, Tmux};
use fleet_mux::{PaneHost, PaneId, PaneSpec};
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
        settle_first: None,
    }
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
