//! The PostgreSQL backend. Owns the connection pool, the write lanes, the migration lock, the
//! admission listener (`LISTEN/NOTIFY`) and the translation of driver errors.
//!
//! Writes run in transactions that lock the rows they read (`FOR UPDATE`) and take their `now`
//! from the database's `clock_timestamp()`, so Hosts with skewed clocks agree on who holds what.
//! Each write goes to one of a few lanes, chosen by the key of the rows it locks (a session, a
//! runtime session's journal, a Host); a lane owns one connection and runs every write queued
//! on it in one transaction, in key order, with one commit, and answers the callers only after
//! that commit. A write that fails after writing, any statement error, a panic or a retryable
//! commit failure rolls the whole group back, and each of its writes is then re-run alone in
//! its own transaction by its caller; a transaction that loses to a deadlock, a serialization
//! failure or a racing insert is re-run from the start there, a bounded number of times.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{
    AssertSqlSafe, Connection, Executor, PgConnection, Postgres, Row as _, Transaction, TypeInfo,
    ValueRef,
};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::backend::Admission;
use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::{CommandId, HostId, RuntimeSessionId, SessionId, TenantId};
use crate::sql::{Conn, Dialect, Param, Row, SqlTx, Value};
use crate::store::StoreOptions;

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/postgres/0001_init.sql")),
    (
        3,
        include_str!("../migrations/postgres/0003_runnable_packages.sql"),
    ),
];
const MAX_TX_ATTEMPTS: usize = 8;
const NOW_SQL: &str = "SELECT (floor(extract(epoch from clock_timestamp()) * 1000))::bigint";
/// Opens a lane's transaction and reads its `now` in one round trip.
const BEGIN_NOW_SQL: &str =
    "BEGIN; SELECT (floor(extract(epoch from clock_timestamp()) * 1000))::bigint";
const NOTIFY_SQL: &str = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p";

enum Handle {
    Tx(Transaction<'static, Postgres>),
    Plain(PoolConnection<Postgres>),
    /// A lane's own connection (detached from the pool), inside the lane's transaction.
    Lane(PgConnection),
}

/// A PostgreSQL connection usable by the generic SQL layer.
pub(crate) struct PgConn {
    handle: Handle,
    locking: bool,
    /// Set when a statement failed in a way a re-run may fix.
    retry: bool,
    /// Set when any statement failed (the transaction is then aborted).
    failed: bool,
    /// Set when a statement changed at least one row.
    wrote: bool,
}

impl PgConn {
    fn new(handle: Handle, locking: bool) -> PgConn {
        PgConn {
            handle,
            locking,
            retry: false,
            failed: false,
            wrote: false,
        }
    }
}

/// A write operation: runs inside a transaction it is given, owns its inputs (so it can be run
/// again after a rollback) and borrows nothing but the transaction.
pub(crate) type PgOp<T> =
    Arc<dyn for<'a> Fn(&'a mut PgTx, Millis) -> BoxFuture<'a, StoreResult<T>> + Send + Sync>;

/// Wraps a closure as a [`PgOp`] (pins down its higher-ranked signature).
pub(crate) fn pg_op<T, F>(f: F) -> PgOp<T>
where
    F: for<'a> Fn(&'a mut PgTx, Millis) -> BoxFuture<'a, StoreResult<T>> + Send + Sync + 'static,
{
    Arc::new(f)
}

/// Says which admission, if any, a committed result announces.
pub(crate) type Announce<T> = fn(&T) -> Option<Admission>;

/// The key of the rows a write locks. Writes with equal keys go to the same lane (so one
/// session's writes are never in two lanes at once), and a lane runs a group in key order (so
/// two groups, in this process or another, take their row locks in the same order). Every
/// write locks only rows of its own key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) struct WriteKey(u64);

impl WriteKey {
    /// The rows of one session: its catalog row and everything hanging off it.
    pub(crate) fn session(t: &TenantId, s: &SessionId) -> WriteKey {
        WriteKey(fnv1a(&[
            b"session",
            t.as_str().as_bytes(),
            s.as_str().as_bytes(),
        ]))
    }

    /// The journal of one runtime session: its lease row and its records.
    pub(crate) fn journal(rs: RuntimeSessionId) -> WriteKey {
        WriteKey(fnv1a(&[b"journal", rs.uuid().as_bytes()]))
    }

    /// One published runnable release.
    pub(crate) fn package(workspace: &str, name: &str, version: &str) -> WriteKey {
        WriteKey(fnv1a(&[
            b"package",
            workspace.as_bytes(),
            name.as_bytes(),
            version.as_bytes(),
        ]))
    }

