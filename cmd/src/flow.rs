//! `hostd flow`: the command-line face of `::flow`. This module owns argument
//! parsing, signal handling, the detached `up`, and which view each subcommand prints (the
//! views themselves are in `render` and `graph_view`); it must never hold flow behaviour of
//! its own — every decision is the library's. Every refusal is printed with its stable code
//! (as one JSON object under `--json`), and a non-`stopped` receipt is a non-zero exit.

mod graph_view;
mod render;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use ::flow::logs::{self, LogFollower, LogLine};
use ::flow::recover::{self, RecoveryPreview};
use ::flow::state::{self, StatePaths};
use ::flow::teardown::TeardownBudget;
use ::flow::{
    ChangeReport, ChangeRequest, DownAction, DownOptions, DryRun, EnvOverride, EventSink, Flow,
    FlowEndReason, FlowError, FlowEvent, FlowOptions, GraphError, ManifestError, Selection, Stage,
    dotenv,
};
use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use render::{Out, Progress};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::output::Table;

/// Arguments of `hostd flow`.
#[derive(Debug, Args)]
#[command(
    after_help = "A workspace is a folder with a flow.yaml naming its services. Start with\n  \
    hostd flow -w examples/flow up\nthen, from another shell: status, logs -f, down."
)]
pub struct FlowArgs {
    /// The workspace folder (the one holding flow.yaml).
    #[arg(
        short = 'w',
        long,
        global = true,
        default_value = ".",
        value_name = "DIR"
    )]
    workspace: PathBuf,

    #[command(subcommand)]
    command: FlowCommand,
}

#[derive(Debug, Subcommand)]
enum FlowCommand {
    /// Start the services (all, or some with what they need), wait until each is ready,
    /// stream their merged output, and keep them running until Ctrl-C or `hostd flow down`.
    /// With services named while a flow runs here, add them (and what they need) to it.
    Up(UpArgs),
    /// Restart services of the running flow: stop each (SIGTERM, then SIGKILL, its whole
    /// process group), start it again with the same environment and ports, wait until it is
    /// ready. Its dependents keep running.
    Restart(RestartArgs),
    /// Withdraw services from the running flow; the rest keeps running. A service running
    /// services depend on is refused unless --with-dependents.
    Stop(StopArgs),
    /// Stop what `up` started in this workspace, from any shell: consumers first, each layer
    /// within its budget (SIGTERM, then SIGKILL), with a receipt per service.
    Down(DownArgs),
    /// Show the recorded flow: service, state (probed now), pid, endpoints, restarts.
    Status(StatusArgs),
    /// Print the services' logs merged in time order (or one service's).
    Logs(LogsArgs),
    /// Print the dependency graph per stage, as text or Graphviz DOT.
    Graph(GraphArgs),
    /// Print the environment the running flow gives a service (or, for the target of
    /// `up --only-deps`, would give it), as a .env file.
    Env(EnvArgs),
    /// Get out of a group `down` refuses (its leader exited, processes remain): preview
    /// exactly what would be stopped, then stop exactly that.
    Recover(RecoverArgs),
    /// Start what a service's tests need, run a test command with the service's
    /// environment, tear down, and exit with the command's status.
    Test(TestArgs),
}

#[derive(Debug, Args)]
struct UpArgs {
    /// Start only these services and what they need at run time (a service two of them
    /// need is started once).
    services: Vec<String>,
    /// Start the service's dependencies but not the service itself (e.g. to run it in a
    /// debugger yourself; `hostd flow env <service>` prints its environment).
    #[arg(long, conflicts_with = "stand_alone")]
    only_deps: bool,
    /// Start the service without its dependencies (they run elsewhere, on fixed ports).
    #[arg(long)]
    stand_alone: bool,
    /// Print what would be started (layers, commands, addresses, environments) and start
    /// nothing.
    #[arg(long)]
    dry_run: bool,
    /// Override one variable of one service, after everything else: SERVICE:KEY=VALUE
    /// (repeatable). The value is taken literally.
    #[arg(long = "set", value_name = "SERVICE:KEY=VALUE")]
    set: Vec<String>,
    /// Once up, write the environment of the (one) named service to this file.
    #[arg(long, value_name = "FILE")]
    env_file: Option<PathBuf>,
    /// Start in the background: return once everything is up (`hostd flow down` stops it;
    /// its own output goes to .hostd/flow/up.log).
    #[arg(short, long)]
    detach: bool,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
    #[command(flatten)]
    timings: Timings,
    /// Internal: this process is the background half of `up --detach`.
    #[arg(long, hide = true)]
    detached_child: bool,
}

