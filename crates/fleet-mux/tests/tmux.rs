//! What is particular to the tmux pane host, against a real private tmux server per test (the
//! behaviour every host shares is the pane-host suite in fleet-testkit's tests).

// A test may unwrap: a panic is how it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use fleet_mux::inject::{InjectOptions, InjectOutcome, inject};
use fleet_mux::tmux::COMMAND_TIMEOUT;
use fleet_mux::tmux::codec::spawn_commands;
use fleet_mux::tmux::control::Control;
use fleet_mux::tmux::spread::{self, Spread};
use fleet_mux::tmux::{Socket, Tmux};
use fleet_mux::{MuxError, PaneHost, PaneId, PaneSpec};
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
async fn wait_for_text(host: &dyn PaneHost, pane: &PaneId, needle: &str) -> String {
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
    let control = Control::new("tmux".into(), name, COMMAND_TIMEOUT);
    abandon_a_slow_call(&control).await;
    // The next command gets its own answer, not the abandoned one's.
    let answers = control
        .run(&[words(&["display-message", "-p", "fresh answer"])])
        .await
        .unwrap();
    assert_eq!(answers, vec![vec!["fresh answer".to_string()]]);
}

/// Sends `control` a command whose answer takes a while (tmux holds the command after a
/// run-shell until it ends), and gives up on it once it is sent: an answer is left unread.
async fn abandon_a_slow_call(control: &Control) {
    let slow = [
        words(&["run-shell", "sleep 0.3"]),
        words(&["display-message", "-p", "stale answer"]),
    ];
    assert!(
        tokio::time::timeout(Duration::from_millis(100), control.run(&slow))
            .await
            .is_err()
    );
}

/// When the control connection is replaced, what its reader had not yet read goes with it:
/// every watch of a pane is woken then, so its caller looks again rather than wait for a write
/// already missed.
#[tokio::test]
async fn a_replaced_connection_wakes_every_watch() {
    let server = Server::new();
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    let pane = server.tmux.spawn(&spec("quiet", "exec cat")).await.unwrap();
    let control = Control::new("tmux".into(), name, COMMAND_TIMEOUT);
    let mut output = control.watch(&pane).await.unwrap();
    output.mark_seen();
    // A call abandoned half-way leaves an answer unread: the next call replaces the connection.
    abandon_a_slow_call(&control).await;
    // cat writes nothing, so only the replacement can wake the watch.
    let answers = control
        .run(&[words(&["display-message", "-p", "next"])])
        .await
        .unwrap();
    assert_eq!(answers, vec![vec!["next".to_string()]]);
    tokio::time::timeout(Duration::from_secs(5), output.changed())
        .await
        .expect("the watch is woken when its connection is replaced");
    assert!(output.is_live(), "the watch still hears the new connection");
    output.mark_seen();
    server.tmux.type_text(&pane, "after").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), output.changed())
        .await
        .expect("a write through the new connection is heard");
}

/// Several commands go as one list: each answered in turn, a `;` inside a word is only text,
/// and a failure stops the list there (what comes after it never runs) and leaves the
/// connection to answer the next call.
#[tokio::test]
async fn commands_run_as_one_list_stop_at_the_first_failure() {
    let server = Server::new();
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    let control = Control::new("tmux".into(), name, COMMAND_TIMEOUT);
    let answers = control
        .run(&[
            words(&["display-message", "-p", "one ; two"]),
            words(&["display-message", "-p", ";"]),
            words(&["display-message", "-p", "three"]),
        ])
        .await
        .unwrap();
    assert_eq!(
        answers,
        vec![
            vec!["one ; two".to_string()],
            vec![";".to_string()],
            vec!["three".to_string()]
        ]
    );
    let failed = control
        .run(&[
            words(&["set-option", "-g", "@fleet-test", "before"]),
            words(&["kill-pane", "-t", "%999999"]),
            words(&["set-option", "-g", "@fleet-test", "after"]),
        ])
        .await;
    assert!(matches!(failed, Err(MuxError::NoPane(_))), "{failed:?}");
    let answers = control
        .run(&[words(&["show-options", "-gv", "@fleet-test"])])
        .await
        .unwrap();
    assert_eq!(answers, vec![vec!["before".to_string()]]);
    // No commands, no line (an empty one would detach the client): the next call still works.
    assert!(control.run(&[]).await.unwrap().is_empty());
    assert_eq!(
        control
            .run(&[words(&["display-message", "-p", "still here"])])
            .await
            .unwrap(),
        vec![vec!["still here".to_string()]]
    );
}

