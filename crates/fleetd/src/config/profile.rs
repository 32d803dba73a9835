//! `[[profiles]]`: how a worker is launched. Its kind picks the launcher (see
//! [`crate::launch`]); settings a kind has a better default for (Claude Code's pause before
//! Enter and its empty input box) fall back to the kind's.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::time::Duration;

use fleet_core::dialog::{CLAUDE_CODE_MARKERS, CLAUDE_CODE_TURN_OVER, OPENCODE_MARKERS};
use fleet_core::entity::{sandbox_name, validate_name};
use fleet_core::redact::EnvNames;
use fleet_core::typed::first_control;
use serde::Deserialize;

use super::{CLAUDE_EMPTY_INPUT, MAX_CONFIG_WAIT_S, within};

/// How long a spawned worker has to call in, by default.
pub(super) const DEFAULT_READY_TIMEOUT_S: u64 = 30;
/// How long to watch for a submit after each Enter, by default.
pub(super) const DEFAULT_SUBMIT_VERIFY_MS: u64 = 2_000;
/// Claude Code takes text followed at once by Enter as a paste: the Enter must come later.
const CLAUDE_ENTER_PAUSE_MS: u64 = 300;
/// opencode's home screen, once it takes input: the placeholder of its empty input box.
const OPENCODE_READY: &str = "Ask anything";
/// The most `blocked_markers` (or `turn_over_markers`) a profile may declare.
const MAX_DIALOG_MARKERS: usize = 32;
/// The longest marker.
const MAX_DIALOG_MARKER_CHARS: usize = 200;
/// The most tasks a `context_cap` may allow.
const MAX_CONTEXT_CAP: u64 = 1_000_000;
/// What Claude Code takes from its environment as a login (2.1.332): an API key, a bearer
/// token (for a gateway in front of the API), a long-lived OAuth token (`claude setup-token`).
pub const CLAUDE_CREDENTIALS: [&str; 3] = [
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
];
/// The variables that point Claude Code at a cloud provider (2.1.332), which signs in by that
/// cloud's own means.
const CLAUDE_PROVIDERS: [&str; 6] = [
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
    "CLAUDE_CODE_USE_ANTHROPIC_AWS",
    "CLAUDE_CODE_USE_ANTHROPIC_GOOGLE_CLOUD",
    "CLAUDE_CODE_USE_MANTLE",
];
/// The flag that hands Claude Code a settings file or JSON, which may name an `apiKeyHelper`.
const CLAUDE_SETTINGS_FLAG: &str = "--settings";
/// The provider of opencode's models that fleetd sets up (`base_url`), and the one variable it
/// takes a login from.
const OPENCODE_ANTHROPIC: (&str, &str) = ("anthropic/", "ANTHROPIC_API_KEY");
/// The placeholders a profile's `workspace` and `workspace_teardown` may use.
pub const WORKSPACE_PLACEHOLDERS: [&str; 4] = ["cwd", "dir", "name", "gid"];
/// The placeholders a sandbox's `runtime` and `teardown` may use.
pub const SANDBOX_PLACEHOLDERS: [&str; 13] = [
    "name",
    "gid",
    "host",
    "image",
    "role",
    "mcp_url",
    "token",
    "workdir",
    "worker_dir",
    "state_dir",
    "home",
    "agent",
    "env_file",
];

/// Which call from a spawning worker proves it ready (besides its `ready_marker`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadyCall {
    /// Its first authenticated request.
    Any,
    /// Its listing fleetd's tools (MCP `tools/list`).
    ToolList,
    /// No call: only its screen.
    None,
}

/// How a profile's program is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProfileKind {
    /// Any terminal program, run as its argv.
    Command,
    /// Claude Code, with its MCP config, environment and reply charter set up by fleetd.
    ClaudeCode,
    /// OpenCode, through a config file of fleetd's making.
    Opencode,
    /// An agent inside a sandbox runtime (docker, podman, bubblewrap …).
    Sandbox,
}

