//! `hostd serve`'s options, declared once each. The serde types own every option's type,
//! default and validation: [`ServeOptions`] (the process: listener, data folder, store) with a
//! nested section per component — `[host]` is `host::Options`, `[link]` is
//! `hostlink_server::LinkOptions`, `[listener]` is `host::listener::ListenerOptions`, `[agents]` is
//! [`AgentOptions`], `[model]` is the model client's
//! `harness::model::OpenAiOptions` — so a config file (`--config
//! host.toml`) is that same type and a new component adds one more section. [`ServeFlags`]
//! owns each option's flag, environment variable and help text as an `Option<T>` override
//! whose clap id is the option's path in the file (`host.capacity`); it carries no defaults.
//!
//! Precedence: flag > environment > file > default. [`load`] layers them and remembers where
//! each effective value came from, which `--print-config` shows. This module never opens the
//! store or binds a socket.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, ValueEnum};
use harness::model::OpenAiOptions;
use host::listener::ListenerOptions;
use host::options::parse_placement;
use host::{IsolationClass, Options};
use hostlink_server::LinkOptions;
use run_hosting::RunOptions;
use serde::{Deserialize, Serialize};
use sessionstore::{HostId, Placement, SessionId, StoreLocation};
use timing::duration_text;

use crate::local::{DEFAULT_DATA_DIR, DataDir};
use crate::telemetry::TraceOptions;

/// SQLite durability.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// Every commit is on disk before it is acknowledged.
    Full,
    /// Faster; the last commits may be lost on power failure or an OS crash.
    Normal,
}

/// The agents the default department runs (`[agents]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentOptions {
    #[serde(with = "duration_text")]
    pub permission_timeout: Duration,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub openai_endpoint: Option<String>,
    pub openai_model: String,
    /// A runnables workspace whose runnables are offered to the agents as tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runnables: Option<PathBuf>,
    /// The runnables offered (`name[@version]` from the workspace, or a published
    /// `workspace/name@version`); empty offers every runnable of the workspace.
    pub runnable_tools: Vec<String>,
    /// Journal records between two snapshots of a session's state.
    pub snapshot_every: u64,
    /// The newest turns a session keeps in memory and sends to its model.
    pub conversation_turns: usize,
    /// About how much conversation text a session keeps in memory (bytes).
    pub conversation_bytes: usize,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            permission_timeout: Duration::from_secs(5 * 60),
            openai_endpoint: None,
            openai_model: "gpt-4o-mini".into(),
            runnables: None,
            runnable_tools: Vec::new(),
            snapshot_every: harness::agent::DEFAULT_SNAPSHOT_EVERY,
            conversation_turns: harness::agent::DEFAULT_CONVERSATION_TURNS,
            conversation_bytes: harness::agent::DEFAULT_CONVERSATION_BYTES,
        }
    }
}

/// When `hostd serve` runs the fleet reconciler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetMode {
    /// With a PostgreSQL store (a fleet), not with the embedded SQLite one.
    Auto,
    /// Always.
    On,
    /// Never (run `hostd controller` elsewhere, or place sessions yourself).
    Off,
}

/// The fleet reconciler (`[fleet]`): re-places sessions with work and no live Host. One
/// process of a fleet acts at a time, under a leadership lease in the store.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetOptions {
    pub reconciler: FleetMode,
    /// How often a reconcile pass runs (and the leadership is renewed).
    #[serde(with = "duration_text")]
    pub interval: Duration,
    /// How long the leadership lives unrenewed (at least 2 intervals).
    #[serde(with = "duration_text")]
    pub leader_ttl: Duration,
    /// The most sessions one pass places.
    pub placements_per_pass: usize,
    /// The most sessions one pass places on one Host.
    pub placements_per_host: usize,
    /// How long an assignment stands if its Host never acts on it (at least 2 intervals).
    #[serde(with = "duration_text")]
    pub assignment_ttl: Duration,
}

impl Default for FleetOptions {
    fn default() -> Self {
        let d = fleet::ReconcilerOptions::default();
        FleetOptions {
            reconciler: FleetMode::Auto,
            interval: d.interval,
            leader_ttl: d.leader_ttl,
            placements_per_pass: d.placements_per_pass,
            placements_per_host: d.placements_per_host,
            assignment_ttl: d.assignment_ttl,
        }
    }
}

impl FleetOptions {
    /// The reconciler's options (validated).
    pub fn reconciler_options(&self) -> Result<fleet::ReconcilerOptions, fleet::ReconcilerError> {
        let o = fleet::ReconcilerOptions {
            name: fleet::ReconcilerOptions::default().name,
            interval: self.interval,
            leader_ttl: self.leader_ttl,
            placements_per_pass: self.placements_per_pass,
            placements_per_host: self.placements_per_host,
            assignment_ttl: self.assignment_ttl,
        };
        o.validate()?;
        Ok(o)
    }

    /// Whether a Host on `store_url` runs the reconciler.
    pub fn enabled_for(&self, store_url: &str) -> bool {
        match self.reconciler {
            FleetMode::On => true,
            FleetMode::Off => false,
            FleetMode::Auto => {
                store_url.starts_with("postgres://") || store_url.starts_with("postgresql://")
            }
        }
    }
}

/// The fleet reconciler's flags and `HOST_FLEET_*` overrides, shared by `hostd serve` and
/// `hostd controller`.
#[derive(Clone, Debug, Default, Args)]
pub struct FleetFlags {
    /// How often the fleet reconciler runs a pass.
    #[arg(id = "fleet.interval", long = "fleet-interval", env = "HOST_FLEET_INTERVAL", value_parser = duration)]
    pub fleet_interval: Option<Duration>,
    /// How long the fleet reconciler's leadership lives unrenewed (at least 2 intervals).
    #[arg(id = "fleet.leader_ttl", long = "fleet-leader-ttl", env = "HOST_FLEET_LEADER_TTL", value_parser = duration)]
    pub fleet_leader_ttl: Option<Duration>,
    /// The most sessions one reconcile pass places.
    #[arg(
        id = "fleet.placements_per_pass",
        long = "fleet-placements-per-pass",
        env = "HOST_FLEET_PLACEMENTS_PER_PASS"
    )]
    pub fleet_placements_per_pass: Option<usize>,
    /// The most sessions one reconcile pass places on one Host.
    #[arg(
        id = "fleet.placements_per_host",
        long = "fleet-placements-per-host",
        env = "HOST_FLEET_PLACEMENTS_PER_HOST"
    )]
    pub fleet_placements_per_host: Option<usize>,
    /// How long a placement stands if its Host never acts on it (at least 2 intervals).
    #[arg(id = "fleet.assignment_ttl", long = "fleet-assignment-ttl", env = "HOST_FLEET_ASSIGNMENT_TTL", value_parser = duration)]
    pub fleet_assignment_ttl: Option<Duration>,
}

impl FleetFlags {
    /// Replaces every fleet option this carries a value for.
    pub fn overlay(self, o: &mut FleetOptions) {
        macro_rules! set {
            ($($flag:ident => $field:ident;)*) => {
                $(if let Some(v) = self.$flag { o.$field = v; })*
            };
        }
        set! {
            fleet_interval => interval;
            fleet_leader_ttl => leader_ttl;
            fleet_placements_per_pass => placements_per_pass;
            fleet_placements_per_host => placements_per_host;
            fleet_assignment_ttl => assignment_ttl;
        }
    }
}

