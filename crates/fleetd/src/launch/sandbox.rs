//! The sandbox launcher (spec CB-500 §4, §11): the profile's runtime argv template, its
//! placeholders filled in, wrapped around the agent's argv; the teardown template, filled in
//! the same way, runs when the pane goes. fleetd launches into a sandbox and tears it down; it
//! never builds images or installs tools.
//!
//! The MCP URL handed in is the gateway's advertised one, which must be reachable from inside
//! the sandbox. `{token}` puts the worker's token on the runtime's command line, where other
//! users of the machine can see it: prefer passing `FLEET_TOKEN` through the environment
//! (`docker run -e FLEET_TOKEN`, which copies it from the pane's environment).

use super::{Launch, PeerLauncher, Worker};
use crate::config::ProfileConfig;

pub(super) struct SandboxLauncher;

impl PeerLauncher for SandboxLauncher {
    fn prepare(
        &self,
        profile: &ProfileConfig,
        worker: &Worker,
        launch: Launch,
    ) -> std::io::Result<Launch> {
        let fill = |word: &String| fill(word, profile, worker);
        let mut argv: Vec<String> = profile.runtime.iter().map(fill).collect();
        argv.extend(launch.argv);
        let teardown =
            (!profile.teardown.is_empty()).then(|| profile.teardown.iter().map(fill).collect());
        Ok(Launch {
            argv,
            env: launch.env,
            teardown,
        })
    }
}

/// `word` with each known `{placeholder}` replaced (the config check refused unknown ones).
fn fill(word: &str, profile: &ProfileConfig, worker: &Worker) -> String {
    let value = |placeholder: &str| -> Option<String> {
        Some(match placeholder {
            "name" => worker.name.clone(),
            "gid" => worker.gid.to_string(),
            "host" => worker.host.clone(),
            "image" => profile.image.clone()?,
            "role" => profile.role.clone()?,
            "mcp_url" => worker.mcp_url.clone(),
            "token" => worker.token.clone(),
            "workdir" => worker.cwd.display().to_string(),
            _ => return None,
        })
    };
    let mut out = String::new();
    let mut rest = word;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after
            .find('}')
            .and_then(|close| value(&after[..close]).map(|v| (close, v)))
        {
            Some((close, filled)) => {
                out.push_str(&filled);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::worker;
    use super::*;
    use crate::config::ProfileKind;

    #[test]
    fn the_runtime_wraps_the_agent_and_the_teardown_is_filled_in() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let mut profile = ProfileConfig::command("box", Vec::new());
        profile.kind = ProfileKind::Sandbox;
        profile.image = Some("fleet/backend:1".into());
        profile.runtime = [
            "docker",
            "run",
            "--name",
            "fleet-{name}",
            "-e",
            "FLEET_TOKEN",
            "{image}",
        ]
        .map(String::from)
        .to_vec();
        profile.teardown = ["docker", "rm", "-f", "fleet-{name}"]
            .map(String::from)
            .to_vec();
        let launch = Launch {
            argv: vec!["agent".into(), "--flag".into()],
            env: Default::default(),
            teardown: None,
        };
        let launch = SandboxLauncher.prepare(&profile, &w, launch).unwrap();
        assert_eq!(
            launch.argv,
            [
                "docker",
                "run",
                "--name",
                "fleet-w1",
                "-e",
                "FLEET_TOKEN",
                "fleet/backend:1",
                "agent",
                "--flag"
            ]
        );
        assert_eq!(launch.teardown.unwrap(), ["docker", "rm", "-f", "fleet-w1"]);
    }

    #[test]
    fn placeholders_fill_in_anywhere_in_a_word_and_other_braces_stay() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let profile = ProfileConfig::command("box", Vec::new());
        assert_eq!(
            fill("{workdir}:/work", &profile, &w),
            format!("{}:/work", dir.path().display())
        );
        assert_eq!(
            fill("URL={mcp_url};{x}", &profile, &w),
            "URL=http://127.0.0.1:9/mcp;{x}"
        );
    }
}
