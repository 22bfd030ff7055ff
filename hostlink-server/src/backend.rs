//! The seam between the HostLink surface and the Host. Owns the [`LinkBackend`] trait the
//! Host implements, what a link tells it about itself ([`LinkCtx`]), how it refuses
//! ([`Refusal`]) and how it feeds a bound session's publications ([`SessionFeed`]). Never
//! contains Host logic: the link calls the backend only after its own checks (decoding,
//! foreign tenant, link bounds) have passed.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::value::RawValue;
use sessionstore::{CommandId, SessionId, TenantId};
use tokio::sync::broadcast;
use uuid::Uuid;

use hostlink::auth::AuthVerifier;
use hostlink::records::{
    AttachRequest, BindRequest, DrainObservation, DrainRequest, EnduringPublication,
    EphemeralPublication, HostLinkError, RegistryObservation, UnbindRequest,
};

/// One link's identity: a UUID (v7) minted when the WebSocket is accepted; also the
/// `client` of the connect reply.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId(Uuid);

impl LinkId {
    /// Mints a fresh id.
    pub fn mint() -> LinkId {
        LinkId(Uuid::now_v7())
    }

    /// The UUID.
    pub fn uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LinkId({})", self.0.hyphenated())
    }
}

/// What the backend learns about the link a request came on. The tenant is the
/// authenticated one: every request the backend sees names this tenant.
#[derive(Clone, Debug)]
pub struct LinkCtx {
    pub link: LinkId,
    pub tenant: TenantId,
    /// The principal the link's credential names (a JWT's `sub`): the actor of what the link
    /// does. `None` for an opaque token.
    pub principal: Option<String>,
    /// The connect command's `name` and `version` (the client's own words; informative only).
    pub client_name: Option<String>,
    pub client_version: Option<String>,
    /// The trace context the connect data named: every request of the link that names none
    /// of its own continues it.
    pub trace: Option<trace_context::TraceContext>,
}

impl LinkCtx {
    /// The actor what this link does is attributed to (see [`hostlink::auth::actor_of`]).
    pub fn actor(&self) -> String {
        hostlink::auth::actor_of(&self.tenant, self.principal.as_deref())
    }
}

/// Why the backend did not do what was asked.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Refusal {
    /// A placement outcome: answered as a *successful* RPC reply carrying the error record
    /// (for a delivery, whose reply has no data: Centrifuge error
    /// [`HostLinkErrorCode::reply_error_code`](hostlink::codes::HostLinkErrorCode::reply_error_code)
    /// with the code as message).
    HostLink(HostLinkError),
    /// A Host-side failure with no placement class: Centrifuge error 100 (retry is safe). The
    /// text is logged, never sent.
    Internal(String),
    /// The request is malformed in a way only the backend can see: Centrifuge error 107.
    BadRequest,
}

impl From<HostLinkError> for Refusal {
    fn from(e: HostLinkError) -> Self {
        Refusal::HostLink(e)
    }
}

/// A committed journal event (already projected: no private id) at its place in the
/// session's public stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamPublication {
    /// The Centrifuge offset: the record's ordinal among the session's public records (1 for
    /// the first, no gaps), counted in the durable journal, so every Host gives the same one.
    pub offset: u64,
    pub record: EnduringPublication,
}

/// A read of a session's durable public stream: the records after an offset, and where the
/// stream stands.
#[derive(Clone, Debug)]
pub struct StreamPage {
    /// The stream's epoch (it changes only if the public history were rewritten).
    pub epoch: String,
    /// The offset of the stream's last committed public record at the read (0: none yet).
    pub top: u64,
    /// The records asked for, in offset order, with no gap.
    pub records: Vec<Arc<StreamPublication>>,
}

/// One item of a session's live feed, in the order the Host committed or produced it.
#[derive(Clone, Debug)]
pub enum FeedItem {
    /// A committed journal event at its stream offset.
    Enduring(Arc<StreamPublication>),
    /// A live text delta (dropped unless the subscriber opted in).
    Ephemeral(Arc<EphemeralPublication>),
}

/// A bound session's live feed for one link. The Host keeps one `broadcast` sender per
/// resident session and hands each bind a receiver (`sender.subscribe()`), so a slow link
/// never slows the Host: a receiver that falls behind the ring is a slow consumer and its
/// link is disconnected (3008). Dropping the sender (the session's tail ended) ends every
/// binding for the session.
#[derive(Debug)]
pub struct SessionFeed {
    receiver: broadcast::Receiver<FeedItem>,
}

impl SessionFeed {
    /// Wraps a receiver of the session's feed.
    pub fn new(receiver: broadcast::Receiver<FeedItem>) -> SessionFeed {
        SessionFeed { receiver }
    }

    pub(crate) fn into_receiver(self) -> broadcast::Receiver<FeedItem> {
        self.receiver
    }
}

