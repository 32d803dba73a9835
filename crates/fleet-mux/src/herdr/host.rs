//! [`PaneHost`] on herdr: the fleet's panes live in one workspace of their own (made on the
//! first spawn), one tab per pane, each pane labelled `<workspace label>:<name>` so fleetd
//! knows its own panes from the user's. herdr's agent detection is passed on; for programs it
//! does not recognise, fleetd reports its own session state (source `fleetd`), so herdr's
//! sidebar shows what fleetd knows.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use fleet_core::dialog::Key;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::codec::{self, Event, Source};
use super::driver::Driver;
use crate::{AgentState, MuxError, PaneHost, PaneId, PaneLife, PaneSpec, PaneState, Snapshot};

/// The source and agent name fleetd reports under; panes showing this agent are reported by
/// fleetd itself, not recognised by herdr.
pub const REPORTER: &str = "fleetd";
/// How many exited panes are remembered (a vanished pane among them read as exited).
const EXITED_KEPT: usize = 256;
/// Room for events not yet taken in; herdr rate-limits them, so a small buffer keeps up.
const EVENT_BUFFER: usize = 256;

/// herdr as the fleet's pane host.
pub struct Herdr {
    /// The socket client.
    driver: Arc<Driver>,
    /// The workspace's label, and the prefix of every fleet pane's label.
    label: String,
    /// The fleet's workspace, once made, and the shell pane herdr started in it.
    workspace: tokio::sync::Mutex<Option<(String, Option<String>)>>,
    /// Panes herdr reported exited: their panes vanish, so this tells an exit from a close.
    exited: Arc<Mutex<VecDeque<String>>>,
    /// The tasks following herdr's events; stopped with the host.
    followers: Vec<JoinHandle<()>>,
}

impl Drop for Herdr {
    fn drop(&mut self) {
        for follower in &self.followers {
            follower.abort();
        }
    }
}

