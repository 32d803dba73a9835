//! The real RabbitMQ for broker tests and benchmarks: where it is ([`Broker`]), a vhost of a
//! test's own, removed when dropped ([`Vhost`]), and a private node a test may stop and restart
//! ([`PrivateNode`]), with a TLS listener if asked ([`TlsSetup`]); the machine's shared broker is
//! never stopped or reconfigured.
//!
//! Vhosts are made and removed with `rabbitmqctl` on the broker's node, so the broker must run
//! on this machine and its node must be reachable by `rabbitmqctl` run as we are.
//! `FLEET_TEST_AMQP_URL` (`amqp://user:pass@host:port`, no vhost) names such a broker, with
//! `FLEET_TEST_RABBIT_NODE` as its node name when it is not `rabbitmqctl`'s default node; its
//! user must exist there (each vhost grants it all permissions).

use std::ffi::OsString;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use fleet_amqp::Client;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use rustix::process::{Pid, Signal};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::wait::until;

mod cluster;
mod tls;
mod users;

pub use cluster::Cluster;
pub use tls::{CLIENT_NAME, TlsCerts, TlsSetup};
pub use users::BrokerUser;

/// How long a private node may take to take AMQP connections after it is started (7–11 s on
/// a busy 2-CPU machine; about half of it the Erlang VM's boot).
const NODE_START_LIMIT: Duration = Duration::from_secs(60);

/// How long a private node may take to exit once told to stop.
const NODE_STOP_LIMIT: Duration = Duration::from_secs(30);

/// How long a new vhost may take to let its user in (definition import is asynchronous).
const VHOST_LIMIT: Duration = Duration::from_secs(30);

/// How long one `rabbitmqctl` run may take.
const CTL_LIMIT: Duration = Duration::from_secs(60);

/// How long one AMQP connection attempt may take before it counts as failed.
const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// How many times [`PrivateNode::start`] starts a node on fresh ports after another process
/// took one of them first.
const PORT_ATTEMPTS: usize = 3;

/// The port of the machine's shared RabbitMQ.
const SHARED_PORT: u16 = 5672;

/// What is percent-encoded in a URI's user info and vhost: all but RFC 3986's unreserved.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A RabbitMQ node the tests may use: its AMQP address and credentials, and how to run
/// `rabbitmqctl` against it. Both [`Broker::find`] and [`PrivateNode::broker`] give one; a
/// [`Vhost`] is made on one.
#[derive(Clone, Debug)]
pub struct Broker {
    /// The AMQP host.
    host: String,
    /// The AMQP port.
    port: u16,
    /// The AMQP user.
    user: String,
    /// The AMQP user's password.
    password: String,
    /// `rabbitmqctl` for this node.
    ctl: Ctl,
}

/// How `rabbitmqctl` reaches one node.
#[derive(Clone, Debug)]
struct Ctl {
    /// The `rabbitmqctl` to run.
    program: PathBuf,
    /// `-n` for it (`None`: its default node).
    node: Option<String>,
    /// Environment for it (a private node's `HOME`, which holds its Erlang cookie).
    env: Vec<(&'static str, OsString)>,
}

/// The broker [`Broker::find`] settled on, for the whole process.
static FOUND: OnceCell<Broker> = OnceCell::const_new();

/// The private node started when this machine has no broker, kept for the whole process (it
/// gets SIGKILL when the process exits, see [`spawn_tied`]; statics are never dropped, so its
/// temporary directory stays behind).
static FALLBACK: OnceCell<PrivateNode> = OnceCell::const_new();

impl Broker {
    /// The tests' broker: `FLEET_TEST_AMQP_URL` if set (see the module docs); else the
    /// machine's RabbitMQ on 127.0.0.1:5672 if it takes a `guest`/`guest` connection; else a
    /// private node started for this process. Decided once per process.
    pub async fn find() -> anyhow::Result<Broker> {
        FOUND
            .get_or_try_init(|| async {
                if let Ok(url) = std::env::var("FLEET_TEST_AMQP_URL") {
                    let node = std::env::var("FLEET_TEST_RABBIT_NODE").ok();
                    return Broker::at(&url, node.as_deref())
                        .context("FLEET_TEST_AMQP_URL names no usable broker");
                }
                let shared = Broker::at(&format!("amqp://127.0.0.1:{SHARED_PORT}"), None)?;
                if probe(&shared.uri("/")).await {
                    return Ok(shared);
                }
                let node = FALLBACK.get_or_try_init(PrivateNode::start).await?;
                Ok(node.broker())
            })
            .await
            .cloned()
    }

