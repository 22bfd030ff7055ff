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
//! The bench learns that commands were applied from the Host itself: the sample count of its
//! `host_command_apply_seconds` histogram (an in-memory counter, looked at every 5 ms), then
//! one read per session confirms the last command is terminal. It reads nothing from the
//! database while the Host works.

use std::sync::Arc;
use std::time::{Duration, Instant};

use department::{LaunchMode, Registration, RuntimeProfile};
use harness::model::ScriptedModel;
use harness::tool::ToolRegistry;
use harness::{AgentConfig, HarnessTarget};
use host::{AttachRequest, Composition, Options, Registrar, Service};
use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::*;

const ONE_SESSION: usize = 150;
const MANY: usize = 64;
const PER_SESSION: usize = 30;
const ATTACHES: usize = 60;

struct Reg;

#[async_trait::async_trait]
impl Registrar for Reg {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String> {
        let agent = AgentConfig::new(
            Arc::new(ScriptedModel::new()),
            ToolRegistry::new(vec![]).map_err(|e| e.to_string())?,
        );
        let target =
            HarnessTarget::new(store.clone(), agent, CompatibilityId::new("bench").unwrap())
                .map_err(|e| e.to_string())?;
        Ok(vec![Registration {
            agent: AgentId::new("assistant").unwrap(),
            target: Arc::new(target),
        }])
    }
}

fn tenant() -> TenantId {
    TenantId::new("bench").unwrap()
}

async fn new_session(store: &Store, name: &str) -> SessionRecord {
    store
        .create_session(NewSession {
            tenant: tenant(),
            session: SessionId::new(name).unwrap(),
            agent: AgentId::new("assistant").unwrap(),
            compatibility: CompatibilityId::new("bench").unwrap(),
            binding: SessionBinding {
                runtime_session_id: RuntimeSessionId::mint(),
                storage_binding_id: local_binding(),
                binding_version: 1,
            },
        })
        .await
        .expect("session")
}

async fn host(options: StoreOptions, name: &str) -> Service {
    let svc = Composition {
        options: Options {
            host_id: Some(HostId::new(name).unwrap()),
            internal_endpoint: Some("ws://127.0.0.1:7400".into()),
            capacity: 1000,
            reconcile_interval: Duration::from_millis(500),
            ..Options::default()
        },
        store: options,
        registrar: Box::new(Reg),
        profile: RuntimeProfile::Durable,
        version: "bench".into(),
    }
    .build()
    .await
    .expect("compose");
    svc.start().await.expect("start");
    svc
}

fn attach_req(s: &SessionRecord) -> AttachRequest {
    AttachRequest {
        tenant: s.tenant.clone(),
        session: s.session.clone(),
        agent: s.agent.clone(),
        compatibility: Some(s.compatibility.clone()),
        mode: LaunchMode::Create,
        actor: None,
        trace: None,
    }
}

/// The store's lifecycle rate and the writes and statements each command cost.
async fn raw_rate(store: &Store, sessions: usize, per: usize, tag: &str) -> Measured {
    let mut all = Vec::new();
    for i in 0..sessions {
        all.push(new_session(store, &format!("raw-{tag}-{i}")).await);
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
        let rec = store
            .admit(NewCommand {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: CommandId::new(format!("c{i}")).unwrap(),
                kind: CommandKind::Input,
                body: CommandBody::Inline(encode_command_body(&CommandBodyV1::Input {
                    text: "hello".into(),
                })),
                principal: None,
                metadata: None,
                apply_within: Duration::from_secs(3600),
            })
            .await
            .expect("admit");
        let _ = svc.deliver(&s.tenant, &s.session);
        last = Some(rec.command);
    }
    last.expect("at least one command")
}

/// How many inputs the Host has applied so far (its own count, in memory).
fn applied(svc: &Service) -> u64 {
    svc.metrics()
        .apply_seconds
        .with_label_values(&["input"])
        .get_sample_count()
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
        let s = new_session(store, &format!("host-{tag}-{i}")).await;
        svc.attach(attach_req(&s)).await.expect("attach");
        all.push(s);
    }
    let expected = applied(svc) + (sessions * per) as u64;
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
    while applied(svc) < expected {
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
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
        let s = new_session(store, &format!("lat-{name}-{i}")).await;
        let t = Instant::now();
        svc.attach(attach_req(&s)).await.expect("attach");
        create.push(t.elapsed());
        sessions.push(s);
    }
    svc.stop().await;
    let svc = host(options, &format!("{name}-b")).await;
    let mut restore = Vec::new();
    for s in &sessions {
        let t = Instant::now();
        let a = svc.attach(attach_req(s)).await.expect("attach");
        restore.push(t.elapsed());
        assert_eq!(a.launched, LaunchMode::Restore);
    }
    svc.stop().await;
    create.sort();
    restore.sort();
    (create, restore)
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

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// `cargo bench -p host --bench commands [-- sqlite|postgres]`: both backends unless one is
/// named (`cargo bench` itself passes `--bench`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let named = |n: &str| args.iter().any(|a| a == n);
    let any = named("sqlite") || named("postgres");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = StoreOptions::new(format!("sqlite://{}", dir.path().join("host.db").display()));
    println!("load average {}", load());
    if !any || named("sqlite") {
        rt.block_on(bench("sqlite", sqlite));
        println!("load average {}", load());
    }
    if any && !named("postgres") {
        return;
    }
    match std::env::var("HOST_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => {
            let schema = format!("bench_host_{}", std::process::id());
            let mut o = StoreOptions::new(url.clone());
            o.pg_schema = Some(schema.clone());
            o.pg_max_connections = 32;
            rt.block_on(bench("postgres", o));
            println!("load average {}", load());
            rt.block_on(async {
                use sqlx::{Connection, Executor};
                if let Ok(mut c) = sqlx::PgConnection::connect(&url).await {
                    let _ = c
                        .execute(sqlx::AssertSqlSafe(format!(
                            "DROP SCHEMA IF EXISTS {schema} CASCADE"
                        )))
                        .await;
                }
            });
        }
        _ => println!("postgres: skipped (HOST_TEST_DATABASE_URL is unset)"),
    }
}
