//! What a spawn decides before it opens a pane: where its worker works (the directory it names,
//! its profile's, a root's, fleetd's own; for another host's lead only under the roots), which
//! groups it joins, and its name (the one asked for if free, else the first `<profile>-<n>`).
//! The gateway gathers the facts, asks, resolves the directory on disk and acts.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;

use crate::entity::{MAX_NAME_LEN, validate_name, validate_worker_name};
use crate::{Entity, FleetError, Gid, WorkerStatus};

/// Where a spawn's worker is to work, before the directory is resolved and checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Workdir {
    /// The directory the spawn named.
    Given(PathBuf),
    /// The profile's `cwd`.
    Profiles(PathBuf),
    /// The first of `gateway.workdir_roots`: neither names one.
    FirstRoot(PathBuf),
    /// fleetd's own working directory: neither names one, and there are no roots.
    Fleetds,
    /// Nowhere: the spawn is for a lead of another host and this host has no roots, so its
    /// worker could be anywhere fleetd can reach.
    NoneForAnotherHost,
}

impl Workdir {
    /// Where the directory came from, for an error about one the caller did not give
    /// (`profile`: the profile's name); `None` for one it gave.
    pub fn source(&self, profile: &str) -> Option<String> {
        match self {
            Workdir::Given(_) => None,
            Workdir::Profiles(_) => Some(format!("profile '{profile}''s cwd")),
            Workdir::FirstRoot(_) => {
                Some("the first of gateway.workdir_roots, as no cwd was given".to_string())
            }
            Workdir::Fleetds => {
                Some("fleetd's own working directory, as no cwd was given".to_string())
            }
            Workdir::NoneForAnotherHost => None,
        }
    }
}

/// Where a spawn works: the directory it names, else its profile's, else the first of `roots`,
/// else fleetd's own; for a lead of `another_host`, only ever under `roots` (a host without
/// roots starts nothing for one).
pub fn where_to_work(
    given: Option<PathBuf>,
    profiles: Option<PathBuf>,
    roots: &[PathBuf],
    another_host: bool,
) -> Workdir {
    if another_host && roots.is_empty() {
        return Workdir::NoneForAnotherHost;
    }
    match (given, profiles, roots.first()) {
        (Some(dir), _, _) => Workdir::Given(dir),
        (None, Some(dir), _) => Workdir::Profiles(dir),
        (None, None, Some(root)) => Workdir::FirstRoot(root.clone()),
        (None, None, None) => Workdir::Fleetds,
    }
}

/// The groups a worker joins: its profile's and those the spawn names (each checked), in
/// order, once each.
pub fn groups_of(profiles: &[String], asked: Vec<String>) -> Result<Vec<String>, FleetError> {
    let mut groups: BTreeSet<String> = profiles.iter().cloned().collect();
    for group in asked {
        validate_name("group", &group)?;
        groups.insert(group);
    }
    Ok(groups.into_iter().collect())
}

/// The name of a new worker of `profile`: `asked` if it is a valid worker name no live entity
/// holds (the error names the holder, with its status from `status_of`), else the first free
/// `<profile>-<n>`.
pub fn name_for(
    asked: Option<String>,
    profile: &str,
    live: &[Entity],
    status_of: impl Fn(Gid) -> Option<WorkerStatus>,
) -> Result<String, FleetError> {
    let taken: HashSet<&str> = live.iter().map(|e| e.name.as_str()).collect();
    let Some(name) = asked else {
        return Ok(free_name(&taken, profile));
    };
    validate_worker_name(&name)?;
    let Some(holder) = live.iter().find(|e| e.name == name) else {
        return Ok(name);
    };
    let status = status_of(holder.gid)
        .map(|s| format!(", status {s}"))
        .unwrap_or_default();
    Err(FleetError::invalid(format!(
        "the name '{name}' is taken by {} {} (gid {}{status}): pick another, or stop that one first (fleet_list shows the names in use)",
        holder.role.as_str(),
        holder.name,
        holder.gid
    )))
}

