//! The PostgreSQL backend. Owns the connection pool, the write lanes, the migration lock, the
//! admission listener (`LISTEN/NOTIFY`) and the translation of driver errors.
//!
//! Writes run in transactions that lock the rows they read (`FOR UPDATE`) and take their `now`
//! from the database's `clock_timestamp()`, so Hosts with skewed clocks agree on who holds what.
//! Each write goes to one of a few lanes, chosen by the key of the rows it locks (a session, a
//! runtime session's journal, a Host); a lane owns one connection and runs every write queued
//! on it in one transaction, in key order, with one commit, and answers the callers only after
//! that commit. Within a group, the writes of different keys run concurrently and their
//! statements are sent in waves through a [`Batcher`], one statement per statement kind and
//! wave (the writes of one key run one after another, in arrival order). A write that fails
//! after writing, any statement error, a panic or a retryable commit failure rolls the whole
//! group back, and each of its writes is then re-run alone in its own transaction by its
//! caller; a transaction that loses to a deadlock, a serialization failure or a racing insert
//! is re-run from the start there, a bounded number of times.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, Postgres, Row as _, Transaction};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::backend::Admission;
use crate::clock::{ClockShift, Millis};
use crate::error::{StoreError, StoreResult};
use crate::ids::{CommandId, HostId, RuntimeSessionId, SessionId, TenantId};
use crate::migrations;
use crate::options::StoreOptions;
pub(crate) use crate::pgexec::map_err;
use crate::pgexec::{self, Answer, Batcher, Work, is_retryable};
use crate::sql::{Conn, Dialect, Param, Row, SetStmt, SqlTx};
use crate::stats::Counters;

