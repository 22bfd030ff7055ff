//! The HTTP side of accepting a link: `GET /hostlink/{tenant}` answered before the upgrade.
//! Owns the order of refusals — a closed or stopping Host 503 (never 400: a client must not
//! read its own credential as the fault), a tenant failing the id rule 400, a protocol other
//! than JSON 400 — and protocol selection as Centrifuge servers do it (no subprotocol,
//! `centrifuge-json`, `format=json` or `cf_protocol=json`; `centrifuge-protobuf` and
//! `format=protobuf` refused). A missing or extra path segment never reaches here (404 from
//! the router). Never authenticates: the credential arrives in the connect command.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sessionstore::TenantId;

use super::Core;
use super::connection::run_link;
use crate::link::backend::LinkBackend;

/// The JSON subprotocol name.
pub const JSON_SUBPROTOCOL: &str = "centrifuge-json";
/// The Protobuf subprotocol name (refused: not implemented).
pub const PROTOBUF_SUBPROTOCOL: &str = "centrifuge-protobuf";

pub(crate) struct RouteState<B> {
    pub(crate) core: Arc<Core>,
    pub(crate) backend: Arc<B>,
}

fn refuse(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

/// What the request asks for: JSON (with or without naming the subprotocol) or something
/// this Host does not speak.
enum Protocol {
    Json { subprotocol: bool },
    Refused(&'static str),
}

fn select_protocol(query: &[(String, String)], headers: &HeaderMap) -> Protocol {
    for (key, value) in query {
        match key.as_str() {
            "format" | "cf_protocol" => match value.as_str() {
                "json" => {}
                "protobuf" => return Protocol::Refused("the protobuf protocol is not served"),
                _ => return Protocol::Refused("unknown protocol format"),
            },
            "cf_protocol_version" if value != "v2" => {
                return Protocol::Refused("only Centrifuge protocol v2 is served");
            }
            _ => {}
        }
    }
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    if offered.iter().any(|p| p == JSON_SUBPROTOCOL) {
        return Protocol::Json { subprotocol: true };
    }
    if offered.iter().any(|p| p == PROTOBUF_SUBPROTOCOL) {
        return Protocol::Refused("the protobuf protocol is not served");
    }
    Protocol::Json { subprotocol: false }
}

pub(crate) async fn accept<B: LinkBackend>(
    State(state): State<Arc<RouteState<B>>>,
    tenant: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let core = &state.core;
    if core.refusing.load(std::sync::atomic::Ordering::SeqCst)
        || core.registry.closing().is_some()
        || !state.backend.accepting_links()
    {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "HostLink is not accepting links",
        );
    }
    let Ok(Path(tenant)) = tenant else {
        return refuse(StatusCode::BAD_REQUEST, "the tenant is not a valid id");
    };
    let Ok(tenant) = TenantId::new(tenant) else {
        return refuse(StatusCode::BAD_REQUEST, "the tenant is not a valid id");
    };
    let Ok(Query(query)) = query else {
        return refuse(StatusCode::BAD_REQUEST, "the query is malformed");
    };
    let subprotocol = match select_protocol(&query, &headers) {
        Protocol::Json { subprotocol } => subprotocol,
        Protocol::Refused(why) => return refuse(StatusCode::BAD_REQUEST, why),
    };
    let upgrade = match upgrade {
        Ok(u) => u,
        Err(rejection) => return rejection.into_response(),
    };
    let ceiling = super::transport::transport_ceiling(core.config.options().max_frame_bytes);
    let mut upgrade = upgrade.max_message_size(ceiling).max_frame_size(ceiling);
    if subprotocol {
        upgrade = upgrade.protocols([JSON_SUBPROTOCOL]);
    }
    // Counted by the tracker from now, so `wait` cannot miss a link being upgraded.
    let tracked = core.tracker.token();
    let core = core.clone();
    let backend = state.backend.clone();
    upgrade
        .on_failed_upgrade(|error| tracing::debug!(%error, "a HostLink upgrade failed"))
        .on_upgrade(move |socket| run_link(core, backend, socket, tenant, tracked))
}
