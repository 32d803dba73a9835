//! The short way for the calls every round trip makes: a stateless (2026-07-28) `tools/call`
//! of `fleet_send`, `fleet_reply`, `fleet_poll` or `fleet_list`, plain in every respect, is
//! answered by fleetd itself (the tool in a task of its own, the answer written by the request's
//! handler), without rmcp's per-request service, its serve loop and the channels between them
//! (about a third of what a bare MCP call costs, see `docs/benchmarks.md`). The answer is the
//! JSON rmcp would give: the same handler code, its result written as rmcp writes it but without
//! the JSON tree rmcp's result type would hold its structured content in, whose keys are then in
//! the order of its text (rmcp's tree sorts them: [`super::written`]). Two other things differ,
//! neither an answer to a call that ends: a call cut short by a shutdown before
//! its first progress notice gets a 500 saying so (rmcp's says "empty response"), and so does a
//! tool that panics (rmcp's request would hang until its client gave up). Once a notice has
//! gone, a shutdown ends the stream, as rmcp's.
//!
//! A call that asks for progress gets its notices as on rmcp's path, every 5 s of a send's or a
//! poll's wait: an answer that comes first is plain JSON, and once a notice comes first the
//! notices and then the answer are an event stream.
//!
//! Only the plain case goes this way. Anything else goes on to rmcp untouched (its body as it
//! came), so every check and every error stays rmcp's own: the session protocol, a request
//! without the per-request `_meta`, a header rmcp would look into (`Mcp-Param-*`, a repeated or
//! encoded one, one that disagrees with the body), a body too big, arguments that do not
//! parse, any other method or tool.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use fleet_core::{ErrorCode, FleetError};
use rmcp::ServerHandler;
use rmcp::model::{
    JsonObject, JsonRpcVersion2_0, ProgressNotification, ProgressToken, ProtocolVersion, RequestId,
    RequestMetaObject, ServerJsonRpcMessage, ServerNotification,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::params::{ListParams, PollParams, ReplyParams, SendParams};
use super::written::written;
use super::{FleetMcp, arguments, call_span, progressing};
use crate::gateway::Caller;
use crate::metrics::Served;

/// The largest body a direct call may have: rmcp's own default limit, which fleetd keeps (a
/// bigger one goes to rmcp, which refuses it).
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// How often an event stream of progress notices says it is alive (rmcp's own interval).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The tools answered directly: those every round trip calls.
const HOT: [&str; 4] = ["fleet_list", "fleet_send", "fleet_reply", "fleet_poll"];

/// The protocol headers (lower case, as `http` keeps names).
const PROTOCOL_VERSION: &str = "mcp-protocol-version";
const METHOD: &str = "mcp-method";
const NAME: &str = "mcp-name";
const SESSION: &str = "mcp-session-id";
const PARAM_PREFIX: &str = "mcp-param-";

/// What answers direct calls: a handler like rmcp's, and the token a shutdown cancels once the
/// calls in flight had their share of the drain.
pub struct Direct {
    mcp: FleetMcp,
    closing: CancellationToken,
}

impl Direct {
    /// Direct calls answered by `mcp`, cut short when `closing` is cancelled.
    pub fn new(mcp: FleetMcp, closing: CancellationToken) -> Arc<Self> {
        Arc::new(Self { mcp, closing })
    }
}

/// A call fleetd answers itself: its request id, the tool's name, its arguments parsed, and
/// the token its progress notices carry, if it asked for them.
#[derive(Debug)]
struct Call {
    id: RequestId,
    name: String,
    tool: Tool,
    progress: Option<ProgressToken>,
}

/// The tool called, with its parameters; or why its arguments do not fit the tool (answered as
/// rmcp's path answers it, before the tool runs).
#[derive(Debug)]
enum Tool {
    List(ListParams),
    Send(SendParams),
    Reply(ReplyParams),
    Poll(PollParams),
    Misfit(String),
}

/// The middleware in front of rmcp's service: a plain stateless call of a hot tool answered
/// here, anything else passed on.
pub async fn serve(State(direct): State<Arc<Direct>>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST || !head_fits(request.headers()) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(bytes) => bytes,
        // Its length was said and within the limit: the body did not come whole.
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    let versions = direct.mcp.supported_protocol_versions();
    let call = parts.extensions.get::<Caller>().and_then(|caller| {
        let call = call_of(&parts.headers, &bytes, &versions, |name| {
            direct.mcp.schema(name)
        })?;
        Some((call, caller.clone()))
    });
    match call {
        Some((call, caller)) => answer(&direct, call, caller).await,
        None => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
}

/// What a direct call tells the writer of its answer, each written already: a progress notice,
/// or the answer (`None` if it could not be written).
enum Said {
    Notice(String),
    Answer(Option<Vec<u8>>),
}

impl Said {
    /// Its JSON, as an event's data.
    fn into_json(self) -> Option<String> {
        match self {
            Said::Notice(json) => Some(json),
            Said::Answer(json) => String::from_utf8(json?).ok(),
        }
    }
}

/// Answers `call` for `caller`, as rmcp would: the tool runs in a task of its own, so a client
/// that goes away cancels its waits (as rmcp's does) but not its half-done steps. An answer
/// that comes before any progress notice is plain JSON; once a notice comes first, the notices
/// and then the answer are an event stream.
async fn answer(direct: &Direct, call: Call, caller: Caller) -> Response {
    let ct = CancellationToken::new();
    let gone = ct.clone().drop_guard();
    let (told, mut said) = mpsc::unbounded_channel();
    let mcp = direct.mcp.clone();
    // In the request's span, as rmcp's handler is.
    tokio::spawn(async move { mcp.direct(call, caller, told, ct).await }.in_current_span());
    let first = tokio::select! {
        first = said.recv() => first,
        () = direct.closing.cancelled() => return shutting_down(),
    };
    let first = match first {
        Some(Said::Answer(Some(body))) => {
            gone.disarm();
            return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
        }
        Some(Said::Notice(notice)) => notice,
        Some(Said::Answer(None)) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot encode the answer",
            )
                .into_response();
        }
        None => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the call ended without an answer",
            )
                .into_response();
        }
    };
    // The stream holds the guard: a client that drops it cancels the call.
    let closing = direct.closing.clone();
    let events = futures_util::stream::unfold(
        (Some(first), said, gone, closing),
        |(first, mut said, gone, closing)| async move {
            let message = match first {
                Some(message) => message,
                // What the call has said goes out before a shutdown cuts the stream.
                None => tokio::select! {
                    biased;
                    message = said.recv() => message?.into_json()?,
                    () = closing.cancelled() => return None,
                },
            };
            let event = Event::default().data(message);
            Some((Ok::<_, Infallible>(event), (None, said, gone, closing)))
        },
    );
    let stream = Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE));
    ([("x-accel-buffering", "no")], stream).into_response()
}

