//! `[broker]` and `[federation]`: the federated plane. Without a `[broker]` block fleetd is a
//! single-host gateway and never opens a broker connection.

use std::collections::BTreeMap;
use std::path::PathBuf;

use fleet_amqp::TlsFiles;
use fleet_amqp::topology::QueueType;
use fleet_core::entity::validate_name;
use fleet_core::ownership::{AllowTable, HostAllow};
use fleet_core::redact::MASK;
use fleet_core::signing::parse_key;
use fleet_core::trust::{PinnedHost, Trust};
use serde::Deserialize;

use super::{MAX_CONFIG_WAIT_S, within};

/// `[broker]`: the AMQP broker the gateways share: one node (`uri`) or a cluster's nodes
/// (`uris`). Its `Debug` masks the URIs' passwords.
#[derive(Clone, Deserialize)]
#[serde(try_from = "BrokerKeys")]
pub struct BrokerConfig {
    /// The broker's nodes (`uri`, or `uris` for a cluster): `amqp://` or `amqps://` URIs, each
    /// with this gateway's own login and the vhost (the same login, vhost and scheme on all);
    /// the password may be left out and come from `password_env` instead. The first that
    /// answers is used; when the link to it fails, the others are tried.
    pub uris: Vec<String>,
    /// The environment variable that holds the password, when a URI has none.
    pub password_env: String,
    /// The broker heartbeat: a crashed gateway's exclusive consumers are released after about
    /// twice this.
    pub heartbeat_s: u16,
    /// How many unacknowledged deliveries one inbox consumer may hold.
    pub prefetch: u16,
    /// An `amqps://` link's CA: the PEM certificate(s) that sign the broker's certificate,
    /// trusted besides the system's CAs. An absolute path, read at every connect.
    pub ca_file: Option<PathBuf>,
    /// This gateway's PEM certificate, for a broker that asks for one (mutual TLS); needs
    /// `key_file`. An absolute path, read at every connect.
    pub cert_file: Option<PathBuf>,
    /// The PEM private key of `cert_file`. An absolute path, read at every connect.
    pub key_file: Option<PathBuf>,
    /// The type of the inboxes, control and dead-letter queues: `classic` (on one node) or
    /// `quorum` (replicated across a cluster). Every gateway on a vhost must agree.
    pub queue_type: QueueType,
    /// How long a message to another host waits for the link when it finds it down (a node
    /// lost, the gateway connecting to another), before it fails with `broker_unavailable`, in
    /// seconds. By default 10 with several nodes and 0 with one: a single broker that is down
    /// fails a remote send at once (spec 10 §10 "Broker outage").
    pub failover_wait_s: u64,
}

/// The keys of `[broker]` as written: one of `uri` and `uris`, the rest with their defaults.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BrokerKeys {
    uri: Option<String>,
    uris: Option<Vec<String>>,
    #[serde(default = "default_password_env")]
    password_env: String,
    #[serde(default = "default_heartbeat_s")]
    heartbeat_s: u16,
    #[serde(default = "default_prefetch")]
    prefetch: u16,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    cert_file: Option<PathBuf>,
    #[serde(default)]
    key_file: Option<PathBuf>,
    #[serde(default)]
    queue_type: Option<String>,
    #[serde(default)]
    failover_wait_s: Option<u64>,
}

/// The most nodes `[broker] uris` may name.
const MAX_BROKER_NODES: usize = 16;
/// How long a message waits for the link to fail over, by default, with several nodes: a
/// gateway finds a surviving node and attaches its inboxes in a second or two (issue 16's
/// cluster test measures it).
const DEFAULT_FAILOVER_WAIT_S: u64 = 10;

impl TryFrom<BrokerKeys> for BrokerConfig {
    type Error = String;

