//! Every store operation, written once over [`Tx`], the row primitives a backend provides inside
//! one transaction. Owns the order of reads and conditional writes of each operation; the rules
//! themselves live in [`crate::machine`]. Never opens or commits a transaction (the backend does)
//! and never reads a clock (the backend passes its `now`).
//!
//! The command lifecycle's writes (admit, claim, begin attempt, reject, settle, cursor, journal
//! append) use merged primitives: a backend may read the rows and write the operation's
//! presumed effect in one statement (PostgreSQL), or read them with plain statements and leave
//! the write to the operation (SQLite). Either way the operation decides with the machine on
//! the rows as they were, and [`reconcile`] keeps a presumed write only when it is exactly what
//! the machine decided.

use std::sync::Arc;

use wire_enum::wire_enum;

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::evidence::{EvidenceReader, EvidenceRouter};
use crate::ids::*;
use crate::journal::*;
use crate::limits::{MAX_INLINE_BODY_BYTES, MAX_OPEN_GATES};
use crate::machine::{self, Transition};
use crate::model::*;

/// Where an offloaded journal body lives.
#[derive(Clone, Debug)]
pub(crate) enum BodySlot {
    Inline(Vec<u8>),
    Object(ObjectId),
}

/// A journal row to insert.
#[derive(Clone, Debug)]
pub(crate) struct JournalRow {
    pub runtime_session: RuntimeSessionId,
    pub seq: u64,
    pub epoch: JournalEpoch,
    pub written_at_ms: Millis,
    pub kind: RowKind,
    pub event: Option<EventId>,
    pub public_body: Option<BodySlot>,
    pub private_body: Option<BodySlot>,
    pub cause: Option<RuntimeCommandId>,
    pub identity: Option<CommandIdentity>,
    pub attempt: Option<AttemptId>,
    pub attempt_epoch: Option<JournalEpoch>,
    pub outcome: Option<Disposition>,
    pub detail: Option<Vec<u8>>,
}

wire_enum! {
    /// Which transition a [`Transitioning`] presumes, as the transition statement's `kind`
    /// column spells it.
    pub(crate) enum TransitionKind {
        Claim = "claim",
        Attempt = "attempt",
        Reject = "reject",
    }
    kind = "transition";
}

/// A command transition as a backend may write it in the statement that reads the row: the
/// row's key, the revision and `now` it is decided at, the claim token it names, and the
/// effect it writes when it changes the record.
pub(crate) struct Transitioning<'a> {
    pub kind: TransitionKind,
    pub tenant: &'a TenantId,
    pub session: &'a SessionId,
    pub command: &'a CommandId,
    pub expected_revision: u64,
    pub now: Millis,
    pub token: Option<uuid::Uuid>,
    pub effect: &'a machine::Effect,
}

/// A command row as a transition found it (locked), and the row the backend wrote when it
/// wrote the presumed effect in the same statement.
pub(crate) struct Found {
    pub before: CommandRecord,
    pub written: Option<CommandRecord>,
    /// The session's residency lease as the same read saw it (claims and attempts are fenced
    /// by it; see `machine::residency_fence`).
    pub residency: Option<ResidencyLease>,
}

/// What an admission found and did: the session's existence, the command already admitted
/// under the id, or the acceptance order the new command was inserted at.
pub(crate) struct Admitted {
    pub session: bool,
    pub existing: Option<CommandRecord>,
    pub order: Option<u64>,
}

/// What settlement reads from the store's own journal and catalog (and the row it wrote when
/// the backend settled in the same statement).
pub(crate) struct SettleRead {
    pub session: Option<SessionRecord>,
    pub before: Option<CommandRecord>,
    /// The journal's applications and closures of the command (none unless the tenant owns it).
    pub evidence: Vec<JournalRow>,
    pub written: Option<CommandRecord>,
}

/// What a cursor save found (and whether the backend wrote the new position already).
pub(crate) struct CursorRead {
    pub session: bool,
    pub current: Option<Cursor>,
    pub wrote: bool,
}

/// What a merged append found: the lease row, a disposition the journal already holds for an
/// application being appended, and the new tip when the records were written.
pub(crate) struct Appended {
    pub lease: Option<JournalLeaseState>,
    pub disposed: Option<RuntimeCommandId>,
    pub tip: Option<u64>,
}

