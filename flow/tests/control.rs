//! The control socket of a running flow, through the library: changes asked with
//! `flow::control::request` against a flow brought up with `Flow::up`, with the fixture
//! program as real services.

mod common;

use std::time::Duration;

use common::{FIXTURE, Recorder, TempWorkspace, assert_no_orphans, fast_options};
use flow::control;
use flow::state::StatePaths;
use flow::{ChangeRequest, Flow, FlowError, Selection};
use tokio_util::sync::CancellationToken;

const TWO: &str = "name: two
services:
  - name: db
    command: {fixture}
    args: [tcp]
    endpoints: [{name: pg, api: tcp}]
  - name: api
    command: {fixture}
    args: [http, --require-env, FLOW_DEP_DB_PG_ADDR]
    endpoints: [{name: http, api: http, health: /healthz}]
    dependencies: [{name: db, kind: runtime}]
";

#[tokio::test]
async fn a_workspace_too_deep_for_a_socket_address_still_answers_changes() {
    let ws = TempWorkspace::new(&[]);
    let deep = ws
        .root()
        .join("a-folder-name-long-enough-to-matter")
        .join("and-another-one-to-pass-the-limit-of-a-unix-socket-address");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("flow.yaml"), TWO.replace("{fixture}", FIXTURE)).unwrap();
    let socket = StatePaths::for_workspace(&deep).control_socket;
    assert!(
        socket.as_os_str().len() > 108,
        "{} must not fit in a socket address",
        socket.display()
    );
    let flow = Flow::load(&deep, fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let before = up.status().await.unwrap();
    let pid = |status: &[flow::ServiceStatus], name: &str| {
        status.iter().find(|s| s.name == name).and_then(|s| s.pid)
    };

    let report = control::request(
        &deep,
        &ChangeRequest::Restart {
            services: vec!["db".into()],
        },
    )
    .await
    .unwrap_or_else(|e| panic!("restart refused: {e}"));
    assert!(report.clean(), "{report:?}");
    assert_eq!(report.started.len(), 1, "{report:?}");
    let after = up.status().await.unwrap();
    assert_ne!(pid(&after, "db"), pid(&before, "db"));
    assert_eq!(
        pid(&after, "api"),
        pid(&before, "api"),
        "its consumer runs on"
    );
    assert_eq!(up.address("db", "pg").map(|a| a.to_string()), {
        let (_, address) = &report.started[0].endpoints[0];
        Some(address.clone())
    });

    let end = up.shutdown().await;
    assert!(end.teardown.all_stopped(), "{:?}", end.teardown);
    assert!(!socket.exists(), "the socket is removed at the end");
    assert_no_orphans(&rec.spawned());
}

#[tokio::test]
async fn a_dropped_flow_handle_still_ends_the_flow_and_then_changes_are_refused() {
    let ws = TempWorkspace::new(&[("flow.yaml", TWO)]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let socket = StatePaths::for_workspace(ws.root()).control_socket;
    assert!(socket.exists());
    // The socket holds only a weak sender: dropping the one handle ends the flow.
    drop(up);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while StatePaths::for_workspace(ws.root()).state_file.exists() || socket.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the flow did not end after its handle was dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_no_orphans(&rec.spawned());
    let refused = control::request(
        ws.root(),
        &ChangeRequest::Stop {
            services: vec!["api".into()],
            with_dependents: false,
        },
    )
    .await
    .expect_err("nothing runs");
    assert!(
        matches!(refused, FlowError::NotRunning { .. }),
        "{refused:?}"
    );
    assert_eq!(refused.code(), "flow.not_running");
}
