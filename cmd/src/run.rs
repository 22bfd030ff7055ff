//! `hostd run`: workflow runs from the command line, as a HostLink client of a Host that
//! serves `run.*` (these commands never read a run from the store, so tenant scoping always
//! applies), and `hostd run exec` ([`exec`]), which drives a program in this process against
//! the data folder's store. Owns argument parsing, rendering (problems with source frames from
//! the local file, the `ps` table, step journals), the retry of `unavailable` starts and
//! resumes within a deadline, and `logs -f`. Which Host it dials is [`crate::reach`]'s: with
//! `--store`, a live Host of the fleet's registry (the Host holding the run first, when a
//! command concerns one), and `logs -f` follows the run from Host to Host.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use controller::client::{ClientError, HostLinkClient, Publication};
use hostlink::runs::{
    ProblemView, RUN_CAPABILITY, RunAnswered, RunList, RunRefusal, RunReply, RunStarted, RunView,
    refusal_codes,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use timing::Backoff;
use tokio::sync::mpsc;

use crate::exit::CliError;
use crate::output::{Output, Table};
use crate::reach::{Capability, ClientFlags, Dialer, Link, Pick};

mod exec;

/// How long `start` and `resume` keep retrying a Host that answers `unavailable` (booting), and
/// how long `logs -f` keeps looking for another live Host of the registry when its own goes
/// away. Longer than any boot reconcile the Host's own options allow for one page of runs.
pub const RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// The pauses between those tries: from 200 ms, doubled up to 2 s.
const RETRY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));

/// How often `logs -f` re-reads the journal without an event from the run's channel.
const FOLLOW_RESYNC: Duration = Duration::from_secs(5);

/// What `hostd run` needs of the Host it dials.
const RUNS: Capability = Capability {
    method: RUN_CAPABILITY,
    does: "host workflow runs",
    serving: "serving runs",
};

/// Start, answer and watch durable workflow runs on a Host.
#[derive(Debug, Args)]
#[command(
    after_help = "With `hostd serve` running with its defaults, no flags are needed:\n  \
R=$(hostd run start examples/runs/order.yaml --input '{\"order\":\"o-1\"}')\n  \
hostd run status $R\n  hostd run answer $R approve true\n  hostd run logs -f $R\n\
Without a server: hostd run exec program.yaml --input '{...}' drives it in this process against \
the data folder's store (a later hostd serve there resumes it if exec is stopped).\n\
Against a fleet: --store postgres://... --tenant T --token ... (or HOST_STORE_URL, HOST_TENANT, \
HOST_TENANT_TOKEN): a live Host of the registry serving runs is dialled, the one holding the run \
first, and `logs -f` follows the run when it moves to another Host. One Host: --endpoint \
ws://host:port (HOST_ENDPOINT)."
)]
pub struct RunArgs {
    #[command(flatten)]
    client: ClientFlags,
    #[command(subcommand)]
    command: RunCommand,
}

