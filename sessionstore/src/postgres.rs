//! The PostgreSQL backend. Owns the connection pool, the migration lock, the admission
//! listener (`LISTEN/NOTIFY`) and the translation of driver errors. Every write is one
//! transaction that locks the rows it reads (`FOR UPDATE`) and takes its `now` from the
//! database's `clock_timestamp()`, so Hosts with skewed clocks agree on who holds what. A
//! transaction that loses to a deadlock, a serialization failure or a racing insert is re-run
//! from the start, a bounded number of times.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{
    AssertSqlSafe, Connection, Executor, PgConnection, Postgres, Row as _, Transaction, TypeInfo,
    ValueRef,
};
use tokio::sync::broadcast;

use crate::backend::Admission;
use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::{CommandId, SessionId, TenantId};
use crate::sql::{Conn, Dialect, Param, Row, SqlTx, Value};
use crate::store::StoreOptions;

const MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("../migrations/postgres/0001_init.sql"))];
pub(crate) const MAX_TX_ATTEMPTS: usize = 8;
const NOW_SQL: &str = "SELECT (floor(extract(epoch from clock_timestamp()) * 1000))::bigint";

enum Handle {
    Tx(Transaction<'static, Postgres>),
    Plain(PoolConnection<Postgres>),
}

/// A PostgreSQL connection usable by the generic SQL layer.
pub(crate) struct PgConn {
    handle: Handle,
    locking: bool,
    /// Set when a statement failed in a way a re-run may fix.
    retry: bool,
}

/// The transaction type the generic operations run over on PostgreSQL.
pub(crate) type PgTx = SqlTx<PgConn>;

/// How a write transaction ended.
pub(crate) enum WriteEnd<T> {
    Done(StoreResult<T>),
    Retry(StoreError),
}

impl PgConn {
    fn exec(&mut self) -> &mut PgConnection {
        match &mut self.handle {
            Handle::Tx(tx) => tx,
            Handle::Plain(c) => c,
        }
    }

    fn fail(&mut self, e: sqlx::Error) -> StoreError {
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
        rows.iter().map(|r| decode_row(r, entity)).collect()
    }

    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> StoreResult<u64> {
        let q = bind(sqlx::query(AssertSqlSafe(sql.to_owned())), params);
        match q.execute(self.exec()).await {
            Ok(r) => Ok(r.rows_affected()),
            Err(e) => Err(self.fail(e)),
        }
    }
}

/// The PostgreSQL engine.
pub(crate) struct PgEngine {
    pool: PgPool,
    channel: String,
    admissions: broadcast::Sender<Admission>,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
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
    let current: i64 =
        sqlx::query_scalar("SELECT coalesce(max(version), 0)::bigint FROM schema_migrations")
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > latest {
        return Err(StoreError::state(
            "schema",
            format!("version {current}"),
            format!(
                "the database was written by a newer build (schema version {current}); this binary knows up to {latest}. Upgrade hostd or use another database."
            ),
        ));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
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
        Ok(PgEngine {
            pool,
            channel,
            admissions,
            listener: Mutex::new(listener),
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
    pub(crate) async fn begin_write(&self, attempt: usize) -> StoreResult<(PgTx, Millis)> {
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
            conn: PgConn {
                handle: Handle::Tx(tx),
                locking: true,
                retry: false,
            },
        };
        let now: i64 = sqlx::query_scalar(NOW_SQL)
            .fetch_one(stx.conn.exec())
            .await
            .map_err(map_err)?;
        Ok((stx, now))
    }

    /// Commits (or rolls back) a write transaction and says whether to re-run it.
    pub(crate) async fn end_write<T>(&self, stx: PgTx, result: StoreResult<T>) -> WriteEnd<T> {
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
            conn: PgConn {
                handle: Handle::Plain(conn),
                locking: false,
                retry: false,
            },
        })
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
    pub(crate) async fn announce(&self, a: Admission) {
        let payload =
            serde_json::json!([a.tenant.as_str(), a.session.as_str(), a.command.as_str()])
                .to_string();
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
