//! The command consumer: one task per resident session that applies its commands in
//! acceptance order, exactly once — claim → strict body check (reject what no Host could apply;
//! block what only this Host cannot do now) → payload dereference → begin attempt → dispatch
//! with the attempt identity → settle from the runtime's evidence → save the cursor. It
//! recovers a predecessor's stranded attempt by closure, never closes its own, never skips a
//! pending predecessor, and never authors an outcome.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use department::{Recorded, RuntimeCommand, RuntimeError};
use sessionstore::limits::COMMAND_BODY_OBJECT_KIND;
use sessionstore::wire::{CommandBodyV1, DecodeError, decode_command};
use sessionstore::{
    AttemptId, AttemptRequest, ClaimRequest, CommandBody, CommandId, CommandRecord, CommandState,
    ErrorCode, GateId, RejectRequest, SettleRequest, StoreError,
};
use tokio::sync::mpsc;
use tracing::Instrument;
use uuid::Uuid;

use crate::failpoints::{self, steps};
use crate::residency::{EndReason, SessionCtx};
use crate::resident::Resident;

/// Why a pass stopped early.
#[derive(Debug)]
enum Stop {
    /// Nothing durable can move until something changes; the session's stream waits here.
    Blocked(String),
    /// The residency or the runtime can no longer be trusted: end the residency.
    End(EndReason),
    /// A transient store fault: retry at the next pass.
    Retry(String),
}

impl Stop {
    /// The stable code a span's error status carries.
    fn code(&self) -> &'static str {
        match self {
            Stop::Blocked(_) => "blocked",
            Stop::End(_) => "residency_ended",
            Stop::Retry(_) => "retry",
        }
    }
}

/// A child span of a command's for one step (claim, settle) under `epoch`.
fn step_span(name: &'static str, epoch: u64) -> tracing::Span {
    tracing::info_span!(
        "command.step",
        otel.name = name,
        epoch,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// Marks `span` failed with a stable code (its OpenTelemetry status).
fn span_failed(span: &tracing::Span, code: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", code);
}

/// A body that passed the strict check, with the attribution the runtime receives.
struct Checked {
    body: CommandBodyV1,
    principal: Option<String>,
    metadata: Option<String>,
}

/// What the strict body check decided.
enum Check {
    Apply(Checked),
    Reject(String),
    Block(String),
}

/// Runs the consumer until the residency's tasks are cancelled.
pub(crate) async fn run(ctx: SessionCtx, mut hints: mpsc::Receiver<()>) {
    let resident = ctx.resident().clone();
    let span = tracing::info_span!(
        target: trace_context::span::LONG_LIVED,
        parent: None,
        "consumer",
        tenant = %resident.key.tenant,
        session = %resident.key.session,
        epoch = resident.epoch.0
    );
    let mut c = Consumer {
        ctx,
        resident,
        tokens: HashMap::new(),
    };
    async move {
        // No timer of its own: the Host's one reconcile loop wakes this consumer every
        // reconcile interval while the session has a command not yet ended.
        let cancel = c.resident.cancel.clone();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                h = hints.recv() => {
                    if h.is_none() { break; }
                    while hints.try_recv().is_ok() {}
                }
            }
            if c.resident.consumer.halted.load(Ordering::SeqCst) {
                continue;
            }
            let control = c.resident.consumer.clone();
            let _pass = control.pass.lock().await;
            if control.halted.load(Ordering::SeqCst) || cancel.is_cancelled() {
                continue;
            }
            loop {
                // Boxed: a pass is a large future, and this task idles far longer than it
                // passes (the resting task stays small; see the memory decision note).
                match Box::pin(c.pass()).await {
                    Ok(true) if !control.halted.load(Ordering::SeqCst) => continue,
                    Ok(_) => break,
                    Err(stop) => {
                        c.stopped(stop);
                        break;
                    }
                }
            }
        }
    }
    .instrument(span)
    .await;
}

struct Consumer {
    ctx: SessionCtx,
    resident: Arc<Resident>,
    /// Claim tokens of this residency, by command.
    tokens: HashMap<CommandId, Uuid>,
}

fn store_stop(e: StoreError) -> Stop {
    if let StoreError::ClaimLost {
        field: "residency", ..
    } = e
    {
        // The store fenced a claim or an attempt: this residency's lease lapsed or was given
        // back, and a lapsed lease is never renewed.
        return Stop::End(EndReason::Lost(format!(
            "the residency no longer holds the session: {e}"
        )));
    }
    match e.code() {
        ErrorCode::Epoch => Stop::End(EndReason::Lost(format!(
            "a successor holds the session: {e}"
        ))),
        ErrorCode::Unavailable => Stop::Retry(e.to_string()),
        _ => Stop::Blocked(e.to_string()),
    }
}

