#![forbid(unsafe_code)]
//! Test support shared by every suite that runs a Host (host, run-hosting and the whole-system
//! tests in `system-tests`). One module per kind of scaffolding: waiting ([`poll`]), a Host
//! composed in-process with a controller's-eye checker ([`fixture`]), that Host behind its real
//! listener ([`served`]), `hostd` as a child process ([`process`]), a PostgreSQL database of a
//! test's own ([`pg`]), injected faults ([`faults`]), a TCP proxy that injects network faults
//! ([`faultproxy`]), signing keys made at test time ([`jwt_keys`]), the Host's log read back ([`log_capture`]), runs recorded straight into a store ([`runs`]), a recorded client history ([`history`]) and the exactly-once checker that
//! judges it against the store ([`checker`]), and what the benches share ([`bench`]).
//!
//! Nothing here is shipped: only test and bench targets depend on this crate. It must never
//! depend on `cmd`, `console` or the run crates (`run-hosting`, `flow`, `runnable`,
//! `workflow`), so a crate's own tests do not build them: `hostd` itself is the
//! `hostd-under-test` binary of `system-tests`, which [`process::hostd`] finds next to the
//! test binary.

pub mod bench;
pub mod checker;
pub mod faultproxy;
pub mod faults;
pub mod fixture;
pub mod history;
pub mod jwt_keys;
pub mod log_capture;
pub mod pg;
pub mod poll;
pub mod process;
pub mod runs;
pub mod served;

pub use fixture::*;
pub use poll::{POLL, WAIT, check, eventually, eventually_blocking};
pub use served::*;
