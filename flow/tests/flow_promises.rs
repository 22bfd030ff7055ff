//! The promises of `docs/conformance/seeds-000-002.md` that the engine keeps, each with real
//! processes: every wait bounded, a failed job ends the run, no start over a squatter, every
//! process group recorded before anything waits on it, reciprocal references, restarts of
//! failed starts, selection options, dry runs, status, and recovery of a refused group. Every
//! test that starts processes ends with the `/proc` check that nothing is left behind.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use common::{FIXTURE, Recorder, TempWorkspace, assert_no_orphans, fast_options, is_step};
use flow::events::Step;
use flow::procfs;
use flow::recover::{self, RecoveryPreview};
use flow::state::{self, StatePaths};
use flow::teardown::TeardownBudget;
use flow::{
    DownOptions, EnvOverride, Flow, FlowError, FlowEvent, FlowOptions, Predicate, Selection,
    StopOutcome, TeardownOperation, down,
};
use tokio_util::sync::CancellationToken;

/// Bounds a wait that, without the behaviour under test, would hang: the test then fails
/// instead of never ending.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within 30 s"))
}

fn env_of(dump: &str) -> std::collections::HashMap<String, String> {
    dump.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn me() -> String {
    format!("pid {}", std::process::id())
}

/// Rows 69 and 68: a failed job ends the `up` even when no consumer of it is started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_ends_the_up_even_when_none_of_its_consumers_is_started() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: migrate
    command: {fixture}
    args: [job, --exit, '3', --say, 'migration 0007 failed']
  - name: api
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: migrate, kind: completion}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let selections = [
        Selection {
            only_deps: true,
            ..Selection::service("api")
        },
        Selection::service("migrate"),
    ];
    for selection in selections {
        let failure = bounded(
            "an up whose only job fails",
            flow.up(selection, sink.clone(), CancellationToken::new()),
        )
        .await
        .expect_err("the job fails");
        match &failure.error {
            FlowError::JobFailed {
                service,
                exit,
                last_lines,
                ..
            } => {
                assert_eq!((service.as_str(), exit.as_str()), ("migrate", "status 3"));
                assert!(
                    last_lines.iter().any(|l| l == "migration 0007 failed"),
                    "{last_lines:?}"
                );
            }
            other => panic!("expected the job's failure, got {other}"),
        }
    }
    assert_no_orphans(&rec.spawned());
}

/// Row 68: waiting on a job is bounded by the readiness deadline and says what it waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_on_a_job_that_never_exits_is_bounded_and_shows_what_it_waits_for() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: seed
    command: {fixture}
    args: [sleep]
  - name: api
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: seed, kind: completion}]
",
    )]);
    let options = FlowOptions {
        readiness_timeout: Duration::from_millis(2500),
        ..fast_options()
    };
    let flow = Flow::load(ws.root(), options).unwrap();
    let (rec, sink) = Recorder::start();
    let failure = bounded(
        "an up waiting on a job that never exits",
        flow.up(Selection::default(), sink, CancellationToken::new()),
    )
    .await
    .expect_err("the job never completes");
    match &failure.error {
        FlowError::NotReady { failure } => {
            assert_eq!(failure.service, "seed");
            assert_eq!(failure.predicate, Predicate::Completion);
            assert!(failure.last_error.contains("deadline passed"), "{failure}");
        }
        other => panic!("expected a bounded wait, got {other}"),
    }
    assert!(
        rec.position(|e| matches!(e, FlowEvent::Waiting { service, failure, .. }
            if service == "seed" && failure.predicate == Predicate::Completion))
            .is_some(),
        "the wait for the job was shown while it lasted"
    );
    assert_eq!(
        failure.teardown.receipt("seed").unwrap().outcome,
        StopOutcome::Stopped
    );
    assert_no_orphans(&rec.spawned());
}

