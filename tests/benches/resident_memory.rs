//! `cargo bench -p system-tests --bench resident_memory`
//!
//! What one resident session costs a real `hostd serve` (SQLite, the scripted agent): the
//! server's resident set (VmRSS of the child process) with one session resident — the
//! baseline, measured in the same run — then with `HOST_RESIDENT_SESSIONS` (default 1,000)
//! sessions created and placed by a controller as `hostd session create` does, all idle and
//! resident (the warm TTL is an hour). It prints the RSS delta per resident session (goal:
//! ≤ 64 KiB) and the delta as a ratio of the baseline; descriptors and threads beside.

use std::time::{Duration, Instant};

use controller::Controller;
use sessionstore::{AgentId, CommandId, CompatibilityId, SessionId, Store, StoreOptions, TenantId};
use testkit::bench::{Held, held, load_average};
use testkit::process::Serve;

const DEFAULT_SESSIONS: usize = 1000;
/// How many creations run at once (a handful of controllers, as a busy fleet would).
const CONCURRENT: usize = 8;

/// Waits until the server's RSS stops moving (two readings 1 s apart within 64 KiB), at most
/// 20 s, and returns the last reading.
fn settled(pid: u32) -> Held {
    let mut last = held(Some(pid));
    for _ in 0..20 {
        std::thread::sleep(Duration::from_secs(1));
        let now = held(Some(pid));
        if (now.rss - last.rss).abs() < 64.0 * 1024.0 {
            return now;
        }
        last = now;
    }
    last
}

async fn create(c: &Controller, name: String) {
    let session = SessionId::new(name).expect("a session id");
    let (_, create) = c
        .create_session(
            session.clone(),
            AgentId::new("assistant").expect("agent"),
            CompatibilityId::new("hostd-scripted-1").expect("build"),
            None,
            CommandId::new(format!("create-{session}")).expect("command id"),
        )
        .await
        .expect("the session is created");
    let placed = c.place(&session).await.expect("the session is placed");
    let _ = c.deliver(&placed, &create.command).await;
}

fn main() {
    let n: usize = std::env::var("HOST_RESIDENT_SESSIONS")
        .ok()
        .map(|v| {
            v.parse()
                .expect("HOST_RESIDENT_SESSIONS must be a whole number")
        })
        .unwrap_or(DEFAULT_SESSIONS);
    println!(
        "resident memory: {n} sessions; load average {}",
        load_average()
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let capacity = (n + 16).to_string();
    let serve = Serve::start(
        dir,
        "resident-memory",
        &[
            "--data-dir",
            ".hostd",
            "--capacity",
            &capacity,
            "--warm-ttl",
            "1h",
        ],
    );
    let pid = serve.pid();
    let token = std::fs::read_to_string(dir.join(".hostd").join("local.token"))
        .expect("hostd serve wrote the local token");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let url = format!("sqlite://{}", dir.join(".hostd").join("host.db").display());
    let (baseline, loaded, took) = rt.block_on(async {
        let store = Store::open(StoreOptions::new(url))
            .await
            .expect("the store opens");
        let c = Controller::new(
            store.clone(),
            TenantId::new("local").expect("tenant"),
            token.trim(),
        );
        // One session first, so the baseline includes everything a first session warms up.
        create(&c, "warm".into()).await;
        let baseline = settled(pid);
        let started = Instant::now();
        let mut next = 0;
        while next < n {
            let batch = (next..(next + CONCURRENT).min(n)).map(|i| create(&c, format!("m-{i}")));
            futures::future::join_all(batch).await;
            next += CONCURRENT;
        }
        let took = started.elapsed();
        let loaded = settled(pid);
        store.close().await;
        (baseline, loaded, took)
    });
    let per = (loaded.rss - baseline.rss) / 1024.0 / n as f64;
    println!(
        "hostd serve (sqlite): {per:.1} KiB RSS per resident session (goal ≤ 64 KiB); {n} sessions placed in {:.1} s; RSS {:.1} MB → {:.1} MB, the delta {:.2}x the one-session baseline",
        took.as_secs_f64(),
        baseline.rss / 1e6,
        loaded.rss / 1e6,
        (loaded.rss - baseline.rss) / baseline.rss,
    );
    println!(
        "hostd serve (sqlite): descriptors {} → {}, threads {} → {}; load average {}",
        baseline.fds,
        loaded.fds,
        baseline.threads,
        loaded.threads,
        load_average()
    );
    let (status, log) = serve.terminate();
    assert!(status.success(), "hostd serve exited {status}:\n{log}");
}
