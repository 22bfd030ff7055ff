//! Invoking a release: validate the input, start the handler once in its own process group
//! with the request on stdin, enforce the deadline (SIGTERM to the group, SIGKILL after a
//! grace), read one result document from stdout, stop whatever the handler left in its group,
//! and classify through [`crate::outcome::classify`].
//!
//! **The request** (one JSON document on stdin, then stdin is closed):
//! `{"protocol": "hostd.runnable.request/1", "runnable": "<workspace/name@version>",
//! "digest": "sha256:…", "invocation_id": "…", "intent_id": "…", "effect_id": "…",
//! "deadline": "<RFC 3339 UTC>", "deadline_unix_ms": <n>, "input": <value>}`.
//! The same ids are in the environment as `HOSTD_RUNNABLE`, `HOSTD_RUNNABLE_DIGEST`,
//! `HOSTD_INVOCATION_ID`, `HOSTD_INTENT_ID`, `HOSTD_EFFECT_ID` and `HOSTD_DEADLINE`, beside
//! the declared `env` and the dependency addresses. Under a trace, the request also carries
//! `traceparent` (and `tracestate`) naming the invocation's span, and the environment
//! `TRACEPARENT` (and `TRACESTATE`). The handler runs in the unpacked package
//! folder. Its stderr goes to a log file (bounded), whose path the result names.
//!
//! **Ids.** `intent_id` is the caller's (a fresh `int-<uuid>` when none is given): reuse it
//! when retrying the same intent. `effect_id` is derived from the intent and the release
//! (identity and digest), so every retry of one intent against one release carries the same
//! idempotency key and different intents never share one; a caller may also pass its own.
//!
//! **Never twice.** An invocation starts the handler at most once and never retries.
//!
//! **Never an orphan.** Beside the handler, in its process group, runs a guard ([`guard`]):
//! a tiny `/bin/sh` that holds the read end of a pipe whose write end only this process holds.
//! When the invocation ends, the guard is told so and exits; when this process dies by any
//! signal (even SIGKILL) or drops the invocation, the pipe reaches end-of-file and the guard
//! stops the whole group (SIGTERM, then SIGKILL after a short grace). Being a member, the
//! guard keeps the group's number from being reused while it signals it.
//!
//! This module owns the handler's process from spawn to reap. It must never signal a process
//! group after reaping its leader (the number could then be someone else's), and it never
//! decides a class itself.

use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use flow::procfs::{self, Ownership, StartIdentity};

use crate::deps;
use crate::error::Violation;
use crate::error::{HandlerError, RunnableError};
use crate::guard::{self, Guard};
use crate::outcome::{self, ExitStatus, Observation, OutcomeClass};
use crate::release::Release;

/// The protocol name of the request document.
pub const REQUEST_PROTOCOL: &str = "hostd.runnable.request/1";

/// Bounds of an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvokeOptions {
    /// How long a handler gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// The largest result document read from stdout.
    pub max_output_bytes: usize,
    /// The most stderr bytes kept in the log (the rest is counted and dropped).
    pub max_log_bytes: u64,
}

impl Default for InvokeOptions {
    fn default() -> Self {
        InvokeOptions {
            kill_grace: Duration::from_secs(2),
            max_output_bytes: 1024 * 1024,
            max_log_bytes: 8 * 1024 * 1024,
        }
    }
}

impl InvokeOptions {
    /// Checks every bound.
    pub fn validate(&self) -> Result<(), String> {
        if self.kill_grace.is_zero() || self.kill_grace > Duration::from_secs(300) {
            return Err("kill_grace must be between 1 ms and 5 min".into());
        }
        if self.max_output_bytes == 0 || self.max_output_bytes > 64 * 1024 * 1024 {
            return Err("max_output_bytes must be between 1 B and 64 MiB".into());
        }
        if self.max_log_bytes > 1024 * 1024 * 1024 {
            return Err("max_log_bytes must be at most 1 GiB".into());
        }
        Ok(())
    }
}

