//! `hostd`: the Host command line. This file only parses the top-level command and hands
//! each subcommand to its own module; it must never hold a subcommand's behaviour.

#![forbid(unsafe_code)]

mod flow;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// hostd: the Host command line.
///
/// Every subcommand has its own help: `hostd <command> --help`.
#[derive(Debug, Parser)]
#[command(name = "hostd", version, propagate_version = true)]
struct Cli {
    /// Log filter for hostd's own diagnostics (e.g. `info`, `orchestration=debug`); defaults
    /// to the RUST_LOG variable, else `warn`.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a local multi-service flow: start services in dependency order, wait for their
    /// readiness, supervise them, tear them down in reverse layers.
    Flow(flow::FlowArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log.as_deref());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hostd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Flow(args) => flow::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hostd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(filter: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = match filter {
        Some(f) => EnvFilter::new(f),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
