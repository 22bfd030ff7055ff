//! Packages: the one file a release is built into, its digest, the recorded releases of a
//! workspace, and the cache folders a package is unpacked into before it runs.
//!
//! **Which files.** A package holds every regular file under the runnable's folder, at any
//! depth, except entries whose name starts with `.` (so `.git`, editor files and hostd's own
//! `.hostd` stay out). A symlink is packaged as the file it points to when that file is inside
//! the folder; a symlink that leaves the folder, or points to a folder, is refused.
//!
//! **The digest** is SHA-256 over: the domain text `hostd.runnable.digest/1` and a zero byte;
//! then, for each file in byte-wise order of its relative path (`/`-separated), the path's
//! length as 8 bytes big-endian, the path, one byte `1` if the file is executable by its owner
//! (else `0`), the content's length as 8 bytes big-endian, and the content. So renaming a file,
//! moving bytes between files or flipping the executable bit changes the digest; timestamps,
//! owners, the folder's location and the order files were found in do not. It is written
//! `sha256:<64 hex digits>`.
//!
//! **The package file**: the line `hostd-runnable-package/1`, then one line of JSON (format,
//! identity, digest and the file list with sizes and executable bits), then the files'
//! contents back to back in list order. Nothing in it depends on time or place.
//!
//! This module owns those bytes and the folders they are written to. It must never run a
//! handler, and it never writes a package or a cache folder in place: everything is written
//! aside and renamed, so a failure leaves what was there before untouched.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::declaration::{DECLARATION_FILE, Declaration};
use crate::error::RunnableError;
use crate::identity::Identity;

/// The first line of every package file.
pub const PACKAGE_MAGIC: &str = "hostd-runnable-package/1\n";
/// The domain text the digest starts with.
pub const DIGEST_DOMAIN: &[u8] = b"hostd.runnable.digest/1\0";
/// The largest package accepted (all files together).
pub const MAX_PACKAGE_BYTES: u64 = 32 * 1024 * 1024;
/// The most files a package may hold.
pub const MAX_FILES: usize = 4096;
/// The file extension of a package.
pub const PACKAGE_EXTENSION: &str = "pkg";

/// One file of a package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackagedFile {
    /// Relative to the runnable's folder, `/`-separated.
    pub path: String,
    pub executable: bool,
    pub bytes: Vec<u8>,
}

/// A package digest, `sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Digest(String);

impl Digest {
    /// Computes the digest of `files` (any order: they are sorted here).
    pub fn of(files: &[PackagedFile]) -> Digest {
        let mut sorted: Vec<&PackagedFile> = files.iter().collect();
        sorted.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let mut h = Sha256::new();
        h.update(DIGEST_DOMAIN);
        for f in sorted {
            h.update((f.path.len() as u64).to_be_bytes());
            h.update(f.path.as_bytes());
            h.update([u8::from(f.executable)]);
            h.update((f.bytes.len() as u64).to_be_bytes());
            h.update(&f.bytes);
        }
        Digest(format!("sha256:{}", hex::encode(h.finalize())))
    }

