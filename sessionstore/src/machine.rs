//! The command state machine and the fencing rule, as pure functions over records; the rules
//! live here once. Every store operation decides with these on the row it read inside its write
//! transaction. A backend may write a transition's [`Effect`] speculatively in the statement that
//! reads the row (PostgreSQL does, to spend one statement per transition), but the operation
//! then runs the transition here on the row as it was and keeps the write only when the two
//! agree (`ops::reconcile`). Never performs I/O and never reads a clock: the caller passes the
//! store's `now`.

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::{JournalEpoch, ResidencyEpoch};
use crate::journal::DispositionFrame;
use crate::limits::{MAX_CLAIM_TTL, ttl_ms};
use crate::model::*;

/// The one fencing rule, applied per record against its own mark: a strictly lower epoch is
/// refused and told the mark; an equal epoch is admitted; a higher one is admitted and raises
/// the mark. Returns the new mark.
pub fn fence(field: &'static str, mark: u64, offered: u64) -> StoreResult<u64> {
    if offered < mark {
        return Err(StoreError::Epoch {
            field,
            mark,
            offered,
        });
    }
    Ok(offered)
}

/// The residency fence a claim and an attempt pass besides the command's own mark: the epoch
/// they carry must still hold the session. A command admitted after a successor took the
/// session has a mark of 0, so only the session's residency lease can tell that a Host waking
/// from a freeze under its old epoch no longer holds it. A lease at a higher epoch refuses
/// with `epoch` (a successor holds the session); a lease at this epoch that lapsed or was
/// given back refuses with `claim_lost` (nobody holds it at this epoch any more, and a lapsed
/// lease is never renewed). No lease, or one at a lower epoch, does not stand in the way: the
/// store then knows nothing that the command's mark does not.
pub fn residency_fence(
    lease: Option<&ResidencyLease>,
    epoch: ResidencyEpoch,
    now: Millis,
) -> StoreResult<()> {
    let Some(lease) = lease else {
        return Ok(());
    };
    fence("residency.epoch", lease.epoch.0, epoch.0)?;
    if lease.epoch == epoch && !lease.is_live(now) {
        return Err(StoreError::ClaimLost {
            field: "residency",
            reason: if lease.holder.is_none() {
                "the residency was released"
            } else {
                "the residency lease expired"
            },
        });
    }
    Ok(())
}

/// What a transition did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Transition {
    /// The record changed; write it (conditionally on the old revision).
    Changed(CommandRecord),
    /// An idempotent replay: the record is returned as it is; write nothing.
    Unchanged(CommandRecord),
}

impl Transition {
    /// The resulting record.
    pub fn record(&self) -> &CommandRecord {
        match self {
            Transition::Changed(r) | Transition::Unchanged(r) => r,
        }
    }

    /// Consumes, giving the record.
    pub fn into_record(self) -> CommandRecord {
        match self {
            Transition::Changed(r) | Transition::Unchanged(r) => r,
        }
    }
}

/// What a transition writes when it changes a record: the state-machine fields it sets, each
/// known from the request, `now` and (for settlement) the evidence alone, never from the stored
/// row. `None` keeps the stored value. Every transition below builds its changed record with
/// [`Effect::apply`], so a backend that writes an effect in the same statement that checks the
/// row writes exactly what the transition would (see `ops::reconcile`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Effect {
    pub state: CommandState,
    /// The new mark: a transition that passes the fence raises the mark to the offered epoch.
    pub epoch_mark: ResidencyEpoch,
    pub claim: Option<Claim>,
    pub attempt: Option<Attempt>,
    pub outcome: Option<Outcome>,
    pub reason: Option<String>,
    pub evidence_seq: Option<u64>,
    pub settled_at_ms: Option<Millis>,
}

impl Effect {
    fn new(state: CommandState, epoch: ResidencyEpoch) -> Effect {
        Effect {
            state,
            epoch_mark: epoch,
            claim: None,
            attempt: None,
            outcome: None,
            reason: None,
            evidence_seq: None,
            settled_at_ms: None,
        }
    }

