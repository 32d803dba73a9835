//! The command line: `serve`, `token`, `mcp-config`, `init`, `mcp-headers`, `key`, and the operator commands against
//! a running gateway (`ls`, `hosts`, `msgs`, `send`, `answer`, `stop`: see [`crate::ops`];
//! `tail`: see [`crate::tail`]). Every subcommand takes `--config` and `--state-dir`.

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use fleet_store::{SqliteStore, Store};

use crate::config::Config;
use crate::identity::GatewayKey;
use crate::mcp_config::{self, Token};
use crate::ops::{AnswerArgs, MsgsArgs, OpsArgs, SendArgs, StopArgs};
use crate::paths::Paths;
use crate::serve::{host_id, mcp_url};
use crate::state::StateDir;
use crate::token;

/// fleetd: run a fleet of terminal AI coding agents from one lead.
#[derive(Debug, Parser)]
#[command(name = "fleetd", version, about, propagate_version = true)]
pub struct Cli {
    /// Where the config and the state dir are.
    #[command(flatten)]
    pub paths: Paths,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway: MCP at http://<listen>/mcp, health at /healthz.
    Serve(ServeArgs),
    /// Print the bearer token of a lead declared in config, minting it on first use.
    Token(TokenArgs),
    /// Print the MCP client config a lead gives Claude Code (reading the token from
    /// FLEET_TOKEN, with the line that sets it from the token file; --literal for the token
    /// itself).
    McpConfig(McpConfigArgs),
    /// Set up a lead in one command: write a commented config if there is none, mint the
    /// lead's token, register fleetd with your Claude Code (user scope) and let it call
    /// fleetd's tools without asking; prints what it changed. --undo takes it back.
    Init(crate::init::InitArgs),
    /// Print a lead's MCP headers as JSON, for Claude Code's header helper (what `fleetd init`
    /// registers): the token is read when Claude Code connects, so a rotated one is picked up.
    McpHeaders(crate::init::McpHeadersArgs),
    /// Print the completion script for a shell (bash, zsh, fish, elvish, powershell).
    Completions(crate::completions::CompletionsArgs),
    /// Print the manual page (`fleetd man | man -l -`), or with --dir write one per subcommand.
    Man(crate::completions::ManArgs),
    /// Print this gateway's public key (ed25519:<base64>), which the other hosts pin, and its
    /// fingerprint; the key pair is made in the state dir on first use.
    Key,
    /// List the fleet across hosts, as the running gateway of this state dir sees it: name,
    /// host, role, profile, sandbox runtime, the role its profile declares (`FOR`), status,
    /// agent status, pane, messages held and queued, last seen.
    /// Exit status 3 when no gateway answers, 4 when it refuses the lead's token.
    Ls(OpsArgs),
    /// List the hosts of the fleet: status, when last heard of, the profiles each can spawn.
    /// Exit status 3 when no gateway answers, 4 when it refuses the lead's token.
    Hosts(OpsArgs),
    /// List this gateway's messages, newest first: kind, sender, recipient, state, age, why
    /// one failed; their text only with --text. Exit status 3 when no gateway answers, 4 when
    /// it refuses the lead's token.
    Msgs(MsgsArgs),
    /// Send a message (to a worker: a task) as the lead and print its answer. Exit status 5
    /// when it was not delivered, 6 when no answer came within --wait (it is then held for the
    /// lead's fleet_poll).
    Send(SendArgs),
    /// Answer a worker's question (its turn id, as `fleetd send` printed it) as the lead, and
    /// print the reply that follows; exit statuses as for send.
    Answer(AnswerArgs),
    /// Stop a worker or architect as the lead.
    Stop(StopArgs),
    /// Follow this gateway's changes live: entities made and changing status, messages made
    /// and moving through their states, failures with their reasons (never a message's text).
    /// Exit status 3 when the gateway cannot be reached or goes away, 4 when it refuses the
    /// lead's token.
    Tail(crate::tail::TailArgs),
    /// Check what would keep this host's fleetd from working: the config, the state dir, the
    /// pane host, every profile's program, the broker, and whether a gateway serves now. Exit
    /// status 1 when a check fails.
    Doctor,
}

/// `fleetd serve`
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
    /// Serve on the TCP socket inherited as file descriptor N, already bound and listening
    /// (from a systemd socket unit: 3), instead of binding gateway.listen. Workers are given
    /// its address; keep gateway.listen the same, for `mcp-config`.
    #[arg(long, value_name = "N")]
    pub listen_fd: Option<u32>,
    /// End the workers when fleetd exits (`[gateway] on_exit = "stop"`), instead of leaving
    /// them running for the next start to take back.
    #[arg(long)]
    pub stop_workers: bool,
}

