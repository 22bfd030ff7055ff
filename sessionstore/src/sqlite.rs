//! The SQLite backend. Owns the database file's connections: exactly one writer connection per
//! process, driven by one thread that groups queued writes into one `BEGIN IMMEDIATE`
//! transaction (each write inside its own savepoint, so one refusal never undoes another), and
//! a small, fixed set of read-only connections, each on a thread of its own. WAL mode; `synchronous=FULL` unless the caller opted
//! into `NORMAL`; a write that finds another process holding the lock waits up to the busy
//! timeout. Results are released to callers only after the transaction commits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{Connection, OpenFlags, params_from_iter};
use tokio::sync::{broadcast, oneshot};

use crate::backend::Admission;
use crate::clock::{Millis, SharedClock};
use crate::error::{StoreError, StoreResult};
use crate::migrations;
use crate::options::{StoreOptions, Synchronous};
use crate::sql::{Conn, Dialect, Param, Row, SetStmt, SqlTx, Value};
use crate::stats::Counters;

/// A connection usable by the generic SQL layer.
pub(crate) struct SqliteConn<'a> {
    conn: &'a Connection,
    counters: &'a Counters,
}

/// The transaction type the generic operations run over on SQLite.
pub(crate) type SqliteTx<'a> = SqlTx<SqliteConn<'a>>;

fn to_sql(p: Param) -> SqlValue {
    match p {
        Param::Int(Some(v)) => SqlValue::Integer(v),
        Param::Text(Some(v)) => SqlValue::Text(v),
        Param::Blob(Some(v)) => SqlValue::Blob(v),
        Param::Int(None) | Param::Text(None) | Param::Blob(None) => SqlValue::Null,
    }
}

fn from_sql(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(r) => Value::Text(format!("{r}")),
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(s) => Value::Text(s.to_owned()),
            Err(_) => Value::Blob(t.to_vec()),
        },
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

pub(crate) fn map_err(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    match &e {
        rusqlite::Error::SqliteFailure(f, msg) => match f.code {
            C::DatabaseBusy | C::DatabaseLocked => StoreError::transient(format!(
                "the database stayed locked past the busy timeout: {}",
                msg.as_deref().unwrap_or("busy")
            )),
            C::ConstraintViolation => StoreError::integrity(
                "database",
                format!(
                    "constraint refused the write: {}",
                    msg.as_deref().unwrap_or("")
                ),
            ),
            // Definite: a retry within a second does not free space; the operator must.
            C::DiskFull => StoreError::unavailable(format!(
                "the disk under the SQLite file is full (free space, then the Host recovers): {}",
                msg.as_deref().unwrap_or("database or disk is full")
            )),
            C::DatabaseCorrupt | C::NotADatabase => {
                StoreError::integrity("database", format!("the database file is damaged: {e}"))
            }
            _ => StoreError::unavailable(format!("sqlite: {e}")),
        },
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::Utf8Error(..) => StoreError::integrity("row", e.to_string()),
        _ => StoreError::unavailable(format!("sqlite: {e}")),
    }
}

impl SqliteConn<'_> {
    /// The connection itself (test support runs raw SQL and plans on it).
    #[cfg(feature = "testing")]
    pub(crate) fn connection(&self) -> &Connection {
        self.conn
    }
}

impl Conn for SqliteConn<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn locking(&self) -> bool {
        false
    }

    async fn query(
        &mut self,
        sql: &str,
        params: Vec<Param>,
        entity: &'static str,
    ) -> StoreResult<Vec<Row>> {
        self.counters.statement();
        self.counters.server_statements(1);
        let mut stmt = self.conn.prepare_cached(sql).map_err(map_err)?;
        let n = stmt.column_count();
        let mut rows = stmt
            .query(params_from_iter(params.into_iter().map(to_sql)))
            .map_err(map_err)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(map_err)? {
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                values.push(from_sql(row.get_ref(i).map_err(map_err)?));
            }
            out.push(Row { values, entity });
        }
        Ok(out)
    }

    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> StoreResult<u64> {
        self.counters.statement();
        self.counters.server_statements(1);
        let mut stmt = self.conn.prepare_cached(sql).map_err(map_err)?;
        let n = stmt
            .execute(params_from_iter(params.into_iter().map(to_sql)))
            .map_err(map_err)?;
        Ok(n as u64)
    }

    async fn query_set(
        &mut self,
        stmt: &'static SetStmt,
        _rows: Vec<Vec<Param>>,
    ) -> StoreResult<Vec<Row>> {
        // The SQL layer runs its SQLite steps instead: set statements are PostgreSQL's.
        Err(StoreError::integrity(
            "database",
            format!("the {} set statement is not SQLite's", stmt.name),
        ))
    }

    fn wrote(&mut self) {}

    fn counters(&self) -> &Counters {
        self.counters
    }
}

