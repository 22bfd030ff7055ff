//! `cargo bench -p sessionstore --bench run_pages`
//!
//! What reading a tenant's runs costs once it has many, for each backend, in one run: the
//! tenant gets `HOST_BENCH_RUNS` (default 20,000) completed runs, then each read is timed
//! `READS` times and its median printed:
//! - the whole list (`Store::runs`): what `run.list` and the console read on every call
//!   before they paged — the baseline the pages are compared with;
//! - the console's first page (50, newest first);
//! - a `run.list` page of 500 from the middle of the list (oldest first, after a cursor).
//!
//! PostgreSQL runs when `HOST_TEST_DATABASE_URL` is set.

use std::time::{Duration, Instant};

use sessionstore::testing::bench::{
    BenchDatabase, bench_postgres_url, chosen_backends, env_usize, load_average, median, runtime,
};
use sessionstore::*;

const READS: usize = 15;
const WRITERS: usize = 8;

fn tenant() -> TenantId {
    TenantId::new("bench").expect("a tenant id")
}

/// `n` completed runs of the bench tenant, `WRITERS` at a time.
async fn fill(store: &Store, n: usize) {
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            for i in (w..n).step_by(WRITERS) {
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
            }
        }));
    }
    for w in writers {
        w.await.expect("a writer");
    }
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
    println!("{name}: load average {}", load_average());
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
            let db = BenchDatabase::postgres(&url, "bench_run_pages");
            let store = Store::open(db.options.clone()).await.expect("store");
            bench("postgres", &store, runs).await;
            store.close().await;
            db.finish().await;
        });
    }
}