/// What the caller asks for.
#[derive(Debug, Clone, Default)]
pub struct InvokeRequest {
    pub input: Value,
    /// The intent this attempt serves; reuse it for a retry. `None` mints one.
    pub intent_id: Option<String>,
    /// An explicit idempotency key; `None` derives it from the intent and the release.
    pub effect_id: Option<String>,
}

/// The result of one invocation (one handler start).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Invocation {
    /// `workspace/name@version`.
    pub identity: String,
    pub digest: String,
    pub outcome: OutcomeClass,
    /// True only for `succeeded` and `failed`.
    pub certain: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<HandlerError>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<Violation>,
    /// What was observed, in one sentence (says so when the effect is unknown).
    pub detail: String,
    pub invocation_id: String,
    pub intent_id: String,
    pub effect_id: String,
    pub exit: ExitStatus,
    /// The handler's stderr.
    pub log: PathBuf,
    pub duration_ms: u64,
}

/// The effect id of `intent_id` against a release: the same for every retry of the intent,
/// different for another intent or another release.
pub fn effect_id(intent_id: &str, identity: &str, digest: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"hostd.runnable.effect/1\0");
    for part in [intent_id, identity, digest] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("eff-{}", &hex::encode(h.finalize())[..32])
}

/// Checks an id a caller supplies: 1-200 printable ASCII characters, no whitespace.
fn check_id(what: &str, id: &str) -> Result<(), RunnableError> {
    if id.is_empty() || id.len() > 200 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(RunnableError::BadReference {
            reference: id.to_owned(),
            reason: format!("{what} must be 1-200 printable ASCII characters without spaces"),
        });
    }
    Ok(())
}

/// A running-handler record: lets a successor stop what a crashed invoker left.
#[derive(serde::Serialize, serde::Deserialize)]
struct RunningRecord {
    identity: String,
    invocation_id: String,
    process: StartIdentity,
    /// The process that invoked it: while it lives, the handler is not an orphan.
    invoker: Option<StartIdentity>,
}

/// Invokes `release` once. Refusals before the start (invalid input, an unresolved
/// dependency, a handler that cannot start) are `Err`; everything after the start is an
/// [`Invocation`] with its class. Runs on a tokio runtime with IO and time enabled (the pipes
/// and SIGCHLD go through its drivers).
pub async fn invoke(
    release: &Release,
    request: InvokeRequest,
    options: &InvokeOptions,
    cancel: &CancellationToken,
) -> Result<Invocation, RunnableError> {
    use tracing::Instrument as _;
    let span = tracing::info_span!(
        "runnable.invoke",
        runnable = %release.identity(),
        digest = %release.digest(),
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    );
    let result = invoke_once(release, request, options, cancel)
        .instrument(span.clone())
        .await;
    match &result {
        Ok(invocation) => {
            span.record("outcome", invocation.outcome.as_str());
            if invocation.outcome != OutcomeClass::Succeeded {
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_description", invocation.outcome.as_str());
            }
        }
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", e.code());
        }
    }
    result
}

