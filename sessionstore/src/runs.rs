//! Workflow run records: the program a run started from (create-only), the releases it is
//! pinned to (create-only), its status (changed only by compare-and-set over state, holder,
//! epoch and fencing token), the step journal, the checkpoints a run armed and the answers
//! given to them. Owns the `run_*` tables' statements
//! (one set for both backends) and the fencing rule: every write a driver makes carries the
//! fencing token it was handed, and is refused `claim_lost` once a takeover minted another or
//! the run left `running`.
//!
//! The store treats inputs, results, schemas and answers as opaque JSON text; it must never
//! interpret a program or validate an answer against its schema (the driver does both).

use std::str::FromStr;
use std::time::Duration;

use trace_context::TraceContext;
use wire_enum::wire_enum;

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::{RunId, TenantId, check_opaque_id};
use crate::limits::MAX_LEASE_TTL;
use crate::model::sha256_hex;
use crate::sql::{
    Conn, Param, Row, SqlTx, int, ms, opt_ms, opt_text, render, split_page, tenant_list, text,
};

/// The largest program source a run may record.
pub const MAX_PROGRAM_BYTES: usize = 1024 * 1024;
/// The largest JSON document (input, step body, answer, schema) a run record may hold.
pub const MAX_RUN_DOCUMENT_BYTES: usize = 1024 * 1024;
/// The longest step or checkpoint name.
pub const MAX_STEP_NAME: usize = 128;
/// The most releases one run may be pinned to (a program has at most 256 steps).
pub const MAX_RUN_PINS: usize = 256;
/// The longest pinned identity (`workspace/name@version`, each part at most 128 bytes).
pub const MAX_PIN_IDENTITY: usize = 400;

wire_enum! {
    /// Where a run stands.
    pub enum RunState {
        /// Driven (or parked at a checkpoint) by its holder.
        Running = "running",
        /// Stopped at a step whose effect is unknown; an operator decides (retry or skip).
        NeedsAttention = "needs_attention",
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
    }
    kind = "run_status";
}

impl RunState {
    /// Completed, failed and cancelled runs never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Completed | RunState::Failed | RunState::Cancelled
        )
    }
}

impl FromStr for RunState {
    type Err = StoreError;
    fn from_str(s: &str) -> StoreResult<Self> {
        RunState::from_wire(s)
            .map_err(|_| StoreError::integrity("run_status", format!("unknown state {s:?}")))
    }
}

/// Why a run failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunFailure {
    /// A stable code.
    pub code: String,
    /// The step that failed.
    pub step: String,
    pub message: String,
}

/// Which end of a tenant's runs a listing starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunOrder {
    /// The order runs were started in (how `run.list` answers).
    #[default]
    OldestFirst,
    /// The newest run first (how the console shows them).
    NewestFirst,
}

/// A page of runs, and where the next one starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunsPage {
    pub runs: Vec<RunStatus>,
    /// The last run of this page when more follow (the `after` of the next page).
    pub next: Option<RunId>,
}

/// A cheap summary of a tenant's runs that changes whenever what a view of them shows does:
/// a run is added, or a status record is rewritten (a step, a park, a takeover, an answer,
/// an end). Lease renewals do not change it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunsMark {
    pub runs: u64,
    /// The sum of the status records' revisions.
    pub revisions: u64,
}

/// A run's status record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunStatus {
    pub run_id: RunId,
    pub tenant: TenantId,
    pub state: RunState,
    /// The attempt that holds the run (a Host id and an attempt id).
    pub holder: String,
    pub epoch: u64,
    pub fencing_token: String,
    pub lease_expires_at_ms: Millis,
    pub idempotency_key: Option<String>,
    /// The run's input, JSON text.
    pub input: String,
    /// The step most recently journaled or armed.
    pub step: Option<String>,
    pub failure: Option<RunFailure>,
    pub revision: u64,
    pub created_at_ms: Millis,
    pub updated_at_ms: Millis,
    /// The actor who started the run; `None` for a run recorded before the store kept it
    /// (schema version 10): unknown, never guessed.
    pub started_by: Option<String>,
    /// The trace the run's steps continue, recorded at its start (schema version 12); `None`
    /// for a run started outside any trace.
    pub trace: Option<TraceContext>,
}

impl RunStatus {
    /// The fence a driver holding this status writes under.
    pub fn fence(&self) -> RunFence {
        RunFence {
            run_id: self.run_id.clone(),
            epoch: self.epoch,
            token: self.fencing_token.clone(),
        }
    }
}

/// A run to record: its program and its first status (running, epoch 1).
#[derive(Clone, Debug)]
pub struct NewRun {
    pub run_id: RunId,
    pub tenant: TenantId,
    /// The exact submitted source.
    pub source: String,
    /// JSON text.
    pub input: String,
    pub holder: String,
    pub fencing_token: String,
    pub lease: Duration,
    /// A retried start with the same key (and tenant) returns the recorded run.
    pub idempotency_key: Option<String>,
    /// The releases the run is pinned to, one per runnable its program invokes (recorded in
    /// the same transaction as the run).
    pub pins: Vec<RunPin>,
    /// The actor who starts it (an authenticated principal, or what its caller is known as);
    /// `None` only where nobody is known, which is then shown as unknown.
    pub started_by: Option<String>,
    /// The trace its steps continue on whichever Host drives them; never changed.
    pub trace: Option<TraceContext>,
}

/// The release a run invokes for one runnable: its identity (`workspace/name@version`) and
/// its package digest (`sha256:<64 hex>`). Recorded once for the run's whole life; the store
/// never interprets either.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunPin {
    pub identity: String,
    pub digest: String,
}

/// What recording a run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunCreated {
    pub status: RunStatus,
    /// False when the idempotency key named a run recorded earlier (nothing was written).
    pub created: bool,
}

/// A run's recorded program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunProgram {
    pub run_id: RunId,
    pub source: String,
    pub sha256: String,
    pub created_at_ms: Millis,
}

/// What a driver writes under: the run, its epoch and its fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunFence {
    pub run_id: RunId,
    pub epoch: u64,
    pub token: String,
}

wire_enum! {
    /// The kinds of journal entries.
    pub enum StepEntryKind {
        /// An invocation whose effect is not replay-safe began (written before the handler
        /// starts).
        Began = "began",
        /// The step's result (one per step).
        Result = "result",
        /// A failed attempt of a supervised step (one per attempt).
        Failure = "failure",
    }
    kind = "run_journal";
}

impl FromStr for StepEntryKind {
    type Err = StoreError;
    fn from_str(s: &str) -> StoreResult<Self> {
        StepEntryKind::from_wire(s)
            .map_err(|_| StoreError::integrity("run_journal", format!("unknown kind {s:?}")))
    }
}

