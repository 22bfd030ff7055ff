//! Live updates for the console page, as server-sent events pushed from the Host's own state:
//! nothing on the page polls.
//!
//! - `events`: a `metrics` sample every second (what the charts draw) and a `changed` notice
//!   whenever what the views show moved (sessions resident here, commands applied, gates, the
//!   fleet's sessions per Host, the listed tenants' runs, this Host's readiness), so the page
//!   re-reads the view it shows.
//! - `sessions/{tenant}/{session}/live`: each committed public record of a session resident on
//!   this Host, as the Host relays it to HostLink subscribers (the same projection).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use hostlink_server::FeedItem;
use serde_json::{Value, json};
use sessionstore::{SessionId, TenantId};
use tokio::sync::{broadcast, mpsc};

use crate::Console;
use crate::api::{ApiError, operator, sample};

/// How often the events stream samples.
const TICK: Duration = Duration::from_secs(1);

fn stream_of(rx: mpsc::Receiver<Event>) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
    )
}

/// What the views show, summarised: when it differs from the last tick, they changed.
async fn fingerprint(c: &Console, values: &Value) -> Value {
    let mut here: Vec<String> = c
        .service
        .residents()
        .into_iter()
        .map(|k| format!("{}/{}", k.tenant, k.session))
        .collect();
    here.sort();
    let fleet: Vec<Value> = match c.service.store().host_loads().await {
        Ok(loads) => loads
            .into_iter()
            .map(|l| json!([l.host.map(|h| h.to_string()), l.sessions, l.placing]))
            .collect(),
        Err(_) => Vec::new(),
    };
    // Runs change on any Host (a step, a park, an answer): one aggregate read per tenant.
    let mut runs = Vec::new();
    for t in c.tenants.iter() {
        if let Ok(m) = c.service.store().runs_mark(t).await {
            runs.push(json!([t.as_str(), m.runs, m.revisions]));
        }
    }
    json!({
        "here": here,
        "fleet": fleet,
        "runs": runs,
        "applied": values.get("applied_total"),
        "gates": values.get("gate_waiting"),
        "ready": c.service.ready(),
        "draining": c.service.draining(),
    })
}

pub async fn events(State(c): State<Console>, headers: HeaderMap) -> Response {
    if let Err(e) = operator(&c, &headers) {
        return e.into_response();
    }
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut last = Value::Null;
        let mut tick = tokio::time::interval(TICK);
        loop {
            tick.tick().await;
            let s = sample(&c);
            let print = fingerprint(&c, &s["values"]).await;
            if print != last {
                last = print;
                if tx
                    .send(Event::default().event("changed").data("{}"))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if tx
                .send(Event::default().event("metrics").data(s.to_string()))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    Sse::new(stream_of(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

pub async fn session_live(
    State(c): State<Console>,
    headers: HeaderMap,
    Path((t, s)): Path<(String, String)>,
) -> Response {
    if let Err(e) = operator(&c, &headers) {
        return e.into_response();
    }
    let (Ok(t), Ok(s)) = (TenantId::new(&t), SessionId::new(&s)) else {
        return ApiError::not_found("no such session").into_response();
    };
    if !c.tenants.contains(&t) {
        return ApiError::not_found("no such session").into_response();
    }
    let Some(mut feed) = c.service.subscribe(&t, &s) else {
        return ApiError {
            status: StatusCode::CONFLICT,
            code: "not_resident_here",
            message: "the session is not resident on this Host: read its journal instead".into(),
        }
        .into_response();
    };
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let item = match feed.recv().await {
                Ok(i) => i,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // The page re-reads the journal on this, then follows again.
                    let _ = tx.send(Event::default().event("gap").data("{}")).await;
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => {
                    let _ = tx.send(Event::default().event("ended").data("{}")).await;
                    return;
                }
            };
            if let FeedItem::Enduring(p) = item
                && tx
                    .send(
                        Event::default()
                            .event("record")
                            .data(p.record.encode().replace('\n', " ")),
                    )
                    .await
                    .is_err()
            {
                return;
            }
        }
    });
    Sse::new(stream_of(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
