//! Workflow runs hosted on a Host, plugged into it as a HostLink [`host::Extension`]
//! (`run.*`, advertised as `hostlink.run`): [`hosting`] owns which runs this Host drives,
//! admission, the boot gate, takeover and the per-run channel of step events; [`agents`] runs a
//! program's `agent:` steps as turns on this Host through its exactly-once command path;
//! [`metrics`] registers the run series in the Host's registry; [`RunHost::for_service`] puts
//! it together for a serving Host.
//!
//! The program format, validation and replay are the `workflow` crate's; the Host's residency
//! and command path are `host`'s. This crate joins them and must never interpret a step.

#![forbid(unsafe_code)]

pub mod agents;
pub mod hosting;
pub mod metrics;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use hostlink_server::backend::{ExtensionReply, RunEvents};
use runnable::Runner;
use serde_json::value::RawValue;
use sessionstore::{RunId, TenantId};
use workflow::{StoreReleases, WorkspaceRunnables};

pub use agents::{ServiceAgents, TurnIds};
pub use hosting::{RunHost, RunHosting, RunOptions};
pub use metrics::RunMetrics;

/// Why run hosting could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("run metrics: {0}")]
    Metrics(#[from] host::metrics::MetricsError),
}

impl RunHost {
    /// Run hosting for a serving Host: new runs are pinned to the runnables of `runner` (none:
    /// a program that invokes is refused at start), published to the store; every run runs its
    /// pinned releases from the store, unpacked under `state` (so a Host without a workspace
    /// still drives pinned runs). `agent:` steps run as one turn in a fresh session of
    /// `service`, for every agent its department registered. Its series are registered in the
    /// Host's registry.
    pub fn for_service(
        service: &host::Service,
        options: RunOptions,
        runner: Option<Runner>,
        state: &Path,
    ) -> Result<RunHost, SetupError> {
        let agents = ServiceAgents::new(service.clone());
        let releases = Arc::new(StoreReleases::new(
            service.store().clone(),
            runner.clone(),
            state,
        ));
        let env = Arc::new(WorkspaceRunnables {
            runner,
            agents: agents.agents().into_iter().collect::<BTreeSet<_>>(),
        });
        let metrics = RunMetrics::register(service.metrics())?;
        Ok(RunHost::new(RunHosting {
            store: service.store().clone(),
            host_id: service.config().host_id.clone(),
            env,
            releases: releases.clone(),
            invoker: releases,
            agents: Some(Arc::new(agents)),
            options,
            metrics: Some(metrics),
        }))
    }
}

#[async_trait]
impl host::Extension for RunHost {
    fn capability(&self) -> &'static str {
        hostlink::runs::RUN_CAPABILITY
    }

    async fn call(
        &self,
        tenant: &TenantId,
        actor: &str,
        method: &str,
        data: Option<&RawValue>,
    ) -> ExtensionReply {
        if !method.starts_with("run.") {
            return ExtensionReply::NotFound;
        }
        self.handle_as(tenant, actor, method, data).await
    }

    async fn run_events(&self, tenant: &TenantId, run: &RunId) -> RunEvents {
        match self.events(tenant, run).await {
            Ok(rx) => RunEvents::Live(rx),
            Err(r) if r.code == hostlink::runs::refusal_codes::NOT_FOUND => RunEvents::Unknown,
            Err(r) => RunEvents::Failed(format!("{}: {}", r.code, r.message)),
        }
    }

    fn boot(&self) {
        RunHost::boot(self);
    }

    fn begin_stop(&self) {
        RunHost::begin_stop(self);
    }

    async fn shutdown(&self, bounds: host::StopBounds) {
        RunHost::stop_by(self, bounds.graceful, bounds.cut).await;
    }
}
