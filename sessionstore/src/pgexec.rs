//! Running statements on one PostgreSQL connection: binding parameters, decoding rows,
//! translating driver errors, running set statements, and the [`Batcher`] through which the
//! concurrent writes of one lane group share their connection. Owns the batcher's queue and
//! answer slots; never opens, commits or rolls back a transaction (the engine and its lanes do).
//!
//! The driver cannot pipeline, so a lane batches by statement instead: the writes of a group
//! queue their statements here and the lane sends them in waves, where every queued request of
//! one set statement becomes one statement (their rows concatenated, numbered by request) and
//! any other statement goes on its own. Round trips per group therefore follow the number of
//! statement kinds in it, not the number of writes.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{AssertSqlSafe, PgConnection, Postgres, Row as _, TypeInfo, ValueRef};

use crate::error::{StoreError, StoreResult};
use crate::sql::{ColType, Param, Row, SetStmt, Value};
use crate::stats::Counters;

pub(crate) fn is_retryable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("40001" | "40P01" | "23505"))
        }
        _ => false,
    }
}

/// SQLSTATEs that pass on their own: connection exceptions (class 08), the server shutting
/// down, crashing or starting (57P01, 57P02, 57P03), too many connections (53300), and losing a
/// serialization race or a deadlock (40001, 40P01).
fn transient_sqlstate(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01"
        )
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
                "40001" | "40P01" => StoreError::transient(format!(
                    "the transaction kept losing to concurrent writers: {}",
                    db.message()
                )),
                c if transient_sqlstate(c) => {
                    StoreError::transient(format!("postgres ({c}): {}", db.message()))
                }
                _ => StoreError::unavailable(format!("postgres: {}", db.message())),
            }
        }
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => StoreError::integrity("row", e.to_string()),
        sqlx::Error::PoolClosed => StoreError::unavailable("the store is closed"),
        // The connection broke (reset, refused, closed mid-statement) or none came free in
        // time: the server may be back a moment later.
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => {
            StoreError::transient(format!("postgres: {e}"))
        }
        _ => StoreError::unavailable(format!("postgres: {e}")),
    }
}

/// Why running a statement failed.
#[derive(Debug)]
pub(crate) enum RunError {
    /// The database (or the connection) refused it.
    Db(sqlx::Error),
    /// The statement's parameters do not fit its declaration (a bug; nothing was sent).
    Shape(String),
}

impl RunError {
    pub(crate) fn retryable(&self) -> bool {
        match self {
            RunError::Db(e) => is_retryable(e),
            RunError::Shape(_) => false,
        }
    }

    pub(crate) fn into_store(self) -> StoreError {
        match self {
            RunError::Db(e) => map_err(e),
            RunError::Shape(what) => StoreError::integrity("database", what),
        }
    }
}

type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