/// Row primitives one backend transaction (or read connection) provides.
pub(crate) trait Tx {
    async fn session(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<Option<SessionRecord>>;
    async fn insert_session(&mut self, rec: &SessionRecord, next_order: u64) -> StoreResult<()>;
    async fn update_session(&mut self, rec: &SessionRecord) -> StoreResult<()>;
    /// Takes the session's next acceptance order and bumps it (and `last_active`).
    async fn take_order(&mut self, t: &TenantId, s: &SessionId, now: Millis) -> StoreResult<u64>;
    async fn list_sessions(
        &mut self,
        t: &TenantId,
        after: Option<&SessionId>,
        limit: usize,
    ) -> StoreResult<Vec<SessionRecord>>;

    async fn lease(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<Option<ResidencyLease>>;
    async fn put_lease(&mut self, lease: &ResidencyLease) -> StoreResult<()>;

    async fn registration(
        &mut self,
        t: &TenantId,
        s: &SessionId,
    ) -> StoreResult<Option<HostRegistration>>;
    async fn put_registration(&mut self, reg: &HostRegistration) -> StoreResult<()>;

    async fn target(&mut self, host: &HostId) -> StoreResult<Option<HostTarget>>;
    async fn put_target(&mut self, target: &HostTarget) -> StoreResult<()>;
    async fn targets(&mut self) -> StoreResult<Vec<HostTarget>>;

    async fn command(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        c: &CommandId,
    ) -> StoreResult<Option<CommandRecord>>;
    async fn command_by_runtime_id(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<Option<CommandRecord>>;
    async fn insert_command(&mut self, rec: &CommandRecord) -> StoreResult<()>;
    /// Writes `rec` where the stored revision is `old_revision`; false when no row matched.
    async fn update_command(&mut self, old_revision: u64, rec: &CommandRecord)
    -> StoreResult<bool>;
    async fn commands_after(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        after_order: u64,
        limit: usize,
    ) -> StoreResult<Vec<CommandRecord>>;
    /// The newest `limit` commands, newest first.
    async fn commands_newest(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        limit: usize,
    ) -> StoreResult<Vec<CommandRecord>>;

    async fn cursor(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<Option<Cursor>>;
    /// Writes the cursor where the stored one has neither a higher epoch nor a higher order;
    /// false when it had.
    async fn put_cursor(&mut self, t: &TenantId, s: &SessionId, c: Cursor) -> StoreResult<bool>;

    // Merged primitives of the command lifecycle (see the module comment).

    /// Counts a presumed write undone (`true`), or a change written after the merged
    /// statement presumed none (`false`).
    fn note_presumption(&mut self, undone: bool);

    /// Admits `rec` at the session's next acceptance order (its own order is ignored), unless
    /// the session is missing or a command with its id exists.
    async fn admit_command(&mut self, rec: &CommandRecord, now: Millis) -> StoreResult<Admitted>;
    /// Reads (and locks) the command a transition applies to; `None` when it does not exist.
    async fn transition_command(&mut self, step: &Transitioning<'_>) -> StoreResult<Option<Found>>;
    /// Reads what settlement from the store's own journal decides on.
    async fn settle_command(&mut self, req: &SettleRequest, now: Millis)
    -> StoreResult<SettleRead>;
    /// Reads (and locks) the cursor a save applies to.
    async fn cursor_write(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        order: u64,
        epoch: ResidencyEpoch,
    ) -> StoreResult<CursorRead>;
    /// Appends inline records at `lease.tip` in one statement; `None` when this backend has no
    /// merged append (the operation then runs its steps).
    async fn append_records(
        &mut self,
        lease: &JournalLease,
        rows: &[JournalRow],
    ) -> StoreResult<Option<Appended>>;

    async fn gate(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        g: &GateId,
    ) -> StoreResult<Option<GateRecord>>;
    async fn count_open_gates(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<usize>;
    async fn put_gate(&mut self, g: &GateRecord) -> StoreResult<()>;
    async fn gates(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        open_only: bool,
    ) -> StoreResult<Vec<GateRecord>>;

    async fn insert_object(&mut self, o: &StoredObject, now: Millis) -> StoreResult<()>;
    async fn object(&mut self, id: &ObjectId) -> StoreResult<Option<StoredObject>>;

    async fn journal_lease(
        &mut self,
        rs: RuntimeSessionId,
    ) -> StoreResult<Option<JournalLeaseState>>;
    async fn put_journal_lease(&mut self, l: &JournalLeaseState) -> StoreResult<()>;
    async fn insert_journal_row(&mut self, row: &JournalRow) -> StoreResult<()>;
    async fn has_disposition(
        &mut self,
        rs: RuntimeSessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<bool>;
    async fn has_effect(&mut self, rs: RuntimeSessionId, rc: RuntimeCommandId)
    -> StoreResult<bool>;
    async fn journal_rows(
        &mut self,
        rs: RuntimeSessionId,
        after: u64,
        upto: u64,
        limit: usize,
        events_only: bool,
    ) -> StoreResult<Vec<JournalRow>>;
    /// How many public events the journal of `rs` holds up to and including `through`.
    async fn public_event_count(&mut self, rs: RuntimeSessionId, through: u64) -> StoreResult<u64>;
    /// The public events of `rs` in sequence order, skipping the first `skip` of them.
    async fn public_event_rows(
        &mut self,
        rs: RuntimeSessionId,
        skip: u64,
        limit: usize,
    ) -> StoreResult<Vec<JournalRow>>;
    /// The applications and closures of `rc` in the journal of `rs`, in sequence order; none
    /// unless tenant `t` owns that journal. Takes no row lock.
    async fn journal_dispositions(
        &mut self,
        t: &TenantId,
        rs: RuntimeSessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<Vec<JournalRow>>;
}

fn session_key(t: &TenantId, s: &SessionId) -> String {
    format!("{t}/{s}")
}

async fn require_session<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    s: &SessionId,
) -> StoreResult<SessionRecord> {
    tx.session(t, s)
        .await?
        .ok_or_else(|| StoreError::not_found("session", session_key(t, s)))
}

// ---- sessions -------------------------------------------------------------------------------

pub(crate) async fn create_session<T: Tx>(
    tx: &mut T,
    new: &NewSession,
    now: Millis,
) -> StoreResult<SessionRecord> {
    if let Some(existing) = tx.session(&new.tenant, &new.session).await? {
        if existing.agent != new.agent {
            return Err(StoreError::CommandMismatch { field: "agent_id" });
        }
        if existing.compatibility != new.compatibility {
            return Err(StoreError::CommandMismatch {
                field: "runtime_compatibility_id",
            });
        }
        if existing.binding != new.binding {
            return Err(StoreError::CommandMismatch { field: "binding" });
        }
        return Ok(existing);
    }
    let rec = SessionRecord {
        tenant: new.tenant.clone(),
        session: new.session.clone(),
        agent: new.agent.clone(),
        compatibility: new.compatibility.clone(),
        binding: new.binding.clone(),
        created_at_ms: now,
        last_active_ms: now,
        residency_state: ResidencyState::None,
        last_journal_seq: 0,
        checkpoint_seq: 0,
        gate_mark: ResidencyEpoch(0),
    };
    tx.insert_session(&rec, 1).await?;
    Ok(rec)
}

pub(crate) async fn fence_gate_mark<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    s: &SessionId,
    epoch: ResidencyEpoch,
) -> StoreResult<ResidencyEpoch> {
    let mut rec = require_session(tx, t, s).await?;
    let mark = machine::fence("session.gate_mark", rec.gate_mark.0, epoch.0)?;
    if mark != rec.gate_mark.0 {
        rec.gate_mark = ResidencyEpoch(mark);
        tx.update_session(&rec).await?;
    }
    Ok(rec.gate_mark)
}

pub(crate) async fn update_projection<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    s: &SessionId,
    epoch: ResidencyEpoch,
    p: &SessionProjection,
    now: Millis,
) -> StoreResult<SessionRecord> {
    let mut rec = require_session(tx, t, s).await?;
    let mark = machine::fence("session.gate_mark", rec.gate_mark.0, epoch.0)?;
    rec.gate_mark = ResidencyEpoch(mark);
    rec.residency_state = p.residency_state;
    rec.last_journal_seq = p.last_journal_seq;
    rec.checkpoint_seq = p.checkpoint_seq;
    rec.last_active_ms = now;
    tx.update_session(&rec).await?;
    Ok(rec)
}

// ---- residency ------------------------------------------------------------------------------

pub(crate) async fn acquire_residency<T: Tx>(
    tx: &mut T,
    req: &ResidencyRequest,
    now: Millis,
) -> StoreResult<ResidencyGrant> {
    require_session(tx, &req.tenant, &req.session).await?;
    let ttl = crate::limits::ttl_ms("residency_ttl", req.ttl, crate::limits::MAX_LEASE_TTL)?;
    let current = tx.lease(&req.tenant, &req.session).await?;
    let (grant, changed) = machine::acquire_residency(current.as_ref(), req, ttl, now)?;
    if changed {
        tx.put_lease(&ResidencyLease {
            tenant: grant.tenant.clone(),
            session: grant.session.clone(),
            epoch: grant.epoch,
            holder: Some(grant.holder.clone()),
            host: Some(grant.host.clone()),
            host_generation: Some(grant.host_generation),
            expires_at_ms: Some(grant.expires_at_ms),
        })
        .await?;
    }
    Ok(grant)
}

pub(crate) async fn renew_residency<T: Tx>(
    tx: &mut T,
    grant: &ResidencyGrant,
    ttl_ms: i64,
    now: Millis,
) -> StoreResult<ResidencyGrant> {
    let mut lease = tx
        .lease(&grant.tenant, &grant.session)
        .await?
        .ok_or_else(|| {
            StoreError::not_found("residency", session_key(&grant.tenant, &grant.session))
        })?;
    machine::renew_residency(&lease, grant, now)?;
    let expires = now.saturating_add(ttl_ms);
    lease.expires_at_ms = Some(expires);
    tx.put_lease(&lease).await?;
    Ok(ResidencyGrant {
        expires_at_ms: expires,
        ..grant.clone()
    })
}

pub(crate) async fn release_residency<T: Tx>(
    tx: &mut T,
    grant: &ResidencyGrant,
) -> StoreResult<()> {
    let Some(mut lease) = tx.lease(&grant.tenant, &grant.session).await? else {
        return Err(StoreError::not_found(
            "residency",
            session_key(&grant.tenant, &grant.session),
        ));
    };
    // A superseded or already-released grant holds nothing: releasing it changes nothing.
    if lease.epoch != grant.epoch || lease.holder.as_deref() != Some(grant.holder.as_str()) {
        return Ok(());
    }
    lease.holder = None;
    lease.expires_at_ms = None;
    tx.put_lease(&lease).await
}

// ---- registry -------------------------------------------------------------------------------

pub(crate) async fn put_registration<T: Tx>(
    tx: &mut T,
    u: &RegistrationUpdate,
    ttl_ms: i64,
    now: Millis,
) -> StoreResult<HostRegistration> {
    require_session(tx, &u.tenant, &u.session).await?;
    let mark = match tx.registration(&u.tenant, &u.session).await? {
        Some(existing) => machine::fence(
            "registration.lease_epoch",
            existing.lease_epoch.0,
            u.lease_epoch.0,
        )?,
        None => u.lease_epoch.0,
    };
    let reg = HostRegistration {
        tenant: u.tenant.clone(),
        session: u.session.clone(),
        host: u.host.clone(),
        host_generation: u.host_generation,
        endpoint: u.endpoint.clone(),
        residency: u.residency,
        accepting: u.accepting,
        lease_epoch: ResidencyEpoch(mark),
        observed_at_ms: now,
        expires_at_ms: now.saturating_add(ttl_ms),
    };
    tx.put_registration(&reg).await?;
    Ok(reg)
}

pub(crate) async fn tombstone_registration<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    s: &SessionId,
    epoch: ResidencyEpoch,
    now: Millis,
) -> StoreResult<HostRegistration> {
    let mut reg = tx
        .registration(t, s)
        .await?
        .ok_or_else(|| StoreError::not_found("registration", session_key(t, s)))?;
    let mark = machine::fence("registration.lease_epoch", reg.lease_epoch.0, epoch.0)?;
    reg.lease_epoch = ResidencyEpoch(mark);
    reg.residency = ResidencyState::Released;
    reg.accepting = false;
    reg.observed_at_ms = now;
    tx.put_registration(&reg).await?;
    Ok(reg)
}

pub(crate) async fn advertise<T: Tx>(
    tx: &mut T,
    a: &HostAdvertisement,
    ttl_ms: i64,
    now: Millis,
) -> StoreResult<HostTarget> {
    let existing = tx.target(&a.host).await?;
    if let Some(existing) = &existing {
        machine::fence("host_target.generation", existing.generation, a.generation)?;
    }
    let target = HostTarget {
        host: a.host.clone(),
        endpoint: a.endpoint.clone(),
        placement: a.placement,
        isolation_class: a.isolation_class.clone(),
        capacity: a.capacity,
        accepting: a.accepting,
        generation: a.generation,
        observed_at_ms: now,
        expires_at_ms: now.saturating_add(ttl_ms),
        // A plain advertisement keeps the weight the last heartbeat published.
        weight_used: existing.map_or(0, |e| e.weight_used),
    };
    tx.put_target(&target).await?;
    Ok(target)
}

// ---- commands -------------------------------------------------------------------------------

pub(crate) async fn admit<T: Tx>(
    tx: &mut T,
    c: &NewCommand,
    runtime_command: RuntimeCommandId,
    now: Millis,
) -> StoreResult<(CommandRecord, bool)> {
    let (digest, size) = machine::body_digest(&c.body);
    let within = i64::try_from(c.apply_within.as_millis())
        .map_err(|_| StoreError::invalid("apply_within", "is too large"))?;
    let mut rec = CommandRecord {
        tenant: c.tenant.clone(),
        session: c.session.clone(),
        command: c.command.clone(),
        kind: c.kind,
        body: c.body.clone(),
        body_digest: digest,
        body_size: size,
        principal: c.principal.clone(),
        metadata: c.metadata.clone(),
        runtime_command,
        // Taken by the primitive, under the session row's lock, so acceptance order is
        // gap-free and monotonic per session.
        accepted_order: 0,
        admitted_at_ms: now,
        apply_deadline_ms: now.saturating_add(within),
        trace: c.trace.clone(),
        state: CommandState::Pending,
        revision: 1,
        epoch_mark: ResidencyEpoch(0),
        claim: None,
        attempt: None,
        outcome: None,
        reason: None,
        evidence_seq: None,
        settled_at_ms: None,
    };
    let admitted = tx.admit_command(&rec, now).await?;
    if !admitted.session {
        return Err(StoreError::not_found(
            "session",
            session_key(&c.tenant, &c.session),
        ));
    }
    if let Some(existing) = admitted.existing {
        machine::check_admission_retry(&existing, c)?;
        return Ok((existing, false));
    }
    rec.accepted_order = admitted
        .order
        .ok_or_else(|| StoreError::integrity("command", "the admission took no order"))?;
    Ok((rec, true))
}

async fn require_command<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    s: &SessionId,
    c: &CommandId,
) -> StoreResult<CommandRecord> {
    tx.command(t, s, c)
        .await?
        .ok_or_else(|| StoreError::not_found("command", format!("{t}/{s}/{c}")))
}

async fn apply<T: Tx>(
    tx: &mut T,
    before: &CommandRecord,
    t: Transition,
) -> StoreResult<CommandRecord> {
    match t {
        Transition::Unchanged(r) => Ok(r),
        Transition::Changed(r) => {
            if tx.update_command(before.revision, &r).await? {
                Ok(r)
            } else {
                Err(StoreError::Conflict {
                    entity: "command",
                    expected: before.revision,
                    current: before.revision + 1,
                })
            }
        }
    }
}

/// Keeps what a merged primitive wrote only when it is exactly the transition the machine
/// decided on the row as it was. Otherwise the presumed write is put back first (the statement
/// restated a check more loosely than the machine: a bug, logged), and then the machine's
/// decision is carried out as if nothing had been written: a change written conditionally on
/// the revision it was decided at, a replay or a refusal returned as it is.
async fn reconcile<T: Tx>(
    tx: &mut T,
    before: &CommandRecord,
    written: Option<CommandRecord>,
    decided: StoreResult<Transition>,
) -> StoreResult<CommandRecord> {
    if let Some(w) = written {
        if let Ok(Transition::Changed(next)) = &decided
            && *next == w
        {
            return Ok(w);
        }
        tracing::error!(
            command = %before.command,
            state = %before.state,
            "a merged statement wrote a transition the state machine did not make; undoing it"
        );
        undo(tx, before, &w).await?;
    } else if matches!(decided, Ok(Transition::Changed(_))) {
        tx.note_presumption(false);
    }
    match decided {
        Ok(t) => apply(tx, before, t).await,
        Err(e) => Err(e),
    }
}

/// Puts `before` back over the row a presumed write turned into `written`.
async fn undo<T: Tx>(
    tx: &mut T,
    before: &CommandRecord,
    written: &CommandRecord,
) -> StoreResult<()> {
    tx.note_presumption(true);
    if tx.update_command(written.revision, before).await? {
        Ok(())
    } else {
        Err(StoreError::integrity(
            "command",
            "a presumed write could not be undone",
        ))
    }
}

fn transitioning<'a>(
    kind: TransitionKind,
    (tenant, session, command): (&'a TenantId, &'a SessionId, &'a CommandId),
    expected_revision: u64,
    now: Millis,
    token: Option<uuid::Uuid>,
    effect: &'a machine::Effect,
) -> Transitioning<'a> {
    Transitioning {
        kind,
        tenant,
        session,
        command,
        expected_revision,
        now,
        token,
        effect,
    }
}

fn command_not_found(t: &TenantId, s: &SessionId, c: &CommandId) -> StoreError {
    StoreError::not_found("command", format!("{t}/{s}/{c}"))
}

pub(crate) async fn claim<T: Tx>(
    tx: &mut T,
    req: &ClaimRequest,
    now: Millis,
) -> StoreResult<CommandRecord> {
    let effect = machine::claim_effect(req, now)?;
    let key = (&req.tenant, &req.session, &req.command);
    let step = transitioning(
        TransitionKind::Claim,
        key,
        req.expected_revision,
        now,
        Some(req.token),
        &effect,
    );
    let found = tx
        .transition_command(&step)
        .await?
        .ok_or_else(|| command_not_found(key.0, key.1, key.2))?;
    let decided = machine::claim(&found.before, found.residency.as_ref(), req, now);
    reconcile(tx, &found.before, found.written, decided).await
}

pub(crate) async fn reject<T: Tx>(
    tx: &mut T,
    req: &RejectRequest,
    now: Millis,
) -> StoreResult<CommandRecord> {
    let effect = machine::reject_effect(req)?;
    let key = (&req.tenant, &req.session, &req.command);
    let step = transitioning(
        TransitionKind::Reject,
        key,
        req.expected_revision,
        now,
        None,
        &effect,
    );
    let found = tx
        .transition_command(&step)
        .await?
        .ok_or_else(|| command_not_found(key.0, key.1, key.2))?;
    let decided = machine::reject(&found.before, req);
    reconcile(tx, &found.before, found.written, decided).await
}

pub(crate) async fn begin_attempt<T: Tx>(
    tx: &mut T,
    req: &AttemptRequest,
    now: Millis,
) -> StoreResult<CommandRecord> {
    let effect = machine::attempt_effect(req, now)?;
    let key = (&req.tenant, &req.session, &req.command);
    let step = transitioning(
        TransitionKind::Attempt,
        key,
        req.expected_revision,
        now,
        Some(req.claim_token),
        &effect,
    );
    let found = tx
        .transition_command(&step)
        .await?
        .ok_or_else(|| command_not_found(key.0, key.1, key.2))?;
    let decided = machine::begin_attempt(&found.before, found.residency.as_ref(), req, now);
    reconcile(tx, &found.before, found.written, decided).await
}

pub(crate) async fn write_settlement<T: Tx>(
    tx: &mut T,
    req: &SettleRequest,
    frame: &DispositionFrame,
    now: Millis,
) -> StoreResult<CommandRecord> {
    let rec = require_command(tx, &req.tenant, &req.session, &req.command).await?;
    let t = machine::settle(&rec, req, frame, now)?;
    apply(tx, &rec, t).await
}

/// Picks the one disposition frame for a command, or says why there is none.
pub(crate) fn single_frame(
    frames: &[DispositionFrame],
    rec: &CommandRecord,
) -> StoreResult<DispositionFrame> {
    match frames {
        [] => Err(StoreError::evidence(format!(
            "the journal holds no disposition for attempt {}",
            rec.attempt
                .as_ref()
                .map_or_else(|| "-".to_owned(), |a| a.id.to_string())
        ))),
        [one] => Ok(one.clone()),
        _ => Err(StoreError::evidence(format!(
            "the journal holds {} dispositions for one command",
            frames.len()
        ))),
    }
}

/// How a settlement went in its write transaction.
pub(crate) enum Settlement {
    /// Settled from this store's own journal.
    Settled(Box<CommandRecord>),
    /// The session's evidence is in another journal store, read through `reader`; nothing
    /// was written.
    Elsewhere {
        session: SessionRecord,
        reader: Arc<dyn EvidenceReader>,
    },
}

/// Settlement: the session, its storage binding routed, and, when the evidence is in this
/// store's own journal, the command row, the journal's dispositions and the terminal state, all
/// in one transaction (on PostgreSQL in one statement, which may settle presumptively; the
/// presumed write is kept only when the router and the machine agree with it).
pub(crate) async fn settle<T: Tx>(
    tx: &mut T,
    req: &SettleRequest,
    router: &dyn EvidenceRouter,
    now: Millis,
) -> StoreResult<Settlement> {
    let read = tx.settle_command(req, now).await?;
    let written = read.written.clone();
    match decide_settlement(tx, read, req, router, now).await {
        Ok(Decided::Transition(decided)) => {
            let (before, decided) = *decided;
            let settled = reconcile(tx, &before, written, Ok(decided)).await?;
            Ok(Settlement::Settled(Box::new(settled)))
        }
        Ok(Decided::Elsewhere(elsewhere)) => {
            let (before, session, reader) = *elsewhere;
            if let (Some(before), Some(w)) = (before, written) {
                // The own journal happened to hold a matching frame, but this binding's
                // evidence lives elsewhere: the presumed settlement does not stand.
                undo(tx, &before, &w).await?;
            }
            Ok(Settlement::Elsewhere { session, reader })
        }
        Err((before, e)) => {
            if let (Some(before), Some(w)) = (before, written) {
                // Refused on what the statement read: its presumed settlement does not stand.
                undo(tx, &before, &w).await?;
            }
            Err(e)
        }
    }
}

/// What settlement decided from what it read (nothing written yet).
enum Decided {
    Transition(Box<(CommandRecord, Transition)>),
    Elsewhere(
        Box<(
            Option<CommandRecord>,
            SessionRecord,
            Arc<dyn EvidenceReader>,
        )>,
    ),
}

async fn decide_settlement<T: Tx>(
    tx: &mut T,
    read: SettleRead,
    req: &SettleRequest,
    router: &dyn EvidenceRouter,
    now: Millis,
) -> Result<Decided, (Option<CommandRecord>, StoreError)> {
    let before = read.before;
    let fail = |before: &Option<CommandRecord>, e: StoreError| (before.clone(), e);
    let Some(session) = read.session else {
        return Err(fail(
            &before,
            StoreError::not_found("session", session_key(&req.tenant, &req.session)),
        ));
    };
    let Some(reader) = router.route(&req.tenant, &session.binding.storage_binding_id) else {
        return Err(fail(
            &before,
            StoreError::Unroutable {
                storage_binding: session.binding.storage_binding_id.to_string(),
            },
        ));
    };
    if !reader.is_own_journal() {
        return Ok(Decided::Elsewhere(Box::new((before, session, reader))));
    }
    let Some(rec) = before else {
        return Err((
            None,
            command_not_found(&req.tenant, &req.session, &req.command),
        ));
    };
    if let Err(e) = machine::require_attempt(&rec) {
        return Err((Some(rec), e));
    }
    let mut frames = Vec::with_capacity(read.evidence.len());
    for row in read.evidence {
        match row_to_record(tx, row).await {
            Ok(r) => frames.extend(r.disposition_frame()),
            Err(e) => return Err((Some(rec), e)),
        }
    }
    let frame = match single_frame(&frames, &rec) {
        Ok(f) => f,
        Err(e) => return Err((Some(rec), e)),
    };
    match machine::settle(&rec, req, &frame, now) {
        Ok(t) => Ok(Decided::Transition(Box::new((rec, t)))),
        Err(e) => Err((Some(rec), e)),
    }
}

pub(crate) async fn save_cursor<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    s: &SessionId,
    order: u64,
    epoch: ResidencyEpoch,
) -> StoreResult<Cursor> {
    let read = tx.cursor_write(t, s, order, epoch).await?;
    if !read.session {
        return Err(StoreError::not_found("session", session_key(t, s)));
    }
    // A refusal after a presumed write fails the operation, and its transaction is undone.
    let next = match machine::save_cursor(read.current, order, epoch) {
        Ok(next) => next,
        Err(e) => {
            if read.wrote {
                tx.note_presumption(true);
            }
            return Err(e);
        }
    };
    if read.wrote || read.current == Some(next) {
        return Ok(next);
    }
    tx.note_presumption(false);
    if !tx.put_cursor(t, s, next).await? {
        // Moved by another writer between the read and the write: decide again on it.
        let current = tx.cursor(t, s).await?;
        let next = machine::save_cursor(current, order, epoch)?;
        if current != Some(next) && !tx.put_cursor(t, s, next).await? {
            return Err(StoreError::unavailable(
                "the cursor kept moving under a concurrent writer",
            ));
        }
        return Ok(next);
    }
    Ok(next)
}

// ---- gates ----------------------------------------------------------------------------------

pub(crate) async fn open_gate<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    s: &SessionId,
    epoch: ResidencyEpoch,
    g: &OpenGate,
    now: Millis,
) -> StoreResult<GateRecord> {
    fence_gate_mark(tx, t, s, epoch).await?;
    if let Some(existing) = tx.gate(t, s, &g.gate).await? {
        return Ok(existing);
    }
    let open = tx.count_open_gates(t, s).await?;
    if open >= MAX_OPEN_GATES {
        return Err(StoreError::state(
            "gate_projection",
            format!("{open} open"),
            format!("at most {MAX_OPEN_GATES} gates may be open per session"),
        ));
    }
    let rec = GateRecord {
        tenant: t.clone(),
        session: s.clone(),
        gate: g.gate.clone(),
        opened_event: g.opened_event.clone(),
        opened_seq: g.opened_seq,
        kind: g.kind.clone(),
        prompt_summary: g.prompt_summary.clone(),
        deadline_ms: g.deadline_ms,
        state: GateState::Open,
        opened_at_ms: now,
        resolved_seq: None,
        resolved_at_ms: None,
    };
    tx.put_gate(&rec).await?;
    Ok(rec)
}