#[derive(Debug, Args)]
struct RestartArgs {
    /// The services to restart.
    #[arg(required = true)]
    services: Vec<String>,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
struct StopArgs {
    /// The services to withdraw.
    #[arg(required = true)]
    services: Vec<String>,
    /// Also stop the running services that depend on them, consumers first.
    #[arg(long)]
    with_dependents: bool,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
struct DownArgs {
    /// How long each teardown layer may take before SIGKILL (default: what `up` ran with).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    teardown_budget: Option<Duration>,
    /// Show what would be signalled (and what would be refused), signal nothing.
    #[arg(long)]
    dry_run: bool,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
struct LogsArgs {
    /// Only this service's log.
    service: Option<String>,
    /// Keep printing new lines as they are written (Ctrl-C to stop).
    #[arg(short, long)]
    follow: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StageArg {
    Build,
    Run,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum GraphFormat {
    Text,
    Dot,
}

#[derive(Debug, Args)]
struct GraphArgs {
    /// Only this stage (default: both).
    #[arg(long)]
    stage: Option<StageArg>,
    /// `text` for reading, `dot` for `dot -Tsvg`.
    #[arg(long, default_value = "text")]
    format: GraphFormat,
}

#[derive(Debug, Args)]
struct EnvArgs {
    /// The service.
    service: String,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("step").required(true).args(["preview", "expect"])))]
struct RecoverArgs {
    /// The service whose recorded process group `down` refused.
    service: String,
    /// List the processes a recovery would stop and the evidence they are the flow's; save
    /// that list for `--expect`.
    #[arg(long)]
    preview: bool,
    /// Where `--preview` saves its list (default: .hostd/flow/recover-<service>.json).
    #[arg(long, value_name = "FILE", requires = "preview")]
    save: Option<PathBuf>,
    /// Stop exactly the processes of this reviewed preview; refused if the group changed.
    #[arg(long, value_name = "FILE")]
    expect: Option<PathBuf>,
    /// How long the processes get after SIGTERM before SIGKILL (default: what `up` ran with).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    teardown_budget: Option<Duration>,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum TestDeps {
    /// Start nothing: the command gets the service's environment only.
    None,
    /// Start the service's dependencies, not the service (the command is the service's
    /// tests).
    Dependencies,
    /// Start the service and its dependencies (the command tests the running service).
    Stack,
}

#[derive(Debug, Args)]
struct TestArgs {
    /// The service whose tests run.
    service: String,
    /// What to start before the command.
    #[arg(long, value_enum, default_value = "dependencies")]
    deps: TestDeps,
    #[command(flatten)]
    timings: Timings,
    /// The test command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// How long `up` and `test` wait for readiness and give each teardown layer. The defaults
/// shown and used are [`FlowOptions`]' own.
#[derive(Debug, Args)]
struct Timings {
    /// How long each start of a service (or run of a one-shot job) may take to be ready.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = duration_text(FlowOptions::default().readiness_timeout))]
    readiness_timeout: Duration,
    /// How long each teardown layer may take before SIGKILL.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = duration_text(FlowOptions::default().teardown_layer_budget))]
    teardown_budget: Duration,
}

impl Timings {
    /// The flow's options with these timings.
    fn options(&self) -> FlowOptions {
        FlowOptions {
            readiness_timeout: self.readiness_timeout,
            teardown_layer_budget: self.teardown_budget,
            ..FlowOptions::default()
        }
    }
}

/// A duration as `--readiness-timeout` and `--teardown-budget` read it (`2m`, `15s`).
fn duration_text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration like 30s or 2m: {e}"))
}

/// Runs one `hostd flow` command. Refusals are printed here, each with its stable code, so
/// the caller only sees an exit code.
pub async fn run(mut args: FlowArgs, json: bool) -> Result<ExitCode> {
    match &mut args.command {
        FlowCommand::Up(a) => a.json = json,
        FlowCommand::Restart(a) => a.json = json,
        FlowCommand::Stop(a) => a.json = json,
        FlowCommand::Down(a) => a.json = json,
        FlowCommand::Status(a) => a.json = json,
        FlowCommand::Env(a) => a.json = json,
        _ => {}
    }
    let root = args.workspace;
    let result = match args.command {
        FlowCommand::Up(a) => up(&root, a).await,
        FlowCommand::Restart(a) => {
            let request = ChangeRequest::Restart {
                services: a.services,
            };
            change(&root, &request, a.json).await
        }
        FlowCommand::Stop(a) => {
            let request = ChangeRequest::Stop {
                services: a.services,
                with_dependents: a.with_dependents,
            };
            change(&root, &request, a.json).await
        }
        FlowCommand::Down(a) => down(&root, a).await,
        FlowCommand::Status(a) => status(&root, a).await,
        FlowCommand::Logs(a) => logs(&root, a).await,
        FlowCommand::Graph(a) => graph(&root, a),
        FlowCommand::Env(a) => env(&root, a),
        FlowCommand::Recover(a) => recover_cmd(&root, a).await,
        FlowCommand::Test(a) => test(&root, a).await,
    };
    Ok(match result {
        Ok(code) => code,
        Err(e) if is_quiet_end(&e) => ExitCode::SUCCESS,
        Err(e) => {
            report_error(&e, json);
            ExitCode::FAILURE
        }
    })
}

/// A reader that went away (`hostd flow logs | head`) ends a command quietly.
fn is_quiet_end(e: &anyhow::Error) -> bool {
    render::is_broken_pipe(e)
}

/// The stable code of an error the library refused with, if it is one.
fn code_of(e: &anyhow::Error) -> Option<&str> {
    e.chain().find_map(|c| {
        c.downcast_ref::<FlowError>()
            .map(FlowError::code)
            .or_else(|| c.downcast_ref::<GraphError>().map(GraphError::code))
            .or_else(|| c.downcast_ref::<ManifestError>().map(ManifestError::code))
    })
}

fn report_error(e: &anyhow::Error, json: bool) {
    let code = code_of(e).unwrap_or("flow.cli");
    let message = format!("{e:#}");
    if json {
        render::json_error(code, &message);
    } else {
        let _ = writeln!(std::io::stderr(), "hostd flow: {code}: {message}");
    }
}

/// A token cancelled by the first SIGINT, SIGTERM or (unless `ignore_hangup`) SIGHUP. A
/// closed terminal must tear the flow down, not kill `up` and leave its services running;
/// a detached `up` has no terminal and ignores SIGHUP instead.
fn cancel_on_signals(ignore_hangup: bool) -> Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    let t = token.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = int.recv() => break,
                _ = term.recv() => break,
                _ = hup.recv() => if !ignore_hangup { break },
            }
        }
        t.cancel();
    });
    Ok(token)
}

