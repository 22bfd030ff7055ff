//! `cargo run -p system-tests --bin nemesis -- --hosts 3 --minutes 5 --seed N`: a fleet of
//! real `hostd serve` processes under a controller workload while a seeded nemesis injects
//! faults, then healed, settled and judged by the exactly-once checker (see `--help`).
//!
//! The program is `hostd` too: the Hosts and the `hostd session` clients it starts are this
//! same executable run with `testkit::process::AS_HOSTD` set (so `cargo run` needs to build
//! nothing else, and the Hosts are the very build under test). The run, in order: the fleet
//! and its proxies ([`fleet`]), the clients ([`workload`]), faults for `--minutes`
//! ([`schedule`]), then everything healed, the clients stopped, the fleet given `--settle` to
//! become ready and end every command, one last command per session, and the check.
#![forbid(unsafe_code)]

mod fleet;
mod options;
mod schedule;
mod workload;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use sessionstore::{SessionRecord, Store, StoreOptions};
use testkit::checker::{Report, StoreView, check};
use testkit::history::Recorder;

use crate::fleet::Fleet;
use crate::options::{Backend, Options};
use crate::schedule::Schedule;
use crate::workload::{Client, ClientStats, Shared};

fn main() -> ExitCode {
    if std::env::var_os(testkit::process::AS_HOSTD).is_some() {
        return cmd::main();
    }
    let options = Options::parse();
    if let Err(e) = options.validate() {
        eprintln!("nemesis: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nemesis: a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(options)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("nemesis: {e}");
            ExitCode::from(2)
        }
    }
}

/// The work folder: the one named, or a fresh temporary one (kept on request).
enum WorkDir {
    Named(std::path::PathBuf),
    Temporary(tempfile::TempDir),
}

impl WorkDir {
    fn path(&self) -> &std::path::Path {
        match self {
            WorkDir::Named(p) => p,
            WorkDir::Temporary(t) => t.path(),
        }
    }

