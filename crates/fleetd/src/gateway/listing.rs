//! Who is in the fleet, as a caller may see it: `fleet_list`, the hosts, and the roster an
//! operator looks at (this host's entities first, then the other hosts' as the federation
//! knows them).

use std::collections::HashMap;

use fleet_core::ownership::Principal;
use fleet_core::{ErrorCode, FleetError, Gid};

use super::views::{HostView, ListResult, RosterEntry};
use super::{Caller, LocalPlane};

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
