//! `hostd serve`: runs a Host. Owns the mapping of every Host option to a flag and a `HOST_*`
//! environment variable, the embedded default (a SQLite store and a local tenant in the data
//! folder), and the signal handling: SIGTERM or SIGINT drains, then exits non-zero if the
//! drain left failures or parked sessions. All behaviour is the `host` crate's.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{ArgMatches, Args};
use department::RuntimeProfile;
use harness::model::OpenAiConfig;
use host::Composition;
use host::Host;
use std::sync::Arc;

use hostlink::live_credentials::{LiveCredentials, POLL_INTERVAL};
use sessionstore::{StoreLocation, StoreOptions, Synchronous};

use crate::agents::DefaultDepartment;
use crate::config::{Effective, ServeFlags, SyncMode, load};
use crate::local::{DEFAULT_DATA_DIR, DataDir, LOCAL_TENANT, Runtime, redacted};
use crate::output::Output;
use crate::signals::{Hangups, StopSignals};
use crate::telemetry::ExportSeries;
use trace_export::{ExportCounts, Incarnation};

/// Run a Host: HostLink, /readyz, /healthz and /metrics on one listener.
#[derive(Debug, Args)]
#[command(after_help = after_help())]
pub struct ServeArgs {
    /// A TOML config file: top-level process options and the sections [host], [link],
    /// [listener], [agents], [model] and [trace], named as --print-config prints them.
    #[arg(long, env = "HOST_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the effective value of every option and where it came from (as a config file),
    /// then exit without serving.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    flags: ServeFlags,
}

fn after_help() -> String {
    format!(
        "With no flags, hostd serve keeps everything in {DEFAULT_DATA_DIR}: a SQLite store and a \
         local tenant whose token `hostd session` finds there. For a fleet, point --store at \
         PostgreSQL and give every Host its own --host-id and --internal-endpoint.\n\nEvery \
         option can be set in a TOML file (--config; --print-config shows one), by the \
         environment variable shown in [env: ...], or by its flag; a flag beats the environment, \
         which beats the file, which beats the default."
    )
}

/// The data folder's lock file (an OS advisory lock, released when the process ends however it
/// ends), so two `hostd serve` never share one folder, its store and its default host id.
const LOCK_FILE: &str = "hostd.lock";

fn lock_data_dir(root: &Path) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    let path = root.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let by = if holder.is_empty() {
                String::new()
            } else {
                format!(" (pid {holder})")
            };
            bail!(
                "data_dir_locked: the data folder {} is in use by another hostd serve{by}; \
                 give each Host its own --data-dir",
                root.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()));
        }
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    Ok(file)
}

impl ServeArgs {
    /// The layered options (read before the process's tracing is set up, which the `[trace]`
    /// section configures).
    pub fn effective(&self, matches: Option<&ArgMatches>) -> Result<Effective> {
        load(self.config.as_deref(), self.flags.clone(), matches)
    }

    /// True when the options are only printed (nothing is served, nothing exported).
    pub fn prints_config(&self) -> bool {
        self.print_config
    }
}