/// Everything `hostd serve` runs with; a config file is this type in TOML.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
    pub sqlite_synchronous: SyncMode,
    /// SQLite: the writer connection's page cache, in KiB (64 KiB to 1 GiB).
    pub sqlite_writer_cache_kib: u32,
    /// SQLite: each reader connection's page cache, in KiB (64 KiB to 1 GiB).
    pub sqlite_reader_cache_kib: u32,
    /// The largest command body stored by reference, in bytes (above 64 KiB, at most 16 MiB).
    pub referenced_body_cap: u64,
    /// PostgreSQL: how long a connection may sit idle inside a transaction before the server
    /// ends it (a frozen Host stalls the fleet for at most this long).
    #[serde(with = "duration_text")]
    pub pg_idle_transaction_timeout: Duration,
    /// PostgreSQL: how long a store call waits for a pooled connection (the pool reconnecting
    /// meanwhile) before it fails as transient and its caller's own retry takes over.
    #[serde(with = "duration_text")]
    pub pg_acquire_timeout: Duration,
    /// PostgreSQL: the most pooled connections (reads, and writes re-run alone), opened as
    /// needed. With the write lanes and one listening connection, what one Host may hold.
    pub pg_max_connections: u32,
    /// PostgreSQL: write lanes, each one connection of its own committing grouped writes.
    pub pg_write_lanes: usize,
    pub host: Options,
    pub link: LinkOptions,
    pub listener: ListenerOptions,
    pub agents: AgentOptions,
    pub model: OpenAiOptions,
    pub fleet: FleetOptions,
    pub runs: RunOptions,
    pub console: ConsoleOptions,
    pub trace: TraceOptions,
}

/// The operator console (`/console` on the listener).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleOptions {
    /// Serve the console.
    pub enabled: bool,
    /// Operator credentials: `<name> <role> <sha256hex>` per line (role read or operate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            store: None,
            credentials_file: None,
            sqlite_synchronous: SyncMode::Full,
            sqlite_writer_cache_kib: sessionstore::StoreOptions::DEFAULT_SQLITE_WRITER_CACHE_KIB,
            sqlite_reader_cache_kib: sessionstore::StoreOptions::DEFAULT_SQLITE_READER_CACHE_KIB,
            referenced_body_cap: sessionstore::limits::DEFAULT_REFERENCED_BODY_CAP,
            pg_idle_transaction_timeout: Duration::from_secs(5),
            pg_acquire_timeout: Duration::from_secs(10),
            pg_max_connections: sessionstore::StoreOptions::new("").pg_max_connections,
            pg_write_lanes: sessionstore::StoreOptions::new("").pg_write_lanes,
            host: Options::default(),
            link: LinkOptions::default(),
            listener: ListenerOptions::default(),
            agents: AgentOptions::default(),
            model: OpenAiOptions::default(),
            fleet: FleetOptions::default(),
            runs: RunOptions::default(),
            console: ConsoleOptions::default(),
            trace: TraceOptions::default(),
        }
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    duration_text::parse(s)
}

fn host_id(s: &str) -> Result<HostId, String> {
    HostId::new(s).map_err(|e| e.to_string())
}

fn session_id(s: &str) -> Result<SessionId, String> {
    SessionId::new(s).map_err(|e| e.to_string())
}

fn placement(s: &str) -> Result<Placement, String> {
    parse_placement(s).map_err(|e| e.to_string())
}

fn isolation(s: &str) -> Result<IsolationClass, String> {
    s.parse::<IsolationClass>().map_err(|e| e.to_string())
}