async fn invoke_once(
    release: &Release,
    request: InvokeRequest,
    options: &InvokeOptions,
    cancel: &CancellationToken,
) -> Result<Invocation, RunnableError> {
    let decl = release.declaration();
    let identity = release.identity().to_string();
    let digest = release.digest().to_string();

    let violations = decl.input.validate(&request.input);
    if !violations.is_empty() {
        return Err(RunnableError::InvalidInput {
            identity,
            violations,
        });
    }
    let intent_id = match request.intent_id {
        Some(id) => {
            check_id("intent_id", &id)?;
            id
        }
        None => format!("int-{}", uuid::Uuid::now_v7().simple()),
    };
    let effect_id = match request.effect_id {
        Some(id) => {
            check_id("effect_id", &id)?;
            id
        }
        None => effect_id(&intent_id, &identity, &digest),
    };
    let dep_env = deps::environment(decl, release.flow_root())?;
    release.ensure_unpacked()?;

    let invocation_id = format!("inv-{}", uuid::Uuid::now_v7().simple());
    let started_wall = SystemTime::now();
    let deadline_wall = started_wall + decl.timeout;
    let deadline_unix_ms = deadline_wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let deadline_text = humantime::format_rfc3339_millis(deadline_wall).to_string();
    let request_doc = json!({
        "protocol": REQUEST_PROTOCOL,
        "runnable": identity,
        "digest": digest,
        "invocation_id": invocation_id,
        "intent_id": intent_id,
        "effect_id": effect_id,
        "deadline": deadline_text,
        "deadline_unix_ms": deadline_unix_ms,
        "input": request.input,
    });
    // The handler continues the invocation's trace: `traceparent` (and `tracestate`) in the
    // request document and TRACEPARENT (TRACESTATE) in its environment.
    let trace = trace_context::span::current_for_callee(None);
    let mut request_doc = request_doc;
    if let Some(t) = &trace {
        request_doc["traceparent"] = json!(t.parent.to_string());
        if let Some(state) = &t.state {
            request_doc["tracestate"] = json!(state.as_str());
        }
    }
    let mut request_bytes = serde_json::to_vec(&request_doc).unwrap_or_default();
    request_bytes.push(b'\n');

    let logs = release.logs_dir();
    std::fs::create_dir_all(&logs).map_err(|e| RunnableError::io(&logs, e))?;
    let log_path = logs.join(format!(
        "{}-{invocation_id}.log",
        release.identity().release()
    ));
    let running = release.running_dir();
    std::fs::create_dir_all(&running).map_err(|e| RunnableError::io(&running, e))?;

    // A path is made absolute before the handler starts in the release folder: a relative
    // one (a data folder given relative to the working directory) would be looked up from
    // inside that folder.
    let program = if decl.command.contains('/') {
        let path = release.dir().join(&decl.command);
        std::path::absolute(&path).unwrap_or(path)
    } else {
        PathBuf::from(&decl.command)
    };
    let mut command = Command::new(&program);
    command
        .args(&decl.args)
        .current_dir(release.dir())
        .envs(decl.env.iter().map(|(k, v)| (k, v)))
        .envs(dep_env.iter().map(|(k, v)| (k, v)))
        .env("HOSTD_RUNNABLE", &identity)
        .env("HOSTD_RUNNABLE_DIGEST", &digest)
        .env("HOSTD_INVOCATION_ID", &invocation_id)
        .env("HOSTD_INTENT_ID", &intent_id)
        .env("HOSTD_EFFECT_ID", &effect_id)
        .env("HOSTD_DEADLINE", &deadline_text)
        .envs(trace.iter().map(|t| ("TRACEPARENT", t.parent.to_string())))
        .envs(trace.iter().filter_map(|t| {
            t.state
                .as_ref()
                .map(|s| ("TRACESTATE", s.as_str().to_owned()))
        }))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // Registered before the spawn so the handler's exit cannot be missed.
    let sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
    let started = tokio::time::Instant::now();
    // Real time (not the runtime's clock): how long the pid counter had to wrap.
    let spawned_at = std::time::Instant::now();
    let mut child = spawn_past_busy_text(&mut command)
        .await
        .map_err(|e| RunnableError::Spawn {
            identity: identity.clone(),
            command: decl.command.clone(),
            reason: e.to_string(),
        })?;
    let pid = child.id() as i32;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    // Reaped below through waitpid, after the group is empty; never through `Child`.
    drop(child);
    tracing::debug!(pid, %invocation_id, "handler started");
    // Spawned at once: until it runs, only the boot sweep of the running records covers a
    // death of this process.
    let guard = Guard::spawn(pid, guard::orphan_grace(options.kill_grace));
    let guard_pid = guard.as_ref().map(Guard::pid);

    let process = procfs::identity(pid).unwrap_or_else(|_| StartIdentity {
        pid,
        pgid: pid,
        start_time: 0,
        boot_id: procfs::boot_id().unwrap_or_default(),
    });
    let process = StartIdentity {
        pgid: pid,
        ..process
    };
    let record_path = running.join(format!("{invocation_id}.json"));
    let record = RunningRecord {
        identity: identity.clone(),
        invocation_id: invocation_id.clone(),
        process,
        invoker: procfs::identity(std::process::id() as i32).ok(),
    };
    if let Err(e) = std::fs::write(
        &record_path,
        serde_json::to_vec(&record).unwrap_or_default(),
    ) {
        tracing::warn!(error = %e, "cannot record the running handler");
    }

    let mut exits = ExitWaiter::new(pid, sigchld);
    // Everything below runs in this one task (no hops between tasks): the request written,
    // stdout read, stderr logged, and the handler supervised. Reads and the write give up
    // `kill_grace` after the group was stopped and reaped (something that left the group
    // may still hold a pipe).
    let (stopped_tx, stopped_rx) = watch::channel(false);
    let grace = options.kill_grace;
    let write_in = {
        let stopped = stopped_rx.clone();
        async move {
            if let Some(mut w) = stdin.and_then(|s| tokio::process::ChildStdin::from_std(s).ok()) {
                // A handler that never reads stdin, or exits early, is not an error here.
                let writing = async {
                    let _ = w.write_all(&request_bytes).await;
                    let _ = w.shutdown().await;
                };
                tokio::select! {
                    _ = writing => {}
                    _ = after_stop(stopped, grace) => {}
                }
            }
        }
    };
    let max_out = options.max_output_bytes;
    let read_out = {
        let stopped = stopped_rx.clone();
        async move {
            let Some(mut reader) =
                stdout.and_then(|s| tokio::process::ChildStdout::from_std(s).ok())
            else {
                return (Vec::new(), false);
            };
            let reading = async move {
                let mut buf = Vec::new();
                let mut overflowed = false;
                let mut chunk = vec![0u8; 16 * 1024];
                loop {
                    match reader.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if buf.len() + n > max_out {
                                overflowed = true;
                            } else {
                                buf.extend_from_slice(&chunk[..n]);
                            }
                        }
                    }
                }
                (buf, overflowed)
            };
            tokio::select! {
                r = reading => r,
                // Still held open: what was read is not a result.
                _ = after_stop(stopped, grace) => (Vec::new(), true),
            }
        }
    };
    let log_bound = options.max_log_bytes;
    let pump = {
        let stopped = stopped_rx.clone();
        let log_path = log_path.clone();
        async move {
            let reader = stderr.and_then(|s| tokio::process::ChildStderr::from_std(s).ok());
            tokio::select! {
                _ = pump_log(reader, &log_path, log_bound) => {}
                _ = after_stop(stopped, grace) => {}
            }
        }
    };
    let deadline = started + decl.timeout;
    let supervise = async {
        let (mut cancelled, mut deadline_passed) = (false, false);
        tokio::select! {
            _ = exits.wait() => {}
            _ = tokio::time::sleep_until(deadline) => deadline_passed = true,
            _ = cancel.cancelled() => cancelled = true,
        }
        // A race: if the leader had already exited on its own, the exit counts.
        if (cancelled || deadline_passed) && peek_exit(pid).is_some() {
            cancelled = false;
            deadline_passed = false;
        }
        if cancelled || deadline_passed {
            tracing::info!(
                pid,
                cancelled,
                deadline_passed,
                "stopping the handler's process group"
            );
        }
        stop_group(pid, guard_pid, grace, spawned_at).await;
        // Before the leader is reaped: the group number is still ours.
        if let Some(guard) = guard {
            guard.release().await;
        }
        let exit = peek_exit(pid).unwrap_or(ExitStatus {
            code: None,
            signal: None,
        });
        match waitpid(Pid::from_raw(pid), None) {
            Ok(_) | Err(nix::errno::Errno::ECHILD) => {}
            Err(e) => tracing::warn!(pid, error = %e, "cannot reap the handler"),
        }
        let _ = std::fs::remove_file(&record_path);
        let _ = stopped_tx.send(true);
        (cancelled, deadline_passed, exit)
    };
    let ((), (stdout_bytes, overflowed), (), (cancelled, deadline_passed, exit)) =
        tokio::join!(write_in, read_out, pump, supervise);

    let observation = Observation {
        cancelled,
        deadline_passed,
        exit,
        document: outcome::parse_document(&stdout_bytes, overflowed, max_out),
    };
    let classified = outcome::classify(&observation, &decl.output);
    tracing::info!(outcome = classified.class.as_str(), certain = classified.certain, %intent_id, %effect_id, "invocation ended");
    Ok(Invocation {
        identity,
        digest,
        outcome: classified.class,
        certain: classified.certain,
        output: classified.output,
        error: classified.error,
        violations: classified.violations,
        detail: classified.detail,
        invocation_id,
        intent_id,
        effect_id,
        exit,
        log: log_path,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}

/// How the leader ended, if it has, without reaping it (its group number stays ours while
/// it is an unreaped zombie).
fn peek_exit(pid: i32) -> Option<ExitStatus> {
    loop {
        return match waitid(
            Id::Pid(Pid::from_raw(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        ) {
            Ok(WaitStatus::Exited(_, code)) => Some(ExitStatus {
                code: Some(code),
                signal: None,
            }),
            Ok(WaitStatus::Signaled(_, sig, _)) => Some(ExitStatus {
                code: None,
                signal: Some(sig as i32),
            }),
            Ok(_) => None,
            Err(nix::errno::Errno::EINTR) => continue,
            // Not our child any more (cannot happen before we reap it): it has ended.
            Err(_) => Some(ExitStatus {
                code: None,
                signal: None,
            }),
        };
    }
}

/// Waits for the leader's exit: woken by SIGCHLD through the runtime's signal driver, or, if
/// SIGCHLD cannot be listened to, by a blocking-pool thread in `waitid`.
struct ExitWaiter {
    pid: i32,
    sigchld: Option<tokio::signal::unix::Signal>,
    thread: Option<watch::Receiver<bool>>,
}

impl ExitWaiter {
    fn new(pid: i32, sigchld: Option<tokio::signal::unix::Signal>) -> ExitWaiter {
        let thread = if sigchld.is_some() {
            None
        } else {
            let (tx, rx) = watch::channel(false);
            tokio::task::spawn_blocking(move || {
                while let Err(nix::errno::Errno::EINTR) = waitid(
                    Id::Pid(Pid::from_raw(pid)),
                    WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
                ) {}
                let _ = tx.send(true);
            });
            Some(rx)
        };
        ExitWaiter {
            pid,
            sigchld,
            thread,
        }
    }

    async fn wait(&mut self) {
        loop {
            if peek_exit(self.pid).is_some() {
                return;
            }
            match (&mut self.sigchld, &mut self.thread) {
                (Some(signals), _) => {
                    if signals.recv().await.is_none() {
                        std::future::pending::<()>().await;
                    }
                }
                (None, Some(rx)) => {
                    if rx.wait_for(|done| *done).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                (None, None) => std::future::pending::<()>().await,
            }
        }
    }
}

/// Resolves `grace` after `stopped` turned true.
async fn after_stop(mut stopped: watch::Receiver<bool>, grace: Duration) {
    if stopped.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(grace).await;
}

/// The fastest pid allocation the scan shortcut below assumes (pids per second). Far above
/// what a machine sustains; it only bounds how long the shortcut stays valid.
const MAX_PID_RATE: u64 = 100_000;

/// Whether `/proc` entries below `pgid` can be skipped when looking for members of the group
/// led by `pgid`, spawned `elapsed` ago. Every member is a descendant of the leader, so it got
/// its pid after the leader's; Linux allocates pids upwards and wraps at `pid_max`. If the last
/// pid allocated is not below the leader's and too little time passed for a whole wrap, every
/// member's pid is above the leader's.
fn only_newer_pids(pgid: i32, elapsed: Duration) -> bool {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    let (Some(pid_max), Some(last)) = (
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/ns_last_pid"),
    ) else {
        return false;
    };
    // Pids wrap to 300 (the kernel's reserved range) after `pid_max`.
    let wrap = Duration::from_secs_f64(pid_max.saturating_sub(300) as f64 / MAX_PID_RATE as f64);
    last >= pgid as u64 && elapsed < wrap
}

/// Whether any process of group `pgid` other than a zombie still runs: one pass over `/proc`
/// (only pids from the leader's up when [`only_newer_pids`] allows), stopping at the first
/// live member, reading each `stat` into one reused buffer. An unreadable `/proc` counts as
/// alive: "empty" is never concluded without proof.
fn group_alive(pgid: i32, except: Option<i32>, elapsed: Duration) -> bool {
    use std::io::Read as _;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    let skip_older = only_newer_pids(pgid, elapsed);
    let mut buf = Vec::with_capacity(512);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if (skip_older && pid < pgid) || Some(pid) == except {
            continue;
        }
        buf.clear();
        let Ok(mut f) = std::fs::File::open(format!("/proc/{pid}/stat")) else {
            continue; // gone meanwhile
        };
        if f.read_to_end(&mut buf).is_err() {
            continue;
        }
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        let Some(close) = buf.iter().rposition(|b| *b == b')') else {
            continue;
        };
        let mut fields = buf[close + 1..]
            .split(|b| *b == b' ')
            .filter(|f| !f.is_empty());
        let state = fields.next().and_then(|f| f.first().copied());
        let pgrp = fields
            .nth(1)
            .and_then(|f| std::str::from_utf8(f).ok())
            .and_then(|f| f.parse::<i32>().ok());
        if pgrp == Some(pgid) && !matches!(state, Some(b'Z' | b'X' | b'x')) {
            return true;
        }
    }
    false
}

/// Stops everything in the handler's group: nothing if it is already empty, else SIGTERM,
/// then SIGKILL after `grace`. The guard (`guard`, a member that ignores SIGTERM) does not
/// count as a member here; it is released afterwards. Returns once the leader has exited and
/// the group is empty (or the kill could not be confirmed within a further grace). Called while the leader is still
/// unreaped, so the group number cannot have been reused.
async fn stop_group(pgid: i32, guard: Option<i32>, grace: Duration, spawned: std::time::Instant) {
    let quiet = || peek_exit(pgid).is_some() && !group_alive(pgid, guard, spawned.elapsed());
    if quiet() {
        return;
    }
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGTERM);
    let until = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < until {
        if quiet() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    let until = tokio::time::Instant::now() + grace.max(Duration::from_secs(1));
    while tokio::time::Instant::now() < until {
        if quiet() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::warn!(
        pgid,
        "the handler's process group did not empty after SIGKILL"
    );
}

async fn pump_log(reader: Option<tokio::process::ChildStderr>, path: &Path, bound: u64) {
    let mut file = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot open the handler log");
            None
        }
    };
    let Some(mut reader) = reader else { return };
    let mut written = 0u64;
    let mut dropped = 0u64;
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = bound.saturating_sub(written) as usize;
                let take = n.min(room);
                if let Some(f) = file.as_mut()
                    && take > 0
                {
                    let _ = f.write_all(&chunk[..take]);
                }
                written += take as u64;
                dropped += (n - take) as u64;
            }
        }
    }
    if dropped > 0
        && let Some(f) = file.as_mut()
    {
        let _ = writeln!(
            f,
            "\n[hostd: {dropped} more byte(s) of stderr were dropped]"
        );
    }
}