/// One queued write: runs inside the group transaction, then learns whether it committed.
trait WriteJob: Send {
    /// Runs the operation; true when it succeeded (its savepoint is kept).
    fn run(&mut self, conn: &Connection, counters: &Counters, now: Millis) -> bool;
    /// Delivers the result: `None` means the transaction committed.
    fn finish(self: Box<Self>, failure: Option<StoreError>);
}

struct TypedJob<T, F> {
    op: Option<F>,
    result: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> WriteJob for TypedJob<T, F>
where
    T: Send + 'static,
    F: for<'a> FnOnce(&mut SqliteTx<'a>, Millis) -> StoreResult<T> + Send + 'static,
{
    fn run(&mut self, conn: &Connection, counters: &Counters, now: Millis) -> bool {
        let Some(op) = self.op.take() else {
            return false;
        };
        let mut tx = SqlTx {
            conn: SqliteConn { conn, counters },
        };
        let result = op(&mut tx, now);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, failure: Option<StoreError>) {
        let this = *self;
        let result = match failure {
            Some(e) => Err(e),
            None => this
                .result
                .unwrap_or_else(|| Err(StoreError::unavailable("the write was never run"))),
        };
        // The caller may have stopped waiting; nothing to do then.
        let _ = this.reply.send(result);
    }
}

/// One queued read: runs on a reader thread, against that thread's connection.
type ReadJob = Box<dyn FnOnce(&Connection, &Counters) + Send>;

/// The read-only connections, each owned by a thread of its own that takes reads from one
/// shared queue. A fixed set of threads: reads never borrow the runtime's blocking pool, whose
/// thread count ratchets up under a steady stream of short jobs (each new thread brings a
/// stack and an allocator arena that a long-running Host never gives back).
struct ReaderPool {
    jobs: Mutex<Option<mpsc::Sender<ReadJob>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl ReaderPool {
    fn start(conns: Vec<Connection>, counters: &Arc<Counters>) -> StoreResult<ReaderPool> {
        let (tx, rx) = mpsc::channel::<ReadJob>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(conns.len());
        for (i, conn) in conns.into_iter().enumerate() {
            let rx = rx.clone();
            let counters = counters.clone();
            let handle = std::thread::Builder::new()
                .name(format!("sqlite-reader-{i}"))
                .spawn(move || reader_loop(conn, &rx, &counters))
                .map_err(|e| {
                    StoreError::unavailable(format!("cannot start a reader thread: {e}"))
                })?;
            threads.push(handle);
        }
        Ok(ReaderPool {
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
        })
    }
}

/// Takes reads from the shared queue until it closes. A read that panics loses only its own
/// answer (its caller sees the reader stop before answering); the thread keeps serving.
fn reader_loop(conn: Connection, jobs: &Mutex<mpsc::Receiver<ReadJob>>, counters: &Counters) {
    loop {
        let job = {
            let rx = match jobs.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            rx.recv()
        };
        let Ok(job) = job else { return };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&conn, counters)));
    }
}

/// The SQLite engine: the writer thread, the readers, and the admission notifier.
pub(crate) struct SqliteEngine {
    jobs: Mutex<Option<mpsc::Sender<Box<dyn WriteJob>>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    readers: ReaderPool,
    clock: SharedClock,
    admissions: broadcast::Sender<Admission>,
    closed: AtomicBool,
    counters: Arc<Counters>,
}

fn parse_path(url: &str) -> StoreResult<PathBuf> {
    match crate::location::StoreLocation::parse(url)? {
        crate::location::StoreLocation::Sqlite(path) => Ok(path),
        crate::location::StoreLocation::Postgres(_) => Err(StoreError::invalid(
            "url",
            "names PostgreSQL, not a SQLite file",
        )),
    }
}

