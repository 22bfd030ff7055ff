//! Fault injection for the fault suite (`tests/tests/faults.rs`): a PostgreSQL cluster of the
//! suite's own (made with `pg_createcluster` on its own port, never the shared server, so it
//! can be stopped and restarted under load), a small tmpfs for a SQLite store to fill, and a
//! recorder of `/readyz` answers over time. The tests that stop the cluster take turns
//! ([`serial`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The cluster's name and default port (overridable with `HOST_FAULT_PG_PORT`).
pub const CLUSTER: &str = "hostfaults";
const DEFAULT_PORT: u16 = 5441;

/// Held while a test stops and starts the cluster: an OS file lock, so test processes run
/// side by side (`cargo nextest`) still take turns.
pub struct Turn {
    _held: std::fs::File,
}

/// Waits for this test's turn with the cluster.
pub async fn serial() -> Turn {
    let path = std::env::temp_dir().join(format!("{CLUSTER}.lock"));
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .expect("the fault suite's lock file");
        file.lock().expect("the fault suite's lock");
        Turn { _held: file }
    })
    .await
    .expect("the lock waiter")
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?} exited {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Says why a fault test cannot run here: a failure in CI, a loud skip elsewhere.
fn unavailable(why: &str) -> Option<FaultCluster> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("the fault suite needs {why} in CI");
    }
    eprintln!("*** SKIPPED (fault suite): {why} ***");
    None
}

/// The suite's own PostgreSQL cluster.
pub struct FaultCluster {
    version: String,
    pub port: u16,
}

impl FaultCluster {
    /// Creates (once) and starts the cluster, with trust authentication on loopback, and a
    /// database `faults`. `None` (a loud skip) outside CI when PostgreSQL's cluster tools are
    /// missing.
    pub fn ensure() -> Option<FaultCluster> {
        let port = std::env::var("HOST_FAULT_PG_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(DEFAULT_PORT);
        let version = match std::fs::read_dir("/etc/postgresql") {
            Ok(d) => d
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .max(),
            Err(_) => None,
        };
        let Some(version) = version else {
            return unavailable("PostgreSQL's cluster tools (pg_createcluster)");
        };
        let conf = PathBuf::from(format!("/etc/postgresql/{version}/{CLUSTER}"));
        if !conf.exists() {
            if let Err(e) = run(Command::new("pg_createcluster").args([
                &version,
                CLUSTER,
                "-p",
                &port.to_string(),
                "--",
                "--auth=trust",
            ])) {
                return unavailable(&format!("a cluster of its own: {e}"));
            }
            let _ = std::fs::write(
                conf.join("conf.d/faults.conf"),
                "listen_addresses = '127.0.0.1'\nmax_connections = 200\n",
            );
        }
        let c = FaultCluster { version, port };
        c.start();
        let created = run(Command::new("psql").args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-Atc",
            "select 1 from pg_database where datname = 'faults'",
        ]))
        .unwrap_or_default();
        if created.trim() != "1" {
            let _ = run(Command::new("psql").args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
                "-c",
                "create database faults",
            ]));
        }
        Some(c)
    }

    /// The URL of its database `faults`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/faults", self.port)
    }

    fn ctl(&self, action: &str, extra: &[&str]) {
        let mut cmd = Command::new("pg_ctlcluster");
        cmd.args(["--skip-systemctl-redirect", &self.version, CLUSTER, action]);
        cmd.args(extra);
        if let Err(e) = run(&mut cmd) {
            // Starting a running cluster (or stopping a stopped one) is not a failure.
            let state = self.online();
            let fine = match action {
                "start" => state,
                "stop" => !state,
                _ => false,
            };
            assert!(fine, "{e}");
        }
    }

    /// True when the cluster accepts connections.
    pub fn online(&self) -> bool {
        Command::new("pg_isready")
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts it and waits until it accepts connections.
    pub fn start(&self) {
        self.ctl("start", &[]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.online() {
            assert!(Instant::now() < deadline, "the fault cluster did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops it the way an operator's restart does (`-m fast`: every session is told the
    /// server is shutting down, then cut off).
    pub fn stop(&self) {
        self.ctl("stop", &["-m", "fast"]);
    }
}

/// A small tmpfs for a store that can be filled to the brim; unmounted on drop.
pub struct SmallDisk {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts a tmpfs of `megabytes`; `None` (a loud skip, a failure in CI) when mounting is
    /// not allowed here.
    pub fn mount(megabytes: u32) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().expect("a mount point");
        let path = dir.path().to_path_buf();
        match run(Command::new("mount").args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={megabytes}m"),
            "tmpfs",
            &path.display().to_string(),
        ])) {
            Ok(_) => Some(SmallDisk { path, _dir: dir }),
            Err(e) => {
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("the disk-full case needs a tmpfs mount in CI: {e}");
                }
                eprintln!("*** SKIPPED (disk full): cannot mount a tmpfs: {e} ***");
                None
            }
        }
    }

    /// Fills what is left with a file at `filler`, a mebibyte at a time, until the disk
    /// refuses.
    pub fn fill(&self, filler: &Path) {
        use std::io::Write;
        let mut f = std::fs::File::create(filler).expect("the filler file");
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a store still closing on another thread must not leave the mount behind.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// `/readyz` answers over time, each as (status, body), collapsed to its transitions.
#[derive(Clone, Default)]
pub struct ReadyzLog {
    seen: Arc<Mutex<Vec<(u16, String)>>>,
}

impl ReadyzLog {
    /// Polls `url` every 50 ms until `stop` fires, keeping each change of status.
    pub fn record(url: String, stop: Stop) -> ReadyzLog {
        let log = ReadyzLog::default();
        let seen = log.seen.clone();
        tokio::spawn(async move {
            while !stop.stopped() {
                // A probe the listener cut before answering (a flood filling the backlog) is
                // not an answer; it is skipped.
                let Some((code, body)) = try_get(&url).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                if let Ok(mut s) = seen.lock()
                    && s.last().is_none_or(|(c, _)| *c != code)
                {
                    s.push((code, body));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        log
    }

    /// The statuses in order of change (e.g. `[200, 503, 200]`).
    pub fn statuses(&self) -> Vec<u16> {
        self.seen
            .lock()
            .map(|s| s.iter().map(|(c, _)| *c).collect())
            .unwrap_or_default()
    }

    /// Every answer kept.
    pub fn answers(&self) -> Vec<(u16, String)> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// One GET with `Connection: close`, as (status, body); `None` when the connection failed
/// before a status line came back.
async fn try_get(url: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.split_once('/')?;
    let mut s = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(authority),
    )
    .await
    .ok()?
    .ok()?;
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    // The listener may answer (and close) before the request is written: read regardless.
    let _ = s.write_all(request.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((code, body))
}

/// A stop flag shared with a recorder.
#[derive(Clone, Default)]
pub struct Stop(Arc<std::sync::atomic::AtomicBool>);

impl Stop {
    pub fn stop(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn stopped(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Lazily made once per process: the cluster, or `None` when it cannot run here.
pub fn cluster() -> Option<&'static FaultCluster> {
    static C: OnceLock<Option<FaultCluster>> = OnceLock::new();
    C.get_or_init(FaultCluster::ensure).as_ref()
}