#[derive(Debug, Subcommand)]
enum RunCommand {
    /// Validate a program, start it on the Host and print the run id (the run continues
    /// without this command).
    Start {
        /// The program file (YAML).
        program: PathBuf,
        /// The run's input, as JSON.
        #[arg(long, default_value = "{}")]
        input: String,
        /// A key that makes a retried start return the same run.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Drive a run again that no live attempt holds (its recorded program is used).
    Resume {
        /// The run id.
        run: String,
    },
    /// Answer an open checkpoint (an ask, or an attention point with {"action":"retry"} or
    /// {"action":"skip","output":...}).
    Answer {
        /// The run id.
        run: String,
        /// The checkpoint name (the ask step's name, or `<step>.attempt-<n>`).
        checkpoint: String,
        /// The answer, as JSON (a bare word is taken as a string).
        value: String,
    },
    /// Show a run: state, holder, epoch, the open checkpoint and every journaled step.
    Status {
        /// The run id.
        run: String,
    },
    /// List the tenant's runs, oldest first.
    Ps,
    /// Print a run's step journal; with -f, follow it (woken by the run's channel of step
    /// events) until the run ends.
    Logs {
        /// The run id.
        run: String,
        /// Keep printing new entries until the run is finished.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Cancel a run (its driver is fenced out).
    Cancel {
        /// The run id.
        run: String,
    },
    /// Drive a program in this process, without a server, against the data folder's store:
    /// print the run id, then each step as it ends; exit with the run's outcome.
    Exec(exec::ExecArgs),
}

/// A `run.*` call the link did not carry (the Host went away, or did not answer in time):
/// the method and the client's error, shown as before and classified as a plain failure.
#[derive(Debug, thiserror::Error)]
#[error("{method}: {error}")]
struct CallFailed {
    method: String,
    error: ClientError,
}

impl CallFailed {
    /// Whether the link itself failed (another Host may answer), not the Host's answer.
    fn link_lost(&self) -> bool {
        matches!(
            self.error,
            ClientError::Connect(_) | ClientError::Disconnected { .. } | ClientError::Timeout(_)
        )
    }
}

fn link_lost(e: &anyhow::Error) -> bool {
    e.downcast_ref::<CallFailed>()
        .is_some_and(CallFailed::link_lost)
}

async fn call<T: DeserializeOwned>(
    client: &HostLinkClient,
    method: &str,
    data: Value,
) -> Result<Result<T, RunRefusal>> {
    let text = client
        .run_rpc(method, &data)
        .await
        .map_err(|error| CallFailed {
            method: method.to_owned(),
            error,
        })?;
    RunReply::<T>::decode(text.as_bytes()).map_err(|e| anyhow::anyhow!("{method}: {e}"))
}

fn run_request(run: &str) -> Value {
    json!({"version": 1, "run_id": run})
}

/// The registry id of the Host a run's holder (`<host id>/<attempt>`) names, if any.
fn holder_host(v: &RunView) -> Option<&str> {
    Some(sessionstore::holder_host(&v.holder)).filter(|h| !h.is_empty())
}

fn finished(v: &RunView) -> bool {
    matches!(v.state.as_str(), "completed" | "failed" | "cancelled")
}

/// A link for a command about `run`: through the registry, the Host holding the run when it is
/// live (its driver is woken at once, its channel carries the run's events), else any live Host
/// serving runs (every one reads the shared store); otherwise the one Host there is.
async fn link_for_run(dialer: &Dialer, run: &str, accepting: bool) -> Result<Link> {
    let link = dialer
        .dial(Pick {
            accepting,
            ..Pick::default()
        })
        .await?;
    if !dialer.fails_over() {
        return Ok(link);
    }
    let Ok(Ok(v)) = call::<RunView>(&link.client, "run.status", run_request(run)).await else {
        return Ok(link);
    };
    match holder_host(&v) {
        Some(h) if !finished(&v) && link.host.as_deref() != Some(h) => {
            match dialer
                .dial(Pick {
                    only: Some(h),
                    accepting,
                    ..Pick::default()
                })
                .await
            {
                Ok(holder) => {
                    link.client.close();
                    Ok(holder)
                }
                Err(_) => Ok(link),
            }
        }
        _ => Ok(link),
    }
}

/// A Host's refusal as a coded error (its code is the exit's code); an unknown code keeps its
/// text in the message and is classified `refused`.
fn refused(r: RunRefusal) -> anyhow::Error {
    const KNOWN: &[&str] = &[
        refusal_codes::NOT_FOUND,
        refusal_codes::CONFLICT,
        refusal_codes::UNAVAILABLE,
        refusal_codes::RESOURCE_EXHAUSTED,
        refusal_codes::INVALID,
        refusal_codes::STATE,
        refusal_codes::NOT_ADMITTING,
        refusal_codes::PROGRAM_MISSING,
    ];
    match KNOWN.iter().find(|c| **c == r.code) {
        Some(code) => CliError::refused(code, r.message).into(),
        None => CliError::refused("refused", format!("{}: {}", r.code, r.message)).into(),
    }
}

/// Calls `method`, retrying while the Host answers `unavailable`, until [`RETRY_DEADLINE`].
async fn call_retrying<T: DeserializeOwned>(
    client: &HostLinkClient,
    method: &str,
    data: Value,
    out: Output,
) -> Result<Result<T, RunRefusal>> {
    let began = Instant::now();
    let mut retries = RETRY_BACKOFF.retries();
    let mut told = false;
    loop {
        match call::<T>(client, method, data.clone()).await? {
            Err(r) if r.code == refusal_codes::UNAVAILABLE && began.elapsed() < RETRY_DEADLINE => {
                if !told {
                    out.note(format_args!(
                        "the Host is not ready ({}); retrying",
                        r.message
                    ));
                    told = true;
                }
                tokio::time::sleep(retries.next_wait()).await;
            }
            other => return Ok(other),
        }
    }
}

/// Renders problems with a frame of the local source, one block per problem.
pub fn render_problems(path: &str, source: &str, problems: &[ProblemView]) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::new();
    for p in problems {
        let step = p
            .step
            .as_ref()
            .map(|s| format!(" (step `{s}`)"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{path}:{}:{}: [{}]{step} {}\n",
            p.line, p.column, p.code, p.message
        ));
        if p.line > 0
            && let Some(text) = lines.get(p.line - 1)
        {
            out.push_str(&format!("  {:>4} | {text}\n", p.line));
            out.push_str(&format!(
                "       | {}^\n",
                " ".repeat(p.column.saturating_sub(1))
            ));
        }
    }
    out
}

fn time(ms: i64) -> String {
    humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
    )
    .to_string()
}

