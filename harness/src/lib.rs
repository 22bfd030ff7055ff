#![forbid(unsafe_code)]
//! harness: our own agent runtime. A session runtime per runtime session id is driven by one
//! task that owns its state and its journal lease; commands are applied with one journal
//! append each (application prefix and disposition together), turns stream a model's reply and
//! run its tools, gates ask a human, and a restore reads the newest snapshot of the session's
//! state and replays the journal after it. [`HarnessTarget`] makes a harness agent a
//! department launch target with full recovery declared.

pub mod agent;
pub mod events;
mod history;
mod inbox;
pub mod model;
mod recent;
mod session;
mod snapshot;
mod state;
mod target;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tool;
mod turn;

pub use agent::{AgentConfig, AgentConfigError};
pub use session::SessionHandle;
pub use snapshot::{SnapshotCounts, SnapshotStats};
pub use target::{HarnessTarget, runtime_of};
