//! The store handle. Owns input validation at the edge, settlement from evidence, payload
//! verification on read and the public journal page; delegates every durable read and write to
//! the backend chosen at open. Cheap to clone; all clones share one backend.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::broadcast;

use crate::backend::Admission;
use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::evidence::{EvidenceReader, EvidenceRouter, FixedEvidenceRouter};
use crate::ids::*;
use crate::journal::*;
use crate::limits::*;
use crate::machine;
use crate::model::*;
use crate::ops;
use crate::options::StoreOptions;
use crate::postgres::{PgEngine, WriteKey, pg_op};
use crate::sqlite::SqliteEngine;
use crate::stats::{Counters, StoreStats};

/// Which backend a store runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BackendKind {
    Sqlite,
    Postgres,
}

enum Engine {
    Sqlite(SqliteEngine),
    Postgres(PgEngine),
}

/// Runs one operation in a write transaction of whichever engine is open. `$body` is an
/// expression over `$tx` (a `&mut` transaction) and `$now` (the store's time) that evaluates
/// to an operation future. `$key` names the rows the operation locks (PostgreSQL groups writes
/// by it). Every variable `$body` uses that is not `Copy` must be listed in `[...]`: the
/// operation owns them, and on PostgreSQL it may run more than once (a group rolled back, a
/// transaction re-run), each run on clones of its own. With `announce = f`, a committed result
/// `f` picks an admission from is announced before the call returns.
macro_rules! write_op {
    ($store:expr, $key:expr, [$($cap:ident),* $(,)?], |$tx:ident, $now:ident| $body:expr) => {
        write_op!($store, $key, [$($cap),*], |$tx, $now| $body, announce = |_| None)
    };
    ($store:expr, $key:expr, [$($cap:ident),* $(,)?], |$tx:ident, $now:ident| $body:expr,
     announce = $announce:expr) => {{
        match &$store.inner.engine {
            Engine::Sqlite(e) => {
                let result = e
                    .write(move |$tx, $now| futures::executor::block_on($body))
                    .await;
                if let Ok(v) = &result
                    && let Some(a) = ($announce)(v)
                {
                    e.announce(a);
                }
                result
            }
            Engine::Postgres(e) => {
                let key = $key;
                let op = pg_op(move |$tx, $now| {
                    $(let $cap = $cap.clone();)*
                    Box::pin(async move { $body.await })
                });
                e.write(key, op, $announce).await
            }
        }
    }};
}

/// Runs one read-only operation.
macro_rules! read_op {
    ($store:expr, |$tx:ident| $body:expr) => {{
        match &$store.inner.engine {
            Engine::Sqlite(e) => e.read(move |$tx| futures::executor::block_on($body)).await,
            Engine::Postgres(e) => {
                let mut guard = e.begin_read().await?;
                let $tx = &mut guard;
                $body.await
            }
        }
    }};
}

struct Inner {
    engine: Engine,
    kind: BackendKind,
    counters: Arc<Counters>,
    router: RwLock<Arc<dyn EvidenceRouter>>,
    referenced_body_cap: u64,
}

/// A handle on an open session store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.inner.kind)
            .finish()
    }
}

/// The store's own journal, read as evidence.
struct OwnJournalEvidence {
    inner: std::sync::Weak<Inner>,
}

#[async_trait::async_trait]
impl EvidenceReader for OwnJournalEvidence {
    async fn dispositions(
        &self,
        tenant: &TenantId,
        runtime_session: RuntimeSessionId,
        runtime_command: RuntimeCommandId,
    ) -> StoreResult<Vec<DispositionFrame>> {
        let inner = self
            .inner
            .upgrade()
            .ok_or_else(|| StoreError::unavailable("the store is closed"))?;
        let store = Store { inner };
        let t = tenant.clone();
        let records = read_op!(store, |tx| ops::journal_dispositions(
            tx,
            &t,
            runtime_session,
            runtime_command
        ))?;
        Ok(records
            .iter()
            .filter_map(JournalRecord::disposition_frame)
            .collect())
    }

    fn is_own_journal(&self) -> bool {
        true
    }
}

