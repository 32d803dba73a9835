//! Federated gateways as the cross-host suites start them: each a real fleetd of a test host
//! (its `host_id`, and its key the test key of that name: [`crate::keys`]), with one lead and
//! the scripted agent as profile `sim`, on the real RabbitMQ at a vhost of the test's own;
//! presence and receipts quick. [`TwoHosts`] is the pair most of them start with.

use crate::broker::{Broker, Vhost};
use crate::client::{Client, Protocol};
use crate::fleet::{Fleet, agent_workdir, sim_profile};
use crate::keys;

/// The test hosts every test gateway pins (each to its test key): those of the gateways the
/// tests start, and those a test stands in for.
pub const HOSTS: [&str; 7] = [
    "hosta", "hostb", "hostc", "hostd", "hostf", "hostg", "hosth",
];

/// Every lead of the test hosts, as a lead's `share` default names them: the test fleets'
/// leads task one another's workers (a lead's own is not shared with itself).
pub const SHARED: &str = r#""alice@hosta", "bob@hostb", "carol@hostc""#;

/// The `[federation]` keys of a test gateway: quick presence and receipts.
pub const QUICK: &str = "presence_interval_s = 1\npresence_ttl_s = 3\ninjected_bound_s = 3\n";

/// A gateway of host `host` with lead `lead` and the scripted agent as profile `sim`, on the
/// broker at `uri`; `extra` is more `[federation]` keys (and what follows them).
pub async fn gateway(uri: &str, host: &str, lead: &str, extra: &str) -> anyhow::Result<Fleet> {
    gateway_with(uri, host, lead, "", &format!("{QUICK}{extra}")).await
}

/// [`gateway`] with more `[gateway]` lines, and `[federation]` keys (and what follows them)
/// of its own in place of [`QUICK`].
pub async fn gateway_with(
    uri: &str,
    host: &str,
    lead: &str,
    gateway: &str,
    federation: &str,
) -> anyhow::Result<Fleet> {
    // Its workers work under the scripted agents' directory: a spawn for another host's lead
    // goes only under a host's roots.
    let gateway = format!("workdir_roots = [{:?}]\n{gateway}", agent_workdir());
    Fleet::start_as(
        host,
        &gateway,
        &format!(
            "[leads.{lead}]\ngroups = []\nshare = [{SHARED}]\n\n{}\n[broker]\nuri = \"{uri}\"\nheartbeat_s = 5\n\n[federation]\n{federation}\n{}",
            sim_profile("sim", &[])?,
            keys::admitting(&HOSTS)
        ),
    )
    .await
}

/// Two gateways on a vhost of their own, and their leads: `hosta` with alice, `hostb` with
/// bob. The vhost is removed when the pair goes, after the gateways (fields drop in order); a
/// test that takes the pair apart names `vhost` first in its pattern, so that it drops last
/// (a pattern's bindings drop in reverse).
pub struct TwoHosts {
    /// The gateway of `hosta`.
    pub a: Fleet,
    /// The gateway of `hostb`.
    pub b: Fleet,
    /// Lead alice, on `hosta`.
    pub alice: Client,
    /// Lead bob, on `hostb`.
    pub bob: Client,
    /// The vhost both are on.
    pub vhost: Vhost,
}

impl TwoHosts {
    /// The pair on the machine's broker (or a private node: [`Broker::find`]).
    pub async fn start() -> anyhow::Result<Self> {
        Self::on(&Broker::find().await?, "").await
    }

    /// The pair on `broker`, both with `extra` `[federation]` keys besides [`QUICK`].
    pub async fn on(broker: &impl AsRef<Broker>, extra: &str) -> anyhow::Result<Self> {
        Self::each(broker, extra, extra).await
    }

    /// The pair on `broker`, `hosta` with `extra_a` and `hostb` with `extra_b` as more
    /// `[federation]` keys (and what follows them: a profile, say) besides [`QUICK`].
    pub async fn each(
        broker: &impl AsRef<Broker>,
        extra_a: &str,
        extra_b: &str,
    ) -> anyhow::Result<Self> {
        let vhost = Vhost::create(broker).await?;
        let a = gateway(&vhost.uri(), "hosta", "alice", extra_a).await?;
        let b = gateway(&vhost.uri(), "hostb", "bob", extra_b).await?;
        let alice = a.lead("alice", Protocol::Stateless).await?;
        let bob = b.lead("bob", Protocol::Stateless).await?;
        Ok(Self {
            a,
            b,
            alice,
            bob,
            vhost,
        })
    }
}
