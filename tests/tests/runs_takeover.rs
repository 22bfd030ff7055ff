//! Workflow runs across a fleet: two `hostd serve` processes on one PostgreSQL database. The
//! Host driving a run is killed with SIGKILL mid-run; the other Host takes the run over once
//! the dead driver's lease lapses, or once the dead Host's registration expires when that
//! comes first (a scan on each Host), under epoch + 1, and the run completes with every step
//! journaled once. A run killed mid-step is taken over by a survivor whose admission cap its
//! parked runs fill, were parked runs counted (they are not).

use std::path::Path;

use serde_json::Value;
use testkit::eventually;
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, hostd_run, ok, tenant_credentials};

const PROGRAM: &str = "\
steps:
  - name: count
    invoke: word-count@1.0.0
    input: {text: \"${input.text}\"}
  - name: nap
    sleep: 3s
  - name: again
    invoke: word-count@1.0.0
    input: {text: \"${input.text} and more\"}
";

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

fn fleet_host(dir: &Path, name: &str, store: &str, credentials: &Path, runnables: &Path) -> Serve {
    fleet_host_with(
        dir,
        name,
        store,
        credentials,
        runnables,
        &["--run-lease", "900ms"],
    )
}

fn fleet_host_with(
    dir: &Path,
    name: &str,
    store: &str,
    credentials: &Path,
    runnables: &Path,
    extra: &[&str],
) -> Serve {
    let mut args = vec![
        "--runnables",
        runnables.to_str().expect("a UTF-8 path"),
        "--run-scan-interval",
        "200ms",
        "--run-poll",
        "100ms",
    ];
    args.extend_from_slice(extra);
    Serve::fleet_member(dir, name, store, credentials, &args)
}

fn run_cli(dir: &Path, host: &Serve, token: &str, args: &[&str]) -> String {
    let endpoint = format!("ws://127.0.0.1:{}", host.port);
    let mut all = vec!["--json", "run"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--endpoint", &endpoint, "--tenant", "acme"]);
    ok(hostd_run(dir, &all, &[("HOST_TENANT_TOKEN", token)]))
}

fn status(dir: &Path, host: &Serve, token: &str, run: &str) -> Value {
    serde_json::from_str(&run_cli(dir, host, token, &["status", run])).expect("status JSON")
}

/// Checks a run's status: held under epoch 2 by a holder on `host`, every step's result
/// journaled exactly once. Returns the run's journal.
fn completed_once_under_epoch_2<'a>(done: &'a Value, host: &str) -> &'a Vec<Value> {
    assert_eq!(done["epoch"], 2, "{done}");
    assert!(
        done["holder"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("{host}/")),
        "{done}"
    );
    let journal = done["journal"].as_array().expect("a journal");
    for step in ["count", "nap", "again"] {
        let results = journal
            .iter()
            .filter(|e| e["step"] == step && e["entry"] == "result")
            .count();
        assert_eq!(results, 1, "step {step}: {done}");
    }
    journal
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_a_killed_host_completes_on_the_other_under_the_next_epoch() {
    let Some(db) = FreshDatabase::create("runs_takeover").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let runnables = dir.join("runnables-ws");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/runnables"),
        &runnables,
    );
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let a = fleet_host(dir, "fleet-a", &db.url, &credentials, &runnables);
    let b = fleet_host(dir, "fleet-b", &db.url, &credentials, &runnables);

    let started: Value = serde_json::from_str(&run_cli(
        dir,
        &a,
        &token,
        &["start", "program.yaml", "--input", r#"{"text":"one two"}"#],
    ))
    .expect("start JSON");
    let run = started["run_id"].as_str().expect("a run id").to_owned();
    assert_eq!(started["epoch"], 1);

    // Kill the driving Host while the run sleeps (its first step is journaled).
    eventually("the run to reach its sleep", async || {
        let v = status(dir, &a, &token, &run);
        match v["checkpoint"]["name"].as_str() {
            Some("nap") => Ok(()),
            _ => Err(v.to_string()),
        }
    })
    .await;
    let (_, _) = a.kill_dead();

    let done = eventually("the other Host to complete the run", async || {
        let v = status(dir, &b, &token, &run);
        if v["state"] == "completed" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await;
    let journal = completed_once_under_epoch_2(&done, "fleet-b");
    let count = journal.iter().find(|e| e["step"] == "count").unwrap();
    assert_eq!(
        count["epoch"], 1,
        "the first step was taken from the journal, not re-run"
    );
    let again = journal.iter().find(|e| e["step"] == "again").unwrap();
    assert_eq!(again["body"]["output"]["words"], 4);
    drop(b);
    db.drop_now().await;
}

/// With a run lease far longer than the registry expiry, a run fails over with its Host's
/// registration (the fleet's failover bound), not with its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_fails_over_when_its_hosts_registration_expires_long_before_its_lease() {
    let Some(db) = FreshDatabase::create("runs_registry_failover").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let runnables = dir.join("runnables-ws");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/runnables"),
        &runnables,
    );
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let quick_registry = [
        "--run-lease",
        "10m",
        "--registry-heartbeat",
        "300ms",
        "--registry-expiry",
        "1500ms",
    ];
    let a = fleet_host_with(
        dir,
        "reg-a",
        &db.url,
        &credentials,
        &runnables,
        &quick_registry,
    );
    let b = fleet_host_with(
        dir,
        "reg-b",
        &db.url,
        &credentials,
        &runnables,
        &quick_registry,
    );
    let started: Value = serde_json::from_str(&run_cli(
        dir,
        &a,
        &token,
        &["start", "program.yaml", "--input", r#"{"text":"one two"}"#],
    ))
    .expect("start JSON");
    let run = started["run_id"].as_str().expect("a run id").to_owned();
    eventually("the run to reach its sleep", async || {
        let v = status(dir, &a, &token, &run);
        match v["checkpoint"]["name"].as_str() {
            Some("nap") => Ok(()),
            _ => Err(v.to_string()),
        }
    })
    .await;
    let killed = std::time::Instant::now();
    let (_, _) = a.kill_dead();
    // The lease (10 minutes) never lapses in this test: only the registration can free the run.
    let done = eventually("the other Host to complete the run", async || {
        let v = status(dir, &b, &token, &run);
        if v["state"] == "completed" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await;
    assert!(
        killed.elapsed() < std::time::Duration::from_secs(20),
        "failed over within the registry expiry, not the lease"
    );
    completed_once_under_epoch_2(&done, "reg-b");
    drop(b);
    db.drop_now().await;
}

/// A read-only runnable that takes `seconds` (its process sleeps), for a kill mid-step.
const PAUSE_YAML: &str = "\
name: pause
version: 1.0.0
description: Take a while, then say so.
input:
  type: object
  properties:
    seconds: {type: integer, minimum: 0, maximum: 10}
  required: [seconds]
output:
  type: object
  properties:
    paused: {type: number}
  required: [paused]
command: python3
args: [pause.py]
timeout: 20s
effect: read_only
";
const PAUSE_PY: &str = "\
import json, sys, time
request = json.load(sys.stdin)
time.sleep(request['input']['seconds'])
json.dump({'ok': True, 'output': {'paused': request['input']['seconds']}}, sys.stdout)
";

const WORK: &str = "\
steps:
  - name: count
    invoke: word-count@1.0.0
    input: {text: \"one two\"}
  - name: work
    invoke: pause@1.0.0
    input: {seconds: 2}
  - name: again
    invoke: word-count@1.0.0
    input: {text: \"one two three\"}
";

const ASKS: &str = "\
steps:
  - name: approve
    ask: go on?
    answer: {type: boolean}
";

/// Parked runs hold no slot: a survivor with as many runs parked as its cap still takes over a
/// run whose Host was killed mid-step, within the registry's bound (the run lease, 10 minutes,
/// never lapses here), and the step is run again there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_mid_step_is_taken_over_by_a_survivor_whose_cap_its_parked_runs_fill() {
    let Some(db) = FreshDatabase::create("runs_takeover_parked").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let runnables = dir.join("runnables-ws");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/runnables"),
        &runnables,
    );
    let pause = runnables.join("runnables/pause");
    std::fs::create_dir_all(&pause).unwrap();
    std::fs::write(pause.join("runnable.yaml"), PAUSE_YAML).unwrap();
    std::fs::write(pause.join("pause.py"), PAUSE_PY).unwrap();
    std::fs::write(dir.join("work.yaml"), WORK).unwrap();
    std::fs::write(dir.join("asks.yaml"), ASKS).unwrap();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let options = [
        "--run-lease",
        "10m",
        "--run-max-active",
        "2",
        "--registry-heartbeat",
        "300ms",
        "--registry-expiry",
        "1500ms",
    ];
    let a = fleet_host_with(dir, "cap-a", &db.url, &credentials, &runnables, &options);
    let b = fleet_host_with(dir, "cap-b", &db.url, &credentials, &runnables, &options);
    let mut asks = Vec::new();
    for _ in 0..2 {
        let started: Value =
            serde_json::from_str(&run_cli(dir, &b, &token, &["start", "asks.yaml"]))
                .expect("start JSON");
        let run = started["run_id"].as_str().expect("a run id").to_owned();
        eventually("the ask to park", async || {
            let v = status(dir, &b, &token, &run);
            if v["checkpoint"]["name"] == "approve" {
                Ok(())
            } else {
                Err(v.to_string())
            }
        })
        .await;
        asks.push(run);
    }
    let started: Value = serde_json::from_str(&run_cli(dir, &a, &token, &["start", "work.yaml"]))
        .expect("start JSON");
    let run = started["run_id"].as_str().expect("a run id").to_owned();
    eventually("the run to be inside its `work` step", async || {
        let v = status(dir, &a, &token, &run);
        let counted = v["journal"]
            .as_array()
            .is_some_and(|j| j.iter().any(|e| e["step"] == "count"));
        if counted { Ok(()) } else { Err(v.to_string()) }
    })
    .await;
    let killed = std::time::Instant::now();
    let (_, _) = a.kill_dead();
    let taken = eventually("the survivor to take the run over", async || {
        let v = status(dir, &b, &token, &run);
        if v["epoch"] == 2 {
            Ok(killed.elapsed())
        } else {
            Err(v.to_string())
        }
    })
    .await;
    // A generous bound: the registry expiry (1.5 s) plus a scan (1 s), on a loaded machine.
    assert!(
        taken < std::time::Duration::from_secs(10),
        "taken over after {taken:?}"
    );
    let done = eventually("the survivor to complete the run", async || {
        let v = status(dir, &b, &token, &run);
        if v["state"] == "completed" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await;
    let journal = done["journal"].as_array().expect("a journal");
    let work: Vec<_> = journal.iter().filter(|e| e["step"] == "work").collect();
    assert_eq!(work.len(), 1, "{done}");
    assert_eq!(
        work[0]["epoch"], 2,
        "the step ran again on the survivor: {done}"
    );
    for run in &asks {
        // Still parked: waiting, with no holder (a Host the registry briefly judged dead on a
        // loaded machine may have had one taken over and parked again, under epoch 2).
        let v = status(dir, &b, &token, run);
        assert_eq!(
            (v["state"].as_str(), v["holder"].as_str()),
            (Some("running"), Some("")),
            "{v}"
        );
    }
    drop(b);
    db.drop_now().await;
}