/// The flag and environment overrides of every option. Each is `None` unless given; the
/// defaults are [`ServeOptions`]'s and `hostd serve --help` shows them.
#[derive(Clone, Debug, Default, Args)]
pub struct ServeFlags {
    /// Address to listen on: HostLink, /readyz, /healthz and /metrics.
    #[arg(id = "listen", long = "listen", env = "HOST_LISTEN_ADDRESS")]
    listen: Option<SocketAddr>,
    /// The data folder (embedded store, local tenant, runtime info).
    #[arg(id = "data_dir", long = "data-dir", env = "HOST_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Store URL: postgres://... (or postgresql://) for a fleet, sqlite://PATH or a plain path
    /// for one Host; any other scheme is refused [default: a SQLite file in the data folder].
    #[arg(id = "store", long = "store", env = "HOST_STORE_URL")]
    store: Option<String>,
    /// Tenant credentials: one `tenant sha256hex` per line [default: the data folder's].
    #[arg(
        id = "credentials_file",
        long = "credentials-file",
        env = "HOST_CREDENTIALS_FILE"
    )]
    credentials_file: Option<PathBuf>,
    /// SQLite durability: full, or normal (faster; may lose the last commits on power loss).
    #[arg(
        id = "sqlite_synchronous",
        long = "sqlite-synchronous",
        env = "HOST_SQLITE_SYNCHRONOUS",
        value_enum
    )]
    sqlite_synchronous: Option<SyncMode>,
    /// SQLite: the page cache of the store's writer connection, in KiB (64 to 1048576). The
    /// process holds at most this plus 4 × the reader cache of SQLite pages.
    #[arg(
        id = "sqlite_writer_cache_kib",
        long = "sqlite-writer-cache-kib",
        env = "HOST_SQLITE_WRITER_CACHE_KIB"
    )]
    sqlite_writer_cache_kib: Option<u32>,
    /// SQLite: the page cache of each of the store's 4 reader connections, in KiB (64 to
    /// 1048576).
    #[arg(
        id = "sqlite_reader_cache_kib",
        long = "sqlite-reader-cache-kib",
        env = "HOST_SQLITE_READER_CACHE_KIB"
    )]
    sqlite_reader_cache_kib: Option<u32>,
    /// The largest command body a controller may store by reference, in bytes (above 65536,
    /// at most 16777216) [default: 8388608].
    #[arg(
        id = "referenced_body_cap",
        long = "referenced-body-cap",
        env = "HOST_REFERENCED_BODY_CAP"
    )]
    referenced_body_cap: Option<u64>,
    /// PostgreSQL: how long a connection may sit idle inside a transaction before the server
    /// ends it and its row locks (a frozen Host stalls the rest of the fleet at most this long).
    #[arg(id = "pg_idle_transaction_timeout", long = "pg-idle-transaction-timeout", env = "HOST_PG_IDLE_TRANSACTION_TIMEOUT", value_parser = duration)]
    pg_idle_transaction_timeout: Option<Duration>,
    /// PostgreSQL: how long a store call waits for a pooled connection while the server is
    /// away before it fails as transient (100 ms to 5 min) [default: 10s].
    #[arg(id = "pg_acquire_timeout", long = "pg-acquire-timeout", env = "HOST_PG_ACQUIRE_TIMEOUT", value_parser = duration)]
    pg_acquire_timeout: Option<Duration>,
    /// PostgreSQL: the most pooled connections this Host opens (1 to 512) [default: 16]. A
    /// Host holds at most this plus --pg-write-lanes plus 1.
    #[arg(
        id = "pg_max_connections",
        long = "pg-max-connections",
        env = "HOST_PG_MAX_CONNECTIONS",
        value_parser = clap::value_parser!(u32).range(1..=512)
    )]
    pg_max_connections: Option<u32>,
    /// PostgreSQL: write lanes, each a connection of its own committing grouped writes (1 to
    /// 64) [default: 2].
    #[arg(
        id = "pg_write_lanes",
        long = "pg-write-lanes",
        env = "HOST_PG_WRITE_LANES",
        value_parser = clap::value_parser!(u64).range(1..=64)
    )]
    pg_write_lanes: Option<u64>,

    /// This Host's stable id, unique in a fleet [default: hostd-<hostname>].
    #[arg(id = "host.host_id", long = "host-id", env = "HOST_ID", value_parser = host_id)]
    host_id: Option<HostId>,
    /// The HostLink base controllers dial: ws://host:port, nothing else [default: ws://<the
    /// bound listen address>].
    #[arg(
        id = "host.internal_endpoint",
        long = "internal-endpoint",
        env = "HOST_INTERNAL_ENDPOINT"
    )]
    internal_endpoint: Option<String>,
    /// shared, cross_tenant_isolated or tenant_exclusive.
    #[arg(id = "host.isolation_class", long = "isolation-class", env = "HOST_ISOLATION_CLASS", value_parser = isolation)]
    isolation_class: Option<IsolationClass>,
    /// pooled (any session) or dedicated (one fixed session).
    #[arg(id = "host.placement", long = "placement", env = "HOST_PLACEMENT", value_parser = placement)]
    placement: Option<Placement>,
    /// Admission capacity (dedicated: 1).
    #[arg(id = "host.capacity", long = "capacity", env = "HOST_CAPACITY")]
    capacity: Option<u32>,
    /// The one session a dedicated Host serves.
    #[arg(id = "host.fixed_session", long = "fixed-session", env = "HOST_FIXED_SESSION_ID", value_parser = session_id)]
    fixed_session: Option<SessionId>,
    /// How long an idle pooled session stays resident.
    #[arg(id = "host.warm_ttl", long = "warm-ttl", env = "HOST_WARM_TTL", value_parser = duration)]
    warm_ttl: Option<Duration>,
    /// How often the Host heartbeats: one write renews its advertisement and every residency lease it holds.
    #[arg(id = "host.registry_heartbeat", long = "registry-heartbeat", env = "HOST_REGISTRY_HEARTBEAT", value_parser = duration)]
    registry_heartbeat: Option<Duration>,
    /// How long an advertisement or a residency lease lives unrenewed (at least 3 heartbeats).
    #[arg(id = "host.registry_expiry", long = "registry-expiry", env = "HOST_REGISTRY_EXPIRY", value_parser = duration)]
    registry_expiry: Option<Duration>,
    /// How long another Host's expired advertisement stays listed before a heartbeat collects
    /// it (at least the registry expiry).
    #[arg(id = "host.registry_retention", long = "registry-retention", env = "HOST_REGISTRY_RETENTION", value_parser = duration)]
    registry_retention: Option<Duration>,
    /// How long a command claim lives before another consumer may take it.
    #[arg(id = "host.claim_ttl", long = "claim-ttl", env = "HOST_CLAIM_TTL", value_parser = duration)]
    claim_ttl: Option<Duration>,
    /// How long an admitted command may wait to be applied (at least 2 claim TTLs).
    #[arg(id = "host.apply_deadline", long = "apply-deadline", env = "HOST_APPLY_DEADLINE", value_parser = duration)]
    apply_deadline: Option<Duration>,
    /// The bound of each session's wake-up queue.
    #[arg(
        id = "host.command_queue_size",
        long = "command-queue-size",
        env = "HOST_COMMAND_QUEUE_SIZE"
    )]
    command_queue_size: Option<usize>,
    /// How often each session's inbox and gates are reconciled without a wake-up.
    #[arg(id = "host.reconcile_interval", long = "reconcile-interval", env = "HOST_RECONCILE_INTERVAL", value_parser = duration)]
    reconcile_interval: Option<Duration>,
    /// How many commands one consumer pass reads.
    #[arg(
        id = "host.reconcile_batch",
        long = "reconcile-batch",
        env = "HOST_RECONCILE_BATCH"
    )]
    reconcile_batch: Option<usize>,
    /// The drain's whole budget; keep it inside the platform's termination grace.
    #[arg(id = "host.drain_grace", long = "drain-grace", env = "HOST_DRAIN_GRACE", value_parser = duration)]
    drain_grace: Option<Duration>,
    /// How long a drain or release waits for a session to go idle.
    #[arg(id = "host.idle_boundary", long = "drain-idle-boundary", env = "HOST_DRAIN_IDLE_BOUNDARY", value_parser = duration)]
    idle_boundary: Option<Duration>,
    /// How long a drain waits to publish that the Host no longer accepts sessions.
    #[arg(id = "host.publish_bound", long = "drain-publish-bound", env = "HOST_DRAIN_PUBLISH_BOUND", value_parser = duration)]
    publish_bound: Option<Duration>,
    /// How long the store may go unanswered before /readyz reports `store_unreachable`.
    #[arg(id = "host.store_unreachable_bound", long = "store-unreachable-bound", env = "HOST_STORE_UNREACHABLE_BOUND", value_parser = duration)]
    store_unreachable_bound: Option<Duration>,

    /// HostLink application ping interval.
    #[arg(id = "link.ping_interval", long = "link-ping", env = "HOST_LINK_PING", value_parser = duration)]
    link_ping: Option<Duration>,
    /// HostLink pong timeout (shorter than the ping interval).
    #[arg(id = "link.pong_timeout", long = "link-pong", env = "HOST_LINK_PONG", value_parser = duration)]
    link_pong: Option<Duration>,
    /// The largest inbound HostLink message, in bytes.
    #[arg(
        id = "link.max_frame_bytes",
        long = "max-frame-bytes",
        env = "HOST_MAX_FRAME_BYTES"
    )]
    max_frame_bytes: Option<usize>,
    /// The most sessions one link may have bound.
    #[arg(
        id = "link.max_bindings_per_link",
        long = "max-bindings-per-link",
        env = "HOST_MAX_BINDINGS_PER_LINK"
    )]
    max_bindings_per_link: Option<usize>,
    /// The most bindings one tenant may hold across its links.
    #[arg(
        id = "link.max_bindings_per_tenant",
        long = "max-bindings-per-tenant",
        env = "HOST_MAX_BINDINGS_PER_TENANT"
    )]
    max_bindings_per_tenant: Option<usize>,
    /// The most authenticated links at once (the least recently used idle one is evicted).
    #[arg(
        id = "link.max_tenant_links",
        long = "max-tenant-links",
        env = "HOST_MAX_TENANT_LINKS"
    )]
    max_tenant_links: Option<usize>,
    /// Each link's outbound queue, in messages (a slow consumer is disconnected).
    #[arg(
        id = "link.outbound_queue",
        long = "outbound-queue",
        env = "HOST_OUTBOUND_QUEUE"
    )]
    outbound_queue: Option<usize>,
    /// How long an enduring record may wait for room in a full outbound queue.
    #[arg(id = "link.slow_consumer_timeout", long = "link-slow-consumer-timeout", env = "HOST_LINK_SLOW_CONSUMER_TIMEOUT", value_parser = duration)]
    slow_consumer_timeout: Option<Duration>,
    /// How long a new link may take to send its connect command.
    #[arg(id = "link.handshake_timeout", long = "link-handshake-timeout", env = "HOST_LINK_HANDSHAKE_TIMEOUT", value_parser = duration)]
    handshake_timeout: Option<Duration>,
    /// Live previews: each link's rate, in bytes per second.
    #[arg(
        id = "link.preview_rate_bytes_per_sec",
        long = "preview-rate-bytes-per-sec",
        env = "HOST_PREVIEW_RATE_BYTES_PER_SEC"
    )]
    preview_rate_bytes_per_sec: Option<u64>,
    /// Live previews: each link's burst, in bytes.
    #[arg(
        id = "link.preview_burst_bytes",
        long = "preview-burst-bytes",
        env = "HOST_PREVIEW_BURST_BYTES"
    )]
    preview_burst_bytes: Option<usize>,
    /// Live previews: how long deltas are merged before they are sent.
    #[arg(id = "link.preview_flush_interval", long = "preview-flush-interval", env = "HOST_PREVIEW_FLUSH_INTERVAL", value_parser = duration)]
    preview_flush_interval: Option<Duration>,
    /// Recovery: the most public records a resubscribing client may be behind and still be
    /// replayed from the durable journal (further behind it is told `recovered: false`).
    #[arg(
        id = "link.recovery_window",
        long = "recovery-window",
        env = "HOST_RECOVERY_WINDOW"
    )]
    recovery_window: Option<usize>,
    /// History: the most publications one `history` reply carries.
    #[arg(
        id = "link.history_limit",
        long = "history-limit",
        env = "HOST_HISTORY_LIMIT"
    )]
    history_limit: Option<usize>,

    /// How long a client may take to send a request's whole header (a slower one is cut off).
    #[arg(id = "listener.header_read_timeout", long = "header-read-timeout", env = "HOST_HEADER_READ_TIMEOUT", value_parser = duration)]
    header_read_timeout: Option<Duration>,
    /// How long a connection may send nothing before it is closed (longer than --link-ping).
    #[arg(id = "listener.idle_timeout", long = "idle-timeout", env = "HOST_IDLE_TIMEOUT", value_parser = duration)]
    idle_timeout: Option<Duration>,
    /// The most connections open at once, before any authentication; past it a connection
    /// is answered 503 and closed.
    #[arg(
        id = "listener.max_connections",
        long = "max-connections",
        env = "HOST_MAX_CONNECTIONS"
    )]
    max_connections: Option<usize>,

    /// Journal records between two snapshots of a session's state (a restore reads the
    /// newest snapshot and the records after it); a warm release also writes one.
    #[arg(
        id = "agents.snapshot_every",
        long = "snapshot-every",
        env = "HOST_SNAPSHOT_EVERY"
    )]
    snapshot_every: Option<u64>,
    /// The newest turns a session keeps in memory and sends to its model (older turns stay
    /// in the journal and its history).
    #[arg(
        id = "agents.conversation_turns",
        long = "conversation-turns",
        env = "HOST_CONVERSATION_TURNS"
    )]
    conversation_turns: Option<usize>,
    /// About how many bytes of conversation text a session keeps in memory and sends to its
    /// model (the turn in flight is always kept whole).
    #[arg(
        id = "agents.conversation_bytes",
        long = "conversation-bytes",
        env = "HOST_CONVERSATION_BYTES"
    )]
    conversation_bytes: Option<usize>,
    /// How long a permission gate waits before denying.
    #[arg(id = "agents.permission_timeout", long = "permission-timeout", env = "HOST_PERMISSION_TIMEOUT", value_parser = duration)]
    permission_timeout: Option<Duration>,
    /// An OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080/v1) for the `openai` agent;
    /// its key is read from HOST_OPENAI_API_KEY.
    #[arg(
        id = "agents.openai_endpoint",
        long = "openai-endpoint",
        env = "HOST_OPENAI_ENDPOINT"
    )]
    openai_endpoint: Option<String>,
    /// The model name the `openai` agent asks for.
    #[arg(
        id = "agents.openai_model",
        long = "openai-model",
        env = "HOST_OPENAI_MODEL"
    )]
    openai_model: Option<String>,
    /// Offer one runnable as a tool: name[@version] from --runnables, or a release published
    /// in the store as workspace/name@version (verified against its digest before use).
    /// Repeatable, or comma-separated.
    #[arg(
        id = "agents.runnable_tools",
        long = "runnable-tool",
        env = "HOST_RUNNABLE_TOOLS",
        value_delimiter = ',',
        value_name = "REF"
    )]
    runnable_tools: Option<Vec<String>>,

    /// Model client: how long connecting to the model endpoint may take.
    #[arg(id = "model.connect_timeout", long = "model-connect-timeout", env = "HOST_MODEL_CONNECT_TIMEOUT", value_parser = duration)]
    model_connect_timeout: Option<Duration>,
    /// Model client: how long the endpoint may take to start answering a request.
    #[arg(id = "model.request_timeout", long = "model-request-timeout", env = "HOST_MODEL_REQUEST_TIMEOUT", value_parser = duration)]
    model_request_timeout: Option<Duration>,
    /// Model client: the longest pause allowed inside a streamed answer.
    #[arg(id = "model.idle_timeout", long = "model-idle-timeout", env = "HOST_MODEL_IDLE_TIMEOUT", value_parser = duration)]
    model_idle_timeout: Option<Duration>,
    /// Model client: retries after a 429, a 5xx or a failed connect (at most 10).
    #[arg(
        id = "model.max_retries",
        long = "model-max-retries",
        env = "HOST_MODEL_MAX_RETRIES"
    )]
    model_max_retries: Option<u32>,
    /// Model client: the wait before the first retry (doubled each time, with jitter).
    #[arg(id = "model.backoff_initial", long = "model-backoff-initial", env = "HOST_MODEL_BACKOFF_INITIAL", value_parser = duration)]
    model_backoff_initial: Option<Duration>,
    /// Model client: the longest wait between two attempts.
    #[arg(id = "model.backoff_max", long = "model-backoff-max", env = "HOST_MODEL_BACKOFF_MAX", value_parser = duration)]
    model_backoff_max: Option<Duration>,
    /// Model client: the most tokens the model may write in one step (unset: the endpoint's).
    #[arg(
        id = "model.max_tokens",
        long = "model-max-tokens",
        env = "HOST_MODEL_MAX_TOKENS"
    )]
    model_max_tokens: Option<u32>,
    /// Model client: the sampling temperature, 0 to 2 (unset: the endpoint's default).
    #[arg(
        id = "model.temperature",
        long = "model-temperature",
        env = "HOST_MODEL_TEMPERATURE"
    )]
    model_temperature: Option<f32>,
    /// Model client: ask the endpoint to report each step's token usage (sends
    /// stream_options.include_usage; the counts go on the model call's trace span). `false`
    /// for an endpoint that refuses stream_options.
    #[arg(
        id = "model.stream_usage",
        long = "model-stream-usage",
        env = "HOST_MODEL_STREAM_USAGE",
        value_name = "BOOL"
    )]
    model_stream_usage: Option<bool>,
    /// When this process runs the fleet reconciler (auto: with a PostgreSQL store).
    #[arg(
        id = "fleet.reconciler",
        long = "fleet-reconciler",
        env = "HOST_FLEET_RECONCILER",
        value_enum
    )]
    fleet_reconciler: Option<FleetMode>,

    /// Host workflow runs: serve run.* over HostLink and advertise hostlink.run.
    #[arg(
        id = "runs.enabled",
        long = "runs",
        env = "HOST_RUNS",
        value_name = "BOOL"
    )]
    runs_enabled: Option<bool>,
    /// The most runs this Host drives at once; past it a start or a resume is refused
    /// resource_exhausted. Runs parked on an ask, a sleep or an operator do not count.
    #[arg(
        id = "runs.max_active",
        long = "run-max-active",
        env = "HOST_RUN_MAX_ACTIVE"
    )]
    run_max_active: Option<u32>,
    /// How often this Host looks for runs whose holder is gone (lease or Host registration
    /// expired) and for parked runs that are due (answered, or their sleep's deadline passed).
    #[arg(id = "runs.scan_interval", long = "run-scan-interval", env = "HOST_RUN_SCAN_INTERVAL", value_parser = duration)]
    run_scan_interval: Option<Duration>,
    /// How often a driver sleeping in place (a short sleep; longer ones park) re-reads its
    /// run's status without a wake-up.
    #[arg(id = "runs.poll", long = "run-poll", env = "HOST_RUN_POLL", value_parser = duration)]
    run_poll: Option<Duration>,
    /// Serve the operator console at /console (off unless given; `--console false` turns a
    /// config file's on off).
    #[arg(
        id = "console.enabled",
        long = "console",
        env = "HOST_CONSOLE",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    console_enabled: Option<bool>,
    /// Operator credentials for the console: `<name> <role> <sha256hex>` per line, role read
    /// or operate [default: the data folder's console-credentials, made with an `admin`
    /// operator on first start].
    #[arg(
        id = "console.credentials_file",
        long = "console-credentials-file",
        env = "HOST_CONSOLE_CREDENTIALS_FILE"
    )]
    console_credentials_file: Option<PathBuf>,

    /// Export traces over OTLP to this collector (http://host:4317 for gRPC, http://host:4318
    /// for HTTP/protobuf); off unless given.
    #[arg(
        id = "trace.otlp_endpoint",
        long = "otlp-endpoint",
        env = "HOST_OTLP_ENDPOINT"
    )]
    otlp_endpoint: Option<String>,
    /// The OTLP transport: grpc, or http/protobuf (spans posted to <endpoint>/v1/traces).
    #[arg(
        id = "trace.otlp_protocol",
        long = "otlp-protocol",
        env = "HOST_OTLP_PROTOCOL",
        value_enum
    )]
    otlp_protocol: Option<crate::telemetry::OtlpProtocol>,
    /// The share of new traces recorded, 0 to 1 (a caller's sampled flag decides for its own).
    #[arg(
        id = "trace.sampling_ratio",
        long = "trace-sampling-ratio",
        env = "HOST_TRACE_SAMPLING_RATIO"
    )]
    trace_sampling_ratio: Option<f64>,
    /// The service.name of exported spans (service.instance.id is the host id).
    #[arg(
        id = "trace.service_name",
        long = "trace-service-name",
        env = "HOST_TRACE_SERVICE_NAME"
    )]
    trace_service_name: Option<String>,
    /// The most finished spans waiting for export; past it spans are dropped and counted in
    /// host_trace_spans_dropped_total, never waited for.
    #[arg(
        id = "trace.queue_size",
        long = "trace-queue-size",
        env = "HOST_TRACE_QUEUE_SIZE"
    )]
    trace_queue_size: Option<usize>,
    /// The most spans in one export request (at most the queue size).
    #[arg(
        id = "trace.export_batch",
        long = "trace-export-batch",
        env = "HOST_TRACE_EXPORT_BATCH"
    )]
    trace_export_batch: Option<usize>,
    /// How long one export request may take before its spans are dropped (10ms to 5m).
    #[arg(id = "trace.export_timeout", long = "trace-export-timeout", env = "HOST_TRACE_EXPORT_TIMEOUT", value_parser = duration)]
    trace_export_timeout: Option<Duration>,
    #[command(flatten)]
    fleet: FleetFlags,
    #[command(flatten)]
    pub drive: DriveFlags,
}

