//! The web view at `/ui`: one page, its script and its style, served from the binary (no build
//! step, no third-party code), that signs a lead or an operator in with its token once (a
//! session from then on: see [`crate::websession`]) and then reads the operator API like any
//! client:
//! the roster and hosts, the lead's messages, the live feed (`/api/v1/events`, server-sent),
//! a worker's screen, and stop buttons. Every value from the fleet reaches the page as text
//! (the script never builds markup from data), and a strict Content-Security-Policy lets the
//! page run only its own script.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::gateway::{Gateway, Viewer};
use crate::openapi::Refusal;
use crate::token;
use crate::websession::{WebSessions, clear_cookie, set_cookie};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// What the page may load and do: its own script, style and API only; no frames, no plugins,
/// no inline script, no form posted anywhere else.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A browser signed in through the web view: the cookie of its session.
#[derive(Clone, Debug)]
pub struct SignedIn {
    /// The session cookie's value.
    pub cookie: String,
}

/// `body` as `content_type`, with the headers that keep the page to itself.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Not `no-referrer`: with it a browser posts the sign-in form with `Origin: null`,
        // which the gateway's origin check rightly refuses.
        (header::REFERRER_POLICY, "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// `POST /ui/session`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// A lead's or an operator's bearer token, pasted.
    token: String,
}

/// Who a viewer is, as the page shows it.
fn who(gateway: &Gateway, viewer: &Viewer) -> serde_json::Value {
    let (role, may_stop) = match viewer {
        Viewer::Lead(_) => ("lead", true),
        Viewer::Operator { read_only, .. } => ("operator", !read_only),
    };
    json!({
        "name": viewer.name(),
        "role": role,
        "may_stop": may_stop,
        "host": gateway.host_id(),
    })
}

/// `POST /ui/session {token}`: a lead's or an operator's token opens a session: its cookie is
/// set, and its key is in the answer, given this once to the page that signed in. JSON only,
/// so no form of another site's page can sign the browser in (its JSON needs a CORS preflight
/// fleetd never answers).
async fn sign_in(
    State((gateway, web)): State<(Arc<Gateway>, Arc<WebSessions>)>,
    body: Result<Json<SignIn>, JsonRejection>,
) -> Response {
    let refused = |status: StatusCode, message: String| {
        let refusal = Refusal {
            error: "unauthorized".into(),
            message,
        };
        (status, Json(refusal)).into_response()
    };
    let form = match body {
        Ok(Json(form)) => form,
        Err(rejected) => {
            // Not JSON or not the form (400), or more than a token (413).
            let (status, code) = if rejected.status() == StatusCode::PAYLOAD_TOO_LARGE {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    fleet_core::ErrorCode::TooLarge,
                )
            } else {
                (
                    StatusCode::BAD_REQUEST,
                    fleet_core::ErrorCode::InvalidParams,
                )
            };
            let refusal = Refusal {
                error: code.as_str().into(),
                message: rejected.body_text(),
            };
            return (status, Json(refusal)).into_response();
        }
    };
    let hash = token::hash(form.token.trim());
    let viewer = match gateway.viewer(&hash) {
        Ok(Some(viewer)) => viewer,
        Ok(None) => {
            tracing::warn!("REFUSED a web view sign-in: not a lead's or an operator's token");
            return refused(
                StatusCode::UNAUTHORIZED,
                "that is not a lead's or an operator's token for this gateway (`fleetd token NAME` prints one)".into(),
            );
        }
        Err(e) => return refused(StatusCode::INTERNAL_SERVER_ERROR, e.message),
    };
    let opened = match web.open(hash, std::time::Instant::now()) {
        Ok(opened) => opened,
        Err(e) => {
            return refused(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot make a session: {e}"),
            );
        }
    };
    tracing::info!(who = %viewer.name(), "signed in to the web view");
    let mut answer = who(&gateway, &viewer);
    answer["key"] = opened.key.into();
    let mut response = Json(answer).into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&set_cookie(&opened.cookie)) {
        headers.insert(header::SET_COOKIE, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /ui/me`: who is signed in (a lead, or an operator and whether it may stop).
pub async fn me(
    State(gateway): State<Arc<Gateway>>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    Json(who(&gateway, &viewer)).into_response()
}

/// `POST /ui/signout`: ends the browser's session and clears its cookie.
pub async fn sign_out(
    Extension(web): Extension<Arc<WebSessions>>,
    signed_in: Option<Extension<SignedIn>>,
) -> Response {
    if let Some(Extension(signed_in)) = signed_in {
        web.close(&signed_in.cookie);
    }
    let mut response = Json(json!({ "signed_out": true })).into_response();
    if let Ok(value) = HeaderValue::from_str(&clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// The most a sign-in's body may hold, in bytes.
const SIGN_IN_BODY_LIMIT: usize = 4 * 1024;

/// The web view's own routes (its page, script, style, and the sign-in form), open to anyone
/// who reaches the gateway: everything they show of the fleet comes through the API, behind
/// sign-in.
pub fn pages(gateway: Arc<Gateway>, web: Arc<WebSessions>) -> Router {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/app.js", get(script))
        .route("/ui/app.css", get(style))
        .route(
            "/ui/session",
            // A token in JSON: a few hundred bytes. Anyone may send this, so no more is read.
            post(sign_in).layer(axum::extract::DefaultBodyLimit::max(SIGN_IN_BODY_LIMIT)),
        )
        .with_state((gateway, web))
}

#[cfg(test)]
mod tests {
    use super::INDEX;
    use fleet_core::{Kind, MsgState};

    /// The options of the page's `<select id="ID">`, `any`'s empty one aside.
    fn options(id: &str) -> Vec<&'static str> {
        let Some(start) = INDEX.find(&format!("<select id=\"{id}\">")) else {
            return Vec::new();
        };
        let select = &INDEX[start..];
        let select = &select[..select.find("</select>").unwrap_or(select.len())];
        select
            .split("<option>")
            .skip(1)
            .filter_map(|o| o.split("</option>").next())
            .collect()
    }

    #[test]
    fn the_message_filters_offer_every_state_and_kind_the_api_takes() {
        assert_eq!(options("filter-state"), MsgState::NAMES);
        let kinds: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(options("filter-kind"), kinds);
    }
}
