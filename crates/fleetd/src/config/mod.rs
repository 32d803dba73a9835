//! The configuration file: one optional TOML file in which every key has a default.
//!
//! Unknown keys are errors that name the key (serde's `deny_unknown_fields`); everything the
//! parser cannot check (names, ranges, combinations) is checked by [`Config::validate`], whose
//! errors name the block and key. Secrets are never part of the config.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use fleet_core::coord::{default_coord_id, validate_coord_id};
use fleet_core::entity::validate_name;
use fleet_core::message::DEFAULT_MAX_MESSAGE_BYTES;
use serde::Deserialize;

mod architects;
mod family;
mod federation;
mod profile;
#[cfg(test)]
mod readme;

pub use architects::{ArchitectsConfig, SlotConfig};
pub use family::{Family, families, family, model_identity};
pub use federation::{
    BrokerConfig, CoordinatorConfig, FederationConfig, PinnedEntry, TrustEntry, redacted_uri,
};
pub use profile::{
    CLAUDE_CREDENTIALS, OnStall, PermissionMode, ProfileConfig, ProfileEnv, ProfileKind, ReadyCall,
    SANDBOX_PLACEHOLDERS,
};

/// The default address of the MCP endpoint: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8765";
/// The name of the lead fleetd declares when the config declares none.
pub const DEFAULT_LEAD: &str = "lead";
/// The name of the built-in profile when the config declares none: the scripted test agent.
pub const DEFAULT_PROFILE: &str = "sim";
/// The scripted test agent's binary, looked up beside fleetd's own, then on `PATH`.
pub const SIM_BINARY: &str = "fleet-agent-sim";
/// How many days settled messages are kept, by default.
const DEFAULT_KEEP_MESSAGES_DAYS: u64 = 7;
/// Why a gateway with a broker and nobody to trust does not start.
const UNTRUSTED: &str = "[broker] is set but [federation.trust] pins no host, so every message off the broker would be refused: run `fleetd key` on each host and pin its key here (hostb = \"ed25519:…\" under [federation.trust]); for a lab only, [federation] insecure_unsigned = true takes unsigned messages instead";
/// Why a gateway with a coordinator and nobody to trust does not start.
const UNTRUSTED_COORDINATOR: &str = "[coordinator] is set but [federation.trust] pins no host, so every coordination message would be refused: pin the other leads' gateways' keys (`fleetd key` on each) under [federation.trust]; for a lab only, [federation] insecure_unsigned = true takes unsigned ones instead";
/// The least time between two nudges into a lead's pane, by default.
const DEFAULT_NUDGE_INTERVAL_S: u64 = 30;
/// Claude Code's empty input box: `❯` and a no-break space.
pub const CLAUDE_EMPTY_INPUT: &str = "❯\u{a0}";
/// The longest any configured wait may be, in seconds (a day): longer is a typo.
pub(crate) const MAX_CONFIG_WAIT_S: u64 = 86_400;
/// How long a lead's pane must hold still to count as idle for a nudge, by default.
const DEFAULT_NUDGE_QUIET_MS: u64 = 1_000;
/// How many messages may wait for one recipient, by default: as many as its inbox on the
/// broker holds (`federation.inbox_max_length`), far more than a lead reads in a sitting or a
/// worker works through, and at the default message size at most 256 MiB of disk per recipient.
const DEFAULT_MAX_HELD_PER_RECIPIENT: usize = 1_000;
/// How many long calls one caller may have open at once, by default: a lead fanning out to a
/// large fleet keeps one open send per worker plus a poll; a client that loops on calls that
/// never return is held there.
const DEFAULT_MAX_LONG_CALLS_PER_CALLER: usize = 32;
/// How many live MCP sessions one token may hold, by default: a client keeps one, and one more
/// per reconnect while the abandoned one lingers (rmcp closes an idle session after 5 min).
const DEFAULT_MAX_SESSIONS_PER_TOKEN: usize = 16;
/// How many connections fleetd holds open at once, by default: far more than a fleet's leads,
/// workers, operators and browsers keep (each keeps one or two), and few enough that a flood
/// cannot reach the open-file limit (fleetd keeps a reserve for its store, panes and broker).
const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// How long a new connection may take to send its first request's head, by default: a client
/// sends it at once; a connection that sends nothing, or drips its headers, is closed.
const DEFAULT_HEADER_TIMEOUT_S: u64 = 10;
/// How long a connection may sit between two requests, by default (and the most a later
/// request's head may take): a client that comes back later opens a new one.
const DEFAULT_IDLE_TIMEOUT_S: u64 = 60;
/// How many event streams (`/api/v1/events`, MCP's GET stream) one token may hold open at once,
/// by default: a web view or two and a lead's MCP client, with room for tabs.
const DEFAULT_MAX_STREAMS_PER_TOKEN: usize = 8;
/// How long fleetd drains after a stop signal before it exits anyway, by default: long enough
/// to close every pane and tell the senders, short enough that a service manager never waits
/// on a wedged drain.
const DEFAULT_DRAIN_TIMEOUT_S: u64 = 20;
/// How long the fleet may run without its gateway and still be taken back, by default: an
/// hour (a restart, an upgrade, a crash and its service manager's restart all fit well).
const DEFAULT_ADOPT_WITHIN_S: u64 = 3_600;
/// The longest `adopt_within_s` may be: a week.
const MAX_ADOPT_WITHIN_S: u64 = 7 * 86_400;
/// The largest cap a count key takes: more is a typo.
const MAX_COUNT_CAP: u64 = 1_000_000;

/// A configuration problem, naming the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (toml's message names the key and line).
    #[error("config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What toml said.
        message: String,
    },
    /// A value is out of bounds or inconsistent with another.
    #[error("config {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        message: String,
    },
}

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// This host's gateway.
    pub gateway: GatewayConfig,
    /// The terminal multiplexer.
    pub mux: MuxConfig,
    /// Human-driven leads, by name.
    pub leads: BTreeMap<String, LeadConfig>,
    /// People and scrapers who may look at the fleet through the operator surfaces (and stop
    /// its workers, unless read-only), by name: never a lead, never given a message's text.
    pub operators: BTreeMap<String, OperatorConfig>,
    /// Worker profiles.
    pub profiles: Vec<ProfileConfig>,
    /// The advisory architects' slots (`fleet_consult`).
    pub architects: ArchitectsConfig,
    /// The broker of the federated plane; none: a single-host gateway.
    pub broker: Option<BrokerConfig>,
    /// Lead-to-lead coordination; none: the leads have no coordination ids.
    pub coordinator: Option<CoordinatorConfig>,
    /// Presence, receipts and inbox caps of the federated plane.
    pub federation: FederationConfig,
}

