//! A runnables workspace: a folder whose `runnables/<folder>/runnable.yaml` files declare
//! runnables, its strict loading into a [`Catalog`], and the one resolver every caller (CLI
//! `show` and `invoke`, agent tools, workflow steps) turns a typed name into a release with.
//!
//! **Workspace name.** The workspace part of an identity is the workspace folder's own name
//! (after resolving symlinks and `..`), so `~/src/shop` declares `shop/<name>@<version>`.
//!
//! **Strictness.** Loading reads every declaration and fails if any one does not load, listing
//! every problem of every file: a listing is never shortened, and a lookup never resolves
//! "around" a broken declaration. A folder under `runnables/` without `runnable.yaml` is a
//! problem too; names starting with `.` are skipped.
//!
//! **No latest.** A name with one release resolves to it; a name with several is `ambiguous`
//! and lists every candidate; nothing picks by version order or time.
//!
//! This module owns discovery and resolution; it must never build, unpack or run anything.

use std::path::{Path, PathBuf};

use crate::declaration::{DECLARATION_FILE, Declaration};
use crate::error::{DeclarationProblem, RunnableError, codes};
use crate::identity::{Identity, Reference, check_part, compare_versions};
use crate::package::{Digest, package_file_name, recorded_digest};

/// The folder of runnable declarations inside a workspace.
pub const RUNNABLES_DIR: &str = "runnables";
/// hostd's own state inside a workspace.
pub const STATE_DIR: &str = ".hostd/runnables";

/// A workspace folder.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The folder, canonical.
    pub root: PathBuf,
    /// The workspace part of identities.
    pub name: String,
}

impl Workspace {
    /// Opens the workspace at `root`.
    pub fn open(root: &Path) -> Result<Workspace, RunnableError> {
        let canonical = std::fs::canonicalize(root).map_err(|e| RunnableError::Workspace {
            path: root.to_path_buf(),
            reason: format!("cannot open the workspace folder: {e}"),
        })?;
        if !canonical.is_dir() {
            return Err(RunnableError::Workspace {
                path: root.to_path_buf(),
                reason: "is not a folder".into(),
            });
        }
        let name = canonical
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        check_part(&name).map_err(|reason| RunnableError::Workspace {
            path: canonical.clone(),
            reason: format!("the folder's name is the workspace name, and it {reason}"),
        })?;
        Ok(Workspace {
            root: canonical,
            name,
        })
    }

    pub fn state_dir(&self) -> PathBuf {
        self.root.join(STATE_DIR)
    }

    /// Where releases are recorded (one package file per `name@version`).
    pub fn releases_dir(&self) -> PathBuf {
        self.state_dir().join("releases")
    }

    /// Where packages are unpacked to run.
    pub fn cache_dir(&self) -> PathBuf {
        self.state_dir().join("cache")
    }

    /// Where each invocation's handler log goes.
    pub fn logs_dir(&self) -> PathBuf {
        self.state_dir().join("logs")
    }

    /// The recorded release file of `identity`.
    pub fn release_path(&self, identity: &Identity) -> PathBuf {
        self.releases_dir().join(package_file_name(identity))
    }

    /// Loads every declaration; fails listing every problem if any does not load.
    pub fn load(&self) -> Result<Catalog, RunnableError> {
        let dir = self.root.join(RUNNABLES_DIR);
        let mut folders = Vec::new();
        match std::fs::read_dir(&dir) {
            Ok(entries) => {
                for entry in entries {
                    let entry = entry.map_err(|e| RunnableError::io(&dir, e))?;
                    let name = entry.file_name();
                    if name.to_string_lossy().starts_with('.') {
                        continue;
                    }
                    let path = entry.path();
                    if path.is_dir() {
                        folders.push(path);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RunnableError::io(&dir, e)),
        }
        folders.sort();
        let mut problems: Vec<DeclarationProblem> = Vec::new();
        let mut runnables: Vec<Declaration> = Vec::new();
        for folder in folders {
            let file = folder.join(DECLARATION_FILE);
            if !file.exists() {
                problems.push(DeclarationProblem {
                    file,
                    line: 0,
                    column: 0,
                    code: codes::UNREADABLE,
                    path: String::new(),
                    message: format!(
                        "the folder {} under {RUNNABLES_DIR}/ has no {DECLARATION_FILE}",
                        folder.display()
                    ),
                });
                continue;
            }
            match Declaration::load(&self.name, &folder, &file) {
                Ok(d) => runnables.push(d),
                Err(mut p) => problems.append(&mut p),
            }
        }
        runnables.sort_by(|a, b| {
            a.identity
                .name
                .cmp(&b.identity.name)
                .then_with(|| compare_versions(&a.identity.version, &b.identity.version))
        });
        for pair in runnables.windows(2) {
            if pair[0].identity == pair[1].identity {
                problems.push(DeclarationProblem {
                    file: pair[1].file.clone(),
                    line: 0,
                    column: 0,
                    code: codes::DUPLICATE,
                    path: String::new(),
                    message: format!(
                        "{} is declared twice: in {} and in {}; a version is one release",
                        pair[1].identity,
                        pair[0].file.display(),
                        pair[1].file.display()
                    ),
                });
            }
        }
        if !problems.is_empty() {
            return Err(RunnableError::Declaration { problems });
        }
        Ok(Catalog {
            workspace: self.clone(),
            runnables,
        })
    }
}

/// Every runnable of a workspace, loaded, in list order (name, then version).
#[derive(Debug, Clone)]
pub struct Catalog {
    pub workspace: Workspace,
    pub runnables: Vec<Declaration>,
}

impl Catalog {
    /// Resolves a typed reference (see [`resolve`]).
    pub fn resolve(&self, reference: &str) -> Result<&Declaration, RunnableError> {
        resolve(&self.runnables, |d| &d.identity, reference)
    }

    /// The digest of `decl`'s recorded release, if it was built.
    pub fn recorded_digest(&self, decl: &Declaration) -> Option<Digest> {
        recorded_digest(&self.workspace.release_path(&decl.identity))
    }
}

/// The one resolver: `name`, `name@version` or `workspace/name@version` against `items`.
/// Exactly one match is the answer; none is `not_found` listing the releases of that name;
/// more than one is `ambiguous` listing every candidate.
pub fn resolve<'a, T>(
    items: &'a [T],
    identity_of: impl Fn(&T) -> &Identity,
    reference: &str,
) -> Result<&'a T, RunnableError> {
    let parsed = Reference::parse(reference).map_err(|reason| RunnableError::BadReference {
        reference: reference.to_owned(),
        reason,
    })?;
    let matching: Vec<&T> = items
        .iter()
        .filter(|i| parsed.matches(identity_of(i)))
        .collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] => Err(RunnableError::NotFound {
            reference: reference.to_owned(),
            available: items
                .iter()
                .map(&identity_of)
                .filter(|id| id.name == parsed.name)
                .map(|id| id.to_string())
                .collect(),
        }),
        many => Err(RunnableError::Ambiguous {
            reference: reference.to_owned(),
            candidates: many.iter().map(|i| identity_of(i).to_string()).collect(),
        }),
    }
}
