//! `fleet_consult`: a lead's brief to its advisory architects (DESIGN §1, CB-500 U6/U7).
//!
//! Every slot's architect is started afresh (a session of its own, no shared context), all of
//! them get the byte-identical brief at the same moment once all are ready, and the call
//! waits for every answer up to its wait, telling the client as each one comes. Each slot is
//! reported on its own: one that fails, crashes or runs out of time does not hide the others'
//! answers. An architect's `fleet_ask` surfaces on the call as a worker's does on a send.
//! Afterwards each architect is stopped once it answered (or kept `keep_s` after its last
//! answer, for follow-ups by name, which it pulls: see `delivery`); one still working may
//! answer late (held for `fleet_poll`) within another wait.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::authz::{Tool, check_tool};
use fleet_core::message::check_size;
use fleet_core::typed::typeable;
use fleet_core::{ErrorCode, FleetError, Gid, Role};
use futures_util::FutureExt;
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::spawn::SpawnRequest;
use super::views::{AskView, DialogView, SendResult, SpawnResult};
use super::{Caller, LocalPlane};
use crate::config::{SlotConfig, model_identity};

/// How long a consult waits for its answers when not told (and an architect taken back by a
/// restart, still on its brief, has to answer).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(600);

mod keep;
mod slots;

use slots::{chosen, own_profile, slot_family};

/// What `fleet_consult` asks for.
#[derive(Clone, Debug)]
pub struct ConsultRequest {
    /// The brief, typed byte for byte into every architect.
    pub brief: String,
    /// How long to wait for the answers.
    pub wait: Duration,
    /// The slots to consult, by name; every configured one when absent.
    pub slots: Option<Vec<String>>,
}

/// How one slot's consultation went.
#[derive(Clone, Debug, Serialize)]
pub struct SlotAnswer {
    /// The slot, which its architect is named after.
    pub architect: String,
    /// The architect's gid, once started.
    pub gid: Option<Gid>,
    /// Its profile.
    pub profile: String,
    /// The model it runs, as far as this gateway can tell.
    pub model: Option<String>,
    /// Its model family, by its maker's lowercase id (`anthropic`, `openai` …; see
    /// [`crate::config::family`]), so a lead weighs agreement knowing whose models agree: this
    /// host's reading of its own profile, or what the slot's host named in its presence; none
    /// when neither can tell (a program fleetd cannot see into, a host not heard, or older).
    pub family: Option<String>,
    /// Its host.
    pub host: String,
    /// `answered`, `failed`, `timeout`, `asking` (its question is in `asks`), `blocked` (its
    /// program stopped on a dialog: `text` says which and how to answer) or `working` (the call
    /// returned for another's question first).
    pub status: &'static str,
    /// Its answer, or why there is none.
    pub text: String,
    /// Milliseconds from the brief to the answer (or to giving up).
    pub ms: u64,
}

/// The answer to `fleet_consult`.
#[derive(Clone, Debug, Serialize)]
pub struct ConsultResult {
    /// One entry per slot, in the configured order.
    pub answers: Vec<SlotAnswer>,
    /// Questions an architect asks you now: answer each with `fleet_send{turn_id, message}`.
    pub asks: Vec<AskView>,
    /// What happens next.
    pub note: String,
}

/// What a consult holds while it runs: its slots (no other consult may use them meanwhile) and
/// the architects it started. Dropped before it hands those over to be retired (its client went
/// away, say), it stops them: none is left running for nobody.
struct ConsultGuard {
    gateway: Arc<LocalPlane>,
    caller: Caller,
    slots: Vec<String>,
    started: std::sync::Mutex<Vec<Gid>>,
}

