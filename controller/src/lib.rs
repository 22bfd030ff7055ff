//! A controller library: what a Factory does, for one tenant. It creates sessions (catalog
//! entry, immutable binding and the create command, idempotently), admits commands (inline or,
//! above 64 KiB, by payload object), places a session on a live Host from the registry and
//! attaches it over HostLink, delivers, binds and streams a session's events, reads the public
//! journal (the same projection the live tail uses), lists open gates and answers one. It
//! writes the store only where a controller owns the state (catalog, inbox, payloads).
//!
//! This crate is what a controller author compiles: it depends on `hostlink` (the protocol)
//! and `sessionstore` (the durable state a controller owns), never on `host`.
#![forbid(unsafe_code)]

pub mod client;

use std::sync::Arc;
use std::time::Duration;

use sessionstore::wire::{CommandBodyV1, GateAnswer, encode_command_body};
use sessionstore::{
    AgentId, CommandBody, CommandId, CommandKind, CommandRecord, CompatibilityId, GateRecord,
    HostTarget, NewCommand, NewObject, NewSession, ResidencyState, RuntimeSessionId,
    SessionBinding, SessionId, SessionRecord, Store, StoreError, TenantId, local_binding,
};
use tokio::sync::mpsc;
use trace_context::TraceContext;

use crate::client::{
    ClientError, ClientOptions, HostLinkClient, Publication, idempotency_key, nonzero,
};
use hostlink::public_journal::{PublicJournalError, PublicJournalPage, PublicJournals};
use hostlink::records::{
    ActorId, AttachMode, AttachRequest, BindRequest, HostLinkError, IdempotencyKey,
    RegistryObservation, V1,
};

/// The inline body limit; larger bodies are stored as payload objects.
const INLINE_LIMIT: usize = sessionstore::limits::MAX_INLINE_BODY_BYTES;

/// Why a controller operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("hostlink: {0}")]
    Link(#[from] ClientError),
    #[error("the Host refused: {}", .0.code().as_str())]
    Refused(HostLinkError),
    #[error("no live, accepting Host can take the session{0}")]
    NoHost(String),
    #[error("journal: {0}")]
    Journal(#[from] PublicJournalError),
    #[error("invalid: {0}")]
    Invalid(String),
}

/// A session placed on a Host: the link and the observation.
pub struct Placed {
    pub client: Arc<HostLinkClient>,
    pub observation: RegistryObservation,
}

/// The controller for one tenant.
#[derive(Clone)]
pub struct Controller {
    store: Store,
    tenant: TenantId,
    token: String,
    name: String,
    /// Who this controller acts for: recorded as the principal of every command it admits
    /// and as the attach's actor. `None`: the controller itself (`controller:<name>`).
    actor: Option<String>,
    /// How long an admitted command may wait before its apply deadline.
    pub apply_within: Duration,
    /// Warm public journal readers, shared by every clone.
    journals: Arc<PublicJournals>,
    /// The HostLink client's connect and request timeouts for every dial.
    pub client: ClientOptions,
    /// The W3C trace context this controller's work continues: sent with each attach and
    /// delivery, and stored with each admitted command so the Host that applies it (whichever
    /// it is) continues the same trace.
    pub trace: Option<TraceContext>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("tenant", &self.tenant)
            .finish()
    }
}

impl Controller {
    /// A controller for `tenant`, presenting `token` to Hosts.
    pub fn new(store: Store, tenant: TenantId, token: impl Into<String>) -> Controller {
        Controller {
            store,
            tenant,
            token: token.into(),
            name: "hostd-controller".into(),
            actor: None,
            apply_within: Duration::from_secs(600),
            journals: Arc::new(PublicJournals::new(PublicJournals::DEFAULT_CAPACITY)),
            client: ClientOptions::default(),
            trace: None,
        }
    }

    /// The same controller continuing `trace` (see [`Controller::trace`]).
    pub fn with_trace(mut self, trace: Option<TraceContext>) -> Controller {
        self.trace = trace;
        self
    }

    /// The same controller dialling Hosts with `client`'s timeouts.
    pub fn with_client(mut self, client: ClientOptions) -> Controller {
        self.client = client;
        self
    }

    /// The same controller acting for `actor` (an authenticated principal, say a JWT's `sub`,
    /// or `tenant:<tenant>` for an opaque token): what it admits is recorded as `actor`'s.
    pub fn with_actor(mut self, actor: impl Into<String>) -> Controller {
        self.actor = Some(actor.into());
        self
    }

