//! Traces a real `hostd serve` exports over OTLP, received by a test collector built on the
//! official OTLP protobuf service: a controller's W3C `traceparent` is continued by the Host
//! (HostLink call → admission → claim, attempt, settle → turn), a malformed one is refused
//! with 107, and with the collector down commands still apply while the drops are counted.

mod collector;

use std::path::Path;

use collector::{Collector, traceparent};
use controller::Controller;
use serde_json::json;
use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    AgentId, CommandId, CompatibilityId, Outcome, SessionId, Store, StoreOptions, TenantId,
};
use testkit::process::{Serve, tenant_credentials};
use testkit::{eventually, terminal};
use trace_context::TraceContext;

const AGENT: &str = "assistant";
const BUILD: &str = "hostd-scripted-1";

/// One Host on a SQLite store in `dir`, exporting to `endpoint`.
fn traced_host(
    dir: &Path,
    name: &str,
    credentials: &Path,
    endpoint: &str,
    extra: &[&str],
) -> (Serve, String) {
    let store = format!("sqlite://{}", dir.join(format!("{name}.db")).display());
    let mut args = vec!["--otlp-endpoint", endpoint];
    args.extend_from_slice(extra);
    (
        Serve::fleet_member(dir, name, &store, credentials, &args),
        store,
    )
}

/// A HostLink link of tenant `acme` to `host`.
async fn link(host: &Serve, token: &str) -> controller::client::HostLinkClient {
    controller::client::HostLinkClient::connect(
        &format!("ws://127.0.0.1:{}", host.port),
        &TenantId::new("acme").unwrap(),
        token,
        "trace-test",
    )
    .await
    .expect("connected")
}

/// A controller of tenant `acme` admitting under a fresh trace, and the session `name` it
/// created and placed, whose creation the Host applied; bound when a feed is kept.
struct TracedSession {
    c: Controller,
    session: SessionId,
    record: sessionstore::SessionRecord,
    placed: controller::Placed,
    /// The caller's `traceparent` and its trace id.
    header: String,
    trace_id: String,
    _feed: Option<tokio::sync::mpsc::Receiver<controller::client::Publication>>,
}

/// The session `name` created and placed under a fresh trace, not bound.
async fn traced_placed(store: &Store, token: &str, name: &str) -> TracedSession {
    let (header, trace_id) = traceparent();
    let trace = TraceContext::from_headers(Some(&header), None).unwrap();
    let c = Controller::new(store.clone(), TenantId::new("acme").unwrap(), token).with_trace(trace);
    let session = SessionId::new(name).unwrap();
    let (record, create) = c
        .create_session(
            session.clone(),
            AgentId::new(AGENT).unwrap(),
            CompatibilityId::new(BUILD).unwrap(),
            None,
            CommandId::new("create").unwrap(),
        )
        .await
        .unwrap();
    let placed = c.place(&session).await.expect("placed");
    assert_eq!(
        terminal(store, &record, &create.command).await.outcome,
        Some(Outcome::Applied)
    );
    TracedSession {
        c,
        session,
        record,
        placed,
        header,
        trace_id,
        _feed: None,
    }
}

/// [`traced_placed`], and bound: its link streams the session.
async fn traced_session(store: &Store, token: &str, name: &str) -> TracedSession {
    let mut traced = traced_placed(store, token, name).await;
    let feed = traced
        .c
        .bind_and_stream(&traced.placed, false)
        .await
        .expect("bound");
    traced._feed = Some(feed);
    traced
}