impl Store {
    /// Opens (and migrates) the store named by `options.url`.
    pub async fn open(options: StoreOptions) -> StoreResult<Store> {
        options.validate()?;
        let counters = Arc::new(Counters::default());
        let (engine, kind) = match crate::location::StoreLocation::parse(&options.url)? {
            crate::location::StoreLocation::Postgres(_) => (
                Engine::Postgres(PgEngine::open(&options, counters.clone()).await?),
                BackendKind::Postgres,
            ),
            crate::location::StoreLocation::Sqlite(_) => (
                Engine::Sqlite(SqliteEngine::open(&options, counters.clone()).await?),
                BackendKind::Sqlite,
            ),
        };
        let bindings = options.local_storage_bindings.clone();
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| {
            let reader: Arc<dyn EvidenceReader> = Arc::new(OwnJournalEvidence {
                inner: weak.clone(),
            });
            Inner {
                engine,
                kind,
                counters,
                router: RwLock::new(Arc::new(FixedEvidenceRouter::new(bindings, reader))),
                referenced_body_cap: options.referenced_body_cap,
            }
        });
        Ok(Store { inner })
    }

    /// Opens a SQLite store at `path` with default options.
    pub async fn open_sqlite(path: impl AsRef<std::path::Path>) -> StoreResult<Store> {
        Store::open(StoreOptions::new(format!(
            "sqlite://{}",
            path.as_ref().display()
        )))
        .await
    }

    /// Which backend this store runs on.
    pub fn backend(&self) -> BackendKind {
        self.inner.kind
    }

    /// What this store has sent its database since it was opened (statements per write, round
    /// trips, commits).
    pub fn stats(&self) -> StoreStats {
        self.inner.counters.snapshot()
    }

    /// A reader of this store's own journal, for use in a custom router.
    pub fn own_evidence_reader(&self) -> Arc<dyn EvidenceReader> {
        Arc::new(OwnJournalEvidence {
            inner: Arc::downgrade(&self.inner),
        })
    }

    /// Replaces the evidence router settlement reads through.
    pub fn set_evidence_router(&self, router: Arc<dyn EvidenceRouter>) {
        match self.inner.router.write() {
            Ok(mut guard) => *guard = router,
            Err(poisoned) => *poisoned.into_inner() = router,
        }
    }

    fn router(&self) -> Arc<dyn EvidenceRouter> {
        match self.inner.router.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Analyses the tables (of at least 10 pages) never analysed or changed by more than 50
    /// rows and a tenth since the database last analysed them, as the store also does on its
    /// own at open and every `pg_statistics_interval`; returns their names. SQLite plans these
    /// lookups by index shape alone: nothing to do there.
    pub async fn refresh_statistics(&self) -> StoreResult<Vec<String>> {
        match &self.inner.engine {
            Engine::Sqlite(_) => Ok(Vec::new()),
            Engine::Postgres(e) => e.refresh_statistics().await,
        }
    }

    /// Closes the store; every later call fails `unavailable`.
    /// The largest referenced (payload object) body this store accepts.
    pub fn referenced_body_cap(&self) -> u64 {
        self.inner.referenced_body_cap
    }

    pub async fn close(&self) {
        match &self.inner.engine {
            Engine::Sqlite(e) => e.close().await,
            Engine::Postgres(e) => e.close().await,
        }
    }

    /// Command admissions, as wake-up hints. Lagging receivers miss hints, never commands.
    pub fn admissions(&self) -> broadcast::Receiver<Admission> {
        match &self.inner.engine {
            Engine::Sqlite(e) => e.admissions(),
            Engine::Postgres(e) => e.admissions(),
        }
    }

    /// The store's clock (database time on PostgreSQL).
    pub async fn now_ms(&self) -> StoreResult<Millis> {
        match &self.inner.engine {
            Engine::Sqlite(e) => Ok(e.now_ms()),
            Engine::Postgres(e) => e.now_ms().await,
        }
    }

    // ---- sessions -------------------------------------------------------------------------

    /// Puts a session in the catalog with its immutable binding. Idempotent for the same
    /// content; a different agent, compatibility id or binding is `command_mismatch` naming
    /// the field.
    pub async fn create_session(&self, s: NewSession) -> StoreResult<SessionRecord> {
        if s.binding.binding_version == 0 {
            return Err(StoreError::invalid("binding_version", "must be >= 1"));
        }
        write_op!(
            self,
            WriteKey::session(&s.tenant, &s.session),
            [s],
            |tx, now| ops::create_session(tx, &s, now)
        )
    }

    /// Reads a catalog row.
    pub async fn session(&self, t: &TenantId, s: &SessionId) -> StoreResult<SessionRecord> {
        let (t, s) = (t.clone(), s.clone());
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.session(&t, &s)
                .await?
                .ok_or_else(|| StoreError::not_found("session", format!("{t}/{s}")))
        })
    }

    /// Lists a tenant's sessions in id order, after `after`.
    pub async fn list_sessions(
        &self,
        t: &TenantId,
        after: Option<&SessionId>,
        limit: usize,
    ) -> StoreResult<Vec<SessionRecord>> {
        let (t, after) = (t.clone(), after.cloned());
        let limit = limit.clamp(1, MAX_PAGE);
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.list_sessions(&t, after.as_ref(), limit).await
        })
    }

    /// The fencing write to a session's gate mark (made at attach before launching the runtime).
    pub async fn fence_gate_mark(
        &self,
        t: &TenantId,
        s: &SessionId,
        epoch: ResidencyEpoch,
    ) -> StoreResult<ResidencyEpoch> {
        check_epoch("epoch", epoch.0)?;
        let (t, s) = (t.clone(), s.clone());
        write_op!(self, WriteKey::session(&t, &s), [t, s], |tx, _now| {
            ops::fence_gate_mark(tx, &t, &s, epoch)
        })
    }

    /// Writes the Host-owned projection, fenced by the gate mark.
    pub async fn update_projection(
        &self,
        t: &TenantId,
        s: &SessionId,
        epoch: ResidencyEpoch,
        projection: SessionProjection,
    ) -> StoreResult<SessionRecord> {
        check_epoch("epoch", epoch.0)?;
        let (t, s) = (t.clone(), s.clone());
        write_op!(
            self,
            WriteKey::session(&t, &s),
            [t, s, projection],
            |tx, now| ops::update_projection(tx, &t, &s, epoch, &projection, now)
        )
    }

    // ---- residency ------------------------------------------------------------------------

    /// Acquires the session's residency lease: a new, strictly higher epoch unless the same
    /// holder already holds it live. Held live elsewhere → `claim_held` with that epoch.
    pub async fn acquire_residency(&self, req: ResidencyRequest) -> StoreResult<ResidencyGrant> {
        check_holder(&req.holder)?;
        check_epoch("host_generation", req.host_generation)?;
        ttl_ms("residency_ttl", req.ttl, MAX_LEASE_TTL)?;
        write_op!(
            self,
            WriteKey::session(&req.tenant, &req.session),
            [req],
            |tx, now| ops::acquire_residency(tx, &req, now)
        )
    }

    /// Renews a live residency lease.
    pub async fn renew_residency(
        &self,
        grant: &ResidencyGrant,
        ttl: Duration,
    ) -> StoreResult<ResidencyGrant> {
        let ttl = ttl_ms("residency_ttl", ttl, MAX_LEASE_TTL)?;
        let grant = grant.clone();
        write_op!(
            self,
            WriteKey::session(&grant.tenant, &grant.session),
            [grant],
            |tx, now| ops::renew_residency(tx, &grant, ttl, now)
        )
    }

    /// Releases a residency lease (the row and its epoch stay).
    pub async fn release_residency(&self, grant: &ResidencyGrant) -> StoreResult<()> {
        let grant = grant.clone();
        write_op!(
            self,
            WriteKey::session(&grant.tenant, &grant.session),
            [grant],
            |tx, _now| ops::release_residency(tx, &grant)
        )
    }

    /// Reads a residency lease row.
    pub async fn residency(
        &self,
        t: &TenantId,
        s: &SessionId,
    ) -> StoreResult<Option<ResidencyLease>> {
        let (t, s) = (t.clone(), s.clone());
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.lease(&t, &s).await
        })
    }

    // ---- registry -------------------------------------------------------------------------

    /// Publishes a session's registration, fenced by its lease epoch.
    pub async fn put_registration(&self, u: RegistrationUpdate) -> StoreResult<HostRegistration> {
        check_epoch("lease_epoch", u.lease_epoch.0)?;
        check_epoch("host_generation", u.host_generation)?;
        check_endpoint(&u.endpoint)?;
        let ttl = ttl_ms("registration_ttl", u.ttl, MAX_REGISTRATION_TTL)?;
        write_op!(
            self,
            WriteKey::session(&u.tenant, &u.session),
            [u],
            |tx, now| ops::put_registration(tx, &u, ttl, now)
        )
    }

    /// Tombstones a registration: residency `released`, not accepting, epoch kept.
    pub async fn tombstone_registration(
        &self,
        t: &TenantId,
        s: &SessionId,
        epoch: ResidencyEpoch,
    ) -> StoreResult<HostRegistration> {
        check_epoch("lease_epoch", epoch.0)?;
        let (t, s) = (t.clone(), s.clone());
        write_op!(self, WriteKey::session(&t, &s), [t, s], |tx, now| {
            ops::tombstone_registration(tx, &t, &s, epoch, now)
        })
    }

    /// Reads a session's registration.
    pub async fn registration(
        &self,
        t: &TenantId,
        s: &SessionId,
    ) -> StoreResult<Option<HostRegistration>> {
        let (t, s) = (t.clone(), s.clone());
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.registration(&t, &s).await
        })
    }

    /// Publishes (or heartbeats) a Host's advertisement; a lower generation is refused.
    pub async fn advertise(&self, a: HostAdvertisement) -> StoreResult<HostTarget> {
        check_epoch("generation", a.generation)?;
        check_endpoint(&a.endpoint)?;
        check_short_text("isolation_class", &a.isolation_class)?;
        let ttl = ttl_ms("advertisement_ttl", a.ttl, MAX_REGISTRATION_TTL)?;
        write_op!(
            self,
            WriteKey::host(&a.host),
            [a],
            |tx, now| ops::advertise(tx, &a, ttl, now)
        )
    }

    /// Reads a Host's advertisement.
    pub async fn target(&self, host: &HostId) -> StoreResult<Option<HostTarget>> {
        let host = host.clone();
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.target(&host).await
        })
    }

    /// Lists advertisements (only unexpired ones, by the store's clock, when `live_only`).
    pub async fn targets(&self, live_only: bool) -> StoreResult<Vec<HostTarget>> {
        let now = self.now_ms().await?;
        read_op!(self, |tx| async move {
            use ops::Tx as _;
            let all = tx.targets().await?;
            Ok(all
                .into_iter()
                .filter(|t| !live_only || t.is_live(now))
                .collect::<Vec<_>>())
        })
    }

    // ---- commands -------------------------------------------------------------------------

    /// Admits a command into the session's inbox. Idempotent by command id: a retry with the
    /// same kind, digest and size returns the existing record; otherwise `command_mismatch`.
    pub async fn admit(&self, c: NewCommand) -> StoreResult<CommandRecord> {
        self.admit_reporting(c).await.map(|(r, _)| r)
    }

    /// As [`Store::admit`], also saying whether this call created the record.
    ///
    /// The admission is a `command.admit` span in the caller's trace (`c.trace`, else the
    /// current span's), when the process records spans; the command then carries the
    /// admission span's own context, so whichever Host applies it continues under it.
    pub async fn admit_reporting(&self, mut c: NewCommand) -> StoreResult<(CommandRecord, bool)> {
        use tracing::Instrument as _;
        let span = tracing::info_span!(
            "command.admit",
            tenant = %c.tenant,
            session = %c.session,
            command = %c.command,
            kind = %c.kind,
            created = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        trace_context::span::continue_if(&span, c.trace.as_ref());
        c.trace = trace_context::span::for_callee(&span, c.trace.as_ref());
        let result = async {
            self.check_new_command(&c)?;
            let runtime_command = RuntimeCommandId::mint();
            write_op!(
                self,
                WriteKey::session(&c.tenant, &c.session),
                [c],
                |tx, now| ops::admit(tx, &c, runtime_command, now),
                announce = admission_of
            )
        }
        .instrument(span.clone())
        .await;
        match &result {
            Ok((_, created)) => {
                span.record("created", *created);
            }
            Err(e) => {
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_description", e.code().as_str());
            }
        }
        result
    }

    fn check_new_command(&self, c: &NewCommand) -> StoreResult<()> {
        match &c.body {
            CommandBody::Inline(bytes) => {
                if bytes.len() > MAX_INLINE_BODY_BYTES {
                    return Err(StoreError::invalid(
                        "body",
                        format!(
                            "is {} bytes; bodies over {MAX_INLINE_BODY_BYTES} bytes must be stored as a payload object",
                            bytes.len()
                        ),
                    ));
                }
            }
            CommandBody::Object(r) => {
                check_sha256_hex("body.sha256", &r.sha256)?;
                if r.size > self.inner.referenced_body_cap {
                    return Err(StoreError::invalid(
                        "body.size",
                        format!(
                            "is {} bytes; at most {} allowed",
                            r.size, self.inner.referenced_body_cap
                        ),
                    ));
                }
            }
        }
        if let Some(p) = &c.principal {
            check_short_text("principal", p)?;
        }
        if let Some(m) = &c.metadata {
            if m.len() > MAX_METADATA_BYTES {
                return Err(StoreError::invalid(
                    "metadata",
                    format!("is {} bytes; at most {MAX_METADATA_BYTES} allowed", m.len()),
                ));
            }
            let parsed: Result<serde_json::Value, _> = serde_json::from_str(m);
            if !matches!(parsed, Ok(serde_json::Value::Object(_))) {
                return Err(StoreError::invalid("metadata", "must be a JSON object"));
            }
        }
        if c.apply_within.is_zero() || c.apply_within > Duration::from_secs(30 * 24 * 3600) {
            return Err(StoreError::invalid(
                "apply_within",
                "must be positive and at most 30 days",
            ));
        }
        Ok(())
    }

    /// Reads one command.
    pub async fn command(
        &self,
        t: &TenantId,
        s: &SessionId,
        c: &CommandId,
    ) -> StoreResult<CommandRecord> {
        let (t, s, c) = (t.clone(), s.clone(), c.clone());
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.command(&t, &s, &c)
                .await?
                .ok_or_else(|| StoreError::not_found("command", format!("{t}/{s}/{c}")))
        })
    }

    /// Finds the command a runtime command id belongs to (to map private ids to public ones).
    pub async fn command_by_runtime_id(
        &self,
        t: &TenantId,
        s: &SessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<Option<CommandRecord>> {
        let (t, s) = (t.clone(), s.clone());
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.command_by_runtime_id(&t, &s, rc).await
        })
    }

    /// Lists commands in acceptance order strictly after `after_order`.
    pub async fn list_commands(
        &self,
        t: &TenantId,
        s: &SessionId,
        after_order: u64,
        limit: usize,
    ) -> StoreResult<Vec<CommandRecord>> {
        let (t, s) = (t.clone(), s.clone());
        let limit = limit.clamp(1, MAX_PAGE);
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.commands_after(&t, &s, after_order, limit).await
        })
    }

    /// A session's newest commands, newest first (at most `limit`, clamped to a page).
    pub async fn newest_commands(
        &self,
        t: &TenantId,
        s: &SessionId,
        limit: usize,
    ) -> StoreResult<Vec<CommandRecord>> {
        let (t, s) = (t.clone(), s.clone());
        let limit = limit.clamp(1, MAX_PAGE);
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.commands_newest(&t, &s, limit).await
        })
    }

    /// Claims a command under a residency grant.
    pub async fn claim(&self, req: ClaimRequest) -> StoreResult<CommandRecord> {
        check_epoch("epoch", req.epoch.0)?;
        ttl_ms("claim_ttl", req.ttl, MAX_CLAIM_TTL)?;
        write_op!(
            self,
            WriteKey::session(&req.tenant, &req.session),
            [req],
            |tx, now| ops::claim(tx, &req, now)
        )
    }

    /// Rejects a command before any attempt exists.
    pub async fn reject(&self, req: RejectRequest) -> StoreResult<CommandRecord> {
        check_epoch("epoch", req.epoch.0)?;
        write_op!(
            self,
            WriteKey::session(&req.tenant, &req.session),
            [req],
            |tx, now| ops::reject(tx, &req, now)
        )
    }

    /// Records the command's one attempt. The Host must not dispatch before this succeeds.
    pub async fn begin_attempt(&self, req: AttemptRequest) -> StoreResult<CommandRecord> {
        check_epoch("epoch", req.epoch.0)?;
        write_op!(
            self,
            WriteKey::session(&req.tenant, &req.session),
            [req],
            |tx, now| ops::begin_attempt(tx, &req, now)
        )
    }

    /// Settles an applying command from the runtime's own disposition, read through the
    /// evidence router for the session's (tenant, storage binding). The caller supplies no
    /// outcome. Missing evidence is an error (`evidence`), an unrouted binding another
    /// (`unroutable`); neither writes anything.
    pub async fn settle(&self, req: SettleRequest) -> StoreResult<CommandRecord> {
        check_epoch("epoch", req.epoch.0)?;
        // One write transaction reads the session, routes its binding and, when the evidence
        // is in this store's own journal, settles.
        let router = self.router();
        let settling = req.clone();
        let (session, reader) = match write_op!(
            self,
            WriteKey::session(&req.tenant, &req.session),
            [settling, router],
            |tx, now| ops::settle(tx, &settling, &*router, now)
        )? {
            ops::Settlement::Settled(rec) => return Ok(*rec),
            ops::Settlement::Elsewhere { session, reader } => (session, reader),
        };
        let rec = self
            .command(&req.tenant, &req.session, &req.command)
            .await?;
        machine::require_attempt(&rec)?;
        let frames = reader
            .dispositions(
                &req.tenant,
                session.binding.runtime_session_id,
                rec.runtime_command,
            )
            .await?;
        let frame = ops::single_frame(&frames, &rec)?;
        write_op!(
            self,
            WriteKey::session(&req.tenant, &req.session),
            [req, frame],
            |tx, now| ops::write_settlement(tx, &req, &frame, now)
        )
    }

    // ---- cursor ---------------------------------------------------------------------------

    /// Reads the consumption cursor.
    pub async fn cursor(&self, t: &TenantId, s: &SessionId) -> StoreResult<Option<Cursor>> {
        let (t, s) = (t.clone(), s.clone());
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.cursor(&t, &s).await
        })
    }

    /// Saves the cursor, fenced (lower epoch refused; lower order a regression).
    pub async fn save_cursor(
        &self,
        t: &TenantId,
        s: &SessionId,
        order: u64,
        epoch: ResidencyEpoch,
    ) -> StoreResult<Cursor> {
        check_epoch("epoch", epoch.0)?;
        let (t, s) = (t.clone(), s.clone());
        write_op!(self, WriteKey::session(&t, &s), [t, s], |tx, _now| {
            ops::save_cursor(tx, &t, &s, order, epoch)
        })
    }

    // ---- gates ----------------------------------------------------------------------------

    /// Projects a gate as open, fenced by the gate mark; at most 16 open per session. A gate
    /// already projected (open or resolved) is returned as it is, never re-opened.
    pub async fn open_gate(
        &self,
        t: &TenantId,
        s: &SessionId,
        epoch: ResidencyEpoch,
        gate: OpenGate,
    ) -> StoreResult<GateRecord> {
        check_epoch("epoch", epoch.0)?;
        check_epoch("opened_seq", gate.opened_seq)?;
        check_short_text("kind", &gate.kind)?;
        check_short_text("prompt_summary", &gate.prompt_summary)?;
        if gate.kind.is_empty() {
            return Err(StoreError::invalid("kind", "must not be empty"));
        }
        let (t, s) = (t.clone(), s.clone());
        write_op!(self, WriteKey::session(&t, &s), [t, s, gate], |tx, now| {
            ops::open_gate(tx, &t, &s, epoch, &gate, now)
        })
    }

    /// Marks a projected gate resolved, fenced by the gate mark.
    pub async fn resolve_gate(
        &self,
        t: &TenantId,
        s: &SessionId,
        epoch: ResidencyEpoch,
        gate: &GateId,
        resolved_seq: u64,
    ) -> StoreResult<GateRecord> {
        check_epoch("epoch", epoch.0)?;
        check_epoch("resolved_seq", resolved_seq)?;
        let (t, s, g) = (t.clone(), s.clone(), gate.clone());
        write_op!(self, WriteKey::session(&t, &s), [t, s, g], |tx, now| {
            ops::resolve_gate(tx, &t, &s, epoch, &g, resolved_seq, now)
        })
    }

    /// Lists a session's projected gates (open only, or all), oldest first.
    pub async fn gates(
        &self,
        t: &TenantId,
        s: &SessionId,
        open_only: bool,
    ) -> StoreResult<Vec<GateRecord>> {
        let (t, s) = (t.clone(), s.clone());
        read_op!(self, |tx| async {
            use ops::Tx as _;
            tx.gates(&t, &s, open_only).await
        })
    }

    /// A page of the open gates of `tenants`, oldest first, after the gate `after` (a gate of
    /// one of them; otherwise `not_found`), at most `limit` (1 to [`MAX_PAGE`]), with the
    /// cursor of the next page when more follow.
    pub async fn open_gates_page(
        &self,
        tenants: &[TenantId],
        after: Option<&crate::GateCursor>,
        limit: usize,
    ) -> StoreResult<crate::OpenGatesPage> {
        let (tenants, after) = (tenants.to_vec(), after.cloned());
        let limit = limit.clamp(1, MAX_PAGE) as u64;
        read_op!(self, |tx| crate::open_gates::page(
            tx,
            &tenants,
            after.as_ref(),
            limit
        ))
    }

    // ---- payload objects ------------------------------------------------------------------

    /// Stores a payload object and returns its reference (id, size, SHA-256).
    pub async fn put_object(&self, o: NewObject) -> StoreResult<ObjectRef> {
        if o.bytes.len() as u64 > self.inner.referenced_body_cap {
            return Err(StoreError::invalid(
                "bytes",
                format!(
                    "is {} bytes; at most {} allowed",
                    o.bytes.len(),
                    self.inner.referenced_body_cap
                ),
            ));
        }
        check_short_text("kind", &o.kind)?;
        check_short_text("media_type", &o.media_type)?;
        let sha = sha256_hex(&o.bytes);
        let id = ObjectId::new(format!("obj-{}", uuid::Uuid::now_v7().simple()))?;
        write_op!(
            self,
            WriteKey::session(&o.tenant, &o.session),
            [id, o, sha],
            |tx, now| ops::put_object(tx, id, o, sha, now)
        )
    }

    /// Reads a payload object and verifies it against `expected` (size and SHA-256) and
    /// against its own stored digest; a mismatch is `integrity`.
    pub async fn get_object(
        &self,
        t: &TenantId,
        expected: &ObjectRef,
    ) -> StoreResult<StoredObject> {
        check_sha256_hex("sha256", &expected.sha256)?;
        let (t, id) = (t.clone(), expected.object_id.clone());
        let obj = read_op!(self, |tx| ops::get_object(tx, &t, &id))?;
        verify_object(&obj, expected)?;
        Ok(obj)
    }

    // ---- journal --------------------------------------------------------------------------

    /// Acquires the journal lease for a runtime session: a strictly higher epoch, with an
    /// opening fence appended at the tip, which permanently fails any previous writer's next
    /// append. Taking over a live lease is allowed: the caller's authority comes from the
    /// residency grant it launched under.
    pub async fn journal_acquire(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
        holder: &str,
        ttl: Duration,
    ) -> StoreResult<JournalLease> {
        check_holder(holder)?;
        let ttl = ttl_ms("journal_lease_ttl", ttl, MAX_LEASE_TTL)?;
        let (t, holder) = (t.clone(), holder.to_owned());
        write_op!(self, WriteKey::journal(rs), [t, holder], |tx, now| {
            ops::journal_acquire(tx, &t, rs, &holder, ttl, now)
        })
    }

    /// Renews a journal lease this writer still holds.
    pub async fn journal_renew(
        &self,
        lease: &JournalLease,
        ttl: Duration,
    ) -> StoreResult<JournalLease> {
        let ttl = ttl_ms("journal_lease_ttl", ttl, MAX_LEASE_TTL)?;
        let lease = lease.clone();
        write_op!(
            self,
            WriteKey::journal(lease.runtime_session),
            [lease],
            |tx, now| ops::journal_renew(tx, &lease, ttl, now)
        )
    }

    /// Releases a journal lease (a superseded lease is already not held: Ok).
    pub async fn journal_release(&self, lease: &JournalLease) -> StoreResult<()> {
        let lease = lease.clone();
        write_op!(
            self,
            WriteKey::journal(lease.runtime_session),
            [lease],
            |tx, _now| ops::journal_release(tx, &lease)
        )
    }

    /// Appends entries as one compare-and-set on `lease.tip`, fenced by `lease.epoch`. Returns
    /// the new tip (the caller tracks it into its lease). Applications need the writer's own
    /// epoch as the attempt epoch; a closure needs a strictly later epoch than the attempt's
    /// and is refused when the journal holds any effect caused by that command; at most one
    /// application or closure per command.
    pub async fn journal_append(
        &self,
        lease: &JournalLease,
        entries: Vec<JournalEntry>,
    ) -> StoreResult<u64> {
        if entries.is_empty() {
            return Err(StoreError::invalid("entries", "must not be empty"));
        }
        if entries.len() > MAX_APPEND_RECORDS {
            return Err(StoreError::invalid(
                "entries",
                format!("at most {MAX_APPEND_RECORDS} per append"),
            ));
        }
        let cap = self.inner.referenced_body_cap as usize;
        for e in &entries {
            e.check()?;
            if let JournalEntry::Event {
                public_body,
                private_body,
                ..
            } = e
                && (public_body.len() > cap || private_body.as_ref().is_some_and(|p| p.len() > cap))
            {
                return Err(StoreError::invalid(
                    "body",
                    format!("event bodies are at most {cap} bytes"),
                ));
            }
        }
        let lease = lease.clone();
        // Shared, not copied, by every run of the operation.
        let entries = Arc::new(entries);
        write_op!(
            self,
            WriteKey::journal(lease.runtime_session),
            [lease, entries],
            |tx, now| ops::journal_append(tx, &lease, &entries, now)
        )
    }

    /// Reads the journal lease row of a runtime session (absent for another tenant).
    pub async fn journal_lease_state(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
    ) -> StoreResult<Option<JournalLeaseState>> {
        let t = t.clone();
        read_op!(self, |tx| ops::journal_lease_state(tx, &t, rs))
    }

    /// The journal tip (0 when the journal does not exist).
    pub async fn journal_tip(&self, t: &TenantId, rs: RuntimeSessionId) -> StoreResult<u64> {
        Ok(self.journal_lease_state(t, rs).await?.map_or(0, |l| l.tip))
    }

    /// A privileged runtime page: every record kind, strictly after `after`.
    pub async fn journal_runtime_page(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
        after: u64,
        limit: usize,
    ) -> StoreResult<Vec<JournalRecord>> {
        let t = t.clone();
        let limit = limit.clamp(1, MAX_PAGE);
        read_op!(self, |tx| ops::journal_read(
            tx,
            &t,
            rs,
            after,
            u64::MAX,
            limit,
            false
        ))
    }

    /// The public offset at sequence `through`: how many public events the journal holds up to
    /// and including it (0 for a journal another tenant owns, or none).
    pub async fn journal_public_offset(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
        through: u64,
    ) -> StoreResult<u64> {
        let t = t.clone();
        read_op!(self, |tx| ops::journal_public_offset(tx, &t, rs, through))
    }

    /// Public events by public offset: those after offset `after`, in order, at most `limit`
    /// (clamped to the page bound; 0 reads only the top), and the public top at the read. An
    /// undecodable record fails the whole page.
    pub async fn journal_by_offset(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
        after: u64,
        limit: usize,
    ) -> StoreResult<OffsetPage> {
        let t = t.clone();
        let limit = limit.min(MAX_PAGE);
        read_op!(self, |tx| ops::journal_by_offset(tx, &t, rs, after, limit))
    }

    /// A public page: public event bodies only. The first page (`pinned_tip = None`) pins the
    /// tip; pass the returned `tip` back to read later pages of the same snapshot. An
    /// undecodable record fails the whole page.
    pub async fn journal_public_page(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
        after: u64,
        pinned_tip: Option<u64>,
        limit: usize,
    ) -> StoreResult<PublicPage> {
        let tip = match pinned_tip {
            Some(tip) => tip,
            None => self.journal_tip(t, rs).await?,
        };
        let limit = limit.clamp(1, MAX_PAGE);
        if after >= tip {
            return Ok(PublicPage {
                events: Vec::new(),
                tip,
                next_after: tip.max(after),
            });
        }
        let t = t.clone();
        let records = read_op!(self, |tx| ops::journal_read(
            tx, &t, rs, after, tip, limit, true
        ))?;
        let mut events = Vec::with_capacity(records.len());
        for r in records {
            match r.kind {
                RecordKind::Event {
                    event, public_body, ..
                } => events.push(PublicEvent {
                    seq: r.seq,
                    event,
                    body: public_body,
                }),
                _ => {
                    return Err(StoreError::integrity(
                        "journal",
                        format!("record {} is not a public event", r.seq),
                    ));
                }
            }
        }
        let next_after = match events.last() {
            Some(last) if events.len() == limit => last.seq,
            _ => tip,
        };
        Ok(PublicPage {
            events,
            tip,
            next_after,
        })
    }
}

