//! What a Host hosts beside its sessions (workflow runs, for one): an [`Extension`] answers
//! HostLink methods of its own family under a capability token it advertises, may serve the
//! live events of its runs, is booted when the Host begins serving and is stopped first in the
//! Host's stop order ([`crate::HostBuilder`] owns that order). This module only declares the
//! seam; it must never know what an extension does.

use std::time::Duration;

use async_trait::async_trait;
use hostlink_server::backend::{ExtensionReply, RunEvents};
use serde_json::value::RawValue;
use sessionstore::{RunId, TenantId};

/// A family of HostLink methods served by something the Host hosts.
///
/// Calls come from links of an authenticated tenant; like every link call they may be dropped
/// when the link closes, so each method must be cancel-safe.
#[async_trait]
pub trait Extension: Send + Sync + 'static {
    /// The capability token advertised after the reserved methods (e.g. `hostlink.run`).
    fn capability(&self) -> &'static str;

    /// Answers `method` for a link of `tenant` when it is one of this extension's methods;
    /// [`ExtensionReply::NotFound`] otherwise, so the next extension may answer it.
    async fn call(
        &self,
        tenant: &TenantId,
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

    /// Stops the extension's work, within `bound`; called first when the Host stops, while
    /// the listener still serves.
    async fn shutdown(&self, bound: Duration);
}