    /// The record after this effect: the fields it sets replaced, the revision advanced.
    pub fn apply(&self, rec: &CommandRecord) -> CommandRecord {
        let mut next = rec.clone();
        next.state = self.state;
        next.epoch_mark = self.epoch_mark;
        if let Some(c) = &self.claim {
            next.claim = Some(c.clone());
        }
        if let Some(a) = &self.attempt {
            next.attempt = Some(a.clone());
        }
        if let Some(o) = self.outcome {
            next.outcome = Some(o);
        }
        if let Some(r) = &self.reason {
            next.reason = Some(r.clone());
        }
        if let Some(seq) = self.evidence_seq {
            next.evidence_seq = Some(seq);
        }
        if let Some(at) = self.settled_at_ms {
            next.settled_at_ms = Some(at);
        }
        advance(next)
    }
}

/// What a successful `claim` writes.
pub fn claim_effect(req: &ClaimRequest, now: Millis) -> StoreResult<Effect> {
    let ttl = ttl_ms("claim_ttl", req.ttl, MAX_CLAIM_TTL)?;
    let mut e = Effect::new(CommandState::Claimed, req.epoch);
    e.claim = Some(Claim {
        epoch: req.epoch,
        token: req.token,
        expires_at_ms: now.saturating_add(ttl),
    });
    Ok(e)
}

/// What a successful `reject` writes.
pub fn reject_effect(req: &RejectRequest) -> StoreResult<Effect> {
    if req.reason.is_empty() {
        return Err(StoreError::invalid("reason", "must not be empty"));
    }
    check_short_text("reason", &req.reason)?;
    let mut e = Effect::new(CommandState::Rejected, req.epoch);
    e.outcome = Some(Outcome::Rejected);
    e.reason = Some(req.reason.clone());
    Ok(e)
}

/// What a successful `begin_attempt` writes.
pub fn attempt_effect(req: &AttemptRequest, now: Millis) -> StoreResult<Effect> {
    if req.journal_epoch == JournalEpoch(0) {
        return Err(StoreError::invalid("journal_epoch", "must be >= 1"));
    }
    let mut e = Effect::new(CommandState::Applying, req.epoch);
    e.attempt = Some(Attempt {
        id: req.attempt,
        journal_epoch: req.journal_epoch,
        residency_epoch: req.epoch,
        begun_at_ms: now,
    });
    Ok(e)
}

/// What a successful `settle` writes, from the verified frame.
pub fn settle_effect(req: &SettleRequest, frame: &DispositionFrame, now: Millis) -> Effect {
    let mut e = Effect::new(frame.disposition.terminal_state(), req.epoch);
    e.outcome = Some(frame.disposition.outcome());
    e.evidence_seq = Some(frame.seq);
    e.settled_at_ms = Some(now);
    e
}

fn check_revision(rec: &CommandRecord, expected: u64) -> StoreResult<()> {
    if rec.revision != expected {
        return Err(StoreError::Conflict {
            entity: "command",
            expected,
            current: rec.revision,
        });
    }
    Ok(())
}

fn terminal(rec: &CommandRecord) -> StoreResult<()> {
    if rec.state.is_terminal() {
        return Err(StoreError::Terminal {
            state: rec.state.as_str().to_owned(),
        });
    }
    Ok(())
}

fn advance(mut rec: CommandRecord) -> CommandRecord {
    rec.revision += 1;
    rec
}

