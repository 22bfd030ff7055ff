//! Warm release and drain, in the orders SEMANTICS.md gives. Owns the `DrainReport`. A warm
//! release (pooled Hosts only) gives an idle session back after `warm_ttl`; it aborts on any
//! sign of work, and a refused runtime release is taken back (the session is an ordinary
//! resident again). A drain stops admitting at once, then releases every resident session
//! within the grace: gracefully when idle, otherwise crash-equivalently (abandoned: nothing
//! written, the journal lease released, an open gate left answerable for a successor). A
//! session parked at an open gate is abandoned at once, without waiting for idle, and is not
//! a failure: only a turn still running past the idle bound is.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tracing::Instrument;

use hostlink::records::DrainState;
use sessionstore::{ResidencyState, SessionProjection};
use tokio::time::Instant;

use crate::failpoints;
use crate::residency::{Residency, SessionCtx};
use crate::resident::{Resident, ResidentState, SessionKey};

/// One failed step of a drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainFailure {
    pub session: Option<SessionKey>,
    pub step: &'static str,
    pub reason: String,
}

/// What a drain did: the Host generation it drained, where it ended, and every session and
/// failed step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainReport {
    /// The Host generation that drained.
    pub generation: u64,
    /// `Drained` once every session was given back with its lease released; a drain that left
    /// a parked session or a lease it could not release stays `Draining` (withheld).
    pub state: DrainState,
    pub released: Vec<SessionKey>,
    /// Sessions stopped crash-equivalently: parked at an open gate (at once, and not a
    /// failure), or mid-turn past the idle bound (also a failed `release_runtime` step: the
    /// graceful release was refused).
    pub abandoned: Vec<SessionKey>,
    /// Sessions whose runtime could be neither released nor abandoned: the process must exit.
    pub parked: Vec<SessionKey>,
    pub failures: Vec<DrainFailure>,
}

