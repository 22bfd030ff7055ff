//! `cargo run [--release] -p system-tests --example run_takeover_latency` (needs
//! `HOST_TEST_DATABASE_URL`, and the `hostd-under-test` binary the system tests build).
//!
//! Run takeover latency with no client action, the run-side sibling of `failover_latency`:
//! three `hostd serve` on one PostgreSQL database (registry heartbeat 500 ms, expiry 2 s; every
//! run option at its default). For each of `KILLS` rounds a run is started on one Host, and
//! while its first step (`slow-echo`, 1 s) runs, that Host is killed with SIGKILL. Recorded:
//! the time from the kill until a survivor holds the run under epoch 2 (its driver begins the
//! next attempt at once), watched from outside every 10 ms, and, from the store's own clock,
//! until the first journal entry under epoch 2 (the re-run step's result: the step's own
//! second is in it). The killed Host is restarted under a new id before the next round.
//! Prints p50, p99 and max against the bound: registry expiry + 1 s.

use std::path::Path;
use std::time::{Duration, Instant};

use sessionstore::*;
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, hostd_run, ok, tenant_credentials};

const KILLS: usize = 12;
const EXPIRY: Duration = Duration::from_secs(2);

const PROGRAM: &str = "\
steps:
  - name: work
    invoke: pause@1.0.0
    input: {seconds: 1}
  - name: count
    invoke: word-count@1.0.0
    input: {text: \"one two three\"}
";

/// A read-only runnable that takes `seconds` (its process simply sleeps).
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

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a folder");
    for e in std::fs::read_dir(from).expect("a readable folder") {
        let e = e.expect("an entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("a file type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).expect("a copy");
        }
    }
}

fn host(dir: &Path, name: &str, url: &str, credentials: &Path, runnables: &Path) -> Serve {
    Serve::fleet_member(
        dir,
        name,
        url,
        credentials,
        &[
            "--runnables",
            runnables.to_str().expect("a UTF-8 path"),
            "--registry-heartbeat",
            "500ms",
            "--registry-expiry",
            "2s",
        ],
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let Some(db) = FreshDatabase::create("run_takeover_latency").await else {
        eprintln!("HOST_TEST_DATABASE_URL is unset");
        return;
    };
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let dir = tmp.path();
    let runnables = dir.join("runnables-ws");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/runnables"),
        &runnables,
    );
    let pause = runnables.join("runnables/pause");
    std::fs::create_dir_all(&pause).expect("a folder");
    std::fs::write(pause.join("runnable.yaml"), PAUSE_YAML).expect("a manifest");
    std::fs::write(pause.join("pause.py"), PAUSE_PY).expect("a script");
    std::fs::write(dir.join("program.yaml"), PROGRAM).expect("the program is written");
    let (token, credentials) = tenant_credentials(dir, "acme");
    let mut hosts: Vec<(String, Serve)> = Vec::new();
    for n in ["take-0", "take-1", "take-2"] {
        hosts.push((n.into(), host(dir, n, &db.url, &credentials, &runnables)));
    }
    let store = Store::open(StoreOptions::new(db.url.clone()))
        .await
        .expect("the store opens");
    let mut taken = Vec::new();
    let mut first_entry = Vec::new();
    for round in 0..KILLS {
        let (victim, serve) = hosts.remove(0);
        let endpoint = format!("ws://127.0.0.1:{}", serve.port);
        let started = ok(hostd_run(
            dir,
            &[
                "--json",
                "run",
                "start",
                "program.yaml",
                "--endpoint",
                &endpoint,
                "--tenant",
                "acme",
            ],
            &[("HOST_TENANT_TOKEN", &token)],
        ));
        let started: serde_json::Value = serde_json::from_str(&started).expect("start JSON");
        let run = RunId::new(started["run_id"].as_str().expect("a run id")).expect("a run id");
        // Mid-step: the driver has begun `work` (a 1 s process) and journaled nothing yet.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let journal = store.run_journal(&run).await.expect("the journal reads");
        if !journal.is_empty() {
            eprintln!("round {round}: the step ended before the kill; skipped");
        }
        let killed_at = Instant::now();
        let _ = serve.kill_dead();
        let killed_ms = store.now_ms().await.expect("the store's clock");
        let took = loop {
            let s = store
                .run_status(None, &run)
                .await
                .expect("the status reads")
                .expect("the run exists");
            if s.epoch >= 2 {
                break killed_at.elapsed();
            }
            if killed_at.elapsed() > Duration::from_secs(60) {
                panic!("round {round}: no survivor took the run within a minute: {s:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let entry = loop {
            let journal = store.run_journal(&run).await.expect("the journal reads");
            if let Some(e) = journal.iter().find(|e| e.epoch >= 2) {
                break e.recorded_at_ms - killed_ms;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        println!(
            "round {round:>2}: killed {victim} mid-step; taken over after {took:?}, first entry under epoch 2 after {entry} ms"
        );
        if journal.is_empty() {
            taken.push(took);
            first_entry.push(Duration::from_millis(entry.max(0) as u64));
        }
        let name = format!("take-{}", round + 3);
        hosts.push((
            name.clone(),
            host(dir, &name, &db.url, &credentials, &runnables),
        ));
    }
    taken.sort();
    first_entry.sort();
    let bound = EXPIRY + Duration::from_secs(1);
    println!(
        "run takeover, kill -9 mid-step to a survivor holding the run under the next epoch, {} runs: p50 {:?}  p99 {:?}  max {:?}  bound (registry expiry + 1 s) {:?}  p99/bound {:.2}",
        taken.len(),
        percentile(&taken, 0.5),
        percentile(&taken, 0.99),
        taken.last().copied().unwrap_or_default(),
        bound,
        percentile(&taken, 0.99).as_secs_f64() / bound.as_secs_f64()
    );
    println!(
        "  kill -> first journal entry under epoch 2 (the re-run 1 s step's result): p50 {:?}  p99 {:?}  max {:?}",
        percentile(&first_entry, 0.5),
        percentile(&first_entry, 0.99),
        first_entry.last().copied().unwrap_or_default(),
    );
    for (_, h) in hosts.drain(..) {
        let _ = h.terminate();
    }
    store.close().await;
    db.drop_now().await;
}
