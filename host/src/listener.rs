//! The accept loop under the Host's one listener, and its bounds on what a connection may
//! cost before anyone is authenticated: a bound on concurrent connections (a permit is taken
//! as the socket is accepted, before a byte is read, and held by the connection — an upgraded
//! HostLink link included — until it closes; past the bound a connection is answered 503 and
//! closed gently: its write side ends first and what the client sent is read and dropped for a
//! moment, so the client reads the whole answer and an orderly end, never a reset that could
//! throw the answer away), a deadline for a request's header (a slowloris client is cut off), and an
//! idle timeout (a connection that sends nothing for that long is closed). Each bound counts
//! in `host_connections_cut_total{reason}` when it bites. Sets `TCP_NODELAY` on every socket.
//! Never routes or authenticates: the router it is given does.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus::IntCounter;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::options::{OptionsCode, OptionsError};
use timing::duration_text;

/// The listener's bounds (`[listener]` in a config file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerOptions {
    /// How long a client may take to send a request's whole header.
    #[serde(with = "duration_text")]
    pub header_read_timeout: Duration,
    /// How long a connection may send nothing at all before it is closed (an upgraded link
    /// answers the Host's pings, so it stays busy).
    #[serde(with = "duration_text")]
    pub idle_timeout: Duration,
    /// The most connections open at once, authenticated or not.
    pub max_connections: usize,
}

/// The largest connection bound accepted.
pub const MAX_CONNECTIONS_CEILING: usize = 1_000_000;

impl Default for ListenerOptions {
    fn default() -> Self {
        ListenerOptions {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 4096,
        }
    }
}

impl ListenerOptions {
    /// Checks each bound; `link_ping` is the HostLink ping interval, which the idle timeout
    /// must outlast (a quiet link is kept busy by its pings and their pongs).
    pub fn validate(&self, link_ping: Duration) -> Result<ListenerOptions, OptionsError> {
        let bounded = |field: &'static str, d: Duration| {
            if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
                Err(OptionsError::new(
                    if d < Duration::from_millis(100) {
                        OptionsCode::BelowBound
                    } else {
                        OptionsCode::AboveBound
                    },
                    field,
                    format!("is {d:?}; between 100ms and 1h"),
                ))
            } else {
                Ok(())
            }
        };
        bounded("header_read_timeout", self.header_read_timeout)?;
        bounded("idle_timeout", self.idle_timeout)?;
        if self.idle_timeout <= link_ping {
            return Err(OptionsError::new(
                OptionsCode::BelowBound,
                "idle_timeout",
                format!(
                    "is {:?}; it must outlast the HostLink ping interval {link_ping:?}",
                    self.idle_timeout
                ),
            ));
        }
        if self.max_connections == 0 {
            return Err(OptionsError::new(
                OptionsCode::NotPositive,
                "max_connections",
                "must be positive",
            ));
        }
        if self.max_connections > MAX_CONNECTIONS_CEILING {
            return Err(OptionsError::new(
                OptionsCode::AboveBound,
                "max_connections",
                format!("at most {MAX_CONNECTIONS_CEILING}"),
            ));
        }
        Ok(self.clone())
    }
}

/// Why a connection was cut, as `host_connections_cut_total` labels it.
pub const CUT_MAX_CONNECTIONS: &str = "max_connections";
pub const CUT_HEADER_TIMEOUT: &str = "header_timeout";
pub const CUT_IDLE_TIMEOUT: &str = "idle_timeout";

/// A connection's socket with the idle deadline and the connection permit: the deadline moves
/// with every byte read or written; the permit goes when the socket is dropped, whether the
/// connection ended as HTTP or as an upgraded link.
struct Guarded {
    tcp: TcpStream,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    cut: IntCounter,
    _permit: OwnedSemaphorePermit,
}

