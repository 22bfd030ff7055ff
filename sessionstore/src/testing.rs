//! Test support (feature `testing`): a store on either backend, isolated per test, so every
//! suite in the workspace can run its cases against SQLite and PostgreSQL alike.
//!
//! PostgreSQL cases read their server from `HOST_TEST_DATABASE_URL` and each gets a fresh
//! schema, dropped when the [`TestStore`] is dropped. When the variable is unset they report
//! themselves skipped on stderr; with `CI=true` an unset variable fails the test instead.
//!
//! Also here, for suites and benches alike: a session to work on ([`new_session`]) and the
//! steps a Host takes around an apply ([`begin_attempt`], [`settle`]). What the workspace's
//! benches share below a Host is [`bench`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::ManualClock;
use crate::error::StoreResult;
use crate::options::StoreOptions;
use crate::store::Store;
use crate::{
    AgentId, CompatibilityId, NewSession, RuntimeSessionId, SessionBinding, SessionId,
    SessionRecord, TenantId, local_binding,
};

pub mod bench;

/// Which backend a test runs against.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TestBackend {
    Sqlite,
    Postgres,
}

/// The PostgreSQL server for tests, or `None` (with a loud notice) when none is configured.
/// Panics when `CI=true` and no server is configured: CI must never skip these cases.
pub fn postgres_url() -> Option<String> {
    match std::env::var("HOST_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "HOST_TEST_DATABASE_URL is unset while CI=true: the PostgreSQL cases must run in CI (.ci/run exports it)"
                );
            }
            // Written to the process's stderr directly, past the test harness's capture, so a
            // skip is visible even when the test passes.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "*** SKIPPED (PostgreSQL): HOST_TEST_DATABASE_URL is unset; set it (e.g. postgres://postgres@127.0.0.1:5432/test) to run this case on PostgreSQL ***"
            );
            None
        }
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A store for one test, on one backend, isolated from every other test.
pub struct TestStore {
    pub store: Store,
    pub backend: TestBackend,
    options: StoreOptions,
    clock: Option<ManualClock>,
    schema: Option<String>,
    pg_url: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestStore {
    /// Opens a fresh store, or `None` when the backend is not available here (PostgreSQL
    /// without `HOST_TEST_DATABASE_URL`, outside CI).
    pub async fn open(backend: TestBackend) -> Option<TestStore> {
        Self::open_with(backend, |_| {}).await
    }

    /// As [`TestStore::open`], letting the caller adjust the options first.
    pub async fn open_with(
        backend: TestBackend,
        adjust: impl FnOnce(&mut StoreOptions),
    ) -> Option<TestStore> {
        match backend {
            TestBackend::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary directory for the test database");
                let path = dir.path().join("store.db");
                let clock = ManualClock::starting_now();
                let mut options = StoreOptions::new(format!("sqlite://{}", path.display()));
                options.clock = std::sync::Arc::new(clock.clone());
                adjust(&mut options);
                let store = Store::open(options.clone())
                    .await
                    .expect("the SQLite test store opens");
                Some(TestStore {
                    store,
                    backend,
                    options,
                    clock: Some(clock),
                    schema: None,
                    pg_url: None,
                    _dir: Some(dir),
                })
            }
            TestBackend::Postgres => {
                let url = postgres_url()?;
                let n = COUNTER.fetch_add(1, Ordering::SeqCst);
                let schema = format!(
                    "t_{}_{}_{:x}",
                    std::process::id(),
                    n,
                    uuid::Uuid::now_v7().as_u128() & 0xffff_ffff
                );
                let mut options = StoreOptions::new(url.clone());
                options.pg_schema = Some(schema.clone());
                options.pg_max_connections = 8;
                adjust(&mut options);
                let store = Store::open(options.clone()).await.expect(
                    "the PostgreSQL test store opens (is HOST_TEST_DATABASE_URL reachable?)",
                );
                Some(TestStore {
                    store,
                    backend,
                    options,
                    clock: None,
                    schema: Some(schema),
                    pg_url: Some(url),
                    _dir: None,
                })
            }
        }
    }

    /// The options this store was opened with.
    pub fn options(&self) -> StoreOptions {
        self.options.clone()
    }

    /// Opens a second, independent store on the same database (its own connections and, on
    /// SQLite, its own writer: what a second process would have).
    pub async fn reopen(&self) -> StoreResult<Store> {
        Store::open(self.options.clone()).await
    }

