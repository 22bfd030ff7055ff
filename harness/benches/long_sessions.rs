//! `cargo bench -p harness --bench long_sessions [-- sqlite|postgres]`
//!
//! How a session's cost follows its age, on each backend (SQLite in a temporary directory;
//! PostgreSQL in a schema of its own when `HOST_TEST_DATABASE_URL` is set), each figure beside
//! its same-run baseline, with the load average:
//!
//! 1. Restore by history length: `launch_session(Restore)` of a session whose journal holds
//!    `LONG_RECORDS` (default 100,000) records, against one of `SHORT_RECORDS` (100), both
//!    after a warm release (so each has its release snapshot). Median of `RESTORE_RUNS`, each
//!    released again in between. The journals are written directly (plain turns: the
//!    application, `user_message`, `turn_started`, `assistant_message`, `turn_done`), then
//!    restored once without a snapshot — the whole fold, printed too — and released. Goal:
//!    the long restore within 2x the short one.
//! 2. Memory by conversation length: the anonymous resident set (heap and stacks) of this
//!    process holding one resident session, after `SHORT_TURNS` (10) real turns against after
//!    `LONG_TURNS` (default 10,000), the turns driven through the real command path (admit,
//!    claim, attempt, apply, settle), and once more after a release and restore. Measured
//!    first, in a fresh process per backend, so nothing measured before inflates or masks
//!    it. Goal: at most 2x. The growth per turn is printed for each half of the run: the first
//!    half holds the conversation window and the store's caches (SQLite's page caches, up to
//!    their configured 3 MiB) filling, the second half is what a session's age still costs.
//!
//! No figure is asserted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use department::{LaunchMode, LaunchRequest, RuntimeCommand};
use harness::events::{Cause, HarnessEvent};
use harness::model::ScriptedModel;
use harness::tool::ToolRegistry;
use harness::{AgentConfig, HarnessTarget, SessionHandle};
use sessionstore::testing::bench::{
    BenchDatabase, bench_postgres_url, chosen_backends, env_usize, held, load_average, median,
    runtime,
};
use sessionstore::testing::{begin_attempt, new_session, settle};
use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::*;
use uuid::Uuid;

const SHORT_RECORDS: usize = 100;
const RESTORE_RUNS: usize = 15;
const SHORT_TURNS: usize = 10;
/// Records per direct journal append while building a long journal.
const BUILD_BATCH_TURNS: usize = 200;
const WAIT: Duration = Duration::from_secs(120);
const COMPATIBILITY: &str = "bench-long-1";

struct Bench {
    backend: &'static str,
    store: Store,
    target: HarnessTarget,
    tenant: TenantId,
    residency: ResidencyEpoch,
    next: AtomicUsize,
}

impl Bench {
    fn new(backend: &'static str, store: Store) -> Bench {
        let tools = ToolRegistry::new(Vec::new()).expect("empty tool registry");
        let agent = AgentConfig::new(Arc::new(ScriptedModel::new()), tools);
        let target = HarnessTarget::new(
            store.clone(),
            agent,
            CompatibilityId::new(COMPATIBILITY).unwrap(),
        )
        .expect("harness target");
        Bench {
            backend,
            store,
            target,
            tenant: TenantId::new("bench").unwrap(),
            residency: ResidencyEpoch(1),
            next: AtomicUsize::new(0),
        }
    }