    /// Who what this controller admits is recorded as done by.
    pub fn actor(&self) -> String {
        self.actor
            .clone()
            .unwrap_or_else(|| format!("controller:{}", self.name))
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The tenant.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// Creates a session (catalog entry with a fresh binding) and admits its create command,
    /// both idempotently: the same session and command ids return what exists.
    pub async fn create_session(
        &self,
        session: SessionId,
        agent: AgentId,
        compatibility: CompatibilityId,
        first_message: Option<String>,
        command: CommandId,
    ) -> Result<(SessionRecord, CommandRecord), ControllerError> {
        let record = match self.store.session(&self.tenant, &session).await {
            Ok(existing) => existing,
            Err(e) if e.code() == sessionstore::ErrorCode::NotFound => {
                self.store
                    .create_session(NewSession {
                        tenant: self.tenant.clone(),
                        session: session.clone(),
                        agent,
                        compatibility,
                        binding: SessionBinding {
                            runtime_session_id: RuntimeSessionId::mint(),
                            storage_binding_id: local_binding(),
                            binding_version: 1,
                        },
                    })
                    .await?
            }
            Err(e) => return Err(e.into()),
        };
        let create = self
            .admit(
                &session,
                command,
                CommandBodyV1::Create {
                    text: first_message,
                },
            )
            .await?;
        Ok((record, create))
    }

    /// Admits a command (idempotent by command id).
    pub async fn admit(
        &self,
        session: &SessionId,
        command: CommandId,
        body: CommandBodyV1,
    ) -> Result<CommandRecord, ControllerError> {
        let kind: CommandKind = body.kind();
        let bytes = encode_command_body(&body);
        let body = if bytes.len() > INLINE_LIMIT {
            CommandBody::Object(
                self.store
                    .put_object(NewObject {
                        tenant: self.tenant.clone(),
                        session: session.clone(),
                        kind: sessionstore::limits::COMMAND_BODY_OBJECT_KIND.into(),
                        media_type: "application/json".into(),
                        bytes,
                    })
                    .await?,
            )
        } else {
            CommandBody::Inline(bytes)
        };
        Ok(self
            .store
            .admit(NewCommand {
                tenant: self.tenant.clone(),
                session: session.clone(),
                command,
                kind,
                body,
                principal: Some(self.actor()),
                metadata: None,
                apply_within: self.apply_within,
                trace: self.trace.clone(),
            })
            .await?)
    }

    /// Places the session: on the Host its registration names when that Host is live and
    /// holds it resident, otherwise on the live, accepting Host with the most free admission
    /// weight (see [`sessionstore::placement::rank_hosts`]); then attaches it over HostLink.
    pub async fn place(&self, session: &SessionId) -> Result<Placed, ControllerError> {
        let record = self.store.session(&self.tenant, session).await?;
        let now = self.store.now_ms().await?;
        // Live, accepting Hosts with room for this tenant, the least loaded first.
        let targets = self.store.targets(true).await?;
        let loads = self.store.host_loads().await?;
        let live: Vec<HostTarget> = sessionstore::placement::rank_hosts(
            &targets,
            &loads,
            &self.tenant,
            session.as_str(),
            now,
        );
        let mut candidates: Vec<HostTarget> = Vec::new();
        if let Some(reg) = self.store.registration(&self.tenant, session).await?
            && reg.residency == ResidencyState::Resident
            && reg.expires_at_ms > now
            && let Some(t) = targets
                .iter()
                .find(|t| t.host == reg.host && t.accepting && t.is_live(now))
        {
            candidates.push(t.clone());
        }
        for t in live {
            if !candidates.iter().any(|c| c.host == t.host) {
                candidates.push(t);
            }
        }
        if candidates.is_empty() {
            return Err(ControllerError::NoHost(String::new()));
        }
        let mut last = None;
        for target in candidates {
            match self.attach_on(&record, &target).await {
                Ok(p) => return Ok(p),
                Err(e) => {
                    tracing::info!(host = %target.host, error = %e, "placement candidate refused");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or(ControllerError::NoHost(String::new())))
    }

    /// Attaches the session on one Host, over a link of its own.
    pub async fn attach_on(
        &self,
        record: &SessionRecord,
        target: &HostTarget,
    ) -> Result<Placed, ControllerError> {
        let client = Arc::new(self.connect(target).await?);
        self.attach_over(&client, record, target).await
    }

    /// A HostLink link to one Host, as this controller's tenant.
    pub async fn connect(&self, target: &HostTarget) -> Result<HostLinkClient, ControllerError> {
        Ok(HostLinkClient::connect_with(
            &target.endpoint,
            &self.tenant,
            &self.token,
            &self.name,
            self.client,
        )
        .await?)
    }

    /// Attaches the session on `target` over a link already open to it (one link may carry
    /// many sessions' attaches).
    pub async fn attach_over(
        &self,
        client: &Arc<HostLinkClient>,
        record: &SessionRecord,
        target: &HostTarget,
    ) -> Result<Placed, ControllerError> {
        let req = AttachRequest {
            version: V1,
            tenant_id: self.tenant.clone(),
            session_id: record.session.clone(),
            host_id: target.host.clone(),
            host_generation: nonzero(target.generation),
            agent_id: record.agent.clone(),
            runtime_compatibility_id: Some(record.compatibility.clone()),
            mode: AttachMode::Create,
            actor_id: ActorId::new(self.actor())
                .map_err(|e| ControllerError::Invalid(e.to_string()))?,
            trace_id: None,
            traceparent: self.trace.as_ref().map(|t| t.parent),
            tracestate: self.trace.as_ref().and_then(|t| t.state.clone()),
            idempotency_key: IdempotencyKey::new(idempotency_key())
                .map_err(|e| ControllerError::Invalid(e.to_string()))?,
        };
        match client.attach(&req).await? {
            Ok(observation) => Ok(Placed {
                client: client.clone(),
                observation,
            }),
            Err(refusal) => Err(ControllerError::Refused(refusal)),
        }
    }

    /// Binds this link to the placed session and subscribes to its channel.
    pub async fn bind_and_stream(
        &self,
        placed: &Placed,
        previews: bool,
    ) -> Result<mpsc::Receiver<Publication>, ControllerError> {
        let o = &placed.observation;
        let req = BindRequest {
            version: V1,
            tenant_id: self.tenant.clone(),
            session_id: o.session_id.clone(),
            host_id: o.host_id.clone(),
            host_generation: o.host_generation,
            lease_epoch: o.lease_epoch,
            runtime_compatibility_id: o.runtime_compatibility_id.clone(),
            idempotency_key: IdempotencyKey::new(idempotency_key())
                .map_err(|e| ControllerError::Invalid(e.to_string()))?,
        };
        if let Err(refusal) = placed.client.bind(&req).await? {
            return Err(ControllerError::Refused(refusal));
        }
        Ok(placed.client.subscribe(&o.session_id, previews).await?)
    }

    /// Wakes the placed session's consumer for `command` (the link must hold the bind).
    pub async fn deliver(
        &self,
        placed: &Placed,
        command: &CommandId,
    ) -> Result<(), ControllerError> {
        Ok(placed
            .client
            .deliver_traced(&placed.observation.session_id, command, self.trace.as_ref())
            .await?)
    }

    /// A page of the durable public journal (projected like the live tail).
    pub async fn journal(
        &self,
        session: &SessionId,
        after: u64,
        pinned_tip: Option<u64>,
        limit: usize,
    ) -> Result<PublicJournalPage, ControllerError> {
        let record = self.store.session(&self.tenant, session).await?;
        Ok(self
            .journals
            .page(
                &self.store,
                &self.tenant,
                session,
                &record.binding,
                after,
                pinned_tip,
                limit,
            )
            .await?)
    }

    /// The session's open gates.
    pub async fn gates(&self, session: &SessionId) -> Result<Vec<GateRecord>, ControllerError> {
        Ok(self.store.gates(&self.tenant, session, true).await?)
    }

    /// Admits the answer to a gate (a `gate_response` command).
    pub async fn answer(
        &self,
        session: &SessionId,
        command: CommandId,
        gate: uuid::Uuid,
        action: &str,
        text: Option<String>,
    ) -> Result<CommandRecord, ControllerError> {
        let expected = self
            .gates(session)
            .await?
            .into_iter()
            .find(|g| g.gate.as_str() == gate.to_string())
            .map(|g| g.opened_seq);
        self.admit(
            session,
            command,
            CommandBodyV1::GateResponse(GateAnswer {
                gate_id: gate,
                action: action.to_owned(),
                text,
                expected_gate_seq: expected,
            }),
        )
        .await
    }

    /// Waits until a command is terminal (polling the store), up to `bound`.
    pub async fn wait_terminal(
        &self,
        session: &SessionId,
        command: &CommandId,
        bound: Duration,
    ) -> Result<Option<CommandRecord>, ControllerError> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let rec = self.store.command(&self.tenant, session, command).await?;
            if rec.state.is_terminal() {
                return Ok(Some(rec));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}