    /// Moves the store's time forward: the manual clock on SQLite, real time on PostgreSQL
    /// (whose clock is the database's own).
    pub async fn advance(&self, by: Duration) {
        match &self.clock {
            Some(c) => c.advance_ms(i64::try_from(by.as_millis()).unwrap_or(i64::MAX)),
            None => tokio::time::sleep(by).await,
        }
    }

    /// Moves the store's time forward at once, on both backends: the manual clock on SQLite,
    /// the shift over the database's own clock on PostgreSQL (shared by every store
    /// [`TestStore::reopen`] opens, so a fleet of Hosts still reads one time). Expiries can
    /// then be driven without sleeping; the database's clock keeps running underneath, so a
    /// test leaves a margin of a second or so around the instants it relies on.
    pub async fn advance_instantly(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        match &self.clock {
            Some(c) => c.advance_ms(ms),
            None => self.options.pg_clock_shift.advance_ms(ms),
        }
    }

    /// Runs raw SQL against the database (to corrupt rows in integrity tests).
    pub async fn exec_raw(&self, sql: &str) {
        match self.backend {
            TestBackend::Sqlite => {
                let url = self.options.url.clone();
                let sql = sql.to_owned();
                tokio::task::spawn_blocking(move || {
                    let path = url.trim_start_matches("sqlite://");
                    let conn = rusqlite::Connection::open(path).expect("raw connection");
                    conn.busy_timeout(Duration::from_secs(5))
                        .expect("busy timeout");
                    conn.execute_batch(&sql).expect("raw SQL runs");
                })
                .await
                .expect("raw SQL task");
            }
            TestBackend::Postgres => {
                use sqlx::{Connection, Executor};
                let url = self.pg_url.clone().unwrap_or_default();
                let mut conn = sqlx::PgConnection::connect(&url)
                    .await
                    .expect("raw connection");
                let schema = self.schema.clone().unwrap_or_default();
                conn.execute(sqlx::AssertSqlSafe(format!(
                    "SET search_path TO \"{schema}\""
                )))
                .await
                .expect("search path");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
                    .execute(&mut conn)
                    .await
                    .expect("raw SQL runs");
                let _ = conn.close().await;
            }
        }
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        let (Some(schema), Some(url)) = (self.schema.take(), self.pg_url.take()) else {
            return;
        };
        // Drop the schema from a separate thread with its own runtime: Drop cannot await.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                use sqlx::{Connection, Executor};
                if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
                    let _ = conn
                        .execute(sqlx::AssertSqlSafe(format!(
                            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                        )))
                        .await;
                    let _ = conn.close().await;
                }
            });
        })
        .join();
    }
}

/// Generates one test per case per backend: `$module::sqlite::$case` and
/// `$module::postgres::$case`, each calling `$cases::$case(&TestStore)`, and then, with
/// `; after = $check`, `$cases::$check(&TestStore)` on the same store.
#[macro_export]
macro_rules! both_backends {
    ($cases:ident => $($case:ident),+ $(,)?) => {
        $crate::both_backends!($cases => $($case),+ ; after = __nothing_after);
        #[allow(dead_code)]
        async fn __nothing_after(_: &$crate::testing::TestStore) {}
    };
    ($cases:ident => $($case:ident),+ $(,)? ; after = $after:ident) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    use super::$cases as cases;
                    let store = $crate::testing::TestStore::open($crate::testing::TestBackend::Sqlite)
                        .await
                        .expect("SQLite is always available");
                    cases::$case(&store).await;
                    super::$after(&store).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    use super::$cases as cases;
                    let Some(store) = $crate::testing::TestStore::open($crate::testing::TestBackend::Postgres).await else {
                        return;
                    };
                    cases::$case(&store).await;
                    super::$after(&store).await;
                }
            )+
        }
    };
}

/// Creates the session `session` of tenant `tenant` for the agent `assistant` at build
/// `compatibility`, with a fresh local binding. Panics when the store refuses.
pub async fn new_session(
    store: &Store,
    tenant: &str,
    session: &str,
    compatibility: &str,
) -> SessionRecord {
    store
        .create_session(NewSession {
            tenant: TenantId::new(tenant).expect("a tenant id"),
            session: SessionId::new(session).expect("a session id"),
            agent: AgentId::new("assistant").expect("an agent id"),
            compatibility: CompatibilityId::new(compatibility).expect("a compatibility id"),
            binding: SessionBinding {
                runtime_session_id: RuntimeSessionId::mint(),
                storage_binding_id: local_binding(),
                binding_version: 1,
            },
        })
        .await
        .expect("session")
}