/// What a call cut short by a shutdown gets.
fn shutting_down() -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, "fleetd is shutting down").into_response()
}

impl FleetMcp {
    /// Runs the direct `call` for `caller`: counted, in the span and the tracking every call
    /// has, its progress notices (if it asked for them) and then its answer told to `told`.
    async fn direct(
        &self,
        call: Call,
        caller: Caller,
        told: mpsc::UnboundedSender<Said>,
        ct: CancellationToken,
    ) {
        let Call {
            id,
            name,
            tool,
            progress,
        } = call;
        self.gateway.tool_called(&name, Served::Direct);
        let span = call_span(&crate::logs::shown(&name), Some(&caller));
        let _in_flight = self.in_flight.token();
        let caller = Ok(caller);
        let work = async {
            let answer = match tool {
                Tool::List(p) => written(&id, self.listing(caller, p)),
                Tool::Send(p) => written(
                    &id,
                    noticed(progress, "fleet_send", self.sending(caller, p, &ct), &told).await,
                ),
                Tool::Reply(p) => written(&id, self.replying(caller, p).await),
                Tool::Poll(p) => written(
                    &id,
                    noticed(progress, "fleet_poll", self.polling(caller, p, &ct), &told).await,
                ),
                Tool::Misfit(why) => {
                    written::<()>(&id, Err(FleetError::new(ErrorCode::InvalidParams, why)))
                }
            };
            if let Err(e) = &answer {
                tracing::warn!(error = %e, "cannot encode the answer");
            }
            answer.ok()
        };
        let answer = work.instrument(span).await;
        let _ = told.send(Said::Answer(answer));
    }
}

