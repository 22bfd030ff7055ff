//! The operator console: one page and a versioned JSON API under `/console` on the Host's
//! listener, behind operator credentials ([`auth`]) that are not tenant credentials.
//!
//! - `GET /console` (and its embedded `app.js` and `app.css`; no network at run time).
//! - `/console/api/v1/…` ([`api`]): the fleet's Hosts, sessions with their commands, gates and
//!   public journal, open gates, runs; `POST`s for the operate role (answer a gate through the
//!   command path, attributed to the operator; retry or skip a run that needs attention; drain
//!   this Host). Every error is `{"error":{"code","message"}}` with a stable code.
//! - Live updates over server-sent events ([`live`]): a session's committed journal as the Host
//!   relays it, and a change notice plus a metrics sample pushed from the Host's own state.
//!
//! Auth: `Authorization: Bearer <token>`, or the `hostd_console` cookie the login sets
//! (HttpOnly, SameSite=Strict, path `/console`). Every `POST` takes JSON only, so a form on
//! another site cannot drive it.

pub mod api;
pub mod auth;
pub mod live;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use host::Service;
use run_hosting::RunHost;
use sessionstore::TenantId;

pub use auth::{CredentialFileError, Operator, Operators, Role};

/// What the console serves from.
#[derive(Clone)]
pub struct Console {
    pub(crate) service: Service,
    pub(crate) runs: Option<RunHost>,
    /// The tenants whose sessions and runs the console lists (those with credentials here).
    pub(crate) tenants: Arc<Vec<TenantId>>,
    pub(crate) operators: Arc<Operators>,
}

impl Console {
    /// A console over `service` (and its run hosting, when on), listing `tenants`, letting in
    /// `operators`.
    pub fn new(
        service: Service,
        runs: Option<RunHost>,
        mut tenants: Vec<TenantId>,
        operators: Operators,
    ) -> Console {
        tenants.sort();
        tenants.dedup();
        Console {
            service,
            runs,
            tenants: Arc::new(tenants),
            operators: Arc::new(operators),
        }
    }

    /// The routes, to merge into the Host's router.
    pub fn router(self) -> Router {
        Router::new()
            .route("/console", get(page))
            .route("/console/", get(page))
            .route("/console/app.js", get(script))
            .route("/console/app.css", get(style))
            .route("/console/api/v1/login", post(api::login))
            .route("/console/api/v1/logout", post(api::logout))
            .route("/console/api/v1/whoami", get(api::whoami))
            .route("/console/api/v1/hosts", get(api::hosts))
            .route("/console/api/v1/sessions", get(api::sessions))
            .route(
                "/console/api/v1/sessions/{tenant}/{session}",
                get(api::session),
            )
            .route(
                "/console/api/v1/sessions/{tenant}/{session}/live",
                get(live::session_live),
            )
            .route("/console/api/v1/gates", get(api::gates))
            .route(
                "/console/api/v1/gates/{tenant}/{session}/{gate}",
                post(api::answer_gate),
            )
            .route("/console/api/v1/runs", get(api::runs))
            .route("/console/api/v1/runs/{tenant}/{run}", get(api::run))
            .route(
                "/console/api/v1/runs/{tenant}/{run}/answer",
                post(api::answer_run),
            )
            .route("/console/api/v1/drain", post(api::drain))
            .route("/console/api/v1/metrics", get(api::metrics))
            .route("/console/api/v1/events", get(live::events))
            .fallback(api::not_found)
            .with_state(self)
    }
}

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");

/// Only this origin's own assets run on the page.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

async fn page() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

async fn script() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

async fn style() -> Response {
    asset(APP_CSS, "text/css; charset=utf-8")
}
