//! Pinning: a run is tied to the releases it started with. At start, [`pin_new_run`]
//! validates the program whole against the environment (the local workspace, loaded strictly),
//! then has [`Releases::pin`] make each release it invokes reachable by every driver (built,
//! published) and validates the program again against exactly those releases, so a recorded
//! run always validates against its pins. At replay, a [`PinnedEnvironment`] resolves the
//! recorded program's references among the pinned releases only, whatever the workspace holds
//! by then.
//!
//! This module owns those two rules; it must never build, fetch or run a release itself (that
//! is the [`Releases`] it is given), and never records anything.

use runnable::{Identity, Reference, RunnableError};
use sessionstore::RunPin;

use crate::program::{self, Environment, Problem, Program, RunnableInfo, StepKind, Unresolved};
use crate::seam::{ReleaseError, Releases};

/// Why a new run cannot be recorded.
#[derive(Debug, Clone)]
pub enum StartRefusal {
    /// The program does not validate: every problem.
    Problems(Vec<Problem>),
    /// A release it invokes cannot be pinned.
    Release(ReleaseError),
}

/// The runnables `program` invokes, as its environment resolved them (one per step).
pub fn invoked(program: &Program) -> Vec<RunnableInfo> {
    program
        .steps
        .iter()
        .filter_map(|s| match &s.kind {
            StepKind::Invoke { runnable, .. } => Some(runnable.clone()),
            _ => None,
        })
        .collect()
}

/// `workspace/name@version` as an identity, if it is one.
pub fn identity_of(text: &str) -> Option<Identity> {
    let r = Reference::parse(text).ok()?;
    Some(Identity {
        workspace: r.workspace?,
        name: r.name,
        version: r.version?,
    })
}

/// Validates `source` for a new run and pins every release it invokes: the pins to record
/// with the run.
pub async fn pin_new_run(
    source: &str,
    env: &dyn Environment,
    releases: &dyn Releases,
) -> Result<Vec<RunPin>, StartRefusal> {
    let program = program::parse(source, env).map_err(StartRefusal::Problems)?;
    let pins = releases
        .pin(&invoked(&program))
        .await
        .map_err(StartRefusal::Release)?;
    let mut pinned = Vec::with_capacity(pins.len());
    for pin in &pins {
        pinned.push(releases.pinned(pin).await.map_err(StartRefusal::Release)?);
    }
    program::parse(source, &PinnedEnvironment::new(pinned, env)).map_err(StartRefusal::Problems)?;
    Ok(pins)
}

/// A run's pinned releases as the environment its recorded program is read against: an
/// `invoke:` reference resolves by the runnables' one rule among the pinned releases only;
/// agents are the base environment's.
pub struct PinnedEnvironment<'a> {
    releases: Vec<(Identity, RunnableInfo)>,
    base: &'a dyn Environment,
}

impl<'a> PinnedEnvironment<'a> {
    pub fn new(pinned: Vec<RunnableInfo>, base: &'a dyn Environment) -> PinnedEnvironment<'a> {
        PinnedEnvironment {
            releases: pinned
                .into_iter()
                .filter_map(|info| identity_of(&info.identity).map(|id| (id, info)))
                .collect(),
            base,
        }
    }
}

/// The pinned identity `reference` resolves to among `pins`, by the one resolver.
pub fn resolve_pinned<'p>(pins: &'p [RunPin], reference: &str) -> Option<&'p RunPin> {
    let named: Vec<(Identity, &RunPin)> = pins
        .iter()
        .filter_map(|p| identity_of(&p.identity).map(|id| (id, p)))
        .collect();
    runnable::resolve(&named, |(id, _)| id, reference)
        .ok()
        .map(|(_, p)| *p)
}

impl Environment for PinnedEnvironment<'_> {
    fn runnable(&self, reference: &str) -> Result<RunnableInfo, Unresolved> {
        match runnable::resolve(&self.releases, |(id, _)| id, reference) {
            Ok((_, info)) => Ok(info.clone()),
            Err(RunnableError::NotFound { available, .. }) => {
                Err(Unresolved::NotFound { available })
            }
            Err(RunnableError::Ambiguous { candidates, .. }) => {
                Err(Unresolved::Ambiguous { candidates })
            }
            Err(e) => Err(Unresolved::Other(e.to_string())),
        }
    }

    fn agent_known(&self, agent: &str) -> bool {
        self.base.agent_known(agent)
    }
}
