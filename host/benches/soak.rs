//! `cargo bench -p host --bench soak [-- sqlite|postgres]`
//!
//! Does memory stay flat while a Host recycles sessions? For each backend, in a process of its
//! own (so one backend's heap never colours the other's figures): one composed Host (pooled,
//! the real harness and its scripted model, a short warm TTL), then
//!
//! 1. **restores**: a fixed set of sessions cycled through restore and warm release until
//!    `HOST_SOAK_N` restores have happened (attach, idle, release: no input, so the journal
//!    grows only by the fence record each lease acquisition writes);
//! 2. **restores with an input**: the same again, each restore applying one input, so the
//!    consumer, publisher, relay and the runtime's turn all run every time (each conversation
//!    grows by a turn per restore, as a soak driven by client messages does);
//! 3. **new sessions**: `HOST_SOAK_N` sessions never seen before, each created, given one
//!    input and warm-released.
//!
//! After every round (all of the round's sessions released) the bench samples the process's
//! resident set (VmRSS and its anonymous part), its descriptors and its threads. It prints the
//! least-squares slope of each over the phase — bytes of RSS per restore and per distinct
//! session, with R² — beside the baseline RSS measured in the same run after a warm-up (the
//! ratio is the phase's fitted growth over that baseline). Goal: < 100 bytes per restore and
//! per distinct session once released; descriptors and threads flat.
//!
//! How long: the first few thousand restores show the allocator's working set forming (glibc
//! spreads frees over per-thread arenas and keeps each one's high-water; SQLite's page caches
//! fill up to their bounds), which fits as about 1 KB per restore over a 1,600-restore run and
//! levels off after that. The default run (25,600 restores alone, 25,600 new sessions: a
//! fixed set of 16 sessions each restored 1,600 times) is long enough to show whether growth
//! stops; the "second half" figure is the slope once it has.
//!
//! `HOST_SOAK_N` (default 25,600) and `HOST_SOAK_SESSIONS` (the fixed set and the round size,
//! default 16) size the run; `HOST_SOAK_INPUT_N` (default 1,600) sizes phase 2 alone (its
//! conversations grow, so each of its restores folds a longer journal than the last); `HOST_SOAK_SQLITE_WRITER_CACHE_KIB` and
//! `HOST_SOAK_SQLITE_READER_CACHE_KIB` replace the store's SQLite page-cache bounds (to compare
//! them in one build); PostgreSQL runs when `HOST_TEST_DATABASE_URL` is set. With
//! `HOST_SOAK_NO_STOP` set the process exits without stopping the Host, so a heap profiler
//! (`heaptrack`) reports everything still held as leaked, by allocation site.

use std::time::{Duration, Instant};

use department::LaunchMode;
use host::{Options, Service};
use sessionstore::*;
use testkit::bench::{
    BenchDatabase, Held, admit_input, attach_request, bench_postgres_url, env_usize, held,
    host_options, inputs_applied, least_squares, load_average, new_session, runtime, start_host,
};

const DEFAULT_N: usize = 25_600;
const DEFAULT_INPUT_N: usize = 1600;
const DEFAULT_SESSIONS: usize = 16;
/// Rounds run before the baseline is taken (allocator arenas, statement caches and pools
/// reach their working size).
const WARM_UP_ROUNDS: usize = 6;

/// A session of tenant `soak` at build `soak`.
async fn session(store: &Store, name: &str) -> SessionRecord {
    new_session(store, "soak", name, "soak").await
}

async fn host(options: StoreOptions) -> Service {
    let host = Options {
        capacity: 10_000,
        warm_ttl: Duration::from_millis(20),
        reconcile_interval: Duration::from_millis(500),
        ..host_options("soak")
    };
    start_host(host, options, "soak").await
}

