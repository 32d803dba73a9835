//! The HTTP front: `GET /healthz` and the MCP endpoint at `/mcp`, behind two layers:
//! a `Host`/`Origin` guard (DNS-rebinding defence: 403 unless the request names exactly one of
//! this gateway's authorities, see [`crate::authority`]) and bearer authentication (401 unless the token maps to a live entity).
//! The authenticated caller rides in the request's extensions down to the tool. The operator
//! surfaces (`/api/v1`, `/metrics`, the web view at `/ui`) take a lead's token, or the web
//! view's session cookie standing for one.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fleet_core::ErrorCode;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceBuilder;
use tracing::Instrument;

use crate::authority::{AllowedHosts, Refused};
use crate::gateway::{
    Caller, Event, Gateway, LiveStatus, MessagesQuery, NudgeTarget, ToldLive, Viewer, merged,
};
use crate::held::holding;
use crate::limits::{CallSlots, SessionLedger, StreamSlots, TokenHash, is_a_call};
use crate::logs::shown;
use crate::mcp::FleetMcp;
use crate::mcp::direct::Direct;
use crate::mcp::params::SendParams;
use crate::mcp_config::{self, PANE_HEADER, TMUX_HEADER};
use crate::openapi::{EventsQuery, HostsView, Refusal, ScreenQuery, StopBody};
use crate::token;
use crate::ui;
use crate::ui::SignedIn;
use crate::websession::{self, WebSessions};

fn refuse(status: StatusCode, code: &str, message: String) -> Response {
    let refusal = Refusal {
        error: code.to_string(),
        message,
    };
    let mut response = (status, axum::Json(refusal)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"fleetd\""),
        );
    }
    response
}

/// Runs each request in a span: its method, path and MCP session (the tool call inside names
/// its caller).
async fn trace_request(req: Request, next: Next) -> Response {
    // Anyone may send a request, authenticated or not: what it names is logged inert and short.
    let session = header_text(req.headers(), HEADER_SESSION_ID).map(shown);
    let path = shown(req.uri().path());
    let span = tracing::info_span!(
        "http",
        method = %req.method(),
        path = %path,
        session = session.as_deref().map(tracing::field::display),
    );
    next.run(req).instrument(span).await
}

async fn guard_host(
    State(allowed): State<Arc<AllowedHosts>>,
    req: Request,
    next: Next,
) -> Response {
    let host = header_text(req.headers(), header::HOST.as_str());
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .map(|origin| origin.to_str().unwrap_or("(not text)"));
    let changes = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let why = match allowed.check(host, origin, changes) {
        Ok(()) => return next.run(req).await,
        Err(Refused::Host) => format!(
            "Host '{}' is not this gateway: fleetd answers only requests to loopback at the port it listens on, or to its advertised URL's host and port",
            shown(host.unwrap_or_default())
        ),
        Err(Refused::Origin) => format!(
            "Origin '{}' may not call fleetd: only pages of this gateway's own origin may",
            shown(origin.unwrap_or_default())
        ),
        Err(Refused::CrossOrigin) => format!(
            "Origin '{}' is not the origin this request was made to: only the web view's own page may change anything",
            shown(origin.unwrap_or_default())
        ),
    };
    refuse(StatusCode::FORBIDDEN, "forbidden", why)
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The bearer token of a request, or what is wrong with it (refused `401`).
fn bearer(headers: &HeaderMap) -> Result<&str, String> {
    let bearer = header_text(headers, header::AUTHORIZATION.as_str())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty());
    let Some(bearer) = bearer else {
        return Err("missing bearer token: send Authorization: Bearer <token> (`fleetd token NAME` prints a lead's or operator's token; `fleetd mcp-config NAME` a lead's whole MCP client config)".into());
    };
    if let Some(why) = mcp_config::unexpanded(bearer) {
        return Err(why);
    }
    Ok(bearer)
}

/// Notes that the connection `req` came on authenticated: it is never closed to make room for
/// a stranger's (see [`crate::listener`]).
fn proven(req: &Request) {
    if let Some(conn) = req.extensions().get::<crate::listener::Conn>() {
        conn.proven();
    }
}

