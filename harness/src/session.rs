//! The session runtime: one task (the actor) per runtime session id owns its state and its
//! journal lease, and is the only writer of its journal. Commands, closures, turn steps, gate
//! timeouts, release and abandonment are all messages to it, handled one at a time. Each
//! accepted command is one journal append carrying the application (prefix and disposition)
//! together with its effects. A failed append latches a persistence fault: nothing is written
//! after it, and every later command is refused.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use department::{
    CommittedEvent, LaunchError, LaunchMode, LaunchRequest, PersistenceFault, Preview, Recorded,
    RuntimeCommand, RuntimeError,
};
use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    ApplicationOutcome, AttemptId, Clock, CommandIdentity, ErrorCode, EventId, JournalEntry,
    JournalEpoch, JournalLease, RuntimeCommandId, RuntimeSessionId, SessionId, Store, StoreError,
    SystemClock, TenantId,
};
use timing::Backoff;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::agent::AgentConfig;
use crate::events::{Cause, GateKind, HarnessEvent};
use crate::inbox::{EVENT_BUFFER, LazyFanout, Msg, Shared, StopReason, TurnMsg};
use crate::snapshot::{self, SnapshotStats};
use crate::state::{Resolution, SessionState, Window};
use crate::turn::{self, TurnPlan};

/// A turn's handle, held by the actor.
struct TurnHandle {
    turn_id: String,
    cancel: CancellationToken,
    reason: Arc<std::sync::Mutex<Option<StopReason>>>,
}

/// The handle the Host's traits are implemented on. Cheap to clone.
#[derive(Clone)]
pub struct SessionHandle {
    tx: mpsc::Sender<Box<Msg>>,
    pub(crate) shared: Arc<Shared>,
    runtime_session: RuntimeSessionId,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("runtime_session", &self.runtime_session)
            .finish()
    }
}

/// How deep the actor's inbox is.
const INBOX: usize = 64;
/// The size of a journal page read at restore. Small on purpose: a restore without a usable
/// snapshot folds the whole journal, and pages sized to a long journal are large short-lived
/// buffers that grow with it and scatter the allocator's heap (memory a recycling Host never
/// gets back).
const RESTORE_PAGE: usize = 128;

struct Actor {
    store: Store,
    agent: Arc<AgentConfig>,
    tenant: TenantId,
    session: SessionId,
    lease: JournalLease,
    state: SessionState,
    shared: Arc<Shared>,
    turn: Option<TurnHandle>,
    fault: Option<PersistenceFault>,
    rx: mpsc::Receiver<Box<Msg>>,
    turn_tx: mpsc::Sender<Box<Msg>>,
    clock: SystemClock,
    /// A message was handled since the last renewal tick: only a runtime in use renews its
    /// journal lease (see `renew`).
    used: bool,
    /// The journal sequence the newest snapshot (written or restored from) folds through.
    snapshot_seq: u64,
    stats: Arc<SnapshotStats>,
    /// The trace each accepted, not yet started input was dispatched under, by command id
    /// (memory only, bounded): its turn continues it. A restored input starts a new trace.
    input_traces: VecDeque<(String, trace_context::TraceContext)>,
}

/// The most input traces an actor keeps for turns not yet started.
const INPUT_TRACES: usize = 64;

impl SessionHandle {
    /// The runtime session id this runtime runs under.
    pub fn runtime_session(&self) -> RuntimeSessionId {
        self.runtime_session
    }

    /// The journal epoch it writes under.
    pub fn journal_epoch(&self) -> JournalEpoch {
        JournalEpoch(self.shared.epoch.load(Ordering::SeqCst))
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, RuntimeError>>) -> Msg,
    ) -> Result<T, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Box::new(make(tx)))
            .await
            .map_err(|_| RuntimeError::Stopped)?;
        rx.await.map_err(|_| RuntimeError::Stopped)?
    }

    /// Applies a command (see [`department::CommandApplier`]).
    pub async fn apply(&self, command: RuntimeCommand) -> Result<Recorded, RuntimeError> {
        self.ask(|r| Msg::Apply(command, r)).await
    }

    /// Closes a predecessor's attempt (see [`department::AttemptCloser`]).
    pub async fn close_attempt(
        &self,
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
    ) -> Result<Recorded, RuntimeError> {
        self.ask(|reply| Msg::Close {
            identity,
            attempt,
            attempt_epoch,
            reply,
        })
        .await
    }

    /// Releases gracefully (idle only).
    pub async fn release(&self) -> Result<(), RuntimeError> {
        self.ask(Msg::Release).await
    }

    /// Abandons crash-equivalently: writes nothing, releases the journal lease.
    pub async fn abandon(&self) -> Result<(), RuntimeError> {
        match self.ask(Msg::Abandon).await {
            Err(RuntimeError::Stopped) => Ok(()),
            other => other,
        }
    }

    /// Idle, as a watch.
    pub fn idle(&self) -> watch::Receiver<bool> {
        self.shared.idle.subscribe()
    }

    /// Faults, as a watch.
    pub fn faults(&self) -> watch::Receiver<Option<PersistenceFault>> {
        self.shared.faults.subscribe()
    }

    /// Liveness, as a watch.
    pub fn alive(&self) -> watch::Receiver<bool> {
        self.shared.alive.subscribe()
    }

    /// Committed events.
    pub fn committed(&self) -> broadcast::Receiver<Arc<CommittedEvent>> {
        self.shared.committed.subscribe()
    }

    /// Live previews.
    pub fn previews(&self) -> broadcast::Receiver<Preview> {
        self.shared.previews.subscribe()
    }
}

