//! `cargo bench -p host --bench commands`
//!
//! For each backend, in one run: the store's own command lifecycle rate (admit → claim →
//! attempt → journal application → settle → cursor, straight on the store: six writes per
//! command), then commands/s end to end through a composed Host with the harness and its
//! scripted model (admitted into the store as a controller would, woken as a HostLink delivery
//! would, settled by the Host from the runtime's evidence; each input also runs its turn, so
//! the Host writes more per command than the lifecycle does: the bench prints how many), for 1
//! and 64 sessions, with the ratio to the lifecycle rate at the same session count (goal at 64
//! sessions: 0.6x); and attach latency p50/p99 for create and for restore. PostgreSQL runs when
//! `HOST_TEST_DATABASE_URL` is set.
//!
//! Then, for each backend, the end-to-end rate with trace export off and on in the same run
//! (the OpenTelemetry layer switched on for the traced rounds, sampling 1.0, exporting over
//! OTLP/gRPC to a collector served in this process), the two alternating over twelve rounds
//! of 100 inputs per session, and the ratio of their medians (goal: at least 0.9x).
//!
//! The bench learns that commands were applied from the Host itself: the sample count of its
//! `host_command_apply_seconds` histogram (an in-memory counter, looked at every 5 ms), then
//! one read per session confirms the last command is terminal. It reads nothing from the
//! database while the Host works.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use department::LaunchMode;
use host::{Options, Service};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use sessionstore::*;
use testkit::bench::{
    BenchDatabase, admit_input, attach_request, bench_postgres_url, chosen_backends, host_options,
    inputs_applied, load_average, new_session, percentile, runtime, start_host,
};
use trace_export::{ExportConfig, TraceExport};

const ONE_SESSION: usize = 150;
const MANY: usize = 64;
const PER_SESSION: usize = 30;
const ATTACHES: usize = 60;

/// A session of tenant `bench` at build `bench`.
async fn session(store: &Store, name: &str) -> SessionRecord {
    new_session(store, "bench", name, "bench").await
}

async fn host(options: StoreOptions, name: &str) -> Service {
    let host = Options {
        capacity: 1000,
        reconcile_interval: Duration::from_millis(500),
        ..host_options(name)
    };
    start_host(host, options, "bench").await
}

/// The store's lifecycle rate and the writes and statements each command cost.
async fn raw_rate(store: &Store, sessions: usize, per: usize, tag: &str) -> Measured {
    let mut all = Vec::new();
    for i in 0..sessions {
        all.push(session(store, &format!("raw-{tag}-{i}")).await);
    }
    let before = store.stats();
    let start = Instant::now();
    let tasks: Vec<_> = all
        .into_iter()
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move { sessionstore::testing::run_lifecycle(&store, &s, per).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("task").expect("lifecycle");
    }
    Measured::new(
        sessions * per,
        start.elapsed(),
        store.stats().since(&before),
    )
}

struct Measured {
    rate: f64,
    commands: usize,
    stats: StoreStats,
}

impl Measured {
    fn new(commands: usize, took: Duration, stats: StoreStats) -> Measured {
        Measured {
            rate: commands as f64 / took.as_secs_f64(),
            commands,
            stats,
        }
    }

    fn per_command(&self) -> String {
        let n = self.commands as f64;
        format!(
            "{:.1} writes, {:.1} statements, {:.2} commits per command",
            self.stats.writes as f64 / n,
            self.stats.statements as f64 / n,
            self.stats.commits as f64 / n,
        )
    }
}

/// Admits `per` inputs to a resident session, waking its consumer after each.
async fn drive(svc: Service, store: Store, s: SessionRecord, per: usize) -> CommandId {
    let mut last = None;
    for i in 0..per {
        let rec = admit_input(&store, &s, CommandId::new(format!("c{i}")).unwrap()).await;
        let _ = svc.deliver(&s.tenant, &s.session);
        last = Some(rec.command);
    }
    last.expect("at least one command")
}