/// `claim`: take (or replay) a claim on a command, under a residency epoch that still holds
/// the session (`residency` is the session's lease as the transaction read it).
pub fn claim(
    rec: &CommandRecord,
    residency: Option<&ResidencyLease>,
    req: &ClaimRequest,
    now: Millis,
) -> StoreResult<Transition> {
    let effect = claim_effect(req, now)?;
    if rec.state == CommandState::Claimed
        && let Some(c) = &rec.claim
        && c.epoch == req.epoch
        && c.token == req.token
    {
        return Ok(Transition::Unchanged(rec.clone()));
    }
    terminal(rec)?;
    if rec.attempt.is_some() {
        return Err(StoreError::state(
            "command",
            rec.state.as_str(),
            "an attempt exists; the command can only be settled",
        ));
    }
    fence("command.epoch_mark", rec.epoch_mark.0, req.epoch.0)?;
    residency_fence(residency, req.epoch, now)?;
    check_revision(rec, req.expected_revision)?;
    if now >= rec.apply_deadline_ms {
        return Err(StoreError::Deadline {
            deadline_ms: rec.apply_deadline_ms,
        });
    }
    if let Some(c) = &rec.claim
        && c.expires_at_ms > now
        && c.epoch == req.epoch
    {
        return Err(StoreError::ClaimHeld {
            field: "command.claim",
            epoch: c.epoch.0,
            expires_at_ms: c.expires_at_ms,
        });
    }
    // A strictly higher epoch takes over a live claim; an equal or higher one re-takes a lapsed
    // claim (a lower one was refused by the fence above).
    Ok(Transition::Changed(effect.apply(rec)))
}

/// `reject`: end a command durably before any attempt exists.
pub fn reject(rec: &CommandRecord, req: &RejectRequest) -> StoreResult<Transition> {
    let effect = reject_effect(req)?;
    if rec.state == CommandState::Rejected
        && rec.attempt.is_none()
        && rec.outcome == Some(Outcome::Rejected)
    {
        return Ok(Transition::Unchanged(rec.clone()));
    }
    terminal(rec)?;
    if rec.attempt.is_some() {
        return Err(StoreError::state(
            "command",
            rec.state.as_str(),
            "an attempt exists; only settlement from evidence can end it",
        ));
    }
    fence("command.epoch_mark", rec.epoch_mark.0, req.epoch.0)?;
    check_revision(rec, req.expected_revision)?;
    Ok(Transition::Changed(effect.apply(rec)))
}

/// `begin_attempt`: record the command's one attempt under a live claim of this residency,
/// while its epoch still holds the session.
pub fn begin_attempt(
    rec: &CommandRecord,
    residency: Option<&ResidencyLease>,
    req: &AttemptRequest,
    now: Millis,
) -> StoreResult<Transition> {
    let effect = attempt_effect(req, now)?;
    if let Some(a) = &rec.attempt
        && a.id == req.attempt
        && a.journal_epoch == req.journal_epoch
        && a.residency_epoch == req.epoch
    {
        return Ok(Transition::Unchanged(rec.clone()));
    }
    terminal(rec)?;
    if rec.attempt.is_some() {
        return Err(StoreError::state(
            "command",
            rec.state.as_str(),
            "another attempt is already recorded",
        ));
    }
    fence("command.epoch_mark", rec.epoch_mark.0, req.epoch.0)?;
    residency_fence(residency, req.epoch, now)?;
    check_revision(rec, req.expected_revision)?;
    let Some(c) = &rec.claim else {
        return Err(StoreError::state(
            "command",
            rec.state.as_str(),
            "an attempt needs a claim",
        ));
    };
    if rec.state != CommandState::Claimed {
        return Err(StoreError::state(
            "command",
            rec.state.as_str(),
            "an attempt needs a claimed command",
        ));
    }
    if c.epoch != req.epoch || c.token != req.claim_token {
        return Err(StoreError::ClaimLost {
            field: "command.claim",
            reason: "the claim is held by another residency or token",
        });
    }
    if c.expires_at_ms <= now {
        return Err(StoreError::ClaimLost {
            field: "command.claim",
            reason: "the claim lapsed",
        });
    }
    if now >= rec.apply_deadline_ms {
        return Err(StoreError::Deadline {
            deadline_ms: rec.apply_deadline_ms,
        });
    }
    Ok(Transition::Changed(effect.apply(rec)))
}