    fn unique(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    async fn launch(&self, s: &SessionRecord, mode: LaunchMode) -> SessionHandle {
        self.target
            .launch_session(LaunchRequest {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                agent: s.agent.clone(),
                binding: s.binding.clone(),
                mode,
                holder: self.unique("holder"),
            })
            .await
            .expect("launch")
    }

    async fn created(&self) -> SessionRecord {
        let s = new_session(
            &self.store,
            self.tenant.as_str(),
            &self.unique("s"),
            COMPATIBILITY,
        )
        .await;
        let h = self.launch(&s, LaunchMode::Create).await;
        h.release().await.expect("release");
        s
    }

    /// Appends plain turns straight to the journal until it holds at least `records`.
    async fn build_journal(&self, s: &SessionRecord, records: usize) {
        let rs = s.binding.runtime_session_id;
        let mut lease = self
            .store
            .journal_acquire(&self.tenant, rs, "bench-builder", Duration::from_secs(600))
            .await
            .expect("acquire");
        while (lease.tip as usize) < records {
            let turns = (records - lease.tip as usize)
                .div_ceil(5)
                .min(BUILD_BATCH_TURNS);
            let mut entries = Vec::with_capacity(turns * 5);
            for _ in 0..turns {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let command = CommandId::new(format!("c-{n}")).unwrap();
                let rc = RuntimeCommandId::mint();
                let input = EventId::new(Uuid::now_v7().to_string()).unwrap();
                let turn_id = Uuid::now_v7().to_string();
                let event = |ev: HarnessEvent, cause| JournalEntry::Event {
                    event: EventId::new(Uuid::now_v7().to_string()).unwrap(),
                    public_body: ev.encode(),
                    private_body: None,
                    cause,
                };
                entries.push(JournalEntry::Application {
                    identity: CommandIdentity {
                        command: command.clone(),
                        runtime_command: rc,
                        kind: CommandKind::Input,
                    },
                    attempt: AttemptId::mint(),
                    attempt_epoch: lease.epoch,
                    outcome: ApplicationOutcome::Applied,
                    detail: None,
                });
                entries.push(JournalEntry::Event {
                    event: input.clone(),
                    public_body: HarnessEvent::UserMessage {
                        text: format!("hello {n}"),
                        cause: Cause::command(command.to_string()),
                    }
                    .encode(),
                    private_body: None,
                    cause: Some(rc),
                });
                entries.push(event(
                    HarnessEvent::TurnStarted {
                        turn_id: turn_id.clone(),
                        input_event: input.to_string(),
                        cause: None,
                    },
                    None,
                ));
                entries.push(event(
                    HarnessEvent::AssistantMessage {
                        turn_id: turn_id.clone(),
                        step: 1,
                        text: format!("You said: hello {n}"),
                        tool_calls: Vec::new(),
                    },
                    None,
                ));
                entries.push(event(HarnessEvent::TurnDone { turn_id }, None));
            }
            lease.tip = self
                .store
                .journal_append(&lease, entries)
                .await
                .expect("append");
        }
        self.store.journal_release(&lease).await.expect("release");
    }

    /// One input through the real path; returns once its disposition is recorded.
    async fn send(&self, s: &SessionRecord, h: &SessionHandle, text: &str) {
        let body = CommandBodyV1::Input { text: text.into() };
        let rec = self
            .store
            .admit(NewCommand {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: CommandId::new(self.unique("c")).unwrap(),
                kind: body.kind(),
                body: CommandBody::Inline(encode_command_body(&body)),
                principal: None,
                metadata: None,
                apply_within: Duration::from_secs(3600),
                trace: None,
            })
            .await
            .expect("admit");
        let epoch = h.journal_epoch();
        let (applying, attempt) = begin_attempt(&self.store, &rec, self.residency, epoch)
            .await
            .expect("claim and begin attempt");
        h.apply(RuntimeCommand::for_attempt(&rec, attempt, epoch, body))
            .await
            .expect("apply");
        settle(&self.store, &applying, self.residency)
            .await
            .expect("settle");
    }

    async fn turns(&self, s: &SessionRecord, h: &SessionHandle, n: usize) {
        for i in 0..n {
            self.send(s, h, &format!("hi {i}")).await;
            if i % 50 == 49 {
                // Inputs are pipelined; let the turns catch up now and then.
                assert!(department::wait_idle(h, WAIT).await, "not idle");
            }
        }
        assert!(department::wait_idle(h, WAIT).await, "not idle");
    }

    /// Median restore time of `s` (each restored session released again).
    async fn restore_time(&self, s: &SessionRecord) -> Duration {
        let mut times = Vec::new();
        for _ in 0..RESTORE_RUNS {
            let t = Instant::now();
            let h = self.launch(s, LaunchMode::Restore).await;
            times.push(t.elapsed());
            h.release().await.expect("release");
        }
        median(times)
    }

    async fn restore_by_length(&self, long: usize) {
        let b = self.backend;
        let short_s = self.created().await;
        let long_s = self.created().await;
        let t = Instant::now();
        self.build_journal(&short_s, SHORT_RECORDS).await;
        self.build_journal(&long_s, long).await;
        println!(
            "{b}: journals of {SHORT_RECORDS} and {long} records written in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let mut first = Vec::new();
        for s in [&short_s, &long_s] {
            let t = Instant::now();
            let h = self.launch(s, LaunchMode::Restore).await;
            first.push(t.elapsed());
            h.release().await.expect("release");
        }
        let short = self.restore_time(&short_s).await;
        let long_t = self.restore_time(&long_s).await;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{b}: whole fold without a snapshot: {SHORT_RECORDS} records {:.2} ms, {long} records {:.1} ms",
            ms(first[0]),
            ms(first[1])
        );
        println!(
            "{b}: restore from the newest snapshot: {long} records {:.2} ms | {SHORT_RECORDS} records {:.2} ms | ratio {:.2}x (goal <= 2x)  [medians of {RESTORE_RUNS}; load {}]",
            ms(long_t),
            ms(short),
            long_t.as_secs_f64() / short.as_secs_f64(),
            load_average()
        );
        let counts = self.target.snapshot_counts();
        println!(
            "{b}: snapshots written {} (failed {}), restores from a snapshot {}, fallbacks {}",
            counts.written, counts.failed, counts.restored_from, counts.fell_back
        );
    }

    /// The anonymous resident set of this process (heap and stacks), in bytes, once
    /// background work settled.
    async fn anon() -> f64 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        held(None).anon
    }

