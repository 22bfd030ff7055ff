//! `hostd runnable`: the command-line face of `::runnable` — list, show, build,
//! invoke, publish, and the recorded releases (`releases`, `prune`, in [`releases`]). This module owns argument parsing, rendering (text and `--json`), exit
//! statuses and signal handling for an invocation; every decision is the library's (and the
//! session store's, for publish).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use ::runnable::deps;
use ::runnable::projection;
use ::runnable::{Invocation, InvokeRequest, OutcomeClass, RunnableError, Runner};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use sessionstore::{NewPackage, Publication, Store, StoreOptions};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::output::Table;
use crate::reach::{HostLocation, TenantFlags};

mod releases;
mod report;

use report::{print_json, refuse};

/// Exit status of a certain failure (the handler said it failed).
const EXIT_FAILED: u8 = 3;
/// Exit status of an uncertain outcome (the effect is unknown).
const EXIT_UNKNOWN: u8 = 4;

/// Arguments of `hostd runnable`.
#[derive(Debug, Args)]
#[command(
    after_help = "A workspace is a folder whose runnables/<folder>/runnable.yaml files \
declare runnables; identities read <workspace>/<name>@<version>, where <workspace> is the \
folder's own name. Try:\n  hostd runnable -w examples/runnables list\n  \
hostd runnable -w examples/runnables invoke word-count --input '{\"text\":\"a b c\"}'\n\n\
Refusals print `hostd: [<code>] <reason>` on stderr (and {\"error\": {\"code\", ...}} on stdout \
with --json); codes: invalid, workspace, bad_reference, not_found, ambiguous, conflict, \
integrity, build, invalid_input, unresolved_dependency, spawn, not_a_tool, io, store."
)]
pub struct RunnableArgs {
    /// The workspace folder (the one holding runnables/).
    #[arg(
        short = 'w',
        long,
        global = true,
        default_value = ".",
        value_name = "DIR"
    )]
    workspace: PathBuf,

    #[command(subcommand)]
    command: RunnableCommand,
}

#[derive(Debug, Subcommand)]
enum RunnableCommand {
    /// List every runnable of the workspace (fails if any declaration does not load).
    List(JsonFlag),
    /// Show one runnable: identity, contract, entrypoint and dependency report.
    Show(ShowArgs),
    /// Package a release: the declaration and handler files under one SHA-256 digest.
    Build(BuildArgs),
    /// Run a release once with an input and report its outcome.
    Invoke(InvokeArgs),
    /// Build a release and store its package in the session store, for every Host.
    Publish(PublishArgs),
    /// List the workspace's recorded releases and whether each still matches its folder.
    Releases(JsonFlag),
    /// Remove recorded releases (the stale ones, named ones, or --all), never one a live run
    /// is pinned to.
    Prune(releases::PruneArgs),
}

