//! The data folder (`./.hostd` by default) that lets the embedded default need no flags:
//! `hostd serve` keeps the SQLite store, the tenant credentials (digests only) and the local
//! tenant's token there, and records where it listens; `hostd session` finds them there. This
//! module owns those file names and formats; it never prints a token in full.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The tenant `hostd serve` creates on first start in the embedded default.
pub const LOCAL_TENANT: &str = "local";

/// Files in the data folder.
pub struct DataDir {
    pub root: PathBuf,
}

/// What a running `hostd serve` records for `hostd session`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Runtime {
    /// The HostLink base (`ws://host:port`).
    pub endpoint: String,
    /// The store URL.
    pub store: String,
    /// The tenant the local token belongs to.
    pub tenant: String,
    pub host_id: String,
    pub pid: u32,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    /// Creates the folder (owner-only) if missing.
    pub fn ensure(&self) -> Result<()> {
        fs::create_dir_all(&self.root)
            .with_context(|| format!("cannot create the data folder {}", self.root.display()))?;
        let _ = fs::set_permissions(&self.root, fs::Permissions::from_mode(0o700));
        Ok(())
    }

    pub fn store_path(&self) -> PathBuf {
        self.root.join("host.db")
    }

    /// The embedded store URL (absolute, so any working directory reaches the same file).
    pub fn store_url(&self) -> Result<String> {
        let abs = absolute(&self.root)?;
        Ok(format!("sqlite://{}", abs.join("host.db").display()))
    }

    pub fn credentials_path(&self) -> PathBuf {
        self.root.join("credentials")
    }

    pub fn token_path(&self, tenant: &str) -> PathBuf {
        self.root.join(format!("{tenant}.token"))
    }

    pub fn runtime_path(&self) -> PathBuf {
        self.root.join("hostd.json")
    }

    /// Creates the local tenant's credential on first start: the token in `local.token`
    /// (owner-only) and its digest in `credentials`. Returns true when it created one.
    pub fn ensure_local_tenant(&self) -> Result<bool> {
        let token_path = self.token_path(LOCAL_TENANT);
        if token_path.exists() {
            return Ok(false);
        }
        let (token, digest) = hostlink::auth::mint_credential();
        write_private(&token_path, token.expose_secret().as_bytes())?;
        let creds = self.credentials_path();
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&creds)
            .with_context(|| format!("cannot write {}", creds.display()))?;
        writeln!(f, "# tenant sha256(token); written by hostd serve")?;
        writeln!(f, "{LOCAL_TENANT} {digest}")?;
        Ok(true)
    }

    /// Reads a tenant's token.
    pub fn token(&self, tenant: &str) -> Result<String> {
        let p = self.token_path(tenant);
        let t = fs::read_to_string(&p).with_context(|| {
            format!(
                "no token for tenant {tenant} at {} (start `hostd serve` once, or pass --token)",
                p.display()
            )
        })?;
        let t = t.trim().to_owned();
        if t.is_empty() {
            bail!("the token file {} is empty", p.display());
        }
        Ok(t)
    }

    pub fn write_runtime(&self, r: &Runtime) -> Result<()> {
        let text = serde_json::to_vec_pretty(r)?;
        write_private(&self.runtime_path(), &text)
    }

    pub fn read_runtime(&self) -> Result<Option<Runtime>> {
        let p = self.runtime_path();
        match fs::read(&p) {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes)
                    .with_context(|| format!("{} is damaged", p.display()))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
        }
    }

    pub fn remove_runtime(&self) {
        let _ = fs::remove_file(self.runtime_path());
    }
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if let Ok(c) = p.canonicalize() {
        return Ok(c);
    }
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    Ok(std::env::current_dir()?.join(p))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A token shown safely: its first four characters and its length.
pub fn redacted(token: &str) -> String {
    let head: String = token.chars().take(4).collect();
    format!("{head}… ({} chars)", token.chars().count())
}