/// The first `<profile>-<n>` not in `taken`, made a valid worker name (a profile's name may hold
/// a `.` or start with `_`, which a worker's may not).
fn free_name(taken: &HashSet<&str>, profile: &str) -> String {
    let base = profile.replace('.', "-");
    let base = match base.trim_start_matches(['_', '-']) {
        "" => "worker",
        // Room for the number: a name stays within the length names may have.
        trimmed => &trimmed[..trimmed.len().min(MAX_NAME_LEN - 12)],
    };
    (1..)
        .map(|n| format!("{base}-{n}"))
        .find(|candidate| !taken.contains(candidate.as_str()))
        .unwrap_or_else(|| format!("{base}-{}", Gid::mint()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorCode, Role};

    fn worker(name: &str) -> Entity {
        Entity {
            gid: Gid::mint(),
            name: name.into(),
            host: "a".into(),
            role: Role::Worker,
            profile: Some("sim".into()),
            sandbox: None,
            profile_role: None,
            groups: vec![],
            parent: None,
        }
    }

    #[test]
    fn generated_names_are_free_and_valid_worker_names() {
        let taken: HashSet<&str> = ["sim-1"].into();
        assert_eq!(free_name(&taken, "sim"), "sim-2");
        let long = "p".repeat(64);
        let cut = format!("{}-1", &long[..52]);
        for (profile, expected) in [
            ("a.b", "a-b-1"),
            ("_x", "x-1"),
            ("__", "worker-1"),
            (long.as_str(), cut.as_str()),
        ] {
            let name = free_name(&HashSet::new(), profile);
            assert_eq!(name, expected);
            assert!(validate_worker_name(&name).is_ok(), "{name}");
        }
    }

    #[test]
    fn a_name_asked_for_is_taken_if_free_and_refused_naming_its_holder_if_not() {
        let live = [worker("w1"), worker("sim-1")];
        assert_eq!(
            name_for(Some("w2".into()), "sim", &live, |_| None).unwrap(),
            "w2"
        );
        assert_eq!(name_for(None, "sim", &live, |_| None).unwrap(), "sim-2");
        let err = name_for(Some("w1".into()), "sim", &live, |gid| {
            (gid == live[0].gid).then_some(WorkerStatus::Busy)
        })
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams);
        assert!(
            err.message.contains("worker w1") && err.message.contains("status busy"),
            "{err:?}"
        );
        // A name a worker may not have is refused before it is looked up.
        let err = name_for(Some("w.1".into()), "sim", &[], |_| None).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams);
    }

    #[test]
    fn groups_are_the_profiles_and_the_asked_checked_and_once_each() {
        let profile = vec!["backend".to_string()];
        assert_eq!(
            groups_of(&profile, vec!["qa".into(), "backend".into()]).unwrap(),
            ["backend", "qa"]
        );
        assert!(groups_of(&profile, vec!["no spaces".into()]).is_err());
    }

    #[test]
    fn a_spawn_works_where_it_says_else_its_profile_else_the_first_root_and_another_hosts_only_under_roots()
     {
        let (given, profile, root) = (
            PathBuf::from("/w/given"),
            PathBuf::from("/w/profile"),
            PathBuf::from("/w"),
        );
        let roots = [root.clone()];
        for another_host in [false, true] {
            assert_eq!(
                where_to_work(
                    Some(given.clone()),
                    Some(profile.clone()),
                    &roots,
                    another_host
                ),
                Workdir::Given(given.clone())
            );
            assert_eq!(
                where_to_work(None, Some(profile.clone()), &roots, another_host),
                Workdir::Profiles(profile.clone())
            );
            assert_eq!(
                where_to_work(None, None, &roots, another_host),
                Workdir::FirstRoot(root.clone())
            );
        }
        assert_eq!(where_to_work(None, None, &[], false), Workdir::Fleetds);
        // Without roots, nothing for another host's lead, not even in its profile's directory.
        for given in [Some(given.clone()), None] {
            assert_eq!(
                where_to_work(given, Some(profile.clone()), &[], true),
                Workdir::NoneForAnotherHost
            );
        }
        // An error about a directory the caller did not give says where it came from.
        assert_eq!(Workdir::Given(PathBuf::from("/x")).source("sim"), None);
        assert!(
            Workdir::Profiles(PathBuf::from("/x"))
                .source("sim")
                .is_some_and(|s| s.contains("profile 'sim'"))
        );
    }
}
