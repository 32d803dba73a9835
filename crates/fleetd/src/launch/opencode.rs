//! The opencode launcher: OpenCode with fleetd as a remote MCP server, through a config file
//! of fleetd's making (`OPENCODE_CONFIG`, merged over the user's own config), whose
//! `Authorization` header opencode fills from `FLEET_TOKEN` itself; the reply charter as an
//! instructions file; the profile's `base_url` as the Anthropic provider's endpoint.

use serde_json::json;

use super::{Launch, PeerLauncher, Worker, charter, private_file};
use crate::config::{MAX_WAIT_S, ProfileConfig};

/// The MCP server's name in opencode.
const SERVER: &str = "fleet";

pub(super) struct OpencodeLauncher;

impl PeerLauncher for OpencodeLauncher {
    fn prepare(
        &self,
        profile: &ProfileConfig,
        worker: &Worker,
        mut launch: Launch,
    ) -> std::io::Result<Launch> {
        let instructions = worker.dir.join("fleet-charter.md");
        private_file(&instructions, charter(&worker.name).as_bytes())?;
        let mut config = json!({
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": false,
            "share": "disabled",
            "instructions": [instructions.display().to_string()],
            "mcp": {SERVER: {
                "type": "remote",
                "url": worker.mcp_url,
                "headers": {"Authorization": "Bearer {env:FLEET_TOKEN}"},
                "enabled": true,
                "timeout": MAX_WAIT_S * 1000,
            }},
            "permission": {"fleet_*": "allow"},
        });
        if let Some(url) = &profile.base_url {
            config["provider"] = json!({"anthropic": {"options": {"baseURL": format!("{}/v1", url.trim_end_matches('/'))}}});
        }
        let file = worker.dir.join("opencode.json");
        private_file(&file, serde_json::to_string_pretty(&config)?.as_bytes())?;
        launch
            .env
            .insert("OPENCODE_CONFIG".into(), file.display().to_string());
        Ok(launch)
    }
}
