//! A restart takes back what still runs. When a worker's pane opens, what fleetd knows it by
//! is recorded (the program it started there, its working directory, owner and shares); at
//! the next start, each worker and architect the previous run left is taken back as it was —
//! same gid, name, owner, token, queue and task in flight — if its pane still runs that very
//! program ([`fleet_core::adoption::adopt`] decides), and ended otherwise, its senders told
//! why. The rest of the start-up (what is failed, which panes close) is in `ending.rs`.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::adoption::{Leftover, PaneNow, ProgramId, Verdict, adopt};
use fleet_core::clock::now_ms;
use fleet_core::ownership::LeadRef;
use fleet_core::{Entity, FleetError, Gid, Message, MsgState, Role};
use fleet_mux::{PaneId, PaneLife, PaneState};
use fleet_store::EntityRecord;
use serde::{Deserialize, Serialize};

use super::interrupted::Settled;
use super::session::{Adopted, PaneSession};
use super::{Caller, LocalPlane};
use crate::config::ProfileConfig;

/// What a worker's session is known by, recorded when its pane opens.
#[derive(Debug, Serialize, Deserialize)]
struct Known {
    /// The program fleetd started in its pane.
    program: ProgramId,
    /// Where it works.
    cwd: PathBuf,
    /// Its own workspace, when its profile made one.
    workspace: Option<PathBuf>,
    /// Its owner.
    owner: LeadRef,
    /// The leads it is shared with.
    shared: Vec<LeadRef>,
}

/// What taking back the previous run's sessions leaves to the rest of the start-up.
#[derive(Default)]
pub(super) struct TakenBack {
    /// The sessions not taken back, to be ended.
    pub ended: Vec<Unadopted>,
    /// Tasks the previous run was typing that their workers were found to have taken: a
    /// sender on another host hears they were typed once the federation is up.
    pub typed: Vec<Message>,
    /// Tasks it was typing whose fate the pane could not tell, to be failed for this reason.
    pub unsure: Vec<(Message, String)>,
}

/// A session the previous run left that this start does not take back, and why not.
pub(super) struct Unadopted {
    /// It, as the store has it.
    pub record: EntityRecord,
    /// Why it is not taken back.
    pub why: String,
}

/// What the start-up knows of the panes and of the previous run's absence.
struct Found {
    panes: BTreeMap<PaneId, PaneState>,
    unattended: Option<Duration>,
    adopt_within: Duration,
    /// The previous run was of a build before schema 9, which recorded nothing of its workers.
    upgraded: bool,
}

/// A session of the previous run to take back.
pub(super) struct Identified {
    /// What it is known by.
    known: Known,
    /// Since when (Unix ms) it has run in its pane: its tasks counted from then.
    pub(super) since: i64,
    /// Its profile, as configured now.
    pub(super) profile: ProfileConfig,
    /// Its pane.
    pub(super) pane: PaneId,
}

impl LocalPlane {
    /// Records what worker `gid`'s session is known by, once its pane `pane` opened; a
    /// session that cannot be recorded is not taken back by a restart (said here).
    pub(super) async fn note_adoptable(&self, gid: Gid, pane: &PaneId) {
        let program = match self.panes.pid(pane).await {
            Ok(pid) => crate::process::program(pid).map_err(|e| e.to_string()),
            Err(e) => Err(crate::logs::mux_error(&e).to_string()),
        };
        let facts = program.and_then(|program| {
            let sessions = self.sessions.lock();
            let session = sessions
                .panes
                .get(&gid)
                .ok_or_else(|| "its session ended".to_string())?;
            let known = Known {
                program,
                cwd: session.cwd().to_path_buf(),
                workspace: session.workspace().map(PathBuf::from),
                owner: session.owner().clone(),
                shared: session.shared().to_vec(),
            };
            serde_json::to_string(&known).map_err(|e| e.to_string())
        });
        let recorded = match facts {
            Ok(facts) => self
                .db
                .run(move |s| s.put_adoptable(gid, &facts, now_ms()))
                .await
                .map_err(|e| e.message),
            Err(why) => Err(why),
        };
        if let Err(why) = recorded {
            tracing::warn!(%gid, %pane, why, "cannot record the worker's program: a restart of fleetd will end it rather than take it back");
        }
    }

