//! The data folder ([`DEFAULT_DATA_DIR`] unless told otherwise) that lets the embedded default need no flags:
//! `hostd serve` keeps the SQLite store, the tenant credentials (digests only) and the local
//! tenant's token there, and records where it listens; the client commands find them there. This
//! module owns those file names and formats; it never prints a token in full.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The data folder every command uses unless told otherwise (`--data-dir`, `HOST_DATA_DIR`).
pub const DEFAULT_DATA_DIR: &str = "./.hostd";

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

    pub fn console_credentials_path(&self) -> PathBuf {
        self.root.join("console-credentials")
    }

    /// Where the first operator's token is kept (owner-only).
    pub fn console_token_path(&self) -> PathBuf {
        self.root.join("console-admin.token")
    }

    /// Creates the console's first operator (`admin`, role operate) when the data folder's
    /// console credentials do not exist yet: its token in `console-admin.token` (owner-only)
    /// and its digest in `console-credentials`. Returns true when it created one.
    pub fn ensure_console_admin(&self) -> Result<bool> {
        let creds = self.console_credentials_path();
        if creds.exists() {
            return Ok(false);
        }
        let (token, digest) = hostlink::auth::mint_credential();
        write_private(&self.console_token_path(), token.expose_secret().as_bytes())?;
        let text = format!(
            "# console operators: name role sha256(token); written by hostd serve\n{}\n",
            console::auth::credential_line("admin", console::Role::Operate, &digest)
        );
        write_private(&creds, text.as_bytes())?;
        Ok(true)
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

/// What the data folder says about its Host right now.
#[derive(Debug, Clone)]
pub enum LocalHost {
    /// A `hostd serve` recorded itself here, its process lives and `/readyz` answers 200.
    Ready(Runtime),
    /// A `hostd serve` recorded itself here but its process is gone: it stopped without
    /// draining (killed), so its leases run until they expire.
    Gone(Runtime),
    /// No Host is ready: none recorded (not started yet, or stopped cleanly), or one that is
    /// still starting.
    NotReady(Option<Runtime>),
}

impl LocalHost {
    pub fn runtime(&self) -> Option<&Runtime> {
        match self {
            LocalHost::Ready(r) | LocalHost::Gone(r) => Some(r),
            LocalHost::NotReady(r) => r.as_ref(),
        }
    }
}

/// Whether the process `pid` exists (a signal 0 reaches it, or it exists but is not ours).
fn process_lives(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

/// The `host:port` of a `ws://host:port` endpoint.
fn authority(endpoint: &str) -> Option<&str> {
    let rest = endpoint.strip_prefix("ws://")?;
    let end = rest.find('/').unwrap_or(rest.len());
    Some(&rest[..end]).filter(|a| !a.is_empty())
}

/// The HTTP status `GET /readyz` gets from the Host at `endpoint`, if anything answers.
pub async fn readyz(endpoint: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = authority(endpoint)?;
    let bound = std::time::Duration::from_secs(2);
    let exchange = async {
        let mut c = tokio::net::TcpStream::connect(addr).await.ok()?;
        c.write_all(
            format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut head = [0u8; 64];
        let mut n = 0;
        while n < head.len() {
            match c.read(&mut head[n..]).await.ok()? {
                0 => break,
                k => n += k,
            }
            if head[..n].contains(&b'\n') {
                break;
            }
        }
        let line = std::str::from_utf8(&head[..n]).ok()?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(bound, exchange).await.ok().flatten()
}

impl DataDir {
    /// Looks once at the Host this folder records.
    pub async fn probe(&self) -> Result<LocalHost> {
        let Some(runtime) = self.read_runtime()? else {
            return Ok(LocalHost::NotReady(None));
        };
        if !process_lives(runtime.pid) {
            return Ok(LocalHost::Gone(runtime));
        }
        Ok(match readyz(&runtime.endpoint).await {
            Some(200) => LocalHost::Ready(runtime),
            _ => LocalHost::NotReady(Some(runtime)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_names_the_address_to_probe() {
        assert_eq!(authority("ws://127.0.0.1:7400"), Some("127.0.0.1:7400"));
        assert_eq!(authority("ws://h:1/base"), Some("h:1"));
        assert_eq!(authority("http://h:1"), None);
        assert_eq!(authority("ws://"), None);
    }

    #[test]
    fn this_process_lives_and_a_reaped_child_does_not() {
        assert!(process_lives(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!process_lives(pid));
    }

    #[tokio::test]
    async fn a_folder_with_no_host_recorded_is_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        assert!(matches!(
            data.probe().await.unwrap(),
            LocalHost::NotReady(None)
        ));
        data.write_runtime(&Runtime {
            endpoint: "ws://127.0.0.1:1".into(),
            store: "sqlite://x".into(),
            tenant: LOCAL_TENANT.into(),
            host_id: "h".into(),
            pid: std::process::id(),
        })
        .unwrap();
        // Our own process lives but answers no /readyz: still starting.
        assert!(matches!(
            data.probe().await.unwrap(),
            LocalHost::NotReady(Some(_))
        ));
    }
}