    /// The broker at `url` (`amqp://user:pass@host:port`; user and password default to
    /// `guest`, the port to 5672), whose vhosts `rabbitmqctl [-n node]` manages (`node`
    /// `None`: `rabbitmqctl`'s default node).
    pub fn at(url: &str, node: Option<&str>) -> anyhow::Result<Broker> {
        let parsed = url::Url::parse(url).with_context(|| format!("parsing {url:?}"))?;
        anyhow::ensure!(parsed.scheme() == "amqp", "{url:?} is not an amqp:// URL");
        anyhow::ensure!(
            matches!(parsed.path(), "" | "/"),
            "{url:?} names a vhost; give the broker's URL without one"
        );
        let decode = |s: &str| -> anyhow::Result<String> {
            Ok(percent_decode_str(s).decode_utf8()?.into_owned())
        };
        let user = match parsed.username() {
            "" => "guest".to_string(),
            user => decode(user)?,
        };
        let password = match parsed.password() {
            None => "guest".to_string(),
            Some(password) => decode(password)?,
        };
        let host = match parsed.host_str() {
            None | Some("") => "127.0.0.1".to_string(),
            Some(host) => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        };
        Ok(Broker {
            host,
            port: parsed.port().unwrap_or(SHARED_PORT),
            user,
            password,
            ctl: Ctl {
                program: installed("/usr/sbin/rabbitmqctl", "rabbitmqctl"),
                node: node.map(str::to_string),
                env: Vec::new(),
            },
        })
    }

    /// The AMQP host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The AMQP user (every [`Vhost`] grants it all permissions).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The node name `rabbitmqctl` is given (`None`: its default node).
    pub fn node(&self) -> Option<&str> {
        self.ctl.node.as_deref()
    }

    /// The base URL, no vhost: `amqp://user:pass@host:port`.
    pub fn url(&self) -> String {
        self.url_at("amqp", self.port)
    }

    /// The base URL with `scheme` and `port` in place of this broker's.
    fn url_at(&self, scheme: &str, port: u16) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!(
            "{scheme}://{}:{}@{host}:{port}",
            utf8_percent_encode(&self.user, COMPONENT),
            utf8_percent_encode(&self.password, COMPONENT),
        )
    }

    /// The URI of `vhost` on this broker, the vhost percent-encoded (`/` is `%2F`).
    pub fn uri(&self, vhost: &str) -> String {
        format!("{}/{}", self.url(), utf8_percent_encode(vhost, COMPONENT))
    }

    /// Runs `rabbitmqctl` with `args` on this broker's node; its standard output.
    pub async fn rabbitmqctl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.ctl.run(args, None).await
    }
}

impl AsRef<Broker> for Broker {
    fn as_ref(&self) -> &Broker {
        self
    }
}

impl Ctl {
    /// The command, without its arguments.
    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(node) = &self.node {
            command.args(["-n", node]);
        }
        command
    }

    /// Runs it with `args`, writing `input` to its standard input; its standard output.
    async fn run(&self, args: &[&str], input: Option<&[u8]>) -> anyhow::Result<String> {
        let mut command = tokio::process::Command::from(self.command());
        command
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let run = async {
            let mut child = command.spawn()?;
            if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
                stdin.write_all(input).await?;
            }
            child.wait_with_output().await
        };
        let out = tokio::time::timeout(CTL_LIMIT, run)
            .await
            .with_context(|| format!("rabbitmqctl {args:?} took over {CTL_LIMIT:?}"))?
            .with_context(|| format!("running {}", self.program.display()))?;
        checked(args, out)
    }

    /// Runs it with `args`, blocking (for `Drop`).
    fn run_blocking(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.program.display()))?;
        checked(args, out)
    }
}

