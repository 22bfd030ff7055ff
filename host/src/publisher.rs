//! The gate publisher: one task per resident session folds the runtime journal (gate opened
//! adds, gate resolved removes) and converges the store's gate projection on it, fenced by
//! this residency's grant: open what the journal holds and the projection lacks (oldest
//! first), resolve what the journal closed. It never re-opens a projected gate; a full
//! projection (16 open) is logged once and the gate waits for a slot; a superseded grant stops
//! the publisher for good. Committed events are only hints to run a pass.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use department::gates::GateEvent;
use sessionstore::{ErrorCode, EventId, GateId, GateState, OpenGate, RecordKind};
use tokio::sync::broadcast;
use tracing::Instrument;

use crate::failpoints::{self, steps};
use crate::residency::{EndReason, SessionCtx};
use crate::resident::Resident;

/// Per-kind deadlines for a gate that declares no timeout.
pub fn default_timeout(kind: &str) -> Duration {
    match kind {
        "permission" => Duration::from_secs(5 * 60),
        "open_url" => Duration::from_secs(3600),
        _ => Duration::from_secs(24 * 3600),
    }
}

/// Journal records read per page while folding. Small: each restore folds the whole journal,
/// and a buffer sized to a long journal is a large short-lived allocation that grows with it.
const FOLD_PAGE: usize = 128;

#[derive(Clone, Debug)]
struct JournalGate {
    event: EventId,
    seq: u64,
    kind: String,
    prompt: String,
    deadline_ms: i64,
}

struct Fold {
    folded: u64,
    open: BTreeMap<String, JournalGate>,
    resolved: BTreeMap<String, u64>,
}

/// Runs the publisher until the residency's tasks are cancelled.
pub(crate) async fn run(ctx: SessionCtx) {
    let r = ctx.resident().clone();
    let span = tracing::info_span!(
        target: trace_context::span::LONG_LIVED,
        parent: None,
        "gate_publisher",
        tenant = %r.key.tenant,
        session = %r.key.session,
        epoch = r.epoch.0
    );
    async move {
        let mut hints = r.runtime.events.committed();
        let mut fold = Fold {
            folded: 0,
            open: BTreeMap::new(),
            resolved: BTreeMap::new(),
        };
        let mut full_logged = false;
        // No periodic pass while idle: a pass runs on a gate event, and again after a
        // failed one (one reconcile interval later) until it succeeds.
        let retry_after = ctx.config().reconcile_interval;
        let mut retry = false;
        let mut due = true;
        loop {
            if due {
                retry = false;
                // Boxed: the resting task stays small while it waits for a gate event.
                match Box::pin(converge(&ctx, &r, &mut fold, &mut full_logged)).await {
                    Ok(changed) => {
                        if changed {
                            r.consumer.wake();
                        }
                    }
                    Err(Stopped::Superseded(reason)) => {
                        tracing::warn!(reason = %reason, "gate publisher superseded; stopping for good");
                        ctx.end_later(EndReason::Lost(reason));
                        return;
                    }
                    Err(Stopped::Retry(reason)) => {
                        tracing::warn!(reason = %reason, "gate pass failed; retrying");
                        retry = true;
                    }
                }
            }
            tokio::select! {
                _ = r.cancel.cancelled() => return,
                h = hints.recv() => match h {
                    // Only a gate event can change the projection.
                    Ok(event) => due = GateEvent::parse(&event.body).is_some() || retry,
                    Err(broadcast::error::RecvError::Lagged(_)) => due = true,
                    Err(broadcast::error::RecvError::Closed) => {
                        // The runtime is gone (the fault watch ends the residency); only a
                        // failed pass is still worth retrying.
                        tokio::select! {
                            _ = r.cancel.cancelled() => return,
                            _ = retry_wait(retry, retry_after) => due = true,
                        }
                    }
                },
                _ = retry_wait(retry, retry_after) => due = true,
            }
        }
    }
    .instrument(span)
    .await;
}

/// Sleeps `after` when a retry is due; otherwise never returns.
async fn retry_wait(retry: bool, after: std::time::Duration) {
    if retry {
        tokio::time::sleep(after).await;
    } else {
        std::future::pending::<()>().await;
    }
}

enum Stopped {
    Superseded(String),
    Retry(String),
}

