//! One direction of one proxied connection: a reader that takes chunks from the sender while
//! the direction flows, and a writer that delivers each chunk once it is due (its delay and
//! jitter), paced by the bandwidth limit, in order. Owns the chunks in flight between the two
//! (a bounded queue, so a slow or stalled direction pushes back on its sender); never closes a
//! socket (its caller does) and never panics on an I/O error (it returns it).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::settings::{Direction, Faults, LinkFault};

/// The largest chunk read at once.
const CHUNK: usize = 16 * 1024;
/// Chunks queued between reader and writer (at most this × [`CHUNK`] bytes in flight).
const QUEUE: usize = 32;
/// Under a bandwidth limit, bytes are written in slices of this much time's worth.
const PACE_SLICE: Duration = Duration::from_millis(20);

struct Chunk {
    read_at: Instant,
    /// This chunk's share of the jitter, in [0, 1).
    jitter_share: f64,
    bytes: Vec<u8>,
}

/// The proxy went away under this pump (its settings sender was dropped).
fn gone() -> io::Error {
    io::Error::other("the fault proxy stopped")
}

/// Copies `from` to `to` under the faults of direction `dir` (`Up` or `Down`) until `from`
/// ends; then shuts `to`'s write side down (a half-close travels on). Counts delivered bytes
/// in `delivered`. Returns the first I/O error of either side.
pub(super) async fn run<R, W>(
    mut from: R,
    mut to: W,
    dir: Direction,
    faults: watch::Receiver<Faults>,
    delivered: &AtomicU64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, mut rx) = mpsc::channel::<Chunk>(QUEUE);
    let mut reading = faults.clone();
    let reader = async move {
        loop {
            flowing(&mut reading, dir).await?;
            let mut buf = vec![0u8; CHUNK];
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), io::Error>(());
            }
            buf.truncate(n);
            let chunk = Chunk {
                read_at: Instant::now(),
                jitter_share: rand::random::<f64>(),
                bytes: buf,
            };
            if tx.send(chunk).await.is_err() {
                return Ok(());
            }
        }
        // `tx` is dropped here, so the writer delivers what is queued and then ends.
    };
    let mut writing = faults;
    let writer = async move {
        let mut pace = Instant::now();
        while let Some(chunk) = rx.recv().await {
            due(&mut writing, dir, &chunk).await?;
            let mut rest = &chunk.bytes[..];
            while !rest.is_empty() {
                flowing(&mut writing, dir).await?;
                let limit = writing.borrow().link(dir).bytes_per_second;
                let take = match limit {
                    Some(rate) => slice(rate).min(rest.len()),
                    None => rest.len(),
                };
                if limit.is_some() {
                    tokio::time::sleep_until(pace).await;
                }
                to.write_all(&rest[..take]).await?;
                delivered.fetch_add(take as u64, Ordering::Relaxed);
                if let Some(rate) = limit {
                    let cost = Duration::from_secs_f64(take as f64 / rate.max(1) as f64);
                    pace = pace.max(Instant::now()) + cost;
                }
                rest = &rest[take..];
            }
        }
        to.flush().await?;
        to.shutdown().await
    };
    tokio::try_join!(reader, writer).map(|_| ())
}

/// How many bytes a rate allows per [`PACE_SLICE`] (at least one).
fn slice(bytes_per_second: u64) -> usize {
    ((bytes_per_second as f64 * PACE_SLICE.as_secs_f64()) as usize).max(1)
}

/// Waits until direction `dir` is not stalled.
async fn flowing(faults: &mut watch::Receiver<Faults>, dir: Direction) -> io::Result<()> {
    loop {
        if !faults.borrow_and_update().link(dir).stalled {
            return Ok(());
        }
        faults.changed().await.map_err(|_| gone())?;
    }
}

/// Waits until `chunk` may be delivered: the direction flows and the chunk's delay (under the
/// settings in force now) has passed since it was read.
async fn due(
    faults: &mut watch::Receiver<Faults>,
    dir: Direction,
    chunk: &Chunk,
) -> io::Result<()> {
    loop {
        let link: LinkFault = *faults.borrow_and_update().link(dir);
        if link.stalled {
            faults.changed().await.map_err(|_| gone())?;
            continue;
        }
        let at = chunk.read_at + link.delay + link.jitter.mul_f64(chunk.jitter_share);
        if Instant::now() >= at {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            changed = faults.changed() => changed.map_err(|_| gone())?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_written_in_slices_of_a_fiftieth_of_a_second_and_never_of_nothing() {
        assert_eq!(slice(50_000), 1000);
        assert_eq!(slice(10), 1);
        assert_eq!(slice(0), 1);
    }
}
