//! The relational mapping, written once for both backends: the seam a backend supplies (a
//! [`Conn`] runs a statement with parameters in its dialect), the rendering of a statement
//! for a dialect, the encoding of records into parameters, the strict decoding of rows back
//! into records, the statements several parts share, and the [`SqlTx`] handle they all run on.
//! The statements of each store operation are built on it in `statements` (PostgreSQL's
//! merged hot-path writes in `merged`); this module never decides what an operation runs. A
//! row that fails decoding is an `integrity` error, never a panic. Never opens or commits
//! transactions.

use std::str::FromStr;
use std::sync::LazyLock;
use trace_context::TraceContext;

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::*;
use crate::journal::*;
use crate::model::*;
use crate::ops::{BodySlot, JournalRow};
use crate::stats::Counters;

/// One parameter or column value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
}

/// Typed NULLs matter to PostgreSQL; a parameter carries its intended type.
#[derive(Clone, Debug)]
pub(crate) enum Param {
    Int(Option<i64>),
    Text(Option<String>),
    Blob(Option<Vec<u8>>),
}

/// A row of values in SELECT order.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub values: Vec<Value>,
    pub entity: &'static str,
}

/// Which SQL dialect a connection speaks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// A connection (inside a transaction, or a read connection) that runs statements.
pub(crate) trait Conn {
    fn dialect(&self) -> Dialect;
    /// True when loads should lock rows (PostgreSQL write transactions).
    fn locking(&self) -> bool;
    async fn query(
        &mut self,
        sql: &str,
        params: Vec<Param>,
        entity: &'static str,
    ) -> StoreResult<Vec<Row>>;
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> StoreResult<u64>;
    /// Runs a set statement (PostgreSQL only) for one request whose `rows` become rows of the
    /// statement's `req` relation. Returns the rows the statement answered for this request,
    /// without their leading request number. A connection may run many operations' requests of
    /// one statement together, as one statement.
    async fn query_set(
        &mut self,
        stmt: &'static SetStmt,
        rows: Vec<Vec<Param>>,
    ) -> StoreResult<Vec<Row>>;
    /// Notes that the current operation changed rows (a set statement's answer says so; the
    /// connection cannot tell on its own).
    fn wrote(&mut self);
    /// The store's counters.
    fn counters(&self) -> &Counters;
}

/// The element type of a set statement's request column.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ColType {
    Int,
    Text,
    Blob,
}

impl ColType {
    fn pg(self) -> &'static str {
        match self {
            ColType::Int => "int8",
            ColType::Text => "text",
            ColType::Blob => "bytea",
        }
    }
}

