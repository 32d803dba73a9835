//! What a bubblewrap (`bwrap`) command line lets the sandbox see, so a spawn whose agent the
//! sandbox would not find fails before it starts, naming the path and the mount that hides it,
//! instead of ending with bwrap's `execvp … No such file or directory` on the worker's screen.
//! Pure: reads an argv, looks at no file system.

use std::path::{Path, PathBuf};

/// bwrap's options that take two arguments, a source and a destination, and mount the source
/// there.
const BINDS: [&str; 6] = [
    "--bind",
    "--bind-try",
    "--ro-bind",
    "--ro-bind-try",
    "--dev-bind",
    "--dev-bind-try",
];
/// bwrap's options that mount something fresh and empty (of the host's files) at their one
/// argument.
const FRESH: [&str; 5] = ["--tmpfs", "--dev", "--proc", "--mqueue", "--dir"];
/// bwrap's other options that take two arguments.
const OTHER_TWO: [&str; 6] = [
    "--setenv",
    "--symlink",
    "--file",
    "--bind-data",
    "--ro-bind-data",
    "--chmod",
];
/// bwrap's other options that take one argument.
const OTHER_ONE: [&str; 22] = [
    "--args",
    "--argv0",
    "--unsetenv",
    "--lock-file",
    "--sync-fd",
    "--chdir",
    "--uid",
    "--gid",
    "--hostname",
    "--exec-label",
    "--file-label",
    "--seccomp",
    "--add-seccomp-fd",
    "--block-fd",
    "--userns-block-fd",
    "--info-fd",
    "--json-status-fd",
    "--cap-add",
    "--cap-drop",
    "--perms",
    "--size",
    "--remount-ro",
];

/// One mount of a bwrap command line.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mount {
    /// The host's `source` shown at the destination.
    Bind { source: PathBuf },
    /// Something of bwrap's own at the destination (a tmpfs, `/dev`, `/proc`, an empty dir),
    /// showing none of the host's files.
    Fresh { option: String },
}

/// How a host path looks from inside the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sight {
    /// The sandbox sees it at the same path: the last mount covering it binds it in place.
    Seen,
    /// The sandbox sees something else there, or nothing: the last mount covering it is
    /// `option` at `at` (for a bind, the host path shown instead).
    Hidden {
        /// The bwrap option.
        option: String,
        /// Where it mounts.
        at: PathBuf,
    },
    /// No mount covers it: bwrap starts from an empty root.
    Unmounted,
}

/// Whether `argv` runs bwrap (by its program's file name).
pub fn is_bwrap(argv: &[String]) -> bool {
    argv.first()
        .and_then(|program| Path::new(program).file_name())
        .is_some_and(|name| name == "bwrap")
}

/// The mounts of bwrap's `argv` (its program first), in order, up to the end of its options.
fn mounts(argv: &[String]) -> Vec<(PathBuf, Mount)> {
    let mut mounts = Vec::new();
    let mut words = argv.iter().skip(1);
    while let Some(word) = words.next() {
        let word = word.as_str();
        if BINDS.contains(&word) {
            if let (Some(source), Some(dest)) = (words.next(), words.next()) {
                mounts.push((
                    PathBuf::from(dest),
                    Mount::Bind {
                        source: PathBuf::from(source),
                    },
                ));
            }
        } else if FRESH.contains(&word) {
            if let Some(dest) = words.next() {
                mounts.push((
                    PathBuf::from(dest),
                    Mount::Fresh {
                        option: word.to_string(),
                    },
                ));
            }
        } else if OTHER_TWO.contains(&word) {
            words.next();
            words.next();
        } else if OTHER_ONE.contains(&word) {
            words.next();
        } else if word == "--" || !word.starts_with("--") {
            break;
        }
    }
    mounts
}

/// How the absolute host path `path` looks from inside the sandbox bwrap's `argv` makes: the
/// last mount whose destination holds `path` decides.
pub fn sight(argv: &[String], path: &Path) -> Sight {
    let deciding = mounts(argv)
        .into_iter()
        .rev()
        .find(|(dest, _)| path.starts_with(dest));
    match deciding {
        None => Sight::Unmounted,
        Some((dest, Mount::Bind { source })) => {
            let shown = path
                .strip_prefix(&dest)
                .map(|rest| source.join(rest))
                .unwrap_or_default();
            if shown == path {
                Sight::Seen
            } else {
                Sight::Hidden {
                    option: format!("a bind of {}", source.display()),
                    at: dest,
                }
            }
        }
        Some((dest, Mount::Fresh { option })) => Sight::Hidden { option, at: dest },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &str) -> Vec<String> {
        words.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_last_mount_over_a_path_decides() {
        let recipe = argv(
            "bwrap --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --tmpfs /home/me \
             --bind /tmp/work /tmp/work --chdir /tmp/work --setenv FLEET_SANDBOX w1 -- agent",
        );
        assert_eq!(sight(&recipe, Path::new("/usr/bin/agent")), Sight::Seen);
        assert_eq!(sight(&recipe, Path::new("/tmp/work/src")), Sight::Seen);
        assert_eq!(
            sight(&recipe, Path::new("/tmp/clone/target/agent")),
            Sight::Hidden {
                option: "--tmpfs".into(),
                at: "/tmp".into()
            }
        );
        assert_eq!(
            sight(&recipe, Path::new("/home/me/.claude.json")),
            Sight::Hidden {
                option: "--tmpfs".into(),
                at: "/home/me".into()
            }
        );
        // A bind of the agent itself after the tmpfs shows it again.
        let mut bound = recipe.clone();
        bound.splice(
            1..1,
            argv("--tmpfs /tmp --ro-bind /tmp/clone/agent /tmp/clone/agent"),
        );
        assert_eq!(
            sight(&bound, Path::new("/tmp/clone/agent")),
            Sight::Hidden {
                option: "--tmpfs".into(),
                at: "/tmp".into()
            },
            "the recipe's own later --tmpfs /tmp covers the earlier bind"
        );
        let mut after = recipe;
        let end = after.iter().position(|w| w == "--").unwrap();
        after.splice(
            end..end,
            argv("--ro-bind /tmp/clone/agent /tmp/clone/agent"),
        );
        assert_eq!(sight(&after, Path::new("/tmp/clone/agent")), Sight::Seen);
    }

    #[test]
    fn binds_elsewhere_options_with_arguments_and_the_command_are_told_apart() {
        // Without a root bind nothing is there; a bind of another path shows other files;
        // option arguments and the agent's own argv are never read as mounts.
        let recipe = argv(
            "bwrap --ro-bind /opt/image /usr --setenv --tmpfs x --chdir --tmpfs -- agent --tmpfs /",
        );
        assert_eq!(sight(&recipe, Path::new("/etc/passwd")), Sight::Unmounted);
        assert_eq!(
            sight(&recipe, Path::new("/usr/bin/agent")),
            Sight::Hidden {
                option: "a bind of /opt/image".into(),
                at: "/usr".into()
            }
        );
        assert!(is_bwrap(&argv("/usr/bin/bwrap --ro-bind / /")));
        assert!(!is_bwrap(&argv("docker run")));
        assert!(!is_bwrap(&[]));
    }
}
