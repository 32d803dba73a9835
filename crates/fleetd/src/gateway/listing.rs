//! Who is in the fleet, as a caller may see it: `fleet_list`, the hosts, and the roster an
//! operator looks at (this host's entities first, then the other hosts' as the federation
//! knows them).

use std::collections::HashMap;

use fleet_core::ownership::Principal;
use fleet_core::{ErrorCode, FleetError, Gid, WorkerStatus};

use super::views::{HostView, ListResult, RosterEntry};
use super::{Caller, LocalPlane};

/// What `fleet_list` keeps of the fleet: entities matching every filter given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    group: Option<String>,
    status: Option<String>,
    host: Option<String>,
}

/// The statuses an entry may have: a session's but `gone`, or `unknown` (its host cannot be
/// reached).
fn listed_statuses() -> impl Iterator<Item = &'static str> {
    WorkerStatus::ALL
        .into_iter()
        .filter(|s| *s != WorkerStatus::Gone)
        .map(WorkerStatus::as_str)
        .chain(["unknown"])
}

impl ListFilter {
    /// A filter of the given parts; a status no entry can have is refused, naming those it
    /// can (a typo would otherwise list nobody and look like an empty fleet).
    pub fn new(
        group: Option<String>,
        status: Option<String>,
        host: Option<String>,
    ) -> Result<Self, FleetError> {
        if let Some(status) = &status
            && !listed_statuses().any(|s| s == status)
        {
            return Err(FleetError::invalid(format!(
                "status '{}' is not one an entry has: one of {}",
                status.escape_debug(),
                listed_statuses().collect::<Vec<_>>().join(", ")
            )));
        }
        Ok(Self {
            group,
            status,
            host,
        })
    }

    /// Whether `entry` matches every filter given.
    pub fn admits(&self, entry: &RosterEntry) -> bool {
        self.group
            .as_ref()
            .is_none_or(|g| entry.groups.iter().any(|x| x == g))
            && self.status.as_ref().is_none_or(|s| entry.status == *s)
            && self.host.as_ref().is_none_or(|h| entry.host == *h)
    }
}

impl LocalPlane {
    /// The local side of [`Gateway::hosts`].
    pub(super) fn hosts(&self) -> Vec<HostView> {
        self.fleet_view().1
    }

    /// Every live entity (this host's first) and the hosts: the roster as an operator, who is
    /// in it, sees it.
    pub(super) fn everyone(&self, viewer: Principal<'_>) -> (Vec<RosterEntry>, Vec<HostView>) {
        let mut entities: Vec<RosterEntry> = self.sessions.lock().entries(viewer);
        let (remote, hosts) = self.fleet_view();
        entities.extend(remote);
        (entities, hosts)
    }

    /// The local side of [`Gateway::list`].
    pub(super) fn list(&self, caller: &Caller) -> Result<ListResult, FleetError> {
        let mut list =
            self.sessions.lock().list(&caller.entity).ok_or_else(|| {
                FleetError::new(ErrorCode::Gone, "you are no longer in the roster")
            })?;
        let (remote, hosts) = self.fleet_view();
        list.entities.extend(remote);
        list.hosts = hosts;
        list.coord_id = self.coord_id_of(caller);
        Ok(list)
    }

    /// The other hosts' entities, and the hosts of the fleet, this one first.
    pub(super) fn fleet_view(&self) -> (Vec<RosterEntry>, Vec<HostView>) {
        let mut hosts = vec![HostView {
            host: self.host_id.clone(),
            status: "up".into(),
            profiles: self
                .config
                .profiles
                .iter()
                .map(|p| p.name.clone())
                .collect(),
            families: crate::config::families(&self.config.profiles),
            last_seen_ms: None,
        }];
        let Some(afar) = self.afar.as_deref() else {
            return (Vec::new(), hosts);
        };
        // An entry names its owner as its host's heartbeat says (`name@host`): this host's
        // leads, or another's the roster knows.
        let leads: HashMap<Gid, String> = self
            .sessions
            .lock()
            .leads
            .values()
            .map(|l| {
                (
                    l.entity().gid,
                    format!("{}@{}", l.entity().name, l.entity().host),
                )
            })
            .collect();
        let (entries, remote_hosts) = afar.roster(&leads);
        hosts.extend(remote_hosts);
        (entries, hosts)
    }

    /// The name of `gid`, live or gone.
    pub(super) async fn name_of(&self, gid: Gid) -> String {
        let live = {
            let sessions = self.sessions.lock();
            sessions
                .leads
                .get(&gid)
                .map(|l| l.entity().name.clone())
                .or_else(|| sessions.panes.get(&gid).map(|s| s.entity().name.clone()))
        };
        let remote = || self.afar.as_deref().and_then(|afar| afar.name(gid));
        match live.or_else(remote) {
            Some(name) => name,
            None => match self.db.run(move |s| s.entity(gid)).await {
                Ok(Some(record)) => record.entity.name,
                _ => gid.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, status: &str, groups: &[&str]) -> RosterEntry {
        RosterEntry::example("w", host, status, groups)
    }

    #[test]
    fn a_filter_keeps_the_entries_matching_every_part_given() {
        let all = [
            entry("a", "idle", &["core"]),
            entry("a", "busy", &["core", "ui"]),
            entry("b", "idle", &[]),
        ];
        let kept = |f: ListFilter| all.iter().filter(|e| f.admits(e)).count();
        let f = |g: Option<&str>, s: Option<&str>, h: Option<&str>| {
            ListFilter::new(g.map(Into::into), s.map(Into::into), h.map(Into::into)).unwrap()
        };
        assert_eq!(kept(ListFilter::default()), 3);
        assert_eq!(kept(f(Some("core"), None, None)), 2);
        assert_eq!(kept(f(Some("ui"), None, None)), 1);
        assert_eq!(kept(f(None, Some("idle"), None)), 2);
        assert_eq!(kept(f(None, None, Some("b"))), 1);
        assert_eq!(kept(f(Some("core"), Some("idle"), Some("a"))), 1);
        assert_eq!(kept(f(Some("core"), None, Some("b"))), 0);
    }

    #[test]
    fn a_status_no_entry_has_is_refused_naming_those_it_can() {
        let err = ListFilter::new(None, Some("idel\n".into()), None).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams);
        assert!(err.message.contains("idle, busy"), "{}", err.message);
        assert!(!err.message.contains('\n'), "{}", err.message);
    }
}
