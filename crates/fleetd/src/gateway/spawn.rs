//! `fleet_spawn`: a worker's pane opened behind the readiness gate, and its session recorded.
//! (Its end is in `ending.rs`; its life between, in `lifecycle.rs`.)

use std::path::PathBuf;
use std::sync::Arc;

use fleet_core::authz::{Tool, check_tool};
use fleet_core::clock::now_ms;
use fleet_core::control::Target;
use fleet_core::entity::validate_worker_name;
use fleet_core::ownership::{LeadRef, MAX_SHARED, parse_shares};
use fleet_core::spawn::{Workdir, groups_of, name_for, where_to_work};
use fleet_core::{Entity, ErrorCode, FleetError, Gid, Role, WorkerStatus};
use fleet_store::EntityRecord;
use tokio_util::sync::CancellationToken;

use super::session::PaneSession;
use super::start_dialogs::start_dialog_note;
use super::views::SpawnResult;
use super::{Caller, LocalPlane};
use crate::config::ProfileConfig;

/// What `fleet_spawn` asks for.
#[derive(Clone, Debug, Default)]
pub struct SpawnRequest {
    /// The profile.
    pub profile: String,
    /// A name; `<profile>-<n>` when absent.
    pub name: Option<String>,
    /// The host to spawn on; this one when absent.
    pub host: Option<String>,
    /// The working directory; the profile's when absent.
    pub cwd: Option<PathBuf>,
    /// Extra broadcast groups.
    pub groups: Vec<String>,
    /// What it is: a worker, or (started by `fleet_consult`) an advisory architect.
    pub role: Role,
    /// The leads it is shared with, besides its owner.
    pub share: Vec<LeadRef>,
}

/// Closes the pane and ends the session of a spawn that did not finish (an error, a cancelled
/// call), so no half-spawned worker is left behind.
struct SpawnGuard {
    gateway: Arc<LocalPlane>,
    gid: Gid,
    armed: bool,
}

impl Drop for SpawnGuard {
    fn drop(&mut self) {
        if self.armed {
            let gateway = Arc::clone(&self.gateway);
            let gid = self.gid;
            self.gateway.tasks.spawn(async move {
                gateway
                    .end_session(gid, "its spawn did not complete", true)
                    .await;
            });
        }
    }
}

impl LocalPlane {
    /// The local side of [`Gateway::spawn`].
    pub(super) async fn spawn(
        self: &Arc<Self>,
        caller: &Caller,
        request: SpawnRequest,
        ct: &CancellationToken,
    ) -> Result<SpawnResult, FleetError> {
        check_tool(&caller.entity, Tool::Spawn)?;
        let mut request = request;
        // An architect is its lead's adviser, for its consults: never shared.
        request.share = match request.role {
            Role::Architect => Vec::new(),
            _ => self.shares_of(caller, request.share)?,
        };
        let requested = request.host.as_deref().filter(|h| *h != self.host_id);
        if let Some(host) = requested
            && self.afar.as_deref().is_none()
        {
            return Err(FleetError::invalid(format!(
                "host '{host}' is not reachable: this gateway has no broker, so it spawns only on '{}'",
                self.host_id
            )));
        }
        if let Some(afar) = self.afar.as_deref()
            && let Target::There(host) = afar.spawn_target(self, requested)?
        {
            return afar.spawn(self, caller, request, &host, ct).await;
        }
        self.spawn_here(&caller.entity, request, Gid::mint(), ct)
            .await
    }