    fn try_from(keys: BrokerKeys) -> Result<Self, String> {
        let uris = match (keys.uri, keys.uris) {
            (Some(uri), None) => vec![uri],
            (None, Some(uris)) => uris,
            (Some(_), Some(_)) => {
                return Err(
                    "set one of `uri` (one node) and `uris` (a cluster's nodes), not both".into(),
                );
            }
            (None, None) => {
                return Err("missing field `uri` (or `uris`, a cluster's nodes)".into());
            }
        };
        let queue_type = match keys.queue_type.as_deref() {
            None => QueueType::default(),
            Some(name) => QueueType::parse(name)
                .ok_or_else(|| format!("queue_type '{name}' is not one of: classic, quorum"))?,
        };
        let failover_wait_s = keys.failover_wait_s.unwrap_or(if uris.len() > 1 {
            DEFAULT_FAILOVER_WAIT_S
        } else {
            0
        });
        Ok(Self {
            uris,
            password_env: keys.password_env,
            heartbeat_s: keys.heartbeat_s,
            prefetch: keys.prefetch,
            ca_file: keys.ca_file,
            cert_file: keys.cert_file,
            key_file: keys.key_file,
            queue_type,
            failover_wait_s,
        })
    }
}

impl std::fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("uris", &self.shown())
            .field("password_env", &self.password_env)
            .field("heartbeat_s", &self.heartbeat_s)
            .field("prefetch", &self.prefetch)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("queue_type", &self.queue_type)
            .field("failover_wait_s", &self.failover_wait_s)
            .finish()
    }
}

/// The URI as logs and `Debug` may show it: its password masked.
pub fn redacted_uri(uri: &str) -> String {
    match url::Url::parse(uri) {
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some(MASK));
            }
            url.to_string()
        }
        Err(_) => "(not a URI)".into(),
    }
}

fn default_password_env() -> String {
    "FLEET_BROKER_PASSWORD".into()
}

fn default_heartbeat_s() -> u16 {
    10
}

fn default_prefetch() -> u16 {
    32
}

/// `[coordinator]`: lead-to-lead coordination (spec 10 "Lead-to-lead") on a vhost of its own,
/// apart from the fleet's. Its link keys are `[broker]`'s (`uri`, `password_env`,
/// `heartbeat_s`, `prefetch`, `ca_file`, `cert_file`, `key_file`), the password from
/// `FLEET_COORD_PASSWORD` by default; `coord_id` is the coordination id of this gateway's one
/// lead (a gateway with several gives each its own in `[leads.NAME] coord_id`; a lead given
/// none is `<lead>@<host id>`). Its `Debug` masks the URI's password.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "toml::Table")]
pub struct CoordinatorConfig {
    /// The link to the coordinator's vhost.
    pub link: BrokerConfig,
    /// The coordination id of this gateway's one lead.
    pub coord_id: Option<String>,
}

/// Where the coordinator's password comes from when its URI has none, by default.
const COORD_PASSWORD_ENV: &str = "FLEET_COORD_PASSWORD";

impl TryFrom<toml::Table> for CoordinatorConfig {
    type Error = String;

    /// `coord_id` taken out, the rest read as a `[broker]` block is (unknown keys refused).
    fn try_from(mut table: toml::Table) -> Result<Self, String> {
        let coord_id = match table.remove("coord_id") {
            None => None,
            Some(toml::Value::String(id)) => Some(id),
            Some(other) => {
                return Err(format!(
                    "coordinator.coord_id must be a string, not {}",
                    other.type_str()
                ));
            }
        };
        table
            .entry("password_env")
            .or_insert_with(|| COORD_PASSWORD_ENV.into());
        let link = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| format!("[coordinator]: {}", e.message().trim()))?;
        Ok(Self { link, coord_id })
    }
}

