//! Test support shared by every suite that runs a Host, and the home of the whole-system
//! tests (`tests/tests/`: several processes, real sockets, real databases, an official SDK).
//! One module per kind of scaffolding: waiting ([`poll`]), a Host composed in-process with a
//! controller's-eye checker ([`fixture`]), that Host behind its real listener ([`served`]),
//! `hostd` as a child process ([`process`]), a PostgreSQL database of a test's own ([`pg`])
//! and the benches' least-squares fits ([`stats`]).
//! Nothing here is shipped: only test targets depend on this crate.

pub mod faults;
pub mod fixture;
pub mod pg;
pub mod poll;
pub mod process;
pub mod served;
pub mod stats;

pub use fixture::*;
pub use poll::{POLL, WAIT, check, eventually, eventually_blocking};
pub use served::*;