/// Row 28: a reference back to a service that depends on its consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_to_a_callback_owner_that_depends_on_its_consumer_keeps_both_in_the_run() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: svc
    command: {fixture}
    args: [tcp, --env-dump, '{dir}/svc.env']
    endpoints: [{name: api, api: tcp}]
    env:
      APP_CALLBACK: 'http://${endpoint:owner/hook}/done'
  - name: owner
    command: {fixture}
    args: [tcp, --require-env, FLOW_DEP_SVC_API_ADDR]
    endpoints: [{name: hook, api: tcp}]
    dependencies: [{name: svc, kind: runtime}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options())
        .unwrap_or_else(|e| panic!("a reciprocal reference is not a cycle: {e}"));
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::service("svc"), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let owner = up
        .address("owner", "hook")
        .expect("the owner is in the run");
    let running = |s: &'static str| rec.position(move |e| is_step(e, s, Step::Running)).unwrap();
    let started = |s: &'static str| rec.position(move |e| is_step(e, s, Step::Start)).unwrap();
    assert!(
        running("svc") < started("owner"),
        "the owner still waits for the service it depends on"
    );
    let env = env_of(&ws.read("svc.env"));
    assert_eq!(env["APP_CALLBACK"], format!("http://{owner}/done"));
    assert!(
        rec.position(|e| matches!(e, FlowEvent::Notice { service, text }
            if service == "svc" && text.contains("adds no startup wait")))
            .is_some(),
        "the run says why it did not wait"
    );
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

/// Row 49: a start that fails before any process runs is retried under `on-failure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_be_started_yet_is_retried_under_its_restart_policy() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: late
    command: ./late.sh
    endpoints: [{name: e, api: tcp}]
    restart: {policy: on-failure, max_restarts: 20, window: 1m, backoff: 100ms, max_backoff: 100ms}
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
    rec.wait_for("a failed start of `late`", |e| {
        matches!(e, FlowEvent::Warning { service, text } if service == "late" && text.contains("cannot start"))
    })
    .await;
    // The program appears (a build finished, a file was mounted): the next attempt runs it.
    let script = ws.path("late.sh");
    std::fs::write(&script, format!("#!/bin/sh\nexec {FIXTURE} tcp\n")).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let up = bounded("up", up)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the retried start should come up: {e}"));
    let status = up.status().await.unwrap();
    assert_eq!(status[0].state, "running");
    assert!(status[0].restarts >= 1, "{status:?}");
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

/// Row 48: without a declared policy a crashed service is restarted (a job is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_a_restart_policy_is_restarted_on_failure_and_a_job_is_not() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: flaky
    command: {fixture}
    args: [tcp, --fail-once, '{dir}/flaky.failed', --count-starts, '{dir}/flaky.starts']
    endpoints: [{name: e, api: tcp}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    assert_eq!(
        flow.workspace().service("flaky").unwrap().restart.policy,
        flow::RestartPolicy::OnFailure
    );
    let (rec, sink) = Recorder::start();
    let up = bounded(
        "up",
        flow.up(Selection::default(), sink, CancellationToken::new()),
    )
    .await
    .unwrap_or_else(|e| panic!("one crash is absorbed by the default policy: {e}"));
    assert!(ws.path("flaky.failed").exists(), "the first start failed");
    assert_eq!(
        ws.read("flaky.starts").lines().count(),
        1,
        "the second one runs"
    );
    assert_eq!(up.status().await.unwrap()[0].restarts, 1);
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());

    let jobs = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: migrate
    command: {fixture}
    args: [job, --fail-once, '{dir}/m.failed', --count-starts, '{dir}/m.starts']
  - name: api
    command: {fixture}
    args: [tcp]
    endpoints: [{name: e, api: tcp}]
    dependencies: [{name: migrate, kind: completion}]
",
    )]);
    let flow = Flow::load(jobs.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let failure = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .expect_err("a job is not re-run unless its manifest says so");
    assert_eq!(failure.error.code(), "flow.job_failed");
    assert_eq!(
        jobs.read("m.starts").lines().count(),
        0,
        "failed before counting"
    );
    assert!(jobs.path("m.failed").exists());
    assert_no_orphans(&rec.spawned());
}