fn words(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|w| w.to_string()).collect()
}

/// A program that writes its working directory to `out`, then waits.
fn print_cwd(cwd: &Path, out: &Path) -> PaneSpec {
    PaneSpec {
        cwd: cwd.to_path_buf(),
        ..spec(
            "where",
            &format!("pwd > '{}'; exec sleep 60", out.display()),
        )
    }
}

/// Waits until `file` holds a whole line, or fails the test after 10 s; returns the line.
async fn wait_for_line(file: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Some(line) = text.strip_suffix('\n')
        {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "{} never got a line",
            file.display()
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_directory_named_like_a_tmux_command_is_only_a_directory() {
    let server = Server::new();
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path().canonicalize().unwrap();
    let owned = tmp.join("owned");
    // tmux would run `touch <tmp>/owned` for `#(…)` in a format.
    let hostile = tmp.join(format!("#(touch {})", owned.display()));
    std::fs::create_dir_all(&hostile).unwrap();
    let out = tmp.join("pwd");
    server.tmux.spawn(&print_cwd(&hostile, &out)).await.unwrap();
    assert_eq!(wait_for_line(&out).await, hostile.display().to_string());
    assert!(!owned.exists(), "the directory's name ran as a command");
}

#[tokio::test]
async fn a_hash_in_a_directory_name_is_kept() {
    let server = Server::new();
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path().canonicalize().unwrap();
    // `#S` is the session's name in a tmux format.
    let dir = tmp.join("C#Sharp");
    std::fs::create_dir(&dir).unwrap();
    let out = tmp.join("pwd");
    let pane = server.tmux.spawn(&print_cwd(&dir, &out)).await.unwrap();
    assert_eq!(wait_for_line(&out).await, dir.display().to_string());
    // And a paste staged under a path with a `#` arrives whole.
    let scratch = tmp.join("state#1");
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    let host = Tmux::private(name, scratch);
    let echo = host
        .spawn(&spec(
            "echo",
            "echo ready; while read line; do echo \"got:$line\"; done",
        ))
        .await
        .unwrap();
    wait_for_text(&host, &echo, "ready").await;
    // Two lines: staged in a file (one line would ride on the command line).
    host.paste(&echo, "pasted #S\nand #S").await.unwrap();
    host.enter(&echo).await.unwrap();
    wait_for_text(&host, &echo, "got:pasted #S").await;
    wait_for_text(&host, &echo, "got:and #S").await;
    assert!(server.tmux.panes().await.unwrap().contains_key(&pane));
    let left: Vec<_> = std::fs::read_dir(tmp.join("state#1")).unwrap().collect();
    assert!(left.is_empty(), "the staged paste is removed: {left:?}");
}

/// A one-line paste rides on the control connection's command line (`set-buffer`), so each
/// character tmux's parser could take for syntax (quotes, `$`, `\\`, `;`, `#{…}`, `~`, braces, a
/// leading `-`, a `~` opening a word in double quotes) must still arrive as itself; and nothing is
/// staged on disk for it.
#[tokio::test]
async fn a_one_line_paste_arrives_as_itself_whatever_it_holds() {
    let server = Server::new();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("typed");
    let texts = [
        "it's $HOME and ${HOME}, #{pane_id} ## #S \\ \" ;",
        "'",
        "\\",
        "$",
        "-x",
        "--",
        "~/x ~",
        "~/x it's",
        "~root's ~",
        "a;b ; c \\;",
        "{ } %if #[fg=red] %1 %%",
        "caf\u{e9} \u{65e5}\u{672c} \u{1f389} \u{202e}mirrored",
        " leading and trailing blanks ",
    ];
    let script = format!("stty -echo; echo ready; exec cat > {}", out.display());
    let pane = server.tmux.spawn(&spec("verbatim", &script)).await.unwrap();
    wait_for_text(&server.tmux, &pane, "ready").await;
    for text in texts {
        server.tmux.paste(&pane, text).await.unwrap();
        server.tmux.enter(&pane).await.unwrap();
    }
    let expected: String = texts.iter().map(|t| format!("{t}\n")).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let typed = std::fs::read_to_string(&out).unwrap_or_default();
        if typed == expected {
            break;
        }
        assert!(
            Instant::now() < deadline && expected.starts_with(&typed),
            "typed {typed:?}, expected {expected:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
    // The staging directory is made for the first file staged: none was.
    assert!(
        !server._scratch.path().join("paste").exists(),
        "a one-line paste stages no file"
    );
}

#[tokio::test]
async fn a_newline_in_a_directory_is_refused_and_the_connection_stays_in_step() {
    let server = Server::new();
    let tmp = tempfile::tempdir().unwrap();
    let owned = tmp.path().join("owned");
    // Sent as it is, the line would end after `x` and the next line would run `touch` (the
    // `#` comments out the closing quote).
    let payload = format!("x\nrun-shell \"touch {}\" #", owned.display());
    let hostile = tmp.path().join(&payload);
    std::fs::create_dir_all(&hostile).unwrap();
    let err = server
        .tmux
        .spawn(&print_cwd(&hostile, &tmp.path().join("pwd")))
        .await
        .unwrap_err();
    assert!(matches!(err, MuxError::Refused(_)), "{err}");
    let err = err.to_string();
    assert!(
        err.contains("working directory") && err.contains("U+000A (newline)"),
        "{err}"
    );
    // The same words straight to the control connection: refused, nothing sent.
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    let control = Control::new("tmux".into(), name, COMMAND_TIMEOUT);
    let err = control
        .run(&[
            words(&["display-message", "-p", "first"]),
            words(&["display-message", "-p", &payload]),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, MuxError::Refused(_)), "{err}");
    // Each later command gets its own answer.
    let answers = control
        .run(&[
            words(&["display-message", "-p", "one"]),
            words(&["display-message", "-p", "two"]),
        ])
        .await
        .unwrap();
    assert_eq!(
        answers,
        vec![vec!["one".to_string()], vec!["two".to_string()]]
    );
    let pane = server
        .tmux
        .spawn(&spec("after", "echo still-serving; exec sleep 60"))
        .await
        .unwrap();
    wait_for_text(&server.tmux, &pane, "still-serving").await;
    assert_eq!(
        server
            .tmux
            .panes()
            .await
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec![&pane]
    );
    assert!(!owned.exists(), "the line after the newline ran");
}

/// Resumes a stopped process when dropped, so a failing test does not leave it stopped.
struct Resume(rustix::process::Pid);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::CONT);
    }
}

