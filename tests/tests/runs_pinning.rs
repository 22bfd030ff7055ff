//! A run is pinned to the releases it started with, seen from outside: real `hostd serve`
//! processes, a real workspace whose runnables were never built, a handler that writes down the
//! ids and the version it ran as, and `kill -9` of the Host driving the run. Whatever happens to
//! the workspace after the start — an unrelated declaration broken, the pinned runnable's
//! handler changed — and on whichever Host the run lands (one without a workspace included),
//! the run completes with the handler it was pinned to, and the step's intent and effect ids
//! are the same on every attempt. A new start meanwhile is refused under the workspace's strict
//! loading, naming the broken file.

use std::path::{Path, PathBuf};

use serde_json::Value;
use testkit::eventually;
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, hostd_run, ok, tenant_credentials};

/// An idempotent handler: appends one line (its version, the ids and the digest it was handed)
/// to the file its input names, then waits for the `go` file, then answers with its version.
const STAMP: &str = r#"
import json, os, sys, time
req = json.load(sys.stdin)
inp = req["input"]
with open(inp["log"], "a") as f:
    f.write(json.dumps({"version": VERSION, "intent_id": req["intent_id"], "effect_id": req["effect_id"], "digest": req["digest"], "pid": os.getpid()}) + "\n")
until = time.time() + 60
while not os.path.exists(inp["go"]) and time.time() < until:
    time.sleep(0.02)
print(json.dumps({"ok": True, "output": {"version": VERSION}}))
"#;

const DECLARATION: &str = "\
name: stamp
version: 1.0.0
input:
  type: object
  properties:
    log: {type: string}
    go: {type: string}
  required: [log, go]
output:
  type: object
  properties: {version: {type: string}}
  required: [version]
command: python3
args: [stamp.py]
timeout: 90s
effect: idempotent
";

const PROGRAM: &str = "\
steps:
  - name: stamp
    invoke: stamp@1.0.0
    input: {log: \"${input.log}\", go: \"${input.go}\"}
  - name: nap
    sleep: 0s
";

/// A workspace `shop` with `stamp@1.0.0` answering `version`; never built.
fn workspace(dir: &Path, version: &str) -> PathBuf {
    let ws = dir.join("shop");
    let folder = ws.join("runnables/stamp");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("runnable.yaml"), DECLARATION).unwrap();
    std::fs::write(
        folder.join("stamp.py"),
        format!("VERSION = {version:?}\n{STAMP}"),
    )
    .unwrap();
    ws
}

/// The pinned runnable's handler now answers `v2`, and an unrelated declaration is broken.
fn break_workspace(ws: &Path) {
    std::fs::write(
        ws.join("runnables/stamp/stamp.py"),
        format!("VERSION = \"v2\"\n{STAMP}"),
    )
    .unwrap();
    let other = ws.join("runnables/zz-unrelated");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("runnable.yaml"), "name: [not, a, name]\n").unwrap();
}

fn host(
    dir: &Path,
    name: &str,
    store: &str,
    credentials: &Path,
    runnables: Option<&Path>,
) -> Serve {
    let mut args = vec![
        "--run-lease",
        "900ms",
        "--run-scan-interval",
        "200ms",
        "--run-poll",
        "100ms",
    ];
    if let Some(ws) = runnables {
        args.extend_from_slice(&["--runnables", ws.to_str().expect("a UTF-8 path")]);
    }
    Serve::fleet_member(dir, name, store, credentials, &args)
}

