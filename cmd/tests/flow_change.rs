//! Changing one service of a running flow from another shell — `hostd flow restart`,
//! `hostd flow stop` and `hostd flow up <service>` against a running `up` (foreground or
//! detached) — driven as a user drives them: separate invocations of the real binary against
//! a workspace whose services are real processes (python3's standard library and `sleep`).
//! Every test that starts services checks that none of their process groups survives.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flow::procfs;
use flow::state::{self, FlowState, StatePaths};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const HOSTD: &str = env!("CARGO_BIN_EXE_hostd");

/// `web` (an HTTP server on `$PORT`) needs `store` (no endpoints) running; `extra` needs
/// nothing and nobody needs it.
const WORKSPACE: &str = "name: change
services:
  - name: store
    command: sleep
    args: ['300']
  - name: web
    command: sh
    args: [-c, 'exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"']
    endpoints: [{name: http, api: http, health: /}]
    dependencies: [{name: store}]
  - name: extra
    command: sleep
    args: ['300']
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

fn said(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(text(&out.stdout).trim())
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", said(out)))
}

/// A foreground `hostd flow up` whose stderr lines are collected.
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
        while !self.said().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no `{needle}` from hostd flow up within 30 s; it said:\n{}",
                self.said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
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

fn recorded(dir: &Path) -> FlowState {
    state::read_state(&StatePaths::for_workspace(dir))
        .expect("read state")
        .expect("a recorded flow")
}

/// (state, pid) of a recorded service.
fn standing(dir: &Path, service: &str) -> (String, Option<i32>) {
    let state = recorded(dir);
    let s = state
        .service(service)
        .unwrap_or_else(|| panic!("`{service}` is not recorded: {state:#?}"));
    (s.state.clone(), s.process.as_ref().map(|p| p.pid))
}

fn pid_of(dir: &Path, service: &str) -> i32 {
    match standing(dir, service) {
        (_, Some(pid)) => pid,
        (state, None) => panic!("`{service}` has no process ({state})"),
    }
}

fn address_of(dir: &Path, service: &str) -> String {
    recorded(dir)
        .service(service)
        .and_then(|s| s.endpoints.first().map(|e| e.address.clone()))
        .unwrap_or_else(|| panic!("`{service}` has no recorded endpoint"))
}

/// Whether the HTTP server at `address` answers a request now.
fn answers_http(address: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(address) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if stream.write_all(b"HEAD / HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.0 200")
}

/// The row of `service` in a table a command printed.
fn row<'a>(shown: &'a str, service: &str) -> &'a str {
    shown
        .lines()
        .find(|l| l.starts_with(&format!("{service} ")))
        .unwrap_or_else(|| panic!("no `{service}` row in:\n{shown}"))
}

fn assert_no_orphans(groups: &[i32]) {
    assert!(!groups.is_empty(), "nothing to check");
    for &pgid in groups {
        let live = procfs::live_members(pgid).expect("read /proc");
        assert!(live.is_empty(), "process group {pgid} survives: {live:?}");
    }
}

fn assert_alive(pid: i32, what: &str) {
    assert!(
        !procfs::live_members(pid).expect("read /proc").is_empty(),
        "{what} (pid {pid}) should still run"
    );
}