fn selection_of(args: &UpArgs) -> Selection {
    Selection {
        targets: args.services.clone(),
        only_deps: args.only_deps,
        stand_alone: args.stand_alone,
    }
}

fn load_flow(root: &Path, args: &UpArgs) -> Result<Flow> {
    let options = args.timings.options();
    let overrides = args
        .set
        .iter()
        .map(|s| EnvOverride::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Flow::load(root, options)?.with_overrides(overrides)?)
}

async fn up(root: &Path, args: UpArgs) -> Result<ExitCode> {
    let flow = load_flow(root, &args)?;
    let selection = selection_of(&args);
    if args.env_file.is_some() && selection.origin().is_none() {
        return Err(FlowError::InvalidSelection(
            "--env-file writes one service's environment: name exactly one service".into(),
        )
        .into());
    }
    if args.dry_run {
        let plan = flow.dry_run(&selection)?;
        print_dry_run(&plan, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(code) = add_to_running(root, &args).await? {
        return Ok(code);
    }
    if args.detach && !args.detached_child {
        return detach(root, &flow, &args).await;
    }
    let plan = flow.plan(&selection)?;
    let width = plan
        .nodes()
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(4)
        .max(4);
    let cancel = cancel_on_signals(args.detached_child)?;
    let (sink, mut rx) = EventSink::channel(8192);
    let (shown_up, up_shown) = tokio::sync::oneshot::channel::<()>();
    let json = args.json;
    let quiet_output = args.detached_child;
    let printer = tokio::spawn(async move {
        let mut view = Progress::new(width, quiet_output);
        let mut shown_up = Some(shown_up);
        while let Some(event) = rx.recv().await {
            let is_up = matches!(event, FlowEvent::Up { .. });
            if json {
                let _ = Out::json(&render::event_json(&event));
            } else {
                view.show(event);
            }
            if is_up && let Some(tx) = shown_up.take() {
                let _ = tx.send(());
            }
        }
        view.clear();
    });

    let result = flow.up(selection.clone(), sink, cancel.clone()).await;
    let mut export_failed = false;
    let code = match result {
        Ok(running) => {
            // Let the event lines up to "up" print first, so the table comes after them.
            let _ = tokio::time::timeout(Duration::from_secs(1), up_shown).await;
            if let (Some(file), Some(origin)) = (&args.env_file, selection.origin()) {
                let env = running.environment(origin).unwrap_or_default();
                match std::fs::write(file, dotenv(env)) {
                    Ok(()) if !json => eprintln_flow(&format!(
                        "wrote the environment of `{origin}` to {}",
                        file.display()
                    )),
                    Ok(()) => {}
                    // The flow is up: it is stopped, never abandoned, when the export fails.
                    Err(e) => {
                        let error = anyhow!(e).context(format!("cannot write {}", file.display()));
                        report_error(&error, json);
                        export_failed = true;
                        cancel.cancel();
                    }
                }
            }
            // An interruption right after "up" may already be tearing down: then there is no
            // table to show, and the teardown must still be waited for.
            let status = running.status().await.unwrap_or_default();
            if status.is_empty() {
                // Nothing to show.
            } else if json {
                let services: Vec<Value> = status
                    .iter()
                    .map(|s| {
                        json!({"name": s.name, "state": s.state, "pid": s.pid,
                        "endpoints": s.endpoints.iter().map(|(n, a)| json!({"name": n, "address": a.to_string()})).collect::<Vec<_>>(),
                        "restarts": s.restarts})
                    })
                    .collect();
                let _ = Out::json(&json!({"event": "status", "services": services}));
            } else {
                let rows: Vec<Vec<String>> = status
                    .iter()
                    .map(|s| {
                        vec![
                            s.name.clone(),
                            s.state.clone(),
                            s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                            render::endpoints_text(
                                s.endpoints.iter().map(|(n, a)| (n.as_str(), a.to_string())),
                            ),
                            s.restarts.to_string(),
                        ]
                    })
                    .collect();
                let _ = write!(
                    std::io::stderr(),
                    "{}",
                    Table::new(&["SERVICE", "STATE", "PID", "ENDPOINTS", "RESTARTS"]).rows(rows)
                );
                if let Some(origin) = selection.origin().filter(|_| selection.only_deps) {
                    eprintln_flow(&format!(
                        "`{origin}` was not started: `hostd flow env {origin}` prints the environment to run it with"
                    ));
                }
                if args.detached_child {
                    eprintln_flow("running in the background: `hostd flow down` stops it");
                } else {
                    eprintln_flow("press Ctrl-C (or run `hostd flow down`) to stop");
                }
            }
            let end = running.wait().await;
            let troubled = !end.teardown.all_stopped();
            render::report_troubles(&end.teardown, json);
            let code = match end.reason {
                FlowEndReason::Cancelled | FlowEndReason::Shutdown => {
                    if troubled || export_failed {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                FlowEndReason::Failed(e) => {
                    if json {
                        render::json_error(e.code(), &e.to_string());
                    } else {
                        eprintln_flow(&format!("the flow failed: {}: {e}", e.code()));
                    }
                    ExitCode::FAILURE
                }
            };
            if json {
                let _ = Out::json(
                    &json!({"event": "end", "teardown": render::report_json(&end.teardown)}),
                );
            }
            code
        }
        Err(failure) => {
            let interrupted = matches!(failure.error, FlowError::Interrupted);
            if json {
                render::json_error(failure.error.code(), &failure.error.to_string());
            } else if interrupted {
                eprintln_flow("interrupted; everything started was stopped");
            } else {
                eprintln_flow(&format!("{}: {}", failure.error.code(), failure.error));
            }
            render::report_troubles(&failure.teardown, json);
            if interrupted {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    };
    let _ = printer.await;
    Ok(code)
}

/// `up <service>...` while a flow runs in the workspace: asks its `up` to add them (and what
/// they need). `None` when no flow runs there (a new one is started), or when the arguments
/// describe a new flow (`--only-deps`, `--stand-alone`, `--set`), which the running one
/// refuses as before.
async fn add_to_running(root: &Path, args: &UpArgs) -> Result<Option<ExitCode>> {
    if args.services.is_empty()
        || args.detached_child
        || args.only_deps
        || args.stand_alone
        || !args.set.is_empty()
    {
        return Ok(None);
    }
    let request = ChangeRequest::Add {
        services: args.services.clone(),
    };
    let report = match ::flow::control::request(root, &request).await {
        Ok(report) => report,
        Err(FlowError::NotRunning { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if let (Some(file), [origin]) = (&args.env_file, args.services.as_slice()) {
        let env = state::read_state(&StatePaths::for_workspace(root))?
            .and_then(|r| r.service(origin).map(|s| s.env.clone()))
            .unwrap_or_default();
        std::fs::write(file, dotenv(&env))
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    show_change(&report, args.json)?;
    Ok(Some(ExitCode::SUCCESS))
}

/// `restart` and `stop`: the running `up` applies the change and answers with receipts.
async fn change(root: &Path, request: &ChangeRequest, json: bool) -> Result<ExitCode> {
    let report = ::flow::control::request(root, request).await?;
    show_change(&report, json)?;
    if report.clean() {
        return Ok(ExitCode::SUCCESS);
    }
    render::report_troubles(&report.stopped, json);
    Ok(ExitCode::FAILURE)
}

fn show_change(report: &ChangeReport, json: bool) -> Result<()> {
    if json {
        return Out::json(&render::change_json(report));
    }
    Out::text(&render::change_text(report))
}

fn eprintln_flow(text: &str) {
    let _ = writeln!(std::io::stderr(), "[flow] {text}");
}

fn print_dry_run(plan: &DryRun, json: bool) -> Result<()> {
    if json {
        let services: Vec<Value> = plan
            .services
            .iter()
            .map(|s| {
                json!({
                    "name": s.name, "program": s.program, "args": s.args, "cwd": s.cwd,
                    "endpoints": s.endpoints.iter().map(|(n, a)| json!({"name": n, "address": a.to_string()})).collect::<Vec<_>>(),
                    "env": s.env.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
                    "job": s.job, "excluded": s.excluded, "restart": s.restart.policy.as_str(),
                    "waits_for": s.waits_for,
                })
            })
            .collect();
        let notices: Vec<Value> = plan
            .notices
            .iter()
            .map(|(s, t)| json!({"service": s, "text": t}))
            .collect();
        return Out::json(
            &json!({"layers": plan.layers, "services": services, "notices": notices}),
        );
    }
    let mut out = String::from("dry run: nothing is started\nstart layers:\n");
    for (i, layer) in plan.layers.iter().enumerate() {
        out.push_str(&format!("  {i}: {}\n", layer.join(", ")));
    }
    for (service, text) in &plan.notices {
        out.push_str(&format!("note: {service}: {text}\n"));
    }
    for s in &plan.services {
        let mut what = vec![if s.job { "one-shot job" } else { "service" }.to_owned()];
        if s.excluded {
            what.push("not started (--only-deps)".into());
        }
        what.push(format!("restart {}", s.restart.policy.as_str()));
        out.push_str(&format!("\n{} ({})\n", s.name, what.join(", ")));
        out.push_str(&format!(
            "  command: {} {}\n  cwd: {}\n",
            s.program.display(),
            s.args.join(" "),
            s.cwd.display()
        ));
        if !s.waits_for.is_empty() {
            out.push_str(&format!("  waits for: {}\n", s.waits_for.join(", ")));
        }
        out.push_str(&format!(
            "  endpoints: {}\n  env:\n",
            render::endpoints_text(s.endpoints.iter().map(|(n, a)| (n.as_str(), a.to_string())))
        ));
        for (k, v) in &s.env {
            out.push_str(&format!("    {k}={v}\n"));
        }
    }
    Out::text(&out)
}

/// `up --detach`: starts the same `up` in the background (its own process group, no
/// terminal, output to .hostd/flow/up.log) and returns once the state file says it is up,
/// or with its error when it fails first. Ctrl-C meanwhile stops it.
async fn detach(root: &Path, flow: &Flow, args: &UpArgs) -> Result<ExitCode> {
    // Refuse what the background `up` would refuse, here, before anything starts.
    flow.plan(&selection_of(args))?;
    let paths = flow.paths().clone();
    std::fs::create_dir_all(&paths.dir)
        .with_context(|| format!("cannot create {}", paths.dir.display()))?;
    let log_path = paths.dir.join("up.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let exe = std::env::current_exe().context("cannot find the hostd executable")?;
    let mut argv: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "-d" && a != "--detach")
        .collect();
    argv.push("--detached-child".into());
    let mut child = std::process::Command::new(exe)
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("cannot share the log file")?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("cannot start the background `hostd flow up`")?;
    let pid = child.id() as i32;
    let cancel = cancel_on_signals(false)?;
    loop {
        if let Some(exit) = child.try_wait().context("cannot watch the background up")? {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = said.lines().rev().take(20).collect();
            for line in tail.into_iter().rev() {
                let _ = writeln!(std::io::stderr(), "{line}");
            }
            return Ok(match exit.code() {
                Some(0) => ExitCode::FAILURE,
                Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
                None => ExitCode::FAILURE,
            });
        }
        if let Ok(Some(recorded)) = state::read_state(&paths)
            && recorded.up
            && recorded.supervisor.pid == pid
        {
            break;
        }
        tokio::select! {
            _ = cancel.cancelled() => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
                let _ = tokio::task::spawn_blocking(move || child.wait()).await;
                eprintln_flow("interrupted; the background up was stopped");
                return Ok(ExitCode::from(130));
            }
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    let status = ::flow::status(root, FlowOptions::default().probe_timeout)
        .await?
        .ok_or_else(|| anyhow!("the background up recorded nothing"))?;
    if let (Some(file), Some(origin)) = (&args.env_file, selection_of(args).origin()) {
        let env = state::read_state(&paths)?
            .and_then(|r| r.service(origin).map(|s| s.env.clone()))
            .unwrap_or_default();
        if let Err(e) = std::fs::write(file, dotenv(&env)) {
            let error = anyhow!(e).context(format!(
                "cannot write {}; the flow runs in the background (pid {pid}): `hostd flow down` stops it",
                file.display()
            ));
            report_error(&error, args.json);
            return Ok(ExitCode::FAILURE);
        }
    }
    if args.json {
        let mut doc = status_json(&status);
        doc["log"] = json!(log_path);
        Out::json(&doc)?;
    } else {
        Out::text(&status_text(&status))?;
        Out::line(&format!(
            "running in the background (pid {pid}); `hostd flow down` stops it; its output: {}",
            log_path.display()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn down(root: &Path, args: DownArgs) -> Result<ExitCode> {
    if args.dry_run {
        return down_preview(root, args.json);
    }
    let options = DownOptions {
        teardown_layer_budget: args.teardown_budget,
        kill_grace: None,
    };
    let report = ::flow::down(root, &options).await?;
    let paths = StatePaths::for_workspace(root);
    if args.json {
        Out::json(&json!({
            "action": match report.action {
                DownAction::NothingRecorded => json!({"kind": "nothing-recorded"}),
                DownAction::AskedSupervisor { pid } => json!({"kind": "asked-supervisor", "pid": pid}),
                DownAction::StoppedDirectly => json!({"kind": "stopped-directly"}),
            },
            "clean": report.clean(),
            "retained": report.retained,
            "teardown": render::report_json(&report.teardown),
        }))?;
    } else {
        match report.action {
            DownAction::NothingRecorded => {
                Out::line(&format!("no flow is recorded in {}", root.display()))?;
                return Ok(ExitCode::SUCCESS);
            }
            DownAction::AskedSupervisor { pid } => Out::line(&format!(
                "asked the running `hostd flow up` (pid {pid}) to stop; its receipts:"
            ))?,
            DownAction::StoppedDirectly => Out::line(
                "the `hostd flow up` that started this flow is gone; stopped its recorded process groups:",
            )?,
        }
        Out::text(&render::receipts_table(&report.teardown))?;
    }
    if report.clean() {
        return Ok(ExitCode::SUCCESS);
    }
    render::report_troubles(&report.teardown, args.json);
    if !report.retained.is_empty() && !args.json {
        let _ = writeln!(
            std::io::stderr(),
            "[flow] still recorded in {} (they may still run): {}; `hostd flow down --dry-run` shows them",
            paths.state_file.display(),
            report.retained.join(", ")
        );
    }
    Ok(ExitCode::FAILURE)
}

fn down_preview(root: &Path, json: bool) -> Result<ExitCode> {
    let Some(preview) = ::flow::down::preview(root)? else {
        if json {
            Out::json(&json!({"recorded": false}))?;
        } else {
            Out::line(&format!("no flow is recorded in {}", root.display()))?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    if json {
        let entries: Vec<Value> = preview
            .entries
            .iter()
            .map(|e| {
                json!({"service": e.service, "layer": e.layer, "pgid": e.pgid, "verdict": e.verdict,
                "detail": e.detail, "members": e.members.iter().map(|(p, c)| json!({"pid": p, "command": c})).collect::<Vec<_>>()})
            })
            .collect();
        Out::json(
            &json!({"recorded": true, "supervisor": preview.supervisor_alive, "entries": entries}),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = String::from("dry run: nothing is signalled\n");
    match preview.supervisor_alive {
        Some(pid) => out.push_str(&format!(
            "the `hostd flow up` (pid {pid}) still runs: `down` would ask it to stop, which stops:\n"
        )),
        None => out.push_str("the `hostd flow up` is gone: `down` would stop these itself:\n"),
    }
    let rows: Vec<Vec<String>> = preview
        .entries
        .iter()
        .map(|e| {
            vec![
                e.service.clone(),
                e.layer.to_string(),
                e.pgid.to_string(),
                e.verdict.to_owned(),
                if e.members.is_empty() {
                    "-".into()
                } else {
                    e.members
                        .iter()
                        .map(|(p, c)| format!("{p} ({c})"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                e.detail.clone(),
            ]
        })
        .collect();
    out.push_str(
        &Table::new(&["SERVICE", "LAYER", "PGID", "WOULD", "PROCESSES", "DETAIL"])
            .rows(rows)
            .render(),
    );
    Out::text(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn status_json(status: &::flow::FlowStatus) -> Value {
    let services: Vec<Value> = status
        .services
        .iter()
        .map(|s| {
            json!({"name": s.name, "state": s.state, "pid": s.pid,
            "endpoints": s.endpoints.iter().map(|(n, a)| json!({"name": n, "address": a})).collect::<Vec<_>>(),
            "restarts": s.restarts, "detail": s.detail, "leftover": s.leftover})
        })
        .collect();
    json!({"flow": status.flow, "supervisor": {"pid": status.supervisor_pid, "alive": status.supervisor_alive},
        "up": status.up, "started_at": status.started_at, "services": services})
}

fn status_text(status: &::flow::FlowStatus) -> String {
    let supervisor = if status.supervisor_alive {
        format!(
            "supervised by `hostd flow up` (pid {})",
            status.supervisor_pid
        )
    } else {
        format!(
            "its `hostd flow up` (pid {}) is gone: run `hostd flow down` to stop what is left",
            status.supervisor_pid
        )
    };
    let rows: Vec<Vec<String>> = status
        .services
        .iter()
        .map(|s| {
            let pid = match (s.pid, s.leftover.as_slice()) {
                (Some(p), _) => p.to_string(),
                (None, []) => "-".into(),
                (None, left) => format!(
                    "({})",
                    left.iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            };
            vec![
                s.name.clone(),
                s.state.clone(),
                pid,
                render::endpoints_text(s.endpoints.iter().map(|(n, a)| (n.as_str(), a.clone()))),
                s.restarts.to_string(),
                s.detail.clone().unwrap_or_default(),
            ]
        })
        .collect();
    format!(
        "flow `{}` since {}, {supervisor}\n{}",
        status.flow,
        status.started_at,
        Table::new(&["SERVICE", "STATE", "PID", "ENDPOINTS", "RESTARTS", "DETAIL"]).rows(rows)
    )
}

async fn status(root: &Path, args: StatusArgs) -> Result<ExitCode> {
    let Some(status) = ::flow::status(root, FlowOptions::default().probe_timeout).await? else {
        if args.json {
            Out::json(&json!({"flow": null}))?;
        } else {
            Out::line(&format!("no flow is up in {}", root.display()))?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    if args.json {
        Out::json(&status_json(&status))?;
    } else {
        Out::text(&status_text(&status))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn env(root: &Path, args: EnvArgs) -> Result<ExitCode> {
    let paths = StatePaths::for_workspace(root);
    let not_recorded = || FlowError::NotRecorded {
        service: args.service.clone(),
        path: paths.state_file.clone(),
    };
    let recorded = state::read_state(&paths)?.ok_or_else(not_recorded)?;
    let service = recorded.service(&args.service).ok_or_else(not_recorded)?;
    if args.json {
        let map: serde_json::Map<String, Value> = service
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        Out::json(&Value::Object(map))?;
    } else {
        Out::text(&dotenv(&service.env))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The recorded teardown budget of the workspace, else the default.
fn recorded_budget(root: &Path, per_layer: Option<Duration>) -> TeardownBudget {
    let defaults = FlowOptions::default();
    let recorded = state::read_state(&StatePaths::for_workspace(root))
        .ok()
        .flatten()
        .and_then(|s| s.budget);
    TeardownBudget {
        per_layer: per_layer
            .or(recorded.map(|b| Duration::from_millis(b.teardown_layer_budget_ms)))
            .unwrap_or(defaults.teardown_layer_budget),
        kill_grace: recorded
            .map(|b| Duration::from_millis(b.kill_grace_ms))
            .unwrap_or(defaults.kill_grace),
    }
}

async fn recover_cmd(root: &Path, args: RecoverArgs) -> Result<ExitCode> {
    if let Some(file) = &args.expect {
        let expected = RecoveryPreview::read(file)?;
        if expected.service != args.service {
            bail!(
                "{} is a preview of `{}`, not `{}`",
                file.display(),
                expected.service,
                args.service
            );
        }
        let budget = recorded_budget(root, args.teardown_budget);
        let report = recover::recover(root, &expected, budget).await?;
        Out::text(&render::receipts_table(&report.teardown))?;
        if report.forgotten && report.teardown.all_stopped() {
            Out::line(&format!(
                "the previewed processes of `{}` are stopped and its record is removed",
                args.service
            ))?;
            return Ok(ExitCode::SUCCESS);
        }
        render::report_troubles(&report.teardown, false);
        if !report.forgotten {
            let _ = writeln!(
                std::io::stderr(),
                "[flow] error: processes remain in the group of `{}`; it stays recorded",
                args.service
            );
        }
        return Ok(ExitCode::FAILURE);
    }
    let preview = recover::preview(root, &args.service)?;
    let paths = StatePaths::for_workspace(root);
    let file = args
        .save
        .clone()
        .unwrap_or_else(|| recover::default_preview_path(&paths, &args.service));
    preview.write(&file)?;
    let rows: Vec<Vec<String>> = preview
        .processes
        .iter()
        .map(|p| {
            vec![
                p.pid.to_string(),
                p.start_time.to_string(),
                p.command.clone(),
            ]
        })
        .collect();
    let mut out = format!(
        "`{}`: its recorded leader (pid {}) is gone; these processes remain in its process group {}:\n",
        preview.service, preview.recorded.pid, preview.recorded.pgid
    );
    out.push_str(
        &Table::new(&["PID", "START (ticks)", "COMMAND"])
            .rows(rows)
            .render(),
    );
    out.push_str("why they are taken to be this flow's:\n");
    for line in &preview.evidence {
        out.push_str(&format!("  - {line}\n"));
    }
    out.push_str(&format!(
        "saved to {}; after reviewing it, stop exactly these processes with:\n  hostd flow -w {} recover {} --expect {}\n",
        file.display(),
        root.display(),
        preview.service,
        file.display()
    ));
    Out::text(&out)?;
    Ok(ExitCode::SUCCESS)
}

async fn test(root: &Path, args: TestArgs) -> Result<ExitCode> {
    let flow = Flow::load(root, args.timings.options())?;
    let selection = Selection {
        only_deps: args.deps == TestDeps::Dependencies,
        ..Selection::service(&args.service)
    };
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow!("no test command after `--`"))?;
    let run_command = |env: Vec<(String, String)>| {
        let program = program.clone();
        let rest = rest.to_vec();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(&program)
                .args(&rest)
                .envs(env)
                .status()
                .with_context(|| format!("cannot run the test command `{program}`"))
        })
    };
    if args.deps == TestDeps::None {
        let plan = flow.dry_run(&selection)?;
        let env = plan
            .services
            .iter()
            .find(|s| s.name == args.service)
            .map(|s| s.env.clone())
            .unwrap_or_default();
        let status = run_command(env).await.context("the test command")??;
        return Ok(exit_code_of(status));
    }
    let cancel = cancel_on_signals(false)?;
    let (sink, mut rx) = EventSink::channel(8192);
    let width = args.service.len().max(4);
    let printer = tokio::spawn(async move {
        let mut view = Progress::new(width, false);
        while let Some(event) = rx.recv().await {
            view.show(event);
        }
        view.clear();
    });
    let running = match flow.up(selection, sink, cancel.clone()).await {
        Ok(running) => running,
        Err(failure) => {
            eprintln_flow(&format!("{}: {}", failure.error.code(), failure.error));
            render::report_troubles(&failure.teardown, false);
            let _ = printer.await;
            return Ok(ExitCode::FAILURE);
        }
    };
    let env = running
        .environment(&args.service)
        .unwrap_or_default()
        .to_vec();
    eprintln_flow(&format!("running the tests of `{}`", args.service));
    let outcome = run_command(env).await;
    let end = running.shutdown().await;
    render::report_troubles(&end.teardown, false);
    let _ = printer.await;
    let status = outcome.context("the test command")??;
    if !end.teardown.all_stopped() {
        return Ok(ExitCode::FAILURE);
    }
    Ok(exit_code_of(status))
}

fn exit_code_of(status: std::process::ExitStatus) -> ExitCode {
    match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => ExitCode::FAILURE,
    }
}

fn log_files(root: &Path, service: Option<&str>) -> Result<Vec<(String, PathBuf)>> {
    let paths = StatePaths::for_workspace(root);
    if let Some(s) = service {
        let path = paths.log_file(s);
        if !path.exists() {
            bail!("no log for `{s}` in {}", paths.logs_dir.display());
        }
        return Ok(vec![(s.to_owned(), path)]);
    }
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(&paths.logs_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "no logs yet in {} (has `hostd flow up` run here?)",
                paths.logs_dir.display()
            )
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read {}", paths.logs_dir.display()));
        }
    };
    for entry in entries {
        let path = entry?.path();
        if let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".log"))
        {
            files.push((name.to_owned(), path.clone()));
        }
    }
    files.sort();
    Ok(files)
}

async fn logs(root: &Path, args: LogsArgs) -> Result<ExitCode> {
    let files = log_files(root, args.service.as_deref())?;
    let width = files.iter().map(|(s, _)| s.len()).max().unwrap_or(4);
    let print = |line: &LogLine| {
        let mark = match line.stream.as_str() {
            "err" => "!",
            logs::FLOW_STREAM => "*",
            _ => "|",
        };
        Out::line(&format!("{:>width$} {mark} {}", line.service, line.text))
    };
    let mut follower = LogFollower::from_end(&files);
    for line in logs::read_merged(&files)? {
        print(&line)?;
    }
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    let cancel = cancel_on_signals(false)?;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(ExitCode::SUCCESS),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        for line in follower.poll()? {
            print(&line)?;
        }
    }
}

fn graph(root: &Path, args: GraphArgs) -> Result<ExitCode> {
    let stages: Vec<Stage> = match args.stage {
        Some(StageArg::Build) => vec![Stage::Build],
        Some(StageArg::Run) => vec![Stage::Run],
        None => vec![Stage::Build, Stage::Run],
    };
    let workspace = ::flow::Workspace::load(root)?;
    // Only the stages shown must be free of cycles.
    let graph = ::flow::DependencyGraph::from_workspace_for(&workspace, &stages)?;
    let text = match args.format {
        GraphFormat::Text => graph_view::graph_text(&graph, &stages)?,
        GraphFormat::Dot => graph_view::graph_dot(&graph, &stages),
    };
    Out::text(&text)?;
    Ok(ExitCode::SUCCESS)
}