async fn authenticate(
    State(gateway): State<Arc<Gateway>>,
    mut req: Request,
    next: Next,
) -> Response {
    let bearer = match bearer(req.headers()) {
        Ok(bearer) => bearer,
        Err(why) => return refuse(StatusCode::UNAUTHORIZED, "unauthorized", why),
    };
    let nudge = NudgeTarget::from_headers(
        header_text(req.headers(), PANE_HEADER),
        header_text(req.headers(), TMUX_HEADER),
    );
    // Only a POST is the agent acting; a GET stream (re)connecting proves nothing about a submit.
    let acting = req.method() == Method::POST;
    let hash = token::hash(bearer);
    match gateway.authenticate(hash, nudge, acting).await {
        Ok(Ok(caller)) => {
            proven(&req);
            req.extensions_mut().insert(caller);
            req.extensions_mut().insert(TokenHash(hash));
            next.run(req).await
        }
        Ok(Err(why)) => refuse(StatusCode::UNAUTHORIZED, "unauthorized", why),
        Err(e) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.code.as_str(),
            e.message,
        ),
    }
}

/// `GET /api/v1/roster`: the roster as the lead's `fleet_list` shows it, with what waits for
/// each of this host's entities (see [`viewers_only`]).
async fn api_roster(
    State(gateway): State<Arc<Gateway>>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    answered(gateway.roster(&viewer).await)
}

/// What the operator surfaces check a request against: the gateway's leads and operators,
/// and the web view's sessions.
#[derive(Clone)]
struct Operators {
    gateway: Arc<Gateway>,
    web: Arc<WebSessions>,
    /// The event streams each token holds open.
    streams: Arc<StreamSlots>,
}

/// What a request to the operator surfaces came with, kept so a long stream can check it
/// again.
#[derive(Clone, Debug)]
enum Credential {
    /// A bearer token, by its hash.
    Bearer([u8; 32]),
    /// The web view's session: every cookie of its name the browser sent (a program on another
    /// port of the host may have set one more), and the key its page sent.
    Session {
        cookies: Vec<String>,
        key: Option<String>,
    },
}

/// Why a request to the operator surfaces is turned away.
#[derive(Debug)]
struct Denied {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Denied {
    fn unauthorized(message: String) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthorized",
            message,
        }
    }

    fn response(self) -> Response {
        refuse(self.status, self.code, self.message)
    }
}

impl Credential {
    /// What `headers` carry: a bearer token, else a session cookie (with its key, if sent).
    fn of(headers: &HeaderMap) -> Result<Self, Denied> {
        let cookies: Vec<String> = header_text(headers, header::COOKIE.as_str())
            .map(|cookies| websession::cookie_values(cookies, websession::COOKIE))
            .unwrap_or_default()
            .into_iter()
            .map(str::to_string)
            .collect();
        if !cookies.is_empty() && !headers.contains_key(header::AUTHORIZATION) {
            return Ok(Credential::Session {
                cookies,
                key: header_text(headers, websession::KEY_HEADER).map(str::to_string),
            });
        }
        match bearer(headers) {
            Ok(bearer) => Ok(Credential::Bearer(token::hash(bearer))),
            Err(why) => Err(Denied::unauthorized(why)),
        }
    }
}

impl Operators {
    /// Who `credential` stands for now (with its web session and the cookie that opened it,
    /// if it is one), or the refusal.
    fn viewer(
        &self,
        credential: &Credential,
    ) -> Result<(Viewer, Option<SignedIn>, TokenHash), Denied> {
        let (hash, session) = match credential {
            Credential::Bearer(hash) => (*hash, None),
            Credential::Session { cookies, key } => {
                match self
                    .web
                    .find_any(cookies, key.as_deref(), std::time::Instant::now())
                {
                    Ok((cookie, session)) => (session.token_hash, Some(SignedIn { cookie })),
                    Err(websession::Refused::Ended) => {
                        return Err(Denied::unauthorized(
                            "your web session has ended (signed out, expired, or fleetd restarted): sign in again at /ui".into(),
                        ));
                    }
                    Err(websession::Refused::WrongKey) => {
                        return Err(Denied::unauthorized(format!(
                            "a web session opens nothing without its key in {}, which only the page that signed in holds: sign in again at /ui",
                            websession::KEY_HEADER
                        )));
                    }
                }
            }
        };
        match self.gateway.viewer(&hash) {
            Ok(Some(viewer)) => Ok((viewer, session, TokenHash(hash))),
            Ok(None) => {
                if let Some(signed_in) = &session {
                    self.web.close(&signed_in.cookie);
                }
                Err(Denied::unauthorized(
                    "only a lead's or an operator's token may use this (`fleetd token NAME` prints one); a token rotated since sign-in no longer does".into(),
                ))
            }
            Err(e) => Err(Denied {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: e.code.as_str(),
                message: e.message,
            }),
        }
    }
}

