//! `hostd run` against a fleet through its store alone: two `hostd serve` share one PostgreSQL
//! database, and every `hostd run` command is given `--store` (no `--endpoint`). The run is
//! started on a live run Host of the registry; `hostd run logs -f --store` follows it on the
//! Host holding it; that Host is killed with SIGKILL mid-run, and the follower dials the
//! survivor, reads the journal again and follows the run to completion there, printing every
//! journal entry once.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;

use serde_json::Value;
use testkit::pg::FreshDatabase;
use testkit::process::{HostdClient as Client, Serve, hostd_command, tenant_credentials};

const PROGRAM: &str = "\
steps:
  - name: first
    sleep: 0s
  - name: nap
    sleep: 4s
  - name: last
    sleep: 0s
";

fn fleet_host(dir: &Path, name: &str, store: &str, credentials: &Path) -> Serve {
    Serve::fleet_member(
        dir,
        name,
        store,
        credentials,
        &[
            "--run-lease",
            "1500ms",
            // Longer than the 4 s nap, so the holder sleeps it in place (a longer sleep would
            // be parked in the store with no holder) and the follower has a Host to lose.
            "--run-scan-interval",
            "5s",
            "--run-poll",
            "100ms",
        ],
    )
}

fn status(dir: &Path, c: &Client, run: &str) -> Value {
    serde_json::from_str(&c.run(dir, &["--json", "run", "status", run])).expect("status JSON")
}

/// The registry id of the Host a run's holder (`<host>/<attempt>`) names.
fn holder_host(v: &Value) -> String {
    let holder = v["holder"].as_str().unwrap_or_default();
    holder.split('/').next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_follow_through_the_store_follows_a_run_to_the_surviving_host() {
    let Some(db) = FreshDatabase::create("runs_fleet_cli").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || follows_the_run_across_a_kill(&dir, &url))
        .await
        .expect("the case ran");
    db.drop_now().await;
}

fn follows_the_run_across_a_kill(dir: &Path, url: &str) {
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let mut hosts = vec![
        fleet_host(dir, "cli-a", url, &credentials),
        fleet_host(dir, "cli-b", url, &credentials),
    ];
    // No endpoint anywhere: the store's registry is how every command finds a Host.
    let c = Client {
        args: vec![
            "--store".into(),
            url.to_owned(),
            "--tenant".into(),
            "acme".into(),
        ],
        env: vec![("HOST_TENANT_TOKEN".into(), token)],
    };
    let run = c.run(dir, &["run", "start", "program.yaml"]);
    assert!(run.starts_with("run-"), "{run}");
    let parked = testkit::eventually_blocking("the run to reach its sleep", || {
        let v = status(dir, &c, &run);
        match v["checkpoint"]["name"].as_str() {
            Some("nap") => Ok(v),
            _ => Err(v.to_string()),
        }
    });
    assert_eq!(parked["epoch"], 1, "{parked}");
    let holder = holder_host(&parked);
    let held = ["cli-a", "cli-b"]
        .iter()
        .position(|n| *n == holder)
        .unwrap_or_else(|| panic!("the holder {holder} is one of the fleet: {parked}"));
    let survivor = if held == 0 { "cli-b" } else { "cli-a" };

    let mut follow = hostd_command(dir);
    follow
        .args(["--json", "run", "logs", "-f", &run])
        .args(&c.args);
    for (k, v) in &c.env {
        follow.env(k, v);
    }
    let mut follower = follow
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("logs -f starts");
    // Let the follower link to the holder and print what is journaled so far.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (_, _) = hosts.remove(held).kill_dead();

    let exit = testkit::eventually_blocking("logs -f to follow the run to its end", || {
        follower
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "still following".to_owned())
    });
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
    assert!(exit.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("lost the link to Host {holder}")),
        "the follower was on the holder and lost it: {stderr}"
    );
    assert!(
        stderr.contains(&format!("following run {run} on Host {survivor}")),
        "{stderr}"
    );
    assert!(stderr.contains("is completed"), "{stderr}");

    // Every journal entry printed once, in order, across the two Hosts.
    let entries: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let seqs: Vec<u64> = entries.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "each entry once: {seqs:?}"
    );
    for step in ["first", "nap", "last"] {
        let results = entries
            .iter()
            .filter(|e| e["step"] == step && e["entry"] == "result")
            .count();
        assert_eq!(results, 1, "step {step}: {stdout}");
    }
    let last = entries
        .iter()
        .find(|e| e["step"] == "last" && e["entry"] == "result")
        .unwrap();
    assert_eq!(last["epoch"], 2, "the survivor finished the run: {last}");

    // The store's registry still finds the run for every other command.
    let done = status(dir, &c, &run);
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(holder_host(&done), survivor, "{done}");
    let ps: Value = serde_json::from_str(&c.run(dir, &["--json", "run", "ps"])).expect("ps JSON");
    assert_eq!(ps["runs"][0]["run_id"], run.as_str(), "{ps}");
    assert_eq!(ps["runs"][0]["state"], "completed", "{ps}");

    // More runs than one `run.list` page holds: `run ps` reads every page, oldest first.
    let bulk = hostlink::runs::RUN_LIST_MAX_LIMIT as usize + 100;
    testkit::runs::record_completed_runs(url, "acme", "run-bulk", bulk);
    let ps: Value = serde_json::from_str(&c.run(dir, &["--json", "run", "ps"])).expect("ps JSON");
    let listed = ps["runs"].as_array().expect("runs");
    assert_eq!(listed.len(), bulk + 1);
    assert_eq!(listed[0]["run_id"], run.as_str());
    assert_eq!(listed[bulk]["run_id"], format!("run-bulk-{:04}", bulk - 1));
    assert!(
        ps.get("next").is_none(),
        "one whole listing: {}",
        ps["next"]
    );
}
