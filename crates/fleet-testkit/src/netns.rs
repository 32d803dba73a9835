//! A network namespace of a test's own that reaches one TCP service (the broker) only through a
//! veth pair the test can take down: a real network partition for a process started inside it
//! (`ip netns exec`, see [`Netns::wrapper`]), while the test, tmux and the workers stay in the
//! test's own namespace.
//!
//! The namespace's end of the veth has one address of a /30; the test's end has the other, and
//! a TCP forwarder of the test listens there and carries each connection to the service. Taking
//! the test's end down ([`Netns::down`]) drops every packet both ways, as a pulled cable or a
//! dead Wi-Fi would: nobody is told, connections go silent. Bringing it up again
//! ([`Netns::up`]) heals the path.
//!
//! Needs root (`CAP_NET_ADMIN`) and iproute2's `ip`: without them [`Netns::create`] fails,
//! saying so; it never skips. Dropped, it stops the forwarder and removes the veth pair and the
//! namespace. One a killed test leaves behind is removed by the next [`Netns::create`] (its
//! name carries the pid that made it).

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The start of every namespace name this module makes: `fleet-p-<pid>-<tag>`.
const PREFIX: &str = "fleet-p-";

/// How many random /30s are tried before giving up on finding one no interface uses.
const SUBNET_ATTEMPTS: usize = 32;

/// A network namespace whose only way out is a veth pair to a forwarder of the test.
pub struct Netns {
    /// `ip`.
    ip: PathBuf,
    /// The namespace's name (`ip netns exec <name>`).
    name: String,
    /// The test's end of the veth pair: the one taken down and up.
    outer: String,
    /// Where the forwarder listens, on the test's end of the veth: the service's address as
    /// seen from inside.
    forward: SocketAddr,
    /// Connections the forwarder has taken, over its life.
    carried: Arc<AtomicUsize>,
    /// Cancelled on drop: stops the forwarder and cuts what it carries.
    stop: CancellationToken,
}