    /// Parses `sha256:<64 lowercase hex>`.
    pub fn parse(text: &str) -> Option<Digest> {
        let hex = text.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| Digest(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        self.0.strip_prefix("sha256:").unwrap_or(&self.0)
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Index {
    format: u32,
    identity: Identity,
    digest: Digest,
    files: Vec<IndexEntry>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexEntry {
    path: String,
    size: u64,
    executable: bool,
}

/// A verified package: its identity, its digest and its files (sorted by path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub identity: Identity,
    pub digest: Digest,
    pub files: Vec<PackagedFile>,
}

impl Package {
    /// A package of `files` (sorted here) for `identity`.
    pub fn new(identity: Identity, mut files: Vec<PackagedFile>) -> Package {
        files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let digest = Digest::of(&files);
        Package {
            identity,
            digest,
            files,
        }
    }

    /// The package file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let index = Index {
            format: 1,
            identity: self.identity.clone(),
            digest: self.digest.clone(),
            files: self
                .files
                .iter()
                .map(|f| IndexEntry {
                    path: f.path.clone(),
                    size: f.bytes.len() as u64,
                    executable: f.executable,
                })
                .collect(),
        };
        let mut out = Vec::new();
        out.extend_from_slice(PACKAGE_MAGIC.as_bytes());
        // Serializing plain strings, numbers and booleans cannot fail.
        out.extend_from_slice(&serde_json::to_vec(&index).unwrap_or_default());
        out.push(b'\n');
        for f in &self.files {
            out.extend_from_slice(&f.bytes);
        }
        out
    }

    /// Reads and verifies package bytes: the layout, the digest recomputed from the contents,
    /// and the packaged declaration naming the same release. Anything else is `integrity`.
    pub fn decode(bytes: &[u8], what: &str) -> Result<Package, RunnableError> {
        let bad = |reason: String| RunnableError::Integrity {
            what: what.to_owned(),
            reason,
        };
        if bytes.len() as u64 > MAX_PACKAGE_BYTES + 1024 * 1024 {
            return Err(bad("larger than any package".into()));
        }
        let rest = bytes
            .strip_prefix(PACKAGE_MAGIC.as_bytes())
            .ok_or_else(|| bad("not a hostd runnable package (bad first line)".into()))?;
        let newline = rest
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| bad("the index line is unterminated".into()))?;
        let index: Index = serde_json::from_slice(&rest[..newline])
            .map_err(|e| bad(format!("the index does not parse: {e}")))?;
        if index.format != 1 {
            return Err(bad(format!("unknown package format {}", index.format)));
        }
        if index.files.len() > MAX_FILES {
            return Err(bad("too many files".into()));
        }
        let mut body = &rest[newline + 1..];
        let mut files = Vec::with_capacity(index.files.len());
        for entry in &index.files {
            if !crate::declaration::stays_inside(&entry.path) || entry.path.contains('\\') {
                return Err(bad(format!("the path `{}` leaves the package", entry.path)));
            }
            let size = usize::try_from(entry.size)
                .ok()
                .filter(|s| *s <= body.len())
                .ok_or_else(|| bad(format!("`{}` is truncated", entry.path)))?;
            files.push(PackagedFile {
                path: entry.path.clone(),
                executable: entry.executable,
                bytes: body[..size].to_vec(),
            });
            body = &body[size..];
        }
        if !body.is_empty() {
            return Err(bad(format!(
                "{} trailing byte(s) after the files",
                body.len()
            )));
        }
        let sorted = files
            .windows(2)
            .all(|w| w[0].path.as_bytes() < w[1].path.as_bytes());
        if !sorted {
            return Err(bad("the files are not in canonical order".into()));
        }
        let digest = Digest::of(&files);
        if digest != index.digest {
            return Err(bad(format!(
                "the contents have digest {digest}, but the package records {}",
                index.digest
            )));
        }
        let package = Package {
            identity: index.identity,
            digest,
            files,
        };
        let decl = package.declaration(Path::new("."))?;
        if decl.identity.name != package.identity.name
            || decl.identity.version != package.identity.version
        {
            return Err(bad(format!(
                "the index names {} but the packaged declaration declares {}",
                package.identity.release(),
                decl.identity.release()
            )));
        }
        Ok(package)
    }

    /// The packaged declaration, as if its folder were `folder`.
    pub fn declaration(&self, folder: &Path) -> Result<Declaration, RunnableError> {
        let file = self
            .files
            .iter()
            .find(|f| f.path == DECLARATION_FILE)
            .ok_or_else(|| RunnableError::Integrity {
                what: self.identity.to_string(),
                reason: format!("the package holds no {DECLARATION_FILE}"),
            })?;
        // Path checks against `folder` happen at build; a package is checked by its digest,
        // and its handler path is looked up among the packaged files.
        let packaged = |rel: &str| {
            let rel = rel.trim_start_matches("./");
            self.files.iter().any(|f| f.path == rel)
        };
        Declaration::parse_with(
            &self.identity.workspace,
            folder,
            &folder.join(DECLARATION_FILE),
            &file.bytes,
            &packaged,
        )
        .map_err(|problems| RunnableError::Declaration { problems })
    }

    /// Total content bytes.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.bytes.len() as u64).sum()
    }
}

