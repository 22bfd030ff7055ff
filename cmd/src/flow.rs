//! `hostd flow`: the command-line face of `orchestration::flow`. This module owns argument
//! parsing, rendering (merged logs, progress, tables, graphs) and signal handling; it must
//! never hold flow behaviour of its own — every decision is the library's.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use orchestration::flow::events::Step;
use orchestration::flow::logs::{self, LogFollower, LogLine};
use orchestration::flow::state::StatePaths;
use orchestration::flow::{
    DependencyGraph, DownAction, EdgeOrigin, EventSink, Flow, FlowEndReason, FlowError, FlowEvent,
    FlowOptions, OutputStream, Receipt, Selection, Stage, StageGraph, TeardownReport,
};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

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
    /// Start the services (all, or one with its dependencies), wait until each is ready,
    /// stream their merged output, and keep them running until Ctrl-C or `hostd flow down`.
    Up(UpArgs),
    /// Stop what `up` started in this workspace, from any shell: consumers first, each layer
    /// within its budget (SIGTERM, then SIGKILL), with a receipt per service.
    Down(DownArgs),
    /// Show the recorded flow: service, state, pid, endpoints, restarts.
    Status,
    /// Print the services' logs merged in time order (or one service's).
    Logs(LogsArgs),
    /// Print the dependency graph per stage, as text or Graphviz DOT.
    Graph(GraphArgs),
}

#[derive(Debug, Args)]
struct UpArgs {
    /// Start only this service and what it needs at run time.
    service: Option<String>,
    /// Start the service's dependencies but not the service itself (e.g. to run it in a
    /// debugger yourself).
    #[arg(long, requires = "service")]
    only_deps: bool,
    /// How long each start of a service may take to become ready.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2m")]
    readiness_timeout: Duration,
    /// How long each teardown layer may take before SIGKILL.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "15s")]
    teardown_budget: Duration,
}

#[derive(Debug, Args)]
struct DownArgs {
    /// How long each teardown layer may take before SIGKILL (when `down` stops the
    /// services itself because the `up` that started them is gone).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "15s")]
    teardown_budget: Duration,
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

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration like 30s or 2m: {e}"))
}

pub async fn run(args: FlowArgs) -> Result<ExitCode> {
    let root = args.workspace;
    match args.command {
        FlowCommand::Up(a) => up(&root, a).await,
        FlowCommand::Down(a) => down(&root, a).await,
        FlowCommand::Status => status(&root).await,
        FlowCommand::Logs(a) => logs(&root, a).await,
        FlowCommand::Graph(a) => graph(&root, a),
    }
}

/// A token cancelled by the first SIGINT or SIGTERM.
fn cancel_on_signals() -> Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        t.cancel();
    });
    Ok(token)
}