/// Row 53: the port is checked again right before the start, and its holder is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_taken_while_a_job_runs_is_refused_before_the_service_starts() {
    let port = free_port();
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        &format!(
            "services:
  - name: migrate
    command: {{fixture}}
    args: [job, --exit-after, 1500ms]
  - name: web
    command: {{fixture}}
    args: [tcp, --survive-bind-failure]
    endpoints: [{{name: http, api: tcp, port: {port}}}]
    dependencies: [{{name: migrate, kind: completion}}]
    restart: {{policy: 'no'}}
"
        ),
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let flow2 = flow.clone();
    let up = tokio::spawn(async move {
        flow2
            .up(Selection::default(), sink, CancellationToken::new())
            .await
    });
    rec.wait_for("the job's start", |e| is_step(e, "migrate", Step::Start))
        .await;
    let squatter = TcpListener::bind(("127.0.0.1", port)).expect("squat the port");
    let failure = bounded("up", up)
        .await
        .unwrap()
        .expect_err("web must not start over a squatter");
    match &failure.error {
        FlowError::PortUnavailable {
            service,
            port: p,
            reason,
            ..
        } => {
            assert_eq!((service.as_str(), *p), ("web", port));
            assert!(reason.contains(&me()), "the holder is named: {reason}");
        }
        other => panic!("expected a taken port, got {other}"),
    }
    assert!(
        rec.position(|e| is_step(e, "web", Step::Start)).is_none(),
        "web was never spawned"
    );
    drop(squatter);
    assert_no_orphans(&rec.spawned());
}

/// Row 53: a squatter on the IPv6 loopback is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_port_taken_on_the_ipv6_loopback_is_refused_naming_its_holder() {
    let Ok(squatter) = TcpListener::bind(("::1", 0)) else {
        panic!("this test needs an IPv6 loopback (::1)");
    };
    let port = squatter.local_addr().unwrap().port();
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        &format!(
            "services:
  - name: web
    command: {{fixture}}
    args: [tcp]
    endpoints: [{{name: http, api: tcp, port: {port}}}]
"
        ),
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let failure = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .expect_err("[::1] is taken");
    assert_eq!(failure.error.code(), "flow.port_unavailable");
    let text = failure.error.to_string();
    assert!(text.contains(&format!("[::1]:{port}")), "{text}");
    assert!(text.contains(&me()), "{text}");
    assert!(rec.spawned().is_empty(), "nothing was started");
    drop(squatter);
}

/// Row 53: readiness checks that what answers on the port is the service's own process group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squatter_answering_on_a_services_port_does_not_make_the_service_ready() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: web
    command: {fixture}
    args: [tcp, --bind-delay, 1s, --survive-bind-failure]
    endpoints: [{name: http, api: tcp}]
    restart: {policy: 'no'}
",
    )]);
    let options = FlowOptions {
        readiness_timeout: Duration::from_secs(3),
        ..fast_options()
    };
    let flow = Flow::load(ws.root(), options).unwrap();
    let (rec, sink) = Recorder::start();
    let flow2 = flow.clone();
    let up = tokio::spawn(async move {
        flow2
            .up(Selection::default(), sink, CancellationToken::new())
            .await
    });
    let load = rec
        .wait_for("web's Load", |e| is_step(e, "web", Step::Load))
        .await;
    let FlowEvent::Step { detail, .. } = load else {
        unreachable!()
    };
    let addr: SocketAddr = detail
        .strip_prefix("http=")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("an address in {detail}"));
    rec.wait_for("web's start", |e| is_step(e, "web", Step::Start))
        .await;
    // Bound while web waits to bind: web fails to bind and carries on without a listener.
    let squatter = TcpListener::bind(addr).expect("squat web's port");
    let failure = bounded("up", up)
        .await
        .unwrap()
        .expect_err("the squatter's answer must not count");
    match &failure.error {
        FlowError::NotReady { failure } => {
            assert_eq!(failure.predicate, Predicate::Listener, "{failure}");
            assert!(failure.last_error.contains(&me()), "{failure}");
        }
        other => panic!("expected a readiness failure, got {other}"),
    }
    drop(squatter);
    assert_no_orphans(&rec.spawned());
}

