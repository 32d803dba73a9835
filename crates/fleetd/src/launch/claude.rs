//! The claude-code launcher: Claude Code with fleetd as its only MCP server.
//!
//! - MCP config in the worker's directory (0600), its `Authorization` header read from
//!   `FLEET_TOKEN` by Claude Code itself, so the token is in no file and no argv;
//! - `--strict-mcp-config --allowedTools mcp__fleet` (the fleet tools run without asking), and
//!   the reply charter appended to the system prompt;
//! - the environment that keeps it quiet offline (no non-essential traffic, no tool search),
//!   and the profile's `base_url` as `ANTHROPIC_BASE_URL`;
//! - by default the user's own login and settings, with only the trust prompt for the working
//!   directory answered in advance; with `isolated_home`, a private `HOME` seeded so it starts
//!   without dialogs (API-key setups, tests).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::{Launch, PeerLauncher, Worker, charter, private_dir, private_file};
use crate::config::{MAX_WAIT_S, ProfileConfig};

/// The MCP server's name in Claude Code (its tools: `mcp__fleet__fleet_reply`, …).
const SERVER: &str = "fleet";
/// Claude Code's settings file in a home.
const CLAUDE_JSON: &str = ".claude.json";
/// How many trailing characters of an API key Claude Code remembers as approved.
const APPROVED_KEY_CHARS: usize = 20;

pub(super) struct ClaudeLauncher {
    /// The user's home, whose `.claude.json` gets the working directory's trust.
    user_home: Option<PathBuf>,
}

impl ClaudeLauncher {
    pub(super) fn new(user_home: Option<PathBuf>) -> Self {
        Self { user_home }
    }
}

impl PeerLauncher for ClaudeLauncher {
    fn prepare(
        &self,
        profile: &ProfileConfig,
        worker: &Worker,
        mut launch: Launch,
    ) -> std::io::Result<Launch> {
        let config = worker.dir.join("mcp.json");
        let servers = json!({"mcpServers": {SERVER: {
            "type": "http",
            "url": worker.mcp_url,
            "headers": {"Authorization": "Bearer ${FLEET_TOKEN}"},
            // A fleet call may block as long as its wait allows (milliseconds).
            "timeout": MAX_WAIT_S * 1000,
        }}});
        private_file(&config, serde_json::to_string_pretty(&servers)?.as_bytes())?;
        launch.argv.extend([
            "--mcp-config".into(),
            config.display().to_string(),
            "--strict-mcp-config".into(),
            "--allowedTools".into(),
            format!("mcp__{SERVER}"),
            "--append-system-prompt".into(),
            charter(&worker.name),
        ]);
        launch.env.insert(
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
            "1".into(),
        );
        launch
            .env
            .insert("ENABLE_TOOL_SEARCH".into(), "false".into());
        if let Some(model) = &profile.model {
            launch.argv.extend(["--model".into(), model.clone()]);
        }
        if let Some(url) = &profile.base_url {
            launch.env.insert("ANTHROPIC_BASE_URL".into(), url.clone());
        }
        if profile.isolated_home {
            let home = worker.dir.join("home");
            private_dir(&home)?;
            let key = launch
                .env
                .get("ANTHROPIC_API_KEY")
                .cloned()
                .or_else(|| std::env::var("ANTHROPIC_API_KEY").ok());
            private_file(
                &home.join(CLAUDE_JSON),
                serde_json::to_string_pretty(&seeded_settings(&worker.cwd, key.as_deref()))?
                    .as_bytes(),
            )?;
            launch.env.insert("HOME".into(), home.display().to_string());
        } else if let Some(home) = &self.user_home {
            trust_directory(&home.join(CLAUDE_JSON), &worker.cwd)?;
        }
        Ok(launch)
    }
}

/// The working directory as Claude Code keys it, and its canonical form if that differs.
fn project_keys(cwd: &Path) -> Vec<String> {
    let mut keys = vec![cwd.display().to_string()];
    if let Ok(real) = fs::canonicalize(cwd)
        && real != cwd
    {
        keys.push(real.display().to_string());
    }
    keys
}

/// A fresh home's settings: onboarding done, the key approved, the directory trusted.
fn seeded_settings(cwd: &Path, api_key: Option<&str>) -> Value {
    let approved: Vec<String> = api_key
        .map(|key| {
            let skip = key.chars().count().saturating_sub(APPROVED_KEY_CHARS);
            key.chars().skip(skip).collect()
        })
        .into_iter()
        .collect();
    let projects: Map<String, Value> = project_keys(cwd)
        .into_iter()
        .map(|key| (key, json!({"hasTrustDialogAccepted": true})))
        .collect();
    json!({
        "hasCompletedOnboarding": true,
        "lastOnboardingVersion": "fleetd",
        "theme": "dark",
        "customApiKeyResponses": {"approved": approved, "rejected": []},
        "projects": projects,
    })
}

