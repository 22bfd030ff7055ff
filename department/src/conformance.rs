//! The runtime conformance kit (feature `conformance`). [`run_runtime_conformance`] launches
//! one real session through any [`LaunchTarget`] over a real store and checks the contract a
//! Host relies on, step by step, returning the first broken promise. A product writing its own
//! runtime runs it in its tests:
//!
//! ```ignore
//! department::conformance::run_runtime_conformance(target, &store).await.unwrap();
//! ```
//!
//! What it checks, in order: full recovery is declared; the runtime runs under the binding's
//! runtime session id and offers both recovery capabilities; it holds the journal lease at the
//! epoch it reports; an input applied under an attempt identity is durably disposed in the
//! journal so the store settles it `applied`; a duplicate delivery returns the same
//! disposition and writes nothing; the session becomes whole-session idle; abandonment writes
//! nothing and releases the journal lease; a restore takes a strictly later journal epoch and
//! closes the abandoned runtime's stranded attempt `not_applied`; a graceful release of an
//! idle runtime succeeds and releases the lease. Live options: the runtime's preview channel
//! is open while it runs. Attribution: with an [`AttributionReader`] (the product says how to
//! read back what its runtime recorded), the principal and metadata the kit admitted reached
//! the runtime's own durable record of the input.
//!
//! A runtime is never handed an unresolved payload reference: a [`RuntimeCommand`] carries a
//! decoded body, and the Host resolves and verifies an object-backed body before the attempt,
//! so there is nothing for the kit to check there.

use std::sync::Arc;
use std::time::Duration;

use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::*;
use uuid::Uuid;

use crate::launch::{LaunchMode, LaunchRequest, LaunchTarget, launch_verified};
use crate::runtime::{Runtime, RuntimeCommand, wait_idle};

/// How long each wait of the kit may take.
const BOUND: Duration = Duration::from_secs(10);

/// A broken promise, naming the step.
#[derive(Debug, thiserror::Error)]
#[error("runtime conformance failed at {step}: {detail}")]
pub struct ConformanceFailure {
    pub step: &'static str,
    pub detail: String,
}

fn fail<T>(step: &'static str, detail: impl Into<String>) -> Result<T, ConformanceFailure> {
    Err(ConformanceFailure {
        step,
        detail: detail.into(),
    })
}

fn check(
    cond: bool,
    step: &'static str,
    detail: impl Into<String>,
) -> Result<(), ConformanceFailure> {
    if cond { Ok(()) } else { fail(step, detail) }
}

fn store<T, E: std::fmt::Display>(
    step: &'static str,
    r: Result<T, E>,
) -> Result<T, ConformanceFailure> {
    r.map_err(|e| ConformanceFailure {
        step,
        detail: e.to_string(),
    })
}

/// What the kit observed, for a test to print.
#[derive(Debug, Clone)]
pub struct ConformanceReport {
    pub runtime_session: RuntimeSessionId,
    pub first_epoch: JournalEpoch,
    pub restored_epoch: JournalEpoch,
    /// Whether principal and metadata were checked (an [`AttributionReader`] was given).
    pub attribution_checked: bool,
}

/// Who asked, as a runtime durably recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribution {
    pub principal: Option<String>,
    pub metadata: Option<serde_json::Value>,
}

/// Reads back what a product's runtime recorded of a command's principal and metadata: the
/// product's own knowledge of where its runtime keeps them.
#[async_trait::async_trait]
pub trait AttributionReader: Send + Sync {
    /// The attribution recorded for the command with runtime id `command`, `None` when the
    /// runtime recorded none.
    async fn recorded(
        &self,
        store: &Store,
        tenant: &TenantId,
        runtime_session: RuntimeSessionId,
        command: RuntimeCommandId,
    ) -> Result<Option<Attribution>, String>;
}

/// What the kit may use beyond the target and the store.
#[derive(Default, Clone)]
pub struct KitOptions {
    pub attribution: Option<Arc<dyn AttributionReader>>,
}

/// The principal and metadata the kit admits its input with.
const KIT_PRINCIPAL: &str = "conformance";
const KIT_METADATA: &str = "{\"kit\":true}";

