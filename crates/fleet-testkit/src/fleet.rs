//! A real `fleetd serve` process for a test: a temp state dir, a loopback socket the test binds
//! (on a port the kernel picks) and fleetd inherits (`--listen-fd`), a private tmux server, and
//! its log kept for when a test fails. Dropping it kills the process and the tmux server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use fleet_mux::tmux::spread;
use tokio::process::{Child, Command};

use crate::bins::binary;
use crate::client::{Client, Protocol};
use crate::inherit::inherit;
use crate::wait::until;

/// How long fleetd may take to answer `/healthz` after it starts.
const START_LIMIT: Duration = Duration::from_secs(20);

/// How fleetd's store notes that a task's keys went to its pane (the `reason` of an
/// `injecting` message: see `fleet_store::Store::keys_sent`).
const KEYS_SENT: &str = "keys sent";
/// ... and that its Enter went (`fleet_store::Store::enter_sent`).
const ENTER_SENT: &str = "enter sent";

/// How far fleetd got typing a task when it died ([`Fleet::as_if_killed_while_typing`]).
#[derive(Clone, Copy, Debug)]
pub enum Keys {
    /// No key went in.
    None,
    /// Its keys went in, not its Enter.
    Pasted,
    /// Its Enter went in too.
    Entered,
}

/// A running fleetd.
pub struct Fleet {
    /// Holds the state dir and config; removed on drop.
    dir: tempfile::TempDir,
    /// The config file.
    config: PathBuf,
    /// The state dir.
    state: PathBuf,
    /// The socket fleetd serves on, bound here and held for the Fleet's life: every start
    /// inherits it, so no other process can take the port before fleetd or between restarts.
    listener: TcpListener,
    /// Its port.
    port: u16,
    /// The private tmux server's socket name.
    socket: String,
    /// The fleetd process, while running.
    child: Option<Child>,
    /// How many times it was started (each start logs to its own file).
    starts: usize,
    /// Variables set (`Some`) or removed (`None`) in its environment, over the test's own.
    env: Vec<(String, Option<String>)>,
    /// The command fleetd is started under (its words, fleetd's command line after them), as
    /// `ip netns exec NAME`; empty: fleetd is started itself.
    wrapper: Vec<String>,
}

/// A gate for the scripted agent's `/gate` task: a task that waits there until it is opened.
pub struct Gate(PathBuf);

impl Gate {
    /// The task `/gate PATH text`: answered `echo: text` once the gate is open.
    pub fn task(&self, text: &str) -> String {
        format!("/gate {} {text}", self.0.display())
    }

    /// Opens it: the tasks waiting there go on.
    pub fn open(&self) -> anyhow::Result<()> {
        std::fs::write(&self.0, "")?;
        Ok(())
    }
}

/// A `[[profiles]]` block running the scripted agent with `args`.
pub fn sim_profile(name: &str, args: &[&str]) -> anyhow::Result<String> {
    let sim = binary("fleet-agent-sim")?;
    let mut argv = vec![format!("{:?}", sim.display().to_string())];
    argv.extend(args.iter().map(|a| format!("{a:?}")));
    Ok(format!(
        "[[profiles]]\nname = \"{name}\"\nkind = \"command\"\nargv = [{}]\nready_timeout_s = 20\n",
        argv.join(", ")
    ))
}

/// The real Claude Code binary the tests drive: `FLEET_TEST_CLAUDE` (set by `./test.sh`, which
/// installs the pinned version from npm), else `claude` on `PATH`.
pub fn claude_binary() -> String {
    std::env::var("FLEET_TEST_CLAUDE").unwrap_or_else(|_| "claude".into())
}

/// The working directory of the tests' real agents: a directory of its own under the temp dir
/// (the temp dir itself holds the test fleets' state dirs, where no worker may work).
pub fn agent_workdir() -> String {
    let dir = std::env::temp_dir().join("fleet-test-agents");
    // Made here so a profile can name it; a failure shows as the spawn's own error.
    let _ = std::fs::create_dir_all(&dir);
    dir.display().to_string()
}

/// The API key the real agents are given: the scripted model takes any.
pub const TEST_API_KEY: &str = "sk-ant-fleet-test-0123456789abcdefghij";

/// A `[[profiles]]` block for a real Claude Code worker in an isolated home, its model the
/// scripted one at `base_url` (see [`crate::model`]).
pub fn claude_profile(name: &str, base_url: &str) -> String {
    format!(
        "[[profiles]]\nname = \"{name}\"\nkind = \"claude-code\"\nargv = [{:?}]\nbase_url = \"{base_url}\"\nisolated_home = true\ncwd = {:?}\nenv = {{ ANTHROPIC_API_KEY = \"{TEST_API_KEY}\" }}\nready_timeout_s = 90\n",
        claude_binary(),
        agent_workdir()
    )
}