#[cfg(feature = "testing")]
impl Store {
    /// Runs raw SQL (one or more statements) on the store's database outside any operation,
    /// for test set-ups (test support).
    pub async fn raw_sql_for_tests(&self, sql: &str) -> StoreResult<()> {
        let sql = sql.to_owned();
        match &self.inner.engine {
            Engine::Sqlite(e) => {
                e.write(move |tx, _now| {
                    tx.conn
                        .connection()
                        .execute_batch(&sql)
                        .map_err(crate::sqlite::map_err)
                })
                .await
            }
            Engine::Postgres(e) => {
                let mut conn = e.raw_connection().await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut *conn)
                    .await
                    .map_err(crate::postgres::map_err)?;
                Ok(())
            }
        }
    }

    /// SQLite's page-cache bound in KiB on the writer connection and on a reader connection
    /// (`PRAGMA cache_size`, negative meaning KiB); `None` on PostgreSQL (test support).
    pub async fn sqlite_cache_kib_for_tests(&self) -> StoreResult<Option<(i64, i64)>> {
        let Engine::Sqlite(e) = &self.inner.engine else {
            return Ok(None);
        };
        let cache = |c: &rusqlite::Connection| {
            c.query_row("PRAGMA cache_size", [], |r| r.get::<_, i64>(0))
                .map(|v| -v)
                .map_err(crate::sqlite::map_err)
        };
        let writer = e.write(move |tx, _now| cache(tx.conn.connection())).await?;
        let reader = e.read(move |tx| cache(tx.conn.connection())).await?;
        Ok(Some((writer, reader)))
    }

    /// The plans of the hot path's lookups of `rec`, a command of `session`, as the database
    /// plans them now, each checked to find its rows by the command's ids (test support).
    pub async fn lookup_plans(
        &self,
        session: &SessionRecord,
        rec: &CommandRecord,
    ) -> StoreResult<Vec<crate::plans::LookupPlan>> {
        let now = self.now_ms().await?;
        match &self.inner.engine {
            Engine::Sqlite(e) => {
                let targets =
                    crate::plans::targets(crate::sql::Dialect::Sqlite, session, rec, now)?;
                e.read(move |tx| crate::plans::sqlite(tx.conn.connection(), targets))
                    .await
            }
            Engine::Postgres(e) => {
                let targets =
                    crate::plans::targets(crate::sql::Dialect::Postgres, session, rec, now)?;
                let mut conn = e.raw_connection().await?;
                crate::plans::postgres(&mut conn, targets).await
            }
        }
    }
}

