//! `cargo bench -p system-tests --bench conversation_memory`
//!
//! What a long conversation costs a real `hostd serve` (SQLite, the scripted agent): the
//! server's resident set (VmRSS of the child process) with one resident session after 10 short
//! turns against after `HOST_CONVERSATION_TURNS` (default 10,000), the turns driven by a
//! controller as a client would (admit an input, wake the Host, wait until the turn is
//! journaled, then the next). Also the RSS at the halfway point, so the growth per turn of each
//! half shows whether it levels off (the first half holds the conversation window and SQLite's
//! page caches filling to their bound). The baseline is the same server with the session
//! created and no turn yet, measured in the same run. Goal: after the long run at most 2x the
//! memory after 10 turns.

use std::time::{Duration, Instant};

use controller::{Controller, Placed};
use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    AgentId, CommandId, CompatibilityId, RuntimeSessionId, SessionId, Store, StoreOptions, TenantId,
};
use testkit::bench::{Held, held, load_average};
use testkit::process::Serve;

const DEFAULT_TURNS: usize = 10_000;
const SHORT_TURNS: usize = 10;
/// A plain turn journals its application, `user_message`, `turn_started`, `assistant_message`
/// and `turn_done`.
const RECORDS_PER_TURN: u64 = 5;
const TURN_BOUND: Duration = Duration::from_secs(30);

/// Waits until the server's RSS stops moving (two readings 1 s apart within 64 KiB), at most
/// 20 s, and returns the last reading.
fn settled(pid: u32) -> Held {
    let mut last = held(Some(pid));
    for _ in 0..20 {
        std::thread::sleep(Duration::from_secs(1));
        let now = held(Some(pid));
        if (now.rss - last.rss).abs() < 64.0 * 1024.0 {
            return now;
        }
        last = now;
    }
    last
}

struct Talk {
    c: Controller,
    store: Store,
    tenant: TenantId,
    session: SessionId,
    rs: RuntimeSessionId,
    placed: Placed,
    next: usize,
}

impl Talk {
    async fn tip(&self) -> u64 {
        self.store
            .journal_tip(&self.tenant, self.rs)
            .await
            .expect("the journal tip")
    }

    /// `n` turns, each waited for.
    async fn turns(&mut self, n: usize) {
        for _ in 0..n {
            let before = self.tip().await;
            let command = CommandId::new(format!("in-{}", self.next)).expect("command id");
            let text = format!("hello {}", self.next);
            self.next += 1;
            self.c
                .admit(
                    &self.session,
                    command.clone(),
                    CommandBodyV1::Input { text },
                )
                .await
                .expect("admit");
            self.c
                .deliver(&self.placed, &command)
                .await
                .expect("the input is delivered");
            let deadline = Instant::now() + TURN_BOUND;
            while self.tip().await < before + RECORDS_PER_TURN {
                assert!(Instant::now() < deadline, "a turn did not finish");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

fn main() {
    let n: usize = std::env::var("HOST_CONVERSATION_TURNS")
        .ok()
        .map(|v| {
            v.parse()
                .expect("HOST_CONVERSATION_TURNS must be a whole number")
        })
        .unwrap_or(DEFAULT_TURNS);
    assert!(
        n >= 4 * SHORT_TURNS,
        "HOST_CONVERSATION_TURNS is at least 40"
    );
    println!(
        "conversation memory: {n} turns; load average {}",
        load_average()
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let serve = Serve::start(
        dir,
        "conversation-memory",
        &["--data-dir", ".hostd", "--warm-ttl", "1h"],
    );
    let pid = serve.pid();
    let token = std::fs::read_to_string(dir.join(".hostd").join("local.token"))
        .expect("hostd serve wrote the local token");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let url = format!("sqlite://{}", dir.join(".hostd").join("host.db").display());
    let (readings, took) = rt.block_on(async {
        let store = Store::open(StoreOptions::new(url))
            .await
            .expect("the store opens");
        let tenant = TenantId::new("local").expect("tenant");
        let c = Controller::new(store.clone(), tenant.clone(), token.trim());
        let session = SessionId::new("long").expect("session id");
        let (record, create) = c
            .create_session(
                session.clone(),
                AgentId::new("assistant").expect("agent"),
                CompatibilityId::new("hostd-scripted-1").expect("build"),
                None,
                CommandId::new("create-long").expect("command id"),
            )
            .await
            .expect("the session is created");
        let placed = c.place(&session).await.expect("the session is placed");
        // Bound, so each delivery wakes the session's consumer at once (the publications are
        // read and dropped, as a client would read them).
        let mut feed = c
            .bind_and_stream(&placed, false)
            .await
            .expect("the link binds the session");
        tokio::spawn(async move { while feed.recv().await.is_some() {} });
        c.deliver(&placed, &create.command)
            .await
            .expect("the create is delivered");
        c.wait_terminal(&session, &create.command, TURN_BOUND)
            .await
            .expect("the create settles")
            .expect("the create is applied in time");
        let mut talk = Talk {
            c,
            store: store.clone(),
            tenant,
            session,
            rs: record.binding.runtime_session_id,
            placed,
            next: 0,
        };
        let baseline = settled(pid);
        let started = Instant::now();
        talk.turns(SHORT_TURNS).await;
        let short = settled(pid);
        talk.turns(n / 2 - SHORT_TURNS).await;
        let half = settled(pid);
        talk.turns(n - n / 2).await;
        let long = settled(pid);
        let took = started.elapsed();
        store.close().await;
        ([baseline, short, half, long], took)
    });
    let [baseline, short, half, long] = readings;
    let mib = |b: f64| b / (1024.0 * 1024.0);
    println!(
        "hostd serve (sqlite): one resident session, RSS after {n} turns {:.1} MiB | after {SHORT_TURNS} turns {:.1} MiB | ratio {:.3}x (goal ≤ 2x); with the session and no turn {:.1} MiB; {n} turns in {:.0} s",
        mib(long.rss),
        mib(short.rss),
        long.rss / short.rss,
        mib(baseline.rss),
        took.as_secs_f64(),
    );
    println!(
        "hostd serve (sqlite): RSS growth per turn: turns {SHORT_TURNS}–{} {:.1} B; turns {}–{n} {:.1} B; descriptors {} → {}, threads {} → {}; load average {}",
        n / 2,
        (half.rss - short.rss) / (n / 2 - SHORT_TURNS) as f64,
        n / 2,
        (long.rss - half.rss) / (n - n / 2) as f64,
        short.fds,
        long.fds,
        short.threads,
        long.threads,
        load_average()
    );
    let (status, log) = serve.terminate();
    assert!(status.success(), "hostd serve exited {status}:\n{log}");
}