fn journal_lines(v: &RunView, after: u64) -> Vec<String> {
    v.journal
        .iter()
        .filter(|e| e.seq > after)
        .map(|e| {
            let outcome = e.outcome.as_deref().unwrap_or("-");
            format!(
                "{:>4}  {}  {:<16} {:<8} {:<14} epoch {} attempt {}  {}",
                e.seq,
                time(e.recorded_at_ms),
                e.step,
                e.entry,
                outcome,
                e.epoch,
                e.attempt,
                e.body
            )
        })
        .collect()
}

fn status_text(v: &RunView) -> String {
    let mut s = format!(
        "run {}\n  state   {}\n  holder  {}\n  epoch   {}\n  started by {}\n",
        v.run_id,
        v.state,
        v.holder,
        v.epoch,
        crate::output::actor_text(v.started_by.as_deref())
    );
    if let Some(step) = &v.step {
        s.push_str(&format!("  step    {step}\n"));
    }
    if let Some(f) = &v.failure {
        s.push_str(&format!(
            "  failure {} at step {}: {}\n",
            f.code, f.step, f.message
        ));
    }
    if let Some(c) = &v.checkpoint {
        s.push_str(&format!("  open    {} ({})", c.name, c.kind));
        if let Some(q) = &c.question {
            s.push_str(&format!(": {q}"));
        }
        if let Some(schema) = &c.schema {
            s.push_str(&format!("  answer schema {schema}"));
        }
        if let Some(d) = c.deadline_at_ms {
            s.push_str(&format!("  until {}", time(d)));
        }
        s.push('\n');
        if c.kind != "sleep" {
            s.push_str(&format!(
                "  answer with: hostd run answer {} {} <json>\n",
                v.run_id, c.name
            ));
        }
    }
    for a in &v.answers {
        s.push_str(&format!(
            "  answered {} by {} at {}\n",
            a.checkpoint,
            a.answerer,
            time(a.answered_at_ms)
        ));
    }
    s.push_str("  journal\n");
    for l in journal_lines(v, 0) {
        s.push_str(&format!("  {l}\n"));
    }
    s
}

fn parse_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Stable codes of what `hostd run` refuses before it dials a Host.
pub mod local_codes {
    /// The program file does not exist.
    pub const FILE_NOT_FOUND: &str = "file_not_found";
    /// The program file exists but cannot be read as text.
    pub const FILE_UNREADABLE: &str = "file_unreadable";
    /// `--input` is not JSON.
    pub const INVALID_INPUT: &str = "invalid_input";
    /// A run id or checkpoint name that no Host could know (empty, or with control characters).
    pub const INVALID_ID: &str = "invalid_id";
}

/// What a subcommand needs from the local side, read and checked before any Host is dialled.
enum Local {
    Start { source: String, input: Value },
    Other,
}

