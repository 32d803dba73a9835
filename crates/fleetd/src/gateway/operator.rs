//! What the operator surfaces (`/api/v1`, `fleetd ls`, `fleetd msgs`) read off the gateway:
//! the roster with what waits for each of this host's entities, and the messages of this
//! gateway's store with their states (their text only when asked).

use std::collections::HashMap;
use std::sync::Arc;

use fleet_core::ownership::{Principal, redacted};
use fleet_core::{ErrorCode, FleetError, Gid, Kind, Message, MsgId, MsgState};
use fleet_store::{Answer, MessageFilter};
use serde::{Deserialize, Serialize};

use super::feed::sees_message;
use super::views::{HostView, RosterEntry};
use super::{Caller, LocalPlane, OperatorViews};

impl OperatorViews {
    /// The views over `local`.
    pub(super) fn new(local: Arc<LocalPlane>) -> Self {
        Self { local }
    }
}

/// Who looks through the operator surfaces.
#[derive(Clone, Debug)]
pub enum Viewer {
    /// A lead: it sees and does what it may over MCP (its own messages, never another lead's).
    Lead(Caller),
    /// An operator (`[operators.NAME]`): sees the whole fleet and every message's state and
    /// reason here, never a message's text nor a worker's screen (which may show a task and
    /// its answer); may stop workers unless read-only; sends nothing.
    Operator {
        /// Its name.
        name: String,
        /// May only read.
        read_only: bool,
    },
}

impl Viewer {
    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Viewer::Lead(caller) => &caller.entity.name,
            Viewer::Operator { name, .. } => name,
        }
    }

    /// The entity whose messages it sees (sent or received): a lead's own; none for an
    /// operator, who sees every message's state.
    pub fn involving(&self) -> Option<Gid> {
        match self {
            Viewer::Lead(caller) => Some(caller.entity.gid),
            Viewer::Operator { .. } => None,
        }
    }

    /// Who it is to the ownership rule.
    pub fn principal(&self) -> Principal<'_> {
        match self {
            Viewer::Lead(caller) => Principal::Lead(&caller.entity),
            Viewer::Operator { name, read_only } => Principal::Operator {
                name,
                may_stop: !read_only,
            },
        }
    }

    /// A reason as it may see it: a lead sees its own messages' reasons as they were told to
    /// it; an operator never a screen one quotes.
    pub fn reason(&self, reason: &str) -> String {
        match self {
            Viewer::Lead(_) => reason.to_string(),
            Viewer::Operator { .. } => redacted(reason).into_owned(),
        }
    }

    /// The lead, for what only a lead may do (`what`); an operator is refused, saying so.
    pub fn lead(&self, what: &str) -> Result<&Caller, FleetError> {
        match self {
            Viewer::Lead(caller) => Ok(caller),
            Viewer::Operator { name, .. } => Err(FleetError::new(
                ErrorCode::Forbidden,
                format!("operator '{name}' may not {what}: only a lead may"),
            )),
        }
    }
}

/// One entity of the roster, with what waits for it here.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
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
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct RosterView {
    /// The caller, when it is a lead (an operator is no entity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub you: Option<RosterEntry>,
    /// Every live entity, this host's first.
    pub entities: Vec<RosterRow>,
    /// The hosts of the fleet, this one first.
    pub hosts: Vec<HostView>,
}

impl OperatorViews {
    /// What [`Gateway::roster`] reads.
    pub(super) async fn roster(&self, viewer: &Viewer) -> Result<RosterView, FleetError> {
        let (you, entities, hosts) = match viewer {
            Viewer::Lead(caller) => {
                let list = self.local.list(caller)?;
                (Some(list.you), list.entities, list.hosts)
            }
            Viewer::Operator { .. } => {
                let (entities, hosts) = self.local.everyone(viewer.principal());
                (None, entities, hosts)
            }
        };
        let mut waiting: HashMap<Gid, (usize, usize)> = HashMap::new();
        for (gid, state, count) in self.local.db.run(|s| s.waiting_by_recipient()).await? {
            let slot = waiting.entry(gid).or_default();
            match state.as_str() {
                "held" => slot.0 += count,
                _ => slot.1 += count,
            }
        }
        let entities = entities
            .into_iter()
            .map(|entry| {
                let here = entry.host == self.local.host_id;
                let (held, queued) = waiting.get(&entry.gid).copied().unwrap_or_default();
                RosterRow {
                    held: here.then_some(held),
                    queued: here.then_some(queued),
                    entry,
                }
            })
            .collect();
        Ok(RosterView {
            you,
            entities,
            hosts,
        })
    }
}

/// How many messages a listing gives when it does not say.
const DEFAULT_LISTED: usize = 50;
/// The most messages one listing gives.
pub const MAX_LISTED: usize = 1000;