impl Guarded {
    fn touch(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.touch();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if self.deadline.as_mut().poll(cx).is_ready() {
                    self.cut.inc();
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the connection was idle past the idle timeout",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.tcp).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// What a connection past the bound is told before it is closed (written only if the socket
/// takes it at once: a refused client never holds the Host up).
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 33\r\nconnection: close\r\n\r\nthe Host is at its connection cap";

/// How many refused connections may be closing gently at once; past that a refusal is closed
/// at once, as a flood of them must not cost the Host more than a bounded set of descriptors.
const GENTLE_REFUSALS: usize = 256;

/// How long a refused client has, after the answer, to close its side before the Host closes
/// the connection regardless.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// Answers a connection past the bound with [`BUSY`] and closes it. Closing a socket whose
/// client's request is still unread makes the kernel send a reset, and a client that sees the
/// reset may lose the answer it had not read yet (a probe would report a broken connection,
/// not a full Host). So the write side is ended first and the client's bytes are read and
/// dropped until it closes its side or [`REFUSAL_LINGER`] passes, for at most
/// [`GENTLE_REFUSALS`] connections at a time.
fn refuse(tcp: TcpStream, refusals: &Arc<Semaphore>, connections: &TaskTracker) {
    let _ = tcp.try_write(BUSY);
    let Ok(gentle) = refusals.clone().try_acquire_owned() else {
        return;
    };
    connections.spawn(async move {
        let _gentle = gentle;
        close_gently(tcp).await;
    });
}

async fn close_gently(mut tcp: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if tcp.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        while let Ok(read) = tcp.read(&mut sink).await {
            if read == 0 {
                break;
            }
        }
    })
    .await;
}

/// Accepts until `stop` turns true, then asks every open HTTP connection to finish and
/// returns once they have (or `grace` has passed). Upgraded links are their owner's to close.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    options: ListenerOptions,
    metrics: Metrics,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) {
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let refusals = Arc::new(Semaphore::new(GENTLE_REFUSALS));
    let connections = TaskTracker::new();
    let cut = |reason: &str| metrics.connections_cut.with_label_values(&[reason]);
    loop {
        let tcp = tokio::select! {
            biased;
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was taken: pause
                    // briefly rather than spin.
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            cut(CUT_MAX_CONNECTIONS).inc();
            refuse(tcp, &refusals, &connections);
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY could not be set on a connection");
        }
        let io = Guarded {
            tcp,
            idle: options.idle_timeout,
            deadline: Box::pin(tokio::time::sleep(options.idle_timeout)),
            cut: cut(CUT_IDLE_TIMEOUT),
            _permit: permit,
        };
        let service = TowerToHyperService::new(app.clone());
        let header_cut = cut(CUT_HEADER_TIMEOUT);
        let header_read_timeout = options.header_read_timeout;
        let mut stopping = stop.clone();
        connections.spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let conn = builder
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades();
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = async { let _ = stopping.wait_for(|s| *s).await; } => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                if e.is_timeout() {
                    header_cut.inc();
                }
                tracing::debug!(error = %e, "a connection ended with an error");
            }
        });
    }
    connections.close();
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("some HTTP connections were still open at the end of the grace");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_validate_and_each_bound_is_checked() {
        let ping = Duration::from_secs(25);
        ListenerOptions::default().validate(ping).unwrap();
        let bad = |o: ListenerOptions| o.validate(ping).unwrap_err();
        let e = bad(ListenerOptions {
            max_connections: 0,
            ..ListenerOptions::default()
        });
        assert_eq!(
            (e.code, e.field),
            (OptionsCode::NotPositive, "max_connections")
        );
        let e = bad(ListenerOptions {
            header_read_timeout: Duration::from_millis(10),
            ..ListenerOptions::default()
        });
        assert_eq!(
            (e.code, e.field),
            (OptionsCode::BelowBound, "header_read_timeout")
        );
        let e = bad(ListenerOptions {
            idle_timeout: Duration::from_secs(20),
            ..ListenerOptions::default()
        });
        assert_eq!((e.code, e.field), (OptionsCode::BelowBound, "idle_timeout"));
    }
}