fn id_arg(what: &str, text: &str) -> Result<()> {
    if text.is_empty() || text.chars().any(char::is_control) {
        return Err(CliError::refused(
            local_codes::INVALID_ID,
            format!("{what} {text:?} is not an id (empty, or with control characters)"),
        )
        .into());
    }
    Ok(())
}

/// Reads the program file and parses the arguments: a mistake here is the caller's, and must
/// say so (with its own code) whether or not a Host is reachable.
/// The program file's text, or the caller's mistake with its code.
fn read_program(program: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(program).map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            local_codes::FILE_NOT_FOUND
        } else {
            local_codes::FILE_UNREADABLE
        };
        CliError::refused(
            code,
            format!("cannot read the program {}: {e}", program.display()),
        )
        .into()
    })
}

/// `--input` as JSON, or the caller's mistake with its code.
fn read_input(input: &str) -> Result<Value> {
    serde_json::from_str(input).map_err(|e| {
        CliError::refused(
            local_codes::INVALID_INPUT,
            format!("--input is not JSON: {e}"),
        )
        .into()
    })
}

fn local(command: &RunCommand) -> Result<Local> {
    match command {
        RunCommand::Start { program, input, .. } => {
            let source = read_program(program)?;
            let input = read_input(input)?;
            Ok(Local::Start { source, input })
        }
        RunCommand::Exec(_) => Ok(Local::Other),
        RunCommand::Answer {
            run, checkpoint, ..
        } => {
            id_arg("the run id", run)?;
            id_arg("the checkpoint", checkpoint)?;
            Ok(Local::Other)
        }
        RunCommand::Resume { run }
        | RunCommand::Status { run }
        | RunCommand::Logs { run, .. }
        | RunCommand::Cancel { run } => {
            id_arg("the run id", run)?;
            Ok(Local::Other)
        }
        RunCommand::Ps => Ok(Local::Other),
    }
}

pub async fn run(args: RunArgs, out: Output) -> Result<ExitCode> {
    if let RunCommand::Exec(a) = args.command {
        return exec::run(a, &args.client, out).await;
    }
    let local = local(&args.command)?;
    let dialer = match Dialer::new(&args.client, "hostd-run", RUNS).await {
        // No Host at all: a program can still be driven here, without a server.
        Err(e) if no_host(&e) => {
            return Err(match &args.command {
                RunCommand::Start { program, .. } => CliError::refused(
                    "no_host",
                    format!(
                        "{e}; or drive the program in this process without a server: hostd run \
                         exec {}",
                        program.display()
                    ),
                )
                .into(),
                _ => e,
            });
        }
        other => other?,
    };
    let result = dispatch(&dialer, &args.command, local, out).await;
    dialer.close().await;
    result
}

