//! Gateway keys for test fleets. Each test host has a key of its own derived from its name, so
//! a test can pin every gateway in every other's `[federation.trust]` before any of them starts
//! ([`trust_table`]), put a host's key in its state dir ([`place`]), and sign as a host — or as
//! a forger — without asking a running gateway.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use fleet_amqp::Table;
use fleet_core::envelope::Envelope;
use fleet_core::signing::{SigningKey, key_text, signature};
use sha2::{Digest, Sha256};

/// The key of test host `host`: its seed is the SHA-256 of a fixed tag and the name.
pub fn host_key(host: &str) -> SigningKey {
    let seed: [u8; 32] = Sha256::digest(format!("fleetd-test-host:{host}")).into();
    SigningKey::from_bytes(&seed)
}

/// The public key of test host `host`, as a trust table pins it.
pub fn public(host: &str) -> String {
    key_text(&host_key(host).verifying_key())
}

/// A `[federation.trust]` table pinning each of `hosts` to its test key.
pub fn trust_table(hosts: &[&str]) -> String {
    let mut table = String::from("[federation.trust]\n");
    for host in hosts {
        table.push_str(&format!("{host} = \"{}\"\n", public(host)));
    }
    table
}

/// The entries of a `[federation.trust]` table pinning each of `hosts` (a host and its broker
/// login) to its test key and that login.
pub fn pinned_with_logins(hosts: &[(&str, &str)]) -> String {
    hosts
        .iter()
        .map(|(host, login)| {
            format!(
                "{host} = {{ keys = [\"{}\"], login = \"{login}\" }}\n",
                public(host)
            )
        })
        .collect()
}

/// [`trust_table`], and a `[federation.allow]` entry for each of `hosts` granting its leads
/// everything (any profile spawned, tasks to their own and shared workers, stops of their
/// own): a fleet whose hosts all admit one another.
pub fn admitting(hosts: &[&str]) -> String {
    format!("{}{}", trust_table(hosts), allow_all(hosts))
}

/// A `[federation.allow]` entry for each of `hosts` granting its leads everything.
pub fn allow_all(hosts: &[&str]) -> String {
    hosts
        .iter()
        .map(|host| {
            format!("\n[federation.allow.{host}]\nspawn = [\"*\"]\nsend = true\nstop = true\n")
        })
        .collect()
}

/// `envelope` with `body` as AMQP headers signed with `host`'s test key (whatever host the
/// envelope itself names: a test signs with the wrong key this way).
pub fn signed_by(host: &str, envelope: &Envelope, body: &[u8]) -> Table {
    Table::of_signed(envelope, &signature(&host_key(host), envelope, body))
}

/// `envelope` with `body` as AMQP headers signed with the key of the host it names.
pub fn signed(envelope: &Envelope, body: &[u8]) -> Table {
    signed_by(
        envelope.from_host.as_deref().unwrap_or_default(),
        envelope,
        body,
    )
}

/// Makes `state_dir` (as fleetd would: the user's only) and puts `host`'s test key in it as
/// the gateway key, so the gateway starting there signs with it.
pub fn place(state_dir: &Path, host: &str) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(state_dir.join("gateway.key"))?;
    file.write_all(host_key(host).as_bytes())
}
