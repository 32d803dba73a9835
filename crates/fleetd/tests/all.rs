//! fleetd's integration tests: the real `fleetd` binary, real tmux, real MCP clients, the
//! scripted agent in real panes. One binary, so the build links once.

mod suite;
