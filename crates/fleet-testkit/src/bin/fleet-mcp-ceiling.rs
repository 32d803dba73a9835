//! `fleet-mcp-ceiling --listen-fd N`: a bare MCP tool server on the stack fleetd's is built on
//! — rmcp's Streamable HTTP service (stateless or session protocol, JSON responses) nested in
//! axum, `TCP_NODELAY` on every connection, a multi-threaded tokio runtime — serving one tool,
//! `empty`, that does nothing, on the listening socket it inherits as descriptor `N`. What a
//! client's calls to it cost is the ceiling of any gateway that speaks MCP this way: `fleet-bench
//! throughput` measures fleetd against it. With `--db PATH` it also serves `commit`, which
//! stores its text as one row of a SQLite database in fleetd's mode (WAL, `synchronous =
//! NORMAL`), one transaction per call, before it answers: the ceiling of a gateway that keeps
//! every message it accepts. With `--list FILE` its `list` tool answers the JSON array in
//! `FILE` (fleetd's `fleet_list` entries, say): the ceiling of any MCP server answering that
//! many entries. With `--direct` a `tools/call` of `empty` is answered in the HTTP request's own
//! task — its body parsed into rmcp's own message type, its answer written from rmcp's own types
//! — without rmcp's per-request service, its spawned serve loop and the channels between them
//! (anything else still goes to rmcp): what that machinery costs a call is the difference.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use clap::Parser;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    JsonRpcRequest, ListToolsResult, PaginatedRequestParams, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_router};

/// Its command line.
#[derive(Debug, Parser)]
struct Args {
    /// The listening TCP socket to serve on, inherited as this descriptor.
    #[arg(long)]
    listen_fd: RawFd,
    /// Where `commit` stores its rows (a new SQLite database); without it `commit` fails.
    #[arg(long)]
    db: Option<PathBuf>,
    /// A JSON array `list` answers with (as `{"entities": [...]}`); without it, an empty one.
    #[arg(long)]
    list: Option<PathBuf>,
    /// Answer a `tools/call` of `empty` without rmcp's per-request service.
    #[arg(long)]
    direct: bool,
}

/// The largest request body `--direct` reads (rmcp's own default limit).
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// `--direct`: a `tools/call` of `empty` answered here, as rmcp would answer it; any other
/// request (or one that does not parse) goes on to rmcp with its body as it came.
async fn direct(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, BODY_LIMIT).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    if let Ok(ClientJsonRpcMessage::Request(JsonRpcRequest {
        id,
        request: ClientRequest::CallToolRequest(call),
        ..
    })) = serde_json::from_slice(&bytes)
        && call.params.name == "empty"
    {
        let result = CallToolResult::structured(serde_json::json!({"ok": true}));
        let answer = ServerJsonRpcMessage::response(ServerResult::CallToolResult(result), id);
        return match serde_json::to_vec(&answer) {
            Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        };
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The arguments of `commit`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Text {
    /// What to store.
    text: String,
}

/// The database `commit` writes, opened once.
static DB: OnceLock<Arc<Mutex<rusqlite::Connection>>> = OnceLock::new();

/// The entries `list` answers with, read once.
static LIST: OnceLock<serde_json::Value> = OnceLock::new();

/// The handler: one tool, its router built once and shared (as fleetd's is).
#[derive(Clone)]
struct Empty {
    tool_router: Arc<ToolRouter<Self>>,
}

#[tool_router]
impl Empty {
    /// Does nothing, and says so in a structured result (as fleetd's tools answer).
    #[tool(description = "Does nothing.")]
    async fn empty(&self) -> CallToolResult {
        CallToolResult::structured(serde_json::json!({"ok": true}))
    }

    /// Answers the entries it was given, as a server answers what it holds in memory: each
    /// call builds its result from them, structured with its JSON as the text (as fleetd's
    /// `fleet_list` answers).
    #[tool(description = "Lists what it holds.")]
    async fn list(&self) -> CallToolResult {
        let entities = LIST
            .get()
            .cloned()
            .unwrap_or_else(|| serde_json::Value::Array(Vec::new()));
        CallToolResult::structured(serde_json::json!({ "entities": entities }))
    }

    /// Stores `text` as a row, committed before the answer.
    #[tool(description = "Stores a text durably.")]
    async fn commit(
        &self,
        Parameters(Text { text }): Parameters<Text>,
    ) -> Result<CallToolResult, ErrorData> {
        let db = DB
            .get()
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("no --db given", None))?;
        let stored = tokio::task::spawn_blocking(move || {
            let mut conn = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let tx = conn.transaction()?;
            tx.execute("INSERT INTO rows (text) VALUES (?1)", [&text])?;
            tx.commit()
        })
        .await;
        match stored {
            Ok(Ok(())) => Ok(CallToolResult::structured(serde_json::json!({"ok": true}))),
            Ok(Err(e)) => Err(ErrorData::internal_error(e.to_string(), None)),
            Err(e) => Err(ErrorData::internal_error(e.to_string(), None)),
        }
    }
}

/// Opens a new database at `path` in fleetd's mode, with the one table `commit` writes.
fn open(path: &std::path::Path) -> anyhow::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, text TEXT NOT NULL)",
    )?;
    Ok(conn)
}

impl Empty {
    fn new() -> Self {
        static TOOLS: OnceLock<Arc<ToolRouter<Empty>>> = OnceLock::new();
        Self {
            tool_router: Arc::clone(TOOLS.get_or_init(|| Arc::new(Self::tool_router()))),
        }
    }
}

impl ServerHandler for Empty {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.tool_router
            .call(ToolCallContext::new(self, request, ctx))
            .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_router.list_all()))
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.listen_fd > 2,
        "--listen-fd must name an inherited socket"
    );
    // SAFETY: the descriptor was handed to this process to own (fleet-bench makes it inheritable
    // for this child only), and nothing else in this process uses it.
    let owned = unsafe { OwnedFd::from_raw_fd(args.listen_fd) };
    let listener = std::net::TcpListener::from(owned);
    listener.set_nonblocking(true)?;
    if let Some(path) = &args.db {
        let conn = open(path).with_context(|| format!("opening {}", path.display()))?;
        let _ = DB.set(Arc::new(Mutex::new(conn)));
    }
    if let Some(path) = &args.list {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let entries: Vec<serde_json::Value> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON array", path.display()))?;
        let _ = LIST.set(serde_json::Value::Array(entries));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let config = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_json_response(true);
        let mcp = StreamableHttpService::new(
            || Ok(Empty::new()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let mut app = Router::new().nest_service("/mcp", mcp);
        if args.direct {
            app = app.layer(middleware::from_fn(direct));
        }
        let listener = listener.tap_io(|stream| {
            let _ = stream.set_nodelay(true);
        });
        axum::serve(listener, app)
            .await
            .context("the HTTP server failed")
    })
}
