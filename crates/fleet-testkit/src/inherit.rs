//! Handing an open descriptor to a child process — a listening socket for `fleetd serve
//! --listen-fd N`, so a test binds `127.0.0.1:0` itself and no other process can take the port
//! between the test's pick and fleetd's bind.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::io::{FdFlags, fcntl_getfd, fcntl_setfd};

/// Lets the child that `command` starts inherit `fd`, under the number returned (for its
/// command line). The command keeps a duplicate of `fd` open until it is dropped; only the child
/// sees the duplicate without close-on-exec, so no other child of the test inherits it.
pub fn inherit(command: &mut Command, fd: impl AsFd) -> std::io::Result<RawFd> {
    let kept = fd.as_fd().try_clone_to_owned()?;
    let number = kept.as_raw_fd();
    // SAFETY: the hook runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: it makes two fcntl system calls (rustix calls the kernel directly; no
    // allocation, no lock) on a descriptor the hook itself owns, so it is open in the child.
    unsafe {
        command.pre_exec(move || {
            let flags = fcntl_getfd(&kept)?;
            fcntl_setfd(&kept, flags - FdFlags::CLOEXEC)?;
            Ok(())
        });
    }
    Ok(number)
}
