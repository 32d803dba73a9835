//! The test harness of fleetd: start the real `fleetd` binary on a loopback socket of its own with a
//! private state dir and tmux server ([`fleet::Fleet`]), talk to it as a real MCP client
//! ([`client::Client`]), and the scripted agent `fleet-agent-sim` that runs in panes
//! ([`sim`]); a network namespace whose broker path a test can cut ([`netns`]), and the
//! partition scenario of issue 37 on it ([`partition`]).

pub mod bins;
pub mod broker;
pub mod client;
pub mod fleet;
pub mod herdr;
pub mod hosts;
pub mod inherit;
pub mod keys;
pub mod model;
pub mod netns;
pub mod partition;
pub mod podman;
pub mod proxy;
pub mod sim;
pub mod standin;
pub mod wait;
