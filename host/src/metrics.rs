//! The Host's own Prometheus registry. Owns every series name and help text (named here once)
//! and the rendering of `/metrics`; nothing else registers a series. Gauges are computed at
//! scrape time from the state that owns them (a [`GaugeSource`]); counters and histograms are
//! recorded as things happen. Never exports process or controller series: only this Host's
//! local state.

use std::sync::{Arc, Mutex, Weak};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub const SESSIONS: &str = "host_sessions";
pub const SESSIONS_GATE_WAITING: &str = "host_sessions_gate_waiting";
pub const SESSIONS_COMMAND_BLOCKED: &str = "host_sessions_command_blocked";
pub const ADMISSION_WEIGHT_CONSUMED: &str = "host_admission_weight_consumed";
pub const ADMISSION_WEIGHT_CAPACITY: &str = "host_admission_weight_capacity";
pub const COMMAND_LAG: &str = "host_command_lag";
pub const COMMAND_QUEUE_DEPTH: &str = "host_command_queue_depth";
pub const RELEASE_FAILURES: &str = "host_release_failures_total";
pub const ATTACH_SECONDS: &str = "host_attach_seconds";
pub const COMMAND_APPLY_SECONDS: &str = "host_command_apply_seconds";
pub const CONNECTIONS_CUT: &str = "host_connections_cut_total";
pub const MEMORY_BUDGET: &str = "host_memory_budget_bytes";
pub const STORE_STATEMENTS: &str = "host_store_statements_total";
pub const STORE_TRANSACTIONS: &str = "host_store_transactions_total";
pub const STORE_WRITES: &str = "host_store_writes_total";
pub const LINK_CREDENTIAL_REFUSALS: &str = "host_link_credential_refusals_total";
pub const READY: &str = "host_ready";
pub const NOT_READY: &str = "host_not_ready";
pub const TRACE_SPANS_DROPPED: &str = "host_trace_spans_dropped_total";
pub const TRACE_SPANS_EXPORTED: &str = "host_trace_spans_exported_total";

/// The residency states `host_sessions` is labelled with.
pub const SESSION_STATES: [&str; 3] = ["attaching", "resident", "releasing"];

/// What the gauges read from the state that owns it, at every scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GaugeSample {
    pub attaching: i64,
    pub resident: i64,
    pub releasing: i64,
    pub gate_waiting: i64,
    pub command_blocked: i64,
    pub weight_consumed: i64,
    pub weight_capacity: i64,
    pub command_lag: i64,
    pub queue_depth: i64,
    /// Whether `/readyz` answers ready.
    pub ready: bool,
    /// For each code of [`crate::readiness::REASON_CODES`], in order, whether it holds.
    pub not_ready: [bool; REASONS],
}

/// How many not-ready reason codes there are.
const REASONS: usize = crate::readiness::REASON_CODES.len();

/// The state the gauges describe (the residency table). Sampled at scrape time, so no gauge
/// is ever kept in step by hand.
pub trait GaugeSource: Send + Sync {
    fn sample(&self) -> GaugeSample;
}

/// The Host's metrics: counters and histograms its parts record, and gauges computed from a
/// [`GaugeSource`] when `/metrics` is rendered.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    gauges: Arc<Gauges>,
    pub release_failures: IntCounter,
    pub attach_seconds: HistogramVec,
    pub apply_seconds: HistogramVec,
    /// Connections the listener cut, by the bound that bit (`max_connections`,
    /// `header_timeout`, `idle_timeout`).
    pub connections_cut: IntCounterVec,
}

/// The gauge series, owned by the collector and set from a fresh sample at each scrape.
struct Gauges {
    source: Mutex<Option<Weak<dyn GaugeSource>>>,
    sessions: IntGaugeVec,
    gate_waiting: IntGauge,
    command_blocked: IntGauge,
    weight_consumed: IntGauge,
    weight_capacity: IntGauge,
    command_lag: IntGauge,
    queue_depth: IntGauge,
    ready: IntGauge,
    not_ready: IntGaugeVec,
    descs: Vec<Desc>,
}