    /// One Host's advertisement.
    pub(crate) fn host(h: &HostId) -> WriteKey {
        WriteKey(fnv1a(&[b"host", h.as_str().as_bytes()]))
    }

    fn lane(self, lanes: usize) -> usize {
        ((self.0 ^ (self.0 >> 32)) % lanes as u64) as usize
    }
}

/// 64-bit FNV-1a over the parts, each followed by a byte no UTF-8 text or tag contains. Fixed,
/// so every process orders keys alike.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(std::iter::once(&0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// The transaction type the generic operations run over on PostgreSQL.
pub(crate) type PgTx = SqlTx<PgConn>;

/// How a write transaction ended.
enum WriteEnd<T> {
    Done(StoreResult<T>),
    Retry(StoreError),
}

impl PgConn {
    fn exec(&mut self) -> &mut PgConnection {
        match &mut self.handle {
            Handle::Tx(tx) => tx,
            Handle::Plain(c) => c,
            Handle::Lane(c) => c,
        }
    }

    fn fail(&mut self, e: sqlx::Error) -> StoreError {
        self.failed = true;
        if is_retryable(&e) {
            self.retry = true;
        }
        map_err(e)
    }
}

fn is_retryable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("40001" | "40P01" | "23505"))
        }
        _ => false,
    }
}

pub(crate) fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.to_string()).unwrap_or_default();
            match code.as_str() {
                "23505" => StoreError::state("database", "duplicate", db.message().to_owned()),
                c if c.starts_with("23") => StoreError::integrity(
                    "database",
                    format!("constraint refused the write: {}", db.message()),
                ),
                "40001" | "40P01" => StoreError::unavailable(format!(
                    "the transaction kept losing to concurrent writers: {}",
                    db.message()
                )),
                _ => StoreError::unavailable(format!("postgres: {}", db.message())),
            }
        }
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => StoreError::integrity("row", e.to_string()),
        sqlx::Error::PoolClosed => StoreError::unavailable("the store is closed"),
        _ => StoreError::unavailable(format!("postgres: {e}")),
    }
}

fn bind<'q>(
    mut q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    params: Vec<Param>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    for p in params {
        q = match p {
            Param::Int(v) => q.bind(v),
            Param::Text(v) => q.bind(v),
            Param::Blob(v) => q.bind(v),
        };
    }
    q
}

fn decode_row(row: &PgRow, entity: &'static str) -> StoreResult<Row> {
    let n = row.columns().len();
    let mut values = Vec::with_capacity(n);
    for i in 0..n {
        let raw = row.try_get_raw(i).map_err(map_err)?;
        if raw.is_null() {
            values.push(Value::Null);
            continue;
        }
        let ty = raw.type_info().name().to_owned();
        let v = match ty.as_str() {
            "INT8" => Value::Int(row.try_get::<i64, _>(i).map_err(map_err)?),
            "INT4" => Value::Int(i64::from(row.try_get::<i32, _>(i).map_err(map_err)?)),
            "INT2" => Value::Int(i64::from(row.try_get::<i16, _>(i).map_err(map_err)?)),
            "BOOL" => Value::Int(i64::from(row.try_get::<bool, _>(i).map_err(map_err)?)),
            "TEXT" | "VARCHAR" | "NAME" | "BPCHAR" => {
                Value::Text(row.try_get::<String, _>(i).map_err(map_err)?)
            }
            "BYTEA" => Value::Blob(row.try_get::<Vec<u8>, _>(i).map_err(map_err)?),
            other => {
                return Err(StoreError::integrity(
                    entity,
                    format!("column {i} has unexpected type {other}"),
                ));
            }
        };
        values.push(v);
    }
    Ok(Row { values, entity })
}

impl Conn for PgConn {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn locking(&self) -> bool {
        self.locking
    }

    async fn query(
        &mut self,
        sql: &str,
        params: Vec<Param>,
        entity: &'static str,
    ) -> StoreResult<Vec<Row>> {
        let q = bind(sqlx::query(AssertSqlSafe(sql.to_owned())), params);
        let rows = match q.fetch_all(self.exec()).await {
            Ok(rows) => rows,
            Err(e) => return Err(self.fail(e)),
        };
        // A data-modifying statement with RETURNING changed the rows it returned.
        if !rows.is_empty() && !is_select(sql) {
            self.wrote = true;
        }
        rows.iter().map(|r| decode_row(r, entity)).collect()
    }

    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> StoreResult<u64> {
        let q = bind(sqlx::query(AssertSqlSafe(sql.to_owned())), params);
        match q.execute(self.exec()).await {
            Ok(r) => {
                if r.rows_affected() > 0 {
                    self.wrote = true;
                }
                Ok(r.rows_affected())
            }
            Err(e) => Err(self.fail(e)),
        }
    }
}