/// `fleetd token`
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The lead (`[leads.NAME]`) or operator (`[operators.NAME]`).
    pub name: String,
    /// Mint a new token; the old one stops working at once.
    #[arg(long)]
    pub rotate: bool,
}

/// `fleetd mcp-config`
#[derive(Debug, Args)]
pub struct McpConfigArgs {
    /// The lead, as declared in `[leads.NAME]`.
    pub name: String,
    /// Print only the JSON (no shell lines).
    #[arg(long)]
    pub json: bool,
    /// Write the token itself into the config instead of `${FLEET_TOKEN}` (it then lands in
    /// whatever file or command line the config goes into).
    #[arg(long)]
    pub literal: bool,
}

/// The token of lead `name`, minted on first use.
pub fn lead_token(
    config: &Config,
    state: &StateDir,
    name: &str,
    rotate: bool,
) -> anyhow::Result<String> {
    let Some(lead) = config.leads.get(name) else {
        let declared: Vec<&str> = config.leads.keys().map(String::as_str).collect();
        bail!(
            "no lead named '{name}' is declared in config (declared: {}); add a [leads.{name}] block",
            declared.join(", ")
        );
    };
    state
        .prepare()
        .with_context(|| format!("cannot create the state dir {}", state.root().display()))?;
    let store = SqliteStore::open(&state.db_path())
        .with_context(|| format!("cannot open {}", state.db_path().display()))?;
    let gid = store.ensure_lead(name, &host_id(config), &lead.groups)?;
    token::token_in(&store, &state.lead_token_path(name), gid, rotate)
}

/// The token of operator `name` (`[operators.NAME]`), minted on first use.
fn operator_token(state: &StateDir, name: &str, rotate: bool) -> anyhow::Result<String> {
    state
        .prepare()
        .with_context(|| format!("cannot create the state dir {}", state.root().display()))?;
    let store = SqliteStore::open(&state.db_path())
        .with_context(|| format!("cannot open {}", state.db_path().display()))?;
    token::token_in(
        &store,
        &state.operator_token_path(name),
        fleet_core::Gid::of_operator(name),
        rotate,
    )
}

/// `fleetd token NAME [--rotate]`: a lead's token, or an operator's.
pub fn token_command(cli: &Cli, args: &TokenArgs) -> anyhow::Result<()> {
    let (config, state) = cli.paths.resolve()?;
    let token = if config.operators.contains_key(&args.name) {
        operator_token(&state, &args.name, args.rotate)?
    } else if config.leads.contains_key(&args.name) {
        lead_token(&config, &state, &args.name, args.rotate)?
    } else {
        let names = |keys: Vec<&String>| {
            keys.into_iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        };
        bail!(
            "no lead or operator named '{}' is declared in config (leads: {}; operators: {}); add a [leads.{0}] or [operators.{0}] block",
            args.name,
            names(config.leads.keys().collect()),
            names(config.operators.keys().collect()),
        );
    };
    println!("{token}");
    Ok(())
}

/// `fleetd key`: the gateway's public key on one line, its fingerprint on the next.
pub fn key_command(cli: &Cli) -> anyhow::Result<()> {
    let (_config, state) = cli.paths.resolve()?;
    state
        .prepare()
        .with_context(|| format!("cannot create the state dir {}", state.root().display()))?;
    let (key, made) = GatewayKey::load_or_create(&state)?;
    if made {
        eprintln!(
            "fleetd: made this gateway's key pair in {}",
            state.root().display()
        );
    }
    println!("{}", key.public_text());
    println!("fingerprint {}", key.fingerprint());
    Ok(())
}

/// `fleetd mcp-config NAME [--json] [--literal]`: see [`crate::mcp_config`].
pub fn mcp_config_command(cli: &Cli, args: &McpConfigArgs) -> anyhow::Result<()> {
    let (config, state) = cli.paths.resolve()?;
    let secret = lead_token(&config, &state, &args.name, false)?;
    let url = mcp_url(&config, config.gateway.listen);
    let file = state.lead_token_path(&args.name);
    let file = std::fs::canonicalize(&file)
        .with_context(|| format!("cannot resolve {}", file.display()))?;
    let token = if args.literal {
        eprintln!("{}", mcp_config::LITERAL_WARNING);
        Token::Literal(&secret)
    } else {
        Token::FromFile(file.to_str().with_context(|| {
            format!(
                "the token file {} is not a UTF-8 path, which a shell line cannot name here; use --literal, or a state dir with a UTF-8 path",
                file.display()
            )
        })?)
    };
    if args.json {
        println!("{:#}", mcp_config::json(&url, token));
    } else {
        print!("{}", mcp_config::text(&url, token));
    }
    Ok(())
}
