//! The MCP server: the fleet's tools over Streamable HTTP (rmcp). Every tool is a thin shim:
//! it finds the caller the HTTP layer authenticated, checks the parameters' shape, and hands
//! over to the gateway. Both the stateless 2026-07-28 protocol and the older session protocol
//! are served by the same handler; identity is read per HTTP request in both.

mod arguments;
pub mod direct;
mod errors;
pub mod params;
mod written;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use fleet_core::ownership::parse_shares;
use fleet_core::{ErrorCode, FleetError, MsgId, Role};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ProtocolVersion,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::gateway::{
    Caller, ConsultRequest, Gateway, ListFilter, ListResult, PollResult, ReplyResult, SendResult,
    SpawnRequest,
};
use crate::limits::{CallSlot, CallSlots};
use crate::metrics::Served;
use params::{
    AskParams, BroadcastParams, ConsultParams, ListParams, PollParams, ReplyParams, SendParams,
    SendTarget, SpawnParams, StopParams,
};

/// How often a long call (spawn, send, ask, poll, consult) tells its client it is still
/// waiting, when the client asked for progress. opencode gives a call up after six of these
/// without a word (see `launch::opencode`).
pub(crate) const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// The longest a call may wait, in seconds.
pub const MAX_CALL_WAIT_S: u64 = 3600;
/// How long `fleet_send` waits for an answer when not told.
pub const DEFAULT_SEND_WAIT_S: u64 = 60;
/// How long `fleet_ask` waits for the answer when the call does not say.
pub const DEFAULT_ASK_WAIT_S: u64 = 300;
/// How long `fleet_consult` waits for the architects' answers when the call does not say.
pub const DEFAULT_CONSULT_WAIT_S: u64 = crate::gateway::DEFAULT_CONSULT_WAIT.as_secs();

/// Every tool fleetd serves, by name.
pub const TOOLS: [&str; 9] = [
    "fleet_list",
    "fleet_spawn",
    "fleet_send",
    "fleet_reply",
    "fleet_ask",
    "fleet_poll",
    "fleet_broadcast",
    "fleet_consult",
    "fleet_stop",
];

/// The MCP handler; one per request or session, all sharing the gateway.
#[derive(Clone)]
pub struct FleetMcp {
    /// The gateway behind every tool.
    gateway: Arc<Gateway>,
    /// The places for long calls, per caller (shared by every handler).
    calls: Arc<CallSlots>,
    /// The tools: built once, shared by every handler (a stateless client gets a handler per
    /// request, and building the router each time was a good part of a call's cost).
    tool_router: Arc<ToolRouter<Self>>,
    /// The tool calls in flight, which a shutdown lets end before it closes MCP's transport.
    in_flight: TaskTracker,
}

impl FleetMcp {
    /// A handler over `gateway`, its long calls counted in `calls`, each call in flight
    /// tracked by `in_flight`.
    pub fn new(gateway: Arc<Gateway>, calls: Arc<CallSlots>, in_flight: TaskTracker) -> Self {
        static TOOLS: OnceLock<Arc<ToolRouter<FleetMcp>>> = OnceLock::new();
        Self {
            gateway,
            calls,
            tool_router: Arc::clone(TOOLS.get_or_init(|| Arc::new(Self::tool_router()))),
            in_flight,
        }
    }

    /// A place for a long call of `caller` to `tool` when `long` (a call that returns at
    /// once needs none), or `too_many`; the place is given back when the call ends.
    fn long_call(
        &self,
        caller: &Caller,
        tool: &str,
        long: bool,
    ) -> Result<Option<CallSlot>, FleetError> {
        long.then(|| self.calls.take(caller.entity.gid, tool))
            .transpose()
    }

    /// The input schema of the tool named `name`, if it is one of ours.
    fn schema(&self, name: &str) -> Option<Arc<rmcp::model::JsonObject>> {
        self.tool_router
            .get(name)
            .map(|known| Arc::clone(&known.input_schema))
    }

