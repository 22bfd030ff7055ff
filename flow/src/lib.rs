//! Flows: a workspace of services (`flow.yaml` plus per-service manifests), the dependency
//! graph over them, and the engine that brings a selection up, keeps it running and tears it
//! down. Each submodule owns one concern; this module only wires their public types together
//! and must never hold behaviour of its own.

#![forbid(unsafe_code)]

pub mod change;
pub mod control;
pub mod down;
pub mod engine;
pub mod environment;
pub mod error;
pub mod events;
pub mod graph;
pub mod logs;
pub mod manifest;
pub mod options;
pub mod policy;
pub mod ports;
pub mod predicate;
pub mod process;
pub mod procfs;
pub mod readiness;
pub mod recover;
pub mod restart;
pub mod sockets;
pub mod state;
pub mod status;
mod supervisor;
pub mod teardown;
pub mod tls;

pub use change::{ChangeReport, ChangeRequest, StartedService};
pub use down::{DownAction, DownOptions, DownPreview, DownReport, PreviewEntry, down};
pub use engine::{
    DryRun, Flow, FlowEnd, FlowEndReason, PlannedService, RunningFlow, Selection, ServiceStatus,
    UpFailure,
};
pub use environment::{EnvOverride, dotenv};
pub use error::{FlowError, GraphError, ManifestError, ManifestProblem};
pub use events::{EventSink, FlowEvent, OutputStream};
pub use graph::{DependencyGraph, Edge, EdgeOrigin, Phase, Stage, StageGraph};
pub use manifest::{Api, Dependency, DependencyKind, Endpoint, ServiceManifest, Workspace};
pub use options::FlowOptions;
pub use predicate::{Predicate, ReadinessFailure};
pub use recover::{RecoveryPreview, RecoveryReport};
pub use restart::{RestartPolicy, RestartSpec};
pub use status::{FlowStatus, RecordedService, status};
pub use teardown::{Receipt, StopOutcome, TeardownOperation, TeardownReport};
