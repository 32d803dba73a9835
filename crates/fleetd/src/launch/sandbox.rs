//! The sandbox launcher (spec CB-500 §4, §11): the profile's runtime argv template, its
//! placeholders filled in, wrapped around the agent's argv; the teardown template, filled in
//! the same way, runs when the pane goes. fleetd launches into a sandbox and tears it down; it
//! never builds images or installs tools.
//!
//! The MCP URL handed in is the gateway's advertised one, which must be reachable from inside
//! the sandbox. `{token}` puts the worker's token on the runtime's command line, where other
//! users of the machine can see it: prefer passing `FLEET_TOKEN` through the environment
//! (`docker run -e FLEET_TOKEN`, which copies it from the pane's environment).
//!
//! A runtime that shares the host's files (bubblewrap) decides what the sandbox sees with its
//! mounts: `{state_dir}` and `{home}` name what to hide, `{worker_dir}` the worker's own files
//! to bind back in, and `{agent}` the agent's program as found on this host (absolute, links
//! resolved) to bind read-only; when the runtime names `{agent}`, the agent is started by that
//! path. A bwrap runtime whose mounts would hide the agent is refused before the pane opens.
//!
//! A container runtime starts the agent with its own environment, not the pane's: `{env_file}`
//! names a file in the worker's directory (user-only) holding the launch's environment, for
//! `--env-file` (docker, podman), so the agent inside gets its token, home and endpoint without
//! a `-e` per variable and with no value on the command line.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use super::bwrap::{self, Sight};
use super::{Launch, PeerLauncher, Worker};
use crate::config::ProfileConfig;

/// The file in the worker's directory that `{env_file}` names: the launch's environment (its
/// token among it), user-only, for a container runtime to read (`--env-file`).
pub(super) const ENV_FILE: &str = "sandbox.env";

pub(super) struct SandboxLauncher {
    /// The gateway's state dir (tokens, database, workers' files): `{state_dir}`.
    pub(super) state_dir: PathBuf,
    /// The user's home: `{home}`.
    pub(super) home: Option<PathBuf>,
}

impl PeerLauncher for SandboxLauncher {
    fn prepare(
        &self,
        profile: &ProfileConfig,
        worker: &Worker,
        mut launch: Launch,
    ) -> io::Result<Launch> {
        let names = |placeholder: &str| {
            profile
                .runtime
                .iter()
                .chain(&profile.teardown)
                .any(|word| word.contains(&format!("{{{placeholder}}}")))
        };
        let program = launch.argv.first().cloned().unwrap_or_default();
        let found = find_program(&program, &launch.env, &worker.cwd);
        let agent = match (&found, names("agent")) {
            (Some(found), true) => {
                launch.argv[0] = found.resolved.display().to_string();
                Some(found.resolved.clone())
            }
            (None, true) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "the runtime binds {{agent}}, but the agent '{program}' is not a program on this host (not found on PATH)"
                    ),
                ));
            }
            (_, false) => None,
        };
        if names("home") && self.home.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the runtime names {home}, but fleetd knows no home (HOME is not set)",
            ));
        }
        let env_file = names("env_file").then(|| worker.dir.join(ENV_FILE));
        let values = Values {
            launcher: self,
            profile,
            worker,
            agent: agent.as_deref(),
            env_file: env_file.as_deref(),
        };
        let fill = |word: &String| fill(word, &values);
        let mut argv: Vec<String> = profile.runtime.iter().map(fill).collect();
        if let Some(found) = &found {
            in_sight(&argv, found, agent.is_some())?;
        }
        // Written last, once nothing can refuse the launch.
        if let Some(file) = &env_file {
            super::private_file(file, env_lines(&launch.env)?.as_bytes())?;
        }
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

