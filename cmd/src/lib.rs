//! `hostd`: the Host command line, as a library whose one entry point is [`main`] (the
//! `hostd` binary is only that call, and the whole-system tests build the same entry point
//! into their own binary). This file only parses the top-level command and hands each
//! subcommand to its own module; it must never hold a subcommand's behaviour.

#![forbid(unsafe_code)]

mod agents;
mod config;
mod exit;
mod flow;
mod hosts;
mod local;
mod output;
mod reach;
mod run;
mod runnable;
mod serve;
mod session;
mod signals;
mod telemetry;
mod token;
mod wait;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// The version `--version` prints: the package version and the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("HOSTD_COMMIT"), ")");

/// hostd: the Host command line.
///
/// Every subcommand has its own help: `hostd <command> --help`.
#[derive(Debug, Parser)]
#[command(name = "hostd", version = VERSION, propagate_version = true)]
struct Cli {
    /// Log filter for hostd's own diagnostics (e.g. `info`, `host=debug`); defaults to the
    /// RUST_LOG variable, else `info` for serve and `warn` otherwise.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,

    /// Log format: human-readable lines or JSON objects (one per line, on stderr).
    #[arg(
        long,
        global = true,
        env = "HOST_LOG_FORMAT",
        value_enum,
        default_value = "human"
    )]
    log_format: LogFormat,

    /// Print data as JSON instead of text: one JSON document per command, or one value per
    /// line for event streams (`session watch`, `session journal`); an error is one JSON
    /// object `{"error": {"code", "message"}}` on stderr.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a Host: keep agent sessions resident, apply their commands exactly once, serve
    /// HostLink, /readyz, /healthz and /metrics on one listener; drain on SIGTERM.
    Serve(Box<serve::ServeArgs>),
    /// Act as a controller: create sessions, send messages, answer gates, watch replies.
    Session(session::SessionArgs),
    /// Run a local multi-service flow: start services in dependency order, wait for their
    /// readiness, supervise them, tear them down in reverse layers.
    Flow(flow::FlowArgs),
    /// Typed, versioned operations: list, show, build, invoke and publish runnables.
    Runnable(runnable::RunnableArgs),
    /// Durable workflow runs on a Host: start, resume, answer, status, ps, logs, cancel.
    Run(run::RunArgs),
    /// The fleet's Host registry: `hostd hosts ls`.
    Hosts(hosts::HostsArgs),
    /// Run the fleet reconciler alone (placement apart from the Hosts).
    Controller(hosts::ControllerArgs),
    /// Wait until a Host is ready to take sessions (for scripts that just started one).
    Wait(wait::WaitArgs),
    /// JWT connection tokens: `hostd token mint`, `hostd token inspect`.
    Token(token::TokenArgs),
    /// Print a shell completion script: `hostd completions bash > /etc/bash_completion.d/hostd`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
}

/// The shells `hostd completions` writes for.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// The whole command line, as shells and help see it.
fn cli_command() -> clap::Command {
    Cli::command().mut_subcommand("serve", config::document_defaults)
}

/// The completion script for `shell`.
fn completions(shell: Shell) -> Vec<u8> {
    use clap_complete::{Shell as S, generate};
    let shell = match shell {
        Shell::Bash => S::Bash,
        Shell::Zsh => S::Zsh,
        Shell::Fish => S::Fish,
    };
    let mut script = Vec::new();
    generate(shell, &mut cli_command(), "hostd", &mut script);
    script
}

/// A command line clap refused: under `--json` one JSON error object, else clap's own text.
fn refuse_usage(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let wants_json = std::env::args_os().any(|a| a == "--json");
    let display = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if wants_json && !display {
        let text = e.render().to_string();
        let message = text
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("the command line is wrong")
            .trim_start_matches("error: ")
            .to_owned();
        output::Output::new(true).coded_error("usage", &message, &[]);
        return exit::code(exit::USAGE);
    }
    e.exit()
}