pub(crate) async fn resolve_gate<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    s: &SessionId,
    epoch: ResidencyEpoch,
    g: &GateId,
    resolved_seq: u64,
    now: Millis,
) -> StoreResult<GateRecord> {
    fence_gate_mark(tx, t, s, epoch).await?;
    let mut rec = tx
        .gate(t, s, g)
        .await?
        .ok_or_else(|| StoreError::not_found("gate", format!("{t}/{s}/{g}")))?;
    if rec.state == GateState::Resolved {
        return Ok(rec);
    }
    rec.state = GateState::Resolved;
    rec.resolved_seq = Some(resolved_seq);
    rec.resolved_at_ms = Some(now);
    tx.put_gate(&rec).await?;
    Ok(rec)
}

// ---- journal --------------------------------------------------------------------------------

pub(crate) fn journal_key(rs: RuntimeSessionId) -> String {
    format!("runtime session {rs}")
}

pub(crate) async fn own_journal<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    rs: RuntimeSessionId,
) -> StoreResult<Option<JournalLeaseState>> {
    match tx.journal_lease(rs).await? {
        // Never reveal another tenant's journal: it reads as absent.
        Some(l) if &l.tenant != t => Ok(None),
        other => Ok(other),
    }
}

pub(crate) async fn journal_acquire<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    rs: RuntimeSessionId,
    holder: &str,
    ttl_ms: i64,
    now: Millis,
) -> StoreResult<JournalLease> {
    let current = tx.journal_lease(rs).await?;
    if let Some(c) = &current
        && &c.tenant != t
    {
        return Err(StoreError::not_found("journal", journal_key(rs)));
    }
    let epoch = JournalEpoch(current.as_ref().map_or(0, |c| c.epoch.0) + 1);
    let seq = current.as_ref().map_or(0, |c| c.tip) + 1;
    tx.insert_journal_row(&JournalRow {
        runtime_session: rs,
        seq,
        epoch,
        written_at_ms: now,
        kind: RowKind::Fence,
        event: None,
        public_body: None,
        private_body: None,
        cause: None,
        identity: None,
        attempt: None,
        attempt_epoch: None,
        outcome: None,
        detail: None,
    })
    .await?;
    let expires = now.saturating_add(ttl_ms);
    tx.put_journal_lease(&JournalLeaseState {
        tenant: t.clone(),
        runtime_session: rs,
        epoch,
        holder: Some(holder.to_owned()),
        expires_at_ms: Some(expires),
        tip: seq,
    })
    .await?;
    Ok(JournalLease {
        tenant: t.clone(),
        runtime_session: rs,
        epoch,
        holder: holder.to_owned(),
        tip: seq,
        expires_at_ms: expires,
    })
}

