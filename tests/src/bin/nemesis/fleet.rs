//! The fleet under test: the run's own store (a fresh PostgreSQL database, or a SQLite file in
//! the work folder), the tenant's credentials, and one slot per Host — its `hostd serve`
//! process (relaunched under the same id and port after a kill), a fault proxy in front of its
//! client listener (the endpoint it advertises, so every client dials through it) and, on
//! PostgreSQL, one in front of its store. Owns those processes and proxies: starting,
//! killing, freezing, thawing, relaunching, healing and stopping them. Never decides which
//! fault comes next (the schedule does) and never panics on a process that misbehaves.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use testkit::faultproxy::{FaultProxy, ProxyHandle};
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, free_port, tenant_credentials};

use crate::options::{Backend, Options};

/// The tenant every client acts for.
pub const TENANT: &str = "acme";

/// Timings of every Host: a registry expiry of 3 s (what the partition was tried at),
/// heartbeats well inside it, short claims, a fleet reconciler that reacts within a second,
/// and a short drain so the final stop is quick.
const HOST_TIMINGS: &[&str] = &[
    "--registry-heartbeat",
    "500ms",
    "--registry-expiry",
    "3s",
    "--registry-retention",
    "30s",
    "--reconcile-interval",
    "200ms",
    "--claim-ttl",
    "3s",
    "--store-unreachable-bound",
    "2s",
    "--drain-grace",
    "5s",
    "--drain-idle-boundary",
    "2s",
];

/// Added on PostgreSQL: the fleet reconciler's pace, and bounds on a store that is away.
const PG_TIMINGS: &[&str] = &[
    "--fleet-interval",
    "300ms",
    "--fleet-leader-ttl",
    "2s",
    "--fleet-assignment-ttl",
    "3s",
    "--pg-idle-transaction-timeout",
    "2s",
    "--pg-acquire-timeout",
    "2s",
];

/// One Host of the fleet.
pub struct HostSlot {
    pub name: String,
    /// Where its listener is (the client proxy's upstream).
    pub port: u16,
    /// In front of its client listener: the endpoint it advertises.
    pub link: FaultProxy,
    /// In front of its PostgreSQL server (`None` on SQLite).
    pub store: Option<FaultProxy>,
    serve: Option<Serve>,
    /// How many times it was launched (each launch logs to `<name>-<n>.log`).
    pub launches: u32,
    pub frozen: bool,
}

impl HostSlot {
    /// True while its process runs (frozen or not).
    pub fn running(&self) -> bool {
        self.serve.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.serve.as_ref().map(Serve::pid)
    }
}

/// The fleet and its store.
pub struct Fleet {
    pub dir: PathBuf,
    pub backend: Backend,
    /// The store's URL as the controller and the command line reach it (no proxy between).
    pub store_url: String,
    db: Option<FreshDatabase>,
    credentials: PathBuf,
    pub token: String,
    pub hosts: Vec<HostSlot>,
}

/// `url` with its host and port replaced by `addr` (user, database and parameters kept).
fn with_authority(url: &str, addr: SocketAddr) -> Result<String, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url:?} is not a URL"))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority.rsplit_once('@').map(|(u, _)| format!("{u}@"));
    Ok(format!(
        "{scheme}://{}{addr}{tail}",
        user.unwrap_or_default()
    ))
}

/// The PostgreSQL server's TCP address in `url`.
async fn server_address(url: &str) -> Result<SocketAddr, String> {
    let options: sqlx::postgres::PgConnectOptions =
        url.parse().map_err(|e| format!("the database URL: {e}"))?;
    let host = options.get_host();
    if host.starts_with('/') {
        return Err(format!(
            "the database URL names a Unix socket ({host}); the fault proxies need TCP"
        ));
    }
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    tokio::net::lookup_host((host, options.get_port()))
        .await
        .map_err(|e| format!("resolving {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} resolves to no address"))
}

