//! fleetd's broker fabric over AMQP 0-9-1 (RabbitMQ): the topology of the federated plane
//! ([`topology`]), one gateway's link with publisher confirms and returns ([`Link`], behind the
//! [`Broker`] trait whose docs state its contract), the inbox consumers and their typed
//! deliveries ([`Delivery`], settled with a `Result`), a plain [`Client`] for tools and
//! tests, and (feature `fake`) an in-memory broker for tests of the gateway's logic.
//!
//! This is the only crate that knows lapin: no lapin type crosses its API. It never decides
//! what a delivery means or how to settle it (that is `fleet_core::admission` and the
//! gateway); it moves envelopes and bodies, and says exactly what the broker answered.

mod broker;
mod client;
mod delivery;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
mod link;
mod table;
mod tls;
pub mod topology;

pub use broker::{Broker, Outgoing, Published};
pub use client::{Client, Raw};
pub use delivery::{Deliveries, Delivery};
pub use error::AmqpError;
pub use link::{Link, LinkSettings, login_of};
pub use table::{Field, Table};
pub use tls::TlsFiles;
pub use topology::{InboxLimits, Permissions, gateway_permissions, inbox_args};
