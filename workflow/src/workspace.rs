//! The runnables of a local workspace as a run's [`Environment`] and [`Invoker`]: validation
//! resolves `invoke:` by the runnables' one rule, invocation runs the recorded release with
//! the step's intent and effect ids. Agents come from a list the caller names.

use std::collections::BTreeSet;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::program::{Environment, RunnableInfo, Unresolved};
use crate::seam::{InvokeCall, InvokeDone, Invoker};
use runnable::{InvokeRequest, RunnableError, Runner};

/// A workspace's runnables, and the agents a Host can launch.
pub struct WorkspaceRunnables {
    pub runner: Option<Runner>,
    pub agents: BTreeSet<String>,
}

impl Environment for WorkspaceRunnables {
    fn runnable(&self, reference: &str) -> Result<RunnableInfo, Unresolved> {
        let Some(runner) = &self.runner else {
            return Err(Unresolved::NotFound {
                available: Vec::new(),
            });
        };
        let catalog = runner
            .catalog()
            .map_err(|e| Unresolved::Other(e.to_string()))?;
        let decl = match catalog.resolve(reference) {
            Ok(d) => d,
            Err(RunnableError::NotFound { available, .. }) => {
                return Err(Unresolved::NotFound { available });
            }
            Err(RunnableError::Ambiguous { candidates, .. }) => {
                return Err(Unresolved::Ambiguous { candidates });
            }
            Err(e) => return Err(Unresolved::Other(e.to_string())),
        };
        let digest = catalog
            .recorded_digest(decl)
            .map(|d| d.to_string())
            .unwrap_or_else(|| "unbuilt".into());
        Ok(RunnableInfo {
            identity: decl.identity.to_string(),
            digest,
            effect: decl.effect,
            input: decl.input.clone(),
        })
    }

    fn agent_known(&self, agent: &str) -> bool {
        self.agents.contains(agent)
    }
}

#[async_trait]
impl Invoker for WorkspaceRunnables {
    async fn invoke(&self, call: InvokeCall) -> Result<InvokeDone, String> {
        let runner = self
            .runner
            .as_ref()
            .ok_or_else(|| "no runnable workspace is configured".to_owned())?;
        let cancel: &CancellationToken = &call.cancel;
        let done = runner
            .invoke(
                &call.identity,
                InvokeRequest {
                    input: call.input,
                    intent_id: Some(call.intent_id),
                    effect_id: Some(call.effect_id),
                },
                cancel,
            )
            .await
            .map_err(|e| format!("{}: {e}", e.code()))?;
        Ok(InvokeDone {
            outcome: done.outcome,
            output: done.output,
            detail: done.detail,
        })
    }
}
