//! What the tools answer: the shapes a caller sees, serialized as each tool's result. The
//! gateway fills them; nothing here decides anything.

use fleet_core::dialog::Choice;
use fleet_core::{Gid, Kind, MsgId, Role, TraceId, WorkerStatus};
use serde::Serialize;

pub use fleet_core::asks::Question as AskView;

/// A dialog a worker's own program stopped on, as its lead sees it.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct DialogView {
    /// Answer it with `fleet_send{turn_id, choice}`.
    pub turn_id: String,
    /// The worker's gid.
    pub from: Gid,
    /// Its name.
    pub from_name: String,
    /// Its host.
    pub host: String,
    /// The dialog's text, as the worker's screen shows it.
    pub prompt: String,
    /// What it offers: answer with one `choice`; only its key is pressed.
    pub choices: Vec<Choice>,
    /// The task the worker is working on, if any.
    pub in_task: Option<MsgId>,
    /// When it was seen (Unix ms).
    pub seen_ms: i64,
}

impl DialogView {
    /// Its choices, as a lead gives them (`"1" (Yes)`), in a list.
    pub fn choices_in_words(&self) -> String {
        self.choices
            .iter()
            .map(|c| format!("\"{}\" ({})", c.choice, c.label))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What a lead's call hands out of an open ask: a question, or a dialog (an ask with choices).
pub enum Surfaced {
    /// A worker's question.
    Question(AskView),
    /// A dialog on a worker's screen.
    Dialog(DialogView),
}

impl From<AskView> for Surfaced {
    fn from(ask: AskView) -> Self {
        match ask.choices {
            Some(choices) => Surfaced::Dialog(DialogView {
                turn_id: ask.turn_id,
                from: ask.from,
                from_name: ask.from_name,
                host: ask.host,
                prompt: ask.question,
                choices,
                in_task: ask.in_task,
                seen_ms: ask.asked_ms,
            }),
            None => Surfaced::Question(ask),
        }
    }
}

impl Surfaced {
    /// The dialog, if it is one.
    pub fn dialog(self) -> Option<DialogView> {
        match self {
            Surfaced::Dialog(dialog) => Some(dialog),
            Surfaced::Question(_) => None,
        }
    }
}

/// A message as its recipient sees it.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Delivered {
    /// Its id.
    pub msg_id: MsgId,
    /// What it is.
    pub kind: Kind,
    /// Sender's gid.
    pub from: Gid,
    /// Sender's name (for coordination, the sender's coordination id).
    pub from_name: String,
    /// For coordination from a peer lead: its coordination id (answer it with
    /// `fleet_send{coord_id}`; it is no task, and `fleet_reply` refuses it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_coord_id: Option<String>,
    /// What it answers.
    pub in_reply_to: Option<MsgId>,
    /// The text.
    pub text: String,
    /// When it was sent (Unix ms).
    pub sent_ms: i64,
    /// Its flow.
    pub trace_id: TraceId,
}

/// How a send ended.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum SendResult {
    /// The recipient answered in time.
    Replied {
        /// The message sent.
        msg_id: MsgId,
        /// The answer.
        reply: Delivered,
    },
    /// The message could not be delivered.
    Failed {
        /// The message sent.
        msg_id: MsgId,
        /// Why.
        reason: String,
    },
    /// A worker asks you something mid-task (maybe not the one you sent to): answer with
    /// `fleet_send{turn_id, message}`. Your message's answer is still on its way.
    Asked {
        /// The message sent.
        msg_id: MsgId,
        /// The question.
        ask: AskView,
        /// What to do next.
        note: String,
    },
    /// A worker's own program stopped on a dialog (a permission prompt) and waits for a key:
    /// answer with `fleet_send{turn_id, choice}`. Your message's answer is still on its way.
    Blocked {
        /// The message sent (none when the dialog came up while the worker was starting).
        #[serde(skip_serializing_if = "Option::is_none")]
        msg_id: Option<MsgId>,
        /// The dialog.
        #[serde(flatten)]
        dialog: DialogView,
        /// What to do next.
        note: String,
    },
    /// Your answer to an ask went to the worker (who is not working on a task of yours).
    Answered {
        /// The ask answered.
        turn_id: String,
        /// What became of the worker, when it was starting (ready for tasks, or still starting).
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// No answer yet; it will be held for `fleet_poll`.
    Pending {
        /// The message sent.
        msg_id: MsgId,
        /// Where the message is now (`queued`, `injecting`, `injected`, `held`).
        state: String,
        /// What to do next.
        note: String,
    },
}

/// The answer to `fleet_reply`.
#[derive(Clone, Debug, Serialize)]
pub struct ReplyResult {
    /// The reply's id.
    pub msg_id: MsgId,
    /// Who it went to.
    pub to: Gid,
    /// Their name.
    pub to_name: String,
}

/// The answer to `fleet_poll`.
#[derive(Clone, Debug, Serialize)]
pub struct PollResult {
    /// Held messages, oldest first (at most a batch).
    pub messages: Vec<Delivered>,
    /// Questions workers are asking you now; answer each with `fleet_send{turn_id, message}`.
    pub asks: Vec<AskView>,
    /// Dialogs workers' programs stopped on; answer each with `fleet_send{turn_id, choice}`.
    pub blocked: Vec<DialogView>,
}

/// What `fleet_broadcast` did.
#[derive(Clone, Debug, Serialize)]
pub struct BroadcastResult {
    /// The broadcast's id (each copy's id derives from it and its recipient).
    pub msg_id: MsgId,
    /// How many workers the roster knows to get a copy.
    pub copies: usize,
    /// What happens next.
    pub note: String,
}

/// The answer to `fleet_ask`.
#[derive(Clone, Debug, Serialize)]
pub struct AskResult {
    /// The ask's turn id.
    pub turn_id: String,
    /// The lead's answer.
    pub answer: String,
}

/// One entry of `fleet_list`. A field that does not apply to it (none, for its kind or now) is
/// left out rather than sent as `null`: a roster of thousands is half the bytes.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct RosterEntry {
    /// Global id.
    pub gid: Gid,
    /// Name.
    pub name: String,
    /// Host id.
    pub host: String,
    /// Role.
    pub role: Role,
    /// For an architect: the slot it fills (`[architects]`), which it is named after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// Profile it was spawned from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The sandbox runtime it runs in, by its program's name (`bwrap`, `podman`, `docker`), as
    /// its profile was when it was spawned; none when it runs unsandboxed (and for leads, and
    /// for another host's that does not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The role its profile declares (`role = "backend"`), as when it was spawned: what it is
    /// for, beside `role` (what it may do).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_role: Option<String>,
    /// Session status (`idle` for leads; `unknown` while the pane host cannot be reached).
    pub status: String,
    /// The agent the pane host recognises in the pane, if any (herdr).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// What the pane host says that agent is doing (`idle`, `working`, `blocked`, `done`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_status: Option<String>,
    /// Broadcast groups.
    pub groups: Vec<String>,
    /// Its pane, for pane-bound entities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pane: Option<String>,
    /// When it last called in (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen_ms: Option<i64>,
    /// For a lead: how many fleet calls it is waiting in now (where workers' asks surface).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_calls: Option<usize>,
    /// For a worker of this host that has stalled (no screen change and no call for its
    /// profile's `stall_after_s` while busy): since when (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled_since: Option<i64>,
    /// For a worker of this host with a workspace of its own: its directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// For a blocked worker of this host: the dialog its program stopped on, as asked of its
    /// lead (answer with `fleet_send{turn_id, choice}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialog: Option<DialogView>,
    /// For a worker or architect of this host: its owner, the lead that spawned it (`name@host`
    /// for a lead of another host). Only its owner tasks, stops and sees it, unless `shared`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// For a worker or architect of this host: the leads it is shared with, who may send it
    /// tasks (and get their own answers, never its owner's text or screen).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<String>,
}