fn configure(conn: &Connection, options: &StoreOptions, writer: bool) -> StoreResult<()> {
    conn.busy_timeout(options.busy_timeout).map_err(map_err)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(map_err)?;
    let sync = match options.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)
        .map_err(map_err)?;
    // A negative cache_size is a bound in KiB rather than in pages.
    let cache_kib = if writer {
        options.sqlite_writer_cache_kib
    } else {
        options.sqlite_reader_cache_kib
    };
    conn.pragma_update(None, "cache_size", -i64::from(cache_kib))
        .map_err(map_err)?;
    if writer {
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(map_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::unavailable(format!(
                "the database refused WAL mode (it is in {mode} mode)"
            )));
        }
    } else {
        conn.pragma_update(None, "query_only", "ON")
            .map_err(map_err)?;
    }
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// The migration runner's steps on the writer connection, before it serves anything (so
/// they run synchronously; `BEGIN IMMEDIATE` takes the file's write lock, which keeps another
/// process's opener out until the commit).
struct SqliteSchema<'c> {
    conn: &'c Connection,
    now: Millis,
}

impl migrations::Schema for SqliteSchema<'_> {
    async fn begin(&mut self) -> StoreResult<()> {
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(map_err)
    }

    async fn create_version_table(&mut self) -> StoreResult<()> {
        self.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
            )
            .map_err(map_err)
    }

    async fn applied(&mut self) -> StoreResult<Vec<i64>> {
        let mut stmt = self
            .conn
            .prepare("SELECT version FROM schema_migrations")
            .map_err(map_err)?;
        let rows = stmt.query_map([], |r| r.get(0)).map_err(map_err)?;
        rows.collect::<Result<_, _>>().map_err(map_err)
    }

    async fn apply(&mut self, sql: &'static str) -> StoreResult<()> {
        self.conn.execute_batch(sql).map_err(map_err)
    }

    async fn record(&mut self, version: i64) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
                rusqlite::params![version, self.now],
            )
            .map(|_| ())
            .map_err(map_err)
    }

    async fn commit(&mut self) -> StoreResult<()> {
        self.conn.execute_batch("COMMIT").map_err(map_err)
    }

    async fn rollback(&mut self) {
        let _ = self.conn.execute_batch("ROLLBACK");
    }
}

fn migrate(conn: &Connection, now: Millis) -> StoreResult<()> {
    futures::executor::block_on(migrations::migrate(
        &mut SqliteSchema { conn, now },
        migrations::SQLITE,
    ))
}

/// Runs a transaction-control statement from the statement cache (the writer runs several per
/// write; parsing each afresh showed in profiles).
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn writer_loop(
    conn: Connection,
    jobs: mpsc::Receiver<Box<dyn WriteJob>>,
    clock: SharedClock,
    max_batch: usize,
    counters: Arc<Counters>,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        counters.server_statements(1);
        if let Err(e) = control(&conn, "BEGIN IMMEDIATE") {
            let err = map_err(e);
            for job in batch {
                job.finish(Some(err.clone()));
            }
            continue;
        }
        let mut broken: Option<StoreError> = None;
        for job in batch.iter_mut() {
            counters.server_statements(2);
            if let Err(e) = control(&conn, "SAVEPOINT op") {
                broken = Some(map_err(e));
                break;
            }
            let ok = job.run(&conn, &counters, clock.now_ms());
            let end = if ok {
                control(&conn, "RELEASE op")
            } else {
                control(&conn, "ROLLBACK TO op").and_then(|()| control(&conn, "RELEASE op"))
            };
            if let Err(e) = end {
                broken = Some(map_err(e));
                break;
            }
        }
        counters.server_statements(1);
        let failure = match broken {
            Some(e) => {
                let _ = control(&conn, "ROLLBACK");
                Some(e)
            }
            None => match control(&conn, "COMMIT") {
                Ok(()) => {
                    counters.commit();
                    None
                }
                Err(e) => {
                    let _ = control(&conn, "ROLLBACK");
                    Some(map_err(e))
                }
            },
        };
        for job in batch {
            job.finish(failure.clone());
        }
    }
}