    /// `fleet_list` for `caller`.
    fn listing(
        &self,
        caller: Result<Caller, FleetError>,
        p: ListParams,
    ) -> Result<ListResult, FleetError> {
        let filter = ListFilter::new(p.group, p.status, p.host)?;
        let mut list = self.gateway.list(&caller?)?;
        list.entities.retain(|e| filter.admits(e));
        Ok(list)
    }

    /// `fleet_send` for `caller`, cancelled by `ct`.
    async fn sending(
        &self,
        caller: Result<Caller, FleetError>,
        p: SendParams,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        send(&self.gateway, &self.calls, &caller?, p, ct).await
    }

    /// `fleet_reply` for `caller`.
    async fn replying(
        &self,
        caller: Result<Caller, FleetError>,
        p: ReplyParams,
    ) -> Result<ReplyResult, FleetError> {
        let caller = caller?;
        let in_reply_to = p
            .in_reply_to
            .as_deref()
            .map(|id| msg_id(id, "in_reply_to"))
            .transpose()?;
        self.gateway.reply(&caller, p.message, in_reply_to).await
    }

    /// `fleet_poll` for `caller`, cancelled by `ct`.
    async fn polling(
        &self,
        caller: Result<Caller, FleetError>,
        p: PollParams,
        ct: &CancellationToken,
    ) -> Result<PollResult, FleetError> {
        let caller = caller?;
        let wait = wait(p.wait_s, 0)?;
        let _slot = self.long_call(&caller, "fleet_poll", !wait.is_zero())?;
        self.gateway
            .poll(&caller, p.from.as_deref(), wait, ct)
            .await
    }
}

/// `fleet_send` for `caller`, over MCP or the operator API alike: the wait checked, a long call
/// counted against the caller's cap, the message to a recipient, a peer lead's coordination
/// id, or a worker's question.
pub async fn send(
    gateway: &Arc<Gateway>,
    calls: &Arc<CallSlots>,
    caller: &Caller,
    mut p: SendParams,
    ct: &CancellationToken,
) -> Result<SendResult, FleetError> {
    let wait = wait(p.wait_s, DEFAULT_SEND_WAIT_S)?;
    let _slot = (!wait.is_zero())
        .then(|| calls.take(caller.entity.gid, "fleet_send"))
        .transpose()?;
    match p.target()? {
        SendTarget::To(to, message) => gateway.send(caller, &to, message, wait, ct).await,
        SendTarget::Coord(coord_id, message) => {
            gateway.coordinate(caller, &coord_id, message).await
        }
        SendTarget::Turn(turn, message) => gateway.answer(caller, &turn, message, wait, ct).await,
        SendTarget::Choice(turn, choice) => {
            gateway.choose_for(caller, &turn, &choice, wait, ct).await
        }
    }
}

/// The span a tool call runs in: the tool's name (already made inert) and its caller's.
fn call_span(tool: &str, caller: Option<&Caller>) -> tracing::Span {
    let span = tracing::info_span!("call", tool = %tool, caller = tracing::field::Empty);
    if let Some(caller) = caller {
        span.record("caller", tracing::field::display(&caller.entity.name));
    }
    span
}

/// The caller the HTTP layer put into this request.
fn caller(ctx: &RequestContext<RoleServer>) -> Result<Caller, FleetError> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
        .ok_or_else(|| FleetError::new(ErrorCode::Forbidden, "this request carries no identity"))
}

/// Runs `work`, sending the client a progress notification every [`PROGRESS_INTERVAL`] while
/// it runs (if the request carries a progress token).
async fn with_progress<T>(
    ctx: &RequestContext<RoleServer>,
    what: &str,
    work: impl Future<Output = T>,
) -> T {
    let (_quiet, events) = mpsc::unbounded_channel();
    with_progress_events(ctx, what, events, work).await
}