impl Gauges {
    fn new() -> Result<Gauges, MetricsError> {
        let sessions = m(IntGaugeVec::new(
            Opts::new(SESSIONS, "Sessions on this Host by residency state."),
            &["state"],
        ))?;
        let gate_waiting = m(IntGauge::new(
            SESSIONS_GATE_WAITING,
            "Resident sessions parked at one or more open gates.",
        ))?;
        let command_blocked = m(IntGauge::new(
            SESSIONS_COMMAND_BLOCKED,
            "Resident sessions whose next command cannot progress on this Host (non-zero is a fault to look at).",
        ))?;
        let weight_consumed = m(IntGauge::new(
            ADMISSION_WEIGHT_CONSUMED,
            "Admission weight held by resident and attaching sessions.",
        ))?;
        let weight_capacity = m(IntGauge::new(
            ADMISSION_WEIGHT_CAPACITY,
            "Admission weight this Host offers.",
        ))?;
        let command_lag = m(IntGauge::new(
            COMMAND_LAG,
            "Commands admitted to resident sessions and not yet consumed, as of each session's last pass.",
        ))?;
        let queue_depth = m(IntGauge::new(
            COMMAND_QUEUE_DEPTH,
            "Wake-ups queued for resident sessions' command consumers.",
        ))?;
        let ready = m(IntGauge::new(
            READY,
            "1 when /readyz answers ready, else 0 (host_not_ready says why).",
        ))?;
        let not_ready = m(IntGaugeVec::new(
            Opts::new(
                NOT_READY,
                "1 for each reason /readyz gives for not being ready (starting, draining, fenced, store_unreachable, persistence_fault), else 0.",
            ),
            &["reason"],
        ))?;
        let mut descs = Vec::new();
        for c in [
            &sessions as &dyn Collector,
            &ready,
            &not_ready,
            &gate_waiting,
            &command_blocked,
            &weight_consumed,
            &weight_capacity,
            &command_lag,
            &queue_depth,
        ] {
            descs.extend(c.desc().into_iter().cloned());
        }
        Ok(Gauges {
            source: Mutex::new(None),
            sessions,
            gate_waiting,
            command_blocked,
            weight_consumed,
            weight_capacity,
            command_lag,
            queue_depth,
            ready,
            not_ready,
            descs,
        })
    }
}

impl Collector for Gauges {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let source = match self.source.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let s = source
            .and_then(|w| w.upgrade())
            .map(|src| src.sample())
            .unwrap_or_default();
        for (state, v) in SESSION_STATES
            .iter()
            .zip([s.attaching, s.resident, s.releasing])
        {
            self.sessions.with_label_values(&[state]).set(v);
        }
        self.gate_waiting.set(s.gate_waiting);
        self.command_blocked.set(s.command_blocked);
        self.weight_consumed.set(s.weight_consumed);
        self.weight_capacity.set(s.weight_capacity);
        self.command_lag.set(s.command_lag);
        self.queue_depth.set(s.queue_depth);
        self.ready.set(i64::from(s.ready));
        for (code, holds) in crate::readiness::REASON_CODES.iter().zip(s.not_ready) {
            self.not_ready
                .with_label_values(&[code])
                .set(i64::from(holds));
        }
        let mut out = self.sessions.collect();
        out.extend(self.not_ready.collect());
        for g in [
            &self.gate_waiting,
            &self.command_blocked,
            &self.weight_consumed,
            &self.weight_capacity,
            &self.command_lag,
            &self.queue_depth,
            &self.ready,
        ] {
            out.extend(g.collect());
        }
        out
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Where a control group states the process's memory limit: cgroup v2, then v1.
const MEMORY_LIMIT_FILES: [&str; 2] = [
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
];

/// The process's memory budget, when its control group sets one.
pub fn memory_budget() -> Option<u64> {
    MEMORY_LIMIT_FILES.iter().find_map(|f| {
        std::fs::read_to_string(f)
            .ok()
            .and_then(|t| parse_memory_limit(&t))
    })
}

/// A control group's memory limit file: a number of bytes, or `max` (v2) or a number near
/// 2^63 (v1, page-rounded) when there is no limit.
pub fn parse_memory_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    // v1 writes "no limit" as i64::MAX rounded down to a page.
    (bytes > 0 && bytes < (1 << 62)).then_some(bytes)
}

/// Registering a fixed, distinct set of series into a fresh registry cannot collide; should a
/// future edit make it do so, the error names the series.
#[derive(Debug, thiserror::Error)]
#[error("metrics registry: {0}")]
pub struct MetricsError(pub String);

fn reg<T: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    c: T,
) -> Result<T, MetricsError> {
    r.register(Box::new(c.clone()))
        .map_err(|e| MetricsError(e.to_string()))?;
    Ok(c)
}

/// The registry owns its collectors by value; the metrics keep a second handle on the gauges
/// to name their source later.
struct SharedGauges(Arc<Gauges>);

impl Collector for SharedGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

/// The store's own counters, read at each scrape: what this Host costs its database.
struct StoreSeries {
    store: sessionstore::Store,
    statements: IntCounter,
    transactions: IntCounter,
    writes: IntCounter,
    descs: Vec<Desc>,
}