pub(crate) fn check_writer(state: &JournalLeaseState, lease: &JournalLease) -> StoreResult<()> {
    if state.epoch != lease.epoch {
        return Err(StoreError::Epoch {
            field: "journal.epoch",
            mark: state.epoch.0,
            offered: lease.epoch.0,
        });
    }
    if state.holder.as_deref() != Some(lease.holder.as_str()) {
        return Err(StoreError::ClaimLost {
            field: "journal.lease",
            reason: "the journal lease was released",
        });
    }
    Ok(())
}

pub(crate) async fn journal_renew<T: Tx>(
    tx: &mut T,
    lease: &JournalLease,
    ttl_ms: i64,
    now: Millis,
) -> StoreResult<JournalLease> {
    let mut state = own_journal(tx, &lease.tenant, lease.runtime_session)
        .await?
        .ok_or_else(|| StoreError::not_found("journal", journal_key(lease.runtime_session)))?;
    check_writer(&state, lease)?;
    let expires = now.saturating_add(ttl_ms);
    state.expires_at_ms = Some(expires);
    tx.put_journal_lease(&state).await?;
    Ok(JournalLease {
        expires_at_ms: expires,
        tip: state.tip,
        ..lease.clone()
    })
}

pub(crate) async fn journal_release<T: Tx>(tx: &mut T, lease: &JournalLease) -> StoreResult<()> {
    let Some(mut state) = own_journal(tx, &lease.tenant, lease.runtime_session).await? else {
        return Err(StoreError::not_found(
            "journal",
            journal_key(lease.runtime_session),
        ));
    };
    if state.epoch != lease.epoch || state.holder.as_deref() != Some(lease.holder.as_str()) {
        return Ok(());
    }
    state.holder = None;
    state.expires_at_ms = None;
    tx.put_journal_lease(&state).await
}