fn store_err(e: StoreError) -> LaunchError {
    LaunchError::Store(e)
}

/// Launches a session runtime: creates a conversation under the binding's runtime session id
/// (refused when the journal already holds one) or restores one from its newest snapshot and
/// the journal after it (see `read_state`).
pub(crate) async fn launch(
    store: Store,
    agent: Arc<AgentConfig>,
    stats: Arc<SnapshotStats>,
    compatibility: String,
    request: LaunchRequest,
) -> Result<SessionHandle, LaunchError> {
    let rs = request.binding.runtime_session_id;
    let tenant = request.tenant.clone();
    let window = Window {
        turns: agent.conversation_turns,
        bytes: agent.conversation_bytes,
    };
    if request.mode == LaunchMode::Create {
        // Refuse before writing anything: creating over a conversation must be impossible.
        let (existing, _) = read_state(&store, &tenant, rs, window, &stats).await?;
        if existing.started {
            return Err(LaunchError::ConversationExists);
        }
    }
    let lease = store
        .journal_acquire(&tenant, rs, &request.holder, agent.lease_ttl)
        .await
        .map_err(store_err)?;
    let mut lease = lease;
    let (state, snapshot_seq) = match read_state(&store, &tenant, rs, window, &stats).await {
        Ok(s) => s,
        Err(e) => {
            let _ = store.journal_release(&lease).await;
            return Err(e);
        }
    };
    let refuse = |e: LaunchError| e;
    match request.mode {
        LaunchMode::Create if state.started => {
            // A concurrent creator won between the check and the fence.
            let _ = store.journal_release(&lease).await;
            return Err(refuse(LaunchError::ConversationExists));
        }
        LaunchMode::Restore if !state.started => {
            let _ = store.journal_release(&lease).await;
            return Err(refuse(LaunchError::NoConversation));
        }
        LaunchMode::Restore => {
            if state.compatibility.as_deref() != Some(compatibility.as_str()) {
                let _ = store.journal_release(&lease).await;
                return Err(LaunchError::Runtime(RuntimeError::Store(
                    StoreError::Invalid {
                        field: "runtime_compatibility_id",
                        reason: format!(
                            "the journal was created under {:?}, this runtime is {compatibility:?}",
                            state.compatibility
                        ),
                    },
                )));
            }
        }
        LaunchMode::Create => {}
    }
    let (committed, _) = broadcast::channel(EVENT_BUFFER);
    let (idle, _) = watch::channel(false);
    let (faults, _) = watch::channel(None);
    let (alive, _) = watch::channel(true);
    let shared = Arc::new(Shared {
        committed,
        previews: LazyFanout::new(),
        idle,
        faults,
        alive,
        epoch: AtomicU64::new(lease.epoch.0),
    });
    let mut state = state;
    if request.mode == LaunchMode::Create {
        let ev = HarnessEvent::SessionStarted {
            session_id: request.session.to_string(),
            agent_id: request.agent.to_string(),
            runtime_compatibility_id: compatibility.clone(),
        };
        let event_id = new_event_id();
        let entry = JournalEntry::Event {
            event: event_id.clone(),
            public_body: ev.encode(),
            private_body: None,
            cause: None,
        };
        match store.journal_append(&lease, vec![entry]).await {
            Ok(tip) => {
                lease.tip = tip;
                let now = SystemClock.now_ms();
                let _ = state.fold_event(event_id.as_str(), ev, now, tip);
            }
            Err(e) => {
                let _ = store.journal_release(&lease).await;
                return Err(store_err(e));
            }
        }
    }
    let (tx, rx) = mpsc::channel(INBOX);
    let handle = SessionHandle {
        tx: tx.clone(),
        shared: shared.clone(),
        runtime_session: rs,
    };
    let actor = Actor {
        store,
        agent,
        tenant,
        session: request.session.clone(),
        lease,
        state,
        shared,
        turn: None,
        fault: None,
        rx,
        turn_tx: tx,
        clock: SystemClock,
        used: false,
        snapshot_seq,
        stats,
        input_traces: VecDeque::new(),
    };
    let span = tracing::info_span!(
        target: trace_context::span::LONG_LIVED,
        parent: None,
        "harness_session",
        tenant = %actor.tenant,
        session = %actor.session,
        journal_epoch = actor.lease.epoch.0
    );
    tokio::spawn(tracing::Instrument::instrument(actor.run(), span));
    Ok(handle)
}

