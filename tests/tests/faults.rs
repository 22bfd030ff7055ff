//! The Host under faults, each case ending with the exactly-once checker and the `/readyz`
//! answers it gave along the way: PostgreSQL restarted and stopped under load (a cluster of
//! the suite's own, never the shared server), the disk under a SQLite store filled, a slowloris
//! client and a flood of connection attempts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sessionstore::testing::{TestBackend, TestStore};
use sessionstore::wire::encode_command_body;
use sessionstore::*;
use testkit::faults::{ReadyzLog, Stop, cluster, serial};
use testkit::*;

/// A store on the fault cluster's database (its own schema), or `None` when the suite cannot
/// run here.
async fn fault_store() -> Option<TestStore> {
    let url = cluster()?.url();
    TestStore::open_with(TestBackend::Postgres, move |o| {
        o.url = url;
        o.pg_max_connections = 8;
    })
    .await
}

/// Heartbeats and leases that outlive a restart of a few seconds, and a short readiness
/// bound so the outage shows on `/readyz`.
fn fault_options(o: &mut host::Options) {
    o.registry_heartbeat = Duration::from_secs(1);
    o.registry_expiry = Duration::from_secs(12);
    o.claim_ttl = Duration::from_secs(5);
    o.reconcile_interval = Duration::from_millis(200);
    o.store_unreachable_bound = Duration::from_millis(800);
}

/// Admits an input for one of `sessions` every few milliseconds until `stop`, tolerating a
/// store that is away; returns the commands admitted.
fn load(
    store: Store,
    service: host::Service,
    sessions: Vec<SessionRecord>,
    stop: Stop,
) -> tokio::task::JoinHandle<Vec<(usize, CommandId)>> {
    tokio::spawn(async move {
        let n = AtomicUsize::new(0);
        let mut admitted = Vec::new();
        while !stop.stopped() {
            let i = n.fetch_add(1, Ordering::SeqCst);
            let which = i % sessions.len();
            let s = &sessions[which];
            let command = CommandId::new(format!("load-{i}")).unwrap();
            let body = input(&format!("message {i}"));
            let admit = store.admit(NewCommand {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: command.clone(),
                kind: body.kind(),
                body: CommandBody::Inline(encode_command_body(&body)),
                principal: Some("user:load".into()),
                metadata: None,
                apply_within: Duration::from_secs(600),
            });
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), admit).await {
                admitted.push((which, command));
                let _ = service.deliver(&s.tenant, &s.session);
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        admitted
    })
}

/// Every admitted command ended, exactly once and honestly, and no residency ended.
async fn settle_and_check(
    c: &Controller,
    s: &Served,
    sessions: &[SessionRecord],
    epochs: &[ResidencyEpoch],
    admitted: &[(usize, CommandId)],
) {
    for (which, command) in admitted {
        let rec = terminal(&c.store, &sessions[*which], command).await;
        assert_eq!(
            rec.outcome,
            Some(Outcome::Applied),
            "{command} ended {rec:?}"
        );
    }
    for (session, epoch) in sessions.iter().zip(epochs) {
        c.check_exactly_once(session).await;
        let (held, state) = s
            .service
            .residency(&session.tenant, &session.session)
            .expect("the session is still resident");
        assert_eq!(held, *epoch, "the residency never ended");
        assert_eq!(state, host::ResidentState::Resident);
    }
}

async fn resident_sessions(c: &Controller, s: &Served, n: usize) -> Vec<SessionRecord> {
    let mut sessions = Vec::new();
    for _ in 0..n {
        let session = c.session().await;
        c.attach(&s.service, &session).await;
        sessions.push(session);
    }
    sessions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_of_seconds_under_load_ends_no_residency_and_loses_nothing() {
    let _one = serial();
    let Some(ts) = fault_store().await else {
        return;
    };
    let Some(pg) = cluster() else { return };
    let s = serve(&ts, "fault-pg-restart", fault_options).await;
    let c = Controller::new(&ts);
    let sessions = resident_sessions(&c, &s, 3).await;
    let epochs: Vec<_> = sessions
        .iter()
        .map(|x| s.service.residency(&x.tenant, &x.session).unwrap().0)
        .collect();
    let stop_probe = Stop::default();
    let readyz = ReadyzLog::record(s.http("/readyz"), stop_probe.clone());
    let stop_load = Stop::default();
    let load = load(
        ts.store.clone(),
        s.service.clone(),
        sessions.clone(),
        stop_load.clone(),
    );
    tokio::time::sleep(Duration::from_millis(700)).await;

    // The restart: down for 3 s (4 s with the stop and start themselves), under load.
    tokio::task::spawn_blocking(|| {
        pg.stop();
        std::thread::sleep(Duration::from_secs(3));
        pg.start();
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_load.stop();
    let admitted = load.await.unwrap();
    assert!(admitted.len() > 20, "load ran: {}", admitted.len());
    settle_and_check(&c, &s, &sessions, &epochs, &admitted).await;
    eventually("readyz to be 200 again", async || {
        let (code, body) = get(&s.http("/readyz")).await;
        check(code == 200, || body)
    })
    .await;
    stop_probe.stop();
    let statuses = readyz.statuses();
    assert_eq!(statuses, [200, 503, 200], "{:?}", readyz.answers());
    assert!(
        readyz.answers()[1].1.contains("store_unreachable"),
        "{:?}",
        readyz.answers()
    );
    assert_eq!(
        s.service.residents().len(),
        3,
        "every session stayed resident"
    );
    s.server.shutdown();
    s.server.wait().await;
}
