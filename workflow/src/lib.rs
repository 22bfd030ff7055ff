//! Workflow runs: durable programs of named steps (invoke a runnable, ask a question, sleep,
//! ask an agent), validated completely before anything is recorded and driven by replay over
//! the run records of the session store.
//!
//! Submodules, each owning one concern: [`program`] (the YAML form, validation with every
//! problem reported, templates), [`seam`] (what a driver works through: the store's driver
//! writes, pinned releases, runnables, agents, step events), [`pinning`] (a run tied to the
//! releases it started with: validated and pinned at start, read against its pins at replay),
//! [`driver`] (replay, fencing, supervision, uncertainty), [`workspace`] (the runnables of a
//! local workspace as the environment a new run is resolved in) and [`releases`] (pinned
//! releases kept in the session store: pinned, fetched, verified and invoked).
//!
//! Hosting — which Host drives which run, admission, boot reconcile, HostLink — belongs to the
//! `run-hosting` crate; this crate must never depend on it, nor on `host`.

#![forbid(unsafe_code)]

pub mod driver;
pub mod pinning;
pub mod program;
pub mod releases;
pub mod seam;
pub mod workspace;

pub use driver::{
    DriveEnd, DriveError, Driver, DriverOptions, Resolution, attention_point, failure_codes,
    parse_resolution, step_ids,
};
pub use pinning::{PinnedEnvironment, StartRefusal, pin_new_run};
pub use program::{Environment, Problem, Program, RunnableInfo, Step, StepKind, Unresolved, parse};
pub use releases::StoreReleases;
pub use seam::{
    AgentTurn, AgentTurns, AsResolved, InvokeCall, InvokeDone, Invoker, NoEvents, ReleaseError,
    Releases, RunJournal, StepEvent, StepEvents,
};
pub use workspace::WorkspaceRunnables;

/// Checks an answer for an open checkpoint before it is recorded: an ask's value against the
/// answer schema of that step in the recorded program, an attention point's value against the
/// operator's two forms.
pub fn check_answer(
    kind: sessionstore::CheckpointKind,
    program_source: &str,
    checkpoint: &str,
    value: &serde_json::Value,
) -> Result<(), Vec<String>> {
    match kind {
        sessionstore::CheckpointKind::Attention => {
            parse_resolution(value).map(|_| ()).map_err(|e| vec![e])
        }
        sessionstore::CheckpointKind::Sleep => Err(vec!["a sleep takes no answer".into()]),
        sessionstore::CheckpointKind::Ask => {
            let schema = program::answer_schema(program_source, checkpoint).ok_or_else(|| {
                vec![format!(
                    "the recorded program has no answer schema for `{checkpoint}`"
                )]
            })?;
            let violations = schema.validate(value);
            if violations.is_empty() {
                Ok(())
            } else {
                Err(violations.iter().map(|v| v.to_string()).collect())
            }
        }
    }
}
