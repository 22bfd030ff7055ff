//! A residency's upkeep: one task renews the residency lease and refreshes the registration
//! every heartbeat; another watches the runtime's persistence faults and liveness. Either asks
//! the residency owner to end the residency when the lease is lost or the runtime is unsound;
//! neither ends it itself, and neither writes anything once its context is cancelled.

use sessionstore::{ErrorCode, ResidencyState};

use crate::residency::{EndReason, SessionCtx};
use crate::resident::ResidentState;

/// Renews the residency lease and refreshes the registration every heartbeat.
pub(crate) async fn renew(ctx: SessionCtx) {
    let r = ctx.resident().clone();
    let config = ctx.config().clone();
    loop {
        tokio::select! {
            _ = r.cancel.cancelled() => return,
            _ = tokio::time::sleep(config.registry_heartbeat) => {}
        }
        let grant = r.grant();
        match ctx
            .store()
            .renew_residency(&grant, config.registry_expiry)
            .await
        {
            Ok(g) => {
                if let Ok(mut held) = r.grant.lock() {
                    *held = g;
                }
            }
            Err(e)
                if matches!(
                    e.code(),
                    ErrorCode::Epoch | ErrorCode::ClaimLost | ErrorCode::NotFound
                ) =>
            {
                ctx.end_later(EndReason::Lost(format!("renewal refused: {e}")));
                return;
            }
            Err(e) => {
                let now = sessionstore::Clock::now_ms(&sessionstore::SystemClock);
                if now >= grant.expires_at_ms {
                    ctx.end_later(EndReason::Lost(format!(
                        "the lease expired while renewals failed: {e}"
                    )));
                    return;
                }
                tracing::warn!(error = %e, "residency renewal failed; retrying");
                continue;
            }
        }
        if r.state() == ResidentState::Resident
            && let Err(e) = ctx
                .store()
                .put_registration(ctx.registration(ResidencyState::Resident))
                .await
            && e.code() == ErrorCode::Epoch
        {
            ctx.end_later(EndReason::Lost(format!("registration fenced: {e}")));
            return;
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