/// A set statement: one PostgreSQL statement over a relation `req` of request rows, built from
/// one array parameter per column (`unnest`). Its first column, `op`, numbers the requests; the
/// statement answers rows whose first column is that number. One request, or the requests of
/// many operations at once, run through the same text.
#[derive(Debug)]
pub(crate) struct SetStmt {
    pub name: &'static str,
    pub entity: &'static str,
    /// The request columns after `op`, in parameter order.
    pub columns: Vec<(&'static str, ColType)>,
    /// The full statement text.
    pub sql: String,
}

impl SetStmt {
    /// `body` continues `WITH req AS (...), ` and must answer `req.op` first in every row.
    pub fn new(
        name: &'static str,
        entity: &'static str,
        columns: &[(&'static str, ColType)],
        body: &str,
    ) -> SetStmt {
        let mut arrays = vec!["$1::int8[]".to_owned()];
        let mut names = vec!["op"];
        for (i, (n, t)) in columns.iter().enumerate() {
            arrays.push(format!("${}::{}[]", i + 2, t.pg()));
            names.push(n);
        }
        let sql = format!(
            "WITH req AS (SELECT * FROM unnest({}) AS r({})), {body}",
            arrays.join(", "),
            names.join(", ")
        );
        SetStmt {
            name,
            entity,
            columns: columns.to_vec(),
            sql,
        }
    }
}

/// Renders a statement template for a dialect: `$N` placeholders become `?N` on SQLite, and
/// `FOR_UPDATE` becomes a row lock on PostgreSQL write transactions (nothing elsewhere).
pub(crate) fn render(template: &str, dialect: Dialect, locking: bool) -> String {
    let lock = if dialect == Dialect::Postgres && locking {
        " FOR UPDATE"
    } else {
        ""
    };
    let s = template.replace(" FOR_UPDATE", lock);
    match dialect {
        Dialect::Postgres => s,
        Dialect::Sqlite => s.replace('$', "?"),
    }
}

// ---- row decoding ---------------------------------------------------------------------------

impl Row {
    /// The `len` columns from `from`, as a row of their own (for answers that join entities).
    pub fn slice(&self, from: usize, len: usize) -> StoreResult<Row> {
        let values = self
            .values
            .get(from..from + len)
            .ok_or_else(|| self.bad(from, "the answer has too few columns"))?;
        Ok(Row {
            values: values.to_vec(),
            entity: self.entity,
        })
    }

    /// True when the column is NULL (an absent side of an outer join).
    pub fn is_null(&self, i: usize) -> StoreResult<bool> {
        Ok(matches!(self.get(i)?, Value::Null))
    }

    fn bad(&self, i: usize, what: &str) -> StoreError {
        StoreError::integrity(self.entity, format!("column {i}: {what}"))
    }

    fn get(&self, i: usize) -> StoreResult<&Value> {
        self.values.get(i).ok_or_else(|| self.bad(i, "missing"))
    }

    pub fn opt_i64(&self, i: usize) -> StoreResult<Option<i64>> {
        match self.get(i)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(*v)),
            _ => Err(self.bad(i, "expected an integer")),
        }
    }

    pub fn i64(&self, i: usize) -> StoreResult<i64> {
        self.opt_i64(i)?
            .ok_or_else(|| self.bad(i, "unexpected NULL"))
    }

    pub fn opt_u64(&self, i: usize) -> StoreResult<Option<u64>> {
        match self.opt_i64(i)? {
            None => Ok(None),
            Some(v) => u64::try_from(v)
                .map(Some)
                .map_err(|_| self.bad(i, "negative value")),
        }
    }

    pub fn u64(&self, i: usize) -> StoreResult<u64> {
        self.opt_u64(i)?
            .ok_or_else(|| self.bad(i, "unexpected NULL"))
    }

    pub fn opt_text(&self, i: usize) -> StoreResult<Option<String>> {
        match self.get(i)? {
            Value::Null => Ok(None),
            Value::Text(v) => Ok(Some(v.clone())),
            Value::Blob(b) => String::from_utf8(b.clone())
                .map(Some)
                .map_err(|_| self.bad(i, "text is not valid UTF-8")),
            Value::Int(_) => Err(self.bad(i, "expected text")),
        }
    }

    pub fn text(&self, i: usize) -> StoreResult<String> {
        self.opt_text(i)?
            .ok_or_else(|| self.bad(i, "unexpected NULL"))
    }

    pub fn opt_blob(&self, i: usize) -> StoreResult<Option<Vec<u8>>> {
        match self.get(i)? {
            Value::Null => Ok(None),
            Value::Blob(b) => Ok(Some(b.clone())),
            Value::Text(t) => Ok(Some(t.clone().into_bytes())),
            Value::Int(_) => Err(self.bad(i, "expected bytes")),
        }
    }

    pub fn bool(&self, i: usize) -> StoreResult<bool> {
        match self.i64(i)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.bad(i, "expected 0 or 1")),
        }
    }

    pub(crate) fn id<T>(
        &self,
        i: usize,
        parse: impl Fn(String) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let text = self.text(i)?;
        parse(text).map_err(|e| self.bad(i, &format!("invalid id: {e}")))
    }

    fn opt_id<T>(
        &self,
        i: usize,
        parse: impl Fn(String) -> StoreResult<T>,
    ) -> StoreResult<Option<T>> {
        match self.opt_text(i)? {
            None => Ok(None),
            Some(text) => parse(text)
                .map(Some)
                .map_err(|e| self.bad(i, &format!("invalid id: {e}"))),
        }
    }

    fn enumv<T: FromStr<Err = StoreError>>(&self, i: usize) -> StoreResult<T> {
        let text = self.text(i)?;
        text.parse::<T>().map_err(|e| self.bad(i, &e.to_string()))
    }
}

