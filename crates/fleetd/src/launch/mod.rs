//! Launchers: how a profile becomes the argv, environment and files of a worker's pane.
//!
//! Every launch starts from the profile's program and environment plus fleetd's own
//! `FLEET_*` variables; the launcher of the agent's kind ([`PeerLauncher`]) adds what that
//! agent needs (its MCP config, model endpoint, reply charter); a sandbox profile's runtime
//! template is then wrapped around the result. Files a launch writes live in the worker's own
//! directory (`<state>/workers/<gid>`, user-only), removed when the session ends; a sandbox's
//! teardown is kept apart (`<state>/teardowns/<gid>.json`), out of the sandbox's reach, so a
//! restart after a crash can still run it and the agent inside cannot rewrite it.

mod bwrap;
mod claude;
mod opencode;
mod sandbox;
mod trust;
mod workspace;

pub use workspace::Workspaces;

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_core::redact::{EnvNames, MASK, ProgramOnly};
use fleet_core::{Gid, Role};

use crate::config::{ProfileConfig, ProfileKind};

/// The variable every worker's program is started with set to its gid (a restart knows by
/// it the workers of a build that recorded nothing else of them).
pub const GID_VAR: &str = "FLEET_GID";

/// How long a sandbox's teardown may run.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Where the teardowns of the workers that have one are kept, each `<gid>.json`: under the state
/// dir, never in a worker's own directory, which its sandbox binds read-write (a teardown
/// read from there would run, on the host, whatever the agent wrote).
const TEARDOWNS: &str = "teardowns";
/// The file in which an older build kept a worker's teardown, inside the worker's directory:
/// never run, as the worker could have written it.
const OLD_TEARDOWN_FILE: &str = "teardown.json";

/// What every agent is told of its part and of answering (appended to its system prompt or
/// instructions): a worker's charter, or an advisory architect's.
pub fn charter(worker: &Worker) -> String {
    let name = &worker.name;
    match worker.role {
        Role::Architect => format!(
            "You are '{name}', an advisory architect in a fleet run by fleetd. The message typed \
             to you is a brief from the lead consulting you; another architect, on another model, \
             gets the same brief and answers on its own. Assess it and recommend: you are an \
             adviser, so do not modify the repository or run anything that changes it unless the \
             brief asks you to. When your assessment is done, call the fleet_reply tool with it: \
             only what you pass to fleet_reply reaches the lead, never what you only write on \
             screen. If you need a clarification from the lead, call fleet_ask with your \
             question; it returns the lead's answer, or says nobody is waiting, in which case \
             decide yourself and say so. Anything the lead sends you later is not typed to you: \
             fleetd types a line saying how many messages wait, and you read them with \
             fleet_poll (leave out from) and answer each with fleet_reply (in_reply_to: its \
             msg_id). You may \
             message only that lead; you may not spawn, stop or broadcast."
        ),
        Role::Lead | Role::Worker => format!(
            "You are '{name}', a worker in a fleet run by fleetd. Every message typed to you is a \
             task from your lead. When a task is done, call the fleet_reply tool with your \
             answer: only what you pass to fleet_reply reaches the lead, never what you only \
             write on screen. If you need a decision from the lead in the middle of a task, call \
             fleet_ask with your question; it returns the lead's answer, or says nobody is \
             waiting, in which case decide yourself and say so in your reply."
        ),
    }
}

/// The worker a launch is for. Its `Debug` masks the token.
#[derive(Clone)]
pub struct Worker {
    /// Its gid.
    pub gid: Gid,
    /// Its name.
    pub name: String,
    /// Its role: a worker or an advisory architect (each has its charter).
    pub role: Role,
    /// This gateway's host id.
    pub host: String,
    /// Its bearer token.
    pub token: String,
    /// The MCP URL it reaches fleetd at (the advertised one).
    pub mcp_url: String,
    /// Its working directory.
    pub cwd: PathBuf,
    /// Its private directory for the files of its launch.
    pub dir: PathBuf,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("gid", &self.gid)
            .field("name", &self.name)
            .field("role", &self.role)
            .field("host", &self.host)
            .field("token", &format_args!("{MASK}"))
            .field("mcp_url", &self.mcp_url)
            .field("cwd", &self.cwd)
            .field("dir", &self.dir)
            .finish()
    }
}

