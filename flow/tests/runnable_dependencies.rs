//! A runnable that declares a dependency on a flow service, invoked while that flow is up:
//! the address injected into the handler is the live allocation the flow's own consumers
//! get. Here rather than in the runnable crate's suite because it drives this crate's test
//! service program.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use flow::{EventSink, Flow, FlowOptions, Selection};
use runnable::declaration::DECLARATION_FILE;
use runnable::{InvokeRequest, OutcomeClass, Runner};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use common::FIXTURE;

const OK_DOC: &str = r#"echo '{"ok":true,"output":{"n":1}}'"#;

#[tokio::test]
async fn with_the_flow_up_the_injected_address_is_the_live_allocation_a_flow_consumer_gets() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("shop");
    let folder = root.join("runnables").join("uses-db");
    std::fs::create_dir_all(&folder).expect("runnable folder");
    let client_env = tmp.path().join("client.env");
    let marker = tmp.path().join("marker");
    std::fs::write(
        root.join("flow.yaml"),
        format!(
            "name: shopflow\nservices:\n  - name: db\n    command: {FIXTURE}\n    args: [tcp]\n    endpoints: [{{name: pg, api: tcp}}]\n\
             \x20 - name: client\n    command: {FIXTURE}\n    args: [tcp, --env-dump, '{}']\n    endpoints: [{{name: http, api: tcp}}]\n    dependencies: [{{name: db, kind: runtime, endpoints: [pg]}}]\n",
            client_env.display()
        ),
    )
    .expect("flow.yaml");
    std::fs::write(
        folder.join(DECLARATION_FILE),
        "name: uses-db\nversion: 1\ndescription: test runnable\n\
         input:\n  type: object\n  properties:\n    n: {type: integer}\n  required: [n]\n\
         output:\n  type: object\n  properties:\n    n: {type: integer}\n  required: [n]\n\
         command: ./run.sh\ntimeout: 5s\neffect: read_only\n\
         dependencies: [{service: db, endpoints: [pg]}]\n",
    )
    .expect("declaration");
    let script = folder.join("run.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >/dev/null\necho \"$FLOW_DEP_DB_PG_ADDR\" >> {}\n{OK_DOC}\n",
            marker.display()
        ),
    )
    .expect("handler");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let invoke = || async {
        Runner::open(&root)
            .expect("workspace opens")
            .invoke(
                "uses-db",
                InvokeRequest {
                    input: json!({"n": 1}),
                    ..InvokeRequest::default()
                },
                &CancellationToken::new(),
            )
            .await
    };

    // Flow down: the port is allocated only at start, so the invocation is refused.
    assert_eq!(invoke().await.unwrap_err().code(), "unresolved_dependency");

    let options = FlowOptions {
        readiness_timeout: Duration::from_secs(20),
        readiness_backoff_initial: Duration::from_millis(20),
        readiness_backoff_max: Duration::from_millis(200),
        ..FlowOptions::default()
    };
    let flow = Flow::load(&root, options).unwrap();
    let (sink, mut rx) = EventSink::channel(4096);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let live = up.address("db", "pg").unwrap().to_string();
    let inv = invoke().await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::Succeeded, "{}", inv.detail);
    let consumer: String = std::fs::read_to_string(&client_env)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("FLOW_DEP_DB_PG_ADDR=").map(str::to_owned))
        .expect("the flow consumer got the address");
    let seen: Vec<String> = std::fs::read_to_string(&marker)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(seen, std::slice::from_ref(&live));
    assert_eq!(consumer, live);
    up.shutdown().await;
}