/// The options of a run driver that `hostd run exec` shares with `hostd serve`, declared once:
/// the workspace new runs are pinned from and the run lease. Each is `None` unless given.
#[derive(Clone, Debug, Default, Args)]
pub struct DriveFlags {
    /// A runnables workspace: a new run is pinned to its runnables (resolved strictly, built
    /// and published to the store); `hostd serve` also offers them to the agents as tools (all
    /// of them, unless --runnable-tool picks some; effectful ones ask permission first).
    #[arg(
        id = "agents.runnables",
        long = "runnables",
        env = "HOST_RUNNABLES",
        value_name = "DIR"
    )]
    pub runnables: Option<PathBuf>,
    /// A run driver's hold on its run; a run whose driver stopped renewing it is taken over by
    /// a live Host once it expires (or once that Host's registration expires, if sooner).
    #[arg(id = "runs.lease", long = "run-lease", env = "HOST_RUN_LEASE", value_parser = duration)]
    pub run_lease: Option<Duration>,
}

impl ServeFlags {
    /// Replaces every option this carries a value for.
    fn overlay(mut self, o: &mut ServeOptions) {
        std::mem::take(&mut self.fleet).overlay(&mut o.fleet);
        let drive = std::mem::take(&mut self.drive);
        if let Some(v) = drive.runnables {
            o.agents.runnables = Some(v);
        }
        if let Some(v) = drive.run_lease {
            o.runs.lease = v;
        }
        macro_rules! set {
            ($($flag:ident => $($path:ident).+;)*) => {
                $(if let Some(v) = self.$flag { o.$($path).+ = v; })*
            };
        }
        macro_rules! set_some {
            ($($flag:ident => $($path:ident).+;)*) => {
                $(if let Some(v) = self.$flag { o.$($path).+ = Some(v); })*
            };
        }
        set! {
            listen => listen;
            data_dir => data_dir;
            sqlite_synchronous => sqlite_synchronous;
            sqlite_writer_cache_kib => sqlite_writer_cache_kib;
            sqlite_reader_cache_kib => sqlite_reader_cache_kib;
            referenced_body_cap => referenced_body_cap;
            pg_idle_transaction_timeout => pg_idle_transaction_timeout;
            pg_acquire_timeout => pg_acquire_timeout;
            pg_max_connections => pg_max_connections;
            isolation_class => host.isolation_class;
            placement => host.placement;
            capacity => host.capacity;
            warm_ttl => host.warm_ttl;
            registry_heartbeat => host.registry_heartbeat;
            registry_expiry => host.registry_expiry;
            registry_retention => host.registry_retention;
            claim_ttl => host.claim_ttl;
            apply_deadline => host.apply_deadline;
            command_queue_size => host.command_queue_size;
            reconcile_interval => host.reconcile_interval;
            reconcile_batch => host.reconcile_batch;
            drain_grace => host.drain_grace;
            idle_boundary => host.idle_boundary;
            publish_bound => host.publish_bound;
            store_unreachable_bound => host.store_unreachable_bound;
            link_ping => link.ping_interval;
            link_pong => link.pong_timeout;
            max_frame_bytes => link.max_frame_bytes;
            max_bindings_per_link => link.max_bindings_per_link;
            max_bindings_per_tenant => link.max_bindings_per_tenant;
            max_tenant_links => link.max_tenant_links;
            outbound_queue => link.outbound_queue;
            slow_consumer_timeout => link.slow_consumer_timeout;
            handshake_timeout => link.handshake_timeout;
            preview_rate_bytes_per_sec => link.preview_rate_bytes_per_sec;
            preview_burst_bytes => link.preview_burst_bytes;
            preview_flush_interval => link.preview_flush_interval;
            recovery_window => link.recovery_window;
            history_limit => link.history_limit;
            header_read_timeout => listener.header_read_timeout;
            idle_timeout => listener.idle_timeout;
            max_connections => listener.max_connections;
            permission_timeout => agents.permission_timeout;
            snapshot_every => agents.snapshot_every;
            conversation_turns => agents.conversation_turns;
            conversation_bytes => agents.conversation_bytes;
            openai_model => agents.openai_model;
            runnable_tools => agents.runnable_tools;
            model_connect_timeout => model.connect_timeout;
            model_request_timeout => model.request_timeout;
            model_idle_timeout => model.idle_timeout;
            model_max_retries => model.max_retries;
            model_backoff_initial => model.backoff_initial;
            model_backoff_max => model.backoff_max;
            model_stream_usage => model.stream_usage;
            fleet_reconciler => fleet.reconciler;
            runs_enabled => runs.enabled;
            console_enabled => console.enabled;
            run_max_active => runs.max_active;
            run_scan_interval => runs.scan_interval;
            run_poll => runs.poll;
            otlp_protocol => trace.otlp_protocol;
            trace_sampling_ratio => trace.sampling_ratio;
            trace_service_name => trace.service_name;
            trace_queue_size => trace.queue_size;
            trace_export_batch => trace.export_batch;
            trace_export_timeout => trace.export_timeout;
        }
        if let Some(lanes) = self.pg_write_lanes {
            // The flag's range (1 to 64) fits any usize.
            o.pg_write_lanes = usize::try_from(lanes).unwrap_or(64);
        }
        set_some! {
            store => store;
            credentials_file => credentials_file;
            console_credentials_file => console.credentials_file;
            host_id => host.host_id;
            internal_endpoint => host.internal_endpoint;
            fixed_session => host.fixed_session;
            openai_endpoint => agents.openai_endpoint;
            model_max_tokens => model.max_tokens;
            model_temperature => model.temperature;
            otlp_endpoint => trace.otlp_endpoint;
        }
    }
}

