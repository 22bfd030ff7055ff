//! Upkeep: the Host's one heartbeat, and each residency's fault watch.
//!
//! The heartbeat is one store write per `registry_heartbeat`, whatever the number of resident
//! sessions: it publishes the advertisement and the charged weight, renews every live lease
//! this Host's generation holds and refreshes its registrations (see
//! `docs/decisions/2026-11-30-fleet-per-host-liveness.md`). A residency whose lease the
//! heartbeat did not renew was lost (taken by a successor, or lapsed) and is ended; when
//! heartbeats fail until the last renewed expiry passes, every residency is ended. The per-
//! session epochs stay the fence: the heartbeat only extends leases still held, never revives
//! one. The fault watch asks the residency owner to end a residency whose runtime is unsound.
//! Neither ends a residency itself, and neither writes anything once the Host stops.

use std::collections::HashSet;
use std::sync::Arc;

use sessionstore::{Clock, ErrorCode, HostHeartbeat, RenewedResidency, SystemClock};

use crate::residency::{EndReason, Residency, SessionCtx};
use crate::resident::ResidentState;

/// Heartbeats until the Host stops.
pub(crate) async fn heartbeat(host: Arc<Residency>, first_expiry_ms: i64) {
    let mut valid_until = first_expiry_ms;
    // After a failed heartbeat the next comes sooner (a quarter period), so a store that is
    // back within the leases' life renews them in time.
    let mut wait = host.config().registry_heartbeat;
    loop {
        tokio::select! {
            _ = host.shutdown().cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = host.config().registry_heartbeat;
        // Only residencies in the table before the write began are judged by its answer: one
        // attached meanwhile took its lease after the renewal statement ran.
        let before = host.residents();
        let accepting = !host.draining();
        let beat = HostHeartbeat {
            advertisement: host.advertisement(accepting),
            weight_used: host.weight_consumed(),
            retention: host.config().registry_retention,
        };
        match host.store().heartbeat(beat).await {
            Ok(report) => {
                valid_until = report.target.expires_at_ms;
                let renewed: HashSet<RenewedResidency> = report.renewed.into_iter().collect();
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
                        r.set_lease_expiry(valid_until);
                    } else if r.state() == ResidentState::Resident {
                        host.end_later(
                            r,
                            EndReason::Lost("the heartbeat found the lease lapsed or taken".into()),
                        );
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
                let now = SystemClock.now_ms();
                if now >= valid_until {
                    tracing::error!(error = %e, "heartbeats failed past the leases' expiry");
                    for r in host.residents() {
                        host.end_later(
                            r,
                            EndReason::Lost(format!(
                                "the leases expired while heartbeats failed: {e}"
                            )),
                        );
                    }
                } else {
                    tracing::warn!(error = %e, "heartbeat failed; retrying");
                    wait = host.config().registry_heartbeat / 4;
                }
            }
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