/// Checks that `rec` has an attempt whose evidence could be looked for: a command with no
/// attempt is refused before any journal is read (`terminal` when it already ended, `state`
/// otherwise).
pub fn require_attempt(rec: &CommandRecord) -> StoreResult<()> {
    if rec.attempt.is_some() {
        return Ok(());
    }
    terminal(rec)?;
    Err(StoreError::state(
        "command",
        rec.state.as_str(),
        "no attempt to settle",
    ))
}

/// Checks that `frame` is the one matching disposition for `rec`'s attempt.
pub fn verify_evidence(rec: &CommandRecord, frame: &DispositionFrame) -> StoreResult<()> {
    let Some(attempt) = &rec.attempt else {
        return Err(StoreError::state(
            "command",
            rec.state.as_str(),
            "no attempt to settle",
        ));
    };
    if frame.identity.runtime_command != rec.runtime_command {
        return Err(StoreError::evidence("frame names another runtime command"));
    }
    if frame.identity.command != rec.command || frame.identity.kind != rec.kind {
        return Err(StoreError::evidence(
            "frame's command identity differs from the inbox record",
        ));
    }
    if frame.attempt != attempt.id {
        return Err(StoreError::evidence("frame names another attempt"));
    }
    if frame.attempt_epoch != attempt.journal_epoch {
        return Err(StoreError::evidence(
            "frame's attempt journal epoch differs from the attempt's",
        ));
    }
    match frame.disposition {
        crate::model::Disposition::NotApplied => {
            if frame.written_epoch <= attempt.journal_epoch {
                return Err(StoreError::evidence(
                    "a closure must be written under a strictly later journal epoch",
                ));
            }
        }
        _ => {
            if frame.written_epoch != attempt.journal_epoch {
                return Err(StoreError::evidence(
                    "an application must be written under the attempt's journal epoch",
                ));
            }
        }
    }
    Ok(())
}

/// `settle`: write the terminal state the verified evidence proves.
pub fn settle(
    rec: &CommandRecord,
    req: &SettleRequest,
    frame: &DispositionFrame,
    now: Millis,
) -> StoreResult<Transition> {
    if rec.state.is_terminal()
        && rec.evidence_seq == Some(frame.seq)
        && rec.outcome == Some(frame.disposition.outcome())
    {
        return Ok(Transition::Unchanged(rec.clone()));
    }
    terminal(rec)?;
    if rec.state != CommandState::Applying {
        return Err(StoreError::state(
            "command",
            rec.state.as_str(),
            "only an applying command can be settled",
        ));
    }
    fence("command.epoch_mark", rec.epoch_mark.0, req.epoch.0)?;
    check_revision(rec, req.expected_revision)?;
    verify_evidence(rec, frame)?;
    Ok(Transition::Changed(
        settle_effect(req, frame, now).apply(rec),
    ))
}

/// Checks an admission retry against the recorded command.
pub fn check_admission_retry(existing: &CommandRecord, new: &NewCommand) -> StoreResult<()> {
    if existing.kind != new.kind {
        return Err(StoreError::CommandMismatch { field: "kind" });
    }
    let (digest, size) = body_digest(&new.body);
    if existing.body_digest != digest {
        return Err(StoreError::CommandMismatch {
            field: "body_digest",
        });
    }
    if existing.body_size != size {
        return Err(StoreError::CommandMismatch { field: "body_size" });
    }
    Ok(())
}

/// The digest and size of a body (for an object, the reference's own).
pub fn body_digest(body: &CommandBody) -> (String, u64) {
    match body {
        CommandBody::Inline(bytes) => (sha256_hex(bytes), bytes.len() as u64),
        CommandBody::Object(r) => (r.sha256.clone(), r.size),
    }
}