fn is_select(sql: &str) -> bool {
    sql.trim_start()
        .get(..6)
        .is_some_and(|w| w.eq_ignore_ascii_case("select"))
}

// ---- write lanes ------------------------------------------------------------------------------

/// How a group ended, for one of its writes.
#[derive(Clone)]
enum Verdict {
    /// The group committed: the write's own result stands.
    Committed,
    /// The group was rolled back (or never began): the caller re-runs the write alone.
    Alone,
    /// The group's fate is unknown: every write in it answers this error.
    Failed(StoreError),
}

/// What a lane answers a caller.
enum LaneReply<T> {
    Done(StoreResult<T>),
    Alone,
}

/// One queued write, with its result type erased.
trait LaneJob: Send {
    fn key(&self) -> WriteKey;
    /// Runs the write inside the group's transaction; true when it succeeded.
    fn run<'a>(&'a mut self, tx: &'a mut PgTx, now: Millis) -> BoxFuture<'a, bool>;
    /// The admission a successful write announces once the group has committed.
    fn admission(&self) -> Option<Admission>;
    /// Answers the caller.
    fn finish(self: Box<Self>, verdict: Verdict);
}

struct TypedLaneJob<T> {
    key: WriteKey,
    op: PgOp<T>,
    announce: Announce<T>,
    result: Option<StoreResult<T>>,
    reply: oneshot::Sender<LaneReply<T>>,
}

impl<T: Send + 'static> LaneJob for TypedLaneJob<T> {
    fn key(&self) -> WriteKey {
        self.key
    }

    fn run<'a>(&'a mut self, tx: &'a mut PgTx, now: Millis) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let result = (self.op)(tx, now).await;
            let ok = result.is_ok();
            self.result = Some(result);
            ok
        })
    }

    fn admission(&self) -> Option<Admission> {
        match &self.result {
            Some(Ok(v)) => (self.announce)(v),
            _ => None,
        }
    }

    fn finish(self: Box<Self>, verdict: Verdict) {
        let this = *self;
        let reply = match verdict {
            Verdict::Committed => match this.result {
                Some(r) => LaneReply::Done(r),
                None => LaneReply::Alone,
            },
            Verdict::Alone => LaneReply::Alone,
            Verdict::Failed(e) => LaneReply::Done(Err(e)),
        };
        // The caller may have stopped waiting; its write stands (or not) all the same.
        let _ = this.reply.send(reply);
    }
}

type LaneSender = mpsc::UnboundedSender<Box<dyn LaneJob>>;

/// One write lane: a connection of its own and the queue it drains.
struct Lane {
    pool: PgPool,
    conn: Option<PgConnection>,
    channel: String,
    max_batch: usize,
}

async fn lane_loop(mut lane: Lane, mut jobs: mpsc::UnboundedReceiver<Box<dyn LaneJob>>) {
    let mut batch: Vec<Box<dyn LaneJob>> = Vec::with_capacity(lane.max_batch);
    while jobs.recv_many(&mut batch, lane.max_batch).await > 0 {
        // A stable sort: one key's writes keep their arrival order.
        batch.sort_by_key(|j| j.key());
        lane.run_group(&mut batch).await;
    }
    if let Some(c) = lane.conn.take() {
        let _ = c.close().await;
    }
}

fn finish_all(batch: &mut Vec<Box<dyn LaneJob>>, verdict: Verdict) {
    for job in batch.drain(..) {
        job.finish(verdict.clone());
    }
}

impl Lane {
    /// The lane's connection: the one it kept, or a fresh one taken from the pool and detached
    /// (so it never goes back to the pool, whatever state it is left in).
    async fn connection(&mut self) -> StoreResult<PgConnection> {
        if let Some(c) = self.conn.take() {
            return Ok(c);
        }
        Ok(self.pool.acquire().await.map_err(map_err)?.detach())
    }

