//! The live feed of the operator surfaces (`GET /api/v1/events`, `fleetd tail`, the web view)
//! and one message's history: the store's recorded changes, told as a caller may see them,
//! and the statuses the store does not keep (a worker busy with a task, idle again), told live
//! as they happen. A lead sees every entity of this host come and change (the roster shows
//! them all) and the messages it sent or received (never another lead's); their text never.

use std::collections::{HashMap, VecDeque};

use fleet_core::ownership::{Action, Principal};
use fleet_core::{FleetError, Gid, Kind, MsgId, Role, WorkerStatus};
use fleet_store::{Change, Subject};
use serde::Serialize;
use tokio::sync::broadcast;

use super::{OperatorViews, Viewer};

/// The most changes one read of the feed gives; the rest come at the next.
pub const FEED_BATCH: usize = 200;

/// One change, as the feed tells it.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Event {
    /// Its place in the order of this gateway's stored changes: read on after it to miss
    /// nothing stored. None for a status told live only (a worker busy with a task, idle after
    /// it), which a feed read on later does not tell again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    /// When it happened (Unix ms).
    pub at_ms: i64,
    /// What changed.
    #[serde(flatten)]
    pub what: What,
}

/// What changed.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
#[serde(tag = "subject", rename_all = "snake_case")]
pub enum What {
    /// A message was made or moved to another state.
    Message {
        /// Its id.
        msg_id: MsgId,
        /// Its kind.
        kind: Kind,
        /// Its sender's name.
        from_name: String,
        /// Its recipient's name.
        to_name: String,
        /// The message it answers.
        in_reply_to: Option<MsgId>,
        /// The state it reached.
        state: String,
        /// Why it failed, if it did.
        reason: Option<String>,
    },
    /// An entity of this host was made or changed status (`gone` when it ended).
    Entity {
        /// Its gid.
        gid: Gid,
        /// Its name.
        name: String,
        /// Its role.
        role: Role,
        /// Its profile.
        profile: Option<String>,
        /// The status it reached.
        status: String,
    },
}

/// One state a message reached, in its history.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Step {
    /// When (Unix ms).
    pub at_ms: i64,
    /// The state.
    pub state: String,
    /// Why it failed, if it did.
    pub reason: Option<String>,
}

/// `GET /api/v1/messages/{msg_id}`: one message and every state it went through.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct MessageHistory {
    /// The message as a listing shows it.
    #[serde(flatten)]
    pub message: super::MessageRow,
    /// Its states, oldest first.
    pub history: Vec<Step>,
}

/// `GET /api/v1/screen?name=`: what a worker's pane shows now, read-only.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Screen {
    /// Whose pane.
    pub name: String,
    /// Its session status.
    pub status: String,
    /// The visible text, one line per row, as the program drew it (untrusted: show it as
    /// text, never as markup or keys).
    pub text: String,
}

/// A status an entity of this host's sessions reached, told live as it happens: every one,
/// the store keeping only some (spawning, ready, gone …) and not a worker's busy and idle with
/// each task, which would cost two more writes a task.
#[derive(Clone, Debug)]
pub struct LiveStatus {
    /// Who.
    pub gid: Gid,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Its profile.
    pub profile: Option<String>,
    /// The status it reached.
    pub status: WorkerStatus,
    /// When (Unix ms).
    pub at_ms: i64,
}

impl LiveStatus {
    /// The feed's event of it: one without a `seq`, as nothing stored it.
    pub fn event(&self) -> Event {
        Event {
            seq: None,
            at_ms: self.at_ms,
            what: What::Entity {
                gid: self.gid,
                name: self.name.clone(),
                role: self.role,
                profile: self.profile.clone(),
                status: self.status.as_str().to_string(),
            },
        }
    }
}

/// Where the sessions tell their statuses live, and the feeds listen. Sending costs nothing
/// while nobody listens; a listener that falls behind by more than it holds misses the oldest
/// (the store still tells it what it keeps).
pub(super) struct StatusTold(broadcast::Sender<LiveStatus>);

impl Default for StatusTold {
    fn default() -> Self {
        Self(broadcast::channel(1024).0)
    }
}

impl StatusTold {
    /// A sender for one session.
    pub fn sender(&self) -> broadcast::Sender<LiveStatus> {
        self.0.clone()
    }

    /// A new listener: it hears what is told from now on.
    pub fn listen(&self) -> broadcast::Receiver<LiveStatus> {
        self.0.subscribe()
    }
}

/// How far apart in time a status told live and the store's record of the same change may be
/// (the store writes it after the session reached it, on another thread).
const SAME_CHANGE_MS: i64 = 5_000;

/// The most live statuses a feed remembers having told.
const TOLD_KEPT: usize = 512;

/// The statuses one feed told live lately: the store's record of one of them, read a moment
/// later, is not told a second time (nor, arriving after a newer live status, told as if it
/// were the newer).
#[derive(Debug, Default)]
pub struct ToldLive(VecDeque<(Gid, String, i64)>);

