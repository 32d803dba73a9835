//! `fleet-herdr-standin`: a stand-in herdr server for tests (see `fleet_testkit::standin`).

use std::path::PathBuf;

use clap::Parser;
use fleet_testkit::standin::StandIn;

/// Serves herdr's socket protocol, with the panes in a private tmux server.
#[derive(Debug, Parser)]
struct Args {
    /// The socket to serve on.
    #[arg(long)]
    socket: PathBuf,
    /// The private tmux server's name (tmux -L); kept across restarts of the stand-in.
    #[arg(long)]
    tmux: String,
    /// Answer every n-th request ~100 ms late, as herdr does now and then.
    #[arg(long)]
    stall_every: Option<usize>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Pastes are staged beside the socket, in the directory whoever started it cleans up.
    let scratch = args.socket.with_extension("paste");
    StandIn::serve(args.socket, args.tmux, scratch, args.stall_every).await
}
