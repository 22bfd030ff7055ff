//! `cargo bench -p harness --bench runtime`
//!
//! For each backend (SQLite in a temporary directory always; PostgreSQL in its own schema
//! `bench_harness_<pid>` when `HOST_TEST_DATABASE_URL` is set), in one run, every figure next
//! to a raw baseline measured in the same run:
//!
//! 1. Turns/s of the scripted model with N concurrent sessions (N = 1, 16, 64), each sending
//!    plain inputs one after another through the real path (admit → claim → begin attempt →
//!    apply → settle → wait until the session is idle again, i.e. the turn's `turn_started`,
//!    `assistant_message` and `turn_done` are journaled). Baseline: one-entry
//!    `journal_append` calls on N concurrent journals, so the ratio says how many raw appends'
//!    time a turn takes. A plain turn journals 5 records (application, `user_message`,
//!    `turn_started`, `assistant_message`, `turn_done`) in at most 4 appends, and makes 4
//!    inbox writes (admit, claim, begin attempt, settle).
//! 2. Restore time of a session whose journal holds at least 1,000 events: `launch_session`
//!    with `LaunchMode::Restore` until it returns (median of several, released in between).
//!    Baseline: a plain read of the same rows through `journal_runtime_page` pages of the size
//!    the harness reads (1000). Also printed, to show where a restore's time goes: the lease
//!    acquisition alone (a durable write) and the read with every event body decoded.
//! 3. Memory per idle resident session, in a fresh child process (this binary re-run with
//!    `--memory-child`) so memory freed by the measurements above neither inflates nor masks
//!    it: the resident-set growth (`VmRSS`) over M idle sessions, per session, in cumulative
//!    rounds (each round's sessions stay resident). Baseline: M plain idle tokio tasks, each
//!    awaiting a bounded channel, measured the same way. Then all are released (the allocator
//!    keeps freed memory mapped, so RSS barely falls) and as many are relaunched, to show the
//!    released memory is reused rather than leaked.
//!
//! No timing is asserted; the goals (restore within 3x the plain read; under 64 KiB per idle
//! session) are printed beside the figures.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use department::{LaunchMode, LaunchRequest, RuntimeCommand};
use futures::StreamExt;
use harness::events::HarnessEvent;
use harness::model::ScriptedModel;
use harness::tool::ToolRegistry;
use harness::{AgentConfig, HarnessTarget, SessionHandle};
use sessionstore::testing::bench::{BenchDatabase, bench_postgres_url, held, median, runtime};
use sessionstore::testing::{begin_attempt, new_session, settle};
use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::*;
use uuid::Uuid;

