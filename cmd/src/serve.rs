//! `hostd serve`: runs a Host. Owns the mapping of every Host option to a flag and a `HOST_*`
//! environment variable, the embedded default (a SQLite store and a local tenant in the data
//! folder), and the signal handling: SIGTERM or SIGINT drains, then exits non-zero if the
//! drain left failures or parked sessions. All behaviour is the `host` crate's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use department::RuntimeProfile;
use harness::model::OpenAiConfig;
use host::link::options::LinkOptions;
use host::options::parse_placement;
use host::server::Server;
use host::{Composition, IsolationClass, Options};
use hostlink::auth::CredentialStore;
use sessionstore::{HostId, SessionId, StoreOptions, Synchronous};
use tokio::signal::unix::{SignalKind, signal};

use crate::agents::DefaultDepartment;
use crate::local::{DataDir, LOCAL_TENANT, Runtime, redacted};

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 500ms, 30s, 5m)"))
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SyncMode {
    /// Every commit is on disk before it is acknowledged.
    Full,
    /// Faster; the last commits may be lost on power failure or an OS crash.
    Normal,
}

/// Run a Host: HostLink, /readyz, /healthz and /metrics on one listener.
#[derive(Debug, Args)]
#[command(
    after_help = "With no flags, hostd serve keeps everything in ./.hostd: a SQLite store and a \
local tenant whose token `hostd session` finds there. For a fleet, point --store at PostgreSQL and \
give every Host its own --host-id and --internal-endpoint.\n\nEvery flag can also be set by the \
environment variable shown in [env: ...]."
)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "HOST_LISTEN_ADDRESS", default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// Store URL: postgres://... for a fleet; default: a SQLite file in the data folder.
    #[arg(long, env = "HOST_STORE_URL")]
    store: Option<String>,
    /// The data folder (embedded store, local tenant, runtime info).
    #[arg(long, env = "HOST_DATA_DIR", default_value = "./.hostd")]
    data_dir: PathBuf,
    /// This Host's stable id (default: hostd-<hostname>).
    #[arg(long, env = "HOST_ID")]
    host_id: Option<String>,
    /// The HostLink base controllers dial: ws://host:port, nothing else (default: from --listen).
    #[arg(long, env = "HOST_INTERNAL_ENDPOINT")]
    internal_endpoint: Option<String>,
    /// shared, cross_tenant_isolated or tenant_exclusive.
    #[arg(long, env = "HOST_ISOLATION_CLASS", default_value = "shared")]
    isolation_class: String,
    /// pooled (any session) or dedicated (one fixed session).
    #[arg(long, env = "HOST_PLACEMENT", default_value = "pooled")]
    placement: String,
    /// Admission capacity (dedicated: 1).
    #[arg(long, env = "HOST_CAPACITY", default_value_t = 64)]
    capacity: u32,
    /// The one session a dedicated Host serves.
    #[arg(long, env = "HOST_FIXED_SESSION_ID")]
    fixed_session: Option<String>,
    /// How long an idle pooled session stays resident.
    #[arg(long, env = "HOST_WARM_TTL", default_value = "5m", value_parser = duration)]
    warm_ttl: Duration,
    #[arg(long, env = "HOST_REGISTRY_HEARTBEAT", default_value = "5s", value_parser = duration)]
    registry_heartbeat: Duration,
    /// At least 3 heartbeats.
    #[arg(long, env = "HOST_REGISTRY_EXPIRY", default_value = "20s", value_parser = duration)]
    registry_expiry: Duration,
    #[arg(long, env = "HOST_CLAIM_TTL", default_value = "30s", value_parser = duration)]
    claim_ttl: Duration,
    /// At least 2 claim TTLs.
    #[arg(long, env = "HOST_APPLY_DEADLINE", default_value = "10m", value_parser = duration)]
    apply_deadline: Duration,
    #[arg(long, env = "HOST_COMMAND_QUEUE_SIZE", default_value_t = 256)]
    command_queue_size: usize,
    #[arg(long, env = "HOST_RECONCILE_INTERVAL", default_value = "2s", value_parser = duration)]
    reconcile_interval: Duration,
    #[arg(long, env = "HOST_RECONCILE_BATCH", default_value_t = 64)]
    reconcile_batch: usize,
    /// The drain's whole budget; keep it inside the platform's termination grace.
    #[arg(long, env = "HOST_DRAIN_GRACE", default_value = "25s", value_parser = duration)]
    drain_grace: Duration,
    #[arg(long, env = "HOST_DRAIN_IDLE_BOUNDARY", default_value = "10s", value_parser = duration)]
    drain_idle_boundary: Duration,
    #[arg(long, env = "HOST_DRAIN_PUBLISH_BOUND", default_value = "5s", value_parser = duration)]
    drain_publish_bound: Duration,
    /// HostLink application ping interval.
    #[arg(long, env = "HOST_LINK_PING", default_value = "25s", value_parser = duration)]
    link_ping: Duration,
    /// HostLink pong timeout (shorter than the ping interval).
    #[arg(long, env = "HOST_LINK_PONG", default_value = "10s", value_parser = duration)]
    link_pong: Duration,
    #[arg(long, env = "HOST_MAX_BINDINGS_PER_LINK", default_value_t = 1024)]
    max_bindings_per_link: usize,
    #[arg(long, env = "HOST_MAX_BINDINGS_PER_TENANT", default_value_t = 4096)]
    max_bindings_per_tenant: usize,
    #[arg(long, env = "HOST_MAX_TENANT_LINKS", default_value_t = 64)]
    max_tenant_links: usize,
    /// The largest inbound HostLink message, in bytes.
    #[arg(long, env = "HOST_MAX_FRAME_BYTES", default_value_t = 1024 * 1024)]
    max_frame_bytes: usize,
    /// Each link's outbound queue, in messages (a slow consumer is disconnected).
    #[arg(long, env = "HOST_OUTBOUND_QUEUE", default_value_t = 1024)]
    outbound_queue: usize,
    /// Tenant credentials: one `tenant sha256hex` per line (default: the data folder's).
    #[arg(long, env = "HOST_CREDENTIALS_FILE")]
    credentials_file: Option<PathBuf>,
    /// SQLite durability.
    #[arg(
        long,
        env = "HOST_SQLITE_SYNCHRONOUS",
        value_enum,
        default_value = "full"
    )]
    sqlite_synchronous: SyncMode,
    /// How long a permission gate waits before denying.
    #[arg(long, env = "HOST_PERMISSION_TIMEOUT", default_value = "5m", value_parser = duration)]
    permission_timeout: Duration,
    /// An OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080/v1) for the `openai` agent;
    /// its key is read from HOST_OPENAI_API_KEY.
    #[arg(long, env = "HOST_OPENAI_ENDPOINT")]
    openai_endpoint: Option<String>,
    /// The model name the `openai` agent asks for.
    #[arg(long, env = "HOST_OPENAI_MODEL", default_value = "gpt-4o-mini")]
    openai_model: String,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".into())
}

