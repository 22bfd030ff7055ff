//! `hostd run exec`: a program driven in-process, without a server, against the data folder's
//! SQLite store, seen from outside. It prints the run id first, then each step as it ends, and
//! exits with the run's outcome; an exec killed (SIGKILL) or stopped (SIGINT) mid-run is
//! resumed by a `hostd serve` on the same data folder — one with no workspace, from the pinned
//! releases in the store — and completes; while an exec holds its run, that Host leaves it alone.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use testkit::eventually;
use testkit::process::{Serve, hostd_command, hostd_run, ok};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The example runnables, copied into `dir/ws` (never built).
fn workspace(dir: &Path) -> PathBuf {
    let ws = dir.join("ws");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/runnables"),
        &ws,
    );
    ws
}

fn program(nap: &str) -> String {
    format!(
        "\
steps:
  - name: count
    invoke: word-count@1.0.0
    input: {{text: \"${{input.text}}\"}}
  - name: nap
    sleep: {nap}
  - name: again
    invoke: word-count@1.0.0
    input: {{text: \"${{input.text}} and more\"}}
"
    )
}

/// A `hostd run exec` running in the background; its stdout lines are collected as they come.
struct Exec {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Exec {
    fn spawn(dir: &Path, args: &[&str]) -> Exec {
        let mut child = hostd_command(dir)
            .args(["run", "exec"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("exec.err")).unwrap())
            .spawn()
            .expect("hostd run exec starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("stdout");
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Exec { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    async fn wait_for_line(&self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        eventually(what, async || {
            self.lines()
                .into_iter()
                .find(|l| matches(l))
                .ok_or_else(|| format!("{:?}", self.lines()))
        })
        .await
    }

    fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), s).expect("signal");
    }

    fn exit_code(&mut self) -> Option<i32> {
        let status = testkit::eventually_blocking("hostd run exec to exit", || {
            match self.child.try_wait() {
                Ok(Some(s)) => Ok(s),
                other => Err(format!("{other:?}")),
            }
        });
        status.code()
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status(dir: &Path, run: &str) -> Value {
    serde_json::from_str(&ok(hostd_run(dir, &["--json", "run", "status", run], &[])))
        .expect("status JSON")
}

#[test]
fn run_exec_drives_a_program_in_process_and_exits_with_the_runs_outcome() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ws = workspace(dir);
    let ws = ws.to_str().unwrap();
    std::fs::write(dir.join("p.yaml"), program("0s")).unwrap();
    let done = hostd_run(
        dir,
        &[
            "run",
            "exec",
            "p.yaml",
            "--input",
            r#"{"text":"one two"}"#,
            "--runnables",
            ws,
        ],
        &[],
    );
    assert_eq!(done.status.code(), Some(0), "{done:?}");
    let text = String::from_utf8_lossy(&done.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    let run = lines[0];
    assert!(run.starts_with("run-"), "the run id comes first: {text}");
    for (i, step) in ["count", "nap", "again"].iter().enumerate() {
        assert!(
            lines[i + 1].starts_with(step) && lines[i + 1].contains("finished"),
            "each step as it ends, in order: {text}"
        );
    }
    assert_eq!(lines[4], format!("{run} completed"), "{text}");
    assert!(
        !dir.join(".hostd/hostd.json").exists(),
        "no server was started"
    );

    // A run that fails ends with status 3; its step and code are on stderr.
    let failed = hostd_run(
        dir,
        &[
            "run",
            "exec",
            "p.yaml",
            "--input",
            r#"{"text":5}"#,
            "--runnables",
            ws,
        ],
        &[],
    );
    assert_eq!(failed.status.code(), Some(3), "{failed:?}");
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(
        err.contains("count") && err.contains("input_invalid"),
        "{err}"
    );

    // A program that does not validate is refused with status 1 and records nothing.
    std::fs::write(
        dir.join("bad.yaml"),
        "steps:\n  - name: x\n    invoke: nosuch@1.0.0\n",
    )
    .unwrap();
    let refused = hostd_run(
        dir,
        &["--json", "run", "exec", "bad.yaml", "--runnables", ws],
        &[],
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("\"code\":\"invalid\""), "{err}");
    let problems: Value = serde_json::from_slice(&refused.stdout).expect("the problems as JSON");
    assert_eq!(
        problems["problems"][0]["code"], "program.unknown_runnable",
        "{problems}"
    );
    assert!(
        problems.get("run_id").is_none(),
        "nothing was recorded: {problems}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_killed_mid_run_is_resumed_by_a_later_serve_on_the_same_data_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ws = workspace(dir);
    std::fs::write(dir.join("p.yaml"), program("2s")).unwrap();
    let exec = Exec::spawn(
        dir,
        &[
            "p.yaml",
            "--input",
            r#"{"text":"one two"}"#,
            "--runnables",
            ws.to_str().unwrap(),
            "--run-lease",
            "1s",
        ],
    );
    let run = exec
        .wait_for_line("the run id", |l| l.starts_with("run-"))
        .await;
    exec.wait_for_line("the first step", |l| l.starts_with("count"))
        .await;
    exec.signal(Signal::SIGKILL);
    drop(exec);

    // A Host on the same folder, without the workspace: it takes the run over once the dead
    // exec's lease lapses, and runs the rest from the pinned release in the store.
    let host = Serve::start(dir, "after-exec", &["--run-scan-interval", "200ms"]);
    let done = eventually("the Host to complete the run", async || {
        let v = status(dir, &run);
        testkit::check(v["state"] == "completed", || v.to_string()).map(|_| v)
    })
    .await;
    // Taken over under epoch 2; the 2 s sleep outlasts the Host's scan interval, so the run
    // is parked and taken again when due, under the next epoch.
    assert!(done["epoch"].as_u64().unwrap_or(0) >= 2, "{done}");
    assert!(
        !done["holder"]
            .as_str()
            .unwrap_or_default()
            .starts_with("run-exec-"),
        "{done}"
    );
    let journal = done["journal"].as_array().unwrap();
    let count = journal.iter().find(|e| e["step"] == "count").unwrap();
    assert_eq!(
        count["epoch"], 1,
        "the exec's step was taken from the journal"
    );
    let again = journal.iter().find(|e| e["step"] == "again").unwrap();
    assert_eq!(again["body"]["output"]["words"], 4, "{done}");
    drop(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_beside_a_serve_keeps_its_run_until_stopped_then_the_serve_resumes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ws = workspace(dir);
    std::fs::write(dir.join("p.yaml"), program("5s")).unwrap();
    let host = Serve::start(dir, "beside", &[]);
    let mut exec = Exec::spawn(
        dir,
        &[
            "p.yaml",
            "--input",
            r#"{"text":"one two"}"#,
            "--runnables",
            ws.to_str().unwrap(),
        ],
    );
    let run = exec
        .wait_for_line("the run id", |l| l.starts_with("run-"))
        .await;
    exec.wait_for_line("the first step", |l| l.starts_with("count"))
        .await;
    // The Host leaves a run the exec holds.
    let held = hostd_run(dir, &["--json", "run", "resume", &run], &[]);
    assert_eq!(held.status.code(), Some(1), "{held:?}");
    assert!(
        String::from_utf8_lossy(&held.stderr).contains("\"code\":\"conflict\""),
        "{held:?}"
    );
    let v = status(dir, &run);
    assert!(
        v["holder"]
            .as_str()
            .unwrap_or_default()
            .starts_with("run-exec-"),
        "{v}"
    );

    // Ctrl-C: the exec stops at once (mid-sleep), writes nothing for the step, hands the run
    // back, and says it is not finished.
    exec.signal(Signal::SIGINT);
    assert_eq!(exec.exit_code(), Some(4));
    let last = exec.lines().last().cloned().unwrap_or_default();
    assert_eq!(last, format!("{run} running"), "{:?}", exec.lines());
    let resumed: Value =
        serde_json::from_str(&ok(hostd_run(dir, &["--json", "run", "resume", &run], &[])))
            .expect("resume JSON");
    assert_eq!(
        resumed["epoch"], 2,
        "taken at once, not after the lease: {resumed}"
    );
    let done = eventually("the Host to complete the run", async || {
        let v = status(dir, &run);
        testkit::check(v["state"] == "completed", || v.to_string()).map(|_| v)
    })
    .await;
    let results = done["journal"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["entry"] == "result")
        .count();
    assert_eq!(results, 3, "{done}");
    drop(host);
}
