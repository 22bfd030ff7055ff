//! `cargo bench -p sessionstore --bench lifecycle`
//!
//! For each backend, in one run:
//! - the raw single-row durable commit rate (one connection, one INSERT per transaction, the
//!   same durability settings the store uses), measured before and after the lifecycle runs;
//!   ratios are against the mean of the two (both are printed: the disk is shared);
//! - the full command lifecycle through the store (admit → claim → begin attempt → journal
//!   application → settle → cursor) for 1 and for 64 concurrent sessions: commands/s, the
//!   ratio to the raw rate, and per command the statements the operations issued, the
//!   statements sent to the database (a batch counts once; BEGIN/COMMIT/NOTIFY count) and the
//!   commits, as counted by the store itself;
//! - the same lifecycle on 16 sessions grown to 10,000 settled commands each against 16 grown
//!   to 100, alternately, four times, with the median ratio (PostgreSQL first once more before
//!   the store's own statistics check has run);
//! - the plans of the lookups of a command by its ids in a session of 10,000 commands.
//!
//! PostgreSQL runs when `HOST_TEST_DATABASE_URL` is set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sessionstore::testing::bench::{
    BenchDatabase, bench_postgres_url, chosen_backends, load_average, runtime,
};
use sessionstore::testing::new_session;
use sessionstore::*;

const RAW_COMMITS: usize = 400;
const ONE_SESSION_COMMANDS: usize = 150;
const MANY_SESSIONS: usize = 64;
const PER_SESSION_COMMANDS: usize = 25;
const GROWN_SESSIONS: usize = 16;
const GROWN_COMMANDS: usize = 40;
const LONG: u64 = 10_000;
const ROUNDS: usize = 4;
const SHORT: u64 = 100;

fn raw_sqlite_rate(path: &std::path::Path) -> f64 {
    sessionstore::testing::raw_sqlite_commit_rate(path, RAW_COMMITS).expect("raw sqlite baseline")
}

async fn raw_postgres_rate(url: &str, schema: &str) -> f64 {
    sessionstore::testing::raw_postgres_commit_rate(url, schema, RAW_COMMITS)
        .await
        .expect("raw postgres baseline")
}

/// A session of tenant `bench` at build `build`.
async fn session(store: &Store, name: &str) -> SessionRecord {
    new_session(store, "bench", name, "build").await
}

struct Run {
    rate: f64,
    stats: StoreStats,
    commands: usize,
}

impl Run {
    fn per_command(&self, n: u64) -> f64 {
        n as f64 / self.commands as f64
    }

    fn counts(&self) -> String {
        format!(
            "per command: {:.2} statements issued, {:.2} sent, {:.3} commits",
            self.per_command(self.stats.statements),
            self.per_command(self.stats.server_statements),
            self.per_command(self.stats.commits),
        )
    }
}

/// Runs `per_session` lifecycles on each of `sessions` concurrently.
async fn lifecycles(store: &Store, sessions: &[SessionRecord], per_session: usize) -> Run {
    let before = store.stats();
    let start = Instant::now();
    let tasks: Vec<_> = sessions
        .iter()
        .cloned()
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                testing::run_lifecycle(&store, &s, per_session)
                    .await
                    .expect("lifecycle")
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("lifecycle task");
    }
    let commands = sessions.len() * per_session;
    Run {
        rate: commands as f64 / start.elapsed().as_secs_f64(),
        stats: store.stats().since(&before),
        commands,
    }
}

async fn sessions(store: &Store, n: usize, tag: &str) -> Vec<SessionRecord> {
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        all.push(session(store, &format!("{tag}-{i}")).await);
    }
    all
}

/// Sessions grown to `size` settled commands each (their ids and journals are fresh, so the
/// lifecycle can run on them again and again: each run uses its own command ids).
async fn grown(store: &Store, size: u64, tag: &str) -> Vec<SessionRecord> {
    let all = sessions(store, GROWN_SESSIONS, tag).await;
    for s in &all {
        testing::grow_session(store, s, size).await.expect("grow");
    }
    all
}