/// Lets through only a lead or an operator ([`Viewer`]): its bearer token, or the web view's
/// session (its cookie and, on every request, its key: see [`crate::websession`]). It does not
/// count the request as a lead calling in (the operator surfaces: `/metrics`, `/api/v1`, the
/// web view's). The viewer is in the request's extensions, with what it came with (for a long
/// stream to check again) and its web session, if any. What each may do is the gateway's to
/// say (an operator sends nothing, reads no text). Nothing it answers is to be cached.
async fn viewers_only(State(ops): State<Operators>, mut req: Request, next: Next) -> Response {
    let checked = Credential::of(req.headers()).and_then(|credential| {
        let (viewer, session, hash) = ops.viewer(&credential)?;
        Ok((credential, viewer, session, hash))
    });
    let (credential, viewer, session, hash) = match checked {
        Ok(checked) => checked,
        Err(denied) => return denied.response(),
    };
    proven(&req);
    if let Some(signed_in) = session {
        req.extensions_mut().insert(signed_in);
    }
    req.extensions_mut().insert(viewer);
    req.extensions_mut().insert(hash);
    req.extensions_mut().insert(credential);
    req.extensions_mut().insert(ops);
    let mut response = next.run(req).await;
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// The HTTP status of a refused operator request.
fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidParams | ErrorCode::TooLarge => StatusCode::BAD_REQUEST,
        ErrorCode::UnknownRecipient => StatusCode::NOT_FOUND,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::Gone => StatusCode::GONE,
        ErrorCode::TooMany => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `GET /api/v1/messages?state=&kind=&to=&from=&with=&since_ms=&before=&text=&limit=`: a page
/// of the messages of this gateway's store the viewer may see (a lead: those it sent or
/// received; an operator: all), newest first, their text only with `text=true`, to a lead (see
/// [`viewers_only`]); with how many there are in all, and where the next page starts.
async fn api_messages(
    State(gateway): State<Arc<Gateway>>,
    Extension(viewer): Extension<Viewer>,
    query: Result<Query<MessagesQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejected) => return bad_query(&rejected),
    };
    answered(gateway.message_rows(&viewer, &query).await)
}

/// The refusal of a body that is not what the call takes, saying what is wrong with it.
fn bad_body(rejected: &JsonRejection) -> Response {
    refuse(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidParams.as_str(),
        inert(&rejected.body_text()),
    )
}

/// The most characters of a parser's refusal an answer repeats.
const REFUSAL_CHARS: usize = 500;

/// A parser's refusal as an answer repeats it: it may quote what the caller sent, so it is
/// made inert and cut short.
fn inert(refusal: &str) -> String {
    fleet_core::inert::cut(refusal, REFUSAL_CHARS)
}

/// A gateway call's answer as the operator API gives it.
fn answered<T: serde::Serialize>(outcome: Result<T, fleet_core::FleetError>) -> Response {
    match outcome {
        Ok(value) => axum::Json(value).into_response(),
        Err(e) => refuse(status_of(e.code), e.code.as_str(), e.message),
    }
}

/// `POST /api/v1/send {to | coord_id | turn_id, message, wait_s?}`: `fleet_send` as the lead,
/// with its parameters, rules and answer (see [`viewers_only`]).
async fn api_send(
    State(gateway): State<Arc<Gateway>>,
    Extension(viewer): Extension<Viewer>,
    Extension(calls): Extension<Arc<CallSlots>>,
    body: Result<axum::Json<SendParams>, JsonRejection>,
) -> Response {
    let caller = match viewer.lead("send") {
        Ok(caller) => caller,
        Err(e) => return answered::<()>(Err(e)),
    };
    let params = match body {
        Ok(axum::Json(params)) => params,
        Err(rejected) => return bad_body(&rejected),
    };
    // A client that goes away drops this call: the answer is then held for the lead.
    let ct = CancellationToken::new();
    answered(crate::mcp::send(&gateway, &calls, caller, params, &ct).await)
}