/// Refuses a bwrap `argv` that would hide the agent `found` from the sandbox: what the sandbox
/// execs (its resolved path when `by_resolved`, the runtime binding `{agent}`, else the path as
/// started) and what that leads to (the file itself, its links followed) must both be in sight.
/// Other runtimes are not read.
fn in_sight(argv: &[String], found: &Found, by_resolved: bool) -> io::Result<()> {
    if !bwrap::is_bwrap(argv) {
        return Ok(());
    }
    let started = if by_resolved {
        &found.resolved
    } else {
        &found.named
    };
    for path in [started, &found.resolved] {
        if let Some(why) = hidden(argv, path) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "the sandbox would not see the agent {}: {why}; bind it in with \"--ro-bind\", \"{{agent}}\", \"{{agent}}\" in the profile's runtime (the agent's program alone: an agent made of several files needs its directory bound)",
                    path.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Why bwrap's `argv` hides the host path `path` from the sandbox, if it does.
fn hidden(argv: &[String], path: &Path) -> Option<String> {
    match bwrap::sight(argv, path) {
        Sight::Seen => None,
        Sight::Hidden { option, at } => Some(format!(
            "it is under {}, where the runtime mounts {option}",
            at.display()
        )),
        Sight::Unmounted => Some("no mount of the runtime covers it".into()),
        // What the reading cannot tell is no reason to refuse.
        Sight::Unknown => None,
    }
}

/// An agent's program as found on this host.
struct Found {
    /// The absolute path it is started by: itself when it names a path (relative to the
    /// worker's working directory, where the pane starts), else the first match on `PATH`.
    named: PathBuf,
    /// That path with its links followed.
    resolved: PathBuf,
}

/// Where `program` is on this host, for a pane in `cwd` with the `PATH` it gets (the
/// profile's, else fleetd's own).
fn find_program(
    program: &str,
    env: &std::collections::BTreeMap<String, String>,
    cwd: &Path,
) -> Option<Found> {
    let path = env
        .get("PATH")
        .map(std::ffi::OsString::from)
        .or_else(|| std::env::var_os("PATH"));
    let named = super::locate_program(program, path.as_deref(), cwd)?;
    let resolved = std::fs::canonicalize(&named).ok()?;
    Some(Found { named, resolved })
}

/// The environment `env` as an env file (`NAME=value` lines, as `docker run --env-file` and
/// `podman run --env-file` read it), or why it cannot be one: a value holding a line break
/// would end its line early and start another variable of its own making.
fn env_lines(env: &BTreeMap<String, String>) -> io::Result<String> {
    let mut lines = String::new();
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\n', '\r']) || value.contains(['\n', '\r']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the variable '{}' cannot go into an env file (a line break or '=' in its name, or a line break in its value)",
                    name.escape_debug()
                ),
            ));
        }
        lines.push_str(&format!("{name}={value}\n"));
    }
    Ok(lines)
}

/// What the placeholders stand for in one launch.
struct Values<'a> {
    launcher: &'a SandboxLauncher,
    profile: &'a ProfileConfig,
    worker: &'a Worker,
    agent: Option<&'a Path>,
    env_file: Option<&'a Path>,
}

