//! No handler outlives its Host: a real `hostd serve` (embedded SQLite, and PostgreSQL) runs a
//! workflow step whose handler starts a grandchild and waits (both write their pids). Killed
//! with SIGKILL mid-invoke, the Host leaves nothing running: the handler's guard stops the
//! group within two seconds. Drained with a drain bound shorter than the handler, the Host
//! halts the invoke at the bound, records nothing for the step, and a later Host finishes the
//! run under the next epoch.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::pg::FreshDatabase;
use testkit::process::{HostdClient as Client, Serve, tenant_credentials};

/// Its first attempt starts a grandchild, writes both pids and waits; a later attempt (the
/// pid file exists) succeeds at once.
const HOLD: &str = r#"#!/bin/sh
request=$(cat)
dir=$(printf '%s' "$request" | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')
if [ -e "$dir/handler.pid" ]; then
  echo '{"ok":true,"output":{"attempt":"later"}}'
  exit 0
fi
sleep 1000 &
echo $! > "$dir/grandchild.pid"
echo $$ > "$dir/handler.pid.tmp"
mv "$dir/handler.pid.tmp" "$dir/handler.pid"
wait
"#;

const DECLARATION: &str = "\
name: hold
version: 1.0.0
input:
  type: object
  properties:
    dir: {type: string}
  required: [dir]
output:
  type: object
  properties: {attempt: {type: string}}
  required: [attempt]
command: ./hold.sh
timeout: 60s
effect: idempotent
";

const PROGRAM: &str = "\
steps:
  - name: hold
    invoke: hold@1.0.0
    input: {dir: \"${input.dir}\"}
";

/// The runnables workspace `shop` with `hold@1.0.0`, the program, and the folder the handler
/// writes its pids to.
fn workspace(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let ws = dir.join("shop");
    let folder = ws.join("runnables/hold");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("runnable.yaml"), DECLARATION).unwrap();
    let script = folder.join("hold.sh");
    std::fs::write(&script, HOLD).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let pids = dir.join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    (ws, pids)
}

/// Whether `pid` runs (a zombie has ended).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_owned()))
        .is_some_and(|r| !r.starts_with('Z') && !r.starts_with('X'))
}

/// The handler's and the grandchild's pids, once written.
fn pids(folder: &Path) -> (i32, i32) {
    let read = |name: &str| {
        std::fs::read_to_string(folder.join(name))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
    };
    testkit::eventually_blocking("the handler to write its pids", || {
        read("handler.pid")
            .zip(read("grandchild.pid"))
            .ok_or_else(|| "not yet".to_owned())
    })
}