/// Runs `work`, telling `told` a progress notice every 5 s while it runs if the call asked for
/// them (`progress`), as rmcp's path does for `what`.
async fn noticed<T>(
    progress: Option<ProgressToken>,
    what: &str,
    work: impl Future<Output = T>,
    told: &mpsc::UnboundedSender<Said>,
) -> T {
    let Some(token) = progress else {
        return work.await;
    };
    let notify = |note| {
        let notice = ServerNotification::ProgressNotification(ProgressNotification::new(note));
        // Not heard only once the answer's writer went away with its client.
        if let Ok(json) = serde_json::to_string(&ServerJsonRpcMessage::notification(notice)) {
            let _ = told.send(Said::Notice(json));
        }
        std::future::ready(())
    };
    let (_quiet, events) = mpsc::unbounded_channel();
    progressing(token, what, events, work, notify).await
}

/// Whether a request's head is that of a plain stateless call: no session, both answer forms
/// accepted, a JSON body of a stated length within the limit, the protocol headers each said
/// once (`Mcp-Method` saying `tools/call`, `Mcp-Name` a hot tool's, unencoded) and no
/// `Mcp-Param-*` header. (Any other call's body is left for rmcp to read, once.)
fn head_fits(headers: &HeaderMap) -> bool {
    let length = one(headers, header::CONTENT_LENGTH.as_str())
        .and_then(|length| length.parse::<usize>().ok());
    !headers.contains_key(SESSION)
        && accepts_both(headers)
        && one(headers, header::CONTENT_TYPE.as_str())
            .is_some_and(|kind| essence(kind).eq_ignore_ascii_case("application/json"))
        && length.is_some_and(|length| length <= BODY_LIMIT)
        && one(headers, PROTOCOL_VERSION).is_some()
        && one(headers, METHOD) == Some("tools/call")
        && one(headers, NAME).is_some_and(|name| HOT.contains(&name))
        && !headers
            .keys()
            .any(|name| name.as_str().starts_with(PARAM_PREFIX))
}

/// The value of header `name` when it is said exactly once, in visible ASCII.
fn one<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    match values.next() {
        Some(_) => None,
        None => value.to_str().ok(),
    }
}

/// A media type without its parameters.
fn essence(media: &str) -> &str {
    media.split(';').next().unwrap_or_default().trim()
}

/// Whether `Accept` names both JSON and an event stream, with no weights (a weighted one goes
/// to rmcp, which reads them).
fn accepts_both(headers: &HeaderMap) -> bool {
    let mut json = false;
    let mut stream = false;
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for media in value.split(',') {
            if media.contains(';') || media.contains('"') {
                return false;
            }
            json |= media.trim().eq_ignore_ascii_case("application/json");
            stream |= media.trim().eq_ignore_ascii_case("text/event-stream");
        }
    }
    json && stream
}

/// A `tools/call` request, read as it is (rmcp's own message types are untagged: they buffer
/// the whole body before trying each kind of message in turn, a twentieth of a call's CPU).
/// Only these fields, each said once: a request with any other (`inputResponses`, say) or a
/// field twice does not read, and goes to rmcp as it came.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Plain {
    /// `"2.0"`, as rmcp's messages have it.
    #[serde(rename = "jsonrpc")]
    _jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    method: String,
    params: PlainParams,
}

/// The parameters of [`Plain`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlainParams {
    name: String,
    arguments: Option<JsonObject>,
    #[serde(rename = "_meta")]
    meta: RequestMetaObject,
}

/// The call the request `body` makes, if fleetd answers it itself: a `tools/call` of a hot tool
/// whose `_meta` names a protocol version of 2026-07-28 or later that fleetd speaks (the one
/// the `MCP-Protocol-Version` header names) and holds every key that version requires; its
/// `Mcp-Name` header names the tool; its arguments parse as the tool's parameters (or fail the
/// tool's schema, which is answered here too, as rmcp's path answers it).
fn call_of(
    headers: &HeaderMap,
    body: &[u8],
    versions: &[ProtocolVersion],
    schema_of: impl Fn(&str) -> Option<Arc<JsonObject>>,
) -> Option<Call> {
    let Plain {
        id, method, params, ..
    } = serde_json::from_slice(body).ok()?;
    let PlainParams {
        name,
        arguments,
        meta,
    } = params;
    let version = meta.protocol_version()?;
    let plain = method == "tools/call"
        && version >= ProtocolVersion::V_2026_07_28
        && versions.contains(&version)
        && one(headers, PROTOCOL_VERSION) == Some(version.as_str())
        && meta
            .missing_required_keys(&ProtocolVersion::V_2026_07_28)
            .is_empty();
    if !plain || one(headers, NAME) != Some(name.as_str()) || !HOT.contains(&name.as_str()) {
        return None;
    }
    let schema = schema_of(&name)?;
    let tool = match arguments::misfit(&crate::logs::shown(&name), &schema, arguments.as_ref()) {
        Some(why) => Tool::Misfit(why),
        None => tool_of(&name, arguments.unwrap_or_default())?,
    };
    Some(Call {
        id,
        name,
        tool,
        progress: meta.get_progress_token(),
    })
}

