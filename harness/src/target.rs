//! The department adapter: a harness agent as a launch target with full recovery declared.
//! Owns the mapping from department's runtime traits onto a session handle; holds no state of
//! its own beyond the store and the agent configuration.

use std::sync::Arc;

use department::{
    AttemptCloser, Capabilities, CommandApplier, CommittedEvent, EventSource, GracefulRelease,
    IdleWatch, JournalEpochReporter, LaunchError, LaunchRequest, LaunchTarget, Liveness,
    PersistenceFault, PersistenceFaults, Preview, Recorded, Recovery, Runtime, RuntimeCommand,
    RuntimeError,
};
use sessionstore::{AttemptId, CommandIdentity, CompatibilityId, JournalEpoch, Store};
use tokio::sync::{broadcast, watch};

use crate::agent::{AgentConfig, AgentConfigError};
use crate::session::{self, SessionHandle};
use crate::snapshot::{SnapshotCounts, SnapshotStats};

/// A harness agent as a department launch target.
#[derive(Clone)]
pub struct HarnessTarget {
    store: Store,
    agent: Arc<AgentConfig>,
    compatibility: CompatibilityId,
    capabilities: Capabilities,
    snapshots: Arc<SnapshotStats>,
}

impl std::fmt::Debug for HarnessTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessTarget")
            .field("compatibility", &self.compatibility)
            .field("agent", &self.agent)
            .finish()
    }
}

impl HarnessTarget {
    /// A target whose sessions journal into `store`. Declares full recovery (the harness
    /// closes predecessors' attempts and reports persistence faults) and pooled support.
    pub fn new(
        store: Store,
        agent: AgentConfig,
        compatibility: CompatibilityId,
    ) -> Result<HarnessTarget, AgentConfigError> {
        agent.validate()?;
        Ok(HarnessTarget {
            store,
            agent: Arc::new(agent),
            compatibility,
            capabilities: Capabilities {
                supports_pooled: true,
                admission_weight: 1,
                isolation: String::new(),
                recovery: Recovery::full(),
            },
            snapshots: Arc::default(),
        })
    }

    /// Overrides the declared capabilities (the recovery declaration is verified at launch).
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> HarnessTarget {
        self.capabilities = capabilities;
        self
    }

    /// Launches and returns the session handle itself (for tests and embedding).
    /// What this target's sessions did with journal snapshots since it was built.
    pub fn snapshot_counts(&self) -> SnapshotCounts {
        self.snapshots.counts()
    }

    pub async fn launch_session(
        &self,
        request: LaunchRequest,
    ) -> Result<SessionHandle, LaunchError> {
        session::launch(
            self.store.clone(),
            self.agent.clone(),
            self.snapshots.clone(),
            self.compatibility.to_string(),
            request,
        )
        .await
    }
}

#[async_trait::async_trait]
impl CommandApplier for SessionHandle {
    async fn apply(&self, command: RuntimeCommand) -> Result<Recorded, RuntimeError> {
        SessionHandle::apply(self, command).await
    }
}

#[async_trait::async_trait]
impl AttemptCloser for SessionHandle {
    async fn close_attempt(
        &self,
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
    ) -> Result<Recorded, RuntimeError> {
        SessionHandle::close_attempt(self, identity, attempt, attempt_epoch).await
    }
}

impl JournalEpochReporter for SessionHandle {
    fn journal_epoch(&self) -> JournalEpoch {
        SessionHandle::journal_epoch(self)
    }
}

#[async_trait::async_trait]
impl PersistenceFaults for SessionHandle {
    fn faults(&self) -> watch::Receiver<Option<PersistenceFault>> {
        SessionHandle::faults(self)
    }

    async fn abandon(&self) -> Result<(), RuntimeError> {
        SessionHandle::abandon(self).await?;
        // Crash-equivalent means stopped: wait until the actor has exited.
        let mut alive = SessionHandle::alive(self);
        while *alive.borrow_and_update() {
            if alive.changed().await.is_err() {
                break;
            }
        }
        Ok(())
    }
}

impl IdleWatch for SessionHandle {
    fn idle(&self) -> watch::Receiver<bool> {
        SessionHandle::idle(self)
    }
}

impl Liveness for SessionHandle {
    fn alive(&self) -> watch::Receiver<bool> {
        SessionHandle::alive(self)
    }
}

#[async_trait::async_trait]
impl GracefulRelease for SessionHandle {
    async fn release(&self) -> Result<(), RuntimeError> {
        SessionHandle::release(self).await
    }
}

impl EventSource for SessionHandle {
    fn committed(&self) -> broadcast::Receiver<Arc<CommittedEvent>> {
        SessionHandle::committed(self)
    }

    fn previews(&self) -> broadcast::Receiver<Preview> {
        SessionHandle::previews(self)
    }
}

/// The department bundle for a session handle.
pub fn runtime_of(handle: SessionHandle) -> Runtime {
    let h = Arc::new(handle);
    Runtime {
        runtime_session: h.runtime_session(),
        applier: h.clone(),
        epoch: h.clone(),
        idle: h.clone(),
        liveness: h.clone(),
        release: h.clone(),
        events: h.clone(),
        closer: Some(h.clone()),
        faults: Some(h),
    }
}

#[async_trait::async_trait]
impl LaunchTarget for HarnessTarget {
    fn capabilities(&self) -> Capabilities {
        self.capabilities.clone()
    }

    fn compatibility(&self) -> CompatibilityId {
        self.compatibility.clone()
    }

    async fn launch(&self, request: LaunchRequest) -> Result<Runtime, LaunchError> {
        Ok(runtime_of(self.launch_session(request).await?))
    }
}