    async fn run_group(&mut self, batch: &mut Vec<Box<dyn LaneJob>>) {
        let conn = match self.connection().await {
            Ok(c) => c,
            Err(e) => return finish_all(batch, Verdict::Failed(e)),
        };
        let mut stx = SqlTx {
            conn: PgConn::new(Handle::Lane(conn), true),
        };
        let now = match begin_group(&mut stx).await {
            Ok(now) => now,
            // The connection may have gone stale while idle: drop it (the server ends whatever
            // it had open) and let each caller run its write alone on a pooled connection.
            Err(_) => return finish_all(batch, Verdict::Alone),
        };
        let mut poisoned = false;
        let mut panicked = false;
        for job in batch.iter_mut() {
            stx.conn.wrote = false;
            match AssertUnwindSafe(job.run(&mut stx, now))
                .catch_unwind()
                .await
            {
                // A refusal that wrote nothing leaves the group as it was.
                Ok(ok) => {
                    if stx.conn.failed || (!ok && stx.conn.wrote) {
                        poisoned = true;
                        break;
                    }
                }
                Err(_) => {
                    poisoned = true;
                    panicked = true;
                    break;
                }
            }
        }
        let Handle::Lane(mut conn) = stx.conn.handle else {
            return finish_all(batch, Verdict::Alone);
        };
        if poisoned {
            // After a panic the connection's state is unknown: dropping it ends the
            // transaction on the server. Otherwise roll back and keep it.
            if !panicked && conn.execute("ROLLBACK").await.is_ok() {
                self.conn = Some(conn);
            }
            return finish_all(batch, Verdict::Alone);
        }
        match conn.execute("COMMIT").await {
            Ok(_) => {
                let payloads: Vec<String> = batch
                    .iter()
                    .filter_map(|j| j.admission())
                    .map(|a| admission_payload(&a))
                    .collect();
                if self.announce(&mut conn, payloads).await {
                    self.conn = Some(conn);
                }
                finish_all(batch, Verdict::Committed);
            }
            Err(e) if is_retryable(&e) => {
                // A failed COMMIT has ended the transaction.
                self.conn = Some(conn);
                finish_all(batch, Verdict::Alone);
            }
            // Whether the group committed is unknown: re-running could apply a write twice.
            Err(e) => finish_all(batch, Verdict::Failed(map_err(e))),
        }
    }

    /// Announces the group's admissions, after its commit and before its callers hear back,
    /// in one statement. False when the connection is no longer fit to keep.
    async fn announce(&self, conn: &mut PgConnection, payloads: Vec<String>) -> bool {
        if payloads.is_empty() {
            return true;
        }
        match sqlx::query(NOTIFY_SQL)
            .bind(&self.channel)
            .bind(payloads)
            .execute(conn)
            .await
        {
            Ok(_) => true,
            // A lost notification only delays a consumer until its next reconcile pass.
            Err(e) => {
                tracing::debug!(error = %e, "admission notifications not sent");
                matches!(e, sqlx::Error::Database(_))
            }
        }
    }
}

/// Begins a lane's transaction and reads the database's `now`, in one round trip.
async fn begin_group(stx: &mut PgTx) -> Result<Millis, sqlx::Error> {
    let rows = sqlx::raw_sql(BEGIN_NOW_SQL)
        .fetch_all(stx.conn.exec())
        .await?;
    let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
    row.try_get::<i64, _>(0)
}

fn admission_payload(a: &Admission) -> String {
    serde_json::json!([a.tenant.as_str(), a.session.as_str(), a.command.as_str()]).to_string()
}

/// The PostgreSQL engine.
pub(crate) struct PgEngine {
    pool: PgPool,
    channel: String,
    admissions: broadcast::Sender<Admission>,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    lanes: Mutex<Option<Vec<LaneSender>>>,
    lane_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    closed: AtomicBool,
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

async fn migrate(pool: &PgPool) -> StoreResult<()> {
    let mut tx = pool.begin().await.map_err(map_err)?;
    // Advisory locks are for migrations only: concurrent openers wait here.
    tx.execute("SELECT pg_advisory_xact_lock(7400740074)")
        .await
        .map_err(map_err)?;
    tx.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
    )
    .await
    .map_err(map_err)?;
    // Applied by set, not by maximum: migrations are independent, so one numbered below an
    // applied one (merged later) is still applied.
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM schema_migrations")
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    if let Some(unknown) = applied
        .iter()
        .find(|v| !MIGRATIONS.iter().any(|m| m.0 == **v))
    {
        return Err(StoreError::state(
            "schema",
            format!("version {unknown}"),
            format!(
                "the database was written by a newer build (schema version {unknown}); this binary knows up to {latest}. Upgrade hostd or use another database."
            ),
        ));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|m| !applied.contains(&m.0)) {
        sqlx::raw_sql(AssertSqlSafe(*sql))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, (floor(extract(epoch from clock_timestamp()) * 1000))::bigint)")
            .bind(version)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
    }
    tx.commit().await.map_err(map_err)
}

