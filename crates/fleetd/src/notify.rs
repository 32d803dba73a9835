//! Readiness for a service manager (systemd's `Type=notify`): once fleetd serves, it sends
//! `READY=1` to the datagram socket `NOTIFY_SOCKET` names, and `STOPPING=1` when it begins to
//! stop. Without `NOTIFY_SOCKET` nothing is sent. The variable is read once at start and taken
//! out of the environment, so no worker (nor tmux) inherits the manager's socket.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

/// Where `NOTIFY_SOCKET` points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotifyTarget {
    /// A socket file.
    Path(PathBuf),
    /// A socket in the abstract namespace (`@name`).
    Abstract(Vec<u8>),
}

/// Reads `NOTIFY_SOCKET`'s value: an absolute path, or `@` and an abstract name; anything else
/// (empty, relative) names no socket.
pub fn notify_target(value: &str) -> Option<NotifyTarget> {
    if let Some(name) = value.strip_prefix('@') {
        return (!name.is_empty()).then(|| NotifyTarget::Abstract(name.as_bytes().to_vec()));
    }
    value
        .starts_with('/')
        .then(|| NotifyTarget::Path(PathBuf::from(value)))
}

/// The readiness message of process `pid`.
pub fn ready_message(pid: u32) -> String {
    format!("READY=1\nMAINPID={pid}\nSTATUS=serving\n")
}

/// The message that fleetd is stopping.
pub const STOPPING: &str = "STOPPING=1\nSTATUS=draining: closing worker panes\n";

/// The variable that names the service manager's socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Sends `message` to the service manager at `target`, if there is one.
pub fn notify(target: Option<&NotifyTarget>, message: &str) {
    let Some(target) = target else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|socket| match target {
        NotifyTarget::Path(path) => socket.send_to(message.as_bytes(), path),
        NotifyTarget::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message.as_bytes(), &addr)
        }
    });
    if let Err(e) = sent {
        tracing::warn!(target = ?target, error = %e, "cannot tell the service manager");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notify_socket_is_a_path_or_an_abstract_name() {
        assert_eq!(
            notify_target("/run/user/1000/systemd/notify"),
            Some(NotifyTarget::Path("/run/user/1000/systemd/notify".into()))
        );
        assert_eq!(
            notify_target("@/org/freedesktop/systemd1/notify/1"),
            Some(NotifyTarget::Abstract(
                b"/org/freedesktop/systemd1/notify/1".to_vec()
            ))
        );
        for none in ["", "@", "relative/path"] {
            assert_eq!(notify_target(none), None, "{none}");
        }
        assert!(ready_message(42).starts_with("READY=1\nMAINPID=42\n"));
    }
}
