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

use std::num::NonZeroU64;
use std::sync::Arc;

use serde_json::value::RawValue;
use tokio::sync::broadcast;

use crate::link::{FeedItem, StreamPublication};
use crate::residency::SessionCtx;
use hostlink::public_journal::PublicJournal;
use hostlink::records::{EnduringPublication, EphemeralPublication, PreviewStream};

/// How many feed items a slow link may fall behind before it is disconnected.
pub const RELAY_BUFFER: usize = 1024;

/// Projects and relays committed events and previews until the residency ends.
pub(crate) async fn relay(ctx: SessionCtx) {
    let r = ctx.resident().clone();
    let mut committed = r.runtime.events.committed();
    let mut previews = r.runtime.events.previews();
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
        tokio::select! {
            biased;
            _ = r.cancel.cancelled() => return,
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
                if r.relay.receiver_count() == 0 {
                    last_offset = last_offset.map(|o| o + 1);
                    continue;
                }
                let offset = match last_offset {
                    Some(o) => o + 1,
                    None => match journal.offset_at(event.seq).await {
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
                if let Err(e) = journal.learn_to(event.seq).await {
                    tracing::warn!(error = %e, "reading command identities failed; dropping the session's routes");
                    invalidate();
                    continue;
                }
                let publication = journal
                    .project(&event.body)
                    .map_err(|e| e.to_string())
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
                        let _ = r.relay.send(FeedItem::Enduring(Arc::new(StreamPublication {
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
            preview = previews.recv() => {
                let preview = match preview {
                    Ok(p) => p,
                    // Previews are never retried: a lag just loses text.
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => {
                        previews = r.runtime.events.previews();
                        continue;
                    }
                };
                if r.relay.receiver_count() == 0 || preview.delta.is_empty() {
                    continue;
                }
                let p = EphemeralPublication::delta(
                    r.key.tenant.clone(),
                    r.key.session.clone(),
                    PreviewStream::Text,
                    preview.delta,
                );
                let _ = r.relay.send(FeedItem::Ephemeral(Arc::new(p)));
            }
        }
    }
}
