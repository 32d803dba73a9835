//! The operator API's OpenAPI 3.1 document (`GET /api/v1/openapi.json`), made from the Rust
//! types its handlers take and answer with: their JSON Schemas come from the types themselves
//! (schemars, JSON Schema 2020-12, which OpenAPI 3.1 uses as is), so the document cannot drift
//! from what the API does. What is written here by hand is only the list of routes, what each
//! one is for, and which refusals it may answer.

use schemars::generate::{Contract, SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::gateway::{
    Event, HostView, MessageHistory, MessagePage, MessagesQuery, RosterView, Screen, SendResult,
    StopResult,
};
use crate::mcp::params::SendParams;

/// Every refusal's body.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Refusal {
    /// What kind of refusal: `unauthorized`, `forbidden`, `invalid_params`, …
    pub error: String,
    /// What is wrong, and what to do.
    pub message: String,
}

/// `GET /api/v1/hosts`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct HostsView {
    /// The hosts of the fleet, this one first.
    pub hosts: Vec<HostView>,
}

/// `POST /api/v1/stop`'s body.
#[derive(Debug, serde::Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopBody {
    /// Who: a name, `name@host`, or a gid.
    pub to: String,
}

/// `GET /api/v1/events`' query.
#[derive(Debug, Default, serde::Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Read on after this `seq` (a reconnecting `EventSource` sends `Last-Event-ID` instead);
    /// without either, the feed starts now.
    pub after: Option<i64>,
}

/// `GET /api/v1/screen`'s query.
#[derive(Debug, serde::Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenQuery {
    /// Whose screen: a name, `name@host`, or a gid.
    pub name: String,
}

/// The path parameter of `/api/v1/messages/{msg_id}`.
fn message_path(generator: &mut SchemaGenerator) -> Schema {
    let mut msg_id = generator.subschema_for::<fleet_core::MsgId>();
    msg_id.insert("description".into(), "The message's id.".into());
    schemars::json_schema!({
        "type": "object",
        "properties": {"msg_id": msg_id},
        "required": ["msg_id"],
    })
}

