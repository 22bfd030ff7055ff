#![forbid(unsafe_code)]
//! The Host: keeps agent sessions resident, applies the commands a controller admitted for
//! them exactly once (claim → attempt → settle from the runtime's own evidence), publishes the
//! gates its agents open, warm-releases idle sessions and drains safely. It knows its runtimes
//! only through `department`'s traits and its durable state only through `sessionstore`.

mod admission;
mod consumer;
pub mod error;
pub mod failpoints;
pub mod feed;
mod fleet;
pub mod link;
mod link_backend;
pub mod listener;
pub mod metrics;
pub mod options;
mod publisher;
pub mod readiness;
mod release;
mod residency;
mod resident;
pub mod run_agents;
pub mod runs;
pub mod server;
mod service;
pub mod stream;
mod upkeep;

pub use error::HostError;
pub use link_backend::{CAPABILITIES, HostBackend};
pub use options::{Config, IsolationClass, Options, OptionsCode, OptionsError};
pub use publisher::default_timeout;
pub use release::{DrainFailure, DrainReport, steps as drain_steps};
pub use residency::Footprint;
pub use resident::{ResidentState, SessionKey};
pub use service::{
    AttachRequest, Attached, Composition, CompositionError, Observation, Registrar, Service,
};