    async fn memory_by_length(&self, long: usize) {
        let b = self.backend;
        let s = new_session(
            &self.store,
            self.tenant.as_str(),
            &self.unique("m"),
            COMPATIBILITY,
        )
        .await;
        let h = self.launch(&s, LaunchMode::Create).await;
        let start = Self::anon().await;
        let t = Instant::now();
        self.turns(&s, &h, SHORT_TURNS).await;
        let short = Self::anon().await;
        self.turns(&s, &h, long / 2 - SHORT_TURNS).await;
        let half = Self::anon().await;
        self.turns(&s, &h, long - long / 2).await;
        let long_rss = Self::anon().await;
        let took = t.elapsed();
        h.release().await.expect("release");
        let h = self.launch(&s, LaunchMode::Restore).await;
        assert!(department::wait_idle(&h, WAIT).await, "not idle");
        let restored = Self::anon().await;
        h.release().await.expect("release");
        let mib = |b: f64| b / (1024.0 * 1024.0);
        println!(
            "{b}: one resident session, anonymous RSS of the process: after {long} turns {:.2} MiB | after {SHORT_TURNS} turns {:.2} MiB | ratio {:.3}x (goal <= 2x)  [before any turn {:.2} MiB; restored after {long} turns {:.2} MiB; {long} turns in {:.0} s; load {}]",
            mib(long_rss),
            mib(short),
            long_rss / short,
            mib(start),
            mib(restored),
            took.as_secs_f64(),
            load_average()
        );
        println!(
            "{b}: growth per turn: from turn {SHORT_TURNS} to turn {} {:.1} B (the window and the store's caches filling); from turn {} to turn {long} {:.1} B",
            long / 2,
            (half - short) / (long / 2 - SHORT_TURNS) as f64,
            long / 2,
            (long_rss - half) / (long - long / 2) as f64
        );
    }
}

/// The argument that makes this binary one backend's child: `--child sqlite|postgres`.
const CHILD: &str = "--child";

/// One backend's run, in a fresh process so the memory figures start from a clean heap:
/// memory first, then restore.
fn child(backend: &str) {
    let rt = runtime();
    rt.block_on(async {
        match backend {
            "sqlite" => {
                let db = BenchDatabase::sqlite("store.db");
                let store = Store::open(db.options.clone()).await.expect("store");
                run("sqlite", store).await;
            }
            _ => {
                let Some(url) = bench_postgres_url() else {
                    return;
                };
                let db = BenchDatabase::postgres(&url, "bench_long");
                let store = Store::open(db.options.clone()).await.expect("store");
                run("postgres", store).await;
                db.finish().await;
            }
        }
    });
}

async fn run(backend: &'static str, store: Store) {
    let bench = Bench::new(backend, store);
    bench
        .memory_by_length(env_usize("LONG_TURNS", 10_000))
        .await;
    bench
        .restore_by_length(env_usize("LONG_RECORDS", 100_000))
        .await;
    bench.store.close().await;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(CHILD) {
        child(args.get(2).map_or("sqlite", String::as_str));
        return;
    }
    let chosen = chosen_backends();
    let start = Instant::now();
    println!("load at start: {}", load_average());
    let exe = std::env::current_exe().expect("the bench binary");
    for (backend, on) in [("sqlite", chosen.sqlite), ("postgres", chosen.postgres)] {
        if on {
            let status = std::process::Command::new(&exe)
                .arg(CHILD)
                .arg(backend)
                .status()
                .expect("the child runs");
            assert!(status.success(), "the {backend} run failed: {status}");
        }
    }
    println!("total: {:.1} s", start.elapsed().as_secs_f64());
}
