//! The hot path's merged statements on PostgreSQL: each command-lifecycle write (admit, a
//! claim/attempt/reject transition, settlement, the cursor, a journal append) as one set
//! statement that reads the rows the operation decides on, locks them, and writes the
//! operation's presumed effect only where the row passes the checks restated in its `WHERE`.
//! Every statement answers the rows as they were (and what it wrote), so the operation in
//! `ops` decides with [`crate::machine`] on exactly what the statement saw and keeps the write
//! only when the two agree. Owns the SQL text and the decoding of these answers; never decides
//! an outcome and never opens or commits a transaction.
//!
//! Every keyed read is a `LATERAL` subquery on the whole key, fenced (`OFFSET 0`, or its row
//! lock) so the planner cannot fold it into a join and reorder it: each request then costs one
//! index probe however young or large the tables are, and the plans the database caches early
//! stay right as the tables grow (`plans` checks them).
//!
//! A statement takes its requests as arrays (`unnest`), so a write lane runs the requests of
//! many operations of one kind as one statement (see `postgres`). Requests of one statement
//! never share a key (the lane runs one write per key at a time), so no row is written twice by
//! one statement.

use std::sync::LazyLock;

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::*;
use crate::journal::JournalLease;
use crate::model::*;
use crate::ops::{Admitted, Appended, CursorRead, Found, JournalRow, SettleRead, Transitioning};
use crate::sql::{
    COMMAND_COLS, ColType, Conn, JLEASE_COLS, JOURNAL_COLS, LEASE_COLS, LEASE_READ, Param, Row,
    SESSION_COLS, SetStmt, SqlTx, command_params, decode_command, decode_journal_lease,
    decode_journal_row, decode_lease, decode_session, int, ms, opt_int, opt_ms, opt_text,
    slot_params, text,
};