/// The admission a committed `admit` announces: only one that created the record.
fn admission_of(result: &(CommandRecord, bool)) -> Option<Admission> {
    let (record, created) = result;
    created.then(|| Admission {
        tenant: record.tenant.clone(),
        session: record.session.clone(),
        command: record.command.clone(),
    })
}

pub(crate) fn verify_object(obj: &StoredObject, expected: &ObjectRef) -> StoreResult<()> {
    if obj.reference.object_id != expected.object_id {
        return Err(StoreError::integrity("payload_object", "id differs"));
    }
    if obj.bytes.len() as u64 != expected.size || obj.reference.size != expected.size {
        return Err(StoreError::integrity(
            "payload_object",
            format!(
                "size is {} bytes, the reference says {}",
                obj.bytes.len(),
                expected.size
            ),
        ));
    }
    let actual = sha256_hex(&obj.bytes);
    if actual != expected.sha256 || obj.reference.sha256 != expected.sha256 {
        return Err(StoreError::integrity(
            "payload_object",
            "SHA-256 of the stored bytes differs from the reference",
        ));
    }
    Ok(())
}

fn check_epoch(field: &'static str, value: u64) -> StoreResult<()> {
    if value == 0 {
        return Err(StoreError::invalid(field, "must be >= 1"));
    }
    if value > i64::MAX as u64 {
        return Err(StoreError::invalid(field, "is too large"));
    }
    Ok(())
}