/// Reads the files a package of `folder` holds (see the module docs for the rule).
pub fn collect(folder: &Path) -> Result<Vec<PackagedFile>, RunnableError> {
    let root = fs::canonicalize(folder).map_err(|e| RunnableError::io(folder, e))?;
    let mut out = Vec::new();
    let mut total = 0u64;
    walk(&root, &root, "", &mut out, &mut total)?;
    out.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    Ok(out)
}

fn walk(
    root: &Path,
    dir: &Path,
    prefix: &str,
    out: &mut Vec<PackagedFile>,
    total: &mut u64,
) -> Result<(), RunnableError> {
    let entries = fs::read_dir(dir).map_err(|e| RunnableError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| RunnableError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(RunnableError::Build {
                path: entry.path(),
                reason: "a file name that is not UTF-8 cannot be packaged".into(),
            });
        };
        if name.starts_with('.') {
            continue;
        }
        let rel = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(|e| RunnableError::io(&path, e))?;
        let (meta, source) = if meta.file_type().is_symlink() {
            let target = fs::canonicalize(&path).map_err(|e| RunnableError::Build {
                path: path.clone(),
                reason: format!("a symlink that does not resolve: {e}"),
            })?;
            if !target.starts_with(root) {
                return Err(RunnableError::Build {
                    path: path.clone(),
                    reason: format!(
                        "the symlink `{rel}` points to {}, outside the runnable's folder; it is not followed",
                        target.display()
                    ),
                });
            }
            let tmeta = fs::metadata(&target).map_err(|e| RunnableError::io(&target, e))?;
            if !tmeta.is_file() {
                return Err(RunnableError::Build {
                    path: path.clone(),
                    reason: format!(
                        "the symlink `{rel}` points to a folder; only files are packaged through symlinks"
                    ),
                });
            }
            (tmeta, target)
        } else {
            (meta, path.clone())
        };
        if meta.is_dir() {
            walk(root, &source, &rel, out, total)?;
            continue;
        }
        if !meta.is_file() {
            return Err(RunnableError::Build {
                path,
                reason: format!("`{rel}` is neither a file nor a folder"),
            });
        }
        let bytes = fs::read(&source).map_err(|e| RunnableError::io(&source, e))?;
        *total += bytes.len() as u64;
        if *total > MAX_PACKAGE_BYTES || out.len() >= MAX_FILES {
            return Err(RunnableError::Build {
                path: root.to_path_buf(),
                reason: format!(
                    "the folder holds more than {MAX_PACKAGE_BYTES} bytes or {MAX_FILES} files"
                ),
            });
        }
        out.push(PackagedFile {
            path: rel,
            executable: meta.permissions().mode() & 0o100 != 0,
            bytes,
        });
    }
    Ok(())
}

/// Where a build writes.
#[derive(Debug, Clone)]
pub enum Destination {
    /// The workspace's recorded releases (`<workspace>/.hostd/runnables/releases`): a release
    /// is written once; the same content again is a no-op, different content a conflict.
    Releases(PathBuf),
    /// An explicit output folder that must not exist yet: an unreleased build, for
    /// inspection. It is never consulted for conflicts; a failed build leaves it in place.
    Output(PathBuf),
}

/// What a build did.
#[derive(Debug, Clone)]
pub struct Built {
    pub package: Package,
    /// The package file.
    pub path: PathBuf,
    /// False when the same release was already recorded with the same digest.
    pub written: bool,
}

/// The file name of a release's package.
pub fn package_file_name(identity: &Identity) -> String {
    format!("{}.{PACKAGE_EXTENSION}", identity.release())
}

/// Test seam: runs between hashing the sources and checking them again.
pub type BuildHook<'a> = &'a dyn Fn();

/// Builds `decl`'s folder into a package at `dest`.
pub fn build(decl: &Declaration, dest: &Destination) -> Result<Built, RunnableError> {
    build_with_hook(decl, dest, &|| {})
}

