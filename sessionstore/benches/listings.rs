//! `cargo bench -p sessionstore --bench listings`
//!
//! What the operator's listings cost once a store has many rows, for each backend, in one
//! run; each read is timed `READS` times and its median printed beside the read it replaced:
//! - runs: the tenant gets `HOST_BENCH_RUNS` (default 20,000) completed runs. The baseline is
//!   the whole list (`Store::runs`), what `run.list` and the console read on every call
//!   before they paged; against it, the console's first page (50, newest first) and a
//!   `run.list` page of 500 from the middle (oldest first, after a cursor);
//! - open gates: `HOST_BENCH_GATED` (default 2,000) sessions with one open gate each. The
//!   baseline is what the console's gates view read before: the tenant's first 1,000 sessions,
//!   then each one's open gates (and it never showed a gate past them); against it, the first
//!   page of 50 open gates, oldest first.
//!
//! PostgreSQL runs when `HOST_TEST_DATABASE_URL` is set.

use std::time::{Duration, Instant};

use sessionstore::testing::bench::{
    BenchDatabase, bench_postgres_url, chosen_backends, env_usize, load_average, median, runtime,
};
use sessionstore::testing::new_session;
use sessionstore::*;

const READS: usize = 15;
const WRITERS: usize = 8;

fn tenant() -> TenantId {
    TenantId::new("bench").expect("a tenant id")
}

/// Runs `write(store, i)` for each `i` below `n`, `WRITERS` at a time.
async fn written<F, Fut>(store: &Store, n: usize, write: F)
where
    F: Fn(Store, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (store, write) = (store.clone(), write.clone());
        writers.push(tokio::spawn(async move {
            for i in (w..n).step_by(WRITERS) {
                write(store.clone(), i).await;
            }
        }));
    }
    for w in writers {
        w.await.expect("a writer");
    }
}

/// `n` completed runs of the bench tenant.
async fn fill(store: &Store, n: usize) {
    written(store, n, |store, i| async move {
        let created = store
            .create_run(NewRun {
                run_id: RunId::new(format!("run-{i:07}")).expect("a run id"),
                tenant: tenant(),
                source: "steps:\n  - name: only\n    sleep: 0s\n".into(),
                input: "{}".into(),
                holder: "bench/attempt-1".into(),
                fencing_token: format!("bench-{i}"),
                lease: Duration::from_secs(3600),
                idempotency_key: None,
                pins: Vec::new(),
                started_by: Some("user:bench".into()),
                trace: None,
            })
            .await
            .expect("a run");
        store
            .end_run(&created.status.fence(), RunEnd::Completed)
            .await
            .expect("the run ends");
    })
    .await;
}

/// The median of `READS` timings of `read`, and the rows its last call returned.
async fn timed<F, Fut>(read: F) -> (Duration, usize)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let mut times = Vec::new();
    let mut rows = 0;
    for _ in 0..READS {
        let start = Instant::now();
        rows = read().await;
        times.push(start.elapsed());
    }
    (median(times), rows)
}

async fn bench(name: &str, store: &Store, runs: usize) {
    println!("{name}: load average {}", load_average());
    let start = Instant::now();
    fill(store, runs).await;
    println!(
        "{name}: {runs} completed runs recorded in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let t = tenant();
    let (whole, whole_rows) =
        timed(|| async { store.runs(&t).await.expect("the whole list").len() }).await;
    let tenants = [t.clone()];
    let (first, first_rows) = timed(|| async {
        store
            .runs_page(&tenants, None, 50, RunOrder::NewestFirst)
            .await
            .expect("the first page")
            .runs
            .len()
    })
    .await;
    let middle = RunId::new(format!("run-{:07}", runs / 2)).expect("a run id");
    let (deep, deep_rows) = timed(|| async {
        store
            .runs_page(&tenants, Some(&middle), 500, RunOrder::OldestFirst)
            .await
            .expect("a page from the middle")
            .runs
            .len()
    })
    .await;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name}: whole list (baseline, the read before paging): {:>8.2} ms for {whole_rows} runs",
        ms(whole)
    );
    println!(
        "{name}: console's first page, newest first:           {:>8.2} ms for {first_rows} runs ({:.4}× the whole list)",
        ms(first),
        first.as_secs_f64() / whole.as_secs_f64()
    );
    println!(
        "{name}: run.list page from the middle, after a cursor: {:>8.2} ms for {deep_rows} runs ({:.4}× the whole list)",
        ms(deep),
        deep.as_secs_f64() / whole.as_secs_f64()
    );
    gates(name, store).await;
    println!("{name}: load average {}", load_average());
}

/// `n` sessions of the bench tenant with one open gate each.
async fn gated_sessions(store: &Store, n: usize) {
    written(store, n, |store, i| async move {
        let s = new_session(&store, "bench", &format!("gated-{i:06}"), "build").await;
        store
            .open_gate(
                &s.tenant,
                &s.session,
                ResidencyEpoch(1),
                OpenGate {
                    gate: GateId::new(format!("gate-{i}")).expect("a gate id"),
                    opened_event: EventId::new(format!("event-{i}")).expect("an event id"),
                    opened_seq: 1,
                    kind: "permission".into(),
                    prompt_summary: "may the agent go on?".into(),
                    deadline_ms: i64::MAX / 2,
                },
            )
            .await
            .expect("an open gate");
    })
    .await;
}

async fn gates(name: &str, store: &Store) {
    let gated = env_usize("HOST_BENCH_GATED", 2_000);
    let start = Instant::now();
    gated_sessions(store, gated).await;
    println!(
        "{name}: {gated} sessions with an open gate each recorded in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let t = tenant();
    let (before, before_rows) = timed(|| async {
        let mut open = 0;
        for s in store.list_sessions(&t, None, 1000).await.expect("sessions") {
            open += store
                .gates(&t, &s.session, true)
                .await
                .expect("gates")
                .len();
        }
        open
    })
    .await;
    let tenants = [t.clone()];
    let (page, page_rows) = timed(|| async {
        store
            .open_gates_page(&tenants, None, 50)
            .await
            .expect("a page of open gates")
            .gates
            .len()
    })
    .await;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name}: gates view before (1,000 sessions, a read each; baseline): {:>8.2} ms for {before_rows} of {gated} open gates",
        ms(before)
    );
    println!(
        "{name}: first page of open gates, oldest first:                  {:>8.2} ms for {page_rows} ({:.4}× the baseline)",
        ms(page),
        page.as_secs_f64() / before.as_secs_f64()
    );
}

fn main() {
    let chosen = chosen_backends();
    let runs = env_usize("HOST_BENCH_RUNS", 20_000);
    let rt = runtime();
    if chosen.sqlite {
        rt.block_on(async {
            let db = BenchDatabase::sqlite("store.db");
            let store = Store::open(db.options.clone()).await.expect("store");
            bench("sqlite", &store, runs).await;
            store.close().await;
            db.finish().await;
        });
    }
    if chosen.postgres
        && let Some(url) = bench_postgres_url()
    {
        rt.block_on(async {
            let db = BenchDatabase::postgres(&url, "bench_listings");
            let store = Store::open(db.options.clone()).await.expect("store");
            bench("postgres", &store, runs).await;
            store.close().await;
            db.finish().await;
        });
    }
}