fn check_holder(holder: &str) -> StoreResult<()> {
    check_opaque_id("holder", holder)
}

fn check_endpoint(endpoint: &str) -> StoreResult<()> {
    if endpoint.is_empty() {
        return Err(StoreError::invalid("endpoint", "must not be empty"));
    }
    check_short_text("endpoint", endpoint)
}

// ---- runnable packages (see `crate::packages`) ----------------------------------------------

impl Store {
    /// Publishes a runnable package. A release is immutable: the same digest again is
    /// [`crate::Publication::Unchanged`], another digest is [`crate::Publication::Conflict`];
    /// neither changes anything.
    pub async fn publish_package(
        &self,
        p: crate::packages::NewPackage,
    ) -> StoreResult<crate::packages::Publication> {
        crate::packages::check_new(&p)?;
        write_op!(
            self,
            WriteKey::package(&p.workspace, &p.name, &p.version),
            [p],
            |tx, now| crate::packages::publish(tx, p, now)
        )
    }

    /// One published release with its bytes (checked against the stored SHA-256).
    pub async fn package(
        &self,
        workspace: &str,
        name: &str,
        version: &str,
    ) -> StoreResult<Option<crate::packages::StoredPackage>> {
        crate::packages::check_identity(workspace, name, version)?;
        let (w, n, v) = (workspace.to_owned(), name.to_owned(), version.to_owned());
        read_op!(self, |tx| crate::packages::get(tx, &w, &n, &v))
    }

