//! The opencode launcher: OpenCode with fleetd as a remote MCP server.
//!
//! - a config file of fleetd's making (`OPENCODE_CONFIG`, 0600, merged over the user's own
//!   config): the `fleet` remote server, its `Authorization` header filled by opencode itself
//!   from `{env:FLEET_TOKEN}` (the token is in no file and no argv), the fleet tools allowed, the
//!   reply charter as an instructions file, the profile's `model` and `base_url` (as the
//!   Anthropic provider's endpoint), no updates, sharing, LSP or formatters;
//! - the environment that keeps it from fetching model lists, updates or language servers;
//! - with `isolated_home`, a private `HOME` and XDG dirs, so it neither reads nor writes the
//!   user's own opencode files (its plugin install is pre-seeded so it does not reach npm), and
//!   fleetd's `ANTHROPIC_API_KEY` when the profile names none.
//!
//! Its screen is ready when its input box shows the placeholder (see
//! [`ProfileConfig::ready_marker`]).

use serde_json::{Value, json};

use super::{HostFacts, Launch, PeerLauncher, Worker, charter, private_dir, private_file};
use crate::config::{ProfileConfig, ProfileKind};

/// The MCP server's name in opencode (its tools: `fleet_fleet_reply`, …).
const SERVER: &str = "fleet";
/// Where each XDG dir of an isolated home goes, under that home.
const XDG_DIRS: [(&str, &str); 4] = [
    ("XDG_CONFIG_HOME", ".config"),
    ("XDG_DATA_HOME", ".local/share"),
    ("XDG_CACHE_HOME", ".cache"),
    ("XDG_STATE_HOME", ".local/state"),
];

/// How long opencode lets a fleet call go without a word from fleetd before it gives the call
/// up, in milliseconds (its `timeout`, which each progress notification starts again). A call
/// that waits hears from fleetd every [`crate::mcp::PROGRESS_INTERVAL`], so only a call whose
/// stream went with a fleetd that died falls silent; opencode does not notice the cut, and with
/// a longer timeout its agent waited on the dead call that long (a day, once) after fleetd came
/// back.
const CALL_SILENCE_MS: u128 = crate::mcp::PROGRESS_INTERVAL.as_millis() * 6;

/// The variable opencode's Anthropic provider takes its key from.
const ANTHROPIC_KEY: &str = "ANTHROPIC_API_KEY";

pub(super) struct OpencodeLauncher {
    /// fleetd's own `ANTHROPIC_API_KEY`, for an isolated home whose profile names none.
    api_key: Option<String>,
}

impl OpencodeLauncher {
    pub(super) fn new(facts: &HostFacts) -> Self {
        Self {
            api_key: facts.credentials.get(ANTHROPIC_KEY).cloned(),
        }
    }
}

impl PeerLauncher for OpencodeLauncher {
    fn prepare(
        &self,
        profile: &ProfileConfig,
        worker: &Worker,
        mut launch: Launch,
    ) -> std::io::Result<Launch> {
        let instructions = worker.dir.join("fleet-charter.md");
        private_file(&instructions, charter(worker).as_bytes())?;
        let file = worker.dir.join("opencode.json");
        private_file(
            &file,
            serde_json::to_string_pretty(&config(profile, worker, &instructions))?.as_bytes(),
        )?;
        for (key, value) in [
            ("OPENCODE_CONFIG", file.display().to_string()),
            ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
            ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
            ("OPENCODE_DISABLE_SHARE", "1".into()),
            ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".into()),
        ] {
            launch.env.insert(key.into(), value);
        }
        if profile.isolated_home {
            let home = worker.dir.join("home");
            for (key, below) in XDG_DIRS {
                let dir = home.join(below);
                private_dir(&dir)?;
                launch.env.insert(key.into(), dir.display().to_string());
            }
            // opencode installs its plugin package into its config dir in the background unless
            // it finds it there: a fresh home says it is, so nothing reaches for npm.
            let own = home.join(".config/opencode");
            private_dir(&own.join("node_modules"))?;
            private_file(
                &own.join("package-lock.json"),
                br#"{"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}"#,
            )?;
            // fleetd's own key goes to its own panes, never into a sandbox.
            if let Some(key) = &self.api_key
                && profile.kind != ProfileKind::Sandbox
                && launch.env.get(ANTHROPIC_KEY).is_none_or(String::is_empty)
            {
                launch.env.insert(ANTHROPIC_KEY.into(), key.clone());
            }
            launch.env.insert("HOME".into(), home.display().to_string());
        }
        Ok(launch)
    }
}