/// The standard output of a `rabbitmqctl` run, or an error with all it said.
fn checked(args: &[&str], out: std::process::Output) -> anyhow::Result<String> {
    anyhow::ensure!(
        out.status.success(),
        "rabbitmqctl {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `preferred` if it is a file, else `fallback` (looked up on `PATH`). Debian puts RabbitMQ's
/// commands in `/usr/sbin`, often not on a user's `PATH`.
fn installed(preferred: &str, fallback: &str) -> PathBuf {
    let path = PathBuf::from(preferred);
    if path.is_file() {
        path
    } else {
        PathBuf::from(fallback)
    }
}

/// Whether an AMQP connection to `uri` opens within [`PROBE_LIMIT`] (it is closed again).
async fn probe(uri: &str) -> bool {
    match tokio::time::timeout(PROBE_LIMIT, Client::connect(uri)).await {
        Ok(Ok(client)) => {
            // It answered; whether the close goes through does not matter.
            let _ = client.close().await;
            true
        }
        _ => false,
    }
}

/// A vhost of a test's own on a [`Broker`], its user granted all permissions; deleted (with
/// all in it) on drop.
pub struct Vhost {
    /// The broker it is on.
    broker: Broker,
    /// Its name.
    name: String,
}

/// A queue as `rabbitmqctl list_queues` shows it.
#[derive(Clone, Debug, Deserialize)]
pub struct QueueInfo {
    /// The queue's name.
    pub name: String,
    /// `classic`, `quorum` or `stream`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Whether it survives a broker restart.
    pub durable: bool,
    /// Whether it is deleted when its last consumer goes.
    pub auto_delete: bool,
    /// Whether it belongs to the connection that declared it (a quorum queue, which never
    /// does, lists it as an empty string).
    #[serde(deserialize_with = "flag")]
    pub exclusive: bool,
    /// Its `x-` arguments (`x-message-ttl`, `x-dead-letter-exchange`, ...).
    #[serde(deserialize_with = "table")]
    pub arguments: Map<String, Value>,
    /// Messages in it, ready or unacknowledged.
    #[serde(deserialize_with = "count")]
    pub messages: u64,
    /// Messages ready for delivery.
    #[serde(deserialize_with = "count")]
    pub messages_ready: u64,
    /// Messages delivered and not yet acknowledged.
    #[serde(deserialize_with = "count")]
    pub messages_unacknowledged: u64,
    /// Its consumers.
    #[serde(deserialize_with = "count")]
    pub consumers: u64,
}

/// An exchange as `rabbitmqctl list_exchanges` shows it.
#[derive(Clone, Debug, Deserialize)]
pub struct ExchangeInfo {
    /// The exchange's name (`""`: the default exchange).
    pub name: String,
    /// `direct`, `topic`, `fanout`, `headers`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether it survives a broker restart.
    pub durable: bool,
    /// Whether it is deleted when its last binding goes.
    pub auto_delete: bool,
    /// Whether clients may not publish to it.
    pub internal: bool,
    /// Its arguments (`alternate-exchange`, ...).
    #[serde(deserialize_with = "table")]
    pub arguments: Map<String, Value>,
}

/// A binding as `rabbitmqctl list_bindings` shows it.
#[derive(Clone, Debug, Deserialize)]
pub struct BindingInfo {
    /// The exchange bound from (`""`: the default exchange, bound to every queue by name).
    #[serde(rename = "source_name")]
    pub source: String,
    /// What the source is (`exchange`).
    pub source_kind: String,
    /// The queue or exchange bound to.
    #[serde(rename = "destination_name")]
    pub destination: String,
    /// `queue` or `exchange`.
    pub destination_kind: String,
    /// The binding's routing key (pattern, for a topic exchange).
    pub routing_key: String,
    /// Its arguments (`x-match` and headers, for a headers exchange).
    #[serde(deserialize_with = "table")]
    pub arguments: Map<String, Value>,
}

/// An AMQP table as `rabbitmqctl --formatter json` prints it (a list of `[key, type, value]`)
/// as a JSON object of key to value. Nested tables come out as objects; an array comes out as
/// the CLI prints it, an object of item type to item (it loses items of a repeated type).
fn table<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Map<String, Value>, D::Error> {
    Ok(table_of(Value::deserialize(de)?))
}

/// [`table`] on a parsed value: nested tables and arrays are turned into objects and lists.
fn table_of(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        Value::Array(fields) => fields
            .into_iter()
            .filter_map(|field| match field {
                Value::Array(field) => match <[Value; 3]>::try_from(field) {
                    Ok([Value::String(key), Value::String(kind), value]) => {
                        Some((key, typed(&kind, value)))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => Map::new(),
    }
}

/// A field value of AMQP type `kind` as plain JSON.
fn typed(kind: &str, value: Value) -> Value {
    match kind {
        "table" => Value::Object(table_of(value)),
        _ => value,
    }
}

/// A count `rabbitmqctl` may leave blank (a queue that is down): 0 then.
/// A flag `rabbitmqctl` lists as a boolean, or as an empty string where a queue type has none.
fn flag<'de, D: serde::Deserializer<'de>>(de: D) -> Result<bool, D::Error> {
    Ok(Value::deserialize(de)?.as_bool().unwrap_or(false))
}

fn count<'de, D: serde::Deserializer<'de>>(de: D) -> Result<u64, D::Error> {
    Ok(Value::deserialize(de)?.as_u64().unwrap_or(0))
}

impl Vhost {
    /// Makes a new vhost `fleet-test-<uuid>` on `on` (a [`Broker`] or a [`PrivateNode`]) with
    /// all permissions for its user, and waits until that user can connect to it.
    pub async fn create(on: &impl AsRef<Broker>) -> anyhow::Result<Vhost> {
        let broker = on.as_ref().clone();
        let name = format!("fleet-test-{}", uuid::Uuid::now_v7().simple());
        // One `rabbitmqctl` run instead of `add_vhost` and `set_permissions` (each run boots
        // an Erlang VM: about a second).
        let definitions = json!({
            "vhosts": [{"name": name}],
            "permissions": [{
                "user": broker.user, "vhost": name,
                "configure": ".*", "write": ".*", "read": ".*",
            }],
        });
        broker
            .ctl
            .run(
                &["-q", "import_definitions", "--format", "json"],
                Some(definitions.to_string().as_bytes()),
            )
            .await?;
        let vhost = Vhost { broker, name };
        let uri = vhost.uri();
        until(
            &format!("vhost {} to let its user in", vhost.name),
            VHOST_LIMIT,
            || {
                let uri = uri.clone();
                async move { probe(&uri).await.then_some(()) }
            },
        )
        .await?;
        Ok(vhost)
    }

    /// The vhost's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The broker it is on.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Its AMQP URI: `amqp://user:pass@host:port/<vhost>`.
    pub fn uri(&self) -> String {
        self.broker.uri(&self.name)
    }

    /// A plain AMQP client on it, its channel in confirm mode.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        Client::connect(&self.uri())
            .await
            .with_context(|| format!("connecting to vhost {}", self.name))
    }

    /// Its queues, with their arguments, message counts and consumers.
    pub async fn queues(&self) -> anyhow::Result<Vec<QueueInfo>> {
        self.list(
            "list_queues",
            &[
                "name",
                "type",
                "durable",
                "auto_delete",
                "exclusive",
                "arguments",
                "messages",
                "messages_ready",
                "messages_unacknowledged",
                "consumers",
            ],
        )
        .await
    }

    /// Its queue `name`, if there is one.
    pub async fn queue(&self, name: &str) -> anyhow::Result<Option<QueueInfo>> {
        Ok(self.queues().await?.into_iter().find(|q| q.name == name))
    }

    /// Its exchanges, the predeclared `amq.*` and default ones included.
    pub async fn exchanges(&self) -> anyhow::Result<Vec<ExchangeInfo>> {
        self.list(
            "list_exchanges",
            &[
                "name",
                "type",
                "durable",
                "auto_delete",
                "internal",
                "arguments",
            ],
        )
        .await
    }

    /// Its bindings, those of the default exchange included.
    pub async fn bindings(&self) -> anyhow::Result<Vec<BindingInfo>> {
        self.list(
            "list_bindings",
            &[
                "source_name",
                "source_kind",
                "destination_name",
                "destination_kind",
                "routing_key",
                "arguments",
            ],
        )
        .await
    }

    /// `rabbitmqctl <command> -p <vhost> <items> --formatter json`, parsed.
    async fn list<T: serde::de::DeserializeOwned>(
        &self,
        command: &str,
        items: &[&str],
    ) -> anyhow::Result<Vec<T>> {
        let mut args = vec!["-q", command, "-p", &self.name];
        args.extend_from_slice(items);
        args.extend_from_slice(&["--formatter", "json"]);
        let out = self.broker.ctl.run(&args, None).await?;
        serde_json::from_str(&out).with_context(|| format!("parsing {command} output {out:?}"))
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        // A node that is down (a stopped private node) has nothing to delete it on.
        let up = format!("{}:{}", self.broker.host, self.broker.port)
            .parse::<SocketAddr>()
            .map_or(true, |addr| {
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
            });
        if !up {
            eprintln!("vhost {} left: its broker is down", self.name);
            return;
        }
        if let Err(e) = self
            .broker
            .ctl
            .run_blocking(&["-q", "delete_vhost", &self.name])
        {
            eprintln!("could not delete vhost {}: {e:#}", self.name);
        }
    }
}

/// A RabbitMQ node of a test's own: its own node name, AMQP and distribution ports on
/// 127.0.0.1 that were free when picked (see [`PrivateNode::start`]), its own Erlang cookie, no
/// plugins, its data and logs in a temporary directory; maybe a TLS listener too (see
/// [`PrivateNode::start_tls`]). Stopping it stops only it; a restart keeps its ports and data,
/// so durable queues and persistent messages survive (a restart fails if another process took
/// a port meanwhile). Dropping it kills it and removes its directory.
pub struct PrivateNode {
    /// Its data, logs, config and `HOME`; removed on drop.
    dir: tempfile::TempDir,
    /// Its node name, `fleet-<uuid>@localhost`.
    name: String,
    /// Its distribution port.
    dist_port: u16,
    /// It as a broker: its AMQP port and `rabbitmqctl -n <name>` with its cookie.
    broker: Broker,
    /// The `rabbitmq-server` process (the Erlang VM), while it runs.
    child: Option<Child>,
    /// How many times it was started (each start's output goes to its own file).
    starts: usize,
    /// Its TLS listener, if it has one.
    tls: Option<NodeTls>,
}

/// A private node's TLS listener.
struct NodeTls {
    /// Its port on 127.0.0.1.
    port: u16,
    /// The files made for it.
    certs: TlsCerts,
}

/// A loopback port nobody listened on a moment ago, for a program that binds its ports itself
/// (RabbitMQ takes port numbers, not inherited sockets). Racy by necessity: the port is free
/// when picked and released at once, and another process may take it before the program binds
/// it.
fn unclaimed_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Whether a node failed to start because one of its ports was taken (what RabbitMQ and the
/// Erlang VM say when a listen fails: `eaddrinuse`, "in use").
fn port_taken(failure: &anyhow::Error) -> bool {
    let text = format!("{failure:#}").to_ascii_lowercase();
    text.contains("eaddrinuse") || text.contains("in use")
}

impl PrivateNode {
    /// Starts a node and waits until it takes AMQP connections. Its ports are picked with
    /// [`unclaimed_port`], so another process may take one first: the node then fails to bind
    /// it, and a new node starts on new ports, up to [`PORT_ATTEMPTS`] times. (Left: another
    /// AMQP server taking the port could answer the readiness probe in the node's place.)
    pub async fn start() -> anyhow::Result<PrivateNode> {
        Self::start_with(None, None).await
    }

    /// [`PrivateNode::start`], with a TLS listener besides the plain one, on another port picked
    /// the same way: the harness makes a CA, the node's certificate for `setup`'s names, a
    /// client certificate and an unrelated CA (see [`PrivateNode::tls_certs`]), and the node
    /// demands a client certificate if `setup` says so. It is ready once the TLS port takes
    /// connections too.
    pub async fn start_tls(setup: &TlsSetup) -> anyhow::Result<PrivateNode> {
        Self::start_with(Some(setup), None).await
    }

    /// Starts a node, with a TLS listener for `tls` and the Erlang cookie `cookie` (else one of
    /// its own), on fresh ports after a taken one.
    async fn start_with(
        tls: Option<&TlsSetup>,
        cookie: Option<&str>,
    ) -> anyhow::Result<PrivateNode> {
        let mut attempt = 1;
        loop {
            match Self::start_once(tls, cookie).await {
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => {
                    eprintln!("a private RabbitMQ node's port was taken; new ports: {e:#}");
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    /// [`PrivateNode::start_with`], once.
    async fn start_once(
        tls: Option<&TlsSetup>,
        cookie: Option<&str>,
    ) -> anyhow::Result<PrivateNode> {
        let dir = tempfile::Builder::new().prefix("fleet-rabbit-").tempdir()?;
        let base = dir.path();
        let home = base.join("home");
        std::fs::create_dir(&home)?;
        // Server and `rabbitmqctl` share this `HOME`, so this cookie.
        let cookie = cookie.map_or_else(
            || uuid::Uuid::now_v7().simple().to_string().to_uppercase(),
            str::to_string,
        );
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(home.join(".erlang.cookie"))
            .and_then(|mut f| io::Write::write_all(&mut f, cookie.as_bytes()))?;
        std::fs::write(base.join("enabled_plugins"), "[].\n")?;
        // In place of /etc/rabbitmq's files (the shared node's name and settings). The config
        // is in the classic Erlang format, which skips the `.conf` schema translation (about a
        // second of every start). No free-disk alarm over a small /tmp: it would block
        // publishers without a word.
        std::fs::write(base.join("rabbitmq-env.conf"), "")?;
        let tls = match tls {
            Some(setup) => {
                let certs = TlsCerts::make(&base.join("tls"), setup)?;
                let port = unclaimed_port()?;
                Some((certs.rabbit_settings(port, setup), NodeTls { port, certs }))
            }
            None => None,
        };
        let listener = tls
            .as_ref()
            .map(|(settings, _)| format!(",\n {settings}"))
            .unwrap_or_default();
        std::fs::write(
            base.join("rabbitmq.config"),
            format!("[{{rabbit, [{{disk_free_limit, 1000000}}{listener}]}}].\n"),
        )?;
        std::fs::write(base.join("advanced.config"), "[].\n")?;
        let name = format!("fleet-{}@localhost", uuid::Uuid::now_v7().simple());
        let broker = Broker {
            host: "127.0.0.1".into(),
            port: unclaimed_port()?,
            user: "guest".into(),
            password: "guest".into(),
            ctl: Ctl {
                program: installed("/usr/lib/rabbitmq/bin/rabbitmqctl", "rabbitmqctl"),
                node: Some(name.clone()),
                env: vec![
                    ("HOME", home.into_os_string()),
                    (
                        "RABBITMQ_CONF_ENV_FILE",
                        base.join("rabbitmq-env.conf").into_os_string(),
                    ),
                ],
            },
        };
        let mut node = PrivateNode {
            name,
            dist_port: unclaimed_port()?,
            broker,
            dir,
            child: None,
            starts: 0,
            tls: tls.map(|(_, tls)| tls),
        };
        node.restart().await?;
        Ok(node)
    }

    /// Its node name (`rabbitmqctl -n` takes it; see [`Broker::rabbitmqctl`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its AMQP port (the same across restarts).
    pub fn port(&self) -> u16 {
        self.broker.port
    }

    /// The node as a [`Broker`], to make a [`Vhost`] on.
    pub fn broker(&self) -> Broker {
        self.broker.clone()
    }

    /// The URI of `vhost` on this node (`"/"`: the default vhost).
    pub fn uri(&self, vhost: &str) -> String {
        self.broker.uri(vhost)
    }

    /// The `amqps://` URI of `vhost` on this node's TLS listener, at 127.0.0.1; `None` without
    /// one.
    pub fn amqps_uri(&self, vhost: &str) -> Option<String> {
        let tls = self.tls.as_ref()?;
        Some(format!(
            "{}/{}",
            self.broker.url_at("amqps", tls.port),
            utf8_percent_encode(vhost, COMPONENT)
        ))
    }

    /// The CA, certificates and keys made for its TLS listener; `None` without one.
    pub fn tls_certs(&self) -> Option<&TlsCerts> {
        self.tls.as_ref().map(|tls| &tls.certs)
    }

    /// Whether it is running (started and not stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Its temporary directory (data under `mnesia/`, logs under `log/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What its latest start wrote: its output, then its log file.
    pub fn log(&self) -> String {
        let base = self.dir.path();
        let output = base.join(format!("server-{}.out", self.starts));
        let log = base.join("log").join(format!("{}.log", self.name));
        [output, log]
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Starts the node again on the same ports and data (after [`PrivateNode::stop`]), and
    /// waits until it takes AMQP connections.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "node {} is running", self.name);
        self.starts += 1;
        let started = Instant::now();
        let output =
            std::fs::File::create(self.dir.path().join(format!("server-{}.out", self.starts)))?;
        let mut command = self.server_command();
        command
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            // Its own process group, so dropping the node kills all of it.
            .process_group(0);
        self.child = Some(spawn_tied(command).context("starting rabbitmq-server")?);
        let uri = self.uri("/");
        let child = &mut self.child;
        let ready = until(
            &format!("private RabbitMQ node {} to take connections", self.name),
            NODE_START_LIMIT,
            || {
                let exited = child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                let uri = uri.clone();
                async move {
                    if let Some(status) = exited {
                        return Some(Err(anyhow::anyhow!("rabbitmq-server exited ({status})")));
                    }
                    probe(&uri).await.then_some(Ok(()))
                }
            },
        )
        .await
        .and_then(|ready| ready);
        // The TLS listener starts with the plain one; it counts only once it takes connections.
        let ready = match (ready, self.tls.as_ref().map(|tls| tls.port)) {
            (Ok(()), Some(port)) => {
                until(
                    &format!("TLS port {port} of the node to take connections"),
                    NODE_START_LIMIT,
                    || async move {
                        tokio::net::TcpStream::connect(("127.0.0.1", port))
                            .await
                            .ok()
                            .map(drop)
                    },
                )
                .await
            }
            (ready, _) => ready,
        };
        if let Err(e) = ready {
            self.kill();
            return Err(e.context(format!("its output and log:\n{}", self.log())));
        }
        eprintln!(
            "private RabbitMQ node {} on port {} took connections {:?} after it was started",
            self.name,
            self.broker.port,
            started.elapsed()
        );
        Ok(())
    }

    /// Stops the node (SIGTERM: RabbitMQ shuts down cleanly) and waits until it has exited and
    /// its port refuses connections.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            anyhow::bail!("node {} is not running", self.name);
        };
        let started = Instant::now();
        if let Some(pid) = pid(&child) {
            // It may have died on its own already.
            let _ = rustix::process::kill_process(pid, Signal::TERM);
        }
        let exited = until(
            &format!("private RabbitMQ node {} to exit", self.name),
            NODE_STOP_LIMIT,
            || {
                let exited = child.try_wait().ok().flatten();
                async move { exited }
            },
        )
        .await;
        if let Err(e) = exited {
            self.child = Some(child);
            self.kill();
            return Err(e);
        }
        let port = self.broker.port;
        until(
            &format!("port {port} of the stopped node to refuse connections"),
            NODE_STOP_LIMIT,
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_err()
                    .then_some(())
            },
        )
        .await?;
        eprintln!(
            "private RabbitMQ node {} stopped in {:?}",
            self.name,
            started.elapsed()
        );
        Ok(())
    }

    /// Kills the node at once (SIGKILL to the Erlang VM and all it runs: a crash, nothing
    /// flushed or said goodbye to) and waits until its port refuses connections. A
    /// [`PrivateNode::restart`] brings it back on its data.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_some(), "node {} is not running", self.name);
        self.kill();
        let port = self.broker.port;
        until(
            &format!("port {port} of the killed node to refuse connections"),
            NODE_STOP_LIMIT,
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_err()
                    .then_some(())
            },
        )
        .await?;
        eprintln!("private RabbitMQ node {} killed", self.name);
        Ok(())
    }

    /// `rabbitmq-server` for this node, in the foreground, with everything of its own.
    fn server_command(&self) -> Command {
        let base = self.dir.path();
        let mut command = Command::new(installed(
            "/usr/lib/rabbitmq/bin/rabbitmq-server",
            "rabbitmq-server",
        ));
        // Nothing of the caller's RabbitMQ settings (nor of systemd's).
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("RABBITMQ_") {
                command.env_remove(&key);
            }
        }
        command
            .env_remove("NOTIFY_SOCKET")
            .envs(self.broker.ctl.env.iter().map(|(k, v)| (k, v)))
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.broker.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_MNESIA_BASE", base.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", base.join("log"))
            .env("RABBITMQ_PLUGINS_EXPAND_DIR", base.join("plugins-expand"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                base.join("enabled_plugins"),
            )
            .env("RABBITMQ_CONFIG_FILE", base.join("rabbitmq.config"))
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                base.join("advanced.config"),
            )
            .env("RABBITMQ_PID_FILE", base.join("node.pid"))
            // With input allowed, the script execs the Erlang VM instead of running it as a
            // child: the VM is our child, and gets the parent-death signal. `-noinput` keeps
            // it from reading a shell from stdin all the same.
            .env("RABBITMQ_ALLOW_INPUT", "1")
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-noinput -kernel inet_dist_use_interface {127,0,0,1}",
            )
            .current_dir(base);
        command
    }

    /// Kills the node's process group at once and reaps it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = pid(&child) {
                let _ = rustix::process::kill_process_group(pid, Signal::KILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl AsRef<Broker> for PrivateNode {
    fn as_ref(&self) -> &Broker {
        &self.broker
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A child's pid, for signals.
fn pid(child: &Child) -> Option<Pid> {
    Pid::from_raw(i32::try_from(child.id()).ok()?)
}

/// A job for the spawner thread: a command, and where to send the child.
type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `command` so that it gets SIGKILL when this process dies, however it dies.
///
/// Linux sends the parent-death signal when the *thread* that forked the child ends, so the
/// fork happens on a thread of ours that lives as long as the process, not on a test's thread
/// or a runtime's (those end before the process does).
fn spawn_tied(mut command: Command) -> anyhow::Result<Child> {
    static SPAWNER: OnceLock<io::Result<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    // SAFETY: the closure only makes one system call (prctl), which is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("fleet-testkit-spawner".into())
            .spawn(move || {
                for (mut command, reply) in queue {
                    let _ = reply.send(command.spawn());
                }
            })
            .map(|_| jobs)
    });
    let spawner = spawner
        .as_ref()
        .map_err(|e| anyhow::anyhow!("starting the spawner thread: {e}"))?;
    let (reply, child) = mpsc::channel();
    spawner
        .send((command, reply))
        .map_err(|_| anyhow::anyhow!("the spawner thread is gone"))?;
    Ok(child
        .recv()
        .map_err(|_| anyhow::anyhow!("the spawner thread is gone"))??)
}