/// What goes into the pane. Its `Debug` shows the programs and the environment's names only:
/// the values hold the token, and so may a sandbox's arguments (`{token}`).
#[derive(Clone, PartialEq, Eq)]
pub struct Launch {
    /// The argv.
    pub argv: Vec<String>,
    /// The environment (on top of the pane host's).
    pub env: BTreeMap<String, String>,
    /// An argv to run when the pane goes.
    pub teardown: Option<Vec<String>>,
}

impl fmt::Debug for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("argv", &ProgramOnly(&self.argv))
            .field("env", &EnvNames(&self.env))
            .field("teardown", &self.teardown.as_deref().map(ProgramOnly))
            .finish()
    }
}

/// One way of launching: adds to a launch what its kind of agent needs.
pub trait PeerLauncher: Send + Sync {
    /// Turns `launch` (the program, its environment) into the launch of `profile`'s agent for
    /// `worker`, writing any files it needs into `worker.dir`.
    fn prepare(
        &self,
        profile: &ProfileConfig,
        worker: &Worker,
        launch: Launch,
    ) -> std::io::Result<Launch>;
}

/// A launcher that runs the argv as it is.
struct CommandLauncher;

impl PeerLauncher for CommandLauncher {
    fn prepare(&self, _: &ProfileConfig, _: &Worker, launch: Launch) -> std::io::Result<Launch> {
        Ok(launch)
    }
}

/// What the launchers take from this host, read once at start.
#[derive(Clone, Default)]
pub struct HostFacts {
    /// The user's home: its `.claude.json` gets a worker's directory trusted; `{home}` of a
    /// sandbox template.
    pub user_home: Option<PathBuf>,
    /// `CLAUDE_CONFIG_DIR` in fleetd's environment: where Claude Code then keeps its
    /// `.claude.json` instead of the home.
    pub claude_config_dir: Option<PathBuf>,
    /// `gateway.workdir_roots`, resolved (empty: none): no directory outside them is marked
    /// trusted, whatever a launch is asked for.
    pub workdir_roots: Vec<PathBuf>,
    /// The model credentials in fleetd's own environment (by name: Claude Code's, of which
    /// opencode's Anthropic provider takes `ANTHROPIC_API_KEY`), handed to a worker in an
    /// isolated home whose profile sets none: a pane host need not pass fleetd's environment on
    /// (herdr's panes get herdr's).
    pub credentials: BTreeMap<String, String>,
}

/// The launchers by kind, the workers' directories, and their workspaces.
pub struct Launchers {
    /// `<state>/workers`.
    root: PathBuf,
    /// `<state>/teardowns`.
    teardowns: PathBuf,
    /// The workspaces of workers whose profile makes one.
    pub workspaces: Workspaces,
    command: CommandLauncher,
    claude: claude::ClaudeLauncher,
    opencode: opencode::OpencodeLauncher,
    sandbox: sandbox::SandboxLauncher,
}

impl Launchers {
    /// The launchers of the gateway with state dir `state_dir`, keeping workers' files in its
    /// `workers`, on a host with `facts`.
    pub fn new(state_dir: &Path, facts: HostFacts) -> Self {
        Self {
            root: state_dir.join("workers"),
            teardowns: state_dir.join(TEARDOWNS),
            workspaces: Workspaces::new(state_dir),
            command: CommandLauncher,
            sandbox: sandbox::SandboxLauncher {
                state_dir: state_dir.to_path_buf(),
                home: facts.user_home.clone(),
            },
            opencode: opencode::OpencodeLauncher::new(&facts),
            claude: claude::ClaudeLauncher::new(facts),
        }
    }

    /// The private directory of worker `gid`.
    pub fn dir_of(&self, gid: Gid) -> PathBuf {
        self.root.join(gid.to_string())
    }

    /// The file keeping worker `gid`'s teardown.
    fn teardown_of(&self, gid: Gid) -> PathBuf {
        self.teardowns.join(format!("{gid}.json"))
    }

    fn agent_launcher(&self, kind: ProfileKind) -> &dyn PeerLauncher {
        match kind {
            ProfileKind::Command | ProfileKind::Sandbox => &self.command,
            ProfileKind::ClaudeCode => &self.claude,
            ProfileKind::Opencode => &self.opencode,
        }
    }

