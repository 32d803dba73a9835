//! Sandboxes in a real container runtime: podman (installed by `./test.sh`), running a
//! container whose root is a directory the test prepares (`podman run --rootfs`): no image is
//! pulled or built. The root holds the host's `/usr` read-only, as a distribution image would
//! hold its own, an `/etc` with the host's users, and an empty `/tmp`; what the worker needs
//! besides is bound in by the profile's runtime template, the docker recipe of docs/workers.md with
//! `--rootfs {image}` for the image.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::Context;

use crate::fleet::TEST_API_KEY;

/// The most processes podman lets a container keep: it lowers its own limit to this when it
/// cannot raise it, and a container asking for more is refused.
const PODMAN_NPROC: u64 = 32 * 1024;

/// Makes `root` a container root: `/usr` (bound read-only at run), the merged-usr links into
/// it, `/etc` with the host's users and hosts, and empty `/tmp`, `/proc`, `/dev`, `/sys`.
fn prepare_root(root: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for dir in [
        "usr", "etc", "tmp", "proc", "dev", "sys", "root", "run", "var/tmp",
    ] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    for link in ["bin", "sbin", "lib", "lib64"] {
        std::os::unix::fs::symlink(format!("usr/{link}"), root.join(link))?;
    }
    for file in ["passwd", "group", "nsswitch.conf"] {
        let from = Path::new("/etc").join(file);
        if from.exists() {
            std::fs::copy(&from, root.join("etc").join(file))?;
        }
    }
    std::fs::write(
        root.join("etc/hosts"),
        "127.0.0.1 localhost\n::1 localhost\n",
    )?;
    Ok(())
}

/// The hard limit of this process's `name` resource (as `/proc/self/limits` calls it).
fn hard_limit(name: &str) -> anyhow::Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let line = limits
        .lines()
        .find(|l| l.starts_with(name))
        .with_context(|| format!("no '{name}' in /proc/self/limits"))?;
    let hard = line[name.len()..]
        .split_whitespace()
        .nth(1)
        .context("a limit line without its hard value")?;
    Ok(if hard == "unlimited" {
        u64::MAX
    } else {
        hard.parse()?
    })
}

/// The `--ulimit` options that keep a container within what this machine lets podman give: a
/// root without `CAP_SYS_RESOURCE` (a machine that is itself a container) cannot raise a limit,
/// and podman's defaults for a root (a million open files) would be refused.
pub fn ulimits() -> anyhow::Result<Vec<String>> {
    let files = hard_limit("Max open files")?.min(1 << 20);
    let processes = hard_limit("Max processes")?.min(PODMAN_NPROC);
    Ok(vec![
        "--ulimit".into(),
        format!("nofile={files}:{files}"),
        "--ulimit".into(),
        format!("nproc={processes}:{processes}"),
    ])
}

/// The OCI runtime podman runs containers with here: crun, Debian's default, when it can run
/// one on this machine, else runc. crun refuses a machine whose cgroups are "hybrid" with a
/// controller on the unified hierarchy (`cgroups in hybrid mode not supported`), which a
/// machine that is itself a container may be. Probed once, with a container of its own.
pub fn oci_runtime() -> anyhow::Result<&'static str> {
    static FOUND: OnceLock<Result<&'static str, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| probe().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn probe() -> anyhow::Result<&'static str> {
    let root = tempfile::tempdir()?;
    prepare_root(root.path())?;
    let mut refusals = Vec::new();
    for runtime in ["crun", "runc"] {
        let output = std::process::Command::new("podman")
            .args(["--runtime", runtime, "run", "--rm", "--network", "host"])
            .args(ulimits()?)
            .args(["-v", "/usr:/usr:ro", "--rootfs"])
            .arg(root.path())
            .args(["/bin/true"])
            .output()
            .context("podman is not installed (./test.sh installs it)")?;
        if output.status.success() {
            return Ok(runtime);
        }
        refusals.push(format!(
            "{runtime}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    anyhow::bail!("podman runs no container here: {}", refusals.join("; "))
}

/// A container root of its own (made by [`prepare_root`]) and the containers run on it,
/// labelled as this one's: removed when this is dropped, so a test that ends (or fails) with
/// workers still up leaves no container running. (fleetd tears a worker's container down when
/// the worker goes; a test's fleet is killed with its workers up.)
pub struct Podman {
    root: tempfile::TempDir,
    label: String,
}

impl Podman {
    /// A fresh root and a label of its own.
    pub fn new() -> anyhow::Result<Self> {
        let root = tempfile::tempdir()?;
        prepare_root(root.path())?;
        Ok(Self {
            root,
            label: format!("fleet-test={}", uuid::Uuid::now_v7().simple()),
        })
    }

    /// A sandbox `[[profiles]]` block running the agent `agent` in a container on this root,
    /// the docker recipe of docs/workers.md: host network (it reaches fleetd on loopback), the launch's
    /// environment from `{env_file}`, the host's `/usr` read-only, and only the worker's own
    /// files, its working directory `workdir` and the agent's program bound in. `real` makes it
    /// a real agent's (`claude-code` or `opencode`, on the scripted model at the given base
    /// URL, in a home of its own with the test key).
    pub fn profile(
        &self,
        name: &str,
        workdir: &Path,
        agent: &str,
        real: Option<(&str, &str)>,
    ) -> anyhow::Result<String> {
        profile(&self.label, name, self.root.path(), workdir, agent, real)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman")
            .args(["rm", "-f", "-t", "0", "--filter"])
            .arg(format!("label={}", self.label))
            .output();
    }
}

/// [`Podman::profile`], its containers labelled `label`, on `root`.
fn profile(
    label: &str,
    name: &str,
    root: &Path,
    workdir: &Path,
    agent: &str,
    real: Option<(&str, &str)>,
) -> anyhow::Result<String> {
    let runtime: Vec<String> = [
        "podman",
        "--runtime",
        oci_runtime()?,
        "run",
        "--rm",
        "-it",
        "--name",
        "fleet-{gid}",
        "--network",
        "host",
        "--env-file",
        "{env_file}",
        "--label",
        label,
    ]
    .into_iter()
    .map(String::from)
    .chain(ulimits()?)
    .chain(
        [
            "-v",
            "/usr:/usr:ro",
            "-v",
            "{worker_dir}:{worker_dir}",
            "-v",
            "{workdir}:{workdir}",
            "-v",
            "{agent}:{agent}:ro",
            "-w",
            "{workdir}",
            "--rootfs",
            "{image}",
        ]
        .map(String::from),
    )
    .collect();
    let real = match real {
        Some((kind, base_url)) => {
            let model = if kind == "opencode" {
                "model = \"anthropic/claude-sonnet-4-5\"\n"
            } else {
                ""
            };
            format!(
                "agent_kind = \"{kind}\"\nbase_url = \"{base_url}\"\n{model}isolated_home = true\nenv = {{ ANTHROPIC_API_KEY = \"{TEST_API_KEY}\" }}\nready_timeout_s = 90\n"
            )
        }
        None => "ready_timeout_s = 30\n".into(),
    };
    Ok(format!(
        "[[profiles]]\nname = \"{name}\"\nkind = \"sandbox\"\ncwd = {workdir:?}\nimage = {root:?}\nruntime = {runtime:?}\nteardown = [\"podman\", \"rm\", \"-f\", \"-t\", \"0\", \"fleet-{{gid}}\"]\nagent = [{agent:?}]\n{real}",
        workdir = workdir.display().to_string(),
        root = root.display().to_string(),
    ))
}
