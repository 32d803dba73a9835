//! `fleetd completions SHELL` and `fleetd man`: shell completions and manual pages, generated
//! from the command line's own definitions (clap), so they never drift from it.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::cli::Cli;

/// `fleetd completions`
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: Shell,
}

/// `fleetd man`
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write `fleetd.1` and a page per subcommand (`fleetd-init.1` …) into this directory,
    /// instead of printing `fleetd.1`.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// `fleetd completions SHELL`: the completion script on stdout (`fleetd completions bash >
/// ~/.local/share/bash-completion/completions/fleetd`).
pub fn completions_command(args: &CompletionsArgs) -> anyhow::Result<()> {
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "fleetd", &mut std::io::stdout());
    Ok(())
}

/// `fleetd man [--dir DIR]`: the manual page on stdout (`fleetd man | man -l -`), or every page
/// written into `DIR`.
pub fn man_command(args: &ManArgs) -> anyhow::Result<()> {
    let command = Cli::command();
    let Some(dir) = &args.dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(command).render(&mut out)?;
        std::io::stdout().write_all(&out)?;
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write_page(dir, "fleetd", command.clone())?;
    for sub in command.get_subcommands() {
        let name = format!("fleetd-{}", sub.get_name());
        write_page(dir, &name, sub.clone().name(name.clone()))?;
    }
    Ok(())
}

/// Writes the page of `command` as `DIR/NAME.1`.
fn write_page(dir: &Path, name: &str, command: clap::Command) -> anyhow::Result<()> {
    let path = dir.join(format!("{name}.1"));
    let mut out = Vec::new();
    clap_mangen::Man::new(command).render(&mut out)?;
    std::fs::write(&path, out).with_context(|| format!("cannot write {}", path.display()))
}