pub async fn run(
    args: ServeArgs,
    effective: Effective,
    export: Option<(Arc<ExportCounts>, Incarnation)>,
    out: Output,
) -> Result<ExitCode> {
    if args.print_config {
        out.partial(&effective.render()?)?;
        return Ok(ExitCode::SUCCESS);
    }
    // Listen from the start, so a stop signal during start-up is a drain, not a kill.
    let mut stop = StopSignals::listen()?;
    let options = effective.options.clone();
    let data = DataDir::new(&options.data_dir);
    data.ensure()?;
    // Held until the process exits: a second `hostd serve` on this folder is refused.
    let _lock = lock_data_dir(&data.root)?;
    let embedded = effective.embedded;
    let store_url = options.store.clone().context("a store URL")?;
    // Credentials: the embedded default makes a local tenant on first start.
    let creds_path = options
        .credentials_file
        .clone()
        .context("a credentials file")?;
    if embedded && effective.default_credentials && data.ensure_local_tenant()? {
        let token = data.token(LOCAL_TENANT)?;
        tracing::info!(
            tenant = LOCAL_TENANT,
            token = %redacted(&token),
            file = %data.token_path(LOCAL_TENANT).display(),
            "created the local tenant and its credential"
        );
    }
    let env_creds = std::env::var("HOST_TENANT_CREDENTIALS").ok();
    let file = creds_path.exists().then(|| creds_path.clone());
    // Read again when a file changes (polled) or on SIGHUP; a version that does not load is
    // refused and the one in force stays.
    let live =
        Arc::new(LiveCredentials::load(file, env_creds).with_context(|| {
            format!("loading tenant credentials from {}", creds_path.display())
        })?);
    let creds = live.current();
    if creds.is_empty() {
        bail!(
            "no tenant credentials: give --credentials-file (lines `tenant sha256hex`) or HOST_TENANT_CREDENTIALS (`tenant=sha256hex,...`)"
        );
    }

    let mut host = options.host.clone();
    let host_id = host.host_id.clone().context("a host id")?;
    let link = options
        .link
        .clone()
        .validate()
        .context("HostLink options")?;
    // Bind first, so the advertised endpoint can name the port actually bound (`--listen
    // 127.0.0.1:0` picks a free one).
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let bound = listener.local_addr()?;
    let endpoint = host
        .internal_endpoint
        .clone()
        .unwrap_or_else(|| format!("ws://{bound}"));
    host.internal_endpoint = Some(endpoint.clone());
    let mut store = StoreOptions::new(store_url.clone());
    store.synchronous = match options.sqlite_synchronous {
        SyncMode::Full => Synchronous::Full,
        SyncMode::Normal => Synchronous::Normal,
    };
    store.referenced_body_cap = options.referenced_body_cap;
    store.sqlite_writer_cache_kib = options.sqlite_writer_cache_kib;
    store.sqlite_reader_cache_kib = options.sqlite_reader_cache_kib;
    store.pg_idle_transaction_timeout = options.pg_idle_transaction_timeout;
    store.pg_acquire_timeout = options.pg_acquire_timeout;
    store.pg_max_connections = options.pg_max_connections;
    store.pg_write_lanes = options.pg_write_lanes;
    // `pg_stat_activity` then says which Host holds which connections. A host id is at most
    // 128 bytes; PostgreSQL keeps 63, so a long one is cut at a character boundary.
    let mut app = format!("hostd/{host_id}");
    while app.len() > 63 {
        app.pop();
    }
    store.pg_application_name = Some(app);
    let agents = &options.agents;
    let openai = match (
        &agents.openai_endpoint,
        std::env::var("HOST_OPENAI_API_KEY"),
    ) {
        (Some(ep), Ok(key)) if !key.is_empty() => Some(
            OpenAiConfig::new(ep.clone(), key, agents.openai_model.clone())
                .with_options(options.model.clone()),
        ),
        (Some(_), _) => bail!("--openai-endpoint needs its key in HOST_OPENAI_API_KEY"),
        _ => None,
    };
    // Before anything here can invoke a handler (a tool or a run's step): stop what a crashed
    // predecessor on this data folder left running that its guard did not get to.
    stop_orphaned_handlers(&data.root, options.agents.runnables.as_deref());
    let service = Composition {
        options: host,
        store,
        registrar: Box::new(DefaultDepartment {
            openai,
            permission_timeout: agents.permission_timeout,
            session_bounds: (
                agents.snapshot_every,
                agents.conversation_turns,
                agents.conversation_bytes,
            ),
            runnables: crate::agents::RunnableOffer {
                workspace: agents.runnables.clone(),
                tools: agents.runnable_tools.clone(),
                state_dir: data.root.join("runnables"),
            },
        }),
        profile: RuntimeProfile::Durable,
        version: format!("hostd {}", env!("CARGO_PKG_VERSION")),
    }
    .build()
    .await
    .map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
    service
        .start()
        .await
        .map_err(|e| anyhow::anyhow!("start: {e}"))?;
    let runs = if options.runs.enabled {
        let runner = match &options.agents.runnables {
            Some(dir) => Some(
                ::runnable::Runner::open(dir)
                    .with_context(|| format!("the runnables workspace {}", dir.display()))?,
            ),
            None => None,
        };
        Some(
            run_hosting::RunHost::for_service(
                &service,
                options.runs.clone(),
                runner,
                &data.root.join("runnables"),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        )
    } else {
        None
    };
    let bounds = options
        .listener
        .validate(options.link.ping_interval)
        .context("the listener's options ([listener])")?;
    let console_routes = if options.console.enabled {
        let path = options
            .console
            .credentials_file
            .clone()
            .context("a console credentials file")?;
        if effective.default_console_credentials && data.ensure_console_admin()? {
            tracing::info!(
                operator = "admin",
                file = %data.console_token_path().display(),
                "created the console's first operator and its token"
            );
        }
        let operators =
            console::Operators::load(&path).map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
        console::Console::new(service.clone(), runs.clone(), creds.tenants(), operators).router()
    } else {
        axum::Router::new()
    };
    tokio::spawn(live.clone().follow(POLL_INTERVAL));
    tokio::spawn(reload_on_hangup(live.clone(), Hangups::listen()?));
    if let Some((counts, _)) = &export {
        let counts = counts.clone();
        service
            .metrics()
            .register(host::metrics::TraceExportSeries::new(Arc::new(
                ExportSeries(counts),
            ))?)?;
    }
    let mut builder = Host::builder(service.clone())
        .auth(Box::new(live))
        .link(link)
        .listener_bounds(bounds)
        .routes(console_routes);
    if let Some(runs) = runs {
        builder = builder.extension(std::sync::Arc::new(runs));
    }
    // The fleet reconciler: every Host of a fleet runs one; one of them acts at a time.
    if options.fleet.enabled_for(&store_url) {
        builder = builder.reconciler(options.fleet.reconciler_options()?);
    }
    let server = builder
        .serve(listener)
        .await
        .map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
    // Spans are exported under this incarnation's generation from now on.
    if let Some((_, incarnation)) = &export {
        incarnation.set_generation(service.generation());
    }
    let tenant = if embedded {
        LOCAL_TENANT.to_owned()
    } else {
        String::new()
    };
    data.write_runtime(&Runtime {
        endpoint: endpoint.clone(),
        store: store_url.clone(),
        tenant,
        host_id: host_id.to_string(),
        pid: std::process::id(),
    })?;
    tracing::info!(
        listen = %server.local_addr(),
        host = %host_id,
        generation = service.generation(),
        endpoint = %endpoint,
        store = %StoreLocation::parse(&store_url)?,
        "hostd is serving HostLink, /readyz, /healthz and /metrics"
    );
    out.note(format_args!(
        "serving on {} (host {host_id})",
        server.local_addr()
    ));

    let mut fences = service.fences();
    // A stop signal, or the fence (`None`: its announcer went away, a stop nobody asked for).
    let stopped = tokio::select! {
        signal = stop.next() => {
            tracing::info!(signal, "draining");
            Ok(signal)
        }
        fence = fences.wait_for(|f| f.is_some()) => Err(fence.ok().and_then(|f| f.clone())),
    };
    match stopped {
        // The signal is who asked: recorded in the store as the drain's requester.
        Ok(signal) => server.shutdown_by(format!("signal:{signal}")),
        Err(Some(fence)) => {
            // Serving on would only be refused: stop, and say so with a failing exit.
            server.shutdown();
            let _ = server.wait().await;
            data.remove_runtime();
            out.error(format_args!(
                "host {host_id} is fenced: {fence}; exiting instead of serving fenced"
            ));
            return Ok(ExitCode::from(3));
        }
        Err(None) => server.shutdown(),
    }
    // A second signal during the drain exits at once.
    let report = tokio::select! {
        r = server.wait() => r,
        _ = stop.next() => {
            out.warn("second signal; exiting without finishing the drain");
            return Ok(ExitCode::from(2));
        }
    };
    data.remove_runtime();
    // Each failure was logged by the drain itself (the first ones one by one, the rest as a
    // count per step); the last line says what the drain came to.
    out.note(format_args!(
        "drained: {} released, {} abandoned, {} parked, {} failures{}",
        report.released.len(),
        report.abandoned.len(),
        report.parked.len(),
        report.failures.len(),
        failures_by_step_text(&report)
    ));
    Ok(exit_after_drain(&report))
}

/// ` (release_runtime 3, release_lease 1)`: a drain's failures counted by step, or nothing.
fn failures_by_step_text(report: &host::DrainReport) -> String {
    let counts = report.failures_by_step();
    if counts.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(step, n)| format!("{step} {n}"))
        .collect();
    format!(" ({})", parts.join(", "))
}

