//! `hostd` as a real child process: finding the binary, starting
//! `hostd serve` on a free port and waiting for `/readyz` (or launching it without waiting,
//! for a tool that must not stop when a Host cannot come up), stopping it with SIGTERM or
//! SIGKILL, signalling it, and running `hostd session` commands. A started server is killed
//! when its handle is dropped, so a failing test leaves no process behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::poll::eventually_blocking;

/// Set in the environment of every `hostd` started from a program that is `hostd` itself
/// (see [`run_self_as_hostd`]): such a program calls `cmd::main` when it finds it set.
pub const AS_HOSTD: &str = "TESTKIT_RUN_AS_HOSTD";

static SELF_AS_HOSTD: OnceLock<PathBuf> = OnceLock::new();

/// Makes every `hostd` this process starts its own executable, with [`AS_HOSTD`] set: for a
/// tool (a `[[bin]]` of `system-tests`, like the nemesis) that `cargo run` builds alone, so
/// no `hostd-under-test` need be built beside it. The tool's `main` must begin with
/// `if std::env::var_os(AS_HOSTD).is_some() { return cmd::main(); }`. Call it before anything
/// is started.
pub fn run_self_as_hostd() -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let _ = SELF_AS_HOSTD.set(exe);
    Ok(())
}

/// The `hostd` the whole-system tests run: `cmd::main` built into `system-tests`' own binary
/// `hostd-under-test`, which cargo builds next to that package's test binaries before it runs
/// them (its integration tests, benches and examples are the only callers), or the calling
/// program itself after [`run_self_as_hostd`].
pub fn hostd() -> &'static Path {
    if let Some(own) = SELF_AS_HOSTD.get() {
        return own;
    }
    static HOSTD: OnceLock<PathBuf> = OnceLock::new();
    HOSTD.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        // <target>/<profile>/deps/<test binary>; cargo puts this crate's binaries in <profile>.
        let path = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test binary lives in <target>/<profile>/deps")
            .join("hostd-under-test");
        assert!(
            path.is_file(),
            "no {} (cargo builds it for system-tests' integration tests, benches and examples)",
            path.display()
        );
        path
    })
}

/// A free loopback port (bound and released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The status line and body of a plain HTTP/1.1 GET on loopback, or `None` when nothing
/// answers (within 5 s: a frozen process's socket accepts and never answers).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let bound = std::time::Duration::from_secs(5);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut c = std::net::TcpStream::connect_timeout(&addr, bound).ok()?;
    c.set_read_timeout(Some(bound)).ok()?;
    c.set_write_timeout(Some(bound)).ok()?;
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut buf = String::new();
    c.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// A running `hostd serve`.
pub struct Serve {
    child: Child,
    log: PathBuf,
    pub port: u16,
}

/// Environment variables a child must not inherit from whoever runs the suite.
const SCRUBBED: [&str; 7] = [
    "HOST_STORE_URL",
    "HOST_ENDPOINT",
    "HOST_DATA_DIR",
    "HOST_TENANT",
    "HOST_TENANT_TOKEN",
    "HOST_CONFIG",
    "HOST_ID",
];

/// A `hostd` command run in `dir`, with none of the caller's `HOST_*` settings that would
/// point it elsewhere.
pub fn hostd_command(dir: &Path) -> Command {
    let mut c = Command::new(hostd());
    c.current_dir(dir);
    for v in SCRUBBED {
        c.env_remove(v);
    }
    if SELF_AS_HOSTD.get().is_some() {
        c.env(AS_HOSTD, "1");
    }
    c
}

impl Serve {
    /// Starts `hostd serve --listen 127.0.0.1:<free port> <args>` in `dir`, logging to
    /// `<dir>/<name>.log`, and waits until `/readyz` answers 200.
    pub fn start(dir: &Path, name: &str, args: &[&str]) -> Serve {
        let s = Serve::launch(dir, name, free_port(), args).expect("hostd serve starts");
        eventually_blocking("hostd serve to become ready", || {
            match http_get(s.port, "/readyz") {
                Some((200, _)) => Ok(()),
                other => Err(format!("{other:?}\n{}", s.log_text())),
            }
        });
        s
    }

    /// Starts one Host of a fleet sharing `store`: the tenants in `credentials`, a data
    /// directory of its own (`.hostd-<name>` in `dir`), host id `name`, then `extra` options
    /// (timings, features), logging to `<dir>/<name>.log`.
    pub fn fleet_member(
        dir: &Path,
        name: &str,
        store: &str,
        credentials: &Path,
        extra: &[&str],
    ) -> Serve {
        let data = format!(".hostd-{name}");
        let mut args = vec![
            "--store",
            store,
            "--credentials-file",
            credentials.to_str().expect("a UTF-8 path"),
            "--data-dir",
            &data,
            "--host-id",
            name,
        ];
        args.extend_from_slice(extra);
        Serve::start(dir, name, &args)
    }