/// `[gateway]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// This host's id in the fleet; the machine's hostname when unset.
    pub host_id: Option<String>,
    /// Where the MCP endpoint listens.
    pub listen: SocketAddr,
    /// The MCP URL handed to workers; `http://<listen>/mcp` when unset.
    pub advertise_url: Option<String>,
    /// The state dir; `$XDG_STATE_HOME/fleetd` (or `~/.local/state/fleetd`) when unset.
    pub state_dir: Option<PathBuf>,
    /// The largest message body accepted, in bytes.
    pub max_message_bytes: usize,
    /// How many days a message is kept after the end of its life (delivered, consumed or
    /// failed); pending ones are kept however old.
    pub keep_messages_days: u64,
    /// The directories workers may work under (`~` is the home); empty: anywhere but fleetd's
    /// state dir and what holds it.
    pub workdir_roots: Vec<PathBuf>,
    /// The most messages that may wait for one recipient (held for its pull or queued for its
    /// pane), so that a flood fills no disk: one more is refused to its sender, `too_many`
    /// (off the broker: dead-lettered and its sender told); notices about the recipient's own
    /// messages have a reserve as large (see `fleet_core::bounds::admit_waiting`).
    pub max_held_per_recipient: usize,
    /// The most long calls (`fleet_send` or `fleet_poll` with a wait, `fleet_ask`,
    /// `fleet_spawn`) one caller may have open at once; one more fails `too_many`.
    pub max_long_calls_per_caller: usize,
    /// The most live MCP sessions (the older `Mcp-Session-Id` protocol) one token may hold;
    /// over the cap, the token's least recently used session with no call in flight is closed.
    pub max_sessions_per_token: usize,
    /// The most connections open at once; over it, the oldest connection that has not yet
    /// authenticated is closed for the new one, or (none such) the new one is refused `503`.
    pub max_connections: usize,
    /// How long a new connection may take to send its first request's head, in seconds.
    pub header_timeout_s: u64,
    /// How long a connection may sit between requests (and a later request's head may take),
    /// in seconds.
    pub idle_timeout_s: u64,
    /// The most event streams (`/api/v1/events`, MCP's GET stream) one token may hold open.
    pub max_streams_per_token: usize,
    /// How long fleetd drains after a stop signal (open calls end, panes close) before it
    /// exits anyway, in seconds.
    pub drain_timeout_s: u64,
    /// Whether the text of tasks, replies, screens, dialogs and last words may be logged, at
    /// TRACE only (`RUST_LOG=fleetd=trace`); off, the log shows a length and a digest.
    pub log_text: bool,
    /// What fleetd's exit does to its workers: `keep` (a stop signal or a crash) leaves them
    /// running for the next start to take back; `stop` ends them and closes their panes.
    /// `fleetd serve --stop-workers` stops them whatever this says.
    pub on_exit: OnExit,
    /// The longest the fleet may have run without its gateway and still be taken back at the
    /// next start, in seconds; a start after a longer absence ends what it finds (and tells
    /// the senders of what those held). 0: a start takes nothing back.
    pub adopt_within_s: u64,
}

/// `[gateway] on_exit`: what fleetd's exit does to its workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnExit {
    /// They keep running, for the next start to take back.
    #[default]
    Keep,
    /// They are stopped and their panes closed.
    Stop,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            host_id: None,
            listen: DEFAULT_LISTEN
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8765))),
            advertise_url: None,
            state_dir: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            keep_messages_days: DEFAULT_KEEP_MESSAGES_DAYS,
            workdir_roots: Vec::new(),
            max_held_per_recipient: DEFAULT_MAX_HELD_PER_RECIPIENT,
            max_long_calls_per_caller: DEFAULT_MAX_LONG_CALLS_PER_CALLER,
            max_sessions_per_token: DEFAULT_MAX_SESSIONS_PER_TOKEN,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout_s: DEFAULT_HEADER_TIMEOUT_S,
            idle_timeout_s: DEFAULT_IDLE_TIMEOUT_S,
            max_streams_per_token: DEFAULT_MAX_STREAMS_PER_TOKEN,
            drain_timeout_s: DEFAULT_DRAIN_TIMEOUT_S,
            log_text: false,
            on_exit: OnExit::Keep,
            adopt_within_s: DEFAULT_ADOPT_WITHIN_S,
        }
    }
}

/// Which multiplexer holds the panes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MuxKind {
    /// A private tmux server.
    #[default]
    Tmux,
    /// A herdr server (the one fleetd runs in, or one named by socket or session).
    Herdr,
}

/// The label of the herdr workspace that holds the fleet's panes, by default.
pub const DEFAULT_HERDR_WORKSPACE: &str = "fleet";

/// `[mux]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MuxConfig {
    /// The multiplexer; unset: the one fleetd runs inside (herdr or tmux), else tmux.
    pub kind: Option<MuxKind>,
    /// tmux: the private server's socket name (`tmux -L`), derived from the state dir when
    /// unset so two gateways never share a server. herdr: the server's socket path.
    pub socket: Option<String>,
    /// herdr: the session name (`herdr --session NAME`), instead of a socket path.
    pub session: Option<String>,
    /// herdr: the label of the fleet's workspace, which prefixes its panes' labels too.
    pub workspace: String,
    /// tmux: the panes one private server holds before new ones go to another (each server
    /// walks all its panes on every keystroke and look); unset: [`DEFAULT_PANES_PER_SERVER`].
    pub panes_per_server: Option<usize>,
}

/// The panes one private tmux server holds by default.
pub const DEFAULT_PANES_PER_SERVER: usize = 16;

impl Default for MuxConfig {
    fn default() -> Self {
        Self {
            kind: None,
            socket: None,
            session: None,
            workspace: DEFAULT_HERDR_WORKSPACE.into(),
            panes_per_server: None,
        }
    }
}

/// `[leads.NAME]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeadConfig {
    /// Broadcast groups.
    pub groups: Vec<String>,
    /// Whether to type a nudge into the lead's pane when replies wait for it.
    pub nudge: bool,
    /// The least time between two nudges.
    pub nudge_interval_s: u64,
    /// How long the lead's pane must hold still to count as idle.
    pub nudge_quiet_ms: u64,
    /// What the lead's empty input box shows (Claude Code's: `❯` and a no-break space): a nudge
    /// is typed only while it is on screen, so a human's half-typed draft is never submitted
    /// with it. Empty: no such check.
    pub empty_input_marker: String,
    /// The lead's coordination id (needs `[coordinator]`); `coordinator.coord_id` for a
    /// gateway's one lead, else `<lead>@<host id>`, when unset.
    pub coord_id: Option<String>,
    /// The leads every worker it spawns is shared with (`name` of this host, `name@host` of
    /// another), besides those its `fleet_spawn{share}` names: they may send those workers
    /// tasks, never see their owner's text.
    pub share: Vec<String>,
}

/// `[operators.NAME]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorConfig {
    /// May only read (a scraper's token): no stop.
    pub read_only: bool,
}

