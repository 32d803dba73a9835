//! The live half of the roster: leads and pane sessions as this process knows them, with what
//! each is doing now (status, the task in flight, open calls). Pure bookkeeping under one lock;
//! no I/O happens here.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use fleet_core::clock::now_ms;
use fleet_core::delivery::{
    Handover, Recipient, Taker, TaskGate, announced, handover, may_take_task,
};
use fleet_core::ownership::{Action, LeadRef, Owned, Principal, may};
use fleet_core::{Entity, Gid, Message, SessionEvent, WorkerStatus};
use fleet_mux::{AgentState, PaneId};
use tokio::sync::watch;
use tokio::time::Instant;

use super::NudgeTarget;
use super::asks::Asks;
use super::views::{AskView, ListResult, RosterEntry, Surfaced, slot_of};
use crate::config::{ProfileConfig, ReadyCall};

/// A lead, reached by MCP pull.
pub(super) struct LeadState {
    /// Who.
    pub entity: Entity,
    /// Fleet calls of this lead now open (a blocked send, a long poll): while any is open the
    /// lead gets its messages through the call and is never nudged.
    pub open_calls: usize,
    /// Whose asks its open calls surface: one entry per open call, a worker's gid (a send to
    /// it) or `None` (a poll without filter: anyone's).
    pub listening: Vec<Option<Gid>>,
    /// Where to type a nudge, as the lead's last request said.
    pub nudge: Option<NudgeTarget>,
    /// When it last called in.
    pub last_seen_ms: Option<i64>,
    /// When it was last nudged.
    pub last_nudge: Option<Instant>,
}

/// A dialog asked of a worker's lead, while it is open.
pub(super) struct OpenDialog {
    /// The ask, as its lead sees it (its turn id, the dialog's text and choices).
    pub question: AskView,
    /// Until when its lead on another host can answer it (its `ASK`'s life there).
    pub good_until: Option<Instant>,
    /// For a lead on another host: the `ASK` that carried it, to tell that lead it is over.
    pub remote: Option<Message>,
    /// How often each of the profile's `turn_over_markers` showed when it was asked: one shown
    /// more often once it is gone ended the turn.
    pub turn_over_before: Vec<usize>,
    /// Its answer is being pressed: the watcher leaves the screen to it.
    pub answering: bool,
}

/// A pane-bound entity (worker, architect) and its session.
pub(super) struct PaneSession {
    /// Who.
    pub entity: Entity,
    /// How to type into it.
    pub profile: Arc<ProfileConfig>,
    /// Where it is in its life.
    pub status: WorkerStatus,
    /// Its pane, once spawned.
    pub pane: Option<PaneId>,
    /// Its working directory (a recycled session starts there again).
    pub cwd: PathBuf,
    /// Since when it has been idle, while it is.
    pub idle_since: Option<Instant>,
    /// Tasks handed to this session so far (for the profile's `context_cap`).
    pub tasks_started: u64,
    /// The task in flight, set when a task is handed over and cleared by its reply.
    pub current: Option<Message>,
    /// Open `fleet_poll` calls: while one is open, tasks go through it, not the keyboard.
    pub polls: usize,
    /// Its fleet calls open now (a long `fleet_send` or `fleet_poll`): while one is, it waits
    /// on the fleet and has not stalled.
    pub open_calls: usize,
    /// The pump or a poll is taking the next task off the queue: the other must not, or two
    /// tasks would be in flight at once.
    pub claiming: bool,
    /// Someone tried to claim while the claim was held; the holder wakes them on letting go.
    pub claim_missed: bool,
    /// Ticks on every authenticated call; the injector's proof of a submit.
    pub activity: watch::Sender<u64>,
    /// Ticks whenever the delivery pump or the readiness gate should look again.
    pub kick: watch::Sender<u64>,
    /// When it last called in.
    pub last_seen_ms: Option<i64>,
    /// The end of its screen when its program exited, for the error a spawn reports.
    pub last_words: Option<String>,
    /// The agent the pane host recognises in the pane, and what it is doing (herdr's agent
    /// detection); `None` where the host knows nothing (tmux, or a program herdr does not
    /// recognise). A working or blocked agent gets no task, but through its own open poll.
    pub host_agent: Option<(String, AgentState)>,
    /// It signalled readiness (called in, or listed the tools) before the pane host had told
    /// us its pane: it is made ready once the pane is known.
    pub ready_early: bool,
    /// When it was last nudged to pull what waits for it (an architect, past its brief);
    /// forgotten once it takes a task.
    pub last_nudge: Option<Instant>,
    /// It took a task, in this session or one before a recycle: an architect pulls what comes
    /// after its brief.
    pub briefed: bool,
    /// When a task was last queued for it.
    pub last_queued: Option<Instant>,
    /// The dialog on its screen asked of its lead, while the session is blocked on it.
    pub dialog: Option<OpenDialog>,
    /// Since when (Unix ms) it has stalled, while it has (the stall watchdog).
    pub stalled_since: Option<i64>,
    /// Its own workspace (its profile's `workspace`), where it runs.
    pub workspace: Option<PathBuf>,
    /// Its owner, the lead that spawned it, by name and host (the roster shows it).
    pub owner: LeadRef,
    /// The leads it is shared with: they may send it tasks.
    pub shared: Vec<LeadRef>,
}

