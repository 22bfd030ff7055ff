#![forbid(unsafe_code)]
//! HostLink, the controller-facing protocol of a Host, as bytes: the Centrifuge client
//! protocol's JSON framing ([`frame`]), the HostLink records carried in it ([`records`]), every
//! code a client branches on ([`codes`]), session channel names ([`channel`]), tenant
//! credentials ([`auth`]: opaque token digests and JWT connection tokens, [`jwt`]) and the public projection of journal bodies that both the
//! live tail and durable journal pages use ([`public_journal`]), and the protocol an upgrade
//! request asks for ([`upgrade`]). See
//! `shared/design/HOSTLINK.md` for the contract.
//!
//! This crate is shared by the server (`host`) and every client (`controller`). It owns no
//! runtime: it never opens a socket, spawns a task, attaches, drains or delivers. Anything
//! that needs a Host's state lives in `host`; anything that dials a Host lives in
//! `controller`.

pub mod auth;
pub mod channel;
pub mod codes;
pub mod frame;
pub mod json;
pub mod json_spans;
pub mod jwt;
pub mod live_credentials;
pub mod public_journal;
pub mod records;
pub mod runs;
pub mod timestamp;
pub mod upgrade;

pub use auth::{AuthRefused, AuthVerifier, CredentialStore, Grant, mint_credential};
pub use codes::{Disconnect, HostLinkErrorCode, ReplyError};
