//! `cargo run -p system-tests --example failover_latency` (needs `HOST_TEST_DATABASE_URL`,
//! and the `hostd-under-test` binary the system tests build).
//!
//! Failover latency with no client action, measured once: three `hostd serve` on one
//! PostgreSQL database (heartbeat 200 ms, registry expiry 800 ms, fleet reconciler every
//! 150 ms; with `FAILOVER_TIMINGS=operator`, heartbeat 1 s, registry expiry 3 s and every
//! other timing left at its default), sessions placed by the reconciler. For each of `KILLS` rounds, the Host holding
//! the most sessions is killed with SIGKILL, one input is admitted on each of its sessions
//! right after the kill, and the time from the kill until each is applied on a survivor is
//! recorded (nobody places, attaches or delivers). The killed Host is restarted under a new id
//! before the next round. Prints p50, p99 and max against the bound: registry expiry + 1 s.
//! With `FAILOVER_SIGNAL=stop` the victim is frozen (SIGSTOP) instead, and killed only once
//! its sessions have moved. Every admission and kill is recorded, and the exactly-once checker
//! (`testkit::checker`) judges the run at the end: it exits non-zero on any violation.
//!
//! `FAILOVER_CASE=partition` measures a partition instead (see [`partition`]): the victim is
//! cut from PostgreSQL by a fault proxy (a black hole) and keeps running.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::*;
use testkit::checker::{StoreView, check};
use testkit::history::Recorder;
use testkit::pg::FreshDatabase;
use testkit::process::Serve;

const KILLS: usize = 20;
const SESSIONS: usize = 9;

/// The timings the Hosts run with. `tuned` (the default) sets every fleet and claim timing
/// short; `operator` (`FAILOVER_TIMINGS=operator`) sets only what an operator who wants fast
/// failover would: heartbeat 1 s, registry expiry 3 s, and leaves every other timing (the
/// fleet reconciler's pace, the claim TTL) at its default.
struct Timings {
    name: &'static str,
    expiry: Duration,
    /// The claim TTL the Hosts run with: a claim's expiry minus it is when it was taken.
    claim_ttl_ms: i64,
    args: &'static [&'static str],
}

const TUNED: Timings = Timings {
    name: "tuned",
    expiry: Duration::from_millis(800),
    claim_ttl_ms: 2_000,
    args: &[
        "--registry-heartbeat",
        "200ms",
        "--registry-expiry",
        "800ms",
        "--registry-retention",
        "1s",
        "--reconcile-interval",
        "100ms",
        "--claim-ttl",
        "2s",
        "--fleet-interval",
        "150ms",
        "--fleet-leader-ttl",
        "600ms",
        "--fleet-assignment-ttl",
        "2s",
        "--pg-idle-transaction-timeout",
        "1s",
    ],
};

const OPERATOR: Timings = Timings {
    name: "operator",
    expiry: Duration::from_secs(3),
    claim_ttl_ms: 30_000,
    args: &["--registry-heartbeat", "1s", "--registry-expiry", "3s"],
};

fn timings() -> &'static Timings {
    match std::env::var("FAILOVER_TIMINGS").as_deref() {
        Ok("operator") => &OPERATOR,
        _ => &TUNED,
    }
}

fn host(dir: &std::path::Path, name: &str, url: &str) -> Serve {
    let data_dir = format!(".hostd-{name}");
    let mut args = vec![
        "--store",
        url,
        "--credentials-file",
        "credentials",
        "--data-dir",
        &data_dir,
        "--host-id",
        name,
    ];
    args.extend_from_slice(timings().args);
    Serve::start(dir, name, &args)
}

async fn admit(
    store: &Store,
    history: &Recorder,
    s: &SessionRecord,
    id: &str,
    body: CommandBodyV1,
) -> CommandRecord {
    let command = CommandId::new(id).unwrap();
    history.invoke(&s.session, &command, body.kind(), None);
    let rec = store
        .admit(NewCommand {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            command: CommandId::new(id).unwrap(),
            kind: body.kind(),
            body: CommandBody::Inline(encode_command_body(&body)),
            principal: None,
            metadata: None,
            apply_within: Duration::from_secs(600),
            trace: None,
        })
        .await
        .unwrap();
    history.admitted(&s.session, &rec.command, rec.accepted_order);
    rec
}

async fn holders(store: &Store, ss: &[SessionRecord]) -> HashMap<SessionId, Option<HostId>> {
    let now = store.now_ms().await.unwrap();
    let mut out = HashMap::new();
    for s in ss {
        let l = store.residency(&s.tenant, &s.session).await.unwrap();
        out.insert(
            s.session.clone(),
            l.filter(|l| l.is_live(now)).and_then(|l| l.host),
        );
    }
    out
}