/// Runs the lifecycle on grown sessions, each run with fresh command ids.
async fn grown_run(store: &Store, all: &[SessionRecord], round: usize) -> Run {
    let before = store.stats();
    let start = Instant::now();
    let tasks: Vec<_> = all
        .iter()
        .cloned()
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                let first = round * GROWN_COMMANDS;
                testing::run_lifecycle_as(&store, &s, "round-", first..first + GROWN_COMMANDS)
                    .await
                    .expect("lifecycle")
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("lifecycle task");
    }
    let commands = all.len() * GROWN_COMMANDS;
    Run {
        rate: commands as f64 / start.elapsed().as_secs_f64(),
        stats: store.stats().since(&before),
        commands,
    }
}

/// Growth: the lifecycle on sessions of 10,000 commands against sessions of 100.
async fn growth(backend: &str, store: &Store) {
    let short = grown(store, SHORT, "short").await;
    let long = grown(store, LONG, "long").await;
    if store.backend() == BackendKind::Postgres {
        let stale = grown_run(store, &long, 0).await;
        println!(
            "{backend}: {GROWN_SESSIONS} sessions of {LONG} commands, first run, before the statistics check: {:>7.0} commands/s",
            stale.rate
        );
        let analysed = store.refresh_statistics().await.expect("statistics");
        println!("{backend}: the store's statistics check analysed {analysed:?}");
    }
    let mut ratios = Vec::new();
    for round in 1..=ROUNDS {
        let s = grown_run(store, &short, round).await;
        let l = grown_run(store, &long, round).await;
        ratios.push(l.rate / s.rate);
        println!(
            "{backend}: {GROWN_SESSIONS} sessions of {SHORT} commands: {:>7.0} commands/s; of {LONG}: {:>7.0} commands/s ({:.2}x; {})",
            s.rate,
            l.rate,
            l.rate / s.rate,
            l.counts()
        );
    }
    ratios.sort_by(f64::total_cmp);
    let median = (ratios[(ratios.len() - 1) / 2] + ratios[ratios.len() / 2]) / 2.0;
    println!(
        "{backend}: rate at {LONG} commands per session vs {SHORT}: median {median:.2}x, {:.2}x to {:.2}x over {ROUNDS} pairs (goal: within 20%)",
        ratios[0],
        ratios[ratios.len() - 1]
    );
    // The plans of the lookups by id, in a session of 10,000 commands.
    let s = &long[0];
    let rec = store
        .command(
            &s.tenant,
            &s.session,
            &CommandId::new(format!("round-{GROWN_COMMANDS}")).expect("id"),
        )
        .await
        .expect("a grown session's command");
    let plans = store.lookup_plans(s, &rec).await.expect("plans");
    let bad: Vec<_> = plans.iter().filter(|p| p.problem.is_some()).collect();
    println!(
        "{backend}: lookups of a command by id at {LONG}+ commands per session: {} plans, {} by index on the id{}",
        plans.len(),
        plans.len() - bad.len(),
        if bad.is_empty() { "" } else { " — NOT ALL:" }
    );
    for p in bad {
        println!(
            "{backend}:   {}: {}\n{}",
            p.statement,
            p.problem.as_deref().unwrap_or_default(),
            p.plan
        );
    }
}

fn report(backend: &str, raw: (f64, f64), one: &Run, many: &Run) {
    let base = (raw.0 + raw.1) / 2.0;
    println!(
        "{backend}: raw single-row durable commits: {:.0} before, {:.0} after: {base:.0} commits/s",
        raw.0, raw.1
    );
    for (label, run) in [("1 session:  ", one), ("64 sessions:", many)] {
        println!(
            "{backend}: lifecycle, {label} {:>7.0} commands/s  ({:.2}x raw); {}",
            run.rate,
            run.rate / base,
            run.counts(),
        );
    }
}

