//! How `hostd flow` shows things: the live view of an `up` (prefixed service output on
//! stdout, flow lines and a progress line on stderr), its JSON-lines form, receipts (in the
//! one table printer, `crate::output::Table`), and the one-object JSON form of an error. Every write to stdout goes through [`Out`],
//! which reports a closed or full stream as an error instead of panicking.
//!
//! This module owns presentation only; it must never decide anything about a flow.

use std::collections::HashMap;
use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use ::flow::events::Step;
use ::flow::{ChangeReport, FlowEvent, OutputStream, Receipt, TeardownReport};
use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::output::Table;

/// Standard output, written fallibly: `hostd flow graph > /dev/full` is an error, not a panic.
pub struct Out;

impl Out {
    pub fn text(text: &str) -> Result<()> {
        let mut out = io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("cannot write to standard output")
    }

    pub fn line(text: &str) -> Result<()> {
        Out::text(&format!("{text}\n"))
    }

    /// One JSON document (or one JSON line of a stream).
    pub fn json(value: &Value) -> Result<()> {
        Out::line(&value.to_string())
    }
}

/// Whether an error is only the reader going away (`hostd flow logs | head`).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// A refusal or failure as one JSON object on stderr.
pub fn json_error(code: &str, message: &str) {
    let value = json!({"error": {"code": code, "message": message}});
    let _ = writeln!(io::stderr(), "{value}");
}

pub fn endpoints_text<'a>(endpoints: impl Iterator<Item = (&'a str, String)>) -> String {
    let text: Vec<String> = endpoints.map(|(n, a)| format!("{n}={a}")).collect();
    if text.is_empty() {
        "-".into()
    } else {
        text.join(" ")
    }
}

pub fn receipt_line(r: &Receipt) -> String {
    format!(
        "{}: {} in {} ms (layer {}): {}",
        r.service, r.outcome, r.duration_ms, r.layer, r.detail
    )
}

pub fn receipts_table(report: &TeardownReport) -> String {
    let rows: Vec<Vec<String>> = report
        .receipts
        .iter()
        .map(|r| {
            vec![
                r.service.clone(),
                r.layer.to_string(),
                r.outcome.to_string(),
                r.duration_ms.to_string(),
                r.detail.clone(),
            ]
        })
        .collect();
    Table::new(&["SERVICE", "LAYER", "OUTCOME", "MS", "DETAIL"])
        .rows(rows)
        .render()
}

pub fn report_json(report: &TeardownReport) -> Value {
    serde_json::to_value(report).unwrap_or(Value::Null)
}

/// Every receipt that is not `stopped`, as one error line each on stderr: a forced or failed
/// stop may have left something running, and must not scroll by as an ordinary line.
pub fn report_troubles(report: &TeardownReport, json: bool) {
    for r in report.troubles() {
        let message = format!(
            "`{}` did not stop cleanly ({}): {}{}",
            r.service,
            r.outcome,
            r.detail,
            if r.lingering {
                "; it may still run and stays recorded"
            } else {
                ""
            }
        );
        if json {
            json_error(&format!("flow.teardown.{}", r.outcome), &message);
        } else {
            let _ = writeln!(io::stderr(), "[flow] error: {message}");
        }
    }
}

/// The answer to `restart`, `stop` or `up <service>` against a running flow, as one JSON
/// document.
pub fn change_json(report: &ChangeReport) -> Value {
    let started: Vec<Value> = report
        .started
        .iter()
        .map(|s| {
            json!({"name": s.name, "state": s.state, "pid": s.pid,
            "endpoints": s.endpoints.iter().map(|(n, a)| json!({"name": n, "address": a})).collect::<Vec<_>>()})
        })
        .collect();
    json!({"operation": report.operation, "supervisor": report.supervisor_pid,
        "clean": report.clean(), "stopped": report_json(&report.stopped), "started": started,
        "unchanged": report.unchanged, "elapsed_ms": report.elapsed_ms})
}