#[tokio::test]
async fn a_command_tmux_never_answers_fails_without_quoting_the_token() {
    let server = Server::new();
    server
        .tmux
        .spawn(&spec("first", "exec sleep 60"))
        .await
        .unwrap();
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    // Connected, then the server wedges.
    let control = Control::new("tmux".into(), name.clone(), COMMAND_TIMEOUT);
    control
        .run(&[words(&["display-message", "-p", "connected"])])
        .await
        .unwrap();
    let out = std::process::Command::new("tmux")
        .args(["-L", &name, "display-message", "-p", "#{pid}"])
        .output()
        .unwrap();
    let pid = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = rustix::process::Pid::from_raw(pid).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let resume = Resume(pid);
    let mut secret = spec("second", "exec sleep 60");
    secret
        .env
        .insert("FLEET_TOKEN".into(), "fleet_do-not-show-me".into());
    // The command that carries the token, as a spawn sends it.
    let session = spawn_commands(&secret).unwrap().remove(2);
    assert!(session.iter().any(|w| w.contains("do-not-show-me")));
    let err = control.run(&[session]).await.unwrap_err().to_string();
    drop(resume);
    assert!(
        err.contains("new-session") && err.contains("did not answer"),
        "{err}"
    );
    assert!(!err.contains("do-not-show-me"), "{err}");
    assert!(!format!("{secret:?}").contains("do-not-show-me"));
}

