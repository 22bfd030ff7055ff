//! The live tail of a resident session. One relay task per session merges the runtime's
//! committed events — each projected once (the same projection as durable journal pages) and
//! placed at its public stream offset — and its previews into one ordered feed, fanned out to
//! every bound link. A relay that falls behind, or meets a body it cannot project, drops every
//! route of the session so viewers repair from the durable journal instead of seeing a gap.
//!
//! Offsets come from the journal, never from this Host's memory alone: the first record the
//! relay places (and the first after any lag) takes its offset from the store (how many public
//! events the journal holds through it); each later one is the next, because the committed
//! feed carries every public event in journal order or reports the lag. So a client that moves
//! to another Host resumes at the same offsets.
//! A failed read of the command mapping is not such a gap: it is retried with a bounded backoff
//! until it succeeds.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use timing::Backoff;
use tokio::sync::broadcast;

use crate::failpoints::{self, steps};
pub use crate::fanout::RELAY_BUFFER;
use crate::residency::SessionCtx;
use department::{Preview, PreviewKind};
use hostlink::public_journal::PublicJournal;
use hostlink::records::{
    EnduringPublication, EphemeralPublication, PreviewStream, ToolPhase, ToolStepPreview,
};
use hostlink_server::{FeedItem, StreamPublication};

/// The first pause before a failed read of the command mapping is tried again; each further
/// failure doubles it, up to [`MAPPING_RETRY_MAX`].
pub const MAPPING_RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between two reads of the command mapping.
pub const MAPPING_RETRY_MAX: Duration = Duration::from_secs(2);
/// The pauses between reads of the command mapping (no jitter: one session's relay retries
/// alone).
const MAPPING_RETRY: Backoff = Backoff::new(MAPPING_RETRY_FIRST, MAPPING_RETRY_MAX);