/// What a Host does before it hands an admitted command to the runtime: claims `rec` under
/// `residency` and begins an attempt under the runtime's journal `epoch`. Returns the applying
/// record and the attempt.
pub async fn begin_attempt(
    store: &Store,
    rec: &crate::CommandRecord,
    residency: crate::ResidencyEpoch,
    epoch: crate::JournalEpoch,
) -> StoreResult<(crate::CommandRecord, crate::AttemptId)> {
    use crate::*;
    let token = uuid::Uuid::now_v7();
    let claimed = store
        .claim(ClaimRequest {
            tenant: rec.tenant.clone(),
            session: rec.session.clone(),
            command: rec.command.clone(),
            epoch: residency,
            token,
            ttl: Duration::from_secs(60),
            expected_revision: rec.revision,
        })
        .await?;
    let attempt = AttemptId::mint();
    let applying = store
        .begin_attempt(AttemptRequest {
            tenant: rec.tenant.clone(),
            session: rec.session.clone(),
            command: rec.command.clone(),
            epoch: residency,
            claim_token: token,
            attempt,
            journal_epoch: epoch,
            expected_revision: claimed.revision,
        })
        .await?;
    Ok((applying, attempt))
}

/// What a Host does once the runtime recorded the disposition of `applying`: settles it under
/// `residency`. Returns the settled record.
pub async fn settle(
    store: &Store,
    applying: &crate::CommandRecord,
    residency: crate::ResidencyEpoch,
) -> StoreResult<crate::CommandRecord> {
    store
        .settle(crate::SettleRequest {
            tenant: applying.tenant.clone(),
            session: applying.session.clone(),
            command: applying.command.clone(),
            epoch: residency,
            expected_revision: applying.revision,
        })
        .await
}

/// The full command lifecycle as a Host and its runtime drive it, straight on the store:
/// admit → claim → begin attempt → journal application → settle → cursor, `n` times on one
/// session (which must exist). Benchmarks use it as the store's raw lifecycle rate.
pub async fn run_lifecycle(
    store: &Store,
    session: &crate::SessionRecord,
    n: usize,
) -> StoreResult<()> {
    run_lifecycle_as(store, session, "lifecycle-", 0..n).await
}

/// As [`run_lifecycle`], for the commands `{prefix}{i}` of `ids` (so it can run on one session
/// again and again).
pub async fn run_lifecycle_as(
    store: &Store,
    session: &crate::SessionRecord,
    prefix: &str,
    ids: std::ops::Range<usize>,
) -> StoreResult<()> {
    use crate::*;
    let epoch = ResidencyEpoch(1);
    let mut lease = store
        .journal_acquire(
            &session.tenant,
            session.binding.runtime_session_id,
            "lifecycle-runtime",
            Duration::from_secs(600),
        )
        .await?;
    for i in ids {
        let rec = store
            .admit(NewCommand {
                tenant: session.tenant.clone(),
                session: session.session.clone(),
                command: CommandId::new(format!("{prefix}{i}"))?,
                kind: CommandKind::Input,
                body: CommandBody::Inline(b"{\"version\":1,\"text\":\"hello\"}".to_vec()),
                principal: None,
                metadata: None,
                apply_within: Duration::from_secs(3600),
                trace: None,
            })
            .await?;
        let (applying, attempt) = begin_attempt(store, &rec, epoch, lease.epoch).await?;
        lease.tip = store
            .journal_append(
                &lease,
                vec![JournalEntry::Application {
                    identity: rec.identity(),
                    attempt,
                    attempt_epoch: lease.epoch,
                    outcome: ApplicationOutcome::Applied,
                    detail: None,
                }],
            )
            .await?;
        settle(store, &applying, epoch).await?;
        store
            .save_cursor(&session.tenant, &session.session, rec.accepted_order, epoch)
            .await?;
    }
    Ok(())
}

