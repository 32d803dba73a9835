//! `fleetd init`: a lead set up in one command. It writes a commented config if there is
//! none, mints the lead's token, registers fleetd with the user's Claude Code (user scope, so
//! every project sees it) with a header helper that reads the token when Claude Code connects,
//! and lets Claude Code call fleetd's tools, and only those, without asking
//! (`permissions.allow` gets `mcp__fleet` in the user's Claude Code settings). It prints what it
//! changed; `fleetd init --undo` takes back what it added. `fleetd mcp-headers NAME` is the
//! helper. The decisions (the starter config, the settings' rule) are pure; [`init_command`]
//! and [`mcp_headers_command`] are the I/O around them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::cli::{Cli, lead_token};
use crate::config::Config;
use crate::mcp_config::{self, SERVER_NAME};
use crate::paths::{config_file, default_config_path};
use crate::serve::mcp_url;
use crate::state::{StateDir, write_private};

/// The Claude Code permission rule that lets it call every fleet tool without a prompt (and no
/// other server's).
pub const ALLOW_RULE: &str = "mcp__fleet";

/// Where `fleetd init` notes, in the state dir, what it added to Claude Code's settings, so
/// `--undo` takes back that and nothing the user added.
const RECORD: &str = "init.json";

/// The config `fleetd init` writes when there is none: what the embedded defaults do, said.
pub const STARTER_CONFIG: &str = r#"# fleetd's config, written by `fleetd init`. Every key and its default: README.md
# (Configuration). Check it with `fleetd doctor`.

[gateway]
listen = "127.0.0.1:8765"          # MCP at http://127.0.0.1:8765/mcp

# The lead: the Claude Code you drive. `fleetd init` registered fleetd with your Claude Code
# for it; `fleetd token lead --rotate` gives it a new token, picked up without a restart.
[leads.lead]

# Worker profiles. With none declared, fleetd offers `sim`, the scripted test agent, so the
# loop can be tried end to end. A real Claude Code worker:
# [[profiles]]
# name = "claude"
# kind = "claude-code"
# argv = ["claude"]
"#;

/// `fleetd init`
#[derive(Debug, Args)]
pub struct InitArgs {
    /// The lead to set up, as declared in `[leads.NAME]` (the starter config declares `lead`).
    #[arg(default_value = "lead")]
    pub name: String,
    /// The Claude Code program to register fleetd with.
    #[arg(long, value_name = "PATH", default_value = "claude")]
    pub claude: PathBuf,
    /// Take back what an earlier `fleetd init` added to Claude Code (the registration, and the
    /// permission rule if it added it); the config and the token stay.
    #[arg(long)]
    pub undo: bool,
}

/// `fleetd mcp-headers`
#[derive(Debug, Args)]
pub struct McpHeadersArgs {
    /// The lead whose token the headers carry.
    pub name: String,
}

/// `settings` (Claude Code's settings file, as JSON; none yet: `Null`) with [`ALLOW_RULE`] in
/// `permissions.allow`, and whether it was added (false: it was there). Refuses settings that
/// are not an object, or whose `permissions` or `allow` are of another shape, naming which.
pub fn with_rule(settings: Value) -> Result<(Value, bool), String> {
    let mut settings = match settings {
        Value::Null => json!({}),
        Value::Object(_) => settings,
        _ => return Err("it is not a JSON object".into()),
    };
    let permissions = settings
        .as_object_mut()
        .and_then(|s| {
            Some(
                s.entry("permissions")
                    .or_insert_with(|| json!({}))
                    .as_object_mut()?
                    .entry("allow")
                    .or_insert_with(|| json!([])),
            )
        })
        .ok_or("its \"permissions\" is not an object")?;
    let allow = permissions
        .as_array_mut()
        .ok_or("its \"permissions\".\"allow\" is not a list")?;
    if allow.iter().any(|rule| rule == ALLOW_RULE) {
        return Ok((settings, false));
    }
    allow.push(json!(ALLOW_RULE));
    Ok((settings, true))
}

/// `settings` without [`ALLOW_RULE`] in `permissions.allow`, and whether it was there.
pub fn without_rule(mut settings: Value) -> (Value, bool) {
    let Some(allow) = settings
        .pointer_mut("/permissions/allow")
        .and_then(Value::as_array_mut)
    else {
        return (settings, false);
    };
    let before = allow.len();
    allow.retain(|rule| rule != ALLOW_RULE);
    let removed = allow.len() != before;
    (settings, removed)
}

/// Claude Code's user settings file: `$CLAUDE_CONFIG_DIR/settings.json`, else
/// `~/.claude/settings.json`.
fn settings_path() -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("CLAUDE_CONFIG_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".claude"),
    };
    Ok(dir.join("settings.json"))
}