    /// Prepares the launch of `profile` for `worker` (whose `dir` is made here, anew).
    pub fn prepare(&self, profile: &ProfileConfig, worker: &Worker) -> std::io::Result<Launch> {
        private_dir(&self.root)?;
        fresh_dir(&worker.dir)?;
        let mut env = profile.env.0.clone();
        env.insert("FLEET_MCP_URL".into(), worker.mcp_url.clone());
        env.insert("FLEET_TOKEN".into(), worker.token.clone());
        env.insert(GID_VAR.into(), worker.gid.to_string());
        env.insert("FLEET_NAME".into(), worker.name.clone());
        env.insert("FLEET_HOST".into(), worker.host.clone());
        let launch = Launch {
            argv: profile.program(),
            env,
            teardown: None,
        };
        let mut launch = self
            .agent_launcher(profile.agent_kind())
            .prepare(profile, worker, launch)?;
        if profile.kind == ProfileKind::Sandbox {
            launch = self.sandbox.prepare(profile, worker, launch)?;
        }
        if let Some(teardown) = &launch.teardown {
            private_dir(&self.teardowns)?;
            private_file(
                &self.teardown_of(worker.gid),
                serde_json::to_string(teardown)?.as_bytes(),
            )?;
        }
        Ok(launch)
    }

    /// After a worker's pane went: runs its teardown (if any) and removes its files. A teardown
    /// that fails is kept, and tried again at the next call (the session's later clearings, or
    /// the next start).
    pub async fn finish(&self, gid: Gid) {
        finish_worker(&self.teardown_of(gid), &self.dir_of(gid), false).await;
    }

    /// At start-up: finishes what a previous run left (its workers' teardowns, their files),
    /// but for the workers in `kept` (taken back: they still run).
    pub async fn finish_leftovers(&self, kept: &[Gid]) {
        let named = |entry: fs::DirEntry, suffix: &str| -> Option<Gid> {
            let name = entry.file_name();
            let gid = name.to_str()?.strip_suffix(suffix)?.parse().ok();
            if gid.is_none() {
                tracing::warn!(file = %entry.path().display(), "not a worker's: left alone");
            }
            gid
        };
        let mut left: Vec<Gid> = [(&self.root, ""), (&self.teardowns, ".json")]
            .into_iter()
            .flat_map(|(dir, suffix)| {
                fs::read_dir(dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(move |entry| named(entry, suffix))
            })
            .filter(|gid| !kept.contains(gid))
            .collect();
        left.sort();
        left.dedup();
        for gid in left {
            tracing::info!(%gid, "finishing a previous run's worker");
            // Its last try: a teardown that fails now is dropped (and said so).
            finish_worker(&self.teardown_of(gid), &self.dir_of(gid), true).await;
        }
    }
}

/// Runs the teardown kept in `teardown` and lets go of that file once it ran (or, on the
/// `last_try`, whatever came of it), then removes the worker's directory `dir`.
async fn finish_worker(teardown: &Path, dir: &Path, last_try: bool) {
    if let Ok(text) = fs::read_to_string(teardown) {
        let done = match serde_json::from_str::<Vec<String>>(&text) {
            Ok(argv) => run_teardown(&argv).await,
            Err(e) => {
                tracing::warn!(file = %teardown.display(), error = %e, "unreadable teardown");
                true
            }
        };
        if !done && last_try {
            tracing::warn!(file = %teardown.display(), "giving up on a sandbox's teardown: tear it down by hand if it still runs");
        }
        if (done || last_try)
            && let Err(e) = fs::remove_file(teardown)
        {
            tracing::warn!(file = %teardown.display(), error = %e, "cannot remove a teardown");
        }
    }
    if dir.join(OLD_TEARDOWN_FILE).exists() {
        tracing::warn!(dir = %dir.display(), "not running a teardown.json in a worker's own directory: its sandbox can write there (an older build kept teardowns there; check by hand that no sandbox of it still runs)");
    }
    // The environment handed to a container (its token, its key) goes first, in case the rest
    // cannot (files a container's root made).
    let _ = fs::remove_file(dir.join(sandbox::ENV_FILE));
    if let Err(e) = fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a worker's files");
    }
}