/// Waits until neither pid runs; how long that took from `since`, or `None` after `bound`.
fn both_gone(pids: (i32, i32), since: Instant, bound: Duration) -> Option<Duration> {
    loop {
        if !alive(pids.0) && !alive(pids.1) {
            return Some(since.elapsed());
        }
        if since.elapsed() > bound {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn hostd_json(dir: &Path, c: &Client, args: &[&str]) -> Value {
    let text = c.run(dir, &[&["--json"][..], args].concat());
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn start_run(dir: &Path, c: &Client, pids: &Path) -> String {
    let input = serde_json::json!({ "dir": pids }).to_string();
    let started = hostd_json(
        dir,
        c,
        &["run", "start", "program.yaml", "--input", input.as_str()],
    );
    started["run_id"].as_str().expect("a run id").to_owned()
}

/// A handler and its grandchild are gone within 2 s of a SIGKILL of their Host.
fn a_kill_leaves_nothing_running(dir: &Path, host: Serve, client: &Client, folder: &Path) {
    start_run(dir, client, folder);
    let (handler, grandchild) = pids(folder);
    assert!(alive(handler) && alive(grandchild));
    let killed = Instant::now();
    let (_, log) = host.kill_dead();
    let took = both_gone((handler, grandchild), killed, Duration::from_secs(2));
    assert!(
        took.is_some(),
        "still running 2 s after the Host's SIGKILL: handler {} grandchild {}\n{log}",
        alive(handler),
        alive(grandchild)
    );
}

/// A drain out of time halts the invoke and records nothing; a later Host finishes the run.
fn a_drain_out_of_time_halts_the_handler(
    dir: &Path,
    first: Serve,
    second: impl FnOnce() -> Serve,
    client_of: impl Fn(&Serve) -> Client,
    folder: &Path,
) {
    let c = client_of(&first);
    let run = start_run(dir, &c, folder);
    let (handler, grandchild) = pids(folder);
    let (_, log) = first.terminate();
    // Halted at the drain's bound: stopped before the Host exited (a little slack for the
    // kernel to finish the signalled processes).
    assert!(
        both_gone(
            (handler, grandchild),
            Instant::now(),
            Duration::from_millis(500)
        )
        .is_some(),
        "the handler outlived the drain\n{log}"
    );
    assert!(
        log.contains("halted mid-invoke"),
        "the drain ran out of time: {log}"
    );
    let host = second();
    let c = client_of(&host);
    let done = testkit::eventually_blocking("the later Host to finish the run", || {
        let v = hostd_json(dir, &c, &["run", "status", &run]);
        if v["state"] == "completed" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    });
    assert_eq!(done["epoch"], 2, "{done}");
    let hold: Vec<&Value> = done["journal"]
        .as_array()
        .expect("a journal")
        .iter()
        .filter(|e| e["step"] == "hold")
        .collect();
    assert_eq!(hold.len(), 1, "only the later attempt is journaled: {done}");
    assert_eq!(hold[0]["entry"], "result");
    assert_eq!(hold[0]["epoch"], 2);
    assert_eq!(hold[0]["body"]["output"]["attempt"], "later");
    drop(host);
}

fn local_client(host: &Serve) -> Client {
    // The data folder's endpoint may still name a Host that is gone.
    Client {
        args: vec!["--endpoint".into(), format!("ws://127.0.0.1:{}", host.port)],
        env: Vec::new(),
    }
}

#[test]
fn a_handler_and_its_grandchild_end_within_two_seconds_of_a_kill_9_of_their_host_on_sqlite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (ws, folder) = workspace(dir);
    let host = Serve::start(dir, "first", &["--runnables", ws.to_str().unwrap()]);
    let c = local_client(&host);
    a_kill_leaves_nothing_running(dir, host, &c, &folder);
}

#[test]
fn a_drain_that_runs_out_of_time_halts_the_handler_records_nothing_and_a_later_host_finishes_on_sqlite()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (ws, folder) = workspace(dir);
    let ws = ws.to_str().unwrap().to_owned();
    let args = [
        "--runnables",
        &ws,
        "--drain-grace",
        "2s",
        "--drain-idle-boundary",
        "1s",
    ];
    a_drain_out_of_time_halts_the_handler(
        dir,
        Serve::start(dir, "first", &args),
        || Serve::start(dir, "second", &args),
        local_client,
        &folder,
    );
}

/// Runs `case` against a fresh PostgreSQL database: Hosts started by `serve(name, extra)`
/// share it (and one host id), clients of tenant `acme` reach them by endpoint.
async fn on_postgres(
    label: &str,
    case: impl FnOnce(&Path, &dyn Fn(&str) -> Serve, &dyn Fn(&Serve) -> Client, &Path) + Send + 'static,
) {
    let Some(db) = FreshDatabase::create(label).await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let (token, credentials) = tenant_credentials(&dir, "acme");
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || {
        let (ws, folder) = workspace(&dir);
        let creds = credentials.to_str().expect("a UTF-8 path").to_owned();
        let ws = ws.to_str().expect("a UTF-8 path").to_owned();
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
                    "guard-pg",
                    "--runnables",
                    &ws,
                    "--drain-grace",
                    "2s",
                    "--drain-idle-boundary",
                    "1s",
                ],
            )
        };
        let client = |h: &Serve| Client {
            args: vec![
                "--endpoint".into(),
                format!("ws://127.0.0.1:{}", h.port),
                "--tenant".into(),
                "acme".into(),
            ],
            env: vec![("HOST_TENANT_TOKEN".into(), token.clone())],
        };
        case(&dir, &serve, &client, &folder);
    })
    .await
    .expect("the case ran");
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_and_its_grandchild_end_within_two_seconds_of_a_kill_9_of_their_host_on_postgres()
{
    on_postgres("guard_kill", |dir, serve, client, folder| {
        let host = serve("first");
        let c = client(&host);
        a_kill_leaves_nothing_running(dir, host, &c, folder);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_runs_out_of_time_halts_the_handler_records_nothing_and_a_later_host_finishes_on_postgres()
 {
    on_postgres("guard_drain", |dir, serve, client, folder| {
        a_drain_out_of_time_halts_the_handler(
            dir,
            serve("first"),
            || serve("second"),
            client,
            folder,
        );
    })
    .await;
}