/// Grows `session` by `n` settled commands (`grown-1` … `grown-n`, each applied from an
/// application record in the session's journal), written straight into the tables in one
/// statement each, as if `n` lifecycles had run: acceptance order, cursor and journal tip move
/// on accordingly, and the journal lease is left released. For measuring how the store behaves
/// on a long-lived session without running every lifecycle. The session must be fresh (no
/// commands, no journal yet). The tables are not analysed afterwards: the store must cope with
/// the statistics it took itself.
pub async fn grow_session(
    store: &Store,
    session: &crate::SessionRecord,
    n: u64,
) -> StoreResult<()> {
    let sqlite = store.backend() == crate::BackendKind::Sqlite;
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let (t, s) = (
        quote(session.tenant.as_str()),
        quote(session.session.as_str()),
    );
    let rs = quote(&session.binding.runtime_session_id.to_text());
    // Three families of fresh UUIDs, told apart by their random first 20 hex digits.
    let family = || {
        let u = uuid::Uuid::now_v7().simple().to_string();
        format!("{}-{}-{}-{}-", &u[0..8], &u[8..12], &u[12..16], &u[16..20])
    };
    let (rc, claim, attempt) = (family(), family(), family());
    let (series, hex, empty) = if sqlite {
        (
            format!(
                "(WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {n}) \
                 SELECT i FROM g)"
            ),
            "printf('%012x', g.i)",
            "X''",
        )
    } else {
        (
            format!("(SELECT generate_series(1, {n}) AS i)"),
            "lpad(to_hex(g.i), 12, '0')",
            "''::bytea",
        )
    };
    let empty_digest = crate::sha256_hex(b"");
    let sql = format!(
        "INSERT INTO commands (tenant_id, session_id, command_id, accepted_order, kind, body, \
             object_id, body_digest, body_size, principal, metadata, runtime_command_id, admitted_at, \
             apply_deadline, state, revision, epoch_mark, claim_epoch, claim_token, claim_expires_at, \
             attempt_id, attempt_journal_epoch, attempt_residency_epoch, attempt_at, outcome, reason, \
             evidence_seq, settled_at) \
         SELECT {t}, {s}, 'grown-' || g.i, g.i, 'input', {empty}, NULL, '{empty_digest}', 0, NULL, \
             NULL, '{rc}' || {hex}, 0, 1, 'applied', 4, 1, 1, '{claim}' || {hex}, 1, \
             '{attempt}' || {hex}, 1, 1, 0, 'applied', NULL, g.i + 1, 0 FROM {series} AS g; \
         INSERT INTO journal_records (runtime_session_id, seq, kind, journal_epoch, written_at) \
             VALUES ({rs}, 1, 'fence', 1, 0); \
         INSERT INTO journal_records (runtime_session_id, seq, kind, journal_epoch, written_at, \
             command_id, runtime_command_id, command_kind, attempt_id, attempt_journal_epoch, outcome) \
         SELECT {rs}, g.i + 1, 'application', 1, 0, 'grown-' || g.i, '{rc}' || {hex}, 'input', \
             '{attempt}' || {hex}, 1, 'applied' FROM {series} AS g; \
         INSERT INTO journal_leases (runtime_session_id, tenant_id, epoch, holder, expires_at, tip) \
             VALUES ({rs}, {t}, 1, NULL, NULL, {tip}); \
         UPDATE sessions SET next_order = {next} WHERE tenant_id = {t} AND session_id = {s}; \
         INSERT INTO cursors (tenant_id, session_id, consumed_order, epoch) VALUES ({t}, {s}, {n}, 1);",
        tip = n + 1,
        next = n + 1,
    );
    store.raw_sql_for_tests(&sql).await
}

/// The raw baseline benchmarks compare against: `commits` single-row INSERTs, each its own
/// durable transaction, on a fresh SQLite file at `path` (WAL, `synchronous=FULL`, as the
/// store runs). Returns commits per second.
pub fn raw_sqlite_commit_rate(path: &std::path::Path, commits: usize) -> rusqlite::Result<f64> {
    let conn = rusqlite::Connection::open(path)?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS raw (id INTEGER PRIMARY KEY, v BLOB NOT NULL)")?;
    let mut stmt = conn.prepare("INSERT INTO raw (v) VALUES (?1)")?;
    let start = std::time::Instant::now();
    for i in 0..commits {
        stmt.execute([format!("row-{i}").into_bytes()])?;
    }
    Ok(commits as f64 / start.elapsed().as_secs_f64())
}

/// The same raw baseline on PostgreSQL: one connection, `commits` single-row INSERTs into a
/// table in `schema` (created if missing), each its own transaction. Returns commits per
/// second.
pub async fn raw_postgres_commit_rate(
    url: &str,
    schema: &str,
    commits: usize,
) -> Result<f64, sqlx::Error> {
    use sqlx::{Connection, Executor};
    let mut conn = sqlx::PgConnection::connect(url).await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {schema}; \
         CREATE TABLE IF NOT EXISTS {schema}.raw (id BIGSERIAL PRIMARY KEY, v BYTEA NOT NULL)"
    )))
    .await?;
    let sql = format!("INSERT INTO {schema}.raw (v) VALUES ($1)");
    let start = std::time::Instant::now();
    for i in 0..commits {
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(format!("row-{i}").into_bytes())
            .execute(&mut conn)
            .await?;
    }
    let rate = commits as f64 / start.elapsed().as_secs_f64();
    let _ = conn.close().await;
    Ok(rate)
}