    /// At start-up, before anything is served or attached: takes back each worker and
    /// architect of the previous run that still runs; returns the others, to be ended.
    pub(super) async fn take_back(self: &Arc<Self>) -> Result<TakenBack, FleetError> {
        let records: Vec<EntityRecord> = self
            .db
            .run(|s| s.live_entities())
            .await?
            .into_iter()
            .filter(|r| r.entity.role.is_pane_bound())
            .collect();
        if records.is_empty() {
            return Ok(TakenBack::default());
        }
        let panes = self.panes.panes().await.map_err(|e| {
            FleetError::new(
                fleet_core::ErrorCode::PaneHost,
                format!("cannot list panes: {e}"),
            )
        })?;
        let last_alive = self.db.run(|s| s.last_alive_ms()).await?;
        let found = Found {
            panes,
            unattended: last_alive
                .map(|at| Duration::from_millis(u64::try_from(now_ms() - at).unwrap_or(0))),
            adopt_within: Duration::from_secs(self.config.gateway.adopt_within_s),
            // No gateway of schema 9 ever ran on this store (it writes when it was alive):
            // its workers were started by an older build, which recorded nothing of them.
            upgraded: last_alive.is_none(),
        };
        let mut back = TakenBack::default();
        for record in records {
            match self.identify(&record, &found).await? {
                Ok(taken) => {
                    for settled in self.take_back_one(&record, taken).await? {
                        match settled {
                            Settled::Typed(task) => back.typed.push(task),
                            Settled::Unsure(task, why) => back.unsure.push((task, why)),
                            Settled::PutBack => {}
                        }
                    }
                }
                Err(why) => back.ended.push(Unadopted { record, why }),
            }
        }
        Ok(back)
    }

    /// Whether `record`, a session of the previous run, is to be taken back
    /// ([`fleet_core::adoption::adopt`]): what it is known by, its profile and its pane; or
    /// why not.
    async fn identify(
        &self,
        record: &EntityRecord,
        found: &Found,
    ) -> Result<Result<Identified, String>, FleetError> {
        let gid = record.entity.gid;
        let pane = record.pane.clone().map(PaneId);
        let pane_now = match pane.as_ref().and_then(|p| found.panes.get(p)) {
            None => PaneNow::Missing,
            Some(state) if state.life == PaneLife::Alive => PaneNow::Running,
            Some(_) => PaneNow::Exited,
        };
        let running = match (&pane, pane_now) {
            (Some(pane), PaneNow::Running) => self
                .panes
                .pid(pane)
                .await
                .ok()
                .and_then(|pid| crate::process::program(pid).ok()),
            _ => None,
        };
        let known = match (self.known(gid).await?, &running) {
            (Some(known), _) => Some(known),
            // A worker of an older build is known by the gid its program was started with.
            (None, Some(program)) if found.upgraded => self.recognised(record, program).await,
            (None, _) => None,
        };
        let profile: Option<ProfileConfig> = record
            .entity
            .profile
            .as_deref()
            .and_then(|name| self.config.profile(name))
            .cloned();
        let verdict = adopt(&Leftover {
            status: record.status,
            started_as: known.as_ref().map(|(k, _)| &k.program),
            pane: pane_now,
            running: running.as_ref(),
            profile_known: profile.is_some(),
            unattended: found.unattended,
            adopt_within: found.adopt_within,
        });
        Ok(match (verdict, known, profile, pane) {
            (Verdict::Adopt, Some((known, since)), Some(profile), Some(pane)) => Ok(Identified {
                known,
                since,
                profile,
                pane,
            }),
            (Verdict::End(why), ..) => Err(why),
            // `adopt` takes back nothing unknown, unconfigured or paneless.
            (Verdict::Adopt, ..) => Err("it cannot be told apart".into()),
        })
    }

