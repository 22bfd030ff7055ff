//! `hostd serve` as a real child process on SQLite, driven only through `hostd session`:
//! stopped with SIGTERM while a session is parked at a permission gate, then a second
//! `hostd serve` on the same store restores the session and the gate is answered there. Also
//! how `hostd serve` refuses bad options and layers a config file, the environment and flags.

use std::path::Path;

use serde_json::Value;
use testkit::eventually_blocking;
use testkit::process::{Serve, hostd_run, ok};

/// Short heartbeats, so a stopped Host's residency lapses quickly.
const FAST: [&str; 10] = [
    "--data-dir",
    ".hostd",
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

fn session(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["session"];
    all.extend_from_slice(args);
    hostd_run(dir, &all, &[])
}

fn open_gate(dir: &Path, s: &str) -> String {
    eventually_blocking("a gate to open", || {
        let gates: Value =
            serde_json::from_str(&ok(session(dir, &["gates", s, "--json"]))).expect("gates JSON");
        match gates.as_array().and_then(|a| a.first()) {
            Some(g) => Ok(g["gate_id"].as_str().expect("gate id").to_owned()),
            None => Err(gates.to_string()),
        }
    })
}

#[test]
fn a_session_parked_at_a_gate_is_given_up_at_sigterm_without_failing_and_is_answered_on_the_next_host()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let first = serve(dir, "host-one");
    let s = ok(session(dir, &["create", "--message", "hi"]));
    assert!(s.starts_with("s-"), "{s}");
    ok(session(
        dir,
        &["send", &s, r#"/tool write_note {"text":"keep me"}"#],
    ));
    let gate = open_gate(dir, &s);

    // SIGTERM while parked: the drain gives the session up at once, crash-equivalently
    // (nothing is written, the gate stays open). Waiting for a human is not a failure: the
    // drain is clean, logged at INFO, and the process exits 0.
    let (status, log) = first.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "hostd serve exited {status}:\n{log}"
    );
    assert!(log.contains("1 abandoned"), "{log}");
    assert!(!log.contains("1 failures"), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("ERROR") && l.contains("release_runtime")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("INFO") && l.contains("parked at an open gate")),
        "{log}"
    );
    assert_eq!(
        open_gate(dir, &s),
        gate,
        "the gate is still open and projected"
    );

    // A second Host on the same store restores the session; the gate is answered there.
    let second = serve(dir, "host-two");
    let answered = ok(session(dir, &["answer", &s, &gate, "approve"]));
    assert!(answered.ends_with("applied"), "{answered}");
    let journal = eventually_blocking("the approved tool to run", || {
        let journal = ok(session(dir, &["journal", &s]));
        if journal.contains("assistant: Tool write_note returned: keep me") {
            Ok(journal)
        } else {
            Err(journal)
        }
    });
    assert_eq!(
        journal.matches("tool write_note: keep me").count(),
        1,
        "the tool ran once:\n{journal}"
    );
    // `ls --json` is one document: the array of sessions.
    let listed: Value =
        serde_json::from_str(&ok(session(dir, &["ls", "--json"]))).expect("ls JSON");
    assert_eq!(listed[0]["host_id"], "host-two", "{listed}");
    let (status, log) = second.terminate();
    assert!(status.success(), "{log}");
}

#[test]
fn serve_refuses_invalid_options_with_the_field_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = hostd_run(
        tmp.path(),
        &[
            "serve",
            "--data-dir",
            ".hostd",
            "--listen",
            "127.0.0.1:0",
            "--registry-heartbeat",
            "10s",
            "--registry-expiry",
            "20s",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("heartbeat_margin") && err.contains("registry_expiry"),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_referenced_body_cap_outside_its_range_and_prints_a_valid_one() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for bad in ["65536", "16777217"] {
        let out = hostd_run(
            tmp.path(),
            &["serve", "--print-config", "--referenced-body-cap", bad],
            &[],
        );
        assert!(!out.status.success(), "{bad} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("referenced_body_cap"), "{err}");
    }
    let text = ok(hostd_run(
        tmp.path(),
        &["serve", "--print-config"],
        &[("HOST_REFERENCED_BODY_CAP", "1048576")],
    ));
    assert!(
        text.lines()
            .any(|l| l.starts_with("referenced_body_cap = 1048576")),
        "{text}"
    );
}

#[test]
fn a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        tmp.path().join("host.toml"),
        "[host]\ncapacity = 8\nwarm_ttl = \"90s\"\nclaim_ttl = \"40s\"\n",
    )
    .unwrap();
    let text = ok(hostd_run(
        tmp.path(),
        &[
            "serve",
            "--config",
            "host.toml",
            "--print-config",
            "--capacity",
            "9",
        ],
        &[("HOST_CAPACITY", "10"), ("HOST_WARM_TTL", "2m")],
    ));
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{key} =")))
            .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
            .to_owned()
    };
    let capacity = line("capacity");
    assert!(capacity.starts_with("capacity = 9 ") && capacity.ends_with("# flag"));
    let warm = line("warm_ttl");
    assert!(warm.starts_with("warm_ttl = \"2m\"") && warm.ends_with("# environment"));
    let claim = line("claim_ttl");
    assert!(claim.starts_with("claim_ttl = \"40s\"") && claim.ends_with("host.toml"));
    let grace = line("drain_grace");
    assert!(grace.starts_with("drain_grace = \"25s\"") && grace.ends_with("# default"));
}

/// The reference Host's deployment variables keep their names: the listener, the advertised
/// endpoint and the three drain bounds are each read from the environment.
#[test]
fn the_reference_deployment_variables_set_the_listener_endpoint_and_drain_bounds() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let text = ok(hostd_run(
        tmp.path(),
        &["serve", "--print-config"],
        &[
            ("HOST_LISTEN_ADDRESS", "127.0.0.1:7411"),
            ("HOST_INTERNAL_ENDPOINT", "ws://10.0.0.7:7411"),
            ("HOST_DRAIN_GRACE", "31s"),
            ("HOST_DRAIN_IDLE_BOUNDARY", "7s"),
            ("HOST_DRAIN_PUBLISH_BOUND", "3s"),
        ],
    ));
    for (key, value) in [
        ("listen", "\"127.0.0.1:7411\""),
        ("internal_endpoint", "\"ws://10.0.0.7:7411\""),
        ("drain_grace", "\"31s\""),
        ("idle_boundary", "\"7s\""),
        ("publish_bound", "\"3s\""),
    ] {
        let wanted = format!("{key} = {value}");
        assert!(
            text.lines()
                .any(|l| l.starts_with(&wanted) && l.ends_with("# environment")),
            "no `{wanted}` read from the environment in:\n{text}"
        );
    }
}

#[test]
fn a_config_file_with_an_unknown_option_is_refused_naming_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("host.toml"), "[host]\ncapacityy = 8\n").unwrap();
    let out = hostd_run(
        tmp.path(),
        &["serve", "--config", "host.toml", "--print-config"],
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("capacityy"), "{err}");
}

#[test]
fn session_without_a_local_host_explains_what_to_do() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = session(tmp.path(), &["ls"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hostd serve"), "{err}");
}

#[test]
fn a_listing_whose_reader_went_away_ends_quietly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let host = serve(dir, "host-pipe");
    for _ in 0..3 {
        ok(session(dir, &["create"]));
    }
    // `hostd session ls | head -0`: the read end is closed before anything is written.
    let mut child = testkit::process::hostd_command(dir)
        .args(["session", "ls"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("hostd session ls starts");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("it ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    drop(host);
}
