//! `hostd serve` as a real child process on SQLite, driven only through `hostd session`:
//! stopped with SIGTERM while a session is parked at a permission gate, then a second
//! `hostd serve` on the same store restores the session and the gate is answered there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const HOSTD: &str = env!("CARGO_BIN_EXE_hostd");
const WAIT: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    fn start(dir: &Path, host_id: &str, port: u16) -> Serve {
        let log = dir.join(format!("{host_id}.log"));
        let child = Command::new(HOSTD)
            .args(["serve", "--data-dir", ".hostd", "--host-id", host_id])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--registry-heartbeat",
                "300ms",
                "--registry-expiry",
                "1200ms",
            ])
            .args(["--drain-grace", "5s", "--drain-idle-boundary", "1s"])
            .current_dir(dir)
            .env_remove("HOST_STORE_URL")
            .env_remove("HOST_DATA_DIR")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("hostd serve starts");
        let s = Serve { child, log };
        s.wait_ready(port);
        s
    }

    fn wait_ready(&self, port: u16) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                use std::io::{Read, Write};
                let _ =
                    c.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut buf = String::new();
                let _ = c.read_to_string(&mut buf);
                if buf.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "hostd serve never became ready:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status.
    fn terminate(mut self) -> (std::process::ExitStatus, String) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (status, self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "hostd serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn session(dir: &Path, args: &[&str]) -> Output {
    Command::new(HOSTD)
        .arg("session")
        .args(args)
        .current_dir(dir)
        .env_remove("HOST_STORE_URL")
        .env_remove("HOST_DATA_DIR")
        .env_remove("HOST_TENANT")
        .env_remove("HOST_TENANT_TOKEN")
        .output()
        .expect("hostd session runs")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "hostd session failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn open_gate(dir: &Path, s: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let gates: Value =
            serde_json::from_str(&ok(session(dir, &["gates", s, "--json"]))).expect("gates JSON");
        if let Some(g) = gates.as_array().and_then(|a| a.first()) {
            return g["gate_id"].as_str().expect("gate id").to_owned();
        }
        assert!(Instant::now() < deadline, "no gate opened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_session_parked_at_a_gate_survives_sigterm_and_is_answered_on_the_next_host() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let first = Serve::start(dir, "host-one", free_port());
    let s = ok(session(dir, &["create", "--message", "hi"]));
    assert!(s.starts_with("s-"), "{s}");
    ok(session(
        dir,
        &["send", &s, r#"/tool write_note {"text":"keep me"}"#],
    ));
    let gate = open_gate(dir, &s);

    // SIGTERM while parked: the drain abandons the session crash-equivalently (nothing is
    // written, the gate stays open) and the process exits 0.
    let (status, log) = first.terminate();
    assert!(status.success(), "hostd serve exited {status}:\n{log}");
    assert!(log.contains("1 abandoned"), "{log}");
    assert_eq!(
        open_gate(dir, &s),
        gate,
        "the gate is still open and projected"
    );

    // A second Host on the same store restores the session; the gate is answered there.
    let second = Serve::start(dir, "host-two", free_port());
    let answered = ok(session(dir, &["answer", &s, &gate, "approve"]));
    assert!(answered.ends_with("applied"), "{answered}");
    let deadline = Instant::now() + WAIT;
    loop {
        let journal = ok(session(dir, &["journal", &s]));
        if journal.contains("assistant: Tool write_note returned: keep me") {
            assert_eq!(
                journal.matches("tool write_note: keep me").count(),
                1,
                "the tool ran once:\n{journal}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the approved tool never ran:\n{journal}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let listed = ok(session(dir, &["ls", "--json"]));
    let row: Value =
        serde_json::from_str(listed.lines().next().expect("a session")).expect("ls JSON");
    assert_eq!(row["host_id"], "host-two");
    let (status, log) = second.terminate();
    assert!(status.success(), "{log}");
}

#[test]
fn serve_refuses_invalid_options_with_the_field_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new(HOSTD)
        .args(["serve", "--data-dir", ".hostd", "--listen", "127.0.0.1:0"])
        .args(["--registry-heartbeat", "10s", "--registry-expiry", "20s"])
        .env_remove("HOST_STORE_URL")
        .current_dir(tmp.path())
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("heartbeat_margin") && err.contains("registry_expiry"),
        "{err}"
    );
}

#[test]
fn session_without_a_local_host_explains_what_to_do() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = session(tmp.path(), &["ls"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hostd serve"), "{err}");
}