/// `word` with each known `{placeholder}` replaced (the config check refused unknown ones).
fn fill(word: &str, values: &Values<'_>) -> String {
    let Values {
        launcher,
        profile,
        worker,
        agent,
        env_file,
    } = values;
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
            "worker_dir" => worker.dir.display().to_string(),
            "state_dir" => launcher.state_dir.display().to_string(),
            "home" => launcher.home.as_ref()?.display().to_string(),
            "agent" => (*agent)?.display().to_string(),
            "env_file" => (*env_file)?.display().to_string(),
            _ => return None,
        })
    };
    super::fill_template(word, &value)
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
        let launch = launcher(dir.path()).prepare(&profile, &w, launch).unwrap();
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
    fn an_env_file_holds_the_launch_environment_for_the_runtime_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        std::fs::create_dir_all(&w.dir).unwrap();
        let mut profile = ProfileConfig::command("box", Vec::new());
        profile.kind = ProfileKind::Sandbox;
        profile.runtime = ["podman", "run", "--env-file", "{env_file}", "img"]
            .map(String::from)
            .to_vec();
        let env: BTreeMap<String, String> = [
            ("FLEET_TOKEN".to_string(), w.token.clone()),
            ("HOME".to_string(), "/w/home".to_string()),
        ]
        .into();
        let launch = Launch {
            argv: vec!["agent".into()],
            env: env.clone(),
            teardown: None,
        };
        let launch = launcher(dir.path()).prepare(&profile, &w, launch).unwrap();
        let file = w.dir.join(ENV_FILE);
        assert_eq!(launch.argv[3], file.display().to_string());
        assert!(!launch.argv.iter().any(|a| a.contains(&w.token)));
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("FLEET_TOKEN={}\nHOME=/w/home\n", w.token)
        );
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A value that would make two lines is refused, naming the variable and not the value.
        let mut broken = env;
        broken.insert("EXTRA".into(), "one\nINJECTED=1".into());
        let launch = Launch {
            argv: vec!["agent".into()],
            env: broken,
            teardown: None,
        };
        let err = launcher(dir.path())
            .prepare(&profile, &w, launch)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'EXTRA'") && !err.contains("INJECTED"),
            "{err}"
        );
        // Without the placeholder, no file is written.
        std::fs::remove_file(&file).unwrap();
        profile.runtime = ["bwrap", "--ro-bind", "/", "/", "--"]
            .map(String::from)
            .to_vec();
        let launch = Launch {
            argv: vec!["/bin/sh".into()],
            env: Default::default(),
            teardown: None,
        };
        launcher(dir.path()).prepare(&profile, &w, launch).unwrap();
        assert!(!file.exists());
    }

    #[test]
    fn a_launch_and_its_worker_debug_print_without_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let mut profile = ProfileConfig::command("box", Vec::new());
        profile.kind = ProfileKind::Sandbox;
        profile.runtime = ["docker", "run", "-e", "FLEET_TOKEN={token}", "img"]
            .map(String::from)
            .to_vec();
        profile.teardown = ["curl", "-H", "Authorization: Bearer {token}", "http://x/"]
            .map(String::from)
            .to_vec();
        let launch = Launch {
            argv: vec!["agent".into()],
            env: [("FLEET_TOKEN".to_string(), w.token.clone())].into(),
            teardown: None,
        };
        let launch = launcher(dir.path()).prepare(&profile, &w, launch).unwrap();
        assert!(launch.argv.contains(&format!("FLEET_TOKEN={}", w.token)));
        for shown in [
            format!("{launch:?}"),
            format!("{launch:#?}"),
            format!("{w:?}"),
        ] {
            assert!(!shown.contains(&w.token), "{shown}");
        }
        let shown = format!("{launch:?}");
        assert!(
            shown.contains(r#"["docker", …5 more]"#) && shown.contains(r#""FLEET_TOKEN": ***"#),
            "{shown}"
        );
        assert!(shown.contains(r#"Some(["curl", …3 more])"#), "{shown}");
    }

    #[test]
    fn placeholders_fill_in_anywhere_in_a_word_and_other_braces_stay() {
        let dir = tempfile::tempdir().unwrap();
        let w = worker(dir.path());
        let profile = ProfileConfig::command("box", Vec::new());
        let launcher = launcher(dir.path());
        let values = Values {
            launcher: &launcher,
            profile: &profile,
            worker: &w,
            agent: Some(Path::new("/opt/agent")),
            env_file: None,
        };
        assert_eq!(
            fill("{workdir}:/work", &values),
            format!("{}:/work", dir.path().display())
        );
        assert_eq!(
            fill("URL={mcp_url};{x}", &values),
            "URL=http://127.0.0.1:9/mcp;{x}"
        );
        assert_eq!(
            fill("{state_dir} {worker_dir} {home} {agent}", &values),
            format!(
                "{}/state {} /home/me /opt/agent",
                dir.path().display(),
                w.dir.display()
            )
        );
    }

    fn launcher(dir: &Path) -> SandboxLauncher {
        SandboxLauncher {
            state_dir: dir.join("state"),
            home: Some("/home/me".into()),
        }
    }

    /// A bwrap profile around an executable agent at `agent`, with `binds` before the `--`.
    fn bwrap(agent: &Path, binds: &[&str]) -> (ProfileConfig, Launch) {
        let mut profile = ProfileConfig::command("boxed", Vec::new());
        profile.kind = ProfileKind::Sandbox;
        profile.runtime = ["bwrap", "--ro-bind", "/", "/", "--tmpfs", "/tmp"]
            .iter()
            .chain(binds)
            .chain(&["--"])
            .map(|w| w.to_string())
            .collect();
        let launch = Launch {
            argv: vec![agent.display().to_string(), "--flag".into()],
            env: Default::default(),
            teardown: None,
        };
        (profile, launch)
    }

    fn executable(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn an_agent_the_bwrap_mounts_hide_is_refused_naming_path_and_mount() {
        // Under /tmp, with a space and behind a symlink: as a clone of the project might be.
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let real = dir.path().join("a clone/target/agent");
        executable(&real);
        let link = dir.path().join("linked");
        std::os::unix::fs::symlink(dir.path().join("a clone"), &link).unwrap();
        let w = worker(dir.path());
        let (profile, launch) = bwrap(&link.join("target/agent"), &[]);
        let err = launcher(dir.path())
            .prepare(&profile, &w, launch.clone())
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let text = err.to_string();
        // Named by the path it is started by.
        let started = link.join("target/agent").display().to_string();
        assert!(text.contains(&started), "{text}");
        assert!(
            text.contains("under /tmp, where the runtime mounts --tmpfs"),
            "{text}"
        );
        assert!(
            text.contains("\"--ro-bind\", \"{agent}\", \"{agent}\""),
            "{text}"
        );

        // Bound in by {agent}: the agent runs by its resolved path, which the bind shows.
        let (profile, launch) = bwrap(
            &link.join("target/agent"),
            &["--ro-bind", "{agent}", "{agent}"],
        );
        let launch = launcher(dir.path()).prepare(&profile, &w, launch).unwrap();
        let real = real.display().to_string();
        let at = launch.argv.iter().position(|w| w == "--").unwrap();
        let around: Vec<&str> = launch.argv[at - 3..at + 2]
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(around, ["--ro-bind", &real, &real, "--", &real]);
        assert_eq!(launch.argv.last().map(String::as_str), Some("--flag"));
    }

    #[test]
    fn a_link_in_sight_to_an_agent_out_of_sight_is_refused_too() {
        // /usr-like place the sandbox sees, linking into /tmp, which it does not.
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let seen = tempfile::tempdir_in("/var/tmp").unwrap();
        let real = dir.path().join("agent");
        executable(&real);
        let link = seen.path().join("agent");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let (profile, launch) = bwrap(&link, &[]);
        let err = launcher(dir.path())
            .prepare(&profile, &worker(dir.path()), launch)
            .unwrap_err();
        assert!(
            err.to_string().contains(&real.display().to_string()),
            "{err}"
        );
        // A relative agent is found in the worker's working directory, where the pane starts.
        let (profile, launch) = bwrap(Path::new("./agent"), &[]);
        let err = launcher(dir.path())
            .prepare(&profile, &worker(dir.path()), launch)
            .unwrap_err();
        assert!(err.to_string().contains("under /tmp"), "{err}");
    }

    #[test]
    fn an_agent_found_on_path_is_bound_by_its_resolved_path() {
        let dir = tempfile::tempdir().unwrap();
        executable(&dir.path().join("bin/my-agent"));
        let w = worker(dir.path());
        let (profile, mut launch) =
            bwrap(Path::new("my-agent"), &["--ro-bind", "{agent}", "{agent}"]);
        launch
            .env
            .insert("PATH".into(), dir.path().join("bin").display().to_string());
        let launch = launcher(dir.path()).prepare(&profile, &w, launch).unwrap();
        let resolved = std::fs::canonicalize(dir.path().join("bin/my-agent")).unwrap();
        let at = launch.argv.iter().position(|w| w == "--").unwrap();
        assert_eq!(launch.argv[at + 1], resolved.display().to_string());

        // Not found at all while the runtime binds it: a clear error, not a broken bind.
        let (profile, launch) = bwrap(
            Path::new("no-such-agent"),
            &["--ro-bind", "{agent}", "{agent}"],
        );
        let err = launcher(dir.path())
            .prepare(&profile, &w, launch)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("'no-such-agent' is not a program on this host"),
            "{err}"
        );
    }
}
