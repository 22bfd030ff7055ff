//! One service process: spawned as the leader of its own process group, its output captured
//! line by line into its log file and the event sink, its exit observed without reaping, its
//! group signalled and finally reaped.
//!
//! This module owns the life of a process this flow spawned. It must never signal a process
//! group after the leader has been reaped (the number could then belong to someone else), and
//! it must never decide whether to restart or stop: the engine and teardown decide.

use std::collections::VecDeque;
use std::fmt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::watch;

use crate::error::FlowError;
use crate::events::{EventSink, FlowEvent, OutputStream};
use crate::logs::{FLOW_STREAM, LogWriter};
use crate::procfs::{self, StartIdentity};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "status {code}"),
            (None, Some(sig)) => match Signal::try_from(sig) {
                Ok(s) => write!(f, "signal {sig} ({})", s.as_str()),
                Err(_) => write!(f, "signal {sig}"),
            },
            (None, None) => f.write_str("an unknown status"),
        }
    }
}

/// Everything needed to start one service process.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub service: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Added to (and overriding) the flow's own environment.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub tail_lines: usize,
    pub max_line_bytes: usize,
}

/// A spawned service process and its process group.
#[derive(Debug)]
pub struct ServiceProcess {
    service: String,
    identity: StartIdentity,
    exit: watch::Receiver<Option<ExitInfo>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Guards signalling against reaping: once `true`, the group number is not ours.
    reaped: Mutex<bool>,
    log: Arc<LogWriter>,
}