/// The session's state from its journal: the newest usable snapshot and the records after it,
/// or the whole journal when there is no snapshot or it cannot be used (another format, a
/// body that fails its digest or does not decode). Returns the state and the sequence the
/// snapshot it started from folds through (0 for none).
async fn read_state(
    store: &Store,
    tenant: &TenantId,
    rs: RuntimeSessionId,
    window: Window,
    stats: &SnapshotStats,
) -> Result<(SessionState, u64), LaunchError> {
    let found = match store.journal_snapshot(tenant, rs).await {
        Ok(found) => found,
        Err(e) if e.is_transient() => return Err(store_err(e)),
        Err(e) => {
            tracing::warn!(error = %e, "the journal snapshot is unreadable; folding the whole journal");
            stats.fell_back();
            None
        }
    };
    let (mut state, mut after) = match found {
        None => (SessionState::new(window), 0),
        Some(snap) => match snapshot::decode(snap.format, &snap.body, window) {
            Ok(state) => {
                stats.restored();
                (state, snap.seq)
            }
            Err(e) => {
                tracing::warn!(error = %e, seq = snap.seq, "the journal snapshot cannot be used; folding the whole journal");
                stats.fell_back();
                (SessionState::new(window), 0)
            }
        },
    };
    let from = after;
    loop {
        let page = store
            .journal_runtime_page(tenant, rs, after, RESTORE_PAGE)
            .await
            .map_err(store_err)?;
        let n = page.len();
        for r in &page {
            state.fold(r).map_err(|e| {
                LaunchError::Store(StoreError::Integrity {
                    entity: "journal",
                    reason: e,
                })
            })?;
            after = r.seq;
        }
        if n < RESTORE_PAGE {
            break;
        }
    }
    Ok((state, from))
}

/// The record a journal entry becomes once written.
fn record_kind(entry: JournalEntry) -> sessionstore::RecordKind {
    match entry {
        JournalEntry::Event {
            event,
            public_body,
            private_body,
            cause,
        } => sessionstore::RecordKind::Event {
            event,
            public_body,
            private_body,
            cause,
        },
        JournalEntry::Control { body, cause } => sessionstore::RecordKind::Control { body, cause },
        JournalEntry::Application {
            identity,
            attempt,
            attempt_epoch,
            outcome,
            detail,
        } => sessionstore::RecordKind::Application {
            identity,
            attempt,
            attempt_epoch,
            outcome,
            detail,
        },
        JournalEntry::Closure {
            identity,
            attempt,
            attempt_epoch,
        } => sessionstore::RecordKind::Closure {
            identity,
            attempt,
            attempt_epoch,
        },
    }
}

/// True when the store refused an append because the journal already holds a disposition of
/// its command (nothing was written).
fn is_disposed(e: &StoreError) -> bool {
    matches!(e, StoreError::State { entity: "journal", state, .. } if state == "disposed")
}

/// Stores a snapshot, logging and counting a failure (never a fault: the journal is whole
/// without it).
async fn write_snapshot(
    store: &Store,
    lease: &JournalLease,
    seq: u64,
    body: Vec<u8>,
    stats: &SnapshotStats,
) {
    match store
        .journal_put_snapshot(lease, seq, snapshot::FORMAT, body)
        .await
    {
        Ok(_) => stats.wrote(),
        Err(e) => {
            tracing::warn!(error = %e, seq, "a journal snapshot was not written");
            stats.failed();
        }
    }
}

/// The waits before retrying an interrupted journal write: from 50 ms, doubled per retry up to
/// one second, each jittered to between half and all of its step.
const JOURNAL_WRITE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1)).with_jitter();

fn new_event_id() -> EventId {
    // A UUID's text always satisfies the id rule.
    EventId::new(Uuid::now_v7().to_string()).unwrap_or_else(|_| new_event_id())
}

impl Actor {
    async fn run(mut self) {
        // Gates restored open and pending work restart where the journal left them.
        self.resume_after_restore();
        self.publish_idle();
        let renew_every = (self.agent.lease_ttl / 3).max(Duration::from_millis(50));
        // The renewal timer is armed only while the runtime is in use (see `renew`): an idle
        // runtime has no timer at all, so a Host holding many idle sessions is not woken for
        // them.
        let mut renew_at: Option<tokio::time::Instant> = None;
        loop {
            let due = async {
                match renew_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = self.rx.recv() => {
                    let Some(msg) = msg else { break };
                    // Boxed, as the renewal below: the actor rests small between messages.
                    if !Box::pin(self.handle(*msg)).await {
                        break;
                    }
                    if renew_at.is_none() {
                        renew_at = Some(tokio::time::Instant::now() + renew_every);
                    }
                }
                _ = due => {
                    Box::pin(self.renew()).await;
                    renew_at = (self.turn.is_some() || self.used)
                        .then(|| tokio::time::Instant::now() + renew_every);
                }
            }
        }
        self.shared.alive.send_replace(false);
    }