/// `[federation]`: presence, receipts and the caps of the inboxes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FederationConfig {
    /// How often each gateway announces its entities.
    pub presence_interval_s: u64,
    /// How long a remote entity stays in the roster without a heartbeat.
    pub presence_ttl_s: u64,
    /// How long a sender waits for a remote brief's `INJECTED` receipt while its recipient is
    /// free to take it (time the recipient reads busy does not count).
    pub injected_bound_s: u64,
    /// The most messages an inbox holds; more are dead-lettered (the sender is refused).
    pub inbox_max_length: u64,
    /// How long a message may wait in an inbox before it is dead-lettered.
    pub inbox_message_ttl_s: u64,
    /// How long an inbox nobody consumes lives (it goes with its messages): a crashed
    /// gateway's orphans are collected after this.
    pub inbox_expires_s: u64,
    /// The most messages the dead-letter queue keeps.
    pub dlq_max_length: u64,
    /// The most roster entries kept of one remote host; heartbeats naming more are ignored
    /// (loudly), so a forged flood of entity names grows no memory.
    pub max_remote_entities_per_host: usize,
    /// The most remote hosts the roster keeps; heartbeats from more are ignored (loudly).
    pub max_remote_hosts: usize,
    /// The size at which the audit log (`<state_dir>/audit.jsonl`) is rotated, in bytes.
    pub audit_max_bytes: u64,
    /// How many rotated audit logs are kept (`audit.jsonl.1` the newest); the oldest goes.
    pub audit_keep_files: usize,
    /// The other hosts' gateway keys (`fleetd key` on each prints its own), by host id: a
    /// message signed by any other key, or from a host not here, is refused.
    pub trust: BTreeMap<String, TrustEntry>,
    /// Takes messages that are unsigned or signed by keys nobody pinned (the signature is not
    /// checked at all). For a lab only: anyone who can publish on the vhost can then type into
    /// this host's workers. Logged loudly at every start.
    pub insecure_unsigned: bool,
    /// How far another gateway's clock may run ahead of this one's before its messages are
    /// refused, in seconds.
    pub clock_skew_s: u64,
    /// The oldest a message off the broker may be when it arrives (and the longest it may be
    /// meant to live), in seconds; its id is remembered that long, so a replay is refused for
    /// as long as it could otherwise pass. At least `inbox_message_ttl_s`: a message may wait
    /// that long in an inbox. Every gateway of a fleet must agree on it.
    pub max_message_age_s: u64,
    /// How long `fleet_spawn` and `fleet_stop` wait for another host's gateway to answer, in
    /// seconds (a spawn there includes its readiness gate); a request that has waited this long
    /// on the broker is not acted on.
    pub control_wait_s: u64,
    /// What another host's leads may do here, by host id, or by `lead@host` for one lead (whose
    /// entry then stands alone): `spawn` (the profiles), `send` (tasks to the workers here they
    /// own or that are shared with them), `stop` (their own). A host with no entry: nothing but
    /// replies, asks and presence for its own traffic.
    pub allow: BTreeMap<String, HostAllow>,
}

/// One host's entry in `[federation.trust]`: a key, two keys (while it rotates), or a table
/// with the keys and the broker login the host publishes as.
#[derive(Clone, Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a host's pinned key: \"ed25519:…\", a list of one or two such keys, or a table with `keys` and `login`"
)]
pub enum TrustEntry {
    /// `hostb = "ed25519:…"`
    Key(String),
    /// `hostb = ["ed25519:…", "ed25519:…"]`
    Keys(Vec<String>),
    /// `[federation.trust.hostb]` with `keys = [...]` and `login = "gw-hostb"`.
    Pinned(PinnedEntry),
}

/// `[federation.trust.<host>]` written as a table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedEntry {
    /// Its keys (one, or two while it rotates).
    pub keys: Vec<String>,
    /// The broker login it publishes as (RabbitMQ vouches for it): a message from this host
    /// published by any other login is refused.
    pub login: Option<String>,
}

/// The most keys one host may be pinned to: the current one and the next, while it rotates.
const MAX_KEYS_PER_HOST: usize = 2;

/// The roster entries kept of one remote host, by default: far above the agents one machine's
/// terminals run, and at a few hundred bytes each a bound of well under a megabyte per host.
const DEFAULT_MAX_REMOTE_ENTITIES_PER_HOST: usize = 256;
/// The remote hosts the roster keeps, by default: a fleet is a handful of machines.
const DEFAULT_MAX_REMOTE_HOSTS: usize = 64;
/// The audit log's rotation size, by default (64 MiB: some 250 000 hops, a busy week).
const DEFAULT_AUDIT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// The rotated audit logs kept, by default: with the live one at most 320 MiB.
const DEFAULT_AUDIT_KEEP_FILES: usize = 4;
/// The smallest audit rotation size: a line is a few hundred bytes, and less would rotate at
/// nearly every line.
const MIN_AUDIT_MAX_BYTES: u64 = 1024;

