//! Where `serve` listens: an address it binds (`gateway.listen`), or a socket already bound and
//! listening that it is given — inherited from the process that started fleetd
//! (`--listen-fd N`: a test harness that holds the port, a systemd socket unit), or handed over
//! in-process.
//!
//! An inherited descriptor is hostile input like any other: its number is checked to be an open
//! TCP socket that listens before fleetd takes it, and nothing is taken (or closed) when it is
//! not. Once taken it is made close-on-exec, so tmux and the agents fleetd starts never hold
//! the gateway's socket.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

use rustix::io::{Errno, FdFlags, fcntl_getfd, fcntl_setfd};
use rustix::net::sockopt::{socket_acceptconn, socket_domain, socket_protocol, socket_type};
use rustix::net::{AddressFamily, SocketType, ipproto};

/// Where the gateway listens.
#[derive(Debug)]
pub enum Listen {
    /// Bind this address (`gateway.listen`).
    Bind(SocketAddr),
    /// Serve on this socket, already bound and listening.
    Bound(TcpListener),
}

/// Why an inherited descriptor cannot be the gateway's socket; each names the descriptor.
#[derive(Debug, thiserror::Error)]
pub enum ListenFdError {
    /// The number is past any descriptor's.
    #[error("--listen-fd {0} is not a file descriptor number")]
    OutOfRange(u32),
    /// Nothing is open under that number.
    #[error("--listen-fd {0}: descriptor {0} is not open (was it passed to fleetd?)")]
    NotOpen(RawFd),
    /// It is open, but not a socket (a file, a pipe, a terminal).
    #[error("--listen-fd {0}: descriptor {0} is not a socket")]
    NotSocket(RawFd),
    /// A socket, but not a TCP one.
    #[error("--listen-fd {fd}: descriptor {fd} is not a TCP socket (it is {what})")]
    NotTcp {
        /// The descriptor.
        fd: RawFd,
        /// What it is instead.
        what: &'static str,
    },
    /// A TCP socket that does not listen (a connection, or one never given `listen()`).
    #[error(
        "--listen-fd {0}: descriptor {0} is a TCP socket that is not listening (bind it and call listen() before passing it)"
    )]
    NotListening(RawFd),
    /// A system call on it failed.
    #[error("--listen-fd {fd}: cannot {what}: {source}")]
    Io {
        /// The descriptor.
        fd: RawFd,
        /// What was tried.
        what: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
}

impl Listen {
    /// The listener on inherited descriptor `fd`, checked to be an open TCP socket that
    /// listens, and made close-on-exec. Call it before anything else opens a descriptor (it
    /// must be the one fleetd was given, not one of fleetd's own under the same number), and
    /// once: the listener owns the descriptor and closes it.
    pub fn inherited(fd: u32) -> Result<Self, ListenFdError> {
        let raw = RawFd::try_from(fd).map_err(|_| ListenFdError::OutOfRange(fd))?;
        // SAFETY: borrowed only for the checks below, and no other code of this process closes
        // descriptors it does not own. A number that is not open gets EBADF from the kernel, and
        // the checks read, never change, what is under it.
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        check_listening(raw, borrowed)?;
        let flags = fcntl_getfd(borrowed).map_err(io(raw, "read its descriptor flags"))?;
        fcntl_setfd(borrowed, flags | FdFlags::CLOEXEC)
            .map_err(io(raw, "make it close-on-exec"))?;
        // SAFETY: the descriptor is open, a listening TCP socket, and was passed to this process
        // to serve on: nothing else in it owns the number, so the listener may own (and close) it.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self::Bound(TcpListener::from(owned)))
    }
}

