//! `cargo bench -p host --bench commands`
//!
//! For each backend, in one run: the store's own command lifecycle rate (admit → claim →
//! attempt → journal application → settle → cursor, straight on the store: six writes per
//! command), then commands/s end to end through a composed Host with the harness and its
//! scripted model (admitted into the store as a controller would, woken as a HostLink delivery
//! would, settled by the Host from the runtime's evidence; each input also runs its turn, so
//! the Host writes more per command than the lifecycle does: the bench prints how many), for 1
//! and 64 sessions, with the ratio to the lifecycle rate at the same session count (goal at 64
//! sessions: 0.6x); and attach latency p50/p99 for create and for restore. PostgreSQL runs when
//! `HOST_TEST_DATABASE_URL` is set.
//!
//! The bench learns that commands were applied from the Host itself: the sample count of its
//! `host_command_apply_seconds` histogram (an in-memory counter, looked at every 5 ms), then
//! one read per session confirms the last command is terminal. It reads nothing from the
//! database while the Host works.

use std::time::{Duration, Instant};

use department::LaunchMode;
use host::{Options, Service};
use sessionstore::*;
use testkit::bench::{
    BenchDatabase, admit_input, attach_request, bench_postgres_url, chosen_backends, host_options,
    inputs_applied, load_average, new_session, percentile, runtime, start_host,
};

const ONE_SESSION: usize = 150;
const MANY: usize = 64;
const PER_SESSION: usize = 30;
const ATTACHES: usize = 60;

/// A session of tenant `bench` at build `bench`.
async fn session(store: &Store, name: &str) -> SessionRecord {
    new_session(store, "bench", name, "bench").await
}

async fn host(options: StoreOptions, name: &str) -> Service {
    let host = Options {
        capacity: 1000,
        reconcile_interval: Duration::from_millis(500),
        ..host_options(name)
    };
    start_host(host, options, "bench").await
}

/// The store's lifecycle rate and the writes and statements each command cost.
async fn raw_rate(store: &Store, sessions: usize, per: usize, tag: &str) -> Measured {
    let mut all = Vec::new();
    for i in 0..sessions {
        all.push(session(store, &format!("raw-{tag}-{i}")).await);
    }
    let before = store.stats();
    let start = Instant::now();
    let tasks: Vec<_> = all
        .into_iter()
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move { sessionstore::testing::run_lifecycle(&store, &s, per).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("task").expect("lifecycle");
    }
    Measured::new(
        sessions * per,
        start.elapsed(),
        store.stats().since(&before),
    )
}

struct Measured {
    rate: f64,
    commands: usize,
    stats: StoreStats,
}

impl Measured {
    fn new(commands: usize, took: Duration, stats: StoreStats) -> Measured {
        Measured {
            rate: commands as f64 / took.as_secs_f64(),
            commands,
            stats,
        }
    }

    fn per_command(&self) -> String {
        let n = self.commands as f64;
        format!(
            "{:.1} writes, {:.1} statements, {:.2} commits per command",
            self.stats.writes as f64 / n,
            self.stats.statements as f64 / n,
            self.stats.commits as f64 / n,
        )
    }
}

/// Admits `per` inputs to a resident session, waking its consumer after each.
async fn drive(svc: Service, store: Store, s: SessionRecord, per: usize) -> CommandId {
    let mut last = None;
    for i in 0..per {
        let rec = admit_input(&store, &s, CommandId::new(format!("c{i}")).unwrap()).await;
        let _ = svc.deliver(&s.tenant, &s.session);
        last = Some(rec.command);
    }
    last.expect("at least one command")
}