impl Default for FederationConfig {
    fn default() -> Self {
        Self {
            presence_interval_s: 5,
            presence_ttl_s: 15,
            injected_bound_s: 30,
            inbox_max_length: 1_000,
            inbox_message_ttl_s: 86_400,
            inbox_expires_s: 604_800,
            dlq_max_length: 100_000,
            max_remote_entities_per_host: DEFAULT_MAX_REMOTE_ENTITIES_PER_HOST,
            max_remote_hosts: DEFAULT_MAX_REMOTE_HOSTS,
            audit_max_bytes: DEFAULT_AUDIT_MAX_BYTES,
            audit_keep_files: DEFAULT_AUDIT_KEEP_FILES,
            trust: BTreeMap::new(),
            insecure_unsigned: false,
            clock_skew_s: 60,
            max_message_age_s: 86_400,
            control_wait_s: 300,
            allow: BTreeMap::new(),
        }
    }
}

impl BrokerConfig {
    /// Checks what the parser cannot, of the block `block` (`broker` or `coordinator`); errors
    /// name the key.
    pub(super) fn validate(&self, block: &str) -> Result<(), String> {
        let key = if self.uris.len() == 1 { "uri" } else { "uris" };
        if self.uris.is_empty() || self.uris.len() > MAX_BROKER_NODES {
            return Err(format!(
                "{block}.uris names {} nodes: name 1 to {MAX_BROKER_NODES}",
                self.uris.len()
            ));
        }
        let mut first: Option<url::Url> = None;
        for (i, uri) in self.uris.iter().enumerate() {
            let named = if self.uris.len() == 1 {
                format!("{block}.uri")
            } else {
                format!("{block}.uris[{i}]")
            };
            let parsed = url::Url::parse(uri).map_err(|e| format!("{named} is not a URI: {e}"))?;
            if !matches!(parsed.scheme(), "amqp" | "amqps") || parsed.host_str().is_none() {
                return Err(format!(
                    "{named} must be an amqp:// or amqps:// URI with a host, not '{}://…'",
                    parsed.scheme()
                ));
            }
            // One login on one vhost, over one scheme: the nodes are one broker.
            if let Some(first) = &first {
                for (what, same) in [
                    ("scheme", first.scheme() == parsed.scheme()),
                    ("login", first.username() == parsed.username()),
                    ("vhost", first.path() == parsed.path()),
                ] {
                    if !same {
                        return Err(format!(
                            "{named} has another {what} than {block}.uris[0]: a cluster's nodes are one broker, reached with one login on one vhost"
                        ));
                    }
                }
            } else {
                first = Some(parsed);
            }
        }
        within(
            &format!("{block}.heartbeat_s"),
            self.heartbeat_s.into(),
            1,
            300,
        )?;
        within(
            &format!("{block}.prefetch"),
            self.prefetch.into(),
            1,
            10_000,
        )?;
        within(
            &format!("{block}.failover_wait_s"),
            self.failover_wait_s,
            0,
            MAX_CONFIG_WAIT_S,
        )?;
        for (key, path) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if let Some(path) = path
                && !path.is_absolute()
            {
                return Err(format!(
                    "{block}.{key} '{}' must be an absolute path (fleetd resolves it against no directory)",
                    path.display()
                ));
            }
        }
        // The TLS rules name `broker.*` keys: said of the block at hand.
        let scheme = first.as_ref().map_or("", url::Url::scheme);
        self.tls().check(scheme).map_err(|e| {
            e.to_string()
                .replace("broker.uri", &format!("{block}.{key}"))
                .replace("broker.", &format!("{block}."))
        })
    }

    /// The broker login the link publishes as (the nodes' one login).
    pub fn login(&self) -> String {
        self.uris
            .first()
            .map_or_else(|| "guest".to_string(), |uri| fleet_amqp::login_of(uri))
    }

    /// The nodes as logs may show them: their passwords masked.
    pub fn shown(&self) -> String {
        self.uris
            .iter()
            .map(|uri| redacted_uri(uri))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The TLS files of the link.
    pub fn tls(&self) -> TlsFiles {
        TlsFiles {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        }
    }
}