/// The store's tables: analysed when due (see [`DUE_SQL`]) right after the migrations, at
/// open and every `pg_statistics_interval`, so the planner's statistics follow the tables'
/// growth (a schema is otherwise never analysed while autovacuum is off).
const TABLES: &[&str] = &[
    "sessions",
    "residency_leases",
    "host_registrations",
    "host_targets",
    "commands",
    "cursors",
    "gates",
    "payload_objects",
    "journal_leases",
    "fleet_leaders",
    "placements",
    "journal_records",
    "journal_snapshots",
    "runnable_packages",
    "run_programs",
    "run_status",
    "run_journal",
    "run_checkpoints",
    "run_answers",
    "host_drains",
];
const MAX_TX_ATTEMPTS: usize = 8;
/// How the store's connections plan. Every statement the store runs reads or writes rows by
/// key or by a short key range, where an index lookup is always right; but the planner only
/// knows that from statistics, guesses 10 request rows against a table of 10 pages while a
/// table is young, and keeps the plans it chose then (sequential scans, hash joins) while the
/// table grows. Without those shapes it picks index lookups and nested loops from the start (a
/// query with no index to use still scans). Such a plan is right for any number of requests,
/// so each statement is planned once per connection (the generic plan) rather than on every
/// run, which for the merged statements costs more than running them. And no JIT: a scan the
/// planner cannot avoid is priced at the 10^10 of a disabled plan shape, far above every JIT
/// threshold, and compiling it (with inlining and optimisation) cost a few hundred milliseconds
/// to read a handful of rows.
const PLANNER_SETTINGS: [(&str, &str); 5] = [
    ("enable_seqscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("plan_cache_mode", "force_generic_plan"),
    ("jit", "off"),
];
const NOW_SQL: &str = "SELECT (floor(extract(epoch from clock_timestamp()) * 1000))::bigint";
/// Opens a lane's transaction and reads its `now` in one round trip.
const BEGIN_NOW_SQL: &str =
    "BEGIN; SELECT (floor(extract(epoch from clock_timestamp()) * 1000))::bigint";
const NOTIFY_SQL: &str = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p";

enum Handle {
    Tx(Transaction<'static, Postgres>),
    Plain(PoolConnection<Postgres>),
    /// One write of a lane group: its statements go through the group's batcher, onto the
    /// lane's connection, inside the lane's transaction.
    Batch(Arc<Batcher>),
}

/// A PostgreSQL connection usable by the generic SQL layer.
pub(crate) struct PgConn {
    handle: Handle,
    locking: bool,
    counters: Arc<Counters>,
    /// Set when a statement failed in a way a re-run may fix.
    retry: bool,
    /// Set when any statement failed (the transaction is then aborted).
    failed: bool,
    /// Set when a statement changed at least one row.
    wrote: bool,
}

impl PgConn {
    fn new(handle: Handle, locking: bool, counters: Arc<Counters>) -> PgConn {
        PgConn {
            handle,
            locking,
            counters,
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

    /// The records of one workflow run.
    pub(crate) fn run(run_id: &str) -> WriteKey {
        WriteKey(fnv1a(&[b"run", run_id.as_bytes()]))
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
    /// The connection a statement runs on directly; `None` for a write of a lane group.
    fn direct(&mut self) -> Option<&mut PgConnection> {
        match &mut self.handle {
            Handle::Tx(tx) => Some(tx),
            Handle::Plain(c) => Some(c),
            Handle::Batch(_) => None,
        }
    }

    fn batcher(&self) -> Option<Arc<Batcher>> {
        match &self.handle {
            Handle::Batch(b) => Some(b.clone()),
            _ => None,
        }
    }

    fn fail(&mut self, e: sqlx::Error) -> StoreError {
        self.failed = true;
        if is_retryable(&e) {
            self.retry = true;
        }
        map_err(e)
    }

    /// A statement of a lane group's write failed (the group is rolled back).
    fn failed_in_group(&mut self, e: StoreError) -> StoreError {
        self.failed = true;
        e
    }
}

fn misanswered() -> StoreError {
    StoreError::integrity(
        "database",
        "a statement was answered with the wrong kind of result",
    )
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
        self.counters.statement();
        let rows = if let Some(b) = self.batcher() {
            let work = Work::Query {
                sql: sql.to_owned(),
                params,
                entity,
            };
            match b.submit(work).await {
                Ok(Answer::Rows(rows)) => rows,
                Ok(Answer::Affected(_)) => return Err(self.failed_in_group(misanswered())),
                Err(e) => return Err(self.failed_in_group(e)),
            }
        } else {
            self.counters.server_statements(1);
            let Some(conn) = self.direct() else {
                return Err(misanswered());
            };
            match pgexec::query(conn, sql, params, entity).await {
                Ok(rows) => rows?,
                Err(e) => return Err(self.fail(e)),
            }
        };
        // A data-modifying statement with RETURNING changed the rows it returned.
        if !rows.is_empty() && !is_select(sql) {
            self.wrote = true;
        }
        Ok(rows)
    }

    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> StoreResult<u64> {
        self.counters.statement();
        let n = if let Some(b) = self.batcher() {
            let work = Work::Execute {
                sql: sql.to_owned(),
                params,
            };
            match b.submit(work).await {
                Ok(Answer::Affected(n)) => n,
                Ok(Answer::Rows(_)) => return Err(self.failed_in_group(misanswered())),
                Err(e) => return Err(self.failed_in_group(e)),
            }
        } else {
            self.counters.server_statements(1);
            let Some(conn) = self.direct() else {
                return Err(misanswered());
            };
            match pgexec::execute(conn, sql, params).await {
                Ok(n) => n,
                Err(e) => return Err(self.fail(e)),
            }
        };
        if n > 0 {
            self.wrote = true;
        }
        Ok(n)
    }

    async fn query_set(
        &mut self,
        stmt: &'static SetStmt,
        rows: Vec<Vec<Param>>,
    ) -> StoreResult<Vec<Row>> {
        self.counters.statement();
        if let Some(b) = self.batcher() {
            return match b.submit(Work::Set { stmt, rows }).await {
                Ok(Answer::Rows(rows)) => Ok(rows),
                Ok(Answer::Affected(_)) => Err(self.failed_in_group(misanswered())),
                Err(e) => Err(self.failed_in_group(e)),
            };
        }
        self.counters.server_statements(1);
        let Some(conn) = self.direct() else {
            return Err(misanswered());
        };
        match pgexec::run_set(conn, stmt, vec![rows]).await {
            Ok(answers) => Ok(answers?.pop().unwrap_or_default()),
            Err(e) => {
                self.failed = true;
                if e.retryable() {
                    self.retry = true;
                }
                Err(e.into_store())
            }
        }
    }

    fn wrote(&mut self) {
        self.wrote = true;
    }

    fn counters(&self) -> &Counters {
        &self.counters
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

/// How one write of a group ended.
#[derive(Clone, Copy, Debug)]
struct JobEnd {
    /// The write succeeded.
    ok: bool,
    /// One of its statements failed (the transaction is aborted).
    failed: bool,
    /// It changed rows.
    wrote: bool,
}

impl JobEnd {
    /// A refusal that wrote nothing leaves its group as it was; anything else that failed
    /// spoils the group.
    fn spoils_group(self) -> bool {
        self.failed || (!self.ok && self.wrote)
    }
}

/// One queued write, with its result type erased.
trait LaneJob: Send {
    fn key(&self) -> WriteKey;
    /// Runs the write inside the group's transaction.
    fn run<'a>(&'a mut self, tx: &'a mut PgTx, now: Millis) -> BoxFuture<'a, JobEnd>;
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

    fn run<'a>(&'a mut self, tx: &'a mut PgTx, now: Millis) -> BoxFuture<'a, JobEnd> {
        Box::pin(async move {
            let result = (self.op)(tx, now).await;
            let ok = result.is_ok();
            self.result = Some(result);
            JobEnd {
                ok,
                failed: tx.conn.failed,
                wrote: tx.conn.wrote,
            }
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
    counters: Arc<Counters>,
    shift: ClockShift,
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
        let mut conn = match self.connection().await {
            Ok(c) => c,
            Err(e) => return finish_all(batch, Verdict::Failed(e)),
        };
        self.counters.server_statements(1);
        let now = match begin_group(&mut conn).await {
            Ok(now) => self.shift.apply(now),
            // The connection may have gone stale while idle: drop it (the server ends whatever
            // it had open) and let each caller run its write alone on a pooled connection.
            Err(_) => return finish_all(batch, Verdict::Alone),
        };
        let (poisoned, panicked) = run_jobs(&mut conn, batch, now, &self.counters).await;
        if poisoned {
            // After a panic the connection's state is unknown: dropping it ends the
            // transaction on the server. Otherwise roll back and keep it.
            self.counters.server_statements(1);
            if !panicked && conn.execute("ROLLBACK").await.is_ok() {
                self.conn = Some(conn);
            }
            return finish_all(batch, Verdict::Alone);
        }
        self.counters.server_statements(1);
        match conn.execute("COMMIT").await {
            Ok(_) => {
                self.counters.commit();
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
        self.counters.server_statements(1);
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

/// Runs a group's writes inside the lane's open transaction. Writes of different keys run
/// concurrently, one write per key at a time (in arrival order), so no statement of a wave
/// touches one key twice. Each sweep polls every key's current write until it waits on a
/// statement; the batcher then sends the wave. Returns (poisoned, panicked): a write that
/// spoiled the group, a failed wave or a panic stops the group at once.
async fn run_jobs(
    conn: &mut PgConnection,
    batch: &mut [Box<dyn LaneJob>],
    now: Millis,
    counters: &Arc<Counters>,
) -> (bool, bool) {
    let batcher = Arc::new(Batcher::default());
    // Runs of equal keys (the batch is sorted by key): [start, end) each.
    let mut chains: Vec<(usize, usize)> = Vec::new();
    for (i, job) in batch.iter().enumerate() {
        match chains.last_mut() {
            Some((_, end)) if batch[*end - 1].key() == job.key() => *end = i + 1,
            _ => chains.push((i, i + 1)),
        }
    }
    let mut txs: Vec<PgTx> = (0..batch.len())
        .map(|_| SqlTx {
            conn: PgConn::new(Handle::Batch(batcher.clone()), true, counters.clone()),
        })
        .collect();
    // Nothing runs until polled.
    let mut runs: Vec<Option<BoxFuture<'_, JobEnd>>> = batch
        .iter_mut()
        .zip(txs.iter_mut())
        .map(|(job, tx)| Some(job.run(tx, now)))
        .collect();
    let mut poisoned = false;
    let mut panicked = false;
    loop {
        std::future::poll_fn(|cx| {
            let mut progressed = false;
            for chain in chains.iter_mut() {
                while chain.0 < chain.1 {
                    let Some(run) = runs[chain.0].as_mut() else {
                        break;
                    };
                    match std::panic::catch_unwind(AssertUnwindSafe(|| run.as_mut().poll(cx))) {
                        Ok(Poll::Ready(end)) => {
                            runs[chain.0] = None;
                            progressed = true;
                            if end.spoils_group() {
                                poisoned = true;
                                return Poll::Ready(());
                            }
                            chain.0 += 1;
                        }
                        Ok(Poll::Pending) => break,
                        Err(_) => {
                            runs[chain.0] = None;
                            poisoned = true;
                            panicked = true;
                            return Poll::Ready(());
                        }
                    }
                }
            }
            let done = chains.iter().all(|(next, end)| next == end);
            if progressed || done || batcher.pending() {
                Poll::Ready(())
            } else {
                // Every waiting write waits on something other than a statement; its waker
                // brings the lane back.
                Poll::Pending
            }
        })
        .await;
        if poisoned || chains.iter().all(|(next, end)| next == end) {
            break;
        }
        if !batcher.pending() {
            continue;
        }
        match AssertUnwindSafe(batcher.flush(conn, counters))
            .catch_unwind()
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                poisoned = true;
                break;
            }
            Err(_) => {
                poisoned = true;
                panicked = true;
                break;
            }
        }
    }
    drop(runs);
    (poisoned, panicked)
}

/// Begins a lane's transaction and reads the database's `now`, in one round trip.
async fn begin_group(conn: &mut PgConnection) -> Result<Millis, sqlx::Error> {
    let rows = sqlx::raw_sql(BEGIN_NOW_SQL).fetch_all(conn).await?;
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
    counters: Arc<Counters>,
    statistics: Mutex<Option<tokio::task::JoinHandle<()>>>,
    shift: ClockShift,
}

/// The store's tables due for an analysis: those of at least 10 pages that were never analysed
/// or have changed, since they last were, by autovacuum's own default rule (more than 50 rows
/// plus a tenth of the table). Smaller tables are left alone: for a table never analysed the
/// planner assumes 10 pages, which keeps it on index lookups; statistics taken from a nearly
/// empty table would instead make scans look cheap, and plans cached then would keep scanning
/// as the table grows. The counts are the database's committed changes, so an analysis that
/// ran while a large write was still open is redone once it commits.
const DUE_SQL: &str = "SELECT s.relname::text FROM pg_stat_user_tables s \
     JOIN pg_class c ON c.oid = s.relid \
     WHERE s.schemaname = current_schema() AND s.relname = ANY($1) \
     AND pg_relation_size(c.oid) >= 10 * current_setting('block_size')::bigint \
     AND (c.reltuples < 0 OR s.n_mod_since_analyze > 50 + 0.1 * c.reltuples)";

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// The migration runner's steps on one pooled connection, in one transaction under the
/// migration lock: an advisory lock held until that transaction ends, so concurrent openers
/// of the same database wait for each other here (advisory locks are for migrations only).
struct PgSchema<'p> {
    pool: &'p PgPool,
    tx: Option<Transaction<'static, Postgres>>,
}

impl PgSchema<'_> {
    fn tx(&mut self) -> StoreResult<&mut Transaction<'static, Postgres>> {
        self.tx
            .as_mut()
            .ok_or_else(|| StoreError::unavailable("the migration transaction is not open"))
    }
}

impl migrations::Schema for PgSchema<'_> {
    async fn begin(&mut self) -> StoreResult<()> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        tx.execute("SELECT pg_advisory_xact_lock(7400740074)")
            .await
            .map_err(map_err)?;
        self.tx = Some(tx);
        Ok(())
    }

    async fn create_version_table(&mut self) -> StoreResult<()> {
        self.tx()?
            .execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
            )
            .await
            .map(|_| ())
            .map_err(map_err)
    }

    async fn applied(&mut self) -> StoreResult<Vec<i64>> {
        sqlx::query_scalar("SELECT version FROM schema_migrations")
            .fetch_all(&mut **self.tx()?)
            .await
            .map_err(map_err)
    }

    async fn apply(&mut self, sql: &'static str) -> StoreResult<()> {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut **self.tx()?)
            .await
            .map(|_| ())
            .map_err(map_err)
    }

    async fn record(&mut self, version: i64) -> StoreResult<()> {
        sqlx::query("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, (floor(extract(epoch from clock_timestamp()) * 1000))::bigint)")
            .bind(version)
            .execute(&mut **self.tx()?)
            .await
            .map(|_| ())
            .map_err(map_err)
    }

    async fn commit(&mut self) -> StoreResult<()> {
        match self.tx.take() {
            Some(tx) => tx.commit().await.map_err(map_err),
            None => Err(StoreError::unavailable(
                "the migration transaction is not open",
            )),
        }
    }

    async fn rollback(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.rollback().await;
        }
    }
}

async fn migrate(pool: &PgPool) -> StoreResult<()> {
    let mut schema = PgSchema { pool, tx: None };
    migrations::migrate(&mut schema, migrations::POSTGRES).await
}

/// Why the server named by `connect` could not be reached, saying where: a refused or
/// unresolvable address names its host and port rather than only "pool timed out".
fn unreachable_server(connect: &PgConnectOptions, e: sqlx::Error) -> StoreError {
    let at = format!("{}:{}", connect.get_host(), connect.get_port());
    match &e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            StoreError::unavailable(format!(
                "cannot connect to PostgreSQL: connection refused at {at}"
            ))
        }
        sqlx::Error::Io(io) => {
            StoreError::unavailable(format!("cannot connect to PostgreSQL at {at}: {io}"))
        }
        sqlx::Error::PoolTimedOut => StoreError::unavailable(format!(
            "cannot connect to PostgreSQL at {at}: no connection within the pool's timeout"
        )),
        sqlx::Error::Database(_) => map_err(e),
        _ => StoreError::unavailable(format!("cannot connect to PostgreSQL at {at}: {e}")),
    }
}

impl PgEngine {
    pub(crate) async fn open(
        options: &StoreOptions,
        counters: Arc<Counters>,
    ) -> StoreResult<PgEngine> {
        let mut connect: PgConnectOptions = options
            .url
            .parse::<PgConnectOptions>()
            .map_err(|e| StoreError::invalid("url", format!("is not a PostgreSQL URL: {e}")))?;
        if let Some(name) = &options.pg_application_name {
            connect = connect.application_name(name);
        }
        let connect = connect
            .options(PLANNER_SETTINGS)
            // A client stalled inside a transaction (a frozen process) would hold its row locks
            // for ever and wedge every other Host of the fleet; the server ends such a session.
            .options([(
                "idle_in_transaction_session_timeout",
                format!("{}ms", options.pg_idle_transaction_timeout.as_millis()).as_str(),
            )]);
        // One direct connection first: the pool would retry a refused connect until its
        // acquire timeout and report only that it timed out.
        let mut first = PgConnection::connect_with(&connect)
            .await
            .map_err(|e| unreachable_server(&connect, e))?;
        if let Some(schema) = &options.pg_schema {
            let c = &mut first;
            c.execute(AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                quote_ident(schema)
            )))
            .await
            .map_err(map_err)?;
        }
        let _ = first.close().await;
        let search_path = options.pg_schema.clone();
        let pool = PgPoolOptions::new()
            .max_connections(options.pg_max_connections)
            .acquire_timeout(options.pg_acquire_timeout)
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
            .connect_with(connect.clone())
            .await
            .map_err(|e| unreachable_server(&connect, e))?;
        migrate(&pool).await?;
        // After the migrations (and at every open): the tables with data get statistics.
        analyse_grown(&pool).await?;

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
                counters: counters.clone(),
                shift: options.pg_clock_shift.clone(),
            };
            lane_tasks.push(tokio::spawn(lane_loop(lane, jobs)));
            lanes.push(sender);
        }
        let statistics = tokio::spawn(keep_statistics(
            pool.clone(),
            options.pg_statistics_interval,
        ));
        Ok(PgEngine {
            pool,
            channel,
            admissions,
            listener: Mutex::new(listener),
            lanes: Mutex::new(Some(lanes)),
            lane_tasks: Mutex::new(lane_tasks),
            closed: AtomicBool::new(false),
            counters,
            statistics: Mutex::new(Some(statistics)),
            shift: options.pg_clock_shift.clone(),
        })
    }

    /// Analyses the tables that are due for it; returns their names.
    pub(crate) async fn refresh_statistics(&self) -> StoreResult<Vec<String>> {
        self.check_open()?;
        analyse_grown(&self.pool).await
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
            conn: PgConn::new(Handle::Tx(tx), true, self.counters.clone()),
        };
        self.counters.server_statements(2);
        let Some(conn) = stx.conn.direct() else {
            return Err(misanswered());
        };
        let now: i64 = sqlx::query_scalar(NOW_SQL)
            .fetch_one(conn)
            .await
            .map_err(map_err)?;
        Ok((stx, self.shift.apply(now)))
    }

    /// Commits (or rolls back) a write transaction and says whether to re-run it.
    async fn end_write<T>(&self, stx: PgTx, result: StoreResult<T>) -> WriteEnd<T> {
        let retry = stx.conn.retry;
        let Handle::Tx(tx) = stx.conn.handle else {
            return WriteEnd::Done(Err(StoreError::unavailable("transaction handle lost")));
        };
        self.counters.server_statements(1);
        match result {
            Ok(v) => match tx.commit().await {
                Ok(()) => {
                    self.counters.commit();
                    WriteEnd::Done(Ok(v))
                }
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

    /// A pooled connection for test support (raw SQL, plans).
    #[cfg(feature = "testing")]
    pub(crate) async fn raw_connection(&self) -> StoreResult<PoolConnection<Postgres>> {
        self.check_open()?;
        self.pool.acquire().await.map_err(map_err)
    }

    /// A pooled connection outside any transaction (no row locks).
    pub(crate) async fn begin_read(&self) -> StoreResult<PgTx> {
        self.check_open()?;
        let conn = self.pool.acquire().await.map_err(map_err)?;
        Ok(SqlTx {
            conn: PgConn::new(Handle::Plain(conn), false, self.counters.clone()),
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
        self.counters.write();
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
        let now: i64 = sqlx::query_scalar(NOW_SQL)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(self.shift.apply(now))
    }

    pub(crate) fn admissions(&self) -> broadcast::Receiver<Admission> {
        self.admissions.subscribe()
    }

    /// Announces an admission to every process listening (after the commit).
    pub(crate) async fn announce(&self, a: Admission) {
        let payload = admission_payload(&a);
        self.counters.server_statements(1);
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
        for task in [&self.listener, &self.statistics] {
            let task = task.lock().ok().and_then(|mut g| g.take());
            if let Some(t) = task {
                t.abort();
                let _ = t.await;
            }
        }
        self.pool.close().await;
    }
}

/// Analyses the store's tables that are due for it (see [`DUE_SQL`]); returns their names.
async fn analyse_grown(pool: &PgPool) -> StoreResult<Vec<String>> {
    let mut conn = pool.acquire().await.map_err(map_err)?;
    let grown: Vec<String> = sqlx::query_scalar(DUE_SQL)
        .bind(TABLES)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
    // Only names from TABLES come back.
    let known: Vec<&str> = TABLES
        .iter()
        .copied()
        .filter(|t| grown.iter().any(|g| g == t))
        .collect();
    if !known.is_empty() {
        conn.execute(AssertSqlSafe(format!("ANALYZE {}", known.join(", "))))
            .await
            .map_err(map_err)?;
        tracing::debug!(tables = ?known, "analysed the tables that grew");
    }
    Ok(known.into_iter().map(str::to_owned).collect())
}

/// Keeps the tables' statistics in step with their growth, until the store closes.
async fn keep_statistics(pool: PgPool, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if pool.is_closed() {
            break;
        }
        if let Err(e) = analyse_grown(&pool).await {
            tracing::debug!(error = %e, "checking the tables' statistics failed; retrying later");
        }
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