async fn host_rate(
    svc: &Service,
    store: &Store,
    sessions: usize,
    per: usize,
    tag: &str,
) -> Measured {
    let mut all = Vec::new();
    for i in 0..sessions {
        let s = session(store, &format!("host-{tag}-{i}")).await;
        svc.attach(attach_request(&s, LaunchMode::Create))
            .await
            .expect("attach");
        all.push(s);
    }
    let expected = inputs_applied(svc) + (sessions * per) as u64;
    let before = svc.store().stats();
    let start = Instant::now();
    let tasks: Vec<_> = all
        .iter()
        .cloned()
        .map(|s| tokio::spawn(drive(svc.clone(), store.clone(), s, per)))
        .collect();
    let mut last = Vec::with_capacity(tasks.len());
    for t in tasks {
        last.push(t.await.expect("task"));
    }
    while inputs_applied(svc) < expected {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = start.elapsed();
    let stats = svc.store().stats().since(&before);
    for (s, c) in all.iter().zip(&last) {
        let rec = store.command(&s.tenant, &s.session, c).await.expect("read");
        assert!(rec.state.is_terminal(), "{} is {}", rec.command, rec.state);
    }
    Measured::new(sessions * per, took, stats)
}

async fn attach_latency(
    options: StoreOptions,
    store: &Store,
    name: &str,
) -> (Vec<Duration>, Vec<Duration>) {
    let svc = host(options.clone(), &format!("{name}-a")).await;
    let mut sessions = Vec::new();
    let mut create = Vec::new();
    for i in 0..ATTACHES {
        let s = session(store, &format!("lat-{name}-{i}")).await;
        let t = Instant::now();
        svc.attach(attach_request(&s, LaunchMode::Create))
            .await
            .expect("attach");
        create.push(t.elapsed());
        sessions.push(s);
    }
    svc.stop().await;
    let svc = host(options, &format!("{name}-b")).await;
    let mut restore = Vec::new();
    for s in &sessions {
        let t = Instant::now();
        let a = svc
            .attach(attach_request(s, LaunchMode::Create))
            .await
            .expect("attach");
        restore.push(t.elapsed());
        assert_eq!(a.launched, LaunchMode::Restore);
    }
    svc.stop().await;
    create.sort();
    restore.sort();
    (create, restore)
}

/// Whether the OpenTelemetry layer records (the traced phase) or not.
static TRACING: AtomicBool = AtomicBool::new(false);

/// An OTLP collector in this process that counts the spans it receives.
#[derive(Clone, Default)]
struct CountingCollector(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for CountingCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n: usize = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(n as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Serves the collector, builds the export pipeline to it and installs the subscriber whose
/// OpenTelemetry layer records only while [`TRACING`] is set.
fn install_tracing(rt: &tokio::runtime::Runtime) -> (TraceExport, Arc<AtomicU64>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let _in = rt.enter();
    let incoming = tonic::transport::server::TcpIncoming::bind(([127, 0, 0, 1], 0).into())
        .expect("the collector binds");
    let addr = incoming.local_addr().expect("an address");
    let collector = CountingCollector::default();
    let received = collector.0.clone();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector))
            .serve_with_incoming(incoming),
    );
    let export = TraceExport::start(&ExportConfig {
        endpoint: format!("http://{addr}"),
        protocol: trace_export::Protocol::Grpc,
        sampling_ratio: 1.0,
        service_name: "hostd-bench".into(),
        instance: "bench".into(),
        queue_size: 4096,
        export_batch: 512,
        export_timeout: Duration::from_secs(5),
    })
    .expect("the export pipeline");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(export.tracer())
        // As `hostd serve` installs it (cmd's init_tracing).
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        // Decided at each span (never cached per callsite): the switch flips between phases.
        .with_filter(tracing_subscriber::filter::dynamic_filter_fn(|m, _| {
            TRACING.load(Ordering::Relaxed)
                && *m.level() <= tracing::Level::INFO
                && m.target() != trace_context::span::LONG_LIVED
        }));
    tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .expect("the subscriber");
    (export, received)
}

/// The order of the export comparison's rounds: off and on alternate (ABBA, three times), so that
/// neither mode always runs on the larger database or the warmer cache.
const TRACE_ROUNDS: [bool; 12] = [
    false, true, true, false, false, true, true, false, false, true, true, false,
];

/// Inputs per session in each round of the export comparison: about two seconds of work per
/// round, long enough that a scheduling hiccup on a shared machine is a small part of it.
const TRACED_PER_SESSION: usize = 100;