/// [`with_progress`], also telling the client each line `events` hears as it comes.
async fn with_progress_events<T>(
    ctx: &RequestContext<RoleServer>,
    what: &str,
    events: mpsc::UnboundedReceiver<String>,
    work: impl Future<Output = T>,
) -> T {
    let Some(token) = ctx.meta.get_progress_token() else {
        return work.await;
    };
    let notify = |note| async {
        if let Err(e) = ctx.peer.notify_progress(note).await {
            tracing::debug!(error = %e, "cannot send progress");
        }
    };
    progressing(token, what, events, work, notify).await
}

/// Runs `work`, handing `notify` a progress notification for `token` every
/// [`PROGRESS_INTERVAL`] while it runs, and one for each line `events` hears.
async fn progressing<T, Told: Future<Output = ()>>(
    token: ProgressToken,
    what: &str,
    mut events: mpsc::UnboundedReceiver<String>,
    work: impl Future<Output = T>,
    notify: impl Fn(ProgressNotificationParam) -> Told,
) -> T {
    tokio::pin!(work);
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval_at(started + PROGRESS_INTERVAL, PROGRESS_INTERVAL);
    let mut told = 0u32;
    loop {
        let message = tokio::select! {
            out = &mut work => return out,
            _ = ticks.tick() => {
                format!("{what}: still waiting after {} s", started.elapsed().as_secs())
            }
            Some(event) = events.recv() => {
                told += 1;
                format!("{what}: {event}")
            }
        };
        let note = ProgressNotificationParam::new(
            token.clone(),
            started.elapsed().as_secs_f64() + f64::from(told),
        )
        .with_message(message);
        notify(note).await;
    }
}

/// The wait a call asks for (`wait_s`, else `default_s`), refused past [`MAX_CALL_WAIT_S`].
pub fn wait(wait_s: Option<u64>, default_s: u64) -> Result<Duration, FleetError> {
    match wait_s.unwrap_or(default_s) {
        s if s > MAX_CALL_WAIT_S => Err(FleetError::invalid(format!(
            "wait_s is {s}; it may be at most {MAX_CALL_WAIT_S}"
        ))),
        s => Ok(Duration::from_secs(s)),
    }
}

fn msg_id(text: &str, what: &str) -> Result<MsgId, FleetError> {
    text.trim()
        .parse()
        .map_err(|_| FleetError::invalid(format!("{what} '{text}' is not a message id")))
}

