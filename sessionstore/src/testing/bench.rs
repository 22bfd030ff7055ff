//! Bench support that needs no Host (part of the `testing` feature): what the workspace's
//! benches share whatever they measure. The backends a run was asked for, a runtime, a
//! database per backend that the bench drops when it is done, and the readings printed beside
//! the figures: the load average, what a process holds (`/proc`), medians, percentiles and
//! least-squares fits. (A session to measure on is [`super::new_session`].)
//!
//! It lives in the bottom crate so that every crate's benches reach it without a dependency
//! loop (`sessionstore`, `harness` and `workflow` benches use it directly; the Host benches
//! get it re-exported by `testkit::bench`, with the Host-level pieces). It measures nothing
//! on its own and asserts nothing about a figure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::options::StoreOptions;

/// The backends a bench run was asked for on its command line (`-- sqlite`, `-- postgres`):
/// both when neither is named. Other arguments (`cargo bench` passes `--bench`) are ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub sqlite: bool,
    pub postgres: bool,
}

/// Reads [`Chosen`] from this process's arguments.
pub fn chosen_backends() -> Chosen {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let named = |n: &str| args.iter().any(|a| a == n);
    let any = named("sqlite") || named("postgres");
    Chosen {
        sqlite: !any || named("sqlite"),
        postgres: !any || named("postgres"),
    }
}

/// The PostgreSQL server of a bench run (`HOST_TEST_DATABASE_URL`), or `None` after printing
/// the line that says the PostgreSQL half was skipped.
pub fn bench_postgres_url() -> Option<String> {
    match std::env::var("HOST_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            println!("postgres: skipped (HOST_TEST_DATABASE_URL is unset)");
            None
        }
    }
}

/// The runtime a bench runs on: multi-threaded, one worker per core, everything enabled.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the bench's runtime")
}

/// Where a bench keeps its store: a SQLite file in a temporary folder of its own (removed when
/// this is dropped), or a PostgreSQL schema named for the bench and this process (so a child
/// process can open it too), dropped with any other schema the bench made by [`Self::finish`].
/// The options use the real clock and the store's defaults; a bench adjusts them before it
/// opens anything.
pub struct BenchDatabase {
    pub options: StoreOptions,
    dir: Option<tempfile::TempDir>,
    schemas: Vec<String>,
}

impl BenchDatabase {
    /// A SQLite store in the file `file` of a fresh temporary folder.
    pub fn sqlite(file: &str) -> BenchDatabase {
        let dir = tempfile::tempdir().expect("a temporary folder for the bench's store");
        let options = StoreOptions::new(format!("sqlite://{}", dir.path().join(file).display()));
        BenchDatabase {
            options,
            dir: Some(dir),
            schemas: Vec::new(),
        }
    }

    /// A PostgreSQL store at `url` in the schema `{prefix}_{pid}`.
    pub fn postgres(url: &str, prefix: &str) -> BenchDatabase {
        let schema = format!("{prefix}_{}", std::process::id());
        let mut options = StoreOptions::new(url.to_owned());
        options.pg_schema = Some(schema.clone());
        BenchDatabase {
            options,
            dir: None,
            schemas: vec![schema],
        }
    }

    /// The store's URL (a SQLite file or the PostgreSQL server).
    pub fn url(&self) -> &str {
        &self.options.url
    }

    /// The PostgreSQL schema of the store; `None` on SQLite.
    pub fn schema(&self) -> Option<&str> {
        self.options.pg_schema.as_deref()
    }

    /// A path for another file beside a SQLite store (a raw baseline's database). Panics on
    /// PostgreSQL.
    pub fn beside(&self, file: &str) -> PathBuf {
        let dir: &Path = self
            .dir
            .as_ref()
            .map(|d| d.path())
            .expect("a SQLite bench database has a folder");
        dir.join(file)
    }

    /// A second schema beside the PostgreSQL store's (`{schema}_raw`, for a raw baseline's
    /// table), dropped with it by [`Self::finish`]. Panics on SQLite.
    pub fn raw_schema(&mut self) -> String {
        let raw = format!(
            "{}_raw",
            self.schema()
                .expect("a PostgreSQL bench database has a schema")
        );
        if !self.schemas.contains(&raw) {
            self.schemas.push(raw.clone());
        }
        raw
    }

    /// Drops the PostgreSQL schemas the bench made (best effort: a bench that cannot reach
    /// the server any more leaves them); removes a SQLite store's folder.
    pub async fn finish(self) {
        if !self.schemas.is_empty() {
            drop_schemas(&self.options.url, &self.schemas).await;
        }
    }
}