impl ConsultGuard {
    /// Claims `slots` for a consult of `caller`'s, or says which one another consult uses.
    fn claim(
        gateway: &Arc<LocalPlane>,
        caller: &Caller,
        slots: &[&SlotConfig],
    ) -> Result<Self, FleetError> {
        let mut sessions = gateway.sessions.lock();
        if let Some(busy) = slots.iter().find(|s| sessions.consulting.contains(&s.name)) {
            return Err(FleetError::new(
                ErrorCode::TooMany,
                format!(
                    "architect slot '{}' is in another consult now: wait for it to end, or consult the other slots (slots)",
                    busy.name
                ),
            ));
        }
        let names: Vec<String> = slots.iter().map(|s| s.name.clone()).collect();
        sessions.consulting.extend(names.iter().cloned());
        Ok(ConsultGuard {
            gateway: Arc::clone(gateway),
            caller: caller.clone(),
            slots: names,
            started: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Notes an architect started.
    fn started(&self, gid: Gid) {
        if let Ok(mut started) = self.started.lock() {
            started.push(gid);
        }
    }

    /// Hands the architects over to be retired as each is done: the guard stops none.
    fn hand_over(&self) {
        if let Ok(mut started) = self.started.lock() {
            started.clear();
        }
    }
}

impl Drop for ConsultGuard {
    fn drop(&mut self) {
        {
            let mut sessions = self.gateway.sessions.lock();
            for slot in &self.slots {
                sessions.consulting.remove(slot);
            }
        }
        let started = self
            .started
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        if started.is_empty() {
            return;
        }
        let (gateway, caller) = (Arc::clone(&self.gateway), self.caller.clone());
        self.gateway.tasks.spawn(async move {
            for gid in started {
                tracing::info!(%gid, "a consult ended before its answers: its architect is stopped");
                let _ = gateway.stop(&caller, &gid.to_string()).await;
            }
        });
    }
}

/// How a slot's answer reads when the send to its architect ended as `sent`.
fn outcome(sent: Result<SendResult, FleetError>) -> (&'static str, String, Option<AskView>) {
    match sent {
        Ok(SendResult::Replied { reply, .. }) => ("answered", reply.text, None),
        Ok(SendResult::Failed { reason, .. }) => ("failed", reason, None),
        Ok(SendResult::Asked { ask, .. }) => (
            "asking",
            format!("it asks you: {} (turn_id {})", ask.question, ask.turn_id),
            Some(ask),
        ),
        Ok(SendResult::Blocked { dialog, .. }) => (
            "blocked",
            format!(
                "its program stopped on a dialog: {} (answer with fleet_send{{turn_id: \"{}\", choice}}, choice one of {})",
                dialog.prompt,
                dialog.turn_id,
                dialog
                    .choices
                    .iter()
                    .map(|c| c.choice.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None,
        ),
        Ok(SendResult::Pending { state, .. }) => (
            "timeout",
            format!(
                "no answer in time (its brief is {state}); a later answer is held for fleet_poll"
            ),
            None,
        ),
        Ok(SendResult::Answered { .. }) => ("failed", "no answer".into(), None),
        Err(e) => ("failed", e.to_string(), None),
    }
}

/// How a slot's answer reads: its status, text, ms after the brief `briefed` and the question
/// its architect asks, if it asks; from how its spawn and its send (and when) ended.
fn slot_outcome(
    spawned: Result<&SpawnResult, &FleetError>,
    sent: Option<Sent>,
    briefed: Instant,
) -> (&'static str, String, u64, Option<AskView>) {
    match (spawned, sent) {
        (Err(e), _) => ("failed", format!("it did not start: {e}"), 0, None),
        (
            Ok(SpawnResult {
                dialog: Some(dialog),
                ..
            }),
            _,
        ) => ("blocked", blocked_at_start(dialog), 0, None),
        (Ok(_), Some((sent, ms))) => {
            let (status, text, ask) = outcome(sent);
            (status, text, ms, ask)
        }
        (Ok(_), None) => (
            "working",
            "still working on the brief: its answer will be held for fleet_poll".into(),
            millis_since(briefed),
            None,
        ),
    }
}

/// How a slot's answer reads when its architect stopped on `dialog` while starting.
fn blocked_at_start(dialog: &DialogView) -> String {
    format!(
        "its program stopped on a dialog while starting: {} (answer with fleet_send{{turn_id: \"{}\", choice}}, choice one of {}); its brief waits for it, and its answer will be held for fleet_poll",
        dialog.prompt,
        dialog.turn_id,
        dialog.choices_in_words()
    )
}

impl LocalPlane {
    /// The local side of [`Gateway::consult`].
    pub(super) async fn consult(
        self: &Arc<Self>,
        caller: &Caller,
        request: ConsultRequest,
        progress: UnboundedSender<String>,
        ct: &CancellationToken,
    ) -> Result<ConsultResult, FleetError> {
        check_tool(&caller.entity, Tool::Consult)?;
        let slots = chosen(&self.config.architects.slots, request.slots.as_deref())?;
        check_size(&request.brief, self.config.gateway.max_message_bytes)?;
        typeable(&request.brief).map_err(|found| found.refusal())?;
        let deadline = Instant::now() + request.wait;
        let guard = ConsultGuard::claim(self, caller, &slots)?;
        // Each slot afresh: one of the caller's still kept from an earlier consult goes first.
        let started = join_all(slots.iter().map(|slot| async {
            self.retire_slot(caller, slot).await;
            let spawned = self.spawn(caller, self.slot_request(slot), ct).await;
            if let Ok(s) = &spawned {
                guard.started(s.gid);
                let _ = progress.send(match s.dialog {
                    Some(_) => format!("{} stopped on a dialog while starting", s.name),
                    None => format!("{} is ready", s.name),
                });
            }
            spawned
        }))
        .await;
        // The same brief to every architect that started, at the same moment.
        let briefed = Instant::now();
        let brief = Brief {
            text: &request.brief,
            at: briefed,
            wait: deadline.saturating_duration_since(briefed),
        };
        let sent = self.brief_all(caller, &started, brief, &progress, ct).await;
        // A call its client gave up on stops what it started (the guard, dropped here).
        if ct.is_cancelled() {
            return Err(FleetError::new(
                ErrorCode::Cancelled,
                "the consult was cancelled: its architects are stopped",
            ));
        }
        guard.hand_over();
        let mut answers = Vec::with_capacity(slots.len());
        let mut asks = Vec::new();
        for ((slot, spawned), sent) in slots.iter().zip(started).zip(sent) {
            let (status, text, ms, ask) = slot_outcome(spawned.as_ref(), sent, briefed);
            asks.extend(ask);
            let gid = spawned.as_ref().ok().map(|s| s.gid);
            if let Some(gid) = gid {
                let done = status == "answered" || status == "failed";
                self.retire_later(caller, slot, gid, done, request.wait);
            }
            answers.push(self.slot_answer(slot, gid, status, text, ms));
        }
        let note = if asks.is_empty() {
            "each architect is stopped once it answered (or kept keep_s for a follow-up by name); one still working may answer late: that answer is held for fleet_poll".to_string()
        } else {
            "an architect asks you something: answer with fleet_send{turn_id, message}, which then waits for that architect's answer; the others' answers are above or held for fleet_poll".to_string()
        };
        Ok(ConsultResult {
            answers,
            asks,
            note,
        })
    }

    /// Sends `brief` to every architect that `started`, and waits for them to answer, each
    /// reported on `progress` as it does; an architect's question ends the wait, as it ends a
    /// send's. For each slot: how its send ended and when (ms after the brief), or `None` if it
    /// had not ended.
    async fn brief_all(
        self: &Arc<Self>,
        caller: &Caller,
        started: &[Result<SpawnResult, FleetError>],
        brief: Brief<'_>,
        progress: &UnboundedSender<String>,
        ct: &CancellationToken,
    ) -> Vec<Option<Sent>> {
        let mut sends: FuturesUnordered<_> = started
            .iter()
            .enumerate()
            .filter_map(|(i, spawned)| {
                let spawned = spawned.as_ref().ok()?;
                let text = brief.text.to_string();
                // One blocked on a dialog of its start gets its brief once it is ready: the
                // consult does not wait for it.
                let wait = match spawned.dialog {
                    Some(_) => Duration::ZERO,
                    None => brief.wait,
                };
                Some(async move {
                    let sent = self
                        .send(caller, &spawned.gid.to_string(), text, wait, ct)
                        .await;
                    (i, &spawned.name, sent, millis_since(brief.at))
                })
            })
            .collect();
        let mut sent: Vec<Option<Sent>> = started.iter().map(|_| None).collect();
        while let Some((i, name, outcome, ms)) = sends.next().await {
            let _ = progress.send(format!("{name} {}", outcome_word(&outcome)));
            let asked = matches!(outcome, Ok(SendResult::Asked { .. }));
            if let Some(place) = sent.get_mut(i) {
                *place = Some((outcome, ms));
            }
            if asked {
                // Those that ended meanwhile are reported as they ended.
                while let Some(Some((i, _, outcome, ms))) = sends.next().now_or_never() {
                    if let Some(place) = sent.get_mut(i) {
                        *place = Some((outcome, ms));
                    }
                }
                break;
            }
        }
        sent
    }

    /// What the consult reports of `slot`.
    fn slot_answer(
        &self,
        slot: &SlotConfig,
        gid: Option<Gid>,
        status: &'static str,
        text: String,
        ms: u64,
    ) -> SlotAnswer {
        let profile = own_profile(&self.config.profiles, slot, &self.host_id);
        SlotAnswer {
            architect: slot.name.clone(),
            gid,
            profile: slot.profile.clone(),
            model: profile.map(model_identity),
            // The roster is read only for a slot on another host.
            family: slot_family(
                slot,
                profile,
                &if profile.is_none() && slot.host.is_some() {
                    self.fleet_view().1
                } else {
                    Vec::new()
                },
            ),
            host: slot.host.clone().unwrap_or_else(|| self.host_id.clone()),
            status,
            text,
            ms,
        }
    }

    /// What starts `slot`'s architect.
    fn slot_request(&self, slot: &SlotConfig) -> SpawnRequest {
        SpawnRequest {
            profile: slot.profile.clone(),
            name: Some(slot.name.clone()),
            host: slot.host.clone(),
            cwd: None,
            groups: Vec::new(),
            role: Role::Architect,
            share: Vec::new(),
        }
    }
}

/// How an architect's send ended, and when (ms after the brief).
type Sent = (Result<SendResult, FleetError>, u64);

/// The brief as it goes to every architect: its text, the moment it goes, and how long each
/// send waits.
#[derive(Clone, Copy)]
struct Brief<'a> {
    text: &'a str,
    at: Instant,
    wait: Duration,
}

/// Milliseconds since `at`.
fn millis_since(at: Instant) -> u64 {
    u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One word for how a send to an architect ended, for a progress line.
fn outcome_word(sent: &Result<SendResult, FleetError>) -> &'static str {
    match sent {
        Ok(SendResult::Replied { .. }) => "answered",
        Ok(SendResult::Asked { .. }) => "asks you something",
        Ok(SendResult::Pending { .. }) => "ran out of time",
        _ => "failed",
    }
}
