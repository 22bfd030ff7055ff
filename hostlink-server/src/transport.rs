//! One link's WebSocket transport: the reader (frames in, commands to the link, pongs
//! recorded), the writer (the bounded outbound queue out, what is queued written together and
//! flushed once, one WebSocket message per reply or push, enduring records encoded straight
//! into their message; the application ping and the pong deadline; the close frame last).
//!
//! Outbound messages are never joined into one multi-line frame: the official JavaScript SDK
//! dispatches the lines of one frame over several promise turns, so a second frame arriving in
//! the same tick is dispatched between them and the application sees publications out of
//! order. One line per message keeps every SDK's order; the writes still share one flush. The link ends through its [`Closer`]. Never interprets a command and never buffers without bound: a full
//! queue or a stalled socket ends the link as slow.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use super::closer::Closer;
use super::encode::EnduringEncoder;
use crate::backend::StreamPublication;
use hostlink::codes::Disconnect;
use hostlink::frame::{
    Command, FrameError, Inbound, MAX_OUTBOUND_BATCH_BYTES, MAX_OUTBOUND_BATCH_MESSAGES, PING,
    decode_frame,
};

/// How long closing may take: writing what is owed, the close frame, and waiting for the
/// client's close frame in answer.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// What the link hands its writer.
pub(crate) enum Outbound {
    /// One encoded reply or push.
    Message(String),
    /// An enduring record on one subscription, encoded by the writer straight into the frame
    /// it goes out in.
    Enduring(Arc<EnduringEncoder>, Arc<StreamPublication>),
    /// The connect reply is queued: start pinging.
    StartHeartbeat,
}

/// The application heartbeat's shared state.
pub(crate) struct Heartbeat {
    pongs: AtomicU64,
    connected: AtomicBool,
}

impl Heartbeat {
    pub(crate) fn new() -> Heartbeat {
        Heartbeat {
            pongs: AtomicU64::new(0),
            connected: AtomicBool::new(false),
        }
    }

    pub(crate) fn set_connected(&self) {
        self.connected.store(true, Ordering::Release);
    }

    fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    fn pong(&self) {
        self.pongs.fetch_add(1, Ordering::AcqRel);
    }

    fn pongs(&self) -> u64 {
        self.pongs.load(Ordering::Acquire)
    }
}

/// How large a message the WebSocket layer itself accepts for a link whose limit is
/// `max_frame_bytes`: twice that (within the frame ceiling's double), so every message up to it
/// reaches [`decode_frame`], whose typed [`FrameError::TooLarge`] decides `message_too_big`.
/// The transport's own limit stays a bound on memory, never the place a refusal is decided.
pub(crate) fn transport_ceiling(max_frame_bytes: usize) -> usize {
    max_frame_bytes
        .saturating_mul(2)
        .min(hostlink::frame::MAX_FRAME_BYTES_CEILING.saturating_mul(2))
}

/// How a failed read ends the link: an I/O error is the connection going away; a message
/// beyond [`transport_ceiling`] is `message too big` (1009), the same close a message between
/// the limit and the ceiling gets from the decoder, so a client sees one code for "too large"
/// however large it was; anything else is the peer breaking the transport's rules.
///
/// The WebSocket library's error is recognised by its type, at the version axum itself uses
/// (the workspace pins one `tungstenite`); should the two ever part, the capacity case would
/// read as a bad request, and `hostlink_surface`'s oversized-message test fails.
pub(crate) fn read_failure(error: &axum::Error) -> Disconnect {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<std::io::Error>() {
            return Disconnect::CONNECTION_CLOSED;
        }
        if let Some(tungstenite::Error::Capacity(_)) = e.downcast_ref::<tungstenite::Error>() {
            return Disconnect::MESSAGE_TOO_BIG;
        }
        source = e.source();
    }
    Disconnect::BAD_REQUEST
}