/// The slot an entity called `name` in `role` fills: an architect's is its name.
pub fn slot_of(role: Role, name: &str) -> Option<String> {
    (role == Role::Architect).then(|| name.to_string())
}

#[cfg(test)]
impl RosterEntry {
    /// A worker's entry: `name` on `host`, `status`, in `groups`, nothing else said.
    pub(crate) fn example(name: &str, host: &str, status: &str, groups: &[&str]) -> Self {
        RosterEntry {
            gid: Gid::mint(),
            name: name.into(),
            host: host.into(),
            role: Role::Worker,
            slot: None,
            profile: None,
            sandbox: None,
            profile_role: None,
            status: status.into(),
            agent: None,
            agent_status: None,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            pane: None,
            last_seen_ms: None,
            open_calls: None,
            stalled_since: None,
            workspace: None,
            dialog: None,
            owner: None,
            shared: Vec::new(),
        }
    }
}

/// The answer to `fleet_list`.
#[derive(Clone, Debug, Serialize)]
pub struct ListResult {
    /// The caller.
    pub you: RosterEntry,
    /// The caller's lead-to-lead coordination id (none without a `[coordinator]`, and for
    /// anyone but a lead).
    pub coord_id: Option<String>,
    /// Every live entity: this host's, then other hosts' as the roster last heard of them.
    pub entities: Vec<RosterEntry>,
    /// The hosts of the fleet (this one first), with the profiles each can spawn.
    pub hosts: Vec<HostView>,
}

/// The answer to `fleet_spawn`.
#[derive(Clone, Debug, Serialize)]
pub struct SpawnResult {
    /// The new entity's gid.
    pub gid: Gid,
    /// Its name.
    pub name: String,
    /// Its host.
    pub host: String,
    /// Its pane.
    pub pane: String,
    /// Its profile.
    pub profile: String,
    /// Its status (`idle`: ready for a task; `blocked`: its program stopped on a dialog while
    /// starting, which `dialog` shows).
    pub status: WorkerStatus,
    /// The dialog it stopped on while starting: answer with `fleet_send{turn_id, choice}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialog: Option<DialogView>,
    /// What to do next, when it is not ready yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The answer to `fleet_stop`.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct StopResult {
    /// Who was stopped.
    pub gid: Gid,
    /// Their name.
    pub name: String,
    /// Their status now.
    pub status: WorkerStatus,
}

/// One host as `fleet_list` shows it.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct HostView {
    /// The host id.
    pub host: String,
    /// `up`, or `unknown` while the broker cannot be reached.
    pub status: String,
    /// The profiles it can spawn.
    pub profiles: Vec<String>,
    /// The model family (its maker's id: `anthropic`, `openai` …) of each of its profiles whose
    /// family its gateway can name, by profile.
    pub families: std::collections::BTreeMap<String, String>,
    /// When its gateway was last heard of (Unix ms); none for this host.
    pub last_seen_ms: Option<i64>,
}
