//! `cargo bench -p workflow --bench runs [-- sqlite|postgres]`
//!
//! For each backend, in one run: the raw single-row durable commit rate (one connection, one
//! INSERT per transaction, the store's durability settings; measured before and after, the
//! ratio is against their mean), then workflow runs of a three-step program — two read-only
//! invokes of an in-process handler and a zero sleep — recorded and driven through the session
//! store to completion, 1 at a time and 64 at once: runs/s and the ratio to the raw rate.
//! Each run is five durable writes (the start, three results, the end).
//!
//! Then parked runs: `PARKED` (default 10,000) runs of a one-ask program are driven, 64 at
//! once, until each parks (handed back to the store, its driver gone, as a Host drives them).
//! Printed: the process's resident memory before and after, the growth per parked run and
//! its ratio to the baseline, and the time one new run takes to complete with all of them
//! parked, against the mean time of a run driven alone earlier in the same run.
//!
//! PostgreSQL runs when `HOST_TEST_DATABASE_URL` is set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use runnable::{Effect, OutcomeClass};
use sessionstore::testing::bench::{
    BenchDatabase, bench_postgres_url, chosen_backends, load_average, runtime,
};
use sessionstore::*;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use workflow::program::{RunnableInfo, Unresolved, schema_from_yaml};
use workflow::{
    DriveEnd, Driver, DriverOptions, Environment, InvokeCall, InvokeDone, Invoker, NoEvents,
};

const RAW_COMMITS: usize = 400;
const ONE_RUNS: usize = 40;
const MANY: usize = 64;
const PER_TASK_RUNS: usize = 4;
const PARKED: usize = 10_000;

const ASKS: &str = "\
steps:
  - name: approve
    ask: go on?
    answer: {type: boolean}
";

const PROGRAM: &str = "\
steps:
  - name: first
    invoke: echo@1.0.0
    input: {n: \"${input.n}\"}
  - name: second
    invoke: echo@1.0.0
    input: {m: \"${steps.first.n}\"}
  - name: pause
    sleep: 0s
";

struct Echo;

impl Environment for Echo {
    fn runnable(&self, _: &str) -> Result<RunnableInfo, Unresolved> {
        Ok(RunnableInfo {
            identity: "bench/echo@1.0.0".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
            effect: Effect::ReadOnly,
            input: schema_from_yaml("type: object\nadditionalProperties: true\n")
                .expect("a schema"),
        })
    }
    fn agent_known(&self, _: &str) -> bool {
        false
    }
}

#[async_trait]
impl Invoker for Echo {
    async fn invoke(&self, call: InvokeCall) -> Result<InvokeDone, String> {
        Ok(InvokeDone {
            outcome: OutcomeClass::Succeeded,
            output: Some(call.input),
            detail: String::new(),
        })
    }
}

fn raw_sqlite_rate(path: &std::path::Path) -> f64 {
    sessionstore::testing::raw_sqlite_commit_rate(path, RAW_COMMITS).expect("raw sqlite baseline")
}

async fn raw_postgres_rate(url: &str, schema: &str) -> f64 {
    sessionstore::testing::raw_postgres_commit_rate(url, schema, RAW_COMMITS)
        .await
        .expect("raw postgres baseline")
}

fn driver(store: &Store) -> Driver {
    driver_with(store, None)
}

fn driver_with(store: &Store, park: Option<Duration>) -> Driver {
    Driver {
        journal: Arc::new(store.clone()),
        env: Arc::new(Echo),
        releases: Arc::new(workflow::AsResolved(Arc::new(Echo))),
        invoker: Arc::new(Echo),
        agents: None,
        events: Arc::new(NoEvents),
        options: DriverOptions {
            lease: Duration::from_secs(60),
            poll: Duration::from_millis(100),
            park,
        },
    }
}

async fn one_run(store: &Store, d: &Driver, id: String) {
    let end = drive_new(store, d, id, PROGRAM).await;
    assert_eq!(end, DriveEnd::Completed);
}

async fn drive_new(store: &Store, d: &Driver, id: String, program: &str) -> DriveEnd {
    let status = store
        .create_run(NewRun {
            run_id: RunId::new(id).expect("an id"),
            tenant: TenantId::new("bench").expect("a tenant"),
            source: program.into(),
            input: r#"{"n": 1}"#.into(),
            holder: "bench/1".into(),
            fencing_token: uuid::Uuid::now_v7().simple().to_string(),
            lease: Duration::from_secs(60),
            idempotency_key: None,
            pins: vec![sessionstore::RunPin {
                identity: "bench/echo@1.0.0".into(),
                digest: format!("sha256:{}", "0".repeat(64)),
            }],
            started_by: None,
            trace: None,
        })
        .await
        .expect("a run")
        .status;
    d.drive(status, Arc::new(Notify::new()), CancellationToken::new())
        .await
        .expect("a drive")
}

/// The process's resident set, in bytes (Linux).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn parked_count() -> usize {
    std::env::var("PARKED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PARKED)
}

/// Parks `n` runs of a one-ask program, `MANY` drivers at once, then times one new run;
/// prints memory per parked run against the baseline and the new run against `alone`
/// (seconds per run driven alone).
async fn parked(store: &Store, backend: &str, alone: f64) {
    let n = parked_count();
    let d = driver_with(store, Some(Duration::ZERO));
    let baseline = rss_bytes();
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..MANY {
        let (store, d) = (store.clone(), d.clone());
        handles.push(tokio::spawn(async move {
            for i in (t..n).step_by(MANY) {
                let end = drive_new(&store, &d, format!("parked-{i}"), ASKS).await;
                assert!(matches!(end, DriveEnd::Parked { .. }), "{end:?}");
            }
        }));
    }
    for h in handles {
        h.await.expect("a task");
    }
    let parking = start.elapsed();
    let after = rss_bytes();
    let per_run = after.saturating_sub(baseline) as f64 / n as f64;
    println!(
        "{backend}: {n} runs parked in {:.1} s; resident memory {:.1} MiB before, {:.1} MiB after: {per_run:.0} bytes per parked run ({:.6}x the baseline; goal 4096 bytes)",
        parking.as_secs_f64(),
        baseline as f64 / 1048576.0,
        after as f64 / 1048576.0,
        per_run / baseline.max(1) as f64
    );
    let fresh = Instant::now();
    one_run(store, &driver(store), "after-parked".into()).await;
    let took = fresh.elapsed().as_secs_f64();
    println!(
        "{backend}: a new run with {n} parked completes in {:.1} ms ({:.2}x a run driven alone, {:.1} ms)",
        took * 1000.0,
        took / alone,
        alone * 1000.0
    );
}

/// Runs `tasks` concurrent tasks of `per_task` runs each; runs/s.
async fn runs(store: &Store, label: &str, tasks: usize, per_task: usize) -> f64 {
    let d = driver(store);
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (store, d, label) = (store.clone(), d.clone(), label.to_owned());
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                one_run(&store, &d, format!("{label}-{t}-{i}")).await;
            }
        }));
    }
    for h in handles {
        h.await.expect("a task");
    }
    (tasks * per_task) as f64 / start.elapsed().as_secs_f64()
}

