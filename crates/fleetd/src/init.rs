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
use indexmap::IndexMap;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::cli::{Cli, lead_token};
use crate::config::Config;
use crate::mcp_config::{self, SERVER_NAME};
use crate::paths::{config_file, default_config_path};
use crate::serve::local_base;
use crate::state::{StateDir, read_if_there, write_private};

/// The Claude Code permission rule that lets it call every fleet tool without a prompt (and no
/// other server's).
pub const ALLOW_RULE: &str = "mcp__fleet";

/// Where `fleetd init` notes, in the state dir, what it added to Claude Code's settings, so
/// `--undo` takes back that and nothing the user added.
const RECORD: &str = "init.json";

/// The config `fleetd init` writes when there is none: what the embedded defaults do, said.
pub const STARTER_CONFIG: &str = r#"# fleetd's config, written by `fleetd init`. Every key and its default:
# docs/configuration.md. Check it with `fleetd doctor`.

[gateway]
listen = "127.0.0.1:8765"          # MCP at http://127.0.0.1:8765/mcp

# The lead: the Claude Code you drive. `fleetd init` registered fleetd with your Claude Code
# for it; `fleetd token lead --rotate` gives it a new token, read when Claude Code next connects.
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

/// `edited` (settings read from `original` and changed) as text in `original`'s order: each
/// key where it was, a value left as it was written, a changed object's keys too in their
/// order, what is new after them; pretty-printed two spaces a level, `depth` levels in.
pub fn in_original_order(original: Option<&RawValue>, edited: &Value, depth: usize) -> String {
    if let Some(raw) = original {
        if serde_json::from_str::<Value>(raw.get()).ok().as_ref() == Some(edited) {
            return raw.get().to_string();
        }
        let keys = serde_json::from_str::<IndexMap<String, Box<RawValue>>>(raw.get());
        if let (Value::Object(map), Ok(keys)) = (edited, keys) {
            let pad = "  ".repeat(depth + 1);
            let entry = |key: &String, raw: Option<&RawValue>, value: &Value| {
                format!(
                    "{pad}{}: {}",
                    Value::String(key.clone()),
                    in_original_order(raw, value, depth + 1)
                )
            };
            let kept = keys
                .iter()
                .filter_map(|(key, raw)| Some(entry(key, Some(raw), map.get(key)?)));
            let added = map
                .iter()
                .filter(|(key, _)| !keys.contains_key(*key))
                .map(|(key, value)| entry(key, None, value));
            let lines: Vec<String> = kept.chain(added).collect();
            if lines.is_empty() {
                return "{}".into();
            }
            return format!("{{\n{}\n{}}}", lines.join(",\n"), "  ".repeat(depth));
        }
    }
    // A JSON string holds no line break of its own (it is escaped): each one is the layout's.
    format!("{edited:#}").replace('\n', &format!("\n{}", "  ".repeat(depth)))
}

/// Claude Code's user settings file: `$CLAUDE_CONFIG_DIR/settings.json`, else
/// `~/.claude/settings.json`.
fn settings_path() -> anyhow::Result<PathBuf> {
    Ok(claude_dir()?.join("settings.json"))
}

/// Claude Code's own directory, absolute: `$CLAUDE_CONFIG_DIR`, else `~/.claude`.
fn claude_dir() -> anyhow::Result<PathBuf> {
    let dir =
        match std::env::var_os("CLAUDE_CONFIG_DIR").filter(|v| !v.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(std::env::var_os("HOME").context(
                "neither CLAUDE_CONFIG_DIR nor HOME says where Claude Code's settings are",
            )?)
            .join(".claude"),
        };
    std::path::absolute(&dir).with_context(|| format!("cannot resolve {}", dir.display()))
}