async fn dispatch(
    dialer: &Dialer,
    command: &RunCommand,
    local: Local,
    out: Output,
) -> Result<ExitCode> {
    let any = Pick::default();
    match command {
        RunCommand::Start {
            program,
            idempotency_key,
            ..
        } => {
            let Local::Start { source, input } = local else {
                bail!("internal: start without its program");
            };
            let link = dialer
                .dial(Pick {
                    accepting: true,
                    ..any
                })
                .await?;
            let mut data = json!({"version": 1, "program": source, "input": input});
            if let Some(k) = idempotency_key {
                data["idempotency_key"] = json!(k);
            }
            match call_retrying::<RunStarted>(&link.client, "run.start", data, out).await? {
                Ok(s) => {
                    out.record(&s.run_id, || json!(s))?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(r) if !r.problems.is_empty() => {
                    let text =
                        render_problems(&program.display().to_string(), &source, &r.problems);
                    if out.is_json() {
                        out.record("", || json!(r))?;
                    } else {
                        eprint!("{text}");
                    }
                    Err(refused(r))
                }
                Err(r) => Err(refused(r)),
            }
        }
        RunCommand::Resume { run } => {
            let link = link_for_run(dialer, run, true).await?;
            match call_retrying::<RunStarted>(&link.client, "run.resume", run_request(run), out)
                .await?
            {
                Ok(s) => {
                    out.record(format_args!("{} epoch {}", s.run_id, s.epoch), || json!(s))?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(r) if r.code == refusal_codes::UNAVAILABLE => Err(anyhow::anyhow!(
                    "{}: {} — retry with: hostd run resume {run}",
                    r.code,
                    r.message
                )),
                Err(r) => Err(refused(r)),
            }
        }
        RunCommand::Answer {
            run,
            checkpoint,
            value,
        } => {
            let link = link_for_run(dialer, run, false).await?;
            let data = json!({"version": 1, "run_id": run, "checkpoint": checkpoint, "value": parse_value(value)});
            let a: RunAnswered = call(&link.client, "run.answer", data)
                .await?
                .map_err(refused)?;
            let human = if a.recorded {
                format!("answered {} of {}", a.checkpoint, a.run_id)
            } else {
                format!("{} of {} was already answered so", a.checkpoint, a.run_id)
            };
            out.record(human, || json!(a))?;
            Ok(ExitCode::SUCCESS)
        }
        RunCommand::Status { run } => {
            let link = dialer.dial(any).await?;
            let v: RunView = call(&link.client, "run.status", run_request(run))
                .await?
                .map_err(refused)?;
            out.record(status_text(&v).trim_end(), || json!(v))?;
            Ok(ExitCode::SUCCESS)
        }
        RunCommand::Ps => {
            let link = dialer.dial(any).await?;
            // Every run, a page at a time (the Host answers at most a page per call).
            let mut list = RunList {
                runs: Vec::new(),
                next: None,
            };
            let mut after: Option<String> = None;
            loop {
                let mut data = json!({"version": 1});
                if let Some(a) = &after {
                    data["after"] = json!(a);
                }
                let page: RunList = call(&link.client, "run.list", data)
                    .await?
                    .map_err(refused)?;
                list.runs.extend(page.runs);
                match page.next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            if out.is_json() {
                out.record("", || json!(list))?;
            } else {
                out.table(&ps_table(&list))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        RunCommand::Logs { run, follow } => logs(dialer, run, *follow, out).await,
        RunCommand::Exec(_) => bail!("internal: exec is not a HostLink command"),
        RunCommand::Cancel { run } => {
            let link = link_for_run(dialer, run, false).await?;
            let v: RunView = call(&link.client, "run.cancel", run_request(run))
                .await?
                .map_err(refused)?;
            out.record(format_args!("{} {}", v.run_id, v.state), || json!(v))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `run ps` as a table: the run id, state, step, epoch and creation time of each run.
fn ps_table(list: &RunList) -> Table {
    Table::new(&["RUN", "STATE", "STEP", "EPOCH", "CREATED"])
        .least_width(0, 36)
        .least_width(1, 15)
        .least_width(2, 16)
        .least_width(3, 5)
        .right(3)
        .rows(list.runs.iter().map(|r| {
            [
                r.run_id.clone(),
                r.state.clone(),
                r.step.clone().unwrap_or_else(|| "-".into()),
                r.epoch.to_string(),
                time(r.created_at_ms),
            ]
        }))
}

/// Subscribes `link` to the run's channel of step events, or says it follows by polling.
async fn subscribe(
    link: &Link,
    run: &sessionstore::RunId,
    out: Output,
) -> Option<mpsc::Receiver<Publication>> {
    match link.client.subscribe_run(run).await {
        Ok(rx) => Some(rx),
        Err(e) => {
            out.note(format_args!(
                "the run's channel is not available ({e}); following by polling"
            ));
            None
        }
    }
}

/// Dials another live Host of the registry for `run` after `lost` went away, trying until
/// [`RETRY_DEADLINE`] while no Host can be reached.
async fn relink(dialer: &Dialer, run: &str, lost: &Link, out: Output) -> Result<Link> {
    out.note(format_args!(
        "lost the link to {}; following run {run} on another Host of the registry",
        lost.name()
    ));
    lost.client.close();
    let began = Instant::now();
    let mut retries = RETRY_BACKOFF.retries();
    loop {
        match link_for_run(dialer, run, false).await {
            Ok(link) => {
                out.note(format_args!("following run {run} on {}", link.name()));
                return Ok(link);
            }
            Err(e) if began.elapsed() < RETRY_DEADLINE && no_host(&e) => {
                tokio::time::sleep(retries.next_wait()).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn no_host(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<CliError>(), Some(CliError::Refused { code, .. }) if *code == "no_host")
}

/// `run logs`: the journal; with `follow`, every new entry until the run ends, woken by the
/// run's channel of step events. Through the registry it follows the run to the Host holding
/// it, and when its Host goes away it dials another live one and reads the journal again
/// (every Host reads the shared store), printing each entry once.
async fn logs(dialer: &Dialer, run: &str, follow: bool, out: Output) -> Result<ExitCode> {
    let id =
        if follow {
            Some(sessionstore::RunId::new(run.to_owned()).map_err(|e| {
                CliError::refused(local_codes::INVALID_ID, format!("the run id: {e}"))
            })?)
        } else {
            None
        };
    let mut link = match &id {
        Some(_) => link_for_run(dialer, run, false).await?,
        None => dialer.dial(Pick::default()).await?,
    };
    // Subscribed before the first read, so no event after it is missed.
    let mut events = match &id {
        Some(id) => subscribe(&link, id, out).await,
        None => None,
    };
    let mut after = 0;
    // The holder this follower last moved to (or failed to), so it tries each one once.
    let mut moved_to: Option<String> = None;
    loop {
        let v: RunView = match call(&link.client, "run.status", run_request(run)).await {
            Ok(reply) => reply.map_err(refused)?,
            Err(e) if follow && dialer.fails_over() && link_lost(&e) => {
                link = relink(dialer, run, &link, out).await?;
                if let Some(id) = &id {
                    events = subscribe(&link, id, out).await;
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        for e in v.journal.iter().filter(|e| e.seq > after) {
            let line = journal_lines(&v, after)
                .into_iter()
                .find(|l| l.trim_start().starts_with(&format!("{} ", e.seq)))
                .unwrap_or_default();
            out.record(line, || json!(e))?;
        }
        after = v.journal.last().map(|e| e.seq).unwrap_or(after);
        if !follow || finished(&v) {
            if follow {
                out.note(format_args!("run {} is {}", v.run_id, v.state));
            }
            return Ok(ExitCode::SUCCESS);
        }
        // The run's events are published by the Host driving it: move to that Host when the
        // run has moved to another live one.
        if let (Some(holder), Some(id)) = (holder_host(&v), &id)
            && dialer.fails_over()
            && link.host.as_deref() != Some(holder)
            && moved_to.as_deref() != Some(holder)
        {
            moved_to = Some(holder.to_owned());
            let pick = Pick {
                only: Some(holder),
                ..Pick::default()
            };
            if let Ok(to) = dialer.dial(pick).await {
                link.client.close();
                link = to;
                events = subscribe(&link, id, out).await;
                continue;
            }
        }
        match &mut events {
            // An event says the journal moved: read it again. The channel carries the events
            // of the Host this link reaches; a run driven (or taken over) by another Host of
            // the fleet publishes there, so the journal is also re-read every FOLLOW_RESYNC.
            Some(rx) => tokio::select! {
                e = rx.recv() => if e.is_none() {
                    events = None;
                    if dialer.fails_over() {
                        // The link ended: the next read fails over to another Host.
                        continue;
                    }
                    out.note(format_args!("the run's channel ended; following by polling"));
                },
                _ = tokio::time::sleep(FOLLOW_RESYNC) => {}
            },
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_is_rendered_with_a_frame_of_the_local_file() {
        let source = "steps:\n  - name: a\n    sleep: soon\n";
        let text = render_problems(
            "p.yaml",
            source,
            &[ProblemView {
                code: "program.duration".into(),
                message: "bad".into(),
                step: Some("a".into()),
                line: 3,
                column: 12,
            }],
        );
        assert_eq!(
            text,
            "p.yaml:3:12: [program.duration] (step `a`) bad\n     3 |     sleep: soon\n       |            ^\n"
        );
    }

    #[test]
    fn the_client_retries_a_booting_host_for_longer_than_a_boot_takes() {
        assert!(RETRY_DEADLINE > Duration::from_secs(10));
    }
}