/// What an extension RPC answered.
/// What a subscription to a run's channel gets.
pub enum RunEvents {
    /// This Host hosts no runs.
    NotHosted,
    /// No such run for the link's tenant (another tenant's run reads the same).
    Unknown,
    /// The Host's live step events; the subscription keeps its run's.
    Live(broadcast::Receiver<hostlink::runs::RunEvent>),
    /// The store could not say.
    Failed(String),
}

pub enum ExtensionReply {
    /// The backend does not serve this method: Centrifuge error 104.
    NotFound,
    /// The reply data (raw JSON) or a refusal.
    Done(Result<Box<RawValue>, Refusal>),
}

/// The Host as the HostLink surface needs it.
///
/// Calls for one link are made one at a time, in the order its commands arrived. When a link
/// closes (the peer left, [`HostLinkHandle::close_all`](crate::HostLinkHandle::close_all))
/// the link stops waiting and drops the call's future, so every `async` method must be
/// cancel-safe: work that must finish (an attach's unwinding) belongs on a task of the
/// backend's own.
#[async_trait]
pub trait LinkBackend: Send + Sync + 'static {
    /// The connect reply's `version` (the Host's build).
    fn server_version(&self) -> String;

    /// Capability tokens advertised after the five reserved methods (e.g.
    /// `hostlink.command.gate_response`). A token is never dispatched as a method; a token
    /// that repeats a reserved method is not advertised.
    fn capability_tokens(&self) -> Vec<String>;

    /// False while the Host is closed or stopping: a new link is answered 503 before the
    /// upgrade. Existing links keep working (a drain is observed over them).
    fn accepting_links(&self) -> bool;

    /// Verifies tenant credentials.
    fn auth(&self) -> &dyn AuthVerifier;

    /// `hostlink.attach`. The request's tenant is the link's.
    async fn attach(
        &self,
        link: &LinkCtx,
        req: AttachRequest,
    ) -> Result<RegistryObservation, Refusal>;

    /// `hostlink.bind`: checks the request against the resident session and hands this link
    /// a feed of it. The request's tenant is the link's; the link's bounds were checked.
    async fn bind(&self, link: &LinkCtx, req: BindRequest) -> Result<SessionFeed, Refusal>;

    /// `hostlink.unbind`: idempotent, never releases residency. On `Ok` the link drops its
    /// binding.
    async fn unbind(&self, link: &LinkCtx, req: UnbindRequest) -> Result<(), Refusal>;

    /// `hostlink.drain` of a dedicated Host's fixed session. The link has already refused a
    /// request with no scope and one naming another tenant (`runtime_unavailable`); the
    /// backend applies the remaining scope rules.
    async fn drain(&self, link: &LinkCtx, req: DrainRequest) -> Result<DrainObservation, Refusal>;

    /// `hostlink.drain_status`: observe only (`runtime_unavailable` if no drain has begun).
    /// Same pre-checks as [`LinkBackend::drain`].
    async fn drain_status(
        &self,
        link: &LinkCtx,
        req: DrainRequest,
    ) -> Result<DrainObservation, Refusal>;

    /// A delivery (a publish on the session channel): wake the session's consumer. Only
    /// called for a session bound on this link.
    async fn deliver(
        &self,
        link: &LinkCtx,
        session: &SessionId,
        command: &CommandId,
    ) -> Result<(), Refusal>;

    /// Sessions whose tail ended (lost, refused or released): the link layer drops every
    /// binding for them on every link. Called once, when the service is built.
    fn route_invalidations(&self) -> broadcast::Receiver<(TenantId, SessionId)>;

    /// Reads the durable public stream of `session` of the link's tenant: the records after
    /// offset `after` (at most `limit`; 0 reads only the position), for recovery and history.
    /// The session need not be resident, only the tenant's: an unknown (or another tenant's)
    /// session is `runtime_unavailable`. `Ok(None)`: this backend keeps no durable stream
    /// (subscriptions are then live only and history is not available). The default keeps
    /// none.
    async fn stream_read(
        &self,
        link: &LinkCtx,
        session: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Option<StreamPage>, Refusal> {
        let _ = (link, session, after, limit);
        Ok(None)
    }

    /// Any other RPC method (not one of the five reserved methods, not a capability token),
    /// e.g. `run.start` on a Host advertising `hostlink.run`. The backend must apply the
    /// tenant scope itself. The default serves none.
    /// The live step events for a subscription of the link to `run`'s channel.
    async fn run_events(&self, link: &LinkCtx, run: &sessionstore::RunId) -> RunEvents {
        let _ = (link, run);
        RunEvents::NotHosted
    }

    async fn extension_rpc(
        &self,
        link: &LinkCtx,
        method: &str,
        data: Option<&RawValue>,
    ) -> ExtensionReply {
        let _ = (link, method, data);
        ExtensionReply::NotFound
    }
}
