//! `hostd run logs -f` follows a run over its channel of step events, not by polling: with a
//! real `hostd serve` (embedded SQLite, and PostgreSQL), a follower started while the run is
//! parked prints the answered step and the agent step's reply and exits on the run's end well
//! inside the interval at which it would otherwise re-read the journal (5 s).

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use testkit::pg::FreshDatabase;
use testkit::process::{HostdClient as Client, Serve, hostd_command, tenant_credentials};

const PROGRAM: &str = "\
steps:
  - name: approve
    ask: Go on?
    answer: {type: boolean}
  - name: greet
    agent: assistant
    prompt: hello
";

fn cli(dir: &Path, c: &Client, args: &[&str]) -> String {
    c.run(dir, &[&["run"][..], args].concat())
}

fn follows_over_the_channel(dir: &Path, c: &Client) {
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let run = cli(dir, c, &["start", "program.yaml"]);
    testkit::eventually_blocking("the run to park on its ask", || {
        let s = cli(dir, c, &["status", &run]);
        if s.contains("open    approve") {
            Ok(())
        } else {
            Err(s)
        }
    });
    let mut follow = hostd_command(dir);
    follow.args(["run", "logs", "-f", &run]).args(&c.args);
    for (k, v) in &c.env {
        follow.env(k, v);
    }
    let mut follower = follow
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("logs -f starts");
    // Let the follower subscribe and print what is journaled (nothing yet).
    std::thread::sleep(Duration::from_millis(1500));
    let answered_at = Instant::now();
    cli(dir, c, &["answer", &run, "approve", "true"]);
    let status = testkit::eventually_blocking("logs -f to end", || {
        follower
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "still following".to_owned())
    });
    let took = answered_at.elapsed();
    let mut stdout = String::new();
    let mut stderr = String::new();
    follower
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    follower
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(
        !stderr.contains("polling"),
        "it followed the channel: {stderr}"
    );
    assert!(
        stdout.contains("approve") && stdout.contains("answered"),
        "{stdout}"
    );
    assert!(stdout.contains("You said: hello"), "{stdout}");
    assert!(stderr.contains("is completed"), "{stderr}");
    assert!(
        took < Duration::from_millis(4000),
        "woken by the channel, not by a re-read every 5 s: {took:?}\n{stdout}"
    );
}

#[test]
fn logs_follow_is_woken_by_the_runs_channel_on_sqlite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let _host = Serve::start(dir, "serve", &[]);
    follows_over_the_channel(dir, &Client::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_is_woken_by_the_runs_channel_on_postgres() {
    let Some(db) = FreshDatabase::create("runs_follow").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let (token, credentials) = tenant_credentials(&dir, "acme");
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || {
        let host = Serve::start(
            &dir,
            "serve",
            &[
                "--store",
                &url,
                "--credentials-file",
                credentials.to_str().expect("a UTF-8 path"),
                "--host-id",
                "follow-pg",
            ],
        );
        follows_over_the_channel(
            &dir,
            &Client {
                args: vec![
                    "--endpoint".into(),
                    format!("ws://127.0.0.1:{}", host.port),
                    "--tenant".into(),
                    "acme".into(),
                ],
                env: vec![("HOST_TENANT_TOKEN".into(), token)],
            },
        );
    })
    .await
    .expect("the case ran");
    db.drop_now().await;
}
