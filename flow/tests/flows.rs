//! Flows with real processes: ordering and addresses, every readiness predicate, completion
//! jobs, restart policies, layered teardown with receipts, interruption. Every test ends by
//! checking that no process of any group it started survives.

mod common;

use std::time::Duration;

use common::{Recorder, TempWorkspace, assert_no_orphans, fast_options, is_step};
use flow::events::Step;
use flow::{
    Flow, FlowEndReason, FlowError, FlowEvent, FlowOptions, Predicate, Selection, StopOutcome,
};
use tokio_util::sync::CancellationToken;

fn env_of(dump: &str) -> std::collections::HashMap<String, String> {
    dump.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_starts_in_order_and_each_consumer_sees_its_producers_addresses() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "name: chain
services:
  - name: store
    command: {fixture}
    args: [tcp, --env-dump, '{dir}/store.env']
    endpoints: [{name: data, api: tcp}]
  - name: api
    command: {fixture}
    args: [http, --require-env, FLOW_DEP_STORE_DATA_ADDR, --env-dump, '{dir}/api.env']
    endpoints:
      - {name: http, api: http, health: /healthz}
    dependencies: [{name: store, kind: runtime}]
  - name: web
    command: {fixture}
    args: [tcp, --require-env, APP_API_ADDR, --env-dump, '{dir}/web.env']
    endpoints: [{name: http, api: tcp}]
    env:
      APP_API: 'http://${endpoint:api/http}/v1'
      APP_API_ADDR: '${endpoint:api/http}'
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));

    let store = up.address("store", "data").unwrap();
    let api = up.address("api", "http").unwrap();
    let web = up.address("web", "http").unwrap();
    assert!(store.ip().is_loopback() && store.port() != api.port() && api.port() != web.port());

    // Order: each consumer starts only after its producer is running.
    let running = |s: &'static str| rec.position(move |e| is_step(e, s, Step::Running)).unwrap();
    let started = |s: &'static str| rec.position(move |e| is_step(e, s, Step::Start)).unwrap();
    assert!(running("store") < started("api"));
    assert!(running("api") < started("web"));

    // Addresses: each consumer was handed its producers' addresses, and its own.
    let api_env = env_of(&ws.read("api.env"));
    assert_eq!(api_env["FLOW_DEP_STORE_DATA_ADDR"], store.to_string());
    assert_eq!(api_env["PORT"], api.port().to_string());
    assert_eq!(api_env["FLOW_ENDPOINT_HTTP_ADDR"], api.to_string());
    let web_env = env_of(&ws.read("web.env"));
    assert_eq!(web_env["APP_API"], format!("http://{api}/v1"));
    assert_eq!(web_env["FLOW_DEP_API_HTTP_ADDR"], api.to_string());
    assert!(
        !web_env.contains_key("FLOW_DEP_STORE_DATA_ADDR"),
        "only direct producers' addresses are handed over"
    );

    let status = up.status().await.unwrap();
    assert!(
        status
            .iter()
            .all(|s| s.state == "running" && s.pid.is_some()),
        "{status:?}"
    );

    let end = up.shutdown().await;
    assert!(matches!(end.reason, FlowEndReason::Shutdown));
    let layer = |s: &str| end.teardown.receipt(s).unwrap().layer;
    assert_eq!((layer("web"), layer("api"), layer("store")), (0, 1, 2));
    assert!(end.teardown.all_stopped(), "{:?}", end.teardown);
    assert!(
        !flow.paths().state_file.exists(),
        "a clean teardown removes the state file"
    );
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_health_server_becomes_ready_only_when_it_turns_from_not_serving_to_serving() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: greeter
    command: {fixture}
    args: [grpc, --serve-when-file, '{dir}/serve']
    endpoints: [{name: grpc, api: grpc}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let flow2 = flow.clone();
    let up = tokio::spawn(async move {
        flow2
            .up(Selection::default(), sink, CancellationToken::new())
            .await
    });

    let waiting = rec
        .wait_for("greeter reported NOT_SERVING", |e| {
            matches!(e, FlowEvent::Waiting { failure, .. }
                if failure.predicate == Predicate::GrpcHealth && failure.last_error.contains("NOT_SERVING"))
        })
        .await;
    if let FlowEvent::Waiting { failure, .. } = waiting {
        assert_eq!(failure.endpoint.as_deref(), Some("grpc"));
    }
    assert!(
        rec.position(|e| is_step(e, "greeter", Step::Running))
            .is_none()
    );
    std::fs::write(ws.path("serve"), b"").unwrap();

    let up = up
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    assert!(
        rec.position(|e| is_step(e, "greeter", Step::Running))
            .is_some()
    );
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

/// The server as a whole reports SERVING from the start, but the service the endpoint
/// declares (`health: shop.Greeter`) is NOT_SERVING until the file appears: the flow waits for
/// the declared service, not the server-wide answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_endpoint_waits_for_the_service_it_declares_not_the_server_wide_status() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: greeter
    command: {fixture}
    args: [grpc, --service, shop.Greeter, --serve-when-file, '{dir}/serve']
    endpoints: [{name: grpc, api: grpc, health: shop.Greeter}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let flow2 = flow.clone();
    let up = tokio::spawn(async move {
        flow2
            .up(Selection::default(), sink, CancellationToken::new())
            .await
    });
    rec.wait_for("greeter's declared service reported NOT_SERVING", |e| {
        matches!(e, FlowEvent::Waiting { failure, .. }
            if failure.predicate == Predicate::GrpcHealth
                && failure.last_error.contains("NOT_SERVING")
                && failure.last_error.contains("shop.Greeter"))
    })
    .await;
    assert!(
        rec.position(|e| is_step(e, "greeter", Step::Running))
            .is_none(),
        "ready on the server-wide status while the declared service was NOT_SERVING"
    );
    std::fs::write(ws.path("serve"), b"").unwrap();
    let up = up
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_server_without_the_health_service_is_ready_on_its_transport() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: bare\n    command: {fixture}\n    args: [grpc-bare]\n    endpoints: [{name: grpc, api: grpc}]\n",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("Unimplemented health must mean transport-only readiness: {e}"));
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_readiness_reports_the_predicate_that_still_fails_at_the_deadline() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: sick
    command: {fixture}
    args: [http, --health-status, '503']
    endpoints: [{name: http, api: http, health: /healthz}]
",
    )]);
    let options = FlowOptions {
        readiness_timeout: Duration::from_millis(800),
        ..fast_options()
    };
    let flow = Flow::load(ws.root(), options).unwrap();
    let (rec, sink) = Recorder::start();
    let failure = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .expect_err("a 503 health path never becomes ready");
    match &failure.error {
        FlowError::NotReady { failure } => {
            assert_eq!(failure.service, "sick");
            assert_eq!(failure.endpoint.as_deref(), Some("http"));
            assert_eq!(failure.predicate, Predicate::HttpStatus);
            assert!(
                failure.last_error.contains("HEAD /healthz answered 503"),
                "{failure}"
            );
        }
        other => panic!("expected a readiness failure, got {other}"),
    }
    assert!(
        failure.error.to_string().contains("http-status failed"),
        "{}",
        failure.error
    );
    assert_eq!(
        failure.teardown.receipt("sick").unwrap().outcome,
        StopOutcome::Stopped
    );
    assert_no_orphans(&rec.spawned());
}

