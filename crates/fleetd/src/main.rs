//! The `fleetd` binary.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use fleetd::cli::{Cli, Command, key_command, mcp_config_command, token_command};
use fleetd::doctor::doctor_command;
use fleetd::listen::Listen;
use fleetd::notify::{NOTIFY_SOCKET, notify_target};
use fleetd::ops::{
    OpsError, answer_command, hosts_command, ls_command, msgs_command, send_command, stop_command,
};
use fleetd::serve::{ServeOptions, serve};
use tokio_util::sync::CancellationToken;

/// Threads for blocking work: the store's calls, which are short (a spawn's preparation, which
/// may wait seconds, has threads of its own: `fleetd::lane`). Few: every thread that allocates
/// gets a malloc arena of its own, and a daemon's memory should not grow with bursts.
const MAX_BLOCKING_THREADS: usize = 4;

fn run(cli: &Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Serve(args) => {
            // First, while the number can only be the descriptor fleetd was given.
            let inherited = args.listen_fd.map(Listen::inherited).transpose()?;
            let manager = std::env::var(NOTIFY_SOCKET)
                .ok()
                .and_then(|v| notify_target(&v));
            // SAFETY: no other thread runs yet (the runtime is built below, and nothing before
            // started one), so nothing reads the environment while it changes. Workers and tmux
            // must not inherit the service manager's socket.
            unsafe { std::env::remove_var(NOTIFY_SOCKET) };
            fleetd::logs::init(args.log_json)
                .map_err(|e| anyhow::anyhow!("cannot set up the log: {e}"))?;
            let (mut config, state) = cli.paths.resolve()?;
            if args.stop_workers {
                config.gateway.on_exit = fleetd::config::OnExit::Stop;
            }
            let listen = inherited.unwrap_or(Listen::Bind(config.gateway.listen));
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .max_blocking_threads(MAX_BLOCKING_THREADS)
                .build()?;
            runtime.block_on(serve(
                ServeOptions {
                    config,
                    state,
                    listen,
                    notify: manager,
                },
                CancellationToken::new(),
            ))
        }
        Command::Token(args) => token_command(cli, args),
        Command::McpConfig(args) => mcp_config_command(cli, args),
        Command::Init(args) => fleetd::init::init_command(cli, args),
        Command::Completions(args) => fleetd::completions::completions_command(args),
        Command::Man(args) => fleetd::completions::man_command(args),
        Command::McpHeaders(args) => fleetd::init::mcp_headers_command(cli, args),
        Command::Key => key_command(cli),
        Command::Ls(args) => ls_command(&cli.paths, args),
        Command::Hosts(args) => hosts_command(&cli.paths, args),
        Command::Msgs(args) => msgs_command(&cli.paths, args),
        Command::Send(args) => send_command(&cli.paths, args),
        Command::Answer(args) => answer_command(&cli.paths, args),
        Command::Stop(args) => stop_command(&cli.paths, args),
        Command::Tail(args) => fleetd::tail::tail_command(&cli.paths, args),
        Command::Doctor => doctor_command(&cli.paths),
    }
}

/// How long an exiting fleetd waits for its last log lines to be written (a stderr that takes
/// nothing does not hold the exit).
const LAST_LINES_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ran = run(&cli);
    // The log's last lines (a serving gateway's), before the process goes.
    fleetd::logs::flush(LAST_LINES_WITHIN);
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Not `eprintln!`, which panics when stderr is gone (its reader died): the exit
            // status still tells.
            let _ = writeln!(std::io::stderr(), "fleetd: error: {e:#}");
            match e.downcast_ref::<OpsError>() {
                Some(ops) => ExitCode::from(ops.exit),
                None => ExitCode::FAILURE,
            }
        }
    }
}