impl SqliteEngine {
    pub(crate) async fn open(
        options: &StoreOptions,
        counters: Arc<Counters>,
    ) -> StoreResult<SqliteEngine> {
        let path = parse_path(&options.url)?;
        let opts = options.clone();
        let clock = options.clock.clone();
        let (writer_conn, readers) = tokio::task::spawn_blocking(move || -> StoreResult<_> {
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI;
            let conn = Connection::open_with_flags(&path, flags).map_err(|e| {
                StoreError::unavailable(format!(
                    "cannot open the SQLite database at {}: {e}",
                    path.display()
                ))
            })?;
            configure(&conn, &opts, true)?;
            migrate(&conn, opts.clock.now_ms())?;
            let mut readers = Vec::with_capacity(opts.sqlite_readers);
            for _ in 0..opts.sqlite_readers {
                let r = Connection::open_with_flags(
                    &path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(map_err)?;
                configure(&r, &opts, false)?;
                readers.push(r);
            }
            Ok((conn, readers))
        })
        .await
        .map_err(|e| StoreError::unavailable(format!("opening the store failed: {e}")))??;

        let (tx, rx) = mpsc::channel::<Box<dyn WriteJob>>();
        let writer_clock = clock.clone();
        let max_batch = options.max_write_batch;
        let writer_counters = counters.clone();
        let handle = std::thread::Builder::new()
            .name("sessionstore-sqlite-writer".into())
            .spawn(move || writer_loop(writer_conn, rx, writer_clock, max_batch, writer_counters))
            .map_err(|e| StoreError::unavailable(format!("cannot start the writer thread: {e}")))?;
        let readers = ReaderPool::start(readers, &counters)?;
        let (admissions, _) = broadcast::channel(1024);
        Ok(SqliteEngine {
            jobs: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(handle)),
            readers,
            clock,
            admissions,
            closed: AtomicBool::new(false),
            counters,
        })
    }

    fn check_open(&self) -> StoreResult<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("the store is closed"));
        }
        Ok(())
    }

    /// Runs `op` inside the writer's next group transaction; resolves after the commit.
    pub(crate) async fn write<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'a> FnOnce(&mut SqliteTx<'a>, Millis) -> StoreResult<T> + Send + 'static,
    {
        self.check_open()?;
        self.counters.write();
        let (reply, rx) = oneshot::channel();
        let job: Box<dyn WriteJob> = Box::new(TypedJob {
            op: Some(op),
            result: None,
            reply,
        });
        {
            let guard = self
                .jobs
                .lock()
                .map_err(|_| StoreError::unavailable("the writer is poisoned"))?;
            let sender = guard
                .as_ref()
                .ok_or_else(|| StoreError::unavailable("the store is closed"))?;
            sender
                .send(job)
                .map_err(|_| StoreError::unavailable("the writer has stopped"))?;
        }
        rx.await
            .map_err(|_| StoreError::unavailable("the writer stopped before answering"))?
    }

    /// Runs `op` on a read-only connection (on one of the reader threads).
    pub(crate) async fn read<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'a> FnOnce(&mut SqliteTx<'a>) -> StoreResult<T> + Send + 'static,
    {
        self.check_open()?;
        let (reply, rx) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn, counters| {
            let mut tx = SqlTx {
                conn: SqliteConn { conn, counters },
            };
            // The caller may have stopped waiting; nothing to do then.
            let _ = reply.send(op(&mut tx));
        });
        {
            let guard = self
                .readers
                .jobs
                .lock()
                .map_err(|_| StoreError::unavailable("the reader pool is poisoned"))?;
            guard
                .as_ref()
                .ok_or_else(|| StoreError::unavailable("the store is closed"))?
                .send(job)
                .map_err(|_| StoreError::unavailable("the readers have stopped"))?;
        }
        rx.await.map_err(|_| {
            StoreError::unavailable("a read failed: the reader stopped before answering")
        })?
    }

    pub(crate) fn now_ms(&self) -> Millis {
        self.clock.now_ms()
    }

    pub(crate) fn admissions(&self) -> broadcast::Receiver<Admission> {
        self.admissions.subscribe()
    }

    pub(crate) fn announce(&self, a: Admission) {
        // No receivers is fine: wake-ups are hints.
        let _ = self.admissions.send(a);
    }

    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(mut guard) = self.jobs.lock() {
            guard.take();
        }
        let handle = self.writer.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        // Reads already queued still run; the threads then close their connections.
        if let Ok(mut guard) = self.readers.jobs.lock() {
            guard.take();
        }
        let threads = self
            .readers
            .threads
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default();
        if !threads.is_empty() {
            let _ = tokio::task::spawn_blocking(move || {
                for t in threads {
                    let _ = t.join();
                }
            })
            .await;
        }
    }
}