/// Stops handlers that a crashed invoker left running: every record under `running` whose
/// invoker is gone and whose handler is proven (same pid, start time and boot) gets its group
/// killed; records of processes that are gone are removed; handlers of a live invoker (another
/// `hostd` using the same folder) are left alone. Returns how many groups were stopped.
pub fn stop_orphans(running: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(running) else {
        return 0;
    };
    let mut stopped = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<RunningRecord>(&bytes) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let invoker_alive = record
            .invoker
            .as_ref()
            .is_some_and(|inv| matches!(procfs::prove(inv), Ok(Ownership::Proven { .. })));
        if invoker_alive {
            continue;
        }
        match procfs::prove(&record.process) {
            Ok(Ownership::Proven { .. }) => {
                tracing::warn!(runnable = %record.identity, invocation = %record.invocation_id, pgid = record.process.pgid, "stopping a handler left running by a previous process; its outcome is unknown");
                let _ = killpg(Pid::from_raw(record.process.pgid), Signal::SIGKILL);
                stopped += 1;
                let _ = std::fs::remove_file(&path);
            }
            Ok(Ownership::Gone) => {
                let _ = std::fs::remove_file(&path);
            }
            Ok(Ownership::Unproven { reason, .. }) => {
                tracing::warn!(runnable = %record.identity, %reason, "a recorded handler group cannot be proven ours; leaving it");
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => {}
        }
    }
    stopped
}