/// Where an effective value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    /// A default computed from another option or the machine.
    Derived(&'static str),
    File,
    Env,
    Flag,
}

/// The layered options and where each value came from.
#[derive(Debug)]
pub struct Effective {
    pub options: ServeOptions,
    /// True when no store was given: a SQLite file in the data folder, with a local tenant.
    pub embedded: bool,
    /// True when no credentials file was given (the data folder's is used).
    pub default_credentials: bool,
    /// True when no console credentials file was given (the data folder's is used).
    pub default_console_credentials: bool,
    /// True when no internal endpoint was given (it follows the bound listen address).
    pub default_endpoint: bool,
    config_file: Option<PathBuf>,
    sources: BTreeMap<String, Source>,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".into())
}

/// The dotted paths of every leaf of a TOML table, with their values, in table order.
fn leaves(prefix: &str, table: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => leaves(&path, t, out),
            other => out.push((path, other.clone())),
        }
    }
}

/// Layers default < file < environment < flag. `matches` are `serve`'s, to tell a flag from
/// an environment variable.
pub fn load(
    config: Option<&Path>,
    flags: ServeFlags,
    matches: Option<&ArgMatches>,
) -> Result<Effective> {
    let (mut options, in_file) = match config {
        None => (ServeOptions::default(), Vec::new()),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the config file {}", path.display()))?;
            let options: ServeOptions = toml::from_str(&text)
                .with_context(|| format!("the config file {} is refused", path.display()))?;
            let table: toml::Table = toml::from_str(&text)?;
            let mut in_file = Vec::new();
            leaves("", &table, &mut in_file);
            (options, in_file.into_iter().map(|(k, _)| k).collect())
        }
    };
    flags.overlay(&mut options);
    options
        .model
        .validate()
        .context("the model client's options ([model])")?;
    sessionstore::limits::check_referenced_body_cap(options.referenced_body_cap)
        .context("the store's options")?;
    if !(1..=512).contains(&options.pg_max_connections) {
        bail!("the store's options: pg_max_connections must be between 1 and 512");
    }
    if !(1..=64).contains(&options.pg_write_lanes) {
        bail!("the store's options: pg_write_lanes must be between 1 and 64");
    }
    options
        .listener
        .validate(options.link.ping_interval)
        .context("the listener's options ([listener])")?;
    harness::AgentConfig::check_session_bounds(
        options.agents.snapshot_every,
        options.agents.conversation_turns,
        options.agents.conversation_bytes,
    )
    .context("the agents' options ([agents])")?;
    options
        .runs
        .validate()
        .map_err(anyhow::Error::msg)
        .context("the run hosting options ([runs])")?;
    options
        .trace
        .validate()
        .context("the trace export options ([trace])")?;
    let mut sources = BTreeMap::new();
    for path in in_file {
        sources.insert(path, Source::File);
    }
    if let Some(m) = matches {
        for id in m.ids() {
            let id = id.as_str();
            match m.value_source(id) {
                Some(ValueSource::CommandLine) => {
                    sources.insert(id.to_owned(), Source::Flag);
                }
                Some(ValueSource::EnvVariable) => {
                    sources.insert(id.to_owned(), Source::Env);
                }
                _ => {}
            }
        }
    }
    pace_to_registry(&mut options, &mut sources)?;
    if let Some(url) = &options.store {
        // Refused here, before a data folder or a SQLite file named after a typo is made.
        StoreLocation::parse(url).context("--store (HOST_STORE_URL)")?;
    }
    let embedded = options.store.is_none();
    let default_credentials = options.credentials_file.is_none();
    let default_endpoint = options.host.internal_endpoint.is_none();
    let data = DataDir::new(&options.data_dir);
    if embedded {
        options.store = Some(data.store_url()?);
        sources.insert(
            "store".into(),
            Source::Derived("the data folder's SQLite file"),
        );
    }
    if default_credentials {
        options.credentials_file = Some(data.credentials_path());
        sources.insert(
            "credentials_file".into(),
            Source::Derived("the data folder's"),
        );
    }
    let default_console_credentials = options.console.credentials_file.is_none();
    if default_console_credentials {
        options.console.credentials_file = Some(data.console_credentials_path());
        sources.insert(
            "console.credentials_file".into(),
            Source::Derived("the data folder's"),
        );
    }
    if options.host.host_id.is_none() {
        options.host.host_id = Some(HostId::new(format!("hostd-{}", hostname()))?);
        sources.insert("host.host_id".into(), Source::Derived("hostd-<hostname>"));
    }
    if default_endpoint {
        sources.insert(
            "host.internal_endpoint".into(),
            Source::Derived("ws://<the bound listen address>"),
        );
    }
    Ok(Effective {
        options,
        embedded,
        default_credentials,
        default_console_credentials,
        default_endpoint,
        config_file: config.map(Path::to_path_buf),
        sources,
    })
}