    /// Starts `hostd serve --listen 127.0.0.1:<port> <args>` in `dir`, logging to
    /// `<dir>/<log>.log`, and returns at once, ready or not (see [`Serve::readyz`]).
    pub fn launch(dir: &Path, log: &str, port: u16, args: &[&str]) -> std::io::Result<Serve> {
        let log = dir.join(format!("{log}.log"));
        let child = hostd_command(dir)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(Serve { child, log, port })
    }

    /// `/readyz`'s answer now, or `None` when nothing answers.
    pub fn readyz(&self) -> Option<(u16, String)> {
        http_get(self.port, "/readyz")
    }

    /// The exit status, once the process has exited (it is reaped); `None` while it runs.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends `signal`; an error when the process is gone.
    pub fn signal(&self, signal: Signal) -> nix::Result<()> {
        kill(Pid::from_raw(self.pid() as i32), signal)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_exit(mut self, what: &str) -> (ExitStatus, String) {
        let status = eventually_blocking(what, || match self.child.try_wait() {
            Ok(Some(status)) => Ok(status),
            other => Err(format!("{other:?}")),
        });
        (status, self.log_text())
    }

    /// Waits for the process to exit on its own; the exit status and the log.
    pub fn exited(self) -> (ExitStatus, String) {
        self.wait_exit("hostd serve to exit on its own")
    }

    /// SIGTERM (a drain), then the exit status and the log.
    pub fn terminate(self) -> (ExitStatus, String) {
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM).expect("SIGTERM");
        self.wait_exit("hostd serve to exit after SIGTERM")
    }

    /// SIGTERM (a drain), then the exit status, the log and how long the exit took, waiting
    /// at most `bound` (a drain of many sessions may take longer than [`crate::WAIT`]).
    pub fn terminate_timed(mut self, bound: Duration) -> (ExitStatus, String, Duration) {
        let asked = std::time::Instant::now();
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM).expect("SIGTERM");
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return (status, self.log_text(), asked.elapsed());
            }
            assert!(
                asked.elapsed() < bound,
                "hostd serve did not exit within {bound:?} of SIGTERM:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGSTOP: the process freezes where it is (its sockets stay open, nothing answers).
    pub fn freeze(&self) {
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGSTOP).expect("SIGSTOP");
    }

    /// SIGCONT: a frozen process resumes.
    pub fn thaw(&self) {
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGCONT).expect("SIGCONT");
    }

    /// SIGKILL: the process dies at whatever instruction it was on.
    pub fn kill_dead(self) -> (ExitStatus, String) {
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGKILL).expect("SIGKILL");
        self.wait_exit("hostd serve to die after SIGKILL")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Mints a token for `tenant` and writes `<dir>/credentials` naming that tenant alone, as
/// `--credentials-file` reads it. Returns the token and the file's path.
pub fn tenant_credentials(dir: &Path, tenant: &str) -> (String, PathBuf) {
    let (token, digest) = hostlink::auth::mint_credential();
    let file = dir.join("credentials");
    std::fs::write(&file, format!("{tenant} {digest}\n")).expect("the credentials file");
    (token.expose_secret().to_owned(), file)
}

/// How a `hostd` client command reaches its Host: flags put after the command's own
/// arguments (`--endpoint`, `--tenant`, `--store`) and environment (`HOST_TENANT_TOKEN`).
/// The default adds nothing: the data folder's local Host and tenant.
#[derive(Clone, Debug, Default)]
pub struct HostdClient {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl HostdClient {
    /// Runs `hostd <args> <client flags>` in `dir`, to completion, whatever its exit.
    pub fn output(&self, dir: &Path, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.extend(self.args.iter().map(String::as_str));
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        hostd_run(dir, &all, &env)
    }

    /// Runs `hostd <args> <client flags>` in `dir`, which must succeed; its trimmed stdout.
    pub fn run(&self, dir: &Path, args: &[&str]) -> String {
        ok(self.output(dir, args))
    }
}

/// Runs `hostd <args>` in `dir` with `env` added, to completion.
pub fn hostd_run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = hostd_command(dir);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("hostd runs")
}

/// The trimmed stdout of a command that must succeed (else the test fails with both streams).
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "hostd failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