impl ProfileKind {
    /// How the kind reads in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileKind::Command => "command",
            ProfileKind::ClaudeCode => "claude-code",
            ProfileKind::Opencode => "opencode",
            ProfileKind::Sandbox => "sandbox",
        }
    }

    /// The program the kind runs when the profile names none.
    fn default_program(self) -> Option<&'static str> {
        match self {
            ProfileKind::ClaudeCode => Some("claude"),
            ProfileKind::Opencode => Some("opencode"),
            ProfileKind::Command | ProfileKind::Sandbox => None,
        }
    }
}

/// A profile's extra environment. Its values are often credentials (`ANTHROPIC_API_KEY`), so
/// its `Debug` shows the names only.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ProfileEnv(pub BTreeMap<String, String>);

impl Deref for ProfileEnv {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for ProfileEnv {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl std::fmt::Debug for ProfileEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        EnvNames(&self.0).fmt(f)
    }
}

/// `[[profiles]]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    /// The profile's name, as `fleet_spawn{profile}` names it.
    pub name: String,
    /// How it is launched.
    pub kind: ProfileKind,
    /// The program and its arguments (`claude` / `opencode` for those kinds when empty; a
    /// sandbox names its agent in `agent` instead).
    #[serde(default)]
    pub argv: Vec<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: ProfileEnv,
    /// Working directory; fleetd's own when unset. A spawn may override it.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Broadcast groups every worker of this profile joins.
    #[serde(default)]
    pub groups: Vec<String>,
    /// The role its workers play (an opaque reference, `{role}` in a sandbox template).
    #[serde(default)]
    pub role: Option<String>,
    /// How long a new worker has to call in (or show `ready_marker`).
    #[serde(default = "default_ready_timeout_s")]
    pub ready_timeout_s: u64,
    /// Text whose appearance on screen also counts as ready (for programs that never call in;
    /// opencode: its input box's placeholder when unset, and only that counts).
    #[serde(default)]
    pub ready_marker: Option<String>,
    /// Pause between paste and Enter (claude-code: 300 ms when unset, else 0).
    #[serde(default)]
    pub enter_pause_ms: Option<u64>,
    /// How long to watch for the submit after each Enter.
    #[serde(default = "default_submit_verify_ms")]
    pub submit_verify_ms: u64,
    /// Text the program shows when its input is empty again; proves a submit (claude-code:
    /// its empty input box when unset).
    #[serde(default)]
    pub submitted_marker: Option<String>,
    /// The program reads one line at a time and does not ask for bracketed paste (a plain shell,
    /// a line-based REPL): each line of a pasted message would reach it as a submit of its own,
    /// so a message holding a newline is refused for it.
    #[serde(default)]
    pub single_line: bool,
    /// A worker idle this long is stopped.
    #[serde(default)]
    pub idle_ttl_s: Option<u64>,
    /// After this many tasks a worker is recycled: a fresh session under the same name.
    #[serde(default)]
    pub context_cap: Option<u64>,
    /// claude-code / opencode: the model endpoint (`ANTHROPIC_BASE_URL`). Only the config sets
    /// it; no tool call can.
    #[serde(default)]
    pub base_url: Option<String>,
    /// claude-code / opencode: the model (`claude --model`; opencode's `provider/model`).
    #[serde(default)]
    pub model: Option<String>,
    /// claude-code / opencode: a private, seeded `HOME` instead of the user's own login and
    /// settings.
    #[serde(default)]
    pub isolated_home: bool,
    /// claude-code: the permission mode its session starts in (`claude --permission-mode`);
    /// unset, Claude Code's own default (the user's `defaultMode`, else its built-in one).
    #[serde(default)]
    pub permission_mode: Option<PermissionMode>,
    /// claude-code (not in an isolated home): mark the working directory trusted in the user's
    /// `~/.claude.json`, so Claude Code starts without asking; false leaves that file alone
    /// (the directory must then be trusted already, or Claude Code asks and never gets ready).
    #[serde(default = "default_trust_workdir")]
    pub trust_workdir: bool,
    /// sandbox: the image (or other reference) for `{image}`; fleetd never builds it.
    #[serde(default)]
    pub image: Option<String>,
    /// sandbox: the runtime's argv template; the agent's argv is appended to it.
    #[serde(default)]
    pub runtime: Vec<String>,
    /// sandbox: an argv run when the worker's pane goes.
    #[serde(default)]
    pub teardown: Vec<String>,
    /// sandbox: the agent's argv inside the sandbox.
    #[serde(default)]
    pub agent: Vec<String>,
    /// sandbox: how the agent inside is set up (`command`, `claude-code`, `opencode`).
    #[serde(default)]
    pub agent_kind: Option<ProfileKind>,
    /// Screen text that means the program stopped on a dialog and waits for a choice (a
    /// permission prompt): a busy worker whose screen shows one and holds still is `blocked`,
    /// and its lead is asked to choose. Unset: the kind's own (claude-code's dialogs); `[]`:
    /// none.
    #[serde(default)]
    pub blocked_markers: Option<Vec<String>>,
    /// Screen text that means the program ended its turn without an answer after a dialog's
    /// choice (Claude Code's "Interrupted · What should Claude do instead?" after "No"): shown
    /// anew after its lead's choice, the task in flight fails with that reason and the worker
    /// takes its next task. Unset: the kind's own (claude-code's); `[]`: none.
    #[serde(default)]
    pub turn_over_markers: Option<Vec<String>>,
    /// A busy worker whose screen has not changed and that has made no call for this long has
    /// stalled: its lead is told, with the end of its screen. Unset: never.
    #[serde(default)]
    pub stall_after_s: Option<u64>,
    /// What else happens to a stalled worker: nothing (`notify`, the default), or its task
    /// fails (its lead is told why) and it starts afresh under its name (`recycle`).
    #[serde(default)]
    pub on_stall: OnStall,
    /// An argv (`{cwd}`, `{dir}`, `{name}`, `{gid}` filled in, no shell) that makes the
    /// worker's own workspace `{dir}` from its `{cwd}` (a git worktree, a copy); the worker
    /// then runs in `{dir}`. Empty: it runs in its cwd.
    #[serde(default)]
    pub workspace: Vec<String>,
    /// An argv, filled in the same way, that takes the workspace down when the worker's
    /// session ends (or, after a crash, at fleetd's next start).
    #[serde(default)]
    pub workspace_teardown: Vec<String>,
    /// Where workspaces go (`{dir}` is `<root>/<name>-<gid>`); the state dir's `workspaces`
    /// when unset.
    #[serde(default)]
    pub workspace_root: Option<PathBuf>,
}