/// The fleet reconciler's pass interval and leadership TTL, and PostgreSQL's idle-transaction
/// timeout, when the operator set them in no layer (flag, environment or file), follow the
/// registry expiry: a short expiry asks for fast failover, and a reconciler paced for the
/// default 20 s expiry (a pass a second, a leadership living 5 s) would add up to 6 s to every
/// failover a dead leader causes, as a frozen Host's 5 s transaction would to one it causes.
fn pace_to_registry(
    options: &mut ServeOptions,
    sources: &mut BTreeMap<String, Source>,
) -> Result<()> {
    let expiry = options.host.registry_expiry;
    if !sources.contains_key("fleet.interval") {
        options.fleet.interval = fleet::ReconcilerOptions::interval_for(expiry);
        sources.insert(
            "fleet.interval".into(),
            Source::Derived("a tenth of the registry expiry, 100 ms to 1 s"),
        );
    }
    if !sources.contains_key("fleet.leader_ttl") {
        options.fleet.leader_ttl =
            fleet::ReconcilerOptions::leader_ttl_for(expiry, options.fleet.interval);
        sources.insert(
            "fleet.leader_ttl".into(),
            Source::Derived("the registry expiry, at most 5 s, at least 2 intervals"),
        );
    }
    if !sources.contains_key("pg_idle_transaction_timeout") {
        // A frozen (SIGSTOPped) Host's open transaction holds its row locks until PostgreSQL
        // ends it; within half the expiry, the survivors are never kept waiting past it.
        options.pg_idle_transaction_timeout = (expiry / 2).clamp(
            Duration::from_secs(1),
            ServeOptions::default().pg_idle_transaction_timeout,
        );
        sources.insert(
            "pg_idle_transaction_timeout".into(),
            Source::Derived("half the registry expiry, 1 s to 5 s"),
        );
    }
    options
        .fleet
        .reconciler_options()
        .context("the fleet reconciler's options ([fleet])")?;
    Ok(())
}

