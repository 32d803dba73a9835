//! Which program a pid is, read from `/proc`: its start time and the boot it started on, so a
//! pid reused by another program is not mistaken for the one fleetd started
//! ([`fleet_core::adoption`]).

use std::io;

use fleet_core::adoption::{ProgramId, start_ticks};

/// The program running as `pid` now.
pub fn program(pid: u32) -> io::Result<ProgramId> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let started = start_ticks(&stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat has no start time"),
        )
    })?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    Ok(ProgramId {
        pid,
        started,
        boot: boot.trim().to_string(),
    })
}

/// Whether the program running as `pid` was started with `key` set to `value` (its
/// environment as it started, `/proc/PID/environ`); false when it cannot be read.
pub fn started_with(pid: u32, key: &str, value: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|environ| fleet_core::adoption::environ_sets(&environ, key, value))
}

/// The working directory of the program running as `pid`.
pub fn cwd(pid: u32) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_itself_and_a_vanished_pid_is_no_program() {
        let me = program(std::process::id()).unwrap();
        assert_eq!(me, program(std::process::id()).unwrap());
        assert!(me.started > 0 && !me.boot.is_empty());
        // Above the kernel's pid_max (4194304 at most): no such process.
        assert!(program(u32::MAX).is_err());
    }

    #[test]
    fn a_program_is_known_by_what_it_was_started_with() {
        use std::io::BufRead;
        // The child says it runs once it does (until then, between fork and exec, its
        // environment would read as this process's), then waits on its input, execing nothing
        // more (an exec under way reads as no environment).
        let mut child = std::process::Command::new("sh")
            .args(["-c", "echo running; read line"])
            .env("FLEET_GID", "g-1")
            .current_dir("/")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = String::new();
        let out = child.stdout.take().unwrap();
        std::io::BufReader::new(out).read_line(&mut said).unwrap();
        assert_eq!(said, "running\n");
        assert!(started_with(child.id(), "FLEET_GID", "g-1"));
        assert!(!started_with(child.id(), "FLEET_GID", "g-2"));
        assert_eq!(cwd(child.id()).unwrap(), std::path::PathBuf::from("/"));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!started_with(child.id(), "FLEET_GID", "g-1"));
    }
}
