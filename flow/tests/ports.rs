//! Ports that stay put: an endpoint without a fixed `port:` keeps one port from one `up` to the
//! next; when someone else holds it the flow moves it, says so, and keeps the new one; a fixed
//! port always wins over one recorded for another endpoint.

mod common;

use common::{Recorder, TempWorkspace, assert_no_orphans, fast_options};
use flow::{Flow, FlowEvent, Selection};
use tokio_util::sync::CancellationToken;

const FLOW: &str = "services:
  - name: api
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
";

/// Brings the flow up, returns the port of `service/endpoint` and the warnings, and stops it.
async fn up_once(ws: &TempWorkspace, service: &str, endpoint: &str) -> (u16, Vec<String>) {
    let flow = Flow::load(ws.root(), fast_options()).expect("load");
    let (rec, sink) = Recorder::start();
    let running = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let port = running
        .address(service, endpoint)
        .expect("an address")
        .port();
    running.shutdown().await;
    assert_no_orphans(&rec.spawned());
    let warnings = rec
        .snapshot()
        .into_iter()
        .filter_map(|e| match e {
            FlowEvent::Warning { text, .. } => Some(text),
            _ => None,
        })
        .collect();
    (port, warnings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_keeps_its_port_from_one_up_to_the_next() {
    let ws = TempWorkspace::new(&[("flow.yaml", FLOW)]);
    let (first, warnings) = up_once(&ws, "api", "http").await;
    assert!(warnings.is_empty(), "{warnings:?}");
    for _ in 0..2 {
        let (again, warnings) = up_once(&ws, "api", "http").await;
        assert_eq!(again, first, "the port moved between runs");
        assert!(warnings.is_empty(), "{warnings:?}");
    }
    // Even with the record gone, the port is derived again from the workspace and the name.
    std::fs::remove_file(ws.path(".hostd/flow/ports.json")).expect("the record exists");
    let (derived, _) = up_once(&ws, "api", "http").await;
    assert_eq!(derived, first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_port_someone_else_holds_moves_says_so_and_the_new_one_is_kept() {
    let ws = TempWorkspace::new(&[("flow.yaml", FLOW)]);
    let (first, _) = up_once(&ws, "api", "http").await;
    let squatter = std::net::TcpListener::bind(("127.0.0.1", first)).expect("take the port");
    let (moved, warnings) = up_once(&ws, "api", "http").await;
    assert_ne!(moved, first);
    assert!(
        warnings.iter().any(|w| w.contains("api/http")
            && w.contains(&first.to_string())
            && w.contains(&moved.to_string())),
        "the move must be reported with both ports: {warnings:?}"
    );
    drop(squatter);
    let (kept, warnings) = up_once(&ws, "api", "http").await;
    assert_eq!(kept, moved, "after a move the new port is the one kept");
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_port_wins_over_a_port_recorded_for_another_endpoint() {
    let ws = TempWorkspace::new(&[("flow.yaml", FLOW)]);
    let (recorded, _) = up_once(&ws, "api", "http").await;
    std::fs::write(
        ws.path("flow.yaml"),
        format!(
            "services:
  - name: api
    command: {fixture}
    args: [tcp]
    endpoints: [{{name: http, api: tcp}}]
  - name: admin
    command: {fixture}
    args: [tcp]
    endpoints: [{{name: http, api: tcp, port: {recorded}}}]
",
            fixture = common::FIXTURE
        ),
    )
    .expect("flow.yaml");
    let flow = Flow::load(ws.root(), fast_options()).expect("load");
    let (rec, sink) = Recorder::start();
    let running = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    assert_eq!(
        running.address("admin", "http").map(|a| a.port()),
        Some(recorded)
    );
    let api = running.address("api", "http").map(|a| a.port());
    assert!(api.is_some() && api != Some(recorded), "{api:?}");
    running.shutdown().await;
    assert_no_orphans(&rec.spawned());
}
