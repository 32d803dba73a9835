//! The parameters of the fleet's MCP tools, as their JSON schemas show them to a model.

use rmcp::schemars;
use serde::Deserialize;

/// `fleet_list` takes nothing.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {}

/// `fleet_spawn`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnParams {
    /// The worker profile to start (see the gateway's config; fleet_list shows profiles of
    /// running workers).
    pub profile: String,
    /// A name for the worker; `<profile>-<n>` when left out.
    #[serde(default)]
    pub name: Option<String>,
    /// The host to start it on; this gateway's host when left out.
    #[serde(default)]
    pub host: Option<String>,
    /// Its working directory; the profile's when left out.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra broadcast groups to put it in.
    #[serde(default)]
    pub groups: Option<Vec<String>>,
}

/// `fleet_send`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendParams {
    /// The recipient: a name (as fleet_list shows it), `name@host`, or a gid.
    #[serde(default)]
    pub to: Option<String>,
    /// A peer lead's coordination id (lead-to-lead coordination), instead of `to`.
    #[serde(default)]
    pub coord_id: Option<String>,
    /// The turn id of a worker's question, to answer it, instead of `to`.
    #[serde(default)]
    pub turn_id: Option<String>,
    /// The message: for a worker, the task exactly as it should be typed into its pane.
    pub message: String,
    /// Seconds to wait for the answer (default 60, at most 3600; 0 returns at once). An answer
    /// that comes later is held for fleet_poll.
    #[serde(default)]
    pub wait_s: Option<u64>,
}

/// `fleet_reply`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplyParams {
    /// The answer.
    pub message: String,
    /// The msg_id of the message being answered; your task in flight when left out.
    #[serde(default)]
    pub in_reply_to: Option<String>,
}

/// `fleet_ask`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskParams {
    /// The question for your lead.
    pub question: String,
    /// Seconds to wait for the answer (default 300, at most 3600).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

/// `fleet_poll`
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PollParams {
    /// Only messages from this sender (a name or gid).
    #[serde(default)]
    pub from: Option<String>,
    /// Seconds to wait for the first message (default 0: look and return; at most 3600).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

/// `fleet_stop`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopParams {
    /// The worker to stop: a name or gid.
    pub to: String,
}

/// `fleet_broadcast`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BroadcastParams {
    /// The message every worker (or every worker of the group) gets as a task.
    pub message: String,
    /// Only the workers of this broadcast group; every worker when left out.
    #[serde(default)]
    pub group: Option<String>,
}

/// `fleet_consult`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsultParams {
    /// The brief: typed byte for byte into every architect, each in a fresh session.
    pub brief: String,
    /// Seconds to wait for the answers (default 600, at most 3600). A later answer is held for
    /// fleet_poll.
    #[serde(default)]
    pub wait_s: Option<u64>,
    /// The slots to consult, by name (as configured under [architects]); all when left out.
    #[serde(default)]
    pub slots: Option<Vec<String>>,
}