pub(crate) fn int(v: u64) -> Param {
    Param::Int(Some(v as i64))
}
pub(crate) fn opt_int(v: Option<u64>) -> Param {
    Param::Int(v.map(|v| v as i64))
}
pub(crate) fn ms(v: Millis) -> Param {
    Param::Int(Some(v))
}
pub(crate) fn opt_ms(v: Option<Millis>) -> Param {
    Param::Int(v)
}
pub(crate) fn text(v: impl Into<String>) -> Param {
    Param::Text(Some(v.into()))
}
pub(crate) fn opt_text(v: Option<String>) -> Param {
    Param::Text(v)
}
pub(crate) fn flag(v: bool) -> Param {
    Param::Int(Some(i64::from(v)))
}

// ---- pages ----------------------------------------------------------------------------------

/// A `tenant_id IN (…)` list for `tenants`: its placeholders (`$1, $2, …`) and their
/// parameters, which come first in the statement.
pub(crate) fn tenant_list(tenants: &[TenantId]) -> (String, Vec<Param>) {
    let placeholders = (1..=tenants.len())
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ");
    (
        placeholders,
        tenants.iter().map(|t| text(t.as_str())).collect(),
    )
}

/// Splits a read of up to `limit + 1` rows into a page of at most `limit` and, when the extra
/// row shows that more follow, the cursor of the next page (`key` of the page's last row).
pub(crate) fn split_page<T, K>(
    mut rows: Vec<T>,
    limit: u64,
    key: impl Fn(&T) -> K,
) -> (Vec<T>, Option<K>) {
    if rows.len() as u64 <= limit {
        return (rows, None);
    }
    rows.truncate(limit as usize);
    let next = rows.last().map(key);
    (rows, next)
}

// ---- statements -----------------------------------------------------------------------------

pub(crate) const SESSION_COLS: &str = "tenant_id, session_id, agent_id, compatibility_id, runtime_session_id, \
     storage_binding_id, binding_version, created_at, last_active_at, residency_state, \
     last_journal_seq, checkpoint_seq, gate_mark";

pub(crate) fn decode_session(r: &Row) -> StoreResult<SessionRecord> {
    Ok(SessionRecord {
        tenant: r.id(0, TenantId::new)?,
        session: r.id(1, SessionId::new)?,
        agent: r.id(2, AgentId::new)?,
        compatibility: r.id(3, CompatibilityId::new)?,
        binding: SessionBinding {
            runtime_session_id: r.id(4, |t: String| RuntimeSessionId::parse(&t))?,
            storage_binding_id: r.id(5, StorageBindingId::new)?,
            binding_version: r.u64(6)?,
        },
        created_at_ms: r.i64(7)?,
        last_active_ms: r.i64(8)?,
        residency_state: r.enumv(9)?,
        last_journal_seq: r.u64(10)?,
        checkpoint_seq: r.u64(11)?,
        gate_mark: ResidencyEpoch(r.u64(12)?),
    })
}

pub(crate) const LEASE_COLS: &str =
    "tenant_id, session_id, epoch, holder, host_id, host_generation, expires_at";

/// A residency lease's expiry as read, for a lease row aliased `l`: its Host's last heartbeat
/// carries it (see migration 0009) when the beat was for the lease's generation, gives a later
/// expiry, and the lease's own expiry reached into the beat's unbroken run; otherwise the
/// row's own. NULL for a released lease.
pub(crate) const LEASE_EXPIRY: &str = "COALESCE((SELECT CASE WHEN t.beat_expires_at > l.expires_at \
     AND l.expires_at > t.beat_since THEN t.beat_expires_at END FROM host_targets t \
     WHERE t.host_id = l.host_id AND t.beat_generation = l.host_generation), l.expires_at)";