/// One round: each session is attached (create or restore) — with one input admitted first
/// when `input` names the round — and the round returns once every input is applied and every
/// session is warm-released again.
async fn round(svc: &Service, store: &Store, sessions: &[SessionRecord], input: Option<&str>) {
    let expected = inputs_applied(svc) + input.map_or(0, |_| sessions.len() as u64);
    let work = sessions.iter().map(|s| {
        let svc = svc.clone();
        let store = store.clone();
        let s = s.clone();
        let command = input.map(|label| CommandId::new(format!("c-{label}")).unwrap());
        async move {
            if let Some(command) = command {
                admit_input(&store, &s, command).await;
            }
            svc.attach(attach_request(&s, LaunchMode::Restore))
                .await
                .expect("attach");
        }
    });
    futures::future::join_all(work).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while inputs_applied(svc) < expected || !svc.residents().is_empty() {
        assert!(
            Instant::now() < deadline,
            "round {input:?}: {} of {expected} applied, {} still resident after 60 s",
            inputs_applied(svc),
            svc.residents().len()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A phase's samples against its work count (restores or sessions).
#[derive(Default)]
struct Phase {
    samples: Vec<(f64, Held)>,
}

impl Phase {
    fn push(&mut self, x: usize) {
        self.samples.push((x as f64, held(None)));
    }

    fn slope(&self, f: impl Fn(&Held) -> f64) -> (f64, f64) {
        let pts: Vec<(f64, f64)> = self.samples.iter().map(|(x, s)| (*x, f(s))).collect();
        least_squares(&pts)
    }

    /// The slope over the phase's second half alone (growth that is levelling off shows a
    /// smaller slope here than over the whole phase).
    fn late_slope(&self, f: impl Fn(&Held) -> f64) -> f64 {
        let half = self.samples.len() / 2;
        let pts: Vec<(f64, f64)> = self.samples[half..]
            .iter()
            .map(|(x, s)| (*x, f(s)))
            .collect();
        least_squares(&pts).0
    }

    fn range(&self, f: impl Fn(&Held) -> f64) -> (f64, f64) {
        self.samples
            .iter()
            .map(|(_, s)| f(s))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    }

    fn report(&self, backend: &str, per: &str, baseline: &Held) {
        let work = self.samples.last().map_or(0.0, |(x, _)| *x);
        let (rss, rss_r2) = self.slope(|s| s.rss);
        let late = self.late_slope(|s| s.rss);
        let (anon, anon_r2) = self.slope(|s| s.anon);
        let (fds, _) = self.slope(|s| s.fds);
        let (threads, _) = self.slope(|s| s.threads);
        let (fd_lo, fd_hi) = self.range(|s| s.fds);
        let (th_lo, th_hi) = self.range(|s| s.threads);
        let (rss_lo, rss_hi) = self.range(|s| s.rss);
        println!(
            "{backend}: {:>6.0} bytes RSS per {per} (R² {rss_r2:.2}; second half {late:.0}), {:>6.0} bytes anonymous (R² {anon_r2:.2}), goal < 100; over {work:.0} {per}s the fit grows {:.3}% of the baseline RSS {:.1} MB (seen {:.1}–{:.1} MB)",
            rss,
            anon,
            100.0 * rss * work / baseline.rss,
            baseline.rss / 1e6,
            rss_lo / 1e6,
            rss_hi / 1e6,
        );
        println!(
            "{backend}: descriptors {fd_lo:.0}–{fd_hi:.0} ({fds:+.5} per {per}; baseline {:.0}), threads {th_lo:.0}–{th_hi:.0} ({threads:+.5} per {per}; baseline {:.0})",
            baseline.fds, baseline.threads,
        );
    }
}

async fn soak(backend: &str, options: StoreOptions, n: usize, k: usize) {
    let store = Store::open(options.clone()).await.expect("store");
    let svc = host(options).await;
    let started = Instant::now();
    let mut fixed = Vec::with_capacity(k);
    for i in 0..k {
        fixed.push(session(&store, &format!("fixed-{i}")).await);
    }
    let mut fresh = 0;
    let mut new_batch = |store: Store| {
        fresh += 1;
        let b = fresh;
        async move {
            let mut batch = Vec::with_capacity(k);
            for i in 0..k {
                batch.push(session(&store, &format!("new-{b}-{i}")).await);
            }
            batch
        }
    };
    // Warm-up: every kind of round a few times.
    for w in 0..WARM_UP_ROUNDS {
        round(&svc, &store, &fixed, Some(&format!("warm-{w}"))).await;
        round(&svc, &store, &fixed, None).await;
        let batch = new_batch(store.clone()).await;
        round(&svc, &store, &batch, Some("first")).await;
    }
    let baseline = held(None);
    // 1. Restores alone: attach, idle, warm release (no input; only the restore's fence record).
    let mut bare = Phase::default();
    bare.push(0);
    let mut done = 0;
    while done < n {
        round(&svc, &store, &fixed, None).await;
        done += k;
        bare.push(done);
    }
    // 2. Restores that each apply one input (each conversation grows by a turn).
    let mut busy = Phase::default();
    busy.push(0);
    let mut done = 0;
    let mut r = 0;
    let input_n = env_usize("HOST_SOAK_INPUT_N", DEFAULT_INPUT_N);
    while done < input_n {
        round(&svc, &store, &fixed, Some(&format!("r{r}"))).await;
        done += k;
        r += 1;
        busy.push(done);
    }
    // 3. New sessions, each created, given one input, released.
    let mut sessions = Phase::default();
    sessions.push(0);
    let mut made = 0;
    while made < n {
        let batch = new_batch(store.clone()).await;
        round(&svc, &store, &batch, Some("first")).await;
        made += k;
        sessions.push(made);
    }
    let footprint = svc.footprint();
    println!(
        "{backend}: {n} restores alone, {input_n} restores with an input ({k} sessions), {made} new sessions, in {:.0} s; per-session state left on the Host: {footprint:?}",
        started.elapsed().as_secs_f64(),
    );
    bare.report(backend, "restore", &baseline);
    busy.report(backend, "restore with an input", &baseline);
    sessions.report(backend, "distinct session", &baseline);
    if std::env::var_os("HOST_SOAK_NO_STOP").is_some() {
        // For a heap profiler: exit holding everything, so what is still held shows as leaked.
        std::process::exit(0);
    }
    svc.stop().await;
    store.close().await;
}

fn run_one(backend: &str) {
    let n = env_usize("HOST_SOAK_N", DEFAULT_N);
    let k = env_usize("HOST_SOAK_SESSIONS", DEFAULT_SESSIONS).max(1);
    let rt = runtime();
    match backend {
        "sqlite" => {
            let db = BenchDatabase::sqlite("host.db");
            let mut o = db.options.clone();
            o.sqlite_writer_cache_kib = env_usize(
                "HOST_SOAK_SQLITE_WRITER_CACHE_KIB",
                o.sqlite_writer_cache_kib as usize,
            ) as u32;
            o.sqlite_reader_cache_kib = env_usize(
                "HOST_SOAK_SQLITE_READER_CACHE_KIB",
                o.sqlite_reader_cache_kib as usize,
            ) as u32;
            println!(
                "sqlite: page caches bounded at {} KiB (writer) + {} × {} KiB (readers)",
                o.sqlite_writer_cache_kib, o.sqlite_readers, o.sqlite_reader_cache_kib
            );
            rt.block_on(soak("sqlite", o, n, k));
        }
        _ => {
            if let Some(url) = bench_postgres_url() {
                let db = BenchDatabase::postgres(&url, "bench_soak");
                rt.block_on(soak("postgres", db.options.clone(), n, k));
                rt.block_on(db.finish());
            }
        }
    }
}

/// Both backends unless one is named (`cargo bench` itself passes `--bench`); each backend
/// runs in a child process of its own.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let named: Vec<&str> = ["sqlite", "postgres"]
        .into_iter()
        .filter(|b| args.iter().any(|a| a == b))
        .collect();
    if let [one] = named.as_slice() {
        run_one(one);
        return;
    }
    let me = std::env::current_exe().expect("the bench's own path");
    println!(
        "soak: HOST_SOAK_N={} HOST_SOAK_SESSIONS={}; load average {}",
        env_usize("HOST_SOAK_N", DEFAULT_N),
        env_usize("HOST_SOAK_SESSIONS", DEFAULT_SESSIONS),
        load_average()
    );
    for backend in ["sqlite", "postgres"] {
        let status = std::process::Command::new(&me)
            .arg(backend)
            .status()
            .expect("the bench runs a child per backend");
        assert!(status.success(), "the {backend} soak failed: {status}");
        println!("load average {}", load_average());
    }
}