    fn publish_idle(&self) {
        let idle = self.fault.is_none() && self.state.is_idle(self.turn.is_some());
        self.shared.idle.send_if_modified(|v| {
            let changed = *v != idle;
            *v = idle;
            changed
        });
    }

    async fn renew(&mut self) {
        if self.fault.is_some() {
            return;
        }
        // An idle runtime does not renew: no write is refused on the journal lease's expiry
        // (acquisition always takes over, and every append is fenced by epoch and tip), so the
        // expiry is only what a reader sees. Renewing it for every idle session would cost a
        // durable write per session per third of the TTL, which a Host holding many idle
        // sessions cannot afford. A runtime that handled a message or runs a turn renews.
        if !std::mem::take(&mut self.used) && self.turn.is_none() {
            return;
        }
        match self
            .store
            .journal_renew(&self.lease, self.agent.lease_ttl)
            .await
        {
            Ok(l) => self.lease.expires_at_ms = l.expires_at_ms,
            Err(e) if matches!(e.code(), ErrorCode::Epoch | ErrorCode::ClaimLost) => {
                self.latch(format!("the journal lease was lost: {e}"));
            }
            // A transient renew failure is retried at the next tick; appends are fenced anyway.
            Err(e) => tracing::warn!(error = %e, "journal lease renewal failed"),
        }
    }

    /// Handles one message; false when the actor must stop.
    async fn handle(&mut self, msg: Msg) -> bool {
        self.used = true;
        match msg {
            Msg::Apply(cmd, reply) => {
                let r = self.apply(cmd).await;
                // Whatever the command set in motion is visible before the caller hears back:
                // a caller that then waits for idle never sees the idle of before.
                self.start_next_turn();
                self.publish_idle();
                let _ = reply.send(r);
            }
            Msg::Close {
                identity,
                attempt,
                attempt_epoch,
                reply,
            } => {
                let r = self.close(identity, attempt, attempt_epoch).await;
                let _ = reply.send(r);
            }
            Msg::Release(reply) => {
                if self.fault.is_none() && !self.state.is_idle(self.turn.is_some()) {
                    let _ = reply.send(Err(RuntimeError::NotIdle));
                    return true;
                }
                // A warm release checkpoints, so the next restore folds only its own fence;
                // one that added nothing but its opening fence since the snapshot writes none.
                if self.fault.is_none()
                    && self.lease.tip > self.snapshot_seq + 1
                    && let Some((seq, body)) = self.snapshot_body()
                {
                    write_snapshot(&self.store, &self.lease, seq, body, &self.stats).await;
                }
                let r = self
                    .store
                    .journal_release(&self.lease)
                    .await
                    .map_err(RuntimeError::Store);
                let _ = reply.send(r);
                return false;
            }
            Msg::Abandon(reply) => {
                self.stop_turn(StopReason::Silent);
                let r = self
                    .store
                    .journal_release(&self.lease)
                    .await
                    .map_err(RuntimeError::Store);
                let _ = reply.send(r);
                return false;
            }
            Msg::Turn(t) => self.turn_msg(t).await,
        }
        self.start_next_turn();
        self.publish_idle();
        true
    }

    fn stop_turn(&mut self, reason: StopReason) {
        if let Some(t) = &self.turn {
            if let Ok(mut r) = t.reason.lock() {
                // An interrupt never downgrades a silent stop.
                if r.as_ref() != Some(&StopReason::Silent) {
                    *r = Some(reason);
                }
            }
            t.cancel.cancel();
        }
    }

    fn latch(&mut self, reason: String) {
        if self.fault.is_some() {
            return;
        }
        tracing::error!(reason = %reason, "persistence fault latched; the session refuses every command from now on");
        self.fault = Some(PersistenceFault { reason });
        self.shared.faults.send_replace(self.fault.clone());
        self.stop_turn(StopReason::Silent);
    }

    /// Appends entries as one compare-and-set; folds and publishes them on success. A failure
    /// latches the fault.
    async fn append(&mut self, entries: Vec<JournalEntry>) -> Result<u64, RuntimeError> {
        if let Some(f) = &self.fault {
            return Err(RuntimeError::Faulted(f.reason.clone()));
        }
        match self.try_append(entries).await {
            Ok(tip) => Ok(tip),
            Err(e) => Err(self.failed_write(e)),
        }
    }