#[derive(Debug, Args)]
struct JsonFlag {
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(disable_version_flag = true)]
struct ShowArgs {
    /// `name`, `name@version` or `workspace/name@version`.
    reference: String,
    /// Select this version (the same as `name@version`).
    #[arg(long, value_name = "VERSION")]
    version: Option<String>,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Without --output the package is recorded as the release in \
<workspace>/.hostd/runnables/releases: building the same content again changes nothing, and \
changed content under a recorded version is refused as a conflict (give it a new version). \
--output writes an unreleased package into a new folder, for inspection, and records nothing."
)]
struct BuildArgs {
    /// `name`, `name@version` or `workspace/name@version`.
    reference: String,
    /// Write an unreleased package into this folder, which must not exist yet.
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(disable_version_flag = true)]
#[command(
    after_help = "The input is validated before anything starts. The handler runs \
once, from the recorded release's package (built first if needed), in its own process group; \
at its timeout the group gets SIGTERM, then SIGKILL. Ctrl-C (or SIGTERM) cancels the same way.\n\n\
Exit status: 0 succeeded; 1 refused, nothing ran (bad input, unknown or ambiguous name, \
conflict, ...); 2 usage error; 3 failed (the handler said so: certain); 4 invalid_output, \
crashed, timed_out or cancelled (the effect is unknown).\n\n\
Without --intent-id a fresh intent id is minted and printed: pass it again to retry the same \
intent, and the handler sees the same effect_id."
)]
struct InvokeArgs {
    /// `name`, `name@version` or `workspace/name@version`.
    reference: String,
    /// The input: JSON text, or @FILE to read it from a file (@- for stdin).
    #[arg(long, value_name = "JSON|@FILE")]
    input: String,
    /// Select this version (the same as `name@version`).
    #[arg(long, value_name = "VERSION")]
    version: Option<String>,
    /// The intent this invocation serves (reuse it to retry).
    #[arg(long, value_name = "ID")]
    intent_id: Option<String>,
    /// An explicit idempotency key (default: derived from the intent and the release).
    #[arg(long, value_name = "ID")]
    effect_id: Option<String>,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "The package goes into the store the location flags name: --store (a fleet's \
PostgreSQL), else the store of the data folder's Host. A published package is the fleet's, not \
a tenant's: --tenant and --token are not used, and --endpoint is refused without --store (a Host \
is not a store)."
)]
struct PublishArgs {
    /// `name`, `name@version` or `workspace/name@version`.
    reference: String,
    #[command(flatten)]
    location: HostLocation,
    // Declared as for every family; a package is not a tenant's, so they go unused.
    #[command(flatten)]
    _tenant: TenantFlags,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

fn with_version(reference: &str, version: &Option<String>) -> String {
    match version {
        Some(v) => format!("{}@{v}", reference.split('@').next().unwrap_or(reference)),
        None => reference.to_owned(),
    }
}

pub async fn run(mut args: RunnableArgs, json: bool) -> Result<ExitCode> {
    match &mut args.command {
        RunnableCommand::List(f) => f.json = json,
        RunnableCommand::Show(a) => a.json = json,
        RunnableCommand::Build(a) => a.json = json,
        RunnableCommand::Invoke(a) => a.json = json,
        RunnableCommand::Publish(a) => a.json = json,
        RunnableCommand::Releases(f) => f.json = json,
        RunnableCommand::Prune(a) => a.json = json,
    }
    let runner = match Runner::open(&args.workspace) {
        Ok(r) => r,
        Err(e) => {
            let json = match &args.command {
                RunnableCommand::List(f) => f.json,
                RunnableCommand::Show(a) => a.json,
                RunnableCommand::Build(a) => a.json,
                RunnableCommand::Invoke(a) => a.json,
                RunnableCommand::Publish(a) => a.json,
                RunnableCommand::Releases(f) => f.json,
                RunnableCommand::Prune(a) => a.json,
            };
            return Ok(refuse(&e, json));
        }
    };
    match args.command {
        RunnableCommand::List(f) => Ok(list(&runner, f.json)),
        RunnableCommand::Show(a) => Ok(show(
            &runner,
            &with_version(&a.reference, &a.version),
            a.json,
        )),
        RunnableCommand::Build(a) => Ok(build(&runner, a)),
        RunnableCommand::Invoke(a) => invoke(&runner, a).await,
        RunnableCommand::Publish(a) => publish(&runner, a).await,
        RunnableCommand::Releases(f) => Ok(releases::list(&runner, f.json)),
        RunnableCommand::Prune(a) => releases::prune(&runner, a).await,
    }
}

fn list(runner: &Runner, json: bool) -> ExitCode {
    let catalog = match runner.catalog() {
        Ok(c) => c,
        Err(e) => return refuse(&e, json),
    };
    let root = &catalog.workspace.root;
    if json {
        let rows: Vec<Value> = catalog
            .runnables
            .iter()
            .map(|d| {
                Value::Object(projection::summary(
                    d,
                    catalog.recorded_digest(d).as_ref(),
                    root,
                ))
            })
            .collect();
        print_json(&Value::Array(rows));
        return ExitCode::SUCCESS;
    }
    if catalog.runnables.is_empty() {
        println!("no runnables in workspace {}", catalog.workspace.name);
        return ExitCode::SUCCESS;
    }
    let table = Table::new(&["IDENTITY", "EFFECT", "TIMEOUT", "DIGEST", "DESCRIPTION"]).rows(
        catalog.runnables.iter().map(|d| {
            [
                d.identity.to_string(),
                d.effect.as_str().to_owned(),
                projection::timeout_text(d),
                catalog
                    .recorded_digest(d)
                    .map(|g| format!("{}…", &g.as_str()[..19]))
                    .unwrap_or_else(|| "-".into()),
                d.description.clone(),
            ]
        }),
    );
    // A closed pipe is a quiet end, not a panic.
    let _ = std::io::stdout()
        .lock()
        .write_all(table.render().as_bytes());
    ExitCode::SUCCESS
}

fn show(runner: &Runner, reference: &str, json: bool) -> ExitCode {
    let catalog = match runner.catalog() {
        Ok(c) => c,
        Err(e) => return refuse(&e, json),
    };
    let decl = match catalog.resolve(reference) {
        Ok(d) => d,
        Err(e) => return refuse(&e, json),
    };
    let root = &catalog.workspace.root;
    // A recorded release whose bytes no longer verify is flagged (invoke refuses it).
    if let Err(e) =
        ::runnable::package::read_recorded(&catalog.workspace.release_path(&decl.identity))
    {
        eprintln!("hostd: [{}] {e}", e.code());
    }
    let report = deps::report(decl, Some(root));
    let doc = projection::show(decl, catalog.recorded_digest(decl).as_ref(), root, &report);
    if json {
        print_json(&Value::Object(doc));
        return ExitCode::SUCCESS;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", decl.identity);
    if !decl.description.is_empty() {
        let _ = writeln!(out, "  {}", decl.description);
    }
    let get = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or("-").to_owned();
    for (label, key) in [
        ("effect", "effect"),
        ("timeout", "timeout"),
        ("command", "command"),
        ("file", "file"),
        ("digest", "digest"),
    ] {
        let _ = writeln!(out, "{label:>9}: {}", get(key));
    }
    for (label, schema) in [("input", &decl.input), ("output", &decl.output)] {
        let text = serde_json::to_string_pretty(&schema.to_json()).unwrap_or_default();
        let _ = writeln!(out, "{label:>9}: {}", text.replace('\n', "\n           "));
    }
    if report.is_empty() {
        let _ = writeln!(out, "     deps: none");
    }
    for r in &report {
        let _ = writeln!(
            out,
            "     deps: {}/{} as {}: {}",
            r.service,
            r.endpoint,
            r.env,
            match &r.reason {
                None => "resolved".to_owned(),
                Some(why) => format!("unresolved ({why})"),
            }
        );
    }
    ExitCode::SUCCESS
}

fn build(runner: &Runner, a: BuildArgs) -> ExitCode {
    let built = match &a.output {
        Some(dir) => runner.build_to(&a.reference, dir),
        None => runner.build(&a.reference),
    };
    let built = match built {
        Ok(b) => b,
        Err(e) => return refuse(&e, a.json),
    };
    let files: Vec<Value> = built
        .package
        .files
        .iter()
        .map(|f| json!({"path": f.path, "size": f.bytes.len(), "executable": f.executable}))
        .collect();
    if a.json {
        print_json(&json!({
            "identity": built.package.identity.to_string(),
            "digest": built.package.digest.as_str(),
            "package": built.path.display().to_string(),
            "written": built.written,
            "released": a.output.is_none(),
            "files": files,
        }));
    } else {
        println!("{} {}", built.package.identity, built.package.digest);
        eprintln!(
            "hostd: {} {} ({} file(s), {} bytes){}",
            if built.written { "wrote" } else { "unchanged:" },
            built.path.display(),
            built.package.files.len(),
            built.package.size(),
            if a.output.is_some() {
                " — unreleased"
            } else {
                ""
            }
        );
    }
    ExitCode::SUCCESS
}

fn read_input(spec: &str) -> Result<Value, RunnableError> {
    let bad = |reason: String| RunnableError::BadReference {
        reference: "--input".into(),
        reason,
    };
    let text = match spec.strip_prefix('@') {
        Some("-") => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .map_err(|e| bad(format!("cannot read stdin: {e}")))?;
            s
        }
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?
        }
        None => spec.to_owned(),
    };
    // Exactly one JSON value: trailing data is refused.
    serde_json::from_str::<Value>(&text).map_err(|e| bad(format!("is not one JSON value: {e}")))
}

