//! Query plans of the store's lookups of one command by its ids (test support, feature
//! `testing`): the statements the store runs on the hot path, planned by the database as it
//! stands, and a check that each finds its rows through an index on the command's id instead
//! of scanning a session's rows. On PostgreSQL each statement is planned both as a custom plan
//! and as the generic plan a prepared statement may switch to. Owns only the check; never
//! writes (`EXPLAIN` without `ANALYZE` runs nothing).

use sqlx::{AssertSqlSafe, PgConnection, Row as _};

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::model::{CommandRecord, SessionRecord};
use crate::pgexec::map_err;
use crate::sql::{COMMAND_BY_ID, DISPOSITIONS, Dialect, HAS_DISPOSITION, Param, SetStmt, render};

/// One planned statement.
#[derive(Clone, Debug)]
pub struct LookupPlan {
    /// Which statement, and (PostgreSQL) which kind of plan.
    pub statement: String,
    /// The plan as the database prints it.
    pub plan: String,
    /// Why this is not a direct lookup by id, if it is not.
    pub problem: Option<String>,
}

/// A table the statement looks up and the id column the lookup must go through.
pub(crate) type Lookup = (&'static str, &'static str);

/// A statement to plan: its name, text ($N placeholders), parameters, and lookups.
pub(crate) struct Target {
    pub name: &'static str,
    pub sql: String,
    /// PostgreSQL parameter types, in order.
    pub types: Vec<&'static str>,
    pub params: Vec<Param>,
    pub lookups: Vec<Lookup>,
}

/// The statements that look up `rec` (a command of `session`) by its ids on the hot path of
/// `dialect`: PostgreSQL's merged statements and its plain lookups, SQLite's lookup steps.
pub(crate) fn targets(
    dialect: Dialect,
    session: &SessionRecord,
    rec: &CommandRecord,
    now: Millis,
) -> StoreResult<Vec<Target>> {
    const COMMAND: Lookup = ("commands", "command_id");
    const JOURNAL: Lookup = ("journal_records", "runtime_command_id");
    let text = |s: String| Param::Text(Some(s));
    let by_id = vec![
        text(rec.tenant.to_string()),
        text(rec.session.to_string()),
        text(rec.command.to_string()),
    ];
    let rs = session.binding.runtime_session_id.to_text();
    let rc = rec.runtime_command.to_text();
    let mut out = Vec::new();
    if dialect == Dialect::Postgres {
        for (stmt, rows) in crate::merged::samples(session, rec, now) {
            let lookups = match stmt.name {
                "admit" | "transition" => vec![COMMAND],
                "settle" => vec![COMMAND, JOURNAL],
                _ => vec![JOURNAL],
            };
            out.push(Target::set(stmt, rows, lookups)?);
        }
    } else {
        out.push(Target {
            name: "has_disposition",
            sql: render(HAS_DISPOSITION, dialect, false),
            types: vec!["text", "text"],
            params: vec![text(rs.clone()), text(rc.clone())],
            lookups: vec![JOURNAL],
        });
    }
    out.push(Target {
        name: "command",
        sql: render(&COMMAND_BY_ID, dialect, true),
        types: vec!["text", "text", "text"],
        params: by_id,
        lookups: vec![COMMAND],
    });
    out.push(Target {
        name: "dispositions",
        sql: render(&DISPOSITIONS, dialect, false),
        types: vec!["text", "text", "text"],
        params: vec![text(rs), text(rc), text(rec.tenant.to_string())],
        lookups: vec![JOURNAL],
    });
    Ok(out)
}

impl Target {
    /// A set statement with its request rows, as parameters of its arrays.
    pub(crate) fn set(
        stmt: &'static SetStmt,
        rows: Vec<Vec<Param>>,
        lookups: Vec<Lookup>,
    ) -> StoreResult<Target> {
        let mut types = vec!["int8[]"];
        let mut params = Vec::new();
        let mut arrays: Vec<Vec<Param>> = vec![Vec::new(); stmt.columns.len() + 1];
        for (i, row) in rows.into_iter().enumerate() {
            arrays[0].push(Param::Int(Some(i as i64 + 1)));
            if row.len() != stmt.columns.len() {
                return Err(StoreError::integrity(
                    "plan",
                    "a sample row has the wrong width",
                ));
            }
            for (j, p) in row.into_iter().enumerate() {
                arrays[j + 1].push(p);
            }
        }
        for (_, t) in &stmt.columns {
            types.push(match t {
                crate::sql::ColType::Int => "int8[]",
                crate::sql::ColType::Text => "text[]",
                crate::sql::ColType::Blob => "bytea[]",
            });
        }
        for (a, t) in arrays.into_iter().zip(&types) {
            params.push(Param::Text(Some(array_literal(&a, t))));
        }
        Ok(Target {
            name: stmt.name,
            sql: stmt.sql.clone(),
            types,
            params,
            lookups,
        })
    }
}

fn literal(p: &Param) -> String {
    match p {
        Param::Int(None) | Param::Text(None) | Param::Blob(None) => "NULL".to_owned(),
        Param::Int(Some(v)) => v.to_string(),
        Param::Text(Some(t)) => format!("'{}'", t.replace('\'', "''")),
        Param::Blob(Some(b)) => format!("'\\x{}'", hex::encode(b)),
    }
}

/// An array parameter written as SQL (a marker the PostgreSQL side splices in unquoted).
fn array_literal(items: &[Param], ty: &str) -> String {
    let inner: Vec<String> = items.iter().map(literal).collect();
    format!("{ARRAY_MARK}ARRAY[{}]::{ty}", inner.join(", "))
}