/// `POST /api/v1/stop {to}`: `fleet_stop` as the lead, or an operator's stop (see
/// [`viewers_only`]).
async fn api_stop(
    State(gateway): State<Arc<Gateway>>,
    Extension(viewer): Extension<Viewer>,
    body: Result<axum::Json<StopBody>, JsonRejection>,
) -> Response {
    match body {
        Ok(axum::Json(body)) => answered(gateway.stop_as(&viewer, &body.to).await),
        Err(rejected) => bad_body(&rejected),
    }
}

/// How often an idle feed looks for new changes.
const FEED_LOOK: std::time::Duration = std::time::Duration::from_millis(200);

/// `GET /api/v1/events`: the live feed, as server-sent events (each one JSON [`Event`]; one the
/// store recorded has its `seq` as the event id, so a client reconnecting with
/// `Last-Event-ID` misses nothing stored; a status told live only has none); it ends when
/// fleetd shuts down (see [`viewers_only`]).
async fn api_events(
    Extension(viewer): Extension<Viewer>,
    Extension(credential): Extension<Credential>,
    Extension(ops): Extension<Operators>,
    Extension(Shutdown(shutdown)): Extension<Shutdown>,
    Extension(token): Extension<TokenHash>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejected) => return bad_query(&rejected),
    };
    let slot = ops.streams.take(token);
    let gateway = Arc::clone(&ops.gateway);
    // Listening before the store is read: a status reached in between is told live, and its
    // record in the store is then not told again.
    let live = gateway.live_statuses();
    let last = match gateway.feed_start().await {
        Ok(last) => last,
        Err(e) => return answered::<()>(Err(e)),
    };
    // A reconnecting EventSource names the last event it had, whatever its URL says; a point
    // past the last change (a state dir made anew since) is now.
    let resumed = header_text(&headers, "last-event-id").and_then(|id| id.trim().parse().ok());
    let after = resumed
        .or(query.after)
        .map_or(last, |after: i64| after.min(last));
    let feed = Feed {
        gateway,
        viewer,
        credential,
        ops,
        after,
        pending: std::collections::VecDeque::new(),
        live,
        told: ToldLive::default(),
        live_told: Vec::new(),
        looks: 0,
        ended: false,
    };
    let stream = futures_util::stream::unfold(feed, move |mut feed| {
        let shutdown = shutdown.clone();
        async move {
            let next = feed.next(&shutdown).await?;
            Some((Ok::<_, std::convert::Infallible>(next), feed))
        }
    });
    let cut = slot.ended.clone();
    holding(
        Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response(),
        slot,
        Some(cut),
    )
}

/// One client's live feed: what it has yet to be sent, and where it reads on from.
struct Feed {
    gateway: Arc<Gateway>,
    viewer: Viewer,
    credential: Credential,
    ops: Operators,
    after: i64,
    pending: std::collections::VecDeque<Event>,
    /// The statuses this host's sessions reach, as they do.
    live: broadcast::Receiver<LiveStatus>,
    /// Those of them it told lately.
    told: ToldLive,
    /// Those heard since the store was last read: sent in time among what it tells.
    live_told: Vec<Event>,
    /// Looks at the store since the credential was last checked.
    looks: u32,
    /// It failed and said so: nothing more comes.
    ended: bool,
}

/// How many looks at the store an open feed makes between checks of its credential (a
/// rotated token or an ended session ends it within about a second).
const LOOKS_PER_CHECK: u32 = 5;