/// Drops the PostgreSQL `schemas` at `url`, in one statement batch; errors are ignored (best
/// effort, at the end of a bench).
pub async fn drop_schemas(url: &str, schemas: &[String]) {
    use sqlx::{Connection, Executor};
    let sql = schemas
        .iter()
        .map(|s| format!("DROP SCHEMA IF EXISTS {s} CASCADE"))
        .collect::<Vec<_>>()
        .join("; ");
    if let Ok(mut c) = sqlx::PgConnection::connect(url).await {
        let _ = c.execute(sqlx::AssertSqlSafe(sql)).await;
        let _ = c.close().await;
    }
}

/// The 1, 5 and 15 minute load averages, for a bench to print beside its figures.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// A whole number from the environment variable `name`, or `default` when it is unset.
/// Panics, naming the variable, on anything else (a bench's own setting).
pub fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}")),
        Err(_) => default,
    }
}

/// The value of one series in a Prometheus text body (`name` or `name{labels}` exactly as
/// exposed), or `None` when the body has no such series.
pub fn metric_value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// User + system CPU seconds process `pid` (this process with `None`) has used so far, from
/// `/proc/<pid>/stat` (USER_HZ = 100 ticks a second on Linux); NaN when it cannot be read.
pub fn cpu_seconds(pid: Option<u32>) -> f64 {
    const USER_HZ: f64 = 100.0;
    let dir = pid.map_or_else(|| "/proc/self".to_owned(), |p| format!("/proc/{p}"));
    let Ok(stat) = std::fs::read_to_string(format!("{dir}/stat")) else {
        return f64::NAN;
    };
    // The fields after the command name (in parentheses, and it may hold spaces): utime and
    // stime are the 14th and 15th of the line, the 12th and 13th after the name.
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) => (u + s) / USER_HZ,
        _ => f64::NAN,
    }
}

/// What a process holds now (bytes for memory).
#[derive(Clone, Copy, Debug, Default)]
pub struct Held {
    /// Resident set (`VmRSS`).
    pub rss: f64,
    /// Its anonymous part (`RssAnon`): the heap and stacks, not mapped files.
    pub anon: f64,
    /// Open descriptors.
    pub fds: f64,
    pub threads: f64,
}

/// Reads what process `pid` holds (this process with `None`); a field `/proc` lacks is NaN.
pub fn held(pid: Option<u32>) -> Held {
    let dir = pid.map_or_else(|| "/proc/self".to_owned(), |p| format!("/proc/{p}"));
    let status = std::fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    Held {
        rss: field("VmRSS:") * 1024.0,
        anon: field("RssAnon:") * 1024.0,
        fds: std::fs::read_dir(format!("{dir}/fd")).map_or(f64::NAN, |d| d.count() as f64),
        threads: field("Threads:"),
    }
}

/// The middle value of `v` (the upper one of two middles). Panics on an empty `v`.
pub fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

/// The `p` quantile (0 to 1) of the sorted durations `sorted`, the nearest rank. Panics on an
/// empty slice.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// The least-squares line through `points` (x, y): its slope and R². A slope of 0 and R² of 0
/// when every x is the same (nothing to fit).
pub fn least_squares(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    if sxx == 0.0 {
        return (0.0, 0.0);
    }
    let slope = sxy / sxx;
    let r2 = if syy == 0.0 {
        1.0
    } else {
        sxy * sxy / (sxx * syy)
    };
    (slope, r2)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{held, least_squares, median, percentile};

    #[test]
    fn a_line_fits_with_its_own_slope_and_no_residue() {
        let pts: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 3.0 * x as f64 + 7.0)).collect();
        let (slope, r2) = least_squares(&pts);
        assert!((slope - 3.0).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn points_at_one_x_have_no_slope() {
        assert_eq!(least_squares(&[(1.0, 2.0), (1.0, 5.0)]), (0.0, 0.0));
    }

    #[test]
    fn this_process_holds_memory_descriptors_and_threads() {
        let h = held(None);
        assert!(
            h.rss > 0.0 && h.anon > 0.0 && h.fds > 0.0 && h.threads >= 1.0,
            "{h:?}"
        );
    }

    #[test]
    fn the_median_is_the_upper_middle_and_percentiles_take_the_nearest_rank() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4, 1, 3, 2]), 3);
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&ms, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&ms, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&ms, 1.0), Duration::from_millis(100));
    }
}
