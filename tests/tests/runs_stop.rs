//! SIGTERM to a real `hostd serve` while a run is mid-invoke (its handler naps far longer than
//! the drain grace), on embedded SQLite and on PostgreSQL: `/readyz` answers 503 `draining` at
//! once, a `run.start` sent afterwards over a link opened before is refused `not_admitting`,
//! the handler is stopped at the grace, and the process exits within
//! `drain grace + 2 × idle boundary`. Nothing is recorded for the open step: the next Host
//! (the same data folder restarted, or another Host of the fleet) takes the run over under
//! epoch 2 and runs the step once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use controller::client::HostLinkClient;
use hostlink::runs::{RunReply, RunStarted};
use serde_json::{Value, json};
use sessionstore::TenantId;
use testkit::pg::FreshDatabase;
use testkit::process::{HostdClient as Client, Serve, tenant_credentials};

const GRACE: Duration = Duration::from_secs(3);
const IDLE_BOUNDARY: Duration = Duration::from_secs(2);

/// Stop options shared by every Host here (3 s + 2 × 2 s = a 7 s bound).
const STOP: [&str; 4] = ["--drain-grace", "3s", "--drain-idle-boundary", "2s"];

const PROGRAM: &str = "\
steps:
  - name: nap
    invoke: long-nap@1.0.0
    input: {}
";

