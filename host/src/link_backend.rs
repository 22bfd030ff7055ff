//! The Host behind HostLink: the [`LinkBackend`] implementation on a [`Service`]. Owns the
//! checks that need the Host's state — host id and generation (before any lease is taken),
//! residency and epoch for bind, the drain scope rules of a dedicated Host — and the mapping of
//! Host refusals to HostLink error records. The link layer has already authenticated the
//! tenant, decoded the records strictly and refused foreign tenants.

use std::num::NonZeroU64;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use department::LaunchMode;
use sessionstore::{CommandId, CompatibilityId, Placement, SessionId, TenantId};
use tokio::sync::broadcast;

use crate::attach::AttachRequest as HostAttach;
use crate::error::HostError;
use crate::resident::ResidentState;
use crate::service::{Observation, Service};
use crate::stream::{DEFAULT_READER_SESSIONS, StreamReadError, StreamReader};
use hostlink::auth::AuthVerifier;
use hostlink::records::{
    AttachMode, AttachRequest, BindRequest, DrainObservation, DrainRequest, DrainState,
    HostLinkError, RegistryObservation, SessionScope, UnbindRequest, V1,
};
use hostlink::timestamp::Timestamp;
use hostlink_server::backend::{LinkBackend, LinkCtx, Refusal, SessionFeed, StreamPage};

/// The capability tokens this Host advertises after the reserved methods.
pub const CAPABILITIES: [&str; 3] = [
    "hostlink.command.gate_response",
    "hostlink.attribution.principal",
    "hostlink.payload.reference",
];

struct LinkDrain {
    tenant: TenantId,
    session: SessionId,
    generation: u64,
    done: bool,
}

/// A Service as HostLink sees it.
pub struct HostBackend {
    service: Service,
    extensions: Vec<std::sync::Arc<dyn crate::Extension>>,
    auth: Box<dyn AuthVerifier>,
    streams: StreamReader,
    drain: std::sync::Arc<Mutex<Option<LinkDrain>>>,
    drains: AtomicU64,
}

impl HostBackend {
    /// The backend of `service`, verifying tenants with `auth`.
    pub fn new(service: Service, auth: Box<dyn AuthVerifier>) -> HostBackend {
        HostBackend {
            streams: StreamReader::new(service.store().clone(), DEFAULT_READER_SESSIONS),
            service,
            extensions: Vec::new(),
            auth,
            drain: std::sync::Arc::default(),
            drains: AtomicU64::new(0),
        }
    }

    /// Serves each extension's methods (and advertises its capability token).
    pub fn with_extensions(
        mut self,
        extensions: Vec<std::sync::Arc<dyn crate::Extension>>,
    ) -> HostBackend {
        self.extensions = extensions;
        self
    }

    fn generation(&self) -> Option<NonZeroU64> {
        NonZeroU64::new(self.service.generation())
    }

    /// Host id and generation must name this Host's current incarnation.
    fn check_host(
        &self,
        host: &sessionstore::HostId,
        generation: NonZeroU64,
    ) -> Result<(), Refusal> {
        if host != &self.service.config().host_id || Some(generation) != self.generation() {
            return Err(HostLinkError::NotAdmitting.into());
        }
        Ok(())
    }

    fn observation(&self, o: &Observation) -> Result<RegistryObservation, Refusal> {
        let nz = |v: u64| {
            NonZeroU64::new(v)
                .ok_or_else(|| Refusal::Internal(format!("zero in an observation: {v}")))
        };
        Ok(RegistryObservation {
            version: V1,
            tenant_id: o.tenant.clone(),
            session_id: o.session.clone(),
            host_id: o.host.clone(),
            host_generation: nz(o.host_generation)?,
            agent_id: o.agent.clone(),
            runtime_compatibility_id: o.compatibility.clone(),
            placement: o.placement,
            internal_endpoint: o.internal_endpoint.clone(),
            residency: o.residency,
            accepting: o.accepting,
            lease_epoch: nz(o.lease_epoch.0)?,
            observed_at: Timestamp::from_unix_millis(o.observed_at_ms)
                .ok_or_else(|| Refusal::Internal("observed_at out of range".into()))?,
            expires_at: Timestamp::from_unix_millis(o.expires_at_ms)
                .ok_or_else(|| Refusal::Internal("expires_at out of range".into()))?,
        })
    }

    /// The drain scope rules: a pooled Host answers no HostLink drain; a dedicated Host's
    /// fixed session only, for the tenant that holds it — refused identically to "nothing
    /// attached yet" otherwise.
    fn scoped(&self, link: &LinkCtx, req: &DrainRequest) -> Result<SessionScope, Refusal> {
        self.check_host(&req.host_id, req.host_generation)?;
        let unavailable = || Refusal::HostLink(HostLinkError::RuntimeUnavailable);
        let cfg = self.service.config();
        if cfg.placement != Placement::Dedicated {
            return Err(unavailable());
        }
        let scope = req.scope.clone().ok_or_else(unavailable)?;
        if scope.tenant_id != link.tenant || cfg.fixed_session.as_ref() != Some(&scope.session_id) {
            return Err(unavailable());
        }
        Ok(scope)
    }

