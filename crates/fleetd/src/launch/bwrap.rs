//! What a bubblewrap (`bwrap`) command line lets the sandbox see, so a spawn whose agent the
//! sandbox would not find fails before it starts, naming the path and the mount that hides it,
//! instead of ending with bwrap's `execvp … No such file or directory` on the worker's screen.
//! Pure: reads an argv, looks at no file system.

use std::path::{Component, Path, PathBuf};

/// bwrap's options that take two arguments, a host path and a destination, and show the host
/// path there.
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
const FRESH: [&str; 4] = ["--tmpfs", "--dev", "--proc", "--mqueue"];
/// bwrap's options that put something other than a host path at their second argument (an
/// open file descriptor's file or directory, a copy of one, a symlink).
const OPAQUE: [&str; 6] = [
    "--bind-fd",
    "--ro-bind-fd",
    "--file",
    "--bind-data",
    "--ro-bind-data",
    "--symlink",
];
/// bwrap's other options that take two arguments.
const OTHER_TWO: [&str; 2] = ["--setenv", "--chmod"];
/// bwrap's other options that take one argument (`--dir` makes a directory where none is,
/// hiding nothing).
const OTHER_ONE: [&str; 24] = [
    "--dir",
    "--userns",
    "--userns2",
    "--pidns",
    "--uid",
    "--gid",
    "--hostname",
    "--chdir",
    "--unsetenv",
    "--lock-file",
    "--sync-fd",
    "--remount-ro",
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
];
/// bwrap's options that take no argument.
const FLAGS: [&str; 18] = [
    "--help",
    "--version",
    "--unshare-all",
    "--share-net",
    "--unshare-user",
    "--unshare-user-try",
    "--unshare-ipc",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-uts",
    "--unshare-cgroup",
    "--unshare-cgroup-try",
    "--disable-userns",
    "--assert-userns-disabled",
    "--clearenv",
    "--new-session",
    "--die-with-parent",
    "--as-pid-1",
];

/// One mount of a bwrap command line.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mount {
    /// The host's `source` shown at the destination.
    Bind { source: PathBuf },
    /// Something of bwrap's own at the destination (a tmpfs, `/dev`, `/proc`), showing none of
    /// the host's files.
    Fresh { option: String },
    /// Something whose content this reading cannot know (a file descriptor's, a symlink).
    Opaque,
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
    /// This reading cannot tell (an option it does not know, arguments from a file descriptor,
    /// a mount of a descriptor's content): never a reason to refuse.
    Unknown,
}

/// Whether `argv` runs bwrap (by its program's file name).
pub fn is_bwrap(argv: &[String]) -> bool {
    argv.first()
        .and_then(|program| Path::new(program).file_name())
        .is_some_and(|name| name == "bwrap")
}

/// `path` with `.` and `..` resolved by its words alone (bwrap takes paths as written; the
/// host's links are another matter).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The mounts of bwrap's `argv` (its program first), in order, up to the end of its options;
/// `None` when the reading cannot tell what the options do.
fn mounts(argv: &[String]) -> Option<Vec<(PathBuf, Mount)>> {
    let mut mounts = Vec::new();
    let mut words = argv.iter().skip(1).map(String::as_str);
    while let Some(word) = words.next() {
        if BINDS.contains(&word) {
            let (source, dest) = (words.next()?, words.next()?);
            mounts.push((
                lexical(Path::new(dest)),
                Mount::Bind {
                    source: lexical(Path::new(source)),
                },
            ));
        } else if FRESH.contains(&word) {
            let option = word.to_string();
            mounts.push((lexical(Path::new(words.next()?)), Mount::Fresh { option }));
        } else if OPAQUE.contains(&word) {
            words.next()?;
            mounts.push((lexical(Path::new(words.next()?)), Mount::Opaque));
        } else if word == "--args" {
            // The rest of the options come from a file descriptor.
            return None;
        } else if OTHER_TWO.contains(&word) {
            words.next()?;
            words.next()?;
        } else if OTHER_ONE.contains(&word) {
            words.next()?;
        } else if word == "--" || !word.starts_with('-') {
            return Some(mounts);
        } else if !FLAGS.contains(&word) {
            // An option this reading does not know: how many arguments it takes, and what it
            // does, cannot be told.
            return None;
        }
    }
    Some(mounts)
}

/// How the absolute host path `path` looks from inside the sandbox bwrap's `argv` makes: the
/// last mount whose destination holds `path` decides.
pub fn sight(argv: &[String], path: &Path) -> Sight {
    let Some(mounts) = mounts(argv) else {
        return Sight::Unknown;
    };
    let path = lexical(path);
    let deciding = mounts
        .into_iter()
        .rev()
        .find(|(dest, _)| path.starts_with(dest));
    match deciding {
        None => Sight::Unmounted,
        Some((_, Mount::Opaque)) => Sight::Unknown,
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

    #[test]
    fn every_option_of_bwrap_0_8_is_read_with_its_arguments() {
        // Descriptor and namespace options take an argument that is not the command; --dir
        // makes a directory and hides nothing.
        let recipe = argv(
            "bwrap --userns 3 --pidns 4 --userns2 5 --uid 0 --perms 0700 --size 1024 --dir /opt/tools \
             --ro-bind / / --chmod 0755 /opt --unsetenv SSH_AUTH_SOCK --clearenv --as-pid-1 -- agent",
        );
        assert_eq!(sight(&recipe, Path::new("/opt/tools/agent")), Sight::Seen);
        // A descriptor's content, arguments read from a descriptor, an option this reading
        // does not know: it cannot tell, and so never refuses.
        for unknowable in [
            "bwrap --ro-bind / / --ro-bind-fd 7 /opt -- agent",
            "bwrap --args 3 -- agent",
            "bwrap --ro-bind / / --some-future-option 9 --tmpfs /opt -- agent",
        ] {
            assert_eq!(
                sight(&argv(unknowable), Path::new("/opt/agent")),
                Sight::Unknown,
                "{unknowable}"
            );
        }
    }

    #[test]
    fn dot_dot_is_resolved_by_the_words() {
        let hides = argv("bwrap --ro-bind / / --tmpfs /home/me/../me -- agent");
        assert_eq!(
            sight(&hides, Path::new("/home/me/bin/agent")),
            Sight::Hidden {
                option: "--tmpfs".into(),
                at: "/home/me".into()
            }
        );
        let shows =
            argv("bwrap --ro-bind / / --tmpfs /tmp --ro-bind /tmp/a/../a/agent /tmp/a/agent --");
        assert_eq!(sight(&shows, Path::new("/tmp/a/./agent")), Sight::Seen);
    }
}