impl Feed {
    /// The next event to send: a change, or an `error` event before the feed ends; none once
    /// it has ended (fleetd shutting down, the credential no longer good).
    async fn next(&mut self, shutdown: &CancellationToken) -> Option<SseEvent> {
        if self.ended {
            return None;
        }
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            if let Some(event) = self.pending.pop_front() {
                let sse = match event.seq {
                    Some(seq) => SseEvent::default().id(seq.to_string()),
                    None => SseEvent::default(),
                };
                return match sse.json_data(&event) {
                    Ok(sse) => Some(sse),
                    Err(e) => Some(self.failed(&format!("cannot write an event: {e}"))),
                };
            }
            self.looks += 1;
            if self.looks >= LOOKS_PER_CHECK {
                self.looks = 0;
                if self.ops.viewer(&self.credential).is_err() {
                    tracing::info!(who = %self.viewer.name(), "a live feed ended: its token or session is no longer good");
                    return None;
                }
            }
            let (events, next) = match self.gateway.feed(&self.viewer, self.after).await {
                Ok(read) => read,
                Err(e) => return Some(self.failed(&e.message)),
            };
            // A session tells a status before the store records it: whatever the store just
            // gave was told by now, so hearing after the read lets the stored copy be dropped.
            while let Some(status) = self.heard() {
                self.tell(&status);
            }
            let idle = next == self.after && self.live_told.is_empty();
            self.after = next;
            let told = &self.told;
            let stored = events.into_iter().filter(|e| told.keeps(e)).collect();
            let live = std::mem::take(&mut self.live_told);
            self.pending.extend(merged(stored, live));
            if idle {
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(FEED_LOOK) => {}
                    heard = self.live.recv() => match heard {
                        Ok(status) => self.tell(&status),
                        Err(broadcast::error::RecvError::Lagged(_)) => {}
                        // No session tells any more (fleetd is shutting down): look as before.
                        Err(broadcast::error::RecvError::Closed) => tokio::time::sleep(FEED_LOOK).await,
                    }
                }
            }
        }
    }

    /// A status told live since the last look, if one was; those a slow reader fell behind on
    /// are skipped (what the store keeps of them it still tells).
    fn heard(&mut self) -> Option<LiveStatus> {
        loop {
            match self.live.try_recv() {
                Ok(status) => return Some(status),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(_) => return None,
            }
        }
    }

    /// Takes `status` to be sent with what the store tells next, noting it told.
    fn tell(&mut self, status: &LiveStatus) {
        self.told
            .note(status.gid, status.status.as_str(), status.at_ms);
        self.live_told.push(status.event());
    }

    /// The `error` event that ends a feed which cannot go on, said in the log too.
    fn failed(&mut self, why: &str) -> SseEvent {
        tracing::warn!(who = %self.viewer.name(), why, "a live feed failed");
        self.ended = true;
        let refusal = Refusal {
            error: ErrorCode::Internal.as_str().to_string(),
            message: format!("the feed failed: {why}; read on with ?after={}", self.after),
        };
        SseEvent::default()
            .event("error")
            .json_data(&refusal)
            .unwrap_or_default()
    }
}

/// `GET /api/v1/messages/{msg_id}`: one of the lead's messages and every state it went through
/// (see [`viewers_only`]).
async fn api_message(
    State(gateway): State<Arc<Gateway>>,
    Extension(viewer): Extension<Viewer>,
    Path(msg_id): Path<String>,
) -> Response {
    match msg_id.parse() {
        Ok(msg_id) => answered(gateway.message_history(&viewer, msg_id).await),
        Err(_) => refuse(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidParams.as_str(),
            format!("'{}' is not a message id", msg_id.escape_debug()),
        ),
    }
}

/// `GET /api/v1/hosts`: the hosts of the fleet, this one first (see [`viewers_only`]).
async fn api_hosts(State(gateway): State<Arc<Gateway>>) -> Response {
    axum::Json(HostsView {
        hosts: gateway.hosts(),
    })
    .into_response()
}

/// `GET /api/v1/screen?name=`: what a worker's pane shows now, read-only (see [`viewers_only`]).
async fn api_screen(
    State(gateway): State<Arc<Gateway>>,
    Extension(viewer): Extension<Viewer>,
    query: Result<Query<ScreenQuery>, QueryRejection>,
) -> Response {
    match query {
        Ok(Query(query)) => answered(gateway.screen(&viewer, &query.name).await),
        Err(rejected) => bad_query(&rejected),
    }
}

/// The refusal of a query string that is not what the call takes, saying what is wrong.
fn bad_query(rejected: &QueryRejection) -> Response {
    refuse(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidParams.as_str(),
        inert(&rejected.body_text()),
    )
}

