//! `cargo bench -p system-tests --bench serve_soak [-- sqlite|postgres]`
//!
//! The soak an operator runs, from outside: a real `hostd serve` (the release build, the
//! scripted agent, a short warm TTL) driven by a controller over HostLink, as `hostd session
//! send` would drive it, while the bench samples the server's resident set, descriptors and
//! threads from `/proc/<pid>`. Where `cargo bench -p host --bench soak` isolates the Host in
//! one process, this one includes everything a message crosses in production: the WebSocket
//! link a placement opens, the bind, the delivery, the live feed and `/metrics`.
//!
//! 1. **restores with a message**: a fixed set of sessions, each sent one message per round;
//!    every message finds its session warm-released and restores it (the Host's own
//!    `host_attach_seconds_count{mode="restore"}` is the x axis);
//! 2. **new sessions**: sessions never seen before, each created with a first message,
//!    placed, applied and warm-released.
//!
//! After every round, once the server holds no session resident, the bench samples. It
//! prints the least-squares slope of RSS per restore and per distinct session (R², and over
//! the second half alone), beside the baseline RSS measured after a warm-up in the same run.
//! Goal (issue 21): < 100 bytes per distinct session, and growth per restore that levels off;
//! each message in phase 1 also grows its conversation by a turn, which a resident session
//! holds (see `docs/decisions/2026-12-01-soak-growth-levels-off.md`).
//!
//! `HOST_SERVE_SOAK_RESTORES` (default 3,200: about the 20-minute soak),
//! `HOST_SERVE_SOAK_SESSIONS` (default 1,600 new sessions) and `HOST_SERVE_SOAK_SET` (the
//! fixed set and the round size, default 16) size it. PostgreSQL runs on a fresh database of
//! its own when `HOST_TEST_DATABASE_URL` is set.

use std::path::Path;
use std::time::{Duration, Instant};

use controller::Controller;
use sessionstore::wire::CommandBodyV1;
use sessionstore::{AgentId, CommandId, CompatibilityId, SessionId, Store, StoreOptions, TenantId};
use testkit::bench::{Held, env_usize, held, least_squares, load_average, metric_value};
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, http_get, tenant_credentials};

const WARM_TTL: &str = "300ms";
const WARM_UP_ROUNDS: usize = 4;

