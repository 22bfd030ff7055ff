//! Warm release and drain, in the orders SEMANTICS.md gives. Owns the `DrainReport`. A warm
//! release (pooled Hosts only) gives an idle session back after `warm_ttl`; it aborts on any
//! sign of work, and a refused runtime release is taken back (the session is an ordinary
//! resident again). A drain stops admitting at once, then releases every resident session
//! within the grace: gracefully when idle, otherwise crash-equivalently (abandoned: nothing
//! written, the journal lease released, an open gate left answerable for a successor).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sessionstore::{ResidencyState, SessionProjection};
use tokio::time::Instant;

use crate::failpoints::{self, steps};
use crate::resident::{Resident, ResidentState, SessionKey};
use crate::service::{Core, Service};

/// One failed step of a drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainFailure {
    pub session: Option<SessionKey>,
    pub step: &'static str,
    pub reason: String,
}

/// What a drain did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    pub released: Vec<SessionKey>,
    /// Sessions stopped crash-equivalently (not idle: parked at a gate or mid-turn).
    pub abandoned: Vec<SessionKey>,
    /// Sessions whose runtime could be neither released nor abandoned: the process must exit.
    pub parked: Vec<SessionKey>,
    pub failures: Vec<DrainFailure>,
}

impl DrainReport {
    /// True when every step succeeded and nothing is parked.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty() && self.parked.is_empty()
    }
}