/// The real opencode binary the tests drive: `FLEET_TEST_OPENCODE` (set by `./test.sh`, which
/// installs the pinned version from npm), else `opencode` on `PATH`.
pub fn opencode_binary() -> String {
    std::env::var("FLEET_TEST_OPENCODE").unwrap_or_else(|_| "opencode".into())
}

/// A `[[profiles]]` block for a real opencode worker in an isolated home, its model the
/// scripted one at `base_url` (see [`crate::model`]).
pub fn opencode_profile(name: &str, base_url: &str) -> String {
    format!(
        "[[profiles]]\nname = \"{name}\"\nkind = \"opencode\"\nargv = [{:?}]\nbase_url = \"{base_url}\"\nmodel = \"anthropic/claude-sonnet-4-5\"\nisolated_home = true\ncwd = {:?}\nenv = {{ ANTHROPIC_API_KEY = \"{TEST_API_KEY}\" }}\nready_timeout_s = 90\n",
        opencode_binary(),
        agent_workdir()
    )
}

/// A `[[profiles]]` block for a sandboxed scripted agent: bubblewrap with a private /tmp and
/// pid namespace, the work dir `workdir` bound in, `FLEET_SANDBOX=<worker name>` set inside;
/// its teardown appends the worker's name to `teardown.log` in the work dir.
pub fn bwrap_profile(name: &str, workdir: &Path) -> anyhow::Result<String> {
    bwrap_profile_of(name, workdir, &binary("fleet-agent-sim")?, true)
}

/// A sandbox `[[profiles]]` block running the agent at `agent` under the bubblewrap recipe of
/// docs/workers.md: the host's files read-only, a fresh `/tmp`, the user's home and fleetd's state dir
/// hidden, the worker's own files, its working directory and (with `bind_agent`) the agent's
/// program bound back in.
pub fn bwrap_profile_of(
    name: &str,
    workdir: &Path,
    agent: &Path,
    bind_agent: bool,
) -> anyhow::Result<String> {
    Ok(format!(
        r#"[[profiles]]
name = "{name}"
kind = "sandbox"
cwd = {workdir:?}
runtime = {runtime}
agent = [{agent:?}]
teardown = ["sh", "-c", "echo {{name}} >> \"$1\"/teardown.log", "sh", "{{workdir}}"]
ready_timeout_s = 20
"#,
        runtime = bwrap_runtime(bind_agent),
        workdir = workdir.display().to_string(),
        agent = agent.display().to_string(),
    ))
}

/// The bubblewrap recipe of docs/workers.md as a TOML array, `FLEET_SANDBOX=<worker name>` set inside,
/// with (`bind_agent`) or without the agent's program bound back in.
fn bwrap_runtime(bind_agent: bool) -> String {
    let bind = if bind_agent {
        r#""--ro-bind", "{agent}", "{agent}","#
    } else {
        ""
    };
    format!(
        r#"["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
           "--tmpfs", "{{home}}", "--tmpfs", "{{state_dir}}", "--bind", "{{worker_dir}}", "{{worker_dir}}",
           {bind} "--bind", "{{workdir}}", "{{workdir}}", "--chdir", "{{workdir}}", "--unshare-pid",
           "--die-with-parent", "--setenv", "FLEET_SANDBOX", "{{name}}", "--"]"#
    )
}

/// A sandbox `[[profiles]]` block running a real agent (`agent_kind` `claude-code` or
/// `opencode`, its program `agent`) under the bubblewrap recipe of docs/workers.md, in a home of its own
/// with the test key, on the scripted model at `base_url`, working in `workdir`, started in the
/// mode fleetd gives a sandbox.
pub fn bwrap_agent_profile(
    name: &str,
    agent_kind: &str,
    agent: &str,
    workdir: &Path,
    base_url: &str,
) -> String {
    let model = match agent_kind {
        "opencode" => "model = \"anthropic/claude-sonnet-4-5\"\n",
        _ => "",
    };
    format!(
        r#"[[profiles]]
name = "{name}"
kind = "sandbox"
agent_kind = "{agent_kind}"
cwd = {workdir:?}
runtime = {runtime}
agent = [{agent:?}]
base_url = "{base_url}"
{model}isolated_home = true
env = {{ ANTHROPIC_API_KEY = "{TEST_API_KEY}" }}
ready_timeout_s = 90
"#,
        runtime = bwrap_runtime(true),
        workdir = workdir.display().to_string(),
    )
}

