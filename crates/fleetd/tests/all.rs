//! fleetd's integration tests: the real `fleetd` binary, real tmux, real MCP clients, the
//! scripted agent in real panes. One binary, so the build links once.

// A test may unwrap: a panic is how it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