pub async fn run(args: ServeArgs) -> Result<ExitCode> {
    let data = DataDir::new(&args.data_dir);
    data.ensure()?;
    let embedded = args.store.is_none();
    let store_url = match &args.store {
        Some(u) => u.clone(),
        None => data.store_url()?,
    };
    // Credentials: the embedded default makes a local tenant on first start.
    let creds_path = args
        .credentials_file
        .clone()
        .unwrap_or_else(|| data.credentials_path());
    if embedded && args.credentials_file.is_none() && data.ensure_local_tenant()? {
        let token = data.token(LOCAL_TENANT)?;
        tracing::info!(
            tenant = LOCAL_TENANT,
            token = %redacted(&token),
            file = %data.token_path(LOCAL_TENANT).display(),
            "created the local tenant and its credential"
        );
    }
    let env_creds = std::env::var("HOST_TENANT_CREDENTIALS").ok();
    let file = creds_path.exists().then_some(creds_path.as_path());
    let creds = CredentialStore::load(file, env_creds.as_deref())
        .with_context(|| format!("loading tenant credentials from {}", creds_path.display()))?;
    if creds.is_empty() {
        bail!(
            "no tenant credentials: give --credentials-file (lines `tenant sha256hex`) or HOST_TENANT_CREDENTIALS (`tenant=sha256hex,...`)"
        );
    }

    let host_id = args
        .host_id
        .clone()
        .unwrap_or_else(|| format!("hostd-{}", hostname()));
    // Bind first, so the advertised endpoint can name the port actually bound (`--listen
    // 127.0.0.1:0` picks a free one).
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let bound = listener.local_addr()?;
    let endpoint = args
        .internal_endpoint
        .clone()
        .unwrap_or_else(|| format!("ws://{bound}"));
    let options = Options {
        host_id: Some(HostId::new(host_id.clone()).context("--host-id")?),
        internal_endpoint: Some(endpoint.clone()),
        isolation_class: args.isolation_class.parse::<IsolationClass>()?,
        placement: parse_placement(&args.placement)?,
        capacity: args.capacity,
        fixed_session: match &args.fixed_session {
            Some(s) => Some(SessionId::new(s.clone()).context("--fixed-session")?),
            None => None,
        },
        warm_ttl: args.warm_ttl,
        registry_heartbeat: args.registry_heartbeat,
        registry_expiry: args.registry_expiry,
        claim_ttl: args.claim_ttl,
        apply_deadline: args.apply_deadline,
        command_queue_size: args.command_queue_size,
        reconcile_interval: args.reconcile_interval,
        reconcile_batch: args.reconcile_batch,
        drain_grace: args.drain_grace,
        idle_boundary: args.drain_idle_boundary,
        publish_bound: args.drain_publish_bound,
    };
    let link = LinkOptions {
        ping_interval: args.link_ping,
        pong_timeout: args.link_pong,
        max_bindings_per_link: args.max_bindings_per_link,
        max_bindings_per_tenant: args.max_bindings_per_tenant,
        max_tenant_links: args.max_tenant_links,
        max_frame_bytes: args.max_frame_bytes,
        outbound_queue: args.outbound_queue,
        ..LinkOptions::default()
    }
    .validate()
    .context("HostLink options")?;
    let mut store = StoreOptions::new(store_url.clone());
    store.synchronous = match args.sqlite_synchronous {
        SyncMode::Full => Synchronous::Full,
        SyncMode::Normal => Synchronous::Normal,
    };
    let openai = match (&args.openai_endpoint, std::env::var("HOST_OPENAI_API_KEY")) {
        (Some(ep), Ok(key)) if !key.is_empty() => Some(OpenAiConfig::new(
            ep.clone(),
            key,
            args.openai_model.clone(),
        )),
        (Some(_), _) => bail!("--openai-endpoint needs its key in HOST_OPENAI_API_KEY"),
        _ => None,
    };
    let service = Composition {
        options,
        store,
        registrar: Box::new(DefaultDepartment {
            openai,
            permission_timeout: args.permission_timeout,
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
    let server = Server::from_listener(service.clone(), Box::new(creds), link, listener).await?;
    let tenant = if embedded {
        LOCAL_TENANT.to_owned()
    } else {
        String::new()
    };
    data.write_runtime(&Runtime {
        endpoint: endpoint.clone(),
        store: store_url.clone(),
        tenant,
        host_id: host_id.clone(),
        pid: std::process::id(),
    })?;
    tracing::info!(
        listen = %server.local_addr(),
        host = %host_id,
        generation = service.generation(),
        endpoint = %endpoint,
        store = %if embedded { store_url.as_str() } else { "postgres" },
        "hostd is serving HostLink, /readyz, /healthz and /metrics"
    );
    eprintln!("hostd: serving on {} (host {host_id})", server.local_addr());

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
    server.shutdown();
    // A second signal during the drain exits at once.
    let wait = server.wait();
    tokio::pin!(wait);
    let report = tokio::select! {
        r = &mut wait => r,
        _ = term.recv() => { eprintln!("hostd: second signal; exiting without finishing the drain"); return Ok(ExitCode::from(2)); }
        _ = int.recv() => { eprintln!("hostd: second signal; exiting without finishing the drain"); return Ok(ExitCode::from(2)); }
    };
    data.remove_runtime();
    for f in &report.failures {
        let session = f
            .session
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        tracing::error!(step = f.step, session = %session, reason = %f.reason, "drain step failed");
    }
    eprintln!(
        "hostd: drained: {} released, {} abandoned, {} parked, {} failures",
        report.released.len(),
        report.abandoned.len(),
        report.parked.len(),
        report.failures.len()
    );
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