/// [`build`], running `hook` after the sources were hashed and the package was written aside.
pub fn build_with_hook(
    decl: &Declaration,
    dest: &Destination,
    hook: BuildHook<'_>,
) -> Result<Built, RunnableError> {
    let files = collect(&decl.folder)?;
    if decl.command.contains('/') {
        let wanted = decl.command.trim_start_matches("./");
        if !files.iter().any(|f| f.path == wanted) {
            return Err(RunnableError::Build {
                path: decl.folder.join(&decl.command),
                reason: format!(
                    "the handler `{}` is not among the packaged files (hidden, or outside the folder)",
                    decl.command
                ),
            });
        }
    }
    let package = Package::new(decl.identity.clone(), files);
    let (dir, final_path) = match dest {
        Destination::Releases(dir) => {
            fs::create_dir_all(dir).map_err(|e| RunnableError::io(dir, e))?;
            let path = dir.join(package_file_name(&decl.identity));
            if let Some(existing) = read_recorded(&path)? {
                return compare_recorded(existing, package, path);
            }
            (dir.clone(), path)
        }
        Destination::Output(dir) => {
            if fs::symlink_metadata(dir).is_ok() {
                return Err(RunnableError::Build {
                    path: dir.clone(),
                    reason: "the output folder exists; give a new folder (a failed build's folder is kept for inspection)".into(),
                });
            }
            fs::create_dir_all(dir).map_err(|e| RunnableError::io(dir, e))?;
            let path = dir.join(package_file_name(&decl.identity));
            (dir.clone(), path)
        }
    };
    let bytes = package.encode();
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        package_file_name(&decl.identity),
        uuid::Uuid::now_v7().simple()
    ));
    let result = (|| {
        write_synced(&tmp, &bytes)?;
        // The digest is recomputed from the bytes actually written.
        let written = fs::read(&tmp).map_err(|e| RunnableError::io(&tmp, e))?;
        let reread = Package::decode(&written, &tmp.display().to_string())?;
        if reread.digest != package.digest {
            return Err(RunnableError::Build {
                path: tmp.clone(),
                reason: "the written package does not match the sources read".into(),
            });
        }
        hook();
        let again = Digest::of(&collect(&decl.folder)?);
        if again != package.digest {
            return Err(RunnableError::Build {
                path: decl.folder.clone(),
                reason: format!(
                    "the sources changed during the build (digest {} then {again}); nothing was packaged",
                    package.digest
                ),
            });
        }
        match dest {
            Destination::Releases(_) => {
                // Link, not rename: a release another build recorded meanwhile is never
                // replaced.
                match fs::hard_link(&tmp, &final_path) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        match read_recorded(&final_path)? {
                            Some(existing) => {
                                compare_recorded(existing, package.clone(), final_path.clone())
                                    .map(|_| false)
                            }
                            None => Err(RunnableError::io(&final_path, e)),
                        }
                    }
                    Err(e) => Err(RunnableError::io(&final_path, e)),
                }
            }
            Destination::Output(_) => fs::rename(&tmp, &final_path)
                .map(|()| true)
                .map_err(|e| RunnableError::io(&final_path, e)),
        }
    })();
    let _ = fs::remove_file(&tmp);
    let written = result?;
    if written && let Destination::Releases(dir) = dest {
        sync_dir(dir);
    }
    Ok(Built {
        package,
        path: final_path,
        written,
    })
}

fn compare_recorded(
    existing: Package,
    offered: Package,
    path: PathBuf,
) -> Result<Built, RunnableError> {
    if existing.digest == offered.digest {
        Ok(Built {
            package: existing,
            path,
            written: false,
        })
    } else {
        Err(RunnableError::Conflict {
            identity: offered.identity.to_string(),
            recorded: existing.digest.to_string(),
            offered: offered.digest.to_string(),
        })
    }
}

/// Reads a recorded release, verifying it. `None` when there is none.
pub fn read_recorded(path: &Path) -> Result<Option<Package>, RunnableError> {
    match fs::read(path) {
        Ok(bytes) => Package::decode(&bytes, &path.display().to_string()).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RunnableError::io(path, e)),
    }
}

