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
use hostlink::upgrade::{Protocol, select_protocol};
use sessionstore::TenantId;

use super::Core;
use super::connection::run_link;
use crate::backend::LinkBackend;

use hostlink::upgrade::JSON_SUBPROTOCOL;

pub(crate) struct RouteState<B> {
    pub(crate) core: Arc<Core>,
    pub(crate) backend: Arc<B>,
}

fn refuse(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
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
    let offered: Vec<&[u8]> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let subprotocol = match select_protocol(&query, &offered) {
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
