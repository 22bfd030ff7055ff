//! `cargo bench -p host --bench idle`
//!
//! The idle cost of resident sessions, in one run on one Host over a SQLite store (a file,
//! `synchronous=FULL`, so every commit is an fsync): first with no session resident (the
//! baseline: the Host's own heartbeat and reconcile loop), then with 1,000 idle resident
//! sessions, each measured over the same window with the Host's default heartbeat (5 s) and
//! reconcile interval (2 s). For each it prints durable writes per second (the store's commits),
//! durable writes per heartbeat, and the process's CPU as a share of one core; then the ratio of
//! the 1,000-session figures to the baseline, and the resident-set growth per session. Goal:
//! at most 1 durable write per heartbeat and under 5% of a core with 1,000 idle sessions.
//!
//! CPU is this process's user + system time (`/proc/self/stat`, in USER_HZ = 100 ticks per
//! second on Linux), so it includes the store's work (SQLite runs in-process).

use std::time::{Duration, Instant};

use department::LaunchMode;
use host::{AttachRequest, Options, Service};
use testkit::bench::{
    BenchDatabase, attach_request, cpu_seconds, held, host_options, new_session, start_host,
};

const SESSIONS: usize = 1000;
const WINDOW: Duration = Duration::from_secs(20);

/// This process's resident set, in KiB (0 when `/proc` does not say).
fn rss_kib() -> u64 {
    let rss = held(None).rss;
    if rss.is_finite() {
        (rss / 1024.0) as u64
    } else {
        0
    }
}

struct Idle {
    writes_per_sec: f64,
    writes_per_heartbeat: f64,
    core_share: f64,
}

async fn measure(svc: &Service) -> Idle {
    let heartbeat = svc.config().registry_heartbeat;
    let before = svc.store().stats();
    let cpu = cpu_seconds(None);
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let elapsed = started.elapsed().as_secs_f64();
    let spent = svc.store().stats().since(&before);
    let writes = spent.commits as f64;
    Idle {
        writes_per_sec: writes / elapsed,
        writes_per_heartbeat: writes / (elapsed / heartbeat.as_secs_f64()),
        core_share: (cpu_seconds(None) - cpu) / elapsed,
    }
}

fn print(label: &str, i: &Idle) {
    println!(
        "{label:>22}: {:>7.2} durable writes/s  {:>5.2} per heartbeat  CPU {:>5.2}% of a core",
        i.writes_per_sec,
        i.writes_per_heartbeat,
        i.core_share * 100.0
    );
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "n/a (baseline 0)".into()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let db = BenchDatabase::sqlite("idle.db");
    let options = Options {
        capacity: 2 * SESSIONS as u32,
        ..host_options("idle-bench")
    };
    let svc = start_host(options, db.options.clone(), "bench").await;
    println!(
        "idle cost on one Host (SQLite, synchronous=FULL): heartbeat {:?}, reconcile {:?}, window {WINDOW:?}",
        svc.config().registry_heartbeat,
        svc.config().reconcile_interval
    );

    let baseline = measure(&svc).await;
    print("no session (baseline)", &baseline);

    let rss_before = rss_kib();
    let attach_started = Instant::now();
    for i in 0..SESSIONS {
        let s = new_session(svc.store(), "bench", &format!("idle-{i}"), "bench").await;
        svc.attach(AttachRequest {
            actor: Some("bench".into()),
            ..attach_request(&s, LaunchMode::Create)
        })
        .await
        .expect("attach");
    }
    let attached_in = attach_started.elapsed();
    // Let the attach burst's own writes finish before the window opens.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_after = rss_kib();
    assert_eq!(svc.residents().len(), SESSIONS, "every session resident");

    let loaded = measure(&svc).await;
    print(&format!("{SESSIONS} idle sessions"), &loaded);
    assert_eq!(
        svc.residents().len(),
        SESSIONS,
        "every session stayed resident"
    );
    println!(
        "{:>22}: writes/s {}  CPU {}  (attaching {SESSIONS} took {:.1}s)",
        "ratio to baseline",
        ratio(loaded.writes_per_sec, baseline.writes_per_sec),
        ratio(loaded.core_share, baseline.core_share),
        attached_in.as_secs_f64()
    );
    println!(
        "{:>22}: {} KiB over {SESSIONS} sessions = {:.1} KiB per resident session (this bench process, not hostd)",
        "RSS growth",
        rss_after.saturating_sub(rss_before),
        rss_after.saturating_sub(rss_before) as f64 / SESSIONS as f64
    );
    println!(
        "{:>22}: <= 1 durable write per heartbeat: {}; < 5% of a core: {}",
        "goals",
        if loaded.writes_per_heartbeat <= 1.05 {
            "met"
        } else {
            "NOT met"
        },
        if loaded.core_share < 0.05 {
            "met"
        } else {
            "NOT met"
        }
    );
    svc.stop().await;
}