/// A journal entry to append.
#[derive(Clone, Debug)]
pub struct NewStepEntry {
    pub step: String,
    pub kind: StepEntryKind,
    /// 0 for results; the attempt number (from 1) for `began` and `failure`.
    pub attempt: u64,
    /// The outcome class, when there is one.
    pub outcome: Option<String>,
    /// JSON text.
    pub body: String,
    pub started_at_ms: Option<Millis>,
    /// The checkpoint whose answer this entry consumes (in the same transaction): an ask's
    /// result, or the `began` of an attempt an operator asked to retry.
    pub consumes: Option<String>,
}

/// A journal entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepEntry {
    pub seq: u64,
    pub step: String,
    pub kind: StepEntryKind,
    pub attempt: u64,
    pub outcome: Option<String>,
    pub body: String,
    pub epoch: u64,
    pub started_at_ms: Option<Millis>,
    pub recorded_at_ms: Millis,
}

wire_enum! {
    /// The kinds of checkpoints.
    pub enum CheckpointKind {
        /// Parks until answered.
        Ask = "ask",
        /// A durable timer.
        Sleep = "sleep",
        /// An operator's decision on a step whose effect is unknown (`retry` or `skip`).
        Attention = "attention",
    }
    kind = "run_checkpoints";
}

impl FromStr for CheckpointKind {
    type Err = StoreError;
    fn from_str(s: &str) -> StoreResult<Self> {
        CheckpointKind::from_wire(s)
            .map_err(|_| StoreError::integrity("run_checkpoints", format!("unknown kind {s:?}")))
    }
}

/// A checkpoint to arm.
#[derive(Clone, Debug)]
pub struct NewCheckpoint {
    pub name: String,
    pub kind: CheckpointKind,
    pub question: Option<String>,
    /// The answer schema, JSON text.
    pub schema: Option<String>,
    /// A sleep's duration; the deadline is the store's now plus this, fixed when first armed.
    pub sleep: Option<Duration>,
}

/// An armed checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub name: String,
    pub kind: CheckpointKind,
    pub question: Option<String>,
    pub schema: Option<String>,
    pub deadline_at_ms: Option<Millis>,
    pub armed_at_ms: Millis,
    pub epoch: u64,
}

/// A recorded answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAnswer {
    pub checkpoint: String,
    /// JSON text.
    pub value: String,
    /// The tenant that answered (from its authenticated link, never from a request field).
    pub answerer: String,
    pub answered_at_ms: Millis,
    pub consumed_at_ms: Option<Millis>,
    pub consumed_epoch: Option<u64>,
}

/// What recording an answer did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerRecorded {
    Recorded(RunAnswer),
    /// The same value was recorded before; nothing changed.
    Unchanged(RunAnswer),
}

/// The Host id a run holder (`<host id>/<attempt id>`) names.
pub fn holder_host(holder: &str) -> &str {
    holder.split_once('/').map_or(holder, |(host, _)| host)
}

/// Which runs a takeover may take. A holder counts as *gone* when its lease has expired, or
/// when the Host its holder names has a registration in the Host registry and that
/// registration has expired (the fleet's own verdict that the Host died: runs fail over with
/// its sessions, not later). A holder whose Host never registered is judged by its lease only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeoverRule {
    /// Only a run whose holder is gone.
    LeaseExpired,
    /// A run whose holder starts with this prefix (a booting Host taking back its own runs),
    /// or whose lease has expired.
    HeldByOrExpired(String),
}

/// A takeover: the run moves to `holder` under epoch + 1 and a new fencing token.
#[derive(Clone, Debug)]
pub struct Takeover {
    pub run_id: RunId,
    /// The epoch the taker read; another is `conflict`.
    pub expected_epoch: u64,
    pub holder: String,
    pub fencing_token: String,
    pub lease: Duration,
    pub rule: TakeoverRule,
}

/// How a driver ends (or parks) its run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    Completed,
    Failed(RunFailure),
    /// The step's effect is unknown; an `attention` checkpoint of that name is armed.
    NeedsAttention {
        step: String,
    },
}

/// The holder of a parked run. No attempt holds a parked run, so it belongs to no Host: a
/// Host's death or restart does not concern it, and its `lease_expires_at` is its wake-up
/// time instead of a lease.
pub const PARKED_HOLDER: &str = "";

/// The wake-up time of a run parked until an answer: never, until the answer sets it to 0.
const UNTIL_ANSWERED: Millis = Millis::MAX;

/// What a parked run waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParkUntil {
    /// An answer to this `ask` checkpoint.
    Answered(String),
    /// The store's clock reaching this time (a sleep's deadline).
    Due(Millis),
}

impl RunStatus {
    /// Whether no attempt holds the run: it waits on an ask or a sleep, with no driver.
    pub fn is_parked(&self) -> bool {
        self.state == RunState::Running && self.holder == PARKED_HOLDER
    }
}

// ---- checks ---------------------------------------------------------------------------------

fn check_name(field: &'static str, v: &str) -> StoreResult<()> {
    if v.is_empty() || v.len() > MAX_STEP_NAME || v.chars().any(char::is_control) {
        return Err(StoreError::invalid(
            field,
            format!("must be 1-{MAX_STEP_NAME} bytes without control characters"),
        ));
    }
    Ok(())
}

fn check_document(field: &'static str, v: &str) -> StoreResult<()> {
    if v.len() > MAX_RUN_DOCUMENT_BYTES {
        return Err(StoreError::invalid(
            field,
            format!(
                "is {} bytes; at most {MAX_RUN_DOCUMENT_BYTES} allowed",
                v.len()
            ),
        ));
    }
    if serde_json::from_str::<serde_json::Value>(v).is_err() {
        return Err(StoreError::invalid(field, "must be one JSON document"));
    }
    Ok(())
}

fn lease_ms(lease: Duration) -> StoreResult<i64> {
    crate::limits::ttl_ms("lease", lease, MAX_LEASE_TTL)
}