/// The cancellation of a shutting-down gateway, for the streams that must end with it.
#[derive(Clone)]
struct Shutdown(CancellationToken);

/// `GET /metrics`: the OpenMetrics text (see [`viewers_only`]).
async fn metrics(State(gateway): State<Arc<Gateway>>) -> Response {
    match gateway.metrics_text().await {
        Ok(text) => ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response(),
        Err(e) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.code.as_str(),
            e.message,
        ),
    }
}

/// `GET /api/v1/openapi.json`: the operator API's OpenAPI document (open to anyone who
/// reaches the gateway: it says what the API is, nothing of the fleet).
async fn openapi() -> Response {
    axum::Json(crate::openapi::document(env!("CARGO_PKG_VERSION"))).into_response()
}

/// `GET /healthz`: 200 while the gateway can really serve (every core loop alive and turning,
/// the store taking writes), else 503 naming what is wrong (see [`crate::health`]).
async fn healthz(State(gateway): State<Arc<Gateway>>) -> Response {
    let problems = gateway.problems();
    let (status, said) = if problems.is_empty() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy")
    };
    let mut body = json!({
        "status": said,
        "host_id": gateway.host_id(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    if !problems.is_empty() {
        body["problems"] = json!(problems);
    }
    (status, axum::Json(body)).into_response()
}

/// Holds each MCP session to the token that opened it, and its token to its cap: a request on
/// a session is noted (busy until its answer, a stream among them, is over); a session opened
/// over the token's cap closes the token's least recently used idle ones, or, when every one
/// has a call in flight, is closed again and answered 429.
async fn cap_sessions(
    State(ledger): State<Arc<SessionLedger>>,
    mut req: Request,
    next: Next,
) -> Response {
    let caller = req.extensions().get::<Caller>().map(|c| c.entity.clone());
    let (Some(caller), Some(token)) = (caller, req.extensions().get::<TokenHash>().copied()) else {
        return next.run(req).await;
    };
    if let Some(id) = header_text(req.headers(), HEADER_SESSION_ID) {
        // A call, or a broken call's stream resumed; not a client merely listening.
        let busy = is_a_call(
            req.method() == Method::POST,
            header_text(req.headers(), "last-event-id"),
        );
        let Ok(in_flight) = ledger.using(token, id.into(), busy) else {
            tracing::warn!(gid = %caller.gid, name = %caller.name, "REFUSED a request on an MCP session another token opened");
            return refuse(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such MCP session: start a new one (initialize)".into(),
            );
        };
        // The call holds the session busy as long as it runs (the MCP service keeps the
        // request's parts, this among them, for the tool), and so does its answer's stream:
        // a call whose connection dropped, to be resumed, is never closed for a new session.
        let in_flight = Arc::new(in_flight);
        req.extensions_mut().insert(Arc::clone(&in_flight));
        return holding(next.run(req).await, in_flight, None);
    }
    let opens = req.method() == Method::POST;
    let response = next.run(req).await;
    let Some(id) = header_text(response.headers(), HEADER_SESSION_ID).filter(|_| opens) else {
        return response;
    };
    match ledger.opened(token, id.into()).await {
        Ok(0) => response,
        Ok(closed) => {
            tracing::info!(gid = %caller.gid, name = %caller.name, closed, "closed the least recently used idle MCP sessions of a token at its cap, for its new one");
            response
        }
        Err(full) => {
            tracing::warn!(gid = %caller.gid, name = %caller.name, cap = %full, "REFUSED an MCP session over the cap");
            refuse(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::TooMany.as_str(),
                format!(
                    "'{}' already holds {} live MCP sessions with this token, each with a call in flight, the most allowed ({full}): wait for a call to return, or use the stateless protocol, which needs no session",
                    caller.name, full.count
                ),
            )
        }
    }
}

/// Holds each token to its cap of event streams: MCP's listening GET stream takes a place
/// while it is open (a token over its cap ends its oldest). A GET resuming a call's own stream
/// is that call's answer, not a stream to cap.
async fn cap_streams(
    State(streams): State<Arc<StreamSlots>>,
    req: Request,
    next: Next,
) -> Response {
    let token = req.extensions().get::<TokenHash>().copied();
    let resumes_a_call = is_a_call(false, header_text(req.headers(), "last-event-id"));
    let (true, false, Some(token)) = (req.method() == Method::GET, resumes_a_call, token) else {
        return next.run(req).await;
    };
    let slot = streams.take(token);
    let response = next.run(req).await;
    if is_event_stream(&response) {
        let cut = slot.ended.clone();
        holding(response, slot, Some(cut))
    } else {
        response
    }
}

/// Whether `response` is a stream of server-sent events.
fn is_event_stream(response: &Response) -> bool {
    header_text(response.headers(), header::CONTENT_TYPE.as_str())
        .is_some_and(|kind| kind.starts_with("text/event-stream"))
}

/// What one caller may hold open at once.
#[derive(Clone, Copy, Debug)]
pub struct CallerCaps {
    /// Long calls (`gateway.max_long_calls_per_caller`).
    pub long_calls: usize,
    /// MCP sessions (`gateway.max_sessions_per_token`).
    pub sessions: usize,
    /// Event streams (`gateway.max_streams_per_token`).
    pub streams: usize,
    /// How long a shutdown lets the tool calls in flight end before MCP's transport closes
    /// (the connections' half of `gateway.drain_timeout_s`).
    pub calls_drain: std::time::Duration,
}

/// The largest body `POST /api/v1/send` reads: room for a message of `max_message_bytes` however
/// JSON escapes it (six bytes a character at worst), so the gateway's own limit is what refuses
/// one too large, naming it; never under axum's default of 2 MiB.
fn send_body_limit(max_message_bytes: usize) -> usize {
    max_message_bytes
        .saturating_mul(6)
        .saturating_add(64 * 1024)
        .max(2 * 1024 * 1024)
}

/// The operator surfaces: a lead's token (or the web view's session for it) only, and no
/// call-in; long calls count against the caller's `calls`.
fn operator_routes(
    gateway: &Arc<Gateway>,
    web: &Arc<WebSessions>,
    streams: &Arc<StreamSlots>,
    calls: Arc<CallSlots>,
    shutdown: &CancellationToken,
) -> Router {
    Router::new()
        .route("/api/v1/roster", get(api_roster))
        .route("/api/v1/messages", get(api_messages))
        .route("/api/v1/messages/{msg_id}", get(api_message))
        .route("/api/v1/hosts", get(api_hosts))
        .route("/api/v1/events", get(api_events))
        .route("/api/v1/screen", get(api_screen))
        .route(
            "/api/v1/send",
            post(api_send).layer(axum::extract::DefaultBodyLimit::max(send_body_limit(
                gateway.max_message_bytes(),
            ))),
        )
        .route("/api/v1/stop", post(api_stop))
        .route("/metrics", get(metrics))
        .route("/ui/me", get(ui::me))
        .route("/ui/signout", post(ui::sign_out))
        .layer(Extension(calls))
        .layer(Extension(Shutdown(shutdown.child_token())))
        .layer(Extension(Arc::clone(web)))
        .layer(middleware::from_fn_with_state(
            Operators {
                gateway: Arc::clone(gateway),
                web: Arc::clone(web),
                streams: Arc::clone(streams),
            },
            viewers_only,
        ))
        .with_state(Arc::clone(gateway))
}

impl CallerCaps {
    /// The caps `[gateway]` sets.
    pub fn of(gateway: &crate::config::GatewayConfig) -> Self {
        Self {
            long_calls: gateway.max_long_calls_per_caller,
            sessions: gateway.max_sessions_per_token,
            streams: gateway.max_streams_per_token,
            calls_drain: std::time::Duration::from_secs(gateway.drain_timeout_s) / 2,
        }
    }
}

/// The token that closes MCP's transport (its streams, its sessions, and any call still in
/// it): cancelled once `shutdown` came and the tool calls `in_flight` ended (the long waits end
/// with the gateway, the others answer as usual), or `within` after it at the latest. Closed
/// at once, a call in flight would reach its client as an HTTP 500 — to a worker left
/// running through the stop, a call that may or may not have been done.
fn after_calls(
    shutdown: &CancellationToken,
    in_flight: &TaskTracker,
    within: std::time::Duration,
) -> CancellationToken {
    let close = CancellationToken::new();
    let (shutdown, in_flight, closing) = (shutdown.clone(), in_flight.clone(), close.clone());
    tokio::spawn(async move {
        shutdown.cancelled().await;
        in_flight.close();
        if tokio::time::timeout(within, in_flight.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                within_s = within.as_secs(),
                "tool calls still in flight at the end of their share of the drain: closed"
            );
        }
        closing.cancel();
    });
    close
}

/// Counts an MCP request (a POST: a call, a notification) in flight from its arrival until its
/// answer's head, so a shutdown that comes meanwhile lets it reach its handler (which counts
/// itself from there: [`FleetMcp`]) instead of closing the transport under it. A stream (GET)
/// is no call and is not counted.
async fn track_posts(
    State(in_flight): State<TaskTracker>,
    request: Request,
    next: Next,
) -> Response {
    let _in_flight = (request.method() == Method::POST).then(|| in_flight.token());
    next.run(request).await
}

/// The whole HTTP app, each caller held to `caps`. `shutdown` ends every open MCP stream and
/// call.
pub fn app(
    gateway: Arc<Gateway>,
    allowed: AllowedHosts,
    caps: CallerCaps,
    shutdown: &CancellationToken,
) -> Router {
    let handler_gateway = Arc::clone(&gateway);
    let calls = CallSlots::new(caps.long_calls);
    let operator_calls = Arc::clone(&calls);
    let sessions = Arc::new(LocalSessionManager::default());
    let ledger = SessionLedger::new(caps.sessions, Arc::clone(&sessions));
    let streams = StreamSlots::new(caps.streams);
    // Host checking is done once, by our guard, for every route alike. A stateless call that
    // answers without notifying first gets a plain JSON response, not a one-event SSE stream
    // (cheaper on both ends, and the connection is free again at once); one that reports
    // progress streams as before.
    let in_flight = TaskTracker::new();
    let handlers_in_flight = in_flight.clone();
    let closing = after_calls(shutdown, &in_flight, caps.calls_drain);
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_json_response(true)
        // rmcp's own body limit stays: the short way (`mcp::direct`) reads up to the same.
        .with_cancellation_token(closing.clone());
    let handler = FleetMcp::new(handler_gateway, calls, handlers_in_flight);
    let direct = Direct::new(handler.clone(), closing);
    let rmcp = Rmcp(Arc::new(StreamableHttpService::new(
        move || Ok(handler.clone()),
        sessions,
        config,
    )));
    let web = Arc::new(WebSessions::default());
    let operator = operator_routes(&gateway, &web, &streams, operator_calls, shutdown);
    // Layers run outside in: authentication first, so the session cap knows the caller. They
    // wrap the MCP service itself, not a route of a router: a router's layer boxes what it
    // wraps, and every request would clone each box in turn (a tenth of a call's CPU).
    let mcp = ServiceBuilder::new()
        .layer(middleware::from_fn_with_state(in_flight, track_posts))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&gateway),
            authenticate,
        ))
        .layer(middleware::from_fn_with_state(ledger, cap_sessions))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&streams),
            cap_streams,
        ))
        .layer(middleware::from_fn_with_state(
            direct,
            crate::mcp::direct::serve,
        ))
        .service(rmcp);
    let routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/api/v1/openapi.json", get(openapi))
        .with_state(Arc::clone(&gateway))
        .nest_service("/mcp", mcp)
        .merge(operator)
        .merge(ui::pages(gateway, web));
    // Around the whole router, likewise: every request, whatever its route (or none).
    let guarded = ServiceBuilder::new()
        .layer(middleware::from_fn(trace_request))
        .layer(middleware::from_fn_with_state(
            Arc::new(allowed),
            guard_host,
        ))
        .service(routes);
    Router::new().fallback_service(guarded)
}

/// rmcp's MCP service, shared: a request borrows it, where its own `Service` clones it whole.
#[derive(Clone)]
struct Rmcp(Arc<StreamableHttpService<FleetMcp, LocalSessionManager>>);

impl tower::Service<Request> for Rmcp {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures_util::future::BoxFuture<'static, Result<Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { Ok(service.handle(request).await.into_response()) })
    }
}
