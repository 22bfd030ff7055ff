//! Runnables as agent tools through a real `hostd serve` (SQLite store, real processes), driven
//! only through `hostd session`: the scripted agent calls `/tool <runnable> <json>`; an
//! effectful runnable asks permission first; a Host killed with SIGKILL mid-invocation leaves
//! the outcome reported as unknown and an effectful runnable never run twice, while an
//! idempotent one is re-run with the same effect id.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(40);

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
    fn start(dir: &Path, host_id: &str, workspace: &Path, extra: &[&str]) -> Serve {
        let port = free_port();
        let log = dir.join(format!("{host_id}.log"));
        let child = Command::new(testkit::process::hostd())
            .args(["serve", "--data-dir", ".hostd", "--host-id", host_id])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--registry-heartbeat",
                "300ms",
                "--registry-expiry",
                "1200ms",
            ])
            .args(["--drain-grace", "5s", "--drain-idle-boundary", "1s"])
            .arg("--runnables")
            .arg(workspace)
            .args(extra)
            .current_dir(dir)
            .env_remove("HOST_STORE_URL")
            .env_remove("HOST_DATA_DIR")
            .env_remove("HOST_RUNNABLES")
            .env_remove("HOST_RUNNABLE_TOOLS")
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
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill9(mut self) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL).expect("SIGKILL");
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn session(dir: &Path, args: &[&str]) -> Output {
    Command::new(testkit::process::hostd())
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

/// Sends a message, retrying (same command id) while the dead Host's residency has not
/// expired yet: placement is refused until then.
fn send_after_crash(dir: &Path, s: &str, text: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let out = session(dir, &["send", s, text, "--command-id", "after-crash"]);
        if out.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            Instant::now() < deadline && err.contains("epoch_mismatch"),
            "sending after the crash failed: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
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

/// Waits until the journal holds `needle`; returns the journal.
fn journal_with(dir: &Path, s: &str, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let journal = ok(session(dir, &["journal", s]));
        if journal.contains(needle) {
            return journal;
        }
        assert!(
            Instant::now() < deadline,
            "the journal never showed {needle:?}:\n{journal}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_for_line(path: &Path, prefix: &str) {
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with(prefix))
    {
        assert!(
            Instant::now() < deadline,
            "{prefix} never appeared in {path:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Live processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// A workspace with one runnable whose handler appends `start <effect_id>` to `marker`,
/// sleeps `sleep` seconds, appends `done <effect_id>` and succeeds.
fn workspace(root: &Path, name: &str, effect: &str, sleep: u32, marker: &Path) -> PathBuf {
    let ws = root.join("ws");
    let dir = ws.join("runnables").join(name);
    std::fs::create_dir_all(&dir).expect("runnable folder");
    std::fs::write(
        dir.join("runnable.yaml"),
        format!(
            "name: {name}\nversion: 1.0.0\ndescription: Append to a marker, slowly.\n\
             input: {{type: object, properties: {{text: {{type: string}}}}, required: [text]}}\n\
             output: {{type: object, properties: {{effect_id: {{type: string}}}}, required: [effect_id]}}\n\
             command: ./step.sh\nenv: {{MARKER: \"{}\", SLEEP: \"{sleep}\"}}\ntimeout: 60s\neffect: {effect}\n",
            marker.display()
        ),
    )
    .expect("declaration");
    let script = dir.join("step.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\ncat >/dev/null\necho \"start $HOSTD_EFFECT_ID\" >> \"$MARKER\"\nsleep \"$SLEEP\"\n\
         echo \"done $HOSTD_EFFECT_ID\" >> \"$MARKER\"\n\
         printf '{\"ok\":true,\"output\":{\"effect_id\":\"%s\"}}\\n' \"$HOSTD_EFFECT_ID\"\n",
    )
    .expect("handler");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    ws
}

fn marker_lines(marker: &Path) -> Vec<String> {
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_scripted_agent_calls_a_runnable_and_an_effectful_one_asks_permission_first() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let marker = dir.join("marker.txt");
    let ws = workspace(dir, "note", "effectful", 0, &marker);
    let host = Serve::start(dir, "host-one", &ws, &[]);
    let s = ok(session(dir, &["create"]));
    ok(session(
        dir,
        &["send", &s, r#"/tool note {"text":"hello"}"#],
    ));
    let gate = open_gate(dir, &s);
    assert!(
        marker_lines(&marker).is_empty(),
        "nothing ran before approval"
    );
    ok(session(dir, &["answer", &s, &gate, "approve"]));
    let journal = journal_with(dir, &s, "assistant: Tool note returned:");
    assert!(journal.contains(r#""outcome":"succeeded""#), "{journal}");
    let lines = marker_lines(&marker);
    assert_eq!(lines.len(), 2, "started and finished once: {lines:?}");

    // Bad input is refused before anything starts, and the agent is told so.
    ok(session(dir, &["send", &s, r#"/tool note {"text":1}"#]));
    let gate = open_gate(dir, &s);
    ok(session(dir, &["answer", &s, &gate, "approve"]));
    let journal = journal_with(dir, &s, "invalid_input");
    assert!(
        journal.contains(r#"\"ran\":false"#) || journal.contains(r#""ran":false"#),
        "{journal}"
    );
    assert_eq!(
        marker_lines(&marker).len(),
        2,
        "the refused call ran nothing"
    );

    // A name that was not offered is not a tool.
    ok(session(
        dir,
        &["send", &s, r#"/tool word-count {"text":"a"}"#],
    ));
    journal_with(dir, &s, "unknown tool \"word-count\"");
    drop(host);
}

#[test]
fn a_host_killed_mid_invocation_never_runs_an_effectful_runnable_twice() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let marker = dir.join("effectful-marker.txt");
    let ws = workspace(dir, "charge", "effectful", 60, &marker);
    let first = Serve::start(dir, "host-one", &ws, &[]);
    let s = ok(session(dir, &["create"]));
    ok(session(
        dir,
        &["send", &s, r#"/tool charge {"text":"once"}"#],
    ));
    let gate = open_gate(dir, &s);
    ok(session(dir, &["answer", &s, &gate, "approve"]));
    wait_for_line(&marker, "start ");
    let killed = Instant::now();
    first.kill9();
    // The handler does not outlive its Host: its guard stops it.
    let script = ws.join(".hostd/runnables/cache");
    let needle = script.to_string_lossy().into_owned();
    while !processes_mentioning(&needle).is_empty() {
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "the handler outlived its Host's SIGKILL by 2 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let second = Serve::start(dir, "host-two", &ws, &[]);
    // The next message places the session on the new Host; the turn in flight is restored and
    // ends interrupted: its outcome is not known, so it is not run again.
    send_after_crash(dir, &s, "hello again");
    let journal = journal_with(dir, &s, "assistant: You said: hello again");
    assert!(journal.contains("turn interrupted (restore)"), "{journal}");
    assert!(
        !journal.contains("Tool charge returned"),
        "no success may be reported for the lost call:\n{journal}"
    );
    let lines = marker_lines(&marker);
    assert_eq!(lines.len(), 1, "started once and never finished: {lines:?}");
    assert!(lines[0].starts_with("start eff-"), "{lines:?}");
    drop(second);
}

#[test]
fn a_host_killed_mid_invocation_re_runs_an_idempotent_runnable_with_the_same_effect_id() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let marker = dir.join("idempotent-marker.txt");
    let ws = workspace(dir, "upsert", "idempotent", 4, &marker);
    let first = Serve::start(dir, "host-one", &ws, &[]);
    let s = ok(session(dir, &["create"]));
    ok(session(dir, &["send", &s, r#"/tool upsert {"text":"x"}"#]));
    wait_for_line(&marker, "start ");
    first.kill9();

    let second = Serve::start(dir, "host-two", &ws, &[]);
    send_after_crash(dir, &s, "hello again");
    let journal = journal_with(dir, &s, "assistant: You said: hello again");
    assert!(
        journal.contains("assistant: Tool upsert returned:"),
        "the replay-safe call ran again and finished:\n{journal}"
    );
    let lines = marker_lines(&marker);
    assert_eq!(lines.len(), 3, "{lines:?}");
    let effect = lines[0].strip_prefix("start ").expect("start line");
    assert_eq!(
        lines[1],
        format!("start {effect}"),
        "the same effect id: {lines:?}"
    );
    assert_eq!(lines[2], format!("done {effect}"), "{lines:?}");
    assert!(
        journal.contains(effect),
        "the result carries that effect id:\n{journal}"
    );
    drop(second);
}