/// What a range's floor is, when it is another key's value.
const MORE_THAN_INTERVAL: &str = " (more than presence_interval_s)";
/// The same, for a floor of the inbox's message ttl.
const AT_LEAST_TTL: &str = " (at least inbox_message_ttl_s)";

impl FederationConfig {
    /// Checks what the parser cannot; errors name the key.
    pub(super) fn validate(&self) -> Result<(), String> {
        for (key, value, min, max, floor) in self.ranges() {
            within(&format!("federation.{key}"), value, min, max)
                .map_err(|e| format!("{e}{floor}"))?;
        }
        self.trust_table()?;
        self.allow_table().map(|_| ())
    }

    /// Each numeric key, its value, its range, and what the range's floor is when it is
    /// another key.
    fn ranges(&self) -> [(&'static str, u64, u64, u64, &'static str); 14] {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let (ttl, wait) = (self.inbox_message_ttl_s, MAX_CONFIG_WAIT_S);
        let interval = self.presence_interval_s;
        [
            ("presence_interval_s", interval, 1, 3_600, ""),
            (
                "presence_ttl_s",
                self.presence_ttl_s,
                interval + 1,
                wait,
                MORE_THAN_INTERVAL,
            ),
            ("injected_bound_s", self.injected_bound_s, 1, wait, ""),
            ("control_wait_s", self.control_wait_s, 1, wait, ""),
            ("inbox_max_length", self.inbox_max_length, 1, 10_000_000, ""),
            ("inbox_message_ttl_s", ttl, 1, wait * 30, ""),
            (
                "inbox_expires_s",
                self.inbox_expires_s,
                ttl,
                wait * 365,
                AT_LEAST_TTL,
            ),
            ("dlq_max_length", self.dlq_max_length, 1, 100_000_000, ""),
            (
                "max_remote_entities_per_host",
                count(self.max_remote_entities_per_host),
                1,
                100_000,
                "",
            ),
            (
                "max_remote_hosts",
                count(self.max_remote_hosts),
                1,
                10_000,
                "",
            ),
            (
                "audit_max_bytes",
                self.audit_max_bytes,
                MIN_AUDIT_MAX_BYTES,
                1 << 40,
                "",
            ),
            (
                "audit_keep_files",
                count(self.audit_keep_files),
                1,
                1_000,
                "",
            ),
            ("clock_skew_s", self.clock_skew_s, 0, 3_600, ""),
            (
                "max_message_age_s",
                self.max_message_age_s,
                ttl,
                wait * 30,
                AT_LEAST_TTL,
            ),
        ]
    }

    /// `[federation.allow]` as the checks use it; an error names the entry and what is wrong.
    pub fn allow_table(&self) -> Result<AllowTable, String> {
        for (key, allow) in &self.allow {
            let (lead, host) = match key.split_once('@') {
                Some((lead, host)) => (Some(lead), host),
                None => (None, key.as_str()),
            };
            validate_name("federation.allow host", host).map_err(|e| e.message)?;
            if let Some(lead) = lead {
                validate_name("federation.allow lead", lead).map_err(|e| e.message)?;
            }
            for profile in allow.spawn.iter().filter(|p| *p != "*") {
                validate_name(
                    &format!("federation.allow.\"{key}\".spawn profile"),
                    profile,
                )
                .map_err(|e| e.message)?;
            }
        }
        Ok(AllowTable(self.allow.clone()))
    }