/// The hot tool named `name` with `arguments` parsed as its parameters; `None` for arguments
/// that do not parse.
fn tool_of(name: &str, arguments: JsonObject) -> Option<Tool> {
    Some(match name {
        "fleet_list" => Tool::List(parsed(arguments)?),
        "fleet_send" => Tool::Send(parsed(arguments)?),
        "fleet_reply" => Tool::Reply(parsed(arguments)?),
        "fleet_poll" => Tool::Poll(parsed(arguments)?),
        _ => return None,
    })
}

/// `arguments` as `P`, as rmcp parses a tool's parameters.
fn parsed<P: DeserializeOwned>(arguments: JsonObject) -> Option<P> {
    serde_json::from_value(serde_json::Value::Object(arguments)).ok()
}

#[cfg(test)]
mod tests {
    use rmcp::model::NumberOrString;
    use serde_json::{Value, json};

    use super::*;

    /// The head a stateless client sends for a call of `tool`.
    fn head(tool: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("accept", PLAIN),
            ("content-type", "application/json"),
            ("content-length", "200"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", tool),
        ] {
            headers.insert(
                axum::http::HeaderName::from_static(name),
                value.parse().unwrap(),
            );
        }
        headers
    }

    const PLAIN: &str = "application/json, text/event-stream";

