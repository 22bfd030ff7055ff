#![forbid(unsafe_code)]
//! The Host: keeps agent sessions resident, applies the commands a controller admitted for
//! them exactly once (claim → attempt → settle from the runtime's own evidence), publishes the
//! gates its agents open, warm-releases idle sessions and drains safely. It knows its runtimes
//! only through `department`'s traits, its durable state only through `sessionstore`, HostLink
//! only through `hostlink-server`'s backend seam, and what it hosts beside sessions (workflow
//! runs) only through [`Extension`]. [`Host::builder`] is the one way to serve it.

mod admission;
mod attach;
mod consumer;
pub mod error;
pub mod extension;
pub mod failpoints;
mod fanout;
pub mod feed;
mod link_backend;
pub mod listener;
pub mod metrics;
pub mod options;
mod publisher;
pub mod readiness;
mod reconcile;
mod release;
mod residency;
mod resident;
pub mod server;
mod service;
pub mod stream;
mod upkeep;

pub use attach::AttachRequest;
pub use error::HostError;
pub use extension::{Extension, StopBounds};
pub use link_backend::{CAPABILITIES, HostBackend};
pub use options::{Config, IsolationClass, Options, OptionsCode, OptionsError};
pub use publisher::default_timeout;
pub use release::{
    DRAIN_PARALLELISM, DrainFailure, DrainReport, FAILURES_LOGGED_ONE_BY_ONE, steps as drain_steps,
};
pub use residency::Footprint;
pub use resident::{ResidentState, SessionKey};
pub use server::{Host, HostBuilder, Listen, ServerError};
pub use service::{Attached, Composition, CompositionError, Observation, Registrar, Service};
