//! A restart settles what the previous run was typing when it stopped: the tasks it left
//! `injecting` for a worker it takes back. Without the note that their keys went in
//! (`Store::keys_sent`), none did: back on the queue. With it (and the note of their Enter,
//! `Store::enter_sent`), the worker's pane decides
//! ([`fleet_mux::interrupted::what_became_of`]): taken, pasted (Enter), never arrived (back on
//! the queue), or unknown (failed, never typed twice).

use fleet_core::{FleetError, Gid, Message, MsgId, MsgState};
use fleet_mux::inject::{InjectOutcome, Settle, hold_still, submit};
use fleet_mux::interrupted::{Interrupted, Interruption, Stage, what_became_of};
use fleet_store::MessageFilter;
use std::time::Duration;
use tokio::sync::watch;

use super::LocalPlane;
use super::adoption::Identified;
use super::typing::{inject_options, typed_text};

/// How the screen of a worker taken back must settle before fleetd reads off it what became
/// of the task it was typing (keys typed just before the stop may still be arriving).
const SETTLE_BEFORE_LOOK: Settle = Settle {
    still: Duration::from_millis(150),
    limit: Duration::from_secs(2),
};
/// How many lines of a worker's output are searched for the task fleetd was typing.
const HISTORY_LINES: usize = 2_000;
/// How many of a worker's earlier tasks are compared with the one fleetd was typing.
const EARLIER_TASKS: usize = 100;
/// The most tasks settled for one worker at a restart: a run types one task at a time into a
/// worker, so one is all a stop leaves `injecting` (the rest fail as interrupted).
const MAX_TYPING: usize = 8;

/// What became of a task the previous run was typing into a session taken back.
pub(super) enum Settled {
    /// It is the session's task in flight.
    Typed(Message),
    /// It is back at the head of its queue.
    PutBack,
    /// Nobody can tell: it fails, for this reason.
    Unsure(Message, String),
}

impl LocalPlane {
    /// Settles the tasks the previous run left `injecting` for `gid` (taken back as `taken`):
    /// the one it was typing (more, should a store hold more), oldest first.
    pub(super) async fn settle_typing(
        &self,
        gid: Gid,
        taken: &Identified,
    ) -> Result<Vec<Settled>, FleetError> {
        let typing = MessageFilter {
            state: Some(MsgState::Injecting.name().to_string()),
            to: Some(gid),
            limit: MAX_TYPING,
            ..MessageFilter::default()
        };
        let mut tasks = self.db.run(move |s| s.messages(&typing)).await?;
        let keys_sent = self.db.run(move |s| s.keys_sent_to(gid)).await?;
        // Oldest first, as they were taken.
        tasks.reverse();
        let mut settled = Vec::with_capacity(tasks.len());
        for task in tasks {
            let noted = keys_sent.iter().find(|(id, _)| *id == task.msg_id);
            let verdict = if let Some((_, entered)) = noted {
                let stage = if *entered {
                    Stage::Entered
                } else {
                    Stage::Pasted
                };
                self.settle_one(gid, taken, task, stage).await?
            } else {
                // No key of it went in: it was never typed, whatever the pane shows.
                tracing::info!(trace_id = %task.trace_id, msg_id = %task.msg_id, %gid, verdict = ?Interrupted::NotTyped, "a task the previous run was typing when it stopped: none of its keys went in");
                self.put_back(task).await?
            };
            settled.push(verdict);
        }
        Ok(settled)
    }

