//! `hostd run exec`: drives a program in this process, with no server, against the data
//! folder's SQLite store — the same run records, pinning and replay driver a Host uses, so a
//! `hostd serve` on that folder can resume a run an exec left behind (Ctrl-C, a crash).
//!
//! **Holder.** An exec holds its run as `run-exec-<pid>/<attempt>`: a holder that names no
//! registered Host, so a serving Host judges it by its run lease alone. While the exec lives it
//! renews the lease, so a Host's boot reconcile and its scans leave the run alone and a
//! `hostd run resume` of it is refused `conflict`; once the exec is gone the lease lapses
//! (`--run-lease`) and a Host of the folder takes the run over under the next epoch by itself.
//! A first SIGINT or SIGTERM stops the drive at its next step boundary, writes nothing for the
//! step, and hands the lease back at once; a second one leaves without waiting.
//!
//! **Beside `hostd serve`.** Both may use one data folder at once: they share the SQLite file
//! (one writer at a time, waiting on each other), exec's runs are never taken by the Host while
//! the exec renews them, and an ask an exec waits on is answered through that Host
//! (`hostd run answer`); the exec sees the answer on its next poll.
//!
//! Owns the exec's holder, its step lines and its exit statuses; driving is `workflow`'s.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use hostlink::auth::CredentialStore;
use hostlink::runs::ProblemView;
use run_hosting::RunOptions;
use serde_json::json;
use sessionstore::{NewRun, RunId, Store, StoreOptions};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use workflow::{
    DriveEnd, Driver, DriverOptions, StartRefusal, StepEvent, StepEvents, StoreReleases,
    WorkspaceRunnables, pin_new_run,
};

use super::{read_input, read_program, render_problems};
use crate::config::DriveFlags;
use crate::exit::{self, CliError};
use crate::local::LOCAL_TENANT;
use crate::output::Output;
use crate::reach::ClientFlags;
use crate::signals::StopSignals;

/// Exit status of a run that ended failed or cancelled (its outcome is known).
const EXIT_ENDED: u8 = 3;
/// Exit status of a run that was recorded and is not finished (parked for an operator,
/// stopped, taken over, or left without a decision): it can be resumed.
const EXIT_UNFINISHED: u8 = 4;

/// Arguments of `hostd run exec`.
#[derive(Debug, Args)]
#[command(after_help = "\
Drives the program in this process against the data folder's SQLite store (--data-dir, \
default ./.hostd): the run is validated, pinned to its releases (built from the workspace — \
--runnables, else this folder when it holds runnables/ — and published to that store) and \
recorded exactly as `hostd run start` does on a Host. It prints the \
run id first, then one line per step as it ends. A `hostd serve` may run on the same folder at \
the same time; agent steps need one (start such a program there instead).\n\n\
Exit status: 0 the run completed; 1 refused, nothing recorded (the program does not validate, a \
release cannot be pinned, a file or --input is wrong); 2 usage error; 3 the run ended failed or \
cancelled; 4 the run is recorded but not finished (it needs an operator, was stopped by a \
signal, or a Host took it over): `hostd run resume <id>` on a Host of this folder goes on.\n\n\
Ctrl-C stops at the next step boundary and hands the run back at once; a second Ctrl-C leaves \
without waiting (then a Host takes the run over once its lease lapses).")]
pub struct ExecArgs {
    /// The program file (YAML).
    program: PathBuf,
    /// The run's input, as JSON.
    #[arg(long, default_value = "{}")]
    input: String,
    #[command(flatten)]
    drive: DriveFlags,
}