async fn host_rate(
    svc: &Service,
    store: &Store,
    sessions: usize,
    per: usize,
    tag: &str,
) -> Measured {
    let mut all = Vec::new();
    for i in 0..sessions {
        let s = session(store, &format!("host-{tag}-{i}")).await;
        svc.attach(attach_request(&s, LaunchMode::Create))
            .await
            .expect("attach");
        all.push(s);
    }
    let expected = inputs_applied(svc) + (sessions * per) as u64;
    let before = svc.store().stats();
    let start = Instant::now();
    let tasks: Vec<_> = all
        .iter()
        .cloned()
        .map(|s| tokio::spawn(drive(svc.clone(), store.clone(), s, per)))
        .collect();
    let mut last = Vec::with_capacity(tasks.len());
    for t in tasks {
        last.push(t.await.expect("task"));
    }
    while inputs_applied(svc) < expected {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = start.elapsed();
    let stats = svc.store().stats().since(&before);
    for (s, c) in all.iter().zip(&last) {
        let rec = store.command(&s.tenant, &s.session, c).await.expect("read");
        assert!(rec.state.is_terminal(), "{} is {}", rec.command, rec.state);
    }
    Measured::new(sessions * per, took, stats)
}

async fn attach_latency(
    options: StoreOptions,
    store: &Store,
    name: &str,
) -> (Vec<Duration>, Vec<Duration>) {
    let svc = host(options.clone(), &format!("{name}-a")).await;
    let mut sessions = Vec::new();
    let mut create = Vec::new();
    for i in 0..ATTACHES {
        let s = session(store, &format!("lat-{name}-{i}")).await;
        let t = Instant::now();
        svc.attach(attach_request(&s, LaunchMode::Create))
            .await
            .expect("attach");
        create.push(t.elapsed());
        sessions.push(s);
    }
    svc.stop().await;
    let svc = host(options, &format!("{name}-b")).await;
    let mut restore = Vec::new();
    for s in &sessions {
        let t = Instant::now();
        let a = svc
            .attach(attach_request(s, LaunchMode::Create))
            .await
            .expect("attach");
        restore.push(t.elapsed());
        assert_eq!(a.launched, LaunchMode::Restore);
    }
    svc.stop().await;
    create.sort();
    restore.sort();
    (create, restore)
}

async fn bench(backend: &str, options: StoreOptions) {
    let store = Store::open(options.clone()).await.expect("store");
    let raw_one = raw_rate(&store, 1, ONE_SESSION, "one").await;
    let raw_many = raw_rate(&store, MANY, PER_SESSION, "many").await;
    let svc = host(options.clone(), &format!("bench-{backend}")).await;
    let one = host_rate(&svc, &store, 1, ONE_SESSION, "one").await;
    let many = host_rate(&svc, &store, MANY, PER_SESSION, "many").await;
    svc.stop().await;
    let (create, restore) = attach_latency(options, &store, backend).await;
    println!(
        "{backend}: store lifecycle, 1 session:      {:>8.0} commands/s  ({})",
        raw_one.rate,
        raw_one.per_command()
    );
    println!(
        "{backend}: host end to end, 1 session:     {:>8.0} commands/s  ({:.2}x the lifecycle; the Host's store: {})",
        one.rate,
        one.rate / raw_one.rate,
        one.per_command()
    );
    println!(
        "{backend}: store lifecycle, {MANY} sessions:    {:>8.0} commands/s  ({})",
        raw_many.rate,
        raw_many.per_command()
    );
    println!(
        "{backend}: host end to end, {MANY} sessions:   {:>8.0} commands/s  ({:.2}x the lifecycle, goal 0.6x; the Host's store: {})",
        many.rate,
        many.rate / raw_many.rate,
        many.per_command()
    );
    println!(
        "{backend}: attach (create)  p50 {:>7.2} ms  p99 {:>7.2} ms  ({ATTACHES} attaches)",
        percentile(&create, 0.5).as_secs_f64() * 1e3,
        percentile(&create, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "{backend}: attach (restore) p50 {:>7.2} ms  p99 {:>7.2} ms  ({ATTACHES} attaches)",
        percentile(&restore, 0.5).as_secs_f64() * 1e3,
        percentile(&restore, 0.99).as_secs_f64() * 1e3
    );
    store.close().await;
}

/// `cargo bench -p host --bench commands [-- sqlite|postgres]`: both backends unless one is
/// named (`cargo bench` itself passes `--bench`).
fn main() {
    let chosen = chosen_backends();
    let rt = runtime();
    println!("load average {}", load_average());
    if chosen.sqlite {
        let db = BenchDatabase::sqlite("host.db");
        rt.block_on(bench("sqlite", db.options.clone()));
        println!("load average {}", load_average());
    }
    if !chosen.postgres {
        return;
    }
    if let Some(url) = bench_postgres_url() {
        let mut db = BenchDatabase::postgres(&url, "bench_host");
        db.options.pg_max_connections = 32;
        rt.block_on(bench("postgres", db.options.clone()));
        println!("load average {}", load_average());
        rt.block_on(db.finish());
    }
}
