//! What `hostd serve` refuses before it serves, as an operator meets it: a store URL that
//! names no backend, a PostgreSQL server that is not there, a data folder another `hostd
//! serve` already holds, SQLite page caches outside their bounds; and what its stderr looks
//! like with `--log-format json`.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::process::{Serve, free_port, hostd_command, hostd_run};

/// Runs `hostd serve` expected to refuse. One that serves instead is killed after 20 s, so
/// the case fails on its assertions rather than hanging.
fn serve_once(dir: &Path, args: &[&str]) -> Output {
    let mut child = hostd_command(dir)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir", ".hostd"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hostd serve starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("hostd serve's status").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("hostd serve's output")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_store_url_with_no_supported_scheme_is_refused_and_creates_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for bad in ["::::", "mysql://x/y", "redis:6379"] {
        let out = serve_once(tmp.path(), &["--store", bad]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{bad} served:\n{err}");
        assert!(err.contains("unsupported_store"), "{bad}: {err}");
        assert!(
            err.contains("sqlite://") && err.contains("postgres://"),
            "the refusal names the schemes: {err}"
        );
        assert!(!err.contains("serving on"), "{err}");
    }
    let made: Vec<String> = std::fs::read_dir(tmp.path())
        .expect("the folder")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !made.iter().any(|n| n.contains(':') || n == "y"),
        "no file was created for a refused URL: {made:?}"
    );
}

#[test]
fn an_unreachable_postgres_is_reported_as_connection_refused_at_its_host_and_port() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/nothing");
    let started = std::time::Instant::now();
    let digest = "ab".repeat(32);
    let out = hostd_run(
        tmp.path(),
        &["serve", "--listen", "127.0.0.1:0", "--store", &url],
        &[("HOST_TENANT_CREDENTIALS", &format!("acme={digest}"))],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("connection refused at 127.0.0.1:{port}")),
        "{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "refused at once, not after the pool's timeout"
    );
}

/// Every line `hostd serve --log-format json` writes to stderr — start, serving, drain, exit —
/// is one JSON object.
#[test]
fn with_json_logs_every_line_on_stderr_is_one_json_object() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let host = Serve::start(
        dir,
        "json",
        &[
            "--log-format",
            "json",
            "--data-dir",
            ".hostd",
            "--host-id",
            "host-json",
            "--drain-grace",
            "5s",
        ],
    );
    let (status, log) = host.terminate();
    assert!(status.success(), "{log}");
    let mut messages = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a line that is not JSON ({e}): {line}\n{log}"));
        assert!(v.is_object(), "{line}");
        messages.push(
            v["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert!(
        messages.iter().any(|m| m.starts_with("serving on")),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.starts_with("drained")),
        "{messages:?}"
    );

    // A refusal at start is one JSON object too.
    let out = hostd_run(
        dir,
        &[
            "serve",
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "mysql://x/y",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    for line in err.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a line that is not JSON ({e}): {line}"));
        assert_eq!(v["level"], "ERROR", "{line}");
    }
    assert!(err.contains("unsupported_store"), "{err}");
}

#[test]
fn a_second_serve_on_the_same_data_folder_is_refused_while_the_first_serves() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let first = Serve::start(dir, "first", &["--data-dir", ".hostd"]);
    let out = serve_once(dir, &[]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("data_dir_locked"), "{err}");
    assert!(
        err.contains(&format!("pid {}", first.pid())),
        "names the holder: {err}"
    );
    // The first is untouched, and once it is gone the folder is free again.
    assert_eq!(
        testkit::process::http_get(first.port, "/readyz").map(|r| r.0),
        Some(200)
    );
    let (status, log) = first.terminate();
    assert!(status.success(), "{log}");
    let again = Serve::start(dir, "again", &["--data-dir", ".hostd"]);
    let (status, log) = again.terminate();
    assert!(status.success(), "{log}");
}

#[test]
fn sqlite_page_caches_outside_their_bounds_are_refused_by_name_and_small_ones_serve() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    for (flag, field) in [
        ("--sqlite-writer-cache-kib", "sqlite_writer_cache_kib"),
        ("--sqlite-reader-cache-kib", "sqlite_reader_cache_kib"),
    ] {
        let out = serve_once(dir, &[flag, "32"]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{flag} 32 served:\n{err}");
        assert!(
            err.contains(field) && err.contains("between 64 KiB and 1 GiB"),
            "the store's refusal names the option and its range: {err}"
        );
        assert!(!err.contains("serving on"), "{err}");
    }
    let small = Serve::start(
        dir,
        "small-caches",
        &[
            "--data-dir",
            ".hostd",
            "--sqlite-writer-cache-kib",
            "64",
            "--sqlite-reader-cache-kib",
            "64",
        ],
    );
    let (status, log) = small.terminate();
    assert!(status.success(), "{log}");
}

/// On a shared PostgreSQL a second Host given the same host id (another data folder) takes a
/// newer generation; the first says it is fenced and exits non-zero instead of serving fenced.
#[test]
fn a_host_fenced_by_a_newer_generation_of_its_id_exits_non_zero() {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let Some(db) = rt.block_on(testkit::pg::FreshDatabase::create("fence")) else {
        eprintln!("skipped: no HOST_TEST_DATABASE_URL");
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    std::fs::write(dir.join("creds"), format!("acme {}\n", "ab".repeat(32))).unwrap();
    let args = |data: &'static str| {
        vec![
            "--data-dir",
            data,
            "--store",
            db.url.as_str(),
            "--credentials-file",
            "creds",
            "--host-id",
            "shared-id",
            "--store-unreachable-bound",
            "400ms",
            "--drain-grace",
            "3s",
        ]
    };
    let first = Serve::start(dir, "first", &args("one"));
    let second = Serve::start(dir, "second", &args("two"));
    let (status, log) = first.exited();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("fenced"), "{log}");
    assert!(log.contains("generation"), "{log}");
    assert_eq!(
        testkit::process::http_get(second.port, "/readyz").map(|r| r.0),
        Some(200),
        "the newer generation serves on"
    );
    let (status, log) = second.terminate();
    assert!(status.success(), "{log}");
    rt.block_on(db.drop_now());
}