    /// Settles `task`, left `injecting` for `gid` with its typing noted as far as `stage`, from
    /// what its pane shows ([`what_became_of`]): one its worker took is typed (and so its task
    /// in flight); one pasted but not submitted gets its Enter; one whose paste never arrived
    /// goes back to its queue; one the pane cannot tell about is failed by the start-up, never
    /// typed again.
    async fn settle_one(
        &self,
        gid: Gid,
        taken: &Identified,
        task: Message,
        stage: Stage,
    ) -> Result<Settled, FleetError> {
        let (msg_id, trace_id) = (task.msg_id, task.trace_id);
        let profile = &taken.profile;
        let typed = match typed_text(&task, &self.name_of(task.from).await, profile) {
            Ok(typed) => typed,
            // Refused before any key went in: the pump will refuse it again, and say why.
            Err(_) => return self.put_back(task).await,
        };
        let earlier = self.typed_before(gid, msg_id, taken).await?;
        let options = inject_options(profile, false);
        let pane = &taken.pane;
        let host = self.panes.as_ref();
        let seen = async {
            hold_still(host, pane, SETTLE_BEFORE_LOOK).await?;
            let screen = host.snapshot(pane).await?;
            let history = host.history(pane, HISTORY_LINES).await?;
            Ok::<_, fleet_mux::MuxError>((screen, history))
        };
        let (screen, history) = match seen.await {
            Ok(seen) => seen,
            Err(e) => {
                let why = format!("its pane could not be read: {}", crate::logs::mux_error(&e));
                return Ok(Settled::Unsure(task, why));
            }
        };
        let verdict = what_became_of(&Interruption {
            typed: &typed,
            stage,
            screen: &screen,
            history: &history,
            marker: options.submitted_marker.as_deref(),
            earlier: &earlier,
        });
        tracing::info!(%trace_id, %msg_id, %gid, ?verdict, "a task the previous run was typing when it stopped, as its worker's pane shows it");
        let settled = match verdict {
            Interrupted::Submitted => self.typed(task).await?,
            Interrupted::InInput => {
                // Nothing calls in before the listener serves: only the screen can tell.
                let (_calls, mut activity) = watch::channel(0u64);
                let submitted = async {
                    let mut screen = screen;
                    if screen.in_mode {
                        // A mode (tmux's copy mode) would eat the Enter.
                        host.leave_mode(pane).await?;
                        screen = host.snapshot(pane).await?;
                    }
                    submit(host, pane, screen, &options, &mut activity).await
                };
                match submitted.await {
                    Ok(InjectOutcome::Submitted { .. }) => self.typed(task).await?,
                    Ok(_) => Settled::Unsure(
                        task,
                        "it was found pasted in the input box, and Enter did not submit it".into(),
                    ),
                    Err(e) => Settled::Unsure(
                        task,
                        format!("its pane host failed: {}", crate::logs::mux_error(&e)),
                    ),
                }
            }
            Interrupted::NotTyped => self.put_back(task).await?,
            Interrupted::Unsure(why) => Settled::Unsure(task, why.to_string()),
        };
        Ok(settled)
    }

    /// Records `task` typed: its worker took it.
    async fn typed(&self, task: Message) -> Result<Settled, FleetError> {
        let msg_id = task.msg_id;
        self.db
            .run(move |s| s.transition(msg_id, &MsgState::Injected))
            .await?;
        Ok(Settled::Typed(task))
    }

    /// Puts `task`, never typed, back at the head of its queue.
    async fn put_back(&self, task: Message) -> Result<Settled, FleetError> {
        let msg_id = task.msg_id;
        self.db.run(move |s| s.put_back_untyped(msg_id)).await?;
        Ok(Settled::PutBack)
    }

    /// The texts typed into `gid` (taken back as `taken`) before `msg_id`, the newest
    /// [`EARLIER_TASKS`].
    async fn typed_before(
        &self,
        gid: Gid,
        msg_id: MsgId,
        taken: &Identified,
    ) -> Result<Vec<String>, FleetError> {
        let filter = MessageFilter {
            state: Some(MsgState::Injected.name().to_string()),
            to: Some(gid),
            limit: EARLIER_TASKS,
            ..MessageFilter::default()
        };
        let mut earlier = Vec::new();
        for message in self.db.run(move |s| s.messages(&filter)).await? {
            if message.msg_id == msg_id {
                continue;
            }
            let from = self.name_of(message.from).await;
            earlier.extend(typed_text(&message, &from, &taken.profile).ok());
        }
        Ok(earlier)
    }
}
