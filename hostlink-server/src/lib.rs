//! The HostLink server side of a Host (the wire protocol itself is the `hostlink` crate): the
//! seam the Host implements ([`backend`]), the link bounds ([`options`]), and the WebSocket
//! surface: the axum [`Router`] serving `GET /hostlink/{tenant}`, the
//! links it accepts, and the [`HostLinkHandle`] its owner stops them with. Owns task tracking
//! (every link task, its reader, writer and subscriptions, and the route-invalidation
//! listener) so the owner can close every transport and wait. Never drains the Host and
//! never closes transports on its own initiative: the owner calls
//! [`HostLinkHandle::close_all`] after its drain, then [`HostLinkHandle::wait`].
//!
//! Building the service spawns the route-invalidation listener, so it must be built inside
//! a Tokio runtime. Setting `TCP_NODELAY` is the owner's listener's job.

pub mod backend;
mod closer;
mod connection;
mod encode;
pub mod options;
mod pump;
mod registry;
mod route;
mod transport;

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use backend::{
    ExtensionReply, FeedItem, LinkBackend, LinkCtx, LinkId, Refusal, SessionFeed, StreamPage,
    StreamPublication,
};
pub use connection::{RESERVED_METHODS, RESUBSCRIBE_BINDING_DROPPED, UNSUBSCRIBE_BINDING_DROPPED};
pub use encode::{ENDURING_RECORD, EPHEMERAL_RECORD, RECORD_TAG};
pub use options::{LinkConfig, LinkOptions, LinkOptionsError};

use hostlink::codes::Disconnect;
use registry::Registry;

/// The path every HostLink link arrives under; the one segment after it is the tenant.
pub const HOSTLINK_PATH_PREFIX: &str = "/hostlink/";
/// The axum route.
pub const HOSTLINK_ROUTE: &str = "/hostlink/{tenant}";

/// What every link of one service shares.
pub(crate) struct Core {
    /// Set when the owner stops: new links are refused (503) from then on, before the drain
    /// that precedes closing the open ones.
    pub(crate) refusing: std::sync::atomic::AtomicBool,
    pub(crate) config: LinkConfig,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tracker: TaskTracker,
    pub(crate) shutdown: CancellationToken,
}

/// The owner's handle: close every link, then wait for every task to finish.
#[derive(Clone)]
pub struct HostLinkHandle {
    core: Arc<Core>,
}

impl HostLinkHandle {
    /// Refuses every new link from now on (503 before the upgrade); links already open stay
    /// until [`HostLinkHandle::close_all`]. What a stopping owner calls first.
    pub fn refuse_new_links(&self) {
        self.core
            .refusing
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Refuses new links from now on (503 before the upgrade) and closes every live link
    /// with `disconnect` (e.g. [`Disconnect::SHUTDOWN`]). Call it after the drain: transports
    /// close last.
    pub fn close_all(&self, disconnect: Disconnect) {
        self.core.shutdown.cancel();
        for closer in self.core.registry.start_closing(disconnect) {
            closer.close(disconnect);
        }
    }

    /// Waits until every link task has finished (each closes within a bounded grace once
    /// closed). Returns at once for a service that was never used after `close_all`.
    pub async fn wait(&self) {
        self.core.tracker.close();
        self.core.tracker.wait().await;
    }

    /// How many bindings `tenant` holds across its links now.
    pub fn tenant_bindings(&self, tenant: &sessionstore::TenantId) -> usize {
        self.core.registry.tenant_bindings(tenant)
    }

    /// How many links are live now (handshaking or authenticated).
    pub fn live_links(&self) -> usize {
        self.core.registry.live_links()
    }
}

/// Builds the HostLink router and its handle. Must run inside a Tokio runtime.
pub fn hostlink_router<B: LinkBackend>(
    backend: Arc<B>,
    config: LinkConfig,
) -> (Router, HostLinkHandle) {
    let options = config.options();
    let registry = Arc::new(Registry::new(
        options.max_bindings_per_link,
        options.max_bindings_per_tenant,
        options.max_tenant_links,
    ));
    let core = Arc::new(Core {
        refusing: std::sync::atomic::AtomicBool::new(false),
        config,
        registry: registry.clone(),
        tracker: TaskTracker::new(),
        shutdown: CancellationToken::new(),
    });
    let invalidations = backend.route_invalidations();
    core.tracker.spawn(
        listen_for_invalidations(invalidations, registry, core.shutdown.clone())
            .instrument(tracing::info_span!("hostlink_route_invalidations")),
    );
    let state = route::RouteState {
        core: core.clone(),
        backend,
    };
    let router = Router::new()
        .route(HOSTLINK_ROUTE, get(route::accept::<B>))
        .with_state(Arc::new(state));
    (router, HostLinkHandle { core })
}

async fn listen_for_invalidations(
    mut invalidations: broadcast::Receiver<(sessionstore::TenantId, sessionstore::SessionId)>,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            next = invalidations.recv() => next,
        };
        match next {
            Ok((tenant, session)) => {
                tracing::debug!(tenant = %tenant, session = %session, "route invalidated");
                registry.invalidate_session(&tenant, &session);
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "route invalidations were missed: dropping every binding"
                );
                registry.invalidate_everything();
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