    /// The leads a worker `caller` spawns is shared with: those it names, then its own
    /// `[leads.NAME] share` default; never itself.
    fn shares_of(&self, caller: &Caller, named: Vec<LeadRef>) -> Result<Vec<LeadRef>, FleetError> {
        let default = self
            .config
            .leads
            .get(&caller.entity.name)
            .map(|l| l.share.as_slice())
            .unwrap_or_default();
        let mut leads = parse_shares(default.iter().map(String::as_str), &self.host_id)?;
        for lead in named {
            if !leads.contains(&lead) {
                leads.insert(0, lead);
            }
        }
        leads.retain(|l| !l.is(&caller.entity));
        // A lead of this host must be one: a name mistyped would share with nobody, silently.
        let here: Vec<String> = self
            .sessions
            .lock()
            .leads
            .values()
            .map(|l| l.entity().name.clone())
            .collect();
        if let Some(unknown) = leads
            .iter()
            .find(|l| l.host == self.host_id && !here.contains(&l.name))
        {
            let mut known = here;
            known.sort();
            return Err(FleetError::invalid(format!(
                "share names '{}', no lead of this host (its leads: {}); a lead of another host is name@host",
                unknown.name,
                known.join(", ")
            )));
        }
        if leads.len() > MAX_SHARED {
            return Err(FleetError::invalid(format!(
                "a worker may be shared with {MAX_SHARED} leads at most, not {}",
                leads.len()
            )));
        }
        Ok(leads)
    }

    /// Starts worker `gid` here for lead `parent` (of this host or, through the control plane,
    /// of another), and returns once it is ready.
    pub(super) async fn spawn_here(
        self: &Arc<Self>,
        parent: &Entity,
        request: SpawnRequest,
        gid: Gid,
        ct: &CancellationToken,
    ) -> Result<SpawnResult, FleetError> {
        let profile = Arc::new(self.profile_named(&request.profile)?);
        if let Some(name) = &request.name {
            validate_worker_name(name)?;
        }
        let groups = groups_of(&profile.groups, request.groups.clone())?;
        let cwd = self
            .spawn_cwd(request.cwd.clone(), &profile, parent)
            .await?;
        // Reserve the name and the session in one step, so parallel spawns never pick the same
        // name; from here on the guard undoes everything if the spawn does not complete.
        let entity = self.reserve(parent, &request, gid, groups, (&profile, &cwd))?;
        let mut guard = SpawnGuard {
            gateway: Arc::clone(self),
            gid,
            armed: true,
        };
        let name = entity.name.clone();
        let record = EntityRecord {
            entity,
            status: WorkerStatus::Spawning,
            pane: None,
            created_ms: now_ms(),
        };
        self.db.run(move |s| s.insert_entity(&record)).await?;
        tracing::info!(%gid, %name, profile = %profile.name, "spawning");
        let cwd = self.workspace_of(gid, &name, &profile, cwd).await?;
        let pane = self.open_pane(gid, &name, &profile, cwd).await?;
        self.start_pump(gid);

        let blocked = self.await_ready(gid, &pane, &profile, ct).await?;
        guard.armed = false;
        let status = match &blocked {
            // Its owner answers the dialog; the start goes on meanwhile, on its own.
            Some(dialog) => {
                // Handed out with this answer, unless nobody will read it.
                if !ct.is_cancelled() {
                    self.hand_out_start_dialog(gid, dialog);
                }
                self.start_on_later(gid, pane.clone(), Arc::clone(&profile));
                WorkerStatus::Blocked
            }
            None => {
                if let Some(afar) = self.afar.as_deref() {
                    afar.joined(self, gid).await;
                }
                WorkerStatus::Idle
            }
        };
        Ok(SpawnResult {
            gid,
            name,
            host: self.host_id.clone(),
            pane: pane.0,
            profile: profile.name.clone(),
            status,
            note: blocked.as_ref().map(start_dialog_note),
            dialog: blocked,
        })
    }