    /// Keeps a temporary folder on disk; its path.
    fn keep(self) -> std::path::PathBuf {
        match self {
            WorkDir::Named(p) => p,
            WorkDir::Temporary(t) => t.keep(),
        }
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The whole run; `Ok(true)` when no violation was found.
async fn run(options: Options) -> Result<bool, String> {
    let seed = options.seed.unwrap_or_else(rand::random);
    println!(
        "nemesis: seed {seed}: {} Hosts on {}, {} sessions, faults for {} minutes (replay: --seed {seed} --hosts {} --minutes {} --backend {} --sessions {})",
        options.hosts,
        options.backend,
        options.sessions,
        options.minutes,
        options.hosts,
        options.minutes,
        options.backend,
        options.sessions
    );
    testkit::process::run_self_as_hostd().map_err(|e| format!("finding this executable: {e}"))?;
    let work = match &options.work_dir {
        Some(p) => {
            std::fs::create_dir_all(p).map_err(|e| format!("{}: {e}", p.display()))?;
            WorkDir::Named(p.clone())
        }
        None => WorkDir::Temporary(
            tempfile::Builder::new()
                .prefix("nemesis-")
                .tempdir()
                .map_err(|e| format!("a work folder: {e}"))?,
        ),
    };
    let history = Recorder::new(Some(seed));
    let mut fleet = Fleet::start(&options, work.path()).await?;
    if let Err(e) = fleet.wait_ready(Duration::from_secs(60)).await {
        let _ = fleet.stop(false).await;
        return Err(format!(
            "the fleet did not start: {e} (logs in {})",
            work.keep().display()
        ));
    }
    let store = Store::open(StoreOptions::new(fleet.store_url.clone()))
        .await
        .map_err(|e| format!("the controller's store: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Shared {
        controller: Shared::controller(store.clone(), &fleet.token),
        history: history.clone(),
        dir: work.path().to_path_buf(),
        store_url: fleet.store_url.clone(),
        token: fleet.token.clone(),
        stop: stop.clone(),
    };
    let mut clients = Vec::new();
    for i in 0..options.sessions as usize {
        clients.push(Client::create(i, shared.clone(), seed).await?);
    }
    let sessions: Vec<SessionRecord> = clients.iter().map(|c| c.record.clone()).collect();
    let running: Vec<_> = clients.into_iter().map(|c| tokio::spawn(c.run())).collect();

    // Faults for the run's length.
    let mut schedule = Schedule::new(seed, options.fault_interval);
    let deadline = tokio::time::Instant::now() + options.duration();
    schedule.run(&mut fleet, &history, deadline).await;

    // Heal everything, stop the clients, let the fleet settle.
    fleet.heal()?;
    history.fault("heal", "everything: every proxy passes, every Host runs");
    println!("nemesis: healed; stopping the clients and letting the fleet settle");
    stop.store(true, Ordering::SeqCst);
    let mut clients = Vec::new();
    for task in running {
        match task.await {
            Ok(c) => clients.push(c),
            Err(e) => return Err(format!("a client task failed: {e}")),
        }
    }
    let settle_deadline = tokio::time::Instant::now() + options.settle;
    let ready = fleet.wait_ready(options.settle).await;
    if let Err(e) = &ready {
        history.note(None, format!("after the heal: {e}"));
        println!("nemesis: {e}");
    }
    // A fleet on PostgreSQL must end every command with no client action (its reconciler
    // places sessions with work); a single Host gets its sessions back only when a controller
    // attaches them, which the last command of each session does.
    if options.backend == Backend::Postgres {
        wait_all_ended(&store, &sessions, settle_deadline).await;
    }
    for c in &mut clients {
        let left = settle_deadline.saturating_duration_since(tokio::time::Instant::now());
        c.final_probe(left.max(Duration::from_secs(10))).await;
    }
    wait_all_ended(&store, &sessions, settle_deadline).await;

    // The check.
    let view = StoreView::read(&store, &sessions)
        .await
        .map_err(|e| format!("reading the final state: {e}"))?;
    let report = check(&history.history(), &view);
    let mut totals = ClientStats::default();
    for c in &clients {
        totals.commands += c.stats.commands;
        totals.via_cli += c.stats.via_cli;
        totals.resends += c.stats.resends;
        totals.gave_up += c.stats.gave_up;
        totals.placements += c.stats.placements;
    }
    let unclean_exits = schedule.unexpected_exits.clone();
    store.close().await;
    let stopped = fleet.stop(!report.is_clean()).await;
    print_summary(
        &options,
        seed,
        &schedule,
        &report,
        &totals,
        &unclean_exits,
        &stopped,
    );

    let history_text = history.history().to_string();
    let clean = report.is_clean() && ready.is_ok();
    if clean {
        // Nothing to keep from a temporary folder.
        if let WorkDir::Named(p) = &work {
            let _ = std::fs::write(p.join("history.txt"), history_text);
            let _ = std::fs::write(p.join("report.txt"), report.to_string());
        }
        return Ok(true);
    }
    println!("{report}");
    let kept = work.keep();
    let _ = std::fs::write(kept.join("history.txt"), history_text);
    let _ = std::fs::write(kept.join("report.txt"), report.to_string());
    println!(
        "nemesis: VIOLATIONS with seed {seed}; the history, the report and every Host's log are in {}",
        kept.display()
    );
    Ok(false)
}

/// Waits until every command of `sessions` has ended, or `deadline`.
async fn wait_all_ended(store: &Store, sessions: &[SessionRecord], deadline: tokio::time::Instant) {
    loop {
        let mut pending = 0usize;
        for s in sessions {
            let mut after = 0;
            loop {
                match store
                    .list_commands(&s.tenant, &s.session, after, 1000)
                    .await
                {
                    Ok(page) => {
                        pending += page.iter().filter(|c| !c.state.is_terminal()).count();
                        match page.last() {
                            Some(last) if page.len() == 1000 => after = last.accepted_order,
                            _ => break,
                        }
                    }
                    Err(_) => {
                        pending += 1;
                        break;
                    }
                }
            }
        }
        if pending == 0 || tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn print_summary(
    options: &Options,
    seed: u64,
    schedule: &Schedule,
    report: &Report,
    clients: &ClientStats,
    unexpected_exits: &[(String, String)],
    stopped: &[(String, String)],
) {
    let faults: usize = schedule.injected.values().sum();
    let by_kind: Vec<String> = schedule
        .injected
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let s = &report.summary;
    let outcome = |k: &str| s.by_outcome.get(k).copied().unwrap_or(0);
    println!("nemesis summary (seed {seed})");
    println!(
        "  run:        {} minutes of faults, {} Hosts on {}, {} sessions",
        options.minutes, options.hosts, options.backend, options.sessions
    );
    println!("  faults:     {faults} ({})", by_kind.join(", "));
    println!(
        "  commands:   {} in the store: {} applied, {} not applied, {} rejected, {} no-op, {} refused, {} not ended",
        s.commands(),
        outcome("applied"),
        outcome("not_applied"),
        outcome("rejected"),
        outcome("no_op"),
        outcome("refused"),
        s.by_outcome
            .iter()
            .filter(|(k, _)| k.starts_with("not ended"))
            .map(|(_, n)| n)
            .sum::<usize>()
    );
    println!(
        "  clients:    {} admitted, {} uncertain, {} refused; {} sends ({} through hostd session send), {} resent after not applied, {} waits given up, {} placements",
        s.admitted,
        s.uncertain,
        s.refused,
        clients.commands,
        clients.via_cli,
        clients.resends,
        clients.gave_up,
        clients.placements
    );
    if !unexpected_exits.is_empty() {
        println!("  hosts that exited on their own: {unexpected_exits:?}");
    }
    if !stopped.is_empty() {
        println!("  hosts whose final stop was not clean: {stopped:?}");
    }
    let counts: Vec<String> = report
        .counts()
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!(
        "  violations: {}{}",
        report.violations.len(),
        if counts.is_empty() {
            String::new()
        } else {
            format!(" ({})", counts.join(", "))
        }
    );
    println!("  load average at the end: {}", load_average());
}