/// What happens to a stalled worker besides its lead being told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStall {
    /// Only its lead is told.
    #[default]
    Notify,
    /// Its task fails and the worker gets a fresh session.
    Recycle,
}

fn default_ready_timeout_s() -> u64 {
    DEFAULT_READY_TIMEOUT_S
}

fn default_submit_verify_ms() -> u64 {
    DEFAULT_SUBMIT_VERIFY_MS
}

/// Refuses a control character in the value of `what`, naming the key, never the value (an env
/// value is often a credential).
fn one_line(what: &str, value: &str) -> Result<(), String> {
    match first_control(value) {
        Some(found) => Err(format!(
            "{what} holds {found}; a pane's command line must stay one line"
        )),
        None => Ok(()),
    }
}

fn default_trust_workdir() -> bool {
    true
}

/// What a Claude Code worker may do without asking (`claude --permission-mode`), from least to
/// most: an action outside its mode stops the worker on a dialog until someone answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum PermissionMode {
    /// Reads only; every edit and command is asked about (`manual`).
    #[serde(rename = "manual", alias = "default")]
    Manual,
    /// Reads, plans; changes nothing in the project.
    #[serde(rename = "plan")]
    Plan,
    /// Reads and pre-approved tools; anything that would ask is refused instead, so the
    /// worker never stops on a dialog.
    #[serde(rename = "dontAsk")]
    DontAsk,
    /// Reads, edits in its working directory, common file commands.
    #[serde(rename = "acceptEdits")]
    AcceptEdits,
    /// Everything a background classifier (run by Anthropic) approves; with a custom
    /// `base_url` the classifier is not reached and the worker stops on a dialog.
    #[serde(rename = "auto")]
    Auto,
    /// Everything, unchecked: for a sandbox only.
    #[serde(rename = "bypassPermissions")]
    BypassPermissions,
}

