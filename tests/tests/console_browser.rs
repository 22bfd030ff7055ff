//! The operator console in a real browser (Debian's headless Chromium, driven by playwright-core
//! from `tests/console`; `.ci/run` installs both): two `hostd serve` on one PostgreSQL, the
//! first with `--console` and the operator credential it makes on first start. The page logs
//! in, sees a session appear when the CLI creates it (no reload), answers its gate so the tool
//! runs once, shows gates and charts, follows a run the CLI started (its starter, its ask
//! answered from the page and attributed to the operator), drains its Host and sees the
//! session held by the other Host once a message moves it, then renders on a narrow screen —
//! with no script error.
//! Screenshots of each view go to `<target>/tmp/console-screenshots`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::pg::FreshDatabase;
use testkit::process::{Serve, hostd_run, ok, tenant_credentials};

/// A run that asks one yes/no question and ends.
const RUN_PROGRAM: &str = "\
steps:
  - name: approve
    ask: \"Ship it?\"
    answer: {type: boolean}
";

fn host(dir: &Path, name: &str, store: &str, credentials: &Path, console: bool) -> Serve {
    let mut args = vec![
        "--registry-heartbeat",
        "300ms",
        "--registry-expiry",
        "1200ms",
        "--drain-grace",
        "5s",
        "--drain-idle-boundary",
        "1s",
    ];
    if console {
        args.push("--console");
    }
    Serve::fleet_member(dir, name, store, credentials, &args)
}

fn chromium() -> PathBuf {
    for p in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("Chromium is required (.ci/run installs Debian's chromium: apt-get install chromium)");
}

fn script_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("console");
    assert!(
        d.join("node_modules/playwright-core").exists(),
        "playwright-core is required (.ci/run runs `npm ci` in tests/console)"
    );
    d
}

fn cli(dir: &Path, store: &str, token: &str, args: &[&str]) -> String {
    let mut all = vec!["session"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--store", store, "--tenant", "acme"]);
    ok(hostd_run(dir, &all, &[("HOST_TENANT_TOKEN", token)]))
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_signs_in_answers_a_gate_and_drains_a_host_in_a_real_browser() {
    let Some(db) = FreshDatabase::create("console_browser").await else {
        return;
    };
    let chromium = chromium();
    let scripts = script_dir();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let (tenant_token, credentials) = tenant_credentials(&dir, "acme");
    let a = host(&dir, "console-a", &db.url, &credentials, true);
    // The first start with --console made an operator and wrote its token.
    let token_path = dir.join(".hostd-console-a/console-admin.token");
    let operator = std::fs::read_to_string(&token_path)
        .unwrap_or_else(|e| panic!("{}: {e}", token_path.display()));
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");

    let store = db.url.clone();
    let run = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("node")
            .arg(scripts.join("console_browser.mjs"))
            .current_dir(&scripts)
            .env(
                "CONSOLE_URL",
                format!("http://127.0.0.1:{}/console", a.port),
            )
            .env("CONSOLE_TOKEN", operator.trim())
            .env("CHROMIUM", &chromium)
            .env("SHOTS", &shots)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node is required (.ci/run installs Node.js)");
        let mut stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut b: Option<Serve> = None;
        let mut session = String::new();
        let mut done = false;
        let mut batches = 0;
        let deadline = Instant::now() + Duration::from_secs(180);
        for line in stdout.lines() {
            let line = line.expect("the script's output");
            assert!(Instant::now() < deadline, "the browser run took too long");
            eprintln!("browser: {line}");
            if line == "WANT_SESSION" {
                // Only the console's Host is up: the session is placed there.
                session = cli(
                    &dir,
                    &store,
                    &tenant_token,
                    &["create", "--message", "hello"],
                );
                cli(
                    &dir,
                    &store,
                    &tenant_token,
                    &[
                        "send",
                        &session,
                        r#"/tool write_note {"text":"from the test"}"#,
                    ],
                );
                b = Some(host(&dir, "console-b", &store, &credentials, false));
                writeln!(stdin, "{session}").unwrap();
            } else if line == "WANT_RUN" {
                std::fs::write(dir.join("program.yaml"), RUN_PROGRAM).unwrap();
                let run = ok(hostd_run(
                    &dir,
                    &[
                        "run",
                        "start",
                        "program.yaml",
                        "--store",
                        &store,
                        "--tenant",
                        "acme",
                    ],
                    &[("HOST_TENANT_TOKEN", &tenant_token)],
                ))
                .trim()
                .to_owned();
                assert!(run.starts_with("run-"), "{run}");
                writeln!(stdin, "{run}").unwrap();
            } else if let Some(n) = line.strip_prefix("WANT_RUNS ") {
                // Runs newer than any before, recorded straight into the store.
                let n: usize = n.parse().expect("a count of runs");
                batches += 1;
                let prefix = format!("run-page{batches}");
                testkit::runs::record_completed_runs(&store, "acme", &prefix, n);
                writeln!(stdin, "{prefix}-{:04}", n - 1).unwrap();
            } else if let Some(report) = line.strip_prefix("DRAINED ") {
                let report: serde_json::Value = serde_json::from_str(report).unwrap();
                assert_eq!(report["state"], "drained", "{report}");
                assert_eq!(report["requested_by"], "operator:admin", "{report}");
                assert_eq!(
                    report["released"],
                    serde_json::json!([format!("acme/{session}")]),
                    "{report}"
                );
                // A message after the drain: the session is placed on the other Host.
                cli(
                    &dir,
                    &store,
                    &tenant_token,
                    &["send", &session, "after the drain"],
                );
                writeln!(stdin, "MOVED").unwrap();
            } else if line == "DONE" {
                done = true;
            }
        }
        let out = child.wait_with_output().expect("the script ends");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success() && done,
            "the browser run failed:\n{stderr}"
        );
        drop(b);
        a
    });
    let a = run.await.expect("the browser run");
    drop(a);
}