/// The user-scope `fleet` server Claude Code has, from its `.claude.json` (beside its settings
/// with `CLAUDE_CONFIG_DIR`, else in the home): whether there is one, and whether it is one
/// `fleetd init` registered (its helper is `fleetd mcp-headers`). Read only: Claude Code keeps
/// that file, and changes go through its own command.
fn registered_fleet() -> anyhow::Result<Option<bool>> {
    let file = match std::env::var_os("CLAUDE_CONFIG_DIR").filter(|v| !v.is_empty()) {
        Some(_) => claude_dir()?.join(".claude.json"),
        None => {
            PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".claude.json")
        }
    };
    let known = read_settings(&file)?;
    Ok(known["mcpServers"].get(SERVER_NAME).map(|entry| {
        entry["headersHelper"]
            .as_str()
            .is_some_and(|helper| helper.contains(" mcp-headers "))
    }))
}

/// The settings file's JSON (`Null` when there is none).
fn read_settings(path: &Path) -> anyhow::Result<Value> {
    Ok(read_json(path)?.1)
}

/// The settings file as written (none when there is none), and its JSON (`Null` then).
fn read_json(path: &Path) -> anyhow::Result<(Option<Box<RawValue>>, Value)> {
    let Some(text) =
        read_if_there(path).with_context(|| format!("cannot read {}", path.display()))?
    else {
        return Ok((None, Value::Null));
    };
    let not_json = || {
        format!(
            "{} is not JSON: fix it, then run fleetd init again",
            path.display()
        )
    };
    let value = serde_json::from_str(&text).with_context(not_json)?;
    let raw = serde_json::from_str(&text).with_context(not_json)?;
    Ok((Some(raw), value))
}

/// The settings file at `path` changed by `edit` (given its JSON, `Null` when there is none;
/// none back: nothing to change), written in the order it was (see [`in_original_order`]).
/// Returns whether it was changed.
fn edit_settings(
    path: &Path,
    edit: impl FnOnce(Value) -> anyhow::Result<Option<Value>>,
) -> anyhow::Result<bool> {
    let (raw, value) = read_json(path)?;
    let Some(edited) = edit(value)? else {
        return Ok(false);
    };
    write_settings(path, &in_original_order(raw.as_deref(), &edited, 0))?;
    Ok(true)
}

/// Writes `text` (settings) to `path` whole (a temporary file renamed over it). An existing
/// file keeps its mode, and a symlink stays one (its target is written); a new file is its
/// owner's only, its directory made if need be.
fn write_settings(path: &Path, text: &str) -> anyhow::Result<()> {
    let text = format!("{}\n", text.trim_end());
    let Ok(target) = std::fs::canonicalize(path) else {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        return write_private(path, &text)
            .with_context(|| format!("cannot write {}", path.display()));
    };
    let mode = std::fs::metadata(&target)
        .with_context(|| format!("cannot read {}", target.display()))?
        .permissions();
    let partial = target.with_extension("json.fleetd-partial");
    std::fs::write(&partial, text)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::set_permissions(&partial, mode)
        .and_then(|()| std::fs::rename(&partial, &target))
        .with_context(|| format!("cannot write {}", target.display()))
}