/// A `[[profiles]]` block for a worker that writes its bearer token to `file` and then only
/// sits there (ready by its screen marker): lets a test act as that worker's MCP client.
pub fn token_spy_profile(name: &str, file: &Path) -> String {
    format!(
        "[[profiles]]\nname = \"{name}\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"printf %s \\\"$FLEET_TOKEN\\\" > '{}'; echo SPY-READY; exec sleep 600\"]\nready_marker = \"SPY-READY\"\nready_timeout_s = 20\n",
        file.display()
    )
}

/// Whether fleetd logs as shipped (see [`Fleet::log_as_shipped`]).
static AS_SHIPPED: AtomicBool = AtomicBool::new(false);

/// An environment change as [`Fleet::start_with_env`] takes it, owned.
fn owned(env: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
    env.iter()
        .map(|(key, value)| (key.to_string(), value.map(String::from)))
        .collect()
}

impl Fleet {
    /// Starts fleetd with `[gateway]` lines `gateway` and the rest of the config `rest`.
    pub async fn start(gateway: &str, rest: &str) -> anyhow::Result<Self> {
        Self::start_under(&std::env::temp_dir(), gateway, rest).await
    }

    /// [`Fleet::start`], with its config, state dir and logs in a new directory under `parent`
    /// (a test that needs the state dir outside `/tmp`, say).
    pub async fn start_under(parent: &Path, gateway: &str, rest: &str) -> anyhow::Result<Self> {
        Self::start_with_env(parent, gateway, rest, &[]).await
    }

    /// From now on, fleetd is started logging as it does when shipped (its own default level)
    /// rather than with the tests' debug lines: what a benchmark measures is fleetd as users
    /// run it. A fleet's own environment still says otherwise where it sets `RUST_LOG`.
    pub fn log_as_shipped() {
        AS_SHIPPED.store(true, Ordering::Relaxed);
    }

    /// [`Fleet::start_under`], with fleetd's environment (and so its tmux server's and its
    /// workers') changed by `env`: each variable set to `Some` value or removed (`None`). A test
    /// of the user's own settings gives fleetd a `HOME` of its own this way.
    pub async fn start_with_env(
        parent: &Path,
        gateway: &str,
        rest: &str,
        env: &[(&str, Option<&str>)],
    ) -> anyhow::Result<Self> {
        let socket = format!("fleet-test-{}", uuid::Uuid::now_v7().simple());
        let dir = tempfile::tempdir_in(parent)?;
        let env = owned(env);
        Self::start_with(
            dir,
            &format!("socket = \"{socket}\""),
            socket,
            gateway,
            rest,
            env,
            None,
        )
        .await
    }

    /// Starts the gateway of test host `host` (its `host_id`, and its key the test key of that
    /// name: [`crate::keys`]), with more `[gateway]` lines `gateway` and the rest of the config
    /// `rest`.
    pub async fn start_as(host: &str, gateway: &str, rest: &str) -> anyhow::Result<Self> {
        Self::start_as_wrapped(host, gateway, rest, &[]).await
    }

    /// Starts fleetd on the herdr server at `herdr_socket` (the tmux private server name is
    /// then unused, but still cleaned up).
    pub async fn start_herdr(herdr_socket: &Path, rest: &str) -> anyhow::Result<Self> {
        Self::start_herdr_with_env(herdr_socket, rest, &[]).await
    }

    /// [`Fleet::start_herdr`], with fleetd's environment changed by `env` (as
    /// [`Fleet::start_with_env`] does).
    pub async fn start_herdr_with_env(
        herdr_socket: &Path,
        rest: &str,
        env: &[(&str, Option<&str>)],
    ) -> anyhow::Result<Self> {
        let env = owned(env);
        let mux = format!(
            "kind = \"herdr\"\nsocket = \"{}\"\nworkspace = \"fleet-test\"",
            herdr_socket.display()
        );
        Self::start_with(
            tempfile::tempdir()?,
            &mux,
            format!("fleet-test-{}", uuid::Uuid::now_v7().simple()),
            "",
            rest,
            env,
            None,
        )
        .await
    }

    /// [`Fleet::start_as`], with fleetd started under the command `wrapper` (its words, then
    /// fleetd's command line): `ip netns exec NAME` puts fleetd in a network namespace of the
    /// test's ([`crate::netns::Netns`]). Only fleetd goes there: its private tmux server is
    /// started first from the test, in the test's own namespace, so the workers' panes (which
    /// tmux forks) stay beside the test and the socket fleetd inherits, and reach fleetd at
    /// 127.0.0.1.
    pub async fn start_as_wrapped(
        host: &str,
        gateway: &str,
        rest: &str,
        wrapper: &[&str],
    ) -> anyhow::Result<Self> {
        let socket = format!("fleet-test-{}", uuid::Uuid::now_v7().simple());
        let mut fleet = Self::prepared(
            tempfile::tempdir()?,
            &format!("socket = \"{socket}\""),
            socket,
            &format!("host_id = \"{host}\"\n{gateway}"),
            rest,
            Vec::new(),
            Some(host),
        )?;
        fleet.wrapper = wrapper.iter().map(|word| word.to_string()).collect();
        fleet.launch().await?;
        Ok(fleet)
    }

