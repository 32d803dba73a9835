//! The real RabbitMQ for broker tests and benchmarks: where it is, a vhost of a test's own
//! (removed when dropped), and a private node a test may stop and restart (the machine's shared
//! broker is never stopped).
//!
//! Vhosts are made with `rabbitmqctl` on the broker's node, so the broker must be on this
//! machine: `FLEET_TEST_AMQP_URL` (`amqp://user:pass@host:port`, no vhost) names one, with
//! `FLEET_TEST_RABBIT_NODE` as its node name when it is not the default node.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::OnceCell;

use crate::fleet::free_port;
use crate::wait::until;

/// How long a private node may take to start (8–9 s here).
const NODE_START_LIMIT: Duration = Duration::from_secs(90);

/// A broker the tests may use: its AMQP base URL and, for `rabbitmqctl`, its node name
/// (`None`: the default node).
#[derive(Clone, Debug)]
pub struct Broker {
    base: String,
    node: Option<String>,
}

/// The private node started when this machine has no broker, kept for the whole process.
static FALLBACK: OnceCell<PrivateNode> = OnceCell::const_new();

impl Broker {
    /// `FLEET_TEST_AMQP_URL` if set; else the machine's RabbitMQ on 127.0.0.1:5672 if it takes
    /// connections; else a private node started for this process.
    pub async fn find() -> anyhow::Result<Broker> {
        if let Ok(url) = std::env::var("FLEET_TEST_AMQP_URL") {
            return Ok(Broker {
                base: url.trim_end_matches('/').to_string(),
                node: std::env::var("FLEET_TEST_RABBIT_NODE").ok(),
            });
        }
        let shared = Broker {
            base: "amqp://guest:guest@127.0.0.1:5672".into(),
            node: None,
        };
        if shared.answers().await {
            return Ok(shared);
        }
        let node = FALLBACK.get_or_try_init(PrivateNode::start).await?;
        Ok(node.broker())
    }

    /// Whether an AMQP connection to the default vhost succeeds.
    async fn answers(&self) -> bool {
        let uri = format!("{}/%2f", self.base);
        match lapin::Connection::connect(&uri, lapin::ConnectionProperties::default()).await {
            Ok(conn) => {
                let _ = conn.close(200, "probe".into()).await;
                true
            }
            Err(_) => false,
        }
    }

    /// `rabbitmqctl` on this broker's node.
    fn ctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut command = Command::new(rabbitmqctl());
        if let Some(node) = &self.node {
            command.args(["-n", node]);
        }
        let out = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running rabbitmqctl")?;
        anyhow::ensure!(
            out.status.success(),
            "rabbitmqctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `rabbitmqctl`, which Debian puts in `/usr/sbin` (not always on `PATH`).
fn rabbitmqctl() -> PathBuf {
    let sbin = PathBuf::from("/usr/sbin/rabbitmqctl");
    if sbin.is_file() {
        sbin
    } else {
        PathBuf::from("rabbitmqctl")
    }
}

/// A vhost of a test's own, with all permissions for the broker's user; deleted on drop.
pub struct Vhost {
    broker: Broker,
    name: String,
}

impl Vhost {
    /// Creates a fresh vhost on `broker`.
    pub async fn create(broker: &Broker) -> anyhow::Result<Vhost> {
        let name = format!("fleet-test-{}", uuid::Uuid::now_v7().simple());
        let user = url::Url::parse(&broker.base)
            .map(|u| u.username().to_string())
            .unwrap_or_else(|_| "guest".into());
        let (broker, vhost) = (broker.clone(), name.clone());
        let made = tokio::task::spawn_blocking(move || {
            broker.ctl(&["add_vhost", &vhost])?;
            broker.ctl(&["set_permissions", "-p", &vhost, &user, ".*", ".*", ".*"])?;
            anyhow::Ok(broker)
        })
        .await??;
        Ok(Vhost { broker: made, name })
    }

    /// The vhost's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its AMQP URI.
    pub fn uri(&self) -> String {
        format!("{}/{}", self.broker.base, self.name)
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        if let Err(e) = self.broker.ctl(&["delete_vhost", &self.name]) {
            eprintln!("could not delete vhost {}: {e}", self.name);
        }
    }
}

/// A RabbitMQ node of a test's own, on free ports, with its data in a temporary directory:
/// stopping it stops only it, and a restart keeps its durable queues.
pub struct PrivateNode {
    dir: tempfile::TempDir,
    name: String,
    port: u16,
    dist_port: u16,
    child: Option<Child>,
}

impl PrivateNode {
    /// Starts a node and waits until it takes AMQP connections.
    pub async fn start() -> anyhow::Result<PrivateNode> {
        let dir = tempfile::Builder::new().prefix("fleet-rabbit-").tempdir()?;
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n")?;
        // The packaged server drops to the `rabbitmq` user: its directory must be theirs.
        if let Some((uid, gid)) = rabbitmq_ids() {
            chown_tree(dir.path(), uid, gid)?;
        }
        let mut node = PrivateNode {
            name: format!("fleet-{}@localhost", uuid::Uuid::now_v7().simple()),
            port: free_port()?,
            dist_port: free_port()?,
            dir,
            child: None,
        };
        node.restart().await?;
        Ok(node)
    }

    /// The node as a [`Broker`].
    pub fn broker(&self) -> Broker {
        Broker {
            base: format!("amqp://guest:guest@127.0.0.1:{}", self.port),
            node: Some(self.name.clone()),
        }
    }

    /// Starts the node again on the same ports and data (after [`PrivateNode::stop`]).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let base = self.dir.path();
        let log = std::fs::File::create(base.join("server.log"))?;
        let mut command = Command::new(server_binary());
        command
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", base.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", base.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                base.join("enabled_plugins"),
            )
            .env("RABBITMQ_CONFIG_FILE", base.join("rabbitmq"))
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                base.join("advanced.config"),
            )
            .env("RABBITMQ_PID_FILE", base.join("node.pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own process group, so dropping the node kills all of it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        self.child = Some(command.spawn().context("starting rabbitmq-server")?);
        let broker = self.broker();
        let log_path = base.join("server.log");
        until(
            "the private RabbitMQ node to take connections",
            NODE_START_LIMIT,
            || {
                let broker = broker.clone();
                async move { broker.answers().await.then_some(()) }
            },
        )
        .await
        .with_context(|| std::fs::read_to_string(&log_path).unwrap_or_default())
    }

    /// Stops the node and waits until its port refuses connections.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let broker = self.broker();
        tokio::task::spawn_blocking(move || broker.ctl(&["stop"])).await??;
        if let Some(mut child) = self.child.take() {
            tokio::task::spawn_blocking(move || child.wait()).await??;
        }
        let port = self.port;
        until(
            "the private node's port to close",
            NODE_START_LIMIT,
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_err()
                    .then_some(())
            },
        )
        .await
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
        }
    }
}

/// `rabbitmq-server`, from `/usr/sbin` if it is there.
fn server_binary() -> PathBuf {
    let sbin = PathBuf::from("/usr/sbin/rabbitmq-server");
    if sbin.is_file() {
        sbin
    } else {
        PathBuf::from("rabbitmq-server")
    }
}

/// The uid and gid of the `rabbitmq` user, when we are root and it exists.
fn rabbitmq_ids() -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "rabbitmq"]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    let root = Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .is_some_and(|o| o.stdout.trim_ascii() == b"0");
    root.then(|| Some((id("-u")?, id("-g")?))).flatten()
}

fn chown_tree(path: &std::path::Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}