/// Runs a teardown; whether it ran to success.
async fn run_teardown(argv: &[String]) -> bool {
    let Some((program, args)) = argv.split_first() else {
        return true;
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // The program only: `{token}` may be among the arguments.
    let argv = ProgramOnly(argv);
    match tokio::time::timeout(TEARDOWN_TIMEOUT, command.output()).await {
        Ok(Ok(output)) if output.status.success() => {
            tracing::info!(?argv, "ran a sandbox's teardown");
            return true;
        }
        Ok(Ok(output)) => tracing::warn!(
            ?argv,
            status = %output.status,
            stderr = %String::from_utf8_lossy(&output.stderr).trim(),
            "a sandbox's teardown failed"
        ),
        Ok(Err(e)) => tracing::warn!(?argv, error = %e, "cannot run a sandbox's teardown"),
        Err(_) => tracing::warn!(?argv, "a sandbox's teardown timed out"),
    }
    false
}

/// How long a fresh session's launch waits for an earlier session's program to stop writing
/// into its directory: a pane closed (a recycle) ends its program, which may still be writing
/// its settings there as it exits.
const ENDING_WRITES_WAIT: Duration = Duration::from_secs(2);

/// The longest pause between two tries at clearing a directory still written into.
const CLEAR_PAUSE_MAX: Duration = Duration::from_millis(100);

/// Whether a directory whose removal failed with `kind`, `waited` into the clearing, is tried
/// again: only one that something still writes into (entries came back), for a while.
fn clear_again(kind: std::io::ErrorKind, waited: Duration) -> bool {
    kind == std::io::ErrorKind::DirectoryNotEmpty && waited < ENDING_WRITES_WAIT
}

/// Makes `dir` anew, empty and user-only: what an earlier session of the worker left there
/// (which its sandbox could write, links included) is removed first, or the launch is refused;
/// nothing fleetd writes there then goes through a file the worker made. An earlier session
/// still ending (its program writing as it exits) is waited for, at most [`ENDING_WRITES_WAIT`].
fn fresh_dir(dir: &Path) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match fs::remove_dir_all(dir) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) if clear_again(e.kind(), started.elapsed()) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(CLEAR_PAUSE_MAX);
            }
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "cannot clear what an earlier session left in {}: {e}",
                    dir.display()
                )));
            }
        }
    }
    fs::DirBuilder::new().mode(0o700).create(dir)
}