/// Row 54: a service listening beyond loopback is warned about, once it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_listening_beyond_loopback_is_warned_about_and_a_loopback_one_is_not() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: open
    command: {fixture}
    args: [tcp, --bind, 0.0.0.0]
    endpoints: [{name: http, api: tcp}]
  - name: closed
    command: {fixture}
    args: [tcp]
    endpoints: [{name: http, api: tcp}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let port = up.address("open", "http").unwrap().port();
    let warning = rec
        .wait_for(
            "a warning about `open`",
            |e| matches!(e, FlowEvent::Warning { service, .. } if service == "open"),
        )
        .await;
    let FlowEvent::Warning { text, .. } = warning else {
        unreachable!()
    };
    assert!(text.contains(&format!("0.0.0.0:{port}")), "{text}");
    up.shutdown().await;
    assert!(
        rec.position(|e| matches!(e, FlowEvent::Warning { service, .. } if service == "closed"))
            .is_none(),
        "a loopback listener is not warned about"
    );
    assert_no_orphans(&rec.spawned());
}

/// Writes a self-signed certificate for 127.0.0.1 with the `openssl` tool.
fn self_signed(ws: &TempWorkspace) {
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(ws.path("key.pem"))
        .arg("-out")
        .arg(ws.path("cert.pem"))
        .output()
        .expect("this test needs the openssl tool");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Row 66: readiness over TLS, for gRPC health and for an HTTP health path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_declared_tls_are_probed_over_tls() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: greeter
    command: {fixture}
    args: [grpc, --serve-when-file, '{dir}/serve', --tls-cert, '{dir}/cert.pem', --tls-key, '{dir}/key.pem']
    endpoints: [{name: grpc, api: grpc, tls: true}]
  - name: web
    command: {fixture}
    args: [http, --health-status-file, '{dir}/status', --tls-cert, '{dir}/cert.pem', --tls-key, '{dir}/key.pem']
    endpoints: [{name: https, api: http, health: /healthz, tls: true}]
",
    )]);
    self_signed(&ws);
    std::fs::write(ws.path("status"), "503").unwrap();
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let flow2 = flow.clone();
    let up = tokio::spawn(async move {
        flow2
            .up(Selection::default(), sink, CancellationToken::new())
            .await
    });
    // Both are reached through TLS: the gRPC health service answers NOT_SERVING and the
    // health path 503, which only a completed handshake can tell.
    rec.wait_for("greeter reported NOT_SERVING over TLS", |e| {
        matches!(e, FlowEvent::Waiting { failure, .. }
            if failure.predicate == Predicate::GrpcHealth && failure.last_error.contains("NOT_SERVING"))
    })
    .await;
    rec.wait_for("web answered 503 over TLS", |e| {
        matches!(e, FlowEvent::Waiting { failure, .. }
            if failure.predicate == Predicate::HttpStatus && failure.last_error.contains("503"))
    })
    .await;
    std::fs::write(ws.path("serve"), b"").unwrap();
    std::fs::write(ws.path("status"), "200").unwrap();
    let up = bounded("up", up)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("TLS endpoints should become ready: {e}"));
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

/// Row 80: the state file names a process group before anything waits on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_process_group_is_recorded_before_anything_waits_on_it() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: slow
    command: {fixture}
    args: [sleep]
    endpoints: [{name: http, api: tcp}]