impl PermissionMode {
    /// The value `claude --permission-mode` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Manual => "manual",
            PermissionMode::Plan => "plan",
            PermissionMode::DontAsk => "dontAsk",
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::Auto => "auto",
            PermissionMode::BypassPermissions => "bypassPermissions",
        }
    }
}

impl ProfileConfig {
    /// A `command` profile running `argv`, every other key at its default.
    pub fn command(name: &str, argv: Vec<String>) -> Self {
        Self {
            name: name.into(),
            kind: ProfileKind::Command,
            argv,
            env: ProfileEnv::default(),
            cwd: None,
            groups: Vec::new(),
            role: None,
            ready_timeout_s: DEFAULT_READY_TIMEOUT_S,
            ready_marker: None,
            enter_pause_ms: None,
            submit_verify_ms: DEFAULT_SUBMIT_VERIFY_MS,
            submitted_marker: None,
            single_line: false,
            idle_ttl_s: None,
            context_cap: None,
            base_url: None,
            model: None,
            permission_mode: None,
            isolated_home: false,
            trust_workdir: default_trust_workdir(),
            image: None,
            runtime: Vec::new(),
            teardown: Vec::new(),
            agent: Vec::new(),
            agent_kind: None,
            blocked_markers: None,
            turn_over_markers: None,
            stall_after_s: None,
            on_stall: OnStall::Notify,
            workspace: Vec::new(),
            workspace_teardown: Vec::new(),
            workspace_root: None,
        }
    }

    /// The screen text that shows the program stopped on a dialog: the profile's, else its
    /// kind's.
    pub fn dialog_markers(&self) -> Vec<String> {
        match &self.blocked_markers {
            Some(markers) => markers.clone(),
            None => match self.agent_kind() {
                ProfileKind::ClaudeCode => {
                    CLAUDE_CODE_MARKERS.iter().map(|m| m.to_string()).collect()
                }
                ProfileKind::Opencode => OPENCODE_MARKERS.iter().map(|m| m.to_string()).collect(),
                ProfileKind::Command | ProfileKind::Sandbox => Vec::new(),
            },
        }
    }

    /// The screen text that shows the program ended its turn without an answer after a dialog's
    /// choice: the profile's, else its kind's.
    pub fn turn_over_markers(&self) -> Vec<String> {
        match &self.turn_over_markers {
            Some(markers) => markers.clone(),
            None => match self.agent_kind() {
                ProfileKind::ClaudeCode => CLAUDE_CODE_TURN_OVER
                    .iter()
                    .map(|m| m.to_string())
                    .collect(),
                ProfileKind::Opencode | ProfileKind::Command | ProfileKind::Sandbox => Vec::new(),
            },
        }
    }

