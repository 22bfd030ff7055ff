#![forbid(unsafe_code)]
//! The durable session store of a Host: the session catalog and its immutable bindings,
//! residency leases, the host registry, the command inbox and its state machine, the
//! consumption cursor, the gate projection, payload objects and the runtime journal — one API
//! over two backends, SQLite (embedded default) and PostgreSQL (a fleet of Hosts).

mod backend;
pub mod clock;
pub mod drains;
pub mod error;
pub mod evidence;
pub mod fleet;
pub mod ids;
pub mod journal;
pub mod limits;
pub mod location;
pub mod machine;
mod merged;
mod migrations;
pub mod model;
mod open_gates;
mod ops;
mod options;
pub mod packages;
mod pgexec;
pub mod placement;
#[cfg(feature = "testing")]
pub mod plans;
mod postgres;
pub mod runs;
mod snapshots;
mod sql;
mod sqlite;
mod statements;
pub mod stats;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wire;

pub use backend::Admission;
pub use clock::{Clock, ClockShift, ManualClock, Millis, SharedClock, SystemClock};
pub use drains::DrainRecord;
pub use error::{ErrorCode, StoreError, StoreResult};
pub use evidence::{EvidenceReader, EvidenceRouter, FixedEvidenceRouter};
pub use fleet::{
    HeartbeatReport, HostHeartbeat, HostLoad, Leadership, LeadershipRequest, Orphan,
    PlacementRecord, PlacementRequest, RenewedResidency,
};
pub use ids::*;
pub use journal::*;
pub use location::StoreLocation;
pub use model::*;
pub use open_gates::{GateCursor, OpenGatesPage};
pub use options::{LOCAL_STORAGE_BINDING, StoreOptions, Synchronous, local_binding};
pub use packages::{NewPackage, PackageSummary, Publication, StoredPackage};
pub use runs::{
    AnswerRecorded, Checkpoint, CheckpointKind, NewCheckpoint, NewRun, NewStepEntry, PARKED_HOLDER,
    ParkUntil, RunAnswer, RunCreated, RunEnd, RunFailure, RunFence, RunOrder, RunPin, RunProgram,
    RunState, RunStatus, RunsMark, RunsPage, StepEntry, StepEntryKind, Takeover, TakeoverRule,
    holder_host,
};
pub use stats::StoreStats;
pub use store::{BackendKind, Store};
pub use trace_context::TraceContext;