#[tool_router]
impl FleetMcp {
    #[tool(
        description = "List the fleet: every live lead and worker with gid, name, host, role, \
profile, status (spawning, idle, busy, asking, blocked, stopping) and groups, plus your own identity and the \
hosts. In a big fleet, ask for fewer: group, status and host each keep only the entities that \
match."
    )]
    async fn fleet_list(
        &self,
        Parameters(p): Parameters<ListParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        errors::result(self.listing(caller(&ctx), p))
    }

    #[tool(
        description = "Start a worker from a configured profile in a new pane. Returns once \
the worker is ready for tasks (it has called in), or fails with not_ready; or, when its program \
stops on a dialog of its own while starting (a folder's trust, say), with status blocked and \
that dialog: answer it with fleet_send{turn_id, choice}, which returns once the worker is ready \
(or shows the next dialog; on another host, once the choice is sent). Leads only."
    )]
    async fn fleet_spawn(
        &self,
        Parameters(p): Parameters<SpawnParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = async {
            let caller = caller(&ctx)?;
            let _slot = self.long_call(&caller, "fleet_spawn", true)?;
            let request = SpawnRequest {
                profile: p.profile,
                name: p.name,
                host: p.host,
                cwd: p.cwd.map(PathBuf::from),
                groups: p.groups.unwrap_or_default(),
                role: Role::Worker,
                share: parse_shares(
                    p.share.iter().flatten().map(String::as_str),
                    self.gateway.host_id(),
                )?,
            };
            self.gateway.spawn(&caller, request, &ctx.ct).await
        };
        errors::result(with_progress(&ctx, "fleet_spawn", outcome).await)
    }

    #[tool(
        description = "Send a message. To a worker it is typed into the worker's pane as a \
task once the worker is idle; waits up to wait_s seconds for the answer and returns it \
(status replied), or status failed with the reason, or status asked when a worker asks you \
something mid-task (answer with fleet_send{turn_id, message}, which then waits for that task's \
answer), or status blocked when a worker's own program stopped on a dialog (a permission \
prompt: its text is in prompt; answer with fleet_send{turn_id, choice}, choice one of choices, \
and only that choice's key is pressed), or status pending with the msg_id: a later answer is held for fleet_poll. Workers may \
send only to their lead. A lead may send coordination to a peer lead of another fleet by its \
coord_id instead of to: held for that lead's fleet_poll, it returns at once (status pending)."
    )]
    async fn fleet_send(
        &self,
        Parameters(p): Parameters<SendParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = self.sending(caller(&ctx), p, &ctx.ct);
        errors::result(with_progress(&ctx, "fleet_send", outcome).await)
    }

    #[tool(
        description = "Answer a message: your task in flight by default, or the message \
whose msg_id you give as in_reply_to. The answer is held for whoever sent it."
    )]
    async fn fleet_reply(
        &self,
        Parameters(p): Parameters<ReplyParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        errors::result(self.replying(caller(&ctx), p).await)
    }

    #[tool(
        description = "Ask your lead a question in the middle of a task and wait up to wait_s \
seconds for the answer (the lead answers with fleet_send{turn_id}). Live only: if the lead is \
not waiting in a fleet call it fails at once with no_waiter; then decide yourself and say so in \
your fleet_reply."
    )]
    async fn fleet_ask(
        &self,
        Parameters(p): Parameters<AskParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = async {
            let caller = caller(&ctx)?;
            let wait = wait(p.wait_s, DEFAULT_ASK_WAIT_S)?;
            let _slot = self.long_call(&caller, "fleet_ask", true)?;
            self.gateway.ask(&caller, p.question, wait, &ctx.ct).await
        };
        errors::result(with_progress(&ctx, "fleet_ask", outcome).await)
    }

    #[tool(
        description = "Collect messages held for you (answers that came after a send \
returned pending, failure notices, messages from workers), oldest first, each handed out once, \
and the questions workers are asking you now (asks: answer each with fleet_send{turn_id, \
message}), and the dialogs workers' programs stopped on (blocked: answer each with \
fleet_send{turn_id, choice}). \
Waits up to wait_s seconds for the first one; from filters by sender."
    )]
    async fn fleet_poll(
        &self,
        Parameters(p): Parameters<PollParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = self.polling(caller(&ctx), p, &ctx.ct);
        errors::result(with_progress(&ctx, "fleet_poll", outcome).await)
    }

    #[tool(
        description = "Broadcast one message to every worker of the fleet, on every host, or \
to the workers of one group. Each copy is typed in as a task when its worker is free; answers \
come back as ordinary replies (collect them with fleet_poll). For identical announcements; \
send tailored briefs one by one. Leads only."
    )]
    async fn fleet_broadcast(
        &self,
        Parameters(p): Parameters<BroadcastParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = async {
            let caller = caller(&ctx)?;
            self.gateway.broadcast(&caller, p.message, p.group).await
        };
        errors::result(outcome.await)
    }

    #[tool(
        description = "Consult the advisory architects (configured under [architects], on \
different model families): each is started afresh, gets the same brief at the same moment, \
and answers on its own. Waits up to wait_s seconds (default 600) for every answer and returns \
them in slot order: architect, profile, model, family (its maker: anthropic, openai, google …; \
null when unknown), host, status (answered, failed, timeout, asking, working), text, ms. An architect's question ends the wait as on fleet_send: answer it with \
fleet_send{turn_id, message}. Architects are stopped once they answered (or kept keep_s for a \
follow-up by name); a late answer is held for fleet_poll. Leads only."
    )]
    async fn fleet_consult(
        &self,
        Parameters(p): Parameters<ConsultParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (tell, events) = mpsc::unbounded_channel();
        let outcome = async {
            let caller = caller(&ctx)?;
            let wait = wait(p.wait_s, DEFAULT_CONSULT_WAIT_S)?;
            let _slot = self.long_call(&caller, "fleet_consult", true)?;
            let request = ConsultRequest {
                brief: p.brief,
                wait,
                slots: p.slots,
            };
            self.gateway.consult(&caller, request, tell, &ctx.ct).await
        };
        errors::result(with_progress_events(&ctx, "fleet_consult", events, outcome).await)
    }

    #[tool(
        description = "Stop a worker: closes its pane and ends its session; messages still \
on their way to it fail and their senders are told. Leads only."
    )]
    async fn fleet_stop(
        &self,
        Parameters(p): Parameters<StopParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = async {
            let caller = caller(&ctx)?;
            self.gateway.stop(&caller, &p.to).await
        };
        errors::result(outcome.await)
    }
}