/// Runs the `hostd` command line on this process's arguments.
pub fn main() -> ExitCode {
    let matches = match cli_command().try_get_matches() {
        Ok(m) => m,
        Err(e) => return refuse_usage(e),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return refuse_usage(e),
    };
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    let out = output::Output::new(cli.json)
        .with_json_diagnostics(matches!(cli.log_format, LogFormat::Json));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            out.error(format_args!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    // `serve`'s options are read first: their `[trace]` section decides whether spans are
    // exported, which the subscriber must know when it is installed.
    let serve_matches = matches.subcommand_matches("serve");
    let mut export = None;
    let serve_effective = match &cli.command {
        Command::Serve(args) => Some(args.effective(serve_matches).and_then(|e| {
            if !args.prints_config() {
                let _in_runtime = runtime.enter();
                let host_id = e
                    .options
                    .host
                    .host_id
                    .as_ref()
                    .map(|h| h.as_str().to_owned())
                    .unwrap_or_default();
                export = telemetry::start(&e.options.trace, &host_id)?;
            }
            Ok(e)
        })),
        _ => None,
    };
    init_tracing(
        cli.log.as_deref(),
        cli.log_format,
        default_level,
        out.colour_stderr(),
        export.as_ref().map(telemetry::TraceExport::tracer),
    );
    let export_counts = export
        .as_ref()
        .map(|x| (x.counts.clone(), x.incarnation.clone()));
    let result = runtime.block_on(async {
        match cli.command {
            Command::Flow(args) => flow::run(args, out.is_json()).await,
            Command::Runnable(args) => runnable::run(args, out.is_json()).await,
            Command::Serve(args) => match serve_effective {
                Some(Ok(effective)) => serve::run(*args, effective, export_counts, out).await,
                Some(Err(e)) => Err(e),
                None => Err(anyhow::anyhow!("serve's options were not read")),
            },
            Command::Session(args) => session::run(args, out).await,
            Command::Run(args) => run::run(args, out).await,
            Command::Hosts(args) => hosts::hosts(args, out).await,
            Command::Controller(args) => hosts::controller(args, out).await,
            Command::Wait(args) => wait::run(args, out).await,
            Command::Token(args) => token::run(args, out).await,
            Command::Completions { shell } => {
                out.partial(&String::from_utf8_lossy(&completions(shell)))?;
                Ok(ExitCode::SUCCESS)
            }
        }
    });
    if let Some(export) = export {
        // Outside the runtime's tasks: the flush waits for the exporting task.
        export.shutdown();
    }
    match result {
        Ok(code) => code,
        // The reader went away (`hostd session ls | head -1`): nothing more to say.
        Err(e) if output::is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let c = exit::classify(&e);
            let extra: Vec<(&str, &str)> = c
                .command_id
                .map(|id| ("command_id", id))
                .into_iter()
                .collect();
            out.coded_error(c.code, &format!("{e:#}"), &extra);
            exit::code(c.status)
        }
    }
}