/// How `hostd serve` exits after its drain: non-zero when a step failed or a session was left
/// parked (a runtime that could not be abandoned may still hold its journal lease; only the
/// process's exit ends it).
fn exit_after_drain(report: &host::DrainReport) -> ExitCode {
    if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Reloads the tenant credentials at each SIGHUP.
async fn reload_on_hangup(live: Arc<LiveCredentials>, mut hangups: Hangups) {
    while hangups.next().await {
        live.reload_and_log("SIGHUP");
    }
}

/// Stops handlers recorded running under this data folder (and the runnables workspace, if
/// any) whose invoker is dead: both the agents' tools and the runs' steps invoke there.
fn stop_orphaned_handlers(data_root: &std::path::Path, workspace: Option<&std::path::Path>) {
    let mut folders = vec![data_root.join("runnables").join("running")];
    if let Some(dir) = workspace
        && let Ok(runner) = ::runnable::Runner::open(dir)
    {
        folders.push(runner.workspace().state_dir().join("running"));
    }
    for folder in folders {
        let stopped = ::runnable::stop_orphans(&folder);
        if stopped > 0 {
            tracing::warn!(stopped, folder = %folder.display(), "stopped handlers a previous process left running");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(session: &str) -> host::SessionKey {
        host::SessionKey {
            tenant: sessionstore::TenantId::new("acme").unwrap(),
            session: sessionstore::SessionId::new(session).unwrap(),
        }
    }

    #[test]
    fn a_drain_that_left_a_session_parked_exits_non_zero_even_with_no_failed_step() {
        let mut report = host::DrainReport::new(1);
        report.released.push(key("given-back"));
        assert_eq!(exit_after_drain(&report), ExitCode::SUCCESS);
        report.parked.push(key("still-running"));
        assert_eq!(exit_after_drain(&report), ExitCode::FAILURE);
    }

    #[test]
    fn the_drain_line_counts_failures_by_step_in_the_order_they_first_failed() {
        let mut report = host::DrainReport::new(1);
        assert_eq!(failures_by_step_text(&report), "");
        for step in [
            host::drain_steps::RELEASE_RUNTIME,
            host::drain_steps::CLOSE_STORE,
            host::drain_steps::RELEASE_RUNTIME,
        ] {
            report.failures.push(host::DrainFailure {
                session: None,
                step,
                reason: "refused".into(),
            });
        }
        assert_eq!(
            failures_by_step_text(&report),
            " (release_runtime 2, close_store 1)"
        );
    }

    #[test]
    fn a_drain_with_a_failed_step_exits_non_zero() {
        let mut report = host::DrainReport::new(1);
        report.failures.push(host::DrainFailure {
            session: None,
            step: host::drain_steps::CLOSE_STORE,
            reason: "the store did not close in time".into(),
        });
        assert_eq!(exit_after_drain(&report), ExitCode::FAILURE);
    }
}