fn body_slot(
    rs: RuntimeSessionId,
    seq: u64,
    which: &str,
    bytes: &[u8],
) -> StoreResult<(BodySlot, Option<StoredObject>)> {
    if bytes.len() <= MAX_INLINE_BODY_BYTES {
        return Ok((BodySlot::Inline(bytes.to_vec()), None));
    }
    let id = ObjectId::new(format!("journal-{rs}-{seq}-{which}"))?;
    let obj = StoredObject {
        reference: ObjectRef {
            object_id: id.clone(),
            size: bytes.len() as u64,
            sha256: sha256_hex(bytes),
        },
        tenant: TenantId::from_literal("journal"),
        session: SessionId::new(rs.to_text())?,
        kind: format!("journal_{which}_body"),
        media_type: "application/octet-stream".to_owned(),
        bytes: bytes.to_vec(),
    };
    Ok((BodySlot::Object(id), Some(obj)))
}

/// The rows of an append that the merged primitive can write on its own: inline events and
/// controls, and applications under the writer's epoch for distinct commands. `None` sends the
/// append through its steps (closures, offloaded bodies, and anything the steps refuse, so
/// refusals keep their order).
fn inline_rows(
    lease: &JournalLease,
    entries: &[JournalEntry],
    now: Millis,
) -> Option<Vec<JournalRow>> {
    let mut rows = Vec::with_capacity(entries.len());
    let mut commands = std::collections::HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let mut row = JournalRow {
            runtime_session: lease.runtime_session,
            seq: lease.tip + 1 + i as u64,
            epoch: lease.epoch,
            written_at_ms: now,
            kind: record_kind_tag(entry),
            event: None,
            public_body: None,
            private_body: None,
            cause: None,
            identity: None,
            attempt: None,
            attempt_epoch: None,
            outcome: None,
            detail: None,
        };
        match entry {
            JournalEntry::Event {
                event,
                public_body,
                private_body,
                cause,
            } => {
                if public_body.len() > MAX_INLINE_BODY_BYTES
                    || private_body
                        .as_ref()
                        .is_some_and(|p| p.len() > MAX_INLINE_BODY_BYTES)
                {
                    return None;
                }
                row.event = Some(event.clone());
                row.public_body = Some(BodySlot::Inline(public_body.clone()));
                row.private_body = private_body.clone().map(BodySlot::Inline);
                row.cause = *cause;
            }
            JournalEntry::Control { body, cause } => {
                row.private_body = Some(BodySlot::Inline(body.clone()));
                row.cause = *cause;
            }
            JournalEntry::Application {
                identity,
                attempt,
                attempt_epoch,
                outcome,
                detail,
            } => {
                if *attempt_epoch != lease.epoch || !commands.insert(identity.runtime_command) {
                    return None;
                }
                row.identity = Some(identity.clone());
                row.attempt = Some(*attempt);
                row.attempt_epoch = Some(*attempt_epoch);
                row.outcome = Some(outcome.disposition());
                row.detail = detail.clone();
            }
            JournalEntry::Closure { .. } => return None,
        }
        rows.push(row);
    }
    Some(rows)
}