impl ServiceProcess {
    /// Spawns the process as the leader of a new process group. Must be called inside a
    /// tokio runtime (the output pipes register with it).
    pub fn spawn(
        spec: &SpawnSpec,
        log: Arc<LogWriter>,
        events: &EventSink,
    ) -> Result<ServiceProcess, FlowError> {
        let spawn_error = |reason: String| FlowError::Spawn {
            service: spec.service.clone(),
            command: spec.program.display().to_string(),
            reason,
        };
        let mut command = Command::new(&spec.program);
        command
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = command.spawn().map_err(|e| spawn_error(e.to_string()))?;
        let pid = child.id() as i32;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        // The child is reaped through `waitpid` below, never through `Child`.
        drop(child);

        let identity = match procfs::identity(pid) {
            Ok(id) => id,
            Err(e) => {
                // Too quick to read: the group cannot outlive a leader we still hold as a
                // zombie, so this identity is still exact for signalling within this flow.
                tracing::debug!(service = %spec.service, pid, error = %e, "start identity read late");
                StartIdentity {
                    pid,
                    pgid: pid,
                    start_time: 0,
                    boot_id: procfs::boot_id().unwrap_or_default(),
                }
            }
        };
        let identity = StartIdentity {
            pgid: pid,
            ..identity
        };

        let (exit_tx, exit_rx) = watch::channel(None);
        std::thread::Builder::new()
            .name(format!("flow-wait-{pid}"))
            .spawn(move || {
                let status = loop {
                    match waitid(
                        Id::Pid(Pid::from_raw(pid)),
                        WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
                    ) {
                        Ok(WaitStatus::Exited(_, code)) => {
                            break ExitInfo {
                                code: Some(code),
                                signal: None,
                            };
                        }
                        Ok(WaitStatus::Signaled(_, sig, _)) => {
                            break ExitInfo {
                                code: None,
                                signal: Some(sig as i32),
                            };
                        }
                        Ok(_) => continue,
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(_) => {
                            break ExitInfo {
                                code: None,
                                signal: None,
                            };
                        }
                    }
                };
                let _ = exit_tx.send(Some(status));
            })
            .map_err(|e| spawn_error(format!("cannot start the exit watcher: {e}")))?;

        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(spec.tail_lines)));
        log.write(
            FLOW_STREAM,
            &format!("started pid {pid} (process group {pid})"),
        );
        let pumps: [(Option<Box<dyn AsyncRead + Send + Unpin>>, OutputStream); 2] = [
            (
                stdout
                    .and_then(|s| tokio::process::ChildStdout::from_std(s).ok())
                    .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>),
                OutputStream::Stdout,
            ),
            (
                stderr
                    .and_then(|s| tokio::process::ChildStderr::from_std(s).ok())
                    .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>),
                OutputStream::Stderr,
            ),
        ];
        for (reader, stream) in pumps {
            if let Some(reader) = reader {
                tokio::spawn(pump(
                    reader,
                    stream,
                    spec.service.clone(),
                    log.clone(),
                    tail.clone(),
                    spec.tail_lines,
                    spec.max_line_bytes,
                    events.clone(),
                ));
            }
        }

        Ok(ServiceProcess {
            service: spec.service.clone(),
            identity,
            exit: exit_rx,
            tail,
            reaped: Mutex::new(false),
            log,
        })
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn identity(&self) -> &StartIdentity {
        &self.identity
    }

    pub fn pid(&self) -> i32 {
        self.identity.pid
    }

    pub fn pgid(&self) -> i32 {
        self.identity.pgid
    }

    pub fn log(&self) -> &LogWriter {
        &self.log
    }

    /// How the leader exited, once it has.
    pub fn exited(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }

    /// Resolves when the leader has exited.
    pub async fn wait_exit(&self) -> ExitInfo {
        let mut rx = self.exit.clone();
        loop {
            if let Some(exit) = *rx.borrow_and_update() {
                return exit;
            }
            if rx.changed().await.is_err() {
                return (*rx.borrow()).unwrap_or(ExitInfo {
                    code: None,
                    signal: None,
                });
            }
        }
    }

    pub fn exit_watch(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.exit.clone()
    }

    /// The last output lines, oldest first.
    pub fn tail(&self) -> Vec<String> {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn is_reaped(&self) -> bool {
        self.reaped.lock().map(|r| *r).unwrap_or(true)
    }

    /// Signals every member of the process group. Refused once the leader has been reaped,
    /// because the group number is then no longer ours to use.
    pub fn signal_group(&self, signal: Signal) -> Result<(), String> {
        let reaped = self
            .reaped
            .lock()
            .map_err(|_| "the process record is poisoned".to_owned())?;
        if *reaped {
            return Err(format!("process group {} was already reaped", self.pgid()));
        }
        match killpg(Pid::from_raw(self.pgid()), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(format!(
                "cannot send {} to process group {}: {e}",
                signal.as_str(),
                self.pgid()
            )),
        }
    }

    /// Whether any member of the group still runs (the leader's zombie does not count).
    pub fn group_alive(&self) -> bool {
        if self.is_reaped() {
            return false;
        }
        procfs::live_members(self.pgid())
            .map(|m| !m.is_empty())
            .unwrap_or(true)
    }

    /// After the leader exited on its own: asks whatever is left in its group to stop
    /// (SIGTERM, then SIGKILL after `grace`), and reaps the leader once the group is empty.
    /// Returns whether the group emptied.
    pub async fn settle(&self, grace: Duration) -> bool {
        self.wait_exit().await;
        if self.is_reaped() {
            return true;
        }
        let mut emptied = true;
        if self.group_alive() {
            tracing::debug!(service = %self.service, pgid = self.pgid(), "stopping what the exited leader left in its group");
            let _ = self.signal_group(Signal::SIGTERM);
            if !self
                .wait_group_empty(tokio::time::Instant::now() + grace)
                .await
            {
                let _ = self.signal_group(Signal::SIGKILL);
                emptied = self
                    .wait_group_empty(tokio::time::Instant::now() + grace)
                    .await;
            }
        }
        if emptied {
            self.reap_if_exited();
        }
        emptied
    }

    /// Waits until no member of the group runs, or `deadline`.
    pub async fn wait_group_empty(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            if !self.group_alive() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Reaps the leader if it has exited and nothing else of its group runs; returns its exit.
    pub fn reap_if_exited(&self) -> Option<ExitInfo> {
        let exit = self.exited()?;
        let Ok(mut reaped) = self.reaped.lock() else {
            return Some(exit);
        };
        if *reaped {
            return Some(exit);
        }
        if procfs::live_members(self.pgid())
            .map(|m| !m.is_empty())
            .unwrap_or(true)
        {
            return None;
        }
        match waitpid(Pid::from_raw(self.pid()), None) {
            Ok(_) | Err(nix::errno::Errno::ECHILD) => {}
            Err(e) => {
                tracing::warn!(service = %self.service, pid = self.pid(), error = %e, "cannot reap")
            }
        }
        *reaped = true;
        self.log.write(
            FLOW_STREAM,
            &format!("pid {} exited with {exit}", self.pid()),
        );
        Some(exit)
    }
}

#[allow(clippy::too_many_arguments)]
async fn pump(
    reader: Box<dyn AsyncRead + Send + Unpin>,
    stream: OutputStream,
    service: String,
    log: Arc<LogWriter>,
    tail: Arc<Mutex<VecDeque<String>>>,
    tail_lines: usize,
    max_line_bytes: usize,
    events: EventSink,
) {
    let mut reader = BufReader::new(reader);
    let mut line: Vec<u8> = Vec::new();
    loop {
        line.clear();
        // Read one line, but never hold more than `max_line_bytes` of it.
        let complete = loop {
            let available = match reader.fill_buf().await {
                Ok(buf) => buf,
                Err(_) => break false,
            };
            if available.is_empty() {
                break false;
            }
            let room = max_line_bytes.saturating_sub(line.len());
            let take = available.len().min(room);
            if let Some(pos) = available[..take].iter().position(|&b| b == b'\n') {
                line.extend_from_slice(&available[..pos]);
                reader.consume(pos + 1);
                break true;
            }
            line.extend_from_slice(&available[..take]);
            reader.consume(take);
            if line.len() >= max_line_bytes {
                break true;
            }
        };
        if !complete && line.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches('\r');
        log.write(stream.as_str(), text);
        if let Ok(mut t) = tail.lock() {
            if t.len() >= tail_lines.max(1) {
                t.pop_front();
            }
            t.push_back(text.to_owned());
        }
        events.emit(FlowEvent::Output {
            service: service.clone(),
            stream,
            line: text.to_owned(),
        });
        if !complete {
            return;
        }
    }
}