/// The settings file's JSON (`Null` when there is none).
fn read_settings(path: &Path) -> anyhow::Result<Value> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not JSON: fix it, then run fleetd init again",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Value::Null),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Writes `settings` to `path` whole (a temporary file renamed over it), readable by its owner
/// only, making its directory if need be.
fn write_settings(path: &Path, settings: &Value) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    write_private(path, &format!("{settings:#}\n"))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Runs `claude ARGS`; its output, or why it failed.
fn claude(program: &Path, args: &[&str]) -> anyhow::Result<std::process::Output> {
    Command::new(program).args(args).output().with_context(|| {
        format!(
            "cannot run Claude Code as '{}' (--claude PATH names it)",
            program.display()
        )
    })
}

/// `fleetd init [NAME] [--claude PATH] [--undo]`.
pub fn init_command(cli: &Cli, args: &InitArgs) -> anyhow::Result<()> {
    if args.undo {
        return undo(cli, args);
    }
    let path = ensure_config(cli)?;
    let (config, state) = crate::paths::Paths {
        config: Some(path.clone()),
        state_dir: cli.paths.state_dir.clone(),
    }
    .resolve()?;
    lead_token(&config, &state, &args.name, false)?;
    println!(
        "the lead '{}' has its token in {}",
        args.name,
        state.lead_token_path(&args.name).display()
    );
    register(args, &config, &state, &path)?;
    allow_tools(&state)?;
    println!(
        "start fleetd (`fleetd serve`), then `claude`: the fleet_* tools are there. To undo: fleetd init --undo"
    );
    Ok(())
}

/// The config `init` sets up with, as an absolute path: the one named, else the user's;
/// written from the starter when missing.
fn ensure_config(cli: &Cli) -> anyhow::Result<PathBuf> {
    let path = match config_file(cli.paths.config.as_deref()) {
        Some(path) => path,
        None => {
            default_config_path().context("neither --config nor HOME says where the config goes")?
        }
    };
    if path.exists() {
        println!("the config {} is kept as it is", path.display());
    } else {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&path, STARTER_CONFIG)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!(
            "wrote the config {} (fleetd's defaults, commented)",
            path.display()
        );
    }
    std::fs::canonicalize(&path).with_context(|| format!("cannot resolve {}", path.display()))
}

/// `path` as a word of the helper's command line.
fn word(path: &Path) -> anyhow::Result<String> {
    path.to_str().map(str::to_string).with_context(|| {
        format!(
            "{} is not a UTF-8 path, which Claude Code's helper command cannot name",
            path.display()
        )
    })
}

/// Registers fleetd with Claude Code (user scope) for lead `args.name`, its token from the
/// header helper run with the config at `path` and `state`.
fn register(args: &InitArgs, config: &Config, state: &StateDir, path: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot tell where this fleetd is")?;
    let state_root = std::fs::canonicalize(state.root())
        .with_context(|| format!("cannot resolve {}", state.root().display()))?;
    let helper =
        mcp_config::helper_command(&word(&exe)?, &args.name, &word(path)?, &word(&state_root)?);
    let url = mcp_url(config, config.gateway.listen);
    let entry = mcp_config::registered(&url, &helper).to_string();
    // `add-json` refuses a name already there: what an earlier init registered goes first.
    claude(&args.claude, &["mcp", "remove", SERVER_NAME, "-s", "user"])?;
    let added = claude(
        &args.claude,
        &["mcp", "add-json", "-s", "user", SERVER_NAME, &entry],
    )?;
    if !added.status.success() {
        bail!(
            "Claude Code did not register fleetd: {}(to do it by hand: {} mcp add-json -s user {SERVER_NAME} {})",
            String::from_utf8_lossy(&added.stderr),
            args.claude.display(),
            mcp_config::shell_quote(&entry)
        );
    }
    println!(
        "registered fleetd with Claude Code as the MCP server '{SERVER_NAME}' (user scope: every project) at {url}; its token comes from `fleetd mcp-headers {}`, read at each connection",
        args.name
    );
    Ok(())
}

