//! The gateway as the rest of fleetd calls it: one method per tool and operator surface, each
//! handed to the plane that does it (the local plane, or the operator views). Starting is the
//! only act that takes both planes: the federation starts between the local plane's leads and
//! its loops.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::{FleetError, MsgId};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::afar::Afar;
use super::feed::{Event, MessageHistory, Screen};
use super::nudge::NudgeTarget;
use super::operator::{MessagePage, MessagesQuery, RosterView, Viewer};
use super::views::{
    AskResult, BroadcastResult, HostView, ListResult, PollResult, ReplyResult, SendResult,
    SpawnResult, StopResult,
};
use super::{
    Caller, ConsultRequest, ConsultResult, Gateway, LocalPlane, OperatorViews, Parts, SpawnRequest,
};
use crate::config::Config;

impl Gateway {
    /// Builds the gateway over its opened parts (an error if its threads cannot be started).
    /// Call [`Gateway::start`] next.
    pub fn new(
        config: Arc<Config>,
        host_id: String,
        mcp_url: String,
        mut parts: Parts,
        shutdown: CancellationToken,
    ) -> std::io::Result<Arc<Self>> {
        let federation = parts.federation.take();
        let afar = federation.clone().map(|f| f as Arc<dyn Afar>);
        let local = LocalPlane::new(config, host_id, mcp_url, parts, afar, shutdown)?;
        let views = OperatorViews::new(Arc::clone(&local));
        Ok(Arc::new(Self {
            local,
            views,
            federation,
        }))
    }

    /// Declares the configured leads, takes back the workers a previous run left running,
    /// connects to the broker (attaching their inboxes; its notices about what the previous
    /// run left half-delivered may be for senders on other hosts), ends what was not taken
    /// back, fails what was left half-delivered, closes the other panes, and starts the pumps,
    /// the pane watcher and the nudgers.
    pub async fn start(&self) -> Result<(), FleetError> {
        self.local.declare_leads().await?;
        let back = self.local.take_back().await?;
        if let Some(federation) = &self.federation {
            federation.start_federation(&self.local).await?;
        }
        self.local.start(back).await
    }

    /// Shuts down: stops the loops and waits for them to finish. The workers keep running for
    /// the next start, unless `[gateway] on_exit = "stop"`: then every live session ends
    /// (its pane closed, the senders of what was on its way told). Held messages stay.
    pub async fn shut_down(&self) {
        self.local.shut_down().await;
    }

    /// Whether fleetd's exit ends its workers (`[gateway] on_exit = "stop"`).
    pub fn stops_workers(&self) -> bool {
        self.local.stops_workers()
    }

    /// `fleet_send`: sends `text` to `to` and waits up to `wait` for the answer.
    pub async fn send(
        &self,
        caller: &Caller,
        to: &str,
        text: String,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        self.local.send(caller, to, text, wait, ct).await
    }

