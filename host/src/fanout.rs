//! A resident session's fan-out to its live viewers: one broadcast buffer, there only while
//! someone watches. The session's record (`resident`) holds it; the live tail's relay task
//! (`feed`) is its only sender, and attaches subscribe to it. Never projects or places a
//! record (that is the feed's work).

use std::sync::{Mutex, MutexGuard};

use hostlink_server::FeedItem;
use tokio::sync::broadcast;

/// How many feed items a slow link may fall behind before it is disconnected.
pub const RELAY_BUFFER: usize = 1024;

/// A session's fan-out to its live viewers. The buffer ([`RELAY_BUFFER`] slots, about 40 KiB)
/// exists only while someone watches: made by the first subscriber, dropped when the relay
/// next finds nobody listening. A resident session nobody watches holds none.
#[derive(Default)]
pub(crate) struct Relay {
    tx: Mutex<Option<broadcast::Sender<FeedItem>>>,
    /// Told of each new viewer, so the relay starts taking the runtime's previews (which it
    /// takes only while someone watches: the runtime's preview buffer exists only then).
    viewers: tokio::sync::Notify,
}

impl Relay {
    fn slot(&self) -> MutexGuard<'_, Option<broadcast::Sender<FeedItem>>> {
        match self.tx.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// A new viewer of the feed from now on (allocating the buffer when it is the first).
    pub fn subscribe(&self) -> broadcast::Receiver<FeedItem> {
        let rx = self
            .slot()
            .get_or_insert_with(|| broadcast::channel(RELAY_BUFFER).0)
            .subscribe();
        self.viewers.notify_one();
        rx
    }

    /// Waits for a viewer to subscribe (at once when one did since the last wait).
    pub async fn viewer_arrived(&self) {
        self.viewers.notified().await;
    }

    /// The sender while anyone listens; with nobody left, the buffer is dropped.
    pub fn listening(&self) -> Option<broadcast::Sender<FeedItem>> {
        let mut slot = self.slot();
        match slot.as_ref() {
            Some(tx) if tx.receiver_count() > 0 => Some(tx.clone()),
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    /// Whether a buffer is held now.
    pub fn allocated(&self) -> bool {
        self.slot().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_holds_no_buffer_until_someone_subscribes_and_drops_it_when_all_have_left() {
        let relay = Relay::default();
        assert!(!relay.allocated(), "nobody watches yet");
        assert!(relay.listening().is_none());
        assert!(!relay.allocated());
        let a = relay.subscribe();
        let b = relay.subscribe();
        assert!(relay.allocated());
        assert!(relay.listening().is_some());
        drop(a);
        assert!(relay.listening().is_some(), "one viewer is left");
        drop(b);
        assert!(relay.listening().is_none());
        assert!(!relay.allocated(), "the buffer went with the last viewer");
        // A later viewer gets a fresh buffer.
        let _c = relay.subscribe();
        assert!(relay.listening().is_some());
    }
}