/// (concurrent sessions, turns each) for the turn-rate runs.
const TURN_LOADS: [(usize, usize); 3] = [(1, 50), (16, 16), (64, 8)];
/// Raw appends per journal per turn the sessions make, to size the baseline run alike (a plain
/// turn journals 5 records in at most 4 appends).
const BASELINE_APPENDS_PER_TURN: usize = 4;
/// The restored session's journal holds at least this many events.
const RESTORE_EVENTS: usize = 1000;
/// Timed restores (and baseline reads); the median is printed.
const RESTORE_RUNS: usize = 15;
/// The page size the harness reads its journal with at restore.
const RESTORE_PAGE: usize = 1000;
/// Rounds of the memory measurement.
const MEMORY_ROUNDS: usize = 3;
/// How many launches or releases run at once while filling memory.
const LAUNCH_CONCURRENCY: usize = 16;
/// Pause before reading the resident set, so background work settles.
const SETTLE: Duration = Duration::from_millis(1000);
/// The longest a turn may take before the bench gives up.
const WAIT: Duration = Duration::from_secs(60);
const COMPATIBILITY: &str = "bench-harness-1";

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
        // The process id keeps the memory child's names apart from its parent's.
        format!(
            "{prefix}-{}-{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    async fn new_session(&self) -> SessionRecord {
        new_session(
            &self.store,
            self.tenant.as_str(),
            &self.unique("s"),
            COMPATIBILITY,
        )
        .await
    }

    async fn new_sessions(&self, n: usize) -> Vec<SessionRecord> {
        futures::stream::iter(0..n)
            .map(|_| self.new_session())
            .buffer_unordered(LAUNCH_CONCURRENCY)
            .collect()
            .await
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

    async fn launch_all(&self, sessions: &[SessionRecord]) -> Vec<SessionHandle> {
        futures::stream::iter(sessions)
            .map(|s| self.launch(s, LaunchMode::Create))
            // In order: handle i is session i's.
            .buffered(LAUNCH_CONCURRENCY)
            .collect()
            .await
    }

    async fn release_all(&self, handles: Vec<SessionHandle>) {
        futures::stream::iter(handles)
            .map(|h| async move { h.release().await.expect("release") })
            .buffer_unordered(LAUNCH_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
    }

    /// One input through the real path: admit → claim → begin attempt → apply → settle.
    /// Returns once the runtime recorded its disposition (the turn runs on).
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

    /// One whole turn: the input sent, then idle again (the turn is journaled).
    async fn turn(&self, s: &SessionRecord, h: &SessionHandle) {
        self.send(s, h, "hello").await;
        assert!(
            department::wait_idle(h, WAIT).await,
            "the session did not become idle"
        );
    }

    // ---- 1. turns/s against the journal append rate -------------------------------------

    /// The sum of the sessions' journal tips.
    async fn tips(&self, sessions: &[SessionRecord]) -> u64 {
        let mut sum = 0;
        for s in sessions {
            sum += self
                .store
                .journal_tip(&s.tenant, s.binding.runtime_session_id)
                .await
                .expect("tip");
        }
        sum
    }

    /// Turns per second, and journal records written per turn.
    async fn turn_rate(&self, sessions: usize, turns: usize) -> (f64, f64) {
        let records = self.new_sessions(sessions).await;
        let handles = self.launch_all(&records).await;
        let before = self.tips(&records).await;
        let start = Instant::now();
        futures::future::join_all(records.iter().zip(&handles).map(|(s, h)| async move {
            for _ in 0..turns {
                self.turn(s, h).await;
            }
        }))
        .await;
        let rate = (sessions * turns) as f64 / start.elapsed().as_secs_f64();
        let after = self.tips(&records).await;
        self.release_all(handles).await;
        (rate, (after - before) as f64 / (sessions * turns) as f64)
    }

    async fn append_rate(&self, journals: usize, appends: usize) -> f64 {
        let records = self.new_sessions(journals).await;
        let mut leases = Vec::new();
        for s in &records {
            leases.push(
                self.store
                    .journal_acquire(
                        &s.tenant,
                        s.binding.runtime_session_id,
                        "bench-raw",
                        Duration::from_secs(600),
                    )
                    .await
                    .expect("journal lease"),
            );
        }
        // A body the size of a scripted turn's assistant message.
        let body = HarnessEvent::AssistantMessage {
            turn_id: Uuid::now_v7().to_string(),
            step: 1,
            text: "You said: hello".into(),
            tool_calls: Vec::new(),
        }
        .encode();
        let start = Instant::now();
        let leases = futures::future::join_all(leases.into_iter().map(|mut lease| {
            let body = body.clone();
            async move {
                for _ in 0..appends {
                    let entry = JournalEntry::Event {
                        event: EventId::new(Uuid::now_v7().to_string()).unwrap(),
                        public_body: body.clone(),
                        private_body: None,
                        cause: None,
                    };
                    lease.tip = self
                        .store
                        .journal_append(&lease, vec![entry])
                        .await
                        .expect("append");
                }
                lease
            }
        }))
        .await;
        let rate = (journals * appends) as f64 / start.elapsed().as_secs_f64();
        for lease in &leases {
            self.store.journal_release(lease).await.expect("release");
        }
        rate
    }

    async fn turns(&self) {
        let b = self.backend;
        for (n, k) in TURN_LOADS {
            // Baseline first, then the turns.
            let appends = self.append_rate(n, k * BASELINE_APPENDS_PER_TURN).await;
            let (turns, records) = self.turn_rate(n, k).await;
            println!(
                "{b}: turns, {n:>2} sessions x {k:>2}: {turns:>7.1} turns/s ({records:.1} journal records/turn) | raw one-entry appends on {n:>2} journals: {appends:>8.1} appends/s | ratio turns/appends {:.3}: a turn takes the time of {:.1} raw appends",
                turns / appends,
                appends / turns
            );
        }
    }

    // ---- 2. restore against a plain read --------------------------------------------------

    /// A plain read of the whole journal in harness-sized pages: (records, events).
    async fn plain_read(&self, rs: RuntimeSessionId) -> (usize, usize) {
        let (mut records, mut events, mut after) = (0, 0, 0);
        loop {
            let page = self
                .store
                .journal_runtime_page(&self.tenant, rs, after, RESTORE_PAGE)
                .await
                .expect("page");
            records += page.len();
            events += page
                .iter()
                .filter(|r| matches!(r.kind, RecordKind::Event { .. }))
                .count();
            if let Some(last) = page.last() {
                after = last.seq;
            }
            if page.len() < RESTORE_PAGE {
                return (records, events);
            }
        }
    }

    /// The same read with every event body decoded (most of what the fold does).
    async fn read_and_decode(&self, rs: RuntimeSessionId) -> usize {
        let mut after = 0;
        let mut decoded = 0;
        loop {
            let page = self
                .store
                .journal_runtime_page(&self.tenant, rs, after, RESTORE_PAGE)
                .await
                .expect("page");
            for r in &page {
                if let RecordKind::Event { public_body, .. } = &r.kind {
                    HarnessEvent::decode(public_body).expect("decodes");
                    decoded += 1;
                }
                after = r.seq;
            }
            if page.len() < RESTORE_PAGE {
                return decoded;
            }
        }
    }

    async fn restore(&self) {
        let b = self.backend;
        let s = self.new_session().await;
        let rs = s.binding.runtime_session_id;
        let h = self.launch(&s, LaunchMode::Create).await;
        // session_started + 4 events per turn; the inputs are pipelined (each applied in turn,
        // the turns run behind them), then the session drains.
        let turns = (RESTORE_EVENTS - 1).div_ceil(4);
        let build = Instant::now();
        for _ in 0..turns {
            self.send(&s, &h, "hello").await;
        }
        assert!(
            department::wait_idle(&h, Duration::from_secs(300)).await,
            "the session did not drain"
        );
        h.release().await.expect("release");
        let build = build.elapsed();
        let (records, events) = self.plain_read(rs).await;
        println!(
            "{b}: restore: journal of {events} events ({records} records, {turns} turns) built in {:.1} s",
            build.as_secs_f64()
        );

        let (mut restore, mut read, mut decode, mut acquire) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..RESTORE_RUNS {
            let t = Instant::now();
            self.plain_read(rs).await;
            read.push(t.elapsed());

            let t = Instant::now();
            self.read_and_decode(rs).await;
            decode.push(t.elapsed());

            let t = Instant::now();
            let lease = self
                .store
                .journal_acquire(&self.tenant, rs, "bench-raw", Duration::from_secs(60))
                .await
                .expect("acquire");
            acquire.push(t.elapsed());
            self.store.journal_release(&lease).await.expect("release");

            let t = Instant::now();
            let h = self.launch(&s, LaunchMode::Restore).await;
            restore.push(t.elapsed());
            h.release().await.expect("release");
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (restore_min, read_min) = (min(&restore), min(&read));
        let (restore, read, decode, acquire) = (
            median(restore),
            median(read),
            median(decode),
            median(acquire),
        );
        println!(
            "{b}: restore of {events} events: {:>7.2} ms | raw plain read of the same rows: {:>7.2} ms | ratio {:.2}x (goal <= 3x)  [medians of {RESTORE_RUNS}; minima {:.2} / {:.2} ms = {:.2}x]",
            ms(restore),
            ms(read),
            restore.as_secs_f64() / read.as_secs_f64(),
            ms(restore_min),
            ms(read_min),
            restore_min.as_secs_f64() / read_min.as_secs_f64()
        );
        println!(
            "{b}: restore breakdown (medians): lease acquisition alone {:>6.2} ms; read + decode every event {:>6.2} ms; acquisition + read + decode = {:.2}x the plain read",
            ms(acquire),
            ms(decode),
            (acquire + decode).as_secs_f64() / read.as_secs_f64()
        );
    }

    // ---- 3. memory per idle resident session ----------------------------------------------

    /// Runs in a fresh child process (see `main`), so the resident set is not inflated or
    /// masked by memory the other measurements freed. Rounds are cumulative: every round's
    /// sessions stay resident, so after the first round the allocator has no free memory of
    /// ours left to hand out and each round's growth is what its sessions hold.
    async fn memory(&self, m: usize) {
        let b = self.backend;
        // The baseline tasks stay alive to the end, so their memory is never reused.
        let (baseline, _idle_tasks) = idle_tasks(m).await;
        println!(
            "{b}: memory baseline: {m} plain idle tokio tasks, each awaiting an mpsc(64) receiver: {baseline:>5.1} KiB/task"
        );
        let mut resident = Vec::new();
        let mut first_before = None;
        for round in 1..=MEMORY_ROUNDS {
            let sessions = self.new_sessions(m).await;
            tokio::time::sleep(SETTLE).await;
            let before = rss_kib();
            first_before.get_or_insert(before);
            let launch = Instant::now();
            let handles = self.launch_all(&sessions).await;
            let launch = launch.elapsed();
            tokio::time::sleep(SETTLE).await;
            let after = rss_kib();
            resident.extend(sessions.into_iter().zip(handles));
            let per = (after - before) / m as f64;
            println!(
                "{b}: memory round {round}: +{m} idle sessions (launched in {:.1} s, {} resident): {per:>6.1} KiB/session (goal < 64) | raw idle task {baseline:.1} KiB | ratio {:.1}x | RSS {before:.0} -> {after:.0} KiB",
                launch.as_secs_f64(),
                resident.len(),
                per / baseline,
            );
        }
        let total = resident.len();
        let first_before = first_before.unwrap_or_default();
        let peak = rss_kib();
        let (sessions, handles): (Vec<_>, Vec<_>) = resident.into_iter().unzip();
        self.release_all(handles).await;
        tokio::time::sleep(SETTLE).await;
        let released = rss_kib();
        println!(
            "{b}: memory after releasing all {total}: RSS {peak:.0} -> {released:.0} KiB, {:.1} KiB/session still counted in RSS (freed to the allocator, which keeps it mapped)",
            (released - first_before) / total as f64
        );
        // Reclaimed, not leaked: the same number of sessions relaunched (restored) fits into
        // the memory the released ones gave back.
        let before = rss_kib();
        let handles: Vec<SessionHandle> = futures::stream::iter(&sessions)
            .map(|s| self.launch(s, LaunchMode::Restore))
            .buffered(LAUNCH_CONCURRENCY)
            .collect()
            .await;
        tokio::time::sleep(SETTLE).await;
        let after = rss_kib();
        println!(
            "{b}: memory after relaunching {total} (restored) into the freed memory: RSS {before:.0} -> {after:.0} KiB, {:+.1} KiB/session (reused: the released sessions' memory was reclaimed)",
            (after - before) / total as f64
        );
        self.release_all(handles).await;
    }
}

/// Resident set size of this process, in KiB.
fn rss_kib() -> f64 {
    let rss = held(None).rss;
    assert!(rss.is_finite(), "VmRSS in /proc/self/status");
    rss / 1024.0
}

/// The raw baseline for memory: `m` idle tokio tasks, each awaiting a bounded channel. Returns
/// KiB per task and the tasks' senders (dropping them ends the tasks).
async fn idle_tasks(m: usize) -> (f64, Vec<tokio::sync::mpsc::Sender<u64>>) {
    tokio::time::sleep(SETTLE).await;
    let before = rss_kib();
    let mut senders = Vec::with_capacity(m);
    for _ in 0..m {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(64);
        senders.push(tx);
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
    }
    tokio::time::sleep(SETTLE).await;
    ((rss_kib() - before) / m as f64, senders)
}

fn min(v: &[Duration]) -> Duration {
    v.iter().copied().min().unwrap_or_default()
}

/// Sessions per memory round.
const MEMORY_SESSIONS: usize = 1000;
/// The argument that makes this binary the memory child: `--memory-child <url> [<pg schema>]`.
const MEMORY_CHILD: &str = "--memory-child";

/// Measures memory in a fresh process running this same binary against the same database.
fn memory_in_child(url: &str, schema: Option<&str>) {
    let exe = std::env::current_exe().expect("the bench binary");
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(MEMORY_CHILD).arg(url);
    if let Some(s) = schema {
        cmd.arg(s);
    }
    let status = cmd.status().expect("the memory child runs");
    assert!(status.success(), "the memory child failed: {status}");
}

async fn memory_child(url: String, schema: Option<String>) {
    let mut options = StoreOptions::new(url);
    let backend = match schema {
        Some(s) => {
            options.pg_schema = Some(s);
            options.pg_max_connections = 32;
            "postgres"
        }
        None => "sqlite",
    };
    let store = Store::open(options).await.expect("store");
    let bench = Bench::new(backend, store);
    bench.memory(MEMORY_SESSIONS).await;
    bench.store.close().await;
}

async fn bench_sqlite() {
    let db = BenchDatabase::sqlite("store.db");
    let store = Store::open(db.options.clone()).await.expect("store");
    let bench = Bench::new("sqlite", store);
    bench.turns().await;
    bench.restore().await;
    bench.store.close().await;
    memory_in_child(db.url(), None);
}

async fn bench_postgres(url: String) {
    let mut db = BenchDatabase::postgres(&url, "bench_harness");
    db.options.pg_max_connections = 32;
    let store = Store::open(db.options.clone()).await.expect("store");
    let bench = Bench::new("postgres", store);
    bench.turns().await;
    bench.restore().await;
    bench.store.close().await;
    memory_in_child(&url, db.schema());
    db.finish().await;
}

fn main() {
    let rt = runtime();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(MEMORY_CHILD) {
        let url = args.get(2).expect("a store url").clone();
        rt.block_on(memory_child(url, args.get(3).cloned()));
        return;
    }
    // `cargo bench` passes `--bench`; a filter argument is accepted and ignored.
    let start = Instant::now();
    rt.block_on(bench_sqlite());
    if let Some(url) = bench_postgres_url() {
        rt.block_on(bench_postgres(url));
    }
    println!("total: {:.1} s", start.elapsed().as_secs_f64());
}