",
    )]);
    let options = FlowOptions {
        readiness_timeout: Duration::from_secs(60),
        ..fast_options()
    };
    let flow = Flow::load(ws.root(), options).unwrap();
    let (rec, sink) = Recorder::start();
    let cancel = CancellationToken::new();
    let flow2 = flow.clone();
    let c = cancel.clone();
    let up = tokio::spawn(async move { flow2.up(Selection::default(), sink, c).await });
    let spawned = rec
        .wait_for("slow's spawn", |e| matches!(e, FlowEvent::Spawned { .. }))
        .await;
    let FlowEvent::Spawned { pid, .. } = spawned else {
        unreachable!()
    };
    let recorded = state::read_state(&StatePaths::for_workspace(ws.root()))
        .unwrap()
        .expect("a state file");
    let slow = recorded.service("slow").unwrap();
    assert_eq!(
        slow.process.as_ref().map(|p| p.pgid),
        Some(pid),
        "recorded while still waiting: {slow:?}"
    );
    cancel.cancel();
    let failure = bounded("up", up).await.unwrap().expect_err("interrupted");
    assert_eq!(
        failure.teardown.operation,
        Some(TeardownOperation::Interrupt),
        "the receipts say what asked for the teardown"
    );
    assert_no_orphans(&rec.spawned());
}

/// Row 14: `--set` overrides a service's variable, after everything else, literally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_wins_over_the_manifest_and_is_taken_literally() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: api
    command: {fixture}
    args: [tcp, --env-dump, '{dir}/api.env']
    endpoints: [{name: http, api: tcp}]
    env:
      APP_MODE: normal
",
    )]);
    let overrides = vec![
        EnvOverride::parse("api:APP_MODE=debug").unwrap(),
        EnvOverride::parse("api:APP_RAW=${endpoint:api/http}").unwrap(),
    ];
    let flow = Flow::load(ws.root(), fast_options())
        .unwrap()
        .with_overrides(overrides)
        .unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let env = env_of(&ws.read("api.env"));
    assert_eq!(env["APP_MODE"], "debug");
    assert_eq!(env["APP_RAW"], "${endpoint:api/http}");
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());

    let refused = Flow::load(ws.root(), fast_options())
        .unwrap()
        .with_overrides(vec![EnvOverride::parse("nosuch:X=1").unwrap()])
        .unwrap_err();
    assert_eq!(refused.code(), "flow.invalid_override");
}

const SHARED: &str = "services:
  - name: db
    command: {fixture}
    args: [tcp, --count-starts, '{dir}/db.starts']
    endpoints: [{name: pg, api: tcp, port: PORT}]
  - name: api
    command: {fixture}
    args: [tcp, --env-dump, '{dir}/api.env']
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: db, kind: runtime}]
  - name: worker
    command: {fixture}
    args: [tcp]
    endpoints: [{name: e, api: tcp}]
    dependencies: [{name: db, kind: runtime}]
  - name: other
    command: {fixture}
    args: [tcp]
    endpoints: [{name: e, api: tcp}]
";

/// Row 40: several targets in one run, a shared dependency started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_targets_start_the_union_of_their_closures_and_a_shared_dependency_once() {
    let yaml = SHARED.replace("PORT", &free_port().to_string());
    let ws = TempWorkspace::new(&[("flow.yaml", &yaml)]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let selection = Selection {
        targets: vec!["api".into(), "worker".into()],
        ..Selection::default()
    };
    let up = flow
        .up(selection, sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let mut names: Vec<String> = up
        .status()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    assert_eq!(names, vec!["api", "db", "worker"]);
    assert_eq!(ws.read("db.starts").lines().count(), 1);
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());

    let refused = flow
        .plan(&Selection {
            targets: vec!["api".into(), "worker".into()],
            only_deps: true,
            ..Selection::default()
        })
        .unwrap_err();
    assert_eq!(refused.code(), "flow.invalid_selection");
}