/// Checks that `fd` is an open TCP socket (IPv4 or IPv6) that listens.
fn check_listening(raw: RawFd, fd: BorrowedFd<'_>) -> Result<(), ListenFdError> {
    match socket_type(fd) {
        Ok(SocketType::STREAM) => {}
        Ok(_) => {
            return Err(ListenFdError::NotTcp {
                fd: raw,
                what: "not a stream socket",
            });
        }
        Err(Errno::BADF) => return Err(ListenFdError::NotOpen(raw)),
        Err(Errno::NOTSOCK) => return Err(ListenFdError::NotSocket(raw)),
        Err(e) => return Err(io(raw, "read its socket type")(e)),
    }
    let domain = socket_domain(fd).map_err(io(raw, "read its address family"))?;
    if domain != AddressFamily::INET && domain != AddressFamily::INET6 {
        let what = if domain == AddressFamily::UNIX {
            "a Unix socket"
        } else {
            "neither IPv4 nor IPv6"
        };
        return Err(ListenFdError::NotTcp { fd: raw, what });
    }
    if socket_protocol(fd).map_err(io(raw, "read its protocol"))? != Some(ipproto::TCP) {
        return Err(ListenFdError::NotTcp {
            fd: raw,
            what: "a stream socket of another protocol",
        });
    }
    if !socket_acceptconn(fd).map_err(io(raw, "ask whether it listens"))? {
        return Err(ListenFdError::NotListening(raw));
    }
    Ok(())
}

/// Maps a failed system call on `fd` (trying `what`) to an error naming both.
fn io(fd: RawFd, what: &'static str) -> impl Fn(Errno) -> ListenFdError {
    move |e| ListenFdError::Io {
        fd,
        what,
        source: e.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpStream, UdpSocket};
    use std::os::fd::{AsFd, AsRawFd, IntoRawFd};
    use std::os::unix::net::UnixListener;

    use super::*;

    /// `fd` as a child sees an inherited one: not close-on-exec.
    fn as_inherited(fd: impl IntoRawFd) -> RawFd {
        let raw = fd.into_raw_fd();
        // SAFETY: `raw` was just released by its owner; the test holds it until `inherited`
        // takes it or the test ends.
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        fcntl_setfd(borrowed, FdFlags::empty()).unwrap();
        raw
    }

    fn number(raw: RawFd) -> u32 {
        u32::try_from(raw).unwrap()
    }

    #[test]
    fn a_listening_tcp_socket_is_taken_and_closed_on_exec() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let raw = as_inherited(listener);
        let Listen::Bound(taken) = Listen::inherited(number(raw)).unwrap() else {
            panic!("not a bound listener");
        };
        assert_eq!(taken.as_raw_fd(), raw);
        assert_eq!(taken.local_addr().unwrap(), addr);
        assert!(
            fcntl_getfd(taken.as_fd())
                .unwrap()
                .contains(FdFlags::CLOEXEC)
        );
        // It serves: a connection to its address is accepted.
        let _client = TcpStream::connect(addr).unwrap();
        taken.accept().unwrap();
    }

    #[test]
    fn what_is_not_a_listening_tcp_socket_is_refused_and_left_open() {
        let file = tempfile::tempfile().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let connection = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let unix = UnixListener::bind(dir.path().join("s")).unwrap();
        let cases: [(BorrowedFd<'_>, &str); 4] = [
            (file.as_fd(), "is not a socket"),
            (connection.as_fd(), "is a TCP socket that is not listening"),
            (
                udp.as_fd(),
                "is not a TCP socket (it is not a stream socket)",
            ),
            (unix.as_fd(), "is not a TCP socket (it is a Unix socket)"),
        ];
        for (fd, needle) in cases {
            let raw = fd.as_raw_fd();
            let err = Listen::inherited(number(raw)).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("--listen-fd {raw}: descriptor {raw} "))
                    && err.contains(needle),
                "{needle}: {err}"
            );
            // Still open, still its owner's.
            fcntl_getfd(fd).unwrap();
        }
    }

    #[test]
    fn a_number_that_is_not_open_or_no_descriptor_is_refused() {
        // Past any descriptor limit (the hard limit stays far below i32::MAX).
        let err = Listen::inherited(i32::MAX as u32).unwrap_err().to_string();
        assert!(err.contains("is not open"), "{err}");
        let err = Listen::inherited(u32::MAX).unwrap_err().to_string();
        assert_eq!(
            err,
            "--listen-fd 4294967295 is not a file descriptor number"
        );
    }
}