/// `GET /api/v1/messages`' query: every condition given must hold.
#[derive(Clone, Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessagesQuery {
    /// A state: queued, injecting, injected, held, consumed or failed (failed also lists a task
    /// that was typed and then answered only by a failure notice: its `answer` is `failed`).
    pub state: Option<String>,
    /// A kind: SEND, REPLY, FAILED (a failure told to its sender: dead letters among them), …
    pub kind: Option<String>,
    /// The recipient, by name (live or gone) or gid.
    pub to: Option<String>,
    /// The sender, by name (live or gone) or gid.
    pub from: Option<String>,
    /// Sent by or to this entity, by name (live or gone) or gid.
    pub with: Option<String>,
    /// Older than this message: the `next` of the page before, to page on.
    pub before: Option<MsgId>,
    /// Made at or after this Unix ms.
    pub since_ms: Option<i64>,
    /// Give each message's text too.
    #[serde(default)]
    pub text: bool,
    /// At most this many, the newest (default 50, at most 1000).
    pub limit: Option<usize>,
}

/// `GET /api/v1/messages`: one page of the messages selected.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct MessagePage {
    /// The messages, newest first.
    pub messages: Vec<MessageRow>,
    /// How many messages the query selects, on all its pages.
    pub total: usize,
    /// How many of them are newer than this page (on the pages before it; 0 on the first).
    pub newer: usize,
    /// Where the next, older page starts (`before=` it), if there are older ones.
    pub next: Option<MsgId>,
}

/// One message as the operator API lists it.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct MessageRow {
    /// Its id.
    pub msg_id: MsgId,
    /// Its kind.
    pub kind: Kind,
    /// Its sender.
    pub from: Gid,
    /// Its sender's name.
    pub from_name: String,
    /// Its recipient.
    pub to: Gid,
    /// Its recipient's name.
    pub to_name: String,
    /// Its state.
    pub state: &'static str,
    /// Why it failed, if it did (a task typed and then failed: what its failure notice told);
    /// for a FAILED notice, the failure it tells of.
    pub reason: Option<String>,
    /// How it was answered, if it was: `replied`, or `failed` (only a failure notice answers
    /// it: a task typed into a worker that then ended, stalled or was stopped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<&'static str>,
    /// The message it answers.
    pub in_reply_to: Option<MsgId>,
    /// When it was made (Unix ms).
    pub created_ms: i64,
    /// Its text, only when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// The kind of `query`, checked: an unknown one is refused, naming those there are.
pub fn checked_kind(query: &MessagesQuery) -> Result<Option<Kind>, FleetError> {
    let Some(kind) = &query.kind else {
        return Ok(None);
    };
    kind.parse().map(Some).map_err(|_| {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        FleetError::invalid(format!(
            "kind '{}' is none of {}",
            kind.escape_debug(),
            known.join(", ")
        ))
    })
}

/// The state and limit of `query`, checked: an unknown state or a limit out of range is
/// refused, naming what is allowed.
pub fn checked(query: &MessagesQuery) -> Result<(Option<String>, usize), FleetError> {
    if let Some(state) = &query.state
        && !MsgState::NAMES.contains(&state.as_str())
    {
        return Err(FleetError::invalid(format!(
            "state '{}' is none of {}",
            state.escape_debug(),
            MsgState::NAMES.join(", ")
        )));
    }
    let limit = query.limit.unwrap_or(DEFAULT_LISTED);
    if !(1..=MAX_LISTED).contains(&limit) {
        return Err(FleetError::invalid(format!(
            "limit is {limit}; it must be between 1 and {MAX_LISTED}"
        )));
    }
    Ok((query.state.clone(), limit))
}

impl OperatorViews {
    /// The name of `gid`, looked up once for a listing that names it again and again.
    pub(super) async fn cached_name(&self, names: &mut HashMap<Gid, String>, gid: Gid) -> String {
        if let Some(name) = names.get(&gid) {
            return name.clone();
        }
        let name = self.local.name_of(gid).await;
        names.insert(gid, name.clone());
        name
    }