    /// Takes back `record`, as `taken` says it is: its task in flight the last one typed in or
    /// handed over that nothing answers — the messages' states are stored as they change, a
    /// session's status is not on every task — and an architect retired as its slot says. The
    /// tasks the previous run was still typing into it are settled first, from its pane
    /// ([`LocalPlane::settle_typing`]); what became of them is returned.
    async fn take_back_one(
        self: &Arc<Self>,
        record: &EntityRecord,
        taken: Identified,
    ) -> Result<Vec<Settled>, FleetError> {
        let gid = record.entity.gid;
        let settled = self.settle_typing(gid, &taken).await?;
        let current = self
            .db
            .run(move |s| s.unanswered_tasks_to(gid))
            .await?
            .into_iter()
            .rfind(|m| matches!(m.state, MsgState::Injected | MsgState::Consumed));
        let since = taken.since;
        let tasks_started = self.db.run(move |s| s.tasks_taken(gid, since)).await?;
        let briefed = self.db.run(move |s| s.tasks_taken(gid, 0)).await? > 0;
        let answered = current.is_none();
        let session = PaneSession::adopted(Adopted {
            entity: record.entity.clone(),
            profile: Arc::new(taken.profile),
            cwd: taken.known.cwd,
            workspace: taken.known.workspace,
            owner: taken.known.owner,
            shared: taken.known.shared,
            pane: taken.pane.clone(),
            current,
            tasks_started,
            briefed,
        });
        let status = session.status();
        self.sessions.lock().add_session(session);
        self.persist_status(gid).await;
        tracing::info!(%gid, name = %record.entity.name, pane = %taken.pane, %status, "took back a worker the previous run left running");
        if record.entity.role == Role::Architect {
            self.retire_adopted(&record.entity, answered);
        }
        Ok(settled)
    }

    /// Arms again the retirement of `architect`, taken back (its consult's timers were the
    /// previous run's): stopped `keep_s` after its answer, or, still on its brief, once a
    /// consult's default wait has passed without its answer.
    fn retire_adopted(self: &Arc<Self>, architect: &Entity, answered: bool) {
        let lead = architect.parent.and_then(|parent| {
            self.sessions
                .lock()
                .leads
                .get(&parent)
                .map(|l| l.entity_shared())
        });
        match (lead, self.config.architects.slot(&architect.name)) {
            (Some(entity), Some(slot)) => {
                self.retire_later(
                    &Caller { entity },
                    slot,
                    architect.gid,
                    answered,
                    super::consult::DEFAULT_WAIT,
                );
            }
            _ => {
                tracing::warn!(gid = %architect.gid, name = %architect.name, "an architect taken back whose slot or lead is gone: it stays until stopped")
            }
        }
    }

    /// What the previous run recorded of `gid`'s session, and as of when; a record that does
    /// not read (a newer build's, say) is none.
    async fn known(&self, gid: Gid) -> Result<Option<(Known, i64)>, FleetError> {
        let Some((text, since)) = self.db.run(move |s| s.adoptable(gid)).await? else {
            return Ok(None);
        };
        match serde_json::from_str::<Known>(&text) {
            Ok(known) => Ok(Some((known, since))),
            Err(e) => {
                tracing::warn!(%gid, error = %e, "unreadable record of a worker's program");
                Ok(None)
            }
        }
    }

    /// What a worker of a run that recorded nothing of it (a build before schema 9) is known
    /// by, if `program` (running in its pane) was started with its gid (`FLEET_GID`): where that
    /// program works (checked as a spawn's directory is), and its owner (a lead of this host;
    /// one of another host cannot be told from such a run's store). Its shares were never
    /// stored: it is taken back unshared; its tasks are counted from now.
    async fn recognised(&self, record: &EntityRecord, program: &ProgramId) -> Option<(Known, i64)> {
        let gid = record.entity.gid;
        if !crate::process::started_with(program.pid, crate::launch::GID_VAR, &gid.to_string()) {
            return None;
        }
        let cwd = crate::process::cwd(program.pid).ok()?;
        let (workdirs, host) = (Arc::clone(&self.workdirs), self.host_id.clone());
        let cwd = self
            .cwd_lane
            .run(move || workdirs.resolve(&cwd, &host))
            .await
            .ok()?
            .ok()?;
        let owner = {
            let sessions = self.sessions.lock();
            let lead = sessions.leads.get(&record.entity.parent?)?.entity();
            LeadRef {
                name: lead.name.clone(),
                host: lead.host.clone(),
            }
        };
        let workspace = self.launchers.workspaces.keeps(gid).then(|| cwd.clone());
        tracing::info!(%gid, name = %record.entity.name, "a worker of a build before schema 9, known by the gid its program was started with");
        let known = Known {
            program: program.clone(),
            cwd,
            workspace,
            owner,
            shared: Vec::new(),
        };
        Some((known, now_ms()))
    }

    /// The panes of the sessions taken back, which the start-up leaves open.
    pub(super) fn kept_panes(&self) -> HashSet<PaneId> {
        self.sessions
            .lock()
            .panes
            .values()
            .filter_map(|s| s.pane().cloned())
            .collect()
    }
}
