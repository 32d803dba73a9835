//! The claude-code launcher: Claude Code with fleetd as its only MCP server.
//!
//! - MCP config in the worker's directory (0600), its `Authorization` header read from
//!   `FLEET_TOKEN` by Claude Code itself, so the token is in no file and no argv;
//! - `--strict-mcp-config --allowedTools mcp__fleet` (the fleet tools run without asking), and
//!   the reply charter appended to the system prompt;
//! - the environment that keeps it quiet offline (no non-essential traffic, no tool search),
//!   and the profile's `base_url` as `ANTHROPIC_BASE_URL`;
//! - by default the user's own login and settings, with only the trust prompt for the working
//!   directory answered in advance (in `~/.claude.json`, under Claude Code's own lock, see
//!   [`super::trust`]; never for a directory outside `gateway.workdir_roots`; not at all with
//!   the profile's `trust_workdir = false`); with `isolated_home`, a private `HOME` seeded so
//!   it starts without dialogs (API-key setups, tests), and the login fleetd was given when the
//!   profile names none.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use fleet_core::workdir::check_roots;
use serde_json::{Map, Value, json};

use super::trust::trust_directory;
use super::{HostFacts, Launch, PeerLauncher, Worker, charter, private_dir, private_file};
use crate::config::{
    CLAUDE_CREDENTIALS, MAX_CONFIG_WAIT_S, PermissionMode, ProfileConfig, ProfileKind,
};

/// The MCP server's name in Claude Code (its tools: `mcp__fleet__fleet_reply`, …).
const SERVER: &str = "fleet";
/// Claude Code's settings file in a home.
const CLAUDE_JSON: &str = ".claude.json";
/// The variable that moves Claude Code's settings (its `.claude.json`) out of the home.
const CLAUDE_CONFIG_DIR: &str = "CLAUDE_CONFIG_DIR";
/// The variable that tells Claude Code it runs in a sandbox (without it, it refuses
/// `bypassPermissions` as root).
const IS_SANDBOX: &str = "IS_SANDBOX";
/// Claude Code's user setting that records the consent to `bypassPermissions` mode.
const BYPASS_CONSENT: &str = "skipDangerousModePermissionPrompt";
/// How many trailing characters of an API key Claude Code remembers as approved.
const APPROVED_KEY_CHARS: usize = 20;

pub(super) struct ClaudeLauncher {
    /// Where the user's Claude Code keeps its `.claude.json`, which gets the working
    /// directory's trust: `CLAUDE_CONFIG_DIR` when fleetd's environment sets it, else the home.
    settings_dir: Option<PathBuf>,
    /// The resolved `gateway.workdir_roots`: no directory outside them is marked trusted.
    roots: Vec<PathBuf>,
    /// Claude Code's credentials in fleetd's environment, for an isolated home whose profile
    /// names none.
    credentials: BTreeMap<String, String>,
}

impl ClaudeLauncher {
    pub(super) fn new(facts: HostFacts) -> Self {
        Self {
            settings_dir: facts.claude_config_dir.or(facts.user_home),
            roots: facts.workdir_roots,
            credentials: facts.credentials,
        }
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
            "timeout": MAX_CONFIG_WAIT_S * 1000,
        }}});
        private_file(&config, serde_json::to_string_pretty(&servers)?.as_bytes())?;
        launch.argv.extend([
            "--mcp-config".into(),
            config.display().to_string(),
            "--strict-mcp-config".into(),
            "--allowedTools".into(),
            format!("mcp__{SERVER}"),
            "--append-system-prompt".into(),
            charter(worker),
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
        let mode = profile.start_mode();
        if let Some(mode) = mode {
            launch
                .argv
                .extend(["--permission-mode".into(), mode.as_str().into()]);
        }
        let bypass = mode == Some(PermissionMode::BypassPermissions);
        if bypass && profile.kind == ProfileKind::Sandbox {
            // Claude Code refuses to bypass its checks as root unless told it is sandboxed,
            // which it is.
            launch.env.insert(IS_SANDBOX.into(), "1".into());
        }
        if let Some(url) = &profile.base_url {
            launch.env.insert("ANTHROPIC_BASE_URL".into(), url.clone());
        }
        // The working directory was checked at spawn; the trust given here reaches no further.
        let keys = trusted_keys(&worker.cwd, &self.roots)?;
        if profile.isolated_home {
            self.isolate(profile, worker, &keys, &mut launch)?;
            if bypass {
                consent_to_bypass(&worker.dir.join("home"))?;
            }
        } else if profile.trust_workdir
            && let Some(dir) = profile
                .env
                .get(CLAUDE_CONFIG_DIR)
                .map(PathBuf::from)
                .or_else(|| self.settings_dir.clone())
        {
            // The profile's own CLAUDE_CONFIG_DIR is where its Claude Code looks.
            trust_directory(&dir.join(CLAUDE_JSON), &keys)?;
        }
        Ok(launch)
    }
}

