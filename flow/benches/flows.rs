//! Orchestration overhead: bring up and tear down chains of 10 and 50 trivial services
//! (each a TCP listener depending on the previous one) through a flow, against starting the
//! same processes directly in the same run (spawn, poll until the port accepts, next; then
//! SIGTERM and wait, last first). Prints plain lines with the per-service overhead and the
//! ratio, first with the DEFAULT options (what `hostd flow up` uses), then with the old
//! 150 ms-doubling readiness backoff for comparison, and the load average of the machine.
//!
//! Run: `cargo bench -p flow --bench flows`

#![forbid(unsafe_code)]

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flow::{EventSink, Flow, FlowOptions, Selection};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;

const FIXTURE: &str = env!("CARGO_BIN_EXE_flow-fixture");
const RUNS: usize = 3;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot allocate a port: {e}"))
}

/// Starts the chain directly: what a shell script would do, with a tight 1 ms poll.
fn raw_chain(n: usize) -> Duration {
    let began = Instant::now();
    let mut children = Vec::new();
    for _ in 0..n {
        let port = free_port();
        let child = Command::new(FIXTURE)
            .arg("tcp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn the fixture: {e}"));
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        children.push(child);
    }
    for mut child in children.into_iter().rev() {
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let _ = child.wait();
    }
    began.elapsed()
}

fn chain_workspace(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let mut yaml = String::from("name: bench\nservices:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - name: s{i}\n    command: {FIXTURE}\n    args: [tcp]\n    endpoints: [{{name: e, api: tcp}}]\n"
        ));
        if i > 0 {
            yaml.push_str(&format!(
                "    dependencies: [{{name: s{}, kind: runtime}}]\n",
                i - 1
            ));
        }
    }
    std::fs::write(dir.path().join("flow.yaml"), yaml).unwrap_or_else(|e| panic!("write: {e}"));
    dir
}

async fn flow_chain(n: usize, options: &FlowOptions) -> Duration {
    let dir = chain_workspace(n);
    let began = Instant::now();
    let flow = Flow::load(dir.path(), options.clone()).unwrap_or_else(|e| panic!("load: {e}"));
    let up = flow
        .up(
            Selection::default(),
            EventSink::none(),
            CancellationToken::new(),
        )
        .await
        .unwrap_or_else(|e| panic!("up: {e}"));
    let end = up.shutdown().await;
    assert!(end.teardown.all_stopped(), "{:?}", end.teardown);
    began.elapsed()
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let default = FlowOptions::default();
    // What readiness polling cost before it started at 1 ms: a 150 ms first pause.
    let old_backoff = FlowOptions {
        readiness_backoff_initial: Duration::from_millis(150),
        readiness_backoff_max: Duration::from_secs(5),
        ..FlowOptions::default()
    };
    println!(
        "flows: chains of trivial TCP services, median of {RUNS} runs, up + teardown; load average before: {}",
        load_average()
    );
    for n in [10usize, 50] {
        let raw = median((0..RUNS).map(|_| raw_chain(n)).collect());
        let with_default = median(
            (0..RUNS)
                .map(|_| runtime.block_on(flow_chain(n, &default)))
                .collect(),
        );
        let with_old = median(
            (0..RUNS)
                .map(|_| runtime.block_on(flow_chain(n, &old_backoff)))
                .collect(),
        );
        for (label, flow) in [
            ("DEFAULT options", with_default),
            ("first pause 150ms (before)", with_old),
        ] {
            let overhead = flow.saturating_sub(raw);
            println!(
                "chain of {n:>2} [{label:<26}]: direct {:>9}, flow {:>9}, overhead {:>9} total / {:>8} per service, ratio {:.2}x",
                ms(raw),
                ms(flow),
                ms(overhead),
                ms(overhead / n as u32),
                flow.as_secs_f64() / raw.as_secs_f64()
            );
        }
    }
    println!("load average after: {}", load_average());
}