impl PaneSession {
    /// Whose it is.
    pub fn owned(&self) -> Owned<'_> {
        Owned {
            owner: self.entity.parent,
            shared: &self.shared,
        }
    }

    /// Whether `who` may do `action` to it.
    pub fn allows(&self, who: Principal<'_>, action: Action) -> bool {
        may(who, action, self.owned())
    }

    /// Applies a session event, logging the transition.
    pub fn apply(&mut self, event: SessionEvent) -> Result<WorkerStatus, fleet_core::FleetError> {
        let next = self.status.on(event)?;
        tracing::info!(gid = %self.entity.gid, name = %self.entity.name, from = %self.status, to = %next, ?event, "session");
        self.status = next;
        if event == SessionEvent::TaskStarted {
            self.tasks_started += 1;
            self.last_nudge = None;
            self.briefed = true;
        }
        self.idle_since = (next == WorkerStatus::Idle).then(Instant::now);
        if next != WorkerStatus::Busy {
            // Only a busy session stalls.
            self.stalled_since = None;
        }
        self.kick();
        Ok(next)
    }

    /// The worker's own sign of readiness (a call-in, or listing the tools): a spawning session
    /// turns idle now if its pane is known, else as soon as it is — a task must never be
    /// handed to a session that has no pane to type it into. Returns whether it turned idle.
    fn signal_ready(&mut self) -> bool {
        if self.status != WorkerStatus::Spawning {
            return false;
        }
        if self.pane.is_none() {
            self.ready_early = true;
            return false;
        }
        self.apply(SessionEvent::Ready).is_ok()
    }

    /// Records the session's new pane; a worker that already signalled readiness turns idle.
    /// Returns whether it did.
    pub fn pane_opened(&mut self, pane: PaneId) -> bool {
        self.pane = Some(pane);
        std::mem::take(&mut self.ready_early)
            && self.status == WorkerStatus::Spawning
            && self.apply(SessionEvent::Ready).is_ok()
    }

    /// Whether what is queued for it waits for its own `fleet_poll` (an architect past its
    /// brief) instead of being typed in.
    pub fn pulls(&self) -> bool {
        handover(self.entity.role, self.briefed) == Handover::Nudge
    }

    /// Whether the session took as many tasks as its profile allows, and must be recycled
    /// before it takes another.
    pub fn cap_reached(&self) -> bool {
        self.profile
            .context_cap
            .is_some_and(|cap| self.tasks_started >= cap)
    }

    /// What decides whether the session takes a task now (`host_down`: the pane host cannot
    /// be reached).
    pub fn gate(&self, host_down: bool) -> TaskGate {
        TaskGate {
            status: self.status,
            cap_reached: self.cap_reached(),
            polls_open: self.polls,
            agent_busy: matches!(
                self.host_agent,
                Some((_, AgentState::Working | AgentState::Blocked))
            ),
            host_down,
        }
    }

    /// Wakes the pump and the readiness gate.
    pub fn kick(&self) {
        self.kick.send_modify(|v| *v = v.wrapping_add(1));
    }
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
}

impl Sessions {
    pub fn add_lead(&mut self, entity: Entity) {
        self.leads.insert(
            entity.gid,
            LeadState {
                entity,
                open_calls: 0,
                listening: Vec::new(),
                nudge: None,
                last_seen_ms: None,
                last_nudge: None,
            },
        );
    }

    /// Notes a call from `gid`. Returns the entity, and whether this call made a spawning
    /// session ready; `None` if `gid` is not live here.
    pub fn called_in(
        &mut self,
        gid: Gid,
        nudge: Option<NudgeTarget>,
        acting: bool,
    ) -> Option<(Entity, bool)> {
        if let Some(lead) = self.leads.get_mut(&gid) {
            lead.last_seen_ms = Some(now_ms());
            if nudge.is_some() {
                lead.nudge = nudge;
            }
            return Some((lead.entity.clone(), false));
        }
        let session = self.panes.get_mut(&gid)?;
        if !session.status.is_live() {
            return None;
        }
        session.last_seen_ms = Some(now_ms());
        if acting {
            session.activity.send_modify(|v| *v = v.wrapping_add(1));
        }
        let became_ready = session.profile.ready_call() == ReadyCall::Any && session.signal_ready();
        Some((session.entity.clone(), became_ready))
    }