/// [`LEASE_COLS`] as read from `residency_leases l` (the expiry as [`LEASE_EXPIRY`] gives it).
pub(crate) static LEASE_READ: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "l.tenant_id, l.session_id, l.epoch, l.holder, l.host_id, l.host_generation, \
         {LEASE_EXPIRY} AS expires_at"
    )
});

pub(crate) fn decode_lease(r: &Row) -> StoreResult<ResidencyLease> {
    Ok(ResidencyLease {
        tenant: r.id(0, TenantId::new)?,
        session: r.id(1, SessionId::new)?,
        epoch: ResidencyEpoch(r.u64(2)?),
        holder: r.opt_text(3)?,
        host: r.opt_id(4, HostId::new)?,
        host_generation: r.opt_u64(5)?,
        expires_at_ms: r.opt_i64(6)?,
    })
}

pub(crate) const REG_COLS: &str = "tenant_id, session_id, host_id, host_generation, endpoint, residency, \
     accepting, lease_epoch, observed_at, expires_at";

/// A registration's time and expiry as read, for a row aliased `r`: while it is in residence,
/// the last heartbeat of its Host and generation refreshes both (see migration 0009).
fn registration_beat(column: &str, beat: &str) -> String {
    format!(
        "COALESCE((SELECT CASE WHEN r.residency IN ('attaching','resident','releasing') \
         AND t.{beat} > r.{column} THEN t.{beat} END FROM host_targets t \
         WHERE t.host_id = r.host_id AND t.beat_generation = r.host_generation), r.{column})"
    )
}

/// [`REG_COLS`] as read from `host_registrations r`.
pub(crate) static REG_READ: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "r.tenant_id, r.session_id, r.host_id, r.host_generation, r.endpoint, r.residency, \
         r.accepting, r.lease_epoch, {} AS observed_at, {} AS expires_at",
        registration_beat("observed_at", "beat_at"),
        registration_beat("expires_at", "beat_expires_at"),
    )
});

pub(crate) fn decode_registration(r: &Row) -> StoreResult<HostRegistration> {
    Ok(HostRegistration {
        tenant: r.id(0, TenantId::new)?,
        session: r.id(1, SessionId::new)?,
        host: r.id(2, HostId::new)?,
        host_generation: r.u64(3)?,
        endpoint: r.text(4)?,
        residency: r.enumv(5)?,
        accepting: r.bool(6)?,
        lease_epoch: ResidencyEpoch(r.u64(7)?),
        observed_at_ms: r.i64(8)?,
        expires_at_ms: r.i64(9)?,
    })
}

pub(crate) const TARGET_COLS: &str = "host_id, endpoint, placement, isolation_class, capacity, accepting, \
     generation, observed_at, expires_at, weight_used";

pub(crate) fn decode_target(r: &Row) -> StoreResult<HostTarget> {
    Ok(HostTarget {
        host: r.id(0, HostId::new)?,
        endpoint: r.text(1)?,
        placement: r.enumv(2)?,
        isolation_class: r.text(3)?,
        capacity: u32::try_from(r.u64(4)?)
            .map_err(|_| StoreError::integrity("host_target", "capacity out of range"))?,
        accepting: r.bool(5)?,
        generation: r.u64(6)?,
        observed_at_ms: r.i64(7)?,
        expires_at_ms: r.i64(8)?,
        weight_used: u32::try_from(r.u64(9)?)
            .map_err(|_| StoreError::integrity("host_target", "weight_used out of range"))?,
    })
}

pub(crate) const COMMAND_COLS: &str = "tenant_id, session_id, command_id, accepted_order, kind, body, \
     object_id, body_digest, body_size, principal, metadata, runtime_command_id, admitted_at, \
     apply_deadline, traceparent, tracestate, state, revision, epoch_mark, claim_epoch, claim_token, claim_expires_at, \
     attempt_id, attempt_journal_epoch, attempt_residency_epoch, attempt_at, outcome, reason, \
     evidence_seq, settled_at";