impl StoreSeries {
    fn new(store: sessionstore::Store) -> Result<StoreSeries, MetricsError> {
        let statements = m(IntCounter::new(
            STORE_STATEMENTS,
            "Statements this Host sent its store's database (each BEGIN, COMMIT and batch counted once; one round trip each on PostgreSQL), reads and writes alike.",
        ))?;
        let transactions = m(IntCounter::new(
            STORE_TRANSACTIONS,
            "Write transactions this Host committed in its store.",
        ))?;
        let writes = m(IntCounter::new(
            STORE_WRITES,
            "Write operations this Host asked of its store (many may share a transaction).",
        ))?;
        let mut descs = Vec::new();
        for c in [&statements, &transactions, &writes] {
            descs.extend(c.desc().into_iter().cloned());
        }
        Ok(StoreSeries {
            store,
            statements,
            transactions,
            writes,
            descs,
        })
    }
}

impl Collector for StoreSeries {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = self.store.stats();
        // The counters only grow; each catches up with the store's own count.
        for (c, v) in [
            (&self.statements, now.server_statements),
            (&self.transactions, now.commits),
            (&self.writes, now.writes),
        ] {
            c.inc_by(v.saturating_sub(c.get()));
        }
        let mut out = self.statements.collect();
        out.extend(self.transactions.collect());
        out.extend(self.writes.collect());
        out
    }
}

fn m<T>(r: prometheus::Result<T>) -> Result<T, MetricsError> {
    r.map_err(|e| MetricsError(e.to_string()))
}

impl Metrics {
    /// A fresh registry; the gauges read zero until [`Metrics::sample_from`] names their
    /// source. `host_memory_budget_bytes` is the process's control-group memory limit, and is
    /// exported only when there is one.
    pub fn new() -> Result<Metrics, MetricsError> {
        Metrics::with_memory_budget(memory_budget())
    }

    /// A fresh registry exporting `budget` as `host_memory_budget_bytes` (nothing when
    /// `None`: an unknown budget is left out, never reported as zero).
    pub fn with_memory_budget(budget: Option<u64>) -> Result<Metrics, MetricsError> {
        let r = Registry::new();
        if let Some(bytes) = budget {
            let g = reg(
                &r,
                m(IntGauge::new(
                    MEMORY_BUDGET,
                    "The memory this Host may use (its control group's limit); absent when unlimited or unknown.",
                ))?,
            )?;
            g.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        let gauges = Arc::new(Gauges::new()?);
        r.register(Box::new(SharedGauges(gauges.clone())))
            .map_err(|e| MetricsError(e.to_string()))?;
        let latency = vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        Ok(Metrics {
            gauges,
            release_failures: reg(
                &r,
                m(IntCounter::new(
                    RELEASE_FAILURES,
                    "Releases (warm or drain) whose runtime release was refused or failed.",
                ))?,
            )?,
            attach_seconds: reg(
                &r,
                m(HistogramVec::new(
                    HistogramOpts::new(ATTACH_SECONDS, "Attach latency, by launch mode.")
                        .buckets(latency.clone()),
                    &["mode"],
                ))?,
            )?,
            apply_seconds: reg(
                &r,
                m(HistogramVec::new(
                    HistogramOpts::new(
                        COMMAND_APPLY_SECONDS,
                        "Command application latency (claim to cursor), by kind.",
                    )
                    .buckets(latency),
                    &["kind"],
                ))?,
            )?,
            connections_cut: reg(
                &r,
                m(IntCounterVec::new(
                    Opts::new(
                        CONNECTIONS_CUT,
                        "Connections the listener cut, by the bound that bit.",
                    ),
                    &["reason"],
                ))?,
            )?,
            registry: r,
        })
    }

    /// Names the state the gauges are computed from at each scrape. Held weakly: the owner of
    /// that state also owns these metrics.
    pub fn sample_from(&self, source: Weak<dyn GaugeSource>) {
        match self.gauges.source.lock() {
            Ok(mut g) => *g = Some(source),
            Err(p) => *p.into_inner() = Some(source),
        }
    }

    /// Exports `store`'s counters of the work it sent its database
    /// (`host_store_statements_total`, `host_store_transactions_total`,
    /// `host_store_writes_total`), read at each scrape.
    pub fn count_store(&self, store: sessionstore::Store) -> Result<(), MetricsError> {
        self.registry
            .register(Box::new(StoreSeries::new(store)?))
            .map_err(|e| MetricsError(e.to_string()))
    }

    /// Registers `collector` (a series of another crate hosted on this Host, such as run
    /// hosting's) in this registry, so `/metrics` renders it; a name already registered is
    /// refused.
    pub fn register<C: Collector + Clone + 'static>(
        &self,
        collector: C,
    ) -> Result<C, MetricsError> {
        reg(&self.registry, collector)
    }

