//! The runnables of a local workspace as the [`Environment`] a new run is validated in:
//! `invoke:` resolves by the runnables' one rule against the workspace loaded strictly (one
//! broken declaration refuses every reference, naming its file). Agents come from a list the
//! caller names. A run never invokes from here: it is pinned at start and runs its pinned
//! releases ([`crate::releases`]); this module must never run a handler.

use std::collections::BTreeSet;

use crate::program::{Environment, RunnableInfo, Unresolved};
use runnable::{RunnableError, Runner};

/// A workspace's runnables (none: a program that invokes is refused), and the agents a Host
/// can launch.
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
        // What validation reports; a start pins the digest of the release it builds, and only
        // a pinned digest ever reaches a step's ids.
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