/// `word` with each `{placeholder}` that `value` knows replaced by its value; anything else,
/// unknown placeholders and lone braces included, kept as it is. No shell ever reads the
/// result: each word stays one argument.
pub fn fill_template(word: &str, value: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after
            .find('}')
            .and_then(|close| value(&after[..close]).map(|v| (close, v)))
        {
            Some((close, filled)) => {
                out.push_str(&filled);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Where `program` is on this host: itself when it names a path (relative to `cwd`, where a
/// pane starts), else the first executable file of that name in `path` (a `PATH` value).
pub fn locate_program(
    program: &str,
    path: Option<&std::ffi::OsStr>,
    cwd: &Path,
) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        fs::metadata(p).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.is_empty() {
        return None;
    }
    if program.contains('/') {
        let named = cwd.join(program);
        return executable(&named).then_some(named);
    }
    std::env::split_paths(path?)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
}

fn private_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `bytes` to a new file at `path` readable by the user only.
fn private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_directory_still_written_into_is_cleared_again_and_only_for_a_while() {
        use std::io::ErrorKind;
        assert!(clear_again(ErrorKind::DirectoryNotEmpty, Duration::ZERO));
        assert!(clear_again(
            ErrorKind::DirectoryNotEmpty,
            ENDING_WRITES_WAIT - Duration::from_millis(1)
        ));
        assert!(!clear_again(
            ErrorKind::DirectoryNotEmpty,
            ENDING_WRITES_WAIT
        ));
        assert!(!clear_again(ErrorKind::PermissionDenied, Duration::ZERO));
        assert!(!clear_again(ErrorKind::Other, Duration::ZERO));
    }

    #[test]
    fn a_directory_an_ending_program_still_writes_into_is_made_anew_once_it_stops() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("worker");
        fs::create_dir(&dir).unwrap();
        let written = dir.clone();
        let (begun, writing) = std::sync::mpsc::channel();
        // An ending program writing its files as fast as it can for a fifth of a second.
        let writer = std::thread::spawn(move || {
            let until = std::time::Instant::now() + Duration::from_millis(200);
            let mut n = 0u64;
            while std::time::Instant::now() < until {
                let _ = fs::write(written.join(format!("settings-{n}")), b"{}");
                n += 1;
                if n == 100 {
                    begun.send(()).unwrap();
                }
            }
        });
        writing.recv().unwrap();
        let cleared = fresh_dir(&dir);
        writer.join().unwrap();
        cleared.unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn programs_are_found_as_the_shell_finds_them() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("agent");
        fs::write(&program, "#!/bin/sh\n").unwrap();
        let path = Some(dir.path().as_os_str());
        let cwd = Path::new("/");
        assert_eq!(
            locate_program("agent", path, cwd),
            None,
            "not executable yet"
        );
        fs::set_permissions(&program, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(locate_program("agent", path, cwd), Some(program.clone()));
        assert_eq!(
            locate_program("./agent", None, dir.path()),
            Some(dir.path().join("./agent"))
        );
        assert_eq!(locate_program("nope", path, cwd), None);
        assert_eq!(locate_program("agent", None, cwd), None);
        assert_eq!(locate_program("/no/such/agent", path, cwd), None);
        assert_eq!(locate_program("", path, cwd), None);
    }

    pub(super) fn worker(dir: &Path) -> Worker {
        Worker {
            gid: Gid::mint(),
            name: "w1".into(),
            role: Role::Worker,
            host: "testhost".into(),
            token: "secret-token".into(),
            mcp_url: "http://127.0.0.1:9/mcp".into(),
            cwd: dir.to_path_buf(),
            dir: dir.join("w1"),
        }
    }

    #[tokio::test]
    async fn a_teardown_runs_from_fleetds_own_place_never_from_the_workers_directory() {
        let dir = tempfile::tempdir().unwrap();
        let launchers = Launchers::new(dir.path(), HostFacts::default());
        let ran = dir.path().join("torn-down");
        let planted = dir.path().join("planted-ran");
        let mut profile = ProfileConfig::command("box", Vec::new());
        profile.kind = ProfileKind::Sandbox;
        profile.runtime = vec!["env".into()];
        profile.agent = vec!["/bin/sh".into()];
        profile.teardown = vec!["touch".into(), ran.display().to_string()];
        let gid = Gid::mint();
        let w = Worker {
            gid,
            dir: launchers.dir_of(gid),
            ..worker(dir.path())
        };
        launchers.prepare(&profile, &w).unwrap();
        // What the agent inside may write: its own directory, bound read-write.
        fs::write(
            w.dir.join(OLD_TEARDOWN_FILE),
            serde_json::to_string(&["touch", &planted.display().to_string()]).unwrap(),
        )
        .unwrap();
        launchers.finish(w.gid).await;
        assert!(ran.exists(), "the profile's teardown did not run");
        assert!(
            !planted.exists(),
            "a teardown the worker wrote ran on the host"
        );
        assert!(!w.dir.exists() && !launchers.teardown_of(w.gid).exists());
        // A start after a crash finds it as well, and runs it once.
        fs::remove_file(&ran).unwrap();
        launchers.prepare(&profile, &w).unwrap();
        launchers.finish_leftovers(&[]).await;
        assert!(ran.exists(), "a leftover teardown did not run");
        fs::remove_file(&ran).unwrap();
        launchers.finish_leftovers(&[]).await;
        assert!(!ran.exists(), "a teardown ran twice");
        // One taken back is left alone.
        launchers.prepare(&profile, &w).unwrap();
        launchers.finish_leftovers(&[w.gid]).await;
        assert!(!ran.exists() && w.dir.exists());
        // A new session starts from an empty directory: nothing the last one left (a link into
        // the user's files, say) is written through.
        let users = dir.path().join("users-file");
        fs::write(&users, "the user's").unwrap();
        std::os::unix::fs::symlink(&users, w.dir.join("planted")).unwrap();
        launchers.prepare(&profile, &w).unwrap();
        assert!(!w.dir.join("planted").exists());
        assert_eq!(fs::read_to_string(&users).unwrap(), "the user's");
        // A teardown that fails is tried again, and given up only at a start.
        launchers.finish(w.gid).await;
        let mut failing = profile.clone();
        failing.teardown = vec!["false".into()];
        launchers.prepare(&failing, &w).unwrap();
        launchers.finish(w.gid).await;
        assert!(
            launchers.teardown_of(w.gid).exists(),
            "dropped after one failure"
        );
        launchers.finish_leftovers(&[]).await;
        assert!(!launchers.teardown_of(w.gid).exists(), "kept past a start");
    }

    #[test]
    fn a_command_runs_as_given_with_fleet_variables() {
        let dir = tempfile::tempdir().unwrap();
        let launchers = Launchers::new(dir.path(), HostFacts::default());
        let profile = ProfileConfig::command("p", vec!["prog".into(), "--x".into()]);
        let w = worker(dir.path());
        let launch = launchers.prepare(&profile, &w).unwrap();
        assert_eq!(launch.argv, ["prog", "--x"]);
        assert_eq!(launch.env["FLEET_TOKEN"], "secret-token");
        assert_eq!(launch.env["FLEET_NAME"], "w1");
        assert_eq!(launch.teardown, None);
        let mode = fs::metadata(&w.dir).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
    }
}