pub(crate) fn decode_command(r: &Row) -> StoreResult<CommandRecord> {
    let body_digest = r.text(7)?;
    let body_size = r.u64(8)?;
    let body = match (r.opt_blob(5)?, r.opt_text(6)?) {
        (Some(bytes), None) => CommandBody::Inline(bytes),
        (None, Some(object)) => CommandBody::Object(ObjectRef {
            object_id: ObjectId::new(object)
                .map_err(|_| StoreError::integrity("command", "invalid object id"))?,
            size: body_size,
            sha256: body_digest.clone(),
        }),
        _ => {
            return Err(StoreError::integrity(
                "command",
                "exactly one of body and object_id must be set",
            ));
        }
    };
    let claim = match (r.opt_u64(19)?, r.opt_text(20)?, r.opt_i64(21)?) {
        (None, None, None) => None,
        (Some(epoch), Some(token), Some(expires)) => Some(Claim {
            epoch: ResidencyEpoch(epoch),
            token: uuid::Uuid::try_parse(&token)
                .map_err(|_| StoreError::integrity("command", "claim token is not a UUID"))?,
            expires_at_ms: expires,
        }),
        _ => return Err(StoreError::integrity("command", "partial claim")),
    };
    let attempt = match (
        r.opt_id(22, |t: String| AttemptId::parse(&t))?,
        r.opt_u64(23)?,
        r.opt_u64(24)?,
        r.opt_i64(25)?,
    ) {
        (None, None, None, None) => None,
        (Some(id), Some(je), Some(re), Some(at)) => Some(Attempt {
            id,
            journal_epoch: JournalEpoch(je),
            residency_epoch: ResidencyEpoch(re),
            begun_at_ms: at,
        }),
        _ => return Err(StoreError::integrity("command", "partial attempt")),
    };
    let outcome = match r.opt_text(26)? {
        None => None,
        Some(o) => Some(o.parse::<Outcome>()?),
    };
    let rec = CommandRecord {
        tenant: r.id(0, TenantId::new)?,
        session: r.id(1, SessionId::new)?,
        command: r.id(2, CommandId::new)?,
        accepted_order: r.u64(3)?,
        kind: r.enumv(4)?,
        body,
        body_digest,
        body_size,
        principal: r.opt_text(9)?,
        metadata: r.opt_text(10)?,
        runtime_command: r.id(11, |t: String| RuntimeCommandId::parse(&t))?,
        admitted_at_ms: r.i64(12)?,
        apply_deadline_ms: r.i64(13)?,
        trace: TraceContext::from_headers(r.opt_text(14)?.as_deref(), r.opt_text(15)?.as_deref())
            .map_err(|e| StoreError::integrity("command", e.to_string()))?,
        state: r.enumv(16)?,
        revision: r.u64(17)?,
        epoch_mark: ResidencyEpoch(r.u64(18)?),
        claim,
        attempt,
        outcome,
        reason: r.opt_text(27)?,
        evidence_seq: r.opt_u64(28)?,
        settled_at_ms: r.opt_i64(29)?,
    };
    check_command_shape(&rec)?;
    Ok(rec)
}