/// `list` ("a, b") with every name prefixed by `alias.`.
fn qualified(alias: &str, list: &str) -> String {
    list.split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn width(list: &str) -> usize {
    list.split(',').count()
}

use ColType::{Blob, Int, Text};

/// The columns a transition may change (the rest of a command row never changes once
/// admitted), in `COMMAND_COLS` order from `state` on: a transition's statement answers these
/// for the row it wrote.
const STATE_COLS: &str = "state, revision, epoch_mark, claim_epoch, claim_token, \
     claim_expires_at, attempt_id, attempt_journal_epoch, attempt_residency_epoch, attempt_at, \
     outcome, reason, evidence_seq, settled_at";

/// The row a transition wrote: `before` with the state columns of `r` from `at` on.
fn written(before: &Row, r: &Row, at: usize) -> StoreResult<CommandRecord> {
    let first = width(COMMAND_COLS) - width(STATE_COLS);
    let mut values = before.slice(0, first)?.values;
    values.extend(r.slice(at, width(STATE_COLS))?.values);
    decode_command(&Row {
        values,
        entity: r.entity,
    })
}

/// The command columns as request columns, in `COMMAND_COLS` order.
const COMMAND_REQ: [(&str, ColType); 30] = [
    ("tenant_id", Text),
    ("session_id", Text),
    ("command_id", Text),
    ("accepted_order", Int),
    ("kind", Text),
    ("body", Blob),
    ("object_id", Text),
    ("body_digest", Text),
    ("body_size", Int),
    ("principal", Text),
    ("metadata", Text),
    ("runtime_command_id", Text),
    ("admitted_at", Int),
    ("apply_deadline", Int),
    ("traceparent", Text),
    ("tracestate", Text),
    ("state", Text),
    ("revision", Int),
    ("epoch_mark", Int),
    ("claim_epoch", Int),
    ("claim_token", Text),
    ("claim_expires_at", Int),
    ("attempt_id", Text),
    ("attempt_journal_epoch", Int),
    ("attempt_residency_epoch", Int),
    ("attempt_at", Int),
    ("outcome", Text),
    ("reason", Text),
    ("evidence_seq", Int),
    ("settled_at", Int),
];

// ---- admit ------------------------------------------------------------------------------------

/// Admission: the session's existence, the command already admitted under this id (if any),
/// and otherwise the next acceptance order taken and the command inserted at it.
static ADMIT: LazyLock<SetStmt> = LazyLock::new(|| {
    let mut cols = COMMAND_REQ.to_vec();
    cols.push(("now", Int));
    let inserted = COMMAND_COLS
        .split(',')
        .map(|c| match c.trim() {
            "accepted_order" => "o.accepted_order".to_owned(),
            other => format!("r.{other}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let body = format!(
        "s AS (SELECT r.op FROM req r CROSS JOIN LATERAL (SELECT 1 FROM sessions x \
             WHERE x.tenant_id = r.tenant_id AND x.session_id = r.session_id OFFSET 0) x), \
         ex AS (SELECT r.op, {c} FROM req r CROSS JOIN LATERAL (SELECT {COMMAND_COLS} \
             FROM commands c WHERE c.tenant_id = r.tenant_id AND c.session_id = r.session_id \
             AND c.command_id = r.command_id OFFSET 0) c), \
         o AS (UPDATE sessions x SET next_order = x.next_order + 1, last_active_at = r.now FROM req r \
             WHERE x.tenant_id = r.tenant_id AND x.session_id = r.session_id \
             AND NOT EXISTS (SELECT 1 FROM ex WHERE ex.op = r.op) \
             RETURNING r.op, x.next_order - 1 AS accepted_order), \
         ins AS (INSERT INTO commands ({COMMAND_COLS}) SELECT {inserted} FROM req r JOIN o ON o.op = r.op) \
         SELECT r.op, s.op IS NOT NULL, o.accepted_order, {e} FROM req r \
             LEFT JOIN s ON s.op = r.op LEFT JOIN o ON o.op = r.op LEFT JOIN ex ON ex.op = r.op",
        c = qualified("c", COMMAND_COLS),
        e = qualified("ex", COMMAND_COLS),
    );
    SetStmt::new("admit", "command", &cols, &body)
});

fn admit_rows(rec: &CommandRecord, now: Millis) -> Vec<Vec<Param>> {
    let mut row = command_params(rec);
    row.push(ms(now));
    vec![row]
}

pub(crate) async fn admit<C: Conn>(
    tx: &mut SqlTx<C>,
    rec: &CommandRecord,
    now: Millis,
) -> StoreResult<Admitted> {
    let rows = tx.conn.query_set(&ADMIT, admit_rows(rec, now)).await?;
    let r = one_row(&rows, "admit")?;
    let existing = if r.is_null(2)? {
        None
    } else {
        Some(decode_command(&r.slice(2, width(COMMAND_COLS))?)?)
    };
    let order = r.opt_u64(1)?;
    if order.is_some() {
        tx.conn.wrote();
    }
    Ok(Admitted {
        session: r.bool(0)?,
        existing,
        order,
    })
}

fn one_row<'a>(rows: &'a [Row], what: &str) -> StoreResult<&'a Row> {
    match rows {
        [one] => Ok(one),
        _ => Err(StoreError::integrity(
            "database",
            format!("the {what} statement answered {} rows, not one", rows.len()),
        )),
    }
}

// ---- claim, attempt, reject -------------------------------------------------------------------

/// The checks each transition's `WHERE` restates, over the stored row `o` and the request `r`.
/// Each must imply that `machine` changes the record with this effect (a check missing here
/// only costs a second statement; one the machine does not make is caught and undone).
const CLAIM_GUARD: &str = "o.attempt_id IS NULL AND o.state IN ('pending','claimed') \
     AND NOT (o.state = 'claimed' AND o.claim_epoch IS NOT DISTINCT FROM r.claim_epoch \
              AND o.claim_token IS NOT DISTINCT FROM r.claim_token) \
     AND r.now < o.apply_deadline \
     AND NOT coalesce(o.claim_expires_at > r.now AND o.claim_epoch = r.claim_epoch, false)";
const ATTEMPT_GUARD: &str = "o.attempt_id IS NULL AND o.state = 'claimed' \
     AND o.claim_epoch = r.epoch_mark AND o.claim_token = r.token AND o.claim_expires_at > r.now \
     AND r.now < o.apply_deadline AND r.attempt_journal_epoch >= 1";
const REJECT_GUARD: &str = "o.attempt_id IS NULL AND o.state IN ('pending','claimed')";
/// `machine::residency_fence` over the session's lease `z` (absent: all NULL), for claims and
/// attempts: no lease, one at a lower epoch, or a live one at this epoch.
const RESIDENCY_GUARD: &str = "(z.epoch IS NULL OR z.epoch < r.epoch_mark \
     OR (z.epoch = r.epoch_mark AND z.holder IS NOT NULL AND z.expires_at > r.now))";

/// One statement for the three transitions a Host makes before and at dispatch. The effect's
/// unset columns are NULL in the request and keep their stored values.
static TRANSITION: LazyLock<SetStmt> = LazyLock::new(|| {
    let cols = [
        ("kind", Text),
        ("tenant_id", Text),
        ("session_id", Text),
        ("command_id", Text),
        ("expected", Int),
        ("now", Int),
        ("token", Text),
        ("state", Text),
        ("epoch_mark", Int),
        ("claim_epoch", Int),
        ("claim_token", Text),
        ("claim_expires_at", Int),
        ("attempt_id", Text),
        ("attempt_journal_epoch", Int),
        ("attempt_residency_epoch", Int),
        ("attempt_at", Int),
        ("outcome", Text),
        ("reason", Text),
    ];
    let body = format!(
        "old AS (SELECT r.op, {c} FROM req r CROSS JOIN LATERAL (SELECT {COMMAND_COLS} \
             FROM commands c WHERE c.tenant_id = r.tenant_id AND c.session_id = r.session_id \
             AND c.command_id = r.command_id FOR UPDATE) c), \
         lz AS (SELECT r.op, {l} FROM req r CROSS JOIN LATERAL (SELECT {lr} \
             FROM residency_leases l WHERE l.tenant_id = r.tenant_id \
             AND l.session_id = r.session_id AND r.kind IN ('claim','attempt') OFFSET 0) l), \
         upd AS (UPDATE commands w SET state = r.state, epoch_mark = r.epoch_mark, \
             revision = o.revision + 1, \
             claim_epoch = coalesce(r.claim_epoch, w.claim_epoch), \
             claim_token = coalesce(r.claim_token, w.claim_token), \
             claim_expires_at = coalesce(r.claim_expires_at, w.claim_expires_at), \
             attempt_id = coalesce(r.attempt_id, w.attempt_id), \
             attempt_journal_epoch = coalesce(r.attempt_journal_epoch, w.attempt_journal_epoch), \
             attempt_residency_epoch = coalesce(r.attempt_residency_epoch, w.attempt_residency_epoch), \
             attempt_at = coalesce(r.attempt_at, w.attempt_at), \
             outcome = coalesce(r.outcome, w.outcome), \
             reason = coalesce(r.reason, w.reason) \
             FROM old o JOIN req r ON r.op = o.op LEFT JOIN lz z ON z.op = o.op \
             WHERE w.tenant_id = o.tenant_id AND w.session_id = o.session_id \
             AND w.command_id = o.command_id AND w.revision = o.revision \
             AND o.revision = r.expected AND o.epoch_mark <= r.epoch_mark \
             AND CASE r.kind WHEN 'claim' THEN ({CLAIM_GUARD}) AND {RESIDENCY_GUARD} \
                 WHEN 'attempt' THEN ({ATTEMPT_GUARD}) AND {RESIDENCY_GUARD} \
                 WHEN 'reject' THEN ({REJECT_GUARD}) ELSE false END \
             RETURNING o.op, {w}) \
         SELECT o.op, {oc}, {uc}, {zc} FROM old o LEFT JOIN upd u ON u.op = o.op \
             LEFT JOIN lz z ON z.op = o.op",
        c = qualified("c", COMMAND_COLS),
        l = qualified("l", LEASE_COLS),
        lr = LEASE_READ.as_str(),
        zc = qualified("z", LEASE_COLS),
        w = qualified("w", STATE_COLS),
        oc = qualified("o", COMMAND_COLS),
        uc = qualified("u", STATE_COLS),
    );
    SetStmt::new("transition", "command", &cols, &body)
});

fn transition_rows(step: &Transitioning<'_>) -> Vec<Vec<Param>> {
    let e = step.effect;
    vec![vec![
        text(step.kind.as_str()),
        text(step.tenant.as_str()),
        text(step.session.as_str()),
        text(step.command.as_str()),
        int(step.expected_revision),
        ms(step.now),
        opt_text(step.token.map(|t| t.hyphenated().to_string())),
        text(e.state.as_str()),
        int(e.epoch_mark.0),
        opt_int(e.claim.as_ref().map(|c| c.epoch.0)),
        opt_text(e.claim.as_ref().map(|c| c.token.hyphenated().to_string())),
        opt_ms(e.claim.as_ref().map(|c| c.expires_at_ms)),
        opt_text(e.attempt.as_ref().map(|a| a.id.to_text())),
        opt_int(e.attempt.as_ref().map(|a| a.journal_epoch.0)),
        opt_int(e.attempt.as_ref().map(|a| a.residency_epoch.0)),
        opt_ms(e.attempt.as_ref().map(|a| a.begun_at_ms)),
        opt_text(e.outcome.map(|o| o.as_str().to_owned())),
        opt_text(e.reason.clone()),
    ]]
}

pub(crate) async fn transition<C: Conn>(
    tx: &mut SqlTx<C>,
    step: &Transitioning<'_>,
) -> StoreResult<Option<Found>> {
    let rows = tx
        .conn
        .query_set(&TRANSITION, transition_rows(step))
        .await?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let n = width(COMMAND_COLS);
    let old = r.slice(0, n)?;
    let before = decode_command(&old)?;
    let written = if r.is_null(n)? {
        None
    } else {
        tx.conn.wrote();
        Some(written(&old, r, n)?)
    };
    let at = n + width(STATE_COLS);
    let residency = if r.is_null(at)? {
        None
    } else {
        Some(decode_lease(&r.slice(at, width(LEASE_COLS))?)?)
    };
    Ok(Some(Found {
        before,
        written,
        residency,
    }))
}

// ---- settle -----------------------------------------------------------------------------------

/// Settlement from the store's own journal: the session, the command (locked), the journal's
/// dispositions of the command (only while this tenant owns that journal), and the terminal
/// state written where exactly one disposition matches the attempt. The outcome-to-state
/// mapping is generated from [`Disposition`] itself.
static SETTLE: LazyLock<SetStmt> = LazyLock::new(|| {
    let cols = [
        ("tenant_id", Text),
        ("session_id", Text),
        ("command_id", Text),
        ("expected", Int),
        ("epoch", Int),
        ("now", Int),
    ];
    let state = Disposition::ALL
        .iter()
        .map(|d| {
            format!(
                "WHEN '{}' THEN '{}'",
                d.as_str(),
                d.terminal_state().as_str()
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    let outcome = Disposition::ALL
        .iter()
        .map(|d| format!("WHEN '{}' THEN '{}'", d.as_str(), d.outcome().as_str()))
        .collect::<Vec<_>>()
        .join(" ");
    let body = format!(
        "s AS (SELECT r.op, {x} FROM req r CROSS JOIN LATERAL (SELECT {SESSION_COLS} \
             FROM sessions x WHERE x.tenant_id = r.tenant_id AND x.session_id = r.session_id \
             OFFSET 0) x), \
         old AS (SELECT r.op, {c} FROM req r CROSS JOIN LATERAL (SELECT {COMMAND_COLS} \
             FROM commands c WHERE c.tenant_id = r.tenant_id AND c.session_id = r.session_id \
             AND c.command_id = r.command_id FOR UPDATE) c), \
         ev AS (SELECT o.op, {j} FROM old o JOIN s ON s.op = o.op CROSS JOIN LATERAL \
             (SELECT {JOURNAL_COLS} FROM journal_records j \
             WHERE j.runtime_session_id = s.runtime_session_id \
             AND j.runtime_command_id = o.runtime_command_id AND j.kind IN ('application','closure') \
             AND EXISTS (SELECT 1 FROM journal_leases l \
                 WHERE l.runtime_session_id = s.runtime_session_id AND l.tenant_id = o.tenant_id) \
             OFFSET 0) j), \
         upd AS (UPDATE commands w SET state = CASE e.outcome {state} END, \
             outcome = CASE e.outcome {outcome} END, evidence_seq = e.seq, settled_at = r.now, \
             epoch_mark = r.epoch, revision = o.revision + 1 \
             FROM old o JOIN req r ON r.op = o.op JOIN ev e ON e.op = o.op \
             WHERE w.tenant_id = o.tenant_id AND w.session_id = o.session_id \
             AND w.command_id = o.command_id AND w.revision = o.revision \
             AND o.revision = r.expected AND o.epoch_mark <= r.epoch AND o.state = 'applying' \
             AND (SELECT count(*) FROM ev e2 WHERE e2.op = o.op) = 1 \
             AND e.command_id = o.command_id AND e.command_kind = o.kind \
             AND e.attempt_id = o.attempt_id AND e.attempt_journal_epoch = o.attempt_journal_epoch \
             AND CASE WHEN e.outcome = 'not_applied' THEN e.journal_epoch > o.attempt_journal_epoch \
                 ELSE e.journal_epoch = o.attempt_journal_epoch END \
             RETURNING o.op, {w}) \
         SELECT r.op, {sx}, {oc}, {uc}, {ec} FROM req r LEFT JOIN s ON s.op = r.op \
             LEFT JOIN old o ON o.op = r.op LEFT JOIN upd u ON u.op = r.op \
             LEFT JOIN ev e ON e.op = r.op ORDER BY r.op, e.seq",
        x = qualified("x", SESSION_COLS),
        c = qualified("c", COMMAND_COLS),
        j = qualified("j", JOURNAL_COLS),
        w = qualified("w", STATE_COLS),
        sx = qualified("s", SESSION_COLS),
        oc = qualified("o", COMMAND_COLS),
        uc = qualified("u", STATE_COLS),
        ec = qualified("e", JOURNAL_COLS),
    );
    SetStmt::new("settle", "command", &cols, &body)
});

fn settle_rows(req: &SettleRequest, now: Millis) -> Vec<Vec<Param>> {
    vec![vec![
        text(req.tenant.as_str()),
        text(req.session.as_str()),
        text(req.command.as_str()),
        int(req.expected_revision),
        int(req.epoch.0),
        ms(now),
    ]]
}

pub(crate) async fn settle<C: Conn>(
    tx: &mut SqlTx<C>,
    req: &SettleRequest,
    now: Millis,
) -> StoreResult<SettleRead> {
    let rows = tx.conn.query_set(&SETTLE, settle_rows(req, now)).await?;
    let (ns, nc, nj) = (
        width(SESSION_COLS),
        width(COMMAND_COLS),
        width(JOURNAL_COLS),
    );
    let mut read = SettleRead {
        session: None,
        before: None,
        evidence: Vec::new(),
        written: None,
    };
    for (i, r) in rows.iter().enumerate() {
        if i == 0 {
            if !r.is_null(0)? {
                read.session = Some(decode_session(&r.slice(0, ns)?)?);
            }
            if !r.is_null(ns)? {
                let old = r.slice(ns, nc)?;
                read.before = Some(decode_command(&old)?);
                if !r.is_null(ns + nc)? {
                    tx.conn.wrote();
                    read.written = Some(written(&old, r, ns + nc)?);
                }
            }
        }
        let at = ns + nc + width(STATE_COLS);
        if !r.is_null(at)? {
            read.evidence.push(decode_journal_row(&r.slice(at, nj)?)?);
        }
    }
    Ok(read)
}

// ---- cursor -----------------------------------------------------------------------------------

/// The cursor save: the session's existence, the stored cursor (locked), and the new position
/// written only where it neither lowers the epoch nor regresses the order nor repeats it.
static CURSOR: LazyLock<SetStmt> = LazyLock::new(|| {
    let cols = [
        ("tenant_id", Text),
        ("session_id", Text),
        ("consumed_order", Int),
        ("epoch", Int),
    ];
    let body = "s AS (SELECT r.op FROM req r CROSS JOIN LATERAL (SELECT 1 FROM sessions x \
             WHERE x.tenant_id = r.tenant_id AND x.session_id = r.session_id OFFSET 0) x), \
         old AS (SELECT r.op, k.consumed_order, k.epoch FROM req r CROSS JOIN LATERAL \
             (SELECT k.consumed_order, k.epoch FROM cursors k \
             WHERE k.tenant_id = r.tenant_id AND k.session_id = r.session_id FOR UPDATE) k), \
         up AS (INSERT INTO cursors AS k (tenant_id, session_id, consumed_order, epoch) \
             SELECT r.tenant_id, r.session_id, r.consumed_order, r.epoch FROM req r JOIN s ON s.op = r.op \
             ON CONFLICT (tenant_id, session_id) DO UPDATE \
             SET consumed_order = excluded.consumed_order, epoch = excluded.epoch \
             WHERE k.epoch <= excluded.epoch AND k.consumed_order <= excluded.consumed_order \
             AND (k.epoch, k.consumed_order) IS DISTINCT FROM (excluded.epoch, excluded.consumed_order) \
             RETURNING k.tenant_id, k.session_id) \
         SELECT r.op, s.op IS NOT NULL, o.consumed_order, o.epoch, u.tenant_id IS NOT NULL \
             FROM req r LEFT JOIN s ON s.op = r.op LEFT JOIN old o ON o.op = r.op \
             LEFT JOIN up u ON u.tenant_id = r.tenant_id AND u.session_id = r.session_id";
    SetStmt::new("cursor", "cursor", &cols, body)
});

pub(crate) async fn cursor<C: Conn>(
    tx: &mut SqlTx<C>,
    t: &TenantId,
    s: &SessionId,
    order: u64,
    epoch: ResidencyEpoch,
) -> StoreResult<CursorRead> {
    let row = vec![text(t.as_str()), text(s.as_str()), int(order), int(epoch.0)];
    let rows = tx.conn.query_set(&CURSOR, vec![row]).await?;
    let r = one_row(&rows, "cursor")?;
    let current = match (r.opt_u64(1)?, r.opt_u64(2)?) {
        (Some(consumed_order), Some(e)) => Some(Cursor {
            consumed_order,
            epoch: ResidencyEpoch(e),
        }),
        (None, None) => None,
        _ => return Err(StoreError::integrity("cursor", "partial cursor row")),
    };
    let wrote = r.bool(3)?;
    if wrote {
        tx.conn.wrote();
    }
    Ok(CursorRead {
        session: r.bool(0)?,
        current,
        wrote,
    })
}

// ---- journal append ---------------------------------------------------------------------------

/// An append of inline records: the journal lease (locked), any disposition the journal
/// already holds for an application being appended, and, where the writer still holds the
/// lease at its tip and no such disposition exists, the records inserted and the tip moved.
static APPEND: LazyLock<SetStmt> = LazyLock::new(|| {
    let cols = [
        ("tenant_id", Text),
        ("lease_epoch", Int),
        ("holder", Text),
        ("expected_tip", Int),
        ("runtime_session_id", Text),
        ("seq", Int),
        ("kind", Text),
        ("journal_epoch", Int),
        ("written_at", Int),
        ("event_id", Text),
        ("public_body", Blob),
        ("public_object_id", Text),
        ("private_body", Blob),
        ("private_object_id", Text),
        ("cause_runtime_command", Text),
        ("command_id", Text),
        ("runtime_command_id", Text),
        ("command_kind", Text),
        ("attempt_id", Text),
        ("attempt_journal_epoch", Int),
        ("outcome", Text),
        ("detail", Blob),
    ];
    let body = format!(
        "a AS (SELECT DISTINCT r.op, r.runtime_session_id, r.tenant_id, r.lease_epoch, r.holder, \
             r.expected_tip FROM req r), \
         l AS (SELECT a.op, {lj} FROM a CROSS JOIN LATERAL (SELECT {JLEASE_COLS} \
             FROM journal_leases j WHERE j.runtime_session_id = a.runtime_session_id FOR UPDATE) j), \
         d AS (SELECT r.op, min(x.runtime_command_id) AS runtime_command_id FROM req r \
             CROSS JOIN LATERAL (SELECT x.runtime_command_id FROM journal_records x \
             WHERE x.runtime_session_id = r.runtime_session_id \
             AND x.runtime_command_id = r.runtime_command_id AND x.kind IN ('application','closure') \
             OFFSET 0) x \
             WHERE r.kind IN ('application','closure') GROUP BY r.op), \
         ok AS (SELECT a.op, a.runtime_session_id FROM a JOIN l ON l.op = a.op \
             WHERE l.tenant_id = a.tenant_id AND l.epoch = a.lease_epoch AND l.holder = a.holder \
             AND l.tip = a.expected_tip AND NOT EXISTS (SELECT 1 FROM d WHERE d.op = a.op)), \
         ins AS (INSERT INTO journal_records ({JOURNAL_COLS}) SELECT {rj} FROM req r \
             JOIN ok ON ok.op = r.op), \
         upd AS (UPDATE journal_leases j SET tip = t.tip \
             FROM (SELECT r.op, max(r.seq) AS tip FROM req r GROUP BY r.op) t \
             JOIN ok ON ok.op = t.op WHERE j.runtime_session_id = ok.runtime_session_id \
             RETURNING t.op, j.tip) \
         SELECT a.op, {ll}, d.runtime_command_id, u.tip FROM a LEFT JOIN l ON l.op = a.op \
             LEFT JOIN d ON d.op = a.op LEFT JOIN upd u ON u.op = a.op",
        lj = qualified("j", JLEASE_COLS),
        rj = qualified("r", JOURNAL_COLS),
        ll = qualified("l", JLEASE_COLS),
    );
    SetStmt::new("append", "journal", &cols, &body)
});

fn append_rows(lease: &JournalLease, records: &[JournalRow]) -> Vec<Vec<Param>> {
    records
        .iter()
        .map(|row| {
            let (pub_body, pub_obj) = slot_params(&row.public_body);
            let (priv_body, priv_obj) = slot_params(&row.private_body);
            vec![
                text(lease.tenant.as_str()),
                int(lease.epoch.0),
                text(lease.holder.clone()),
                int(lease.tip),
                text(row.runtime_session.to_text()),
                int(row.seq),
                text(row.kind.as_str()),
                int(row.epoch.0),
                ms(row.written_at_ms),
                opt_text(row.event.as_ref().map(|e| e.as_str().to_owned())),
                pub_body,
                pub_obj,
                priv_body,
                priv_obj,
                opt_text(row.cause.map(|c| c.to_text())),
                opt_text(row.identity.as_ref().map(|i| i.command.as_str().to_owned())),
                opt_text(row.identity.as_ref().map(|i| i.runtime_command.to_text())),
                opt_text(row.identity.as_ref().map(|i| i.kind.as_str().to_owned())),
                opt_text(row.attempt.map(|a| a.to_text())),
                opt_int(row.attempt_epoch.map(|e| e.0)),
                opt_text(row.outcome.map(|o| o.as_str().to_owned())),
                Param::Blob(row.detail.clone()),
            ]
        })
        .collect()
}

pub(crate) async fn append<C: Conn>(
    tx: &mut SqlTx<C>,
    lease: &JournalLease,
    records: &[JournalRow],
) -> StoreResult<Appended> {
    let answer = tx
        .conn
        .query_set(&APPEND, append_rows(lease, records))
        .await?;
    let r = one_row(&answer, "append")?;
    let n = width(JLEASE_COLS);
    let lease_row = if r.is_null(0)? {
        None
    } else {
        Some(decode_journal_lease(&r.slice(0, n)?)?)
    };
    let disposed = match r.opt_text(n)? {
        None => None,
        Some(t) => Some(
            RuntimeCommandId::parse(&t)
                .map_err(|_| StoreError::integrity("journal", "invalid runtime command id"))?,
        ),
    };
    let tip = r.opt_u64(n + 1)?;
    if tip.is_some() {
        tx.conn.wrote();
    }
    Ok(Appended {
        lease: lease_row,
        disposed,
        tip,
    })
}

/// The merged statements as the lifecycle of `rec` (a command of `session`) would run them,
/// for looking at their plans (feature `testing`).
#[cfg(feature = "testing")]
pub(crate) fn samples(
    session: &SessionRecord,
    rec: &CommandRecord,
    now: Millis,
) -> Vec<(&'static SetStmt, Vec<Vec<Param>>)> {
    use crate::journal::RowKind;
    use crate::ops::TransitionKind;
    let req = ClaimRequest {
        tenant: rec.tenant.clone(),
        session: rec.session.clone(),
        command: rec.command.clone(),
        epoch: ResidencyEpoch(1),
        token: uuid::Uuid::now_v7(),
        ttl: std::time::Duration::from_secs(60),
        expected_revision: rec.revision,
    };
    let effect = crate::machine::Effect {
        state: CommandState::Claimed,
        epoch_mark: req.epoch,
        claim: Some(Claim {
            epoch: req.epoch,
            token: req.token,
            expires_at_ms: now + 60_000,
        }),
        attempt: None,
        outcome: None,
        reason: None,
        evidence_seq: None,
        settled_at_ms: None,
    };
    let step = Transitioning {
        kind: TransitionKind::Claim,
        tenant: &rec.tenant,
        session: &rec.session,
        command: &rec.command,
        expected_revision: rec.revision,
        now,
        token: Some(req.token),
        effect: &effect,
    };
    let settle = SettleRequest {
        tenant: rec.tenant.clone(),
        session: rec.session.clone(),
        command: rec.command.clone(),
        epoch: ResidencyEpoch(1),
        expected_revision: rec.revision,
    };
    let lease = JournalLease {
        tenant: rec.tenant.clone(),
        runtime_session: session.binding.runtime_session_id,
        epoch: JournalEpoch(1),
        holder: "plan".to_owned(),
        tip: 1,
        expires_at_ms: now + 60_000,
    };
    let application = JournalRow {
        runtime_session: lease.runtime_session,
        seq: 2,
        epoch: lease.epoch,
        written_at_ms: now,
        kind: RowKind::Application,
        event: None,
        public_body: None,
        private_body: None,
        cause: None,
        identity: Some(rec.identity()),
        attempt: Some(AttemptId::mint()),
        attempt_epoch: Some(lease.epoch),
        outcome: Some(Disposition::Applied),
        detail: None,
    };
    vec![
        (&*ADMIT, admit_rows(rec, now)),
        (&*TRANSITION, transition_rows(&step)),
        (&*SETTLE, settle_rows(&settle, now)),
        (&*APPEND, append_rows(&lease, &[application])),
    ]
}