    async fn start_with(
        dir: tempfile::TempDir,
        mux: &str,
        socket: String,
        gateway: &str,
        rest: &str,
        env: Vec<(String, Option<String>)>,
        key_of: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut fleet = Self::prepared(dir, mux, socket, gateway, rest, env, key_of)?;
        fleet.launch().await?;
        Ok(fleet)
    }

    /// A fleet with its config written and its state dir made, not yet started.
    fn prepared(
        dir: tempfile::TempDir,
        mux: &str,
        socket: String,
        gateway: &str,
        rest: &str,
        env: Vec<(String, Option<String>)>,
        key_of: Option<&str>,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let config = dir.path().join("fleetd.toml");
        // `gateway` may name the host; else every test gateway is `testhost`. `listen` names the
        // socket's own address, as `mcp-config` prints it.
        let host = if gateway.contains("host_id") {
            ""
        } else {
            "host_id = \"testhost\"\n"
        };
        std::fs::write(
            &config,
            format!(
                "[gateway]\nlisten = \"127.0.0.1:{port}\"\n{host}{gateway}\n\n[mux]\n{mux}\n\n{rest}\n"
            ),
        )?;
        let state = dir.path().join("state");
        if let Some(host) = key_of {
            crate::keys::place(&state, host)?;
        }
        Ok(Self {
            dir,
            config,
            state,
            listener,
            port,
            socket,
            child: None,
            starts: 0,
            env,
            wrapper: Vec::new(),
        })
    }

    /// Starts the process again over the same state dir (after [`Fleet::kill9`]).
    pub async fn launch(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let log = std::fs::File::create(self.log_path(self.starts))?;
        self.launch_with(Stdio::from(log)).await
    }

    /// [`Fleet::launch`], its stderr a pipe whose reading end is returned (as `fleetd serve
    /// 2>&1 | tee log` would have it): drop it to break the pipe. What fleetd logs through it
    /// is in no log file.
    pub async fn launch_piped(&mut self) -> anyhow::Result<tokio::process::ChildStderr> {
        self.starts += 1;
        std::fs::write(self.log_path(self.starts), "(stderr was a pipe)\n")?;
        self.launch_with(Stdio::piped()).await?;
        self.child
            .as_mut()
            .and_then(|child| child.stderr.take())
            .ok_or_else(|| anyhow::anyhow!("fleetd's stderr is no pipe"))
    }

