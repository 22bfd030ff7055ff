//! `hostd flow` as a user drives it: separate invocations of the real binary against a
//! workspace whose services are real processes (python3's standard library and `sleep`).
//! Every test that starts services checks that none of their process groups survives.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flow::procfs;
use flow::state::{self, StatePaths};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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

/// The pid `up` reported for a service: `[flow] <service>: started (pid N)`.
fn started_pid(up: &Up, service: &str) -> i32 {
    let said = up.said();
    let marker = format!("[flow] {service}: started (pid ");
    let start = said
        .find(&marker)
        .unwrap_or_else(|| panic!("no start of {service} in:\n{said}"))
        + marker.len();
    said[start..]
        .split(')')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid for {service} in:\n{said}"))
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Row 80: a crash of `up` while a service is still waiting leaves nothing `down` cannot see.
#[test]
fn a_killed_up_leaves_no_process_group_that_down_cannot_see() {
    let dir = workspace(
        "services:
  - name: never
    command: sleep
    args: ['300']
    endpoints: [{name: http, api: tcp}]
",
    );
    let mut up = Up::start(dir.path(), &["--readiness-timeout", "5m"]);
    up.wait_for("[flow] never: started");
    let pgid = started_pid(&up, "never");
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGKILL).expect("kill up");
    up.wait_exit();
    assert!(
        !procfs::live_members(pgid).expect("proc").is_empty(),
        "the service outlived its up"
    );
    assert_eq!(
        recorded_groups(dir.path()),
        vec![pgid],
        "recorded while still waiting"
    );
    let down = hostd(dir.path(), &["down"]);
    let said = text(&down.stdout);
    assert!(down.status.success(), "{said}{}", text(&down.stderr));
    assert!(
        said.lines()
            .any(|l| l.starts_with("never ") && l.contains("stopped")),
        "{said}"
    );
    assert_no_orphans(&[pgid]);
}

/// Row 26: the note that a reference superseded an `external` declaration is shown by
/// default, not only at `--log info`.
#[test]
fn up_says_when_a_reference_supersedes_an_external_declaration() {
    let dir = workspace(
        "services:
  - name: prod
    command: sh
    args: [-c, 'exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"']
    endpoints: [{name: http, api: tcp}]
  - name: cons
    command: sleep
    args: ['300']
    dependencies: [{name: prod, kind: external}]
    env: {PROD: '${endpoint:prod/http}'}
",
    );
    let mut up = Up::start(dir.path(), &["cons"]);
    up.wait_for("[flow] up: 2 service(s)");
    let groups = recorded_groups(dir.path());
    assert!(
        up.said()
            .contains("cons: note: its `external` dependency on `prod` is superseded"),
        "{}",
        up.said()
    );
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).expect("interrupt up");
    assert!(up.wait_exit().success(), "{}", up.said());
    assert_no_orphans(&groups);
}

/// Row 92: a refusal at load or graph time is printed with its stable code, and under
/// `--json` as one JSON object.
#[test]
fn refusals_are_printed_with_their_stable_codes() {
    let cycle = workspace(
        "services:
  - name: a
    command: 'true'
    endpoints: [{name: e, api: tcp}]
    dependencies: [{name: b, kind: runtime}]
  - name: b
    command: 'true'
    endpoints: [{name: e, api: tcp}]
    dependencies: [{name: a, kind: runtime}]
",
    );
    let out = hostd(cycle.path(), &["up"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("flow.graph.cycle: run dependencies have a cycle: a -> b -> a"),
        "{}",
        text(&out.stderr)
    );
    let out = hostd(cycle.path(), &["graph"]);
    assert!(
        text(&out.stderr).contains("flow.graph.cycle"),
        "{}",
        text(&out.stderr)
    );

    let broken = workspace("services:\n  - name: a\n    command: 'true'\n    helth: /\n");
    let out = hostd(broken.path(), &["up"]);
    assert!(
        text(&out.stderr).contains("flow.manifest.unknown_key"),
        "{}",
        text(&out.stderr)
    );
    let out = hostd(broken.path(), &["up", "--json"]);
    let line = text(&out.stderr);
    let error: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON object");
    assert_eq!(error["error"]["code"], "flow.manifest.unknown_key");

    let fine = web_workspace();
    let out = hostd(fine.path(), &["up", "nosuch"]);
    assert!(
        text(&out.stderr).contains("flow.graph.unknown_service"),
        "{}",
        text(&out.stderr)
    );
}

/// A service that ignores SIGTERM: only SIGKILL stops it.
const STUBBORN: &str = "services:
  - name: stubborn
    command: sh
    args: [-c, 'trap \"\" TERM; sleep 300']
";

/// Row 76: a receipt other than `stopped` is a non-zero exit and an error line, for `up`
/// interrupted by Ctrl-C and for `down` asking that `up`.
#[test]
fn a_forced_stop_makes_up_and_down_exit_non_zero_with_an_error_line() {
    let dir = workspace(STUBBORN);
    let mut up = Up::start(dir.path(), &["--teardown-budget", "1s"]);
    up.wait_for("[flow] up: 1 service(s)");
    let groups = recorded_groups(dir.path());
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).expect("interrupt up");
    let status = up.wait_exit();
    assert!(!status.success(), "{}", up.said());
    assert!(
        up.said()
            .contains("[flow] error: `stubborn` did not stop cleanly (timed-out)"),
        "{}",
        up.said()
    );
    assert_no_orphans(&groups);

    let mut up = Up::start(dir.path(), &["--teardown-budget", "1s"]);
    up.wait_for("[flow] up: 1 service(s)");
    let groups = recorded_groups(dir.path());
    let down = hostd(dir.path(), &["down"]);
    assert!(!down.status.success(), "{}", text(&down.stdout));
    assert!(
        text(&down.stdout).contains("timed-out"),
        "{}",
        text(&down.stdout)
    );
    assert!(
        text(&down.stderr).contains("did not stop cleanly"),
        "{}",
        text(&down.stderr)
    );
    up.wait_exit();
    assert_no_orphans(&groups);
}