async fn bench_sqlite(growth_phase: bool) {
    println!("sqlite: load average {}", load_average());
    let db = BenchDatabase::sqlite("store.db");
    let raw_before = raw_sqlite_rate(&db.beside("raw-before.db"));
    let store = Store::open(db.options.clone()).await.expect("store");
    let one = lifecycles(
        &store,
        &sessions(&store, 1, "one").await,
        ONE_SESSION_COMMANDS,
    )
    .await;
    let many = lifecycles(
        &store,
        &sessions(&store, MANY_SESSIONS, "many").await,
        PER_SESSION_COMMANDS,
    )
    .await;
    let raw_after = raw_sqlite_rate(&db.beside("raw-after.db"));
    report("sqlite", (raw_before, raw_after), &one, &many);
    if growth_phase {
        growth("sqlite", &store).await;
    }
    store.close().await;
    println!("sqlite: load average {}", load_average());
}

/// Only the 64-session lifecycle, `rounds` times (for profiling: `-- postgres many`).
async fn many_only(url: String, rounds: usize) {
    let db = BenchDatabase::postgres(&url, "bench_many");
    let store = Store::open(db.options.clone()).await.expect("store");
    for round in 0..rounds {
        let all = sessions(&store, MANY_SESSIONS, &format!("many-{round}")).await;
        let run = lifecycles(&store, &all, PER_SESSION_COMMANDS).await;
        println!(
            "postgres: lifecycle, 64 sessions: {:>7.0} commands/s; {}",
            run.rate,
            run.counts()
        );
    }
    store.close().await;
    db.finish().await;
}

async fn bench_postgres(url: String, growth_phase: bool) {
    println!("postgres: load average {}", load_average());
    let mut db = BenchDatabase::postgres(&url, "bench");
    let raw = db.raw_schema();
    let raw_before = raw_postgres_rate(&url, &raw).await;
    db.options.pg_max_connections = 32;
    // The growth phase calls the statistics check itself, after one stale run.
    db.options.pg_statistics_interval = Duration::from_secs(3600);
    let store = Store::open(db.options.clone()).await.expect("store");
    let one = lifecycles(
        &store,
        &sessions(&store, 1, "one").await,
        ONE_SESSION_COMMANDS,
    )
    .await;
    let many = lifecycles(
        &store,
        &sessions(&store, MANY_SESSIONS, "many").await,
        PER_SESSION_COMMANDS,
    )
    .await;
    let raw_after = raw_postgres_rate(&url, &raw).await;
    report("postgres", (raw_before, raw_after), &one, &many);
    if growth_phase {
        growth("postgres", &store).await;
    }
    store.close().await;
    println!("postgres: load average {}", load_average());
    db.finish().await;
}

/// What to run: `cargo bench -p sessionstore --bench lifecycle [-- sqlite|postgres] [lifecycle]`
/// (`lifecycle` skips the growth phase; `many` runs only the 64-session lifecycle, four times,
/// for profiling). `cargo bench` itself passes `--bench`.
struct Selection {
    sqlite: bool,
    postgres: bool,
    growth: bool,
    many_only: bool,
}

fn selection() -> Selection {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let named = |n: &str| args.iter().any(|a| a == n);
    let backends = chosen_backends();
    Selection {
        sqlite: backends.sqlite,
        postgres: backends.postgres,
        growth: !named("lifecycle"),
        many_only: named("many"),
    }
}

fn main() {
    let chosen = selection();
    let rt = Arc::new(runtime());
    if chosen.sqlite {
        rt.block_on(bench_sqlite(chosen.growth));
    }
    if chosen.postgres {
        match bench_postgres_url() {
            Some(url) if chosen.many_only => rt.block_on(many_only(url, 4)),
            Some(url) => rt.block_on(bench_postgres(url, chosen.growth)),
            None => {}
        }
    }
}
