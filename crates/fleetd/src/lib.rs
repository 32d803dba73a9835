//! fleetd, the gateway of one host: it spawns agents into panes, types their tasks in when they
//! are ready, and holds every answer durably until the lead pulls it.

pub mod audit;
pub mod authority;
pub mod cli;
pub mod completions;
pub mod config;
pub mod doctor;
pub mod gateway;
pub mod gather;
pub mod health;
pub mod held;
pub mod http;
pub mod identity;
pub mod init;
pub mod lane;
pub mod launch;
pub mod limits;
pub mod listen;
pub mod listener;
pub mod logs;
pub mod mcp;
pub mod mcp_config;
pub mod metrics;
pub mod mux;
pub mod notify;
pub mod openapi;
pub mod ops;
pub mod paths;
pub mod process;
pub mod serve;
pub mod skill;
pub mod state;
pub mod tail;
pub mod token;
pub mod ui;
pub mod websession;