impl Consumer {
    fn set_blocked(&self, blocked: bool) {
        self.resident
            .consumer
            .blocked
            .store(blocked, Ordering::SeqCst);
    }

    fn set_lag(&self, lag: i64) {
        self.resident.consumer.lag.store(lag, Ordering::SeqCst);
    }

    fn stopped(&mut self, stop: Stop) {
        match stop {
            Stop::Blocked(reason) => {
                tracing::warn!(reason = %reason, "command stream blocked; it will be retried");
                self.set_blocked(true);
            }
            Stop::Retry(reason) => {
                tracing::warn!(reason = %reason, "command pass failed on a store fault; retrying");
            }
            Stop::End(reason) => self.ctx.end_later(reason),
        }
    }

    /// One pass. Ok(true) when the page was full (run again at once).
    async fn pass(&mut self) -> Result<bool, Stop> {
        let r = self.resident.clone();
        let store = self.ctx.store().clone();
        let cursor = store
            .cursor(&r.key.tenant, &r.key.session)
            .await
            .map_err(store_stop)?;
        let mut consumed = cursor.map_or(0, |c| c.consumed_order);
        let batch = self.ctx.config().reconcile_batch;
        let page = store
            .list_commands(&r.key.tenant, &r.key.session, consumed, batch)
            .await
            .map_err(store_stop)?;
        // Validate the page before applying any of it.
        let mut expect = consumed;
        for rec in &page {
            if rec.tenant != r.key.tenant
                || rec.session != r.key.session
                || rec.accepted_order <= expect
            {
                return Err(Stop::Blocked(format!(
                    "the inbox page is not this session's, in order: command {} at {}",
                    rec.command, rec.accepted_order
                )));
            }
            expect = rec.accepted_order;
        }
        let full = page.len() == batch;
        self.set_lag(page.iter().filter(|c| !c.state.is_terminal()).count() as i64);
        let start = consumed;
        let mut outcome = Ok(full);
        for listed in page {
            if r.cancel.is_cancelled() || r.consumer.halted.load(Ordering::SeqCst) {
                outcome = Ok(false);
                break;
            }
            if !listed.state.is_terminal() {
                let started = Instant::now();
                let kind = listed.kind;
                // The listed row is fresh enough to try: a transition that lost a race
                // answers `conflict` and is retried from a re-read.
                let mut step = self.apply(listed.clone()).await;
                if matches!(step, Err(Stop::Retry(_))) {
                    match store
                        .command(&r.key.tenant, &r.key.session, &listed.command)
                        .await
                    {
                        Ok(fresh) => step = self.apply(fresh).await,
                        Err(e) => step = Err(store_stop(e)),
                    }
                }
                if let Err(stop) = step {
                    outcome = Err(stop);
                    break;
                }
                self.ctx
                    .metrics()
                    .apply_seconds
                    .with_label_values(&[kind.as_str()])
                    .observe(started.elapsed().as_secs_f64());
            }
            consumed = listed.accepted_order;
            self.tokens.remove(&listed.command);
        }
        // The cursor moves once per pass, through the fence, over what is terminal.
        if consumed > start {
            store
                .save_cursor(&r.key.tenant, &r.key.session, consumed, r.epoch)
                .await
                .map_err(store_stop)?;
        }
        if outcome.is_ok() {
            self.set_blocked(false);
            self.set_lag(0);
        }
        outcome
    }