/// The state/field combinations a command row may have (the schema checks them too; this
/// catches rows written by anything else).
fn check_command_shape(rec: &CommandRecord) -> StoreResult<()> {
    let ok = match rec.state {
        CommandState::Pending => {
            rec.claim.is_none() && rec.attempt.is_none() && rec.outcome.is_none()
        }
        CommandState::Claimed => {
            rec.claim.is_some() && rec.attempt.is_none() && rec.outcome.is_none()
        }
        CommandState::Applying => rec.attempt.is_some() && rec.outcome.is_none(),
        CommandState::Applied => {
            rec.attempt.is_some()
                && matches!(rec.outcome, Some(Outcome::Applied | Outcome::NoOp))
                && rec.evidence_seq.is_some()
        }
        CommandState::Rejected => match rec.attempt {
            Some(_) => {
                matches!(rec.outcome, Some(Outcome::Refused | Outcome::NotApplied))
                    && rec.evidence_seq.is_some()
            }
            None => rec.outcome == Some(Outcome::Rejected),
        },
    };
    if !ok {
        return Err(StoreError::integrity(
            "command",
            format!("state {} does not match its fields", rec.state),
        ));
    }
    if rec.revision == 0 || rec.accepted_order == 0 {
        return Err(StoreError::integrity(
            "command",
            "revision and order start at 1",
        ));
    }
    if let CommandBody::Inline(b) = &rec.body
        && (b.len() as u64 != rec.body_size || sha256_hex(b) != rec.body_digest)
    {
        return Err(StoreError::integrity(
            "command",
            "inline body does not match its recorded size and digest",
        ));
    }
    Ok(())
}

pub(crate) fn command_params(rec: &CommandRecord) -> Vec<Param> {
    let (body, object) = match &rec.body {
        CommandBody::Inline(b) => (Param::Blob(Some(b.clone())), Param::Text(None)),
        CommandBody::Object(r) => (Param::Blob(None), text(r.object_id.as_str())),
    };
    vec![
        text(rec.tenant.as_str()),
        text(rec.session.as_str()),
        text(rec.command.as_str()),
        int(rec.accepted_order),
        text(rec.kind.as_str()),
        body,
        object,
        text(rec.body_digest.clone()),
        int(rec.body_size),
        opt_text(rec.principal.clone()),
        opt_text(rec.metadata.clone()),
        text(rec.runtime_command.to_text()),
        ms(rec.admitted_at_ms),
        ms(rec.apply_deadline_ms),
        opt_text(rec.trace.as_ref().map(|t| t.parent.to_string())),
        opt_text(
            rec.trace
                .as_ref()
                .and_then(|t| t.state.as_ref().map(|s| s.as_str().to_owned())),
        ),
        text(rec.state.as_str()),
        int(rec.revision),
        int(rec.epoch_mark.0),
        opt_int(rec.claim.as_ref().map(|c| c.epoch.0)),
        opt_text(rec.claim.as_ref().map(|c| c.token.hyphenated().to_string())),
        opt_ms(rec.claim.as_ref().map(|c| c.expires_at_ms)),
        opt_text(rec.attempt.as_ref().map(|a| a.id.to_text())),
        opt_int(rec.attempt.as_ref().map(|a| a.journal_epoch.0)),
        opt_int(rec.attempt.as_ref().map(|a| a.residency_epoch.0)),
        opt_ms(rec.attempt.as_ref().map(|a| a.begun_at_ms)),
        opt_text(rec.outcome.map(|o| o.as_str().to_owned())),
        opt_text(rec.reason.clone()),
        opt_int(rec.evidence_seq),
        opt_ms(rec.settled_at_ms),
    ]
}

pub(crate) const GATE_COLS: &str = "tenant_id, session_id, gate_id, opened_event_id, opened_seq, kind, \
     prompt_summary, deadline, state, opened_at, resolved_seq, resolved_at";

pub(crate) fn decode_gate(r: &Row) -> StoreResult<GateRecord> {
    let rec = GateRecord {
        tenant: r.id(0, TenantId::new)?,
        session: r.id(1, SessionId::new)?,
        gate: r.id(2, GateId::new)?,
        opened_event: r.id(3, EventId::new)?,
        opened_seq: r.u64(4)?,
        kind: r.text(5)?,
        prompt_summary: r.text(6)?,
        deadline_ms: r.i64(7)?,
        state: r.enumv(8)?,
        opened_at_ms: r.i64(9)?,
        resolved_seq: r.opt_u64(10)?,
        resolved_at_ms: r.opt_i64(11)?,
    };
    if (rec.state == GateState::Resolved) != rec.resolved_seq.is_some() {
        return Err(StoreError::integrity(
            "gate",
            "resolved state and sequence disagree",
        ));
    }
    Ok(rec)
}

