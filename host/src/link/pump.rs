//! One subscription's pump: moves a bound session's feed into its link's outbound queue.
//! Owns the preview policy — deltas merged per stream in short flush windows, rate-limited
//! per link by a token bucket, always flushed before the next enduring record, dropped (never
//! retried) when over budget, with `gap` set on the next preview that does go out. Never
//! waits without bound: an enduring record that cannot be queued in time, or a feed that
//! overflowed, ends the link as slow (3008).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sessionstore::{SessionId, TenantId};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use super::registry::Registry;
use super::transport::{Closer, Outbound};
use crate::link::backend::{FeedItem, LinkId};
use hostlink::codes::Disconnect;
use hostlink::frame::encode_publication_push;
use hostlink::json::push_json_string;
use hostlink::records::{
    EnduringPublication, EphemeralPublication, MAX_PREVIEW_TEXT_BYTES, PreviewStream,
};

/// The Centrifuge publication tag that names a push's record type.
pub const RECORD_TAG: &str = "record";
/// The tag value of an enduring record.
pub const ENDURING_RECORD: &str = "enduring_publication";
/// The tag value of a preview.
pub const EPHEMERAL_RECORD: &str = "ephemeral_publication";

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

/// Encodes one subscription's enduring pushes: byte for byte what
/// `encode_publication_push(channel, &record.encode(), &[(RECORD_TAG, ENDURING_RECORD)])`
/// gives, with everything fixed for the subscription (channel, tenant, session, tags) encoded
/// once. The pump hands the record itself to the writer ([`Outbound::Enduring`]), which
/// encodes it straight into the frame it goes out in: on a session with many links this is
/// the per-link hot path, so it costs one copy of the body and no allocation of its own.
pub(crate) struct EnduringEncoder {
    /// `{"push":{"channel":…,"pub":{"data":{"tenant_id":…,"session_id":…,"event_id":`
    head: String,
    /// `},"tags":{"record":"enduring_publication"}}}}`
    tail: String,
}

/// Room for `,"journal_seq":N,"covered_through":N,"body":` with two 20-digit numbers.
const ENDURING_MIDDLE_BYTES: usize = 80;

impl EnduringEncoder {
    pub(crate) fn new(channel: &str, tenant: &TenantId, session: &SessionId) -> EnduringEncoder {
        let mut head = String::from(r#"{"push":{"channel":"#);
        push_json_string(&mut head, channel);
        head.push_str(r#","pub":{"data":{"tenant_id":"#);
        push_json_string(&mut head, tenant.as_str());
        head.push_str(r#","session_id":"#);
        push_json_string(&mut head, session.as_str());
        head.push_str(r#","event_id":"#);
        let mut tail = String::from(r#"},"tags":{"#);
        push_json_string(&mut tail, RECORD_TAG);
        tail.push(':');
        push_json_string(&mut tail, ENDURING_RECORD);
        tail.push_str("}}}}");
        EnduringEncoder { head, tail }
    }

    /// About how many bytes the push for `record` takes (exact unless the event id needs
    /// escaping): for sizing frames and batches.
    pub(crate) fn encoded_len(&self, record: &EnduringPublication) -> usize {
        self.head.len()
            + record.event_id.as_str().len()
            + 2
            + ENDURING_MIDDLE_BYTES
            + record.body().get().len()
            + self.tail.len()
    }

    /// Appends the push for `record`, which belongs to the encoder's tenant and session.
    pub(crate) fn encode_into(&self, out: &mut String, record: &EnduringPublication) {
        let body = record.body().get();
        out.push_str(&self.head);
        push_json_string(out, record.event_id.as_str());
        let _ = write!(
            out,
            r#","journal_seq":{},"covered_through":{},"body":"#,
            record.journal_seq.get(),
            record.covered_through
        );
        // Batching is line-delimited: a raw line break (only ever insignificant whitespace in
        // valid JSON, and only the body can hold one) goes out as a space, as `one_line` does.
        if body.as_bytes().contains(&b'\n') || body.as_bytes().contains(&b'\r') {
            out.extend(body.chars().map(|c| match c {
                '\n' | '\r' => ' ',
                c => c,
            }));
        } else {
            out.push_str(body);
        }
        out.push_str(&self.tail);
    }

    #[cfg(test)]
    fn encode(&self, record: &EnduringPublication) -> String {
        let mut out = String::with_capacity(self.encoded_len(record));
        self.encode_into(&mut out, record);
        out
    }
}

/// Preview text waiting for its flush window.
struct PendingPreviews {
    segments: Vec<(PreviewStream, String)>,
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
    pub(crate) out: mpsc::Sender<Outbound>,
    pub(crate) closer: Arc<Closer>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) bucket: Arc<Mutex<TokenBucket>>,
    pub(crate) flush_interval: Duration,
    pub(crate) max_pending_bytes: usize,
    pub(crate) slow_consumer_timeout: Duration,
    pub(crate) stop: CancellationToken,
}

impl Pump {
    fn belongs(&self, tenant: &TenantId, session: &SessionId) -> bool {
        *tenant == self.tenant && *session == self.session
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
            Some((stream, text))
                if *stream == preview.stream && text.len() + len <= MAX_PREVIEW_TEXT_BYTES =>
            {
                text.push_str(&preview.text);
            }
            _ => pending
                .segments
                .push((preview.stream, preview.text.clone())),
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
        for (stream, text) in pending.segments.drain(..) {
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
        record: Arc<EnduringPublication>,
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
                        if !self.belongs(&record.tenant_id, &record.session_id) {
                            tracing::error!("a feed carried another session's record; not relayed");
                            continue;
                        }
                        self.flush(&mut pending);
                        if !self.send_enduring(&encoder, record).await {
                            return;
                        }
                    }
                    Ok(FeedItem::Ephemeral(preview)) => {
                        if self.previews && self.belongs(&preview.tenant_id, &preview.session_id) {
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
                let expected = encode_publication_push(
                    &channel,
                    &record.encode(),
                    &[(RECORD_TAG, ENDURING_RECORD)],
                );
                assert_eq!(encoder.encode(&record), expected);
                assert!(!encoder.encode(&record).contains(['\n', '\r']));
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