#[tool_handler(router = self.tool_router, name = "fleetd", instructions = "fleetd runs a fleet of terminal coding agents. A lead spawns workers (fleet_spawn), sends them tasks (fleet_send, which waits for the answer) and collects answers that came late (fleet_poll); it may consult its advisory architects, on different model families, with one brief (fleet_consult). A worker answers its task with fleet_reply, and may ask its lead a question mid-task with fleet_ask (the lead answers with fleet_send{turn_id}). fleet_list shows who is there.")]
impl ServerHandler for FleetMcp {
    /// Every tool call runs in a span naming the tool and its caller, so each log line of the
    /// call says whose it was.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.gateway.tool_called(&request.name, Served::Rmcp);
        // The tool's name is whatever the caller sent: logged inert and short.
        let tool = crate::logs::shown(&request.name);
        let span = call_span(&tool, caller(&ctx).ok().as_ref());
        let _in_flight = self.in_flight.token();
        let schema = self.schema(&request.name);
        if let Some(why) = schema
            .as_deref()
            .and_then(|schema| arguments::misfit(&tool, schema, request.arguments.as_ref()))
        {
            return Ok(errors::failed(&FleetError::new(ErrorCode::InvalidParams, why)).into());
        }
        let call = ToolCallContext::new(self, request, ctx);
        let answer = self.tool_router.call(call).instrument(span).await;
        match (answer, schema) {
            (Ok(CallToolResponse::Complete(result)), Some(schema)) => {
                Ok(errors::unparsed(result, &tool, &schema).into())
            }
            (answer, _) => answer,
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        if let Ok(caller) = caller(&ctx) {
            self.gateway.listed_tools(&caller).await;
        }
        let mut result = ListToolsResult::with_all_items(self.tool_router.list_all());
        // The same list for every caller, but listed afresh each time: the listing is how a
        // Claude Code worker shows it is ready.
        if ctx
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
        {
            result = result.with_ttl_ms(0);
            result.cache_scope = Some(CacheScope::Public);
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use rmcp::model::NumberOrString;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_long_call_is_told_every_five_seconds_and_each_line_it_hears() {
        let notes = Mutex::new(Vec::new());
        let notify = |note: ProgressNotificationParam| {
            if let Ok(mut notes) = notes.lock() {
                notes.push((note.progress, note.message.unwrap_or_default()));
            }
            std::future::ready(())
        };
        let (tell, events) = mpsc::unbounded_channel();
        let work = async {
            tokio::time::sleep(Duration::from_secs(7)).await;
            let _ = tell.send("a line".to_string());
            tokio::time::sleep(Duration::from_secs(5)).await;
            "done"
        };
        let token = ProgressToken(NumberOrString::Number(1));
        let out = progressing(token, "fleet_send", events, work, notify).await;
        assert_eq!(out, "done");
        let notes = notes.into_inner().unwrap();
        assert_eq!(
            notes,
            [
                (5.0, "fleet_send: still waiting after 5 s".to_string()),
                (8.0, "fleet_send: a line".to_string()),
                (11.0, "fleet_send: still waiting after 10 s".to_string()),
            ]
        );
    }
}