    /// Drives one command to a terminal state, or stops the pass.
    async fn apply(&mut self, rec: CommandRecord) -> Result<(), Stop> {
        if matches!(rec.state, CommandState::Applied | CommandState::Rejected) {
            return Ok(());
        }
        // One span per command this Host drives, continuing the trace it was admitted under
        // (whichever Host admitted or first tried it); claim, attempt, settle and the
        // runtime's apply are its children.
        let span = tracing::info_span!(
            parent: None,
            "command",
            otel.name = "command.apply",
            tenant = %rec.tenant,
            session = %rec.session,
            command = %rec.command,
            kind = %rec.kind,
            state = %rec.state,
            epoch = self.resident.epoch.0,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        trace_context::span::continue_if(&span, rec.trace.as_ref());
        let inner = span.clone();
        let result = async move {
            match rec.state {
                CommandState::Applied | CommandState::Rejected => Ok(()),
                CommandState::Applying => self.settle_or_recover(rec).await,
                CommandState::Pending | CommandState::Claimed => self.claim_and_apply(rec).await,
            }
        }
        .instrument(span)
        .await;
        if let Err(stop) = &result {
            span_failed(&inner, stop.code());
        }
        result
    }

    fn token(&mut self, command: &CommandId) -> Uuid {
        *self
            .tokens
            .entry(command.clone())
            .or_insert_with(Uuid::now_v7)
    }

    async fn claim_and_apply(&mut self, rec: CommandRecord) -> Result<(), Stop> {
        let r = self.resident.clone();
        let store = self.ctx.store().clone();
        let token = self.token(&rec.command);
        let claim_span = step_span("command.claim", r.epoch.0);
        let claimed = match store
            .claim(ClaimRequest {
                tenant: rec.tenant.clone(),
                session: rec.session.clone(),
                command: rec.command.clone(),
                epoch: r.epoch,
                token,
                ttl: self.ctx.config().claim_ttl,
                expected_revision: rec.revision,
            })
            .instrument(claim_span.clone())
            .await
            .inspect_err(|e| span_failed(&claim_span, e.code().as_str()))
        {
            Ok(c) => c,
            Err(StoreError::Deadline { .. }) => {
                return self.reject(&rec, "apply_deadline_passed").await;
            }
            Err(e) if e.code() == ErrorCode::Terminal => return Ok(()),
            Err(e) if matches!(e.code(), ErrorCode::Conflict | ErrorCode::State) => {
                // Moved under us (or an attempt appeared): read it again next pass.
                return Err(Stop::Retry(e.to_string()));
            }
            Err(e) if e.code() == ErrorCode::ClaimHeld => {
                self.tokens.remove(&rec.command);
                return Err(Stop::Blocked(format!("the claim is held live: {e}")));
            }
            Err(e) => return Err(store_stop(e)),
        };
        failpoints::hit(self.ctx.config().host_id.as_str(), steps::AFTER_CLAIM).await;
        let body = match self.check(&claimed).await? {
            Check::Apply(b) => b,
            Check::Reject(reason) => return self.reject(&claimed, &reason).await,
            Check::Block(reason) => return Err(Stop::Blocked(reason)),
        };
        let attempt = AttemptId::mint();
        let journal_epoch = r.runtime.epoch.journal_epoch();
        let attempt_span = tracing::info_span!(
            "command.attempt",
            epoch = r.epoch.0,
            attempt = %attempt,
            journal_epoch = journal_epoch.0,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let applying = match store
            .begin_attempt(AttemptRequest {
                tenant: claimed.tenant.clone(),
                session: claimed.session.clone(),
                command: claimed.command.clone(),
                epoch: r.epoch,
                claim_token: token,
                attempt,
                journal_epoch,
                expected_revision: claimed.revision,
            })
            .instrument(attempt_span.clone())
            .await
            .inspect_err(|e| span_failed(&attempt_span, e.code().as_str()))
        {
            Ok(a) => a,
            Err(StoreError::ClaimLost {
                field: "command.claim",
                reason,
            }) => {
                self.tokens.remove(&claimed.command);
                return Err(Stop::Retry(format!("claim_lost: {reason}")));
            }
            Err(StoreError::Deadline { .. }) => {
                return self.reject(&claimed, "apply_deadline_passed").await;
            }
            Err(e) => return Err(store_stop(e)),
        };
        failpoints::hit(
            self.ctx.config().host_id.as_str(),
            steps::AFTER_BEGIN_ATTEMPT,
        )
        .await;
        self.dispatch_and_settle(&applying, attempt, journal_epoch, body)
            .await
    }

    async fn dispatch_and_settle(
        &mut self,
        applying: &CommandRecord,
        attempt: AttemptId,
        journal_epoch: sessionstore::JournalEpoch,
        checked: Checked,
    ) -> Result<(), Stop> {
        let r = &self.resident;
        let mut command =
            RuntimeCommand::for_attempt(applying, attempt, journal_epoch, checked.body);
        command.principal = checked.principal;
        command.metadata = checked.metadata;
        // The runtime's own `runtime.apply` span (and the turn under it) is a child of the
        // command's span: the dispatch has no span of its own, since the runtime's span
        // covers the same interval from the other side (one span fewer per command).
        command.trace = trace_context::span::current_for_callee(applying.trace.as_ref());
        let recorded: Recorded = match r.runtime.applier.apply(command).await {
            Ok(rec) => rec,
            Err(RuntimeError::Store(e)) if e.is_transient() => {
                // The runtime wrote nothing and its store may be back in a moment: the next
                // pass finds our own attempt and offers it again under the same identity.
                return Err(Stop::Retry(format!(
                    "the runtime could not reach its store: {e}"
                )));
            }
            Err(e) => {
                if let RuntimeError::Faulted(reason) = &e {
                    // The runtime latched a persistence fault: `/readyz` reports it whichever
                    // of this and the fault watch ends the residency first.
                    self.ctx.persistence_fault(reason);
                }
                // An attempt exists and the runtime recorded nothing: it is unsound.
                return Err(Stop::End(EndReason::Fault(format!(
                    "the runtime failed a dispatched attempt: {e}"
                ))));
            }
        };
        tracing::debug!(disposition = %recorded.disposition, seq = recorded.seq, "runtime disposed the command");
        failpoints::hit(
            self.ctx.config().host_id.as_str(),
            steps::AFTER_DISPATCH_BEFORE_SETTLE,
        )
        .await;
        self.settle(applying).await?;
        failpoints::hit(
            self.ctx.config().host_id.as_str(),
            steps::AFTER_SETTLE_BEFORE_CURSOR,
        )
        .await;
        Ok(())
    }

    async fn settle(&self, rec: &CommandRecord) -> Result<(), Stop> {
        let settle_span = step_span("command.settle", self.resident.epoch.0);
        match self
            .ctx
            .store()
            .settle(SettleRequest {
                tenant: rec.tenant.clone(),
                session: rec.session.clone(),
                command: rec.command.clone(),
                epoch: self.resident.epoch,
                expected_revision: rec.revision,
            })
            .instrument(settle_span.clone())
            .await
            .inspect_err(|e| span_failed(&settle_span, e.code().as_str()))
        {
            Ok(settled) => {
                if let Some(outcome) = settled.outcome {
                    settle_span.record("outcome", outcome.as_str());
                    tracing::Span::current().record("outcome", outcome.as_str());
                }
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::Evidence => Err(Stop::End(EndReason::Fault(format!(
                "the runtime reported a disposition the journal does not hold: {e}"
            )))),
            Err(e) => Err(store_stop(e)),
        }
    }

    /// An `applying` command: settle it from evidence, or recover a predecessor's stranded
    /// attempt by closure (never our own: our own is re-dispatched under the same identity).
    async fn settle_or_recover(&mut self, rec: CommandRecord) -> Result<(), Stop> {
        let r = self.resident.clone();
        let Some(attempt) = rec.attempt.clone() else {
            return Err(Stop::Blocked(
                "an applying command without an attempt".into(),
            ));
        };
        let req = SettleRequest {
            tenant: rec.tenant.clone(),
            session: rec.session.clone(),
            command: rec.command.clone(),
            epoch: r.epoch,
            expected_revision: rec.revision,
        };
        match self.ctx.store().settle(req.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if e.code() == ErrorCode::Evidence => {}
            Err(e) => return Err(store_stop(e)),
        }
        let current = r.runtime.epoch.journal_epoch();
        if attempt.journal_epoch < current {
            let Some(closer) = r.runtime.closer.clone() else {
                return Err(Stop::Blocked(
                    "a predecessor's attempt is stranded and this runtime cannot close attempts"
                        .into(),
                ));
            };
            let identity = rec.identity();
            match closer
                .close_attempt(identity, attempt.id, attempt.journal_epoch)
                .await
            {
                Ok(_) => {}
                Err(e @ RuntimeError::ClosureRefused(_)) => {
                    return Err(Stop::Blocked(format!(
                        "the stranded attempt cannot be closed: {e}"
                    )));
                }
                Err(e) => {
                    return Err(Stop::End(EndReason::Fault(format!(
                        "the runtime failed to close a stranded attempt: {e}"
                    ))));
                }
            }
            return self.settle(&rec).await;
        }
        if attempt.journal_epoch == current && attempt.residency_epoch == r.epoch {
            // Our own attempt, dispatched and not disposed (or never dispatched): offer it
            // again under the same identity; the runtime deduplicates.
            let body = match self.check(&rec).await? {
                Check::Apply(b) => b,
                Check::Reject(reason) | Check::Block(reason) => {
                    return Err(Stop::Blocked(format!(
                        "an attempted command's body no longer decodes: {reason}"
                    )));
                }
            };
            return self
                .dispatch_and_settle(&rec, attempt.id, current, body)
                .await;
        }
        Err(Stop::Blocked(format!(
            "attempt {} names journal epoch {} and this runtime holds {}",
            attempt.id, attempt.journal_epoch, current
        )))
    }

    async fn reject(&mut self, rec: &CommandRecord, reason: &str) -> Result<(), Stop> {
        tracing::info!(command = %rec.command, reason, "rejecting a command no Host could apply");
        match self
            .ctx
            .store()
            .reject(RejectRequest {
                tenant: rec.tenant.clone(),
                session: rec.session.clone(),
                command: rec.command.clone(),
                epoch: self.resident.epoch,
                reason: reason.to_owned(),
                expected_revision: rec.revision,
            })
            .await
        {
            Ok(_) => {
                self.tokens.remove(&rec.command);
                tracing::Span::current().record("outcome", "rejected");
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::Conflict => Err(Stop::Retry(e.to_string())),
            Err(e) => Err(store_stop(e)),
        }
    }

    /// The strict body check, after the claim and before any attempt.
    async fn check(&self, rec: &CommandRecord) -> Result<Check, Stop> {
        let r = &self.resident;
        let bytes = match &rec.body {
            CommandBody::Inline(b) => b.clone(),
            CommandBody::Object(reference) => {
                match self.ctx.store().get_object(&rec.tenant, reference).await {
                    Ok(obj) if obj.session != rec.session => {
                        return Ok(Check::Reject(
                            "payload object belongs to another session".into(),
                        ));
                    }
                    Ok(obj) if obj.kind != COMMAND_BODY_OBJECT_KIND => {
                        return Ok(Check::Reject(format!(
                            "payload object is a {:?}, not a command body",
                            obj.kind
                        )));
                    }
                    // The cap may have been lowered since the object was written.
                    Ok(obj) if obj.bytes.len() as u64 > self.ctx.store().referenced_body_cap() => {
                        return Ok(Check::Reject(format!(
                            "payload object is {} bytes, above the {}-byte cap",
                            obj.bytes.len(),
                            self.ctx.store().referenced_body_cap()
                        )));
                    }
                    Ok(obj) => obj.bytes,
                    Err(e) => match e.code() {
                        ErrorCode::NotFound => {
                            return Ok(Check::Reject("payload object missing".into()));
                        }
                        ErrorCode::Integrity | ErrorCode::Invalid => {
                            return Ok(Check::Reject(format!("payload object corrupt: {e}")));
                        }
                        _ => return Ok(Check::Block(format!("payload object unreadable: {e}"))),
                    },
                }
            }
        };
        let decoded = decode_command(rec.kind, &bytes, &rec.session, &rec.command).and_then(|d| {
            let (principal, metadata) = d
                .attribution
                .reconcile(rec.principal.as_deref(), rec.metadata.as_deref())?;
            Ok(Checked {
                body: d.body,
                principal,
                metadata,
            })
        });
        let checked = match decoded {
            Ok(c) => c,
            Err(e @ DecodeError::Malformed(_)) => return Ok(Check::Reject(e.to_string())),
            Err(e) => return Ok(Check::Block(format!("unreadable_command: {e}"))),
        };
        let body = &checked.body;
        if let CommandBodyV1::GateResponse(answer) = body {
            let session = match self
                .ctx
                .store()
                .session(&r.key.tenant, &r.key.session)
                .await
            {
                Ok(s) => s,
                Err(e) => return Ok(Check::Block(format!("gate projection unreadable: {e}"))),
            };
            if session.gate_mark != r.epoch {
                return Ok(Check::Block(format!(
                    "the gate mark is {} and this Host's grant is {}",
                    session.gate_mark, r.epoch
                )));
            }
            if let Some(expected) = answer.expected_gate_seq {
                let gates = match self
                    .ctx
                    .store()
                    .gates(&r.key.tenant, &r.key.session, false)
                    .await
                {
                    Ok(g) => g,
                    Err(e) => return Ok(Check::Block(format!("gate projection unreadable: {e}"))),
                };
                let id = GateId::new(answer.gate_id.to_string())
                    .map_err(|e| Stop::Blocked(e.to_string()))?;
                if let Some(g) = gates.iter().find(|g| g.gate == id)
                    && g.opened_seq != expected
                {
                    return Ok(Check::Reject(format!(
                        "expected_gate_seq {expected} contradicts the projected gate opened at {}",
                        g.opened_seq
                    )));
                }
            }
        }
        Ok(Check::Apply(checked))
    }
}
