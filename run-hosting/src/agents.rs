//! Agent steps of workflow runs, on this Host: one turn in a fresh session, through the same
//! exactly-once command path a controller uses. The step's session and its one command are
//! named from the run, the step and the attempt, so a driver that replays after a crash finds
//! the session and the command it admitted before and takes the reply the Host's consumer
//! settled, instead of admitting a second turn.
//!
//! A turn is: the catalog entry (created once), the `create` command carrying the prompt
//! (admitted once, idempotent by its id), residency on this Host (attach, then a delivery to
//! wake the consumer, which claims, attempts and settles it), and the reply read back from the
//! session's public journal. Reading the reply is the one place this module reads a runtime's
//! event vocabulary (`assistant_message`, `turn_done`, `turn_failed`, `turn_interrupted`),
//! as `department::gates` does for gates; an agent whose runtime journals other events gives
//! no reply and its step fails `agent_failed`.

use std::time::Duration;

use async_trait::async_trait;
use department::LaunchMode;
use serde_json::Value;
use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::{
    AgentId, CommandBody, CommandId, CommandRecord, ErrorCode, NewCommand, NewSession, Outcome,
    RuntimeSessionId, SessionBinding, SessionId, SessionRecord, StoreError, TenantId,
    local_binding,
};
use workflow::{AgentTurn, AgentTurns};

use host::{AttachRequest, HostError, ResidentState, Service};

/// The principal the step's command is admitted under.
const PRINCIPAL: &str = "run:agent-step";

/// How an agent turn of a run reads in the store: its session and its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnIds {
    pub session: SessionId,
    pub command: CommandId,
}

impl TurnIds {
    /// The session and command of `turn`: the same on every replay of the same attempt.
    pub fn of(turn: &AgentTurn) -> Result<TurnIds, String> {
        let session = SessionId::new(turn.idempotency_key.clone())
            .map_err(|e| format!("the step's session id: {e}"))?;
        let command = CommandId::new(format!("{}.prompt", turn.idempotency_key))
            .map_err(|e| format!("the step's command id: {e}"))?;
        Ok(TurnIds { session, command })
    }
}

/// Runs agent turns on a started Host's own residency and command consumer.
#[derive(Clone)]
pub struct ServiceAgents {
    service: Service,
    /// How often the turn's progress is re-read while waiting.
    pub poll: Duration,
    /// How long an admitted prompt may wait to be applied: a step whose session no Host can
    /// take (no capacity, a lease that never lapses) fails its attempt after this, instead
    /// of waiting without bound.
    pub apply_within: Duration,
}

impl std::fmt::Debug for ServiceAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAgents").finish()
    }
}

/// How far the turn has come, read from the session's public journal.
enum Reading {
    /// The turn has not ended yet.
    Pending,
    /// The turn ended with this reply.
    Replied(String),
    /// The turn ended without a reply.
    Failed(String),
}

/// What a retryable step of the turn saw (the caller waits and tries again).
enum Wait {
    Retry(String),
    Fail(String),
}

impl From<StoreError> for Wait {
    fn from(e: StoreError) -> Self {
        match e.code() {
            ErrorCode::Invalid | ErrorCode::Conflict => Wait::Fail(e.to_string()),
            _ => Wait::Retry(e.to_string()),
        }
    }
}

impl ServiceAgents {
    /// Agent turns on `service` (which must be started before a turn runs).
    pub fn new(service: Service) -> ServiceAgents {
        ServiceAgents {
            service,
            poll: Duration::from_millis(100),
            apply_within: Duration::from_secs(600),
        }
    }

    /// The agents this Host can launch.
    pub fn agents(&self) -> Vec<String> {
        self.service
            .department()
            .agents()
            .map(|a| a.to_string())
            .collect()
    }