impl DrainReport {
    /// An empty report of a drain of `generation`, not yet settled.
    pub fn new(generation: u64) -> DrainReport {
        DrainReport {
            generation,
            state: DrainState::Draining,
            released: Vec::new(),
            abandoned: Vec::new(),
            parked: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// How many failures each step had, in the order the steps first failed.
    pub fn failures_by_step(&self) -> Vec<(&'static str, usize)> {
        let mut counts: Vec<(&'static str, usize)> = Vec::new();
        for f in &self.failures {
            match counts.iter_mut().find(|(step, _)| *step == f.step) {
                Some((_, n)) => *n += 1,
                None => counts.push((f.step, 1)),
            }
        }
        counts
    }

    /// True when every step succeeded and nothing is parked.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty() && self.parked.is_empty()
    }

    /// Decides the terminal state: drained unless something may still hold a lease.
    fn settle(&mut self) {
        let lease_held = self.failures.iter().any(|f| f.step == steps::RELEASE_LEASE);
        self.state = if self.parked.is_empty() && !lease_held {
            DrainState::Drained
        } else {
            DrainState::Draining
        };
    }
}

/// The names of drain and stop steps a [`DrainFailure`] carries.
pub mod steps {
    pub const PUBLISH_NOT_ACCEPTING: &str = "publish_not_accepting";
    pub const CLAIM_RESIDENCY: &str = "claim_residency";
    pub const HALT_CONSUMPTION: &str = "halt_consumption";
    pub const MARK_RELEASING: &str = "mark_releasing";
    pub const CHECKPOINT: &str = "checkpoint";
    /// The graceful runtime release was refused (or never possible: not idle in time).
    pub const RELEASE_RUNTIME: &str = "release_runtime";
    pub const ABANDON_RESIDENCY: &str = "abandon_residency";
    pub const TOMBSTONE: &str = "tombstone";
    pub const RELEASE_LEASE: &str = "release_lease";
    /// A session's drain did not finish within the grace and its abandon budget.
    pub const DRAIN_SESSION: &str = "drain_session";
    /// Links still open when the stop's bounded tail ran out.
    pub const CLOSE_LINK: &str = "close_link";
    /// The store did not close within the stop's bounded tail.
    pub const CLOSE_STORE: &str = "close_store";
    /// The stop itself failed (its task ended abnormally).
    pub const STOP: &str = "stop";
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
pub(crate) async fn warm_watch(ctx: SessionCtx) {
    let r = ctx.resident().clone();
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
                _ = tokio::time::sleep(ctx.config().warm_ttl) => break true,
                c = idle.changed() => {
                    if c.is_err() { return; }
                    if !*idle.borrow_and_update() { break false; }
                }
            }
        };
        if !fired || r.state() != ResidentState::Resident || ctx.draining() {
            continue;
        }
        let span = tracing::info_span!(
            parent: None,
            "residency.warm_release",
            tenant = %r.key.tenant,
            session = %r.key.session,
            epoch = r.epoch.0,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        // Boxed: the countdown task rests small until the release runs.
        match Box::pin(warm_release(&ctx)).instrument(span.clone()).await {
            Ok(()) => return,
            Err(reason) => {
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_description", "release_aborted");
                tracing::info!(reason = %reason, "warm release aborted; the session stays resident")
            }
        }
    }
}

async fn inbox_has_work(ctx: &SessionCtx) -> Result<bool, String> {
    let r = ctx.resident();
    let cursor = ctx
        .store()
        .cursor(&r.key.tenant, &r.key.session)
        .await
        .map_err(|e| e.to_string())?;
    let after = cursor.map_or(0, |c| c.consumed_order);
    let page = ctx
        .store()
        .list_commands(&r.key.tenant, &r.key.session, after, 16)
        .await
        .map_err(|e| e.to_string())?;
    Ok(page.iter().any(|c| !c.state.is_terminal()))
}

async fn checkpoint(ctx: &SessionCtx, state: ResidencyState) -> Result<(), String> {
    let r = ctx.resident();
    let tip = ctx
        .store()
        .journal_tip(&r.key.tenant, r.binding.runtime_session_id)
        .await
        .map_err(|e| e.to_string())?;
    ctx.store()
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

/// Publishes the registration in `residency`, not accepting commands.
async fn mark(ctx: &SessionCtx, residency: ResidencyState) -> Result<(), String> {
    let mut u = ctx.registration(residency);
    u.accepting = false;
    ctx.store()
        .put_registration(u)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A warm release. Err says why it was aborted: the session is resident again then, or, when
/// a drain began meanwhile, held halted for the drain to end.
async fn warm_release(ctx: &SessionCtx) -> Result<(), String> {
    let r = ctx.resident();
    let config = ctx.config();
    // Claim the end first. From here until the claim is given back a drain waits for this
    // release instead of skipping the session, and only this path may resume the consumer.
    if !r.begin_end() {
        return Err("another path is ending this residency".into());
    }
    if ctx.draining() {
        return take_back(ctx, "a drain began".into(), false).await;
    }
    if !r.consumer.halt(config.idle_boundary).await {
        return take_back(ctx, "a command pass did not finish in time".into(), false).await;
    }
    if !*r.runtime.idle.idle().borrow() {
        return take_back(ctx, "the session is no longer idle".into(), false).await;
    }
    match inbox_has_work(ctx).await {
        Ok(false) => {}
        Ok(true) => return take_back(ctx, "a command arrived".into(), false).await,
        Err(e) => {
            return take_back(ctx, format!("the inbox could not be read: {e}"), false).await;
        }
    }
    r.set_state(ResidentState::Releasing);
    if let Err(e) = mark(ctx, ResidencyState::Releasing).await {
        return take_back(ctx, format!("marking releasing failed: {e}"), true).await;
    }
    if let Err(e) = checkpoint(ctx, ResidencyState::Releasing).await {
        return take_back(ctx, format!("checkpoint failed: {e}"), true).await;
    }
    match tokio::time::timeout(config.drain_grace, r.runtime.release.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return take_back(ctx, format!("the runtime refused the release: {e}"), true).await;
        }
        Err(_) => return take_back(ctx, "the runtime release timed out".into(), true).await,
    }
    r.warm_released.store(true, Ordering::SeqCst);
    let failures = ctx.give_back().await;
    for (step, reason) in &failures {
        tracing::warn!(step, reason = %reason, "warm release step failed");
    }
    let _ = checkpoint(ctx, ResidencyState::Released).await;
    tracing::info!(tenant = %r.key.tenant, session = %r.key.session, "session warm-released");
    Ok(())
}

/// Takes a warm release back (`published`: the registration already said releasing, so this
/// counts as a release failure). Outside a drain the session is an ordinary resident again:
/// re-published and its consumer resumed. While a drain runs the take-back is refused: the
/// consumer stays halted, nothing is re-published, and the claim passes to the drain. The
/// consumer is resumed before the claim is given up, so a drain that claims next always
/// halts it after any resume.
async fn take_back(ctx: &SessionCtx, why: String, published: bool) -> Result<(), String> {
    let r = ctx.resident();
    if published {
        ctx.metrics().release_failures.inc();
    }
    if ctx.draining() {
        tracing::info!(
            tenant = %r.key.tenant,
            session = %r.key.session,
            epoch = r.epoch.0,
            reason = %why,
            "warm release given up during a drain; the session is held for the drain"
        );
    } else {
        if published && let Err(e) = mark(ctx, ResidencyState::Resident).await {
            tracing::warn!(error = %e, "re-publishing the registration after a taken-back release failed");
        }
        r.consumer.resume();
    }
    r.abandon_end_claim();
    Err(why)
}

/// How a drain came to hold (or not) a session's end.
enum Claim {
    /// The drain ends it.
    Claimed,
    /// Another path (a warm release, or an abnormal end) ended it while the drain waited.
    EndedElsewhere,
    /// Another path still held it at the deadline.
    StillHeld,
}

/// Claims the end of `r` for the drain, waiting (up to `deadline`) while another path holds
/// it: a warm release in flight either gives the session back (then the drain claims it) or
/// ends it. A drain never skips a session because someone else was busy with it.
async fn claim_for_drain(r: &Resident, deadline: Instant) -> Claim {
    let mut state = r.state.subscribe();
    loop {
        // Read the state before trying the claim: a give-back between the two still wakes us.
        let seen = *state.borrow_and_update();
        if r.begin_end() {
            return Claim::Claimed;
        }
        if seen == ResidentState::Ended {
            return Claim::EndedElsewhere;
        }
        match tokio::time::timeout(remaining(deadline), state.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Claim::EndedElsewhere,
            Err(_) => return Claim::StillHeld,
        }
    }
}

async fn drain_session(ctx: SessionCtx, deadline: Instant, report: &std::sync::Mutex<DrainReport>) {
    let r = ctx.resident().clone();
    let config = ctx.config();
    let key = r.key.clone();
    let generation = ctx.host_generation();
    let fail = |step: &'static str, reason: String| {
        let index = match report.lock() {
            Ok(mut rep) => {
                rep.failures.push(DrainFailure {
                    session: Some(key.clone()),
                    step,
                    reason: reason.clone(),
                });
                rep.failures.len()
            }
            Err(_) => 0,
        };
        // Past the first few, a failure is logged only in the drain's summary by step: a large
        // Host may fail the same step for tens of thousands of sessions.
        if index > FAILURES_LOGGED_ONE_BY_ONE {
            tracing::debug!(tenant = %key.tenant, session = %key.session, epoch = r.epoch.0, host_generation = generation, step, reason = %reason, "drain step failed");
        } else if step == steps::RELEASE_RUNTIME {
            // A refused runtime release is the crash-equivalent case: an operator must know.
            tracing::error!(tenant = %key.tenant, session = %key.session, epoch = r.epoch.0, host_generation = generation, step, reason = %reason, "drain step failed");
        } else {
            tracing::warn!(tenant = %key.tenant, session = %key.session, epoch = r.epoch.0, host_generation = generation, step, reason = %reason, "drain step failed");
        }
    };
    match claim_for_drain(&r, deadline).await {
        Claim::Claimed => {}
        Claim::EndedElsewhere => {
            if r.warm_released.load(Ordering::SeqCst)
                && let Ok(mut rep) = report.lock()
            {
                rep.released.push(key.clone());
            }
            return;
        }
        Claim::StillHeld => {
            fail(
                steps::CLAIM_RESIDENCY,
                "a warm release still held the session at the end of the grace".into(),
            );
            if let Ok(mut rep) = report.lock() {
                rep.parked.push(key.clone());
            }
            return;
        }
    }
    r.set_state(ResidentState::Releasing);
    let bound = config.idle_boundary.min(remaining(deadline));
    if !r.consumer.halt(bound).await {
        fail(
            steps::HALT_CONSUMPTION,
            "a command pass did not finish within the bound".into(),
        );
    }
    if let Err(e) = mark(&ctx, ResidencyState::Releasing).await {
        fail(steps::MARK_RELEASING, e);
    }
    // Parked at an open gate: it cannot become idle until a human answers, and a draining Host
    // applies no answer, so waiting would only spend the grace. It is given up at once,
    // crash-equivalently (the gate stays open and answerable on the successor), and that is
    // the expected end of a gated session, not a failure.
    let gated = r.gates_open.load(Ordering::SeqCst) > 0;
    let idle = if gated {
        false
    } else {
        let bound = config.idle_boundary.min(remaining(deadline));
        department::wait_idle(r.runtime.idle.as_ref(), bound).await
    };
    if let Err(e) = checkpoint(&ctx, ResidencyState::Releasing).await {
        fail(steps::CHECKPOINT, e);
    }
    let mut outcome = None;
    if gated {
        tracing::info!(tenant = %key.tenant, session = %key.session, epoch = r.epoch.0, host_generation = generation, "parked at an open gate: abandoned at once, the gate stays answerable on the next Host");
    } else if idle {
        match tokio::time::timeout(remaining(deadline), r.runtime.release.release()).await {
            Ok(Ok(())) => outcome = Some(Outcome::Released),
            Ok(Err(e)) => fail(steps::RELEASE_RUNTIME, e.to_string()),
            Err(_) => fail(steps::RELEASE_RUNTIME, "timed out".into()),
        }
    } else {
        // A graceful release needs whole-session idle; this session is parked at a gate or
        // mid-turn, so the runtime would refuse it: a failed step, stopped crash-equivalently.
        fail(
            steps::RELEASE_RUNTIME,
            "not idle within the bound (a gate is open or a turn runs): refused, abandoning".into(),
        );
    }
    if outcome.is_none() {
        // Not idle (a turn, or parked at a gate): crash-equivalent, writing nothing.
        match &r.runtime.faults {
            None => {
                fail(
                    steps::ABANDON_RESIDENCY,
                    "the runtime cannot be abandoned".into(),
                );
                outcome = Some(Outcome::Parked);
            }
            Some(f) => {
                let bound = config.idle_boundary;
                match tokio::time::timeout(bound, f.abandon()).await {
                    Ok(Ok(())) if !*r.runtime.liveness.alive().borrow() => {
                        outcome = Some(Outcome::Abandoned)
                    }
                    Ok(Ok(())) => {
                        fail(
                            steps::ABANDON_RESIDENCY,
                            "the runtime is still alive after abandonment".into(),
                        );
                        outcome = Some(Outcome::Parked);
                    }
                    Ok(Err(e)) => {
                        fail(steps::ABANDON_RESIDENCY, e.to_string());
                        outcome = Some(Outcome::Parked);
                    }
                    Err(_) => {
                        fail(steps::ABANDON_RESIDENCY, "timed out".into());
                        outcome = Some(Outcome::Parked);
                    }
                }
            }
        }
    }
    if matches!(outcome, Some(Outcome::Parked)) {
        ctx.metrics().release_failures.inc();
    }
    for (step, reason) in ctx.give_back().await {
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

/// The one drain of a Host: its report, kept for every later caller.
#[derive(Default)]
pub(crate) struct DrainOnce {
    report: std::sync::Mutex<Option<DrainReport>>,
    done: tokio::sync::Notify,
}

impl DrainOnce {
    fn finished(&self) -> Option<DrainReport> {
        self.report.lock().ok().and_then(|r| r.clone())
    }

    /// Waits for the first drain's report.
    async fn wait(&self) -> DrainReport {
        loop {
            let notified = self.done.notified();
            if let Some(r) = self.finished() {
                return r;
            }
            notified.await;
        }
    }

    fn finish(&self, report: DrainReport) {
        if let Ok(mut slot) = self.report.lock() {
            *slot = Some(report);
        }
        self.done.notify_waiters();
    }
}

fn whole_host_failure(report: &std::sync::Mutex<DrainReport>, step: &'static str, reason: String) {
    tracing::warn!(step, reason = %reason, "drain step failed");
    if let Ok(mut r) = report.lock() {
        r.failures.push(DrainFailure {
            session: None,
            step,
            reason,
        });
    }
}

/// How many of a drain's failed steps are logged one line each; the rest are counted in one
/// summary line per step at the drain's end (and every one is in the report).
pub const FAILURES_LOGGED_ONE_BY_ONE: usize = 20;

/// How many idle sessions a drain releases at once (see `drain_in_span`).
pub const DRAIN_PARALLELISM: usize = 64;

/// Drains the whole Host (what SIGTERM does): admission off at once, advertisement
/// withdrawn, every resident session released within the grace. Calling it again returns the
/// first drain's report once it finishes.
pub(crate) async fn drain(host: &Arc<Residency>, once: &DrainOnce) -> DrainReport {
    let span = tracing::info_span!(parent: None, "residency.drain", generation = host.generation());
    drain_in_span(host, once).instrument(span).await
}

async fn drain_in_span(host: &Arc<Residency>, once: &DrainOnce) -> DrainReport {
    host.begin_drain();
    if !host.claim_drain() {
        return once.wait().await;
    }
    let config = host.config();
    let report = std::sync::Mutex::new(DrainReport::new(host.generation()));
    let deadline = Instant::now() + config.drain_grace;
    if host.started() {
        match tokio::time::timeout(
            config.publish_bound,
            host.store().advertise(host.advertisement(false)),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => whole_host_failure(&report, steps::PUBLISH_NOT_ACCEPTING, e.to_string()),
            Err(_) => whole_host_failure(&report, steps::PUBLISH_NOT_ACCEPTING, "timed out".into()),
        }
    }
    failpoints::hit(config.host_id.as_str(), failpoints::steps::MID_DRAIN).await;
    let residents = host.residents();
    let keys: Vec<SessionKey> = residents.iter().map(|r| r.key.clone()).collect();
    let drain_one = |r: Arc<Resident>| {
        let report = &report;
        async move {
            // Wait for an attach in flight on this session.
            let _serial = host.lock_session(&r.key, Some(remaining(deadline))).await;
            drain_session(host.session(r), deadline, report).await;
        }
    };
    // Sessions busy now (a turn running, or parked at a gate) are drained all at once: they
    // wait for idle, or are abandoned, each within its own bound. Idle sessions, which only
    // write, are drained DRAIN_PARALLELISM at a time, so each one finishes in turn instead of
    // every one being half-done when the grace ends, and the store's queue stays short.
    let (busy, idle): (Vec<_>, Vec<_>) = residents
        .into_iter()
        .partition(|r| r.gates_open.load(Ordering::SeqCst) > 0 || !*r.runtime.idle.idle().borrow());
    let idle = {
        use futures::StreamExt as _;
        futures::stream::iter(idle.into_iter().map(drain_one))
            .buffer_unordered(DRAIN_PARALLELISM)
            .collect::<Vec<()>>()
    };
    let busy = futures::future::join_all(busy.into_iter().map(drain_one));
    // Everything before an abandon stops at the grace; an abandon gets one fresh idle
    // boundary and the give-back half of one more. What is still running then is reported
    // parked, so the drain ends by grace + 1.5 × idle boundary (see `stop_tail`).
    let cut = deadline + config.idle_boundary + config.idle_boundary / 2;
    let finished = tokio::time::timeout_at(cut, futures::future::join(idle, busy))
        .await
        .is_ok();
    let mut report = report.into_inner().unwrap_or_else(|p| p.into_inner());
    // Sessions the drain did not finish: not begun before the grace ended, or still running at
    // the cut. Each is left as a crash leaves it (its leases lapse and a successor takes it),
    // reported parked with a failure, and logged once as a count (a large Host may leave many).
    let reported: std::collections::HashSet<&SessionKey> = report
        .released
        .iter()
        .chain(&report.abandoned)
        .chain(&report.parked)
        .collect();
    let unfinished: Vec<SessionKey> = keys.into_iter().filter(|k| !reported.contains(k)).collect();
    if let Some(first) = unfinished.first() {
        tracing::error!(
            host_generation = report.generation,
            step = steps::DRAIN_SESSION,
            sessions = unfinished.len(),
            first = %first,
            drain_finished_in_time = finished,
            "drain step failed: sessions not drained within the grace and the abandon budget are left as a crash leaves them"
        );
    }
    for key in unfinished {
        report.failures.push(DrainFailure {
            session: Some(key.clone()),
            step: steps::DRAIN_SESSION,
            reason:
                "not drained within the grace and its abandon budget; left as a crash leaves it"
                    .into(),
        });
        report.parked.push(key);
    }
    report.settle();
    if report.failures.len() > FAILURES_LOGGED_ONE_BY_ONE {
        for (step, count) in report.failures_by_step() {
            tracing::error!(
                host_generation = report.generation,
                step,
                failures = count,
                "drain step failed (summary: only the drain's first {FAILURES_LOGGED_ONE_BY_ONE} failures were logged one by one)"
            );
        }
    }
    once.finish(report.clone());
    tracing::info!(
        host_generation = report.generation,
        state = report.state.as_str(),
        released = report.released.len(),
        abandoned = report.abandoned.len(),
        parked = report.parked.len(),
        failures = report.failures.len(),
        "drain finished"
    );
    report
}

/// The budget of the stop's tail after the drain (closing links, stopping tasks, closing the
/// store): half an idle boundary, so the whole stop ends within
/// `drain_grace + 2 × idle_boundary` (the bound the README gives for termination grace).
pub fn stop_tail(idle_boundary: Duration) -> Duration {
    idle_boundary / 2
}
