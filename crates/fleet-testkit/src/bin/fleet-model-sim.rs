//! `fleet-model-sim`: the scripted Messages API server (see `fleet_testkit::model`), to run a
//! real Claude Code worker offline by hand. Prints its base URL and serves until interrupted.

use fleet_testkit::model::ModelSim;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let model = ModelSim::start().await?;
    println!("ANTHROPIC_BASE_URL={}", model.base_url());
    tokio::signal::ctrl_c().await?;
    eprintln!("answered {} model requests", model.requests());
    Ok(())
}