    async fn launch_with(&mut self, stderr: Stdio) -> anyhow::Result<()> {
        let fleetd = binary("fleetd")?;
        let mut command = match self.wrapper.split_first() {
            Some((program, words)) => {
                self.start_tmux_here()?;
                let mut command = Command::new(program);
                command.args(words).arg(&fleetd);
                command
            }
            None => Command::new(&fleetd),
        };
        let fd = inherit(command.as_std_mut(), &self.listener)?;
        // What it logs, unless its environment says (a bench tracing a round trip's steps): the
        // tests' debug lines, or in a bench what fleetd logs as shipped.
        if AS_SHIPPED.load(Ordering::Relaxed) {
            command.env_remove("RUST_LOG");
        } else {
            command.env("RUST_LOG", "info,rmcp=warn,fleetd=debug");
        }
        for (key, value) in &self.env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        let child = command
            .args(["serve", "--listen-fd", &fd.to_string()])
            .arg("--config")
            .arg(&self.config)
            .arg("--state-dir")
            .arg(&self.state)
            .env_remove("TMUX")
            .env_remove("TMUX_PANE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()?;
        let child = self.child.insert(child);
        let url = format!("http://127.0.0.1:{}/healthz", self.port);
        let http = reqwest::Client::new();
        // Connections wait in the socket's backlog until fleetd takes them, so a probe may wait
        // as long as fleetd starts: fleetd's exit ends the wait, and so does the limit.
        let healthy = until("fleetd to answer /healthz", START_LIMIT, || {
            let request = http.get(&url).send();
            async move {
                let response = request.await.ok()?;
                response.status().is_success().then_some(())
            }
        });
        let ready = tokio::select! {
            status = child.wait() => Err(match status {
                Ok(status) => anyhow::anyhow!("fleetd exited ({status}) at start"),
                Err(e) => anyhow::anyhow!("cannot wait for fleetd: {e}"),
            }),
            ready = tokio::time::timeout(START_LIMIT, healthy) => ready.unwrap_or_else(|_| {
                Err(anyhow::anyhow!("gave up after {START_LIMIT:?} waiting for fleetd to answer /healthz"))
            }),
        };
        ready.map_err(|e| anyhow::anyhow!("{e}:\n{}", self.log()))
    }

    /// Starts the private tmux server from this process, unless it runs: with the session
    /// fleetd's control client attaches to (`new-session -A`), running what fleetd would run
    /// in it, and fleetd's environment. A server fleetd started itself would be wherever
    /// fleetd is (a wrapped fleetd's network namespace), and so would every pane it forks.
    fn start_tmux_here(&self) -> anyhow::Result<()> {
        let session = fleet_mux::tmux::codec::control::CONTROL_SESSION;
        let tmux = |args: &[&str]| {
            let mut command = std::process::Command::new("tmux");
            command
                .args(["-f", "/dev/null", "-L", &self.socket])
                .args(args)
                .env_remove("TMUX")
                .env_remove("TMUX_PANE")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            for (key, value) in &self.env {
                match value {
                    Some(value) => command.env(key, value),
                    None => command.env_remove(key),
                };
            }
            command.output()
        };
        if tmux(&["has-session", "-t", &format!("={session}")])?
            .status
            .success()
        {
            return Ok(());
        }
        let window = fleet_mux::tmux::codec::control::CONTROL_WINDOW;
        let out = tmux(&[
            "new-session",
            "-d",
            "-s",
            session,
            "-n",
            window,
            "sleep",
            "2147483647",
        ])?;
        anyhow::ensure!(
            out.status.success(),
            "cannot start the tmux server {}: {}",
            self.socket,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    fn log_path(&self, start: usize) -> PathBuf {
        self.dir.path().join(format!("fleetd-{start}.log"))
    }

    /// Everything fleetd logged, over every start.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| std::fs::read_to_string(self.log_path(n)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }

    /// Waits (10 s at most) until fleetd's log holds `text`: fleetd writes its log from a
    /// thread of its own, so a line may come a moment after what it tells of. Fails with the
    /// whole log.
    pub async fn logged(&self, text: &str) -> anyhow::Result<()> {
        until(
            &format!("{text:?} in fleetd's log"),
            Duration::from_secs(10),
            || async { self.log().contains(text).then_some(()) },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.log()))
    }

    /// How many times fleetd logged its broker link up, over every start: it went up again
    /// once this grows.
    pub fn links_up(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("broker link up"))
            .count()
    }

    /// The MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The base URL (for raw HTTP checks).
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The state dir.
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// A closed gate in the state dir (see [`Gate`]).
    pub fn gate(&self) -> Gate {
        Gate(
            self.state
                .join(format!("gate-{}", uuid::Uuid::now_v7().simple())),
        )
    }

    /// Whether fleetd's log says it recorded `sent` (what `fleet_send` returned) injected: the
    /// agent has the task and fleetd saw the submit.
    pub fn logged_injected(&self, sent: &serde_json::Value) -> bool {
        let id = format!("msg_id={}", sent["msg_id"].as_str().unwrap_or_default());
        self.log()
            .lines()
            .any(|l| l.contains(" injected ") && l.contains(&id))
    }

    /// Waits until fleetd's log says it recorded `sent` injected ([`Fleet::logged_injected`]).
    pub async fn injected(&self, sent: &serde_json::Value) -> anyhow::Result<()> {
        until(
            "fleetd to record the task injected",
            START_LIMIT,
            || async { self.logged_injected(sent).then_some(()) },
        )
        .await
    }

    /// Makes the store say message `msg_id` was still being typed (`injecting`) when fleetd
    /// died, as far as `keys` says: taken off the queue, no key in ([`Keys::None`]); pasted
    /// ([`Keys::Pasted`]); or its Enter gone too ([`Keys::Entered`]: for a task typed, the kill
    /// came between its submit and fleetd's record of it). While fleetd is stopped.
    pub fn as_if_killed_while_typing(&self, msg_id: &str, keys: Keys) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "fleetd is running");
        let db = rusqlite::Connection::open(self.state.join("fleet.db"))?;
        let note = match keys {
            Keys::None => None,
            Keys::Pasted => Some(KEYS_SENT),
            Keys::Entered => Some(ENTER_SENT),
        };
        let changed = db.execute(
            "UPDATE messages SET state = 'injecting', reason = ?2
             WHERE msg_id = ?1 AND state IN ('injected', 'queued')",
            rusqlite::params![msg_id, note],
        )?;
        anyhow::ensure!(changed == 1, "no injected or queued message {msg_id}");
        Ok(())
    }

    /// Makes the store say fleetd, when it died, had accepted another task `text` from the
    /// sender of task `like` to the same recipient and was typing it (`injecting`, its keys
    /// noted going in, not its Enter); returns its msg_id. Paste `text` into the pane ([`Fleet::paste`]) for the kill to have come between
    /// the paste and the Enter. While fleetd is stopped.
    pub fn as_if_typing_another(&self, like: &str, text: &str) -> anyhow::Result<String> {
        anyhow::ensure!(self.child.is_none(), "fleetd is running");
        let db = rusqlite::Connection::open(self.state.join("fleet.db"))?;
        let msg_id = uuid::Uuid::now_v7().hyphenated().to_string();
        let made = db.execute(
            "INSERT INTO messages (msg_id, trace_id, kind, from_gid, to_gid, in_reply_to, body,
                                   state, reason, created_ms, updated_ms)
             SELECT ?2, trace_id, kind, from_gid, to_gid, NULL, ?3, 'injecting', ?4,
                    created_ms, updated_ms
             FROM messages WHERE msg_id = ?1 AND kind = 'SEND'",
            [like, &msg_id, text, KEYS_SENT],
        )?;
        anyhow::ensure!(made == 1, "no task {like}");
        Ok(msg_id)
    }

    /// Makes the store say task `msg_id` was answered (its reply held for its sender, say),
    /// so its worker is idle when taken back. While fleetd is stopped.
    pub fn as_if_answered(&self, msg_id: &str) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "fleetd is running");
        let db = rusqlite::Connection::open(self.state.join("fleet.db"))?;
        db.execute("INSERT INTO answered (msg_id) VALUES (?1)", [msg_id])?;
        Ok(())
    }

    /// Pastes `text` into pane `pane` as fleetd types a task (a bracketed paste where the
    /// program asked for one), without the Enter after it.
    pub fn paste(&self, pane: &str, text: &str) -> anyhow::Result<()> {
        let buffer = format!("paste-{}", uuid::Uuid::now_v7().simple());
        let (server, pane) = self.on_server(pane)?;
        for args in [
            vec!["set-buffer", "-b", &buffer, "--", text],
            vec!["paste-buffer", "-p", "-d", "-b", &buffer, "-t", &pane],
        ] {
            let out = std::process::Command::new("tmux")
                .args(["-L", &server])
                .args(&args)
                .output()?;
            anyhow::ensure!(
                out.status.success(),
                "tmux {}: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Makes the store what the previous release (store schema 8) left: schema 9 only added
    /// tables (what each worker is known by, when fleetd was last alive), 10 changed no table,
    /// 11 added two columns (what each worker was spawned as), 12 one (why it ended) and 13
    /// rekeyed the change log, so dropping them, the log as it was, and the version with them,
    /// leave what that release wrote. While fleetd is stopped.
    pub fn as_left_by_schema_8(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "fleetd is running");
        let db = rusqlite::Connection::open(self.state.join("fleet.db"))?;
        change_log_of_schema_12(&db)?;
        db.execute_batch(
            "DROP TRIGGER adoptable_gone; DROP TABLE adoptable; DROP TABLE alive;
             DROP TABLE lead_panes;
             ALTER TABLE entities DROP COLUMN sandbox; ALTER TABLE entities DROP COLUMN profile_role;
             DROP INDEX entities_name; ALTER TABLE entities DROP COLUMN ended;
             PRAGMA user_version = 8;",
        )?;
        Ok(())
    }

    /// The states the store recorded for message `msg_id`, oldest first, as `state@ms (reason)`
    /// joined by ` → ` (`none` when it recorded none), then the same for each message it holds
    /// that answers this one (an ask, a reply, a notice): what this gateway did with it.
    pub fn trail(&self, msg_id: &str) -> anyhow::Result<String> {
        let db = rusqlite::Connection::open(self.state.join("fleet.db"))?;
        let states = |id: &str| -> anyhow::Result<String> {
            let mut stmt = db.prepare(
                "SELECT c.at_ms, c.state, c.reason FROM changes c JOIN messages m ON m.seq = c.message \
                 WHERE m.msg_id = ?1 ORDER BY c.seq",
            )?;
            let steps = stmt
                .query_map([id], |row| {
                    let (at, state, reason): (i64, String, Option<String>) =
                        (row.get(0)?, row.get(1)?, row.get(2)?);
                    Ok(match reason {
                        Some(why) => format!("{state}@{at} ({why})"),
                        None => format!("{state}@{at}"),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(if steps.is_empty() {
                "none".into()
            } else {
                steps.join(" → ")
            })
        };
        let mut trail = states(msg_id)?;
        let mut stmt = db.prepare("SELECT msg_id, kind FROM messages WHERE in_reply_to = ?1")?;
        let answers = stmt
            .query_map([msg_id], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        for (id, kind) in answers {
            trail.push_str(&format!("; its {kind} {id}: {}", states(&id)?));
        }
        Ok(trail)
    }

    /// When the store says fleetd was last seen alive (its store probe writes it), if ever.
    pub fn last_alive_ms(&self) -> anyhow::Result<Option<i64>> {
        let db = rusqlite::Connection::open(self.state.join("fleet.db"))?;
        let mut stmt = db.prepare("SELECT at_ms FROM alive WHERE id = 1")?;
        let mut rows = stmt.query([])?;
        Ok(match rows.next()? {
            Some(row) => Some(row.get(0)?),
            None => None,
        })
    }

    /// Makes the store say fleetd was last seen alive `ago` earlier than it was: as if it had
    /// been away that long (while it is stopped, before its next start).
    pub fn pretend_away(&self, ago: Duration) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "fleetd is running");
        let db = rusqlite::Connection::open(self.state.join("fleet.db"))?;
        let ms = i64::try_from(ago.as_millis())?;
        let changed = db.execute("UPDATE alive SET at_ms = at_ms - ?1", [ms])?;
        anyhow::ensure!(changed == 1, "the store has no record of fleetd alive");
        Ok(())
    }

    /// The config file.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// The private tmux server's socket name.
    pub fn tmux_socket(&self) -> &str {
        &self.socket
    }

    /// Runs `fleetd ARGS --config … --state-dir …` to completion.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        Ok(self.cli_command(args)?.output()?)
    }

    /// The `fleetd` command line `args` against this fleet's config and state dir, not yet
    /// started (for a command that runs on, like `tail`).
    pub fn cli_command(&self, args: &[&str]) -> anyhow::Result<std::process::Command> {
        let mut command = std::process::Command::new(binary("fleetd")?);
        command
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .arg("--state-dir")
            .arg(&self.state);
        Ok(command)
    }

    /// What pane `pane` of the private tmux server shows.
    pub fn screen(&self, pane: &str) -> anyhow::Result<String> {
        let (server, inner) = self.on_server(pane)?;
        let out = std::process::Command::new("tmux")
            .args(["-L", &server, "capture-pane", "-p", "-J", "-t", &inner])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "capture-pane {pane}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The pid of the program pane `pane` runs.
    pub fn pane_pid(&self, pane: &str) -> anyhow::Result<u32> {
        let (server, inner) = self.on_server(pane)?;
        let out = std::process::Command::new("tmux")
            .args(["-L", &server, "display-message", "-p", "-t", &inner])
            .arg("#{pane_pid}")
            .output()?;
        let said = String::from_utf8_lossy(&out.stdout);
        said.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "no process in pane {pane}: {said:?} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// Kills the process group of what runs in pane `pane` with SIGKILL: its program crashing.
    pub fn kill_pane_program(&self, pane: &str) -> anyhow::Result<()> {
        let pid = self.pane_pid(pane)?;
        let killed = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status()?;
        anyhow::ensure!(killed.success(), "kill -KILL -{pid} failed");
        Ok(())
    }

    /// The worker panes of the private tmux servers (none when none runs), by the ids fleetd
    /// gives them; the panes of fleetd's own control sessions are not ones.
    pub fn panes(&self) -> anyhow::Result<Vec<String>> {
        let mut panes = Vec::new();
        for index in 0..spread::MAX_SERVERS {
            let out = std::process::Command::new("tmux")
                .args([
                    "-L",
                    &spread::server_name(&self.socket, index),
                    "list-panes",
                    "-a",
                    "-F",
                    "#{pane_id} #{session_name}",
                ])
                .output()?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            // No server (never started, or gone with fleetd) holds no pane, and the servers a
            // fleet spread to follow one another; any other failure is not an answer.
            if stderr.contains("no server running") || stderr.contains("error connecting to") {
                break;
            }
            anyhow::ensure!(out.status.success(), "tmux list-panes: {stderr}");
            panes.extend(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|line| line.split_once(' '))
                    .filter(|(_, session)| {
                        *session != fleet_mux::tmux::codec::control::CONTROL_SESSION
                    })
                    .map(|(pane, _)| {
                        spread::outer_id(index, &fleet_mux::PaneId(pane.to_string())).0
                    }),
            );
        }
        Ok(panes)
    }

    /// The tmux server holding pane `pane` (an id fleetd gave), and tmux's own id of it.
    fn on_server(&self, pane: &str) -> anyhow::Result<(String, String)> {
        let (index, inner) = spread::inner_id(&fleet_mux::PaneId(pane.to_string()))
            .with_context(|| format!("{pane:?} is no pane id of fleetd's tmux servers"))?;
        Ok((spread::server_name(&self.socket, index), inner.0))
    }

    /// The bearer token of lead `name`.
    pub fn token(&self, name: &str) -> anyhow::Result<String> {
        let out = self.cli(&["token", name])?;
        anyhow::ensure!(
            out.status.success(),
            "fleetd token {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    }

    /// An MCP client connected as lead `name`.
    pub async fn lead(&self, name: &str, protocol: Protocol) -> anyhow::Result<Client> {
        let token = self.token(name)?;
        Client::connect(&self.url(), &token, protocol, &[]).await
    }

    /// The pid of the running process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// The value of the sample `sample` (a metric's name with its labels, as `/metrics` writes
    /// it: `fleetd_connections_closed_total{why="evicted"}`) now, scraped with the lead
    /// `lead`'s token; `None` if the scrape fails or has no such sample.
    pub async fn metric(&self, lead: &str, sample: &str) -> Option<f64> {
        let text = reqwest::Client::new()
            .get(format!("{}/metrics", self.base()))
            .bearer_auth(self.token(lead).ok()?)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    }

    /// Kills the process with SIGKILL and waits for it to die.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.start_kill()?;
            child.wait().await?;
        }
        Ok(())
    }

    /// Sends SIGTERM and waits for a clean exit; returns whether it exited successfully.
    pub async fn terminate(&mut self) -> anyhow::Result<bool> {
        Ok(self.stop_by("TERM").await?.success())
    }

    /// Sends signal `name` (`TERM`, `INT`) and waits for the process to exit; its exit status.
    pub async fn stop_by(&mut self, name: &str) -> anyhow::Result<std::process::ExitStatus> {
        let Some(mut child) = self.child.take() else {
            anyhow::bail!("fleetd is not running");
        };
        if let Some(pid) = child.id() {
            std::process::Command::new("kill")
                .args([&format!("-{name}"), &pid.to_string()])
                .status()?;
        }
        match tokio::time::timeout(TERMINATE_LIMIT, child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                let _ = child.start_kill();
                anyhow::bail!(
                    "fleetd did not stop within {} s of SIG{name}:\n{}",
                    TERMINATE_LIMIT.as_secs(),
                    self.log()
                )
            }
        }
    }
}

/// How long a SIGTERM'd fleetd may take to drain and exit before a test calls it hung.
const TERMINATE_LIMIT: Duration = Duration::from_secs(30);

/// How long a killed fleetd may take to die before its tmux server is stopped anyway.
const DEATH_WAIT: Duration = Duration::from_secs(5);

impl Drop for Fleet {
    fn drop(&mut self) {
        // fleetd first, and wait for it: while it lives it would reconnect to (and so restart)
        // the tmux server stopped below.
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
            let deadline = std::time::Instant::now() + DEATH_WAIT;
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        stop_tmux(&self.socket);
    }
}

/// Stops the private tmux server `name` and the servers a big fleet spread to (`name-2`,
/// `name-3` … up to the first not running), and any tmux process still naming one: a control
/// client fleetd started just before it was killed can bring a server up after `kill-server`.
pub fn stop_tmux(name: &str) {
    let kill = |server: &str| {
        std::process::Command::new("tmux")
            .args(["-L", server, "kill-server"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    kill(name);
    for k in 2.. {
        if !kill(&spread::server_name(name, k - 1)) {
            break;
        }
    }
    let _ = std::process::Command::new("pkill")
        .args(["-KILL", "-f", &format!("tmux .*-L {name}(@[0-9]+)? ")])
        .status();
}

/// Takes a store's change log back to schema 12's, each row naming what changed by its text id,
/// for a test that makes a database what an earlier build left. Its triggers go: the store
/// opened next makes them again as it migrates, before anything changes.
pub fn change_log_of_schema_12(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    db.execute_batch(
        "DROP TRIGGER changes_message_made; DROP TRIGGER changes_message_moved;
         DROP TRIGGER changes_message_pruned; DROP TRIGGER changes_entity_made;
         DROP TRIGGER changes_entity_moved;
         CREATE TABLE changes_12 (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL,
             subject TEXT NOT NULL, id TEXT NOT NULL, state TEXT NOT NULL, reason TEXT);
         INSERT INTO changes_12 SELECT c.seq, c.at_ms, IIF(c.message IS NULL, 'entity', 'message'),
             COALESCE(m.msg_id, c.entity), c.state, c.reason
             FROM changes c LEFT JOIN messages m ON m.seq = c.message;
         DROP TABLE changes;
         ALTER TABLE changes_12 RENAME TO changes;",
    )
}
