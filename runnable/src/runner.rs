//! The library entry point for a workspace's runnables: list, show, build and invoke by name,
//! the same calls `hostd runnable` makes and a workflow step makes.
//!
//! ```no_run
//! # async fn demo() -> Result<(), runnable::RunnableError> {
//! use runnable::{InvokeRequest, Runner};
//! let runner = Runner::open(std::path::Path::new("examples/runnables"))?;
//! let done = runner
//!     .invoke(
//!         "word-count@1.0.0",
//!         InvokeRequest {
//!             input: serde_json::json!({"text": "a b c"}),
//!             intent_id: Some("order-42".into()), // reuse it when retrying this intent
//!             effect_id: None,                     // derived: same intent + release, same id
//!         },
//!         &tokio_util::sync::CancellationToken::new(),
//!     )
//!     .await?;
//! println!("{} certain={} {:?}", done.outcome, done.certain, done.output);
//! # Ok(()) }
//! ```
//!
//! `invoke` always runs verified package bytes: it records the release first (the same rules
//! as `build`: a changed source under a recorded version is a `conflict`), unpacks the
//! package into the cache, and runs that. This module must never keep state between calls:
//! every call reads the workspace afresh.

use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::declaration::Declaration;
use crate::error::RunnableError;
use crate::invoke::{Invocation, InvokeOptions, InvokeRequest, invoke};
use crate::package::{Built, Destination, build};
use crate::release::Release;
use crate::workspace::{Catalog, Workspace};

/// A workspace's runnables.
#[derive(Debug, Clone)]
pub struct Runner {
    workspace: Workspace,
    options: InvokeOptions,
}

impl Runner {
    /// Opens the workspace at `root` with default invocation bounds.
    pub fn open(root: &Path) -> Result<Runner, RunnableError> {
        Ok(Runner {
            workspace: Workspace::open(root)?,
            options: InvokeOptions::default(),
        })
    }

    /// Replaces the invocation bounds.
    pub fn with_options(mut self, options: InvokeOptions) -> Result<Runner, RunnableError> {
        options
            .validate()
            .map_err(|reason| RunnableError::Workspace {
                path: self.workspace.root.clone(),
                reason,
            })?;
        self.options = options;
        Ok(self)
    }

    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    pub fn options(&self) -> &InvokeOptions {
        &self.options
    }

    /// Every runnable, strictly (any broken declaration fails the whole load).
    pub fn catalog(&self) -> Result<Catalog, RunnableError> {
        self.workspace.load()
    }

    /// Builds `reference` into the workspace's recorded releases.
    pub fn build(&self, reference: &str) -> Result<Built, RunnableError> {
        let catalog = self.catalog()?;
        let decl = catalog.resolve(reference)?;
        build(decl, &Destination::Releases(self.workspace.releases_dir()))
    }

    /// Builds `reference` into `output`, a folder that must not exist (an unreleased build).
    pub fn build_to(&self, reference: &str, output: &Path) -> Result<Built, RunnableError> {
        let catalog = self.catalog()?;
        let decl = catalog.resolve(reference)?;
        build(decl, &Destination::Output(output.to_path_buf()))
    }

    /// The release `reference` names, recorded and unpacked, ready to invoke.
    pub fn release(&self, reference: &str) -> Result<Release, RunnableError> {
        let catalog = self.catalog()?;
        let decl = catalog.resolve(reference)?;
        self.release_of(decl)
    }

    /// The release of a declaration already resolved.
    pub fn release_of(&self, decl: &Declaration) -> Result<Release, RunnableError> {
        let built = build(decl, &Destination::Releases(self.workspace.releases_dir()))?;
        Release::new(
            built.package,
            &self.workspace.state_dir(),
            Some(self.workspace.root.clone()),
        )
    }

    /// Resolves, records, unpacks and invokes `reference` once.
    pub async fn invoke(
        &self,
        reference: &str,
        request: InvokeRequest,
        cancel: &CancellationToken,
    ) -> Result<Invocation, RunnableError> {
        let release = self.release(reference)?;
        invoke(&release, request, &self.options, cancel).await
    }
}
