//! Federation over `amqps://`: real fleetd processes on a private RabbitMQ node with a TLS
//! listener, its CA and certificates made by the harness. A gateway that trusts the node's CA
//! by `broker.ca_file` federates; one that trusts another CA, reaches the node by a name its
//! certificate lacks, or shows a node that demands a client certificate none or one of another
//! CA is refused at start, and says which.

use std::time::Duration;

use fleet_testkit::broker::{CLIENT_NAME, PrivateNode, TlsCerts, TlsSetup, Vhost};
use fleet_testkit::client::{Client, Protocol};
use fleet_testkit::fleet::{Fleet, sim_profile};
use fleet_testkit::keys;
use fleet_testkit::wait::until;

use fleet_testkit::hosts::SHARED;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(30);

/// A gateway of host `host` with lead `lead` and the scripted agent as profile `sim`, on the
/// broker at `uri`, with `tls` (`ca_file = …` and the like) in its `[broker]`.
async fn gateway(uri: &str, host: &str, lead: &str, tls: &str) -> anyhow::Result<Fleet> {
    Fleet::start_as(
        host,
        "",
        &format!(
            "[leads.{lead}]\ngroups = []\nshare = [{SHARED}]\n\n{}\n[broker]\nuri = \"{uri}\"\nheartbeat_s = 5\n{tls}\n[federation]\npresence_interval_s = 1\npresence_ttl_s = 3\n{}",
            sim_profile("sim", &[])?,
            keys::admitting(&["hosta", "hostb", "hostc"])
        ),
    )
    .await
}

/// Why a gateway with `tls` did not start: all fleetd said.
async fn refused(uri: &str, tls: &str) -> anyhow::Result<String> {
    match gateway(uri, "hostc", "carol", tls).await {
        Ok(fleet) => anyhow::bail!("the gateway started:\n{}", fleet.log()),
        Err(e) => {
            let said = format!("{e:#}");
            for line in said.lines().filter(|l| l.starts_with("fleetd: error")) {
                println!("{line}");
            }
            Ok(said)
        }
    }
}

/// What a gateway with `tls` says about a node that refuses its client certificate, or its
/// lack. The node says why in an alert and closes; when the gateway's next bytes reach it after
/// that, its reset can beat the alert (TLS 1.3 sends the first AMQP bytes before the refusal;
/// TLS 1.2 the rest of the handshake). With the alert fleetd stops at start, naming the
/// failure; after a reset it starts, retrying, and its warning carries the hint. Either way:
/// the alert's refusal or the hint, and all fleetd said.
async fn refused_or_hinted(uri: &str, tls: &str) -> anyhow::Result<(String, String)> {
    match gateway(uri, "hostc", "carol", tls).await {
        Err(e) => {
            let said = format!("{e:#}");
            let line = said
                .lines()
                .find(|l| l.starts_with("fleetd: error"))
                .unwrap_or_default()
                .to_string();
            println!("refused: {line}");
            Ok((line, said))
        }
        Ok(fleet) => {
            let said = fleet.log();
            let line = said
                .lines()
                .find(|l| l.contains("the broker cannot be reached yet"))
                .unwrap_or_default()
                .to_string();
            println!("reset, retrying: {line}");
            Ok((line, said))
        }
    }
}

/// `[broker]` lines naming `path` as `key`.
fn file(key: &str, path: &std::path::Path) -> String {
    format!("{key} = \"{}\"\n", path.display())
}

/// The node's TLS files and the `amqps://` URI of `vhost`.
fn tls_of<'a>(node: &'a PrivateNode, vhost: &Vhost) -> anyhow::Result<(&'a TlsCerts, String)> {
    let certs = node
        .tls_certs()
        .ok_or_else(|| anyhow::anyhow!("the node has no TLS listener"))?;
    let uri = node
        .amqps_uri(vhost.name())
        .ok_or_else(|| anyhow::anyhow!("the node has no TLS listener"))?;
    Ok((certs, uri))
}

/// The connections to `vhost` on `node`, as `rabbitmqctl list_connections` shows them: whether
/// each is TLS, and the subject of its client certificate.
async fn connections(node: &PrivateNode, vhost: &Vhost) -> anyhow::Result<Vec<Value>> {
    let out = node
        .broker()
        .rabbitmqctl(&[
            "-q",
            "list_connections",
            "vhost",
            "ssl",
            "peer_cert_subject",
            "--formatter",
            "json",
        ])
        .await?;
    let all: Vec<Value> = serde_json::from_str(&out)?;
    Ok(all
        .into_iter()
        .filter(|c| c["vhost"] == vhost.name())
        .collect())
}

/// Waits until `lead`'s `fleet_list` shows `name` with its host heard.
async fn sees(lead: &Client, name: &str) -> anyhow::Result<Value> {
    until(&format!("the roster to show {name}"), LIMIT, || async {
        lead.heard_entry(name).await.ok()
    })
    .await
}