/// The refusals of an append, in the order its steps make them, from what the merged
/// primitive found.
fn check_appended(
    lease: &JournalLease,
    entries: &[JournalEntry],
    found: &Appended,
) -> StoreResult<()> {
    let rs = lease.runtime_session;
    let state = match &found.lease {
        Some(l) if l.tenant == lease.tenant => l,
        _ => return Err(StoreError::not_found("journal", journal_key(rs))),
    };
    check_writer(state, lease)?;
    if state.tip != lease.tip {
        return Err(StoreError::Conflict {
            entity: "journal.tip",
            expected: lease.tip,
            current: state.tip,
        });
    }
    if let Some(rc) = found.disposed {
        let command = entries
            .iter()
            .find_map(|e| match e {
                JournalEntry::Application { identity, .. } if identity.runtime_command == rc => {
                    Some(identity.command.to_string())
                }
                _ => None,
            })
            .unwrap_or_else(|| rc.to_string());
        return Err(StoreError::state(
            "journal",
            "disposed",
            format!("command {command} already has a disposition"),
        ));
    }
    Ok(())
}

pub(crate) async fn journal_append<T: Tx>(
    tx: &mut T,
    lease: &JournalLease,
    entries: &[JournalEntry],
    now: Millis,
) -> StoreResult<u64> {
    if let Some(rows) = inline_rows(lease, entries, now)
        && let Some(found) = tx.append_records(lease, &rows).await?
    {
        // A refusal after a write fails the operation, and its transaction is undone.
        if let Err(e) = check_appended(lease, entries, &found) {
            if found.tip.is_some() {
                tx.note_presumption(true);
            }
            return Err(e);
        }
        let tip = lease.tip + rows.len() as u64;
        match found.tip {
            Some(written) if written == tip => return Ok(tip),
            Some(written) => {
                tx.note_presumption(true);
                return Err(StoreError::integrity(
                    "journal",
                    format!("the append moved the tip to {written}, not {tip}"),
                ));
            }
            // Nothing written though nothing refuses it: the steps decide.
            None => tx.note_presumption(false),
        }
    }
    let rs = lease.runtime_session;
    let mut state = own_journal(tx, &lease.tenant, rs)
        .await?
        .ok_or_else(|| StoreError::not_found("journal", journal_key(rs)))?;
    check_writer(&state, lease)?;
    if state.tip != lease.tip {
        return Err(StoreError::Conflict {
            entity: "journal.tip",
            expected: lease.tip,
            current: state.tip,
        });
    }
    let mut seq = state.tip;
    for entry in entries {
        seq += 1;
        let mut row = JournalRow {
            runtime_session: rs,
            seq,
            epoch: lease.epoch,
            written_at_ms: now,
            kind: record_kind_tag(entry),
            event: None,
            public_body: None,
            private_body: None,
            cause: None,
            identity: None,
            attempt: None,
            attempt_epoch: None,
            outcome: None,
            detail: None,
        };
        match entry {
            JournalEntry::Event {
                event,
                public_body,
                private_body,
                cause,
            } => {
                row.event = Some(event.clone());
                let (slot, obj) = body_slot(rs, seq, "public", public_body)?;
                row.public_body = Some(slot);
                if let Some(o) = obj {
                    let o = StoredObject {
                        tenant: lease.tenant.clone(),
                        ..o
                    };
                    tx.insert_object(&o, now).await?;
                }
                if let Some(p) = private_body {
                    let (slot, obj) = body_slot(rs, seq, "private", p)?;
                    row.private_body = Some(slot);
                    if let Some(o) = obj {
                        let o = StoredObject {
                            tenant: lease.tenant.clone(),
                            ..o
                        };
                        tx.insert_object(&o, now).await?;
                    }
                }
                row.cause = *cause;
            }
            JournalEntry::Control { body, cause } => {
                row.private_body = Some(BodySlot::Inline(body.clone()));
                row.cause = *cause;
            }
            JournalEntry::Application {
                identity,
                attempt,
                attempt_epoch,
                outcome,
                detail,
            } => {
                if *attempt_epoch != lease.epoch {
                    return Err(StoreError::invalid(
                        "attempt_journal_epoch",
                        format!(
                            "an application is written under the attempt's own journal epoch ({}), not {}",
                            attempt_epoch, lease.epoch
                        ),
                    ));
                }
                if tx.has_disposition(rs, identity.runtime_command).await? {
                    return Err(StoreError::state(
                        "journal",
                        "disposed",
                        format!("command {} already has a disposition", identity.command),
                    ));
                }
                row.identity = Some(identity.clone());
                row.attempt = Some(*attempt);
                row.attempt_epoch = Some(*attempt_epoch);
                row.outcome = Some(outcome.disposition());
                row.detail = detail.clone();
            }
            JournalEntry::Closure {
                identity,
                attempt,
                attempt_epoch,
            } => {
                if *attempt_epoch >= lease.epoch {
                    return Err(StoreError::Epoch {
                        field: "closure.journal_epoch",
                        mark: attempt_epoch.0 + 1,
                        offered: lease.epoch.0,
                    });
                }
                if tx.has_disposition(rs, identity.runtime_command).await? {
                    return Err(StoreError::state(
                        "journal",
                        "disposed",
                        format!("command {} already has a disposition", identity.command),
                    ));
                }
                if tx.has_effect(rs, identity.runtime_command).await? {
                    return Err(StoreError::state(
                        "journal",
                        "effect",
                        format!(
                            "the journal holds an effect caused by command {}; it cannot be closed not_applied",
                            identity.command
                        ),
                    ));
                }
                row.identity = Some(identity.clone());
                row.attempt = Some(*attempt);
                row.attempt_epoch = Some(*attempt_epoch);
                row.outcome = Some(Disposition::NotApplied);
            }
        }
        tx.insert_journal_row(&row).await?;
    }
    state.tip = seq;
    tx.put_journal_lease(&state).await?;
    Ok(seq)
}