    /// The characters the agent's input box reads as a command when they open the input: a
    /// task that opens with one is typed after a label line, so it is a task, not a command
    /// (Claude Code: `!` shell, `/` slash command, `#` memory; opencode: `!` shell, `/`
    /// command). None for other programs: fleetd does not know their input.
    pub fn command_prefixes(&self) -> &'static [char] {
        match self.agent_kind() {
            ProfileKind::ClaudeCode => &['!', '/', '#'],
            ProfileKind::Opencode => &['!', '/'],
            ProfileKind::Command | ProfileKind::Sandbox => &[],
        }
    }

    /// The character that, last before Enter, makes the program's Enter a newline instead of a
    /// submit (Claude Code: a backslash), if any: a task ending in it gets a blank typed after
    /// it, which Claude Code trims from what it submits, so its model gets the task as sent.
    pub fn line_continuation(&self) -> Option<char> {
        match self.agent_kind() {
            ProfileKind::ClaudeCode => Some('\\'),
            ProfileKind::Opencode | ProfileKind::Command | ProfileKind::Sandbox => None,
        }
    }

    /// The kind of program in the pane: a sandbox's agent kind, else the profile's own.
    pub fn agent_kind(&self) -> ProfileKind {
        match self.kind {
            ProfileKind::Sandbox => self.agent_kind.unwrap_or(ProfileKind::Command),
            kind => kind,
        }
    }

    /// The permission mode a Claude Code worker starts in: the profile's, else, in a sandbox
    /// with a home of its own, `bypassPermissions` (the mode a sandbox is for: nothing stops the
    /// agent on a dialog, the sandbox bounds what it can reach, and fleetd records the mode's
    /// consent in that home), else none (Claude Code's own default: a home fleetd does not seed
    /// would stop it on the mode's warning).
    pub fn start_mode(&self) -> Option<PermissionMode> {
        let sandboxed = self.kind == ProfileKind::Sandbox
            && self.agent_kind() == ProfileKind::ClaudeCode
            && self.isolated_home;
        self.permission_mode
            .or(sandboxed.then_some(PermissionMode::BypassPermissions))
    }

    /// The agent's argv: the profile's (a sandbox's `agent`), else its kind's program.
    pub fn program(&self) -> Vec<String> {
        let given = match self.kind {
            ProfileKind::Sandbox => &self.agent,
            _ => &self.argv,
        };
        if given.is_empty()
            && let Some(program) = self.agent_kind().default_program()
        {
            return vec![program.into()];
        }
        given.clone()
    }

    /// The sandbox runtime its workers run in, as `fleet_list` shows it: its runtime's
    /// program by file name ([`sandbox_name`]: `bwrap`, `podman`, `docker`); none unless it is
    /// a sandbox.
    pub fn sandbox(&self) -> Option<String> {
        match self.kind {
            ProfileKind::Sandbox => self.runtime.first().and_then(|p| sandbox_name(p)),
            _ => None,
        }
    }

    /// The pause between paste and Enter.
    pub fn enter_pause(&self) -> Duration {
        let default = match self.agent_kind() {
            ProfileKind::ClaudeCode => CLAUDE_ENTER_PAUSE_MS,
            _ => 0,
        };
        Duration::from_millis(self.enter_pause_ms.unwrap_or(default))
    }

    /// The text that shows the program's input is empty, if known.
    pub fn submitted_marker(&self) -> Option<String> {
        self.submitted_marker.clone().or_else(|| {
            (self.agent_kind() == ProfileKind::ClaudeCode).then(|| CLAUDE_EMPTY_INPUT.to_string())
        })
    }

    /// The text on screen that shows the program is ready, if known.
    pub fn ready_marker(&self) -> Option<String> {
        self.ready_marker.clone().or_else(|| {
            (self.agent_kind() == ProfileKind::Opencode).then(|| OPENCODE_READY.to_string())
        })
    }

    /// Which call-in makes a spawning worker ready. Claude Code calls in (MCP `initialize`)
    /// before it has fleetd's tools, and a task submitted then goes to its model without them:
    /// only its listing the tools counts. opencode connects to its MCP servers before its
    /// screen takes input, so only its screen counts.
    pub fn ready_call(&self) -> ReadyCall {
        match self.agent_kind() {
            ProfileKind::ClaudeCode => ReadyCall::ToolList,
            ProfileKind::Opencode => ReadyCall::None,
            ProfileKind::Command | ProfileKind::Sandbox => ReadyCall::Any,
        }
    }

    /// How long an idle worker lives.
    pub fn idle_ttl(&self) -> Option<Duration> {
        self.idle_ttl_s.map(Duration::from_secs)
    }

    /// Checks what the parser cannot; errors name the profile and the key.
    pub(super) fn validate(&self) -> Result<(), String> {
        let name = &self.name;
        let key = |k: &str| format!("profiles '{name}': {k}");
        let named = |what: &str, value: &str| validate_name(what, value).map_err(|e| e.message);
        named("profile", name)?;
        for group in &self.groups {
            named(&key("groups entry"), group)?;
        }
        if let Some(role) = &self.role {
            named(&key("role"), role)?;
        }
        within(
            &key("ready_timeout_s"),
            self.ready_timeout_s,
            1,
            MAX_CONFIG_WAIT_S,
        )?;
        within(
            &key("submit_verify_ms"),
            self.submit_verify_ms,
            1,
            MAX_CONFIG_WAIT_S * 1000,
        )?;
        if let Some(pause) = self.enter_pause_ms {
            within(&key("enter_pause_ms"), pause, 0, MAX_CONFIG_WAIT_S * 1000)?;
        }
        if let Some(ttl) = self.idle_ttl_s {
            within(&key("idle_ttl_s"), ttl, 1, MAX_CONFIG_WAIT_S * 365)?;
        }
        if let Some(cap) = self.context_cap {
            within(&key("context_cap"), cap, 1, MAX_CONTEXT_CAP)?;
        }
        if let Some(stall) = self.stall_after_s {
            within(&key("stall_after_s"), stall, 1, MAX_CONFIG_WAIT_S * 365)?;
        }
        if self.on_stall == OnStall::Recycle && self.stall_after_s.is_none() {
            return Err(key(
                "on_stall = \"recycle\" needs stall_after_s (how long a worker may stall first)",
            ));
        }
        self.validate_workspace()?;
        self.validate_text()?;
        self.validate_kind()
    }

    /// The text a profile hands to a screen or a command line: dialog and turn-over markers
    /// (some text, not too much, one line), env entries (none of fleetd's own), and the words of
    /// its command lines, one line each (tmux ends a command at a newline).
    fn validate_text(&self) -> Result<(), String> {
        let name = &self.name;
        let key = |k: &str| format!("profiles '{name}': {k}");
        for (list, markers) in [
            ("blocked_markers", &self.blocked_markers),
            ("turn_over_markers", &self.turn_over_markers),
        ] {
            let markers = markers.as_deref().unwrap_or_default();
            if markers.len() > MAX_DIALOG_MARKERS {
                return Err(key(&format!(
                    "{list} holds {} markers; at most {MAX_DIALOG_MARKERS}",
                    markers.len()
                )));
            }
            for (i, marker) in markers.iter().enumerate() {
                let what = key(&format!("{list}[{i}]"));
                if marker.trim().is_empty() || marker.chars().count() > MAX_DIALOG_MARKER_CHARS {
                    return Err(format!(
                        "{what} must hold some text, at most {MAX_DIALOG_MARKER_CHARS} characters (a marker is screen text)"
                    ));
                }
                one_line(&what, marker)?;
            }
        }
        for (env, value) in self.env.iter() {
            if env.is_empty() || env.contains('=') || env.starts_with("FLEET_") {
                return Err(key(&format!(
                    "env key '{env}' is not allowed (empty, has '=', or is one of fleetd's own FLEET_* variables)"
                )));
            }
            one_line(&key(&format!("env {env}")), value)?;
        }
        // What goes into a pane's command line stays one line (tmux ends a command at a newline).
        for (what, words) in [
            ("argv", &self.argv),
            ("agent", &self.agent),
            ("runtime", &self.runtime),
        ] {
            for (i, word) in words.iter().enumerate() {
                one_line(&key(&format!("{what}[{i}]")), word)?;
            }
        }
        Ok(())
    }

    /// An agent in an isolated home starts with no login of its own: without a credential it
    /// takes a task and never answers. Refuses such a profile when a credential is missing
    /// (looked for in its `env` and, but for a sandbox, in fleetd's environment, `fleetd_env`,
    /// which the launcher hands on); the error names the variables, never their values.
    ///
    /// Claude Code ("Not logged in"): one of [`CLAUDE_CREDENTIALS`], unless something else
    /// signs it in: a cloud provider (`CLAUDE_CODE_USE_BEDROCK` …) or a `--settings` argument
    /// (which may name an `apiKeyHelper`). opencode ("Anthropic API key is missing"): only for an
    /// `anthropic/…` model, the provider fleetd sets up, whose key is `ANTHROPIC_API_KEY`;
    /// other providers have variables of their own, which fleetd does not know.
    pub fn check_login(&self, fleetd_env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
        if !self.isolated_home {
            return Ok(());
        }
        // fleetd's own login is never handed into a sandbox: there only the profile's counts.
        let sandboxed = self.kind == ProfileKind::Sandbox;
        let set = |key: &str| {
            self.env
                .get(key)
                .cloned()
                .or_else(|| (!sandboxed).then(|| fleetd_env(key)).flatten())
                .is_some_and(|value| !value.is_empty())
        };
        match self.agent_kind() {
            ProfileKind::ClaudeCode => self.check_claude_login(&set),
            ProfileKind::Opencode => {
                let (provider, key) = OPENCODE_ANTHROPIC;
                match &self.model {
                    Some(model) if model.starts_with(provider) && !set(key) => Err(format!(
                        "profiles '{}': isolated_home = true starts opencode with no login, where its model '{model}' fails with \"Anthropic API key is missing\" and it never answers: add {key} to the profile's env or to fleetd's environment, or drop isolated_home to use your own login",
                        self.name
                    )),
                    _ => Ok(()),
                }
            }
            ProfileKind::Command | ProfileKind::Sandbox => Ok(()),
        }
    }

    /// [`ProfileConfig::check_login`] for Claude Code, `set` telling which variables are set.
    fn check_claude_login(&self, set: &dyn Fn(&str) -> bool) -> Result<(), String> {
        let settings = self.program().iter().any(|arg| {
            arg == CLAUDE_SETTINGS_FLAG
                || arg
                    .strip_prefix(CLAUDE_SETTINGS_FLAG)
                    .is_some_and(|rest| rest.starts_with('='))
        });
        if CLAUDE_CREDENTIALS
            .iter()
            .chain(&CLAUDE_PROVIDERS)
            .any(|key| set(key))
            || settings
        {
            return Ok(());
        }
        let whose = if self.kind == ProfileKind::Sandbox {
            "the profile's env (fleetd's own login never goes into a sandbox)"
        } else {
            "the profile's env or to fleetd's environment"
        };
        Err(format!(
            "profiles '{}': isolated_home = true starts Claude Code in a fresh home with no login, where it shows \"Not logged in\" and never answers: add ANTHROPIC_API_KEY (or {}) to {whose}, or drop isolated_home to use your own login",
            self.name,
            CLAUDE_CREDENTIALS[1..].join(", ")
        ))
    }

    /// The keys that belong to some kinds only, and what each kind needs.
    fn validate_kind(&self) -> Result<(), String> {
        let name = &self.name;
        let kind = self.kind.as_str();
        let sandbox = self.kind == ProfileKind::Sandbox;
        let only = |set: bool, key: &str, kinds: &str| {
            if set {
                Err(format!(
                    "profiles '{name}': {key} applies to {kinds} profiles, not to kind \"{kind}\""
                ))
            } else {
                Ok(())
            }
        };
        let agent = self.agent_kind();
        let model_agent = matches!(agent, ProfileKind::ClaudeCode | ProfileKind::Opencode);
        only(
            self.base_url.is_some() && !model_agent,
            "base_url",
            "claude-code and opencode",
        )?;
        only(
            self.model.is_some() && !model_agent,
            "model",
            "claude-code and opencode",
        )?;
        only(
            self.isolated_home && !model_agent,
            "isolated_home",
            "claude-code and opencode",
        )?;
        only(
            !self.trust_workdir && agent != ProfileKind::ClaudeCode,
            "trust_workdir",
            "claude-code",
        )?;
        only(
            self.permission_mode.is_some() && agent != ProfileKind::ClaudeCode,
            "permission_mode",
            "claude-code",
        )?;
        if !self.trust_workdir && self.isolated_home {
            return Err(format!(
                "profiles '{name}': trust_workdir = false is about your own ~/.claude.json; an isolated home is fleetd's own and trusts its directory (without that Claude Code asks and never gets ready): drop one of them"
            ));
        }
        for (set, key) in [
            (self.image.is_some(), "image"),
            (!self.runtime.is_empty(), "runtime"),
            (!self.teardown.is_empty(), "teardown"),
            (!self.agent.is_empty(), "agent"),
            (self.agent_kind.is_some(), "agent_kind"),
        ] {
            only(set && !sandbox, key, "sandbox")?;
        }
        if let Some(url) = &self.base_url {
            let parsed = url::Url::parse(url)
                .map_err(|e| format!("profiles '{name}': base_url '{url}' is not a URL: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!(
                    "profiles '{name}': base_url '{url}' must be an http:// or https:// URL"
                ));
            }
        }
        if model_agent && self.env.contains_key("ANTHROPIC_BASE_URL") {
            return Err(format!(
                "profiles '{name}': set the model endpoint with base_url, not env ANTHROPIC_BASE_URL"
            ));
        }
        if sandbox {
            self.validate_sandbox()?;
        }
        if self.program().first().is_none_or(|p| p.trim().is_empty()) {
            let key = if sandbox { "agent" } else { "argv" };
            return Err(format!("profiles '{name}': {key} must name a program"));
        }
        Ok(())
    }

    /// A sandbox's keys: its agent in `agent`, its runtime's program in `runtime`, and known
    /// placeholders in its runtime and teardown templates.
    fn validate_sandbox(&self) -> Result<(), String> {
        let name = &self.name;
        if !self.argv.is_empty() {
            return Err(format!(
                "profiles '{name}': a sandbox names its agent's argv in agent and its runtime's in runtime, not argv"
            ));
        }
        if self.runtime.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(format!(
                "profiles '{name}': runtime must name the sandbox runtime's program (e.g. [\"docker\", \"run\", …])"
            ));
        }
        if self.agent_kind == Some(ProfileKind::Sandbox) {
            return Err(format!(
                "profiles '{name}': agent_kind cannot be \"sandbox\""
            ));
        }
        for (key, argv) in [("runtime", &self.runtime), ("teardown", &self.teardown)] {
            for word in argv {
                self.check_placeholders(key, word, &SANDBOX_PLACEHOLDERS)?;
            }
        }
        Ok(())
    }

    /// A workspace's templates: a program, known placeholders, one line each; a teardown only
    /// with a workspace; a root that is an absolute path.
    fn validate_workspace(&self) -> Result<(), String> {
        let name = &self.name;
        if self.workspace.is_empty() {
            if !self.workspace_teardown.is_empty() || self.workspace_root.is_some() {
                return Err(format!(
                    "profiles '{name}': workspace_teardown and workspace_root need a workspace (the argv that makes it)"
                ));
            }
            return Ok(());
        }
        if self.workspace[0].trim().is_empty() {
            return Err(format!(
                "profiles '{name}': workspace must name a program (e.g. [\"git\", \"-C\", \"{{cwd}}\", \"worktree\", \"add\", \"{{dir}}\"])"
            ));
        }
        for (key, argv) in [
            ("workspace", &self.workspace),
            ("workspace_teardown", &self.workspace_teardown),
        ] {
            for (i, word) in argv.iter().enumerate() {
                one_line(&format!("profiles '{name}': {key}[{i}]"), word)?;
                self.check_placeholders(key, word, &WORKSPACE_PLACEHOLDERS)?;
            }
        }
        if let Some(root) = &self.workspace_root
            && !root.is_absolute()
        {
            return Err(format!(
                "profiles '{name}': workspace_root must be an absolute path, not '{}'",
                root.display()
            ));
        }
        Ok(())
    }

    /// Every `{…}` in `word` must be one of `known` (with a value).
    fn check_placeholders(&self, key: &str, word: &str, known: &[&str]) -> Result<(), String> {
        let name = &self.name;
        let mut rest = word;
        while let Some(open) = rest.find('{') {
            let after = &rest[open + 1..];
            let Some(close) = after.find('}') else {
                return Err(format!(
                    "profiles '{name}': {key} entry '{word}' has a '{{' without '}}'"
                ));
            };
            let placeholder = &after[..close];
            if !known.contains(&placeholder) {
                return Err(format!(
                    "profiles '{name}': {key} entry '{word}' names an unknown placeholder {{{placeholder}}} (known: {})",
                    known
                        .iter()
                        .map(|p| format!("{{{p}}}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if (placeholder == "image" && self.image.is_none())
                || (placeholder == "role" && self.role.is_none())
            {
                return Err(format!(
                    "profiles '{name}': {key} uses {{{placeholder}}} but the profile sets no {placeholder}"
                ));
            }
            rest = &after[close + 1..];
        }
        Ok(())
    }
}