/// Reads frames until the peer closes, the link closes (then only the peer's close frame is
/// awaited) or `stop` fires. Commands go to the link in order; pongs are recorded here so a
/// slow backend call never looks like a missed pong.
pub(crate) async fn read_loop(
    mut stream: SplitStream<WebSocket>,
    commands: mpsc::Sender<Command>,
    closer: Arc<Closer>,
    heartbeat: Arc<Heartbeat>,
    max_frame_bytes: usize,
    stop: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            next = stream.next() => next,
        };
        let message = match next {
            None => {
                closer.close(Disconnect::CONNECTION_CLOSED);
                break;
            }
            Some(Err(e)) => {
                let disconnect = read_failure(&e);
                tracing::debug!(error = %e, reason = disconnect.reason, "the WebSocket read failed");
                closer.close(disconnect);
                break;
            }
            Some(Ok(m)) => m,
        };
        if closer.is_closed() {
            // Closing: only the peer's close frame matters now.
            continue;
        }
        match message {
            Message::Text(text) => {
                let inbound = match decode_frame(text.as_str().as_bytes(), max_frame_bytes) {
                    Ok(inbound) => inbound,
                    Err(FrameError::TooLarge(_)) => {
                        closer.close(Disconnect::MESSAGE_TOO_BIG);
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "an undecodable frame");
                        closer.close(Disconnect::BAD_REQUEST);
                        continue;
                    }
                };
                for item in inbound {
                    match item {
                        Inbound::Pong if heartbeat.connected() => heartbeat.pong(),
                        Inbound::Pong => {
                            closer.close(Disconnect::BAD_REQUEST);
                            break;
                        }
                        Inbound::Command(command) => {
                            let sent = tokio::select! {
                                biased;
                                _ = closer.closed() => false,
                                r = commands.send(command) => r.is_ok(),
                            };
                            if !sent {
                                break;
                            }
                        }
                    }
                }
            }
            Message::Binary(_) => {
                tracing::debug!("a binary frame on a JSON link");
                closer.close(Disconnect::BAD_REQUEST);
            }
            Message::Ping(_) | Message::Pong(_) => {}
            Message::Close(_) => closer.close(Disconnect::CONNECTION_CLOSED),
        }
    }
}

/// Writes to the socket with a deadline; false when the deadline passed or the socket failed.
async fn write_until(
    sink: &mut SplitSink<WebSocket, Message>,
    message: Message,
    deadline: Instant,
) -> Result<(), WriteFailure> {
    match timeout_at(deadline, sink.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(WriteFailure::Broken),
        Err(_) => Err(WriteFailure::Stalled),
    }
}

enum WriteFailure {
    Broken,
    Stalled,
}

/// About how many bytes `item` takes in a frame, its separator included.
fn frame_bytes(item: &Outbound) -> usize {
    match item {
        Outbound::Message(m) => m.len() + 1,
        Outbound::Enduring(encoder, record) => encoder.encoded_len(record) + 1,
        Outbound::StartHeartbeat => 0,
    }
}

/// The text of one queued item (nothing for the heartbeat marker).
fn message_text(item: Outbound) -> Option<String> {
    match item {
        Outbound::Message(m) => Some(m),
        Outbound::Enduring(encoder, record) => {
            let mut text = String::with_capacity(encoder.encoded_len(&record));
            encoder.encode_into(&mut text, &record);
            Some(text)
        }
        Outbound::StartHeartbeat => None,
    }
}

/// Writes `items` (drained) as one WebSocket message each and flushes once, with a deadline.
async fn write_all_until(
    sink: &mut SplitSink<WebSocket, Message>,
    items: &mut Vec<Outbound>,
    deadline: Instant,
) -> Result<(), WriteFailure> {
    let write = async {
        for item in items.drain(..) {
            if let Some(text) = message_text(item) {
                sink.feed(Message::Text(Utf8Bytes::from(text))).await?;
            }
        }
        sink.flush().await
    };
    match timeout_at(deadline, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(WriteFailure::Broken),
        Err(_) => Err(WriteFailure::Stalled),
    }
}

/// Timing the writer runs under.
pub(crate) struct WriterTiming {
    pub(crate) ping_interval: Duration,
    pub(crate) pong_timeout: Duration,
    pub(crate) slow_consumer_timeout: Duration,
}