impl PgEngine {
    pub(crate) async fn open(options: &StoreOptions) -> StoreResult<PgEngine> {
        let connect: PgConnectOptions = options
            .url
            .parse()
            .map_err(|e| StoreError::invalid("url", format!("is not a PostgreSQL URL: {e}")))?;
        if let Some(schema) = &options.pg_schema {
            let mut c = PgConnection::connect_with(&connect)
                .await
                .map_err(map_err)?;
            c.execute(AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                quote_ident(schema)
            )))
            .await
            .map_err(map_err)?;
            let _ = c.close().await;
        }
        let search_path = options.pg_schema.clone();
        let pool = PgPoolOptions::new()
            .max_connections(options.pg_max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _meta| {
                let search_path = search_path.clone();
                Box::pin(async move {
                    if let Some(schema) = search_path {
                        conn.execute(AssertSqlSafe(format!(
                            "SET search_path TO {}",
                            quote_ident(&schema)
                        )))
                        .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(connect)
            .await
            .map_err(|e| StoreError::unavailable(format!("cannot connect to PostgreSQL: {e}")))?;
        migrate(&pool).await?;

        let channel = format!(
            "sessionstore_admit_{}",
            options.pg_schema.as_deref().unwrap_or("public")
        );
        let (admissions, _) = broadcast::channel(1024);
        let listener = spawn_listener(pool.clone(), channel.clone(), admissions.clone()).await;
        let mut lanes = Vec::with_capacity(options.pg_write_lanes);
        let mut lane_tasks = Vec::with_capacity(options.pg_write_lanes);
        for _ in 0..options.pg_write_lanes {
            let (sender, jobs) = mpsc::unbounded_channel();
            let lane = Lane {
                pool: pool.clone(),
                conn: None,
                channel: channel.clone(),
                max_batch: options.max_write_batch,
            };
            lane_tasks.push(tokio::spawn(lane_loop(lane, jobs)));
            lanes.push(sender);
        }
        Ok(PgEngine {
            pool,
            channel,
            admissions,
            listener: Mutex::new(listener),
            lanes: Mutex::new(Some(lanes)),
            lane_tasks: Mutex::new(lane_tasks),
            closed: AtomicBool::new(false),
        })
    }

    fn check_open(&self) -> StoreResult<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("the store is closed"));
        }
        Ok(())
    }

    /// Opens a write transaction and reads the database's `now`. `attempt` counts re-runs of
    /// the same operation; past the bound the last failure stands.
    async fn begin_write(&self, attempt: usize) -> StoreResult<(PgTx, Millis)> {
        self.check_open()?;
        if attempt >= MAX_TX_ATTEMPTS {
            return Err(StoreError::unavailable(
                "the transaction kept losing to concurrent writers",
            ));
        }
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(2 * attempt as u64)).await;
        }
        let tx = self.pool.begin().await.map_err(map_err)?;
        let mut stx = SqlTx {
            conn: PgConn::new(Handle::Tx(tx), true),
        };
        let now: i64 = sqlx::query_scalar(NOW_SQL)
            .fetch_one(stx.conn.exec())
            .await
            .map_err(map_err)?;
        Ok((stx, now))
    }

    /// Commits (or rolls back) a write transaction and says whether to re-run it.
    async fn end_write<T>(&self, stx: PgTx, result: StoreResult<T>) -> WriteEnd<T> {
        let retry = stx.conn.retry;
        let Handle::Tx(tx) = stx.conn.handle else {
            return WriteEnd::Done(Err(StoreError::unavailable("transaction handle lost")));
        };
        match result {
            Ok(v) => match tx.commit().await {
                Ok(()) => WriteEnd::Done(Ok(v)),
                Err(e) if is_retryable(&e) => WriteEnd::Retry(map_err(e)),
                Err(e) => WriteEnd::Done(Err(map_err(e))),
            },
            Err(e) => {
                let _ = tx.rollback().await;
                if retry {
                    WriteEnd::Retry(e)
                } else {
                    WriteEnd::Done(Err(e))
                }
            }
        }
    }

    /// A pooled connection outside any transaction (no row locks).
    pub(crate) async fn begin_read(&self) -> StoreResult<PgTx> {
        self.check_open()?;
        let conn = self.pool.acquire().await.map_err(map_err)?;
        Ok(SqlTx {
            conn: PgConn::new(Handle::Plain(conn), false),
        })
    }

    /// Runs `op` in the next group transaction of the lane its key maps to; resolves after
    /// that commit. When the group is rolled back, runs `op` alone instead. A committed result
    /// `announce` picks an admission from is announced before this returns.
    pub(crate) async fn write<T: Send + 'static>(
        &self,
        key: WriteKey,
        op: PgOp<T>,
        announce: Announce<T>,
    ) -> StoreResult<T> {
        self.check_open()?;
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn LaneJob> = Box::new(TypedLaneJob {
            key,
            op: op.clone(),
            announce,
            result: None,
            reply,
        });
        let queued = {
            let guard = self
                .lanes
                .lock()
                .map_err(|_| StoreError::unavailable("the write lanes are poisoned"))?;
            let lanes = guard
                .as_ref()
                .ok_or_else(|| StoreError::unavailable("the store is closed"))?;
            lanes[key.lane(lanes.len())].send(job).is_ok()
        };
        if !queued {
            // The lane is gone (it never saw this write): run it alone.
            return self.write_alone(&op, announce).await;
        }
        match answer.await {
            Ok(LaneReply::Done(result)) => result,
            Ok(LaneReply::Alone) => self.write_alone(&op, announce).await,
            Err(_) => Err(StoreError::unavailable(
                "the write lane stopped before answering",
            )),
        }
    }

    /// Runs `op` in a transaction of its own, re-running it a bounded number of times when it
    /// loses to a deadlock, a serialization failure or a racing insert.
    async fn write_alone<T>(&self, op: &PgOp<T>, announce: Announce<T>) -> StoreResult<T> {
        let mut attempt = 0usize;
        let result = loop {
            let (mut tx, now) = self.begin_write(attempt).await?;
            let result = op(&mut tx, now).await;
            match self.end_write(tx, result).await {
                WriteEnd::Done(r) => break r,
                WriteEnd::Retry(err) => {
                    attempt += 1;
                    if attempt >= MAX_TX_ATTEMPTS {
                        break Err(err);
                    }
                }
            }
        };
        if let Ok(v) = &result
            && let Some(a) = announce(v)
        {
            self.announce(a).await;
        }
        result
    }

    pub(crate) async fn now_ms(&self) -> StoreResult<Millis> {
        self.check_open()?;
        sqlx::query_scalar(NOW_SQL)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)
    }

    pub(crate) fn admissions(&self) -> broadcast::Receiver<Admission> {
        self.admissions.subscribe()
    }

    /// Announces an admission to every process listening (after the commit).
    async fn announce(&self, a: Admission) {
        let payload = admission_payload(&a);
        // A lost notification only delays a consumer until its next reconcile pass.
        if let Err(e) = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(&self.channel)
            .bind(payload)
            .execute(&self.pool)
            .await
        {
            tracing::debug!(error = %e, "admission notification not sent");
        }
    }

    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Lanes finish the writes already queued, then close their connections.
        let lanes = self.lanes.lock().ok().and_then(|mut g| g.take());
        drop(lanes);
        let lane_tasks = self
            .lane_tasks
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default();
        for t in lane_tasks {
            let _ = t.await;
        }
        let task = self.listener.lock().ok().and_then(|mut g| g.take());
        if let Some(t) = task {
            t.abort();
            let _ = t.await;
        }
        self.pool.close().await;
    }
}

async fn spawn_listener(
    pool: PgPool,
    channel: String,
    out: broadcast::Sender<Admission>,
) -> Option<tokio::task::JoinHandle<()>> {
    let mut listener = match PgListener::connect_with(&pool).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "admission listener unavailable; consumers will poll");
            return None;
        }
    };
    if let Err(e) = listener.listen(&channel).await {
        tracing::warn!(error = %e, "LISTEN failed; consumers will poll");
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            match listener.recv().await {
                Ok(n) => {
                    let parsed: Option<(String, String, String)> =
                        serde_json::from_str(n.payload()).ok();
                    let Some((t, s, c)) = parsed else { continue };
                    let (Ok(tenant), Ok(session), Ok(command)) =
                        (TenantId::new(t), SessionId::new(s), CommandId::new(c))
                    else {
                        continue;
                    };
                    let _ = out.send(Admission {
                        tenant,
                        session,
                        command,
                    });
                }
                Err(sqlx::Error::PoolClosed) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "admission listener error; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }))
}