/// Checks a set of pins: at most [`MAX_RUN_PINS`], identities 1-[`MAX_PIN_IDENTITY`] bytes of
/// printable text without whitespace, each named once, digests `sha256:<64 lowercase hex>`.
pub(crate) fn check_pins(pins: &[RunPin]) -> StoreResult<()> {
    if pins.len() > MAX_RUN_PINS {
        return Err(StoreError::invalid(
            "pins",
            format!("at most {MAX_RUN_PINS} releases per run"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for p in pins {
        if p.identity.is_empty()
            || p.identity.len() > MAX_PIN_IDENTITY
            || p.identity
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(StoreError::invalid(
                "pin.identity",
                format!(
                    "must be 1-{MAX_PIN_IDENTITY} bytes without whitespace or control characters"
                ),
            ));
        }
        let hex = p.digest.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(StoreError::invalid(
                "pin.digest",
                "must be sha256:<64 lowercase hex>",
            ));
        }
        if !seen.insert(p.identity.as_str()) {
            return Err(StoreError::invalid(
                "pins",
                format!("{} is pinned twice", p.identity),
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_new_run(r: &NewRun) -> StoreResult<()> {
    if r.source.is_empty() || r.source.len() > MAX_PROGRAM_BYTES {
        return Err(StoreError::invalid(
            "source",
            format!("must be 1 to {MAX_PROGRAM_BYTES} bytes"),
        ));
    }
    check_document("input", &r.input)?;
    check_pins(&r.pins)?;
    check_opaque_id("holder", &r.holder)?;
    check_opaque_id("fencing_token", &r.fencing_token)?;
    if let Some(k) = &r.idempotency_key {
        check_opaque_id("idempotency_key", k)?;
    }
    if let Some(a) = &r.started_by {
        check_opaque_id("started_by", a)?;
    }
    lease_ms(r.lease)?;
    Ok(())
}

pub(crate) fn check_fence(f: &RunFence) -> StoreResult<()> {
    check_opaque_id("fencing_token", &f.token)
}

pub(crate) fn check_entry(e: &NewStepEntry) -> StoreResult<()> {
    check_name("step", &e.step)?;
    check_document("body", &e.body)?;
    match (e.kind, e.attempt) {
        (StepEntryKind::Result, 0) => {}
        (StepEntryKind::Result, _) => {
            return Err(StoreError::invalid("attempt", "is 0 for a result"));
        }
        (_, 0) => return Err(StoreError::invalid("attempt", "counts from 1")),
        _ => {}
    }
    if e.consumes.is_some() && e.kind == StepEntryKind::Failure {
        return Err(StoreError::invalid(
            "consumes",
            "only a result or a began entry consumes an answer",
        ));
    }
    if let Some(o) = &e.outcome {
        check_name("outcome", o)?;
    }
    Ok(())
}

pub(crate) fn check_checkpoint(c: &NewCheckpoint) -> StoreResult<()> {
    check_name("checkpoint", &c.name)?;
    if let Some(s) = &c.schema {
        check_document("schema", s)?;
    }
    if let Some(q) = &c.question
        && q.len() > MAX_RUN_DOCUMENT_BYTES
    {
        return Err(StoreError::invalid("question", "is too long"));
    }
    if c.kind == CheckpointKind::Sleep && c.sleep.is_none() {
        return Err(StoreError::invalid("sleep", "a sleep needs its duration"));
    }
    Ok(())
}

pub(crate) fn check_answer(checkpoint: &str, value: &str, answerer: &str) -> StoreResult<()> {
    check_name("checkpoint", checkpoint)?;
    check_document("value", value)?;
    check_opaque_id("answerer", answerer)
}

pub(crate) fn check_takeover(t: &Takeover) -> StoreResult<()> {
    check_opaque_id("holder", &t.holder)?;
    check_opaque_id("fencing_token", &t.fencing_token)?;
    lease_ms(t.lease)?;
    Ok(())
}

pub(crate) fn check_lease(lease: Duration) -> StoreResult<()> {
    lease_ms(lease).map(|_| ())
}

// ---- decoding -------------------------------------------------------------------------------

const STATUS_COLS: &str = "run_id, tenant_id, state, holder, epoch, fencing_token, lease_expires_at, \
     idempotency_key, input, step, failure_code, failure_step, failure_message, revision, \
     created_at, updated_at, started_by, traceparent, tracestate";

fn bad(entity: &'static str, e: StoreError) -> StoreError {
    StoreError::integrity(entity, e.to_string())
}

/// The status records a query over `run_status` selecting [`STATUS_COLS`] answers.
async fn statuses<C: Conn>(
    tx: &mut SqlTx<C>,
    q: &str,
    params: Vec<Param>,
) -> StoreResult<Vec<RunStatus>> {
    rows(tx, q, params, "run_status")
        .await?
        .iter()
        .map(decode_status)
        .collect()
}

fn decode_status(r: &Row) -> StoreResult<RunStatus> {
    let failure = match (r.opt_text(10)?, r.opt_text(11)?) {
        (Some(code), Some(step)) => Some(RunFailure {
            code,
            step,
            message: r.opt_text(12)?.unwrap_or_default(),
        }),
        _ => None,
    };
    Ok(RunStatus {
        run_id: RunId::new(r.text(0)?).map_err(|e| bad("run_status", e))?,
        tenant: TenantId::new(r.text(1)?).map_err(|e| bad("run_status", e))?,
        state: r.text(2)?.parse()?,
        holder: r.text(3)?,
        epoch: r.u64(4)?,
        fencing_token: r.text(5)?,
        lease_expires_at_ms: r.i64(6)?,
        idempotency_key: r.opt_text(7)?,
        input: r.text(8)?,
        step: r.opt_text(9)?,
        failure,
        revision: r.u64(13)?,
        created_at_ms: r.i64(14)?,
        updated_at_ms: r.i64(15)?,
        started_by: r.opt_text(16)?,
        trace: TraceContext::from_headers(r.opt_text(17)?.as_deref(), r.opt_text(18)?.as_deref())
            .map_err(|e| StoreError::integrity("run_status", e.to_string()))?,
    })
}

const ENTRY_COLS: &str = "seq, step, kind, attempt, outcome, body, epoch, started_at, recorded_at";

fn decode_entry(r: &Row) -> StoreResult<StepEntry> {
    Ok(StepEntry {
        seq: r.u64(0)?,
        step: r.text(1)?,
        kind: r.text(2)?.parse()?,
        attempt: r.u64(3)?,
        outcome: r.opt_text(4)?,
        body: r.text(5)?,
        epoch: r.u64(6)?,
        started_at_ms: r.opt_i64(7)?,
        recorded_at_ms: r.i64(8)?,
    })
}

const CHECKPOINT_COLS: &str = "name, kind, question, schema, deadline_at, armed_at, epoch";

fn decode_checkpoint(r: &Row) -> StoreResult<Checkpoint> {
    Ok(Checkpoint {
        name: r.text(0)?,
        kind: r.text(1)?.parse()?,
        question: r.opt_text(2)?,
        schema: r.opt_text(3)?,
        deadline_at_ms: r.opt_i64(4)?,
        armed_at_ms: r.i64(5)?,
        epoch: r.u64(6)?,
    })
}

const ANSWER_COLS: &str = "checkpoint, value, answerer, answered_at, consumed_at, consumed_epoch";

fn decode_answer(r: &Row) -> StoreResult<RunAnswer> {
    Ok(RunAnswer {
        checkpoint: r.text(0)?,
        value: r.text(1)?,
        answerer: r.text(2)?,
        answered_at_ms: r.i64(3)?,
        consumed_at_ms: r.opt_i64(4)?,
        consumed_epoch: r.opt_u64(5)?,
    })
}

// ---- statements -----------------------------------------------------------------------------

async fn rows<C: Conn>(
    tx: &mut SqlTx<C>,
    template: &str,
    params: Vec<Param>,
    entity: &'static str,
) -> StoreResult<Vec<Row>> {
    let sql = render(template, tx.conn.dialect(), tx.conn.locking());
    tx.conn.query(&sql, params, entity).await
}

async fn exec<C: Conn>(tx: &mut SqlTx<C>, template: &str, params: Vec<Param>) -> StoreResult<u64> {
    let sql = render(template, tx.conn.dialect(), false);
    tx.conn.execute(&sql, params).await
}

async fn load_status<C: Conn>(
    tx: &mut SqlTx<C>,
    tenant: Option<&TenantId>,
    run_id: &RunId,
) -> StoreResult<Option<RunStatus>> {
    let q = format!("SELECT {STATUS_COLS} FROM run_status WHERE run_id = $1 FOR_UPDATE");
    let found = rows(tx, &q, vec![text(run_id.as_str())], "run_status").await?;
    let status = found.first().map(decode_status).transpose()?;
    // Another tenant's run reads exactly like an unknown one.
    Ok(status.filter(|s| tenant.is_none_or(|t| &s.tenant == t)))
}

async fn by_key<C: Conn>(
    tx: &mut SqlTx<C>,
    tenant: &TenantId,
    key: &str,
) -> StoreResult<Option<RunStatus>> {
    let q = format!(
        "SELECT {STATUS_COLS} FROM run_status WHERE tenant_id = $1 AND idempotency_key = $2"
    );
    let found = rows(tx, &q, vec![text(tenant.as_str()), text(key)], "run_status").await?;
    found.first().map(decode_status).transpose()
}

fn fenced(reason: &'static str) -> StoreError {
    StoreError::ClaimLost {
        field: "run",
        reason,
    }
}

/// Checks the fence against the locked status row and moves its current step; the row must be
/// `running` under the same token, and not parked (a parked run has no writer).
async fn hold<C: Conn>(
    tx: &mut SqlTx<C>,
    fence: &RunFence,
    step: Option<&str>,
    now: Millis,
) -> StoreResult<()> {
    let moved = exec(
        tx,
        "UPDATE run_status SET step = COALESCE($1, step), updated_at = $2, revision = revision + 1 \
         WHERE run_id = $3 AND fencing_token = $4 AND epoch = $5 AND state = 'running' \
         AND holder <> $6",
        vec![
            opt_text(step.map(str::to_owned)),
            ms(now),
            text(fence.run_id.as_str()),
            text(&fence.token),
            int(fence.epoch),
            text(PARKED_HOLDER),
        ],
    )
    .await?;
    if moved == 1 {
        Ok(())
    } else {
        Err(fenced(
            "the run is no longer running under this fencing token",
        ))
    }
}

/// Records a run's program and first status in one transaction, unless its idempotency key
/// names a recorded run (then returns that one, writing nothing).
pub(crate) async fn create<C: Conn>(
    tx: &mut SqlTx<C>,
    r: NewRun,
    now: Millis,
) -> StoreResult<RunCreated> {
    if let Some(key) = &r.idempotency_key
        && let Some(status) = by_key(tx, &r.tenant, key).await?
    {
        return Ok(RunCreated {
            status,
            created: false,
        });
    }
    let lease = lease_ms(r.lease)?;
    let inserted = exec(
        tx,
        "INSERT INTO run_status (run_id, tenant_id, state, holder, epoch, fencing_token, \
         lease_expires_at, idempotency_key, input, revision, created_at, updated_at, started_by, \
         traceparent, tracestate) \
         VALUES ($1, $2, 'running', $3, 1, $4, $5, $6, $7, 1, $8, $8, $9, $10, $11) \
         ON CONFLICT DO NOTHING",
        vec![
            text(r.run_id.as_str()),
            text(r.tenant.as_str()),
            text(&r.holder),
            text(&r.fencing_token),
            ms(now.saturating_add(lease)),
            opt_text(r.idempotency_key.clone()),
            text(&r.input),
            ms(now),
            opt_text(r.started_by.clone()),
            opt_text(r.trace.as_ref().map(|t| t.parent.to_string())),
            opt_text(
                r.trace
                    .as_ref()
                    .and_then(|t| t.state.as_ref())
                    .map(|s| s.as_str().to_owned()),
            ),
        ],
    )
    .await?;
    if inserted == 0 {
        if let Some(key) = &r.idempotency_key
            && let Some(status) = by_key(tx, &r.tenant, key).await?
        {
            return Ok(RunCreated {
                status,
                created: false,
            });
        }
        return Err(StoreError::Conflict {
            entity: "run",
            expected: 0,
            current: 1,
        });
    }
    let program = exec(
        tx,
        "INSERT INTO run_programs (run_id, tenant_id, source, sha256, created_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        vec![
            text(r.run_id.as_str()),
            text(r.tenant.as_str()),
            text(&r.source),
            text(sha256_hex(r.source.as_bytes())),
            ms(now),
        ],
    )
    .await?;
    if program == 0 {
        // A program without a status row (written by hand): the first stands.
        return Err(StoreError::Conflict {
            entity: "run_program",
            expected: 0,
            current: 1,
        });
    }
    insert_pins(tx, &r.run_id, &r.pins, 1, now).await?;
    let status = load_status(tx, None, &r.run_id)
        .await?
        .ok_or_else(|| StoreError::integrity("run_status", "a create left no row"))?;
    Ok(RunCreated {
        status,
        created: true,
    })
}

/// One run's status; `tenant` scopes it (`None`: any tenant, for the Host's own scans).
pub(crate) async fn status<C: Conn>(
    tx: &mut SqlTx<C>,
    tenant: Option<&TenantId>,
    run_id: &RunId,
) -> StoreResult<Option<RunStatus>> {
    load_status(tx, tenant, run_id).await
}

/// A tenant's runs, oldest first.
pub(crate) async fn list<C: Conn>(
    tx: &mut SqlTx<C>,
    tenant: &TenantId,
) -> StoreResult<Vec<RunStatus>> {
    let q = format!(
        "SELECT {STATUS_COLS} FROM run_status WHERE tenant_id = $1 ORDER BY created_at, run_id"
    );
    statuses(tx, &q, vec![text(tenant.as_str())]).await
}

/// A page of the runs of `tenants` in `order` of creation (the run id, unique across tenants,
/// breaks ties), starting after the run `after` (which must be a run of one of them), at most
/// `limit`, with the cursor of the next page when more follow.
pub(crate) async fn page<C: Conn>(
    tx: &mut SqlTx<C>,
    tenants: &[TenantId],
    after: Option<&RunId>,
    limit: u64,
    order: RunOrder,
) -> StoreResult<RunsPage> {
    let read = page_and_one(tx, tenants, after, limit + 1, order).await?;
    let (runs, next) = split_page(read, limit, |r| r.run_id.clone());
    Ok(RunsPage { runs, next })
}

async fn page_and_one<C: Conn>(
    tx: &mut SqlTx<C>,
    tenants: &[TenantId],
    after: Option<&RunId>,
    limit: u64,
    order: RunOrder,
) -> StoreResult<Vec<RunStatus>> {
    if tenants.is_empty() {
        return Ok(Vec::new());
    }
    let (past, direction) = match order {
        RunOrder::OldestFirst => (">", "ASC"),
        RunOrder::NewestFirst => ("<", "DESC"),
    };
    let (among, mut params) = tenant_list(tenants);
    let mut past_cursor = String::new();
    if let Some(after) = after {
        let mut lookup = params.clone();
        lookup.push(text(after.as_str()));
        let found = rows(
            tx,
            &format!(
                "SELECT created_at FROM run_status WHERE tenant_id IN ({among}) AND run_id = ${}",
                lookup.len()
            ),
            lookup,
            "run_status",
        )
        .await?;
        let Some(cursor) = found.first() else {
            return Err(StoreError::NotFound {
                entity: "run",
                key: after.to_string(),
            });
        };
        params.push(ms(cursor.i64(0)?));
        params.push(text(after.as_str()));
        let (at, id) = (params.len() - 1, params.len());
        // A row-value comparison, so both backends walk the index from the cursor on.
        past_cursor = format!(" AND (created_at, run_id) {past} (${at}, ${id})");
    }
    params.push(int(limit));
    let q = format!(
        "SELECT {STATUS_COLS} FROM run_status WHERE tenant_id IN ({among}){past_cursor} \
         ORDER BY created_at {direction}, run_id {direction} LIMIT ${}",
        params.len()
    );
    statuses(tx, &q, params).await
}

/// The tenant's [`RunsMark`].
pub(crate) async fn mark<C: Conn>(tx: &mut SqlTx<C>, tenant: &TenantId) -> StoreResult<RunsMark> {
    let found = rows(
        tx,
        "SELECT COUNT(*), CAST(COALESCE(SUM(revision), 0) AS BIGINT) FROM run_status \
         WHERE tenant_id = $1",
        vec![text(tenant.as_str())],
        "run_status",
    )
    .await?;
    match found.first() {
        Some(r) => Ok(RunsMark {
            runs: r.u64(0)?,
            revisions: r.u64(1)?,
        }),
        None => Ok(RunsMark::default()),
    }
}

/// Every run in `state`, across tenants, oldest first (at most `limit`).
pub(crate) async fn in_state<C: Conn>(
    tx: &mut SqlTx<C>,
    state: RunState,
    limit: u64,
) -> StoreResult<Vec<RunStatus>> {
    let q = format!(
        "SELECT {STATUS_COLS} FROM run_status WHERE state = $1 ORDER BY created_at, run_id LIMIT $2"
    );
    statuses(tx, &q, vec![text(state.as_str()), int(limit)]).await
}

/// A run's program, checked against its recorded SHA-256.
pub(crate) async fn program<C: Conn>(
    tx: &mut SqlTx<C>,
    run_id: &RunId,
) -> StoreResult<Option<RunProgram>> {
    let found = rows(
        tx,
        "SELECT source, sha256, created_at FROM run_programs WHERE run_id = $1",
        vec![text(run_id.as_str())],
        "run_program",
    )
    .await?;
    let Some(row) = found.first() else {
        return Ok(None);
    };
    let source = row.text(0)?;
    let sha256 = row.text(1)?;
    if sha256_hex(source.as_bytes()) != sha256 {
        return Err(StoreError::integrity(
            "run_program",
            format!("the recorded program of {run_id} does not match its SHA-256"),
        ));
    }
    Ok(Some(RunProgram {
        run_id: run_id.clone(),
        source,
        sha256,
        created_at_ms: row.i64(2)?,
    }))
}

async fn insert_pins<C: Conn>(
    tx: &mut SqlTx<C>,
    run_id: &RunId,
    pins: &[RunPin],
    epoch: u64,
    now: Millis,
) -> StoreResult<()> {
    for p in pins {
        let inserted = exec(
            tx,
            "INSERT INTO run_pins (run_id, identity, digest, epoch, pinned_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            vec![
                text(run_id.as_str()),
                text(&p.identity),
                text(&p.digest),
                int(epoch),
                ms(now),
            ],
        )
        .await?;
        if inserted != 1 {
            return Err(StoreError::Conflict {
                entity: "run_pin",
                expected: 0,
                current: 1,
            });
        }
    }
    Ok(())
}

/// The releases a run is pinned to, by identity (none: a run recorded before pinning, or a
/// program that invokes nothing).
pub(crate) async fn pins<C: Conn>(tx: &mut SqlTx<C>, run_id: &RunId) -> StoreResult<Vec<RunPin>> {
    rows(
        tx,
        "SELECT identity, digest FROM run_pins WHERE run_id = $1 ORDER BY identity",
        vec![text(run_id.as_str())],
        "run_pin",
    )
    .await?
    .iter()
    .map(|r| {
        Ok(RunPin {
            identity: r.text(0)?,
            digest: r.text(1)?,
        })
    })
    .collect()
}

/// The runs still alive (`running` or `needs_attention`) pinned to a release of `identity`,
/// with the digest each is pinned to, by run id, at most `limit`.
pub(crate) async fn live_pins_of<C: Conn>(
    tx: &mut SqlTx<C>,
    identity: &str,
    limit: u64,
) -> StoreResult<Vec<(RunId, RunPin)>> {
    rows(
        tx,
        "SELECT p.run_id, p.identity, p.digest FROM run_pins p \
         JOIN run_status s ON s.run_id = p.run_id \
         WHERE p.identity = $1 AND s.state IN ('running', 'needs_attention') \
         ORDER BY p.run_id LIMIT $2",
        vec![text(identity), int(limit)],
        "run_pin",
    )
    .await?
    .iter()
    .map(|r| {
        let run = RunId::new(r.text(0)?).map_err(|e| bad("run_pin", e))?;
        Ok((
            run,
            RunPin {
                identity: r.text(1)?,
                digest: r.text(2)?,
            },
        ))
    })
    .collect()
}

/// Pins a run recorded before pinning existed, under the driver's fence: the first pinning
/// stands (a run that has pins keeps them, and they are returned unchanged).
pub(crate) async fn pin<C: Conn>(
    tx: &mut SqlTx<C>,
    fence: RunFence,
    offered: Vec<RunPin>,
    now: Millis,
) -> StoreResult<Vec<RunPin>> {
    hold(tx, &fence, None, now).await?;
    let recorded = pins(tx, &fence.run_id).await?;
    if !recorded.is_empty() {
        return Ok(recorded);
    }
    insert_pins(tx, &fence.run_id, &offered, fence.epoch, now).await?;
    pins(tx, &fence.run_id).await
}

/// Running runs a Host may take over now, soonest due first (at most `limit`): the lease
/// expired (for a parked run: its wake-up time passed), or the holder names one of `hosts`.
/// A parked run names no Host, so it is returned only once due.
pub(crate) async fn to_take<C: Conn>(
    tx: &mut SqlTx<C>,
    now: Millis,
    hosts: &[String],
    limit: u64,
) -> StoreResult<Vec<RunStatus>> {
    let mut q = format!(
        "SELECT {STATUS_COLS} FROM run_status WHERE state = 'running' AND (lease_expires_at <= $1"
    );
    let mut params = vec![ms(now)];
    for host in hosts {
        params.push(text(format!("{host}/")));
        let n = params.len();
        q.push_str(&format!(" OR substr(holder, 1, length(${n})) = ${n}"));
    }
    params.push(int(limit));
    q.push_str(&format!(
        ") ORDER BY lease_expires_at, run_id LIMIT ${}",
        params.len()
    ));
    statuses(tx, &q, params).await
}

/// Hands a running run back to the store under the driver's fence: it keeps its epoch and
/// token, names no holder, and wakes when `until` comes (the scan of any Host takes it then).
/// Returns `false`, writing nothing, when the ask it would wait for is answered already: the
/// check and the write are one transaction under the run's row lock, which an answer takes
/// too, so an answer recorded around a park is never lost.
pub(crate) async fn park<C: Conn>(
    tx: &mut SqlTx<C>,
    fence: RunFence,
    until: ParkUntil,
    now: Millis,
) -> StoreResult<bool> {
    let current = load_status(tx, None, &fence.run_id)
        .await?
        .ok_or_else(|| StoreError::not_found("run", fence.run_id.as_str()))?;
    if current.state != RunState::Running
        || current.epoch != fence.epoch
        || current.fencing_token != fence.token
    {
        return Err(fenced(
            "the run is no longer running under this fencing token",
        ));
    }
    let wake_at = match until {
        ParkUntil::Answered(checkpoint) => {
            let answered = rows(
                tx,
                "SELECT 1 FROM run_answers WHERE run_id = $1 AND checkpoint = $2",
                vec![text(fence.run_id.as_str()), text(checkpoint)],
                "run_answer",
            )
            .await?;
            if !answered.is_empty() {
                return Ok(false);
            }
            UNTIL_ANSWERED
        }
        ParkUntil::Due(at) => at,
    };
    exec(
        tx,
        "UPDATE run_status SET holder = $1, lease_expires_at = $2, updated_at = $3, \
         revision = revision + 1 \
         WHERE run_id = $4 AND fencing_token = $5 AND epoch = $6 AND state = 'running'",
        vec![
            text(PARKED_HOLDER),
            ms(wake_at),
            ms(now),
            text(fence.run_id.as_str()),
            text(&fence.token),
            int(fence.epoch),
        ],
    )
    .await?;
    Ok(true)
}

/// Moves a running run to a new holder under epoch + 1 and a new fencing token.
pub(crate) async fn take<C: Conn>(
    tx: &mut SqlTx<C>,
    t: Takeover,
    now: Millis,
) -> StoreResult<RunStatus> {
    let current = load_status(tx, None, &t.run_id)
        .await?
        .ok_or_else(|| StoreError::not_found("run", t.run_id.as_str()))?;
    if current.state != RunState::Running {
        return Err(StoreError::state(
            "run",
            current.state.as_str(),
            "only a running run can be taken over",
        ));
    }
    if current.epoch != t.expected_epoch {
        return Err(StoreError::Conflict {
            entity: "run_status",
            expected: t.expected_epoch,
            current: current.epoch,
        });
    }
    let expired = current.lease_expires_at_ms <= now
        || host_registration_expired(tx, holder_host(&current.holder), now).await?;
    let allowed = match &t.rule {
        TakeoverRule::LeaseExpired => expired,
        TakeoverRule::HeldByOrExpired(prefix) => expired || current.holder.starts_with(prefix),
    };
    if !allowed {
        return Err(StoreError::ClaimHeld {
            field: "run",
            epoch: current.epoch,
            expires_at_ms: current.lease_expires_at_ms,
        });
    }
    let lease = lease_ms(t.lease)?;
    let moved = exec(
        tx,
        "UPDATE run_status SET holder = $1, epoch = epoch + 1, fencing_token = $2, \
         lease_expires_at = $3, updated_at = $4, revision = revision + 1 \
         WHERE run_id = $5 AND epoch = $6 AND state = 'running'",
        vec![
            text(&t.holder),
            text(&t.fencing_token),
            ms(now.saturating_add(lease)),
            ms(now),
            text(t.run_id.as_str()),
            int(t.expected_epoch),
        ],
    )
    .await?;
    if moved != 1 {
        return Err(StoreError::Conflict {
            entity: "run_status",
            expected: t.expected_epoch,
            current: current.epoch,
        });
    }
    load_status(tx, None, &t.run_id)
        .await?
        .ok_or_else(|| StoreError::integrity("run_status", "a takeover left no row"))
}

/// Whether `host` has a registration in the Host registry that has expired at `now` (no
/// registration: `false`).
async fn host_registration_expired<C: Conn>(
    tx: &mut SqlTx<C>,
    host: &str,
    now: Millis,
) -> StoreResult<bool> {
    let found = rows(
        tx,
        "SELECT expires_at FROM host_targets WHERE host_id = $1",
        vec![text(host)],
        "host_target",
    )
    .await?;
    match found.first() {
        None => Ok(false),
        Some(r) => Ok(r.i64(0)? <= now),
    }
}

/// Extends the holder's lease; refused once the fence is stale or the run was parked (a
/// renewal in flight when its driver parked must not turn the wake-up time into a lease).
pub(crate) async fn renew<C: Conn>(
    tx: &mut SqlTx<C>,
    fence: RunFence,
    lease: Duration,
    now: Millis,
) -> StoreResult<Millis> {
    let until = now.saturating_add(lease_ms(lease)?);
    let moved = exec(
        tx,
        "UPDATE run_status SET lease_expires_at = $1 \
         WHERE run_id = $2 AND fencing_token = $3 AND epoch = $4 AND state = 'running' \
         AND holder <> $5",
        vec![
            ms(until),
            text(fence.run_id.as_str()),
            text(&fence.token),
            int(fence.epoch),
            text(PARKED_HOLDER),
        ],
    )
    .await?;
    if moved == 1 {
        Ok(until)
    } else {
        Err(fenced(
            "the run is no longer running under this fencing token",
        ))
    }
}

/// Ends the holder's lease now, under the fence: a driver that stopped cleanly hands its run to
/// the next taker at once instead of letting the lease lapse. Writes nothing else.
pub(crate) async fn release<C: Conn>(
    tx: &mut SqlTx<C>,
    fence: RunFence,
    now: Millis,
) -> StoreResult<()> {
    let moved = exec(
        tx,
        "UPDATE run_status SET lease_expires_at = $1 \
         WHERE run_id = $2 AND fencing_token = $3 AND epoch = $4 AND state = 'running'",
        vec![
            ms(now),
            text(fence.run_id.as_str()),
            text(&fence.token),
            int(fence.epoch),
        ],
    )
    .await?;
    if moved == 1 {
        Ok(())
    } else {
        Err(fenced(
            "the run is no longer running under this fencing token",
        ))
    }
}

/// Appends a journal entry under the fence (and consumes the named answer with it).
pub(crate) async fn append<C: Conn>(
    tx: &mut SqlTx<C>,
    fence: RunFence,
    e: NewStepEntry,
    now: Millis,
) -> StoreResult<StepEntry> {
    hold(tx, &fence, Some(&e.step), now).await?;
    if let Some(checkpoint) = &e.consumes {
        let consumed = exec(
            tx,
            "UPDATE run_answers SET consumed_at = $1, consumed_epoch = $2 \
             WHERE run_id = $3 AND checkpoint = $4 AND consumed_at IS NULL",
            vec![
                ms(now),
                int(fence.epoch),
                text(fence.run_id.as_str()),
                text(checkpoint),
            ],
        )
        .await?;
        if consumed != 1 {
            return Err(StoreError::state(
                "run_answer",
                "absent or consumed",
                format!("checkpoint {checkpoint} has no unconsumed answer"),
            ));
        }
    }
    let q = "INSERT INTO run_journal (run_id, seq, step, kind, attempt, outcome, body, epoch, started_at, recorded_at) \
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5, $6, $7, $8, $9 FROM run_journal WHERE run_id = $1 \
         ON CONFLICT DO NOTHING";
    let inserted = exec(
        tx,
        q,
        vec![
            text(fence.run_id.as_str()),
            text(&e.step),
            text(e.kind.as_str()),
            int(e.attempt),
            opt_text(e.outcome.clone()),
            text(&e.body),
            int(fence.epoch),
            opt_ms(e.started_at_ms),
            ms(now),
        ],
    )
    .await?;
    if inserted != 1 {
        return Err(StoreError::Conflict {
            entity: "run_journal",
            expected: 0,
            current: 1,
        });
    }
    let q = format!(
        "SELECT {ENTRY_COLS} FROM run_journal WHERE run_id = $1 AND step = $2 AND kind = $3 AND attempt = $4"
    );
    let found = rows(
        tx,
        &q,
        vec![
            text(fence.run_id.as_str()),
            text(&e.step),
            text(e.kind.as_str()),
            int(e.attempt),
        ],
        "run_journal",
    )
    .await?;
    found
        .first()
        .map(decode_entry)
        .transpose()?
        .ok_or_else(|| StoreError::integrity("run_journal", "an append left no row"))
}

/// Arms a checkpoint under the fence; one armed earlier is returned unchanged (a sleep keeps
/// its first deadline).
pub(crate) async fn arm<C: Conn>(
    tx: &mut SqlTx<C>,
    fence: RunFence,
    c: NewCheckpoint,
    now: Millis,
) -> StoreResult<Checkpoint> {
    hold(tx, &fence, Some(&c.name), now).await?;
    let deadline = match c.sleep {
        Some(d) => Some(
            now.saturating_add(
                i64::try_from(d.as_millis())
                    .map_err(|_| StoreError::invalid("sleep", "is too long"))?,
            ),
        ),
        None => None,
    };
    exec(
        tx,
        "INSERT INTO run_checkpoints (run_id, name, kind, question, schema, deadline_at, armed_at, epoch) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
        vec![
            text(fence.run_id.as_str()),
            text(&c.name),
            text(c.kind.as_str()),
            opt_text(c.question.clone()),
            opt_text(c.schema.clone()),
            opt_ms(deadline),
            ms(now),
            int(fence.epoch),
        ],
    )
    .await?;
    let q =
        format!("SELECT {CHECKPOINT_COLS} FROM run_checkpoints WHERE run_id = $1 AND name = $2");
    let found = rows(
        tx,
        &q,
        vec![text(fence.run_id.as_str()), text(&c.name)],
        "run_checkpoint",
    )
    .await?;
    let armed = found
        .first()
        .map(decode_checkpoint)
        .transpose()?
        .ok_or_else(|| StoreError::integrity("run_checkpoint", "arming left no row"))?;
    if armed.kind != c.kind {
        return Err(StoreError::Conflict {
            entity: "run_checkpoint",
            expected: 0,
            current: 1,
        });
    }
    Ok(armed)
}

/// Ends (or parks for an operator) a run under the fence.
pub(crate) async fn end<C: Conn>(
    tx: &mut SqlTx<C>,
    fence: RunFence,
    how: RunEnd,
    now: Millis,
) -> StoreResult<RunStatus> {
    hold(tx, &fence, None, now).await?;
    let (state, failure, step) = match &how {
        RunEnd::Completed => (RunState::Completed, None, None),
        RunEnd::Failed(f) => (RunState::Failed, Some(f.clone()), Some(f.step.clone())),
        RunEnd::NeedsAttention { step } => (RunState::NeedsAttention, None, Some(step.clone())),
    };
    exec(
        tx,
        "UPDATE run_status SET state = $1, failure_code = $2, failure_step = $3, failure_message = $4, \
         step = COALESCE($5, step), updated_at = $6, revision = revision + 1 WHERE run_id = $7",
        vec![
            text(state.as_str()),
            opt_text(failure.as_ref().map(|f| f.code.clone())),
            opt_text(failure.as_ref().map(|f| f.step.clone())),
            opt_text(failure.as_ref().map(|f| f.message.clone())),
            opt_text(step),
            ms(now),
            text(fence.run_id.as_str()),
        ],
    )
    .await?;
    load_status(tx, None, &fence.run_id)
        .await?
        .ok_or_else(|| StoreError::integrity("run_status", "an end left no row"))
}

/// Cancels a tenant's run (running or needing attention); its driver is fenced out.
pub(crate) async fn cancel<C: Conn>(
    tx: &mut SqlTx<C>,
    tenant: TenantId,
    run_id: RunId,
    now: Millis,
) -> StoreResult<RunStatus> {
    let current = load_status(tx, Some(&tenant), &run_id)
        .await?
        .ok_or_else(|| StoreError::not_found("run", run_id.as_str()))?;
    if current.state.is_terminal() {
        return Err(StoreError::state(
            "run",
            current.state.as_str(),
            "a finished run cannot be cancelled",
        ));
    }
    exec(
        tx,
        "UPDATE run_status SET state = 'cancelled', updated_at = $1, revision = revision + 1 \
         WHERE run_id = $2",
        vec![ms(now), text(run_id.as_str())],
    )
    .await?;
    load_status(tx, None, &run_id)
        .await?
        .ok_or_else(|| StoreError::integrity("run_status", "a cancel left no row"))
}

/// Records an answer to an armed, still open `ask` or `attention` checkpoint. The same value
/// again is [`AnswerRecorded::Unchanged`]; another value is `conflict`. Answering an attention
/// checkpoint hands the run back to `running` with an expired lease, so a Host takes it over;
/// answering the ask a parked run waits for makes it due at once, likewise.
pub(crate) async fn answer<C: Conn>(
    tx: &mut SqlTx<C>,
    tenant: TenantId,
    run_id: RunId,
    checkpoint: String,
    value: String,
    answerer: String,
    now: Millis,
) -> StoreResult<AnswerRecorded> {
    let status = load_status(tx, Some(&tenant), &run_id)
        .await?
        .ok_or_else(|| StoreError::not_found("run", run_id.as_str()))?;
    if status.state.is_terminal() {
        return Err(StoreError::state(
            "run",
            status.state.as_str(),
            "a finished run takes no answers",
        ));
    }
    let q =
        format!("SELECT {CHECKPOINT_COLS} FROM run_checkpoints WHERE run_id = $1 AND name = $2");
    let armed = rows(
        tx,
        &q,
        vec![text(run_id.as_str()), text(&checkpoint)],
        "run_checkpoint",
    )
    .await?
    .first()
    .map(decode_checkpoint)
    .transpose()?;
    let open = armed
        .as_ref()
        .is_some_and(|c| matches!(c.kind, CheckpointKind::Ask | CheckpointKind::Attention));
    if !open {
        return Err(StoreError::not_found(
            "checkpoint",
            format!("{run_id}/{checkpoint}"),
        ));
    }
    let q = format!("SELECT {ANSWER_COLS} FROM run_answers WHERE run_id = $1 AND checkpoint = $2");
    let earlier = rows(
        tx,
        &q,
        vec![text(run_id.as_str()), text(&checkpoint)],
        "run_answer",
    )
    .await?
    .first()
    .map(decode_answer)
    .transpose()?;
    if let Some(a) = earlier {
        let same = serde_json::from_str::<serde_json::Value>(&a.value).ok()
            == serde_json::from_str::<serde_json::Value>(&value).ok()
            && a.answerer == answerer;
        return if same {
            Ok(AnswerRecorded::Unchanged(a))
        } else {
            Err(StoreError::Conflict {
                entity: "run_answer",
                expected: 0,
                current: 1,
            })
        };
    }
    let result = rows(
        tx,
        "SELECT 1 FROM run_journal WHERE run_id = $1 AND step = $2 AND kind = 'result'",
        vec![text(run_id.as_str()), text(&checkpoint)],
        "run_journal",
    )
    .await?;
    if !result.is_empty() {
        return Err(StoreError::not_found(
            "checkpoint",
            format!("{run_id}/{checkpoint}"),
        ));
    }
    exec(
        tx,
        "INSERT INTO run_answers (run_id, checkpoint, value, answerer, answered_at) VALUES ($1, $2, $3, $4, $5)",
        vec![
            text(run_id.as_str()),
            text(&checkpoint),
            text(&value),
            text(&answerer),
            ms(now),
        ],
    )
    .await?;
    let kind = armed.map(|c| c.kind);
    if status.is_parked() && kind == Some(CheckpointKind::Ask) {
        // The run waits for exactly this: due now, for the first Host that looks.
        exec(
            tx,
            "UPDATE run_status SET lease_expires_at = 0, updated_at = $1, \
             revision = revision + 1 WHERE run_id = $2 AND state = 'running' AND holder = $3",
            vec![ms(now), text(run_id.as_str()), text(PARKED_HOLDER)],
        )
        .await?;
    }
    if status.state == RunState::NeedsAttention && kind == Some(CheckpointKind::Attention) {
        exec(
            tx,
            "UPDATE run_status SET state = 'running', lease_expires_at = 0, updated_at = $1, \
             revision = revision + 1 WHERE run_id = $2 AND state = 'needs_attention'",
            vec![ms(now), text(run_id.as_str())],
        )
        .await?;
    }
    Ok(AnswerRecorded::Recorded(RunAnswer {
        checkpoint,
        value,
        answerer,
        answered_at_ms: now,
        consumed_at_ms: None,
        consumed_epoch: None,
    }))
}

/// A run's journal in order.
pub(crate) async fn journal<C: Conn>(
    tx: &mut SqlTx<C>,
    run_id: &RunId,
) -> StoreResult<Vec<StepEntry>> {
    let q = format!("SELECT {ENTRY_COLS} FROM run_journal WHERE run_id = $1 ORDER BY seq");
    rows(tx, &q, vec![text(run_id.as_str())], "run_journal")
        .await?
        .iter()
        .map(decode_entry)
        .collect()
}

/// A run's checkpoints, in the order they were armed.
pub(crate) async fn checkpoints<C: Conn>(
    tx: &mut SqlTx<C>,
    run_id: &RunId,
) -> StoreResult<Vec<Checkpoint>> {
    let q = format!(
        "SELECT {CHECKPOINT_COLS} FROM run_checkpoints WHERE run_id = $1 ORDER BY armed_at, name"
    );
    rows(tx, &q, vec![text(run_id.as_str())], "run_checkpoint")
        .await?
        .iter()
        .map(decode_checkpoint)
        .collect()
}

/// A run's answers, by checkpoint.
pub(crate) async fn answers<C: Conn>(
    tx: &mut SqlTx<C>,
    run_id: &RunId,
) -> StoreResult<Vec<RunAnswer>> {
    let q = format!(
        "SELECT {ANSWER_COLS} FROM run_answers WHERE run_id = $1 ORDER BY answered_at, checkpoint"
    );
    rows(tx, &q, vec![text(run_id.as_str())], "run_answer")
        .await?
        .iter()
        .map(decode_answer)
        .collect()
}
