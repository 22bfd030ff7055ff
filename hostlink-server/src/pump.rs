//! One subscription's pump: moves a bound session's feed into its link's outbound queue.
//! Owns the preview policy — deltas merged per stream in short flush windows, rate-limited
//! per link by a token bucket, always flushed before the next enduring record, dropped (never
//! retried) when over budget, with `gap` set on the next preview that does go out. Never
//! waits without bound: an enduring record that cannot be queued in time, or a feed that
//! overflowed, ends the link as slow (3008).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sessionstore::{SessionId, TenantId};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use super::closer::Closer;
use super::encode::{EPHEMERAL_RECORD, EnduringEncoder, RECORD_TAG};
use super::registry::Registry;
use super::transport::Outbound;
use crate::backend::{FeedItem, LinkId, StreamPublication};
use hostlink::codes::Disconnect;
use hostlink::frame::encode_publication_push;
use hostlink::records::{
    EphemeralPublication, MAX_PREVIEW_TEXT_BYTES, PreviewStream, ToolStepPreview,
};

/// A per-link byte budget for previews.
pub(crate) struct TokenBucket {
    rate_per_sec: f64,
    burst: f64,
    tokens: f64,
    refilled_at: Instant,
}

impl TokenBucket {
    pub(crate) fn new(rate_per_sec: u64, burst: usize) -> TokenBucket {
        TokenBucket {
            rate_per_sec: rate_per_sec as f64,
            burst: burst as f64,
            tokens: burst as f64,
            refilled_at: Instant::now(),
        }
    }

    /// Takes `bytes` from the budget if it holds them.
    pub(crate) fn try_take(&mut self, bytes: usize) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate_per_sec).min(self.burst);
        self.refilled_at = now;
        let want = bytes as f64;
        if self.tokens >= want {
            self.tokens -= want;
            true
        } else {
            false
        }
    }
}

/// Preview text waiting for its flush window.
struct PendingPreviews {
    /// Text deltas of one stream are merged; a tool step stands alone (with its call).
    segments: Vec<(PreviewStream, String, Option<ToolStepPreview>)>,
    bytes: usize,
    /// Text was dropped since the last preview that went out.
    gap: bool,
    flush_at: Option<Instant>,
}

/// Everything a pump needs.
pub(crate) struct Pump {
    pub(crate) link: LinkId,
    pub(crate) tenant: TenantId,
    pub(crate) session: SessionId,
    pub(crate) channel: String,
    pub(crate) feed: broadcast::Receiver<FeedItem>,
    pub(crate) previews: bool,
    /// With previews: reasoning deltas and tool steps too.
    pub(crate) reasoning: bool,
    pub(crate) tool_steps: bool,
    pub(crate) out: mpsc::Sender<Outbound>,
    pub(crate) closer: Arc<Closer>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) bucket: Arc<Mutex<TokenBucket>>,
    pub(crate) flush_interval: Duration,
    pub(crate) max_pending_bytes: usize,
    pub(crate) slow_consumer_timeout: Duration,
    /// Enduring records at or below this offset already went out (in the subscribe reply's
    /// recovered publications) or precede the subscription's position: not pushed again.
    pub(crate) sent_through: u64,
    pub(crate) stop: CancellationToken,
}

impl Pump {
    fn belongs(&self, tenant: &TenantId, session: &SessionId) -> bool {
        *tenant == self.tenant && *session == self.session
    }

    /// Whether this subscription asked for previews of this kind.
    fn wants(&self, preview: &EphemeralPublication) -> bool {
        self.previews
            && match preview.stream {
                PreviewStream::Text => true,
                PreviewStream::Reasoning => self.reasoning,
                PreviewStream::ToolStep => self.tool_steps,
            }
    }

    fn take_budget(&self, bytes: usize) -> bool {
        match self.bucket.lock() {
            Ok(mut b) => b.try_take(bytes),
            Err(poisoned) => poisoned.into_inner().try_take(bytes),
        }
    }

    fn hold(&self, pending: &mut PendingPreviews, preview: &EphemeralPublication) {
        let len = preview.text.len();
        if len == 0 {
            return;
        }
        if len > MAX_PREVIEW_TEXT_BYTES || pending.bytes + len > self.max_pending_bytes {
            pending.gap = true;
            return;
        }
        match pending.segments.last_mut() {
            Some((stream, text, None))
                if preview.tool.is_none()
                    && *stream == preview.stream
                    && text.len() + len <= MAX_PREVIEW_TEXT_BYTES =>
            {
                text.push_str(&preview.text);
            }
            _ => {
                pending
                    .segments
                    .push((preview.stream, preview.text.clone(), preview.tool.clone()))
            }
        }
        pending.bytes += len;
        if pending.flush_at.is_none() {
            pending.flush_at = Some(Instant::now() + self.flush_interval);
        }
    }