impl Fleet {
    /// Makes the store and the credentials and launches every Host behind its proxies (it
    /// does not wait for them: see [`Fleet::wait_ready`]).
    pub async fn start(options: &Options, dir: &Path) -> Result<Fleet, String> {
        let (token, credentials) = tenant_credentials(dir, TENANT);
        let (store_url, db, server) = match options.backend {
            Backend::Postgres => {
                let admin = options.database_url.clone().unwrap_or_default();
                let db = FreshDatabase::create_on(&admin, "nemesis")
                    .await
                    .map_err(|e| format!("a database of the run's own on {admin}: {e}"))?;
                let server = server_address(&db.url).await?;
                (db.url.clone(), Some(db), Some(server))
            }
            Backend::Sqlite => (
                format!("sqlite://{}", dir.join("store.db").display()),
                None,
                None,
            ),
        };
        let mut hosts = Vec::new();
        for i in 0..options.hosts {
            let port = free_port();
            let link = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port)))
                .await
                .map_err(|e| format!("a client proxy: {e}"))?;
            let store = match server {
                Some(server) => Some(
                    FaultProxy::start(server)
                        .await
                        .map_err(|e| format!("a store proxy: {e}"))?,
                ),
                None => None,
            };
            hosts.push(HostSlot {
                name: format!("host-{}", (b'a' + i as u8) as char),
                port,
                link,
                store,
                serve: None,
                launches: 0,
                frozen: false,
            });
        }
        let mut fleet = Fleet {
            dir: dir.to_path_buf(),
            backend: options.backend,
            store_url,
            db,
            credentials,
            token,
            hosts,
        };
        for i in 0..fleet.hosts.len() {
            fleet.launch(i)?;
        }
        Ok(fleet)
    }

    fn args(&self, i: usize) -> Result<Vec<String>, String> {
        let h = &self.hosts[i];
        let store = match &h.store {
            Some(proxy) => with_authority(&self.store_url, proxy.addr())?,
            None => self.store_url.clone(),
        };
        let mut args: Vec<String> = vec![
            "--store".into(),
            store,
            "--credentials-file".into(),
            self.credentials.display().to_string(),
            "--data-dir".into(),
            format!(".hostd-{}", h.name),
            "--host-id".into(),
            h.name.clone(),
            "--internal-endpoint".into(),
            format!("ws://{}", h.link.addr()),
        ];
        args.extend(HOST_TIMINGS.iter().map(|s| (*s).to_owned()));
        if self.backend == Backend::Postgres {
            args.extend(PG_TIMINGS.iter().map(|s| (*s).to_owned()));
        }
        Ok(args)
    }

    /// Launches Host `i` (again): same id, port and data folder, a new log.
    pub fn launch(&mut self, i: usize) -> Result<(), String> {
        let args = self.args(i)?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let h = &mut self.hosts[i];
        h.launches += 1;
        let log = format!("{}-{}", h.name, h.launches);
        let serve = Serve::launch(&self.dir, &log, h.port, &args)
            .map_err(|e| format!("launching {}: {e}", h.name))?;
        h.serve = Some(serve);
        h.frozen = false;
        Ok(())
    }

    /// SIGKILL to Host `i` (thawed or not); it is reaped at once.
    pub fn kill(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        if let Some(serve) = h.serve.take() {
            let _ = serve.signal(Signal::SIGKILL);
            drop(serve);
        }
        h.frozen = false;
    }

    /// SIGSTOP to Host `i`.
    pub fn freeze(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        if let Some(serve) = &h.serve
            && serve.signal(Signal::SIGSTOP).is_ok()
        {
            h.frozen = true;
        }
    }

    /// SIGCONT to Host `i`.
    pub fn thaw(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        if let Some(serve) = &h.serve {
            let _ = serve.signal(Signal::SIGCONT);
        }
        h.frozen = false;
    }

    /// Hosts that exited on their own since the last call (reaped): name, status and the end
    /// of their log.
    pub fn exited(&mut self) -> Vec<(String, ExitStatus, String)> {
        let mut out = Vec::new();
        for h in &mut self.hosts {
            let Some(serve) = h.serve.as_mut() else {
                continue;
            };
            if let Some(status) = serve.try_exit() {
                let log = serve.log_text();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                out.push((h.name.clone(), status, tail.join("\n")));
                h.serve = None;
                h.frozen = false;
            }
        }
        out
    }

    /// The fault handle of Host `i`'s client link.
    pub fn link(&self, i: usize) -> ProxyHandle {
        self.hosts[i].link.handle()
    }

    /// The fault handle of Host `i`'s store link (PostgreSQL only).
    pub fn store_link(&self, i: usize) -> Option<ProxyHandle> {
        self.hosts[i].store.as_ref().map(FaultProxy::handle)
    }

    /// Every proxy passes, every frozen Host is thawed, every Host that is not running is
    /// launched again.
    pub fn heal(&mut self) -> Result<(), String> {
        for i in 0..self.hosts.len() {
            self.hosts[i].link.handle().heal();
            if let Some(s) = &self.hosts[i].store {
                s.handle().heal();
            }
            if self.hosts[i].frozen {
                self.thaw(i);
            }
            if !self.hosts[i].running() {
                self.launch(i)?;
            }
        }
        Ok(())
    }

    /// Each Host's `/readyz` now (`None`: not running, frozen or not answering).
    async fn readiness(&self) -> Vec<(String, Option<(u16, String)>)> {
        let mut out = Vec::new();
        for h in &self.hosts {
            let answer = match &h.serve {
                Some(_) if !h.frozen => {
                    let port = h.port;
                    tokio::task::spawn_blocking(move || testkit::process::http_get(port, "/readyz"))
                        .await
                        .ok()
                        .flatten()
                }
                _ => None,
            };
            out.push((h.name.clone(), answer));
        }
        out
    }

    /// Waits until every Host answers `/readyz` 200, up to `bound`; the last answers when
    /// some never did.
    pub async fn wait_ready(&self, bound: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let seen = self.readiness().await;
            if seen
                .iter()
                .all(|(_, a)| a.as_ref().is_some_and(|(code, _)| *code == 200))
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "not every Host became ready within {bound:?}: {seen:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops every Host (thawed, then SIGTERM: a drain; SIGKILL for one still running after
    /// 30 s), then every proxy; drops the run's database unless `keep_database`. Returns the
    /// Hosts whose stop was not clean (name and what happened).
    pub async fn stop(mut self, keep_database: bool) -> Vec<(String, String)> {
        let mut unclean = Vec::new();
        for i in 0..self.hosts.len() {
            if self.hosts[i].frozen {
                self.thaw(i);
            }
            if let Some(serve) = &self.hosts[i].serve {
                let _ = serve.signal(Signal::SIGTERM);
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        for h in &mut self.hosts {
            let Some(mut serve) = h.serve.take() else {
                continue;
            };
            loop {
                if let Some(status) = serve.try_exit() {
                    if !status.success() {
                        unclean.push((h.name.clone(), format!("its drain exited {status}")));
                    }
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    unclean.push((h.name.clone(), "still running 30 s after SIGTERM".into()));
                    break; // dropping it kills it
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        for h in self.hosts.drain(..) {
            h.link.shutdown().await;
            if let Some(s) = h.store {
                s.shutdown().await;
            }
        }
        if let Some(db) = self.db.take() {
            if keep_database {
                println!("nemesis: the run's database is kept: {}", db.name());
            } else {
                db.drop_now().await;
            }
        }
        unclean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_keeps_its_user_database_and_parameters_with_another_authority() {
        let addr: SocketAddr = "127.0.0.1:6001".parse().unwrap();
        assert_eq!(
            with_authority(
                "postgres://postgres@127.0.0.1:5432/t_x?sslmode=disable",
                addr
            )
            .unwrap(),
            "postgres://postgres@127.0.0.1:6001/t_x?sslmode=disable"
        );
        assert_eq!(
            with_authority("postgresql://u:p@db/x", addr).unwrap(),
            "postgresql://u:p@127.0.0.1:6001/x"
        );
        assert_eq!(
            with_authority("postgres://localhost", addr).unwrap(),
            "postgres://127.0.0.1:6001"
        );
        assert!(with_authority("not a url", addr).is_err());
    }
}
