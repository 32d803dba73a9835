//! One pane-bound entity's session (a worker's, an architect's): where it is in its life, the
//! task in flight, the claim on its queue, its open calls, its dialog and its stall. Its fields
//! are its own: every change goes through a method here, named for what happened, so the rules
//! of a session (one claimant at a time, one task in flight, a turn ends once) hold in one
//! place and are tested here, at explicit times. Pure bookkeeping: no I/O.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleet_core::ownership::{Action, LeadRef, Owned, Principal, may};
use fleet_core::{Entity, Message, WorkerStatus};
use fleet_mux::{AgentState, PaneId};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::feed::LiveStatus;
use super::views::AskView;
use crate::config::ProfileConfig;

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
    /// Its program showed it while starting (no task is in flight): once it goes, the session
    /// starts on.
    pub at_start: bool,
}

/// Where a session is in its start.
#[derive(Debug, PartialEq)]
pub(super) enum StartState<'a> {
    /// Starting: it has not signalled readiness, and shows no dialog asked of its owner.
    Starting,
    /// Blocked on a dialog its program showed while starting, asked as this.
    Blocked(&'a AskView),
    /// Ended (or being ended) before it was ready: its last words, if its program left any.
    Ended(Option<&'a str>),
    /// Past its start: ready, or at work since.
    Past,
}

/// What a session a previous run left is taken back with (see [`PaneSession::adopted`]).
pub(super) struct Adopted {
    /// Who.
    pub entity: Entity,
    /// Its profile, as configured now.
    pub profile: Arc<ProfileConfig>,
    /// Its working directory.
    pub cwd: PathBuf,
    /// Its own workspace, when its profile made one.
    pub workspace: Option<PathBuf>,
    /// Its owner.
    pub owner: LeadRef,
    /// The leads it is shared with.
    pub shared: Vec<LeadRef>,
    /// Its pane, still running the program fleetd started.
    pub pane: PaneId,
    /// Its task in flight, if it has one.
    pub current: Option<Message>,
    /// How many tasks this session took so far.
    pub tasks_started: u64,
    /// Whether it ever took a task.
    pub briefed: bool,
}

/// A pane-bound entity (worker, architect) and its session.
pub(super) struct PaneSession {
    /// Who: shared with each of its calls' [`super::Caller`]s.
    entity: Arc<Entity>,
    /// How to type into it.
    profile: Arc<ProfileConfig>,
    /// Where it is in its life.
    status: WorkerStatus,
    /// Its pane, once spawned.
    pane: Option<PaneId>,
    /// Its working directory (a recycled session starts there again).
    cwd: PathBuf,
    /// Since when it has been idle, while it is.
    idle_since: Option<Instant>,
    /// Tasks handed to this session so far (for the profile's `context_cap`).
    tasks_started: u64,
    /// The task in flight, set when a task is handed over and cleared by its reply.
    current: Option<Message>,
    /// Open `fleet_poll` calls: while one is open, tasks go through it, not the keyboard.
    polls: usize,
    /// Its fleet calls open now (a long `fleet_send` or `fleet_poll`): while one is, it waits
    /// on the fleet and has not stalled.
    open_calls: usize,
    /// The pump or a poll is taking the next task off the queue: the other must not, or two
    /// tasks would be in flight at once.
    claiming: bool,
    /// Someone tried to claim while the claim was held; the holder wakes them on letting go.
    claim_missed: bool,
    /// Its task in flight was taken as it was accepted and waits for its pump to type it in.
    to_type: bool,
    /// Its delivery pump was started.
    pumped: bool,
    /// Briefs from another host queued for it whose acknowledgement is not yet seen.
    arriving: usize,
    /// Ticks on every authenticated call; the injector's proof of a submit.
    activity: watch::Sender<u64>,
    /// Ticks whenever the delivery pump or the readiness gate should look again.
    kick: watch::Sender<u64>,
    /// When it last called in.
    last_seen_ms: Option<i64>,
    /// The end of its screen when its program exited, for the error a spawn reports.
    last_words: Option<String>,
    /// The agent the pane host recognises in the pane, and what it is doing (herdr's agent
    /// detection); `None` where the host knows nothing (tmux, or a program herdr does not
    /// recognise). A working or blocked agent gets no task, but through its own open poll.
    host_agent: Option<(String, AgentState)>,
    /// It signalled readiness (called in, or listed the tools) before the pane host had told
    /// us its pane: it is made ready once the pane is known.
    ready_early: bool,
    /// When it was last nudged to pull what waits for it (an architect, past its brief);
    /// forgotten once it takes a task.
    last_nudge: Option<Instant>,
    /// It took a task, in this session or one before a recycle: an architect pulls what comes
    /// after its brief.
    briefed: bool,
    /// When a task was last queued for it.
    last_queued: Option<Instant>,
    /// The dialog on its screen asked of its lead, while the session is blocked on it.
    dialog: Option<OpenDialog>,
    /// Since when (Unix ms) it has stalled, while it has (the stall watchdog).
    stalled_since: Option<i64>,
    /// Its own workspace (its profile's `workspace`), where it runs.
    workspace: Option<PathBuf>,
    /// Its owner, the lead that spawned it, by name and host (the roster shows it).
    owner: LeadRef,
    /// The leads it is shared with: they may send it tasks.
    shared: Vec<LeadRef>,
    /// Where each status it reaches is told live (the feeds), once it is among the sessions.
    told: Option<broadcast::Sender<LiveStatus>>,
}

impl PaneSession {
    /// A session being spawned for `entity` with `profile`, to work in `cwd`, owned by `owner`
    /// and shared with `shared`.
    pub fn spawning(
        entity: Entity,
        profile: Arc<ProfileConfig>,
        cwd: PathBuf,
        owner: LeadRef,
        shared: Vec<LeadRef>,
    ) -> PaneSession {
        PaneSession {
            entity: Arc::new(entity),
            profile,
            status: WorkerStatus::Spawning,
            pane: None,
            cwd,
            idle_since: None,
            tasks_started: 0,
            current: None,
            polls: 0,
            arriving: 0,
            open_calls: 0,
            claiming: false,
            claim_missed: false,
            to_type: false,
            pumped: false,
            activity: watch::channel(0).0,
            kick: watch::channel(0).0,
            last_seen_ms: None,
            last_words: None,
            host_agent: None,
            ready_early: false,
            last_nudge: None,
            briefed: false,
            last_queued: None,
            dialog: None,
            stalled_since: None,
            workspace: None,
            owner,
            shared,
            told: None,
        }
    }

    /// A session a previous run of fleetd left running, taken back as `taken` says: its
    /// status ([`fleet_core::adoption::adopted_status`]) follows from its task in flight.
    pub fn adopted(taken: Adopted) -> PaneSession {
        let status = fleet_core::adoption::adopted_status(taken.current.is_some());
        let mut session = PaneSession::spawning(
            taken.entity,
            taken.profile,
            taken.cwd,
            taken.owner,
            taken.shared,
        );
        session.status = status;
        session.pane = Some(taken.pane);
        session.workspace = taken.workspace;
        session.current = taken.current;
        session.tasks_started = taken.tasks_started;
        session.briefed = taken.briefed;
        if status == WorkerStatus::Idle {
            session.idle_since = Some(Instant::now());
        }
        session
    }

    /// Who.
    pub fn entity(&self) -> &Entity {
        &self.entity
    }

    /// Who, shared (no copy of its names).
    pub fn entity_shared(&self) -> Arc<Entity> {
        Arc::clone(&self.entity)
    }

    /// Its profile.
    pub fn profile(&self) -> &Arc<ProfileConfig> {
        &self.profile
    }

    /// Where it is in its life.
    pub fn status(&self) -> WorkerStatus {
        self.status
    }

    /// Whether it is blocked on a dialog its program showed while starting.
    pub fn blocked_at_start(&self) -> bool {
        self.start_dialog().is_some()
    }

    /// The dialog its program showed while starting, as asked of its owner, while it is
    /// blocked on it.
    pub fn start_dialog(&self) -> Option<&AskView> {
        self.dialog
            .as_ref()
            .filter(|d| d.at_start && self.status == WorkerStatus::Blocked)
            .map(|d| &d.question)
    }

    /// Where it is in its start.
    pub fn start_state(&self) -> StartState<'_> {
        match self.status {
            WorkerStatus::Spawning => StartState::Starting,
            WorkerStatus::Stopping | WorkerStatus::Gone => StartState::Ended(self.last_words()),
            _ => match self.start_dialog() {
                Some(asked) => StartState::Blocked(asked),
                None => StartState::Past,
            },
        }
    }

    /// Its status as the store keeps it: a session blocked on a start dialog is still
    /// starting there (a restart cannot take back the dialog's ask, nor a start half done).
    pub fn stored_status(&self) -> WorkerStatus {
        if self.blocked_at_start() {
            WorkerStatus::Spawning
        } else {
            self.status
        }
    }

    /// Tells each status it reaches from now on to `told`'s listeners.
    pub fn tell_to(&mut self, told: broadcast::Sender<LiveStatus>) {
        self.told = Some(told);
    }

    /// Tells its listeners, if any, that it reached its status now.
    fn tell(&self) {
        let Some(told) = &self.told else { return };
        if told.receiver_count() == 0 {
            return;
        }
        let _ = told.send(LiveStatus {
            gid: self.entity.gid,
            name: self.entity.name.clone(),
            role: self.entity.role,
            profile: self.entity.profile.clone(),
            status: self.status,
            at_ms: fleet_core::clock::now_ms(),
        });
    }

    /// Its pane, once spawned.
    pub fn pane(&self) -> Option<&PaneId> {
        self.pane.as_ref()
    }

    /// Its working directory.
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// Its own workspace, when its profile makes one.
    pub fn workspace(&self) -> Option<&Path> {
        self.workspace.as_deref()
    }

    /// The task in flight.
    pub fn current(&self) -> Option<&Message> {
        self.current.as_ref()
    }

    /// How many tasks this session was handed so far.
    pub fn tasks_started(&self) -> u64 {
        self.tasks_started
    }

    /// How many of its fleet calls are open now.
    pub fn open_calls(&self) -> usize {
        self.open_calls
    }

    /// Whether the pump or a poll holds the claim on its queue.
    pub fn claiming(&self) -> bool {
        self.claiming
    }

    /// When it last called in (Unix ms).
    pub fn last_seen_ms(&self) -> Option<i64> {
        self.last_seen_ms
    }

    /// The end of its screen when its program exited.
    pub fn last_words(&self) -> Option<&str> {
        self.last_words.as_deref()
    }

    /// The agent the pane host sees in its pane, and what it is doing.
    pub fn host_agent(&self) -> Option<&(String, AgentState)> {
        self.host_agent.as_ref()
    }

    /// The dialog asked of its lead, while it is open.
    pub fn dialog(&self) -> Option<&OpenDialog> {
        self.dialog.as_ref()
    }

    /// The open dialog, to be marked (being answered, say).
    pub fn dialog_mut(&mut self) -> Option<&mut OpenDialog> {
        self.dialog.as_mut()
    }

    /// Since when (Unix ms) it has stalled, while it has.
    pub fn stalled_since(&self) -> Option<i64> {
        self.stalled_since
    }

    /// When it was last nudged to pull what waits for it.
    pub fn last_nudge(&self) -> Option<Instant> {
        self.last_nudge
    }

    /// When a task was last queued for it.
    pub fn last_queued(&self) -> Option<Instant> {
        self.last_queued
    }

    /// How long it has been idle at `now`, while it is.
    pub fn idle_for(&self, now: Instant) -> Option<std::time::Duration> {
        self.idle_since
            .map(|since| now.saturating_duration_since(since))
    }

    /// Its owner.
    pub fn owner(&self) -> &LeadRef {
        &self.owner
    }

    /// The leads it is shared with.
    pub fn shared(&self) -> &[LeadRef] {
        &self.shared
    }

    /// A receiver that ticks on every call it makes.
    pub fn activity(&self) -> watch::Receiver<u64> {
        self.activity.subscribe()
    }

    /// A receiver that ticks whenever the pump or the readiness gate should look again.
    pub fn kicks(&self) -> watch::Receiver<u64> {
        self.kick.subscribe()
    }

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
}

mod changes;
#[cfg(test)]
mod tests;