async fn invoke(runner: &Runner, a: InvokeArgs) -> Result<ExitCode> {
    let input = match read_input(&a.input) {
        Ok(v) => v,
        Err(e) => return Ok(refuse(&e, a.json)),
    };
    let reference = with_version(&a.reference, &a.version);
    let release = match runner.release(&reference) {
        Ok(r) => r,
        Err(e) => return Ok(refuse(&e, a.json)),
    };
    let cancel = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let watcher = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            eprintln!("hostd: cancelling: stopping the handler's process group");
            cancel.cancel();
        })
    };
    let minted = a.intent_id.is_none();
    let result = ::runnable::invoke(
        &release,
        InvokeRequest {
            input,
            intent_id: a.intent_id,
            effect_id: a.effect_id,
        },
        runner.options(),
        &cancel,
    )
    .await;
    watcher.abort();
    let inv = match result {
        Ok(i) => i,
        Err(e) => return Ok(refuse(&e, a.json)),
    };
    Ok(report_invocation(&inv, a.json, minted))
}

fn report_invocation(inv: &Invocation, json: bool, minted: bool) -> ExitCode {
    if json {
        print_json(&serde_json::to_value(inv).unwrap_or(Value::Null));
    } else {
        if let Some(out) = &inv.output {
            print_json(out);
        }
        eprintln!(
            "hostd: {}: {} ({}) — {}",
            inv.identity,
            inv.outcome,
            if inv.certain {
                "certain"
            } else {
                "effect unknown"
            },
            inv.detail
        );
        if minted {
            eprintln!(
                "hostd: intent {} (pass --intent-id {} to retry this intent)",
                inv.intent_id, inv.intent_id
            );
        }
        eprintln!(
            "hostd: effect {}; handler log: {}",
            inv.effect_id,
            inv.log.display()
        );
    }
    match inv.outcome {
        OutcomeClass::Succeeded => ExitCode::SUCCESS,
        OutcomeClass::Failed => ExitCode::from(EXIT_FAILED),
        _ => ExitCode::from(EXIT_UNKNOWN),
    }
}