impl Herdr {
    /// Connects to the herdr server at `socket` (checking its protocol) and starts following
    /// its events. `label` names the fleet's workspace and prefixes its panes' labels.
    pub async fn connect(socket: &Path, label: &str) -> Result<Self, MuxError> {
        let driver = Arc::new(Driver::new(socket.to_path_buf()));
        let (version, protocol) = driver.check().await?;
        tracing::info!(socket = %socket.display(), version, protocol, "herdr reached");
        let exited = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, mut rx) = mpsc::channel(EVENT_BUFFER);
        let follower = {
            let driver = Arc::clone(&driver);
            tokio::spawn(async move { driver.follow(tx).await })
        };
        let recorder = {
            let exited = Arc::clone(&exited);
            tokio::spawn(async move {
                while let Some(event) = rx.recv().await {
                    match event {
                        Event::PaneExited(pane) => {
                            let mut exited = lock(&exited);
                            exited.push_back(pane);
                            if exited.len() > EXITED_KEPT {
                                exited.pop_front();
                            }
                        }
                        Event::Started => tracing::debug!("following herdr's events"),
                        _ => {}
                    }
                }
            })
        };
        Ok(Self {
            driver,
            label: label.to_string(),
            workspace: tokio::sync::Mutex::new(None),
            exited,
            followers: vec![follower, recorder],
        })
    }

    fn pane_label(&self, name: &str) -> String {
        format!("{}:{name}", self.label)
    }

    fn is_ours(&self, label: Option<&str>) -> bool {
        label.is_some_and(|l| l.starts_with(&format!("{}:", self.label)))
    }

    /// The fleet's workspace, made on first use (or again, when `stale` is the one herdr lost).
    async fn workspace(&self, cwd: &Path, stale: Option<&str>) -> Result<String, MuxError> {
        let mut workspace = self.workspace.lock().await;
        if stale.is_some() && workspace.as_ref().map(|(id, _)| id.as_str()) == stale {
            *workspace = None;
        }
        if let Some((id, _)) = workspace.as_ref() {
            return Ok(id.clone());
        }
        let result = self
            .driver
            .call(codec::workspace_create(&self.label, cwd))
            .await?;
        let id = codec::created_workspace(&result).map_err(|e| protocol("workspace.create", e))?;
        *workspace = Some((id.clone(), codec::created_root_pane(&result)));
        Ok(id)
    }

    /// Closes the shell pane herdr started in the fleet's workspace (the fleet's own panes are
    /// closed with their sessions), so the workspace goes with the gateway.
    pub async fn close_workspace(&self) -> Result<(), MuxError> {
        let root = self
            .workspace
            .lock()
            .await
            .take()
            .and_then(|(_, root)| root);
        match root {
            Some(pane) => self.close(&PaneId(pane)).await,
            None => Ok(()),
        }
    }

    /// The herdr server's socket.
    pub fn socket(&self) -> &Path {
        self.driver.socket()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn protocol(command: &str, e: codec::CodecError) -> MuxError {
    MuxError::Protocol {
        command: command.into(),
        answer: e.to_string(),
    }
}

#[async_trait]
impl PaneHost for Herdr {
    async fn spawn(&self, spec: &PaneSpec) -> Result<PaneId, MuxError> {
        let label = self.pane_label(&spec.label);
        let mut workspace = self.workspace(&spec.cwd, None).await?;
        let request = |workspace: &str| {
            codec::layout_apply(workspace, &label, &spec.argv, &spec.env, &spec.cwd)
        };
        let result = match self.driver.call(request(&workspace)).await {
            Ok(result) => result,
            // herdr restarted and lost the workspace: make it again, once.
            Err(MuxError::Command { stderr, .. })
                if stderr.starts_with(codec::WORKSPACE_NOT_FOUND) =>
            {
                workspace = self.workspace(&spec.cwd, Some(&workspace)).await?;
                self.driver.call(request(&workspace)).await?
            }
            Err(e) => return Err(e),
        };
        let panes = codec::applied_panes(&result).map_err(|e| protocol("layout.apply", e))?;
        panes
            .into_iter()
            .next()
            .map(|(_, id)| PaneId(id))
            .ok_or_else(|| MuxError::Protocol {
                command: "layout.apply".into(),
                // Not the answer itself: it echoes the argv, which may carry the token.
                answer: "a layout without a pane".into(),
            })
    }

    async fn leave_mode(&self, _pane: &PaneId) -> Result<(), MuxError> {
        // herdr hands input to the program whatever the pane's scroll: nothing to leave.
        Ok(())
    }

    async fn paste(&self, pane: &PaneId, text: &str) -> Result<(), MuxError> {
        self.driver
            .call(codec::send_input(&pane.0, Some(text), &[]))
            .await
            .map(drop)
    }

    async fn enter(&self, pane: &PaneId) -> Result<(), MuxError> {
        self.press(pane, Key::Enter).await
    }

    async fn press(&self, pane: &PaneId, key: Key) -> Result<(), MuxError> {
        // herdr's key names for the safe set are the keys' own (`1`, `y`, `enter`, `esc`, and
        // the arrows `up`, `down`, `left`, `right`, as herdr 0.8.0 names them).
        self.driver
            .call(codec::send_input(&pane.0, None, &[key.name().as_str()]))
            .await
            .map(drop)
    }

    async fn snapshot(&self, pane: &PaneId) -> Result<Snapshot, MuxError> {
        let result = self
            .driver
            .read(codec::pane_read(&pane.0, Source::Visible))
            .await?;
        let text = codec::read_text(&result).map_err(|e| protocol("pane.read", e))?;
        // herdr tells no cursor position; the screen's text carries every change.
        Ok(Snapshot {
            cursor: None,
            in_mode: false,
            text,
        })
    }

    async fn styled(&self, pane: &PaneId) -> Result<String, MuxError> {
        let result = self.driver.read(codec::pane_read_styled(&pane.0)).await?;
        codec::read_text(&result).map_err(|e| protocol("pane.read", e))
    }

    /// herdr's default read (up to 80 lines), cut to `lines`: asking for more lines makes a
    /// headless herdr read a screen that is not full as empty (see [`codec::pane_read`]).
    async fn history(&self, pane: &PaneId, lines: usize) -> Result<String, MuxError> {
        let result = self
            .driver
            .read(codec::pane_read(&pane.0, Source::RecentUnwrapped))
            .await?;
        let text = codec::read_text(&result).map_err(|e| protocol("pane.read", e))?;
        let kept: Vec<&str> = text.lines().collect();
        Ok(kept[kept.len().saturating_sub(lines)..].join("\n"))
    }

    async fn panes(&self) -> Result<BTreeMap<PaneId, PaneState>, MuxError> {
        let result = self.driver.read(codec::pane_list()).await?;
        let listed = codec::listed_panes(&result).map_err(|e| protocol("pane.list", e))?;
        let mut panes: BTreeMap<PaneId, PaneState> = listed
            .into_iter()
            .filter(|pane| self.is_ours(pane.label.as_deref()))
            .map(|pane| {
                // A state fleetd reported itself is not news to fleetd.
                let agent = pane
                    .agent
                    .filter(|agent| agent != REPORTER)
                    .map(|agent| (agent, pane.agent_state));
                (
                    PaneId(pane.pane_id),
                    PaneState {
                        life: PaneLife::Alive,
                        agent,
                    },
                )
            })
            .collect();
        for pane in lock(&self.exited).iter() {
            panes.entry(PaneId(pane.clone())).or_insert(PaneState {
                life: PaneLife::Exited(None),
                agent: None,
            });
        }
        Ok(panes)
    }

    async fn report(&self, pane: &PaneId, state: AgentState) -> Result<(), MuxError> {
        self.driver
            .call(codec::report_agent(&pane.0, REPORTER, REPORTER, state))
            .await
            .map(drop)
    }

    async fn pid(&self, pane: &PaneId) -> Result<u32, MuxError> {
        let result = self.driver.read(codec::pane_process_info(&pane.0)).await?;
        codec::process_pid(&result).map_err(|e| protocol("pane.process_info", e))
    }

    async fn close(&self, pane: &PaneId) -> Result<(), MuxError> {
        match self.driver.call(codec::pane_close(&pane.0)).await {
            Ok(_) | Err(MuxError::NoPane(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