/// The worker's opencode config.
fn config(profile: &ProfileConfig, worker: &Worker, instructions: &std::path::Path) -> Value {
    let mut config = json!({
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": false,
        "share": "disabled",
        "lsp": false,
        "formatter": false,
        "instructions": [instructions.display().to_string()],
        "mcp": {SERVER: {
            "type": "remote",
            "url": worker.mcp_url,
            "headers": {"Authorization": "Bearer {env:FLEET_TOKEN}"},
            "oauth": false,
            "enabled": true,
            // A fleet call that waits is kept alive by its progress notifications.
            "timeout": CALL_SILENCE_MS,
        }},
        "permission": {format!("{SERVER}_*"): "allow"},
    });
    if let Some(model) = &profile.model {
        config["model"] = json!(model);
        config["small_model"] = json!(model);
    }
    if let Some(url) = &profile.base_url {
        config["provider"] = json!({"anthropic": {"options": {
            "baseURL": format!("{}/v1", url.trim_end_matches('/')),
        }}});
    }
    config
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use super::super::tests::worker;
    use super::*;
    use crate::config::ProfileKind;

    #[test]
    fn the_config_names_fleetd_with_the_token_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        private_dir(&w.dir).unwrap();
        let mut profile = ProfileConfig::command("oc", Vec::new());
        profile.kind = ProfileKind::Opencode;
        profile.base_url = Some("http://127.0.0.1:4000/".into());
        profile.model = Some("anthropic/claude-sonnet-4-5".into());
        profile.isolated_home = true;
        let launch = Launch {
            argv: profile.program(),
            env: Default::default(),
            teardown: None,
        };
        // fleetd's own key is handed on to an isolated home whose profile names none.
        let facts = HostFacts {
            credentials: [(ANTHROPIC_KEY.to_string(), "fleetds-key".to_string())].into(),
            ..HostFacts::default()
        };
        let launcher = OpencodeLauncher::new(&facts);
        let launch = launcher.prepare(&profile, &w, launch).unwrap();
        assert_eq!(launch.env[ANTHROPIC_KEY], "fleetds-key");
        assert_eq!(launch.argv, ["opencode"]);
        let file = PathBuf::from(&launch.env["OPENCODE_CONFIG"]);
        let text = fs::read_to_string(&file).unwrap();
        assert!(!text.contains("secret-token"), "{text}");
        let config: Value = serde_json::from_str(&text).unwrap();
        let server = &config["mcp"]["fleet"];
        assert_eq!(server["type"], "remote");
        assert_eq!(server["url"], w.mcp_url);
        // Six progress notifications' worth of silence, not the hour a call may wait.
        assert_eq!(server["timeout"], 30_000);
        assert_eq!(
            server["headers"]["Authorization"],
            "Bearer {env:FLEET_TOKEN}"
        );
        assert_eq!(config["permission"]["fleet_*"], "allow");
        assert_eq!(
            config["provider"]["anthropic"]["options"]["baseURL"],
            "http://127.0.0.1:4000/v1"
        );
        assert_eq!(config["model"], "anthropic/claude-sonnet-4-5");
        let charter = fs::read_to_string(config["instructions"][0].as_str().unwrap()).unwrap();
        assert!(charter.contains("fleet_reply"), "{charter}");
        let home = PathBuf::from(&launch.env["HOME"]);
        assert!(home.starts_with(&w.dir));
        assert!(PathBuf::from(&launch.env["XDG_CONFIG_HOME"]).starts_with(&home));
        assert_eq!(launch.env["OPENCODE_DISABLE_MODELS_FETCH"], "1");
        // A profile's own key is kept.
        let own = Launch {
            argv: profile.program(),
            env: [(ANTHROPIC_KEY.to_string(), "profiles-key".to_string())].into(),
            teardown: None,
        };
        let launch = launcher.prepare(&profile, &w, own).unwrap();
        assert_eq!(launch.env[ANTHROPIC_KEY], "profiles-key");
    }
}
