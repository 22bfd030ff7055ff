//! `cargo run [--release] -p system-tests --example fleet_cost` (needs
//! `HOST_TEST_DATABASE_URL`, and the `hostd-under-test` binary the system tests build).
//!
//! What a fleet costs its PostgreSQL while nobody uses it: `FLEET_HOSTS` (default 10)
//! `hostd serve` processes on one database, heartbeat 1 s and registry expiry 3 s (every other
//! timing at its default, so the fleet reconciler runs a pass every 300 ms), holding resident
//! sessions placed by the reconciler. At each step of `FLEET_SESSIONS` (default
//! `0,1000,10000`: sessions in the whole fleet) the sessions are created, each with one
//! admitted command, and placed and applied by the fleet with no client action; then, after
//! `FLEET_SETTLE_SECS` (default 25: the runtimes' last journal-lease renewals after their
//! command) and for `FLEET_WINDOW_SECS` (default 20) of idleness, it measures from each Host's `/metrics`
//! (`host_store_statements_total`: statements and transaction brackets sent, reads
//! included) and from PostgreSQL (`pg_stat_activity` by `application_name`, which a Host sets
//! to `hostd/<host id>`; `xact_commit` of the database) the statements per second per Host,
//! the connections each Host holds, and the database's commits per second.
//!
//! The ratio printed is each step's statements per second per Host against the step with no
//! sessions, measured in the same run: a fleet whose own cost is O(Hosts) stays near 1 as
//! the sessions grow (the heartbeat renews all of a Host's leases in one statement, the
//! reconcile pass reads only sessions with open work).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::*;
use sqlx::Row as _;
use testkit::bench::{env_usize, load_average, metric_value};
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, http_get, tenant_credentials};

fn statements(port: u16) -> f64 {
    http_get(port, "/metrics")
        .and_then(|(_, body)| metric_value(&body, "host_store_statements_total"))
        .unwrap_or(f64::NAN)
}

async fn create(store: &Store, i: usize) {
    let session = store
        .create_session(NewSession {
            tenant: TenantId::new("acme").unwrap(),
            session: SessionId::new(format!("cost-{i}")).unwrap(),
            agent: AgentId::new("assistant").unwrap(),
            compatibility: CompatibilityId::new("hostd-scripted-1").unwrap(),
            binding: SessionBinding {
                runtime_session_id: RuntimeSessionId::mint(),
                storage_binding_id: local_binding(),
                binding_version: 1,
            },
        })
        .await
        .unwrap();
    let body = CommandBodyV1::Create { text: None };
    store
        .admit(NewCommand {
            tenant: session.tenant.clone(),
            session: session.session.clone(),
            command: CommandId::new("create").unwrap(),
            kind: body.kind(),
            body: CommandBody::Inline(encode_command_body(&body)),
            principal: None,
            metadata: None,
            apply_within: Duration::from_secs(3600),
            trace: None,
        })
        .await
        .unwrap();
}