pub(crate) const OBJECT_COLS: &str =
    "object_id, tenant_id, session_id, kind, media_type, size, sha256, bytes";

pub(crate) fn decode_object(r: &Row) -> StoreResult<StoredObject> {
    Ok(StoredObject {
        reference: ObjectRef {
            object_id: r.id(0, ObjectId::new)?,
            size: r.u64(5)?,
            sha256: r.text(6)?,
        },
        tenant: r.id(1, TenantId::new)?,
        session: r.id(2, SessionId::new)?,
        kind: r.text(3)?,
        media_type: r.text(4)?,
        bytes: r.opt_blob(7)?.unwrap_or_default(),
    })
}

pub(crate) const JLEASE_COLS: &str =
    "runtime_session_id, tenant_id, epoch, holder, expires_at, tip";

pub(crate) fn decode_journal_lease(r: &Row) -> StoreResult<JournalLeaseState> {
    Ok(JournalLeaseState {
        runtime_session: r.id(0, |t: String| RuntimeSessionId::parse(&t))?,
        tenant: r.id(1, TenantId::new)?,
        epoch: JournalEpoch(r.u64(2)?),
        holder: r.opt_text(3)?,
        expires_at_ms: r.opt_i64(4)?,
        tip: r.u64(5)?,
    })
}

pub(crate) const JOURNAL_COLS: &str = "runtime_session_id, seq, kind, journal_epoch, written_at, event_id, \
     public_body, public_object_id, private_body, private_object_id, cause_runtime_command, \
     command_id, runtime_command_id, command_kind, attempt_id, attempt_journal_epoch, outcome, detail";

fn decode_slot(r: &Row, body: usize, object: usize) -> StoreResult<Option<BodySlot>> {
    match (r.opt_blob(body)?, r.opt_text(object)?) {
        (None, None) => Ok(None),
        (Some(b), None) => Ok(Some(BodySlot::Inline(b))),
        (None, Some(o)) => {
            Ok(Some(BodySlot::Object(ObjectId::new(o).map_err(|_| {
                StoreError::integrity("journal", "invalid object id")
            })?)))
        }
        _ => Err(StoreError::integrity(
            "journal",
            "both inline and offloaded body",
        )),
    }
}

pub(crate) fn decode_journal_row(r: &Row) -> StoreResult<JournalRow> {
    let kind = RowKind::from_wire(&r.text(2)?).map_err(|e| {
        StoreError::integrity("journal", format!("unknown record kind {:?}", e.value))
    })?;
    let identity = match (
        r.opt_id(11, CommandId::new)?,
        r.opt_id(12, |t: String| RuntimeCommandId::parse(&t))?,
        r.opt_text(13)?,
    ) {
        (Some(command), Some(runtime_command), Some(k)) => Some(CommandIdentity {
            command,
            runtime_command,
            kind: k.parse()?,
        }),
        (None, None, None) => None,
        _ => return Err(StoreError::integrity("journal", "partial command identity")),
    };
    let outcome = match r.opt_text(16)? {
        None => None,
        Some(o) => Some(o.parse::<Disposition>()?),
    };
    Ok(JournalRow {
        runtime_session: r.id(0, |t: String| RuntimeSessionId::parse(&t))?,
        seq: r.u64(1)?,
        kind,
        epoch: JournalEpoch(r.u64(3)?),
        written_at_ms: r.i64(4)?,
        event: r.opt_id(5, EventId::new)?,
        public_body: decode_slot(r, 6, 7)?,
        private_body: decode_slot(r, 8, 9)?,
        cause: r.opt_id(10, |t: String| RuntimeCommandId::parse(&t))?,
        identity,
        attempt: r.opt_id(14, |t: String| AttemptId::parse(&t))?,
        attempt_epoch: r.opt_u64(15)?.map(JournalEpoch),
        outcome,
        detail: r.opt_blob(17)?,
    })
}

