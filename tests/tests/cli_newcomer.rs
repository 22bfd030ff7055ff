//! `hostd` as a newcomer and a script meet it, with real processes: the README's quickstart
//! pasted whole into a shell in a fresh folder; `hostd wait`; a command admitted while its
//! Host is dead is named, with its own exit status, and a resend applies it once; a wrong
//! token admits and reads nothing (on SQLite against the local credentials, on PostgreSQL by a
//! handshake with a live Host); unknown sessions, gates and actions are refused at once;
//! `--json` errors are one object; a listing longer than a store page is whole; log lines in a
//! file carry no colour; a reader that goes away ends a listing quietly.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::eventually_blocking;
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, free_port, hostd, hostd_command, hostd_run, ok, tenant_credentials};

/// Short heartbeats, so a stopped Host's residency lapses quickly.
const FAST: [&str; 8] = [
    "--registry-heartbeat",
    "300ms",
    "--registry-expiry",
    "1200ms",
    "--drain-grace",
    "5s",
    "--drain-idle-boundary",
    "1s",
];

fn serve(dir: &Path, host_id: &str) -> Serve {
    let mut args = FAST.to_vec();
    args.extend(["--host-id", host_id]);
    Serve::start(dir, host_id, &args)
}

fn session(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["session"];
    all.extend_from_slice(args);
    hostd_run(dir, &all, &[])
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one JSON error object a `--json` command wrote on stderr.
fn json_error(out: &Output) -> Value {
    let text = stderr(out);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {text}");
    let v: Value = serde_json::from_str(lines[0]).expect("a JSON error object");
    assert!(v["error"]["code"].is_string(), "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    v["error"].clone()
}

/// The fenced `sh` block of the README that starts a Host in the background.
fn readme_quickstart() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("the README");
    let mut blocks = readme.split("```sh\n").skip(1);
    blocks
        .find_map(|b| {
            let body = b.split("```").next()?;
            body.contains("hostd serve &").then(|| body.to_owned())
        })
        .expect("the README has a quickstart block starting `hostd serve &`")
}

#[test]
fn the_readme_quickstart_pasted_whole_works_in_a_fresh_folder() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(hostd(), bin.join("hostd")).unwrap();
    let work = dir.join("fresh");
    std::fs::create_dir(&work).unwrap();
    let script = readme_quickstart();
    assert!(script.contains("hostd session create"), "{script}");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Verbatim, with every failure fatal; only the port is the test's own, so it cannot
    // collide with another test.
    let mut child = Command::new("bash");
    child
        .args(["-e", "-o", "pipefail", "-c", &script])
        .current_dir(&work)
        .env("PATH", path)
        .env("HOST_LISTEN_ADDRESS", format!("127.0.0.1:{}", free_port()))
        .env_remove("HOST_STORE_URL")
        .env_remove("HOST_DATA_DIR")
        .env_remove("HOST_TENANT")
        .env_remove("HOST_TENANT_TOKEN")
        .env_remove("HOST_CONFIG")
        .env_remove("HOST_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut running = child.spawn().expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = running.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let pgid = nix::unistd::Pid::from_raw(running.id() as i32);
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = running.wait();
            panic!("the quickstart did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    let mut err = String::new();
    running
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    running
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        status.success(),
        "{status}\n--- stdout\n{out}\n--- stderr\n{err}"
    );
    assert!(out.contains("You said: hello"), "{out}");
    assert!(out.contains("tool write_note: buy milk"), "{out}");
    assert_eq!(out.matches(": applied").count(), 3, "{out}");
    assert!(err.contains("drained: 1 released"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn hostd_wait_returns_once_a_starting_host_is_ready_and_gives_up_with_a_code_otherwise() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let out = hostd_run(dir, &["--json", "wait", "--timeout", "300ms"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(json_error(&out)["code"], "host_not_ready");

    // Started in the background and waited for at once, as a script would.
    let port = free_port();
    let mut host = hostd_command(dir)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("hostd serve starts");
    let out = hostd_run(dir, &["--json", "wait", "--timeout", "60s"], &[]);
    let ready: Value = serde_json::from_str(&ok(out)).expect("one JSON document");
    assert_eq!(ready["ready"], true);
    assert_eq!(
        ready["endpoint"].as_str(),
        Some(format!("ws://127.0.0.1:{port}").as_str())
    );
    let (status, _) = testkit::process::http_get(port, "/readyz").expect("ready");
    assert_eq!(status, 200);
    let _ = host.kill();
    let _ = host.wait();
}

#[test]
fn a_session_command_run_while_the_host_starts_waits_for_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let port = free_port();
    let mut host = hostd_command(dir)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("hostd serve starts");
    // No wait in between: `S=$(hostd session create)` right after `hostd serve &`.
    let s = ok(session(dir, &["create"]));
    assert!(s.starts_with("s-"), "{s}");
    let _ = host.kill();
    let _ = host.wait();
}

#[test]
fn a_command_admitted_while_its_host_is_dead_is_named_and_a_resend_applies_it_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let first = serve(dir, "host-one");
    let s = ok(session(dir, &["create"]));
    ok(session(dir, &["send", &s, "hello"]));
    first.kill_dead();

    let out = session(
        dir,
        &[
            "--json",
            "send",
            &s,
            "transfer 100 EUR",
            "--wait-for-host",
            "0s",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = json_error(&out);
    assert_eq!(err["code"], "admitted_not_applied", "{err}");
    let id = err["command_id"]
        .as_str()
        .expect("the command id")
        .to_owned();
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("admitted, not yet applied"), "{message}");
    assert!(message.contains("not running"), "{message}");
    assert!(message.contains(&format!("--command-id {id}")), "{message}");

    // The same in words, without --json.
    let out = session(
        dir,
        &[
            "send",
            &s,
            "transfer 100 EUR",
            "--command-id",
            &id,
            "--wait-for-host",
            "0s",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains(&id), "{}", stderr(&out));

    // A Host again; the resend waits for the one command and never applies it twice.
    let second = serve(dir, "host-one");
    let out = session(
        dir,
        &[
            "--json",
            "send",
            &s,
            "transfer 100 EUR",
            "--command-id",
            &id,
        ],
    );
    let done: Value = serde_json::from_str(&ok(out)).expect("one JSON document");
    assert_eq!(done["command_id"], id.as_str());
    assert_eq!(done["state"], "applied");
    let journal = ok(session(dir, &["journal", &s]));
    assert_eq!(
        journal.matches("user: transfer 100 EUR").count(),
        1,
        "{journal}"
    );
    drop(second);
}

#[test]
fn a_wrong_token_admits_nothing_and_reads_nothing_on_sqlite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let host = serve(dir, "host-auth");
    let s = ok(session(dir, &["create"]));
    ok(session(dir, &["send", &s, "first"]));
    for args in [
        vec!["send", s.as_str(), "sneaked in"],
        vec!["journal", s.as_str()],
        vec!["gates", s.as_str()],
        vec!["ls"],
        vec!["create"],
    ] {
        let mut all = vec!["--json", "--token", "not-the-token"];
        all.extend(args.iter().copied());
        let out = session(dir, &all);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert_eq!(json_error(&out)["code"], "unauthenticated", "{args:?}");
        assert!(stdout(&out).is_empty(), "{args:?} printed {}", stdout(&out));
    }
    let journal = ok(session(dir, &["journal", &s]));
    assert!(journal.contains("user: first"), "{journal}");
    assert!(!journal.contains("sneaked in"), "{journal}");
    assert_eq!(
        ok(session(dir, &["ls", "--json"]))
            .matches("session_id")
            .count(),
        1
    );
    drop(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_admits_nothing_and_reads_nothing_on_postgres() {
    let Some(db) = FreshDatabase::create("cli_auth").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let (token, credentials) = tenant_credentials(&dir, "acme");
    let host = Serve::start(
        &dir,
        "fleet-auth",
        &[
            "--store",
            &db.url,
            "--credentials-file",
            credentials.to_str().unwrap(),
            "--host-id",
            "fleet-auth",
        ],
    );
    let fleet = |token: &str, args: &[&str]| {
        let mut all = vec!["--json", "session", "--store", &db.url, "--tenant", "acme"];
        all.extend(["--token", token]);
        all.extend_from_slice(args);
        hostd_run(&dir, &all, &[])
    };
    // `hostd wait` against the fleet's store: a live Host accepting sessions.
    let ready = hostd_run(
        &dir,
        &["--json", "wait", "--store", &db.url, "--timeout", "30s"],
        &[],
    );
    let ready: Value = serde_json::from_str(&ok(ready)).expect("one JSON document");
    assert_eq!(ready["host_id"], "fleet-auth", "{ready}");
    let good = token;
    let s = {
        let created: Value = serde_json::from_str(&ok(fleet(&good, &["create"]))).unwrap();
        created["session_id"].as_str().unwrap().to_owned()
    };
    ok(fleet(&good, &["send", &s, "first"]));
    for args in [
        vec!["send", s.as_str(), "sneaked in"],
        vec!["journal", s.as_str()],
    ] {
        let out = fleet("not-the-token", &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert_eq!(json_error(&out)["code"], "unauthenticated", "{args:?}");
        assert!(stdout(&out).is_empty(), "{args:?} printed {}", stdout(&out));
    }
    let journal = stdout(&fleet(&good, &["journal", &s]));
    assert!(journal.contains("\"first\""), "{journal}");
    assert!(!journal.contains("sneaked in"), "{journal}");
    drop(host);
    db.drop_now().await;
}

#[test]
fn unknown_sessions_gates_and_actions_are_refused_at_once_with_a_code() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let host = serve(dir, "host-gates");
    let s = ok(session(dir, &["create"]));
    ok(session(
        dir,
        &["send", &s, r#"/tool write_note {"text":"x"}"#],
    ));
    let gate = eventually_blocking("a gate to open", || {
        let gates: Value =
            serde_json::from_str(&ok(session(dir, &["gates", &s, "--json"]))).expect("JSON");
        match gates.as_array().and_then(|a| a.first()) {
            Some(g) => Ok(g["gate_id"].as_str().unwrap().to_owned()),
            None => Err(gates.to_string()),
        }
    });
    let missing_gate = "01000000-0000-7000-8000-000000000000";
    let cases: [(&[&str], &str); 6] = [
        (&["gates", "s-nobody"], "session_not_found"),
        (
            &["answer", "s-nobody", "next", "approve"],
            "session_not_found",
        ),
        (&["send", "s-nobody", "hi"], "session_not_found"),
        (&["answer", &s, missing_gate, "approve"], "gate_not_found"),
        (&["answer", &s, "not-a-gate", "approve"], "gate_not_found"),
        (&["answer", &s, &gate, "frobnicate"], "unknown_action"),
    ];
    for (args, code) in cases {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let started = Instant::now();
        let out = session(dir, &all);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert_eq!(json_error(&out)["code"], code, "{args:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
    // The gate is still open and takes a real answer; once it is resolved, a second answer
    // is refused too.
    ok(session(dir, &["answer", &s, &gate, "approve"]));
    eventually_blocking("the gate to be resolved", || {
        let open = ok(session(dir, &["gates", &s, "--json"]));
        if open == "[]" { Ok(()) } else { Err(open) }
    });
    let out = session(dir, &["--json", "answer", &s, &gate, "approve"]);
    assert_eq!(json_error(&out)["code"], "gate_closed");
    drop(host);
}

#[test]
fn a_listing_piped_into_head_ends_quietly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let host = serve(dir, "host-head");
    for _ in 0..3 {
        ok(session(dir, &["create"]));
    }
    let out = Command::new("sh")
        .args([
            "-c",
            &format!("'{}' session ls | head -1", hostd().display()),
        ])
        .current_dir(dir)
        .output()
        .expect("sh runs");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
    assert!(stdout(&out).starts_with("SESSION"), "{}", stdout(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    drop(host);
}

#[test]
fn json_output_is_one_document_per_listing_and_one_line_per_streamed_event() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let host = serve(dir, "host-json");
    let s = ok(session(dir, &["create"]));
    ok(session(dir, &["create"]));
    ok(session(dir, &["send", &s, "hello"]));
    let ls: Value = serde_json::from_str(&ok(session(dir, &["--json", "ls"]))).expect("one doc");
    assert_eq!(ls.as_array().map(Vec::len), Some(2), "{ls}");
    let gates: Value =
        serde_json::from_str(&ok(session(dir, &["--json", "gates", &s]))).expect("one doc");
    assert!(gates.is_array(), "{gates}");
    let journal = eventually_blocking("the turn to end", || {
        let journal = ok(session(dir, &["--json", "journal", &s]));
        if journal.contains("turn_done") {
            Ok(journal)
        } else {
            Err(journal)
        }
    });
    assert!(journal.lines().count() >= 3, "{journal}");
    for line in journal.lines() {
        let event: Value = serde_json::from_str(line).expect("one event per line");
        assert!(event["seq"].is_u64(), "{event}");
    }
    drop(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_longer_than_a_store_page_is_whole() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let host = serve(&dir, "host-many");
    let store = sessionstore::Store::open(sessionstore::StoreOptions::new(format!(
        "sqlite://{}",
        dir.join(".hostd/host.db").display()
    )))
    .await
    .expect("the local store");
    let tenant = sessionstore::TenantId::new("local").unwrap();
    let total = sessionstore::limits::MAX_PAGE + 5;
    let mut creating = tokio::task::JoinSet::new();
    for i in 0..total {
        let (store, tenant) = (store.clone(), tenant.clone());
        creating.spawn(async move {
            store
                .create_session(sessionstore::NewSession {
                    tenant,
                    session: sessionstore::SessionId::new(format!("many-{i:05}")).unwrap(),
                    agent: sessionstore::AgentId::new("assistant").unwrap(),
                    compatibility: sessionstore::CompatibilityId::new("hostd-scripted-1").unwrap(),
                    binding: sessionstore::SessionBinding {
                        runtime_session_id: sessionstore::RuntimeSessionId::mint(),
                        storage_binding_id: sessionstore::local_binding(),
                        binding_version: 1,
                    },
                })
                .await
                .expect("a session")
        });
    }
    while let Some(r) = creating.join_next().await {
        r.expect("created");
    }
    let ls = hostd_run(&dir, &["--json", "session", "ls"], &[]);
    let ls: Value = serde_json::from_str(&ok(ls)).expect("one document");
    let ids: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), total);
    assert_eq!(
        ids.last().copied(),
        Some(format!("many-{:05}", total - 1).as_str())
    );
    drop(host);
}

#[test]
fn log_lines_written_to_a_file_carry_no_colour() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let host = serve(dir, "host-colour");
    ok(session(dir, &["create"]));
    let (_, log) = host.terminate();
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\x1b'), "colour escapes in a file: {log:?}");
}

#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let out = Command::new(hostd())
        .arg("--version")
        .output()
        .expect("runs");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match head {
        Some(commit) => assert!(text.contains(&format!("commit {commit}")), "{text}"),
        None => assert!(text.contains("not built from a git checkout"), "{text}"),
    }
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(hostd())
            .args(["completions", shell])
            .output()
            .expect("runs");
        let script = stdout(&out);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        assert!(script.contains("session"), "{shell}");
    }
    // The bash script is valid bash.
    let script = Command::new(hostd())
        .args(["completions", "bash"])
        .output()
        .expect("runs")
        .stdout;
    let check = Command::new("bash")
        .args(["-n", "/dev/stdin"])
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(&script)?;
            c.wait()
        })
        .expect("bash -n runs");
    assert!(check.success());
}

/// Runs `hostd <args>` in `dir` under a pseudo-terminal (`script` from util-linux), returning
/// everything the terminal showed.
fn on_a_terminal(dir: &Path, args: &[&str]) -> String {
    let mut line = format!("'{}'", hostd().display());
    for a in args {
        line.push_str(&format!(" '{a}'"));
    }
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .current_dir(dir)
        .env_remove("HOST_DATA_DIR")
        .env_remove("HOST_STORE_URL")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn long_waits_show_progress_on_a_terminal_and_stay_quiet_otherwise() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let shown = on_a_terminal(dir, &["wait", "--timeout", "2s"]);
    assert!(
        shown.contains("waiting for a Host to be ready (1 s of 2 s)"),
        "{shown:?}"
    );
    let quiet = hostd_run(dir, &["wait", "--timeout", "2s"], &[]);
    assert!(!stderr(&quiet).contains("waiting"), "{}", stderr(&quiet));
    assert!(!stderr(&quiet).contains('\x1b'), "{:?}", stderr(&quiet));

    // `gates --wait` says what it waits for until the gate opens.
    let host = serve(dir, "host-progress");
    let s = ok(session(dir, &["create"]));
    let opener = {
        let (dir, s) = (dir.to_owned(), s.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1800));
            ok(session(
                &dir,
                &["send", &s, r#"/tool write_note {"text":"later"}"#],
            ))
        })
    };
    let shown = on_a_terminal(dir, &["session", "gates", &s, "--wait"]);
    opener.join().expect("the sender");
    assert!(
        shown.contains(&format!(
            "waiting for a gate of session {s} to open (1 s of 30 s)"
        )),
        "{shown:?}"
    );
    assert!(shown.contains("permission"), "{shown:?}");
    drop(host);
}

#[test]
fn a_usage_error_under_json_is_one_json_object_with_status_2() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = hostd_run(tmp.path(), &["--json", "session", "frobnicate"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(json_error(&out)["code"], "usage");
    let out = hostd_run(tmp.path(), &["session", "frobnicate"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("frobnicate"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_while_a_killed_hosts_lease_runs_is_applied_once_by_its_successor_on_postgres() {
    let Some(db) = FreshDatabase::create("cli_lease").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let (token, credentials) = tenant_credentials(&dir, "acme");
    let start = |name: &str| {
        let mut args = vec![
            "--store",
            &db.url,
            "--credentials-file",
            credentials.to_str().unwrap(),
            "--host-id",
            "fleet-one",
            "--registry-heartbeat",
            "1s",
            "--registry-expiry",
            "4s",
        ];
        args.extend(["--data-dir", name]);
        Serve::start(&dir, name, &args)
    };
    let fleet = |args: &[&str]| {
        let mut all = vec!["--json", "session", "--store", &db.url, "--tenant", "acme"];
        all.extend(["--token", token.as_str()]);
        all.extend_from_slice(args);
        hostd_run(&dir, &all, &[])
    };
    let first = start("first");
    let created: Value = serde_json::from_str(&ok(fleet(&["create"]))).unwrap();
    let s = created["session_id"].as_str().unwrap().to_owned();
    ok(fleet(&["send", &s, "hello"]));
    first.kill_dead();
    // The same Host restarted at once: the dead one's residency lease still runs, so the
    // session cannot be attached yet (`epoch_mismatch`); the send waits for the lease, then
    // the one command is applied.
    let second = start("second");
    let out = fleet(&["send", &s, "transfer 100 EUR", "--command-id", "transfer-1"]);
    let done: Value = serde_json::from_str(&ok(out)).expect("one JSON document");
    assert_eq!(done["command_id"], "transfer-1");
    assert_eq!(done["state"], "applied");
    // A resend of the same id reports the same outcome and applies nothing more.
    let again: Value = serde_json::from_str(&ok(fleet(&[
        "send",
        &s,
        "transfer 100 EUR",
        "--command-id",
        "transfer-1",
    ])))
    .unwrap();
    assert_eq!(again["state"], "applied");
    let journal = stdout(&fleet(&["journal", &s]));
    assert_eq!(
        journal.matches("\"transfer 100 EUR\"").count(),
        1,
        "{journal}"
    );
    drop(second);
    db.drop_now().await;
}