/// Projects and relays committed events and previews until the residency ends.
pub(crate) async fn relay(ctx: SessionCtx) {
    let r = ctx.resident().clone();
    let mut committed = r.runtime.events.committed();
    // Taken only while someone watches (see `Relay`): a session nobody watches holds no
    // preview buffer in its runtime.
    let mut previews: Option<broadcast::Receiver<Preview>> = None;
    let mut journal = PublicJournal::new(
        ctx.store().clone(),
        r.key.tenant.clone(),
        r.key.session.clone(),
        r.binding.clone(),
    );
    let invalidate = || ctx.invalidate_routes();
    // The offset of the last committed public event, once learned from the journal.
    let mut last_offset: Option<u64> = None;
    loop {
        let watched = r.relay.allocated();
        if watched != previews.is_some() {
            previews = watched.then(|| r.runtime.events.previews());
        }
        tokio::select! {
            biased;
            _ = r.cancel.cancelled() => return,
            _ = r.relay.viewer_arrived() => continue,
            event = committed.recv() => {
                let event = match event {
                    Ok(e) => e,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "the live tail fell behind; dropping the session's routes");
                        last_offset = None;
                        invalidate();
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let Some(tx) = r.relay.listening() else {
                    last_offset = last_offset.map(|o| o + 1);
                    continue;
                };
                let offset = match last_offset {
                    Some(o) => o + 1,
                    // Store reads are boxed here and below: the relay rests small between events.
                    None => match Box::pin(journal.offset_at(event.seq)).await {
                        Ok(o) if o > 0 => o,
                        Ok(_) => {
                            tracing::error!(seq = event.seq, "a committed event is not in the journal; dropping the session's routes");
                            invalidate();
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "reading the stream offset failed; dropping the session's routes");
                            invalidate();
                            continue;
                        }
                    },
                };
                // Placed: whatever happens to this record's relay, the next one is the next offset.
                last_offset = Some(offset);
                // The mapping is needed to project this event: a failed read is retried (WARN
                // per attempt, bounded backoff) rather than skipping the event; the tail goes
                // on. Committed events queue meanwhile; a tail that falls too far behind is
                // dropped as lagged above.
                let mut retries = MAPPING_RETRY.retries();
                loop {
                    let read = if failpoints::fails(ctx.config().host_id.as_str(), steps::MAPPING_READ) {
                        Err("failpoint: the mapping read fails".to_owned())
                    } else {
                        Box::pin(journal.learn_to(event.seq)).await.map_err(|e| e.to_string())
                    };
                    let Err(e) = read else { break };
                    let pause = retries.next_wait();
                    let attempt = retries.taken();
                    tracing::warn!(error = %e, seq = event.seq, attempt, retry_in_ms = pause.as_millis() as u64, "reading command identities failed; retrying the publication");
                    tokio::select! {
                        _ = r.cancel.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
                let refused = failpoints::fails(ctx.config().host_id.as_str(), steps::PUBLISH);
                let publication = journal
                    .project(&event.body)
                    .map_err(|e| e.to_string())
                    .and_then(|body| {
                        if refused {
                            Err("failpoint: the publication is refused".to_owned())
                        } else {
                            Ok(body)
                        }
                    })
                    .and_then(|body| String::from_utf8(body).map_err(|e| e.to_string()))
                    .and_then(|text| RawValue::from_string(text).map_err(|e| e.to_string()))
                    .and_then(|raw| {
                        let seq = NonZeroU64::new(event.seq).ok_or_else(|| "sequence 0".to_owned())?;
                        EnduringPublication::new(
                            r.key.tenant.clone(),
                            r.key.session.clone(),
                            event.event.clone(),
                            seq,
                            event.seq,
                            raw,
                        )
                        .map_err(|e| e.to_string())
                    });
                match publication {
                    Ok(record) => {
                        let _ = tx.send(FeedItem::Enduring(Arc::new(StreamPublication {
                            offset,
                            record,
                        })));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, seq = event.seq, "a committed body could not be relayed; dropping the session's routes");
                        invalidate();
                    }
                }
            }
            preview = next_preview(&mut previews) => {
                let preview = match preview {
                    Ok(p) => p,
                    // Previews are never retried: a lag just loses text.
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => {
                        previews = None;
                        continue;
                    }
                };
                if preview.delta.is_empty() {
                    continue;
                }
                let Some(tx) = r.relay.listening() else {
                    continue;
                };
                let (tenant, session) = (r.key.tenant.clone(), r.key.session.clone());
                let p = match preview.kind {
                    PreviewKind::Text => {
                        EphemeralPublication::delta(tenant, session, PreviewStream::Text, preview.delta)
                    }
                    PreviewKind::Reasoning => EphemeralPublication::delta(
                        tenant,
                        session,
                        PreviewStream::Reasoning,
                        preview.delta,
                    ),
                    PreviewKind::ToolStarted { call_id, name } => EphemeralPublication::tool_step(
                        tenant,
                        session,
                        ToolStepPreview {
                            call_id,
                            name,
                            phase: ToolPhase::Started,
                            is_error: false,
                        },
                        preview.delta,
                    ),
                    PreviewKind::ToolFinished {
                        call_id,
                        name,
                        is_error,
                    } => EphemeralPublication::tool_step(
                        tenant,
                        session,
                        ToolStepPreview {
                            call_id,
                            name,
                            phase: ToolPhase::Finished,
                            is_error,
                        },
                        preview.delta,
                    ),
                };
                let _ = tx.send(FeedItem::Ephemeral(Arc::new(p)));
            }
        }
    }
}

/// The next preview, or never while none is taken.
async fn next_preview(
    previews: &mut Option<broadcast::Receiver<Preview>>,
) -> Result<Preview, broadcast::error::RecvError> {
    match previews {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_retry_pause_doubles_up_to_its_bound() {
        let mut retries = MAPPING_RETRY.retries();
        let seen: Vec<Duration> = (0..9).map(|_| retries.next_wait()).collect();
        assert_eq!(seen[0], MAPPING_RETRY_FIRST);
        assert_eq!(seen[1], MAPPING_RETRY_FIRST * 2);
        assert!(seen.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*seen.last().unwrap(), MAPPING_RETRY_MAX);
    }
}