fn bind(mut q: Query<'_>, params: Vec<Param>) -> Query<'_> {
    for p in params {
        q = match p {
            Param::Int(v) => q.bind(v),
            Param::Text(v) => q.bind(v),
            Param::Blob(v) => q.bind(v),
        };
    }
    q
}

pub(crate) fn decode_row(row: &PgRow, entity: &'static str) -> StoreResult<Row> {
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

/// Runs one plain statement and decodes its rows.
pub(crate) async fn query(
    conn: &mut PgConnection,
    sql: &str,
    params: Vec<Param>,
    entity: &'static str,
) -> Result<StoreResult<Vec<Row>>, sqlx::Error> {
    let rows = bind(sqlx::query(AssertSqlSafe(sql.to_owned())), params)
        .fetch_all(conn)
        .await?;
    Ok(rows.iter().map(|r| decode_row(r, entity)).collect())
}

/// Runs one plain statement and counts the rows it changed.
pub(crate) async fn execute(
    conn: &mut PgConnection,
    sql: &str,
    params: Vec<Param>,
) -> Result<u64, sqlx::Error> {
    Ok(bind(sqlx::query(AssertSqlSafe(sql.to_owned())), params)
        .execute(conn)
        .await?
        .rows_affected())
}

/// One array parameter of a set statement.
enum Column {
    Int(Vec<Option<i64>>),
    Text(Vec<Option<String>>),
    Blob(Vec<Option<Vec<u8>>>),
}

/// Runs `stmt` once for all `requests` (each a list of request rows) and answers each its own
/// rows, without the leading request number.
pub(crate) async fn run_set(
    conn: &mut PgConnection,
    stmt: &'static SetStmt,
    requests: Vec<Vec<Vec<Param>>>,
) -> Result<StoreResult<Vec<Vec<Row>>>, RunError> {
    let mut ops: Vec<i64> = Vec::new();
    let mut columns: Vec<Column> = stmt
        .columns
        .iter()
        .map(|(_, t)| match t {
            ColType::Int => Column::Int(Vec::new()),
            ColType::Text => Column::Text(Vec::new()),
            ColType::Blob => Column::Blob(Vec::new()),
        })
        .collect();
    let count = requests.len();
    for (i, rows) in requests.into_iter().enumerate() {
        for row in rows {
            if row.len() != columns.len() {
                return Err(RunError::Shape(format!(
                    "{} takes {} request columns, not {}",
                    stmt.name,
                    columns.len(),
                    row.len()
                )));
            }
            ops.push(i as i64 + 1);
            for (c, p) in columns.iter_mut().zip(row) {
                match (c, p) {
                    (Column::Int(v), Param::Int(x)) => v.push(x),
                    (Column::Text(v), Param::Text(x)) => v.push(x),
                    (Column::Blob(v), Param::Blob(x)) => v.push(x),
                    _ => {
                        return Err(RunError::Shape(format!(
                            "{} was given a parameter of another type",
                            stmt.name
                        )));
                    }
                }
            }
        }
    }
    let mut q = sqlx::query(AssertSqlSafe(stmt.sql.as_str())).bind(ops);
    for c in columns {
        q = match c {
            Column::Int(v) => q.bind(v),
            Column::Text(v) => q.bind(v),
            Column::Blob(v) => q.bind(v),
        };
    }
    let rows = q.fetch_all(conn).await.map_err(RunError::Db)?;
    let mut answers: Vec<Vec<Row>> = (0..count).map(|_| Vec::new()).collect();
    for pg in &rows {
        let mut row = match decode_row(pg, stmt.entity) {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        let op = match row.values.first() {
            Some(Value::Int(op)) if *op >= 1 && (*op as usize) <= count => *op as usize,
            _ => {
                return Ok(Err(StoreError::integrity(
                    "database",
                    format!("{} answered a row for no request", stmt.name),
                )));
            }
        };
        row.values.remove(0);
        answers[op - 1].push(row);
    }
    Ok(Ok(answers))
}

/// What a statement answered.
pub(crate) enum Answer {
    Rows(Vec<Row>),
    Affected(u64),
}

/// A statement waiting in the batcher.
pub(crate) enum Work {
    Query {
        sql: String,
        params: Vec<Param>,
        entity: &'static str,
    },
    Execute {
        sql: String,
        params: Vec<Param>,
    },
    Set {
        stmt: &'static SetStmt,
        rows: Vec<Vec<Param>>,
    },
}

type Slot = Arc<Mutex<Option<StoreResult<Answer>>>>;

struct Request {
    work: Work,
    slot: Slot,
}

/// The statements a lane group's writes are waiting on.
#[derive(Default)]
pub(crate) struct Batcher {
    queue: Mutex<Vec<Request>>,
}

/// A write's wait for its statement's answer. It registers no waker: the lane polls every
/// waiting write again after each wave it sends.
pub(crate) struct Waiting {
    slot: Slot,
}

impl Future for Waiting {
    type Output = StoreResult<Answer>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = match self.slot.lock() {
            Ok(mut guard) => guard.take(),
            Err(_) => Some(Err(StoreError::unavailable("a lane's batcher is poisoned"))),
        };
        match answer {
            Some(a) => Poll::Ready(a),
            None => Poll::Pending,
        }
    }
}

fn answer(slot: &Slot, a: StoreResult<Answer>) {
    if let Ok(mut guard) = slot.lock() {
        *guard = Some(a);
    }
}

impl Batcher {
    /// Queues a statement; the answer arrives after the lane's next wave.
    pub(crate) fn submit(&self, work: Work) -> Waiting {
        let slot: Slot = Arc::new(Mutex::new(None));
        match self.queue.lock() {
            Ok(mut q) => q.push(Request {
                work,
                slot: slot.clone(),
            }),
            Err(_) => answer(
                &slot,
                Err(StoreError::unavailable("a lane's batcher is poisoned")),
            ),
        }
        Waiting { slot }
    }

    /// True when statements are waiting.
    pub(crate) fn pending(&self) -> bool {
        self.queue.lock().map(|q| !q.is_empty()).unwrap_or(true)
    }

    /// Sends every waiting statement as one wave: the requests of one set statement together
    /// (in the order the writes queued them, which is key order), the others one by one. Every
    /// request is answered. The first failure ends the wave: the transaction is then aborted,
    /// and its error is returned for the lane to roll the group back.
    pub(crate) async fn flush(
        &self,
        conn: &mut PgConnection,
        counters: &Counters,
    ) -> Result<(), StoreError> {
        let requests = match self.queue.lock() {
            Ok(mut q) => std::mem::take(&mut *q),
            Err(_) => return Err(StoreError::unavailable("a lane's batcher is poisoned")),
        };
        let mut waves: Vec<Vec<Request>> = Vec::new();
        for r in requests {
            if let Work::Set { stmt, .. } = &r.work
                && let Some(w) = waves.iter_mut().find(
                    |w| matches!(&w[0].work, Work::Set { stmt: s, .. } if std::ptr::eq(*s, *stmt)),
                )
            {
                w.push(r);
                continue;
            }
            waves.push(vec![r]);
        }
        let mut failure: Option<StoreError> = None;
        for group in waves {
            if let Some(e) = &failure {
                for r in group {
                    answer(&r.slot, Err(e.clone()));
                }
                continue;
            }
            counters.server_statements(1);
            if let Err(e) = run_wave(conn, group).await {
                failure = Some(e);
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Runs one statement for one or more requests and answers them.
async fn run_wave(conn: &mut PgConnection, mut group: Vec<Request>) -> Result<(), StoreError> {
    if group.len() == 1
        && !matches!(group[0].work, Work::Set { .. })
        && let Some(r) = group.pop()
    {
        let result = match r.work {
            Work::Query {
                sql,
                params,
                entity,
            } => match query(conn, &sql, params, entity).await {
                Ok(rows) => rows.map(Answer::Rows),
                Err(e) => Err(map_err(e)),
            },
            Work::Execute { sql, params } => match execute(conn, &sql, params).await {
                Ok(n) => Ok(Answer::Affected(n)),
                Err(e) => Err(map_err(e)),
            },
            Work::Set { .. } => Err(StoreError::integrity("database", "misrouted statement")),
        };
        let failed = result.as_ref().err().cloned();
        answer(&r.slot, result);
        return failed.map_or(Ok(()), Err);
    }
    let mut stmt = None;
    let mut requests = Vec::with_capacity(group.len());
    let mut slots = Vec::with_capacity(group.len());
    for r in group {
        match r.work {
            Work::Set { stmt: s, rows } => {
                stmt = Some(s);
                requests.push(rows);
                slots.push(r.slot);
            }
            _ => answer(
                &r.slot,
                Err(StoreError::integrity("database", "misrouted statement")),
            ),
        }
    }
    let Some(stmt) = stmt else {
        return Ok(());
    };
    match run_set(conn, stmt, requests).await {
        Ok(Ok(answers)) => {
            for (slot, rows) in slots.iter().zip(answers) {
                answer(slot, Ok(Answer::Rows(rows)));
            }
            Ok(())
        }
        Ok(Err(e)) => {
            for slot in &slots {
                answer(slot, Err(e.clone()));
            }
            Err(e)
        }
        Err(e) => {
            let e = e.into_store();
            for slot in &slots {
                answer(slot, Err(e.clone()));
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod transient_tests {
    use super::*;

    #[test]
    fn a_broken_connection_or_a_pool_timeout_is_transient_and_a_closed_store_is_not() {
        for kind in [
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            let e = map_err(sqlx::Error::Io(std::io::Error::from(kind)));
            assert!(e.is_transient(), "{kind:?}");
            assert_eq!(e.code(), crate::ErrorCode::Unavailable);
        }
        assert!(map_err(sqlx::Error::PoolTimedOut).is_transient());
        assert!(!map_err(sqlx::Error::PoolClosed).is_transient());
        assert!(!map_err(sqlx::Error::RowNotFound).is_transient());
    }

    #[test]
    fn shutdown_restart_connection_and_serialization_sqlstates_are_transient() {
        for code in [
            "57P01", "57P02", "57P03", "08006", "08001", "53300", "40001", "40P01",
        ] {
            assert!(transient_sqlstate(code), "{code}");
        }
        for code in ["23505", "42P01", "22001", "XX000"] {
            assert!(!transient_sqlstate(code), "{code}");
        }
    }
}