/// A workspace with `long-nap`: the first time it runs it writes its pid to `pid` and sleeps
/// two minutes; once `first` exists it answers at once.
fn nap_workspace(dir: &Path) -> (PathBuf, PathBuf) {
    let ws = dir.join("ws");
    let pkg = ws.join("runnables/long-nap");
    std::fs::create_dir_all(&pkg).unwrap();
    let pid = dir.join("nap.pid");
    let first = dir.join("nap.first");
    std::fs::write(
        pkg.join("runnable.yaml"),
        "name: long-nap\nversion: 1.0.0\ndescription: Naps far past a drain grace the first time.\n\
         input: {type: object}\noutput:\n  type: object\n  properties:\n    napped: {type: boolean}\n  \
         required: [napped]\ncommand: sh\nargs: [nap.sh]\ntimeout: 300s\neffect: read_only\n",
    )
    .unwrap();
    let script = pkg.join("nap.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >/dev/null\nif [ -e '{first}' ]; then\n  \
             printf '{{\"ok\":true,\"output\":{{\"napped\":false}}}}\\n'\n  exit 0\nfi\n\
             touch '{first}'\necho $$ > '{pid}.tmp' && mv '{pid}.tmp' '{pid}'\nexec sleep 120\n",
            first = first.display(),
            pid = pid.display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (ws, pid)
}

/// Kills the napping handler if a failed check left it running (a passing stop has already).
struct Reap(i32);

impl Drop for Reap {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn alive(pid: i32) -> bool {
    // A zombie is not alive: it has stopped, only its reaping is pending.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn client_for(host: &Serve, token: &str) -> Client {
    Client {
        args: vec![
            "--endpoint".into(),
            format!("ws://127.0.0.1:{}", host.port),
            "--tenant".into(),
            "acme".into(),
        ],
        env: vec![("HOST_TENANT_TOKEN".into(), token.to_owned())],
    }
}

fn status(dir: &Path, c: &Client, run: &str) -> Value {
    let text = c.run(dir, &["--json", "run", "status", run]);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// What one stop showed.
struct Stopped {
    run: String,
    ready_503_after: Duration,
    readyz_body: String,
    refusal: Value,
    exited_after: Duration,
    log: String,
}

/// Starts the run on `host` over a link kept open, waits for the handler to nap, sends
/// SIGTERM and watches `/readyz`, a second `run.start` on that link and the exit.
async fn stop_mid_invoke(mut host: Serve, token: &str, pid_file: &Path) -> Stopped {
    let tenant = TenantId::new("acme").unwrap();
    let link = HostLinkClient::connect(
        &format!("ws://127.0.0.1:{}", host.port),
        &tenant,
        token,
        "runs-stop-test",
    )
    .await
    .expect("a link to the Host");
    let start = json!({"version": 1, "program": PROGRAM});
    let started: RunReply<RunStarted> =
        serde_json::from_str(&link.run_rpc("run.start", &start).await.expect("run.start"))
            .expect("a run.start reply");
    let run = started.result.expect("a started run").run_id;
    let pid = testkit::eventually("the handler to begin its nap", async || {
        std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .ok_or_else(|| format!("no pid yet\n{}", host.log_text()))
    })
    .await;
    let _reap = Reap(pid);
    assert!(alive(pid));

    let signalled = Instant::now();
    host.signal(nix::sys::signal::Signal::SIGTERM)
        .expect("SIGTERM");
    let (ready_503_after, readyz_body) = loop {
        match host.readyz() {
            Some((503, body)) => break (signalled.elapsed(), body),
            other => {
                assert!(
                    signalled.elapsed() < GRACE,
                    "/readyz still answers {other:?} {:?} after SIGTERM",
                    signalled.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let refused = link
        .run_rpc("run.start", &start)
        .await
        .expect("run.start answered on the open link");
    let refusal: Value = serde_json::from_str(&refused).expect("a run.start reply");
    assert!(
        alive(pid),
        "the handler runs on until the drain grace, not stopped at SIGTERM"
    );
    let exited_after = loop {
        if host.try_exit().is_some() {
            break signalled.elapsed();
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(60),
            "hostd serve still runs a minute after SIGTERM:\n{}",
            host.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let log = host.log_text();
    testkit::eventually("the napping handler to be stopped", async || {
        if alive(pid) {
            Err(format!("pid {pid} still runs"))
        } else {
            Ok(())
        }
    })
    .await;
    Stopped {
        run,
        ready_503_after,
        readyz_body,
        refusal,
        exited_after,
        log,
    }
}

/// The bound every stop must keep, and what else the stop must show.
fn check_stop(s: &Stopped) {
    eprintln!(
        "/readyz 503 after {:?}; exited after {:?}",
        s.ready_503_after, s.exited_after
    );
    assert!(
        s.ready_503_after < Duration::from_secs(1),
        "/readyz turned 503 only {:?} after SIGTERM (the extensions' stop came first)\n{}",
        s.ready_503_after,
        s.log
    );
    assert!(s.readyz_body.contains("draining"), "{}", s.readyz_body);
    assert_eq!(s.refusal["error"]["code"], "not_admitting", "{}", s.refusal);
    let bound = GRACE + 2 * IDLE_BOUNDARY;
    assert!(
        s.exited_after < bound + Duration::from_secs(2),
        "the stop took {:?}, past grace + 2 × idle boundary ({bound:?}) and a 2 s slack\n{}",
        s.exited_after,
        s.log
    );
    assert!(
        s.log.contains("halted mid-invoke"),
        "the driver was halted in its step:\n{}",
        s.log
    );
}

/// The run completed on the next Host under epoch 2, its one step recorded once, there.
fn check_taken_over(dir: &Path, c: &Client, run: &str) {
    let done = testkit::eventually_blocking("the next Host to complete the run", || {
        let v = status(dir, c, run);
        if v["state"] == "completed" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    });
    assert_eq!(done["epoch"], 2, "{done}");
    let nap: Vec<&Value> = done["journal"]
        .as_array()
        .expect("a journal")
        .iter()
        .filter(|e| e["step"] == "nap")
        .collect();
    assert_eq!(
        nap.len(),
        1,
        "nothing was recorded by the stopped Host: {done}"
    );
    assert_eq!(nap[0]["entry"], "result", "{done}");
    assert_eq!(nap[0]["epoch"], 2, "{done}");
    assert_eq!(nap[0]["body"]["output"]["napped"], false, "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_invoke_refuses_at_once_and_stops_within_the_bound_on_sqlite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let (ws, pid) = nap_workspace(&dir);
    let (token, credentials) = tenant_credentials(&dir, "acme");
    let ws_arg = ws.to_str().expect("a UTF-8 path").to_owned();
    let creds = credentials.to_str().expect("a UTF-8 path").to_owned();
    let args: Vec<String> = [
        "--runnables",
        &ws_arg,
        "--credentials-file",
        &creds,
        "--run-scan-interval",
        "200ms",
    ]
    .into_iter()
    .chain(STOP)
    .map(str::to_owned)
    .collect();
    let start = {
        let dir = dir.clone();
        move |name: &'static str| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Serve::start(&dir, name, &args)
        }
    };
    let first = {
        let start = start.clone();
        tokio::task::spawn_blocking(move || start("first"))
            .await
            .unwrap()
    };
    let stopped = stop_mid_invoke(first, &token, &pid).await;
    check_stop(&stopped);

    tokio::task::spawn_blocking(move || {
        let second = start("second");
        let c2 = client_for(&second, &token);
        check_taken_over(&dir, &c2, &stopped.run);
        drop(second);
    })
    .await
    .expect("the takeover case ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_invoke_refuses_at_once_and_stops_within_the_bound_on_postgres() {
    let Some(db) = FreshDatabase::create("runs_stop").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let (ws, pid) = nap_workspace(&dir);
    let (token, credentials) = tenant_credentials(&dir, "acme");
    let ws_arg = ws.to_str().expect("a UTF-8 path").to_owned();
    let args: Vec<String> = [
        "--runnables",
        &ws_arg,
        "--run-lease",
        "900ms",
        "--run-scan-interval",
        "200ms",
    ]
    .into_iter()
    .chain(STOP)
    .map(str::to_owned)
    .collect();
    let member = {
        let (dir, url, credentials) = (dir.clone(), db.url.clone(), credentials.clone());
        move |name: &'static str| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Serve::fleet_member(&dir, name, &url, &credentials, &args)
        }
    };
    let (a, b) = {
        let member = member.clone();
        tokio::task::spawn_blocking(move || (member("stop-a"), member("stop-b")))
            .await
            .unwrap()
    };
    let stopped = stop_mid_invoke(a, &token, &pid).await;
    check_stop(&stopped);

    let case_dir = dir.clone();
    tokio::task::spawn_blocking(move || {
        let c = client_for(&b, &token);
        check_taken_over(&case_dir, &c, &stopped.run);
        drop(b);
    })
    .await
    .expect("the takeover case ran");
    db.drop_now().await;
}