/// The same answer for a person: what was stopped (receipts), what was started (and where),
/// what was left alone.
pub fn change_text(report: &ChangeReport) -> String {
    let pid = report.supervisor_pid;
    let mut out = String::new();
    if !report.stopped.receipts.is_empty() {
        let what = match report.operation.as_str() {
            "restart" => "stopped to restart",
            _ => "stopped; the rest of the flow keeps running",
        };
        out.push_str(&format!(
            "the running `hostd flow up` (pid {pid}) {what}:\n{}",
            receipts_table(&report.stopped)
        ));
    }
    if !report.started.is_empty() {
        let rows: Vec<Vec<String>> = report
            .started
            .iter()
            .map(|s| {
                vec![
                    s.name.clone(),
                    s.state.clone(),
                    s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                    endpoints_text(s.endpoints.iter().map(|(n, a)| (n.as_str(), a.clone()))),
                ]
            })
            .collect();
        let what = match report.operation.as_str() {
            "restart" => "started again",
            _ => "added to the running flow",
        };
        out.push_str(&format!(
            "{what} (pid {pid} supervises), ready in {} ms:\n{}",
            report.elapsed_ms,
            Table::new(&["SERVICE", "STATE", "PID", "ENDPOINTS"])
                .rows(rows)
                .render()
        ));
    }
    if !report.unchanged.is_empty() {
        let how = match report.operation.as_str() {
            "stop" => "already stopped",
            _ => "already running",
        };
        out.push_str(&format!(
            "{how}, left as is: {}\n",
            report.unchanged.join(", ")
        ));
    }
    if out.is_empty() {
        out.push_str("nothing to do\n");
    }
    out
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A flow event as one JSON object.
pub fn event_json(event: &FlowEvent) -> Value {
    match event {
        FlowEvent::Step {
            service,
            step,
            detail,
        } => json!({"event": "step", "service": service, "step": step.as_str(), "detail": detail}),
        FlowEvent::Spawned { service, pid } => {
            json!({"event": "spawned", "service": service, "pid": pid})
        }
        FlowEvent::Waiting {
            service,
            failure,
            elapsed,
            deadline,
        } => json!({
            "event": "waiting", "service": service, "endpoint": failure.endpoint,
            "predicate": failure.predicate.as_str(), "error": failure.last_error,
            "elapsed_ms": ms(*elapsed), "deadline_ms": ms(*deadline),
        }),
        FlowEvent::Output {
            service,
            stream,
            line,
        } => {
            json!({"event": "output", "service": service, "stream": stream.as_str(), "line": line})
        }
        FlowEvent::Exited { service, exit } => {
            json!({"event": "exited", "service": service, "exit": exit})
        }
        FlowEvent::Restarting {
            service,
            attempt,
            delay,
        } => {
            json!({"event": "restarting", "service": service, "attempt": attempt, "delay_ms": ms(*delay)})
        }
        FlowEvent::Failed { service, reason } => {
            json!({"event": "failed", "service": service, "reason": reason})
        }
        FlowEvent::Up { services, elapsed } => {
            json!({"event": "up", "services": services, "elapsed_ms": ms(*elapsed)})
        }
        FlowEvent::TeardownStarted { layers } => json!({"event": "teardown", "layers": layers}),
        FlowEvent::Stopped(r) => json!({"event": "stopped", "receipt": r}),
        FlowEvent::Notice { service, text } => {
            json!({"event": "notice", "service": service, "text": text})
        }
        FlowEvent::Warning { service, text } => {
            json!({"event": "warning", "service": service, "text": text})
        }
    }
}

/// Renders flow events as a person reads them: prefixed service output on stdout, flow lines
/// on stderr, and a progress line for long waits (redrawn in place on a terminal, an
/// occasional plain line otherwise). Writes never fail the flow: a closed pipe
/// (`hostd flow up | head`) must not stop the services.
pub struct Progress {
    width: usize,
    terminal: bool,
    waiting: HashMap<String, String>,
    last_plain: HashMap<String, Instant>,
    drawn: bool,
    spinner: usize,
    /// Service output is left out (a detached `up` writes it only to the service logs).
    quiet_output: bool,
}

impl Progress {
    pub fn new(width: usize, quiet_output: bool) -> Self {
        Progress {
            width,
            terminal: io::stderr().is_terminal(),
            waiting: HashMap::new(),
            last_plain: HashMap::new(),
            drawn: false,
            spinner: 0,
            quiet_output,
        }
    }

    pub fn clear(&mut self) {
        if self.drawn {
            let _ = write!(io::stderr(), "\r\x1b[2K");
            self.drawn = false;
        }
    }

    pub fn flow_line(&mut self, text: String) {
        self.clear();
        let _ = writeln!(io::stderr(), "[flow] {text}");
    }

    fn redraw(&mut self) {
        if !self.terminal || self.waiting.is_empty() {
            return;
        }
        const FRAMES: [char; 4] = ['|', '/', '-', '\\'];
        self.spinner = (self.spinner + 1) % FRAMES.len();
        let mut names: Vec<&String> = self.waiting.keys().collect();
        names.sort();
        let first = names[0];
        let more = if names.len() > 1 {
            format!(" (+{} more)", names.len() - 1)
        } else {
            String::new()
        };
        let mut line = format!(
            "{} waiting: {}{more}",
            FRAMES[self.spinner], self.waiting[first]
        );
        line.truncate(160);
        let mut err = io::stderr();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.drawn = true;
    }

    pub fn show(&mut self, event: FlowEvent) {
        match event {
            FlowEvent::Output {
                service,
                stream,
                line,
            } => {
                if !self.quiet_output {
                    self.clear();
                    let mark = if stream == OutputStream::Stderr {
                        "!"
                    } else {
                        "|"
                    };
                    let _ = writeln!(io::stdout(), "{service:>w$} {mark} {line}", w = self.width);
                }
            }
            FlowEvent::Step {
                service,
                step,
                detail,
            } => {
                if matches!(step, Step::Running | Step::Completed) {
                    self.waiting.remove(&service);
                }
                match step {
                    Step::Load | Step::Init => {
                        tracing::debug!(%service, step = step.as_str(), %detail);
                    }
                    Step::Start => self.flow_line(format!("{service}: started ({detail})")),
                    Step::Running if detail.is_empty() => {
                        self.flow_line(format!("{service}: running"))
                    }
                    Step::Running => self.flow_line(format!("{service}: running at {detail}")),
                    Step::Completed => self.flow_line(format!("{service}: completed ({detail})")),
                }
            }
            FlowEvent::Spawned { .. } => {}
            FlowEvent::Waiting {
                service,
                failure,
                elapsed,
                deadline,
            } => {
                let text = format!(
                    "{} ({:.0}s of {}): {}",
                    service,
                    elapsed.as_secs_f64(),
                    humantime::format_duration(deadline),
                    failure
                );
                self.waiting.insert(service.clone(), text.clone());
                if self.terminal {
                    self.redraw();
                } else if elapsed >= Duration::from_secs(2) {
                    let due = self
                        .last_plain
                        .get(&service)
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(5));
                    if due {
                        self.last_plain.insert(service, Instant::now());
                        self.flow_line(format!("waiting for {text}"));
                    }
                }
            }
            FlowEvent::Exited { service, exit } => {
                self.flow_line(format!("{service}: exited with {exit}"))
            }
            FlowEvent::Restarting {
                service,
                attempt,
                delay,
            } => self.flow_line(format!(
                "{service}: restart #{attempt} in {}",
                humantime::format_duration(delay)
            )),
            FlowEvent::Failed { service, reason } => {
                self.waiting.remove(&service);
                self.flow_line(format!("{service}: FAILED: {reason}"));
            }
            FlowEvent::Up { services, elapsed } => {
                self.waiting.clear();
                self.flow_line(format!(
                    "up: {services} service(s) in {:.1}s",
                    elapsed.as_secs_f64()
                ));
            }
            FlowEvent::TeardownStarted { layers } => {
                self.waiting.clear();
                self.flow_line(format!("tearing down in {layers} layer(s)"));
            }
            FlowEvent::Stopped(r) => self.flow_line(receipt_line(&r)),
            FlowEvent::Notice { service, text } => {
                self.flow_line(format!("{service}: note: {text}"))
            }
            FlowEvent::Warning { service, text } => {
                self.flow_line(format!("{service}: warning: {text}"))
            }
        }
        if !self.waiting.is_empty() {
            self.redraw();
        }
    }
}