async fn up(root: &Path, args: UpArgs) -> Result<ExitCode> {
    let options = FlowOptions {
        readiness_timeout: args.readiness_timeout,
        teardown_layer_budget: args.teardown_budget,
        ..FlowOptions::default()
    };
    let flow = Flow::load(root, options)?;
    let selection = Selection {
        targets: args.service.into_iter().collect(),
        only_deps: args.only_deps,
        stand_alone: false,
    };
    let plan = flow.plan(&selection)?;
    let width = plan
        .nodes()
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(4)
        .max(4);
    let cancel = cancel_on_signals()?;
    let (sink, mut rx) = EventSink::channel(8192);
    let (shown_up, up_shown) = tokio::sync::oneshot::channel::<()>();
    let printer = tokio::spawn(async move {
        let mut view = Progress::new(width);
        let mut shown_up = Some(shown_up);
        while let Some(event) = rx.recv().await {
            let is_up = matches!(event, FlowEvent::Up { .. });
            view.show(event);
            if is_up && let Some(tx) = shown_up.take() {
                let _ = tx.send(());
            }
        }
        view.clear();
    });

    let result = flow.up(selection, sink, cancel.clone()).await;
    let code = match result {
        Ok(running) => {
            // Let the event lines up to "up" print first, so the table comes after them.
            let _ = tokio::time::timeout(Duration::from_secs(1), up_shown).await;
            let status = running.status().await?;
            print_table(
                &["SERVICE", "STATE", "PID", "ENDPOINTS", "RESTARTS"],
                status
                    .iter()
                    .map(|s| {
                        vec![
                            s.name.clone(),
                            s.state.clone(),
                            s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                            endpoints_text(
                                s.endpoints.iter().map(|(n, a)| (n.as_str(), a.to_string())),
                            ),
                            s.restarts.to_string(),
                        ]
                    })
                    .collect(),
                true,
            );
            eprintln!("[flow] press Ctrl-C (or run `hostd flow down`) to stop");
            let end = running.wait().await;
            match end.reason {
                FlowEndReason::Cancelled | FlowEndReason::Shutdown => ExitCode::SUCCESS,
                FlowEndReason::Failed(e) => {
                    eprintln!("[flow] the flow failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(failure) => {
            let interrupted = matches!(failure.error, FlowError::Interrupted);
            if !interrupted {
                eprintln!("[flow] {}: {}", failure.error.code(), failure.error);
            } else {
                eprintln!("[flow] interrupted; everything started was stopped");
            }
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

/// Renders flow events: prefixed service output on stdout, flow lines on stderr, and a
/// progress line for long readiness waits (redrawn in place on a terminal, an occasional
/// plain line otherwise).
struct Progress {
    width: usize,
    terminal: bool,
    waiting: HashMap<String, String>,
    last_plain: HashMap<String, Instant>,
    drawn: bool,
    spinner: usize,
}

impl Progress {
    fn new(width: usize) -> Self {
        Progress {
            width,
            terminal: std::io::stderr().is_terminal(),
            waiting: HashMap::new(),
            last_plain: HashMap::new(),
            drawn: false,
            spinner: 0,
        }
    }

    fn clear(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.drawn = false;
        }
    }

    /// Writes never panic: a closed pipe (`hostd flow up | head`) must not stop the flow.
    fn flow_line(&mut self, text: String) {
        self.clear();
        let _ = writeln!(std::io::stderr(), "[flow] {text}");
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
        let mut err = std::io::stderr();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.drawn = true;
    }

    fn show(&mut self, event: FlowEvent) {
        match event {
            FlowEvent::Output {
                service,
                stream,
                line,
            } => {
                self.clear();
                let mark = if stream == OutputStream::Stderr {
                    "!"
                } else {
                    "|"
                };
                let _ = writeln!(
                    std::io::stdout(),
                    "{service:>w$} {mark} {line}",
                    w = self.width
                );
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

fn receipt_line(r: &Receipt) -> String {
    format!(
        "{}: {} in {} ms (layer {}): {}",
        r.service, r.outcome, r.duration_ms, r.layer, r.detail
    )
}

fn print_receipts(report: &TeardownReport) {
    print_table(
        &["SERVICE", "LAYER", "OUTCOME", "MS", "DETAIL"],
        report
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
            .collect(),
        false,
    );
}

async fn down(root: &Path, args: DownArgs) -> Result<ExitCode> {
    let options = orchestration::flow::DownOptions {
        teardown_layer_budget: Some(args.teardown_budget),
        kill_grace: None,
    };
    let report = orchestration::flow::down(root, &options).await?;
    match report.action {
        DownAction::NothingRecorded => {
            println!("no flow is recorded in {}", root.display());
            return Ok(ExitCode::SUCCESS);
        }
        DownAction::AskedSupervisor { pid } => {
            println!("asked the running `hostd flow up` (pid {pid}) to stop; its receipts:");
        }
        DownAction::StoppedDirectly => {
            println!(
                "the `hostd flow up` that started this flow is gone; stopped its recorded process groups:"
            );
        }
    }
    print_receipts(&report.teardown);
    if report.clean() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "some services could not be proven to be this flow's and were left alone; they stay recorded in {}",
            StatePaths::for_workspace(root).state_file.display()
        );
        Ok(ExitCode::FAILURE)
    }
}

async fn status(root: &Path) -> Result<ExitCode> {
    let Some(status) =
        orchestration::flow::status(root, FlowOptions::default().probe_timeout).await?
    else {
        println!("no flow is up in {}", root.display());
        return Ok(ExitCode::SUCCESS);
    };
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
    println!(
        "flow `{}` since {}, {supervisor}",
        status.flow, status.started_at
    );
    print_table(
        &["SERVICE", "STATE", "PID", "ENDPOINTS", "RESTARTS"],
        status
            .services
            .iter()
            .map(|s| {
                vec![
                    s.name.clone(),
                    s.state.clone(),
                    s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                    endpoints_text(s.endpoints.iter().map(|(n, a)| (n.as_str(), a.clone()))),
                    s.restarts.to_string(),
                ]
            })
            .collect(),
        false,
    );
    Ok(ExitCode::SUCCESS)
}

fn endpoints_text<'a>(endpoints: impl Iterator<Item = (&'a str, String)>) -> String {
    let text: Vec<String> = endpoints.map(|(n, a)| format!("{n}={a}")).collect();
    if text.is_empty() {
        "-".into()
    } else {
        text.join(" ")
    }
}

fn print_table(headers: &[&str], rows: Vec<Vec<String>>, to_stderr: bool) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.len());
            }
        }
    }
    let render = |cells: Vec<String>| {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        line.trim_end().to_owned()
    };
    let mut out = vec![render(headers.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.into_iter().map(render));
    for line in out {
        if to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
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
        println!("{:>width$} {mark} {}", line.service, line.text);
    };
    let mut follower = LogFollower::from_end(&files);
    for line in logs::read_merged(&files)? {
        print(&line);
    }
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    let cancel = cancel_on_signals()?;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(ExitCode::SUCCESS),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        for line in follower.poll()? {
            print(&line);
        }
        let _ = std::io::stdout().flush();
    }
}