/// What one route answers when it answers as asked.
enum Answer {
    /// JSON of a type.
    Json(fn(&mut SchemaGenerator) -> Schema),
    /// Server-sent events, each one's data JSON of a type.
    Events(fn(&mut SchemaGenerator) -> Schema),
    /// Text of a media type.
    Text(&'static str),
}

/// One route of the API.
struct Route {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    /// Its parameters (query, or path for a `{…}` path), from a type's properties.
    parameters: Option<fn(&mut SchemaGenerator) -> Schema>,
    /// Its JSON body.
    body: Option<fn(&mut SchemaGenerator) -> Schema>,
    answer: Answer,
    /// The refusals it may answer, besides 401 (every route but the open ones), 403 (the
    /// Host/Origin check) and 500 (the store failing).
    refusals: &'static [u16],
    /// Whether it needs no token.
    open: bool,
}

fn of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// The routes, in the order the document lists them.
fn routes() -> Vec<Route> {
    let mut routes = read_routes();
    routes.extend(action_routes());
    routes
}

/// A lead's route (an operator's too): `answer`, or one of `refusals` besides those of every
/// route.
fn lead(
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    answer: Answer,
    refusals: &'static [u16],
) -> Route {
    Route {
        method,
        path,
        summary,
        parameters: None,
        body: None,
        answer,
        refusals,
        open: false,
    }
}

/// The routes that read: the roster, the hosts, messages, the live feed, a screen.
fn read_routes() -> Vec<Route> {
    vec![
        lead(
            "get",
            "/api/v1/roster",
            "Every live entity of the fleet (this host's first, with the messages held and queued for each) and the hosts.",
            Answer::Json(of::<RosterView>),
            &[],
        ),
        lead(
            "get",
            "/api/v1/hosts",
            "The hosts of the fleet, this one first.",
            Answer::Json(of::<HostsView>),
            &[],
        ),
        Route {
            parameters: Some(of::<MessagesQuery>),
            ..lead(
                "get",
                "/api/v1/messages",
                "A page of the messages in this gateway's store (a lead's: those it sent or received; an operator's: all), newest first, with their states and reasons, how many there are in all, and where the next page starts (before=next); their text only with text=true, to a lead.",
                Answer::Json(of::<MessagePage>),
                &[400, 404, 403],
            )
        },
        Route {
            parameters: Some(message_path),
            ..lead(
                "get",
                "/api/v1/messages/{msg_id}",
                "One message (a lead's own; any, for an operator) and every state it went through.",
                Answer::Json(of::<MessageHistory>),
                &[400, 404],
            )
        },
        Route {
            parameters: Some(of::<EventsQuery>),
            ..lead(
                "get",
                "/api/v1/events",
                "The live feed of this gateway's changes as server-sent events (each one's id is its seq; Last-Event-ID resumes): entities made and changing status, messages (a lead's own; all, for an operator) moving through their states; never a message's text. A feed that fails sends an `error` event (a Refusal) and ends.",
                Answer::Events(of::<Event>),
                &[400],
            )
        },
        Route {
            parameters: Some(of::<ScreenQuery>),
            ..lead(
                "get",
                "/api/v1/screen",
                "What the pane of a worker of this host shows now, to the lead that spawned it or whose task it has in hand (read-only; untrusted text).",
                Answer::Json(of::<Screen>),
                &[400, 403, 404, 410],
            )
        },
    ]
}

/// The routes that act (send, stop), and the metrics and this document.
fn action_routes() -> Vec<Route> {
    vec![
        Route {
            body: Some(of::<SendParams>),
            ..lead(
                "post",
                "/api/v1/send",
                "fleet_send as the lead: a task to a worker (or an answer to its question), waiting up to wait_s for the answer.",
                Answer::Json(of::<SendResult>),
                &[400, 403, 404, 410, 429],
            )
        },
        Route {
            body: Some(of::<StopBody>),
            ..lead(
                "post",
                "/api/v1/stop",
                "Ends a worker or architect: fleet_stop as a lead; an operator stops this host's, unless read-only.",
                Answer::Json(of::<StopResult>),
                &[400, 403, 404],
            )
        },
        lead(
            "get",
            "/metrics",
            "Prometheus metrics in the OpenMetrics text format (counts only).",
            Answer::Text(crate::metrics::CONTENT_TYPE),
            &[],
        ),
        Route {
            open: true,
            ..lead(
                "get",
                "/api/v1/openapi.json",
                "This document.",
                Answer::Text("application/json"),
                &[],
            )
        },
    ]
}

/// The parameters of a route, one per property of `schema`, in the path for a `{name}` in
/// `path` and in the query otherwise.
fn parameters(path: &str, schema: &Schema) -> Vec<Value> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    properties
        .iter()
        .map(|(name, property)| {
            let in_path = path.contains(&format!("{{{name}}}"));
            let mut property = property.clone();
            let description = property
                .as_object_mut()
                .and_then(|p| p.remove("description"))
                .unwrap_or(Value::Null);
            json!({
                "name": name,
                "in": if in_path { "path" } else { "query" },
                "required": in_path || required.contains(&name.as_str()),
                "description": description,
                "schema": property,
            })
        })
        .collect()
}

/// The description of an HTTP status a route may answer.
fn status_text(status: u16) -> &'static str {
    match status {
        400 => "refused: a parameter or the body is not what this takes (the message names it)",
        401 => "no lead's token (or web session) came with the request",
        403 => {
            "the Host or Origin is not this gateway's, or a web session's action lacks its CSRF token"
        }
        404 => "no such entity or message",
        410 => "the worker's pane is gone",
        429 => "the lead holds as many long calls as it may",
        _ => "refused",
    }
}

/// A route's answer when it succeeds, its schema written by `answers`.
fn ok_response(answer: Answer, answers: &mut SchemaGenerator) -> Value {
    match answer {
        Answer::Json(schema_of) => json!({
            "description": "what was asked",
            "content": {"application/json": {"schema": schema_of(answers)}},
        }),
        Answer::Events(schema_of) => json!({
            "description": "a stream of server-sent events; each one's data is this JSON, its id the event's seq",
            "content": {"text/event-stream": {
                "schema": {"type": "string"},
                "x-event-data": schema_of(answers),
            }},
        }),
        Answer::Text(media) => json!({
            "description": "what was asked",
            "content": {media: {"schema": {"type": "string"}}},
        }),
    }
}