struct Fixture {
    store: Store,
    session: SessionRecord,
    residency: ResidencyEpoch,
}

impl Fixture {
    async fn admit(&self, id: &str, text: &str) -> Result<CommandRecord, ConformanceFailure> {
        store(
            "admit",
            self.store
                .admit(NewCommand {
                    tenant: self.session.tenant.clone(),
                    session: self.session.session.clone(),
                    command: store("admit", CommandId::new(id))?,
                    kind: CommandKind::Input,
                    body: CommandBody::Inline(encode_command_body(&CommandBodyV1::Input {
                        text: text.into(),
                    })),
                    principal: Some(KIT_PRINCIPAL.into()),
                    metadata: Some(KIT_METADATA.into()),
                    apply_within: Duration::from_secs(600),
                    trace: None,
                })
                .await,
        )
    }

    /// Claims and begins an attempt under the runtime's reported epoch.
    async fn attempt(
        &self,
        rec: &CommandRecord,
        epoch: JournalEpoch,
    ) -> Result<(CommandRecord, AttemptId), ConformanceFailure> {
        let token = Uuid::now_v7();
        let claimed = store(
            "claim",
            self.store
                .claim(ClaimRequest {
                    tenant: rec.tenant.clone(),
                    session: rec.session.clone(),
                    command: rec.command.clone(),
                    epoch: self.residency,
                    token,
                    ttl: Duration::from_secs(60),
                    expected_revision: rec.revision,
                })
                .await,
        )?;
        let attempt = AttemptId::mint();
        let applying = store(
            "begin_attempt",
            self.store
                .begin_attempt(AttemptRequest {
                    tenant: rec.tenant.clone(),
                    session: rec.session.clone(),
                    command: rec.command.clone(),
                    epoch: self.residency,
                    claim_token: token,
                    attempt,
                    journal_epoch: epoch,
                    expected_revision: claimed.revision,
                })
                .await,
        )?;
        Ok((applying, attempt))
    }

    async fn settle(&self, rec: &CommandRecord) -> Result<CommandRecord, ConformanceFailure> {
        store(
            "settle",
            self.store
                .settle(SettleRequest {
                    tenant: rec.tenant.clone(),
                    session: rec.session.clone(),
                    command: rec.command.clone(),
                    epoch: self.residency,
                    expected_revision: rec.revision,
                })
                .await,
        )
    }

    fn command(
        &self,
        rec: &CommandRecord,
        attempt: AttemptId,
        epoch: JournalEpoch,
        text: &str,
    ) -> RuntimeCommand {
        RuntimeCommand::for_attempt(
            rec,
            attempt,
            epoch,
            CommandBodyV1::Input { text: text.into() },
        )
    }

    async fn tip(&self) -> Result<u64, ConformanceFailure> {
        store(
            "journal_tip",
            self.store
                .journal_tip(
                    &self.session.tenant,
                    self.session.binding.runtime_session_id,
                )
                .await,
        )
    }

    async fn lease_holder(&self) -> Result<Option<String>, ConformanceFailure> {
        let state = store(
            "journal_lease",
            self.store
                .journal_lease_state(
                    &self.session.tenant,
                    self.session.binding.runtime_session_id,
                )
                .await,
        )?;
        Ok(state.and_then(|s| s.holder))
    }
}

async fn launch(
    target: &dyn LaunchTarget,
    f: &Fixture,
    mode: LaunchMode,
    holder: &str,
) -> Result<Runtime, ConformanceFailure> {
    store(
        "launch",
        launch_verified(
            target,
            LaunchRequest {
                tenant: f.session.tenant.clone(),
                session: f.session.session.clone(),
                agent: f.session.agent.clone(),
                binding: f.session.binding.clone(),
                mode,
                holder: holder.into(),
            },
        )
        .await,
    )
}