async fn wait_for_span(c: &Collector, trace_id: &str, name: &str) -> collector::Span {
    eventually(&format!("a span {name} in trace {trace_id}"), async || {
        c.trace(trace_id)
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| {
                let seen: Vec<String> = c
                    .spans()
                    .iter()
                    .map(|s| format!("{} {}", s.trace_id, s.name))
                    .collect();
                format!("seen: {seen:?}")
            })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_controllers_traceparent_through_attach_command_steps_turn_model_call_and_tool_call()
 {
    let collector = Collector::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let (host, store_url) = traced_host(dir, "traced-a", &credentials, &collector.endpoint(), &[]);
    let store = Store::open(StoreOptions::new(store_url))
        .await
        .expect("the store");
    let (header, trace_id) = traceparent();
    let trace = TraceContext::from_headers(Some(&header), None).unwrap();
    let c = Controller::new(store.clone(), TenantId::new("acme").unwrap(), &token)
        .with_trace(trace.clone());
    let session = SessionId::new("traced-1").unwrap();
    c.create_session(
        session.clone(),
        AgentId::new(AGENT).unwrap(),
        CompatibilityId::new(BUILD).unwrap(),
        None,
        CommandId::new("create").unwrap(),
    )
    .await
    .unwrap();
    let placed = c.place(&session).await.expect("placed");

    let attach = wait_for_span(&collector, &trace_id, "hostlink.attach").await;
    let caller = trace.as_ref().unwrap().parent.parent_id_hex();
    assert_eq!(attach.parent_span_id, caller, "{attach:?}");
    assert_eq!(attach.attr("session"), Some("traced-1"));
    assert_eq!(
        attach.resource.get("service.name").map(String::as_str),
        Some("hostd")
    );
    assert_eq!(
        attach
            .resource
            .get("service.instance.id")
            .map(String::as_str),
        Some("traced-a")
    );
    assert_eq!(
        attach
            .resource
            .get("hostd.host.generation")
            .map(String::as_str),
        Some("1"),
        "the Host generation, issued at start, names the exporting incarnation"
    );

    // The attach made the session resident in the same trace: a create, not a restore.
    let create = wait_for_span(&collector, &trace_id, "residency.create").await;
    assert_eq!(create.attr("session"), Some("traced-1"), "{create:?}");
    assert_eq!(create.status_code, 0, "{create:?}");

    // A command admitted under the trace is applied in it: command → claim, attempt,
    // settle and the runtime's apply; the turn under the apply; the model call (and, below,
    // a tool call) under the turn.
    let _feed = c.bind_and_stream(&placed, false).await.expect("bound");
    let cmd = c
        .admit(
            &session,
            CommandId::new("say-1").unwrap(),
            CommandBodyV1::Input {
                text: "hello".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(cmd.trace, trace);
    c.deliver(&placed, &cmd.command).await.unwrap();
    let record = store
        .session(&TenantId::new("acme").unwrap(), &session)
        .await
        .unwrap();
    assert_eq!(
        terminal(&store, &record, &cmd.command).await.outcome,
        Some(Outcome::Applied)
    );
    let apply = eventually("the command's span", async || {
        c_spans(&collector, &trace_id, "command.apply")
            .into_iter()
            .find(|s| s.attr("command") == Some("say-1"))
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(apply.parent_span_id, caller, "{apply:?}");
    assert_eq!(apply.attr("tenant"), Some("acme"));
    assert_eq!(apply.attr("session"), Some("traced-1"));
    assert_eq!(apply.attr("outcome"), Some("applied"));
    assert!(apply.attr("epoch").is_some());
    for step in ["command.claim", "command.attempt", "command.settle"] {
        let s = wait_for_child(&collector, &trace_id, step, &apply.span_id).await;
        assert_eq!(s.status_code, 0, "{s:?}");
    }
    let runtime = wait_for_child(&collector, &trace_id, "runtime.apply", &apply.span_id).await;
    let turn = wait_for_child(&collector, &trace_id, "turn", &runtime.span_id).await;
    wait_for_child(&collector, &trace_id, "model.call", &turn.span_id).await;

    // A tool the model calls is a span of the same trace under its turn: the tool's name and
    // the call's outcome.
    let cmd = c
        .admit(
            &session,
            CommandId::new("tool-1").unwrap(),
            CommandBodyV1::Input {
                text: r#"/tool echo {"text":"traced"}"#.into(),
            },
        )
        .await
        .unwrap();
    c.deliver(&placed, &cmd.command).await.unwrap();
    assert_eq!(
        terminal(&store, &record, &cmd.command).await.outcome,
        Some(Outcome::Applied)
    );
    let apply = eventually("the tool command's span", async || {
        c_spans(&collector, &trace_id, "command.apply")
            .into_iter()
            .find(|s| s.attr("command") == Some("tool-1"))
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    let runtime = wait_for_child(&collector, &trace_id, "runtime.apply", &apply.span_id).await;
    let turn = wait_for_child(&collector, &trace_id, "turn", &runtime.span_id).await;
    let tool = wait_for_child(&collector, &trace_id, "tool.call", &turn.span_id).await;
    assert_eq!(tool.attr("tool"), Some("echo"), "{tool:?}");
    assert_eq!(tool.attr("outcome"), Some("ok"), "{tool:?}");
    assert_eq!(tool.status_code, 0, "{tool:?}");
    drop(host);
    store.close().await;
}

fn c_spans(c: &Collector, trace_id: &str, name: &str) -> Vec<collector::Span> {
    c.trace(trace_id)
        .into_iter()
        .filter(|s| s.name == name)
        .collect()
}

async fn wait_for_child(
    c: &Collector,
    trace_id: &str,
    name: &str,
    parent: &str,
) -> collector::Span {
    eventually(&format!("{name} under {parent}"), async || {
        c_spans(c, trace_id, name)
            .into_iter()
            .find(|s| s.parent_span_id == parent)
            .ok_or_else(|| {
                let seen: Vec<String> = c
                    .trace(trace_id)
                    .iter()
                    .map(|s| format!("{} {} <- {}", s.name, s.span_id, s.parent_span_id))
                    .collect();
                format!("{seen:?}")
            })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_otlp_http_protobuf_a_commands_spans_reach_the_collector_in_the_callers_trace() {
    let collector = Collector::start_http();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let (host, store_url) = traced_host(
        dir,
        "traced-h",
        &credentials,
        &collector.endpoint(),
        &["--otlp-protocol", "http/protobuf"],
    );
    let store = Store::open(StoreOptions::new(store_url))
        .await
        .expect("the store");
    let TracedSession {
        header, trace_id, ..
    } = traced_session(&store, &token, "traced-h").await;
    let apply = eventually("the command's span, posted over HTTP", async || {
        c_spans(&collector, &trace_id, "command.apply")
            .into_iter()
            .find(|s| s.attr("command") == Some("create"))
            .ok_or_else(|| format!("{} spans so far", collector.spans().len()))
    })
    .await;
    assert_eq!(apply.parent_span_id, header[36..52].to_owned(), "{apply:?}");
    assert_eq!(
        apply
            .resource
            .get("service.instance.id")
            .map(String::as_str),
        Some("traced-h")
    );
    wait_for_child(&collector, &trace_id, "command.settle", &apply.span_id).await;
    drop(host);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_is_refused_with_107_and_a_good_one_is_not() {
    let collector = Collector::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let (host, _) = traced_host(dir, "traced-b", &credentials, &collector.endpoint(), &[]);
    let client = link(&host, &token).await;
    let attach = |trace: serde_json::Value| {
        let mut data = json!({
            "version": 1, "tenant_id": "acme", "session_id": "nowhere", "host_id": "traced-b",
            "host_generation": 1, "agent_id": AGENT, "mode": "create", "actor_id": "t",
            "idempotency_key": "k1"
        });
        for (k, v) in trace.as_object().unwrap() {
            data[k] = v.clone();
        }
        data
    };
    let (good, trace_id) = traceparent();
    for bad in [
        json!({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0"}),
        json!({"traceparent": good.to_uppercase()}),
        json!({"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}),
        json!({"traceparent": 7}),
        json!({"tracestate": "a=b"}),
        json!({"traceparent": good, "tracestate": "=broken"}),
    ] {
        match client
            .run_rpc("hostlink.attach", &attach(bad.clone()))
            .await
        {
            Err(controller::client::ClientError::Reply { code, .. }) => {
                assert_eq!(code, 107, "{bad}")
            }
            other => panic!("{bad} was answered {other:?}"),
        }
    }
    // A well-formed one reaches the Host's own checks (here: no such session).
    let answered = client
        .run_rpc(
            "hostlink.attach",
            &attach(json!({"traceparent": good, "tracestate": "k=v"})),
        )
        .await
        .expect("an answer, not a refusal of the request");
    let reply: serde_json::Value = serde_json::from_str(&answered).expect("a JSON reply");
    let code = reply["code"]
        .as_str()
        .unwrap_or_else(|| panic!("{answered}"));
    // Its call span is in the caller's trace, failed, with the reply's stable code as the
    // status description (not an attribute of the same name).
    let call = eventually("the attach's call span", async || {
        c_spans(&collector, &trace_id, "hostlink.attach")
            .into_iter()
            .next()
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(call.status_code, 2, "{call:?}");
    assert_eq!(call.status_message, code, "{call:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_collector_down_commands_still_apply_and_the_dropped_spans_are_counted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (token, credentials) = tenant_credentials(dir, "acme");
    // Nothing listens on this port: every export fails, and a queue of 4 fills at once.
    let nowhere = format!("http://127.0.0.1:{}", testkit::process::free_port());
    let (host, store_url) = traced_host(
        dir,
        "traced-c",
        &credentials,
        &nowhere,
        &[
            "--trace-queue-size",
            "4",
            "--trace-export-batch",
            "2",
            "--trace-export-timeout",
            "200ms",
        ],
    );
    let store = Store::open(StoreOptions::new(store_url))
        .await
        .expect("the store");
    let TracedSession {
        c,
        session,
        record,
        placed,
        _feed,
        ..
    } = traced_session(&store, &token, "traced-3").await;
    for i in 0..5 {
        let cmd = c
            .admit(
                &session,
                CommandId::new(format!("say-{i}")).unwrap(),
                CommandBodyV1::Input {
                    text: format!("hello {i}"),
                },
            )
            .await
            .unwrap();
        c.deliver(&placed, &cmd.command).await.unwrap();
        assert_eq!(
            terminal(&store, &record, &cmd.command).await.outcome,
            Some(Outcome::Applied)
        );
    }
    let dropped = eventually("dropped spans in /metrics", async || {
        let (status, text) =
            testkit::process::http_get(host.port, "/metrics").ok_or("no answer")?;
        if status != 200 {
            return Err(format!("status {status}"));
        }
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("host_trace_spans_dropped_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if n > 0 { Ok(n) } else { Err(text) }
    })
    .await;
    assert!(dropped > 0);
    drop(placed);
    drop(host);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_and_failover_the_successor_applies_a_command_in_its_admissions_trace() {
    let Some(db) = testkit::pg::FreshDatabase::create("trace_failover").await else {
        return;
    };
    let collector = Collector::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let member = |name: &str| {
        Serve::fleet_member(
            dir,
            name,
            &db.url,
            &credentials,
            &[
                "--otlp-endpoint",
                &collector.endpoint(),
                "--registry-heartbeat",
                "300ms",
                "--registry-expiry",
                "1200ms",
                "--reconcile-interval",
                "200ms",
                "--claim-ttl",
                "2s",
            ],
        )
    };
    let hosts = [member("trace-a"), member("trace-b")];
    let store = Store::open(StoreOptions::new(db.url.clone()))
        .await
        .expect("the fleet's store");
    let TracedSession {
        c,
        session,
        record,
        placed,
        header,
        trace_id,
        ..
    } = traced_placed(&store, &token, "failover-traced").await;
    let resident = placed.observation.host_id.to_string();
    let [a, b] = hosts;
    let (victim, survivor) = if resident == "trace-a" {
        (a, b)
    } else {
        (b, a)
    };
    // The resident Host is frozen, so the command admitted now is not applied before it dies.
    victim.freeze();
    let cmd = c
        .admit(
            &session,
            CommandId::new("after-the-kill").unwrap(),
            CommandBodyV1::Input {
                text: "still here".into(),
            },
        )
        .await
        .unwrap();
    let _ = victim.kill_dead();
    drop(placed);
    let taken = eventually("the survivor to take the session over", async || {
        c.place(&session).await.map_err(|e| e.to_string())
    })
    .await;
    assert_ne!(taken.observation.host_id.to_string(), resident);
    let _feed = c.bind_and_stream(&taken, false).await.expect("bound");
    c.deliver(&taken, &cmd.command).await.unwrap();
    assert_eq!(
        terminal(&store, &record, &cmd.command).await.outcome,
        Some(Outcome::Applied)
    );
    let survivor_id = taken.observation.host_id.to_string();
    let apply = eventually("the successor's command span", async || {
        c_spans(&collector, &trace_id, "command.apply")
            .into_iter()
            .find(|s| s.attr("command") == Some("after-the-kill"))
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(
        apply.resource.get("service.instance.id"),
        Some(&survivor_id),
        "{apply:?}"
    );
    assert_eq!(apply.parent_span_id, header[36..52].to_owned());
    assert_eq!(apply.attr("outcome"), Some("applied"));
    drop(taken);
    drop(survivor);
    store.close().await;
    db.drop_now().await;
}

const RUN_PROGRAM: &str = "\
steps:
  - name: first
    sleep: 0s
  - name: approve
    ask: \"Ship it?\"
    answer: {type: boolean}
  - name: last
    sleep: 0s
";

/// The `result` of a `run.*` reply, or a panic naming the refusal.
fn run_result(reply: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(reply).expect("a JSON reply");
    match v.get("result") {
        Some(r) => r.clone(),
        None => panic!("refused: {reply}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_steps_share_the_trace_it_was_started_in_across_its_park_and_takeover() {
    let collector = Collector::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let (host, _) = traced_host(dir, "traced-run", &credentials, &collector.endpoint(), &[]);
    let client = link(&host, &token).await;
    let (header, trace_id) = traceparent();
    let caller = header[36..52].to_owned();

    // A malformed context on a run request is refused with 107 and starts nothing.
    for bad in [
        json!({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0"}),
        json!({"tracestate": "a=b"}),
    ] {
        let mut data = json!({"version": 1, "program": RUN_PROGRAM});
        for (k, v) in bad.as_object().unwrap() {
            data[k] = v.clone();
        }
        match client.run_rpc("run.start", &data).await {
            Err(controller::client::ClientError::Reply { code, .. }) => {
                assert_eq!(code, 107, "{bad}")
            }
            other => panic!("{bad} was answered {other:?}"),
        }
    }
    let listed = run_result(
        &client
            .run_rpc("run.list", &json!({"version": 1}))
            .await
            .unwrap(),
    );
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(0), "{listed}");

    let started = run_result(
        &client
            .run_rpc(
                "run.start",
                &json!({"version": 1, "program": RUN_PROGRAM, "traceparent": header}),
            )
            .await
            .unwrap(),
    );
    let run = started["run_id"].as_str().expect("a run id").to_owned();
    let start = eventually("the start call's span", async || {
        c_spans(&collector, &trace_id, "run.rpc")
            .into_iter()
            .find(|s| s.attr("method") == Some("run.start"))
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    let first = wait_for_span(&collector, &trace_id, "run.step").await;
    assert_eq!(first.attr("step"), Some("first"), "{first:?}");
    assert_eq!(first.attr("run"), Some(run.as_str()));
    assert_eq!(first.attr("outcome"), Some("finished"));
    assert_eq!(first.attr("epoch"), Some("1"));

    // The ask parks the run; answering it (in a trace of the answerer's own) hands the run
    // back, and the drive that takes it over continues the run's trace, not the answer's.
    eventually("the run to park at its ask", async || {
        let status = run_result(
            &client
                .run_rpc("run.status", &json!({"version": 1, "run_id": run}))
                .await
                .map_err(|e| e.to_string())?,
        );
        match status["checkpoint"]["name"].as_str() {
            Some("approve") => Ok(()),
            _ => Err(status.to_string()),
        }
    })
    .await;
    let (answer_header, answer_trace) = traceparent();
    run_result(
        &client
            .run_rpc(
                "run.answer",
                &json!({"version": 1, "run_id": run, "checkpoint": "approve", "value": true,
                        "traceparent": answer_header}),
            )
            .await
            .unwrap(),
    );
    let last = eventually("the last step's span", async || {
        c_spans(&collector, &trace_id, "run.step")
            .into_iter()
            .find(|s| s.attr("step") == Some("last"))
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(last.attr("outcome"), Some("finished"), "{last:?}");
    let steps = c_spans(&collector, &trace_id, "run.step");
    let names: std::collections::BTreeSet<_> =
        steps.iter().filter_map(|s| s.attr("step")).collect();
    assert_eq!(
        names,
        ["approve", "first", "last"].into_iter().collect(),
        "{steps:?}"
    );
    // Every drive of the run (the first, and the one after the answer) hangs off the start
    // call, and every step off a drive.
    let drives = eventually("both drives to end", async || {
        let d = c_spans(&collector, &trace_id, "run.drive");
        if d.len() >= 2 {
            Ok(d)
        } else {
            Err(format!("{d:?}"))
        }
    })
    .await;
    for d in &drives {
        assert_eq!(d.parent_span_id, start.span_id, "{d:?}");
    }
    let epochs: std::collections::BTreeSet<_> =
        drives.iter().filter_map(|d| d.attr("epoch")).collect();
    assert!(
        epochs.len() >= 2,
        "a takeover took the run at a new epoch: {drives:?}"
    );
    for s in &steps {
        assert!(
            drives.iter().any(|d| d.span_id == s.parent_span_id),
            "{s:?} under {drives:?}"
        );
    }
    // The answer's own call is traced in the answerer's trace, and no step is.
    let answer = wait_for_span(&collector, &answer_trace, "run.rpc").await;
    assert_eq!(answer.attr("method"), Some("run.answer"));
    assert!(c_spans(&collector, &answer_trace, "run.step").is_empty());
    // The start call continued the caller's span.
    let rpc = c_spans(&collector, &trace_id, "run.start")
        .into_iter()
        .find(|s| s.span_id == start.parent_span_id)
        .expect("the HostLink call's span");
    assert_eq!(rpc.parent_span_id, caller, "{rpc:?}");
    drop(host);
}