impl Netns {
    /// Makes a namespace (`fleet-p-<pid>-<tag>`), a veth pair into it with addresses in a
    /// random /30 of 10.0.0.0/8 that no interface here uses, both ends and the namespace's
    /// loopback up, and a forwarder on the test's end carrying connections to `upstream`.
    pub async fn create(upstream: SocketAddr) -> anyhow::Result<Netns> {
        let ip = ip_program()?;
        sweep_stale(&ip).await;
        let tag = format!("{:08x}", random_u32());
        let (outer_ip, inner_ip) = free_subnet(&ip).await?;
        let mut netns = Netns {
            name: format!("{PREFIX}{}-{tag}", std::process::id()),
            // Interface names are at most 15 bytes: `fp` + 8 + 1.
            outer: format!("fp{tag}a"),
            forward: SocketAddr::from((outer_ip, 0)),
            carried: Arc::new(AtomicUsize::new(0)),
            stop: CancellationToken::new(),
            ip,
        };
        // From here on a failure leaves what was made to the drop.
        let inner = format!("fp{tag}b");
        let (name, outer) = (netns.name.clone(), netns.outer.clone());
        let (outer_cidr, inner_cidr) = (format!("{outer_ip}/30"), format!("{inner_ip}/30"));
        netns.ip(&["netns", "add", &name]).await?;
        netns
            .ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &name,
            ])
            .await?;
        netns
            .ip(&["addr", "add", &outer_cidr, "dev", &outer])
            .await?;
        netns.ip(&["link", "set", &outer, "up"]).await?;
        for args in [
            ["addr", "add", inner_cidr.as_str(), "dev", inner.as_str()].as_slice(),
            &["link", "set", inner.as_str(), "up"],
            &["link", "set", "lo", "up"],
        ] {
            let mut words = vec!["-n", name.as_str()];
            words.extend_from_slice(args);
            netns.ip(&words).await?;
        }
        let listener = TcpListener::bind(netns.forward)
            .await
            .with_context(|| format!("binding the forwarder on {outer_ip}"))?;
        netns.forward = listener.local_addr()?;
        tokio::spawn(forward(
            listener,
            upstream,
            Arc::clone(&netns.carried),
            netns.stop.clone(),
        ));
        Ok(netns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The command line that runs a program inside the namespace (the program's words go
    /// after it): `ip netns exec <name>`.
    pub fn wrapper(&self) -> Vec<String> {
        vec![
            self.ip.display().to_string(),
            "netns".into(),
            "exec".into(),
            self.name.clone(),
        ]
    }

    /// The service's address as a program inside the namespace reaches it: the forwarder.
    pub fn forward_addr(&self) -> SocketAddr {
        self.forward
    }

    /// Whether process `pid` runs inside the namespace (its network namespace is this one).
    pub fn holds(&self, pid: u32) -> anyhow::Result<bool> {
        let ours = std::fs::metadata(Path::new("/run/netns").join(&self.name))
            .with_context(|| format!("no namespace {}", self.name))?;
        let its = std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .with_context(|| format!("no process {pid}"))?;
        Ok((ours.dev(), ours.ino()) == (its.dev(), its.ino()))
    }

    /// How many connections the forwarder has taken so far.
    pub fn connections(&self) -> usize {
        self.carried.load(Ordering::Relaxed)
    }

    /// Cuts the path: the test's end of the veth goes down, and every packet between the
    /// namespace and the forwarder is dropped, both ways, without a word to either side.
    pub async fn down(&self) -> anyhow::Result<()> {
        self.ip(&["link", "set", &self.outer, "down"]).await
    }

    /// Heals the path: the test's end of the veth comes up again (with its address and route).
    pub async fn up(&self) -> anyhow::Result<()> {
        self.ip(&["link", "set", &self.outer, "up"]).await
    }

    /// Runs `ip` with `args`; an error quotes what it said.
    async fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        run_ip(&self.ip, args).await
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.stop.cancel();
        // Deleting one end deletes the pair; deleting the namespace does too, but only once
        // the last process in it is gone.
        for args in [
            ["link", "del", self.outer.as_str()],
            ["netns", "del", self.name.as_str()],
        ] {
            let out = std::process::Command::new(&self.ip)
                .args(args)
                .stdin(Stdio::null())
                .output();
            if let Ok(out) = out
                && !out.status.success()
            {
                eprintln!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
    }
}

/// Accepts connections on `listener` until `stop`, carrying each to `upstream` both ways.
async fn forward(
    listener: TcpListener,
    upstream: SocketAddr,
    carried: Arc<AtomicUsize>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        let Ok((mut inside, _)) = accepted else {
            continue;
        };
        carried.fetch_add(1, Ordering::Relaxed);
        let stop = stop.clone();
        tokio::spawn(async move {
            let Ok(mut service) = TcpStream::connect(upstream).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inside, &mut service) => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

/// iproute2's `ip`: in `/usr/sbin` or `/sbin` (often not on a user's `PATH`), else on `PATH`;
/// an error if it does not run.
fn ip_program() -> anyhow::Result<PathBuf> {
    let program = ["/usr/sbin/ip", "/sbin/ip"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("ip"));
    let runs = std::process::Command::new(&program)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    anyhow::ensure!(
        runs,
        "iproute2's `ip` does not run: a network partition test needs it (./test.sh installs iproute2), and root"
    );
    Ok(program)
}

/// Runs `ip` with `args`; an error quotes what it said (and says that it needs root).
async fn run_ip(ip: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = ip_output(ip, args).await?;
    anyhow::ensure!(
        out.status.success(),
        "ip {} failed ({}): {} (a network partition test runs as root)",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// `ip` with `args`, run to its end.
async fn ip_output(ip: &Path, args: &[&str]) -> anyhow::Result<std::process::Output> {
    tokio::process::Command::new(ip)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {} {}", ip.display(), args.join(" ")))
}

/// Removes the namespaces (and their veth pairs) of test processes that are gone: a test
/// killed before its drop ran leaves them behind.
async fn sweep_stale(ip: &Path) {
    let Ok(out) = ip_output(ip, &["netns", "list"]).await else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some((pid, tag)) = name.strip_prefix(PREFIX).and_then(|r| r.split_once('-')) else {
            continue;
        };
        if pid.parse::<u32>().is_err() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        // Best effort: another test may be sweeping the same one.
        let _ = run_ip(ip, &["link", "del", &format!("fp{tag}a")]).await;
        let _ = run_ip(ip, &["netns", "del", name]).await;
    }
}

/// A random /30 of 10.0.0.0/8 that overlaps no IPv4 network of an interface here: its two
/// usable addresses, the test's end first.
async fn free_subnet(ip: &Path) -> anyhow::Result<(Ipv4Addr, Ipv4Addr)> {
    let out = ip_output(ip, &["-o", "-4", "addr", "show"]).await?;
    anyhow::ensure!(
        out.status.success(),
        "ip -o -4 addr show failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let used = used_networks(&String::from_utf8_lossy(&out.stdout));
    for _ in 0..SUBNET_ATTEMPTS {
        let base = (10u32 << 24) | (random_u32() & 0x00ff_fffc);
        if !used
            .iter()
            .any(|&(net, prefix)| overlaps((base, 30), (net, prefix)))
        {
            return Ok((Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2)));
        }
    }
    anyhow::bail!("no free /30 in 10.0.0.0/8 after {SUBNET_ATTEMPTS} tries")
}

/// The IPv4 networks (address, prefix length) in `ip -o -4 addr show`'s output.
fn used_networks(listing: &str) -> Vec<(u32, u8)> {
    listing
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            let (addr, prefix) = words.next()?.split_once('/')?;
            Some((
                u32::from(addr.parse::<Ipv4Addr>().ok()?),
                prefix.parse().ok()?,
            ))
        })
        .collect()
}

/// Whether two networks (address, prefix length) share an address.
fn overlaps(a: (u32, u8), b: (u32, u8)) -> bool {
    let shorter = a.1.min(b.1).min(32);
    let mask = if shorter == 0 {
        0
    } else {
        u32::MAX << (32 - shorter)
    };
    a.0 & mask == b.0 & mask
}

/// 32 random bits (a v7 UUID's last bytes are random).
fn random_u32() -> u32 {
    let bytes = uuid::Uuid::now_v7().into_bytes();
    u32::from_be_bytes([bytes[12], bytes[13], bytes[14], bytes[15]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_are_read_from_ip_addr() {
        let listing = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                       4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\n";
        assert_eq!(
            used_networks(listing),
            [
                (u32::from(Ipv4Addr::new(127, 0, 0, 1)), 8),
                (u32::from(Ipv4Addr::new(192, 0, 2, 2)), 24)
            ]
        );
    }

    #[test]
    fn overlap_is_judged_by_the_shorter_prefix() {
        let net = |a, b, c, d| u32::from(Ipv4Addr::new(a, b, c, d));
        assert!(overlaps((net(10, 1, 2, 4), 30), (net(10, 0, 0, 1), 8)));
        assert!(overlaps((net(10, 1, 2, 4), 30), (net(10, 1, 2, 6), 30)));
        assert!(!overlaps((net(10, 1, 2, 4), 30), (net(10, 1, 2, 8), 30)));
        assert!(!overlaps((net(10, 1, 2, 4), 30), (net(192, 0, 2, 2), 24)));
        assert!(overlaps((net(10, 1, 2, 4), 30), (net(0, 0, 0, 0), 0)));
    }
}