fn run_cli(dir: &Path, host: &Serve, token: &str, args: &[&str]) -> std::process::Output {
    let endpoint = format!("ws://127.0.0.1:{}", host.port);
    let mut all = vec!["--json", "run"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--endpoint", &endpoint, "--tenant", "acme"]);
    hostd_run(dir, &all, &[("HOST_TENANT_TOKEN", token)])
}

fn status(dir: &Path, host: &Serve, token: &str, run: &str) -> Value {
    serde_json::from_str(&ok(run_cli(dir, host, token, &["status", run]))).expect("status JSON")
}

fn stamps(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a stamp line"))
        .collect()
}

fn start(dir: &Path, host: &Serve, token: &str, log: &Path, go: &Path) -> String {
    let input = serde_json::json!({"log": log, "go": go}).to_string();
    let started: Value = serde_json::from_str(&ok(run_cli(
        dir,
        host,
        token,
        &["start", "program.yaml", "--input", &input],
    )))
    .expect("start JSON");
    started["run_id"].as_str().expect("a run id").to_owned()
}

async fn completed(dir: &Path, host: &Serve, token: &str, run: &str) -> Value {
    eventually("the run to complete", async || {
        let v = status(dir, host, token, run);
        if v["state"] == "completed" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await
}

/// The killed Host's handlers are its orphans (stopping them is not this test's business):
/// the `go` file lets them end, and this stops any still there.
fn end_orphans(lines: &[Value]) {
    for l in lines {
        if let Some(pid) = l["pid"].as_i64() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_completes_on_the_survivor_with_its_pinned_handler_after_the_workspace_broke() {
    let Some(db) = FreshDatabase::create("runs_pinning").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let ws = workspace(dir, "v1");
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let a = host(dir, "pin-a", &db.url, &credentials, Some(&ws));
    let b = host(dir, "pin-b", &db.url, &credentials, Some(&ws));
    let (log, go) = (dir.join("stamps"), dir.join("go"));
    let run = start(dir, &a, &token, &log, &go);
    eventually("the first attempt's handler to start", async || {
        testkit::check(stamps(&log).len() == 1, || format!("{:?}", stamps(&log)))
    })
    .await;

    break_workspace(&ws);
    let (_, _) = a.kill_dead();
    std::fs::write(&go, "").unwrap();
    let done = completed(dir, &b, &token, &run).await;
    assert_eq!(done["epoch"], 2, "{done}");
    assert!(
        done["holder"]
            .as_str()
            .unwrap_or_default()
            .starts_with("pin-b/"),
        "{done}"
    );
    let result = done["journal"]
        .as_array()
        .expect("a journal")
        .iter()
        .find(|e| e["step"] == "stamp" && e["entry"] == "result")
        .expect("the step's result")
        .clone();
    assert_eq!(result["epoch"], 2, "the survivor ran the step: {done}");
    assert_eq!(
        result["body"]["output"]["version"], "v1",
        "the pinned handler ran, not the workspace's: {done}"
    );
    let lines = stamps(&log);
    end_orphans(&lines);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|l| l["version"] == "v1"), "{lines:?}");
    assert_eq!(lines[0]["effect_id"], lines[1]["effect_id"], "{lines:?}");
    assert_eq!(lines[0]["intent_id"], lines[1]["intent_id"], "{lines:?}");

    // A new start meanwhile is refused under the workspace's strict loading.
    let input = serde_json::json!({"log": log, "go": go}).to_string();
    let refused = run_cli(
        dir,
        &b,
        &token,
        &["start", "program.yaml", "--input", &input],
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let stdout = String::from_utf8_lossy(&refused.stdout);
    assert!(
        stdout.contains("zz-unrelated/runnable.yaml")
            || stderr.contains("zz-unrelated/runnable.yaml"),
        "the refusal names the broken file:\n{stdout}\n{stderr}"
    );
    drop(b);
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_started_without_runnables_drives_a_pinned_run_from_the_store() {
    let Some(db) = FreshDatabase::create("runs_pinning_bare").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let ws = workspace(dir, "v1");
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let a = host(dir, "bare-a", &db.url, &credentials, Some(&ws));
    let b = host(dir, "bare-b", &db.url, &credentials, None);
    let (log, go) = (dir.join("stamps"), dir.join("go"));
    let run = start(dir, &a, &token, &log, &go);
    eventually("the first attempt's handler to start", async || {
        testkit::check(stamps(&log).len() == 1, || format!("{:?}", stamps(&log)))
    })
    .await;
    let (_, _) = a.kill_dead();
    std::fs::write(&go, "").unwrap();
    let done = completed(dir, &b, &token, &run).await;
    assert!(
        done["holder"]
            .as_str()
            .unwrap_or_default()
            .starts_with("bare-b/"),
        "{done}"
    );
    let lines = stamps(&log);
    end_orphans(&lines);
    assert_eq!(
        lines.len(),
        2,
        "the Host without a workspace ran the step: {lines:?}"
    );
    assert_eq!(lines[0]["digest"], lines[1]["digest"], "{lines:?}");
    drop(b);
    db.drop_now().await;
}

/// One Host on SQLite, killed with SIGKILL mid-invoke and started again on its data folder: its
/// boot reconcile takes the run back and the step runs again with the same ids, although the
/// runnable was never built before the run started (it joined the workspace after the Host
/// started, so not even the Host's own start built it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_keeps_its_intent_and_effect_ids_across_a_takeover() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let ws = dir.join("shop");
    std::fs::create_dir_all(ws.join("runnables")).unwrap();
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let args = [
        "--runnables",
        ws.to_str().expect("a UTF-8 path"),
        "--run-lease",
        "900ms",
        "--run-scan-interval",
        "200ms",
    ];
    let first = Serve::start(dir, "ids-1", &args);
    workspace(dir, "v1");
    assert!(
        !ws.join(".hostd/runnables/releases").exists(),
        "the runnable was never built"
    );
    let client = |host: &Serve, args: &[&str]| {
        let endpoint = format!("ws://127.0.0.1:{}", host.port);
        let mut all = vec!["--json", "run"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--endpoint", &endpoint]);
        ok(hostd_run(dir, &all, &[]))
    };
    let (log, go) = (dir.join("stamps"), dir.join("go"));
    let input = serde_json::json!({"log": log, "go": go}).to_string();
    let started: Value = serde_json::from_str(&client(
        &first,
        &["start", "program.yaml", "--input", &input],
    ))
    .expect("start JSON");
    let run = started["run_id"].as_str().expect("a run id").to_owned();
    eventually("the first attempt's handler to start", async || {
        testkit::check(stamps(&log).len() == 1, || format!("{:?}", stamps(&log)))
    })
    .await;
    let (_, _) = first.kill_dead();
    let second = Serve::start(dir, "ids-2", &args);
    eventually("the second attempt's handler to start", async || {
        testkit::check(stamps(&log).len() == 2, || format!("{:?}", stamps(&log)))
    })
    .await;
    std::fs::write(&go, "").unwrap();
    eventually("the run to complete", async || {
        let v: Value = serde_json::from_str(&client(&second, &["status", &run])).unwrap();
        testkit::check(v["state"] == "completed", || v.to_string())
    })
    .await;
    let lines = stamps(&log);
    end_orphans(&lines);
    assert_ne!(lines[0]["pid"], lines[1]["pid"], "two attempts: {lines:?}");
    assert_eq!(lines[0]["intent_id"], lines[1]["intent_id"], "{lines:?}");
    assert_eq!(
        lines[0]["effect_id"], lines[1]["effect_id"],
        "one step, one effect id, on every attempt: {lines:?}"
    );
    drop(second);
}