async fn wait_dead(runtime: &Runtime) -> bool {
    let mut alive = runtime.liveness.alive();
    tokio::time::timeout(BOUND, async {
        loop {
            if !*alive.borrow_and_update() {
                return true;
            }
            if alive.changed().await.is_err() {
                return true;
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// Launches one real session through `target`, journaling into `store` (whose evidence router
/// must route the local storage binding to the journal the target writes), and checks the
/// contract. The tenant `conformance` and a fresh session id are used.
pub async fn run_runtime_conformance(
    target: Arc<dyn LaunchTarget>,
    store_handle: &Store,
) -> Result<ConformanceReport, ConformanceFailure> {
    run_runtime_conformance_with(target, store_handle, KitOptions::default()).await
}

/// [`run_runtime_conformance`], with the checks `options` make possible.
pub async fn run_runtime_conformance_with(
    target: Arc<dyn LaunchTarget>,
    store_handle: &Store,
    options: KitOptions,
) -> Result<ConformanceReport, ConformanceFailure> {
    let caps = target.capabilities();
    check(
        caps.recovery.is_full(),
        "recovery_declared",
        format!("the target lacks {}", caps.recovery.missing().join(" and ")),
    )?;
    check(
        caps.admission_weight >= 1,
        "admission_weight",
        "must be at least 1",
    )?;

    let tenant = store("ids", TenantId::new("conformance"))?;
    let session = store(
        "create_session",
        store_handle
            .create_session(NewSession {
                tenant: tenant.clone(),
                session: store(
                    "ids",
                    SessionId::new(format!("conformance-{}", Uuid::now_v7())),
                )?,
                agent: store("ids", AgentId::new("conformance-agent"))?,
                compatibility: target.compatibility(),
                binding: SessionBinding {
                    runtime_session_id: RuntimeSessionId::mint(),
                    storage_binding_id: local_binding(),
                    binding_version: 1,
                },
            })
            .await,
    )?;
    let f = Fixture {
        store: store_handle.clone(),
        session,
        residency: ResidencyEpoch(1),
    };

    // Launch: identity, capabilities, lease.
    let runtime = launch(target.as_ref(), &f, LaunchMode::Create, "conformance-a").await?;
    check(
        runtime.runtime_session == f.session.binding.runtime_session_id,
        "runtime_session_id",
        "the runtime does not run under the binding's runtime session id",
    )?;
    check(
        runtime.closer.is_some(),
        "attempt_closer",
        "absent at runtime",
    )?;
    check(
        runtime.faults.is_some(),
        "persistence_faults",
        "absent at runtime",
    )?;
    let epoch = runtime.epoch.journal_epoch();
    check(
        epoch.0 >= 1,
        "journal_epoch",
        "the runtime reports no journal epoch",
    )?;
    let lease = store(
        "journal_lease",
        f.store
            .journal_lease_state(&f.session.tenant, f.session.binding.runtime_session_id)
            .await,
    )?;
    check(
        lease
            .as_ref()
            .is_some_and(|l| l.epoch == epoch && l.holder.is_some()),
        "journal_lease",
        format!("the store's journal lease is {lease:?}, the runtime reports epoch {epoch}"),
    )?;
    if let Some(faults) = &runtime.faults {
        check(
            faults.faults().borrow().is_none(),
            "persistence_faults",
            "a fault is latched at launch",
        )?;
    }
    // Live options: a Host subscribes to previews for the runtime's whole life.
    let mut previews = runtime.events.previews();
    check(
        !matches!(
            previews.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Closed)
        ),
        "live_options",
        "the runtime's preview channel is closed while it runs",
    )?;

    // Apply under an attempt identity; settle from the journal's evidence.
    let rec = f
        .admit("kit-input-1", "hello from the conformance kit")
        .await?;
    let (applying, attempt) = f.attempt(&rec, epoch).await?;
    let recorded = store(
        "apply",
        runtime
            .applier
            .apply(f.command(&applying, attempt, epoch, "hello from the conformance kit"))
            .await,
    )?;
    check(
        recorded.disposition == Disposition::Applied,
        "apply",
        format!("an input was disposed {:?}", recorded.disposition),
    )?;
    if let Some(reader) = &options.attribution {
        let got = store(
            "attribution",
            reader
                .recorded(
                    &f.store,
                    &f.session.tenant,
                    f.session.binding.runtime_session_id,
                    applying.identity().runtime_command,
                )
                .await,
        )?;
        let want = Attribution {
            principal: Some(KIT_PRINCIPAL.into()),
            metadata: serde_json::from_str(KIT_METADATA).ok(),
        };
        check(
            got.as_ref() == Some(&want),
            "attribution",
            format!("the runtime recorded {got:?}, the input was admitted with {want:?}"),
        )?;
    }
    let settled = f.settle(&applying).await?;
    check(
        settled.state == CommandState::Applied && settled.evidence_seq == Some(recorded.seq),
        "settle",
        format!(
            "settled {:?} from evidence {:?}",
            settled.state, settled.evidence_seq
        ),
    )?;

    // Idle, then a duplicate delivery: same disposition, nothing written.
    check(
        wait_idle(runtime.idle.as_ref(), BOUND).await,
        "idle",
        "the session never became idle",
    )?;
    let tip = f.tip().await?;
    let again = store(
        "duplicate_delivery",
        runtime
            .applier
            .apply(f.command(&applying, attempt, epoch, "hello from the conformance kit"))
            .await,
    )?;
    check(
        again == recorded,
        "duplicate_delivery",
        format!("{again:?} differs from {recorded:?}"),
    )?;
    check(
        f.tip().await? == tip,
        "duplicate_delivery",
        "a duplicate delivery wrote to the journal",
    )?;

    // A stranded attempt: begun under this runtime, never dispatched; then abandonment.
    let stranded = f.admit("kit-input-2", "never dispatched").await?;
    let (stranded, stranded_attempt) = f.attempt(&stranded, epoch).await?;
    let before = f.tip().await?;
    let Some(faults) = runtime.faults.clone() else {
        return fail("abandon", "no persistence-fault capability");
    };
    store("abandon", faults.abandon().await)?;
    check(
        wait_dead(&runtime).await,
        "abandon",
        "the runtime is still alive after abandonment",
    )?;
    check(
        f.tip().await? == before,
        "abandon",
        "abandonment wrote to the journal",
    )?;
    check(
        f.lease_holder().await?.is_none(),
        "abandon",
        "abandonment did not release the journal lease",
    )?;

    // Restore: a strictly later epoch closes the stranded attempt not_applied.
    let restored = launch(target.as_ref(), &f, LaunchMode::Restore, "conformance-b").await?;
    let epoch2 = restored.epoch.journal_epoch();
    check(
        epoch2 > epoch,
        "restore_epoch",
        format!("{epoch2} is not later than {epoch}"),
    )?;
    let Some(closer) = restored.closer.clone() else {
        return fail("close_attempt", "no attempt closer after restore");
    };
    let closed = store(
        "close_attempt",
        closer
            .close_attempt(stranded.identity(), stranded_attempt, epoch)
            .await,
    )?;
    check(
        closed.disposition == Disposition::NotApplied,
        "close_attempt",
        format!("closed as {:?}", closed.disposition),
    )?;
    let settled = f.settle(&stranded).await?;
    check(
        settled.state == CommandState::Rejected && settled.outcome == Some(Outcome::NotApplied),
        "settle_closure",
        format!("settled {:?}/{:?}", settled.state, settled.outcome),
    )?;
    // The earlier command's disposition survived the restore: re-delivering it is a duplicate.
    let replay = store(
        "duplicate_after_restore",
        restored
            .applier
            .apply(f.command(&applying, attempt, epoch, "hello from the conformance kit"))
            .await,
    )?;
    check(
        replay == recorded,
        "duplicate_after_restore",
        format!("{replay:?} differs from {recorded:?}"),
    )?;

    // Graceful release of an idle runtime.
    check(
        wait_idle(restored.idle.as_ref(), BOUND).await,
        "idle_after_restore",
        "never idle",
    )?;
    store("release", restored.release.release().await)?;
    check(
        wait_dead(&restored).await,
        "release",
        "the runtime is still alive after release",
    )?;
    check(
        f.lease_holder().await?.is_none(),
        "release",
        "release did not give the journal lease back",
    )?;

    Ok(ConformanceReport {
        runtime_session: f.session.binding.runtime_session_id,
        first_epoch: epoch,
        restored_epoch: epoch2,
        attribution_checked: options.attribution.is_some(),
    })
}