    fn drain_observation(&self, d: &LinkDrain) -> Result<DrainObservation, Refusal> {
        Ok(DrainObservation {
            host_id: self.service.config().host_id.clone(),
            host_generation: self
                .generation()
                .ok_or_else(|| Refusal::Internal("not started".into()))?,
            drain_generation: NonZeroU64::new(d.generation)
                .ok_or_else(|| Refusal::Internal("drain generation 0".into()))?,
            state: if d.done {
                DrainState::Drained
            } else {
                DrainState::Draining
            },
            scope: Some(SessionScope {
                tenant_id: d.tenant.clone(),
                session_id: d.session.clone(),
            }),
        })
    }

    fn holds(&self, tenant: &TenantId, session: &SessionId) -> bool {
        self.service.residency(tenant, session).is_some()
    }
}

fn refusal(e: HostError) -> Refusal {
    match e {
        // No link is accepted before start; should one race it, it is told to go elsewhere.
        HostError::NotAdmitting(_) | HostError::NotStarted | HostError::Disposed => {
            HostLinkError::NotAdmitting.into()
        }
        HostError::Releasing => HostLinkError::Releasing.into(),
        HostError::NoCapacity { .. } => HostLinkError::NoCapacity.into(),
        // An unreadable (or zero) epoch is sent as none rather than guessed.
        HostError::EpochMismatch {
            current_lease_epoch,
        } => HostLinkError::EpochMismatch {
            current_lease_epoch: current_lease_epoch.and_then(NonZeroU64::new),
        }
        .into(),
        HostError::RuntimeMismatch {
            runtime_compatibility_id,
        } => match CompatibilityId::new(runtime_compatibility_id) {
            Ok(c) => HostLinkError::RuntimeMismatch {
                runtime_compatibility_id: c,
            }
            .into(),
            Err(e) => Refusal::Internal(e.to_string()),
        },
        HostError::RuntimeUnavailable(_) => HostLinkError::RuntimeUnavailable.into(),
        HostError::Invalid(_) => Refusal::BadRequest,
        // The code a controller branches on survives a failed unwind (logged at ERROR).
        HostError::Unwound { refusal: r, .. } => refusal(*r),
        e @ HostError::Internal { .. } => Refusal::Internal(e.to_string()),
    }
}

#[async_trait::async_trait]
impl LinkBackend for HostBackend {
    fn server_version(&self) -> String {
        self.service.version().to_owned()
    }

    fn capability_tokens(&self) -> Vec<String> {
        let mut tokens: Vec<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
        tokens.extend(self.extensions.iter().map(|e| e.capability().to_owned()));
        tokens
    }

    async fn run_events(
        &self,
        link: &LinkCtx,
        run: &sessionstore::RunId,
    ) -> hostlink_server::backend::RunEvents {
        use hostlink_server::backend::RunEvents;
        for extension in &self.extensions {
            match extension.run_events(&link.tenant, run).await {
                RunEvents::NotHosted => continue,
                events => return events,
            }
        }
        RunEvents::NotHosted
    }

    async fn extension_rpc(
        &self,
        link: &LinkCtx,
        method: &str,
        data: Option<&serde_json::value::RawValue>,
    ) -> hostlink_server::backend::ExtensionReply {
        for extension in &self.extensions {
            match extension
                .call(&link.tenant, &link.actor(), method, data)
                .await
            {
                hostlink_server::backend::ExtensionReply::NotFound => continue,
                reply => return reply,
            }
        }
        hostlink_server::backend::ExtensionReply::NotFound
    }

    /// New links once the Host has started and until it stops. The process's stop refuses
    /// new links itself from its first instant ([`crate::Host::shutdown`]); during a
    /// HostLink drain of a dedicated Host's fixed session a controller may still reconnect to
    /// read `drain_status`, while attach and bind answer `not_admitting`.
    fn accepting_links(&self) -> bool {
        self.service.live() && self.service.generation() > 0
    }

    fn auth(&self) -> &dyn AuthVerifier {
        self.auth.as_ref()
    }

    async fn attach(
        &self,
        link: &LinkCtx,
        req: AttachRequest,
    ) -> Result<RegistryObservation, Refusal> {
        // Host id and generation are checked before any lease is taken.
        self.check_host(&req.host_id, req.host_generation)?;
        let attach = HostAttach {
            tenant: link.tenant.clone(),
            session: req.session_id,
            agent: req.agent_id,
            compatibility: req.runtime_compatibility_id,
            mode: match req.mode {
                AttachMode::Create => LaunchMode::Create,
                AttachMode::Restore => LaunchMode::Restore,
            },
            // The principal a JWT names is the actor; an opaque token's link says its own.
            actor: Some(
                link.principal
                    .clone()
                    .unwrap_or_else(|| req.actor_id.as_str().to_owned()),
            ),
            trace: req.trace_id.map(|t| t.as_str().to_owned()),
        };
        // `Service::attach` finishes (or unwinds) on its own task even if the link goes away.
        match self.service.attach(attach).await {
            Ok(a) => self.observation(&a.observation),
            Err(e) => Err(refusal(e)),
        }
    }