/// Cursor save: lower epoch refused with the mark; a lower order is a regression.
pub fn save_cursor(
    current: Option<Cursor>,
    order: u64,
    epoch: ResidencyEpoch,
) -> StoreResult<Cursor> {
    let Some(cur) = current else {
        return Ok(Cursor {
            consumed_order: order,
            epoch,
        });
    };
    let mark = fence("cursor.epoch", cur.epoch.0, epoch.0)?;
    if order < cur.consumed_order {
        return Err(StoreError::state(
            "cursor",
            cur.consumed_order.to_string(),
            format!("regression to {order} refused"),
        ));
    }
    Ok(Cursor {
        consumed_order: order,
        epoch: ResidencyEpoch(mark),
    })
}

/// Residency acquisition over the stored lease (if any).
pub fn acquire_residency(
    current: Option<&ResidencyLease>,
    req: &ResidencyRequest,
    ttl: i64,
    now: Millis,
) -> StoreResult<(ResidencyGrant, bool)> {
    let grant = |epoch: u64| ResidencyGrant {
        tenant: req.tenant.clone(),
        session: req.session.clone(),
        epoch: ResidencyEpoch(epoch),
        holder: req.holder.clone(),
        host: req.host.clone(),
        host_generation: req.host_generation,
        expires_at_ms: now.saturating_add(ttl),
    };
    match current {
        None => Ok((grant(1), true)),
        Some(lease) if lease.is_live(now) => {
            if lease.holder.as_deref() == Some(req.holder.as_str()) {
                // Idempotent: the same holder gets its grant back, unchanged.
                Ok((
                    ResidencyGrant {
                        tenant: req.tenant.clone(),
                        session: req.session.clone(),
                        epoch: lease.epoch,
                        holder: req.holder.clone(),
                        host: lease.host.clone().unwrap_or_else(|| req.host.clone()),
                        host_generation: lease.host_generation.unwrap_or(req.host_generation),
                        expires_at_ms: lease.expires_at_ms.unwrap_or(now),
                    },
                    false,
                ))
            } else {
                Err(StoreError::ClaimHeld {
                    field: "residency",
                    epoch: lease.epoch.0,
                    expires_at_ms: lease.expires_at_ms.unwrap_or(now),
                })
            }
        }
        Some(lease) => Ok((grant(lease.epoch.0 + 1), true)),
    }
}

/// Residency renewal: only the live holder of exactly this epoch may renew.
pub fn renew_residency(
    lease: &ResidencyLease,
    grant: &ResidencyGrant,
    now: Millis,
) -> StoreResult<()> {
    if lease.epoch != grant.epoch {
        return Err(StoreError::Epoch {
            field: "residency.epoch",
            mark: lease.epoch.0,
            offered: grant.epoch.0,
        });
    }
    if lease.holder.as_deref() != Some(grant.holder.as_str()) {
        return Err(StoreError::ClaimLost {
            field: "residency",
            reason: "the lease was released",
        });
    }
    if !lease.is_live(now) {
        return Err(StoreError::ClaimLost {
            field: "residency",
            reason: "the lease expired",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_refuses_lower_admits_equal_and_raises_on_higher() {
        let err = fence("m", 5, 4).unwrap_err();
        assert_eq!(err.mark(), Some(5));
        assert_eq!(fence("m", 5, 5).unwrap(), 5);
        assert_eq!(fence("m", 5, 7).unwrap(), 7);
    }

    #[test]
    fn a_cursor_refuses_regression_and_a_lower_epoch() {
        let c = save_cursor(None, 3, ResidencyEpoch(2)).unwrap();
        assert_eq!(
            save_cursor(Some(c), 2, ResidencyEpoch(2))
                .unwrap_err()
                .code()
                .as_str(),
            "state"
        );
        assert_eq!(
            save_cursor(Some(c), 4, ResidencyEpoch(1))
                .unwrap_err()
                .code()
                .as_str(),
            "epoch"
        );
        let c2 = save_cursor(Some(c), 4, ResidencyEpoch(3)).unwrap();
        assert_eq!(c2.epoch, ResidencyEpoch(3));
    }
}