async fn resolve_slot<T: Tx>(tx: &mut T, slot: Option<BodySlot>) -> StoreResult<Option<Vec<u8>>> {
    match slot {
        None => Ok(None),
        Some(BodySlot::Inline(b)) => Ok(Some(b)),
        Some(BodySlot::Object(id)) => {
            let obj = tx.object(&id).await?.ok_or_else(|| {
                StoreError::integrity("journal", format!("offloaded body {id} is missing"))
            })?;
            if obj.bytes.len() as u64 != obj.reference.size
                || sha256_hex(&obj.bytes) != obj.reference.sha256
            {
                return Err(StoreError::integrity(
                    "journal",
                    format!("offloaded body {id} fails its digest"),
                ));
            }
            Ok(Some(obj.bytes))
        }
    }
}

pub(crate) async fn row_to_record<T: Tx>(
    tx: &mut T,
    row: JournalRow,
) -> StoreResult<JournalRecord> {
    let bad = |what: &str| StoreError::integrity("journal", format!("record {}: {what}", row.seq));
    let kind = match row.kind {
        RowKind::Fence => RecordKind::Fence,
        RowKind::Event => {
            let event = row.event.clone().ok_or_else(|| bad("event without id"))?;
            let public = resolve_slot(tx, row.public_body.clone())
                .await?
                .ok_or_else(|| bad("event without public body"))?;
            let private = resolve_slot(tx, row.private_body.clone()).await?;
            RecordKind::Event {
                event,
                public_body: public,
                private_body: private,
                cause: row.cause,
            }
        }
        RowKind::Control => RecordKind::Control {
            body: resolve_slot(tx, row.private_body.clone())
                .await?
                .ok_or_else(|| bad("control without body"))?,
            cause: row.cause,
        },
        RowKind::Application | RowKind::Closure => {
            let identity = row
                .identity
                .clone()
                .ok_or_else(|| bad("no command identity"))?;
            let attempt = row.attempt.ok_or_else(|| bad("no attempt"))?;
            let attempt_epoch = row.attempt_epoch.ok_or_else(|| bad("no attempt epoch"))?;
            let outcome = row.outcome.ok_or_else(|| bad("no outcome"))?;
            if row.kind == RowKind::Closure {
                if outcome != Disposition::NotApplied {
                    return Err(bad("closure with an outcome other than not_applied"));
                }
                RecordKind::Closure {
                    identity,
                    attempt,
                    attempt_epoch,
                }
            } else {
                let outcome = match outcome {
                    Disposition::Applied => ApplicationOutcome::Applied,
                    Disposition::NoOp => ApplicationOutcome::NoOp,
                    Disposition::Refused => ApplicationOutcome::Refused,
                    Disposition::NotApplied => return Err(bad("application with not_applied")),
                };
                RecordKind::Application {
                    identity,
                    attempt,
                    attempt_epoch,
                    outcome,
                    detail: row.detail.clone(),
                }
            }
        }
    };
    Ok(JournalRecord {
        seq: row.seq,
        epoch: row.epoch,
        written_at_ms: row.written_at_ms,
        kind,
    })
}

