//! Workflow runs across a fleet: two `hostd serve` processes on one PostgreSQL database. The
//! Host driving a run is killed with SIGKILL mid-run; the other Host takes the run over once
//! the dead driver's lease lapses, or once the dead Host's registration expires when that
//! comes first (a scan on each Host), under epoch + 1, and the run completes with every step
//! journaled once.

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