const ARRAY_MARK: &str = "\u{0}array:";

fn pg_argument(p: &Param, ty: &str) -> String {
    match p {
        Param::Text(Some(t)) if t.starts_with(ARRAY_MARK) => t[ARRAY_MARK.len()..].to_owned(),
        other => format!("{}::{ty}", literal(other)),
    }
}

/// Plans every target on PostgreSQL, custom and generic.
pub(crate) async fn postgres(
    conn: &mut PgConnection,
    targets: Vec<Target>,
) -> StoreResult<Vec<LookupPlan>> {
    let mut out = Vec::new();
    for t in targets {
        let prepare = format!("PREPARE plan_check ({}) AS {}", t.types.join(", "), t.sql);
        sqlx::raw_sql(AssertSqlSafe(prepare))
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        let args: Vec<String> = t
            .params
            .iter()
            .zip(&t.types)
            .map(|(p, ty)| pg_argument(p, ty))
            .collect();
        for mode in ["custom", "generic"] {
            let explain = format!(
                "SET plan_cache_mode = force_{mode}_plan; EXPLAIN EXECUTE plan_check({})",
                args.join(", ")
            );
            let rows = sqlx::raw_sql(AssertSqlSafe(explain))
                .fetch_all(&mut *conn)
                .await
                .map_err(map_err)?;
            let mut lines = Vec::with_capacity(rows.len());
            for r in &rows {
                lines.push(r.try_get::<String, _>(0).map_err(map_err)?);
            }
            let plan = lines.join("\n");
            out.push(LookupPlan {
                statement: format!("{} ({mode} plan)", t.name),
                problem: pg_problem(&plan, &t.lookups),
                plan,
            });
        }
        sqlx::raw_sql("DEALLOCATE plan_check; RESET plan_cache_mode")
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(out)
}

/// Plans every target on SQLite.
pub(crate) fn sqlite(
    conn: &rusqlite::Connection,
    targets: Vec<Target>,
) -> StoreResult<Vec<LookupPlan>> {
    let mut out = Vec::new();
    for t in targets {
        let sql = format!("EXPLAIN QUERY PLAN {}", t.sql.replace('$', "?"));
        let mut stmt = conn.prepare(&sql).map_err(crate::sqlite::map_err)?;
        let params: Vec<rusqlite::types::Value> = t
            .params
            .iter()
            .map(|p| match p.clone() {
                Param::Int(Some(v)) => rusqlite::types::Value::Integer(v),
                Param::Text(Some(v)) => rusqlite::types::Value::Text(v),
                Param::Blob(Some(v)) => rusqlite::types::Value::Blob(v),
                _ => rusqlite::types::Value::Null,
            })
            .collect();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params))
            .map_err(crate::sqlite::map_err)?;
        let mut lines = Vec::new();
        while let Some(r) = rows.next().map_err(crate::sqlite::map_err)? {
            lines.push(r.get::<_, String>(3).map_err(crate::sqlite::map_err)?);
        }
        let plan = lines.join("\n");
        out.push(LookupPlan {
            statement: t.name.to_owned(),
            problem: sqlite_problem(&plan, &t.lookups),
            plan,
        });
    }
    Ok(out)
}

/// True when `text` names `word` as a whole identifier.
fn mentions(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// A PostgreSQL plan's problem: a sequential scan of a looked-up table, or a scan of it whose
/// conditions do not name the id column.
fn pg_problem(plan: &str, lookups: &[Lookup]) -> Option<String> {
    // Nodes: a header line ("->" or the first line) and the detail lines under it.
    let mut nodes: Vec<(String, Vec<String>)> = Vec::new();
    for (i, line) in plan.lines().enumerate() {
        let t = line.trim_start();
        if i == 0 || t.starts_with("->") {
            nodes.push((t.trim_start_matches("->").trim().to_owned(), Vec::new()));
        } else if let Some(last) = nodes.last_mut() {
            last.1.push(t.to_owned());
        }
    }
    for (table, column) in lookups {
        let mut found = false;
        for (header, details) in &nodes {
            let on_table = header.contains(&format!(" on {table} "))
                || header.ends_with(&format!(" on {table}"));
            if !on_table || !header.contains("Scan") {
                continue;
            }
            found = true;
            if header.starts_with("Seq Scan") {
                return Some(format!(
                    "{header}: scans {table} instead of looking up {column}"
                ));
            }
            let by_id = details.iter().any(|d| {
                (d.starts_with("Index Cond:") || d.starts_with("Recheck Cond:"))
                    && mentions(d, column)
            });
            if !by_id {
                return Some(format!(
                    "{header}: its index conditions do not name {column}"
                ));
            }
        }
        if !found {
            return Some(format!("no scan of {table} in the plan"));
        }
    }
    None
}

/// A SQLite plan's problem: a full scan of a looked-up table, or a search of it that does not
/// use the id column.
fn sqlite_problem(plan: &str, lookups: &[Lookup]) -> Option<String> {
    for (table, column) in lookups {
        let mut found = false;
        for line in plan.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.get(1) != Some(table) {
                continue;
            }
            found = true;
            if words.first() == Some(&"SCAN") {
                return Some(format!(
                    "{line}: scans {table} instead of looking up {column}"
                ));
            }
            if !line.contains(&format!("{column}=")) || !mentions(line, column) {
                return Some(format!("{line}: does not search by {column}"));
            }
        }
        if !found {
            return Some(format!("no search of {table} in the plan"));
        }
    }
    None
}
