//! Pinned releases kept in the session store: the [`Releases`] and the [`Invoker`] a Host (or
//! `hostd run exec`) drives runs with.
//!
//! **Pinning** (at a run's start) resolves each runnable in the local workspace, loaded
//! strictly, builds it into the workspace's recorded releases (so a workspace that was never
//! built still pins), and publishes the package to the store's packages when the store does not
//! hold that release yet. The store holding another digest under the same identity is a
//! `conflict`: a version is one immutable release.
//!
//! **Running** a pinned release fetches its package from the store, checks it against the
//! pinned digest (the package's own digest, recomputed from its bytes) and unpacks it into
//! `<state>/cache/<digest>`; the handler runs there. A pinned release is never looked up in the
//! live workspace, so editing, breaking or removing a declaration, or a Host started without a
//! workspace, changes nothing for a run already pinned.
//!
//! Owns the shelf of verified releases this process holds in memory (at most
//! [`SHELF_CAPACITY`], the oldest dropped first; the unpacked folders stay on disk). It must
//! never resolve a reference when it invokes: an invocation names the pinned identity and
//! digest.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use runnable::package::{Destination, build};
use runnable::{Digest, InvokeOptions, InvokeRequest, Release, Runner};
use sessionstore::{ErrorCode, NewPackage, Publication, RunPin, Store, StoreError};

use crate::pinning::identity_of;
use crate::program::RunnableInfo;
use crate::seam::{InvokeCall, InvokeDone, Invoker, ReleaseError, Releases};

/// The most verified releases kept in memory.
pub const SHELF_CAPACITY: usize = 64;

/// Releases pinned from a workspace and run from the session store.
pub struct StoreReleases {
    store: Store,
    workspace: Option<Runner>,
    state: PathBuf,
    options: InvokeOptions,
    shelf: Mutex<VecDeque<Release>>,
}

impl std::fmt::Debug for StoreReleases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReleases")
            .field("state", &self.state)
            .field(
                "workspace",
                &self.workspace.as_ref().map(|r| r.workspace().root.clone()),
            )
            .finish()
    }
}