    /// Appends entries as one compare-and-set and folds them; a failure is returned as the
    /// store gave it, latching nothing (the caller decides).
    async fn try_append(&mut self, entries: Vec<JournalEntry>) -> Result<u64, StoreError> {
        let first = self.lease.tip + 1;
        let tip = self.write_journal(&entries).await?;
        self.lease.tip = tip;
        let now = self.clock.now_ms();
        for (i, e) in entries.into_iter().enumerate() {
            let seq = first + i as u64;
            self.fold_written(e, seq, now);
        }
        self.snapshot_if_due();
        Ok(tip)
    }

    /// Latches the fault a failed journal write is, and the error its caller answers.
    fn failed_write(&mut self, e: StoreError) -> RuntimeError {
        let lost = e.code() == ErrorCode::Epoch;
        self.latch(format!("a journal write failed: {e}"));
        if lost {
            RuntimeError::LeaseLost
        } else {
            RuntimeError::Faulted(e.to_string())
        }
    }

    /// Checkpoints the fold when `snapshot_every` records were appended since the last
    /// snapshot. The write runs beside the actor: it never delays or fails an append (a failed
    /// one is logged and counted, and the next is due `snapshot_every` records later).
    fn snapshot_if_due(&mut self) {
        if self.fault.is_some()
            || self.lease.tip < self.snapshot_seq.saturating_add(self.agent.snapshot_every)
        {
            return;
        }
        let Some((seq, body)) = self.snapshot_body() else {
            return;
        };
        let (store, lease, stats) = (self.store.clone(), self.lease.clone(), self.stats.clone());
        tokio::spawn(async move { write_snapshot(&store, &lease, seq, body, &stats).await });
    }

    /// The snapshot of the fold through the tip (marked as the newest), or `None` when the
    /// fold does not encode (counted as a failed snapshot).
    fn snapshot_body(&mut self) -> Option<(u64, Vec<u8>)> {
        self.snapshot_seq = self.lease.tip;
        match snapshot::encode(&self.state) {
            Ok(body) => Some((self.lease.tip, body)),
            Err(e) => {
                tracing::warn!(error = %e, "a journal snapshot was not written");
                self.stats.failed();
                None
            }
        }
    }

    /// As [`Actor::recorded`]; a faulted session answers a failed read with its fault.
    async fn recorded_unless_faulted(
        &self,
        rc: RuntimeCommandId,
    ) -> Result<Option<Recorded>, RuntimeError> {
        match self.recorded(rc).await {
            Err(_) if self.fault.is_some() => Ok(None),
            other => other,
        }
    }

    /// The disposition the journal holds for `rc`: the recent ones in memory, else one read
    /// through the journal's index of dispositions by command.
    async fn recorded(&self, rc: RuntimeCommandId) -> Result<Option<Recorded>, RuntimeError> {
        if let Some(r) = self.state.recent.get(&rc) {
            return Ok(Some(r));
        }
        let frame = self
            .store
            .journal_command_disposition(&self.lease.tenant, self.lease.runtime_session, rc)
            .await?;
        Ok(frame.map(|f| Recorded {
            disposition: f.disposition,
            seq: f.seq,
        }))
    }