fn graph(root: &Path, args: GraphArgs) -> Result<ExitCode> {
    let flow = Flow::load(root, FlowOptions::default())?;
    let graph = flow.graph();
    let stages: Vec<Stage> = match args.stage {
        Some(StageArg::Build) => vec![Stage::Build],
        Some(StageArg::Run) => vec![Stage::Run],
        None => vec![Stage::Build, Stage::Run],
    };
    let text = match args.format {
        GraphFormat::Text => graph_text(graph, &stages)?,
        GraphFormat::Dot => graph_dot(graph, &stages),
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn edge_label(kind: &str, endpoints: &[String], origin: &EdgeOrigin) -> String {
    let mut label = kind.to_owned();
    if !endpoints.is_empty() {
        label.push_str(": ");
        label.push_str(&endpoints.join(", "));
    }
    if let EdgeOrigin::Reference { key } = origin {
        label.push_str(&format!(" (via ${{endpoint}} in {key})"));
    }
    label
}

fn graph_text(graph: &DependencyGraph, stages: &[Stage]) -> Result<String> {
    let mut out = String::new();
    for &stage in stages {
        let g: &StageGraph = graph.stage(stage);
        out.push_str(&format!(
            "{stage} stage — start order, one layer per line:\n"
        ));
        for (i, layer) in g.layers()?.iter().enumerate() {
            out.push_str(&format!("  {i}: {}\n", layer.join(", ")));
        }
        if g.edges().is_empty() {
            out.push_str("  (no edges)\n");
        }
        for e in g.edges() {
            out.push_str(&format!(
                "  {} -> {}  [{}]\n",
                e.consumer,
                e.producer,
                edge_label(e.kind.as_str(), &e.endpoints, &e.origin)
            ));
        }
    }
    if !graph.external_edges().is_empty() {
        out.push_str("external (in no stage: never started or waited for):\n");
        for e in graph.external_edges() {
            let note = if graph.superseded().contains(e) {
                "  (superseded by an ${endpoint} reference: runs first)"
            } else {
                ""
            };
            out.push_str(&format!("  {} -> {}{note}\n", e.consumer, e.producer));
        }
    }
    Ok(out)
}

fn dot_id(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

fn graph_dot(graph: &DependencyGraph, stages: &[Stage]) -> String {
    let mut out = String::from("digraph flow {\n  rankdir=LR;\n  node [shape=box];\n");
    let clustered = stages.len() > 1;
    let node = |stage: Stage, name: &str| {
        if clustered {
            dot_id(&format!("{stage}:{name}"))
        } else {
            dot_id(name)
        }
    };
    for &stage in stages {
        let g = graph.stage(stage);
        let indent = if clustered { "    " } else { "  " };
        if clustered {
            out.push_str(&format!(
                "  subgraph cluster_{stage} {{\n    label={};\n",
                dot_id(&format!("{stage} stage"))
            ));
        }
        for n in g.nodes() {
            out.push_str(&format!(
                "{indent}{} [label={}];\n",
                node(stage, n),
                dot_id(n)
            ));
        }
        for e in g.edges() {
            let style = match e.kind.as_str() {
                "completion" => ", style=dashed",
                "build" | "schema" => ", style=dotted",
                _ => "",
            };
            out.push_str(&format!(
                "{indent}{} -> {} [label={}{style}];\n",
                node(stage, &e.consumer),
                node(stage, &e.producer),
                dot_id(&edge_label(e.kind.as_str(), &e.endpoints, &e.origin))
            ));
        }
        if clustered {
            out.push_str("  }\n");
        }
    }
    for e in graph.external_edges() {
        let consumer = node(*stages.last().unwrap_or(&Stage::Run), &e.consumer);
        out.push_str(&format!(
            "  {} [label={}, shape=ellipse, style=dashed];\n  {consumer} -> {} [label=\"external\", style=dashed, color=gray];\n",
            dot_id(&format!("external:{}", e.producer)),
            dot_id(&e.producer),
            dot_id(&format!("external:{}", e.producer)),
        ));
    }
    out.push_str("}\n");
    out
}
