//! `cargo bench -p sessionstore --bench lifecycle`
//!
//! For each backend, in one run: the raw single-row durable commit rate (one connection, one
//! INSERT per transaction, the same durability settings the store uses), then the full command
//! lifecycle rate through the store (admit → claim → begin attempt → journal application →
//! settle → cursor) for 1 and for 64 concurrent sessions, printed as commands/s and as a ratio
//! to the raw rate. PostgreSQL runs when `HOST_TEST_DATABASE_URL` is set.

use std::sync::Arc;
use std::time::Instant;

use sessionstore::*;

const RAW_COMMITS: usize = 400;
const ONE_SESSION_COMMANDS: usize = 200;
const MANY_SESSIONS: usize = 64;
const PER_SESSION_COMMANDS: usize = 20;

fn raw_sqlite_rate(dir: &std::path::Path) -> f64 {
    let conn = rusqlite::Connection::open(dir.join("raw.db")).expect("raw sqlite");
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .expect("wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("sync");
    conn.execute_batch("CREATE TABLE raw (id INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        .expect("table");
    let mut stmt = conn
        .prepare("INSERT INTO raw (v) VALUES (?1)")
        .expect("stmt");
    let start = Instant::now();
    for i in 0..RAW_COMMITS {
        stmt.execute([format!("row-{i}").into_bytes()])
            .expect("insert");
    }
    RAW_COMMITS as f64 / start.elapsed().as_secs_f64()
}

async fn raw_postgres_rate(url: &str, schema: &str) -> f64 {
    use sqlx::{Connection, Executor};
    let mut conn = sqlx::PgConnection::connect(url).await.expect("raw pg");
    conn.execute(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {schema}"
    )))
    .await
    .expect("schema");
    conn.execute(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {schema}.raw (id BIGSERIAL PRIMARY KEY, v BYTEA NOT NULL)"
    )))
    .await
    .expect("table");
    let sql = format!("INSERT INTO {schema}.raw (v) VALUES ($1)");
    let start = Instant::now();
    for i in 0..RAW_COMMITS {
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(format!("row-{i}").into_bytes())
            .execute(&mut conn)
            .await
            .expect("insert");
    }
    let rate = RAW_COMMITS as f64 / start.elapsed().as_secs_f64();
    let _ = conn.close().await;
    rate
}

async fn new_session(store: &Store, name: &str) -> SessionRecord {
    store
        .create_session(NewSession {
            tenant: TenantId::new("bench").unwrap(),
            session: SessionId::new(name).unwrap(),
            agent: AgentId::new("assistant").unwrap(),
            compatibility: CompatibilityId::new("build").unwrap(),
            binding: SessionBinding {
                runtime_session_id: RuntimeSessionId::mint(),
                storage_binding_id: local_binding(),
                binding_version: 1,
            },
        })
        .await
        .expect("session")
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
}

async fn lifecycle_rate(store: &Store, sessions: usize, per_session: usize, tag: &str) -> Run {
    let mut all = Vec::new();
    for i in 0..sessions {
        all.push(new_session(store, &format!("{tag}-{i}")).await);
    }
    let before = store.stats();
    let start = Instant::now();
    let tasks: Vec<_> = all
        .into_iter()
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
    let commands = sessions * per_session;
    Run {
        rate: commands as f64 / start.elapsed().as_secs_f64(),
        stats: store.stats().since(&before),
        commands,
    }
}

fn report(backend: &str, raw: f64, one: &Run, many: &Run) {
    println!("{backend}: raw single-row durable commits: {raw:>9.0} commits/s");
    for (label, run) in [("1 session:  ", one), ("64 sessions:", many)] {
        println!(
            "{backend}: lifecycle, {label}          {:>9.0} commands/s  ({:.2}x raw); per command: {:.2} statements issued, {:.2} sent, {:.2} commits",
            run.rate,
            run.rate / raw,
            run.per_command(run.stats.statements),
            run.per_command(run.stats.server_statements),
            run.per_command(run.stats.commits),
        );
    }
}

async fn bench_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let raw = raw_sqlite_rate(dir.path());
    let store = Store::open(StoreOptions::new(format!(
        "sqlite://{}",
        dir.path().join("store.db").display()
    )))
    .await
    .expect("store");
    let one = lifecycle_rate(&store, 1, ONE_SESSION_COMMANDS, "one").await;
    let many = lifecycle_rate(&store, MANY_SESSIONS, PER_SESSION_COMMANDS, "many").await;
    store.close().await;
    report("sqlite", raw, &one, &many);
}

async fn bench_postgres(url: String) {
    let schema = format!("bench_{}", std::process::id());
    let raw = raw_postgres_rate(&url, &format!("{schema}_raw")).await;
    let mut options = StoreOptions::new(url.clone());
    options.pg_schema = Some(schema.clone());
    options.pg_max_connections = 32;
    let store = Store::open(options).await.expect("store");
    let one = lifecycle_rate(&store, 1, ONE_SESSION_COMMANDS, "one").await;
    let many = lifecycle_rate(&store, MANY_SESSIONS, PER_SESSION_COMMANDS, "many").await;
    store.close().await;
    report("postgres", raw, &one, &many);
    use sqlx::{Connection, Executor};
    if let Ok(mut c) = sqlx::PgConnection::connect(&url).await {
        let _ = c
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; DROP SCHEMA IF EXISTS {schema}_raw CASCADE"
            )))
            .await;
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is accepted and ignored.
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime"),
    );
    rt.block_on(bench_sqlite());
    match std::env::var("HOST_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => rt.block_on(bench_postgres(url)),
        _ => println!("postgres: skipped (HOST_TEST_DATABASE_URL is unset)"),
    }
}