/// The OpenAPI 3.1 document of the operator API, for a gateway of fleetd `version`.
pub fn document(version: &str) -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    // What a response holds is what the type serializes to.
    settings.contract = Contract::Serialize;
    let mut answers = settings.clone().into_generator();
    // What a request may hold is what the type takes; written inline, apart from the answers'.
    settings.contract = Contract::Deserialize;
    settings.inline_subschemas = true;
    let mut requests = settings.into_generator();
    let refusal = answers.subschema_for::<Refusal>();

    let mut paths = Map::new();
    for route in routes() {
        let mut operation = Map::new();
        operation.insert("summary".into(), route.summary.into());
        if let Some(parameters_of) = route.parameters {
            let schema = parameters_of(&mut requests);
            operation.insert("parameters".into(), parameters(route.path, &schema).into());
        }
        if let Some(body_of) = route.body {
            operation.insert(
                "requestBody".into(),
                json!({
                    "required": true,
                    "content": {"application/json": {"schema": body_of(&mut requests)}},
                }),
            );
        }
        let ok = ok_response(route.answer, &mut answers);
        let mut responses = Map::new();
        responses.insert("200".into(), ok);
        let always: &[u16] = if route.open {
            &[403, 500]
        } else {
            &[401, 403, 500]
        };
        for status in always.iter().chain(route.refusals) {
            responses.insert(
                status.to_string(),
                json!({
                    "description": status_text(*status),
                    "content": {"application/json": {"schema": refusal.clone()}},
                }),
            );
        }
        operation.insert("responses".into(), responses.into());
        if route.open {
            operation.insert("security".into(), json!([]));
        }
        let entry = paths
            .entry(route.path.to_string())
            .or_insert_with(|| json!({}));
        if let Some(entry) = entry.as_object_mut() {
            entry.insert(route.method.into(), operation.into());
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "fleetd operator API",
            "version": version,
            "description": "What a person or a script may see and do in a running fleet, as a lead (the same identities and rules as the MCP tools) or as an operator ([operators.NAME]: sees all, reads no text, sends nothing). Authenticate with a bearer token (`fleetd token NAME`), or the web view's session: its cookie and, on every request, its key in X-Fleet-Session-Key.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {"session": []}],
        "paths": paths,
        "components": {
            "schemas": answers.take_definitions(true),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "a lead's token"},
                "session": {"type": "apiKey", "in": "cookie", "name": crate::websession::COOKIE,
                            "description": "the web view's session, set at sign-in; it opens nothing without the session's key in the X-Fleet-Session-Key header"},
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_documented_with_its_types_and_refusals() {
        let doc = document("9.9.9");
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["info"]["version"], "9.9.9");
        let roster = &doc["paths"]["/api/v1/roster"]["get"];
        assert_eq!(
            roster["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/RosterView"
        );
        assert!(roster["responses"]["401"].is_object());
        // An entity says what it runs in and what its profile is for, or null.
        let entry = &doc["components"]["schemas"]["RosterEntry"]["properties"];
        for (field, says) in [("sandbox", "bwrap"), ("profile_role", "backend")] {
            assert_eq!(entry[field]["type"], json!(["string", "null"]), "{field}");
            assert!(
                entry[field]["description"]
                    .as_str()
                    .is_some_and(|d| d.contains(says)),
                "{field}: {}",
                entry[field]
            );
        }
        // Every $ref points into the document.
        let text = doc.to_string();
        for reference in text.split("\"$ref\":\"").skip(1) {
            let name = reference.split('"').next().unwrap_or_default();
            let name = name.trim_start_matches("#/components/schemas/");
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{name} is referenced but not defined"
            );
        }
        // Query and path parameters come from the types' fields, with their descriptions.
        let messages = &doc["paths"]["/api/v1/messages"]["get"]["parameters"];
        let state = messages
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "state"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (&state["in"], &state["required"]),
            (&json!("query"), &json!(false))
        );
        assert!(
            state["description"]
                .as_str()
                .is_some_and(|d| d.contains("queued"))
        );
        let one = &doc["paths"]["/api/v1/messages/{msg_id}"]["get"]["parameters"][0];
        assert_eq!(
            (&one["in"], &one["required"]),
            (&json!("path"), &json!(true))
        );
        // A request body is what the handler takes, unknown fields refused.
        let stop = &doc["paths"]["/api/v1/stop"]["post"]["requestBody"]["content"]["application/json"]
            ["schema"];
        assert_eq!(stop["required"], json!(["to"]));
        assert_eq!(stop["additionalProperties"], json!(false));
        // The document itself is open; everything else needs a lead.
        assert_eq!(
            doc["paths"]["/api/v1/openapi.json"]["get"]["security"],
            json!([])
        );
    }
}