    /// The text exposition of this registry.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if encoder.encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// The content type of [`Metrics::render`].
    pub fn content_type(&self) -> String {
        TextEncoder::new().format_type().to_owned()
    }
}

/// `host_link_credential_refusals_total{reason}`: the credentials' own refusal counts, read
/// at each scrape (the credentials own the counting; this only exports it).
#[derive(Clone)]
pub struct CredentialRefusals {
    source: Arc<dyn hostlink::auth::AuthVerifier>,
    counter: IntCounterVec,
}

impl CredentialRefusals {
    pub fn new(
        source: Arc<dyn hostlink::auth::AuthVerifier>,
    ) -> Result<CredentialRefusals, MetricsError> {
        let counter = m(IntCounterVec::new(
            Opts::new(
                LINK_CREDENTIAL_REFUSALS,
                "Link credentials refused (at connect, refresh or a reload), by the check that failed.",
            ),
            &["reason"],
        ))?;
        Ok(CredentialRefusals { source, counter })
    }
}

impl Collector for CredentialRefusals {
    fn desc(&self) -> Vec<&Desc> {
        self.counter.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        for (reason, total) in self.source.refusal_counts() {
            let series = self.counter.with_label_values(&[reason.as_str()]);
            let shown = series.get();
            if total > shown {
                series.inc_by(total - shown);
            }
        }
        self.counter.collect()
    }
}

/// What the trace export pipeline counted (it owns the counting; `/metrics` only reads it).
pub trait TraceExportSource: Send + Sync {
    /// Finished spans given up: the export queue was full, or their export failed.
    fn dropped(&self) -> u64;
    /// Finished spans a collector accepted.
    fn exported(&self) -> u64;
}

/// `host_trace_spans_dropped_total` and `host_trace_spans_exported_total`, read from the
/// export pipeline at each scrape.
#[derive(Clone)]
pub struct TraceExportSeries {
    source: Arc<dyn TraceExportSource>,
    dropped: IntCounter,
    exported: IntCounter,
}

impl TraceExportSeries {
    pub fn new(source: Arc<dyn TraceExportSource>) -> Result<TraceExportSeries, MetricsError> {
        Ok(TraceExportSeries {
            source,
            dropped: m(IntCounter::new(
                TRACE_SPANS_DROPPED,
                "Finished trace spans dropped rather than exported (the export queue was full or the collector failed).",
            ))?,
            exported: m(IntCounter::new(
                TRACE_SPANS_EXPORTED,
                "Finished trace spans the OTLP collector accepted.",
            ))?,
        })
    }
}

impl Collector for TraceExportSeries {
    fn desc(&self) -> Vec<&Desc> {
        let mut d = self.dropped.desc();
        d.extend(self.exported.desc());
        d
    }

    fn collect(&self) -> Vec<MetricFamily> {
        for (series, total) in [
            (&self.dropped, self.source.dropped()),
            (&self.exported, self.source.exported()),
        ] {
            let shown = series.get();
            if total > shown {
                series.inc_by(total - shown);
            }
        }
        let mut out = self.dropped.collect();
        out.extend(self.exported.collect());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(u64, u64);

    impl TraceExportSource for Fixed {
        fn dropped(&self) -> u64 {
            self.0
        }
        fn exported(&self) -> u64 {
            self.1
        }
    }

    #[test]
    fn trace_export_counts_are_read_from_their_source_at_each_scrape() {
        let metrics = Metrics::with_memory_budget(None).unwrap();
        metrics
            .register(TraceExportSeries::new(Arc::new(Fixed(7, 40))).unwrap())
            .unwrap();
        let text = metrics.render();
        assert!(text.contains("host_trace_spans_dropped_total 7"), "{text}");
        assert!(
            text.contains("host_trace_spans_exported_total 40"),
            "{text}"
        );
    }

    #[test]
    fn the_memory_budget_is_exported_only_when_a_limit_is_known() {
        let known = Metrics::with_memory_budget(Some(512 << 20))
            .unwrap()
            .render();
        assert!(
            known.contains("host_memory_budget_bytes 536870912"),
            "{known}"
        );
        let unknown = Metrics::with_memory_budget(None).unwrap().render();
        assert!(!unknown.contains(MEMORY_BUDGET), "{unknown}");
    }

    #[test]
    fn a_control_group_limit_reads_as_bytes_and_no_limit_reads_as_unknown() {
        assert_eq!(parse_memory_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_memory_limit("max\n"), None);
        assert_eq!(parse_memory_limit("9223372036854771712\n"), None);
        assert_eq!(parse_memory_limit("0"), None);
        assert_eq!(parse_memory_limit("garbage"), None);
    }
}