/// How often a spawn refused with "text file busy" is tried again, and the first pause.
const BUSY_TEXT_TRIES: u32 = 8;
const BUSY_TEXT_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// Spawns `command`, trying again for a moment when the kernel refuses the executable as busy
/// (`ETXTBSY`). A handler just written (a cache folder unpacked again after an edit) can be
/// held open for writing by a child another thread of this process forked and has not yet
/// exec'd; that child's copy of the descriptor closes at its exec, within moments.
async fn spawn_past_busy_text(command: &mut Command) -> std::io::Result<std::process::Child> {
    let mut pause = BUSY_TEXT_PAUSE;
    for _ in 1..BUSY_TEXT_TRIES {
        match command.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                tracing::debug!(error = %e, "the handler's executable is busy; trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            other => return other,
        }
    }
    command.spawn()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_skips_older_pids_only_while_no_wrap_can_have_happened() {
        assert!(only_newer_pids(1, Duration::ZERO));
        assert!(
            !only_newer_pids(i32::MAX, Duration::ZERO),
            "the counter is below the leader"
        );
        assert!(
            !only_newer_pids(1, Duration::from_secs(24 * 3600)),
            "a day is long enough to wrap"
        );
    }

    #[test]
    fn a_group_with_a_live_member_is_alive_and_an_unused_number_is_not() {
        let me = nix::unistd::getpgrp().as_raw();
        assert!(group_alive(me, None, Duration::from_secs(24 * 3600)));
        assert!(!group_alive(i32::MAX - 7, None, Duration::ZERO));
    }

    #[test]
    fn effect_ids_follow_the_intent_and_the_release() {
        let a = effect_id("i1", "w/n@1", "sha256:aa");
        assert_eq!(a, effect_id("i1", "w/n@1", "sha256:aa"));
        assert_ne!(a, effect_id("i2", "w/n@1", "sha256:aa"));
        assert_ne!(a, effect_id("i1", "w/n@2", "sha256:aa"));
        assert_ne!(a, effect_id("i1", "w/n@1", "sha256:bb"));
    }

    #[tokio::test]
    async fn a_handler_held_open_for_writing_for_a_moment_is_spawned_once_the_writer_lets_go() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handler.sh");
        std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        // As a child forked by another thread holds a just-written file until its exec.
        let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let busy = Command::new(&path).spawn().unwrap_err();
        assert_eq!(busy.kind(), std::io::ErrorKind::ExecutableFileBusy);
        let lets_go = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
            drop(writer);
        });
        let mut child = super::spawn_past_busy_text(&mut Command::new(&path))
            .await
            .unwrap();
        assert!(child.wait().unwrap().success());
        lets_go.await.unwrap();
    }
}