impl ToldLive {
    /// Notes that `gid`'s `status` was told live, reached at `at_ms`.
    pub fn note(&mut self, gid: Gid, status: &str, at_ms: i64) {
        if self.0.len() == TOLD_KEPT {
            self.0.pop_front();
        }
        self.0.push_back((gid, status.to_string(), at_ms));
    }

    /// Whether the store's change of `gid` to `status` at `at_ms` was told live already.
    pub fn told(&self, gid: Gid, status: &str, at_ms: i64) -> bool {
        self.0
            .iter()
            .any(|(g, s, at)| *g == gid && s == status && (at_ms - at).abs() <= SAME_CHANGE_MS)
    }

    /// Whether `event` is to be told: a message always, an entity's status unless told live.
    pub fn keeps(&self, event: &Event) -> bool {
        match &event.what {
            What::Entity { gid, status, .. } => !self.told(*gid, status, event.at_ms),
            What::Message { .. } => true,
        }
    }
}

/// The changes `stored` (in the store's order) and the statuses told `live` (in the order they
/// were reached) as one feed, in time: each keeps its own order, and a live status goes before
/// the first stored change after it.
pub fn merged(stored: Vec<Event>, live: Vec<Event>) -> Vec<Event> {
    let mut out = Vec::with_capacity(stored.len() + live.len());
    let mut live = live.into_iter().peekable();
    for event in stored {
        while let Some(earlier) = live.next_if(|l| l.at_ms < event.at_ms) {
            out.push(earlier);
        }
        out.push(event);
    }
    out.extend(live);
    out
}

/// Whether a message between `from` and `to` is to be seen by one who sees the messages
/// `involving` an entity (those it sent or received), or all (none).
pub fn sees_message(involving: Option<Gid>, from: Gid, to: Gid) -> bool {
    involving.is_none_or(|gid| gid == from || gid == to)
}

impl OperatorViews {
    /// What [`Gateway::feed_start`] reads.
    pub(super) async fn feed_start(&self) -> Result<i64, FleetError> {
        self.local.db.run(|s| s.last_change()).await
    }

    /// What [`Gateway::feed`] reads.
    pub(super) async fn feed(
        &self,
        viewer: &Viewer,
        after: i64,
    ) -> Result<(Vec<Event>, i64), FleetError> {
        let changes = self
            .local
            .db
            .run(move |s| s.changes_since(after, FEED_BATCH))
            .await?;
        let next = changes.last().map_or(after, |c| c.seq);
        let mut names: HashMap<Gid, String> = HashMap::new();
        let mut events = Vec::with_capacity(changes.len());
        for change in changes {
            if let Some(what) = self.told(viewer, &change, &mut names).await? {
                events.push(Event {
                    seq: Some(change.seq),
                    at_ms: change.at_ms,
                    what,
                });
            }
        }
        Ok((events, next))
    }

    /// `change` as `viewer` may see it, or none: a message not a lead's own, or one or an
    /// entity no longer in the store (pruned).
    async fn told(
        &self,
        viewer: &Viewer,
        change: &Change,
        names: &mut HashMap<Gid, String>,
    ) -> Result<Option<What>, FleetError> {
        match change.subject {
            Subject::Message(msg_id) => {
                let Some(message) = self.local.db.run(move |s| s.message(msg_id)).await? else {
                    return Ok(None);
                };
                if !sees_message(viewer.involving(), message.from, message.to) {
                    return Ok(None);
                }
                Ok(Some(What::Message {
                    msg_id,
                    kind: message.kind,
                    from_name: self.cached_name(names, message.from).await,
                    to_name: self.cached_name(names, message.to).await,
                    in_reply_to: message.in_reply_to,
                    state: change.state.clone(),
                    reason: change.reason.as_deref().map(|r| viewer.reason(r)),
                }))
            }
            Subject::Entity(gid) => {
                let Some(record) = self.local.db.run(move |s| s.entity(gid)).await? else {
                    return Ok(None);
                };
                Ok(Some(What::Entity {
                    gid,
                    name: record.entity.name,
                    role: record.entity.role,
                    profile: record.entity.profile,
                    status: change.state.clone(),
                }))
            }
        }
    }

