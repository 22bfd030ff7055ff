//! Upkeep: the Host's one heartbeat, and each residency's fault watch.
//!
//! The heartbeat is one store write per `registry_heartbeat`, whatever the number of resident
//! sessions: it publishes the advertisement and the charged weight, renews every live lease
//! this Host's generation holds and refreshes its registrations (see
//! `docs/decisions/2026-11-30-fleet-per-host-liveness.md`). A residency whose lease the
//! heartbeat did not renew was lost (taken by a successor, or lapsed) and is ended. When no
//! heartbeat goes through (the store failing or silent), every residency is given up a quarter
//! of a period before its lease could lapse (see [`heartbeat`]). The per-session epochs stay the
//! fence: the heartbeat only extends leases still held, never revives one. The fault watch
//! asks the residency owner to end a residency whose runtime is unsound. Neither ends a
//! residency itself, and neither writes anything once the Host stops.

use std::collections::HashSet;
use std::sync::Arc;

use sessionstore::{ErrorCode, HostHeartbeat, RenewedResidency};
use tokio::time::Instant;

use crate::residency::{EndReason, Residency, SessionCtx};
use crate::resident::ResidentState;

/// Heartbeats until the Host stops.
///
/// Each lease a heartbeat renews expires at the store's clock when the write runs plus
/// `registry_expiry`, so never before the instant the write was sent plus that expiry. A
/// quarter of a heartbeat period before that instant (`registry_expiry` is at least three periods, so two
/// renewals had their chance), a Host whose heartbeats have not gone through gives every
/// residency up and reports `store_unreachable`, whether its last write failed or is still
/// waiting on a silent network: it stops acting as resident while its leases are still its
/// own, before any successor can take them. A heartbeat that goes through again clears that.
pub(crate) async fn heartbeat(host: Arc<Residency>, first_sent: Instant) {
    let period = host.config().registry_heartbeat;
    let give_up_after = host.config().registry_expiry.saturating_sub(period / 4);
    let mut give_up_at = first_sent + give_up_after;
    let mut given_up = false;
    // Heartbeats start a period apart. After a failed one the next comes sooner (a quarter
    // period), so a store that is back within the leases' life renews them in time.
    let mut next = first_sent + period;
    loop {
        tokio::select! {
            _ = host.shutdown().cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        // Only residencies in the table before the write began are judged by its answer: one
        // attached meanwhile took its lease after the renewal statement ran.
        let before = host.residents();
        let accepting = !host.draining();
        let beat = HostHeartbeat {
            advertisement: host.advertisement(accepting),
            weight_used: host.weight_consumed(),
            retention: host.config().registry_retention,
        };
        let sent = Instant::now();
        // Paced from each write's start, not its end: a slow write must not also push the
        // next renewal a whole period further.
        next = sent + period;
        // The write is never abandoned (a store call cut off midway proves nothing); the
        // residencies are given up beside it when the deadline passes first.
        let write = host.store().heartbeat(beat);
        tokio::pin!(write);
        let answer = loop {
            tokio::select! {
                _ = host.shutdown().cancelled() => return,
                answer = &mut write => break answer,
                _ = tokio::time::sleep_until(give_up_at), if !given_up => {
                    given_up = true;
                    give_up(&host, "no heartbeat answered");
                }
            }
        };
        match answer {
            Ok(report) => {
                let took = sent.elapsed();
                if took > period {
                    tracing::warn!(
                        took_ms = took.as_millis() as u64,
                        "a heartbeat took longer than its period"
                    );
                }
                give_up_at = sent + give_up_after;
                given_up = false;
                host.readiness().leases_renewed();
                match report.renewed {
                    // An unbroken run of beats: every lease this Host held is still its own.
                    None => {
                        for r in before {
                            if r.state() != ResidentState::Ended {
                                r.set_lease_expiry(report.target.expires_at_ms);
                            }
                        }
                    }
                    Some(renewed) => {
                        let renewed: HashSet<RenewedResidency> = renewed.into_iter().collect();
                        for r in before {
                            if r.state() == ResidentState::Ended {
                                continue;
                            }
                            let key = RenewedResidency {
                                tenant: r.key.tenant.clone(),
                                session: r.key.session.clone(),
                                epoch: r.epoch,
                            };
                            if renewed.contains(&key) {
                                r.set_lease_expiry(report.target.expires_at_ms);
                            } else if r.state() == ResidentState::Resident {
                                host.end_later(
                                    r,
                                    EndReason::Lost(
                                        "the heartbeat found the lease lapsed or taken".into(),
                                    ),
                                );
                            }
                        }
                    }
                }
                if report.collected > 0 {
                    tracing::info!(
                        collected = report.collected,
                        "collected expired Host advertisements"
                    );
                }
            }
            Err(e) if e.code() == ErrorCode::Epoch => {
                // A newer incarnation of this Host id advertised: every lease is its, not ours.
                tracing::error!(error = %e, "this Host's generation was superseded");
                for r in host.residents() {
                    host.end_later(r, EndReason::Lost(format!("generation superseded: {e}")));
                }
            }
            Err(e) => {
                if e.code() == ErrorCode::Unavailable && !e.is_transient() {
                    // The store answers but refuses writes (a full disk): `/readyz` says so.
                    host.readiness().host_write_failed(e.to_string());
                }
                if Instant::now() >= give_up_at {
                    if !given_up {
                        given_up = true;
                        give_up(&host, &format!("heartbeats failed: {e}"));
                    }
                } else {
                    tracing::warn!(error = %e, "heartbeat failed; retrying");
                }
                next = next.min(Instant::now() + period / 4);
            }
        }
    }
}

/// Gives every residency up before its lease can lapse unrenewed, and says so on `/readyz`.
fn give_up(host: &Arc<Residency>, why: &str) {
    let residents = host.residents();
    tracing::error!(
        sessions = residents.len(),
        why,
        "no heartbeat renewed the leases in time; giving every residency up"
    );
    host.readiness().leases_unrenewed(why.to_owned());
    for r in residents {
        if r.state() == ResidentState::Resident {
            host.end_later(r, EndReason::Unrenewed(why.to_owned()));
        }
    }
}

/// Watches the runtime's persistence faults and liveness.
pub(crate) async fn supervise(ctx: SessionCtx) {
    let r = ctx.resident().clone();
    let mut alive = r.runtime.liveness.alive();
    let mut faults = r.runtime.faults.as_ref().map(|f| f.faults());
    loop {
        let fault = async {
            match faults.as_mut() {
                Some(rx) => {
                    let _ = rx.wait_for(|f| f.is_some()).await;
                    rx.borrow().clone()
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = r.cancel.cancelled() => return,
            f = fault => {
                let reason = f.map_or_else(|| "fault channel closed".to_owned(), |f| f.reason);
                ctx.persistence_fault(&reason);
                ctx.end_later(EndReason::Fault(format!("persistence fault: {reason}")));
                return;
            }
            changed = alive.changed() => {
                if changed.is_err() || !*alive.borrow() {
                    if r.state() == ResidentState::Resident {
                        ctx.end_later(EndReason::Fault("the runtime stopped".into()));
                    }
                    return;
                }
            }
        }
    }
}