/// A command's lifecycle after the kill, in store milliseconds since the kill.
struct Phases {
    claimed: Option<i64>,
    attempted: Option<i64>,
    settled: Option<i64>,
}

impl Phases {
    fn of(rec: &CommandRecord, killed_ms: i64) -> Phases {
        Phases {
            claimed: rec
                .claim
                .as_ref()
                .map(|c| c.expires_at_ms - timings().claim_ttl_ms - killed_ms),
            attempted: rec.attempt.as_ref().map(|a| a.begun_at_ms - killed_ms),
            settled: rec.settled_at_ms.map(|t| t - killed_ms),
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    if std::env::var("FAILOVER_CASE").is_ok_and(|v| v == "partition") {
        return partition::run().await;
    }
    let Some(db) = FreshDatabase::create("failover_latency").await else {
        eprintln!("HOST_TEST_DATABASE_URL is unset");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_, digest) = hostlink::auth::mint_credential();
    std::fs::write(dir.join("credentials"), format!("acme {digest}\n")).unwrap();
    let mut hosts: HashMap<String, Serve> = HashMap::new();
    for n in ["lat-0", "lat-1", "lat-2"] {
        hosts.insert(n.into(), host(dir, n, &db.url));
    }
    let store = Store::open(StoreOptions::new(db.url.clone()))
        .await
        .unwrap();
    let history = Recorder::new(None);
    let mut ss = Vec::new();
    for i in 0..SESSIONS {
        let s = store
            .create_session(NewSession {
                tenant: TenantId::new("acme").unwrap(),
                session: SessionId::new(format!("lat-{i}")).unwrap(),
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
        admit(
            &store,
            &history,
            &s,
            "create",
            CommandBodyV1::Create { text: None },
        )
        .await;
        ss.push(s);
    }
    // `FAILOVER_SIGNAL=stop` freezes the victim (SIGSTOP) instead of killing it.
    let frozen = std::env::var("FAILOVER_SIGNAL").is_ok_and(|v| v == "stop");
    let how = if frozen { "SIGSTOP" } else { "kill -9" };
    let mut samples = Vec::new();
    let mut phases: Vec<Phases> = Vec::new();
    for round in 0..KILLS {
        // Every session resident: one input each (an idle session with no work is left
        // where it is, even when its Host lost it), applied before the kill.
        let mut warm = Vec::new();
        for s in &ss {
            let c = admit(
                &store,
                &history,
                s,
                &format!("w{round}"),
                CommandBodyV1::Input {
                    text: format!("warm {round}"),
                },
            )
            .await;
            warm.push((s.clone(), c.command));
        }
        for (s, c) in &warm {
            while !store
                .command(&s.tenant, &s.session, c)
                .await
                .unwrap()
                .state
                .is_terminal()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let held = holders(&store, &ss).await;
        let mut count: HashMap<String, usize> = HashMap::new();
        for h in held.values().flatten() {
            *count.entry(h.to_string()).or_default() += 1;
        }
        let victim = count
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(h, _)| h)
            .unwrap();
        let Some(serve) = hosts.remove(&victim) else {
            eprintln!("round {round}: {victim} is not one of ours");
            break;
        };
        let killed_at = Instant::now();
        history.fault(
            if frozen { "freeze" } else { "kill" },
            format!("{victim} (pid {})", serve.pid()),
        );
        let frozen_victim = if frozen {
            serve.freeze();
            Some(serve)
        } else {
            let _ = serve.kill_dead();
            None
        };
        // The store's clock at the kill: the claim and attempt times below are on it.
        let killed_ms = store.now_ms().await.unwrap();
        let mut waiting = Vec::new();
        for s in ss
            .iter()
            .filter(|s| held[&s.session].as_ref().map(|h| h.as_str()) == Some(victim.as_str()))
        {
            let c = admit(
                &store,
                &history,
                s,
                &format!("r{round}"),
                CommandBodyV1::Input {
                    text: format!("round {round}"),
                },
            )
            .await;
            waiting.push((s.clone(), c.command));
        }
        for (s, c) in &waiting {
            loop {
                let rec = store.command(&s.tenant, &s.session, c).await.unwrap();
                if rec.state.is_terminal() {
                    samples.push(killed_at.elapsed());
                    phases.push(Phases::of(&rec, killed_ms));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let worst = samples[samples.len() - waiting.len()..]
            .iter()
            .max()
            .copied();
        println!(
            "round {round:>2}: killed {victim} holding {} sessions; last applied after {:?}",
            waiting.len(),
            worst.unwrap_or_default()
        );
        // A new id each time (the three first were lat-0..2).
        let name = format!("lat-{}", round + 3);
        if let Some(serve) = frozen_victim {
            // Its sessions moved while it was frozen; it is not thawed (the thaw is the
            // fleet test's business), only replaced.
            let _ = serve.kill_dead();
        }
        hosts.insert(name.clone(), host(dir, &name, &db.url));
    }
    samples.sort();
    let bound = timings().expiry + Duration::from_secs(1);
    println!(
        "failover ({} timings), {how} to applied on a survivor with no client action, {} commands over {KILLS} kills: p50 {:?}  p99 {:?}  max {:?}  bound (registry expiry + 1 s) {:?}  p99/bound {:.2}",
        timings().name,
        samples.len(),
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        samples.last().copied().unwrap_or_default(),
        bound,
        percentile(&samples, 0.99).as_secs_f64() / bound.as_secs_f64()
    );
    // Where the time goes, from the store's own timestamps: until the survivor's consumer
    // claimed the command (expiry, the reconciler's pass, the assignment, the attach), until
    // its attempt began, until it was settled.
    let phase = |name: &str, pick: fn(&Phases) -> Option<i64>| {
        let mut v: Vec<i64> = phases.iter().filter_map(pick).collect();
        v.sort_unstable();
        if v.is_empty() {
            return;
        }
        let at = |p: f64| v[(((v.len() - 1) as f64) * p).round() as usize];
        println!(
            "  kill -> {name:<9} p50 {:>5} ms  p99 {:>5} ms  max {:>5} ms",
            at(0.5),
            at(0.99),
            v[v.len() - 1]
        );
    };
    phase("claimed", |p| p.claimed);
    phase("attempted", |p| p.attempted);
    phase("settled", |p| p.settled);
    // Exactly once, from outside: every admitted command ended once, honestly, in order.
    let view = StoreView::read(&store, &ss).await.expect("the store reads");
    let report = check(&history.history(), &view);
    println!("{}", report.summary);
    for (_, h) in hosts.drain() {
        let _ = h.terminate();
    }
    store.close().await;
    db.drop_now().await;
    if !report.is_clean() {
        eprintln!("{report}");
        std::process::exit(1);
    }
}

/// `FAILOVER_CASE=partition`: three Hosts at the timings the issue measured a partition at
/// (heartbeat 500 ms, registry expiry 3 s, fleet reconciler every 300 ms), each reaching
/// PostgreSQL through a fault proxy of its own. For each of `PARTITIONS` rounds the Host holding the most sessions is cut
/// from PostgreSQL (a black hole: silence, nothing closed) while it keeps running; one input
/// is admitted on each of its sessions right after the cut, and the time from the cut until
/// each is applied under a successor is recorded. Then the cut heals and the Host rejoins
/// before the next round. Prints p50, p99 and max against registry expiry + 1 s, and how long
/// after each cut the cut Host's `/readyz` said `store_unreachable`; the exactly-once checker
/// judges the whole run.
mod partition {
    use super::*;
    use testkit::faultproxy::FaultProxy;

    const PARTITIONS: usize = 10;
    /// The registry expiry the issue measured a partition at (heartbeat 500 ms).
    const CUT_EXPIRY: Duration = Duration::from_secs(3);

    fn cut_host(dir: &std::path::Path, name: &str, url: &str) -> Serve {
        Serve::start(
            dir,
            name,
            &[
                "--store",
                url,
                "--credentials-file",
                "credentials",
                "--data-dir",
                &format!(".hostd-{name}"),
                "--host-id",
                name,
                "--registry-heartbeat",
                "500ms",
                "--registry-expiry",
                "3s",
                "--registry-retention",
                "30s",
                "--reconcile-interval",
                "200ms",
                "--claim-ttl",
                "3s",
                "--fleet-interval",
                "300ms",
                "--fleet-leader-ttl",
                "2s",
                "--fleet-assignment-ttl",
                "3s",
                "--pg-idle-transaction-timeout",
                "2s",
                "--pg-acquire-timeout",
                "2s",
            ],
        )
    }

    fn through(url: &str, addr: std::net::SocketAddr) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let user = authority
            .rsplit_once('@')
            .map(|(u, _)| format!("{u}@"))
            .unwrap_or_default();
        format!("{scheme}://{user}{addr}{tail}")
    }

    fn server(url: &str) -> std::net::SocketAddr {
        use std::net::ToSocketAddrs as _;
        let o: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
        let h = if o.get_host() == "localhost" {
            "127.0.0.1"
        } else {
            o.get_host()
        };
        (h, o.get_port()).to_socket_addrs().unwrap().next().unwrap()
    }

    pub async fn run() {
        let Some(db) = FreshDatabase::create("partition_latency").await else {
            eprintln!("HOST_TEST_DATABASE_URL is unset");
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (_, digest) = hostlink::auth::mint_credential();
        std::fs::write(dir.join("credentials"), format!("acme {digest}\n")).unwrap();
        let pg = server(&db.url);
        let mut hosts = Vec::new();
        for n in ["cut-0", "cut-1", "cut-2"] {
            let proxy = FaultProxy::start(pg).await.unwrap();
            let serve = cut_host(dir, n, &through(&db.url, proxy.addr()));
            hosts.push((n.to_owned(), serve, proxy));
        }
        let store = Store::open(StoreOptions::new(db.url.clone()))
            .await
            .unwrap();
        let history = Recorder::new(None);
        let mut ss = Vec::new();
        for i in 0..SESSIONS {
            let s = store
                .create_session(NewSession {
                    tenant: TenantId::new("acme").unwrap(),
                    session: SessionId::new(format!("cut-{i}")).unwrap(),
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
            admit(
                &store,
                &history,
                &s,
                "create",
                CommandBodyV1::Create { text: None },
            )
            .await;
            ss.push(s);
        }
        let mut samples = Vec::new();
        let mut unready = Vec::new();
        for round in 0..PARTITIONS {
            let mut warm = Vec::new();
            for s in &ss {
                let c = admit(
                    &store,
                    &history,
                    s,
                    &format!("w{round}"),
                    CommandBodyV1::Input {
                        text: format!("warm {round}"),
                    },
                )
                .await;
                warm.push((s.clone(), c.command));
            }
            for (s, c) in &warm {
                while !store
                    .command(&s.tenant, &s.session, c)
                    .await
                    .unwrap()
                    .state
                    .is_terminal()
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let held = holders(&store, &ss).await;
            let mut count: HashMap<String, usize> = HashMap::new();
            for h in held.values().flatten() {
                *count.entry(h.to_string()).or_default() += 1;
            }
            let victim = count.into_iter().max_by_key(|(_, n)| *n).map(|(h, _)| h);
            let Some(v) = victim.and_then(|v| hosts.iter().position(|h| h.0 == v)) else {
                eprintln!("round {round}: no session is held");
                break;
            };
            let (name, serve, proxy) = &hosts[v];
            history.fault("partition", format!("{name} cut from PostgreSQL"));
            proxy.handle().black_hole();
            let cut = Instant::now();
            let mut waiting = Vec::new();
            for s in ss
                .iter()
                .filter(|s| held[&s.session].as_ref().map(|h| h.as_str()) == Some(name.as_str()))
            {
                let c = admit(
                    &store,
                    &history,
                    s,
                    &format!("r{round}"),
                    CommandBodyV1::Input {
                        text: format!("round {round}"),
                    },
                )
                .await;
                waiting.push((s.clone(), c.command));
            }
            let port = serve.port;
            let readyz = tokio::spawn(async move {
                loop {
                    let answer = tokio::task::spawn_blocking(move || {
                        testkit::process::http_get(port, "/readyz")
                    })
                    .await
                    .ok()
                    .flatten();
                    if answer.is_some_and(|(code, body)| {
                        code == 503 && body.contains("store_unreachable")
                    }) {
                        return cut.elapsed();
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
            for (s, c) in &waiting {
                loop {
                    let rec = store.command(&s.tenant, &s.session, c).await.unwrap();
                    if rec.state.is_terminal() {
                        samples.push(cut.elapsed());
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let said = readyz.await.unwrap();
            unready.push(said);
            println!(
                "round {round:>2}: cut {name} holding {} sessions; /readyz 503 after {said:?}; last applied after {:?}",
                waiting.len(),
                samples[samples.len() - waiting.len()..]
                    .iter()
                    .max()
                    .copied()
                    .unwrap_or_default()
            );
            proxy.handle().heal();
            history.fault("heal", format!("{name} reaches PostgreSQL again"));
            while !matches!(serve.readyz(), Some((200, _))) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        samples.sort();
        unready.sort();
        let bound = CUT_EXPIRY + Duration::from_secs(1);
        println!(
            "failover, cut from PostgreSQL to applied under a successor with no client action, {} commands over {PARTITIONS} cuts: p50 {:?}  p99 {:?}  max {:?}  bound (registry expiry + 1 s) {:?}  p99/bound {:.2}",
            samples.len(),
            percentile(&samples, 0.5),
            percentile(&samples, 0.99),
            samples.last().copied().unwrap_or_default(),
            bound,
            percentile(&samples, 0.99).as_secs_f64() / bound.as_secs_f64()
        );
        println!(
            "  cut -> /readyz store_unreachable p50 {:?}  max {:?}  (registry expiry {CUT_EXPIRY:?})",
            percentile(&unready, 0.5),
            unready.last().copied().unwrap_or_default()
        );
        let view = StoreView::read(&store, &ss).await.expect("the store reads");
        let report = check(&history.history(), &view);
        println!("{}", report.summary);
        for (_, h, p) in hosts {
            let _ = h.terminate();
            p.shutdown().await;
        }
        store.close().await;
        db.drop_now().await;
        if !report.is_clean() {
            eprintln!("{report}");
            std::process::exit(1);
        }
    }
}