/// The holder of every run this process drives.
fn holder() -> String {
    format!(
        "run-exec-{}/{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    )
}

/// Prints each step as it ends (and where it waits).
struct StepLines {
    out: Output,
    run: String,
}

impl StepEvents for StepLines {
    fn event(&self, e: StepEvent) {
        if !matches!(
            e.phase.as_str(),
            "finished" | "failed" | "attention" | "parked" | "answered"
        ) {
            return;
        }
        let took = e
            .duration_ms
            .map(|ms| format!(" {ms}ms"))
            .unwrap_or_default();
        let human = format!("{:<16} {:<6} {}{took}", e.step, e.kind, e.phase);
        let _ = self.out.record(human, || json!(e));
        if e.kind == "ask" && e.phase == "parked" {
            self.out.note(format_args!(
                "step {} waits for an answer: `hostd run answer {} {} <json>` through a `hostd \
                 serve` on this data folder",
                e.step, self.run, e.step
            ));
        }
    }
}

/// Checks the tenant's token against the data folder's credentials when it has any; a folder
/// no Host has used yet holds none, and then only the local tenant may be named. Returns the
/// actor the run is started as (the token's principal, else the tenant).
fn authenticate(client: &ClientFlags, tenant: &sessionstore::TenantId) -> Result<String> {
    let data = client.location.data();
    let creds = data.credentials_path();
    if !creds.exists() {
        if tenant.as_str() == LOCAL_TENANT {
            return Ok(hostlink::auth::actor_of(tenant, None));
        }
        return Err(CliError::refused(
            "cannot_authenticate",
            format!(
                "cannot check the token for tenant {tenant}: {} holds no credentials; nothing \
                 was recorded",
                creds.display()
            ),
        )
        .into());
    }
    let token = client.tenant.token(&data, tenant)?;
    let store = CredentialStore::load(Some(&creds), None)
        .with_context(|| format!("reading the credentials in {}", creds.display()))?;
    store
        .check(tenant, &token)
        .map(|g| g.actor(tenant))
        .map_err(|_| {
            CliError::refused(
                "unauthenticated",
                format!("the token was refused for tenant {tenant}: nothing was recorded"),
            )
            .into()
        })
}

pub async fn run(args: ExecArgs, client: &ClientFlags, out: Output) -> Result<ExitCode> {
    let location = &client.location;
    if location.store.is_some() || location.endpoint.is_some() {
        return Err(CliError::usage(
            "`hostd run exec` drives against the data folder's SQLite store (--data-dir); to \
             run a program on a Host of another store, use `hostd run start`",
        )
        .into());
    }
    let source = read_program(&args.program)?;
    let input = read_input(&args.input)?;
    let options = RunOptions {
        lease: args.drive.run_lease.unwrap_or(RunOptions::default().lease),
        ..RunOptions::default()
    };
    options
        .validate()
        .map_err(|e| CliError::usage(format!("--run-lease: {e}")))?;
    let tenant = client.tenant.tenant(None)?;
    let actor = authenticate(client, &tenant)?;
    // The workspace: --runnables, else this folder when it holds runnables/ (as for
    // `hostd runnable`), else none (a program that invokes is refused).
    let workspace = args.drive.runnables.clone().or_else(|| {
        std::path::Path::new(::runnable::workspace::RUNNABLES_DIR)
            .is_dir()
            .then(|| PathBuf::from("."))
    });
    let runner = match &workspace {
        Some(dir) => Some(::runnable::Runner::open(dir).map_err(|e| {
            CliError::refused("workspace", format!("--runnables {}: {e}", dir.display()))
        })?),
        None => None,
    };
    let data = location.data();
    data.ensure()?;
    let store = Store::open(StoreOptions::new(data.store_url()?))
        .await
        .context("opening the data folder's store")?;
    let result = Exec {
        program: &args.program,
        source: &source,
        input,
        tenant,
        actor,
        options,
        out,
    }
    .drive(runner, &data.root, &store)
    .await;
    store.close().await;
    result
}

/// One program to drive, read and checked.
struct Exec<'a> {
    program: &'a std::path::Path,
    source: &'a str,
    input: serde_json::Value,
    tenant: sessionstore::TenantId,
    /// Who starts the run (the token's principal, else the tenant).
    actor: String,
    options: RunOptions,
    out: Output,
}