/// Runs `claude ARGS`; its output, or why it failed.
fn claude(program: &Path, args: &[&str]) -> anyhow::Result<std::process::Output> {
    Command::new(program).args(args).output().with_context(|| {
        format!(
            "cannot run Claude Code as '{}' (--claude PATH names it; then run fleetd init again)",
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
    println!("{}", crate::skill::install(&claude_dir()?)?);
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

/// `path` as a word of the helper's command line: UTF-8, and without `${` (Claude Code expands
/// those in its config before any shell sees the quotes).
fn word(path: &Path) -> anyhow::Result<String> {
    let text = path.to_str().with_context(|| {
        format!(
            "{} is not a UTF-8 path, which Claude Code's helper command cannot name",
            path.display()
        )
    })?;
    if text.contains("${") || text.ends_with(" (deleted)") {
        bail!(
            "{text} cannot be named in Claude Code's helper command (a `${{` in it would be expanded; a deleted binary cannot run): move it, then run fleetd init again"
        );
    }
    Ok(text.to_string())
}

/// Registers fleetd with Claude Code (user scope) for lead `args.name`, its token from the
/// header helper run with the config at `path` and `state`.
fn register(args: &InitArgs, config: &Config, state: &StateDir, path: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot tell where this fleetd is")?;
    let state_root = std::fs::canonicalize(state.root())
        .with_context(|| format!("cannot resolve {}", state.root().display()))?;
    let helper =
        mcp_config::helper_command(&word(&exe)?, &args.name, &word(path)?, &word(&state_root)?);
    let url = match &config.gateway.advertise_url {
        Some(url) => url.clone(),
        None => format!("{}/mcp", local_base(config.gateway.listen)),
    };
    let entry = mcp_config::registered(&url, &helper).to_string();
    // `add-json` refuses a name already there: what an earlier init registered goes first; one
    // the user made is left alone.
    match registered_fleet()? {
        Some(false) => bail!(
            "Claude Code has an MCP server '{SERVER_NAME}' in user scope that fleetd init did not register; fleetd left it as it is: remove it (`{} mcp remove {SERVER_NAME} -s user`), then run fleetd init again",
            args.claude.display()
        ),
        Some(true) => {
            claude(&args.claude, &["mcp", "remove", SERVER_NAME, "-s", "user"])?;
        }
        None => {}
    }
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
    let added = edit_settings(&settings, |value| {
        let (merged, added) = with_rule(value)
            .map_err(|why| anyhow::anyhow!("{} cannot take the permission rule: {why}; add \"{ALLOW_RULE}\" to its permissions.allow yourself", settings.display()))?;
        Ok(added.then_some(merged))
    })?;
    if !added {
        println!(
            "Claude Code may already call fleetd's tools without asking (\"{ALLOW_RULE}\" is in {})",
            settings.display()
        );
        return Ok(());
    }
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
    match registered_fleet()? {
        Some(true) => {
            let removed = claude(&args.claude, &["mcp", "remove", SERVER_NAME, "-s", "user"])?;
            if !removed.status.success() {
                bail!(
                    "Claude Code did not remove the MCP server '{SERVER_NAME}': {}",
                    String::from_utf8_lossy(&removed.stderr).trim()
                );
            }
            println!("removed the MCP server '{SERVER_NAME}' from Claude Code (user scope)");
        }
        Some(false) => println!(
            "Claude Code's MCP server '{SERVER_NAME}' was not registered by fleetd init: it is left as it is"
        ),
        None => println!("Claude Code has no MCP server '{SERVER_NAME}' in user scope"),
    }
    let record_path = state.root().join(RECORD);
    let record: Value = std::fs::read_to_string(&record_path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null);
    match record["allow_added_to"].as_str() {
        Some(settings) => {
            let settings = PathBuf::from(settings);
            let removed = edit_settings(&settings, |value| {
                let (kept, removed) = without_rule(value);
                Ok(removed.then_some(kept))
            })?;
            if removed {
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
    println!("{}", crate::skill::remove(&claude_dir()?)?);
    println!(
        "kept: the config and the lead's token (`fleetd token NAME --rotate` makes the token stop working)"
    );
    Ok(())
}

/// `fleetd mcp-headers NAME`: the lead's headers as Claude Code's header helper wants them. The
/// token file is read, never written: minting here would revoke the token in use (a helper run
/// beside `fleetd token NAME --rotate` would undo the rotation), and the store is not opened
/// (the helper runs at every connection of every Claude Code, within Claude Code's 10 s).
pub fn mcp_headers_command(cli: &Cli, args: &McpHeadersArgs) -> anyhow::Result<()> {
    let (_config, state) = cli.paths.resolve()?;
    let file = state.lead_token_path(&args.name);
    let token = std::fs::read_to_string(&file)
        .map(|t| t.trim().to_string())
        .with_context(|| {
            format!(
                "no token for lead '{}' at {} (is --state-dir right? `fleetd token {0}` makes one)",
                args.name,
                file.display()
            )
        })?;
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
    fn settings_are_written_back_in_the_users_order_and_as_they_were_written() {
        let theirs = r#"{
  "model": "opus",
  "hooks": {"Stop": [{"command": "say done"}]},
  "permissions": {
    "deny": ["Read(.env)"],
    "allow": ["Bash(ls)"],
    "defaultMode": "acceptEdits"
  },
  "env": {"B": "1", "A": "2\nlines"}
}"#;
        let raw: Box<RawValue> = serde_json::from_str(theirs).unwrap();
        let value: Value = serde_json::from_str(theirs).unwrap();
        let (merged, _) = with_rule(value.clone()).unwrap();
        let written = in_original_order(Some(&raw), &merged, 0);
        assert_eq!(
            written,
            r#"{
  "model": "opus",
  "hooks": {"Stop": [{"command": "say done"}]},
  "permissions": {
    "deny": ["Read(.env)"],
    "allow": [
      "Bash(ls)",
      "mcp__fleet"
    ],
    "defaultMode": "acceptEdits"
  },
  "env": {"B": "1", "A": "2\nlines"}
}"#
        );
        assert_eq!(serde_json::from_str::<Value>(&written).unwrap(), merged);
        // Undone, it reads as it did.
        let raw: Box<RawValue> = serde_json::from_str(&written).unwrap();
        let (kept, _) = without_rule(merged);
        let undone = in_original_order(Some(&raw), &kept, 0);
        assert_eq!(serde_json::from_str::<Value>(&undone).unwrap(), value);
        assert!(
            undone.find("\"model\"") < undone.find("\"env\""),
            "{undone}"
        );
        // Nothing there before: the rule alone, pretty.
        let (made, _) = with_rule(Value::Null).unwrap();
        assert_eq!(
            in_original_order(None, &made, 0),
            "{\n  \"permissions\": {\n    \"allow\": [\n      \"mcp__fleet\"\n    ]\n  }\n}"
        );
        // An empty object stays one, and a key added goes last.
        let raw: Box<RawValue> = serde_json::from_str(r#"{"z": 1}"#).unwrap();
        assert_eq!(
            in_original_order(Some(&raw), &json!({"z": 1, "a": {}}), 0),
            "{\n  \"z\": 1,\n  \"a\": {}\n}"
        );
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
    fn settings_written_keep_their_mode_and_a_symlink_stays_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("dotfiles-settings.json");
        std::fs::write(&target, "{}").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.path().join("settings.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_settings(
            &link,
            &json!({"permissions": {"allow": ["mcp__fleet"]}}).to_string(),
        )
        .unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let read: Value = serde_json::from_str(&std::fs::read_to_string(&target).unwrap()).unwrap();
        assert_eq!(read["permissions"]["allow"][0], "mcp__fleet");
        // A new file is its owner's only, in a directory made for it.
        let fresh = dir.path().join("new/settings.json");
        write_settings(&fresh, "{}").unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn the_starter_config_loads_and_declares_the_lead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleetd.toml");
        std::fs::write(&path, STARTER_CONFIG).unwrap();
        let config = crate::config::Config::load(&path).unwrap();
        // Declared by the file itself, not only filled in as a default.
        let raw: toml::Table = STARTER_CONFIG.parse().unwrap();
        assert!(raw["leads"].get("lead").is_some(), "{raw}");
        let embedded = crate::config::Config::embedded();
        assert_eq!(config.gateway.listen, embedded.gateway.listen);
        assert!(config.leads.contains_key("lead"));
        assert_eq!(config.gateway.listen.to_string(), "127.0.0.1:8765");
        assert!(
            config.profiles.iter().any(|p| p.name == "sim"),
            "the sim profile is offered"
        );
    }
}