/// Row 38: stand-alone starts only the target, handing it its producers' fixed addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stand_alone_starts_only_the_target_with_its_producers_fixed_addresses() {
    let port = free_port();
    let yaml = SHARED.replace("PORT", &port.to_string());
    let ws = TempWorkspace::new(&[("flow.yaml", &yaml)]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(
            Selection {
                stand_alone: true,
                ..Selection::service("api")
            },
            sink,
            CancellationToken::new(),
        )
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let names: Vec<String> = up
        .status()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, vec!["api"]);
    assert!(!ws.path("db.starts").exists(), "db was not started");
    let env = env_of(&ws.read("api.env"));
    assert_eq!(env["FLOW_DEP_DB_PG_ADDR"], format!("127.0.0.1:{port}"));
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());

    // A reference to a port chosen per run cannot be honoured by a stand-alone run.
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
    env: {DB: '${endpoint:db/pg}'}
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let refused = flow
        .dry_run(&Selection {
            stand_alone: true,
            ..Selection::service("api")
        })
        .unwrap_err();
    assert_eq!(refused.code(), "flow.invalid_selection");
    assert!(refused.to_string().contains("db/pg"), "{refused}");
}

/// Row 41: `--only-deps` keeps the target's addresses and environment for the user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_deps_records_the_environment_the_target_would_be_started_with() {
    let yaml = SHARED.replace("PORT", &free_port().to_string());
    let ws = TempWorkspace::new(&[("flow.yaml", &yaml)]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
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
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let db = up.address("db", "pg").unwrap();
    let env = up.environment("api").expect("the target's environment");
    let get = |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert_eq!(get("FLOW_DEP_DB_PG_ADDR"), Some(db.to_string()));
    let own = get("FLOW_ENDPOINT_HTTP_ADDR").expect("the target's own address is reserved");
    let recorded = state::read_state(&StatePaths::for_workspace(ws.root()))
        .unwrap()
        .unwrap();
    let api = recorded.service("api").expect("the target is recorded");
    assert_eq!(api.state, "excluded");
    assert!(api.process.is_none());
    assert_eq!(api.endpoints[0].address, own);
    assert_eq!(api.env, env);
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

/// Row 42: a dry run stops after Load and Init: ports, commands and environments, no process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_plans_ports_and_environments_without_starting_anything() {
    let yaml = SHARED.replace("PORT", &free_port().to_string());
    let ws = TempWorkspace::new(&[("flow.yaml", &yaml)]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let plan = flow.dry_run(&Selection::service("api")).unwrap();
    assert_eq!(
        plan.layers,
        vec![vec!["db".to_string()], vec!["api".into()]]
    );
    let api = plan.services.iter().find(|s| s.name == "api").unwrap();
    let db = plan.services.iter().find(|s| s.name == "db").unwrap();
    assert_eq!(api.waits_for, vec!["db (runtime)".to_string()]);
    assert!(api.env.contains(&(
        "FLOW_DEP_DB_PG_ADDR".to_string(),
        db.endpoints[0].1.to_string()
    )));
    assert!(!ws.path("db.starts").exists(), "nothing ran");
    assert!(!flow.paths().state_file.exists(), "nothing was recorded");
    // Nothing of this workspace runs: no process has its folder on its command line.
    let dir = ws.root().display().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        {
            let cmd = procfs::cmdline(pid).unwrap_or_default();
            assert!(
                !cmd.contains(&dir),
                "pid {pid} runs for the workspace: {cmd}"
            );
        }
    }
}

/// Issue 19 (9): a cycle in the build stage does not stop a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_stage_cycle_does_not_stop_a_run() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: a
    command: {fixture}
    args: [tcp]
    endpoints: [{name: e, api: tcp}]
    dependencies: [{name: b, kind: build}]
  - name: b
    command: {fixture}
    args: [tcp]
    endpoints: [{name: e, api: tcp}]
    dependencies: [{name: a, kind: schema}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options())
        .unwrap_or_else(|e| panic!("the run stage has no cycle: {e}"));
    let err = flow.graph().stage(flow::Stage::Build).layers().unwrap_err();
    assert_eq!(
        err.to_string(),
        "build dependencies have a cycle: a -> b -> a"
    );
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

/// Spawns the fixture as the leader of a new process group, like a flow does.
fn spawn_group(args: &[&str]) -> (std::process::Child, procfs::StartIdentity) {
    let child = Command::new(FIXTURE)
        .args(args)
        .process_group(0)
        .spawn()
        .expect("spawn");
    let identity = procfs::identity(child.id() as i32).expect("identity");
    (child, identity)
}

