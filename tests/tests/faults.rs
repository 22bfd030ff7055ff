//! The Host under faults, each case ending with the exactly-once checker and the `/readyz`
//! answers it gave along the way: PostgreSQL restarted and stopped under load (a cluster of
//! the suite's own, never the shared server), the disk under a SQLite store filled, a slowloris
//! client and a flood of connection attempts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sessionstore::testing::{TestBackend, TestStore};
use sessionstore::wire::encode_command_body;
use sessionstore::*;
use testkit::faults::{ReadyzLog, SmallDisk, Stop, cluster, serial};
use testkit::*;

/// A store on the fault cluster's database (its own schema), or `None` when the suite cannot
/// run here.
async fn fault_store() -> Option<TestStore> {
    let url = cluster()?.url();
    TestStore::open_with(TestBackend::Postgres, move |o| {
        o.url = url;
        o.pg_max_connections = 8;
        // Short, so the pool cannot hide an outage by waiting it out: a store call made while
        // the server is away fails as transient well inside the outage, and only its caller's
        // own retry (the journal append's, the renewal's, the consumer's) carries it through.
        o.pg_acquire_timeout = Duration::from_millis(300);
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

/// What a load run saw: the commands admitted (session index, id) and the codes of the
/// refusals.
#[derive(Default)]
struct Loaded {
    admitted: Vec<(usize, CommandId)>,
    refused: Vec<ErrorCode>,
}

/// Admits an input for one of `sessions` every few milliseconds until `stop`, tolerating a
/// store that is away or full.
fn load(
    store: Store,
    service: host::Service,
    sessions: Vec<SessionRecord>,
    stop: Stop,
) -> tokio::task::JoinHandle<Loaded> {
    tokio::spawn(async move {
        let n = AtomicUsize::new(0);
        let mut loaded = Loaded::default();
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
                trace: None,
            });
            match tokio::time::timeout(Duration::from_secs(2), admit).await {
                Ok(Ok(_)) => {
                    loaded.admitted.push((which, command));
                    let _ = service.deliver(&s.tenant, &s.session);
                }
                Ok(Err(e)) => loaded.refused.push(e.code()),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        loaded
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
    for (session, epoch) in sessions.iter().zip(epochs) {
        let held = s.service.residency(&session.tenant, &session.session);
        assert_eq!(
            held.map(|(e, _)| e),
            Some(*epoch),
            "{} is still resident under its epoch: {held:?}",
            session.session
        );
    }
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
async fn a_postgres_restart_of_five_seconds_under_load_ends_no_residency_and_loses_nothing() {
    pg_outage_under_load("fault-pg-restart", Duration::from_secs(5), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_for_eight_seconds_under_load_shows_on_readyz_and_loses_nothing() {
    // Longer than a residency lease survives unrenewed (its renewals wait on the pool's
    // acquire timeout too): a residency may end, fenced as designed; its commands are then
    // applied after a re-attach, still exactly once.
    pg_outage_under_load("fault-pg-stopped", Duration::from_secs(8), false).await;
}

/// PostgreSQL stopped for `down` (then started again) while commands keep arriving: `/readyz`
/// goes 200 → 503 `store_unreachable` → 200, every admitted command is applied exactly once,
/// and (when `keeps_residency`) no residency ends.
async fn pg_outage_under_load(host: &str, down: Duration, keeps_residency: bool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "off".into()))
        .with_test_writer()
        .try_init();
    let _one = serial().await;
    let Some(ts) = fault_store().await else {
        return;
    };
    let Some(pg) = cluster() else { return };
    let s = serve(&ts, host, fault_options).await;
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

    // The outage, under load: stopped (`-m fast`), down for `down`, started again.
    tokio::task::spawn_blocking(move || {
        pg.stop();
        std::thread::sleep(down);
        pg.start();
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_load.stop();
    let admitted = load.await.unwrap().admitted;
    assert!(admitted.len() > 20, "load ran: {}", admitted.len());
    if !keeps_residency {
        for session in &sessions {
            if s.service
                .residency(&session.tenant, &session.session)
                .is_none()
            {
                c.attach_eventually(&s.service, session).await;
            }
        }
        for session in &sessions {
            let _ = s.service.deliver(&session.tenant, &session.session);
        }
    }
    let epochs: Vec<_> = if keeps_residency {
        epochs
    } else {
        sessions
            .iter()
            .map(|x| s.service.residency(&x.tenant, &x.session).unwrap().0)
            .collect()
    };
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

/// The disk under a SQLite store fills up while commands keep arriving: admissions are refused
/// with the typed code `unavailable` (the reason says the disk is full), `/readyz` turns 503
/// with `persistence_fault` for as long as writes fail, nothing admitted is lost; once space is
/// freed `/readyz` is 200 again and, after the controller re-attaches any session whose
/// residency a failed journal write ended (what a fleet's reconciler does by itself), every
/// admitted command is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_sqlite_refuses_with_a_typed_code_shows_on_readyz_and_loses_nothing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "off".into()))
        .with_test_writer()
        .try_init();
    let Some(disk) = SmallDisk::mount(6) else {
        return;
    };
    let db = disk.path.join("host.db");
    let Some(ts) = TestStore::open_with(TestBackend::Sqlite, |o| {
        o.url = format!("sqlite://{}", db.display());
        // Leases judged by the real clock, as in a real Host.
        o.clock = std::sync::Arc::new(SystemClock);
    })
    .await
    else {
        return;
    };
    let s = serve(&ts, "fault-disk-full", fault_options).await;
    let c = Controller::new(&ts);
    let sessions = resident_sessions(&c, &s, 3).await;
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

    // A few mebibytes on a tmpfs: quick enough to write from here.
    let filler = disk.path.join("filler");
    disk.fill(&filler);
    eventually("readyz to report the failing writes", async || {
        let (code, body) = get(&s.http("/readyz")).await;
        check(code == 503 && body.contains("persistence_fault"), || {
            format!("{code} {body}")
        })
    })
    .await;
    // Full for a while longer, under load.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (code, body) = get(&s.http("/readyz")).await;
    assert_eq!(code, 503, "still full: {body}");

    std::fs::remove_file(&filler).expect("the filler goes");
    eventually("readyz to be 200 once space is freed", async || {
        let (code, body) = get(&s.http("/readyz")).await;
        check(code == 200, || format!("{code} {body}"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_load.stop();
    let loaded = load.await.unwrap();
    assert!(
        loaded.admitted.len() > 20,
        "load ran: {}",
        loaded.admitted.len()
    );
    assert!(
        !loaded.refused.is_empty(),
        "the full disk refused some admissions"
    );
    assert!(
        loaded.refused.iter().all(|c| *c == ErrorCode::Unavailable),
        "every refusal is typed `unavailable`: {:?}",
        loaded.refused
    );

    for session in &sessions {
        if s.service
            .residency(&session.tenant, &session.session)
            .is_none()
        {
            c.attach_eventually(&s.service, session).await;
        }
        let _ = s.service.deliver(&session.tenant, &session.session);
    }
    // Every admitted command ends. An attempt the full disk interrupted (at most one per
    // session: its runtime latches at once) is closed by the next residency as not applied,
    // an honest outcome; every other one is applied.
    let mut not_applied = 0;
    for (which, command) in &loaded.admitted {
        let rec = terminal(&c.store, &sessions[*which], command).await;
        match rec.outcome {
            Some(Outcome::Applied) => {}
            Some(Outcome::NotApplied) => not_applied += 1,
            _ => panic!("{command} ended {rec:?}"),
        }
    }
    assert!(
        not_applied <= sessions.len(),
        "{not_applied} commands not applied"
    );
    for session in &sessions {
        c.check_exactly_once(session).await;
    }
    stop_probe.stop();
    assert_eq!(readyz.statuses(), [200, 503, 200], "{:?}", readyz.answers());
    s.server.shutdown();
    s.server.wait().await;
    drop(ts);
    drop(disk);
}

/// A Host behind its listener with `bounds`, on `ts`; HostLink pings every 500 ms so a short
/// idle timeout is allowed.
async fn bounded(ts: &TestStore, host: &str, bounds: host::listener::ListenerOptions) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut opts = options(host);
    opts.internal_endpoint = Some(format!("ws://{addr}"));
    let (service, _) = started(ts, opts).await;
    let mut creds = hostlink::auth::CredentialStore::empty();
    let mut tokens = Vec::new();
    let (token, digest) = hostlink::auth::mint_credential();
    creds.add(TenantId::new("acme").unwrap(), &digest).unwrap();
    tokens.push((
        TenantId::new("acme").unwrap(),
        token.expose_secret().to_owned(),
    ));
    let link = hostlink_server::LinkOptions {
        ping_interval: Duration::from_millis(500),
        pong_timeout: Duration::from_millis(400),
        ..hostlink_server::LinkOptions::default()
    }
    .validate()
    .unwrap();
    let server = host::Host::builder(service.clone())
        .auth(Box::new(creds))
        .link(link)
        .listener_bounds(bounds)
        .serve(listener)
        .await
        .unwrap();
    Served {
        service,
        server,
        base: format!("ws://{addr}"),
        tokens,
    }
}

fn cut(s: &Served, reason: &str) -> f64 {
    let text = s.service.metrics().render();
    let prefix = format!("host_connections_cut_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Reads until the server closes the connection; how long that took.
async fn until_closed(c: &mut tokio::net::TcpStream) -> Duration {
    use tokio::io::AsyncReadExt;
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection was never closed"),
        }
    }
}

/// A client sending one header line at a time, slowly, is cut off at the header-read timeout;
/// one that sends nothing is cut off at the idle timeout; neither disturbs a session's
/// commands or `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_and_a_silent_one_are_cut_off_at_their_timeouts() {
    use tokio::io::AsyncWriteExt;
    for backend in [TestBackend::Sqlite, TestBackend::Postgres] {
        let Some(ts) = TestStore::open(backend).await else {
            continue;
        };
        let s = bounded(
            &ts,
            "fault-slowloris",
            host::listener::ListenerOptions {
                header_read_timeout: Duration::from_millis(700),
                idle_timeout: Duration::from_millis(1500),
                max_connections: 64,
            },
        )
        .await;
        let addr = s.server.local_addr();
        let stop_probe = Stop::default();
        let readyz = ReadyzLog::record(s.http("/readyz"), stop_probe.clone());
        let c = Controller::new(&ts);
        let session = c.session().await;
        c.attach(&s.service, &session).await;

        // Slowloris: a header line every 200 ms, never the blank line.
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /readyz HTTP/1.1\r\n").await.unwrap();
        let dripping = tokio::spawn(async move {
            for i in 0..100 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if slow
                    .write_all(format!("X-Drip-{i}: x\r\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
            }
            slow
        });
        // Meanwhile the session works.
        let cmd = c
            .send(&s.service, &session, input("through the attack"))
            .await;
        assert_eq!(
            c.terminal(&session, &cmd).await.outcome,
            Some(Outcome::Applied)
        );
        let mut slow = dripping.await.unwrap();
        let held = until_closed(&mut slow).await;
        assert!(
            held < Duration::from_secs(5),
            "cut at the header timeout, not {held:?}"
        );
        assert!(cut(&s, "header_timeout") >= 1.0);

        // Silent: connects and sends nothing; the idle timeout (shorter here) cuts it.
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let started = tokio::time::Instant::now();
        until_closed(&mut silent).await;
        let held = started.elapsed();
        assert!(
            held >= Duration::from_millis(600) && held < Duration::from_secs(5),
            "{held:?}"
        );
        assert!(
            cut(&s, "header_timeout") + cut(&s, "idle_timeout") >= 2.0,
            "each cut is counted"
        );
        c.check_exactly_once(&session).await;
        stop_probe.stop();
        assert_eq!(readyz.statuses(), [200], "{:?}", readyz.answers());
        s.server.shutdown();
        s.server.wait().await;
    }
}

/// A client refused at the connection cap reads the whole 503 and then an orderly end, never a
/// reset: a Host that closed the socket with the client's request unread would make the kernel
/// reset it, and the client could lose the answer (a probe would see a broken connection, not
/// a full Host). Attempts come 25 at a time so some requests reach the Host before their
/// connection is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refused_at_the_connection_cap_reads_the_whole_503_and_no_reset() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // This process's descriptors are counted: no other counting test may run meanwhile.
    let _alone = DESCRIPTOR_TESTS.lock().await;
    let Some(ts) = TestStore::open(TestBackend::Sqlite).await else {
        return;
    };
    let s = bounded(
        &ts,
        "fault-refusal",
        host::listener::ListenerOptions {
            max_connections: 1,
            ..host::listener::ListenerOptions::default()
        },
    )
    .await;
    let addr = s.server.local_addr();
    let fds_before = open_fds();
    let holder = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut failures = Vec::new();
    for _ in 0..20 {
        let mut tries = Vec::new();
        for _ in 0..25 {
            tries.push(tokio::spawn(async move {
                let mut c = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                c.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .map_err(|e| format!("write: {e}"))?;
                let mut answer = Vec::new();
                match tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut answer)).await
                {
                    Err(_) => Err("no end within 5 s".to_owned()),
                    Ok(Err(e)) => Err(format!(
                        "read: {e} after {:?}",
                        String::from_utf8_lossy(&answer)
                    )),
                    Ok(Ok(_)) if answer.ends_with(b"the Host is at its connection cap") => Ok(()),
                    Ok(Ok(_)) => Err(format!("answer {:?}", String::from_utf8_lossy(&answer))),
                }
            }));
        }
        for t in tries {
            if let Err(e) = t.await.unwrap() {
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 500 refusals were not a clean 503: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(cut(&s, "max_connections") >= 500.0);
    drop(holder);
    descriptors_return_then_stop(s, fds_before).await;
}

/// Held by each test that counts this process's open descriptors, so two of them never run
/// at once (one's connections would be counted as the other's leak).
static DESCRIPTOR_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits for this process's open descriptors to come back to `before` (give or take the
/// Host's own churn), then stops the Host.
async fn descriptors_return_then_stop(s: Served, before: usize) {
    eventually("descriptors to return", async || {
        let now = open_fds();
        check(now <= before + 20, || {
            format!("{now} open, {before} before")
        })
    })
    .await;
    s.server.shutdown();
    s.server.wait().await;
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// 10,000 connection attempts against a Host whose connection bound is already taken: each is
/// answered 503 and closed at once, nothing leaks, and once the holders go the Host serves
/// again, its session's commands applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connection_attempts_past_the_bound_are_refused_and_leak_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // This process's descriptors are counted: no other counting test may run meanwhile.
    let _alone = DESCRIPTOR_TESTS.lock().await;
    let Some(ts) = TestStore::open(TestBackend::Sqlite).await else {
        return;
    };
    let bound = 100;
    let s = bounded(
        &ts,
        "fault-flood",
        host::listener::ListenerOptions {
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            max_connections: bound,
        },
    )
    .await;
    let addr = s.server.local_addr();
    let c = Controller::new(&ts);
    let session = c.session().await;
    c.attach(&s.service, &session).await;
    let fds_before = open_fds();
    let stop_probe = Stop::default();
    let readyz = ReadyzLog::record(s.http("/readyz"), stop_probe.clone());
    eventually("the first readyz answer", async || {
        check(readyz.statuses() == [200], || {
            format!("{:?}", readyz.answers())
        })
    })
    .await;
    // Take every permit with connections that send nothing.
    let mut holders = Vec::new();
    for _ in 0..bound {
        holders.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = std::sync::Arc::new(AtomicUsize::new(0));
    let attempts = 10_000;
    let mut waves = Vec::new();
    for wave in 0..(attempts / 500) {
        let refused = refused.clone();
        waves.push(tokio::spawn(async move {
            let mut tasks = Vec::new();
            for _ in 0..500 {
                let refused = refused.clone();
                tasks.push(tokio::spawn(async move {
                    let Ok(mut c) = tokio::net::TcpStream::connect(addr).await else {
                        return;
                    };
                    let _ = c
                        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                        .await;
                    let mut answer = Vec::new();
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut answer))
                            .await;
                    if answer.starts_with(b"HTTP/1.1 503") {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            wave
        }));
        // One wave at a time keeps the client side within its descriptors.
        if let Some(w) = waves.pop() {
            w.await.unwrap();
        }
    }
    let refused = refused.load(Ordering::SeqCst);
    assert!(
        refused >= attempts * 9 / 10,
        "{refused} of {attempts} were answered 503"
    );
    assert!(cut(&s, "max_connections") >= refused as f64);
    drop(holders);
    eventually(
        "readyz to answer 200 once the holders are gone",
        async || {
            let (code, body) = get(&s.http("/readyz")).await;
            check(code == 200, || format!("{code} {body}"))
        },
    )
    .await;
    let cmd = c.send(&s.service, &session, input("after the flood")).await;
    assert_eq!(
        c.terminal(&session, &cmd).await.outcome,
        Some(Outcome::Applied)
    );
    c.check_exactly_once(&session).await;
    // The recorder probes on its own schedule: let it see the Host ready again before it
    // stops (under load its last probe can predate the holders' release).
    eventually("the readyz recorder to see 200 again", async || {
        check(readyz.statuses().last() == Some(&200), || {
            format!("{:?}", readyz.answers())
        })
    })
    .await;
    stop_probe.stop();
    // Ready, refused at the connection cap while the bound is taken (the probe is a
    // connection too), ready again once it is free.
    assert_eq!(readyz.statuses(), [200, 503, 200], "{:?}", readyz.answers());
    assert!(
        readyz.answers()[1].1.contains("connection cap"),
        "{:?}",
        readyz.answers()
    );
    descriptors_return_then_stop(s, fds_before).await;
}