/// Issue 19 (9): a hangup (the terminal closed) tears the flow down.
#[test]
fn a_hangup_tears_the_flow_down_instead_of_leaving_its_services_running() {
    let dir = web_workspace();
    let mut up = Up::start(dir.path(), &[]);
    up.wait_for("[flow] up: 2 service(s)");
    let groups = recorded_groups(dir.path());
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGHUP).expect("hang up");
    let status = up.wait_exit();
    assert!(status.success(), "{status:?}: {}", up.said());
    assert!(up.said().contains("[flow] web: stopped"), "{}", up.said());
    assert_no_orphans(&groups);
}

/// Rows 81 and 82: a group `down` refuses (its leader exited, a child remains) blocks
/// nothing for good: a dry run shows it, a preview lists it, a confirmed recovery stops
/// exactly it, and the workspace starts again.
#[test]
fn a_refused_group_is_previewed_recovered_and_the_workspace_starts_again() {
    let dir = workspace(
        "services:
  - name: svc
    command: sh
    args: [-c, 'sleep 300 & exec sleep 2']
",
    );
    let mut up = Up::start(dir.path(), &[]);
    up.wait_for("[flow] up: 1 service(s)");
    let pgid = started_pid(&up, "svc");
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGKILL).expect("kill up");
    up.wait_exit();
    // The leader exits on its own; its background child stays in the group.
    wait_until("the leader's exit", || {
        procfs::live_members(pgid).expect("proc").len() == 1
            && procfs::stat(pgid)
                .expect("proc")
                .is_none_or(|s| s.is_zombie())
    });

    let down = hostd(dir.path(), &["down"]);
    assert!(!down.status.success());
    let said = format!("{}{}", text(&down.stdout), text(&down.stderr));
    assert!(said.contains("hostd flow recover svc --preview"), "{said}");
    let again = hostd(dir.path(), &["up"]);
    assert!(
        text(&again.stderr).contains("flow.leftover_state")
            && text(&again.stderr).contains("hostd flow recover"),
        "{}",
        text(&again.stderr)
    );
    let dry = hostd(dir.path(), &["down", "--dry-run"]);
    let shown = text(&dry.stdout);
    assert!(
        shown.contains("nothing is signalled") && shown.contains("refuse"),
        "{shown}"
    );

    let preview = hostd(dir.path(), &["recover", "svc", "--preview"]);
    let shown = text(&preview.stdout);
    assert!(preview.status.success(), "{shown}{}", text(&preview.stderr));
    assert!(shown.contains("sleep 300"), "{shown}");
    let file = dir.path().join(".hostd/flow/recover-svc.json");
    assert!(file.exists(), "{shown}");
    let recovered = hostd(
        dir.path(),
        &["recover", "svc", "--expect", file.to_str().expect("utf-8")],
    );
    assert!(
        recovered.status.success(),
        "{}{}",
        text(&recovered.stdout),
        text(&recovered.stderr)
    );
    assert_no_orphans(&[pgid]);

    let mut up = Up::start(dir.path(), &[]);
    up.wait_for("[flow] up: 1 service(s)");
    let groups = recorded_groups(dir.path());
    assert!(hostd(dir.path(), &["down"]).status.success());
    up.wait_exit();
    assert_no_orphans(&groups);
}