impl Effective {
    /// Where the value at `path` came from.
    pub fn source(&self, path: &str) -> Source {
        self.sources.get(path).cloned().unwrap_or(Source::Default)
    }

    /// The effective options as TOML (a valid config file), each value followed by where it
    /// came from.
    pub fn render(&self) -> Result<String> {
        let mut options = self.options.clone();
        if self.default_endpoint {
            options.host.internal_endpoint = Some(format!("ws://{}", options.listen));
        }
        let table = toml::Table::try_from(&options)?;
        let mut out = String::from(
            "# hostd serve: the effective value of every option and where it came from\n\
             # (precedence: flag > environment > file > default)\n",
        );
        let mut section = String::new();
        let mut rows = Vec::new();
        leaves("", &table, &mut rows);
        // Top-level values first, then one table per section, as TOML requires.
        rows.sort_by_key(|(path, _)| path.contains('.'));
        for (path, value) in rows {
            let (head, key) = match path.rsplit_once('.') {
                Some((h, k)) => (h.to_owned(), k.to_owned()),
                None => (String::new(), path.clone()),
            };
            if head != section {
                out.push_str(&format!("\n[{head}]\n"));
                section = head;
            }
            let line = format!("{key} = {value}");
            let from = match self.source(&path) {
                Source::Default => "default".to_owned(),
                Source::Derived(how) => format!("default: {how}"),
                Source::File => format!(
                    "file {}",
                    self.config_file
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ),
                Source::Env => "environment".to_owned(),
                Source::Flag => "flag".to_owned(),
            };
            out.push_str(&format!("{line:<48} # {from}\n"));
        }
        Ok(out)
    }
}