    /// What [`Gateway::screen`] reads.
    pub(super) async fn screen(&self, viewer: &Viewer, to: &str) -> Result<Screen, FleetError> {
        let caller = viewer.lead("look at a worker's screen")?;
        let entity = match self
            .local
            .resolve_or_ended(to, Some(&caller.entity))
            .await?
        {
            fleet_core::routing::Route::Local(entity) => entity,
            fleet_core::routing::Route::Remote(entity) => {
                return Err(FleetError::invalid(format!(
                    "'{}' runs on host '{}': its screen is shown by that host's fleetd",
                    entity.name, entity.host
                )));
            }
        };
        let (pane, status, whose) = {
            let sessions = self.local.sessions.lock();
            let session = sessions.panes.get(&entity.gid);
            (
                session.and_then(|s| s.pane().cloned()),
                session.map(|s| s.status()),
                session.is_some_and(|s| s.allows(Principal::Lead(&caller.entity), Action::SeeText)),
            )
        };
        let (Some(pane), Some(status)) = (pane, status) else {
            return Err(FleetError::invalid(format!(
                "'{}' has no pane: only workers and architects have a screen",
                entity.name
            )));
        };
        if !whose {
            return Err(FleetError::new(
                fleet_core::ErrorCode::Forbidden,
                format!(
                    "'{}' is not yours: only the lead that spawned it may look at its screen (a lead it is shared with sends it tasks, and sees nothing of its owner's)",
                    entity.name
                ),
            ));
        }
        let snapshot = self.local.panes.snapshot(&pane).await.map_err(|e| {
            FleetError::new(
                fleet_core::ErrorCode::Gone,
                format!("cannot read the screen of '{}': {e}", entity.name),
            )
        })?;
        Ok(Screen {
            name: entity.name,
            status: status.as_str().to_string(),
            text: snapshot.text,
        })
    }

    /// What [`Gateway::message_history`] reads.
    pub(super) async fn message_history(
        &self,
        viewer: &Viewer,
        msg_id: MsgId,
    ) -> Result<MessageHistory, FleetError> {
        let unknown = || {
            FleetError::new(
                fleet_core::ErrorCode::UnknownRecipient,
                format!("no message {msg_id} you may see is kept here (it may have been pruned)"),
            )
        };
        let message = self
            .local
            .db
            .run(move |s| s.message(msg_id))
            .await?
            .filter(|m| sees_message(viewer.involving(), m.from, m.to))
            .ok_or_else(unknown)?;
        let history = self
            .local
            .db
            .run(move |s| s.history(msg_id))
            .await?
            .into_iter()
            .map(|c| Step {
                at_ms: c.at_ms,
                reason: c.reason.as_deref().map(|r| viewer.reason(r)),
                state: c.state,
            })
            .collect();
        let mut names = HashMap::new();
        let answer = self
            .local
            .db
            .run(move |s| s.answers(&[msg_id]))
            .await?
            .pop()
            .map(|(_, answer)| answer);
        Ok(MessageHistory {
            message: self
                .message_row(viewer, &mut names, message, answer, false)
                .await,
            history,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lead_sees_only_the_messages_it_sent_or_received_an_operator_all() {
        let (lead, other, w) = (Gid::mint(), Gid::mint(), Gid::mint());
        assert!(sees_message(Some(lead), lead, w));
        assert!(sees_message(Some(lead), w, lead));
        assert!(!sees_message(Some(lead), other, w));
        assert!(!sees_message(Some(lead), w, other));
        // An operator sees every message's state.
        assert!(sees_message(None, other, w));
    }

    #[test]
    fn a_status_told_live_is_not_told_again_when_the_store_records_it() {
        let (w1, w2) = (Gid::mint(), Gid::mint());
        let live = LiveStatus {
            gid: w1,
            name: "w1".into(),
            role: Role::Worker,
            profile: Some("sim".into()),
            status: WorkerStatus::Idle,
            at_ms: 10_000,
        };
        let told = live.event();
        assert_eq!(told.seq, None, "nothing stored it");
        let mut feed = ToldLive::default();
        feed.note(w1, "idle", 10_000);
        feed.note(w1, "busy", 10_002);
        let stored = |gid: Gid, status: &str, at_ms: i64| Event {
            seq: Some(7),
            at_ms,
            what: What::Entity {
                gid,
                name: "x".into(),
                role: Role::Worker,
                profile: None,
                status: status.into(),
            },
        };
        // The store's idle, written a moment after, and after the live busy: not told again.
        assert!(!feed.keeps(&stored(w1, "idle", 10_004)));
        // What was not told live is told: another status, another worker, a change long after.
        assert!(feed.keeps(&stored(w1, "gone", 10_004)));
        assert!(feed.keeps(&stored(w2, "idle", 10_004)));
        assert!(feed.keeps(&stored(w1, "idle", 10_000 + SAME_CHANGE_MS + 1)));
        // It remembers a bounded number.
        for i in 0..TOLD_KEPT {
            feed.note(w2, "busy", i64::try_from(i).unwrap());
        }
        assert!(feed.keeps(&stored(w1, "idle", 10_004)), "forgotten");
        // In time with what the store tells: the worker made (stored) before it turned idle
        // (live), though the live status was heard first.
        let made = Event {
            seq: Some(3),
            ..stored(w1, "spawning", 9_000)
        };
        let later = Event {
            seq: Some(4),
            ..stored(w2, "spawning", 10_500)
        };
        let order: Vec<Option<i64>> = merged(vec![made, later], vec![told.clone()])
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(order, [Some(3), None, Some(4)]);
        let json = serde_json::to_value(&told).unwrap();
        assert!(json.get("seq").is_none(), "{json}");
        assert_eq!(json["status"], "idle");
    }
}
