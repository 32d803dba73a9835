//! What the operator surfaces (`/api/v1`, `fleetd ls`) read off the gateway: the roster with
//! what waits for each of this host's entities.

use std::collections::HashMap;

use fleet_core::{FleetError, Gid};
use serde::Serialize;

use super::views::{HostView, RosterEntry};
use super::{Caller, Gateway};

/// One entity of the roster, with what waits for it here.
#[derive(Clone, Debug, Serialize)]
pub struct RosterRow {
    /// The entity as `fleet_list` shows it.
    #[serde(flatten)]
    pub entry: RosterEntry,
    /// Messages held for its pull; none for another host's (that host holds them).
    pub held: Option<usize>,
    /// Messages queued to be typed in (or pulled); none for another host's.
    pub queued: Option<usize>,
}

/// `GET /api/v1/roster`.
#[derive(Clone, Debug, Serialize)]
pub struct RosterView {
    /// The caller.
    pub you: RosterEntry,
    /// Every live entity, this host's first.
    pub entities: Vec<RosterRow>,
    /// The hosts of the fleet, this one first.
    pub hosts: Vec<HostView>,
}

impl Gateway {
    /// The roster as `caller` may see it (the rules of `fleet_list`), with what waits for each
    /// of this host's entities.
    pub async fn roster(&self, caller: &Caller) -> Result<RosterView, FleetError> {
        let list = self.list(caller)?;
        let mut waiting: HashMap<Gid, (usize, usize)> = HashMap::new();
        for (gid, state, count) in self.db(|s| s.waiting_by_recipient()).await? {
            let slot = waiting.entry(gid).or_default();
            match state.as_str() {
                "held" => slot.0 += count,
                _ => slot.1 += count,
            }
        }
        let entities = list
            .entities
            .into_iter()
            .map(|entry| {
                let here = entry.host == self.host_id;
                let (held, queued) = waiting.get(&entry.gid).copied().unwrap_or_default();
                RosterRow {
                    held: here.then_some(held),
                    queued: here.then_some(queued),
                    entry,
                }
            })
            .collect();
        Ok(RosterView {
            you: list.you,
            entities,
            hosts: list.hosts,
        })
    }
}