    /// One published release's summary (without its bytes).
    pub async fn package_summary(
        &self,
        workspace: &str,
        name: &str,
        version: &str,
    ) -> StoreResult<Option<crate::packages::PackageSummary>> {
        crate::packages::check_identity(workspace, name, version)?;
        let (w, n, v) = (workspace.to_owned(), name.to_owned(), version.to_owned());
        read_op!(self, |tx| crate::packages::summary(tx, &w, &n, &v))
    }

    /// Every published release (without bytes).
    pub async fn packages(&self) -> StoreResult<Vec<crate::packages::PackageSummary>> {
        read_op!(self, |tx| crate::packages::list(tx))
    }
}

// ---- workflow runs (see `crate::runs`) --------------------------------------------------------

impl Store {
    /// Records a run's program (create-only, the exact source) and its first status (running,
    /// epoch 1) in one transaction. A start retried with the same idempotency key returns the
    /// run recorded first, writing nothing; a second create of a run id is `conflict`.
    pub async fn create_run(&self, r: crate::runs::NewRun) -> StoreResult<crate::runs::RunCreated> {
        crate::runs::check_new_run(&r)?;
        let key = match &r.idempotency_key {
            Some(k) => WriteKey::run(&format!("{}\u{0}{k}", r.tenant)),
            None => WriteKey::run(r.run_id.as_str()),
        };
        write_op!(self, key, [r], |tx, now| crate::runs::create(tx, r, now))
    }