async fn converge(
    ctx: &SessionCtx,
    r: &Resident,
    fold: &mut Fold,
    full_logged: &mut bool,
) -> Result<bool, Stopped> {
    let store = ctx.store();
    // Fold the journal from where the last pass stopped.
    loop {
        let page = store
            .journal_runtime_page(
                &r.key.tenant,
                r.binding.runtime_session_id,
                fold.folded,
                FOLD_PAGE,
            )
            .await
            .map_err(|e| Stopped::Retry(e.to_string()))?;
        for rec in &page {
            fold.folded = rec.seq;
            let RecordKind::Event {
                event, public_body, ..
            } = &rec.kind
            else {
                continue;
            };
            match GateEvent::parse(public_body) {
                Some(GateEvent::Opened {
                    gate_id,
                    kind,
                    prompt,
                    timeout_ms,
                }) => {
                    let timeout =
                        timeout_ms.map_or_else(|| default_timeout(&kind), Duration::from_millis);
                    let deadline_ms = rec
                        .written_at_ms
                        .saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX));
                    fold.open.insert(
                        gate_id,
                        JournalGate {
                            event: event.clone(),
                            seq: rec.seq,
                            kind,
                            prompt,
                            deadline_ms,
                        },
                    );
                }
                Some(GateEvent::Resolved { gate_id }) => {
                    fold.open.remove(&gate_id);
                    fold.resolved.insert(gate_id, rec.seq);
                }
                None => {}
            }
        }
        if page.len() < FOLD_PAGE {
            break;
        }
    }
    // Waiting-at-a-gate, read by the gauges at scrape time.
    r.gates_open.store(fold.open.len(), Ordering::SeqCst);
    let projected = store
        .gates(&r.key.tenant, &r.key.session, false)
        .await
        .map_err(|e| Stopped::Retry(e.to_string()))?;
    let mut changed = false;
    // Resolve what the journal closed.
    for g in projected.iter().filter(|g| g.state == GateState::Open) {
        if let Some(seq) = fold.resolved.get(g.gate.as_str()) {
            match store
                .resolve_gate(&r.key.tenant, &r.key.session, r.epoch, &g.gate, *seq)
                .await
            {
                Ok(_) => changed = true,
                Err(e) if e.code() == ErrorCode::Epoch => {
                    return Err(Stopped::Superseded(e.to_string()));
                }
                Err(e) => return Err(Stopped::Retry(e.to_string())),
            }
        }
    }
    // Open what the journal holds and the projection lacks, oldest first.
    let mut pending: Vec<(&String, &JournalGate)> = fold
        .open
        .iter()
        .filter(|(id, _)| !projected.iter().any(|p| p.gate.as_str() == id.as_str()))
        .collect();
    pending.sort_by_key(|(_, g)| g.seq);
    for (id, g) in pending {
        let Ok(gate) = GateId::new(id.clone()) else {
            tracing::warn!(gate = %id, "a journaled gate id is not a valid id; not published");
            continue;
        };
        let summary: String = g.prompt.chars().take(512).collect();
        match store
            .open_gate(
                &r.key.tenant,
                &r.key.session,
                r.epoch,
                OpenGate {
                    gate,
                    opened_event: g.event.clone(),
                    opened_seq: g.seq,
                    kind: g.kind.clone(),
                    prompt_summary: summary,
                    deadline_ms: g.deadline_ms,
                },
            )
            .await
        {
            Ok(_) => {
                changed = true;
                *full_logged = false;
            }
            Err(e) if e.code() == ErrorCode::Epoch => {
                return Err(Stopped::Superseded(e.to_string()));
            }
            Err(e) if e.code() == ErrorCode::State => {
                if !*full_logged {
                    tracing::warn!(gate = %id, "the gate projection is full (16 open); this gate waits for a slot");
                    *full_logged = true;
                }
                break;
            }
            Err(e) => return Err(Stopped::Retry(e.to_string())),
        }
    }
    failpoints::hit(ctx.config().host_id.as_str(), steps::GATE_PASS).await;
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_without_a_timeout_gets_its_kinds_default_deadline() {
        for (kind, wait) in [
            ("permission", 5 * 60),
            ("open_url", 3600),
            ("ask_user", 24 * 3600),
            ("form", 24 * 3600),
        ] {
            assert_eq!(default_timeout(kind), Duration::from_secs(wait), "{kind}");
        }
    }
}
