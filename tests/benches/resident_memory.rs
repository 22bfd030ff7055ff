//! `cargo bench -p system-tests --bench resident_memory`
//!
//! What resident sessions cost a real `hostd serve` (SQLite, the scripted agent, the default
//! 5 s heartbeat), as a curve: sessions are created and placed as `hostd session create` does
//! (a catalog entry, its create command admitted, an attach, the command delivered), all idle
//! and resident (the warm TTL is an hour), up to each level of `HOST_RESIDENT_CURVE` (default
//! `1000`; the curve is `1000,10000,100000`). At each level it prints:
//!
//! - the server's resident set (VmRSS) per resident session above the one-session baseline
//!   measured in the same run (goal ≤ 16 KiB), and that growth as a ratio of the baseline;
//! - attach latency, p50 and p99, of `HOST_RESIDENT_PROBES` (default 500) attaches made one
//!   at a time with that many sessions resident (goal p99 < 20 ms at 100,000);
//! - over an idle window of `HOST_RESIDENT_WINDOW_SECS` (default 20), begun 25 s after the
//!   last command (once every runtime that handled one has renewed its journal lease): the
//!   server's CPU as a share of one core (goal < 5%) and its durable writes per heartbeat (the
//!   store's write operations, from `/metrics`; goal ≤ 1), each beside the one-session
//!   baseline's.
//!
//! At the end it drains the Host with SIGTERM and prints how long the exit took with every
//! level's sessions resident, and what the drain reported (released, abandoned, parked).
//!
//! `HOST_RESIDENT_SESSIONS=N` is the curve `N` (kept for older scripts).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use controller::client::HostLinkClient;
use controller::{Controller, Placed};
use sessionstore::{
    AgentId, CommandId, CompatibilityId, HostTarget, SessionId, Store, StoreOptions, TenantId,
};
use testkit::bench::{Held, cpu_seconds, held, load_average, metric_value, percentile};
use testkit::process::{Serve, http_get};

/// How many links create sessions at once (a handful of controllers, as a busy fleet would).
const LINKS: usize = 8;
const HEARTBEAT: Duration = Duration::from_secs(5);

fn curve() -> Vec<usize> {
    let parse = |v: &str| -> usize {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{v:?} is not a whole number of sessions"))
    };
    if let Ok(one) = std::env::var("HOST_RESIDENT_SESSIONS") {
        return vec![parse(&one)];
    }
    let list = std::env::var("HOST_RESIDENT_CURVE").unwrap_or_else(|_| "1000".into());
    let mut levels: Vec<usize> = list.split(',').map(parse).collect();
    levels.sort_unstable();
    levels
}

/// Waits until the server's RSS stops moving (two readings 1 s apart within 64 KiB), at most
/// 30 s, and returns the last reading.
fn settled(pid: u32) -> Held {
    let mut last = held(Some(pid));
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        let now = held(Some(pid));
        if (now.rss - last.rss).abs() < 64.0 * 1024.0 {
            return now;
        }
        last = now;
    }
    last
}

/// What an idle window cost the server: CPU as a share of one core, and durable writes per
/// heartbeat.
struct Idle {
    core_share: f64,
    writes_per_beat: f64,
}

/// How long after the last command an idle window starts: a runtime that handled a message
/// renews its journal lease once, a third of the lease TTL (60 s) later; the window measures
/// the steady idle that follows.
const QUIET: Duration = Duration::from_secs(25);

fn idle_window(pid: u32, port: u16, window: Duration) -> Idle {
    std::thread::sleep(QUIET);
    let writes = || {
        http_get(port, "/metrics")
            .and_then(|(_, body)| metric_value(&body, "host_store_writes_total"))
            .unwrap_or(f64::NAN)
    };
    let (cpu0, w0, t0) = (cpu_seconds(Some(pid)), writes(), Instant::now());
    std::thread::sleep(window);
    let (cpu1, w1, took) = (cpu_seconds(Some(pid)), writes(), t0.elapsed());
    Idle {
        core_share: (cpu1 - cpu0) / took.as_secs_f64(),
        writes_per_beat: (w1 - w0) / (took.as_secs_f64() / HEARTBEAT.as_secs_f64()),
    }
}

/// Creates session `name` and places it on `target` over `link`; the attach's own time.
async fn create(
    c: &Controller,
    link: &Arc<HostLinkClient>,
    target: &HostTarget,
    name: String,
) -> Duration {
    let session = SessionId::new(name).expect("a session id");
    let (record, create) = c
        .create_session(
            session.clone(),
            AgentId::new("assistant").expect("agent"),
            CompatibilityId::new("hostd-scripted-1").expect("build"),
            None,
            CommandId::new(format!("create-{session}")).expect("command id"),
        )
        .await
        .expect("the session is created");
    let started = Instant::now();
    let placed: Placed = c
        .attach_over(link, &record, target)
        .await
        .expect("the session is placed");
    let took = started.elapsed();
    let _ = c.deliver(&placed, &create.command).await;
    took
}