impl Default for LeadConfig {
    fn default() -> Self {
        Self {
            groups: Vec::new(),
            nudge: true,
            nudge_interval_s: DEFAULT_NUDGE_INTERVAL_S,
            nudge_quiet_ms: DEFAULT_NUDGE_QUIET_MS,
            empty_input_marker: CLAUDE_EMPTY_INPUT.into(),
            coord_id: None,
            share: Vec::new(),
        }
    }
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and validates `text` (read from `path`, which errors name).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: parse_error(text, &e),
        })?;
        config.validate().map_err(|message| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        })?;
        config.fill_defaults();
        Ok(config)
    }

    /// The embedded defaults, used when there is no file.
    pub fn embedded() -> Self {
        let mut config = Config::default();
        config.fill_defaults();
        config
    }

    /// Declares the default lead and profile where the file declares none.
    fn fill_defaults(&mut self) {
        if self.leads.is_empty() {
            self.leads
                .insert(DEFAULT_LEAD.into(), LeadConfig::default());
        }
        if self.profiles.is_empty() {
            self.profiles.push(ProfileConfig::command(
                DEFAULT_PROFILE,
                vec![sim_binary().display().to_string()],
            ));
        }
    }

    fn validate(&self) -> Result<(), String> {
        self.validate_gateway()?;
        self.validate_mux()?;
        self.validate_people()?;
        let untrusted = self.federation.trust.is_empty() && !self.federation.insecure_unsigned;
        if let Some(broker) = &self.broker {
            broker.validate("broker")?;
            if untrusted {
                return Err(UNTRUSTED.into());
            }
        }
        self.validate_coordination(untrusted)?;
        self.federation.validate()?;
        self.validate_profiles()?;
        if self.broker.is_none()
            && let Some(far) = self.architects.slots.iter().find(|s| {
                s.host
                    .as_deref()
                    .is_some_and(|h| Some(h) != self.gateway.host_id.as_deref())
            })
        {
            return Err(format!(
                "architects.slots '{}' is on host '{}', which only the control plane reaches: configure [broker], or drop the slot's host",
                far.name,
                far.host.as_deref().unwrap_or_default()
            ));
        }
        let leads = self.leads.keys().map(String::as_str).collect();
        self.architects
            .validate(&self.profiles, self.gateway.host_id.as_deref(), &leads)?;
        Ok(())
    }

    /// `[gateway]`: its host id, caps and timeouts, and its advertised URL.
    fn validate_gateway(&self) -> Result<(), String> {
        if let Some(host) = &self.gateway.host_id {
            validate_name("gateway.host_id", host).map_err(|e| e.message)?;
        }
        if self.gateway.max_message_bytes == 0 {
            return Err("gateway.max_message_bytes must be at least 1".into());
        }
        within(
            "gateway.keep_messages_days",
            self.gateway.keep_messages_days,
            1,
            3650,
        )?;
        for (key, cap) in [
            (
                "gateway.max_held_per_recipient",
                self.gateway.max_held_per_recipient,
            ),
            (
                "gateway.max_long_calls_per_caller",
                self.gateway.max_long_calls_per_caller,
            ),
            (
                "gateway.max_sessions_per_token",
                self.gateway.max_sessions_per_token,
            ),
            ("gateway.max_connections", self.gateway.max_connections),
            (
                "gateway.max_streams_per_token",
                self.gateway.max_streams_per_token,
            ),
        ] {
            within(
                key,
                u64::try_from(cap).unwrap_or(u64::MAX),
                1,
                MAX_COUNT_CAP,
            )?;
        }
        within(
            "gateway.header_timeout_s",
            self.gateway.header_timeout_s,
            1,
            MAX_CONFIG_WAIT_S,
        )?;
        within(
            "gateway.idle_timeout_s",
            self.gateway.idle_timeout_s,
            1,
            MAX_CONFIG_WAIT_S,
        )?;
        if self.gateway.idle_timeout_s < self.gateway.header_timeout_s {
            return Err(format!(
                "gateway.idle_timeout_s ({}) must be at least gateway.header_timeout_s ({}): a connection waiting for its next request's head waits no longer than the first",
                self.gateway.idle_timeout_s, self.gateway.header_timeout_s
            ));
        }
        within(
            "gateway.adopt_within_s",
            self.gateway.adopt_within_s,
            0,
            MAX_ADOPT_WITHIN_S,
        )?;
        within(
            "gateway.drain_timeout_s",
            self.gateway.drain_timeout_s,
            1,
            MAX_CONFIG_WAIT_S,
        )?;
        if let Some(url) = &self.gateway.advertise_url {
            let parsed = url::Url::parse(url)
                .map_err(|e| format!("gateway.advertise_url '{url}' is not a URL: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(format!(
                    "gateway.advertise_url '{url}' must be an http:// or https:// URL with a host"
                ));
            }
        }
        Ok(())
    }

    /// `[mux]`: a socket, session and workspace each of the pane host's kind.
    fn validate_mux(&self) -> Result<(), String> {
        let named = |what: &str, name: &str| validate_name(what, name).map_err(|e| e.message);
        let herdr = self.mux.kind == Some(MuxKind::Herdr);
        if let Some(socket) = &self.mux.socket
            && !herdr
        {
            named(
                "mux.socket (a tmux socket name; a path needs kind = \"herdr\")",
                socket,
            )?;
        }
        if let Some(session) = &self.mux.session {
            if self.mux.kind == Some(MuxKind::Tmux) {
                return Err("mux.session names a herdr session; it needs kind = \"herdr\"".into());
            }
            named("mux.session", session)?;
        }
        named("mux.workspace", &self.mux.workspace)?;
        match self.mux.panes_per_server {
            Some(_) if herdr => Err(
                "mux.panes_per_server spreads panes over tmux servers; it needs kind = \"tmux\""
                    .into(),
            ),
            Some(n) => within(
                "mux.panes_per_server",
                u64::try_from(n).unwrap_or(u64::MAX),
                1,
                100_000,
            ),
            None => Ok(()),
        }
    }

    /// `[leads]` and `[operators]`: their names, groups, nudges and shares, and no name both.
    fn validate_people(&self) -> Result<(), String> {
        let named = |what: &str, name: &str| validate_name(what, name).map_err(|e| e.message);
        for (name, lead) in &self.leads {
            named("lead", name)?;
            for group in &lead.groups {
                named(&format!("leads.{name}.groups entry"), group)?;
            }
            within(
                &format!("leads.{name}.nudge_interval_s"),
                lead.nudge_interval_s,
                1,
                MAX_CONFIG_WAIT_S,
            )?;
            within(
                &format!("leads.{name}.nudge_quiet_ms"),
                lead.nudge_quiet_ms,
                0,
                MAX_CONFIG_WAIT_S * 1000,
            )?;
            fleet_core::ownership::parse_shares(
                lead.share.iter().map(String::as_str),
                self.gateway.host_id.as_deref().unwrap_or("localhost"),
            )
            .map_err(|e| format!("leads.{name}.share: {}", e.message))?;
        }
        for name in self.operators.keys() {
            named("operator", name)?;
            // With no lead declared, the default one is.
            let lead = self.leads.contains_key(name)
                || (self.leads.is_empty() && name.as_str() == DEFAULT_LEAD);
            if lead {
                return Err(format!(
                    "'{name}' is a lead and an operator: a token is one or the other, so give the operator another name"
                ));
            }
        }
        Ok(())
    }

    /// `[[profiles]]`: each valid, declared once, and its workspace inside the work roots
    /// when they are set.
    fn validate_profiles(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for profile in &self.profiles {
            profile.validate()?;
            if !seen.insert(profile.name.as_str()) {
                return Err(format!("profile '{}' is declared twice", profile.name));
            }
            // A worker runs in its workspace: with roots set, that must be inside one.
            let roots = &self.gateway.workdir_roots;
            let inside = |root: &std::path::Path| roots.iter().any(|r| root.starts_with(r));
            if !roots.is_empty()
                && !profile.workspace.is_empty()
                && !profile.workspace_root.as_deref().is_some_and(inside)
            {
                return Err(format!(
                    "profiles '{}': with gateway.workdir_roots set, workspace_root must be set to a directory inside one of them (workers run in their workspaces, which go under the state dir otherwise)",
                    profile.name
                ));
            }
        }
        Ok(())
    }

    /// `[coordinator]` and the leads' coordination ids (the defaults, which need the host id,
    /// are checked by [`Config::coord_ids`]).
    fn validate_coordination(&self, untrusted: bool) -> Result<(), String> {
        let coord_id = |what: &str, id: &str| validate_coord_id(what, id).map_err(|e| e.message);
        let explicit = self
            .leads
            .iter()
            .filter_map(|(name, lead)| lead.coord_id.as_deref().map(|id| (name, id)));
        let Some(coordinator) = &self.coordinator else {
            return match explicit.map(|(name, _)| name).next() {
                Some(name) => Err(format!(
                    "leads.{name}.coord_id is set, but there is no [coordinator] block to coordinate on"
                )),
                None => Ok(()),
            };
        };
        coordinator.link.validate("coordinator")?;
        if untrusted {
            return Err(UNTRUSTED_COORDINATOR.into());
        }
        for (name, id) in explicit {
            coord_id(&format!("leads.{name}.coord_id"), id)?;
        }
        if let Some(id) = &coordinator.coord_id {
            coord_id("coordinator.coord_id", id)?;
            if self.leads.len() > 1 {
                return Err(format!(
                    "coordinator.coord_id '{id}' names the mailbox of a gateway's one lead, and this one declares {}: give each lead its own in [leads.NAME] coord_id",
                    self.leads.len()
                ));
            }
        }
        Ok(())
    }

    /// The coordination id of each lead (by name) of the gateway of host `host`: none without
    /// `[coordinator]`; else its own `coord_id`, or `coordinator.coord_id` for the one lead,
    /// or `<lead>@<host>`. Two leads with one id are an error naming both.
    pub fn coord_ids(&self, host: &str) -> Result<BTreeMap<String, String>, String> {
        let Some(coordinator) = &self.coordinator else {
            return Ok(BTreeMap::new());
        };
        let mut ids = BTreeMap::new();
        let mut owners: BTreeMap<String, &str> = BTreeMap::new();
        for (name, lead) in &self.leads {
            let id = lead
                .coord_id
                .clone()
                .or_else(|| coordinator.coord_id.clone())
                .unwrap_or_else(|| default_coord_id(name, host));
            validate_coord_id(&format!("the coordination id of lead '{name}'"), &id)
                .map_err(|e| e.message)?;
            if let Some(other) = owners.insert(id.clone(), name) {
                return Err(format!(
                    "leads '{other}' and '{name}' have one coordination id, '{id}': set [leads.NAME] coord_id apart"
                ));
            }
            ids.insert(name.clone(), id);
        }
        Ok(ids)
    }

    /// What only `serve` can check, with fleetd's environment at hand (`fleetd_env`): every
    /// profile with an isolated home has a login (see [`ProfileConfig::check_login`]).
    pub fn check_logins(&self, fleetd_env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
        self.profiles
            .iter()
            .try_for_each(|profile| profile.check_login(fleetd_env))
    }

    /// The profile called `name`.
    pub fn profile(&self, name: &str) -> Option<&ProfileConfig> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// toml's error as where (line, column, and the key the line sets) and what, without the line
