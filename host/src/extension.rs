//! What a Host hosts beside its sessions (workflow runs, for one): an [`Extension`] answers
//! HostLink methods of its own family under a capability token it advertises, may serve the
//! live events of its runs, is booted when the Host begins serving, told at the stop's first
//! instant to take nothing new, and stopped beside the session drain under the drain's own
//! deadlines ([`crate::HostBuilder`] owns that order). This module only declares the seam; it
//! must never know what an extension does.

use async_trait::async_trait;
use hostlink_server::backend::{ExtensionReply, RunEvents};
use serde_json::value::RawValue;
use sessionstore::{RunId, TenantId};
use tokio::time::Instant;

/// The deadlines an extension's stop shares with the session drain: work in flight may finish
/// until `graceful` (the drain grace), is stopped crash-equivalently then, and everything has
/// ended by `cut` (the grace and one and a half idle boundaries, as a session's drain).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopBounds {
    pub graceful: Instant,
    pub cut: Instant,
}

/// A family of HostLink methods served by something the Host hosts.
///
/// Calls come from links of an authenticated tenant; like every link call they may be dropped
/// when the link closes, so each method must be cancel-safe.
#[async_trait]
pub trait Extension: Send + Sync + 'static {
    /// The capability token advertised after the reserved methods (e.g. `hostlink.run`).
    fn capability(&self) -> &'static str;

    /// Answers `method` for a link of `tenant` when it is one of this extension's methods;
    /// [`ExtensionReply::NotFound`] otherwise, so the next extension may answer it. `actor`
    /// is who the link acts as (see [`hostlink_server::backend::LinkCtx::actor`]): what the
    /// call records as done by someone is recorded as done by it.
    async fn call(
        &self,
        tenant: &TenantId,
        actor: &str,
        method: &str,
        data: Option<&RawValue>,
    ) -> ExtensionReply;

    /// The live events of `run` for a link of `tenant` subscribing to its channel;
    /// [`RunEvents::NotHosted`] when this extension hosts no runs.
    async fn run_events(&self, _tenant: &TenantId, _run: &RunId) -> RunEvents {
        RunEvents::NotHosted
    }

    /// Starts the extension's own work; called once, when the Host begins serving.
    fn boot(&self) {}

    /// Takes nothing new from this instant (new work is refused with a stable code); called
    /// at the stop's first instant, before anything waits. Must not block.
    fn begin_stop(&self) {}

    /// Stops the extension's work within `bounds`; called when the Host stops, concurrently
    /// with the session drain, while the listener still serves.
    async fn shutdown(&self, bounds: StopBounds);
}