fn main() {
    let levels = curve();
    let top = *levels.last().expect("at least one level");
    let probes = testkit::bench::env_usize("HOST_RESIDENT_PROBES", 500);
    let window =
        Duration::from_secs(testkit::bench::env_usize("HOST_RESIDENT_WINDOW_SECS", 20) as u64);
    println!(
        "resident memory: levels {levels:?}, {probes} probe attaches per level, idle window {} s; load average {}",
        window.as_secs(),
        load_average()
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    // A level counts every resident session, the warm-up one included (the Host's capacity is
    // at most 100,000).
    let capacity = top.to_string();
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
            "--registry-heartbeat",
            "5s",
        ],
    );
    let (pid, port) = (serve.pid(), serve.port);
    let token = std::fs::read_to_string(dir.join(".hostd").join("local.token"))
        .expect("hostd serve wrote the local token");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let url = format!("sqlite://{}", dir.join(".hostd").join("host.db").display());
    rt.block_on(async {
        let store = Store::open(StoreOptions::new(url))
            .await
            .expect("the store opens");
        let c = Controller::new(
            store.clone(),
            TenantId::new("local").expect("tenant"),
            token.trim(),
        );
        let target = store
            .targets(true)
            .await
            .expect("the registry")
            .into_iter()
            .next()
            .expect("the Host advertised itself");
        let mut links = Vec::new();
        for _ in 0..LINKS {
            links.push(Arc::new(c.connect(&target).await.expect("a link")));
        }
        // One session first, so the baseline includes everything a first session warms up.
        create(&c, &links[0], &target, "warm".into()).await;
        let baseline = settled(pid);
        let quiet = idle_window(pid, port, window);
        println!(
            "baseline (1 session): RSS {:.1} MB; idle CPU {:.2}% of a core, {:.2} durable writes per heartbeat",
            baseline.rss / 1e6,
            quiet.core_share * 100.0,
            quiet.writes_per_beat
        );
        let mut resident = 0usize;
        for &level in &levels {
            // Fill to the level less the probes, many links at once.
            let fill_to = (level - 1).saturating_sub(probes).max(resident);
            let next = Arc::new(AtomicUsize::new(resident));
            let started = Instant::now();
            let workers = links.iter().map(|link| {
                let (c, link, target, next) = (&c, link.clone(), &target, next.clone());
                async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= fill_to {
                            return;
                        }
                        create(c, &link, target, format!("m-{i}")).await;
                    }
                }
            });
            futures::future::join_all(workers).await;
            let filled = fill_to - resident;
            let fill_rate = filled as f64 / started.elapsed().as_secs_f64();
            // Then probe one at a time: the attach's own latency at this many resident.
            let mut took = Vec::new();
            for i in fill_to..level - 1 {
                took.push(create(&c, &links[0], &target, format!("m-{i}")).await);
            }
            resident = level - 1;
            took.sort_unstable();
            let loaded = settled(pid);
            let idle = idle_window(pid, port, window);
            let per = (loaded.rss - baseline.rss) / 1024.0 / level as f64;
            let (p50, p99) = if took.is_empty() {
                (Duration::ZERO, Duration::ZERO)
            } else {
                (percentile(&took, 0.5), percentile(&took, 0.99))
            };
            println!(
                "{level} resident: {per:.1} KiB RSS per session (goal ≤ 16 KiB), RSS {:.1} MB ({:.2}x the baseline's growth ratio); \
                 attach p50 {:.2} ms, p99 {:.2} ms over {} probes (goal p99 < 20 ms); filled at {fill_rate:.0} sessions/s; \
                 idle CPU {:.2}% of a core ({:.1}x baseline), {:.2} durable writes per heartbeat ({:.2}x baseline); \
                 descriptors {}, threads {}; load average {}",
                loaded.rss / 1e6,
                (loaded.rss - baseline.rss) / baseline.rss,
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3,
                took.len(),
                idle.core_share * 100.0,
                idle.core_share / quiet.core_share,
                idle.writes_per_beat,
                idle.writes_per_beat / quiet.writes_per_beat,
                loaded.fds,
                loaded.threads,
                load_average()
            );
        }
        store.close().await;
    });
    // The drain of the top level: SIGTERM releases every resident session (the README's
    // termination bound is drain grace + 2 × idle boundary, 45 s by default).
    let (status, log, took) = serve.terminate_timed(Duration::from_secs(120));
    let drained = log
        .lines()
        .rev()
        .find(|l| l.contains("drain finished"))
        .unwrap_or("no drain line");
    println!(
        "drain of {top} resident: exited in {:.1} s ({status}); {}",
        took.as_secs_f64(),
        drain_counts(drained)
    );
    // A drain that could not release every session in its grace exits non-zero by design
    // (the README's stopping section); the figure above says how far it got.
    assert!(
        status.success() || drained.contains("drain finished"),
        "hostd serve exited {status} without finishing its drain:\n{log}"
    );
}

/// The counts of the Host's `drain finished` log line.
fn drain_counts(line: &str) -> String {
    ["released", "abandoned", "parked", "failures"]
        .iter()
        .map(|k| {
            let v = line
                .split([',', ' ', '{', '}'])
                .find_map(|part| {
                    part.trim()
                        .trim_start_matches('"')
                        .strip_prefix(k)
                        .map(|rest| rest.trim_start_matches(['"', ':', '=']).to_owned())
                })
                .unwrap_or_else(|| "?".into());
            format!("{k} {v}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}