    /// One run's status; `tenant` scopes it (another tenant's run reads as absent). `None`
    /// reads any tenant's run (for a Host's own scans, never for a caller's request).
    pub async fn run_status(
        &self,
        tenant: Option<&TenantId>,
        run_id: &RunId,
    ) -> StoreResult<Option<crate::runs::RunStatus>> {
        let (t, r) = (tenant.cloned(), run_id.clone());
        read_op!(self, |tx| crate::runs::status(tx, t.as_ref(), &r))
    }

    /// A tenant's runs, oldest first.
    pub async fn runs(&self, tenant: &TenantId) -> StoreResult<Vec<crate::runs::RunStatus>> {
        let t = tenant.clone();
        read_op!(self, |tx| crate::runs::list(tx, &t))
    }

    /// A page of the runs of `tenants` in `order`, after the run `after` (a run of one of
    /// them; otherwise `not_found`), at most `limit` (1 to [`MAX_PAGE`]), with the cursor of
    /// the next page when more follow.
    pub async fn runs_page(
        &self,
        tenants: &[TenantId],
        after: Option<&crate::RunId>,
        limit: usize,
        order: crate::runs::RunOrder,
    ) -> StoreResult<crate::runs::RunsPage> {
        let (tenants, after) = (tenants.to_vec(), after.cloned());
        let limit = limit.clamp(1, MAX_PAGE) as u64;
        read_op!(self, |tx| crate::runs::page(
            tx,
            &tenants,
            after.as_ref(),
            limit,
            order
        ))
    }

    /// A tenant's [`crate::RunsMark`]: one aggregate read, for a view that follows runs to
    /// tell that they changed without reading them all.
    pub async fn runs_mark(&self, tenant: &TenantId) -> StoreResult<crate::runs::RunsMark> {
        let t = tenant.clone();
        read_op!(self, |tx| crate::runs::mark(tx, &t))
    }

    /// Every tenant's runs in `state`, oldest first, at most `limit` (for reconcile scans).
    pub async fn runs_in_state(
        &self,
        state: crate::runs::RunState,
        limit: usize,
    ) -> StoreResult<Vec<crate::runs::RunStatus>> {
        let limit = limit.min(crate::limits::MAX_PAGE) as u64;
        read_op!(self, |tx| crate::runs::in_state(tx, state, limit))
    }

    /// Running runs a Host may take over at `now` (the store's time), soonest due first, at
    /// most `limit`: whose lease expired (a parked run: whose wake-up time passed) or whose
    /// holder names one of `hosts` (Hosts the registry says died; a booting Host's own id).
    pub async fn runs_to_take(
        &self,
        now: Millis,
        hosts: &[HostId],
        limit: usize,
    ) -> StoreResult<Vec<crate::runs::RunStatus>> {
        let limit = limit.min(crate::limits::MAX_PAGE) as u64;
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        read_op!(self, |tx| crate::runs::to_take(tx, now, &hosts, limit))
    }

    /// Hands a running run back to the store under the driver's fence until `until` comes;
    /// `false` (nothing written) when the ask it would wait for is answered already;
    /// `claim_lost` once the fence is stale.
    pub async fn park_run(
        &self,
        fence: &crate::runs::RunFence,
        until: crate::runs::ParkUntil,
    ) -> StoreResult<bool> {
        crate::runs::check_fence(fence)?;
        let f = fence.clone();
        write_op!(
            self,
            WriteKey::run(f.run_id.as_str()),
            [f, until],
            |tx, now| { crate::runs::park(tx, f, until, now) }
        )
    }

    /// A run's recorded program (checked against its SHA-256).
    pub async fn run_program(
        &self,
        run_id: &RunId,
    ) -> StoreResult<Option<crate::runs::RunProgram>> {
        let r = run_id.clone();
        read_op!(self, |tx| crate::runs::program(tx, &r))
    }

    /// The releases a run is pinned to, by identity. None for a run recorded before pinning
    /// (or whose program invokes nothing).
    pub async fn run_pins(&self, run_id: &RunId) -> StoreResult<Vec<crate::runs::RunPin>> {
        let r = run_id.clone();
        read_op!(self, |tx| crate::runs::pins(tx, &r))
    }