#[tokio::main]
async fn main() {
    let Some(db) = FreshDatabase::create("fleet_cost").await else {
        eprintln!("HOST_TEST_DATABASE_URL is unset");
        return;
    };
    let hosts = env_usize("FLEET_HOSTS", 10);
    let window = Duration::from_secs(env_usize("FLEET_WINDOW_SECS", 20) as u64);
    let steps: Vec<usize> = std::env::var("FLEET_SESSIONS")
        .unwrap_or_else(|_| "0,1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_, credentials) = tenant_credentials(dir, "acme");
    let per_host = steps.iter().max().copied().unwrap_or(0) / hosts.max(1) * 2 + 64;
    let capacity = per_host.to_string();
    let fleet: Vec<(String, Serve)> = (0..hosts)
        .map(|i| {
            let name = format!("cost-{i}");
            let serve = Serve::fleet_member(
                dir,
                &name,
                &db.url,
                &credentials,
                &[
                    "--registry-heartbeat",
                    "1s",
                    "--registry-expiry",
                    "3s",
                    "--capacity",
                    &capacity,
                    "--fleet-placements-per-pass",
                    "1000",
                    "--fleet-placements-per-host",
                    "200",
                    // Idle sessions stay resident through the run: a warm release is work,
                    // not the idle cost this measures.
                    "--warm-ttl",
                    "1h",
                ],
            );
            (name, serve)
        })
        .collect();
    let store = Store::open(StoreOptions::new(db.url.clone()))
        .await
        .unwrap();
    let admin = sqlx::PgPool::connect(&db.url).await.unwrap();
    println!(
        "fleet cost: {hosts} Hosts on one PostgreSQL, heartbeat 1 s, expiry 3 s, idle window {window:?}; load {}",
        load_average()
    );
    let mut created = 0;
    let mut baseline: Option<f64> = None;
    for target in steps {
        // Create up to `target` sessions, each with one admitted command, then wait until the
        // fleet has placed every one and applied its command.
        let started = Instant::now();
        futures::stream::iter(created..target)
            .for_each_concurrent(32, |i| {
                let store = store.clone();
                async move { create(&store, i).await }
            })
            .await;
        created = created.max(target);
        loop {
            let open: i64 = sqlx::query(
                "SELECT COUNT(*) FROM commands WHERE state IN ('pending','claimed','applying')",
            )
            .fetch_one(&admin)
            .await
            .map(|r| r.get(0))
            .unwrap_or(-1);
            if open == 0 {
                break;
            }
            if started.elapsed() > Duration::from_secs(3600) {
                panic!("{open} commands still open after an hour");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let placed = started.elapsed();
        // Let the attach burst's writes settle before measuring idleness: a session runtime
        // that handled a message renews its journal lease once more within a third of its
        // TTL (20 s by default), and only then rests without writes.
        tokio::time::sleep(Duration::from_secs(
            env_usize("FLEET_SETTLE_SECS", 25) as u64
        ))
        .await;
        let commits = |pool: sqlx::PgPool| async move {
            sqlx::query(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            )
            .fetch_one(&pool)
            .await
            .map(|r| r.get::<i64, _>(0))
            .unwrap_or(0)
        };
        let before: Vec<f64> = fleet.iter().map(|(_, s)| statements(s.port)).collect();
        let commits_before = commits(admin.clone()).await;
        let t0 = Instant::now();
        tokio::time::sleep(window).await;
        let secs = t0.elapsed().as_secs_f64();
        let after: Vec<f64> = fleet.iter().map(|(_, s)| statements(s.port)).collect();
        let commits_after = commits(admin.clone()).await;
        let rates: Vec<f64> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| (a - b) / secs)
            .collect();
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        let max = rates.iter().copied().fold(0.0, f64::max);
        let mut connections: BTreeMap<String, i64> = BTreeMap::new();
        for r in sqlx::query(
            "SELECT application_name, COUNT(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name LIKE 'hostd/%' \
             GROUP BY application_name",
        )
        .fetch_all(&admin)
        .await
        .unwrap()
        {
            connections.insert(r.get(0), r.get(1));
        }
        let conn_total: i64 = connections.values().sum();
        let conn_max = connections.values().copied().max().unwrap_or(0);
        let ratio = match baseline {
            None => {
                baseline = Some(mean);
                1.0
            }
            Some(b) => mean / b,
        };
        println!(
            "{target:>6} sessions (placed and applied in {:.1}s): statements/s per Host mean {mean:.1} max {max:.1} (x{ratio:.2} of the first step); database commits/s {:.1}; connections: {conn_total} in all, at most {conn_max} per Host; load {}",
            placed.as_secs_f64(),
            (commits_after - commits_before) as f64 / secs,
            load_average()
        );
    }
    for (_, s) in fleet {
        let _ = s.terminate();
    }
    store.close().await;
    admin.close().await;
    db.drop_now().await;
}