/// Marks `cwd` trusted in the Claude Code settings file at `file`, keeping everything else in
/// it. The file is rewritten whole (to a temporary file, then renamed over it).
fn trust_directory(file: &Path, cwd: &Path) -> std::io::Result<()> {
    let mut settings: Value = match fs::read_to_string(file) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            std::io::Error::other(format!(
                "{} is not JSON ({e}): cannot mark {} trusted for Claude Code",
                file.display(),
                cwd.display()
            ))
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
        Err(e) => return Err(e),
    };
    let Some(root) = settings.as_object_mut() else {
        return Err(std::io::Error::other(format!(
            "{} is not a JSON object",
            file.display()
        )));
    };
    let projects = root.entry("projects").or_insert_with(|| json!({}));
    let Some(projects) = projects.as_object_mut() else {
        return Err(std::io::Error::other(format!(
            "{}: 'projects' is not an object",
            file.display()
        )));
    };
    let mut changed = false;
    for key in project_keys(cwd) {
        let project = projects.entry(key).or_insert_with(|| json!({}));
        if let Some(project) = project.as_object_mut()
            && project.get("hasTrustDialogAccepted") != Some(&Value::Bool(true))
        {
            project.insert("hasTrustDialogAccepted".into(), Value::Bool(true));
            changed = true;
        }
    }
    if !changed {
        return Ok(());
    }
    let temporary = file.with_extension(format!("json.fleetd-{}", std::process::id()));
    private_file(
        &temporary,
        serde_json::to_string_pretty(&settings)?.as_bytes(),
    )?;
    fs::rename(&temporary, file)
}

#[cfg(test)]
mod tests {
    use super::super::tests::worker;
    use super::*;

    fn claude_profile() -> ProfileConfig {
        let mut profile = ProfileConfig::command("c", vec!["claude".into()]);
        profile.kind = crate::config::ProfileKind::ClaudeCode;
        profile.base_url = Some("http://127.0.0.1:4000".into());
        profile
    }

    fn prepare(profile: &ProfileConfig, user_home: Option<PathBuf>, w: &Worker) -> Launch {
        private_dir(&w.dir).unwrap();
        let launch = Launch {
            argv: profile.program(),
            env: Default::default(),
            teardown: None,
        };
        ClaudeLauncher::new(user_home)
            .prepare(profile, w, launch)
            .unwrap()
    }

    #[test]
    fn the_mcp_config_names_fleetd_and_reads_the_token_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let mut profile = claude_profile();
        profile.isolated_home = true;
        let launch = prepare(&profile, None, &w);
        let at = launch
            .argv
            .iter()
            .position(|a| a == "--mcp-config")
            .unwrap();
        let file = PathBuf::from(&launch.argv[at + 1]);
        let text = fs::read_to_string(&file).unwrap();
        assert!(!text.contains("secret-token"), "{text}");
        let config: Value = serde_json::from_str(&text).unwrap();
        let server = &config["mcpServers"]["fleet"];
        assert_eq!(server["url"], w.mcp_url);
        assert_eq!(server["headers"]["Authorization"], "Bearer ${FLEET_TOKEN}");
        let mode = fs::metadata(&file).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        assert!(launch.argv.contains(&"--strict-mcp-config".to_string()));
        let allowed = launch
            .argv
            .iter()
            .position(|a| a == "--allowedTools")
            .unwrap();
        assert_eq!(launch.argv[allowed + 1], "mcp__fleet");
        assert!(launch.argv.iter().any(|a| a.contains("fleet_reply")));
        assert_eq!(launch.env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:4000");
        assert_eq!(launch.env["ENABLE_TOOL_SEARCH"], "false");
        assert_eq!(launch.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"], "1");
    }

    #[test]
    fn an_isolated_home_is_seeded_without_dialogs() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let mut profile = claude_profile();
        profile.isolated_home = true;
        profile.env.insert(
            "ANTHROPIC_API_KEY".into(),
            "sk-ant-0123456789-abcdefghijklmnopqrst".into(),
        );
        let mut launch = Launch {
            argv: profile.program(),
            env: profile.env.0.clone(),
            teardown: None,
        };
        private_dir(&w.dir).unwrap();
        launch = ClaudeLauncher::new(None)
            .prepare(&profile, &w, launch)
            .unwrap();
        let home = PathBuf::from(&launch.env["HOME"]);
        assert!(home.starts_with(&w.dir));
        let seeded: Value =
            serde_json::from_str(&fs::read_to_string(home.join(CLAUDE_JSON)).unwrap()).unwrap();
        assert_eq!(seeded["hasCompletedOnboarding"], true);
        assert_eq!(
            seeded["customApiKeyResponses"]["approved"][0],
            "abcdefghijklmnopqrst"
        );
        let cwd = w.cwd.display().to_string();
        assert_eq!(seeded["projects"][&cwd]["hasTrustDialogAccepted"], true);
    }

    #[test]
    fn the_users_own_settings_only_gain_the_directorys_trust() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let home = dir.path().join("home");
        fs::create_dir(&home).unwrap();
        let file = home.join(CLAUDE_JSON);
        fs::write(
            &file,
            r#"{"oauthAccount": {"email": "me@example.com"}, "projects": {"/elsewhere": {"x": 1}}}"#,
        )
        .unwrap();
        let launch = prepare(&claude_profile(), Some(home.clone()), &w);
        assert!(!launch.env.contains_key("HOME"));
        let settings: Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(settings["oauthAccount"]["email"], "me@example.com");
        assert_eq!(settings["projects"]["/elsewhere"]["x"], 1);
        let cwd = w.cwd.display().to_string();
        assert_eq!(settings["projects"][&cwd]["hasTrustDialogAccepted"], true);
        // A file that is not JSON is left alone, with an error naming it.
        fs::write(&file, "not json").unwrap();
        let err = trust_directory(&file, &w.cwd).unwrap_err().to_string();
        assert!(err.contains(".claude.json"), "{err}");
        assert_eq!(fs::read_to_string(&file).unwrap(), "not json");
    }
}
