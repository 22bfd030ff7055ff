//! `hostd flow` as a user drives it: separate invocations of the real binary against a
//! workspace whose services are real processes (python3's standard library and `sleep`).
//! Every test that starts services checks that none of their process groups survives.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use orchestration::flow::procfs;
use orchestration::flow::state::{self, StatePaths};

const HOSTD: &str = env!("CARGO_BIN_EXE_hostd");

/// A web service on python3's standard library (its port comes from PORT, which the flow
/// sets for a one-endpoint service), and a service with no endpoints.
const WORKSPACE: &str = "name: cli
services:
  - name: store
    command: sleep
    args: ['300']
  - name: web
    command: sh
    args: [-c, 'exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"']
    endpoints: [{name: http, api: http, health: /}]
    dependencies: [{name: store}]
";

fn workspace(flow_yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("flow.yaml"), flow_yaml).expect("write flow.yaml");
    dir
}

fn hostd(dir: &Path, args: &[&str]) -> Output {
    Command::new(HOSTD)
        .arg("flow")
        .arg("-w")
        .arg(dir)
        .args(args)
        .output()
        .expect("run hostd")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running `hostd flow up` whose stderr lines are collected.
struct Up {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Up {
    fn start(dir: &Path, extra: &[&str]) -> Up {
        let mut child = Command::new(HOSTD)
            .arg("flow")
            .arg("-w")
            .arg(dir)
            .arg("up")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hostd flow up");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        Up { child, lines }
    }

    fn wait_for(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .any(|l| l.contains(needle))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no `{needle}` from hostd flow up within 30 s; it said:\n{}",
                self.lines.lock().expect("lines").join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "hostd flow up did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn said(&self) -> String {
        self.lines.lock().expect("lines").join("\n")
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The process groups the flow recorded.
fn recorded_groups(dir: &Path) -> Vec<i32> {
    let recorded = state::read_state(&StatePaths::for_workspace(dir))
        .expect("read state")
        .expect("a recorded flow");
    recorded
        .services
        .iter()
        .filter_map(|s| s.process.as_ref().map(|p| p.pgid))
        .collect()
}

fn assert_no_orphans(groups: &[i32]) {
    assert!(!groups.is_empty(), "nothing to check");
    for &pgid in groups {
        let live = procfs::live_members(pgid).expect("read /proc");
        assert!(live.is_empty(), "process group {pgid} survives: {live:?}");
    }
}

fn web_workspace() -> tempfile::TempDir {
    workspace(WORKSPACE)
}

#[test]
fn hostd_help_lists_the_flow_subcommands_for_a_newcomer() {
    let top = Command::new(HOSTD).arg("--help").output().expect("run");
    assert!(top.status.success());
    assert!(text(&top.stdout).contains("flow"), "{}", text(&top.stdout));
    let flow = Command::new(HOSTD)
        .args(["flow", "--help"])
        .output()
        .expect("run");
    let help = text(&flow.stdout);
    for sub in ["up", "down", "status", "logs", "graph", "--workspace"] {
        assert!(
            help.contains(sub),
            "`hostd flow --help` does not mention {sub}:\n{help}"
        );
    }
}

#[test]
fn graph_prints_each_stage_as_text_and_as_dot() {
    let dir = workspace(
        "services:
  - name: api
    command: 'true'
    endpoints: [{name: grpc, api: grpc}]
    dependencies: [{name: db, kind: runtime, endpoints: [pg]}]
  - name: db
    command: 'true'
    endpoints: [{name: pg, api: tcp}]
    dependencies: [{name: api, kind: schema}]
",
    );
    let out = hostd(dir.path(), &["graph"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("build stage"), "{shown}");
    assert!(shown.contains("db -> api  [schema]"), "{shown}");
    assert!(shown.contains("api -> db  [runtime: pg]"), "{shown}");

    let out = hostd(dir.path(), &["graph", "--stage", "run", "--format", "dot"]);
    let dot = text(&out.stdout);
    assert!(dot.starts_with("digraph flow {"), "{dot}");
    assert!(
        dot.contains("\"api\" -> \"db\" [label=\"runtime: pg\"]"),
        "{dot}"
    );
    assert!(
        !dot.contains("schema"),
        "the run stage has no build edge: {dot}"
    );

    let out = hostd(dir.path(), &["graph", "--stage", "deploy"]);
    assert!(!out.status.success(), "an unknown stage is an error");
}

#[test]
fn an_invalid_workspace_is_refused_with_the_file_the_service_and_the_reason() {
    let dir = workspace(
        "services:\n  - name: api\n    command: 'true'\n    dependencies: [{name: db}]\n",
    );
    let out = hostd(dir.path(), &["up"]);
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(said.contains("flow.yaml"), "{said}");
    assert!(said.contains("service `api`"), "{said}");
    assert!(
        said.contains("depends on `db`, which is not a service of this workspace"),
        "{said}"
    );
}

#[test]
fn down_from_a_second_invocation_stops_what_up_started_and_up_exits_cleanly() {
    let dir = web_workspace();
    let mut up = Up::start(dir.path(), &[]);
    up.wait_for("[flow] up: 2 service(s)");
    let groups = recorded_groups(dir.path());

    let status = hostd(dir.path(), &["status"]);
    let shown = text(&status.stdout);
    assert!(shown.contains("supervised by `hostd flow up`"), "{shown}");
    let web = shown
        .lines()
        .find(|l| l.starts_with("web "))
        .expect("a web row");
    assert!(
        web.contains("running") && web.contains("http=127.0.0.1:"),
        "{shown}"
    );

    let logs = hostd(dir.path(), &["logs", "web"]);
    assert!(
        text(&logs.stdout).contains("HEAD / HTTP/1.1"),
        "{}",
        text(&logs.stdout)
    );
    let merged = text(&hostd(dir.path(), &["logs"]).stdout);
    let first_store = merged
        .find("store * started pid")
        .expect("store's start in the merged log");
    let first_web = merged
        .find("  web * started pid")
        .expect("web's start in the merged log");
    assert!(first_store < first_web, "merged in time order:\n{merged}");

    let down = hostd(dir.path(), &["down"]);
    let said = text(&down.stdout);
    assert!(down.status.success(), "{said}{}", text(&down.stderr));
    assert!(said.contains("asked the running `hostd flow up`"), "{said}");
    let web_receipt = said
        .lines()
        .find(|l| l.starts_with("web "))
        .expect("a web receipt");
    let store_receipt = said
        .lines()
        .find(|l| l.starts_with("store "))
        .expect("a store receipt");
    assert!(
        web_receipt.contains(" 0 ") && web_receipt.contains("stopped"),
        "{said}"
    );
    assert!(
        store_receipt.contains(" 1 ") && store_receipt.contains("stopped"),
        "{said}"
    );

    assert!(up.wait_exit().success(), "{}", up.said());
    assert_no_orphans(&groups);
    let after = hostd(dir.path(), &["status"]);
    assert!(
        text(&after.stdout).contains("no flow is up"),
        "{}",
        text(&after.stdout)
    );
}

#[test]
fn down_after_up_was_killed_stops_the_recorded_process_groups_itself() {
    let dir = web_workspace();
    let mut up = Up::start(dir.path(), &[]);
    up.wait_for("[flow] up: 2 service(s)");
    let groups = recorded_groups(dir.path());
    // A crash of `up` itself: no teardown runs, the services keep running.
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGKILL).expect("kill up");
    up.wait_exit();
    for &g in &groups {
        assert!(
            !procfs::live_members(g).expect("proc").is_empty(),
            "group {g} should still run"
        );
    }

    let status = hostd(dir.path(), &["status"]);
    assert!(
        text(&status.stdout).contains("is gone: run `hostd flow down`"),
        "{}",
        text(&status.stdout)
    );

    let down = hostd(dir.path(), &["down"]);
    let said = text(&down.stdout);
    assert!(down.status.success(), "{said}{}", text(&down.stderr));
    assert!(
        said.contains("is gone; stopped its recorded process groups"),
        "{said}"
    );
    assert_no_orphans(&groups);
    assert!(!StatePaths::for_workspace(dir.path()).state_file.exists());
}

#[test]
fn ctrl_c_on_up_tears_everything_down_in_layers() {
    let dir = web_workspace();
    let mut up = Up::start(dir.path(), &[]);
    up.wait_for("[flow] up: 2 service(s)");
    let groups = recorded_groups(dir.path());
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).expect("interrupt up");
    assert!(up.wait_exit().success(), "{}", up.said());
    let said = up.said();
    let web = said.find("[flow] web: stopped").expect("a web receipt");
    let store = said.find("[flow] store: stopped").expect("a store receipt");
    assert!(web < store, "the consumer is stopped first:\n{said}");
    assert_no_orphans(&groups);
}

#[test]
fn an_interrupted_up_that_was_still_waiting_exits_130_and_leaves_nothing() {
    let dir = workspace(
        "services:
  - name: base
    command: sleep
    args: ['300']
  - name: never
    command: sleep
    args: ['300']
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: base}]
",
    );
    let mut up = Up::start(dir.path(), &["--readiness-timeout", "5m"]);
    up.wait_for("[flow] never: started");
    let groups = recorded_groups(dir.path());
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).expect("interrupt up");
    let status = up.wait_exit();
    assert_eq!(status.code(), Some(130), "{}", up.said());
    assert!(
        up.said()
            .contains("interrupted; everything started was stopped"),
        "{}",
        up.said()
    );
    assert_no_orphans(&groups);
}