    /// Notes that `gid` listed fleetd's tools; returns whether that made it ready.
    pub fn listed_tools(&mut self, gid: Gid) -> bool {
        self.panes.get_mut(&gid).is_some_and(|session| {
            session.profile.ready_call() != ReadyCall::None && session.signal_ready()
        })
    }

    /// Who `gid` is to this gateway, for a message's placement.
    pub fn recipient(&self, gid: Gid) -> Recipient {
        if self.leads.contains_key(&gid) {
            return Recipient::Lead;
        }
        match self.panes.get(&gid) {
            Some(s) => Recipient::Pane {
                live: s.status.is_live(),
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
        let mut leads: Vec<&LeadState> = self.leads.values().collect();
        leads.sort_by_key(|l| l.entity.gid);
        let mut panes: Vec<&PaneSession> =
            self.panes.values().filter(|s| s.status.is_live()).collect();
        panes.sort_by_key(|s| s.entity.gid);
        leads
            .into_iter()
            .map(|l| l.entity.clone())
            .chain(panes.into_iter().map(|s| s.entity.clone()))
            .collect()
    }

    /// Forgets the oldest ended sessions beyond `keep`.
    pub fn prune_gone(&mut self, keep: usize) {
        let mut gone: Vec<Gid> = self
            .panes
            .iter()
            .filter(|(_, s)| s.status == WorkerStatus::Gone)
            .map(|(gid, _)| *gid)
            .collect();
        if gone.len() > keep {
            gone.sort_unstable();
            for gid in &gone[..gone.len() - keep] {
                self.panes.remove(gid);
            }
        }
    }

    /// The roster entry of `gid` as `viewer` may see it: a blocked worker's dialog (screen
    /// text) only for its owner.
    pub fn entry(&self, gid: Gid, viewer: Principal<'_>) -> Option<RosterEntry> {
        if let Some(lead) = self.leads.get(&gid) {
            return Some(RosterEntry {
                gid,
                name: lead.entity.name.clone(),
                host: lead.entity.host.clone(),
                role: lead.entity.role,
                slot: None,
                profile: None,
                status: WorkerStatus::Idle.as_str().to_string(),
                agent: None,
                agent_status: None,
                groups: lead.entity.groups.clone(),
                pane: None,
                last_seen_ms: lead.last_seen_ms,
                open_calls: Some(lead.open_calls),
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
            name: s.entity.name.clone(),
            host: s.entity.host.clone(),
            role: s.entity.role,
            slot: slot_of(s.entity.role, &s.entity.name),
            profile: s.entity.profile.clone(),
            status: if self.host_down.is_some() {
                "unknown".to_string()
            } else {
                s.status.as_str().to_string()
            },
            agent: s.host_agent.as_ref().map(|(agent, _)| agent.clone()),
            agent_status: s
                .host_agent
                .as_ref()
                .map(|(_, state)| state.as_str().to_string()),
            groups: s.entity.groups.clone(),
            pane: s.pane.as_ref().map(|p| p.0.clone()),
            last_seen_ms: s.last_seen_ms,
            open_calls: None,
            stalled_since: s.stalled_since,
            workspace: s.workspace.as_ref().map(|d| d.display().to_string()),
            dialog: s
                .dialog
                .as_ref()
                .filter(|_| s.status == WorkerStatus::Blocked && s.allows(viewer, Action::SeeText))
                .and_then(|d| Surfaced::from(d.question.clone()).dialog()),
            owner: Some(shown_lead(&s.owner, &s.entity.host)),
            shared: s
                .shared
                .iter()
                .map(|r| shown_lead(r, &s.entity.host))
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
            .filter(|s| s.status.is_live())
            .filter(|s| group.is_none_or(|g| s.entity.groups.iter().any(|x| x == g)))
            .filter(|s| s.allows(Principal::Lead(lead), Action::Task))
            .map(|s| s.entity.gid)
            .collect::<std::collections::BTreeSet<Gid>>()
            .into_iter()
            .collect()
    }

    /// The whole roster as seen by `caller`.
    pub fn list(&self, caller: &Entity) -> Option<ListResult> {
        let viewer = principal_of(caller);
        let entities = self
            .entities()
            .into_iter()
            .filter_map(|e| self.entry(e.gid, viewer))
            .collect();
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
