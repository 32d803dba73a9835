//! Broker users of a test's own: a gateway's login with the narrowest permissions fleetd
//! documents (`fleet_amqp::gateway_permissions`), made in one `rabbitmqctl import_definitions`
//! run and deleted when dropped.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fleet_amqp::gateway_permissions;
use percent_encoding::utf8_percent_encode;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{Broker, COMPONENT, Vhost};
use crate::wait::until;

/// A user on a test's broker, deleted when dropped.
pub struct BrokerUser {
    broker: Broker,
    name: String,
    password: String,
}

/// RabbitMQ's stored form of `password` (`rabbit_password_hashing_sha256`): base64 of a 4-byte
/// salt followed by the SHA-256 of the salt and the password.
fn password_hash(password: &str) -> String {
    let salt: [u8; 4] = rand_salt();
    let mut hasher = Sha256::new();
    hasher.update(salt);
    hasher.update(password.as_bytes());
    let mut stored = salt.to_vec();
    stored.extend_from_slice(&hasher.finalize());
    STANDARD.encode(stored)
}

/// Four bytes that differ from one user to the next (a salt need not be secret).
fn rand_salt() -> [u8; 4] {
    let id = uuid::Uuid::now_v7();
    let bytes = id.as_bytes();
    [bytes[12], bytes[13], bytes[14], bytes[15]]
}

impl Vhost {
    /// Makes a login for the gateway of `host` on this vhost, with the permissions fleetd
    /// documents for one (its own roster keys only on `fleet.roster`); waits until it can
    /// connect.
    pub async fn add_gateway_user(&self, host: &str) -> anyhow::Result<BrokerUser> {
        let name = format!("{}-gw-{host}", self.name());
        let password = uuid::Uuid::now_v7().simple().to_string();
        let p = gateway_permissions(host);
        let definitions = json!({
            "users": [{
                "name": name,
                "password_hash": password_hash(&password),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": [],
            }],
            "permissions": [{
                "user": name, "vhost": self.name(),
                "configure": p.configure, "write": p.write, "read": p.read,
            }],
            "topic_permissions": [{
                "user": name, "vhost": self.name(), "exchange": "fleet.roster",
                "write": p.roster_write, "read": ".*",
            }],
        });
        self.broker()
            .ctl
            .run(
                &["-q", "import_definitions", "--format", "json"],
                Some(definitions.to_string().as_bytes()),
            )
            .await?;
        let user = BrokerUser {
            broker: self.broker().clone(),
            name,
            password,
        };
        let uri = user.uri(self);
        until(
            &format!("user {} to be let in", user.name),
            super::VHOST_LIMIT,
            || {
                let uri = uri.clone();
                async move { super::probe(&uri).await.then_some(()) }
            },
        )
        .await?;
        Ok(user)
    }
}

impl BrokerUser {
    /// The user's name (its broker login).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// An AMQP URI of `vhost` logging in as this user.
    pub fn uri(&self, vhost: &Vhost) -> String {
        format!(
            "amqp://{}:{}@{}:{}/{}",
            utf8_percent_encode(&self.name, COMPONENT),
            utf8_percent_encode(&self.password, COMPONENT),
            self.broker.host(),
            self.broker.port(),
            utf8_percent_encode(vhost.name(), COMPONENT)
        )
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        if let Err(e) = self
            .broker
            .ctl
            .run_blocking(&["-q", "delete_user", &self.name])
        {
            eprintln!("could not delete broker user {}: {e:#}", self.name);
        }
    }
}