    /// `fleet_poll`: held messages for the caller (only those from `from`, when given),
    /// waiting up to `wait` for the first.
    pub async fn poll(
        &self,
        caller: &Caller,
        from: Option<&str>,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<PollResult, FleetError> {
        self.local.poll(caller, from, wait, ct).await
    }

    /// `fleet_reply`: answers `in_reply_to`, or the caller's task in flight.
    pub async fn reply(
        &self,
        caller: &Caller,
        text: String,
        in_reply_to: Option<MsgId>,
    ) -> Result<ReplyResult, FleetError> {
        self.local.reply(caller, text, in_reply_to).await
    }

    /// `fleet_ask`: asks the lead whose task the caller is working on (else the lead that
    /// spawned it) and waits up to `wait` for the answer.
    pub async fn ask(
        &self,
        caller: &Caller,
        question: String,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<AskResult, FleetError> {
        self.local.ask(caller, question, wait, ct).await
    }

    /// `fleet_send{turn_id}`: answers a worker's ask, then waits up to `wait` for the reply to
    /// the task it was asked in (if the caller sent that task).
    pub async fn answer(
        &self,
        caller: &Caller,
        turn_id: &str,
        text: String,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        self.local.answer(caller, turn_id, text, wait, ct).await
    }

    /// `fleet_send{turn_id, choice}`: answers the dialog `turn_id` with `choice`, then waits
    /// up to `wait` for the reply to the task it stopped in (if the caller sent that task).
    pub async fn choose_for(
        &self,
        caller: &Caller,
        turn_id: &str,
        choice: &str,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        self.local
            .choose_for(caller, turn_id, choice, wait, ct)
            .await
    }

    /// `fleet_broadcast`: one message to every worker (or those of `group`), each copy
    /// delivered by the normal rules of its worker's gateway. With a broker it is published
    /// once and the broker copies it into every bound inbox; without one, or with the broker
    /// down (the note then says the other hosts were not reached), this host's workers get a
    /// copy each.
    pub async fn broadcast(
        &self,
        caller: &Caller,
        text: String,
        group: Option<String>,
    ) -> Result<BroadcastResult, FleetError> {
        self.local.broadcast(caller, text, group).await
    }

    /// `fleet_send{coord_id}`: publishes `text` to the mailbox of `coord_id` on the
    /// coordinator, signed; returns once the coordinator holds it (`pending`: it never waits
    /// for an answer).
    pub async fn coordinate(
        &self,
        caller: &Caller,
        coord_id: &str,
        text: String,
    ) -> Result<SendResult, FleetError> {
        self.local.coordinate(caller, coord_id, text).await
    }

    /// `fleet_spawn`: starts a worker from a profile, here or (through its gateway) on another
    /// host, and returns once it is ready.
    pub async fn spawn(
        &self,
        caller: &Caller,
        request: SpawnRequest,
        ct: &CancellationToken,
    ) -> Result<SpawnResult, FleetError> {
        self.local.spawn(caller, request, ct).await
    }

    /// `fleet_stop`: ends a worker's session and closes its pane.
    pub async fn stop(&self, caller: &Caller, to: &str) -> Result<StopResult, FleetError> {
        self.local.stop(caller, to).await
    }

    /// `POST /api/v1/stop` as `viewer`: a lead's is `fleet_stop`; an operator (unless
    /// read-only) stops a worker or architect of this host (another host's, through its own
    /// fleetd: the control plane carries a lead's requests only).
    pub async fn stop_as(&self, viewer: &Viewer, to: &str) -> Result<StopResult, FleetError> {
        self.local.stop_as(viewer, to).await
    }

    /// `fleet_consult`: see the module's documentation. `progress` hears a line as each
    /// architect is ready and as each answers.
    pub async fn consult(
        &self,
        caller: &Caller,
        request: ConsultRequest,
        progress: UnboundedSender<String>,
        ct: &CancellationToken,
    ) -> Result<ConsultResult, FleetError> {
        self.local.consult(caller, request, progress, ct).await
    }

    /// The hosts of the fleet, this one first.
    pub fn hosts(&self) -> Vec<HostView> {
        self.local.hosts()
    }

    /// `fleet_list`: every live entity, and the caller.
    pub fn list(&self, caller: &Caller) -> Result<ListResult, FleetError> {
        self.local.list(caller)
    }

    /// Whether the gateway can serve now: what is wrong with it, if anything (see
    /// [`Health`](crate::health::Health)).
    pub fn problems(&self) -> Vec<String> {
        self.local.problems()
    }

    /// The host id.
    pub fn host_id(&self) -> &str {
        self.local.host_id()
    }

    /// The largest message it takes, in bytes (`gateway.max_message_bytes`).
    pub fn max_message_bytes(&self) -> usize {
        self.local.config.gateway.max_message_bytes
    }

    /// Resolves a bearer token's hash to its live caller, and notes that the caller called in
    /// (readiness, last seen; when `acting`, proof that a typed task was submitted; for a lead,
    /// the pane `nudge` names, which wakes its nudger when it is news). A token that names
    /// nobody live gets the reason why.
    pub async fn authenticate(
        &self,
        hash: [u8; 32],
        nudge: Option<NudgeTarget>,
        acting: bool,
    ) -> Result<Result<Caller, String>, FleetError> {
        self.local.authenticate(hash, nudge, acting).await
    }

    /// Notes that `caller` listed fleetd's tools: the readiness proof of agents that call in
    /// before they have the tools (Claude Code).
    pub async fn listed_tools(&self, caller: &Caller) {
        self.local.listed_tools(caller).await
    }

    /// Who the token hashing to `hash` lets look through the operator surfaces (`/metrics`,
    /// `/api/v1`, the web view): a lead of this gateway, or an operator its config declares
    /// now (one taken out of the config is refused though its token is still on file).
    /// Unlike [`Gateway::authenticate`] it leaves no trace of a call: a look is not the lead
    /// calling in, and a worker's token makes no worker ready here.
    pub fn viewer(&self, hash: &[u8; 32]) -> Result<Option<Viewer>, FleetError> {
        self.views.viewer(hash)
    }

    /// Counts a call of the tool named `tool`, answered the way `served` says.
    pub fn tool_called(&self, tool: &str, served: crate::metrics::Served) {
        self.local.metrics.tool_called(tool, served);
    }

    /// The metrics, in the OpenMetrics text format, the gauges read now.
    pub async fn metrics_text(&self) -> Result<String, FleetError> {
        self.views.metrics_text().await
    }

    /// The roster as `viewer` may see it (the rules of `fleet_list`: every live entity), with
    /// what waits for each of this host's entities.
    pub async fn roster(&self, viewer: &Viewer) -> Result<RosterView, FleetError> {
        self.views.roster(viewer).await
    }

    /// The messages of this gateway's store that `query` selects among those `viewer` may see
    /// (a lead: those it sent or received, never another lead's; an operator: all, never
    /// their text), newest first: one page, how many there are in all, and where the next
    /// page starts.
    pub async fn message_rows(
        &self,
        viewer: &Viewer,
        query: &MessagesQuery,
    ) -> Result<MessagePage, FleetError> {
        self.views.message_rows(viewer, query).await
    }

    /// The statuses this host's sessions reach from now on, told as they happen (see
    /// [`LiveStatus`]).
    pub fn live_statuses(&self) -> tokio::sync::broadcast::Receiver<super::LiveStatus> {
        self.local.sessions.lock().told.listen()
    }

    /// Where a feed that starts now reads on from.
    pub async fn feed_start(&self) -> Result<i64, FleetError> {
        self.views.feed_start().await
    }

    /// The changes after `after` that `viewer` may see, oldest first, and the `seq` to read on
    /// from (past those it may not see as well).
    pub async fn feed(&self, viewer: &Viewer, after: i64) -> Result<(Vec<Event>, i64), FleetError> {
        self.views.feed(viewer, after).await
    }

    /// What the pane of `to` (an entity of this host) shows now, to its owner, the lead that
    /// spawned it (a screen shows its tasks and answers: never another lead's to read, not
    /// even one it is shared with, nor an operator's). A look only: nothing is typed, and the look is not
    /// the lead calling in.
    pub async fn screen(&self, viewer: &Viewer, to: &str) -> Result<Screen, FleetError> {
        self.views.screen(viewer, to).await
    }

    /// A message `viewer` may see with every state it went through; one it may not is as
    /// unknown as one that never was.
    pub async fn message_history(
        &self,
        viewer: &Viewer,
        msg_id: MsgId,
    ) -> Result<MessageHistory, FleetError> {
        self.views.message_history(viewer, msg_id).await
    }
}