    /// Sends what is pending now; what the budget or the queue cannot take is dropped.
    fn flush(&self, pending: &mut PendingPreviews) {
        pending.flush_at = None;
        pending.bytes = 0;
        for (stream, text, tool) in pending.segments.drain(..) {
            let len = text.len();
            if !self.take_budget(len) {
                pending.gap = true;
                continue;
            }
            let record = EphemeralPublication {
                tenant_id: self.tenant.clone(),
                session_id: self.session.clone(),
                stream,
                text,
                gap: pending.gap,
                tool,
            };
            let push = encode_publication_push(
                &self.channel,
                &record.encode(),
                &[(RECORD_TAG, EPHEMERAL_RECORD)],
            );
            match self.out.try_send(Outbound::Message(push)) {
                Ok(()) => pending.gap = false,
                Err(_) => pending.gap = true,
            }
        }
    }

    async fn send_enduring(
        &self,
        encoder: &Arc<EnduringEncoder>,
        record: Arc<StreamPublication>,
    ) -> bool {
        // Room in the queue is the common case: no timer for it.
        let item = match self
            .out
            .try_send(Outbound::Enduring(encoder.clone(), record))
        {
            Ok(()) => return true,
            Err(TrySendError::Closed(_)) => return false,
            Err(TrySendError::Full(item)) => item,
        };
        match timeout(self.slow_consumer_timeout, self.out.send(item)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false,
            Err(_) => {
                tracing::info!("the outbound queue stayed full: the link is slow");
                self.closer.close(Disconnect::SLOW);
                false
            }
        }
    }

    /// Runs until stopped, the link closes, or the feed ends (then the binding is dropped).
    pub(crate) async fn run(mut self) {
        let encoder = Arc::new(EnduringEncoder::new(
            &self.channel,
            &self.tenant,
            &self.session,
        ));
        let mut pending = PendingPreviews {
            segments: Vec::new(),
            bytes: 0,
            gap: false,
            flush_at: None,
        };
        loop {
            let flush_at = pending.flush_at;
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                _ = async { if let Some(at) = flush_at { sleep_until(at).await } }, if flush_at.is_some() => {
                    self.flush(&mut pending);
                }
                item = self.feed.recv() => match item {
                    Ok(FeedItem::Enduring(record)) => {
                        if !self.belongs(&record.record.tenant_id, &record.record.session_id) {
                            tracing::error!("a feed carried another session's record; not relayed");
                            continue;
                        }
                        if record.offset <= self.sent_through {
                            continue;
                        }
                        self.flush(&mut pending);
                        if !self.send_enduring(&encoder, record).await {
                            return;
                        }
                    }
                    Ok(FeedItem::Ephemeral(preview)) => {
                        if self.wants(&preview) && self.belongs(&preview.tenant_id, &preview.session_id) {
                            self.hold(&mut pending, &preview);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::info!(missed, "the session feed overflowed: the link is slow");
                        self.closer.close(Disconnect::SLOW);
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        self.flush(&mut pending);
                        tracing::debug!("the session's feed ended: dropping the binding");
                        self.registry.invalidate_link_session(self.link, &self.session);
                        return;
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::ENDURING_RECORD;
    use hostlink::frame::{encode_publication, encode_push};
    use hostlink::records::EnduringPublication;
    use serde_json::value::RawValue;
    use sessionstore::EventId;
    use std::num::NonZeroU64;

    #[test]
    fn the_enduring_encoder_writes_what_the_generic_encoders_write() {
        let tenant = TenantId::new("tenant-1").unwrap();
        let session = SessionId::new("session-1").unwrap();
        let channel = hostlink::channel::session_channel(&tenant, &session);
        let encoder = EnduringEncoder::new(&channel, &tenant, &session);
        let bodies = [
            r#"{"type":"assistant_message","text":"caf\u00e9 \"quoted\" \n é"}"#,
            "{\n  \"kind\": \"applied\",\r\n  \"n\": [1, 2]\n}",
            "42",
            r#""text""#,
        ];
        for (i, body) in bodies.iter().enumerate() {
            for (seq, covered) in [(1, 0), (u64::MAX, u64::MAX), (17, 16)] {
                let record = EnduringPublication::new(
                    tenant.clone(),
                    session.clone(),
                    EventId::new(format!("event-{i}")).unwrap(),
                    NonZeroU64::new(seq).unwrap(),
                    covered,
                    RawValue::from_string((*body).to_owned()).unwrap(),
                )
                .unwrap();
                let expected = encode_push(
                    &channel,
                    &encode_publication(
                        &record.encode(),
                        Some(seq / 2 + 1),
                        &[(RECORD_TAG, ENDURING_RECORD)],
                    ),
                );
                let publication = StreamPublication {
                    offset: seq / 2 + 1,
                    record,
                };
                assert_eq!(encoder.encode(&publication), expected);
                assert!(!encoder.encode(&publication).contains(['\n', '\r']));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_gives_its_burst_then_its_rate() {
        let mut b = TokenBucket::new(100, 50);
        assert!(b.try_take(50));
        assert!(!b.try_take(1));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.try_take(10));
        assert!(!b.try_take(1));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(b.try_take(50));
        assert!(!b.try_take(1));
    }
}