enum Outcome {
    Released,
    Abandoned,
    Parked,
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Arms on whole-session idle; a repeated idle does not restart the countdown; any work
/// cancels it. At the TTL, tries a warm release.
pub(crate) async fn warm_watch(core: Arc<Core>, r: Arc<Resident>) {
    let mut idle = r.runtime.idle.idle();
    loop {
        // Wait for idle.
        loop {
            if *idle.borrow_and_update() {
                break;
            }
            tokio::select! {
                _ = r.cancel.cancelled() => return,
                c = idle.changed() => if c.is_err() { return },
            }
        }
        // Count down while idle stays true.
        let fired = loop {
            tokio::select! {
                _ = r.cancel.cancelled() => return,
                _ = tokio::time::sleep(core.config.warm_ttl) => break true,
                c = idle.changed() => {
                    if c.is_err() { return; }
                    if !*idle.borrow_and_update() { break false; }
                }
            }
        };
        if !fired || r.state() != ResidentState::Resident || core.draining.load(Ordering::SeqCst) {
            continue;
        }
        match warm_release(&core, &r).await {
            Ok(()) => return,
            Err(reason) => {
                tracing::info!(reason = %reason, "warm release aborted; the session stays resident")
            }
        }
    }
}

async fn inbox_has_work(core: &Core, r: &Resident) -> Result<bool, String> {
    let cursor = core
        .store
        .cursor(&r.key.tenant, &r.key.session)
        .await
        .map_err(|e| e.to_string())?;
    let after = cursor.map_or(0, |c| c.consumed_order);
    let page = core
        .store
        .list_commands(&r.key.tenant, &r.key.session, after, 16)
        .await
        .map_err(|e| e.to_string())?;
    Ok(page.iter().any(|c| !c.state.is_terminal()))
}

async fn checkpoint(core: &Core, r: &Resident, state: ResidencyState) -> Result<(), String> {
    let tip = core
        .store
        .journal_tip(&r.key.tenant, r.binding.runtime_session_id)
        .await
        .map_err(|e| e.to_string())?;
    core.store
        .update_projection(
            &r.key.tenant,
            &r.key.session,
            r.epoch,
            SessionProjection {
                residency_state: state,
                last_journal_seq: tip,
                checkpoint_seq: tip,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

async fn mark(core: &Core, r: &Resident, residency: ResidencyState) -> Result<(), String> {
    let mut u = core_registration(core, r, residency);
    u.accepting = false;
    core.store
        .put_registration(u)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn core_registration(
    core: &Core,
    r: &Resident,
    residency: ResidencyState,
) -> sessionstore::RegistrationUpdate {
    sessionstore::RegistrationUpdate {
        tenant: r.key.tenant.clone(),
        session: r.key.session.clone(),
        host: core.config.host_id.clone(),
        host_generation: core.generation.load(Ordering::SeqCst),
        endpoint: core.config.internal_endpoint.clone(),
        residency,
        accepting: residency == ResidencyState::Resident,
        lease_epoch: r.epoch,
        ttl: core.config.registry_expiry,
    }
}

/// Gives back what a released residency held: tombstone, stop its tasks, release the lease,
/// credit capacity, forget it. Failures are returned as (step, reason).
async fn give_back(core: &Core, r: &Arc<Resident>) -> Vec<(&'static str, String)> {
    let mut failures = Vec::new();
    if let Err(e) = core
        .store
        .tombstone_registration(&r.key.tenant, &r.key.session, r.epoch)
        .await
    {
        failures.push(("tombstone", e.to_string()));
    }
    r.cancel.cancel();
    let _ = core
        .invalidations
        .send((r.key.tenant.clone(), r.key.session.clone()));
    if let Err(e) = core.store.release_residency(&r.grant()).await {
        failures.push(("release_lease", e.to_string()));
    }
    core.forget(r);
    failures
}

/// A warm release. Err says why it was aborted (the session is still resident then).
async fn warm_release(core: &Arc<Core>, r: &Arc<Resident>) -> Result<(), String> {
    if !r.consumer.halt(core.config.idle_boundary).await {
        r.consumer.resume();
        return Err("a command pass did not finish in time".into());
    }
    let abort = |why: String| {
        r.consumer.resume();
        Err(why)
    };
    if !*r.runtime.idle.idle().borrow() {
        return abort("the session is no longer idle".into());
    }
    match inbox_has_work(core, r).await {
        Ok(false) => {}
        Ok(true) => return abort("a command arrived".into()),
        Err(e) => return abort(format!("the inbox could not be read: {e}")),
    }
    if !r.begin_end() {
        return Err("another path is ending this residency".into());
    }
    r.set_state(ResidentState::Releasing);
    let revert = |why: String| async move {
        core.metrics.release_failures.inc();
        r.ending.store(false, Ordering::SeqCst);
        r.set_state(ResidentState::Resident);
        if let Err(e) = mark(core, r, ResidencyState::Resident).await {
            tracing::warn!(error = %e, "re-publishing the registration after a taken-back release failed");
        }
        r.consumer.resume();
        Err::<(), String>(why)
    };
    if let Err(e) = mark(core, r, ResidencyState::Releasing).await {
        return revert(format!("marking releasing failed: {e}")).await;
    }
    if let Err(e) = checkpoint(core, r, ResidencyState::Releasing).await {
        return revert(format!("checkpoint failed: {e}")).await;
    }
    match tokio::time::timeout(core.config.drain_grace, r.runtime.release.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return revert(format!("the runtime refused the release: {e}")).await,
        Err(_) => return revert("the runtime release timed out".into()).await,
    }
    let failures = give_back(core, r).await;
    for (step, reason) in &failures {
        tracing::warn!(step, reason = %reason, "warm release step failed");
    }
    let _ = checkpoint(core, r, ResidencyState::Released).await;
    tracing::info!(tenant = %r.key.tenant, session = %r.key.session, "session warm-released");
    Ok(())
}

async fn drain_session(
    core: &Arc<Core>,
    r: Arc<Resident>,
    deadline: Instant,
    report: &std::sync::Mutex<DrainReport>,
) {
    let key = r.key.clone();
    let fail = |step: &'static str, reason: String| {
        tracing::warn!(tenant = %key.tenant, session = %key.session, epoch = r.epoch.0, step, reason = %reason, "drain step failed");
        if let Ok(mut rep) = report.lock() {
            rep.failures.push(DrainFailure {
                session: Some(key.clone()),
                step,
                reason,
            });
        }
    };
    if !r.begin_end() {
        return;
    }
    r.set_state(ResidentState::Releasing);
    let bound = core.config.idle_boundary.min(remaining(deadline));
    if !r.consumer.halt(bound).await {
        fail(
            "halt_consumption",
            "a command pass did not finish within the bound".into(),
        );
    }
    if let Err(e) = mark(core, &r, ResidencyState::Releasing).await {
        fail("mark_releasing", e);
    }
    let bound = core.config.idle_boundary.min(remaining(deadline));
    let idle = department::wait_idle(r.runtime.idle.as_ref(), bound).await;
    if let Err(e) = checkpoint(core, &r, ResidencyState::Releasing).await {
        fail("checkpoint", e);
    }
    let mut outcome = None;
    if idle {
        match tokio::time::timeout(remaining(deadline), r.runtime.release.release()).await {
            Ok(Ok(())) => outcome = Some(Outcome::Released),
            Ok(Err(e)) => fail("release_runtime", e.to_string()),
            Err(_) => fail("release_runtime", "timed out".into()),
        }
    }
    if outcome.is_none() {
        // Not idle (a turn, or parked at a gate): crash-equivalent, writing nothing.
        match &r.runtime.faults {
            None => {
                fail(
                    "abandon_residency",
                    "the runtime cannot be abandoned".into(),
                );
                outcome = Some(Outcome::Parked);
            }
            Some(f) => {
                let bound = core.config.idle_boundary;
                match tokio::time::timeout(bound, f.abandon()).await {
                    Ok(Ok(())) if !*r.runtime.liveness.alive().borrow() => {
                        outcome = Some(Outcome::Abandoned)
                    }
                    Ok(Ok(())) => {
                        fail(
                            "abandon_residency",
                            "the runtime is still alive after abandonment".into(),
                        );
                        outcome = Some(Outcome::Parked);
                    }
                    Ok(Err(e)) => {
                        fail("abandon_residency", e.to_string());
                        outcome = Some(Outcome::Parked);
                    }
                    Err(_) => {
                        fail("abandon_residency", "timed out".into());
                        outcome = Some(Outcome::Parked);
                    }
                }
            }
        }
    }
    if matches!(outcome, Some(Outcome::Parked)) {
        core.metrics.release_failures.inc();
    }
    for (step, reason) in give_back(core, &r).await {
        fail(step, reason);
    }
    if let Ok(mut rep) = report.lock() {
        match outcome {
            Some(Outcome::Released) => rep.released.push(key.clone()),
            Some(Outcome::Abandoned) => rep.abandoned.push(key.clone()),
            Some(Outcome::Parked) | None => rep.parked.push(key.clone()),
        }
    }
}

impl Service {
    /// Drains the whole Host (what SIGTERM does): admission off at once, advertisement
    /// withdrawn, every resident session released within the grace. Calling it again returns
    /// the first drain's report once it finishes.
    pub async fn drain(&self) -> DrainReport {
        let core = self.core.clone();
        if core.draining.swap(true, Ordering::SeqCst) {
            let mut done = core.drain_done.subscribe();
            let _ = done.wait_for(|d| *d).await;
            return core
                .drain_report
                .lock()
                .map(|r| r.clone().unwrap_or_default())
                .unwrap_or_default();
        }
        let report = std::sync::Mutex::new(DrainReport::default());
        if let Ok(mut a) = core.admission.lock() {
            a.set_accepting(false);
        }
        let deadline = Instant::now() + core.config.drain_grace;
        if core.started.load(Ordering::SeqCst) {
            match tokio::time::timeout(
                core.config.publish_bound,
                core.store.advertise(core.advertisement(false)),
            )
            .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => report
                    .lock()
                    .map(|mut r| {
                        r.failures.push(DrainFailure {
                            session: None,
                            step: "publish_not_accepting",
                            reason: e.to_string(),
                        })
                    })
                    .unwrap_or(()),
                Err(_) => report
                    .lock()
                    .map(|mut r| {
                        r.failures.push(DrainFailure {
                            session: None,
                            step: "publish_not_accepting",
                            reason: "timed out".into(),
                        })
                    })
                    .unwrap_or(()),
            }
        }
        failpoints::hit(core.config.host_id.as_str(), steps::MID_DRAIN).await;
        let residents: Vec<Arc<Resident>> = core
            .residents
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        let drains = residents.into_iter().map(|r| {
            let core = core.clone();
            let report = &report;
            async move {
                // Wait for an attach in flight on this session.
                let lock = core.session_lock_for_drain(&r.key);
                let _serial = tokio::time::timeout(remaining(deadline), lock.lock()).await;
                drain_session(&core, r, deadline, report).await;
            }
        });
        futures::future::join_all(drains).await;
        let report = report.into_inner().unwrap_or_default();
        if let Ok(mut slot) = core.drain_report.lock() {
            *slot = Some(report.clone());
        }
        core.drain_done.send_replace(true);
        tracing::info!(
            released = report.released.len(),
            abandoned = report.abandoned.len(),
            parked = report.parked.len(),
            failures = report.failures.len(),
            "drain finished"
        );
        report
    }

    /// Drains, then stops everything and closes the store last. `/healthz` turns false when
    /// this returns.
    pub async fn stop(&self) -> DrainReport {
        let report = self.drain().await;
        self.core.shutdown.cancel();
        self.core.tasks.close();
        let _ = tokio::time::timeout(self.core.config.idle_boundary, self.core.tasks.wait()).await;
        self.core.store.close().await;
        self.core.live.store(false, Ordering::SeqCst);
        report
    }
}