    /// A call of `tool` with `arguments` and `_meta` `meta`.
    fn message(tool: &str, arguments: Value, meta: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta}}))
        .unwrap()
    }

    fn meta() -> Value {
        json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}})
    }

    fn schema(name: &str) -> Option<Arc<JsonObject>> {
        let schema = match name {
            "fleet_send" => rmcp::handler::server::common::schema_for_type::<SendParams>(),
            "fleet_poll" => rmcp::handler::server::common::schema_for_type::<PollParams>(),
            "fleet_spawn" => Arc::new(JsonObject::new()),
            _ => return None,
        };
        Some(schema)
    }

    fn versions() -> &'static [ProtocolVersion] {
        ProtocolVersion::KNOWN_VERSIONS
    }

    fn call(headers: &HeaderMap, message: Vec<u8>) -> Option<Call> {
        call_of(headers, &message, versions(), schema)
    }

    #[test]
    fn a_plain_stateless_call_of_a_hot_tool_is_answered_directly() {
        let headers = head("fleet_send");
        assert!(head_fits(&headers));
        let sent = message("fleet_send", json!({"to": "w1", "message": "hi"}), meta());
        let call = call(&headers, sent).expect("a plain call");
        assert_eq!(call.name, "fleet_send");
        assert_eq!(call.id, RequestId::Number(3));
        assert!(
            matches!(&call.tool, Tool::Send(p) if p.to.as_deref() == Some("w1")),
            "{call:?}"
        );
        let polled = message("fleet_poll", json!({}), meta());
        let call = super::call_of(&head("fleet_poll"), &polled, versions(), schema);
        assert!(matches!(
            call,
            Some(Call {
                tool: Tool::Poll(_),
                ..
            })
        ));
    }

    #[test]
    fn a_call_that_asks_for_progress_is_answered_directly_with_its_token() {
        let mut meta = meta();
        meta["progressToken"] = json!("p1");
        let sent = json!({"to": "w1", "message": "hi", "wait_s": 60});
        let call = call(
            &head("fleet_send"),
            message("fleet_send", sent, meta.clone()),
        )
        .expect("a call that asks for progress");
        assert!(matches!(call.tool, Tool::Send(_)), "{call:?}");
        assert_eq!(
            call.progress,
            Some(ProgressToken(NumberOrString::String("p1".into())))
        );
        let polled = message("fleet_poll", json!({"wait_s": 5}), meta);
        let call = super::call_of(&head("fleet_poll"), &polled, versions(), schema);
        assert!(call.is_some_and(|c| c.progress.is_some()));
    }

    #[test]
    fn arguments_that_miss_the_schema_are_answered_directly_with_the_schemas_words() {
        let sent = message("fleet_send", json!({"to": 5, "message": "hi"}), meta());
        let call = call(&head("fleet_send"), sent).expect("answered directly");
        let Tool::Misfit(why) = call.tool else {
            panic!("{call:?}")
        };
        assert!(why.contains("to"), "{why}");
    }

    #[test]
    fn a_head_rmcp_must_read_goes_to_rmcp() {
        let changed = |name: &'static str, value: &str| {
            let mut headers = head("fleet_send");
            headers.insert(name, value.parse().unwrap());
            headers
        };
        let without = |name: &'static str| {
            let mut headers = head("fleet_send");
            headers.remove(name);
            headers
        };
        let twice = |name: &'static str| {
            let mut headers = head("fleet_send");
            headers.append(name, "tools/call".parse().unwrap());
            headers
        };
        for (why, headers) in [
            ("a session", changed("mcp-session-id", "abc")),
            ("json only", changed("accept", "application/json")),
            (
                "weighted",
                changed("accept", "application/json;q=1, text/event-stream"),
            ),
            ("not json", changed("content-type", "text/plain")),
            ("no length", without("content-length")),
            ("too long", changed("content-length", "4194305")),
            ("no version", without("mcp-protocol-version")),
            ("no method", without("mcp-method")),
            ("another method", changed("mcp-method", "tools/list")),
            ("method twice", twice("mcp-method")),
            ("encoded name", changed("mcp-name", "=?base64?Zm9v?=")),
            ("a tool that is not hot", changed("mcp-name", "fleet_spawn")),
            ("a param header", changed("mcp-param-to", "w1")),
        ] {
            assert!(!head_fits(&headers), "{why}");
        }
        assert!(head_fits(&changed(
            "content-type",
            "application/json; charset=utf-8"
        )));
    }

    #[test]
    fn a_body_rmcp_must_read_goes_to_rmcp() {
        let send = json!({"to": "w1", "message": "hi"});
        let with_meta = |extra: Value| {
            let mut meta = meta();
            for (k, v) in extra.as_object().unwrap() {
                meta[k] = v.clone();
            }
            meta
        };
        for (why, headers, sent) in [
            (
                "no per-request version",
                head("fleet_send"),
                message("fleet_send", send.clone(), json!({})),
            ),
            (
                "no client capabilities",
                head("fleet_send"),
                message(
                    "fleet_send",
                    send.clone(),
                    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"}),
                ),
            ),
            (
                "an older version",
                {
                    let mut headers = head("fleet_send");
                    headers.insert("mcp-protocol-version", "2025-06-18".parse().unwrap());
                    headers
                },
                message(
                    "fleet_send",
                    send.clone(),
                    with_meta(json!({"io.modelcontextprotocol/protocolVersion": "2025-06-18"})),
                ),
            ),
            (
                "a version the header does not name",
                {
                    let mut headers = head("fleet_send");
                    headers.insert("mcp-protocol-version", "2025-06-18".parse().unwrap());
                    headers
                },
                message("fleet_send", send.clone(), meta()),
            ),
            (
                "a name the header does not say",
                head("fleet_poll"),
                message("fleet_send", send.clone(), meta()),
            ),
            (
                "a tool that is not hot",
                head("fleet_spawn"),
                message("fleet_spawn", json!({"profile": "p"}), meta()),
            ),
            (
                "a tool fleetd does not have",
                head("nothing"),
                message("nothing", json!({}), meta()),
            ),
        ] {
            assert!(call(&headers, sent).is_none(), "{why}");
        }
        let call_with = |change: &dyn Fn(&mut Value)| {
            let mut body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "fleet_send", "arguments": send, "_meta": meta()}});
            change(&mut body);
            serde_json::to_vec(&body).unwrap()
        };
        for (why, body) in [
            (
                "another method",
                call_with(&|b| b["method"] = json!("tools/list")),
            ),
            (
                "another JSON-RPC version",
                call_with(&|b| b["jsonrpc"] = json!("1.0")),
            ),
            (
                "a notification (no id)",
                call_with(&|b| {
                    b.as_object_mut().unwrap().remove("id");
                }),
            ),
            (
                "a field fleetd does not read",
                call_with(&|b| b["params"]["requestState"] = json!("s")),
            ),
            ("a field at the top", call_with(&|b| b["extra"] = json!(1))),
            (
                "a null _meta",
                call_with(&|b| b["params"]["_meta"] = json!(null)),
            ),
            (
                "no arguments object",
                call_with(&|b| b["params"]["arguments"] = json!([1])),
            ),
            (
                "a batch",
                serde_json::to_vec(&json!([serde_json::from_slice::<Value>(&call_with(
                    &|_| {}
                ))
                .unwrap()]))
                .unwrap(),
            ),
            (
                "a field said twice",
                String::from_utf8(call_with(&|_| {}))
                    .unwrap()
                    .replacen("\"id\":3", "\"id\":3,\"id\":4", 1)
                    .into_bytes(),
            ),
        ] {
            assert!(call(&head("fleet_send"), body).is_none(), "{why}");
        }
    }

    #[test]
    fn a_call_read_here_is_the_call_rmcp_reads() {
        let mut meta = meta();
        meta["progressToken"] = json!("p-7");
        for (tool, arguments) in [
            (
                "fleet_send",
                json!({"to": "w1", "message": "hi\u{0}\u{1b}[2J", "wait_s": 3}),
            ),
            ("fleet_poll", json!({})),
            ("fleet_poll", json!(null)),
        ] {
            let body = message(tool, arguments.clone(), meta.clone());
            let ours = call(&head(tool), body.clone()).unwrap();
            let theirs: rmcp::model::ClientJsonRpcMessage = serde_json::from_slice(&body).unwrap();
            let rmcp::model::ClientJsonRpcMessage::Request(request) = theirs else {
                panic!("rmcp reads no request");
            };
            let progress = rmcp::model::GetMeta::get_meta(&request.request).get_progress_token();
            let rmcp::model::ClientRequest::CallToolRequest(theirs) = request.request else {
                panic!("rmcp reads another request");
            };
            assert_eq!(ours.id, request.id);
            assert_eq!(ours.name, theirs.params.name);
            assert_eq!(ours.progress.unwrap(), progress.unwrap());
            let theirs = theirs.params.arguments.map_or(Value::Null, Value::Object);
            assert_eq!(theirs, arguments);
        }
    }

    #[test]
    fn arguments_that_fit_the_schema_but_not_the_parameters_go_to_rmcp() {
        // A negative wait is an integer to the schema, and no u64 to the parameters: rmcp's
        // own words for it, rewritten by the tool's handler, are the answer.
        let sent = message(
            "fleet_send",
            json!({"to": "w1", "message": "hi", "wait_s": -1}),
            meta(),
        );
        assert!(call(&head("fleet_send"), sent).is_none());
    }

    #[test]
    fn a_version_fleetd_does_not_speak_goes_to_rmcp() {
        let mut headers = head("fleet_send");
        headers.insert("mcp-protocol-version", "2027-01-01".parse().unwrap());
        let mut later = meta();
        later["io.modelcontextprotocol/protocolVersion"] = json!("2027-01-01");
        let sent = message("fleet_send", json!({"to": "w1", "message": "hi"}), later);
        assert!(call(&headers, sent).is_none());
    }

    #[test]
    fn a_repeated_protocol_header_goes_to_rmcp() {
        for name in [
            "mcp-name",
            "mcp-protocol-version",
            "content-type",
            "content-length",
        ] {
            let mut headers = head("fleet_send");
            let value = headers[name].clone();
            headers.append(name, value);
            assert!(!head_fits(&headers), "{name}");
        }
    }

    #[test]
    fn no_hot_tools_parameter_asks_for_a_header_of_its_own() {
        // rmcp checks a parameter annotated `x-mcp-header` against its `Mcp-Param-*` header,
        // present or not; the short way only sees that none is present.
        let router = FleetMcp::tool_router();
        for name in HOT {
            let tool = router.get(name).expect("a hot tool");
            let schema = serde_json::to_string(tool.input_schema.as_ref()).unwrap();
            assert!(!schema.contains("x-mcp-header"), "{name}: {schema}");
        }
    }

    #[test]
    fn every_tool_the_router_has_is_named_in_tools() {
        let mut listed: Vec<String> = FleetMcp::tool_router()
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        listed.sort();
        let mut named: Vec<String> = crate::mcp::TOOLS.iter().map(|t| t.to_string()).collect();
        named.sort();
        assert_eq!(listed, named);
    }
}