/// Appends each option's default (from [`ServeOptions::default`]) to its help text, so
/// `hostd serve --help` shows defaults that are declared only once.
pub fn document_defaults(mut cmd: clap::Command) -> clap::Command {
    let Ok(table) = toml::Table::try_from(ServeOptions::default()) else {
        return cmd;
    };
    let mut rows = Vec::new();
    leaves("", &table, &mut rows);
    for (path, value) in rows {
        if !cmd.get_arguments().any(|a| a.get_id() == path.as_str()) {
            continue;
        }
        let shown = match &value {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        cmd = cmd.mut_arg(path, |a| {
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            a.help(format!("{help} [default: {shown}]"))
        });
    }
    // A value is named after its option's last segment (`--capacity <CAPACITY>`), not its id.
    let named: Vec<(String, String)> = cmd
        .get_arguments()
        .filter(|a| {
            a.get_action().takes_values()
                && a.get_value_names()
                    .is_none_or(|v| v.len() == 1 && v[0] == a.get_id().as_str())
        })
        .map(|a| {
            let id = a.get_id().to_string();
            let last = id.rsplit('.').next().unwrap_or(&id).to_uppercase();
            (id, last)
        })
        .collect();
    for (id, name) in named {
        cmd = cmd.mut_arg(id, |a| a.value_name(name));
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Probe {
        #[command(flatten)]
        flags: ServeFlags,
    }

    fn every_path(o: &ServeOptions) -> Vec<String> {
        let mut rows = Vec::new();
        leaves("", &toml::Table::try_from(o).unwrap(), &mut rows);
        rows.into_iter().map(|(k, _)| k).collect()
    }

    fn filled() -> ServeOptions {
        let mut o = ServeOptions {
            store: Some("sqlite:///x".into()),
            credentials_file: Some("c".into()),
            ..ServeOptions::default()
        };
        o.host.host_id = Some(HostId::new("h").unwrap());
        o.host.internal_endpoint = Some("ws://h:1".into());
        o.host.fixed_session = Some(SessionId::new("s").unwrap());
        o.agents.openai_endpoint = Some("http://m".into());
        o.agents.runnables = Some("r".into());
        o.agents.runnable_tools = vec!["t".into()];
        o.model.max_tokens = Some(1);
        o.model.temperature = Some(0.5);
        o.console.credentials_file = Some("o".into());
        o.trace.otlp_endpoint = Some("http://c:4317".into());
        o
    }

    #[test]
    fn every_option_has_exactly_one_flag_with_help_and_every_flag_names_an_option() {
        let cmd = Probe::command();
        let paths = every_path(&filled());
        let ids: Vec<String> = cmd
            .get_arguments()
            .filter(|a| a.get_id() != "help")
            .map(|a| a.get_id().to_string())
            .collect();
        for p in &paths {
            assert!(ids.contains(p), "option {p} has no flag");
        }
        for a in cmd.get_arguments().filter(|a| a.get_id() != "help") {
            let id = a.get_id().to_string();
            assert!(paths.contains(&id), "flag {id} names no option");
            assert!(
                a.get_env().is_some(),
                "flag {id} has no environment variable"
            );
            assert!(
                a.get_help().is_some_and(|h| !h.to_string().is_empty()),
                "flag {id} has no help"
            );
        }
    }

    #[test]
    fn a_model_option_out_of_its_range_is_refused_at_load_naming_the_field() {
        let matches = Probe::command()
            .try_get_matches_from(["probe", "--model-temperature", "5"])
            .unwrap();
        let probe = Probe::from_arg_matches(&matches).unwrap();
        let err = load(None, probe.flags, Some(&matches)).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("[model]"), "{text}");
        assert!(text.contains("out_of_range"), "{text}");
        assert!(text.contains("temperature"), "{text}");
    }

    fn load_args(args: &[&str]) -> Result<Effective> {
        let matches = Probe::command()
            .try_get_matches_from(std::iter::once("probe").chain(args.iter().copied()))
            .unwrap();
        let probe = Probe::from_arg_matches(&matches).unwrap();
        load(None, probe.flags, Some(&matches))
    }

    #[test]
    fn the_fleet_reconciler_and_idle_transactions_keep_pace_with_a_short_registry_expiry_unless_told_otherwise()
     {
        let e = load_args(&["--registry-expiry", "3s", "--registry-heartbeat", "1s"]).unwrap();
        assert_eq!(e.options.fleet.interval, Duration::from_millis(300));
        assert_eq!(e.options.fleet.leader_ttl, Duration::from_secs(3));
        assert!(matches!(e.source("fleet.interval"), Source::Derived(_)));
        assert!(matches!(e.source("fleet.leader_ttl"), Source::Derived(_)));
        assert_eq!(
            e.options.pg_idle_transaction_timeout,
            Duration::from_millis(1500)
        );
        // The default expiry (20 s) keeps the reconciler's own defaults.
        let e = load_args(&[]).unwrap();
        let d = fleet::ReconcilerOptions::default();
        assert_eq!(e.options.fleet.interval, d.interval);
        assert_eq!(e.options.fleet.leader_ttl, d.leader_ttl);
        assert_eq!(
            e.options.pg_idle_transaction_timeout,
            ServeOptions::default().pg_idle_transaction_timeout
        );
        // What the operator sets wins; the other one still follows the expiry, and is
        // stretched to cover two of the operator's intervals.
        let e = load_args(&["--registry-expiry", "3s", "--fleet-leader-ttl", "4s"]).unwrap();
        assert_eq!(e.options.fleet.leader_ttl, Duration::from_secs(4));
        assert_eq!(e.options.fleet.interval, Duration::from_millis(300));
        assert_eq!(e.source("fleet.leader_ttl"), Source::Flag);
        let e = load_args(&["--registry-expiry", "3s", "--fleet-interval", "2s"]).unwrap();
        assert_eq!(e.options.fleet.interval, Duration::from_secs(2));
        assert_eq!(e.options.fleet.leader_ttl, Duration::from_secs(4));
        // An explicit pair the reconciler cannot honour is still refused at load.
        let err = load_args(&["--fleet-interval", "2s", "--fleet-leader-ttl", "3s"]).unwrap_err();
        assert!(format!("{err:#}").contains("[fleet]"), "{err:#}");
    }

    #[test]
    fn the_hosts_postgresql_connections_are_bounded_by_flags_checked_at_load() {
        let e = load_args(&["--pg-max-connections", "4", "--pg-write-lanes", "1"]).unwrap();
        assert_eq!(e.options.pg_max_connections, 4);
        assert_eq!(e.options.pg_write_lanes, 1);
        for refused in [["--pg-max-connections", "0"], ["--pg-write-lanes", "65"]] {
            assert!(
                Probe::command()
                    .try_get_matches_from(std::iter::once("probe").chain(refused))
                    .is_err(),
                "{refused:?}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("host.toml");
        std::fs::write(&file, "pg_max_connections = 0\n").unwrap();
        let err = load(Some(&file), ServeFlags::default(), None).unwrap_err();
        assert!(format!("{err:#}").contains("pg_max_connections"), "{err:#}");
    }

    #[test]
    fn a_run_option_out_of_its_range_is_refused_at_load_naming_the_section() {
        let matches = Probe::command()
            .try_get_matches_from(["probe", "--run-max-active", "0"])
            .unwrap();
        let probe = Probe::from_arg_matches(&matches).unwrap();
        let err = load(None, probe.flags, Some(&matches)).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("[runs]"), "{text}");
        assert!(text.contains("max_active"), "{text}");
        let matches = Probe::command()
            .try_get_matches_from(["probe", "--runs", "false", "--run-lease", "2s"])
            .unwrap();
        let probe = Probe::from_arg_matches(&matches).unwrap();
        let e = load(None, probe.flags, Some(&matches)).unwrap();
        assert!(!e.options.runs.enabled);
        assert_eq!(e.options.runs.lease, Duration::from_secs(2));
        assert_eq!(e.source("runs.lease"), Source::Flag);
    }

    #[test]
    fn a_session_bound_out_of_its_range_is_refused_at_load_naming_the_section() {
        let matches = Probe::command()
            .try_get_matches_from(["probe", "--snapshot-every", "3"])
            .unwrap();
        let probe = Probe::from_arg_matches(&matches).unwrap();
        let err = load(None, probe.flags, Some(&matches)).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("[agents]"), "{text}");
        assert!(text.contains("snapshot_every"), "{text}");
        let matches = Probe::command()
            .try_get_matches_from(["probe", "--conversation-turns", "7"])
            .unwrap();
        let probe = Probe::from_arg_matches(&matches).unwrap();
        let e = load(None, probe.flags, Some(&matches)).unwrap();
        assert_eq!(e.options.agents.conversation_turns, 7);
        assert_eq!(
            e.options.agents.snapshot_every,
            harness::agent::DEFAULT_SNAPSHOT_EVERY
        );
        assert_eq!(e.source("agents.conversation_turns"), Source::Flag);
    }

    #[test]
    fn a_flag_overrides_the_file_and_the_file_overrides_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("host.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9000\"\n[host]\ncapacity = 8\nwarm_ttl = \"90s\"\n[link]\nmax_tenant_links = 7\n",
        )
        .unwrap();
        let matches = Probe::command()
            .try_get_matches_from(["probe", "--capacity", "9"])
            .unwrap();
        let probe = Probe::from_arg_matches(&matches).unwrap();
        let e = load(Some(&file), probe.flags, Some(&matches)).unwrap();
        assert_eq!(e.options.host.capacity, 9);
        assert_eq!(e.source("host.capacity"), Source::Flag);
        assert_eq!(e.options.host.warm_ttl, Duration::from_secs(90));
        assert_eq!(e.source("host.warm_ttl"), Source::File);
        assert_eq!(e.options.link.max_tenant_links, 7);
        assert_eq!(e.options.listen.port(), 9000);
        assert_eq!(e.options.host.claim_ttl, Options::default().claim_ttl);
        assert_eq!(e.source("host.claim_ttl"), Source::Default);
        let text = e.render().unwrap();
        assert!(text.contains("capacity = 9"), "{text}");
        // What --print-config shows is itself a config file that gives the same options.
        let again: ServeOptions = toml::from_str(&text).unwrap();
        assert_eq!(again.host.capacity, 9);
        assert_eq!(again.host.warm_ttl, Duration::from_secs(90));
    }

    #[test]
    fn an_unknown_or_mistyped_member_of_the_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "[host]\ncapacityy = 8\n",
            "[host]\ncapacity = \"eight\"\n",
            "[host]\nwarm_ttl = \"soon\"\n",
            "[host]\nplacement = \"shared\"\n",
            "[nope]\nx = 1\n",
        ] {
            let file = dir.path().join("bad.toml");
            std::fs::write(&file, text).unwrap();
            assert!(
                load(Some(&file), ServeFlags::default(), None).is_err(),
                "{text}"
            );
        }
    }
}