    async fn session(
        &self,
        tenant: &TenantId,
        agent: &AgentId,
        ids: &TurnIds,
    ) -> Result<SessionRecord, Wait> {
        let store = self.service.store();
        match store.session(tenant, &ids.session).await {
            Ok(s) => return Ok(s),
            Err(e) if e.code() == ErrorCode::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let target = self.service.department().target(agent).ok_or_else(|| {
            Wait::Fail(format!("this Host cannot launch an agent named `{agent}`"))
        })?;
        let created = store
            .create_session(NewSession {
                tenant: tenant.clone(),
                session: ids.session.clone(),
                agent: agent.clone(),
                compatibility: target.compatibility(),
                binding: SessionBinding {
                    runtime_session_id: RuntimeSessionId::mint(),
                    storage_binding_id: local_binding(),
                    binding_version: 1,
                },
            })
            .await;
        match created {
            Ok(s) => Ok(s),
            // Another attempt of this driver created it between the read and the write.
            Err(e) if e.code() == ErrorCode::Conflict => {
                Ok(store.session(tenant, &ids.session).await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn admit(
        &self,
        s: &SessionRecord,
        ids: &TurnIds,
        prompt: &str,
    ) -> Result<CommandRecord, Wait> {
        let body = CommandBodyV1::Create {
            text: Some(prompt.to_owned()),
        };
        let bytes = encode_command_body(&body);
        if bytes.len() > sessionstore::limits::MAX_INLINE_BODY_BYTES {
            return Err(Wait::Fail(format!(
                "the rendered prompt is {} bytes; an agent step's prompt is at most {} bytes",
                bytes.len(),
                sessionstore::limits::MAX_INLINE_BODY_BYTES
            )));
        }
        Ok(self
            .service
            .store()
            .admit(NewCommand {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: ids.command.clone(),
                kind: body.kind(),
                body: CommandBody::Inline(bytes),
                principal: Some(PRINCIPAL.into()),
                metadata: None,
                apply_within: self.apply_within,
                // The turn is applied in the run's trace, under the step that asked for it.
                trace: trace_context::span::current_for_callee(None),
            })
            .await?)
    }

    /// Makes the session resident here and wakes its consumer.
    fn attach_request(s: &SessionRecord) -> AttachRequest {
        AttachRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            agent: s.agent.clone(),
            compatibility: Some(s.compatibility.clone()),
            mode: LaunchMode::Create,
            actor: Some(PRINCIPAL.into()),
            trace: None,
        }
    }

    async fn wake(&self, s: &SessionRecord) -> Result<(), Wait> {
        let resident = matches!(
            self.service.residency(&s.tenant, &s.session),
            Some((_, ResidentState::Resident))
        );
        if resident {
            return self
                .service
                .deliver(&s.tenant, &s.session)
                .map_err(|e| Wait::Retry(e.to_string()));
        }
        // `Service::attach` runs to its end on its own task even if this driver is stopped.
        match self.service.attach(Self::attach_request(s)).await {
            Ok(_) => {}
            Err(
                e @ (HostError::EpochMismatch { .. }
                | HostError::Releasing
                | HostError::NoCapacity { .. }
                | HostError::NotAdmitting(_)
                | HostError::Internal { .. }),
            ) => return Err(Wait::Retry(e.to_string())),
            Err(e) => return Err(Wait::Fail(e.to_string())),
        }
        self.service
            .deliver(&s.tenant, &s.session)
            .map_err(|e| Wait::Retry(e.to_string()))
    }

    /// Reads the session's public journal: the turn's reply once it ended.
    async fn read(&self, s: &SessionRecord) -> Result<Reading, Wait> {
        let store = self.service.store();
        let mut after = 0;
        let mut tip = None;
        let mut reply: Option<String> = None;
        loop {
            let page = store
                .journal_public_page(&s.tenant, s.binding.runtime_session_id, after, tip, 500)
                .await?;
            for e in &page.events {
                let Ok(body) = serde_json::from_slice::<Value>(&e.body) else {
                    continue;
                };
                match body.get("type").and_then(Value::as_str) {
                    Some("assistant_message") => {
                        if let Some(text) = body.get("text").and_then(Value::as_str)
                            && !text.is_empty()
                        {
                            reply = Some(text.to_owned());
                        }
                    }
                    Some("turn_done") => {
                        return Ok(match reply {
                            Some(r) => Reading::Replied(r),
                            None => {
                                Reading::Failed("the agent's turn ended without a reply".into())
                            }
                        });
                    }
                    Some("turn_failed") => {
                        let why = body
                            .pointer("/error/message")
                            .and_then(Value::as_str)
                            .unwrap_or("no reason given");
                        return Ok(Reading::Failed(format!("the agent's turn failed: {why}")));
                    }
                    Some("turn_interrupted") => {
                        let why = body.get("reason").and_then(Value::as_str).unwrap_or("");
                        return Ok(Reading::Failed(format!(
                            "the agent's turn was interrupted: {why}"
                        )));
                    }
                    _ => {}
                }
            }
            tip = Some(page.tip);
            if page.events.is_empty() || page.next_after >= page.tip {
                return Ok(Reading::Pending);
            }
            after = page.next_after;
        }
    }

    /// One pass over the turn: `Ok(Some(reply))` when it ended, `Ok(None)` to wait.
    async fn pass(&self, turn: &AgentTurn, ids: &TurnIds) -> Result<Option<String>, Wait> {
        let tenant = TenantId::new(turn.tenant.clone()).map_err(|e| Wait::Fail(e.to_string()))?;
        let agent = AgentId::new(turn.agent.clone()).map_err(|e| Wait::Fail(e.to_string()))?;
        let s = self.session(&tenant, &agent, ids).await?;
        if s.agent != agent {
            return Err(Wait::Fail(format!(
                "session {} belongs to agent {}, not {agent}",
                s.session, s.agent
            )));
        }
        let command = self.admit(&s, ids, &turn.prompt).await?;
        if command.state.is_terminal() {
            if command.outcome != Some(Outcome::Applied) {
                return Err(Wait::Fail(format!(
                    "the prompt was not applied: {}{}",
                    command
                        .outcome
                        .map(|o| o.as_str())
                        .unwrap_or(command.state.as_str()),
                    command
                        .reason
                        .as_ref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                )));
            }
            return match self.read(&s).await? {
                Reading::Replied(r) => Ok(Some(r)),
                Reading::Failed(why) => Err(Wait::Fail(why)),
                // Applied, the turn still going: the residency must stay here to finish it.
                Reading::Pending => {
                    self.wake(&s).await?;
                    Ok(None)
                }
            };
        }
        if command.attempt.is_none()
            && self.service.store().now_ms().await? > command.apply_deadline_ms
        {
            // Past its deadline the store lets no attempt begin: it can never be applied.
            return Err(Wait::Fail(format!(
                "the prompt was not applied before its deadline ({} ms after admission): no \
                 Host took the step's session {} in time",
                self.apply_within.as_millis(),
                s.session
            )));
        }
        self.wake(&s).await?;
        Ok(None)
    }
}

#[async_trait]
impl AgentTurns for ServiceAgents {
    async fn turn(&self, turn: AgentTurn) -> Result<String, String> {
        let ids = TurnIds::of(&turn)?;
        let mut said = None::<String>;
        loop {
            match self.pass(&turn, &ids).await {
                Ok(Some(reply)) => return Ok(reply),
                Ok(None) => {}
                Err(Wait::Fail(why)) => return Err(why),
                Err(Wait::Retry(why)) => {
                    if said.as_deref() != Some(why.as_str()) {
                        tracing::info!(run = %turn.run_id, step = %turn.step, session = %ids.session,
                            "agent step waits: {why}");
                        said = Some(why);
                    }
                }
            }
            tokio::time::sleep(self.poll).await;
        }
    }
}
