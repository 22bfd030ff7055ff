//! The Host's one reconcile loop. Every `reconcile_interval` it asks the store which of the
//! sessions this Host holds have a command not yet ended and wakes only those consumers (one
//! indexed read, whatever the number of residents: idle sessions cost nothing), and it acts on
//! the placement assignments the fleet's reconciler wrote for this Host: each assigned session
//! is attached here, and the assignment is cleared whether the attach succeeded or not (a
//! refused one goes back to the reconciler). A store notification about a session not resident
//! here (an admission, or an assignment's wake-up) runs the assignment half at once. Nothing
//! here decides placement; it never attaches a session nobody assigned to this Host.

use std::sync::Arc;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use sessionstore::{PlacementRecord, Store};
use tokio::sync::broadcast;
use tracing::Instrument as _;

use crate::attach::AttachRequest;
use crate::error::HostError;
use crate::residency::Residency;
use crate::resident::{ResidentState, SessionKey};

/// How many assigned sessions one pass attaches at the same time.
const ATTACH_CONCURRENCY: usize = 4;

/// How the loop makes an assigned session resident here: the composition's attach, answering
/// whether this call took the session (false: it already was resident). Handed in by the
/// composition (`service`) that starts the loop, so the loop never reaches the composition.
pub(crate) type Attach =
    Box<dyn Fn(AttachRequest) -> BoxFuture<'static, Result<bool, HostError>> + Send + Sync>;

/// Runs the loop until the Host stops.
pub(crate) async fn reconcile(host: Arc<Residency>, attach: Attach) {
    let mut hints = Some(host.store().admissions());
    let mut tick = tokio::time::interval(host.config().reconcile_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wake_residents = tokio::select! {
            _ = host.shutdown().cancelled() => return,
            _ = tick.tick() => true,
            hint = next_hint(&mut hints) => match hint {
                Hint::About(key) => {
                    // A burst of hints runs one pass; one about a resident session runs none
                    // (the admission hints wake its consumer).
                    let mut elsewhere = host.resident(&key).is_none();
                    let mut lost = false;
                    while let Some(rx) = hints.as_mut() {
                        match rx.try_recv() {
                            Ok(a) => {
                                let key = SessionKey { tenant: a.tenant, session: a.session };
                                elsewhere |= host.resident(&key).is_none();
                            }
                            Err(broadcast::error::TryRecvError::Lagged(_)) => lost = true,
                            Err(_) => break,
                        }
                    }
                    if !elsewhere && !lost {
                        continue;
                    }
                    lost
                }
                Hint::Lost => true,
                Hint::Closed => {
                    hints = None;
                    continue;
                }
            },
        };
        if !host.started() {
            continue;
        }
        if wake_residents {
            wake_sessions_with_work(&host).await;
        }
        if !host.draining() {
            act_on_assignments(&attach, &host).await;
        }
    }
}

enum Hint {
    /// About one session (maybe assigned to this Host).
    About(SessionKey),
    /// Hints were lost: do a whole pass.
    Lost,
    Closed,
}

async fn next_hint(hints: &mut Option<broadcast::Receiver<sessionstore::Admission>>) -> Hint {
    let Some(rx) = hints.as_mut() else {
        return std::future::pending().await;
    };
    match rx.recv().await {
        Ok(a) => Hint::About(SessionKey {
            tenant: a.tenant,
            session: a.session,
        }),
        Err(broadcast::error::RecvError::Lagged(_)) => Hint::Lost,
        Err(broadcast::error::RecvError::Closed) => Hint::Closed,
    }
}

async fn wake_sessions_with_work(host: &Residency) {
    let config = host.config();
    match host
        .store()
        .sessions_with_work(&config.host_id, host.generation())
        .await
    {
        Ok(keys) => {
            for (tenant, session) in keys {
                if let Some(r) = host.resident(&SessionKey { tenant, session })
                    && r.state() == ResidentState::Resident
                {
                    r.consumer.wake();
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "reading the sessions with work failed"),
    }
}

async fn act_on_assignments(attach: &Attach, host: &Residency) {
    let config = host.config();
    let assigned = match host
        .store()
        .placements_for(&config.host_id, host.generation())
        .await
    {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "reading this Host's assignments failed");
            return;
        }
    };
    futures::stream::iter(assigned.into_iter().take(config.reconcile_batch))
        .for_each_concurrent(ATTACH_CONCURRENCY, |p| {
            let span = tracing::info_span!("assignment", tenant = %p.tenant, session = %p.session, leader_epoch = p.leader_epoch);
            take_assignment(attach, host.store(), p).instrument(span)
        })
        .await;
}

async fn take_assignment(attach: &Attach, store: &Store, p: PlacementRecord) {
    let outcome = match store.session(&p.tenant, &p.session).await {
        Ok(session) => {
            attach(AttachRequest {
                tenant: p.tenant.clone(),
                session: p.session.clone(),
                agent: session.agent,
                compatibility: Some(session.compatibility),
                // An orphan may never have had a conversation (created, admitted, never
                // attached): a create restores one when the journal holds it, and only a
                // create may start one.
                mode: department::LaunchMode::Create,
                actor: Some("fleet-reconciler".into()),
                trace: None,
            })
            .await
        }
        Err(e) => Err(HostError::from(e)),
    };
    match &outcome {
        Ok(true) => tracing::info!("attached an assigned session"),
        Ok(false) => tracing::debug!("an assigned session was already resident here"),
        Err(e) => tracing::warn!(error = %e, "an assigned session could not be attached here"),
    }
    if let Err(e) = store.clear_placement(&p.tenant, &p.session, &p.host).await {
        tracing::warn!(error = %e, "clearing an assignment failed; it lapses on its own");
    }
}