/// The digest a recorded release names, without verifying its contents (for listings).
pub fn recorded_digest(path: &Path) -> Option<Digest> {
    let bytes = fs::read(path).ok()?;
    let rest = bytes.strip_prefix(PACKAGE_MAGIC.as_bytes())?;
    let newline = rest.iter().position(|b| *b == b'\n')?;
    let index: Index = serde_json::from_slice(&rest[..newline]).ok()?;
    Some(index.digest)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), RunnableError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| RunnableError::io(path, e))?;
    f.write_all(bytes).map_err(|e| RunnableError::io(path, e))?;
    f.sync_all().map_err(|e| RunnableError::io(path, e))
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Unpacks `package` into `cache/<digest hex>` (written aside, then renamed) unless a folder
/// with exactly its files is already there, and returns that folder. A cached folder whose
/// files differ from the package (edited, truncated, removed) is replaced, never run.
pub fn materialise(package: &Package, cache: &Path) -> Result<PathBuf, RunnableError> {
    let dir = cache.join(package.digest.hex());
    match verify_tree(&dir, package) {
        Ok(()) => return Ok(dir),
        Err(reason) if dir.exists() => {
            tracing::warn!(dir = %dir.display(), %reason, "a cached package differs from its verified bytes; unpacking it again");
            make_writable(&dir);
            fs::remove_dir_all(&dir).map_err(|e| RunnableError::io(&dir, e))?;
        }
        Err(_) => {}
    }
    fs::create_dir_all(cache).map_err(|e| RunnableError::io(cache, e))?;
    let tmp = cache.join(format!(".unpack-{}", uuid::Uuid::now_v7().simple()));
    let result = (|| {
        fs::create_dir(&tmp).map_err(|e| RunnableError::io(&tmp, e))?;
        for f in &package.files {
            let path = tmp.join(&f.path);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(|e| RunnableError::io(parent, e))?;
            }
            write_synced(&path, &f.bytes)?;
            let mode = if f.executable { 0o555 } else { 0o444 };
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(|e| RunnableError::io(&path, e))?;
        }
        match fs::rename(&tmp, &dir) {
            Ok(()) => Ok(()),
            // Another process unpacked the same digest first: use it if it is whole.
            Err(_) if verify_tree(&dir, package).is_ok() => Ok(()),
            Err(e) => Err(RunnableError::io(&dir, e)),
        }
    })();
    if tmp.exists() {
        make_writable(&tmp);
        let _ = fs::remove_dir_all(&tmp);
    }
    result?;
    sync_dir(cache);
    Ok(dir)
}

fn make_writable(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            make_writable(&p);
        }
        let _ = fs::set_permissions(&p, fs::Permissions::from_mode(0o755));
    }
}

/// Checks that `dir` holds exactly the package's bytes and executable bits for each of its
/// files (files the handler added beside them are not looked at).
pub fn verify_tree(dir: &Path, package: &Package) -> Result<(), String> {
    for f in &package.files {
        let path = dir.join(&f.path);
        let meta = fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", f.path))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", f.path));
        }
        if (meta.permissions().mode() & 0o100 != 0) != f.executable {
            return Err(format!("{}: the executable bit differs", f.path));
        }
        if meta.len() != f.bytes.len() as u64 {
            return Err(format!("{}: the size differs", f.path));
        }
        let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", f.path))?;
        if bytes != f.bytes {
            return Err(format!("{}: the contents differ", f.path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, bytes: &[u8]) -> PackagedFile {
        PackagedFile {
            path: path.into(),
            executable: false,
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn the_digest_ignores_the_order_files_were_found_in() {
        let a = Digest::of(&[file("a", b"1"), file("b", b"2")]);
        let b = Digest::of(&[file("b", b"2"), file("a", b"1")]);
        assert_eq!(a, b);
    }

    #[test]
    fn moving_bytes_between_files_or_renaming_one_changes_the_digest() {
        let base = Digest::of(&[file("a", b"xy"), file("b", b"z")]);
        assert_ne!(base, Digest::of(&[file("a", b"x"), file("b", b"yz")]));
        assert_ne!(base, Digest::of(&[file("a", b"xy"), file("c", b"z")]));
        let mut exec = file("a", b"xy");
        exec.executable = true;
        assert_ne!(base, Digest::of(&[exec, file("b", b"z")]));
    }

    #[test]
    fn the_framing_is_the_documented_one() {
        // Recomputed by hand from the module documentation.
        let mut h = Sha256::new();
        h.update(b"hostd.runnable.digest/1\0");
        h.update(1u64.to_be_bytes());
        h.update(b"a");
        h.update([1u8]);
        h.update(2u64.to_be_bytes());
        h.update(b"hi");
        let want = format!("sha256:{}", hex::encode(h.finalize()));
        let mut f = file("a", b"hi");
        f.executable = true;
        assert_eq!(Digest::of(&[f]).as_str(), want);
    }
}
