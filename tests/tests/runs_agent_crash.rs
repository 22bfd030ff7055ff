//! An `agent:` step survives its Host being killed with SIGKILL mid-turn: a real `hostd serve`
//! (embedded SQLite, and PostgreSQL) is killed while the scripted agent is still streaming its
//! reply; the restarted Host takes the run back under epoch 2, finds the step's session and its
//! one prompt command, and the run completes with the reply — one command, one user message,
//! one finished turn in the step's session.

use std::path::Path;

use serde_json::Value;
use testkit::pg::FreshDatabase;
use testkit::process::{HostdClient as Client, Serve, tenant_credentials};

const PROGRAM: &str = "\
steps:
  - name: greet
    agent: assistant
    prompt: \"/slow 600 one two three four five six\"
";

/// Residency leases that lapse within the test's wait once their Host is dead.
const QUICK_LEASES: &[&str] = &[
    "--registry-heartbeat",
    "300ms",
    "--registry-expiry",
    "1500ms",
];

fn hostd_json(dir: &Path, c: &Client, args: &[&str]) -> Value {
    let text = c.run(dir, &[&["--json"][..], args].concat());
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn hostd_lines(dir: &Path, c: &Client, args: &[&str]) -> Vec<Value> {
    c.run(dir, &[&["--json"][..], args].concat())
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Starts the run on `first`, kills it mid-turn, starts `second` and checks the outcome.
fn survives_a_kill_mid_turn(
    dir: &Path,
    first: Serve,
    second: impl FnOnce() -> Serve,
    run_client: impl Fn(&Serve) -> Client,
    session_client: &Client,
) {
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let c = run_client(&first);
    let started = hostd_json(dir, &c, &["run", "start", "program.yaml"]);
    let run = started["run_id"].as_str().expect("a run id").to_owned();
    let session = format!("run-{run}-greet-1");
    // Kill while the turn streams (about 3.6 s of deltas): the prompt is admitted, the reply
    // not yet journaled.
    testkit::eventually_blocking("the prompt to be admitted", || {
        let out = session_client.output(dir, &["--json", "session", "commands", &session]);
        if out.status.success() && !out.stdout.is_empty() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(800));
    let before = hostd_lines(dir, session_client, &["session", "journal", &session]);
    assert!(
        !before.iter().any(|e| e["body"]["type"] == "turn_done"),
        "the kill must land mid-turn: {before:?}"
    );
    let (_, _) = first.kill_dead();
    let host = second();
    let c = run_client(&host);
    let done = testkit::eventually_blocking("the run to complete on the restarted Host", || {
        let v = hostd_json(dir, &c, &["run", "status", &run]);
        if v["state"] == "completed" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    });
    assert_eq!(done["epoch"], 2, "{done}");
    let results: Vec<&Value> = done["journal"]
        .as_array()
        .expect("a journal")
        .iter()
        .filter(|e| e["step"] == "greet" && e["entry"] == "result")
        .collect();
    assert_eq!(results.len(), 1, "{done}");
    assert_eq!(results[0]["body"]["output"], "one two three four five six");
    let commands = hostd_lines(dir, session_client, &["session", "commands", &session]);
    assert_eq!(commands.len(), 1, "one prompt command: {commands:?}");
    assert_eq!(commands[0]["command_id"], format!("{session}.prompt"));
    let events = hostd_lines(dir, session_client, &["session", "journal", &session]);
    let count = |t: &str| events.iter().filter(|e| e["body"]["type"] == t).count();
    assert_eq!(count("user_message"), 1, "{events:?}");
    assert_eq!(count("turn_done"), 1, "{events:?}");
    drop(host);
}

#[test]
fn an_agent_step_survives_its_host_killed_mid_turn_on_sqlite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let none = Client::default();
    survives_a_kill_mid_turn(
        dir,
        Serve::start(dir, "first", QUICK_LEASES),
        || Serve::start(dir, "second", QUICK_LEASES),
        // The data folder's endpoint may still name the killed Host for a moment.
        |h| Client {
            args: vec!["--endpoint".into(), format!("ws://127.0.0.1:{}", h.port)],
            env: Vec::new(),
        },
        &none,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_step_survives_its_host_killed_mid_turn_on_postgres() {
    let Some(db) = FreshDatabase::create("runs_agent_crash").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let (token, credentials) = tenant_credentials(&dir, "acme");
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || {
        let creds = credentials.to_str().expect("a UTF-8 path").to_owned();
        let serve = |name: &str| {
            Serve::start(
                &dir,
                name,
                &[
                    "--store",
                    &url,
                    "--credentials-file",
                    &creds,
                    "--host-id",
                    "crash-pg",
                    "--registry-heartbeat",
                    "300ms",
                    "--registry-expiry",
                    "1500ms",
                ],
            )
        };
        let session_client = Client {
            args: vec![
                "--store".into(),
                url.clone(),
                "--tenant".into(),
                "acme".into(),
            ],
            env: vec![("HOST_TENANT_TOKEN".into(), token.clone())],
        };
        survives_a_kill_mid_turn(
            &dir,
            serve("first"),
            || serve("second"),
            |h| Client {
                args: vec![
                    "--endpoint".into(),
                    format!("ws://127.0.0.1:{}", h.port),
                    "--tenant".into(),
                    "acme".into(),
                ],
                env: vec![("HOST_TENANT_TOKEN".into(), token.clone())],
            },
            &session_client,
        );
    })
    .await
    .expect("the case ran");
    db.drop_now().await;
}