/// Issue 15: `up -d` returns once everything is up, `--json` documents, `down` stops it.
#[test]
fn a_detached_up_returns_once_up_and_down_stops_it_with_json_documents() {
    let dir = web_workspace();
    let out = hostd(dir.path(), &["up", "-d", "--json"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(text(&out.stdout).trim()).expect("one JSON document");
    assert_eq!(doc["up"], true, "{doc}");
    assert_eq!(doc["services"].as_array().map(Vec::len), Some(2), "{doc}");
    let groups = recorded_groups(dir.path());

    let status = hostd(dir.path(), &["status", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(text(&status.stdout).trim()).expect("json");
    assert_eq!(doc["supervisor"]["alive"], true, "{doc}");
    let web = doc["services"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "web"))
        .expect("web");
    assert_eq!(web["state"], "running", "{doc}");

    let down = hostd(dir.path(), &["down", "--json"]);
    assert!(down.status.success(), "{}", text(&down.stderr));
    let doc: serde_json::Value = serde_json::from_str(text(&down.stdout).trim()).expect("json");
    assert_eq!(doc["clean"], true, "{doc}");
    assert_eq!(doc["teardown"]["operation"], "interrupt", "{doc}");
    assert_no_orphans(&groups);
}

/// Row 41: the environment of the `--only-deps` target, from `env` and `--env-file`.
#[test]
fn only_deps_exports_the_targets_environment() {
    let dir = workspace(
        "services:
  - name: db
    command: sh
    args: [-c, 'exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"']
    endpoints: [{name: http, api: tcp}]
  - name: api
    command: sleep
    args: ['300']
    endpoints: [{name: http, api: tcp}]
    dependencies: [{name: db, kind: runtime}]
    env: {DB_URL: 'http://${endpoint:db/http}/'}
",
    );
    let env_file = dir.path().join("api.env");
    let mut up = Up::start(
        dir.path(),
        &[
            "api",
            "--only-deps",
            "--env-file",
            env_file.to_str().expect("utf-8"),
        ],
    );
    up.wait_for("[flow] wrote the environment of `api`");
    let groups = recorded_groups(dir.path());
    let printed = text(&hostd(dir.path(), &["env", "api"]).stdout);
    let written = std::fs::read_to_string(&env_file).expect("the env file");
    assert_eq!(printed, written);
    let db_line = printed
        .lines()
        .find(|l| l.starts_with("FLOW_DEP_DB_HTTP_ADDR=127.0.0.1:"))
        .unwrap_or_else(|| panic!("{printed}"));
    let db = db_line.split_once('=').map(|(_, v)| v).expect("value");
    assert!(
        printed.contains(&format!("DB_URL=http://{db}/")),
        "{printed}"
    );
    assert!(printed.contains("FLOW_ENDPOINT_HTTP_PORT="), "{printed}");
    up.wait_for("`api` was not started: `hostd flow env api` prints");
    assert!(hostd(dir.path(), &["down"]).status.success());
    up.wait_exit();
    assert_no_orphans(&groups);
}

/// Row 35: `test` starts what the tests need, runs them with the service's environment,
/// tears down, and exits with their status.
#[test]
fn test_runs_a_command_against_the_dependencies_and_passes_its_status_through() {
    let dir = workspace(
        "services:
  - name: db
    command: sh
    args: [-c, 'exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"']
    endpoints: [{name: http, api: tcp}]
  - name: api
    command: sleep
    args: ['300']
    dependencies: [{name: db, kind: runtime}]
",
    );
    let probe = "import os, urllib.request, sys; \
        urllib.request.urlopen('http://' + os.environ['FLOW_DEP_DB_HTTP_ADDR'] + '/'); \
        open(os.environ['OUT'], 'w').write(str(os.getpid())); sys.exit(int(os.environ['CODE']))";
    let out_file = dir.path().join("ran");
    let run = |code: &str| {
        Command::new(HOSTD)
            .arg("flow")
            .arg("-w")
            .arg(dir.path())
            .args(["test", "api", "--", "python3", "-c", probe])
            .env("OUT", &out_file)
            .env("CODE", code)
            .output()
            .expect("run hostd flow test")
    };
    let ok = run("0");
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(out_file.exists(), "the command ran against db");
    let failed = run("3");
    assert_eq!(failed.status.code(), Some(3), "{}", text(&failed.stderr));
    let said = text(&failed.stderr);
    assert!(
        said.contains("[flow] db: stopped"),
        "torn down after the tests: {said}"
    );
    let db = said
        .split("[flow] db: started (pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|p| p.parse::<i32>().ok())
        .expect("db's pid");
    assert!(!StatePaths::for_workspace(dir.path()).state_file.exists());
    assert_no_orphans(&[db]);
}

/// Issue 15: a full or closed stdout is an error, never a panic.
#[test]
fn graph_into_a_full_device_fails_cleanly() {
    let dir = web_workspace();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = Command::new(HOSTD)
        .arg("flow")
        .arg("-w")
        .arg(dir.path())
        .arg("graph")
        .stdout(full)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(!said.contains("panicked"), "{said}");
    assert!(said.contains("cannot write to standard output"), "{said}");
}

/// Issue 19 (9): a build-stage cycle does not stop run-stage commands.
#[test]
fn a_build_stage_cycle_does_not_block_the_run_stage_graph() {
    let dir = workspace(
        "services:
  - name: a
    command: 'true'
    dependencies: [{name: b, kind: build}]
  - name: b
    command: 'true'
    dependencies: [{name: a, kind: schema}]
",
    );
    let run = hostd(dir.path(), &["graph", "--stage", "run"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let both = hostd(dir.path(), &["graph"]);
    assert!(!both.status.success());
    assert!(
        text(&both.stderr).contains("flow.graph.cycle: build dependencies have a cycle"),
        "{}",
        text(&both.stderr)
    );
    let dry = hostd(dir.path(), &["up", "--dry-run"]);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    assert!(text(&dry.stdout).contains("nothing is started"));
}