    /// `message` as a listing shows it, its text only if `text`; a reason that quotes a
    /// worker's screen only to `viewer` a lead (whose own messages are all it lists: a screen
    /// is quoted only to the worker's owner), to an operator with the screen withheld.
    pub(super) async fn message_row(
        &self,
        viewer: &Viewer,
        names: &mut HashMap<Gid, String>,
        message: Message,
        answer: Option<Answer>,
        text: bool,
    ) -> MessageRow {
        let told = match &answer {
            Some(Answer::Failed(told)) => told.clone(),
            _ => None,
        };
        let reason = message
            .state
            .reason()
            .map(str::to_string)
            // A FAILED notice's text is the reason it tells (fleetd's words, quoting a screen
            // only to the worker's owner).
            .or_else(|| (message.kind == Kind::Failed).then(|| message.body.clone()))
            .or(told)
            .map(|reason| viewer.reason(&reason));
        MessageRow {
            msg_id: message.msg_id,
            kind: message.kind,
            from: message.from,
            from_name: self.cached_name(names, message.from).await,
            to: message.to,
            to_name: self.cached_name(names, message.to).await,
            state: message.state.name(),
            reason,
            answer: answer.map(|a| match a {
                Answer::Replied => "replied",
                Answer::Failed(_) => "failed",
            }),
            in_reply_to: message.in_reply_to,
            created_ms: message.created_ms,
            text: text.then_some(message.body),
        }
    }

    /// What [`Gateway::message_rows`] reads.
    pub(super) async fn message_rows(
        &self,
        viewer: &Viewer,
        query: &MessagesQuery,
    ) -> Result<MessagePage, FleetError> {
        let (state, limit) = checked(query)?;
        let kind = checked_kind(query)?;
        if query.text {
            viewer.lead("read a message's text")?;
        }
        let mut involving: Vec<Gid> = viewer.involving().into_iter().collect();
        let named = |name: &Option<String>| {
            let name = name.clone();
            async move {
                match name {
                    Some(name) => self.local.resolve_sender(&name).await.map(Some),
                    None => Ok(None),
                }
            }
        };
        let (to, from) = (named(&query.to).await?, named(&query.from).await?);
        involving.extend(named(&query.with).await?);
        let filter = MessageFilter {
            state,
            kind,
            to,
            from,
            since_ms: query.since_ms,
            involving,
            before: query.before,
            // One more than shown: whether there is an older page.
            limit: limit + 1,
        };
        let seen = viewer.involving();
        let before = query.before;
        let (mut messages, (total, newer), answers) = self
            .local
            .db
            .run(move |s| {
                if let Some(before) = filter.before
                    && !s
                        .message(before)?
                        .is_some_and(|m| sees_message(seen, m.from, m.to))
                {
                    return Ok(None);
                }
                let messages = s.messages(&filter)?;
                let ids: Vec<MsgId> = messages.iter().take(limit).map(|m| m.msg_id).collect();
                Ok(Some((
                    messages,
                    s.message_total(&filter)?,
                    s.answers(&ids)?,
                )))
            })
            .await?
            .ok_or_else(|| unlisted(before))?;
        let next = (messages.len() > limit).then(|| {
            messages.truncate(limit);
            messages.last().map(|m| m.msg_id)
        });
        let mut answers: HashMap<MsgId, Answer> = answers.into_iter().collect();
        let mut names: HashMap<Gid, String> = HashMap::new();
        let mut rows = Vec::with_capacity(messages.len());
        for message in messages {
            let answer = answers.remove(&message.msg_id);
            rows.push(
                self.message_row(viewer, &mut names, message, answer, query.text)
                    .await,
            );
        }
        Ok(MessagePage {
            messages: rows,
            total,
            newer,
            next: next.flatten(),
        })
    }
}

/// The refusal of a page `before` a message the viewer does not list (another lead's, or one
/// no longer stored: the two read alike).
fn unlisted(before: Option<MsgId>) -> FleetError {
    let before = before.map(|b| b.to_string()).unwrap_or_default();
    FleetError::invalid(format!(
        "before={before} is no message you may list (or it is no longer stored); leave it out for the newest page"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_names_the_states_and_bounds_it_takes() {
        let query = |state: Option<&str>, limit: Option<usize>| MessagesQuery {
            state: state.map(str::to_string),
            limit,
            ..MessagesQuery::default()
        };
        assert_eq!(
            checked(&query(Some("failed"), None)).unwrap(),
            (Some("failed".to_string()), 50)
        );
        let err = checked(&query(Some("lost\u{1b}"), None)).unwrap_err();
        assert!(
            err.message.contains("'lost\\u{1b}'") && err.message.contains("queued, injecting"),
            "{err}"
        );
        assert!(checked(&query(None, Some(0))).is_err());
        assert!(checked(&query(None, Some(MAX_LISTED + 1))).is_err());
        assert_eq!(
            checked(&query(None, Some(MAX_LISTED))).unwrap().1,
            MAX_LISTED
        );
        let kind = |kind: &str| MessagesQuery {
            kind: Some(kind.into()),
            ..MessagesQuery::default()
        };
        assert_eq!(checked_kind(&kind("FAILED")).unwrap(), Some(Kind::Failed));
        let err = checked_kind(&kind("dead")).unwrap_err();
        assert!(err.message.contains("'dead' is none of SEND"), "{err}");
    }
}
