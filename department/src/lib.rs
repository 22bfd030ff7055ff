#![forbid(unsafe_code)]
//! What a Host can launch. A [`Department`] is the immutable set of agents a Host serves, each
//! registered with a [`LaunchTarget`] that declares its [`Capabilities`]; a launched
//! [`Runtime`] is a bundle of small, separate capabilities the Host consumes (apply a command,
//! close a predecessor's attempt, report its journal epoch and persistence faults, wait for
//! idle, report liveness, release, abandon, publish events). The Host knows a runtime only
//! through these traits.

mod capabilities;
#[cfg(feature = "conformance")]
pub mod conformance;
mod department;
pub mod gates;
mod launch;
mod runtime;

pub use capabilities::{Capabilities, Recovery, RuntimeProfile};
pub use department::{Department, DepartmentError, Registration};
pub use launch::{LaunchError, LaunchMode, LaunchRequest, LaunchTarget, launch_verified};
pub use runtime::*;
