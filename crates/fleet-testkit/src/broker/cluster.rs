//! A RabbitMQ cluster of a test's own: private nodes (each with its own name, ports and data
//! dir) sharing one Erlang cookie, joined with `rabbitmqctl join_cluster`; a test may kill any
//! of them with SIGKILL and start it again, when it rejoins by itself. Dropping the cluster
//! kills every node and removes their directories.

use anyhow::Context;
use serde::Deserialize;
use tokio::time::Instant;

use super::{Broker, PrivateNode};
use crate::wait::until;

/// How long a restarted node may take to run in the cluster again, once it takes connections.
const REJOIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A cluster of private nodes.
pub struct Cluster {
    /// Its nodes; the first is the one the others joined.
    nodes: Vec<PrivateNode>,
}

/// What `rabbitmqctl cluster_status --formatter json` says, of what the tests look at.
#[derive(Deserialize)]
struct Status {
    running_nodes: Vec<String>,
}

/// One queue as `rabbitmqctl list_queues name leader online` lists it.
#[derive(Deserialize)]
struct Replicas {
    name: String,
    /// Its leader's node (empty for a classic queue).
    #[serde(default)]
    leader: serde_json::Value,
    /// The nodes of its members that are up (a quorum queue's).
    #[serde(default)]
    online: serde_json::Value,
}

impl Cluster {
    /// Starts `size` nodes at once sharing a new cookie, joins each after the first to it with
    /// `rabbitmqctl stop_app`, `join_cluster` and `start_app` (one at a time, as RabbitMQ
    /// asks), and waits until the first sees them all running.
    pub async fn start(size: usize) -> anyhow::Result<Cluster> {
        anyhow::ensure!(size >= 1, "a cluster has a node at least");
        let started = Instant::now();
        let cookie = uuid::Uuid::now_v7().simple().to_string().to_uppercase();
        let starts = (0..size).map(|_| PrivateNode::start_with(None, Some(&cookie)));
        let nodes = futures_util::future::join_all(starts)
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<_>>>()?;
        let booted = started.elapsed();
        let seed = nodes[0].name().to_string();
        for node in &nodes[1..] {
            let ctl = node.broker();
            ctl.rabbitmqctl(&["-q", "stop_app"]).await?;
            ctl.rabbitmqctl(&["-q", "join_cluster", &seed])
                .await
                .with_context(|| format!("joining {} to {seed}", node.name()))?;
            ctl.rabbitmqctl(&["-q", "start_app"]).await?;
        }
        let cluster = Cluster { nodes };
        let names: Vec<String> = cluster.nodes.iter().map(|n| n.name().to_string()).collect();
        for name in &names {
            cluster.until_running(name).await?;
        }
        eprintln!(
            "RabbitMQ cluster of {size} nodes up in {:?} (nodes booted in {booted:?}, then joined)",
            started.elapsed()
        );
        Ok(cluster)
    }

    /// Its `i`th node.
    pub fn node(&self, i: usize) -> &PrivateNode {
        &self.nodes[i]
    }

    /// How many nodes it has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no node (never: [`Cluster::start`] makes one at least).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The URI of `vhost` on each node, in the nodes' order: a gateway's `[broker] uris`.
    pub fn uris(&self, vhost: &str) -> Vec<String> {
        self.nodes.iter().map(|n| n.uri(vhost)).collect()
    }

    /// A running node as a [`Broker`] (the first that runs): to make a vhost on (vhosts are the
    /// cluster's, whichever node makes them) and to run `rabbitmqctl` against.
    pub fn broker(&self) -> anyhow::Result<Broker> {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .map(PrivateNode::broker)
            .context("no node of the cluster runs")
    }

    /// The index of the node called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name() == name)
    }

    /// Kills node `i` with SIGKILL (see [`PrivateNode::kill9`]).
    pub async fn kill9(&mut self, i: usize) -> anyhow::Result<()> {
        self.nodes[i].kill9().await
    }

    /// Starts node `i` again on its data, and waits until the cluster runs it again.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.nodes[i].restart().await?;
        let name = self.nodes[i].name().to_string();
        self.until_running(&name).await
    }

    /// The nodes running in the cluster, as a running node sees them.
    pub async fn running(&self) -> anyhow::Result<Vec<String>> {
        let out = self
            .broker()?
            .rabbitmqctl(&["-q", "cluster_status", "--formatter", "json"])
            .await?;
        let status: Status =
            serde_json::from_str(&out).with_context(|| format!("parsing {out:?}"))?;
        Ok(status.running_nodes)
    }

    /// Waits until the cluster runs node `name`.
    async fn until_running(&self, name: &str) -> anyhow::Result<()> {
        until(
            &format!("the cluster to run {name}"),
            REJOIN_LIMIT,
            || async {
                self.running()
                    .await
                    .ok()
                    .filter(|running| running.iter().any(|n| n == name))
                    .map(drop)
            },
        )
        .await
    }

    /// The node leading quorum queue `queue` of `vhost`, and the nodes of its members that are
    /// up; `None` when there is no such quorum queue.
    pub async fn replicas(
        &self,
        vhost: &str,
        queue: &str,
    ) -> anyhow::Result<Option<(String, Vec<String>)>> {
        let out = self
            .broker()?
            .rabbitmqctl(&[
                "-q",
                "list_queues",
                "-p",
                vhost,
                "name",
                "leader",
                "online",
                "--formatter",
                "json",
            ])
            .await?;
        let queues: Vec<Replicas> =
            serde_json::from_str(&out).with_context(|| format!("parsing {out:?}"))?;
        Ok(queues.into_iter().find(|q| q.name == queue).and_then(|q| {
            let leader = q.leader.as_str().filter(|l| !l.is_empty())?.to_string();
            let online = q
                .online
                .as_array()
                .map(|nodes| {
                    nodes
                        .iter()
                        .filter_map(|n| n.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            Some((leader, online))
        }))
    }
}
