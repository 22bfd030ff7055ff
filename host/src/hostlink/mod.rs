//! HostLink: the controller-facing surface of a Host — the Centrifuge client protocol (JSON)
//! over WebSocket on axum. The tree is self-contained: [`frame`] speaks Centrifuge framing,
//! [`records`] the HostLink records, [`codes`] every code a client branches on, [`channel`]
//! session channel names, [`auth`] tenant credentials, [`backend`] the seam the Host
//! implements, [`options`] the validated bounds, and [`link`] the WebSocket machinery that
//! ties them together. See `shared/design/HOSTLINK.md` for the contract. Owns nothing of the
//! Host itself: it never attaches, drains or delivers except through [`LinkBackend`], and it
//! never closes its transports unless its owner asks ([`HostLinkHandle::close_all`]).
#![forbid(unsafe_code)]

pub mod auth;
pub mod backend;
pub mod channel;
pub mod codes;
pub mod frame;
pub mod json;
pub mod link;
pub mod options;
pub mod records;
pub mod timestamp;

pub use auth::{AuthRefused, AuthVerifier, CredentialStore, mint_credential};
pub use backend::{ExtensionReply, FeedItem, LinkBackend, LinkCtx, LinkId, Refusal, SessionFeed};
pub use codes::{Disconnect, HostLinkErrorCode, ReplyError};
pub use link::{HOSTLINK_PATH_PREFIX, HostLinkHandle, hostlink_router};
pub use options::{LinkConfig, LinkOptions, LinkOptionsError};