/// An http endpoint that declares no health path is ready once its port accepts: nothing is
/// asked of `/`, so a server that speaks no HTTP at all (it writes a line and hangs up) is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_endpoint_without_a_health_path_is_ready_on_its_transport_alone() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: plain\n    command: {fixture}\n    args: [tcp]\n    endpoints: [{name: http, api: http}]\n",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("no health path must mean transport-only readiness: {e}"));
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_health_path_that_redirects_counts_as_an_answer_and_is_not_followed() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: moved
    command: {fixture}
    args: [http, --health-status, '302']
    endpoints: [{name: http, api: http, health: /healthz}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap();
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_dies_before_it_is_ready_fails_the_flow_with_its_status_and_last_lines() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: doomed
    command: {fixture}
    args: [job, --exit, '4', --say, 'cannot bind']
    endpoints: [{name: http, api: tcp}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let failure = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .expect_err("it exits");
    match &failure.error {
        FlowError::ServiceCrashed {
            service,
            exit,
            last_lines,
            ..
        } => {
            assert_eq!(service, "doomed");
            assert_eq!(exit, "status 4");
            assert!(
                last_lines.iter().any(|l| l == "cannot bind"),
                "{last_lines:?}"
            );
        }
        other => panic!("expected a crash, got {other}"),
    }
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_job_runs_to_exit_zero_before_its_consumer_starts() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: migrate
    command: {fixture}
    args: [job, --exit-after, 300ms, --count-starts, '{dir}/migrated']
  - name: api
    command: {fixture}
    args: [tcp, --env-dump, '{dir}/api.env']
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: migrate, kind: completion}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap();
    let completed = rec
        .position(|e| is_step(e, "migrate", Step::Completed))
        .unwrap();
    let started = rec.position(|e| is_step(e, "api", Step::Start)).unwrap();
    assert!(
        completed < started,
        "the consumer started before the job completed"
    );
    assert_eq!(ws.read("migrated").lines().count(), 1);
    let env = env_of(&ws.read("api.env"));
    assert!(
        !env.keys().any(|k| k.starts_with("FLOW_DEP_MIGRATE")),
        "a completion edge hands over no address"
    );
    let status = up.status().await.unwrap();
    assert_eq!(
        status.iter().find(|s| s.name == "migrate").unwrap().state,
        "completed"
    );
    let end = up.shutdown().await;
    assert_eq!(
        end.teardown.receipt("migrate").unwrap().outcome,
        StopOutcome::Stopped
    );
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_completion_job_fails_the_flow_naming_the_job_its_status_and_last_lines() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: migrate
    command: {fixture}
    args: [job, --exit, '3', --say, 'table quotes already exists']
  - name: api
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: migrate, kind: completion}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let failure = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .expect_err("the job fails");
    match &failure.error {
        FlowError::JobFailed {
            service,
            exit,
            last_lines,
            ..
        } => {
            assert_eq!(service, "migrate");
            assert_eq!(exit, "status 3");
            assert!(
                last_lines
                    .iter()
                    .any(|l| l == "table quotes already exists"),
                "{last_lines:?}"
            );
        }
        other => panic!("expected the job's failure, got {other}"),
    }
    assert_eq!(failure.error.code(), "flow.job_failed");
    assert!(
        rec.position(|e| is_step(e, "api", Step::Start)).is_none(),
        "the consumer never starts"
    );
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_service_is_restarted_within_its_budget_then_fails_the_flow_with_its_last_lines()
{
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: flaky
    command: {fixture}
    args: [sleep, --exit-after, 150ms, --exit, '7', --say, 'about to fall over', --count-starts, '{dir}/starts']
    restart: {policy: on-failure, max_restarts: 2, window: 1m, backoff: 50ms}
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let error = match flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
    {
        // Usually up first (the crash comes 150 ms after the start)…
        Ok(up) => match up.wait().await.reason {
            FlowEndReason::Failed(e) => e,
            other => panic!("the flow should fail, it ended with {other:?}"),
        },
        // …but a slow machine may see the first crash before the first readiness round.
        Err(failure) => failure.error,
    };
    match &error {
        FlowError::ServiceCrashed {
            service,
            exit,
            reason,
            last_lines,
        } => {
            assert_eq!(service, "flaky");
            assert_eq!(exit, "status 7");
            assert!(
                reason.contains("exhausted its restart budget (2 restarts within 1m)"),
                "{reason}"
            );
            assert!(
                last_lines.iter().any(|l| l == "about to fall over"),
                "{last_lines:?}"
            );
        }
        other => panic!("expected a crash, got {other}"),
    }
    assert_eq!(
        ws.read("starts").lines().count(),
        3,
        "one start and two restarts"
    );
    let restarts: Vec<u32> = rec
        .snapshot()
        .iter()
        .filter_map(|e| match e {
            FlowEvent::Restarting { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(restarts, vec![1, 2]);
    assert_eq!(rec.spawned().len(), 3);
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_service_comes_back_to_running_and_the_flow_stays_up() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: phoenix
    command: {fixture}
    args: [tcp, --exit-after, 300ms, --exit, '1', --count-starts, '{dir}/starts']
    endpoints: [{name: e, api: tcp}]
    restart: {policy: always, max_restarts: 1, window: 1m, backoff: 10ms}
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap();
    rec.wait_for("a restart", |e| matches!(e, FlowEvent::Restarting { .. }))
        .await;
    // Back to running after the restart, on the same port.
    let running = |e: &FlowEvent| is_step(e, "phoenix", Step::Running);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while rec.snapshot().iter().filter(|e| running(e)).count() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no second running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = up.status().await.unwrap();
    assert_eq!(status[0].restarts, 1);
    // The second start exits again after 300 ms and exhausts the budget of one.
    let end = up.wait().await;
    assert!(matches!(
        end.reason,
        FlowEndReason::Failed(FlowError::ServiceCrashed { .. })
    ));
    assert_eq!(ws.read("starts").lines().count(), 2);
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_stops_consumers_first_and_a_shared_dependency_once_after_all_of_them() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: db
    command: {fixture}
    args: [tcp]
    endpoints: [{name: pg, api: tcp}]
  - name: api
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: db, kind: runtime}]
  - name: worker
    command: {fixture}
    args: [sleep, --child]
    dependencies: [{name: db}]
  - name: web
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: api, kind: runtime}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap();
    let end = up.shutdown().await;
    let r = &end.teardown;
    assert_eq!(r.layers, 3);
    let order: Vec<(&str, usize)> = r
        .receipts
        .iter()
        .map(|x| (x.service.as_str(), x.layer))
        .collect();
    assert_eq!(
        order,
        vec![("worker", 0), ("web", 0), ("api", 1), ("db", 2)]
    );
    assert_eq!(r.receipts.iter().filter(|x| x.service == "db").count(), 1);
    assert!(r.all_stopped(), "{r:?}");
    // The worker's child shared its process group and went with it.
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_ignores_sigterm_is_killed_and_receipted_timed_out() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: db
    command: {fixture}
    args: [tcp]
    endpoints: [{name: pg, api: tcp}]
  - name: stubborn
    command: {fixture}
    args: [sleep, --ignore-sigterm]
    dependencies: [{name: db}]
",
    )]);
    let options = FlowOptions {
        teardown_layer_budget: Duration::from_millis(700),
        ..fast_options()
    };
    let flow = Flow::load(ws.root(), options).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap();
    // Let the fixture install its SIGTERM handler.
    rec.wait_for("stubborn running", |e| {
        is_step(e, "stubborn", Step::Running)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let end = up.shutdown().await;
    let stubborn = end.teardown.receipt("stubborn").unwrap();
    assert_eq!(stubborn.outcome, StopOutcome::TimedOut, "{stubborn:?}");
    assert!(stubborn.duration_ms >= 700, "{stubborn:?}");
    assert!(stubborn.detail.contains("SIGKILL"), "{stubborn:?}");
    let db = end.teardown.receipt("db").unwrap();
    assert_eq!((db.outcome, db.layer), (StopOutcome::Stopped, 1));
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_up_tears_down_what_it_started() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: db
    command: {fixture}
    args: [tcp]
    endpoints: [{name: pg, api: tcp}]
  - name: slow
    command: {fixture}
    args: [grpc, --serve-when-file, '{dir}/never']
    endpoints: [{name: grpc, api: grpc}]
    dependencies: [{name: db, kind: runtime}]
  - name: web
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: slow, kind: runtime}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let cancel = CancellationToken::new();
    let flow2 = flow.clone();
    let token = cancel.clone();
    let up = tokio::spawn(async move { flow2.up(Selection::default(), sink, token).await });
    rec.wait_for(
        "slow waiting",
        |e| matches!(e, FlowEvent::Waiting { service, .. } if service == "slow"),
    )
    .await;
    cancel.cancel();
    let failure = up.await.unwrap().expect_err("interrupted");
    assert!(
        matches!(failure.error, FlowError::Interrupted),
        "{}",
        failure.error
    );
    let stopped: Vec<&str> = failure
        .teardown
        .receipts
        .iter()
        .map(|r| r.service.as_str())
        .collect();
    assert_eq!(
        stopped,
        vec!["slow", "db"],
        "web never started, so it has no receipt"
    );
    assert!(!flow.paths().state_file.exists());
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_with_a_target_starts_its_closure_and_only_deps_leaves_the_target_out() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: db
    command: {fixture}
    args: [tcp]
    endpoints: [{name: pg, api: tcp}]
  - name: codegen
    command: {fixture}
    args: [tcp]
    endpoints: [{name: e, api: tcp}]
  - name: api
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
    dependencies:
      - {name: db, kind: runtime}
      - {name: codegen, kind: build}
  - name: other
    command: {fixture}
    args: [tcp]
    endpoints: [{name: e, api: tcp}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(
            Selection::service("api"),
            sink.clone(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let names: Vec<String> = up
        .status()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        vec!["db", "api"],
        "a build edge does not pull its producer into a run"
    );
    up.shutdown().await;

    let up = flow
        .up(
            Selection {
                only_deps: true,
                ..Selection::service("api")
            },
            sink,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let names: Vec<String> = up
        .status()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, vec!["db"]);
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_up_in_the_same_workspace_is_refused_while_the_first_runs() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: {fixture}\n    args: [tcp]\n    endpoints: [{name: e, api: tcp}]\n",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink.clone(), CancellationToken::new())
        .await
        .unwrap();
    let refused = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .expect_err("one up per workspace");
    assert!(
        matches!(refused.error, FlowError::AlreadyUp { pid } if pid == std::process::id() as i32)
    );
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_cannot_be_started_fails_the_lifecycle_predicate_and_its_producers_are_stopped()
 {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: db
    command: {fixture}
    args: [tcp]
    endpoints: [{name: pg, api: tcp}]
  - name: api
    command: ./no-such-program
    dependencies: [{name: db, kind: runtime}]
    restart: {policy: 'no'}
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let failure = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .expect_err("the program does not exist");
    assert_eq!(failure.error.code(), "flow.spawn");
    let text = failure.error.to_string();
    assert!(
        text.starts_with("api: lifecycle failed: cannot start"),
        "{text}"
    );
    assert!(text.contains("no-such-program"), "{text}");
    assert_eq!(
        failure.teardown.receipt("db").unwrap().outcome,
        StopOutcome::Stopped
    );
    assert_eq!(rec.spawned().len(), 1, "only db was spawned");
    assert_no_orphans(&rec.spawned());
}
