//! `cargo bench -p host --bench commands`
//!
//! For each backend, in one run: the store's raw command lifecycle rate (admit → claim →
//! attempt → journal application → settle → cursor, straight on the store), then commands/s
//! end to end through a composed Host with the harness and its scripted model (admitted into
//! the store, woken as a HostLink delivery would, settled by the Host from the runtime's
//! evidence — each input also runs its turn), for 1 and 64 sessions, with the ratio to the raw
//! rate; and attach latency p50/p99 for create and for restore. PostgreSQL runs when
//! `HOST_TEST_DATABASE_URL` is set.

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
const PER_SESSION: usize = 15;
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
        compatibility: s.compatibility.clone(),
        mode: LaunchMode::Create,
        actor: None,
        trace: None,
    }
}

async fn raw_rate(store: &Store, sessions: usize, per: usize, tag: &str) -> f64 {
    let mut all = Vec::new();
    for i in 0..sessions {
        all.push(new_session(store, &format!("raw-{tag}-{i}")).await);
    }
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
    (sessions * per) as f64 / start.elapsed().as_secs_f64()
}

/// Admits `per` inputs to a resident session, wakes its consumer after each, and waits until
/// the last one is settled.
async fn drive(svc: Service, store: Store, s: SessionRecord, per: usize) {
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
        last = Some(rec);
    }
    let Some(last) = last else { return };
    loop {
        let rec = store
            .command(&s.tenant, &s.session, &last.command)
            .await
            .expect("read");
        if rec.state.is_terminal() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn host_rate(svc: &Service, store: &Store, sessions: usize, per: usize, tag: &str) -> f64 {
    let mut all = Vec::new();
    for i in 0..sessions {
        let s = new_session(store, &format!("host-{tag}-{i}")).await;
        svc.attach(attach_req(&s)).await.expect("attach");
        all.push(s);
    }
    let start = Instant::now();
    let tasks: Vec<_> = all
        .into_iter()
        .map(|s| tokio::spawn(drive(svc.clone(), store.clone(), s, per)))
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    (sessions * per) as f64 / start.elapsed().as_secs_f64()
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
    println!("{backend}: store raw lifecycle, 1 session:    {raw_one:>8.0} commands/s");
    println!(
        "{backend}: host end to end, 1 session:        {one:>8.0} commands/s  ({:.2}x raw)",
        one / raw_one
    );
    println!("{backend}: store raw lifecycle, {MANY} sessions:  {raw_many:>8.0} commands/s");
    println!(
        "{backend}: host end to end, {MANY} sessions:      {many:>8.0} commands/s  ({:.2}x raw)",
        many / raw_many
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

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = StoreOptions::new(format!("sqlite://{}", dir.path().join("host.db").display()));
    rt.block_on(bench("sqlite", sqlite));
    match std::env::var("HOST_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => {
            let schema = format!("bench_host_{}", std::process::id());
            let mut o = StoreOptions::new(url.clone());
            o.pg_schema = Some(schema.clone());
            o.pg_max_connections = 32;
            rt.block_on(bench("postgres", o));
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