/// Lets Claude Code call fleetd's tools without asking, noting in `state` that init did.
fn allow_tools(state: &StateDir) -> anyhow::Result<()> {
    let settings = settings_path()?;
    let (merged, added) = with_rule(read_settings(&settings)?)
        .map_err(|why| anyhow::anyhow!("{} cannot take the permission rule: {why}; add \"{ALLOW_RULE}\" to its permissions.allow yourself", settings.display()))?;
    if !added {
        println!(
            "Claude Code may already call fleetd's tools without asking (\"{ALLOW_RULE}\" is in {})",
            settings.display()
        );
        return Ok(());
    }
    write_settings(&settings, &merged)?;
    write_private(
        &state.root().join(RECORD),
        &json!({"allow_added_to": settings}).to_string(),
    )
    .context("cannot note what fleetd init added")?;
    println!(
        "let Claude Code call fleetd's tools without asking: \"{ALLOW_RULE}\" added to permissions.allow in {}",
        settings.display()
    );
    Ok(())
}

/// `fleetd init --undo`: the registration goes, and the permission rule if init added it.
fn undo(cli: &Cli, args: &InitArgs) -> anyhow::Result<()> {
    let (_config, state) = cli.paths.resolve()?;
    let removed = claude(&args.claude, &["mcp", "remove", SERVER_NAME, "-s", "user"])?;
    if removed.status.success() {
        println!("removed the MCP server '{SERVER_NAME}' from Claude Code (user scope)");
    } else {
        println!("Claude Code has no MCP server '{SERVER_NAME}' in user scope");
    }
    let record_path = state.root().join(RECORD);
    let record: Value = std::fs::read_to_string(&record_path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null);
    match record["allow_added_to"].as_str() {
        Some(settings) => {
            let settings = PathBuf::from(settings);
            let (kept, removed) = without_rule(read_settings(&settings)?);
            if removed {
                write_settings(&settings, &kept)?;
                println!(
                    "removed \"{ALLOW_RULE}\" from permissions.allow in {}",
                    settings.display()
                );
            }
            std::fs::remove_file(&record_path)
                .with_context(|| format!("cannot remove {}", record_path.display()))?;
        }
        None => println!(
            "fleetd init added no permission rule here: Claude Code's settings are left as they are"
        ),
    }
    println!(
        "kept: the config and the lead's token (`fleetd token NAME --rotate` makes the token stop working)"
    );
    Ok(())
}

/// `fleetd mcp-headers NAME`: the lead's headers as Claude Code's header helper wants them.
pub fn mcp_headers_command(cli: &Cli, args: &McpHeadersArgs) -> anyhow::Result<()> {
    let (config, state) = cli.paths.resolve()?;
    let token = lead_token(&config, &state, &args.name, false)?;
    println!("{}", mcp_config::helper_output(&token));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_is_added_once_beside_what_the_user_has() {
        let (made, added) = with_rule(Value::Null).unwrap();
        assert!(added);
        assert_eq!(made, json!({"permissions": {"allow": ["mcp__fleet"]}}));
        let theirs = json!({"model": "opus", "permissions": {"allow": ["Bash(ls)"], "deny": ["Read(.env)"]}});
        let (merged, added) = with_rule(theirs).unwrap();
        assert!(added);
        assert_eq!(
            merged,
            json!({"model": "opus", "permissions": {"allow": ["Bash(ls)", "mcp__fleet"], "deny": ["Read(.env)"]}})
        );
        let (again, added) = with_rule(merged.clone()).unwrap();
        assert!(!added);
        assert_eq!(again, merged);
    }

    #[test]
    fn settings_of_another_shape_are_refused_naming_what() {
        assert_eq!(
            with_rule(json!([1])).unwrap_err(),
            "it is not a JSON object"
        );
        assert_eq!(
            with_rule(json!({"permissions": "all"})).unwrap_err(),
            "its \"permissions\" is not an object"
        );
        assert_eq!(
            with_rule(json!({"permissions": {"allow": "mcp__fleet"}})).unwrap_err(),
            "its \"permissions\".\"allow\" is not a list"
        );
    }

    #[test]
    fn undo_takes_back_the_rule_and_nothing_else() {
        let (merged, _) = with_rule(json!({"permissions": {"allow": ["Bash(ls)"]}})).unwrap();
        let (kept, removed) = without_rule(merged);
        assert!(removed);
        assert_eq!(kept, json!({"permissions": {"allow": ["Bash(ls)"]}}));
        let (same, removed) = without_rule(kept.clone());
        assert!(!removed);
        assert_eq!(same, kept);
        assert_eq!(without_rule(json!({})), (json!({}), false));
    }

    #[test]
    fn the_starter_config_loads_and_declares_the_lead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleetd.toml");
        std::fs::write(&path, STARTER_CONFIG).unwrap();
        let config = crate::config::Config::load(&path).unwrap();
        assert!(config.leads.contains_key("lead"));
        assert_eq!(config.gateway.listen.to_string(), "127.0.0.1:8765");
        assert!(
            config.profiles.iter().any(|p| p.name == "sim"),
            "the sim profile is offered"
        );
    }
}
