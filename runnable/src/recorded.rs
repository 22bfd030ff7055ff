//! The workspace's recorded releases as an author manages them: each one listed with whether
//! its declaration's folder still packages to the recorded digest, and removed on request.
//!
//! This module reads `<workspace>/.hostd/runnables/releases` and removes files from it; it
//! never builds, never touches the unpacked cache (a Host may be running a handler from it)
//! and knows nothing of runs — what a live run is pinned to is the caller's question.

use std::path::PathBuf;

use crate::error::RunnableError;
use crate::package::{self, Digest, PACKAGE_EXTENSION, Package};
use crate::workspace::Workspace;

/// How a recorded release stands against the workspace as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// The declaration's folder packages to exactly the recorded digest.
    Current,
    /// The declaration's folder has changed since: building it again under this version is a
    /// `conflict` until the release is pruned (or the version bumped).
    Changed,
    /// No declaration of this identity is left in the workspace.
    Orphan,
    /// The workspace does not load (a broken declaration), so nothing could be compared.
    Unchecked,
    /// The file is not a readable package (its integrity check failed).
    Unreadable,
}

impl RecordState {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Current => "current",
            RecordState::Changed => "changed",
            RecordState::Orphan => "orphan",
            RecordState::Unchecked => "unchecked",
            RecordState::Unreadable => "unreadable",
        }
    }

    /// Whether a plain `prune` (no names) removes a release in this state: the ones that can
    /// no longer be built again as they are.
    pub fn stale(self) -> bool {
        matches!(
            self,
            RecordState::Changed | RecordState::Orphan | RecordState::Unreadable
        )
    }
}

/// One recorded release.
#[derive(Debug, Clone)]
pub struct RecordedRelease {
    /// `workspace/name@version` (for an unreadable file: the workspace and the file's stem).
    pub identity: String,
    /// `name@version` (the file's stem).
    pub release: String,
    pub digest: Option<Digest>,
    pub path: PathBuf,
    pub size: u64,
    pub state: RecordState,
    /// Why the state is what it is, when that needs saying.
    pub note: Option<String>,
}

/// Every recorded release of `workspace`, sorted by `name@version`.
pub fn recorded(workspace: &Workspace) -> Result<Vec<RecordedRelease>, RunnableError> {
    let dir = workspace.releases_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(RunnableError::io(&dir, e)),
    };
    let catalog = workspace.load();
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| RunnableError::io(&dir, e))?;
        let path = entry.path();
        let Some(release) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(&format!(".{PACKAGE_EXTENSION}")))
            .map(str::to_owned)
        else {
            continue;
        };
        let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
        let package = match package::read_recorded(&path) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(e) => {
                out.push(RecordedRelease {
                    identity: format!("{}/{release}", workspace.name),
                    release,
                    digest: None,
                    path,
                    size,
                    state: RecordState::Unreadable,
                    note: Some(e.to_string()),
                });
                continue;
            }
        };
        let (state, note) = match &catalog {
            Err(e) => (
                RecordState::Unchecked,
                Some(format!("the workspace does not load: {e}")),
            ),
            Ok(catalog) => stand(&package, catalog)?,
        };
        out.push(RecordedRelease {
            identity: package.identity.to_string(),
            release,
            digest: Some(package.digest.clone()),
            path,
            size,
            state,
            note,
        });
    }
    out.sort_by(|a, b| a.release.cmp(&b.release));
    Ok(out)
}

fn stand(
    package: &Package,
    catalog: &crate::workspace::Catalog,
) -> Result<(RecordState, Option<String>), RunnableError> {
    let Some(decl) = catalog
        .runnables
        .iter()
        .find(|d| d.identity == package.identity)
    else {
        return Ok((
            RecordState::Orphan,
            Some("no declaration of this name and version is left".into()),
        ));
    };
    let now = Digest::of(&package::collect(&decl.folder)?);
    Ok(if now == package.digest {
        (RecordState::Current, None)
    } else {
        (
            RecordState::Changed,
            Some(format!(
                "{} now packages to {now}: prune this release to build it again under the same version, or give it a new version",
                decl.folder.display()
            )),
        )
    })
}

/// Removes one recorded release's file. The unpacked cache is left alone.
pub fn remove(release: &RecordedRelease) -> Result<(), RunnableError> {
    std::fs::remove_file(&release.path).map_err(|e| RunnableError::io(&release.path, e))
}