/// Two gateways on `uri` with `tls` each, and a worker on the second that the first one's lead
/// sends a task to: the answer comes back across the broker.
async fn round_trip(uri: &str, tls: &str) -> anyhow::Result<(Fleet, Fleet)> {
    let a = gateway(uri, "hosta", "alice", tls).await?;
    let b = gateway(uri, "hostb", "bob", tls).await?;
    let alice = a.lead("alice", Protocol::Stateless).await?;
    let bob = b.lead("bob", Protocol::Stateless).await?;
    bob.spawn("sim", "wb").await?;
    let entry = sees(&alice, "wb").await?;
    assert_eq!(entry["host"], "hostb", "{entry}");
    let sent = alice.send("wb", "over TLS", 20).await?;
    assert_eq!(
        sent["reply"]["text"],
        "echo: over TLS",
        "{sent}\n{}\n{}",
        a.log(),
        b.log()
    );
    Ok((a, b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_that_trust_the_broker_by_ca_file_federate_over_amqps_and_another_ca_is_refused()
-> anyhow::Result<()> {
    let node = PrivateNode::start_tls(&TlsSetup::default()).await?;
    let vhost = Vhost::create(&node.broker()).await?;
    let (certs, uri) = tls_of(&node, &vhost)?;
    let (_a, _b) = round_trip(&uri, &file("ca_file", &certs.ca_file)).await?;
    // Both links are TLS connections, without a client certificate.
    let links = connections(&node, &vhost).await?;
    assert_eq!(links.len(), 2, "{links:?}");
    assert!(links.iter().all(|c| c["ssl"] == true), "{links:?}");

    // Trusting another CA: refused at start, the key and the file named.
    let other = refused(&uri, &file("ca_file", &certs.other_ca_file)).await?;
    assert!(
        other.contains(&format!(
            "TLS: the broker's certificate is not signed by the CA in broker.ca_file ({})",
            certs.other_ca_file.display()
        )),
        "{other}"
    );
    // Trusting only the system's CAs: told to set broker.ca_file.
    let system = refused(&uri, "").await?;
    assert!(
        system.contains(
            "TLS: the broker's certificate is not signed by a CA of this machine's (set broker.ca_file to the CA that signs it)"
        ),
        "{system}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_whose_certificate_names_another_host_is_refused() -> anyhow::Result<()> {
    let setup = TlsSetup {
        server_names: vec!["broker.fleet.invalid".into()],
        ..TlsSetup::default()
    };
    let node = PrivateNode::start_tls(&setup).await?;
    let vhost = Vhost::create(&node.broker()).await?;
    let (certs, uri) = tls_of(&node, &vhost)?;
    assert!(uri.contains("@127.0.0.1:"), "{uri}");
    let wrong = refused(&uri, &file("ca_file", &certs.ca_file)).await?;
    assert!(
        wrong.contains(
            "TLS: the broker's certificate does not name host '127.0.0.1' (broker.uri's host); it names broker.fleet.invalid"
        ),
        "{wrong}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_demands_client_certificates_takes_the_gateways_cert_file()
-> anyhow::Result<()> {
    let setup = TlsSetup {
        client_certs: true,
        ..TlsSetup::default()
    };
    let node = PrivateNode::start_tls(&setup).await?;
    let vhost = Vhost::create(&node.broker()).await?;
    let (certs, uri) = tls_of(&node, &vhost)?;
    let ca = file("ca_file", &certs.ca_file);

    // Without a certificate of its own: refused, and told which keys to set.
    let (bare, said) = refused_or_hinted(&uri, &ca).await?;
    assert!(
        (bare.contains("TLS: the broker demands a client certificate")
            || bare.contains("Connection reset by peer")
                && bare.contains("TLS: a broker that demands client certificates"))
            && bare.contains("set broker.cert_file and broker.key_file"),
        "{said}"
    );

    // With one another CA signed: refused, the file named.
    let (stranger, said) = refused_or_hinted(
        &uri,
        &format!(
            "{ca}{}{}",
            file("cert_file", &certs.other_client_cert_file),
            file("key_file", &certs.other_client_key_file)
        ),
    )
    .await?;
    let cert = certs.other_client_cert_file.display();
    assert!(
        stranger.contains(&format!(
            "TLS: the broker refused this gateway's certificate, broker.cert_file ({cert})"
        )) || stranger.contains("Connection reset by peer")
            && stranger.contains(&format!(
                "if it does, check that it trusts broker.cert_file ({cert})"
            )),
        "{said}"
    );

    // With one the node's CA signed: federated, each link showing it.
    let mutual = format!(
        "{ca}{}{}",
        file("cert_file", &certs.client_cert_file),
        file("key_file", &certs.client_key_file)
    );
    let (_a, _b) = round_trip(&uri, &mutual).await?;
    let links = connections(&node, &vhost).await?;
    assert_eq!(links.len(), 2, "{links:?}");
    assert!(
        links.iter().all(|c| c["ssl"] == true
            && c["peer_cert_subject"]
                .as_str()
                .is_some_and(|s| s.contains(&format!("CN={CLIENT_NAME}")))),
        "{links:?}"
    );
    Ok(())
}