    async fn bind(&self, link: &LinkCtx, req: BindRequest) -> Result<SessionFeed, Refusal> {
        self.check_host(&req.host_id, req.host_generation)?;
        if self.service.draining() {
            // A draining Host takes no new route to a session it is giving back.
            return Err(HostLinkError::NotAdmitting.into());
        }
        let Some((epoch, state)) = self.service.residency(&link.tenant, &req.session_id) else {
            return Err(HostLinkError::RuntimeUnavailable.into());
        };
        if state != ResidentState::Resident {
            return Err(HostLinkError::Releasing.into());
        }
        if epoch.0 != req.lease_epoch.get() {
            return Err(refusal(HostError::EpochMismatch {
                current_lease_epoch: Some(epoch.0),
            }));
        }
        let Some((compatibility, feed)) = self.service.live_feed(&link.tenant, &req.session_id)
        else {
            return Err(HostLinkError::RuntimeUnavailable.into());
        };
        if compatibility != req.runtime_compatibility_id {
            return Err(HostLinkError::RuntimeMismatch {
                runtime_compatibility_id: compatibility,
            }
            .into());
        }
        Ok(SessionFeed::new(feed))
    }

    async fn unbind(&self, _link: &LinkCtx, _req: UnbindRequest) -> Result<(), Refusal> {
        // Idempotent, and never releases residency: the link drops its route.
        Ok(())
    }

    async fn drain(&self, link: &LinkCtx, req: DrainRequest) -> Result<DrainObservation, Refusal> {
        let scope = self.scoped(link, &req)?;
        {
            let current = self
                .drain
                .lock()
                .map_err(|_| Refusal::Internal("poisoned".into()))?;
            if let Some(d) = current.as_ref() {
                // The mutator is attributed to a holder: repeating it is idempotent while the
                // session is still held, and refused once it was released, even for the link
                // that began it (observation is `drain_status`'s job).
                if self.holds(&link.tenant, &scope.session_id) {
                    return self.drain_observation(d);
                }
                return Err(HostLinkError::RuntimeUnavailable.into());
            }
        }
        if !self.holds(&link.tenant, &scope.session_id) {
            return Err(HostLinkError::RuntimeUnavailable.into());
        }
        let generation = self.drains.fetch_add(1, Ordering::SeqCst) + 1;
        let d = LinkDrain {
            tenant: scope.tenant_id.clone(),
            session: scope.session_id.clone(),
            generation,
            done: false,
        };
        let observation = self.drain_observation(&d)?;
        if let Ok(mut slot) = self.drain.lock() {
            *slot = Some(d);
        }
        let service = self.service.clone();
        let slot = self.drain.clone();
        let requested_by = link.actor();
        tokio::spawn(async move {
            let (report, _) =
                tokio::join!(service.drain(), service.record_drain_request(&requested_by));
            tracing::info!(
                clean = report.is_clean(),
                state = report.state.as_str(),
                "HostLink drain of the fixed session finished"
            );
            // `drained` is withheld while a lease may still be held (a parked session).
            if let Ok(mut s) = slot.lock()
                && let Some(d) = s.as_mut()
            {
                d.done = report.state == DrainState::Drained;
            }
        });
        Ok(observation)
    }

    async fn drain_status(
        &self,
        link: &LinkCtx,
        req: DrainRequest,
    ) -> Result<DrainObservation, Refusal> {
        let scope = self.scoped(link, &req)?;
        let current = self
            .drain
            .lock()
            .map_err(|_| Refusal::Internal("poisoned".into()))?;
        match current.as_ref() {
            // The tenant holding the fixed session may observe; so may whoever began this very
            // drain, matched on the tenant and session it was begun with (not on the link: a
            // controller that reconnects must still read the terminal `drained`). Nobody else:
            // that would tell any link naming the fixed session who occupies this Host.
            Some(d)
                if self.holds(&link.tenant, &scope.session_id)
                    || (d.tenant == link.tenant && d.session == scope.session_id) =>
            {
                self.drain_observation(d)
            }
            _ => Err(HostLinkError::RuntimeUnavailable.into()),
        }
    }

    async fn deliver(
        &self,
        link: &LinkCtx,
        session: &SessionId,
        _command: &CommandId,
    ) -> Result<(), Refusal> {
        self.service
            .deliver(&link.tenant, session)
            .map_err(|_| Refusal::HostLink(HostLinkError::RuntimeUnavailable))
    }

    fn route_invalidations(&self) -> broadcast::Receiver<(TenantId, SessionId)> {
        self.service.route_invalidations()
    }

    async fn stream_read(
        &self,
        link: &LinkCtx,
        session: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Option<StreamPage>, Refusal> {
        match self.streams.read(&link.tenant, session, after, limit).await {
            Ok(page) => Ok(Some(page)),
            Err(StreamReadError::Unknown) => Err(HostLinkError::RuntimeUnavailable.into()),
            Err(e) => Err(Refusal::Internal(e.to_string())),
        }
    }
}