/// itself, which toml quotes: its value may be the broker's password or an API key.
fn parse_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim();
    let Some(span) = e.span() else {
        return what.to_string();
    };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .unwrap_or_default()
        .chars()
        .count()
        + 1;
    let key = text
        .lines()
        .nth(line - 1)
        .and_then(|l| l.split_once('='))
        .map(|(key, _)| format!(" ({} = …)", key.trim()))
        .unwrap_or_default();
    format!("line {line}, column {column}{key}: {what}")
}

/// Checks that `value` (the key `what`) lies in `min..=max`.
pub(crate) fn within(what: &str, value: u64, min: u64, max: u64) -> Result<(), String> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{what} is {value}; it must be between {min} and {max}"
        ))
    }
}

/// Where the scripted test agent is: beside this executable if it is there, else on `PATH`.
fn sim_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(SIM_BINARY)))
        .filter(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from(SIM_BINARY))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("test.toml"), text)
    }

    #[test]
    fn an_empty_file_is_all_defaults() {
        let config = parse("").unwrap();
        assert_eq!(config.gateway.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(config.gateway.max_message_bytes, 256 * 1024);
        assert!(config.leads.contains_key(DEFAULT_LEAD));
        assert!(config.profile(DEFAULT_PROFILE).is_some());
        assert_eq!(config.mux.kind, None);
        assert_eq!(config.mux.workspace, DEFAULT_HERDR_WORKSPACE);
    }

    #[test]
    fn operators_are_named_apart_from_the_leads() {
        let config = parse("[operators.ops]\n[operators.prom]\nread_only = true\n").unwrap();
        assert!(!config.operators["ops"].read_only);
        assert!(config.operators["prom"].read_only);
        for (text, says) in [
            (
                "[leads.ops]\n[operators.ops]\n",
                "'ops' is a lead and an operator",
            ),
            ("[operators.lead]\n", "'lead' is a lead and an operator"),
            ("[operators.\"a b\"]\n", "operator"),
            ("[operators.ops]\nstop = true\n", "stop"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_full_file_parses() {
        let config = parse(
            r#"
            [gateway]
            host_id = "laptop"
            listen = "127.0.0.1:9000"
            advertise_url = "http://127.0.0.1:9000/mcp"
            max_message_bytes = 1000
            [mux]
            kind = "tmux"
            socket = "fleet-x"
            [leads.alice]
            groups = ["core"]
            nudge_interval_s = 5
            [[profiles]]
            name = "echo"
            kind = "command"
            argv = ["fleet-agent-sim", "--mode", "echo"]
            env = { RUST_LOG = "info" }
            groups = ["core"]
            ready_timeout_s = 5
            enter_pause_ms = 10
            "#,
        )
        .unwrap();
        assert_eq!(config.gateway.host_id.as_deref(), Some("laptop"));
        assert_eq!(config.leads["alice"].nudge_interval_s, 5);
        assert!(!config.leads.contains_key(DEFAULT_LEAD));
        let echo = config.profile("echo").unwrap();
        assert_eq!(echo.argv[2], "echo");
        assert_eq!(echo.submit_verify_ms, profile::DEFAULT_SUBMIT_VERIFY_MS);
        assert!(config.profile(DEFAULT_PROFILE).is_none());
    }

    #[test]
    fn a_permission_mode_is_claude_codes_and_one_it_knows() {
        let mode = |text: &str| {
            parse(&format!(
                "[[profiles]]\nname = \"c\"\nkind = \"claude-code\"\npermission_mode = \"{text}\"\n"
            ))
            .map(|c| c.profile("c").and_then(|p| p.permission_mode))
        };
        assert_eq!(
            mode("acceptEdits").unwrap(),
            Some(PermissionMode::AcceptEdits)
        );
        assert_eq!(mode("default").unwrap(), Some(PermissionMode::Manual));
        assert_eq!(
            mode("dontAsk").unwrap().map(PermissionMode::as_str),
            Some("dontAsk")
        );
        let err = mode("yolo").unwrap_err().to_string();
        assert!(err.contains("yolo") && err.contains("acceptEdits"), "{err}");
        let err =
            parse("[[profiles]]\nname = \"o\"\nkind = \"opencode\"\npermission_mode = \"plan\"\n")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("permission_mode applies to claude-code"),
            "{err}"
        );
    }

    #[test]
    fn dialog_markers_come_from_the_kind_unless_the_profile_names_its_own() {
        let config = parse(
            r#"
            [[profiles]]
            name = "claude"
            kind = "claude-code"
            [[profiles]]
            name = "quiet"
            kind = "claude-code"
            blocked_markers = []
            [[profiles]]
            name = "tool"
            kind = "command"
            argv = ["my-tool"]
            blocked_markers = ["Overwrite? [y/n]"]
            stall_after_s = 300
            on_stall = "recycle"
            "#,
        )
        .unwrap();
        let markers = |name: &str| config.profile(name).unwrap().dialog_markers();
        assert!(markers("claude").contains(&"Do you want to proceed?".to_string()));
        assert!(markers("quiet").is_empty());
        assert_eq!(markers("tool"), ["Overwrite? [y/n]"]);
        let tool = config.profile("tool").unwrap();
        assert_eq!(
            (tool.stall_after_s, tool.on_stall),
            (Some(300), OnStall::Recycle)
        );
        assert_eq!(config.profile("claude").unwrap().on_stall, OnStall::Notify);
        let over = |name: &str| config.profile(name).unwrap().turn_over_markers();
        assert!(
            over("claude").contains(&"Interrupted · What should Claude do instead?".to_string())
        );
        assert!(over("tool").is_empty());
        for (bad, says) in [
            (
                "turn_over_markers = [\"  \"]",
                "turn_over_markers[0] must hold some text",
            ),
            (
                "turn_over_markers = [\"a\\u001b[2Jb\"]",
                "turn_over_markers[0] holds",
            ),
            ("turn_over_markers = \"Interrupted\"", "turn_over_markers"),
            (
                "blocked_markers = [\"\"]",
                "blocked_markers[0] must hold some text",
            ),
            ("blocked_markers = [\"a\\nb\"]", "blocked_markers[0] holds"),
            ("on_stall = \"recycle\"", "needs stall_after_s"),
            ("stall_after_s = 0", "stall_after_s"),
            ("on_stall = \"kill\"", "kill"),
            (
                "blocked_markers = [\"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\"]",
                "at most 32",
            ),
        ] {
            let err = parse(&format!(
                "[[profiles]]\nname = \"t\"\nkind = \"command\"\nargv = [\"x\"]\n{bad}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn a_workspace_template_names_a_program_and_known_placeholders() {
        let profile = |keys: &str| {
            parse(&format!(
                "[[profiles]]\nname = \"t\"\nkind = \"command\"\nargv = [\"x\"]\n{keys}\n"
            ))
        };
        let config = profile(
            "workspace = [\"git\", \"-C\", \"{cwd}\", \"worktree\", \"add\", \"{dir}\", \"-b\", \"fleet/{name}-{gid}\"]\nworkspace_teardown = [\"git\", \"worktree\", \"remove\", \"{dir}\"]\nworkspace_root = \"/srv/spaces\"",
        )
        .unwrap();
        let t = config.profile("t").unwrap();
        assert_eq!(t.workspace[7], "fleet/{name}-{gid}");
        assert_eq!(t.workspace_root.as_deref(), Some(Path::new("/srv/spaces")));
        for (keys, says) in [
            (
                "workspace = [\"cp\", \"-r\", \"{cwd}\", \"{token}\"]",
                "unknown placeholder {token}",
            ),
            (
                "workspace_teardown = [\"rm\", \"{dir}\"]",
                "need a workspace",
            ),
            ("workspace = [\"\"]", "workspace must name a program"),
            ("workspace = [\"cp\", \"a\\nb\"]", "workspace[1] holds"),
            (
                "workspace = [\"x\"]\nworkspace_root = \"rel\"",
                "absolute path",
            ),
        ] {
            let err = profile(keys).unwrap_err().to_string();
            assert!(err.contains(says), "{keys}: {err}");
        }
    }

    #[test]
    fn with_workdir_roots_a_workspace_root_must_be_inside_one() {
        let config = |root: &str| {
            parse(&format!(
                "[gateway]\nworkdir_roots = [\"/srv/code\"]\n[[profiles]]\nname = \"t\"\nkind = \"command\"\nargv = [\"x\"]\nworkspace = [\"mkdir\", \"{{dir}}\"]\n{root}\n"
            ))
        };
        assert!(config("workspace_root = \"/srv/code/spaces\"").is_ok());
        for root in ["", "workspace_root = \"/tmp/spaces\""] {
            let err = config(root).unwrap_err().to_string();
            assert!(err.contains("inside one of them"), "{root}: {err}");
        }
    }

    #[test]
    fn agent_kinds_bring_their_programs_and_screen_habits() {
        let config = parse(
            r#"
            [[profiles]]
            name = "claude"
            kind = "claude-code"
            base_url = "http://127.0.0.1:4000"
            idle_ttl_s = 1800
            context_cap = 20
            [[profiles]]
            name = "oc"
            kind = "opencode"
            [[profiles]]
            name = "box"
            kind = "sandbox"
            role = "backend"
            image = "fleet/backend:latest"
            runtime = ["docker", "run", "--rm", "-it", "--name", "{name}", "-e", "FLEET_TOKEN", "{image}"]
            teardown = ["docker", "rm", "-f", "{name}"]
            agent_kind = "claude-code"
            "#,
        )
        .unwrap();
        let claude = config.profile("claude").unwrap();
        assert_eq!(claude.program(), ["claude"]);
        assert_eq!(claude.enter_pause().as_millis(), 300);
        assert_eq!(
            claude.submitted_marker().as_deref(),
            Some(CLAUDE_EMPTY_INPUT)
        );
        assert_eq!(claude.idle_ttl().map(|t| t.as_secs()), Some(1800));
        let opencode = config.profile("oc").unwrap();
        assert_eq!(opencode.program(), ["opencode"]);
        assert_eq!(opencode.ready_marker().as_deref(), Some("Ask anything"));
        assert_eq!(opencode.ready_call(), ReadyCall::None);
        assert_eq!(claude.ready_call(), ReadyCall::ToolList);
        let sandboxed = config.profile("box").unwrap();
        assert_eq!(sandboxed.program(), ["claude"]);
        assert_eq!(
            sandboxed.submitted_marker().as_deref(),
            Some(CLAUDE_EMPTY_INPUT)
        );
        // What fleet_list shows a worker of each runs in.
        assert_eq!(sandboxed.sandbox().as_deref(), Some("docker"));
        assert_eq!(claude.sandbox(), None);
        let mut bwrap = sandboxed.clone();
        bwrap.runtime = vec!["/usr/bin/bwrap".into(), "--".into()];
        assert_eq!(bwrap.sandbox().as_deref(), Some("bwrap"));
        let command = ProfileConfig::command("c", vec!["x".into()]);
        assert_eq!(command.enter_pause().as_millis(), 0);
        assert_eq!(command.submitted_marker(), None);
        assert_eq!(command.sandbox(), None);
    }

    #[test]
    fn debug_masks_the_broker_password_and_profile_env_values() {
        let config = parse(
            r#"
            [broker]
            uri = "amqp://gw:pa55word@broker.internal:5672/fleet"
            [federation]
            insecure_unsigned = true
            [[profiles]]
            name = "claude"
            kind = "claude-code"
            env = { ANTHROPIC_API_KEY = "sk-ant-api03-s3cret", RUST_LOG = "info" }
            "#,
        )
        .unwrap();
        for shown in [format!("{config:?}"), format!("{config:#?}")] {
            assert!(!shown.contains("pa55word"), "{shown}");
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(
                shown.contains("amqp://gw:***@broker.internal:5672/fleet"),
                "{shown}"
            );
            assert!(shown.contains("ANTHROPIC_API_KEY"), "{shown}");
        }
        // The values are all still there for the launch.
        let claude = config.profile("claude").unwrap();
        assert_eq!(claude.env["ANTHROPIC_API_KEY"], "sk-ant-api03-s3cret");
        assert_eq!(redacted_uri("amqp://gw@b/fleet"), "amqp://gw@b/fleet");
        assert_eq!(redacted_uri("amqp://:p%40ss@b/"), "amqp://:***@b/");
        assert_eq!(redacted_uri("not a uri pa55word"), "(not a URI)");
    }

    /// A public key to pin in a test: of the seed `seed` × 32.
    fn pinned(seed: u8) -> String {
        fleet_core::signing::key_text(
            &fleet_core::signing::SigningKey::from_bytes(&[seed; 32]).verifying_key(),
        )
    }

    #[test]
    fn a_broker_needs_a_trust_table_or_an_explicit_insecure_lab() {
        let err = parse("[broker]\nuri = \"amqp://b/fleet\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("[federation.trust] pins no host"), "{err}");
        assert!(err.contains("fleetd key"), "{err}");
        let lab =
            parse("[broker]\nuri = \"amqp://b/fleet\"\n[federation]\ninsecure_unsigned = true\n")
                .unwrap();
        assert!(lab.federation.insecure_unsigned);
        // Without a broker nothing is needed.
        assert!(parse("").unwrap().federation.trust.is_empty());
    }

    #[test]
    fn a_host_is_pinned_to_one_key_two_while_it_rotates_and_optionally_a_login() {
        let (k1, k2, k3) = (pinned(1), pinned(2), pinned(3));
        let config = parse(&format!(
            "[broker]\nuri = \"amqp://b/fleet\"\n[federation.trust]\nhostb = \"{k1}\"\nhostc = [\"{k1}\", \"{k2}\"]\n[federation.trust.hostd]\nkeys = [\"{k3}\"]\nlogin = \"gw-hostd\"\n"
        ))
        .unwrap();
        assert_eq!(config.federation.trust_table().unwrap().len(), 3);
        for (trust, wrong) in [
            ("hostb = []".to_string(), "lists 0 keys"),
            (
                format!("hostb = [\"{k1}\", \"{k2}\", \"{k3}\"]"),
                "lists 3 keys",
            ),
            (
                "hostb = \"ed25519:AAAA\"".to_string(),
                "federation.trust.hostb",
            ),
            (format!("\"bad host\" = \"{k1}\""), "bad host"),
            (
                format!("hostb = {{ keys = [\"{k1}\"], login = \"\" }}"),
                "federation.trust.hostb.login",
            ),
            (
                format!("hostb = {{ keys = [\"{k1}\"], user = \"x\" }}"),
                "a host's pinned key",
            ),
        ] {
            let err = parse(&format!(
                "[broker]\nuri = \"amqp://b/fleet\"\n[federation.trust]\n{trust}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains(wrong), "{trust}: {err}");
        }
    }

    #[test]
    fn the_message_window_covers_the_time_a_message_may_wait_in_an_inbox() {
        let err = parse("[federation]\ninbox_message_ttl_s = 100\nmax_message_age_s = 99\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("federation.max_message_age_s"), "{err}");
        let ok = parse(
            "[federation]\ninbox_message_ttl_s = 100\nmax_message_age_s = 100\nclock_skew_s = 0\n",
        )
        .unwrap();
        assert_eq!(ok.federation.max_message_age_s, 100);
    }

    #[test]
    fn a_syntax_error_says_where_without_quoting_the_line() {
        let err = parse("[broker]\nuri = \"amqp://gw:pa55word@b/fleet\" heartbeat_s = 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("config test.toml: line 2, column 36 (uri = …): "),
            "{err}"
        );
        assert!(!err.contains("pa55word"), "{err}");
        let err = parse("[gateway]\nlisten_on = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2, column 1 (listen_on = …): unknown field `listen_on`"),
            "{err}"
        );
    }

    #[test]
    fn the_caps_have_defaults_and_take_their_smallest_values() {
        let defaults = parse("").unwrap();
        assert_eq!(defaults.gateway.max_held_per_recipient, 1_000);
        assert_eq!(defaults.gateway.max_long_calls_per_caller, 32);
        assert_eq!(defaults.gateway.max_sessions_per_token, 16);
        assert_eq!(defaults.federation.max_remote_entities_per_host, 256);
        assert_eq!(defaults.federation.max_remote_hosts, 64);
        assert_eq!(defaults.federation.audit_max_bytes, 64 * 1024 * 1024);
        assert_eq!(defaults.federation.audit_keep_files, 4);
        let smallest = parse(
            "[gateway]\nmax_held_per_recipient = 1\nmax_long_calls_per_caller = 1\nmax_sessions_per_token = 1\n[federation]\nmax_remote_entities_per_host = 1\nmax_remote_hosts = 1\naudit_max_bytes = 1024\naudit_keep_files = 1\n",
        )
        .unwrap();
        assert_eq!(smallest.gateway.max_held_per_recipient, 1);
        assert_eq!(smallest.federation.audit_max_bytes, 1024);
    }

    #[test]
    fn the_listeners_limits_have_defaults_and_refuse_what_cannot_work() {
        let defaults = parse("").unwrap().gateway;
        assert_eq!(
            (
                defaults.max_connections,
                defaults.header_timeout_s,
                defaults.idle_timeout_s,
                defaults.max_streams_per_token,
                defaults.drain_timeout_s,
                defaults.log_text
            ),
            (4096, 10, 60, 8, 20, false)
        );
        for (bad, says) in [
            ("max_connections = 0", "gateway.max_connections is 0"),
            (
                "max_streams_per_token = 0",
                "gateway.max_streams_per_token is 0",
            ),
            ("header_timeout_s = 0", "gateway.header_timeout_s is 0"),
            ("drain_timeout_s = 0", "gateway.drain_timeout_s is 0"),
            (
                "idle_timeout_s = 100000",
                "gateway.idle_timeout_s is 100000",
            ),
            (
                "header_timeout_s = 20\nidle_timeout_s = 10",
                "gateway.idle_timeout_s (10) must be at least gateway.header_timeout_s (20)",
            ),
        ] {
            let err = parse(&format!("[gateway]\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn an_isolated_claude_code_without_a_login_is_refused_naming_what_to_add() {
        let nothing = |_: &str| None;
        let profile = |extra: &str| {
            parse(&format!(
                "[[profiles]]\nname = \"claude\"\nkind = \"claude-code\"\nisolated_home = true\n{extra}\n"
            ))
            .unwrap()
        };
        let refused = [
            "",
            // Empty is unset; other variables are no login, and their values are never shown.
            "env = { ANTHROPIC_API_KEY = \"\", OTHER_SECRET = \"s3cr3t-value\" }",
            "env = { ANTHROPIC_BASE_URL_X = \"sk-ant-lookalike\" }",
        ];
        for extra in refused {
            let err = profile(extra).check_logins(&nothing).unwrap_err();
            for needle in [
                "profiles 'claude'",
                "isolated_home",
                "Not logged in",
                "add ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN, CLAUDE_CODE_OAUTH_TOKEN)",
            ] {
                assert!(err.contains(needle), "{extra}: {needle}: {err}");
            }
            assert!(!err.contains("s3cr3t") && !err.contains("sk-ant"), "{err}");
        }
        // A sandboxed Claude Code in an isolated home is held to the same rule.
        let sandboxed = parse(
            "[[profiles]]\nname = \"box\"\nkind = \"sandbox\"\nruntime = [\"bwrap\"]\nagent_kind = \"claude-code\"\nisolated_home = true\n",
        )
        .unwrap();
        let err = sandboxed.check_logins(&nothing).unwrap_err();
        assert!(err.contains("profiles 'box'"), "{err}");
        // fleetd's own login is never handed into a sandbox, so it does not count there.
        let fleetds = |key: &str| (key == "ANTHROPIC_API_KEY").then(|| "sk-ant-fleetd".to_string());
        assert!(sandboxed.check_logins(&fleetds).is_err());

        let allowed = [
            "env = { ANTHROPIC_API_KEY = \"sk-ant-x\" }",
            "env = { ANTHROPIC_AUTH_TOKEN = \"t\" }",
            "env = { CLAUDE_CODE_OAUTH_TOKEN = \"t\" }",
            "env = { CLAUDE_CODE_USE_BEDROCK = \"1\" }",
            "env = { CLAUDE_CODE_USE_VERTEX = \"1\" }",
            "argv = [\"claude\", \"--settings\", \"/etc/fleet/claude-settings.json\"]",
            "argv = [\"claude\", \"--settings={}\"]",
        ];
        for extra in allowed {
            assert_eq!(profile(extra).check_logins(&nothing), Ok(()), "{extra}");
        }
        // The user's own home has the user's own login.
        let own = parse("[[profiles]]\nname = \"claude\"\nkind = \"claude-code\"\n").unwrap();
        assert_eq!(own.check_logins(&nothing), Ok(()));
        // A credential in fleetd's own environment counts (the launcher hands it on).
        for key in CLAUDE_CREDENTIALS {
            let env = |k: &str| (k == key).then(|| "secret".to_string());
            assert_eq!(profile("").check_logins(&env), Ok(()), "{key}");
        }
        let empty = |_: &str| Some(String::new());
        assert!(profile("").check_logins(&empty).is_err());
    }

    #[test]
    fn an_isolated_opencode_on_an_anthropic_model_without_its_key_is_refused() {
        let nothing = |_: &str| None;
        let opencode = |extra: &str| {
            parse(&format!(
                "[[profiles]]\nname = \"oc\"\nkind = \"opencode\"\nisolated_home = true\n{extra}\n"
            ))
            .unwrap()
        };
        let anthropic = "model = \"anthropic/claude-sonnet-4-5\"";
        let err = opencode(anthropic).check_logins(&nothing).unwrap_err();
        for needle in [
            "profiles 'oc'",
            "anthropic/claude-sonnet-4-5",
            "API key is missing",
            "add ANTHROPIC_API_KEY",
        ] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let with_key = format!("{anthropic}\nenv = {{ ANTHROPIC_API_KEY = \"k\" }}");
        assert_eq!(opencode(&with_key).check_logins(&nothing), Ok(()));
        let fleetds = |k: &str| (k == "ANTHROPIC_API_KEY").then(|| "k".to_string());
        assert_eq!(opencode(anthropic).check_logins(&fleetds), Ok(()));
        // Another provider's variables are its own business; so is the user's own home.
        for extra in ["model = \"ollama/llama3\"", ""] {
            assert_eq!(opencode(extra).check_logins(&nothing), Ok(()), "{extra}");
        }
        let own = parse(&format!(
            "[[profiles]]\nname = \"oc\"\nkind = \"opencode\"\n{anthropic}\n"
        ))
        .unwrap();
        assert_eq!(own.check_logins(&nothing), Ok(()));
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse("[gateway]\nlisten_on = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("listen_on"), "{err}");
        let err = parse("[broker]\nuri = \"amqp://x\"\nheartbeat = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("heartbeat"), "{err}");
        let err = parse("[architects]\nslot = []\n").unwrap_err().to_string();
        assert!(err.contains("slot"), "{err}");
        let err = parse("[architects]\nslots = [{ name = \"a1\", profile = \"sim\", keep = 1 }]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("keep"), "{err}");
        let err = parse("[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\nargs=[]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("args"), "{err}");
    }

    #[test]
    fn two_architects_on_one_family_start_only_when_the_config_says_so() {
        let two = "[[profiles]]\nname = \"c1\"\nkind = \"claude-code\"\n[[profiles]]\nname = \"c2\"\nkind = \"opencode\"\nmodel = \"anthropic/claude-opus-4-1\"\n[architects]\nslots = [{ name = \"a1\", profile = \"c1\" }, { name = \"a2\", profile = \"c2\" }]\n";
        let err = parse(two).unwrap_err().to_string();
        assert!(
            err.contains("'a1' and 'a2' are both on the anthropic model family"),
            "{err}"
        );
        let allowed = two.replace("[architects]\n", "[architects]\nallow_same_family = true\n");
        assert!(parse(&allowed).unwrap().architects.allow_same_family);
        assert!(!parse("").unwrap().architects.allow_same_family);
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            (
                "[architects]\nslots = [{ name = \"a1\", profile = \"sim\", host = \"far\" }]\n",
                "configure [broker]",
            ),
            (
                "[architects]\nnudge_interval_s = 0\n",
                "architects.nudge_interval_s is 0",
            ),
            ("[gateway]\nlisten = \"nowhere\"\n", "listen"),
            ("[gateway]\nmax_message_bytes = 0\n", "max_message_bytes"),
            ("[gateway]\nadvertise_url = \"ftp://x\"\n", "advertise_url"),
            ("[broker]\nuri = \"http://broker\"\n", "broker.uri"),
            (
                "[broker]\nuri = \"amqp://b\"\nprefetch = 0\n",
                "broker.prefetch",
            ),
            (
                "[federation]\npresence_interval_s = 5\npresence_ttl_s = 5\n",
                "presence_ttl_s",
            ),
            ("[leads.\"bad name\"]\n", "bad name"),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[]\n",
                "argv",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"docker\"\nargv=[\"x\"]\n",
                "docker",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\n[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"y\"]\n",
                "declared twice",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\nenv={FLEET_TOKEN=\"x\"}\n",
                "FLEET_TOKEN",
            ),
            ("[mux]\nkind = \"screen\"\n", "screen"),
            (
                "[mux]\nkind = \"tmux\"\nsession = \"x\"\n",
                "needs kind = \"herdr\"",
            ),
            ("[mux]\nsocket = \"/tmp/x.sock\"\n", "mux.socket"),
            ("[mux]\npanes_per_server = 0\n", "mux.panes_per_server is 0"),
            ("[mux]\npanes_per_server = -1\n", "panes_per_server"),
            ("[mux]\npanes_per_server = \"16\"\n", "panes_per_server"),
            // The servers a big fleet spreads to are NAME@2 …: no socket name holds an `@`.
            ("[mux]\nsocket = \"fleet@2\"\n", "mux.socket"),
            (
                "[mux]\npanes_per_server = 100001\n",
                "mux.panes_per_server is 100001",
            ),
            (
                "[mux]\nkind = \"herdr\"\nsocket = \"/tmp/h.sock\"\npanes_per_server = 8\n",
                "needs kind = \"tmux\"",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\nready_timeout_s=99999999999\n",
                "ready_timeout_s is 99999999999",
            ),
            ("[leads.x]\nnudge_interval_s = 0\n", "nudge_interval_s is 0"),
            (
                "[gateway]\nmax_held_per_recipient = 0\n",
                "gateway.max_held_per_recipient is 0",
            ),
            (
                "[gateway]\nmax_long_calls_per_caller = 0\n",
                "gateway.max_long_calls_per_caller is 0",
            ),
            (
                "[gateway]\nmax_sessions_per_token = 0\n",
                "gateway.max_sessions_per_token is 0",
            ),
            (
                "[gateway]\nmax_held_per_recipient = 1000001\n",
                "between 1 and 1000000",
            ),
            (
                "[gateway]\nmax_sessions_per_token = -1\n",
                "max_sessions_per_token",
            ),
            (
                "[federation]\nmax_remote_entities_per_host = 0\n",
                "federation.max_remote_entities_per_host is 0",
            ),
            (
                "[federation]\nmax_remote_hosts = 0\n",
                "federation.max_remote_hosts is 0",
            ),
            (
                "[federation]\naudit_max_bytes = 1023\n",
                "federation.audit_max_bytes is 1023",
            ),
            (
                "[federation]\naudit_keep_files = 0\n",
                "federation.audit_keep_files is 0",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\nbase_url=\"http://m\"\n",
                "base_url applies to claude-code and opencode profiles",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"claude-code\"\nbase_url=\"file:///x\"\n",
                "must be an http:// or https:// URL",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"claude-code\"\nenv={ANTHROPIC_BASE_URL=\"http://m\"}\n",
                "with base_url, not env",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\nisolated_home=true\n",
                "isolated_home applies to claude-code and opencode",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"opencode\"\ntrust_workdir=false\n",
                "trust_workdir applies to claude-code profiles, not to kind \"opencode\"",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"claude-code\"\nisolated_home=true\ntrust_workdir=false\n",
                "an isolated home is fleetd's own",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\nruntime=[\"docker\"]\n",
                "runtime applies to sandbox profiles",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"sandbox\"\nagent=[\"x\"]\n",
                "runtime must name",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"sandbox\"\nruntime=[\"bwrap\"]\n",
                "agent must name a program",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"sandbox\"\nruntime=[\"docker\", \"{imag}\"]\nagent=[\"x\"]\n",
                "unknown placeholder {imag}",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"sandbox\"\nruntime=[\"docker\", \"{image}\"]\nagent=[\"x\"]\n",
                "uses {image} but the profile sets no image",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\ncontext_cap=0\n",
                "context_cap is 0",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\"]\nenv={KEY=\"s3cret\\nrun-shell x\"}\n",
                "profiles 'a': env KEY holds a control character, U+000A (newline), at character 6",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"command\"\nargv=[\"x\", \"a\\tb\"]\n",
                "profiles 'a': argv[1] holds a control character, U+0009 (tab)",
            ),
            (
                "[[profiles]]\nname=\"a\"\nkind=\"sandbox\"\nruntime=[\"bwrap\", \"\\r\"]\nagent=[\"x\"]\n",
                "profiles 'a': runtime[1] holds",
            ),
        ];
        for (text, needle) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
            assert!(err.contains("test.toml"), "{err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
    }
}
