//! How a link ends: once, with the first reason given. Every part of a link (reader, writer,
//! pump, registry eviction) holds the same [`Closer`]; none of them closes the socket itself.

use std::sync::OnceLock;

use hostlink::codes::Disconnect;
use tokio_util::sync::CancellationToken;

/// Ends a link once, with the first reason given.
pub(crate) struct Closer {
    token: CancellationToken,
    reason: OnceLock<Disconnect>,
}

impl Closer {
    pub(crate) fn new() -> Closer {
        Closer {
            token: CancellationToken::new(),
            reason: OnceLock::new(),
        }
    }

    /// Ends the link (the first reason wins).
    pub(crate) fn close(&self, disconnect: Disconnect) {
        let _ = self.reason.set(disconnect);
        self.token.cancel();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The reason the link ended (the peer going away if none was given).
    pub(crate) fn reason(&self) -> Disconnect {
        self.reason
            .get()
            .copied()
            .unwrap_or(Disconnect::CONNECTION_CLOSED)
    }

    pub(crate) async fn closed(&self) {
        self.token.cancelled().await
    }

    /// A token cancelled when the link ends (for the link's subordinate tasks).
    pub(crate) fn child_token(&self) -> CancellationToken {
        self.token.child_token()
    }
}