/// A state file as a crashed `up` leaves it.
fn record_crashed_flow(
    paths: &StatePaths,
    services: Vec<(&str, &procfs::StartIdentity)>,
    budget: Option<state::RecordedBudget>,
) {
    let (mut sup, supervisor) = spawn_group(&["sleep"]);
    sup.kill().unwrap();
    sup.wait().unwrap();
    state::write_state(
        paths,
        &state::FlowState {
            version: state::STATE_VERSION,
            flow: "crashed".into(),
            supervisor,
            started_at: "earlier".into(),
            teardown_layers: vec![services.iter().map(|(n, _)| n.to_string()).collect()],
            services: services
                .iter()
                .map(|(name, identity)| state::ServiceRecord {
                    name: name.to_string(),
                    state: "running".into(),
                    process: Some((*identity).clone()),
                    endpoints: vec![],
                    restarts: 0,
                    detail: None,
                    env: vec![],
                })
                .collect(),
            budget,
            up: true,
        },
    )
    .unwrap();
}

/// Rows 70, 81 and 82: a group whose leader exited while a child runs is shown, previewed,
/// and stopped by a confirmed recovery, after which the workspace can start again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_leader_exited_is_shown_previewed_and_recovered() {
    let ws = TempWorkspace::new(&[]);
    let paths = StatePaths::for_workspace(ws.root());
    let (mut leader, identity) = spawn_group(&["sleep", "--child", "--exit-after", "200ms"]);
    record_crashed_flow(&paths, vec![("svc", &identity)], None);
    leader.wait().unwrap();
    let child = loop {
        let members = procfs::live_members(identity.pgid).unwrap();
        if let [one] = members.as_slice() {
            break *one;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // status: not `gone` while a member runs.
    let status = flow::status(ws.root(), Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.services[0].state, "leader-exited");
    assert_eq!(status.services[0].leftover, vec![child]);

    // down refuses, keeps the record, and says how to get out.
    let report = down(ws.root(), &DownOptions::default()).await.unwrap();
    assert!(!report.clean());
    assert_eq!(report.retained, vec!["svc".to_string()]);
    let receipt = report.teardown.receipt("svc").unwrap();
    assert_eq!(receipt.outcome, StopOutcome::Failed);
    assert!(
        receipt.detail.contains("hostd flow recover svc --preview"),
        "{receipt:?}"
    );
    let preview_down = flow::down::preview(ws.root()).unwrap().unwrap();
    assert_eq!(preview_down.entries[0].verdict, "refuse");
    assert_eq!(preview_down.entries[0].members[0].0, child);
    assert!(
        !procfs::live_members(identity.pgid).unwrap().is_empty(),
        "nothing signalled"
    );

    // The recovery preview lists exactly the child; a stale preview is refused.
    let preview = recover::preview(ws.root(), "svc").unwrap();
    assert_eq!(preview.processes.len(), 1);
    assert_eq!(preview.processes[0].pid, child);
    assert!(
        preview.processes[0].command.contains("sleep"),
        "{preview:?}"
    );
    let file = ws.path("preview.json");
    preview.write(&file).unwrap();
    let mut stale = RecoveryPreview::read(&file).unwrap();
    stale.processes[0].start_time += 1;
    let budget = TeardownBudget {
        per_layer: Duration::from_secs(3),
        kill_grace: Duration::from_secs(1),
    };
    let refused = recover::recover(ws.root(), &stale, budget)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "flow.recover.group_changed");
    assert!(
        !procfs::live_members(identity.pgid).unwrap().is_empty(),
        "nothing signalled"
    );

    let report = recover::recover(ws.root(), &RecoveryPreview::read(&file).unwrap(), budget)
        .await
        .unwrap();
    assert!(report.forgotten, "{report:?}");
    assert!(report.teardown.all_stopped(), "{report:?}");
    assert_eq!(report.teardown.operation, Some(TeardownOperation::Recover));
    assert!(
        !paths.state_file.exists(),
        "the record is gone with the group"
    );
    assert_no_orphans(&[("svc".into(), identity.pgid)]);
}