    /// The trust table as the checks use it; an error names the host and what is wrong.
    pub fn trust_table(&self) -> Result<Trust, String> {
        let mut hosts = BTreeMap::new();
        for (host, entry) in &self.trust {
            validate_name("federation.trust host", host).map_err(|e| e.message)?;
            let (texts, login) = match entry {
                TrustEntry::Key(key) => (std::slice::from_ref(key), None),
                TrustEntry::Keys(keys) => (keys.as_slice(), None),
                TrustEntry::Pinned(p) => (p.keys.as_slice(), p.login.as_deref()),
            };
            if texts.is_empty() || texts.len() > MAX_KEYS_PER_HOST {
                return Err(format!(
                    "federation.trust.{host} lists {} keys: pin one, or two while the host rotates its key",
                    texts.len()
                ));
            }
            let keys = texts
                .iter()
                .map(|text| parse_key(text).map_err(|e| format!("federation.trust.{host}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(login) = login
                && (login.is_empty() || login.len() > 255 || login.chars().any(char::is_control))
            {
                return Err(format!(
                    "federation.trust.{host}.login must be a broker user name: 1 to 255 characters, no control characters"
                ));
            }
            hosts.insert(
                host.clone(),
                PinnedHost::new(keys, login.map(str::to_string)),
            );
        }
        Ok(Trust::new(hosts))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use fleet_amqp::topology::QueueType;

    use super::super::Config;
    use super::DEFAULT_FAILOVER_WAIT_S;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(Path::new("test.toml"), text).map_err(|e| e.to_string())
    }

    /// A config with `[coordinator]` lines `coordinator` and leads `leads` (TOML).
    fn coordinated(coordinator: &str, leads: &str) -> Result<Config, String> {
        parse(&format!(
            "{leads}\n[coordinator]\nuri = \"amqp://coord@b/coord\"\n{coordinator}\n[federation]\ninsecure_unsigned = true\n"
        ))
    }

    #[test]
    fn the_coordinator_is_a_broker_link_with_a_coord_id() {
        let config = coordinated("coord_id = \"alice@laptop\"\nheartbeat_s = 7", "").unwrap();
        let coordinator = config.coordinator.clone().unwrap();
        assert_eq!(coordinator.coord_id.as_deref(), Some("alice@laptop"));
        assert_eq!(coordinator.link.heartbeat_s, 7);
        assert_eq!(coordinator.link.password_env, "FLEET_COORD_PASSWORD");
        let ids = config.coord_ids("laptop").unwrap();
        assert_eq!(ids.get("lead").map(String::as_str), Some("alice@laptop"));
        // No id given: the lead's name at the host.
        let config = coordinated("", "[leads.bob]").unwrap();
        let ids = config.coord_ids("hostb").unwrap();
        assert_eq!(ids.get("bob").map(String::as_str), Some("bob@hostb"));
        // Several leads, each its own.
        let config = coordinated(
            "",
            "[leads.a]\ncoord_id = \"a@x\"\n[leads.b]\ncoord_id = \"b@x\"",
        )
        .unwrap();
        let ids = config.coord_ids("x").unwrap();
        assert_eq!(ids.values().collect::<Vec<_>>(), ["a@x", "b@x"]);
        // Without [coordinator], nobody has one.
        assert!(parse("").unwrap().coord_ids("x").unwrap().is_empty());
    }

    #[test]
    fn every_coordinator_key_is_checked_and_named() {
        let cases = [
            ("coord_id = \"@alice\"", "", "coordinator.coord_id '@alice'"),
            (
                "coord_id = \"a b\"",
                "",
                "coordinator.coord_id is not a valid",
            ),
            ("coord_id = 7", "", "coordinator.coord_id must be a string"),
            (
                "coord_id = \"a\"",
                "[leads.x]\n[leads.y]",
                "coordinator.coord_id 'a'",
            ),
            (
                "",
                "[leads.x]\ncoord_id = \"x/y\"",
                "leads.x.coord_id is not a valid",
            ),
            ("", "[leads.x]\ncoord_id = \"-x\"", "leads.x.coord_id '-x'"),
            ("color = \"red\"", "", "unknown field `color`"),
            ("heartbeat_s = 0", "", "coordinator.heartbeat_s is 0"),
            (
                "ca_file = \"/ca.pem\"",
                "",
                "coordinator.ca_file set, but coordinator.uri is amqp://",
            ),
        ];
        for (coordinator, leads, expected) in cases {
            let err = coordinated(coordinator, leads).unwrap_err();
            assert!(err.contains(expected), "{coordinator} {leads}: {err}");
        }
        let err = parse("[leads.x]\ncoord_id = \"x@h\"\n").unwrap_err();
        assert!(
            err.contains("leads.x.coord_id is set, but there is no [coordinator]"),
            "{err}"
        );
        let err = parse("[coordinator]\nuri = \"amqp://b/coord\"\n").unwrap_err();
        assert!(err.contains("[coordinator] is set but"), "{err}");
        let err = parse("[coordinator]\nuri = \"http://b/coord\"\n").unwrap_err();
        assert!(err.contains("coordinator.uri must be an amqp://"), "{err}");
        // Two leads on one id: refused, both named.
        let config = coordinated("", "[leads.a]\ncoord_id = \"b@h\"\n[leads.b]").unwrap();
        let err = config.coord_ids("h").unwrap_err();
        assert!(
            err.contains("'a' and 'b'") && err.contains("'b@h'"),
            "{err}"
        );
    }

    /// A `[broker]` block of `lines`, trusting nobody (a lab).
    fn broker(lines: &str) -> Result<Config, String> {
        parse(&format!(
            "[broker]\n{lines}\n[federation]\ninsecure_unsigned = true\n"
        ))
    }

    #[test]
    fn a_cluster_is_its_nodes_on_one_login_and_vhost_and_fails_over_by_default() {
        let one = broker("uri = \"amqp://gw@b/fleet\"")
            .unwrap()
            .broker
            .unwrap();
        assert_eq!(one.uris, ["amqp://gw@b/fleet"]);
        assert_eq!(one.queue_type, QueueType::Classic);
        // One node: a remote send with it down fails at once.
        assert_eq!(one.failover_wait_s, 0);
        let cluster = broker(
            "uris = [\"amqp://gw:pw@b1/fleet\", \"amqp://gw@b2:5673/fleet\"]\nqueue_type = \"quorum\"",
        )
        .unwrap()
        .broker
        .unwrap();
        assert_eq!(cluster.uris.len(), 2);
        assert_eq!(cluster.queue_type, QueueType::Quorum);
        assert_eq!(cluster.failover_wait_s, DEFAULT_FAILOVER_WAIT_S);
        assert_eq!(cluster.login(), "gw");
        assert_eq!(
            cluster.shown(),
            "amqp://gw:***@b1/fleet, amqp://gw@b2:5673/fleet"
        );
        assert!(!format!("{cluster:?}").contains("pw"), "{cluster:?}");
        let set = broker("uris = [\"amqp://b1\", \"amqp://b2\"]\nfailover_wait_s = 0")
            .unwrap()
            .broker
            .unwrap();
        assert_eq!(set.failover_wait_s, 0);
    }

    #[test]
    fn every_node_of_a_cluster_is_checked_and_named() {
        let cases = [
            ("", "missing field `uri`"),
            (
                "uri = \"amqp://b\"\nuris = [\"amqp://c\"]",
                "set one of `uri` (one node) and `uris`",
            ),
            ("uris = []", "broker.uris names 0 nodes"),
            (
                "uris = [\"amqp://b/fleet\", \"http://c/fleet\"]",
                "broker.uris[1] must be an amqp://",
            ),
            (
                "uris = [\"amqp://b/fleet\", \"not a uri\"]",
                "broker.uris[1] is not a URI",
            ),
            (
                "uris = [\"amqp://gw@b/fleet\", \"amqp://other@c/fleet\"]",
                "broker.uris[1] has another login than broker.uris[0]",
            ),
            (
                "uris = [\"amqp://b/fleet\", \"amqp://c/other\"]",
                "broker.uris[1] has another vhost",
            ),
            (
                "uris = [\"amqp://b/fleet\", \"amqps://c/fleet\"]",
                "broker.uris[1] has another scheme",
            ),
            (
                "uris = [\"amqp://b\", \"amqp://c\"]\nca_file = \"/ca.pem\"",
                "broker.ca_file set, but broker.uris is amqp://",
            ),
            (
                "uri = \"amqp://b\"\nqueue_type = \"stream\"",
                "queue_type 'stream' is not one of: classic, quorum",
            ),
            (
                "uri = \"amqp://b\"\nfailover_wait_s = 99999999",
                "broker.failover_wait_s",
            ),
            (
                "uri = \"amqp://b\"\nqueue = \"quorum\"",
                "unknown field `queue`",
            ),
        ];
        for (lines, expected) in cases {
            let err = broker(lines).unwrap_err();
            assert!(err.contains(expected), "{lines}: {err}");
        }
        let many: Vec<String> = (0..17).map(|i| format!("\"amqp://b{i}\"")).collect();
        let err = broker(&format!("uris = [{}]", many.join(", "))).unwrap_err();
        assert!(err.contains("broker.uris names 17 nodes"), "{err}");
    }

    #[test]
    fn the_tls_files_are_absolute_go_with_amqps_and_a_certificate_with_its_key() {
        let config = parse(
            "[broker]\nuri = \"amqps://b/fleet\"\nca_file = \"/etc/fleet/ca.pem\"\ncert_file = \"/etc/fleet/gw.pem\"\nkey_file = \"/etc/fleet/gw.key\"\n[federation]\ninsecure_unsigned = true\n",
        )
        .unwrap();
        let tls = config.broker.unwrap().tls();
        assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/etc/fleet/ca.pem")));
        assert_eq!(
            tls.key_file.as_deref(),
            Some(Path::new("/etc/fleet/gw.key"))
        );

        let cases = [
            (
                "uri = \"amqps://b\"\nca_file = \"ca.pem\"",
                "broker.ca_file 'ca.pem' must be an absolute path",
            ),
            (
                "uri = \"amqps://b\"\nkey_file = \"~/gw.key\"\ncert_file = \"/gw.pem\"",
                "broker.key_file '~/gw.key' must be an absolute path",
            ),
            (
                "uri = \"amqp://b\"\nca_file = \"/ca.pem\"",
                "broker.ca_file set, but broker.uri is amqp://, not amqps://",
            ),
            (
                "uri = \"amqps://b\"\ncert_file = \"/gw.pem\"",
                "broker.cert_file is set without broker.key_file",
            ),
            (
                "uri = \"amqps://b\"\nkey_file = \"/gw.key\"",
                "broker.key_file is set without broker.cert_file",
            ),
        ];
        for (broker, expected) in cases {
            let err = parse(&format!("[broker]\n{broker}\n")).unwrap_err();
            assert!(err.contains(expected), "{broker}: {err}");
        }
    }

    #[test]
    fn every_allow_entry_and_share_is_checked_and_named() {
        let allowed = parse(
            "[federation]\ninsecure_unsigned = true\n[federation.allow.laptop]\nspawn = [\"coder\", \"*\"]\nsend = true\n[federation.allow.\"bob@ci\"]\nstop = true\n",
        )
        .unwrap();
        let table = allowed.federation.allow_table().unwrap();
        assert_eq!(table.0.len(), 2);
        assert!(table.0["laptop"].send && !table.0["laptop"].stop);
        let cases = [
            (
                "[federation.allow.\"lap top\"]\nsend = true",
                "federation.allow host 'lap top'",
            ),
            (
                "[federation.allow.\"b\\u001b[31m@ci\"]\nsend = true",
                "federation.allow lead",
            ),
            (
                "[federation.allow.\"@ci\"]\nsend = true",
                "federation.allow lead ''",
            ),
            (
                "[federation.allow.ci]\nspawn = [\"../x\"]",
                "federation.allow.\"ci\".spawn profile '../x'",
            ),
            ("[federation.allow.ci]\nsend = \"yes\"", "invalid type"),
            (
                "[federation.allow.ci]\nadmin = true",
                "unknown field `admin`",
            ),
        ];
        for (allow, expected) in cases {
            let err = parse(&format!(
                "[federation]\ninsecure_unsigned = true\n{allow}\n"
            ))
            .unwrap_err();
            assert!(err.contains(expected), "{allow}: {err}");
        }
        for (share, expected) in [
            ("[\"b b\"]", "leads.alice.share"),
            ("[\"bob@\"]", "leads.alice.share"),
            ("\"bob\"", "invalid type"),
        ] {
            let err = parse(&format!("[leads.alice]\nshare = {share}\n")).unwrap_err();
            assert!(err.contains(expected), "{share}: {err}");
        }
        let many: Vec<String> = (0..=64).map(|i| format!("\"l{i}\"")).collect();
        let err = parse(&format!("[leads.alice]\nshare = [{}]\n", many.join(", "))).unwrap_err();
        assert!(err.contains("64 leads at most"), "{err}");
    }
}
