//! A release ready to run: a verified package, unpacked into a cache folder named by its
//! digest, with its declaration read from the packaged bytes (never from a source folder that
//! may have changed since).
//!
//! State lives under one folder (a workspace's `.hostd/runnables`, or a Host's runnable
//! folder): `cache/<digest>` (unpacked packages), `logs/` (one handler log per invocation)
//! and `running/` (a record per live handler, so a successor can stop what a crashed process
//! left behind). This module owns those folders' layout; it must never decide an outcome.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::declaration::{Declaration, Effect};
use crate::error::RunnableError;
use crate::identity::Identity;
use crate::package::{Digest, Package, materialise, verify_tree};

/// A verified, unpacked release.
#[derive(Debug, Clone)]
pub struct Release {
    package: Arc<Package>,
    declaration: Arc<Declaration>,
    dir: PathBuf,
    state: PathBuf,
    flow_root: Option<PathBuf>,
}

impl Release {
    /// Unpacks a verified `package` under `state/cache` and reads its declaration.
    /// `flow_root` is the flow workspace dependencies resolve against, if any.
    pub fn new(
        package: Package,
        state: &Path,
        flow_root: Option<PathBuf>,
    ) -> Result<Release, RunnableError> {
        let dir = materialise(&package, &state.join("cache"))?;
        let declaration = package.declaration(&dir)?;
        Ok(Release {
            package: Arc::new(package),
            declaration: Arc::new(declaration),
            dir,
            state: state.to_path_buf(),
            flow_root,
        })
    }

    /// Reads package bytes (verifying them: a tampered package is `integrity`) and unpacks
    /// them. How a Host runs a release published in the session store.
    pub fn from_bytes(
        bytes: &[u8],
        expected: Option<&Digest>,
        state: &Path,
        flow_root: Option<PathBuf>,
    ) -> Result<Release, RunnableError> {
        let package = Package::decode(bytes, "the package")?;
        if let Some(want) = expected
            && *want != package.digest
        {
            return Err(RunnableError::Integrity {
                what: package.identity.to_string(),
                reason: format!(
                    "the package has digest {}, but {want} was expected",
                    package.digest
                ),
            });
        }
        Release::new(package, state, flow_root)
    }

    pub fn identity(&self) -> &Identity {
        &self.package.identity
    }

    pub fn digest(&self) -> &Digest {
        &self.package.digest
    }

    pub fn declaration(&self) -> &Declaration {
        &self.declaration
    }

    pub fn effect(&self) -> Effect {
        self.declaration.effect
    }

    pub fn package(&self) -> &Package {
        &self.package
    }

    /// The unpacked folder the handler runs in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn flow_root(&self) -> Option<&Path> {
        self.flow_root.as_deref()
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.state.join("logs")
    }

    pub fn running_dir(&self) -> PathBuf {
        self.state.join("running")
    }

    /// Checks the unpacked folder still holds the verified bytes; unpacks again if not.
    pub(crate) fn ensure_unpacked(&self) -> Result<(), RunnableError> {
        if verify_tree(&self.dir, &self.package).is_ok() {
            return Ok(());
        }
        let again = materialise(&self.package, &self.state.join("cache"))?;
        if again != self.dir {
            return Err(RunnableError::Integrity {
                what: self.identity().to_string(),
                reason: "the cache folder moved".into(),
            });
        }
        Ok(())
    }
}