impl ClaudeLauncher {
    /// Gives `worker` a home of its own: its login (its profile's, else fleetd's, never into a
    /// sandbox), and Claude Code's settings seeded there with its working directory trusted
    /// (`keys`) and no first-run dialog.
    fn isolate(
        &self,
        profile: &ProfileConfig,
        worker: &Worker,
        keys: &[String],
        launch: &mut Launch,
    ) -> std::io::Result<()> {
        let home = worker.dir.join("home");
        private_dir(&home)?;
        let own_login = CLAUDE_CREDENTIALS
            .iter()
            .any(|key| launch.env.get(*key).is_some_and(|value| !value.is_empty()));
        // fleetd's own login goes to its own panes, never into a sandbox.
        if !own_login && profile.kind != ProfileKind::Sandbox {
            launch.env.extend(self.credentials.clone());
        }
        private_file(
            &home.join(CLAUDE_JSON),
            serde_json::to_string_pretty(&seeded_settings(
                keys,
                // The key it will see: its own, else fleetd's (a pane host may pass that on).
                launch
                    .env
                    .get("ANTHROPIC_API_KEY")
                    .or_else(|| {
                        (profile.kind != ProfileKind::Sandbox)
                            .then(|| self.credentials.get("ANTHROPIC_API_KEY"))
                            .flatten()
                    })
                    .map(String::as_str),
            ))?
            .as_bytes(),
        )?;
        launch.env.insert("HOME".into(), home.display().to_string());
        Ok(())
    }
}

/// Records in the private `home` the consent Claude Code asks for before its first session in
/// `bypassPermissions` mode (its "running in Bypass Permissions mode" warning, which waits for a
/// key): the user's settings file there, `.claude/settings.json`, with
/// `skipDangerousModePermissionPrompt`, as accepting the warning would write it. Only ever into a
/// worker's own home, for a profile that asked for that mode.
fn consent_to_bypass(home: &Path) -> std::io::Result<()> {
    let dir = home.join(".claude");
    private_dir(&dir)?;
    private_file(
        &dir.join("settings.json"),
        serde_json::to_string_pretty(&json!({BYPASS_CONSENT: true}))?.as_bytes(),
    )
}

/// The working directory as Claude Code keys it, and its canonical form if that differs; each
/// must lie under the `roots` (when there are any), or nothing is trusted.
fn trusted_keys(cwd: &Path, roots: &[PathBuf]) -> std::io::Result<Vec<String>> {
    let mut dirs = vec![cwd.to_path_buf()];
    if let Ok(real) = fs::canonicalize(cwd)
        && real != cwd
    {
        dirs.push(real);
    }
    dirs.iter()
        .map(|dir| {
            check_roots(dir, roots).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("not marking it trusted for Claude Code: {}", e.message),
                )
            })?;
            Ok(dir.display().to_string())
        })
        .collect()
}

