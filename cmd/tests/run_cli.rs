//! `hostd run` mistakes that are the caller's: the program file, `--input` and the ids are read
//! and checked before any Host is dialled, so each fails with its own stable code (and a
//! non-zero exit) whether or not a Host is running.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const HOSTD: &str = env!("CARGO_BIN_EXE_hostd");

/// `hostd --json run ...` in `dir`, which holds no data folder: no Host can be found.
fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(HOSTD)
        .arg("--json")
        .arg("run")
        .args(args)
        .current_dir(dir)
        .env_remove("HOST_ENDPOINT")
        .env_remove("HOST_DATA_DIR")
        .env_remove("HOST_TENANT")
        .env_remove("HOST_TENANT_TOKEN")
        .output()
        .expect("hostd runs")
}

/// The coded error on stderr.
fn error(o: &Output) -> (String, String) {
    let text = String::from_utf8_lossy(&o.stderr);
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON error on stderr: {text}"));
    let v: Value = serde_json::from_str(line).expect("a JSON error");
    (
        v["error"]["code"].as_str().unwrap_or_default().to_owned(),
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[test]
fn start_with_a_missing_program_file_fails_with_a_file_error_before_dialling() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(tmp.path(), &["start", "nosuch.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let (code, message) = error(&out);
    assert_eq!(code, "file_not_found", "{message}");
    assert!(message.contains("nosuch.yaml"), "{message}");
    assert!(
        !message.contains("reached"),
        "no Host was dialled: {message}"
    );
}

#[test]
fn start_with_a_program_that_is_not_a_file_fails_unreadable() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("folder.yaml")).unwrap();
    let out = run(tmp.path(), &["start", "folder.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(error(&out).0, "file_unreadable");
}

#[test]
fn start_with_input_that_is_not_json_fails_invalid_input_before_dialling() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("p.yaml"),
        "steps:\n  - name: nap\n    sleep: 0s\n",
    )
    .unwrap();
    let out = run(tmp.path(), &["start", "p.yaml", "--input", "{order: 1"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let (code, message) = error(&out);
    assert_eq!(code, "invalid_input", "{message}");
    assert!(message.contains("--input"), "{message}");
}

#[test]
fn an_empty_run_id_fails_invalid_id_for_every_subcommand_that_takes_one() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["status", ""][..],
        &["resume", ""],
        &["logs", ""],
        &["cancel", ""],
        &["answer", "", "approve", "true"],
        &["answer", "run-1", "", "true"],
    ] {
        let out = run(tmp.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert_eq!(error(&out).0, "invalid_id", "{args:?}");
    }
}

#[test]
fn with_good_arguments_and_no_host_the_error_says_no_host_with_its_own_code() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("p.yaml"),
        "steps:\n  - name: nap\n    sleep: 0s\n",
    )
    .unwrap();
    let out = run(tmp.path(), &["start", "p.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let (code, message) = error(&out);
    assert_eq!(code, "no_host");
    assert!(
        message.contains("hostd run exec p.yaml"),
        "with no Host at all, a start names the way to run without one: {message}"
    );
    let out = run(
        tmp.path(),
        &[
            "status",
            "run-1",
            "--endpoint",
            "ws://127.0.0.1:9",
            "--tenant",
            "acme",
            "--token",
            "t",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(error(&out).0, "connect");
}

/// The answerer of a hosted run is the link's actor (its token's principal, else the tenant):
/// `run answer` takes no `--by`, so a caller cannot name someone else as the one who answered.
#[test]
fn answer_takes_no_by_flag_naming_who_answered() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(tmp.path(), &["answer", "r1", "ask", "true", "--by", "bob"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("--by"), "{text}");
}