    /// The profile called `name`; the error names those there are.
    fn profile_named(&self, name: &str) -> Result<ProfileConfig, FleetError> {
        self.config.profile(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = self
                .config
                .profiles
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            FleetError::new(
                ErrorCode::UnknownProfile,
                format!(
                    "no profile is named '{name}' (configured: {})",
                    known.join(", ")
                ),
            )
        })
    }

    /// The directory a spawn of `profile` for `parent` works in ([`where_to_work`]), resolved
    /// and checked on disk (off the async threads: a mount that hangs holds up none).
    async fn spawn_cwd(
        &self,
        given: Option<PathBuf>,
        profile: &ProfileConfig,
        parent: &Entity,
    ) -> Result<PathBuf, FleetError> {
        let workdir = where_to_work(
            given,
            profile.cwd.clone(),
            self.workdirs.roots(),
            parent.host != self.host_id,
        );
        let from = workdir.source(&profile.name);
        let requested = match workdir {
            Workdir::Given(dir) | Workdir::Profiles(dir) | Workdir::FirstRoot(dir) => dir,
            Workdir::Fleetds => std::env::current_dir().map_err(|e| {
                FleetError::internal(format!("fleetd has no working directory: {e}"))
            })?,
            Workdir::NoneForAnotherHost => {
                return Err(FleetError::forbidden(format!(
                    "host '{}' starts no worker for a lead of another host outside its [gateway] workdir_roots, and has none",
                    self.host_id
                )));
            }
        };
        let (workdirs, host) = (Arc::clone(&self.workdirs), self.host_id.clone());
        self.cwd_lane
            .run(move || workdirs.resolve(&requested, &host))
            .await
            .map_err(|lost| FleetError::internal(format!("cannot resolve the cwd: {lost}")))?
            .map_err(|mut e| {
                if let Some(from) = &from {
                    e.message = format!(
                        "{} (the cwd is {from}: give fleet_spawn a cwd, or set the profile's)",
                        e.message
                    );
                }
                e
            })
    }

    /// Takes the name and the session of new worker `gid` in one step under the lock: its
    /// name ([`name_for`]) and a spawning session of `profile` in `cwd`, owned by `parent`. Its
    /// entity keeps the sandbox and the role `profile` gives it now, for its life.
    fn reserve(
        &self,
        parent: &Entity,
        request: &SpawnRequest,
        gid: Gid,
        groups: Vec<String>,
        (profile, cwd): (&Arc<ProfileConfig>, &std::path::Path),
    ) -> Result<Entity, FleetError> {
        let mut sessions = self.sessions.lock();
        // A spawn asked for twice (a control request delivered again) spawns once.
        if sessions.panes.contains_key(&gid) {
            return Err(FleetError::invalid(format!(
                "worker {gid} was spawned here already"
            )));
        }
        let name = name_for(
            request.name.clone(),
            &profile.name,
            &sessions.entities(),
            |gid| sessions.panes.get(&gid).map(PaneSession::status),
        )?;
        let entity = Entity {
            gid,
            name,
            host: self.host_id.clone(),
            role: request.role,
            profile: Some(profile.name.clone()),
            sandbox: profile.sandbox(),
            profile_role: profile.role.clone(),
            groups,
            parent: Some(parent.gid),
        };
        let session = PaneSession::spawning(
            entity.clone(),
            Arc::clone(profile),
            cwd.to_path_buf(),
            LeadRef {
                name: parent.name.clone(),
                host: parent.host.clone(),
            },
            request.share.clone(),
        );
        sessions.add_session(session);
        Ok(entity)
    }

    /// Where worker `gid` runs: its own workspace when its profile makes one (it runs there,
    /// recycled or not), else `cwd`.
    async fn workspace_of(
        &self,
        gid: Gid,
        name: &str,
        profile: &ProfileConfig,
        cwd: PathBuf,
    ) -> Result<PathBuf, FleetError> {
        match self
            .launchers
            .workspaces
            .make(profile, gid, name, &cwd)
            .await
        {
            Ok(Some(dir)) => {
                let spawning = self
                    .sessions
                    .lock()
                    .panes
                    .get_mut(&gid)
                    .is_some_and(|session| session.work_in(&dir));
                if !spawning {
                    // Stopped while its workspace was being made: that was left to us.
                    self.launchers.workspaces.end(gid).await;
                    return Err(FleetError::new(
                        ErrorCode::NotReady,
                        format!("'{name}' was stopped while its workspace was being made"),
                    ));
                }
                Ok(dir)
            }
            Ok(None) => Ok(cwd),
            Err(why) => Err(FleetError::new(
                ErrorCode::NotReady,
                format!(
                    "cannot make the workspace of '{name}' (profile '{}'): {why}",
                    profile.name
                ),
            )),
        }
    }
}