/// How many sessions the window of `pane` on server `name` is linked into.
fn linked_sessions(name: &str, pane: &PaneId) -> String {
    let out = std::process::Command::new("tmux")
        .args(["-L", name, "display-message", "-p", "-t", &pane.0])
        .arg("#{window_linked_sessions_list}")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn a_watched_pane_tells_of_each_write_and_only_of_writes() {
    let server = Server::new();
    let pane = server.tmux.spawn(&spec("loud", "exec cat")).await.unwrap();
    let mut output = server.tmux.watch_output(&pane).await.unwrap();
    assert!(output.is_live());
    output.mark_seen();
    // Nothing written: nothing told.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), output.changed())
            .await
            .is_err()
    );
    server.tmux.type_text(&pane, "echoed").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), output.changed())
        .await
        .expect("cat's echo is told");
    wait_for_text(&server.tmux, &pane, "echoed").await;
    // A pane watched again after its watch ended is heard again, and a watch of another pane
    // hears nothing of this one.
    drop(output);
    let other = server.tmux.spawn(&spec("quiet", "exec cat")).await.unwrap();
    let mut quiet = server.tmux.watch_output(&other).await.unwrap();
    let mut again = server.tmux.watch_output(&pane).await.unwrap();
    quiet.mark_seen();
    again.mark_seen();
    server.tmux.type_text(&pane, "twice").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), again.changed())
        .await
        .expect("heard after a second watch");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), quiet.changed())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn closing_a_workers_own_session_by_hand_still_ends_its_program() {
    let server = Server::new();
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    let pane = server
        .tmux
        .spawn(&spec("doomed", "exec sleep 600"))
        .await
        .unwrap();
    let kept = server
        .tmux
        .spawn(&spec("kept", "exec sleep 600"))
        .await
        .unwrap();
    let pid = server.tmux.pid(&pane).await.unwrap();
    // Its window is linked into fleetd's own session too, which would keep it open.
    assert_eq!(linked_sessions(&name, &pane), "doomed,_fleetd");
    let out = std::process::Command::new("tmux")
        .args(["-L", &name, "kill-session", "-t", "doomed"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let listed = server.tmux.panes().await.unwrap();
    assert!(!listed.contains_key(&pane), "{listed:?}");
    assert!(listed.contains_key(&kept), "{listed:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "its program still runs");
        sleep(Duration::from_millis(20)).await;
    }
    // fleetd's own session and its other worker are untouched.
    assert_eq!(server.tmux.panes().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_pane_fleetd_did_not_open_is_linked_once_when_first_watched() {
    let server = Server::new();
    let Socket::Name(name) = server.tmux.socket().clone() else {
        panic!("a private server has a name");
    };
    // The server runs (fleetd's control session in it); a pane opened by a client process
    // stands for one an earlier fleetd opened.
    server.tmux.panes().await.unwrap();
    let client = Tmux::new(Socket::Name(name.clone()));
    let out = std::process::Command::new("tmux")
        .args(["-L", &name, "new-session", "-d", "-s", "older", "-P"])
        .args(["-F", "#{pane_id}", "cat"])
        .output()
        .unwrap();
    let pane = PaneId(String::from_utf8_lossy(&out.stdout).trim().to_string());
    assert_eq!(linked_sessions(&name, &pane), "older");
    let mut output = server.tmux.watch_output(&pane).await.unwrap();
    assert_eq!(linked_sessions(&name, &pane), "older,_fleetd");
    output.mark_seen();
    client.type_text(&pane, "seen").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), output.changed())
        .await
        .expect("an adopted pane is heard");
    drop(output);
    // A fleetd started afresh on the same server finds the link and adds none.
    let scratch = tempfile::tempdir().unwrap();
    let restarted = Tmux::private(name.clone(), scratch.path().join("paste"));
    let _watch = restarted.watch_output(&pane).await.unwrap();
    assert_eq!(linked_sessions(&name, &pane), "older,_fleetd");
}

/// Kills `name`'s servers (`name`, `name-2` …) when the test ends, pass or fail.
struct Servers(String);

impl Drop for Servers {
    fn drop(&mut self) {
        for index in 0..8 {
            let _ = std::process::Command::new("tmux")
                .args(["-L", &spread::server_name(&self.0, index), "kill-server"])
                .output();
        }
    }
}

/// The pid of tmux server `name`, if it runs.
fn server_pid(name: &str) -> Option<String> {
    let out = std::process::Command::new("tmux")
        .args(["-L", name, "display-message", "-p", "#{pid}"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panes_past_a_servers_count_go_to_the_next_server_and_a_restart_finds_them_all() {
    let scratch = tempfile::tempdir().unwrap();
    let name = format!("fleet-mux-spread-{}", uuid::Uuid::now_v7().simple());
    let _servers = Servers(name.clone());
    let host = Spread::open(name.clone(), scratch.path().join("paste"), 2).await;
    let mut panes = Vec::new();
    for i in 0..5 {
        let pane = host
            .spawn(&spec(&format!("w{i}"), &format!("echo I AM {i}; exec cat")))
            .await
            .unwrap();
        panes.push(pane);
    }
    // Two a server, in order: server 1's panes keep tmux's ids, the others' name their server.
    let servers: Vec<usize> = panes
        .iter()
        .map(|pane| spread::inner_id(pane).unwrap().0)
        .collect();
    assert_eq!(servers, [0, 0, 1, 1, 2], "{panes:?}");
    assert!(panes[4].0.starts_with("3:%"), "{}", panes[4]);
    for index in 0..3 {
        assert!(server_pid(&spread::server_name(&name, index)).is_some());
    }
    assert_eq!(server_pid(&spread::server_name(&name, 3)), None);
    for (i, pane) in panes.iter().enumerate() {
        wait_for_text(&host, pane, &format!("I AM {i}")).await;
    }
    host.paste(&panes[4], "typed into server 3").await.unwrap();
    host.enter(&panes[4]).await.unwrap();
    wait_for_text(&host, &panes[4], "typed into server 3\ntyped into server 3").await;

    // A gateway that restarts finds every server of the previous run, and each pane by its id,
    // past a server gone meanwhile; a server of the same name that is not fleetd's is left be.
    drop(host);
    let killed = std::process::Command::new("tmux")
        .args(["-L", &spread::server_name(&name, 1), "kill-server"])
        .status()
        .unwrap();
    assert!(killed.success());
    let foreign = spread::server_name(&name, 4);
    let started = std::process::Command::new("tmux")
        .args(["-f", "/dev/null", "-L", &foreign])
        .args(["new-session", "-d", "-s", "theirs", "sleep 600"])
        .status()
        .unwrap();
    assert!(started.success());
    let again = Spread::open(name.clone(), scratch.path().join("paste"), 2).await;
    let listed = again.panes().await.unwrap();
    let mut left = vec![panes[0].clone(), panes[1].clone(), panes[4].clone()];
    left.sort();
    assert_eq!(listed.keys().cloned().collect::<Vec<_>>(), left);
    wait_for_text(&again, &panes[4], "I AM 4").await;
    assert!(matches!(
        again.snapshot(&panes[2]).await,
        Err(MuxError::NoPane(pane)) if pane == panes[2]
    ));
    assert!(matches!(
        again.snapshot(&PaneId("5:%0".into())).await,
        Err(MuxError::NoPane(_))
    ));
    // Server 1 has room again once one of its panes closes; a new one goes there, not on a
    // fourth server.
    again.close(&panes[0]).await.unwrap();
    let refill = again.spawn(&spec("refill", "exec cat")).await.unwrap();
    assert_eq!(spread::inner_id(&refill).unwrap().0, 0, "{refill}");
    // An id no server gave is no pane.
    assert!(matches!(
        again.snapshot(&PaneId("9:%1".into())).await,
        Err(MuxError::NoPane(pane)) if pane.0 == "9:%1"
    ));
    assert!(matches!(
        again.snapshot(&PaneId("3:%999".into())).await,
        Err(MuxError::NoPane(pane)) if pane.0 == "3:%999"
    ));

    again.kill_servers().await.unwrap();
    for index in 0..3 {
        assert_eq!(server_pid(&spread::server_name(&name, index)), None);
    }
    assert!(server_pid(&foreign).is_some(), "not fleetd's to stop");
}