fn report(backend: &str, raw: (f64, f64), one: f64, many: f64) {
    let base = (raw.0 + raw.1) / 2.0;
    println!(
        "{backend}: raw single-row durable commits: {:.0} before, {:.0} after: {base:.0} commits/s",
        raw.0, raw.1
    );
    println!(
        "{backend}: runs, 1 at a time:  {one:>7.1} runs/s  ({:.2}x raw)",
        one / base
    );
    println!(
        "{backend}: runs, {MANY} at once:   {many:>7.1} runs/s  ({:.2}x raw)",
        many / base
    );
}

async fn bench_sqlite() {
    println!("sqlite: load average {}", load_average());
    let db = BenchDatabase::sqlite("runs.db");
    let raw_before = raw_sqlite_rate(&db.beside("raw-before.db"));
    let store = Store::open(db.options.clone()).await.expect("store");
    let one = runs(&store, "one", 1, ONE_RUNS).await;
    let many = runs(&store, "many", MANY, PER_TASK_RUNS).await;
    let raw_after = raw_sqlite_rate(&db.beside("raw-after.db"));
    report("sqlite", (raw_before, raw_after), one, many);
    parked(&store, "sqlite", 1.0 / one).await;
    store.close().await;
    println!("sqlite: load average {}", load_average());
}

async fn bench_postgres(url: String) {
    println!("postgres: load average {}", load_average());
    let mut db = BenchDatabase::postgres(&url, "bench_runs");
    let raw = db.raw_schema();
    let raw_before = raw_postgres_rate(&url, &raw).await;
    db.options.pg_max_connections = 32;
    let store = Store::open(db.options.clone()).await.expect("store");
    let one = runs(&store, "one", 1, ONE_RUNS).await;
    let many = runs(&store, "many", MANY, PER_TASK_RUNS).await;
    let raw_after = raw_postgres_rate(&url, &raw).await;
    report("postgres", (raw_before, raw_after), one, many);
    parked(&store, "postgres", 1.0 / one).await;
    store.close().await;
    println!("postgres: load average {}", load_average());
    db.finish().await;
}

fn main() {
    let chosen = chosen_backends();
    let rt = runtime();
    if chosen.sqlite {
        rt.block_on(bench_sqlite());
    }
    if chosen.postgres
        && let Some(url) = bench_postgres_url()
    {
        rt.block_on(bench_postgres(url));
    }
}