    /// One journal append as a compare-and-set on the tip. A transient store failure (a reset
    /// connection, a restarting server, a busy file) is retried with jittered, doubling backoff
    /// for at most a third of the lease TTL — within the lease, so no successor can have taken
    /// the journal meanwhile without the append being refused as `epoch`. An interrupted try
    /// may have committed before its answer was lost: a retry then meets the tip already moved
    /// (`conflict`), and the records after the old tip are read back — if they are exactly
    /// these entries under this lease's epoch, the append happened. Anything else is definite.
    async fn write_journal(&self, entries: &[JournalEntry]) -> Result<u64, StoreError> {
        let deadline = tokio::time::Instant::now() + self.agent.lease_ttl / 3;
        let mut retries = JOURNAL_WRITE_BACKOFF.retries();
        let mut interrupted = false;
        loop {
            let error = match self
                .store
                .journal_append(&self.lease, entries.to_vec())
                .await
            {
                Ok(tip) => return Ok(tip),
                Err(e) if interrupted && e.code() == ErrorCode::Conflict => {
                    match self.appended_before(entries).await {
                        Ok(true) => {
                            tracing::info!("an interrupted journal append had committed");
                            return Ok(self.lease.tip + entries.len() as u64);
                        }
                        Ok(false) => return Err(e),
                        Err(read) if read.is_transient() => read,
                        Err(read) => return Err(read),
                    }
                }
                Err(e) if e.is_transient() => e,
                Err(e) => return Err(e),
            };
            interrupted = true;
            let wait = retries.next_wait();
            if tokio::time::Instant::now() + wait > deadline {
                return Err(error);
            }
            tracing::warn!(error = %error, retry_in_ms = wait.as_millis() as u64, "a journal write was interrupted; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// True when the records right after the lease's tip are exactly `entries`, written under
    /// this lease's epoch.
    async fn appended_before(&self, entries: &[JournalEntry]) -> Result<bool, StoreError> {
        let page = self
            .store
            .journal_runtime_page(
                &self.lease.tenant,
                self.lease.runtime_session,
                self.lease.tip,
                entries.len(),
            )
            .await?;
        Ok(page.len() == entries.len()
            && page.iter().zip(entries).enumerate().all(|(i, (r, e))| {
                r.seq == self.lease.tip + 1 + i as u64
                    && r.epoch == self.lease.epoch
                    && r.kind == record_kind(e.clone())
            }))
    }

    fn fold_written(&mut self, entry: JournalEntry, seq: u64, now: sessionstore::Millis) {
        let record = sessionstore::JournalRecord {
            seq,
            epoch: self.lease.epoch,
            written_at_ms: now,
            kind: record_kind(entry),
        };
        self.fold_record(record);
    }

    fn fold_record(&mut self, record: sessionstore::JournalRecord) {
        let seq = record.seq;
        if let sessionstore::RecordKind::Event {
            event, public_body, ..
        } = &record.kind
        {
            let _ = self.shared.committed.send(Arc::new(CommittedEvent {
                seq,
                event: event.clone(),
                body: Arc::from(public_body.as_slice()),
            }));
        }
        if let Err(e) = self.state.fold(&record) {
            // Our own writes always decode; if one does not, stop writing rather than diverge.
            self.latch(format!("the session could not fold its own record: {e}"));
        }
    }

    fn event(ev: &HarnessEvent, cause: Option<RuntimeCommandId>) -> JournalEntry {
        JournalEntry::Event {
            event: new_event_id(),
            public_body: ev.encode(),
            private_body: None,
            cause,
        }
    }

    async fn apply(&mut self, cmd: RuntimeCommand) -> Result<Recorded, RuntimeError> {
        let span = tracing::info_span!(
            parent: None,
            "runtime.apply",
            tenant = %cmd.tenant,
            session = %cmd.session,
            command = %cmd.identity.command,
            kind = %cmd.identity.kind,
            attempt = %cmd.attempt
        );
        trace_context::span::continue_if(&span, cmd.trace.as_ref());
        if let Some(trace) = trace_context::span::for_callee(&span, cmd.trace.as_ref()) {
            let command = cmd.identity.command.to_string();
            self.input_traces.retain(|(c, _)| *c != command);
            if self.input_traces.len() >= INPUT_TRACES {
                self.input_traces.pop_front();
            }
            self.input_traces.push_back((command, trace));
        }
        tracing::Instrument::instrument(self.apply_inner(cmd), span).await
    }

    /// The trace the input that caused a turn was applied under (taken: one turn per input).
    fn take_input_trace(&mut self, cause: Option<&Cause>) -> Option<trace_context::TraceContext> {
        let command = &cause?.command_id;
        let at = self.input_traces.iter().position(|(c, _)| c == command)?;
        self.input_traces.remove(at).map(|(_, t)| t)
    }

    async fn apply_inner(&mut self, cmd: RuntimeCommand) -> Result<Recorded, RuntimeError> {
        if cmd.tenant != self.tenant || cmd.session != self.session {
            return Err(RuntimeError::WrongSession);
        }
        let rc = cmd.identity.runtime_command;
        if let Some(r) = self.state.recent.get(&rc) {
            // A duplicate delivery: the recorded disposition, and nothing else.
            return Ok(r);
        }
        if self.fault.is_some() || cmd.journal_epoch != self.lease.epoch {
            // Refused below, unless it was recorded before (a duplicate of an older one).
            if let Some(r) = self.recorded_unless_faulted(rc).await? {
                return Ok(r);
            }
        }
        if let Some(f) = &self.fault {
            return Err(RuntimeError::Faulted(f.reason.clone()));
        }
        if cmd.journal_epoch != self.lease.epoch {
            return Err(RuntimeError::Epoch {
                attempt: cmd.journal_epoch.0,
                held: self.lease.epoch.0,
            });
        }
        // The principal crosses on every kind, metadata on create and input (a JSON object
        // the store accepted at admission; anything else is left out rather than guessed).
        let carries_metadata = matches!(
            cmd.body,
            CommandBodyV1::Create { .. } | CommandBodyV1::Input { .. }
        );
        let cause = Cause {
            command_id: cmd.identity.command.to_string(),
            principal: cmd.principal.clone(),
            metadata: cmd
                .metadata
                .as_deref()
                .filter(|_| carries_metadata)
                .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
                .filter(serde_json::Value::is_object),
        };
        let mut effects: Vec<JournalEntry> = Vec::new();
        let mut resolution: Option<(Uuid, Resolution)> = None;
        let mut interrupt = false;
        let outcome = match &cmd.body {
            CommandBodyV1::Create { text } => {
                if let Some(t) = text.as_ref().filter(|t| !t.is_empty()) {
                    effects.push(Self::event(
                        &HarnessEvent::UserMessage {
                            text: t.clone(),
                            cause: cause.clone(),
                        },
                        Some(rc),
                    ));
                }
                ApplicationOutcome::Applied
            }
            CommandBodyV1::Restore => ApplicationOutcome::Applied,
            CommandBodyV1::Input { text } => {
                if text.is_empty() {
                    ApplicationOutcome::Refused
                } else {
                    effects.push(Self::event(
                        &HarnessEvent::UserMessage {
                            text: text.clone(),
                            cause: cause.clone(),
                        },
                        Some(rc),
                    ));
                    ApplicationOutcome::Applied
                }
            }
            CommandBodyV1::Interrupt => {
                if self.turn.is_some() {
                    interrupt = true;
                    ApplicationOutcome::Applied
                } else {
                    ApplicationOutcome::NoOp
                }
            }
            CommandBodyV1::GateResponse(answer) => match self.state.open_gates.get(&answer.gate_id)
            {
                None => ApplicationOutcome::NoOp,
                Some(gate) => {
                    let offered = gate.kind.actions().contains(&answer.action.as_str());
                    let text_ok = gate.kind != GateKind::AskUser
                        || answer.text.as_ref().is_some_and(|t| !t.is_empty());
                    if !offered || !text_ok {
                        ApplicationOutcome::Refused
                    } else {
                        let res = Resolution {
                            action: answer.action.clone(),
                            text: answer.text.clone(),
                        };
                        effects.push(Self::event(
                            &HarnessEvent::GateResolved {
                                gate_id: answer.gate_id.to_string(),
                                action: res.action.clone(),
                                text: res.text.clone(),
                                cause: Some(cause.clone()),
                            },
                            Some(rc),
                        ));
                        resolution = Some((answer.gate_id, res));
                        ApplicationOutcome::Applied
                    }
                }
            },
        };
        // The waiter must be taken before the fold removes the gate.
        let waiter = resolution.as_ref().and_then(|(g, _)| {
            self.state
                .open_gates
                .get_mut(g)
                .and_then(|o| o.waiter.take())
        });
        let mut entries = vec![JournalEntry::Application {
            identity: cmd.identity.clone(),
            attempt: cmd.attempt,
            attempt_epoch: cmd.journal_epoch,
            outcome,
            detail: None,
        }];
        entries.extend(effects);
        let first = self.lease.tip + 1;
        // A command recorded before this launch (and no longer in memory) is refused by the
        // journal's one-disposition-per-command index, writing nothing: its recorded
        // disposition is the answer. So a new command costs no read to tell it from a
        // duplicate, and none of the session's history need be held.
        match self.try_append(entries).await {
            Ok(_) => {}
            Err(e) if is_disposed(&e) => {
                if let (Some(w), Some((g, _))) = (waiter, &resolution)
                    && let Some(open) = self.state.open_gates.get_mut(g)
                {
                    open.waiter = Some(w);
                }
                return match self.recorded(rc).await? {
                    Some(r) => Ok(r),
                    None => Err(self.failed_write(e)),
                };
            }
            Err(e) => return Err(self.failed_write(e)),
        }
        if let (Some(w), Some((_, res))) = (waiter, resolution) {
            let _ = w.send(res);
        }
        if interrupt {
            self.stop_turn(StopReason::Interrupt(cause, rc));
        }
        Ok(Recorded::applied(outcome, first))
    }

    async fn close(
        &mut self,
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
    ) -> Result<Recorded, RuntimeError> {
        if let Some(r) = self
            .recorded_unless_faulted(identity.runtime_command)
            .await?
        {
            return Ok(r);
        }
        if let Some(f) = &self.fault {
            return Err(RuntimeError::Faulted(f.reason.clone()));
        }
        if attempt_epoch >= self.lease.epoch {
            // Never close an attempt of our own epoch: only a strictly later writer may.
            return Err(RuntimeError::Epoch {
                attempt: attempt_epoch.0,
                held: self.lease.epoch.0,
            });
        }
        if self
            .store
            .journal_has_effect(
                &self.lease.tenant,
                self.lease.runtime_session,
                identity.runtime_command,
            )
            .await?
        {
            return Err(RuntimeError::ClosureRefused(format!(
                "the journal holds an effect of command {}",
                identity.command
            )));
        }
        let first = self.lease.tip + 1;
        self.append(vec![JournalEntry::Closure {
            identity,
            attempt,
            attempt_epoch,
        }])
        .await?;
        Ok(Recorded {
            disposition: sessionstore::Disposition::NotApplied,
            seq: first,
        })
    }

    async fn turn_msg(&mut self, msg: TurnMsg) {
        match msg {
            TurnMsg::Append {
                turn_id,
                events,
                reply,
            } => {
                let current = self.turn.as_ref().is_some_and(|t| t.turn_id == turn_id);
                if !current || self.fault.is_some() {
                    let _ = reply.send(Err(()));
                    return;
                }
                let entries = events.iter().map(|(e, c)| Self::event(e, *c)).collect();
                let r = self.append(entries).await.map(|_| ()).map_err(|_| ());
                let _ = reply.send(r);
            }
            TurnMsg::OpenGate {
                turn_id,
                event,
                reply,
            } => {
                let current = self.turn.as_ref().is_some_and(|t| t.turn_id == turn_id);
                let gate = match &event {
                    HarnessEvent::GateOpened { gate_id, .. } => Uuid::try_parse(gate_id).ok(),
                    _ => None,
                };
                let (Some(gate), true) = (gate, current) else {
                    let _ = reply.send(Err(()));
                    return;
                };
                if self.append(vec![Self::event(&event, None)]).await.is_err() {
                    let _ = reply.send(Err(()));
                    return;
                }
                let (tx, rx) = oneshot::channel();
                if let Some(g) = self.state.open_gates.get_mut(&gate) {
                    g.waiter = Some(tx);
                }
                let _ = reply.send(Ok(rx));
            }
            TurnMsg::AwaitGate { gate, reply } => {
                let rx = self.state.open_gates.get_mut(&gate).map(|g| {
                    let (tx, rx) = oneshot::channel();
                    g.waiter = Some(tx);
                    rx
                });
                let _ = reply.send(rx);
            }
            TurnMsg::GateTimeout { gate } => {
                let Some(open) = self.state.open_gates.get_mut(&gate) else {
                    return;
                };
                let waiter = open.waiter.take();
                let ev = HarnessEvent::GateResolved {
                    gate_id: gate.to_string(),
                    action: "timeout".into(),
                    text: None,
                    cause: None,
                };
                if self.append(vec![Self::event(&ev, None)]).await.is_ok()
                    && let Some(w) = waiter
                {
                    let _ = w.send(Resolution {
                        action: "timeout".into(),
                        text: None,
                    });
                }
            }
            TurnMsg::Conversation {
                pending_input,
                reply,
            } => {
                let _ = reply.send(self.state.conversation_with(
                    self.agent.system_prompt.as_deref(),
                    pending_input.as_deref(),
                ));
            }
            TurnMsg::Finished { turn_id } => {
                if self.turn.as_ref().is_some_and(|t| t.turn_id == turn_id) {
                    self.turn = None;
                }
            }
        }
    }

    fn spawn_turn(
        &mut self,
        turn_id: String,
        plan: TurnPlan,
        trace: Option<trace_context::TraceContext>,
    ) {
        let span = tracing::info_span!(
            parent: None,
            "turn",
            tenant = %self.tenant,
            session = %self.session,
            turn_id = %turn_id,
        );
        trace_context::span::continue_if(&span, trace.as_ref());
        let cancel = CancellationToken::new();
        let reason = Arc::new(std::sync::Mutex::new(None));
        self.turn = Some(TurnHandle {
            turn_id: turn_id.clone(),
            cancel: cancel.clone(),
            reason: reason.clone(),
        });
        let ctx = turn::TurnCtx {
            turn_id,
            agent: self.agent.clone(),
            tx: self.turn_tx.clone(),
            shared: self.shared.clone(),
            cancel,
            reason,
        };
        tokio::spawn(tracing::Instrument::instrument(turn::run(ctx, plan), span));
    }

    /// Starts the next queued input's turn when no turn is running.
    fn start_next_turn(&mut self) {
        if self.turn.is_some() || self.fault.is_some() || self.state.open_turn.is_some() {
            return;
        }
        let Some(input) = self.state.inputs.front().cloned() else {
            return;
        };
        let turn_id = Uuid::now_v7().to_string();
        let trace = self.take_input_trace(input.cause.as_ref());
        self.spawn_turn(
            turn_id,
            TurnPlan::Fresh {
                input_event: input.event_id,
                cause: input.cause,
            },
            trace,
        );
    }

    /// After a restore: resume a turn the journal holds in flight (parked at a gate, or
    /// between steps), or start the turn of an accepted input that never got one.
    fn resume_after_restore(&mut self) {
        let Some(open) = self.state.open_turn.clone() else {
            self.start_next_turn();
            return;
        };
        let point = turn::resume_point(
            &open,
            &self.state.open_gates,
            &self.agent,
            self.clock.now_ms(),
        );
        self.spawn_turn(
            open.turn_id.clone(),
            TurnPlan::Resume {
                steps: open.steps,
                point,
            },
            None,
        );
    }
}