impl Exec<'_> {
    /// Pins, records and drives the run; its exit status.
    async fn drive(
        self,
        runner: Option<::runnable::Runner>,
        data_root: &std::path::Path,
        store: &Store,
    ) -> Result<ExitCode> {
        let Exec {
            program,
            source,
            input,
            tenant,
            actor,
            options,
            out,
        } = self;
        let releases = Arc::new(StoreReleases::new(
            store.clone(),
            runner.clone(),
            &data_root.join("runnables"),
        ));
        let env = Arc::new(WorkspaceRunnables {
            runner,
            agents: BTreeSet::new(),
        });
        let pins = match pin_new_run(source, env.as_ref(), releases.as_ref()).await {
            Ok(p) => p,
            Err(StartRefusal::Problems(problems)) => {
                let views: Vec<ProblemView> = problems
                    .into_iter()
                    .map(|p| ProblemView {
                        code: p.code,
                        message: p.message,
                        step: p.step,
                        line: p.line,
                        column: p.column,
                    })
                    .collect();
                let message = format!(
                    "the program has {} problem(s); nothing was recorded",
                    views.len()
                );
                if out.is_json() {
                    // As `hostd run start` prints a Host's refusal: the problems as data.
                    out.record(
                        "",
                        || json!({"code": "invalid", "message": message, "problems": views}),
                    )?;
                } else {
                    eprint!(
                        "{}",
                        render_problems(&program.display().to_string(), source, &views)
                    );
                }
                return Err(CliError::refused("invalid", message).into());
            }
            Err(StartRefusal::Release(e)) => {
                return Err(CliError::refused(
                    e.code(),
                    format!("the program's releases cannot be pinned: {e}; nothing was recorded"),
                )
                .into());
            }
        };
        let mut signals = StopSignals::listen()?;
        let run_id = RunId::new(format!("run-{}", uuid::Uuid::now_v7().simple()))?;
        let created = store
            .create_run(NewRun {
                run_id: run_id.clone(),
                tenant,
                source: source.to_owned(),
                input: input.to_string(),
                holder: holder(),
                fencing_token: uuid::Uuid::now_v7().simple().to_string(),
                lease: options.lease,
                idempotency_key: None,
                pins,
                started_by: Some(actor),
                trace: None,
            })
            .await
            .context("recording the run")?;
        let status = created.status;
        let fence = status.fence();
        let id = run_id.to_string();
        out.record(&id, || json!({"run_id": id, "epoch": status.epoch}))?;
        let driver = Driver {
            journal: Arc::new(store.clone()),
            env,
            releases: releases.clone(),
            invoker: releases,
            agents: None,
            events: Arc::new(StepLines {
                out,
                run: id.clone(),
            }),
            options: DriverOptions {
                lease: options.lease,
                poll: options.poll,
                // Nothing here scans for due runs: the one driver waits in place.
                park: None,
            },
        };
        let stop = CancellationToken::new();
        let mut drive = tokio::spawn({
            let stop = stop.clone();
            async move { driver.drive(status, Arc::new(Notify::new()), stop).await }
        });
        let ended = tokio::select! {
            r = &mut drive => r,
            name = signals.next() => {
                out.note(format_args!(
                    "{name}: stopping run {id} at its next step boundary (again to leave at once)"
                ));
                stop.cancel();
                tokio::select! {
                    r = &mut drive => r,
                    name = signals.next() => {
                        out.warn(format_args!(
                            "{name}: leaving run {id} where it is; a Host of this data folder takes \
                             it over once its lease lapses ({}), or `hostd run resume {id}` then",
                            humantime::format_duration(options.lease)
                        ));
                        return Ok(exit::code(EXIT_UNFINISHED));
                    }
                }
            }
        };
        let end = match ended {
            Ok(end) => end,
            Err(e) => {
                out.error(format_args!("run {id}: the driver stopped: {e}"));
                return Ok(exit::code(EXIT_UNFINISHED));
            }
        };
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                out.error(format_args!(
                    "run {id} stopped without a decision ([{}] {e}); it stays running: resume it \
                 with `hostd run resume {id}` on a Host of this data folder",
                    e.code()
                ));
                return Ok(exit::code(EXIT_UNFINISHED));
            }
        };
        if end == DriveEnd::Stopped {
            // Nothing was written for the step; hand the run back so a Host may take it at once.
            if let Err(e) = store.release_run(&fence).await {
                tracing::warn!(error = %e, "could not hand the run's lease back");
            }
        }
        let now = store.run_status(None, &run_id).await?;
        let state = now.as_ref().map(|s| s.state);
        let failure = now.as_ref().and_then(|s| s.failure.clone());
        out.record(
        format_args!(
            "{id} {}",
            state.map(|s| s.as_str()).unwrap_or("unknown")
        ),
        || {
            json!({
                "run_id": id,
                "state": state.map(|s| s.as_str()),
                "epoch": now.as_ref().map(|s| s.epoch),
                "failure": failure.as_ref().map(|f| json!({"code": f.code, "step": f.step, "message": f.message})),
            })
        },
    )?;
        Ok(match end {
            DriveEnd::Completed => ExitCode::SUCCESS,
            DriveEnd::Failed { code, step } => {
                let message = failure.map(|f| f.message).unwrap_or_default();
                out.error(format_args!(
                    "run {id} failed at step {step}: [{code}] {message}"
                ));
                exit::code(EXIT_ENDED)
            }
            DriveEnd::Cancelled => {
                out.error(format_args!("run {id} was cancelled"));
                exit::code(EXIT_ENDED)
            }
            DriveEnd::NeedsAttention { step, checkpoint } => {
                out.error(format_args!(
                    "run {id} needs an operator at step {step}: whether its effect happened is \
                 unknown. Answer `hostd run answer {id} {checkpoint} '{{\"action\":\"retry\"}}'` \
                 (or skip) through a `hostd serve` on this data folder"
                ));
                exit::code(EXIT_UNFINISHED)
            }
            DriveEnd::Parked { step } => {
                // This driver never parks (it waits in place), so only a bug lands here.
                out.error(format_args!(
                    "run {id} was handed back to the store at step {step}; a `hostd serve` on \
                 this data folder wakes it"
                ));
                exit::code(EXIT_UNFINISHED)
            }
            DriveEnd::Fenced => {
                out.error(format_args!(
                "run {id} was taken over by a Host ({}); follow it with `hostd run logs -f {id}`",
                now.map(|s| s.holder).unwrap_or_default()
            ));
                exit::code(EXIT_UNFINISHED)
            }
            DriveEnd::Stopped => {
                out.note(format_args!(
                "run {id} stopped; resume it with `hostd run resume {id}` on a Host of this data \
                 folder (a `hostd serve` there also takes it over by itself)"
            ));
                exit::code(EXIT_UNFINISHED)
            }
        })
    }
}
