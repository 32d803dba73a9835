//! The live half of the roster: leads and pane sessions as this process knows them, with what
//! each is doing now (status, the task in flight, open calls). Pure bookkeeping under one lock;
//! no I/O happens here.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use fleet_core::clock::now_ms;
use fleet_core::delivery::{Recipient, Taker, announced, may_take_task};
use fleet_core::ownership::{Action, LeadRef, Principal};
use fleet_core::{Entity, Gid, WorkerStatus};

use super::NudgeTarget;
use super::asks::Asks;
use super::feed::StatusTold;
use super::lead::LeadState;
use super::session::PaneSession;
use super::views::{ListResult, RosterEntry, Surfaced, slot_of};

/// The sessions, shared by the gateway's calls and loops behind one std mutex, which is never
/// held across an await.
#[derive(Default)]
pub(super) struct Shared(Mutex<Sessions>);

impl Shared {
    /// The sessions, for one look or change.
    pub(super) fn lock(&self) -> MutexGuard<'_, Sessions> {
        // Sessions hold no invariant that a panic half-way could break beyond repair.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What a caller's call changed, for the gateway to act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CalledIn {
    /// Nothing to act on.
    Nothing,
    /// A spawning session became ready: its status is to be stored.
    BecameReady,
    /// A lead named a pane it had not named before: its nudger looks again (messages may
    /// wait for it already, held before fleetd knew where to nudge it).
    PaneNamed,
}

/// Leads and pane sessions.
#[derive(Default)]
pub(super) struct Sessions {
    /// Leads by gid.
    pub leads: HashMap<Gid, LeadState>,
    /// Live pane sessions by gid.
    pub panes: HashMap<Gid, PaneSession>,
    /// Why the pane host cannot be reached, while it cannot: workers read `unknown` and sends
    /// to them fail at once.
    pub host_down: Option<String>,
    /// Workers' questions waiting for their leads' answers.
    pub asks: Asks,
    /// The architect slots a consult is using now (one consult of a slot at a time).
    pub consulting: HashSet<String>,
    /// The gids of leads and sessions by name (gone sessions too, until they are pruned): a
    /// recipient's name is looked up, never searched for.
    names: HashMap<String, Vec<Gid>>,
    /// Where sessions tell their statuses live.
    pub told: StatusTold,
}

impl Sessions {
    pub fn add_lead(&mut self, entity: Entity) {
        self.index(&entity);
        self.leads.insert(entity.gid, LeadState::new(entity));
    }

    /// Adds the session of a pane-bound entity: each status it reaches from now on is told
    /// live.
    pub fn add_session(&mut self, mut session: PaneSession) {
        session.tell_to(self.told.sender());
        self.index(session.entity());
        self.panes.insert(session.entity().gid, session);
    }

    fn index(&mut self, entity: &Entity) {
        let gids = self.names.entry(entity.name.clone()).or_default();
        if !gids.contains(&entity.gid) {
            gids.push(entity.gid);
        }
    }

    /// The live entity `gid` of this host.
    pub fn live(&self, gid: Gid) -> Option<Entity> {
        match self.leads.get(&gid) {
            Some(lead) => Some(lead.entity().clone()),
            None => self
                .panes
                .get(&gid)
                .filter(|s| s.status().is_live())
                .map(|s| s.entity().clone()),
        }
    }

