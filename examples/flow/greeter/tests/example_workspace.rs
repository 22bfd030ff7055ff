//! The `examples/flow` workspace, brought up as a newcomer would, with one change: the
//! greeter runs from the binary cargo built for this test instead of `cargo run` (a nested
//! cargo would wait on the lock the running `cargo test` holds).

use std::path::{Path, PathBuf};
use std::time::Duration;

use flow::procfs;
use flow::{EventSink, Flow, FlowEvent, FlowOptions, Selection, StopOutcome};
use tokio_util::sync::CancellationToken;

const GREETER: &str = env!("CARGO_BIN_EXE_flow-example-greeter");

/// Copies the workspace files (not its state folder, nor the greeter's crate sources).
fn copy_dir(from: &Path, to: &Path, top: bool) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_name() == ".hostd" || (top && entry.file_name() == "greeter") {
            continue;
        }
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target, false);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_workspace_comes_up_serves_a_quote_through_all_three_and_goes_down() {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_dir(&example(), dir.path(), true);
    let manifest = dir.path().join("services/greeter/service.yaml");
    let original = std::fs::read_to_string(&manifest).expect("greeter manifest");
    let rewritten = original
        .replace("command: cargo", &format!("command: {GREETER}"))
        .replace(
            "args: [run, --release, --quiet, -p, flow-example-greeter]",
            "args: []",
        )
        .replace("cwd: ../../greeter\n", "");
    assert_ne!(
        original, rewritten,
        "the greeter manifest changed shape; update this test"
    );
    std::fs::write(&manifest, rewritten).expect("write");

    let flow =
        Flow::load(dir.path(), FlowOptions::default()).expect("the example workspace is valid");
    let (sink, mut rx) = EventSink::channel(4096);
    let groups = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = groups.clone();
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            if let FlowEvent::Spawned { pid, .. } = e {
                seen.lock().expect("groups").push(pid);
            }
        }
    });
    let up = flow
        .up(Selection::default(), sink, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("the example did not come up: {e}"));

    let frontend = up.address("frontend", "http").expect("frontend address");
    let body = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(frontend).expect("connect frontend");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        write!(s, "GET / HTTP/1.0\r\nHost: {frontend}\r\n\r\n").expect("request");
        let mut body = String::new();
        s.read_to_string(&mut body).expect("response");
        body
    })
    .await
    .expect("request task");
    assert!(body.starts_with("HTTP/1.0 200"), "{body}");
    assert!(
        body.contains("greeter at 127.0.0.1:") && body.contains("reachable"),
        "{body}"
    );

    let end = up.shutdown().await;
    let receipts: Vec<(&str, usize, StopOutcome)> = end
        .teardown
        .receipts
        .iter()
        .map(|r| (r.service.as_str(), r.layer, r.outcome))
        .collect();
    assert_eq!(
        receipts,
        vec![
            ("frontend", 0, StopOutcome::Stopped),
            ("quotes", 1, StopOutcome::Stopped),
            ("greeter", 1, StopOutcome::Stopped),
            ("migrate", 2, StopOutcome::Stopped),
        ]
    );
    for pgid in groups.lock().expect("groups").iter() {
        assert!(
            procfs::live_members(*pgid).expect("proc").is_empty(),
            "group {pgid} survives"
        );
    }
}