fn info(release: &Release) -> RunnableInfo {
    RunnableInfo {
        identity: release.identity().to_string(),
        digest: release.digest().to_string(),
        effect: release.effect(),
        input: release.declaration().input.clone(),
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> ReleaseError {
    ReleaseError::Unavailable(format!("{what}: {e}"))
}

fn from_store(identity: &str, e: StoreError) -> ReleaseError {
    match e.code() {
        ErrorCode::Integrity => ReleaseError::Changed(format!("{identity}: {e}")),
        ErrorCode::Invalid => ReleaseError::Refused(format!("{identity}: {e}")),
        _ => unavailable(identity, e),
    }
}

impl StoreReleases {
    /// Releases over `store`: pinned from `workspace` (none: nothing can be pinned here, but
    /// pinned runs still run), unpacked and logged under `state` (a Host's runnable folder).
    pub fn new(store: Store, workspace: Option<Runner>, state: &Path) -> StoreReleases {
        let options = workspace
            .as_ref()
            .map(|r| r.options().clone())
            .unwrap_or_default();
        StoreReleases {
            store,
            workspace,
            state: state.to_path_buf(),
            options,
            shelf: Mutex::new(VecDeque::new()),
        }
    }

    /// The folder packages are unpacked into (`cache/`), handler logs kept (`logs/`) and live
    /// handlers recorded (`running/`).
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    fn flow_root(&self) -> Option<PathBuf> {
        self.workspace.as_ref().map(|r| r.workspace().root.clone())
    }

    fn shelved(&self, pin: &RunPin) -> Option<Release> {
        let shelf = match self.shelf.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        shelf
            .iter()
            .find(|r| r.digest().as_str() == pin.digest && r.identity().to_string() == pin.identity)
            .cloned()
    }

    fn shelve(&self, release: Release) {
        let mut shelf = match self.shelf.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        if shelf
            .iter()
            .any(|r| r.digest() == release.digest() && r.identity() == release.identity())
        {
            return;
        }
        if shelf.len() >= SHELF_CAPACITY {
            shelf.pop_front();
        }
        shelf.push_back(release);
    }

    /// Makes `release` one of the store's packages unless the store holds it already.
    async fn publish(&self, release: &Release) -> Result<(), ReleaseError> {
        let id = release.identity();
        let digest = release.digest().to_string();
        let identity = id.to_string();
        let conflict = |recorded: &str| {
            ReleaseError::Conflict(format!(
                "the store holds {identity} with digest {recorded}; the workspace builds it as \
                 {digest}. A version is an immutable release: give the changed content a new \
                 version"
            ))
        };
        let held = self
            .store
            .package_summary(&id.workspace, &id.name, &id.version)
            .await
            .map_err(|e| from_store(&identity, e))?;
        match held {
            Some(s) if s.digest == digest => return Ok(()),
            Some(s) => return Err(conflict(&s.digest)),
            None => {}
        }
        let published = self
            .store
            .publish_package(NewPackage {
                workspace: id.workspace.clone(),
                name: id.name.clone(),
                version: id.version.clone(),
                digest: digest.clone(),
                bytes: release.package().encode(),
            })
            .await
            .map_err(|e| from_store(&identity, e))?;
        match published {
            Publication::Recorded(_) => {
                tracing::info!(runnable = %identity, %digest, "published a pinned release to the store");
                Ok(())
            }
            Publication::Unchanged(_) => Ok(()),
            Publication::Conflict { recorded } => Err(conflict(&recorded.digest)),
        }
    }

    /// The pinned release, verified and unpacked: from the shelf, else from the store.
    pub async fn release(&self, pin: &RunPin) -> Result<Release, ReleaseError> {
        if let Some(r) = self.shelved(pin) {
            return Ok(r);
        }
        let changed = |why: String| ReleaseError::Changed(format!("{}: {why}", pin.identity));
        let id = identity_of(&pin.identity)
            .ok_or_else(|| changed("the pin names no workspace/name@version".into()))?;
        let digest = Digest::parse(&pin.digest)
            .ok_or_else(|| changed(format!("the pinned digest {} is unreadable", pin.digest)))?;
        let stored = self
            .store
            .package(&id.workspace, &id.name, &id.version)
            .await
            .map_err(|e| from_store(&pin.identity, e))?
            .ok_or_else(|| {
                ReleaseError::Missing(format!(
                    "{} is not among the store's packages (it was pinned at {})",
                    pin.identity, pin.digest
                ))
            })?;
        if stored.summary.digest != pin.digest {
            return Err(changed(format!(
                "the store holds digest {}, but the run is pinned to {}",
                stored.summary.digest, pin.digest
            )));
        }
        let (state, flow_root) = (self.state.clone(), self.flow_root());
        let release = tokio::task::spawn_blocking(move || {
            Release::from_bytes(&stored.bytes, Some(&digest), &state, flow_root)
        })
        .await
        .map_err(|e| unavailable(&pin.identity, e))?
        .map_err(|e| match e.code() {
            "io" => unavailable(&pin.identity, e),
            _ => changed(e.to_string()),
        })?;
        self.shelve(release.clone());
        Ok(release)
    }
}

#[async_trait]
impl Releases for StoreReleases {
    async fn pin(&self, resolved: &[RunnableInfo]) -> Result<Vec<RunPin>, ReleaseError> {
        let mut identities: Vec<String> = resolved.iter().map(|r| r.identity.clone()).collect();
        identities.sort();
        identities.dedup();
        if identities.is_empty() {
            return Ok(Vec::new());
        }
        let runner = self.workspace.clone().ok_or_else(|| {
            ReleaseError::Refused(
                "no runnable workspace is configured here (--runnables): nothing can be pinned"
                    .into(),
            )
        })?;
        let (state, flow_root) = (self.state.clone(), self.flow_root());
        let built = tokio::task::spawn_blocking(move || -> Result<Vec<Release>, ReleaseError> {
            let catalog = runner
                .catalog()
                .map_err(|e| ReleaseError::Refused(e.to_string()))?;
            let releases = Destination::Releases(runner.workspace().releases_dir());
            identities
                .iter()
                .map(|identity| {
                    let decl = catalog
                        .resolve(identity)
                        .map_err(|e| ReleaseError::Refused(e.to_string()))?;
                    let built = build(decl, &releases).map_err(|e| match e.code() {
                        "conflict" => ReleaseError::Conflict(e.to_string()),
                        "io" => unavailable(identity, e),
                        _ => ReleaseError::Refused(e.to_string()),
                    })?;
                    Release::new(built.package, &state, flow_root.clone()).map_err(|e| {
                        match e.code() {
                            "io" => unavailable(identity, e),
                            _ => ReleaseError::Refused(e.to_string()),
                        }
                    })
                })
                .collect()
        })
        .await
        .map_err(|e| unavailable("pinning", e))??;
        let mut pins = Vec::with_capacity(built.len());
        for release in built {
            self.publish(&release).await?;
            pins.push(RunPin {
                identity: release.identity().to_string(),
                digest: release.digest().to_string(),
            });
            self.shelve(release);
        }
        Ok(pins)
    }

    async fn pinned(&self, pin: &RunPin) -> Result<RunnableInfo, ReleaseError> {
        self.release(pin).await.map(|r| info(&r))
    }
}

#[async_trait]
impl Invoker for StoreReleases {
    async fn invoke(&self, call: InvokeCall) -> Result<InvokeDone, String> {
        let pin = RunPin {
            identity: call.identity.clone(),
            digest: call.digest.clone(),
        };
        let release = self
            .release(&pin)
            .await
            .map_err(|e| format!("{}: {e}", e.code()))?;
        let done = runnable::invoke(
            &release,
            InvokeRequest {
                input: call.input,
                intent_id: Some(call.intent_id),
                effect_id: Some(call.effect_id),
            },
            &self.options,
            &call.cancel,
        )
        .await
        .map_err(|e| format!("{}: {e}", e.code()))?;
        Ok(InvokeDone {
            outcome: done.outcome,
            output: done.output,
            detail: done.detail,
        })
    }
}