/// The end-to-end rate at 64 sessions with trace export off and on (same Host options), each
/// the median of its rounds.
async fn traced(backend: &str, options: StoreOptions, export: &TraceExport, received: &AtomicU64) {
    let store = Store::open(options.clone()).await.expect("store");
    let before = (received.load(Ordering::Relaxed), export.counts.dropped());
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for (round, traced) in TRACE_ROUNDS.into_iter().enumerate() {
        TRACING.store(traced, Ordering::Relaxed);
        let tag = format!("{}-{round}", if traced { "traced" } else { "untraced" });
        let svc = host(options.clone(), &format!("{tag}-{backend}")).await;
        let m = host_rate(&svc, &store, MANY, TRACED_PER_SESSION, &tag).await;
        svc.stop().await;
        TRACING.store(false, Ordering::Relaxed);
        if traced {
            on.push(m.rate)
        } else {
            off.push(m.rate)
        }
    }
    // Let the queue's last batch reach the collector before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rounds = |r: &[f64]| {
        r.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "{backend}: rounds, export off: {}; export on: {}",
        rounds(&off),
        rounds(&on)
    );
    let (off, on) = (median(&mut off), median(&mut on));
    println!(
        "{backend}: host end to end, {MANY} sessions, export off: {off:>8.0} commands/s (median of {} rounds)",
        TRACE_ROUNDS.len() / 2
    );
    println!(
        "{backend}: host end to end, {MANY} sessions, export on:  {on:>8.0} commands/s  ({:.2}x untraced, goal 0.9x; {} spans received, {} dropped)",
        on / off,
        received.load(Ordering::Relaxed) - before.0,
        export.counts.dropped() - before.1,
    );
    store.close().await;
}

fn median(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    let n = rates.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        rates[n / 2]
    } else {
        (rates[n / 2 - 1] + rates[n / 2]) / 2.0
    }
}

async fn bench(backend: &str, options: StoreOptions) {
    let store = Store::open(options.clone()).await.expect("store");
    let raw_one = raw_rate(&store, 1, ONE_SESSION, "one").await;
    let raw_many = raw_rate(&store, MANY, PER_SESSION, "many").await;
    let svc = host(options.clone(), &format!("bench-{backend}")).await;
    let one = host_rate(&svc, &store, 1, ONE_SESSION, "one").await;
    let many = host_rate(&svc, &store, MANY, PER_SESSION, "many").await;
    svc.stop().await;
    let (create, restore) = attach_latency(options, &store, backend).await;
    println!(
        "{backend}: store lifecycle, 1 session:      {:>8.0} commands/s  ({})",
        raw_one.rate,
        raw_one.per_command()
    );
    println!(
        "{backend}: host end to end, 1 session:     {:>8.0} commands/s  ({:.2}x the lifecycle; the Host's store: {})",
        one.rate,
        one.rate / raw_one.rate,
        one.per_command()
    );
    println!(
        "{backend}: store lifecycle, {MANY} sessions:    {:>8.0} commands/s  ({})",
        raw_many.rate,
        raw_many.per_command()
    );
    println!(
        "{backend}: host end to end, {MANY} sessions:   {:>8.0} commands/s  ({:.2}x the lifecycle, goal 0.6x; the Host's store: {})",
        many.rate,
        many.rate / raw_many.rate,
        many.per_command()
    );
    println!(
        "{backend}: attach (create)  p50 {:>7.2} ms  p99 {:>7.2} ms  ({ATTACHES} attaches)",
        percentile(&create, 0.5).as_secs_f64() * 1e3,
        percentile(&create, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "{backend}: attach (restore) p50 {:>7.2} ms  p99 {:>7.2} ms  ({ATTACHES} attaches)",
        percentile(&restore, 0.5).as_secs_f64() * 1e3,
        percentile(&restore, 0.99).as_secs_f64() * 1e3
    );
    store.close().await;
}

/// `cargo bench -p host --bench commands [-- sqlite|postgres]`: both backends unless one is
/// named (`cargo bench` itself passes `--bench`).
fn main() {
    let chosen = chosen_backends();
    let rt = runtime();
    let (export, received) = install_tracing(&rt);
    println!("load average {}", load_average());
    if chosen.sqlite {
        let db = BenchDatabase::sqlite("host.db");
        rt.block_on(bench("sqlite", db.options.clone()));
        println!("load average {}", load_average());
        let db = BenchDatabase::sqlite("traced.db");
        rt.block_on(traced("sqlite", db.options.clone(), &export, &received));
        println!("load average {}", load_average());
    }
    if !chosen.postgres {
        return;
    }
    if let Some(url) = bench_postgres_url() {
        let mut db = BenchDatabase::postgres(&url, "bench_host");
        db.options.pg_max_connections = 32;
        rt.block_on(bench("postgres", db.options.clone()));
        println!("load average {}", load_average());
        rt.block_on(traced("postgres", db.options.clone(), &export, &received));
        println!("load average {}", load_average());
        rt.block_on(db.finish());
    }
}