#[test]
fn restart_keeps_the_other_services_pids_and_the_restarted_ones_port_and_it_is_ready_again() {
    let dir = workspace(WORKSPACE);
    let mut up = Up::start(dir.path(), &["web"]);
    up.wait_for("[flow] up: 2 service(s)");
    let store = pid_of(dir.path(), "store");
    let web = pid_of(dir.path(), "web");
    let address = address_of(dir.path(), "web");

    let out = hostd(dir.path(), &["restart", "web"]);
    assert!(out.status.success(), "{}", said(&out));
    let shown = text(&out.stdout);
    assert!(shown.contains("stopped to restart"), "{shown}");
    assert!(row(&shown, "web").contains("stopped"), "{shown}");
    assert!(shown.contains("started again"), "{shown}");
    let web_again = pid_of(dir.path(), "web");
    assert_ne!(web_again, web, "a new process: {shown}");
    let started = row(shown.split("started again").nth(1).unwrap_or(""), "web");
    assert!(
        started.contains("running")
            && started.contains(&web_again.to_string())
            && started.contains(&format!("http={address}")),
        "{shown}"
    );
    assert_eq!(
        pid_of(dir.path(), "store"),
        store,
        "its producer was left alone"
    );
    assert_eq!(address_of(dir.path(), "web"), address, "the same port");
    assert_eq!(standing(dir.path(), "web").0, "running");
    assert!(answers_http(&address), "web answers again at {address}");
    assert_no_orphans(&[web]);

    // Restarting the producer leaves its running consumer alone.
    let out = hostd(dir.path(), &["restart", "store", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let doc = json(&out);
    assert_eq!(doc["operation"], "restart", "{doc}");
    assert_eq!(doc["clean"], true, "{doc}");
    assert_eq!(doc["stopped"]["operation"], "restart", "{doc}");
    assert_eq!(doc["stopped"]["receipts"][0]["service"], "store", "{doc}");
    assert_eq!(doc["started"][0]["name"], "store", "{doc}");
    assert_eq!(doc["started"][0]["state"], "running", "{doc}");
    assert_eq!(
        pid_of(dir.path(), "web"),
        web_again,
        "the dependent kept running"
    );
    assert_no_orphans(&[store]);
    let store_again = pid_of(dir.path(), "store");
    assert!(up.running(), "the up still supervises: {}", up.said());
    assert!(up.said().contains("[flow] store: started"), "{}", up.said());

    let down = hostd(dir.path(), &["down"]);
    assert!(down.status.success(), "{}", said(&down));
    assert!(up.wait_exit().success(), "{}", up.said());
    assert_no_orphans(&[store_again, web_again]);
}

#[test]
fn up_with_a_service_adds_it_and_its_dependency_to_a_running_detached_flow() {
    let dir = workspace(WORKSPACE);
    let out = hostd(dir.path(), &["up", "-d", "extra"]);
    assert!(out.status.success(), "{}", said(&out));
    let extra = pid_of(dir.path(), "extra");
    let supervisor = recorded(dir.path()).supervisor.pid;

    let out = hostd(dir.path(), &["up", "web"]);
    assert!(out.status.success(), "{}", said(&out));
    let shown = text(&out.stdout);
    assert!(
        shown.contains(&format!(
            "added to the running flow (pid {supervisor} supervises)"
        )),
        "{shown}"
    );
    assert!(row(&shown, "store").contains("running"), "{shown}");
    assert!(row(&shown, "web").contains("running"), "{shown}");
    let store = pid_of(dir.path(), "store");
    let web = pid_of(dir.path(), "web");
    assert_eq!(pid_of(dir.path(), "extra"), extra, "left alone");
    assert!(answers_http(&address_of(dir.path(), "web")));
    // The dependency was ready before its consumer started.
    let merged = text(&hostd(dir.path(), &["logs"]).stdout);
    let store_started = merged.find("store * started pid").expect("store started");
    let web_started = merged.find("web * started pid").expect("web started");
    assert!(store_started < web_started, "{merged}");
    let state = recorded(dir.path());
    assert_eq!(state.supervisor.pid, supervisor, "the same up supervises");
    assert!(
        state.teardown_layers.iter().flatten().any(|s| s == "web"),
        "down will find it: {state:#?}"
    );

    let again = hostd(dir.path(), &["up", "web", "store", "--json"]);
    assert!(again.status.success(), "{}", said(&again));
    let doc = json(&again);
    assert_eq!(doc["operation"], "add", "{doc}");
    assert_eq!(doc["started"], serde_json::json!([]), "{doc}");
    assert_eq!(
        doc["unchanged"],
        serde_json::json!(["web", "store"]),
        "{doc}"
    );
    let again = hostd(dir.path(), &["up", "web"]);
    assert!(
        text(&again.stdout).contains("already running, left as is: web"),
        "{}",
        said(&again)
    );
    assert_eq!(pid_of(dir.path(), "web"), web);

    let down = hostd(dir.path(), &["down"]);
    let shown = text(&down.stdout);
    assert!(down.status.success(), "{}", said(&down));
    for service in ["extra", "web", "store"] {
        assert!(row(&shown, service).contains("stopped"), "{shown}");
    }
    assert_no_orphans(&[extra, store, web]);
}

#[test]
fn stop_refuses_a_service_running_services_depend_on_and_with_dependents_stops_consumers_first() {
    let dir = workspace(WORKSPACE);
    let mut up = Up::start(dir.path(), &[]);
    up.wait_for("[flow] up: 3 service(s)");
    let store = pid_of(dir.path(), "store");
    let web = pid_of(dir.path(), "web");
    let extra = pid_of(dir.path(), "extra");

    let out = hostd(dir.path(), &["stop", "store"]);
    assert!(!out.status.success(), "{}", said(&out));
    let refusal = text(&out.stderr);
    assert!(
        refusal.contains("flow.control.has_dependents")
            && refusal.contains("`store` is needed by running service(s) web"),
        "{refusal}"
    );
    let out = hostd(dir.path(), &["stop", "store", "--json"]);
    let error: serde_json::Value =
        serde_json::from_str(text(&out.stderr).trim()).expect("one JSON error");
    assert_eq!(error["error"]["code"], "flow.control.has_dependents");
    assert_alive(store, "the refused stop signalled nothing: store");
    assert_alive(web, "web");

    let out = hostd(dir.path(), &["stop", "store", "--with-dependents"]);
    assert!(out.status.success(), "{}", said(&out));
    let shown = text(&out.stdout);
    let web_receipt = row(&shown, "web");
    let store_receipt = row(&shown, "store");
    assert!(
        web_receipt.contains(" 0 ") && web_receipt.contains("stopped"),
        "the consumer first: {shown}"
    );
    assert!(
        store_receipt.contains(" 1 ") && store_receipt.contains("stopped"),
        "{shown}"
    );
    assert!(
        shown.find("web ").expect("web") < shown.find("store ").expect("store"),
        "{shown}"
    );
    assert_no_orphans(&[store, web]);
    assert_alive(extra, "the rest keeps running: extra");
    assert!(up.running(), "{}", up.said());

    let status = hostd(dir.path(), &["status"]);
    let shown = text(&status.stdout);
    assert!(row(&shown, "store").contains("stopped"), "{shown}");
    assert!(row(&shown, "web").contains("stopped"), "{shown}");
    assert!(row(&shown, "extra").contains("running"), "{shown}");

    let down = hostd(dir.path(), &["down"]);
    assert!(down.status.success(), "{}", said(&down));
    assert!(up.wait_exit().success(), "{}", up.said());
    assert_no_orphans(&[extra]);
}

#[test]
fn stop_then_down_stops_the_rest_with_receipts_and_a_stopped_service_can_be_added_again() {
    let dir = workspace(WORKSPACE);
    let mut up = Up::start(dir.path(), &[]);
    up.wait_for("[flow] up: 3 service(s)");
    let store = pid_of(dir.path(), "store");
    let web = pid_of(dir.path(), "web");
    let extra = pid_of(dir.path(), "extra");
    let address = address_of(dir.path(), "web");

    let out = hostd(dir.path(), &["stop", "web", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let doc = json(&out);
    assert_eq!(doc["operation"], "stop", "{doc}");
    assert_eq!(doc["stopped"]["operation"], "stop", "{doc}");
    assert_eq!(doc["stopped"]["receipts"][0]["service"], "web", "{doc}");
    assert_eq!(doc["stopped"]["receipts"][0]["outcome"], "stopped", "{doc}");
    assert_no_orphans(&[web]);
    assert_eq!(standing(dir.path(), "web"), ("stopped".to_owned(), None));
    let status = hostd(dir.path(), &["status", "--json"]);
    let doc = json(&status);
    let web_status = doc["services"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "web"))
        .expect("web");
    assert_eq!(web_status["state"], "stopped", "{doc}");
    assert_eq!(web_status["pid"], serde_json::Value::Null, "{doc}");

    // Stopping it again says so; restarting a stopped service is refused with its way back.
    let out = hostd(dir.path(), &["stop", "web"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        text(&out.stdout).contains("already stopped, left as is: web"),
        "{}",
        said(&out)
    );
    let out = hostd(dir.path(), &["restart", "web"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("flow.control.not_in_flow")
            && text(&out.stderr).contains("`hostd flow up web` starts it again"),
        "{}",
        said(&out)
    );

    // `up web` brings it back, on the same port.
    let out = hostd(dir.path(), &["up", "web"]);
    assert!(out.status.success(), "{}", said(&out));
    let web_again = pid_of(dir.path(), "web");
    assert_eq!(address_of(dir.path(), "web"), address);
    assert!(answers_http(&address));
    assert_eq!(pid_of(dir.path(), "store"), store);

    let out = hostd(dir.path(), &["stop", "web", "extra"]);
    assert!(out.status.success(), "{}", said(&out));
    assert_no_orphans(&[web_again, extra]);

    let down = hostd(dir.path(), &["down"]);
    let shown = text(&down.stdout);
    assert!(down.status.success(), "{}", said(&down));
    assert!(
        shown.contains("asked the running `hostd flow up`"),
        "{shown}"
    );
    assert!(row(&shown, "store").contains("stopped"), "{shown}");
    assert!(
        !shown
            .lines()
            .any(|l| l.starts_with("web ") || l.starts_with("extra ")),
        "only what still ran gets a receipt: {shown}"
    );
    assert!(up.wait_exit().success(), "{}", up.said());
    assert_no_orphans(&[store]);
    assert!(!StatePaths::for_workspace(dir.path()).state_file.exists());
}

#[test]
fn changes_against_a_workspace_without_a_running_up_refuse_and_a_stale_socket_wedges_nothing() {
    let dir = workspace(WORKSPACE);
    for args in [
        &["restart", "web"][..],
        &["stop", "web"],
        &["stop", "web", "--with-dependents"],
    ] {
        let out = hostd(dir.path(), args);
        assert!(!out.status.success(), "{args:?}: {}", said(&out));
        assert!(
            text(&out.stderr).contains("flow.not_running: no `hostd flow up` runs in"),
            "{args:?}: {}",
            said(&out)
        );
    }
    let out = hostd(dir.path(), &["restart", "web", "--json"]);
    let error: serde_json::Value =
        serde_json::from_str(text(&out.stderr).trim()).expect("one JSON error");
    assert_eq!(error["error"]["code"], "flow.not_running");

    // An `up` killed outright leaves its socket file behind.
    let mut up = Up::start(dir.path(), &["extra"]);
    up.wait_for("[flow] up: 1 service(s)");
    let extra = pid_of(dir.path(), "extra");
    let socket = StatePaths::for_workspace(dir.path()).control_socket;
    assert!(socket.exists());
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGKILL).expect("kill up");
    up.wait_exit();
    assert!(socket.exists(), "the stale socket file stays");
    let out = hostd(dir.path(), &["restart", "extra"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("flow.not_running")
            && text(&out.stderr).contains("is gone; `hostd flow down` stops what it left"),
        "{}",
        said(&out)
    );
    assert_alive(extra, "nothing was signalled: extra");
    assert!(hostd(dir.path(), &["down"]).status.success());
    assert_no_orphans(&[extra]);

    // The next `up` replaces the stale socket and answers on it.
    let mut up = Up::start(dir.path(), &["extra"]);
    up.wait_for("[flow] up: 1 service(s)");
    let extra = pid_of(dir.path(), "extra");
    let out = hostd(dir.path(), &["restart", "extra"]);
    assert!(out.status.success(), "{}", said(&out));
    let extra_again = pid_of(dir.path(), "extra");
    assert_ne!(extra_again, extra);
    assert!(hostd(dir.path(), &["down"]).status.success());
    assert!(up.wait_exit().success(), "{}", up.said());
    assert!(!socket.exists(), "a clean end removes its socket");
    assert_no_orphans(&[extra, extra_again]);
}

#[test]
fn a_change_asked_while_the_flow_is_still_starting_is_refused_and_signals_nothing() {
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
    let base = pid_of(dir.path(), "base");
    let never = pid_of(dir.path(), "never");
    for args in [
        &["restart", "base"][..],
        &["stop", "never"],
        &["up", "base"],
    ] {
        let out = hostd(dir.path(), args);
        assert!(!out.status.success(), "{args:?}: {}", said(&out));
        assert!(
            text(&out.stderr).contains("flow.control.starting: the flow is still starting"),
            "{args:?}: {}",
            said(&out)
        );
    }
    assert_eq!(pid_of(dir.path(), "base"), base);
    assert_eq!(pid_of(dir.path(), "never"), never);
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).expect("interrupt up");
    assert_eq!(up.wait_exit().code(), Some(130), "{}", up.said());
    assert_no_orphans(&[base, never]);
}

/// The same rule as at `up`: a service that cannot become ready fails the flow, and the
/// command that restarted it is told so.
#[test]
fn a_restarted_service_that_cannot_become_ready_fails_the_flow_and_the_restart_says_so() {
    let dir = workspace(
        "services:
  - name: store
    command: sleep
    args: ['300']
  - name: web
    command: sh
    args: [-c, 'if [ -e broken ]; then exec sleep 300; fi; exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"']
    endpoints: [{name: http, api: tcp}]
    restart: {policy: 'no'}
",
    );
    let mut up = Up::start(dir.path(), &["--readiness-timeout", "2s"]);
    up.wait_for("[flow] up: 2 service(s)");
    let store = pid_of(dir.path(), "store");
    let web = pid_of(dir.path(), "web");
    std::fs::write(dir.path().join("broken"), b"").expect("break web");

    let out = hostd(dir.path(), &["restart", "web"]);
    assert!(!out.status.success(), "{}", said(&out));
    let refusal = text(&out.stderr);
    assert!(
        refusal.contains("flow.control.not_started: `web` was not started")
            && refusal.contains("flow.not_ready")
            && refusal.contains("was torn down"),
        "{refusal}"
    );
    let status = up.wait_exit();
    assert!(!status.success(), "{}", up.said());
    assert!(
        up.said().contains("the flow failed: flow.not_ready"),
        "{}",
        up.said()
    );
    assert_no_orphans(&[store, web]);
    assert!(!StatePaths::for_workspace(dir.path()).state_file.exists());
}

/// `up <service> --only-deps` leaves the service to be run by hand; `up <service>` later
/// starts it in the running flow on the addresses reserved for it.
#[test]
fn the_target_an_only_deps_flow_left_out_joins_it_on_its_reserved_address() {
    let dir = workspace(WORKSPACE);
    let mut up = Up::start(dir.path(), &["web", "--only-deps"]);
    up.wait_for("[flow] up: 1 service(s)");
    let store = pid_of(dir.path(), "store");
    let reserved = address_of(dir.path(), "web");
    assert_eq!(standing(dir.path(), "web"), ("excluded".to_owned(), None));

    let out = hostd(dir.path(), &["up", "web"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(row(&text(&out.stdout), "web").contains(&format!("http={reserved}")));
    assert!(answers_http(&reserved));
    let web = pid_of(dir.path(), "web");
    assert_eq!(standing(dir.path(), "web").0, "running");
    assert_eq!(
        recorded(dir.path())
            .services
            .iter()
            .filter(|s| s.name == "web")
            .count(),
        1,
        "one record of web, no longer excluded"
    );
    assert_eq!(pid_of(dir.path(), "store"), store);

    let down = hostd(dir.path(), &["down"]);
    assert!(down.status.success(), "{}", said(&down));
    assert!(row(&text(&down.stdout), "web").contains("stopped"));
    assert!(up.wait_exit().success(), "{}", up.said());
    assert_no_orphans(&[store, web]);
}

/// What a change started is recorded the moment it exists: an `up` killed right after a
/// restart and an add leaves nothing `down` cannot see.
#[test]
fn down_after_the_up_was_killed_stops_what_its_changes_started() {
    let dir = workspace(WORKSPACE);
    let mut up = Up::start(dir.path(), &["web"]);
    up.wait_for("[flow] up: 2 service(s)");
    let old_web = pid_of(dir.path(), "web");
    assert!(hostd(dir.path(), &["restart", "web"]).status.success());
    assert!(hostd(dir.path(), &["up", "extra"]).status.success());
    let store = pid_of(dir.path(), "store");
    let web = pid_of(dir.path(), "web");
    let extra = pid_of(dir.path(), "extra");
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGKILL).expect("kill up");
    up.wait_exit();
    assert_alive(web, "the restarted web");
    assert_alive(extra, "the added extra");

    let down = hostd(dir.path(), &["down"]);
    let shown = text(&down.stdout);
    assert!(down.status.success(), "{}", said(&down));
    assert!(
        shown.contains("is gone; stopped its recorded process groups"),
        "{shown}"
    );
    for service in ["store", "web", "extra"] {
        assert!(row(&shown, service).contains("stopped"), "{shown}");
    }
    assert_no_orphans(&[old_web, store, web, extra]);
}