    /// The live runs (`running` or `needs_attention`, every tenant) pinned to a release of
    /// `identity` (`workspace/name@version`), with each one's digest; at most `limit`. What a
    /// prune of recorded releases must leave alone.
    pub async fn live_runs_pinned_to(
        &self,
        identity: &str,
        limit: usize,
    ) -> StoreResult<Vec<(RunId, crate::runs::RunPin)>> {
        let limit = limit.min(crate::limits::MAX_PAGE) as u64;
        let identity = identity.to_owned();
        read_op!(self, |tx| crate::runs::live_pins_of(tx, &identity, limit))
    }

    /// Pins a run recorded before pinning existed, under the driver's fence (`claim_lost`
    /// when it is stale). Create-only: a run that has pins keeps them, and they are returned.
    pub async fn pin_run(
        &self,
        fence: &crate::runs::RunFence,
        pins: Vec<crate::runs::RunPin>,
    ) -> StoreResult<Vec<crate::runs::RunPin>> {
        crate::runs::check_fence(fence)?;
        crate::runs::check_pins(&pins)?;
        let f = fence.clone();
        write_op!(
            self,
            WriteKey::run(f.run_id.as_str()),
            [f, pins],
            |tx, now| { crate::runs::pin(tx, f, pins, now) }
        )
    }

    /// Takes a running run over under epoch + 1 and a new fencing token: `conflict` when its
    /// epoch is not the expected one, `claim_held` when the rule does not allow it yet,
    /// `state` when it is not running.
    pub async fn take_run(&self, t: crate::runs::Takeover) -> StoreResult<crate::runs::RunStatus> {
        crate::runs::check_takeover(&t)?;
        write_op!(self, WriteKey::run(t.run_id.as_str()), [t], |tx, now| {
            crate::runs::take(tx, t, now)
        })
    }

    /// Extends the driver's lease; `claim_lost` once its fence is stale.
    pub async fn renew_run(
        &self,
        fence: &crate::runs::RunFence,
        lease: std::time::Duration,
    ) -> StoreResult<Millis> {
        crate::runs::check_fence(fence)?;
        crate::runs::check_lease(lease)?;
        let f = fence.clone();
        write_op!(self, WriteKey::run(f.run_id.as_str()), [f], |tx, now| {
            crate::runs::renew(tx, f, lease, now)
        })
    }

    /// Ends the driver's lease now (`claim_lost` once its fence is stale): a driver that
    /// stopped cleanly hands its run to the next taker without waiting for the lease.
    pub async fn release_run(&self, fence: &crate::runs::RunFence) -> StoreResult<()> {
        crate::runs::check_fence(fence)?;
        let f = fence.clone();
        write_op!(self, WriteKey::run(f.run_id.as_str()), [f], |tx, now| {
            crate::runs::release(tx, f, now)
        })
    }

    /// Appends a journal entry under the fence: `claim_lost` when the fence is stale,
    /// `conflict` when the step already has that entry (a step has one result).
    pub async fn append_run_step(
        &self,
        fence: &crate::runs::RunFence,
        entry: crate::runs::NewStepEntry,
    ) -> StoreResult<crate::runs::StepEntry> {
        crate::runs::check_fence(fence)?;
        crate::runs::check_entry(&entry)?;
        let f = fence.clone();
        write_op!(
            self,
            WriteKey::run(f.run_id.as_str()),
            [f, entry],
            |tx, now| { crate::runs::append(tx, f, entry, now) }
        )
    }

    /// Arms a checkpoint under the fence, or returns the one armed earlier unchanged.
    pub async fn arm_run_checkpoint(
        &self,
        fence: &crate::runs::RunFence,
        checkpoint: crate::runs::NewCheckpoint,
    ) -> StoreResult<crate::runs::Checkpoint> {
        crate::runs::check_fence(fence)?;
        crate::runs::check_checkpoint(&checkpoint)?;
        let f = fence.clone();
        write_op!(
            self,
            WriteKey::run(f.run_id.as_str()),
            [f, checkpoint],
            |tx, now| { crate::runs::arm(tx, f, checkpoint, now) }
        )
    }

    /// Ends a run (completed or failed) or parks it for an operator, under the fence.
    pub async fn end_run(
        &self,
        fence: &crate::runs::RunFence,
        how: crate::runs::RunEnd,
    ) -> StoreResult<crate::runs::RunStatus> {
        crate::runs::check_fence(fence)?;
        let f = fence.clone();
        write_op!(
            self,
            WriteKey::run(f.run_id.as_str()),
            [f, how],
            |tx, now| { crate::runs::end(tx, f, how, now) }
        )
    }

    /// Cancels a tenant's unfinished run, fencing its driver out.
    pub async fn cancel_run(
        &self,
        tenant: &TenantId,
        run_id: &RunId,
    ) -> StoreResult<crate::runs::RunStatus> {
        let (t, r) = (tenant.clone(), run_id.clone());
        write_op!(self, WriteKey::run(r.as_str()), [t, r], |tx, now| {
            crate::runs::cancel(tx, t, r, now)
        })
    }

    /// Records an answer to an open checkpoint of a tenant's run; the answerer is whoever the
    /// caller authenticated. The only way an answer record is created.
    pub async fn answer_run(
        &self,
        tenant: &TenantId,
        run_id: &RunId,
        checkpoint: &str,
        value: &str,
        answerer: &str,
    ) -> StoreResult<crate::runs::AnswerRecorded> {
        crate::runs::check_answer(checkpoint, value, answerer)?;
        let (t, r) = (tenant.clone(), run_id.clone());
        let (c, v, a) = (checkpoint.to_owned(), value.to_owned(), answerer.to_owned());
        write_op!(
            self,
            WriteKey::run(r.as_str()),
            [t, r, c, v, a],
            |tx, now| { crate::runs::answer(tx, t, r, c, v, a, now) }
        )
    }

    /// A run's step journal, in order.
    pub async fn run_journal(&self, run_id: &RunId) -> StoreResult<Vec<crate::runs::StepEntry>> {
        let r = run_id.clone();
        read_op!(self, |tx| crate::runs::journal(tx, &r))
    }

    /// A run's armed checkpoints.
    pub async fn run_checkpoints(
        &self,
        run_id: &RunId,
    ) -> StoreResult<Vec<crate::runs::Checkpoint>> {
        let r = run_id.clone();
        read_op!(self, |tx| crate::runs::checkpoints(tx, &r))
    }

    /// A run's recorded answers.
    pub async fn run_answers(&self, run_id: &RunId) -> StoreResult<Vec<crate::runs::RunAnswer>> {
        let r = run_id.clone();
        read_op!(self, |tx| crate::runs::answers(tx, &r))
    }
}

mod drains;
mod fleet;
mod snapshots;