/// A fresh home's settings: onboarding done, the key approved, the directories trusted.
fn seeded_settings(keys: &[String], api_key: Option<&str>) -> Value {
    let approved: Vec<String> = api_key
        .map(|key| {
            let skip = key.chars().count().saturating_sub(APPROVED_KEY_CHARS);
            key.chars().skip(skip).collect()
        })
        .into_iter()
        .collect();
    let projects: Map<String, Value> = keys
        .iter()
        .map(|key| (key.clone(), json!({"hasTrustDialogAccepted": true})))
        .collect();
    json!({
        "hasCompletedOnboarding": true,
        "lastOnboardingVersion": "fleetd",
        "theme": "dark",
        "customApiKeyResponses": {"approved": approved, "rejected": []},
        "projects": projects,
    })
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

    /// A host whose user's home is `user_home`, with `roots` and fleetd's `credentials`.
    fn facts(user_home: Option<&Path>, roots: &[&Path], credentials: &[(&str, &str)]) -> HostFacts {
        HostFacts {
            user_home: user_home.map(Path::to_path_buf),
            claude_config_dir: None,
            workdir_roots: roots.iter().map(|r| r.to_path_buf()).collect(),
            credentials: credentials
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn try_prepare(
        profile: &ProfileConfig,
        facts: HostFacts,
        w: &Worker,
    ) -> std::io::Result<Launch> {
        private_dir(&w.dir).unwrap();
        let launch = Launch {
            argv: profile.program(),
            env: profile.env.0.clone(),
            teardown: None,
        };
        ClaudeLauncher::new(facts).prepare(profile, w, launch)
    }

    fn prepare(profile: &ProfileConfig, user_home: Option<PathBuf>, w: &Worker) -> Launch {
        try_prepare(profile, facts(user_home.as_deref(), &[], &[]), w).unwrap()
    }

    /// A user's home holding a `.claude.json` with `text`; returns the file.
    fn users_settings(dir: &Path, text: &str) -> PathBuf {
        let home = dir.join("home");
        fs::create_dir(&home).unwrap();
        let file = home.join(CLAUDE_JSON);
        fs::write(&file, text).unwrap();
        file
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
    fn a_permission_mode_is_passed_only_when_the_profile_sets_one() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let mut profile = claude_profile();
        profile.isolated_home = true;
        let launch = prepare(&profile, None, &w);
        assert!(!launch.argv.iter().any(|a| a == "--permission-mode"));
        profile.permission_mode = Some(crate::config::PermissionMode::DontAsk);
        let launch = prepare(&profile, None, &w);
        let at = launch
            .argv
            .iter()
            .position(|a| a == "--permission-mode")
            .unwrap();
        assert_eq!(launch.argv[at + 1], "dontAsk");
    }

    /// The mode a launch starts in, whether it says it is sandboxed, and whether its home holds
    /// the consent to bypass mode.
    fn started(launch: &Launch, w: &Worker) -> (Option<String>, bool, bool) {
        let mode = launch
            .argv
            .iter()
            .position(|a| a == "--permission-mode")
            .map(|at| launch.argv[at + 1].clone());
        let consent = fs::read_to_string(w.dir.join("home/.claude/settings.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .is_some_and(|v| v[BYPASS_CONSENT] == true);
        (mode, launch.env.contains_key(IS_SANDBOX), consent)
    }

    #[test]
    fn a_sandboxed_claude_code_starts_in_bypass_mode_unattended_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut boxed = claude_profile();
        boxed.kind = ProfileKind::Sandbox;
        boxed.agent_kind = Some(ProfileKind::ClaudeCode);
        boxed.isolated_home = true;
        let w = Worker {
            dir: dir.path().join("boxed"),
            ..worker(dir.path())
        };
        let launch = prepare(&boxed, None, &w);
        assert_eq!(
            started(&launch, &w),
            (Some("bypassPermissions".into()), true, true)
        );
        let home = w.dir.join("home/.claude");
        let mode = fs::metadata(&home).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
        // A sandbox without a home of its own: fleetd cannot record the consent, so it starts
        // in Claude Code's own default.
        boxed.isolated_home = false;
        let w = Worker {
            dir: dir.path().join("boxed-own-home"),
            ..worker(dir.path())
        };
        let launch = prepare(&boxed, None, &w);
        assert_eq!(started(&launch, &w), (None, false, false));
        boxed.isolated_home = true;
        // A sandbox whose profile names a mode keeps it, and is not told to bypass.
        boxed.permission_mode = Some(PermissionMode::AcceptEdits);
        let w = Worker {
            dir: dir.path().join("boxed-edits"),
            ..worker(dir.path())
        };
        let launch = prepare(&boxed, None, &w);
        assert_eq!(
            started(&launch, &w),
            (Some("acceptEdits".into()), false, false)
        );
        // Outside a sandbox, bypass is the profile's own choice: consented to in its own home,
        // never declared sandboxed.
        let mut own = claude_profile();
        own.isolated_home = true;
        own.permission_mode = Some(PermissionMode::BypassPermissions);
        let w = Worker {
            dir: dir.path().join("own"),
            ..worker(dir.path())
        };
        let launch = prepare(&own, None, &w);
        assert_eq!(
            started(&launch, &w),
            (Some("bypassPermissions".into()), false, true)
        );
        // On the user's own login, their settings are never given that consent.
        let file = users_settings(dir.path(), "{}");
        own.isolated_home = false;
        let w = Worker {
            dir: dir.path().join("users"),
            ..worker(dir.path())
        };
        let launch = prepare(&own, file.parent().map(Path::to_path_buf), &w);
        assert_eq!(
            started(&launch, &w),
            (Some("bypassPermissions".into()), false, false)
        );
        assert!(
            !file
                .parent()
                .unwrap()
                .join(".claude/settings.json")
                .exists()
        );
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
        let launch = prepare(&profile, None, &w);
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
    fn an_isolated_home_gets_fleetds_login_when_its_profile_names_none() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let mut profile = claude_profile();
        profile.isolated_home = true;
        let fleetds = [(
            "ANTHROPIC_API_KEY",
            "sk-ant-fleetd-0123456789-abcdefghijklmnop",
        )];
        let launch = try_prepare(&profile, facts(None, &[], &fleetds), &w).unwrap();
        assert_eq!(launch.env["ANTHROPIC_API_KEY"], fleetds[0].1);
        let home = PathBuf::from(&launch.env["HOME"]);
        let seeded: Value =
            serde_json::from_str(&fs::read_to_string(home.join(CLAUDE_JSON)).unwrap()).unwrap();
        assert_eq!(
            seeded["customApiKeyResponses"]["approved"][0],
            "789-abcdefghijklmnop"
        );
        // A profile with a login of its own keeps it, and gets nothing of fleetd's.
        let w2 = Worker {
            dir: dir.path().join("w2"),
            ..worker(dir.path())
        };
        profile
            .env
            .insert("ANTHROPIC_AUTH_TOKEN".into(), "gateway-token".into());
        let launch = try_prepare(&profile, facts(None, &[], &fleetds), &w2).unwrap();
        assert_eq!(launch.env["ANTHROPIC_AUTH_TOKEN"], "gateway-token");
        assert!(!launch.env.contains_key("ANTHROPIC_API_KEY"));
        // A sandboxed Claude Code never gets fleetd's login, even with none of its own.
        let w3 = Worker {
            dir: dir.path().join("w3"),
            ..worker(dir.path())
        };
        let mut boxed = claude_profile();
        boxed.kind = ProfileKind::Sandbox;
        boxed.agent_kind = Some(ProfileKind::ClaudeCode);
        boxed.isolated_home = true;
        let launch = try_prepare(&boxed, facts(None, &[], &fleetds), &w3).unwrap();
        assert!(
            !launch.env.contains_key("ANTHROPIC_API_KEY"),
            "fleetd's key went into a sandbox"
        );
    }

    #[test]
    fn the_users_own_settings_only_gain_the_directorys_trust() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let file = users_settings(
            dir.path(),
            r#"{"oauthAccount": {"email": "me@example.com"}, "projects": {"/elsewhere": {"x": 1}}}"#,
        );
        let home = file.parent().unwrap().to_path_buf();
        let launch = prepare(&claude_profile(), Some(home.clone()), &w);
        assert!(!launch.env.contains_key("HOME"));
        let settings: Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(settings["oauthAccount"]["email"], "me@example.com");
        assert_eq!(settings["projects"]["/elsewhere"]["x"], 1);
        let cwd = w.cwd.display().to_string();
        assert_eq!(settings["projects"][&cwd]["hasTrustDialogAccepted"], true);
        // A file that is not JSON is left alone, and the launch fails naming it.
        fs::write(&file, "not json").unwrap();
        let err = try_prepare(&claude_profile(), facts(Some(&home), &[], &[]), &w)
            .unwrap_err()
            .to_string();
        assert!(err.contains(".claude.json"), "{err}");
        assert_eq!(fs::read_to_string(&file).unwrap(), "not json");
    }

    #[test]
    fn claude_config_dir_moves_the_settings_that_get_the_trust() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let file = users_settings(dir.path(), "{}");
        let home = file.parent().unwrap().to_path_buf();
        let cwd = w.cwd.display().to_string();
        let trusted = |file: &Path| {
            let settings: Value = serde_json::from_str(&fs::read_to_string(file).unwrap()).unwrap();
            settings["projects"][&cwd]["hasTrustDialogAccepted"] == true
        };
        // fleetd's own CLAUDE_CONFIG_DIR.
        let config = dir.path().join("config");
        fs::create_dir(&config).unwrap();
        let mut facts = facts(Some(&home), &[], &[]);
        facts.claude_config_dir = Some(config.clone());
        try_prepare(&claude_profile(), facts, &w).unwrap();
        assert!(trusted(&config.join(CLAUDE_JSON)));
        assert!(!trusted(&file), "the home's file was edited instead");
        // A profile's own wins.
        let own = dir.path().join("own");
        fs::create_dir(&own).unwrap();
        let mut profile = claude_profile();
        profile
            .env
            .insert(CLAUDE_CONFIG_DIR.into(), own.display().to_string());
        let w2 = Worker {
            dir: dir.path().join("w2"),
            ..worker(dir.path())
        };
        prepare(&profile, Some(home.clone()), &w2);
        assert!(trusted(&own.join(CLAUDE_JSON)));
    }

    #[test]
    fn with_trust_workdir_off_the_users_settings_are_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let text = r#"{"projects": {"/elsewhere": {"x": 1}}}"#;
        let file = users_settings(dir.path(), text);
        let home = file.parent().unwrap().to_path_buf();
        let before = fs::metadata(&file).unwrap().modified().unwrap();
        let mut profile = claude_profile();
        profile.trust_workdir = false;
        prepare(&profile, Some(home.clone()), &w);
        assert_eq!(fs::read_to_string(&file).unwrap(), text);
        assert_eq!(fs::metadata(&file).unwrap().modified().unwrap(), before);
        // Not even its lock was taken: nothing but the file is in the home.
        let names: Vec<_> = fs::read_dir(&home)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [CLAUDE_JSON]);
    }

    #[test]
    fn a_directory_outside_the_roots_is_never_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("src");
        let inside = root.join("app");
        let outside = dir.path().join("elsewhere");
        fs::create_dir_all(&inside).unwrap();
        fs::create_dir_all(&outside).unwrap();
        // A link under the root that leads out of it.
        std::os::unix::fs::symlink(&outside, root.join("way-out")).unwrap();
        let text = r#"{"projects": {}}"#;
        let file = users_settings(dir.path(), text);
        let home = file.parent().unwrap().to_path_buf();
        for cwd in [
            outside.clone(),
            root.join("way-out"),
            dir.path().to_path_buf(),
        ] {
            let w = Worker {
                cwd: cwd.clone(),
                ..worker(dir.path())
            };
            let err =
                try_prepare(&claude_profile(), facts(Some(&home), &[&root], &[]), &w).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{cwd:?}");
            assert!(
                err.to_string().contains("outside gateway.workdir_roots"),
                "{err}"
            );
            assert_eq!(fs::read_to_string(&file).unwrap(), text);
        }
        // An isolated home does not trust such a directory either.
        let mut isolated = claude_profile();
        isolated.isolated_home = true;
        let w = Worker {
            cwd: outside.clone(),
            ..worker(dir.path())
        };
        assert!(try_prepare(&isolated, facts(None, &[&root], &[]), &w).is_err());
        // Under the root: trusted.
        let w = Worker {
            cwd: inside.clone(),
            ..worker(dir.path())
        };
        try_prepare(&claude_profile(), facts(Some(&home), &[&root], &[]), &w).unwrap();
        let settings: Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
        let key = inside.display().to_string();
        assert_eq!(settings["projects"][&key]["hasTrustDialogAccepted"], true);
    }
}