async fn publish(runner: &Runner, a: PublishArgs) -> Result<ExitCode> {
    let built = match runner.build(&a.reference) {
        Ok(b) => b,
        Err(e) => return Ok(refuse(&e, a.json)),
    };
    let url = a.location.store_url("hostd runnable publish")?;
    let store = Store::open(StoreOptions::new(url))
        .await
        .map_err(|e| anyhow::anyhow!("[store] cannot open the session store: {e}"))?;
    let id = &built.package.identity;
    let published = store
        .publish_package(NewPackage {
            workspace: id.workspace.clone(),
            name: id.name.clone(),
            version: id.version.clone(),
            digest: built.package.digest.to_string(),
            bytes: built.package.encode(),
        })
        .await;
    store.close().await;
    let published = published.map_err(|e| anyhow::anyhow!("[store] {e}"))?;
    let (status, summary) = match &published {
        Publication::Recorded(s) => ("published", s),
        Publication::Unchanged(s) => ("unchanged", s),
        Publication::Conflict { recorded } => {
            let err = RunnableError::Conflict {
                identity: id.to_string(),
                recorded: recorded.digest.clone(),
                offered: built.package.digest.to_string(),
            };
            return Ok(refuse(&err, a.json));
        }
    };
    if a.json {
        print_json(&json!({
            "identity": summary.identity(),
            "digest": summary.digest,
            "size": summary.size,
            "status": status,
        }));
    } else {
        println!("{} {}", summary.identity(), summary.digest);
        eprintln!(
            "hostd: {status} in the session store ({} bytes)",
            summary.size
        );
    }
    Ok(ExitCode::SUCCESS)
}