fn init_tracing(
    filter: Option<&str>,
    format: LogFormat,
    default_level: &str,
    colour: bool,
    tracer: Option<opentelemetry_sdk::trace::Tracer>,
) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = match filter {
        Some(f) => EnvFilter::new(f),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
    };
    // Spans that live as long as a task are logged, never exported (see `trace_context::span`).
    let otel = tracer.map(|t| {
        tracing_opentelemetry::layer()
            .with_tracer(t)
            // Per-span extras nobody reads, which every span would pay for (attributes to
            // build and encode, clock reads at each poll): see the tracing decision note.
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.target() != trace_context::span::LONG_LIVED
            }))
    });
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_target(false);
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    let _ = match format {
        LogFormat::Human => registry
            .with(
                fmt.event_format(telemetry::log_ids::WithTraceIds::new(
                    tracing_subscriber::fmt::format()
                        .with_target(false)
                        .with_ansi(colour),
                )),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt.json()
                    .event_format(telemetry::log_ids::WithTraceIds::new(
                        tracing_subscriber::fmt::format().json(),
                    )),
            )
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                out.push(format!("{path} {id}"));
            }
        }
        for sub in cmd.get_subcommands() {
            undocumented(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_completion_script_names_the_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completions(shell)).expect("UTF-8");
            for word in ["serve", "session", "wait", "completions", "wait-for-host"] {
                assert!(script.contains(word), "{shell:?} lacks {word}");
            }
        }
    }

    #[test]
    fn the_version_names_the_commit_or_says_it_is_unknown() {
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")), "{VERSION}");
        assert!(VERSION.contains("(commit "), "{VERSION}");
    }

    /// The flag `long` of the command at `path` (`["run", "start"]`), as clap sees it there.
    fn flag(path: &[&str], long: &str) -> Option<clap::Arg> {
        let mut cmd = cli_command();
        cmd.build();
        let mut at = &cmd;
        for name in path {
            at = at.find_subcommand(name)?;
        }
        at.get_arguments()
            .find(|a| a.get_long() == Some(long))
            .cloned()
    }

    /// What makes a flag the same flag in two places: its help, its variable, its value's name
    /// and its default.
    fn shape(a: &clap::Arg) -> String {
        format!(
            "{:?} {:?} {:?} {:?}",
            a.get_help().map(ToString::to_string),
            a.get_env(),
            a.get_value_names(),
            a.get_default_values()
        )
    }

    #[test]
    fn every_family_that_reaches_a_host_or_store_takes_the_same_location_flags() {
        const LOCATION: [&str; 3] = ["data-dir", "store", "endpoint"];
        const TENANT: [&str; 2] = ["tenant", "token"];
        let families: [(&[&str], bool); 8] = [
            (&["session", "ls"], true),
            (&["run", "start"], true),
            (&["run", "logs"], true),
            (&["runnable", "publish"], true),
            (&["hosts", "ls"], false),
            (&["controller"], false),
            (&["wait"], false),
            (&["session", "send"], true),
        ];
        let reference: Vec<(String, String)> = LOCATION
            .iter()
            .chain(TENANT.iter())
            .map(|f| {
                let a = flag(&["run", "start"], f).unwrap_or_else(|| panic!("run start --{f}"));
                ((*f).to_owned(), shape(&a))
            })
            .collect();
        assert!(
            flag(&["run"], "data-dir")
                .and_then(|a| a.get_env().map(|e| e == "HOST_DATA_DIR"))
                .unwrap_or(false)
        );
        for (path, acts_for_a_tenant) in families {
            for (f, expected) in &reference {
                let wanted = LOCATION.contains(&f.as_str()) || acts_for_a_tenant;
                match flag(path, f) {
                    Some(a) => {
                        assert!(wanted, "hostd {} takes --{f}", path.join(" "));
                        assert_eq!(&shape(&a), expected, "hostd {} --{f}", path.join(" "));
                    }
                    None => assert!(!wanted, "hostd {} lacks --{f}", path.join(" ")),
                }
            }
        }
    }

    #[test]
    fn the_flow_timings_show_the_flow_options_defaults() {
        let defaults = ::flow::FlowOptions::default();
        for path in [&["flow", "up"][..], &["flow", "test"]] {
            let readiness = flag(path, "readiness-timeout").expect("--readiness-timeout");
            let budget = flag(path, "teardown-budget").expect("--teardown-budget");
            let shown = |a: &clap::Arg| {
                let v = a.get_default_values();
                humantime::parse_duration(&v[0].to_string_lossy()).expect("a duration")
            };
            assert_eq!(shown(&readiness), defaults.readiness_timeout);
            assert_eq!(shown(&budget), defaults.teardown_layer_budget);
        }
    }

    #[test]
    fn every_flag_and_argument_of_serve_session_run_and_wait_has_help() {
        let cmd = Cli::command();
        let mut missing = Vec::new();
        for name in ["serve", "session", "run", "wait", "completions", "token"] {
            let sub = cmd.find_subcommand(name).expect("the subcommand exists");
            undocumented(sub, &format!("hostd {name}"), &mut missing);
        }
        assert!(missing.is_empty(), "without help: {missing:?}");
    }
}