/// Drains the outbound queue into the socket (what is already queued written as separate
/// messages and flushed once), sends the
/// application ping and enforces the pong deadline; when the link closes, writes what is
/// owed (not for a slow link), then the close frame, then waits for the reader to finish.
pub(crate) async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    mut queue: mpsc::Receiver<Outbound>,
    closer: Arc<Closer>,
    heartbeat: Arc<Heartbeat>,
    timing: WriterTiming,
    reader_done: CancellationToken,
    stop_reader: CancellationToken,
) {
    let mut next_ping: Option<Instant> = None;
    let mut pong_due: Option<(Instant, u64)> = None;
    let mut batch: Vec<Outbound> = Vec::new();
    loop {
        tokio::select! {
            biased;
            _ = closer.closed() => break,
            _ = async { if let Some((at, _)) = pong_due { sleep_until(at).await } }, if pong_due.is_some() => {
                if let Some((_, pongs_at_ping)) = pong_due.take()
                    && heartbeat.pongs() <= pongs_at_ping
                {
                    closer.close(Disconnect::NO_PONG);
                    break;
                }
            }
            _ = async { if let Some(at) = next_ping { sleep_until(at).await } }, if next_ping.is_some() => {
                let now = Instant::now();
                let deadline = now + timing.slow_consumer_timeout;
                match write_until(&mut sink, Message::Text(Utf8Bytes::from_static(PING)), deadline).await {
                    Ok(()) => {}
                    Err(WriteFailure::Stalled) => { closer.close(Disconnect::SLOW); break; }
                    Err(WriteFailure::Broken) => { closer.close(Disconnect::CONNECTION_CLOSED); break; }
                }
                if pong_due.is_none() {
                    pong_due = Some((now + timing.pong_timeout, heartbeat.pongs()));
                }
                next_ping = Some(now + timing.ping_interval);
            }
            item = queue.recv() => {
                let Some(item) = item else { break };
                let mut start_heartbeat = false;
                let mut bytes = 0usize;
                let mut pending = Some(item);
                while let Some(item) = pending.take() {
                    match item {
                        Outbound::StartHeartbeat => start_heartbeat = true,
                        item => {
                            bytes += frame_bytes(&item);
                            batch.push(item);
                        }
                    }
                    if batch.len() < MAX_OUTBOUND_BATCH_MESSAGES && bytes < MAX_OUTBOUND_BATCH_BYTES {
                        pending = queue.try_recv().ok();
                    }
                }
                if !batch.is_empty() {
                    let deadline = Instant::now() + timing.slow_consumer_timeout;
                    let write = write_all_until(&mut sink, &mut batch, deadline);
                    let outcome = tokio::select! {
                        biased;
                        r = write => Some(r),
                        _ = closer.closed() => None,
                    };
                    match outcome {
                        None | Some(Ok(())) => {}
                        Some(Err(WriteFailure::Stalled)) => { closer.close(Disconnect::SLOW); break; }
                        Some(Err(WriteFailure::Broken)) => { closer.close(Disconnect::CONNECTION_CLOSED); break; }
                    }
                }
                // A zero interval is a heartbeat turned off: no ping, so no pong is awaited.
                if start_heartbeat && next_ping.is_none() && !timing.ping_interval.is_zero() {
                    next_ping = Some(Instant::now() + timing.ping_interval);
                }
            }
        }
    }
    let disconnect = closer.reason();
    let deadline = Instant::now() + CLOSE_GRACE;
    let mut healthy = true;
    if disconnect != Disconnect::CONNECTION_CLOSED {
        if disconnect != Disconnect::SLOW {
            // Replies already queued before the close are owed to the client.
            let mut owed = Vec::new();
            while let Ok(item) = queue.try_recv() {
                if !matches!(item, Outbound::StartHeartbeat) {
                    owed.push(item);
                }
            }
            if write_all_until(&mut sink, &mut owed, deadline)
                .await
                .is_err()
            {
                healthy = false;
            }
        }
        if healthy {
            let frame = CloseFrame {
                code: disconnect.code,
                reason: Utf8Bytes::from_static(disconnect.reason),
            };
            healthy = write_until(&mut sink, Message::Close(Some(frame)), deadline)
                .await
                .is_ok();
        }
    }
    queue.close();
    if healthy && disconnect != Disconnect::MESSAGE_TOO_BIG {
        // Wait for the client's close frame (the reader ends on it), within the grace.
        let _ = timeout_at(deadline, reader_done.cancelled()).await;
    }
    stop_reader.cancel();
    let _ = timeout_at(Instant::now() + Duration::from_millis(100), sink.close()).await;
}