/// Row 70: `status` probes a service recorded running instead of trusting the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_probes_a_service_recorded_running_afresh() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: web
    command: {fixture}
    args: [http, --health-status-file, '{dir}/status']
    endpoints: [{name: http, api: http, health: /healthz}]
",
    )]);
    let flow = Flow::load(ws.root(), fast_options()).unwrap();
    let (rec, sink) = Recorder::start();
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("up failed: {e}"));
    let now = flow::status(ws.root(), Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert!(now.up);
    assert_eq!(now.services[0].state, "running");
    std::fs::write(ws.path("status"), "503").unwrap();
    let now = flow::status(ws.root(), Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.services[0].state, "not-ready");
    let detail = now.services[0].detail.clone().unwrap_or_default();
    assert!(detail.contains("http-status failed"), "{detail}");
    up.shutdown().await;
    assert_no_orphans(&rec.spawned());
}

/// Rows 83 and 76: a group still alive after SIGKILL stays recorded and `down` is not clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_outlives_sigkill_stays_recorded_and_down_is_not_clean() {
    let ws = TempWorkspace::new(&[]);
    let paths = StatePaths::for_workspace(ws.root());
    let (mut leader, identity) = spawn_group(&["sleep"]);
    record_crashed_flow(&paths, vec![("svc", &identity)], None);
    // Something outside the group keeps putting a process back into it.
    let group = identity.pgid.to_string();
    let (mut respawner, _) = spawn_group(&["respawn-into", "--group", &group]);
    let options = DownOptions {
        teardown_layer_budget: Some(Duration::from_millis(500)),
        kill_grace: Some(Duration::from_millis(500)),
    };
    let report = down(ws.root(), &options).await.unwrap();
    let receipt = report.teardown.receipt("svc").unwrap();
    assert_eq!(receipt.outcome, StopOutcome::TimedOut, "{receipt:?}");
    assert!(!report.clean());
    assert_eq!(report.retained, vec!["svc".to_string()]);
    let kept = state::read_state(&paths).unwrap().expect("still recorded");
    assert_eq!(kept.services[0].state, "timed-out");

    respawner.kill().unwrap();
    respawner.wait().unwrap();
    leader.wait().unwrap();
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(identity.pgid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !procfs::live_members(identity.pgid).unwrap().is_empty()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = down(ws.root(), &options).await.unwrap();
    assert!(report.clean(), "{report:?}");
    assert!(!paths.state_file.exists());
    assert_no_orphans(&[("svc".into(), identity.pgid)]);
}

/// Issue 19 (9): `down` waits with the budget the `up` ran with, unless told otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_uses_the_teardown_budget_the_up_recorded() {
    let ws = TempWorkspace::new(&[]);
    let paths = StatePaths::for_workspace(ws.root());
    let (mut stubborn, identity) = spawn_group(&["sleep", "--ignore-sigterm"]);
    // Let it install its SIGTERM handler.
    std::thread::sleep(Duration::from_millis(300));
    record_crashed_flow(
        &paths,
        vec![("stubborn", &identity)],
        Some(state::RecordedBudget {
            teardown_layer_budget_ms: 700,
            kill_grace_ms: 1000,
        }),
    );
    let report = down(ws.root(), &DownOptions::default()).await.unwrap();
    let receipt = report.teardown.receipt("stubborn").unwrap();
    assert_eq!(receipt.outcome, StopOutcome::TimedOut);
    assert!(
        (700..5000).contains(&receipt.duration_ms),
        "bounded by the recorded 700 ms, not the default 15 s: {receipt:?}"
    );
    assert!(receipt.detail.contains("700ms"), "{receipt:?}");
    assert!(!report.clean(), "a forced stop is trouble");
    assert!(
        !paths.state_file.exists(),
        "the group is gone, so is its record"
    );
    stubborn.wait().unwrap();
    assert_no_orphans(&[("stubborn".into(), identity.pgid)]);
}