    /// The live entities of this host called `name` (one, but while a stopped one ends).
    pub fn live_named(&self, name: &str) -> Vec<Entity> {
        self.names
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|gid| self.live(*gid))
            .collect()
    }

    /// The names of this host's live entities.
    /// The name of the pane session `gid`, for its log lines (empty when there is none).
    pub fn pane_name(&self, gid: Gid) -> String {
        self.panes
            .get(&gid)
            .map(|s| s.entity().name.clone())
            .unwrap_or_default()
    }

    pub fn live_names(&self) -> Vec<String> {
        self.names
            .iter()
            .filter(|(_, gids)| gids.iter().any(|gid| self.live(*gid).is_some()))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Notes a call from `gid`. Returns the entity, and what the call changed: a spawning
    /// session made ready, or a lead's pane named anew; `None` if `gid` is not live here.
    pub fn called_in(
        &mut self,
        gid: Gid,
        nudge: Option<NudgeTarget>,
        acting: bool,
    ) -> Option<(Arc<Entity>, CalledIn)> {
        if let Some(lead) = self.leads.get_mut(&gid) {
            let news = lead.called_in(nudge, now_ms());
            let changed = if news {
                CalledIn::PaneNamed
            } else {
                CalledIn::Nothing
            };
            return Some((lead.entity_shared(), changed));
        }
        let session = self.panes.get_mut(&gid)?;
        let changed = if session.called_in(acting, now_ms())? {
            CalledIn::BecameReady
        } else {
            CalledIn::Nothing
        };
        Some((session.entity_shared(), changed))
    }

    /// Notes that `gid` listed fleetd's tools; returns whether that made it ready.
    pub fn listed_tools(&mut self, gid: Gid) -> bool {
        self.panes
            .get_mut(&gid)
            .is_some_and(PaneSession::listed_tools)
    }

    /// Who `gid` is to this gateway, for a message's placement.
    pub fn recipient(&self, gid: Gid) -> Recipient {
        if self.leads.contains_key(&gid) {
            return Recipient::Lead;
        }
        match self.panes.get(&gid) {
            Some(s) => Recipient::Pane {
                live: s.status().is_live(),
            },
            None => Recipient::Elsewhere,
        }
    }

    /// Whether `taker` may hand `gid` its next task now (`false` for no session here).
    pub fn may_take_task(&self, gid: Gid, taker: Taker) -> bool {
        self.panes
            .get(&gid)
            .is_some_and(|s| may_take_task(&s.gate(self.host_down.is_some()), taker))
    }

    /// Whether `gid` is (or was, in this run) an entity of this gateway.
    pub fn is_local(&self, gid: Gid) -> bool {
        self.leads.contains_key(&gid) || self.panes.contains_key(&gid)
    }

    /// Every live entity, leads first, then sessions oldest first.
    pub fn entities(&self) -> Vec<Entity> {
        self.live_gids()
            .into_iter()
            .filter_map(|gid| {
                self.leads
                    .get(&gid)
                    .map(|l| l.entity().clone())
                    .or_else(|| self.panes.get(&gid).map(|s| s.entity().clone()))
            })
            .collect()
    }

    /// The gids of [`Sessions::entities`], in its order, with nothing cloned.
    fn live_gids(&self) -> Vec<Gid> {
        let mut leads: Vec<Gid> = self.leads.keys().copied().collect();
        leads.sort_unstable();
        let mut panes: Vec<Gid> = self
            .panes
            .iter()
            .filter(|(_, s)| s.status().is_live())
            .map(|(gid, _)| *gid)
            .collect();
        panes.sort_unstable();
        leads.extend(panes);
        leads
    }

    /// Forgets the oldest ended sessions beyond `keep`.
    pub fn prune_gone(&mut self, keep: usize) {
        let mut gone: Vec<Gid> = self
            .panes
            .iter()
            .filter(|(_, s)| s.status() == WorkerStatus::Gone)
            .map(|(gid, _)| *gid)
            .collect();
        if gone.len() > keep {
            gone.sort_unstable();
            for gid in &gone[..gone.len() - keep] {
                if let Some(session) = self.panes.remove(gid) {
                    let name = &session.entity().name;
                    if let Some(gids) = self.names.get_mut(name) {
                        gids.retain(|g| g != gid);
                        if gids.is_empty() {
                            self.names.remove(name);
                        }
                    }
                }
            }
        }
    }

    /// The roster entry of `gid` as `viewer` may see it: a blocked worker's dialog (screen
    /// text) only for its owner.
    pub fn entry(&self, gid: Gid, viewer: Principal<'_>) -> Option<RosterEntry> {
        if let Some(lead) = self.leads.get(&gid) {
            return Some(RosterEntry {
                gid,
                name: lead.entity().name.clone(),
                host: lead.entity().host.clone(),
                role: lead.entity().role,
                slot: None,
                profile: None,
                sandbox: None,
                profile_role: None,
                status: WorkerStatus::Idle.as_str().to_string(),
                agent: None,
                agent_status: None,
                groups: lead.entity().groups.clone(),
                pane: None,
                last_seen_ms: lead.last_seen_ms(),
                open_calls: Some(lead.open_calls()),
                stalled_since: None,
                workspace: None,
                dialog: None,
                owner: None,
                shared: Vec::new(),
            });
        }
        let s = self.panes.get(&gid)?;
        Some(RosterEntry {
            gid,
            name: s.entity().name.clone(),
            host: s.entity().host.clone(),
            role: s.entity().role,
            slot: slot_of(s.entity().role, &s.entity().name),
            profile: s.entity().profile.clone(),
            sandbox: s.entity().sandbox.clone(),
            profile_role: s.entity().profile_role.clone(),
            status: if self.host_down.is_some() {
                "unknown".to_string()
            } else {
                s.status().as_str().to_string()
            },
            agent: s.host_agent().as_ref().map(|(agent, _)| agent.clone()),
            agent_status: s
                .host_agent()
                .as_ref()
                .map(|(_, state)| state.as_str().to_string()),
            groups: s.entity().groups.clone(),
            pane: s.pane().map(|p| p.0.clone()),
            last_seen_ms: s.last_seen_ms(),
            open_calls: None,
            stalled_since: s.stalled_since(),
            workspace: s.workspace().as_ref().map(|d| d.display().to_string()),
            dialog: s
                .dialog()
                .filter(|_| {
                    s.status() == WorkerStatus::Blocked && s.allows(viewer, Action::SeeText)
                })
                .and_then(|d| Surfaced::from(d.question.clone()).dialog()),
            owner: Some(shown_lead(s.owner(), &s.entity().host)),
            shared: s
                .shared()
                .iter()
                .map(|r| shown_lead(r, &s.entity().host))
                .collect(),
        })
    }

    /// The status other hosts hear for `gid`: as `fleet_list` shows it (`unknown` while the
    /// pane host cannot be reached), a worker's as the rule announces it ([`announced`]).
    pub fn presence_status(&self, gid: Gid) -> String {
        let nobody = Principal::Operator {
            name: "",
            may_stop: false,
        };
        match (self.entry(gid, nobody), self.panes.get(&gid)) {
            (None, _) => "unknown".into(),
            (Some(_), Some(s)) if self.host_down.is_none() => {
                announced(&s.gate(false)).as_str().to_string()
            }
            (Some(entry), _) => entry.status,
        }
    }

    /// This host's workers and architects (of `group`, when given) that `lead` may send a
    /// task to: its own and those shared with it.
    pub fn taskable(&self, lead: &Entity, group: Option<&str>) -> Vec<Gid> {
        self.panes
            .values()
            .filter(|s| s.status().is_live())
            .filter(|s| group.is_none_or(|g| s.entity().groups.iter().any(|x| x == g)))
            .filter(|s| s.allows(Principal::Lead(lead), Action::Task))
            .map(|s| s.entity().gid)
            .collect::<std::collections::BTreeSet<Gid>>()
            .into_iter()
            .collect()
    }

    /// Every live entity's roster entry (leads first, each kind by gid) as `viewer` sees it.
    pub fn entries(&self, viewer: Principal<'_>) -> Vec<RosterEntry> {
        self.live_gids()
            .into_iter()
            .filter_map(|gid| self.entry(gid, viewer))
            .collect()
    }

    /// The whole roster as seen by `caller`.
    pub fn list(&self, caller: &Entity) -> Option<ListResult> {
        let viewer = principal_of(caller);
        let entities = self.entries(viewer);
        Some(ListResult {
            you: self.entry(caller.gid, viewer)?,
            coord_id: None,
            entities,
            hosts: Vec::new(),
        })
    }
}

/// `entity` (a caller) as the ownership rule knows it: a lead, or a pane-bound entity by its
/// own token.
pub(super) fn principal_of(entity: &Entity) -> Principal<'_> {
    if entity.role.is_pane_bound() {
        Principal::Pane(entity)
    } else {
        Principal::Lead(entity)
    }
}

/// How a roster entry of a worker of host `here` names lead `lead`: by its name when it is of
/// that host, else `name@host`.
pub(super) fn shown_lead(lead: &LeadRef, here: &str) -> String {
    if lead.host == here {
        lead.name.clone()
    } else {
        lead.to_string()
    }
}