pub(crate) async fn journal_read<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    rs: RuntimeSessionId,
    after: u64,
    upto: u64,
    limit: usize,
    events_only: bool,
) -> StoreResult<Vec<JournalRecord>> {
    if own_journal(tx, t, rs).await?.is_none() {
        return Ok(Vec::new());
    }
    let rows = tx.journal_rows(rs, after, upto, limit, events_only).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(row_to_record(tx, row).await?);
    }
    Ok(out)
}

/// The public events of a journal by public offset (see [`crate::journal::OffsetPage`]).
pub(crate) async fn journal_by_offset<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    rs: RuntimeSessionId,
    after: u64,
    limit: usize,
) -> StoreResult<OffsetPage> {
    let Some(lease) = own_journal(tx, t, rs).await? else {
        return Ok(OffsetPage {
            events: Vec::new(),
            top: 0,
        });
    };
    let top = tx.public_event_count(rs, lease.tip).await?;
    if after >= top || limit == 0 {
        return Ok(OffsetPage {
            events: Vec::new(),
            top,
        });
    }
    let rows = tx.public_event_rows(rs, after, limit).await?;
    let mut events = Vec::with_capacity(rows.len());
    for (i, row) in rows.into_iter().enumerate() {
        let offset = after + 1 + i as u64;
        if offset > top {
            break;
        }
        let record = row_to_record(tx, row).await?;
        match record.kind {
            RecordKind::Event {
                event, public_body, ..
            } => events.push(OffsetEvent {
                offset,
                seq: record.seq,
                event,
                body: public_body,
            }),
            _ => {
                return Err(StoreError::integrity(
                    "journal",
                    format!("record {} is not a public event", record.seq),
                ));
            }
        }
    }
    Ok(OffsetPage { events, top })
}

/// The public offset of the journal of `rs` at sequence `through` (0 for another tenant's).
pub(crate) async fn journal_public_offset<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    rs: RuntimeSessionId,
    through: u64,
) -> StoreResult<u64> {
    if own_journal(tx, t, rs).await?.is_none() {
        return Ok(0);
    }
    tx.public_event_count(rs, through).await
}

pub(crate) async fn journal_dispositions<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    rs: RuntimeSessionId,
    rc: RuntimeCommandId,
) -> StoreResult<Vec<JournalRecord>> {
    // Settlement reads the evidence inside a session's write transaction: it takes no lock on
    // the journal (whose writes are keyed by the runtime session, not the session), so writers
    // never lock one another's rows. Disposition records are immutable and at most one per
    // command, and a journal's tenant never changes, so the unlocked read is exact.
    let rows = tx.journal_dispositions(t, rs, rc).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(row_to_record(tx, row).await?);
    }
    Ok(out)
}

pub(crate) async fn journal_lease_state<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    rs: RuntimeSessionId,
) -> StoreResult<Option<JournalLeaseState>> {
    own_journal(tx, t, rs).await
}

pub(crate) async fn get_object<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    id: &ObjectId,
) -> StoreResult<StoredObject> {
    match tx.object(id).await? {
        Some(o) if &o.tenant == t => Ok(o),
        _ => Err(StoreError::not_found("payload_object", id.to_string())),
    }
}

pub(crate) async fn put_object<T: Tx>(
    tx: &mut T,
    id: ObjectId,
    o: NewObject,
    sha256: String,
    now: Millis,
) -> StoreResult<ObjectRef> {
    require_session(tx, &o.tenant, &o.session).await?;
    let reference = ObjectRef {
        object_id: id,
        size: o.bytes.len() as u64,
        sha256,
    };
    tx.insert_object(
        &StoredObject {
            reference: reference.clone(),
            tenant: o.tenant,
            session: o.session,
            kind: o.kind,
            media_type: o.media_type,
            bytes: o.bytes,
        },
        now,
    )
    .await?;
    Ok(reference)
}

pub(crate) async fn journal_has_effect<T: Tx>(
    tx: &mut T,
    t: &TenantId,
    rs: RuntimeSessionId,
    rc: RuntimeCommandId,
) -> StoreResult<bool> {
    if own_journal(tx, t, rs).await?.is_none() {
        return Ok(false);
    }
    tx.has_effect(rs, rc).await
}
