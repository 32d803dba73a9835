//! The domain core of fleetd: global ids, entities and roles, messages and their states, the
//! routing decision, the worker session state machine, the authorisation rules, the rules of the
//! local plane (placement, who may take a task, asks, turnover and nudges) and those of the
//! federated plane (admission of a broker delivery, the remote roster, the receipt bound, which
//! dead letters are told of).
//!
//! This crate does no I/O, and its rules know no clock: timestamps come in as arguments (the
//! adapters read the one clock, [`clock::now_ms`]), so every rule here is tested with explicit
//! times and without tokio.

pub mod admission;
pub mod adoption;
pub mod asks;
pub mod authz;
pub mod bounds;
pub mod clock;
pub mod control;
pub mod coord;
pub mod dead;
pub mod delivery;
pub mod dialog;
pub mod entity;
pub mod envelope;
pub mod error;
pub mod ids;
pub mod inert;
pub mod lifecycle;
pub mod message;
pub mod ownership;
pub mod presence;
pub mod receipts;
pub mod redact;
pub mod roster;
pub mod routing;
pub mod send;
pub mod session;
pub mod signing;
pub mod spawn;
pub mod trust;
pub mod typed;
pub mod workdir;

pub use entity::{Entity, Role};
pub use envelope::{Envelope, EnvelopeError, HeaderValue, Version};
pub use error::{ErrorCode, FleetError};
pub use ids::{Gid, MsgId, TraceId};
pub use message::{Kind, Message, MsgState};
pub use session::{SessionEvent, WorkerStatus};