pub(crate) fn slot_params(slot: &Option<BodySlot>) -> (Param, Param) {
    match slot {
        None => (Param::Blob(None), Param::Text(None)),
        Some(BodySlot::Inline(b)) => (Param::Blob(Some(b.clone())), Param::Text(None)),
        Some(BodySlot::Object(id)) => (Param::Blob(None), text(id.as_str())),
    }
}

/// One command by its id (locked in a PostgreSQL write transaction).
pub(crate) static COMMAND_BY_ID: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {COMMAND_COLS} FROM commands WHERE tenant_id = $1 AND session_id = $2 \
         AND command_id = $3 FOR_UPDATE"
    )
});

/// Whether a journal holds a disposition of a runtime command.
pub(crate) const HAS_DISPOSITION: &str = "SELECT 1 FROM journal_records \
     WHERE runtime_session_id = $1 AND runtime_command_id = $2 \
     AND kind IN ('application','closure') LIMIT 1";

/// A journal's dispositions of a runtime command, none unless the tenant owns the journal (the
/// ownership check rides along in the same statement). Unordered: the caller sorts the few rows
/// (ordering by `seq` here would tempt PostgreSQL to walk the journal's primary key instead of
/// looking the command up).
pub(crate) static DISPOSITIONS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {JOURNAL_COLS} FROM journal_records WHERE runtime_session_id = $1 \
         AND runtime_command_id = $2 AND kind IN ('application','closure') \
         AND EXISTS (SELECT 1 FROM journal_leases WHERE journal_leases.runtime_session_id = $1 \
         AND journal_leases.tenant_id = $3)"
    )
});

// Page sizes are written into the statements (`LIMIT {limit}`), never bound: SQLite
// re-prepares a statement on every run whose `LIMIT` is a bound parameter (its planner uses
// the value), and the store's page sizes are a few integers it chose itself.

/// A transaction over any [`Conn`]: the handle every SQL statement of the store runs on (the
/// store operations' `Tx` is implemented on it in `statements`).
pub(crate) struct SqlTx<C: Conn> {
    pub conn: C,
}

impl<C: Conn> SqlTx<C> {
    pub(crate) async fn rows(
        &mut self,
        template: &str,
        params: Vec<Param>,
        entity: &'static str,
    ) -> StoreResult<Vec<Row>> {
        let sql = render(template, self.conn.dialect(), self.conn.locking());
        self.conn.query(&sql, params, entity).await
    }

    pub(crate) async fn one<T>(
        &mut self,
        template: &str,
        params: Vec<Param>,
        entity: &'static str,
        decode: fn(&Row) -> StoreResult<T>,
    ) -> StoreResult<Option<T>> {
        let rows = self.rows(template, params, entity).await?;
        match rows.first() {
            None => Ok(None),
            Some(r) => decode(r).map(Some),
        }
    }

    pub(crate) async fn many<T>(
        &mut self,
        template: &str,
        params: Vec<Param>,
        entity: &'static str,
        decode: fn(&Row) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        let rows = self.rows(template, params, entity).await?;
        rows.iter().map(decode).collect()
    }

    pub(crate) async fn exec(&mut self, template: &str, params: Vec<Param>) -> StoreResult<u64> {
        let sql = render(template, self.conn.dialect(), false);
        self.conn.execute(&sql, params).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_past_the_page_names_the_next_page_and_a_short_one_does_not() {
        assert_eq!(split_page(vec![1, 2, 3], 2, |n| *n), (vec![1, 2], Some(2)));
        assert_eq!(split_page(vec![1, 2], 2, |n| *n), (vec![1, 2], None));
        assert_eq!(split_page(Vec::<u8>::new(), 2, |n| *n), (vec![], None));
    }

    #[test]
    fn a_tenant_list_numbers_one_placeholder_per_tenant_from_one() {
        let tenants = [TenantId::new("a").unwrap(), TenantId::new("b").unwrap()];
        let (placeholders, params) = tenant_list(&tenants);
        assert_eq!(placeholders, "$1, $2");
        assert_eq!(params.len(), 2);
    }
}
