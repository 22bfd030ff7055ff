//! The live tail of a resident session. One relay task per session projects each committed
//! public event (the same projection as durable journal pages) once and fans it out to every
//! subscriber; previews are passed through. A relay that falls behind or meets a body it
//! cannot project drops every route of the session, so viewers repair from the durable
//! journal instead of seeing a gap.

use std::sync::Arc;

use department::Preview;
use sessionstore::Store;
use tokio::sync::broadcast;

use crate::public_body::{PublicEventView, PublicJournal};
use crate::resident::Resident;
use crate::service::Core;

/// How many projected events a slow subscriber may fall behind.
pub const RELAY_BUFFER: usize = 1024;

/// A subscription to a resident session's live events.
pub struct SessionFeed {
    pub enduring: broadcast::Receiver<Arc<PublicEventView>>,
    pub previews: broadcast::Receiver<Preview>,
}

impl SessionFeed {
    pub(crate) fn new(_store: Store, r: &Resident) -> SessionFeed {
        SessionFeed {
            enduring: r.relay.subscribe(),
            previews: r.runtime.events.previews(),
        }
    }
}

/// Projects and relays committed events until the residency ends.
pub(crate) async fn relay(core: Arc<Core>, r: Arc<Resident>) {
    let mut committed = r.runtime.events.committed();
    let mut journal = PublicJournal::new(
        core.store.clone(),
        r.key.tenant.clone(),
        r.key.session.clone(),
        r.binding.clone(),
    );
    loop {
        let event = tokio::select! {
            _ = r.cancel.cancelled() => return,
            e = committed.recv() => e,
        };
        let event = match event {
            Ok(e) => e,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "live tail fell behind; dropping the session's routes"
                );
                let _ = core
                    .invalidations
                    .send((r.key.tenant.clone(), r.key.session.clone()));
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if r.relay.receiver_count() == 0 {
            continue;
        }
        if let Err(e) = journal.learn_to(event.seq).await {
            tracing::warn!(error = %e, "reading command identities failed; dropping the session's routes");
            let _ = core
                .invalidations
                .send((r.key.tenant.clone(), r.key.session.clone()));
            continue;
        }
        match journal.project(&event.body) {
            Ok(body) => {
                let _ = r.relay.send(Arc::new(PublicEventView {
                    seq: event.seq,
                    event_id: event.event.to_string(),
                    body,
                }));
            }
            Err(e) => {
                tracing::error!(error = %e, seq = event.seq, "a committed body could not be projected; dropping the session's routes");
                let _ = core
                    .invalidations
                    .send((r.key.tenant.clone(), r.key.session.clone()));
            }
        }
    }
}