/// The server's own counts: restores so far, and sessions resident or on their way.
fn counts(port: u16) -> (f64, f64) {
    let text = http_get(port, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let restores =
        metric_value(&text, "host_attach_seconds_count{mode=\"restore\"}").unwrap_or(0.0);
    let held: f64 = ["attaching", "resident", "releasing"]
        .iter()
        .filter_map(|s| metric_value(&text, &format!("host_sessions{{state=\"{s}\"}}")))
        .sum();
    (restores, held)
}

async fn create(c: &Controller, session: &SessionId) {
    let (_, create) = c
        .create_session(
            session.clone(),
            AgentId::new("assistant").expect("agent"),
            CompatibilityId::new("hostd-scripted-1").expect("build"),
            Some("hello".into()),
            CommandId::new(format!("create-{session}")).expect("command id"),
        )
        .await
        .expect("the session is created");
    let placed = c.place(session).await.expect("the session is placed");
    let _ = c.deliver(&placed, &create.command).await;
    applied(c, session, &create.command).await;
}

async fn send(c: &Controller, session: &SessionId, label: &str) {
    let command = CommandId::new(format!("{label}-{session}")).expect("command id");
    c.admit(
        session,
        command.clone(),
        CommandBodyV1::Input {
            text: "hello".into(),
        },
    )
    .await
    .expect("admitted");
    let placed = c.place(session).await.expect("the session is placed");
    let _ = c.deliver(&placed, &command).await;
    applied(c, session, &command).await;
}

async fn applied(c: &Controller, session: &SessionId, command: &CommandId) {
    let done = c
        .wait_terminal(session, command, Duration::from_secs(60))
        .await
        .expect("the store answers")
        .unwrap_or_else(|| panic!("{command} on {session} not terminal after 60 s"));
    assert_eq!(
        done.outcome,
        Some(sessionstore::Outcome::Applied),
        "{command} on {session}: {done:?}"
    );
}

/// Waits until the server holds no session (every one warm-released).
async fn released(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while counts(port).1 > 0.0 {
        assert!(
            Instant::now() < deadline,
            "sessions still resident after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Default)]
struct Phase {
    points: Vec<(f64, Held)>,
}

impl Phase {
    fn report(&self, backend: &str, per: &str, baseline: &Held) {
        let series = |f: &dyn Fn(&Held) -> f64, from: usize| -> (f64, f64) {
            let pts: Vec<(f64, f64)> = self.points[from..]
                .iter()
                .map(|(x, h)| (*x, f(h)))
                .collect();
            least_squares(&pts)
        };
        let (rss, r2) = series(&|h| h.rss, 0);
        let (late, _) = series(&|h| h.rss, self.points.len() / 2);
        let (fds, _) = series(&|h| h.fds, 0);
        let (threads, _) = series(&|h| h.threads, 0);
        let work =
            self.points.last().map_or(0.0, |p| p.0) - self.points.first().map_or(0.0, |p| p.0);
        let lo = self
            .points
            .iter()
            .map(|p| p.1.rss)
            .fold(f64::INFINITY, f64::min);
        let hi = self
            .points
            .iter()
            .map(|p| p.1.rss)
            .fold(f64::NEG_INFINITY, f64::max);
        println!(
            "hostd serve ({backend}): {rss:>6.0} bytes RSS per {per} (R² {r2:.2}; second half {late:.0}) over {work:.0} {per}s; the fit grows {:.2}% of the baseline RSS {:.1} MB (seen {:.1}–{:.1} MB)",
            100.0 * rss * work / baseline.rss,
            baseline.rss / 1e6,
            lo / 1e6,
            hi / 1e6,
        );
        println!(
            "hostd serve ({backend}): descriptors {fds:+.5} per {per} (baseline {:.0}), threads {threads:+.5} per {per} (baseline {:.0})",
            baseline.fds, baseline.threads
        );
    }
}

/// `store`: a PostgreSQL URL, or `None` for `hostd serve`'s own SQLite store in its data
/// directory (the zero-set-up default, with its local tenant).
async fn soak(backend: &str, dir: &Path, store: Option<&str>) {
    let restores = env_usize("HOST_SERVE_SOAK_RESTORES", 3200);
    let fresh = env_usize("HOST_SERVE_SOAK_SESSIONS", 1600);
    let k = env_usize("HOST_SERVE_SOAK_SET", 16).max(1);
    let mut args: Vec<String> = ["--data-dir", ".hostd", "--warm-ttl", WARM_TTL]
        .map(String::from)
        .to_vec();
    // PostgreSQL: a tenant of the soak's own. SQLite: the data folder's local tenant.
    let remote = store.map(|url| {
        let (token, credentials) = tenant_credentials(dir, "soak");
        args.extend([
            "--store".into(),
            url.to_owned(),
            "--credentials-file".into(),
            credentials.display().to_string(),
        ]);
        (token, url.to_owned())
    });
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let serve = Serve::start(dir, &format!("serve-soak-{backend}"), &args);
    let (pid, port) = (serve.pid(), serve.port);
    let (tenant, token, url) = match remote {
        Some((token, url)) => ("soak", token, url),
        None => (
            "local",
            std::fs::read_to_string(dir.join(".hostd").join("local.token"))
                .expect("hostd serve wrote the local token")
                .trim()
                .to_owned(),
            format!("sqlite://{}", dir.join(".hostd").join("host.db").display()),
        ),
    };
    let store = Store::open(StoreOptions::new(url))
        .await
        .expect("the store opens");
    let c = Controller::new(store.clone(), TenantId::new(tenant).expect("tenant"), token);
    let started = Instant::now();
    let fixed: Vec<SessionId> = (0..k)
        .map(|i| SessionId::new(format!("fixed-{i}")).expect("session id"))
        .collect();
    futures::future::join_all(fixed.iter().map(|s| create(&c, s))).await;
    released(port).await;
    let mut batch_no = 0;
    let mut new_batch = || {
        batch_no += 1;
        (0..k)
            .map(|i| SessionId::new(format!("new-{batch_no}-{i}")).expect("session id"))
            .collect::<Vec<_>>()
    };
    for w in 0..WARM_UP_ROUNDS {
        let label = format!("warm{w}");
        futures::future::join_all(fixed.iter().map(|s| send(&c, s, &label))).await;
        released(port).await;
        let batch = new_batch();
        futures::future::join_all(batch.iter().map(|s| create(&c, s))).await;
        released(port).await;
    }
    let baseline = held(Some(pid));
    // 1. Restores, each applying a message.
    let mut busy = Phase::default();
    let first = counts(port).0;
    busy.points.push((0.0, baseline));
    let mut round = 0;
    loop {
        let done = counts(port).0 - first;
        if done >= restores as f64 {
            break;
        }
        let label = format!("r{round}");
        futures::future::join_all(fixed.iter().map(|s| send(&c, s, &label))).await;
        released(port).await;
        round += 1;
        busy.points.push((counts(port).0 - first, held(Some(pid))));
    }
    // 2. New sessions.
    let mut sessions = Phase::default();
    sessions.points.push((0.0, held(Some(pid))));
    let mut made = 0;
    while made < fresh {
        let batch = new_batch();
        futures::future::join_all(batch.iter().map(|s| create(&c, s))).await;
        released(port).await;
        made += batch.len();
        sessions.points.push((made as f64, held(Some(pid))));
    }
    println!(
        "hostd serve ({backend}): {:.0} restores with a message ({k} sessions), {made} new sessions, in {:.0} s",
        counts(port).0 - first,
        started.elapsed().as_secs_f64()
    );
    busy.report(backend, "restore", &baseline);
    sessions.report(backend, "distinct session", &baseline);
    store.close().await;
    let (status, log) = serve.terminate();
    assert!(status.success(), "hostd serve exited {status}:\n{log}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let only = |b: &str| {
        let named: Vec<&String> = args
            .iter()
            .filter(|a| *a == "sqlite" || *a == "postgres")
            .collect();
        named.is_empty() || named.iter().any(|a| *a == b)
    };
    println!("serve soak: load average {}", load_average());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if only("sqlite") {
        let tmp = tempfile::tempdir().expect("tempdir");
        rt.block_on(soak("sqlite", tmp.path(), None));
        println!("load average {}", load_average());
    }
    if only("postgres") {
        rt.block_on(async {
            match FreshDatabase::create("serve_soak").await {
                Some(db) => {
                    let tmp = tempfile::tempdir().expect("tempdir");
                    soak("postgres", tmp.path(), Some(&db.url)).await;
                    db.drop_now().await;
                    println!("load average {}", load_average());
                }
                None => {
                    println!("hostd serve (postgres): skipped (HOST_TEST_DATABASE_URL is unset)")
                }
            }
        });
    }
}
