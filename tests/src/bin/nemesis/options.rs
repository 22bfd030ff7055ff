//! The nemesis's command line: every option declared once here (type, default, environment
//! variable, flag, help and validation), and the store backend it names. Owns the parsing and
//! the checks an option needs beyond its type; never starts anything.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use wire_enum::wire_enum;

wire_enum! {
    /// The store the fleet shares.
    pub enum Backend {
        /// A fleet on a PostgreSQL database of the run's own, each Host behind a fault proxy
        /// to it.
        Postgres = "postgres",
        /// One Host on a SQLite file (no store link to fault: processes and client links only).
        Sqlite = "sqlite",
    }
    kind = "backend";
    from_str;
}

/// The longest run (a day).
const MAX_MINUTES: f64 = 24.0 * 60.0;

/// Drives a fleet of real `hostd serve` processes with a controller workload while a seeded
/// nemesis injects faults (kill -9 and restart, SIGSTOP/SIGCONT, and through a fault proxy
/// in front of each Host's PostgreSQL link and of each Host's client listener: delays,
/// bandwidth limits, dropped and black-holed connections, cuts, half-open links). At the end
/// it heals everything, lets the fleet settle, checks every admitted command ended exactly
/// once (testkit's checker) and prints a summary. Exit status: 0 no violation, 1 violations
/// (the seed and the offending sessions' histories are printed), 2 the run could not be set up.
#[derive(Debug, Parser)]
#[command(name = "nemesis", version)]
pub struct Options {
    /// Hosts in the fleet (`hostd serve` processes); SQLite allows exactly one.
    #[arg(long, env = "NEMESIS_HOSTS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=9))]
    pub hosts: u32,

    /// How long faults are injected, in minutes (a decimal: 0.5 is thirty seconds). Healing,
    /// settling and checking come after.
    #[arg(long, env = "NEMESIS_MINUTES", default_value_t = 5.0, value_parser = minutes)]
    pub minutes: f64,

    /// The seed of every random choice (which fault, when, where, for how long; what each
    /// client sends). A fresh one, printed, when not given: pass it again to replay the run's
    /// choices (timings on a real machine are not replayed).
    #[arg(long, env = "NEMESIS_SEED")]
    pub seed: Option<u64>,

    /// The store the fleet shares: `postgres` (a fleet) or `sqlite` (one Host).
    #[arg(long, env = "NEMESIS_BACKEND", default_value = "postgres", value_parser = backend)]
    pub backend: Backend,

    /// The PostgreSQL server the run makes its own database on (for `--backend postgres`); a
    /// URL naming a database on it that may create databases.
    #[arg(long, env = "HOST_TEST_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Sessions driven at once, each by a client of its own.
    #[arg(long, env = "NEMESIS_SESSIONS", default_value_t = 9,
          value_parser = clap::value_parser!(u32).range(1..=200))]
    pub sessions: u32,

    /// The mean pause between two faults (each pause is drawn between half and one and a half
    /// times it).
    #[arg(long, env = "NEMESIS_FAULT_INTERVAL", default_value = "3s", value_parser = positive_duration)]
    pub fault_interval: Duration,

    /// How long, after everything is healed, the fleet has to become ready and end every
    /// admitted command; a command still pending then is reported `wedged`.
    #[arg(long, env = "NEMESIS_SETTLE", default_value = "60s", value_parser = positive_duration)]
    pub settle: Duration,

    /// Where the Hosts' data folders and logs, the history and the report go: a fresh
    /// temporary folder by default, kept (and named) when a violation is found.
    #[arg(long, env = "NEMESIS_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
}

impl Options {
    /// Checks what the types alone cannot: the backend's needs.
    pub fn validate(&self) -> Result<(), String> {
        match self.backend {
            Backend::Sqlite if self.hosts != 1 => Err(format!(
                "--hosts {}: a SQLite store serves exactly one Host (use --hosts 1, or --backend postgres)",
                self.hosts
            )),
            Backend::Postgres if self.database_url.as_deref().is_none_or(str::is_empty) => Err(
                "--backend postgres needs --database-url (or HOST_TEST_DATABASE_URL), e.g. postgres://postgres@127.0.0.1:5432/test".into(),
            ),
            _ => Ok(()),
        }
    }

    /// How long faults are injected.
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.minutes * 60.0)
    }
}

fn minutes(text: &str) -> Result<f64, String> {
    let m: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of minutes (e.g. 2 or 0.5)"))?;
    if !(m > 0.0 && m <= MAX_MINUTES) {
        return Err(format!(
            "{m} minutes: must be above 0 and at most {MAX_MINUTES}"
        ));
    }
    Ok(m)
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    let d = timing::duration_text::parse(text)?;
    if d.is_zero() {
        return Err("must be above zero".into());
    }
    Ok(d)
}

fn backend(text: &str) -> Result<Backend, String> {
    text.parse::<Backend>().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("nemesis").chain(args.iter().copied()))
    }

    #[test]
    fn the_defaults_are_three_hosts_for_five_minutes_on_postgres() {
        let o = parse(&["--database-url", "postgres://x@127.0.0.1/db"]).unwrap();
        assert_eq!((o.hosts, o.minutes, o.backend), (3, 5.0, Backend::Postgres));
        assert_eq!(o.duration(), Duration::from_secs(300));
        assert!(o.validate().is_ok());
    }

    #[test]
    fn a_bad_value_is_refused_naming_what_it_should_be() {
        for (args, expected) in [
            (&["--minutes", "0"][..], "must be above 0"),
            (&["--minutes", "soon"][..], "not a number of minutes"),
            (&["--hosts", "0"][..], "0 is not in 1..=9"),
            (
                &["--backend", "mysql"][..],
                "expected one of postgres, sqlite",
            ),
            (&["--settle", "30"][..], "e.g. 500ms"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(expected), "{args:?}: {err}");
        }
    }

    #[test]
    fn sqlite_takes_one_host_and_postgres_needs_a_server() {
        let o = parse(&["--backend", "sqlite"]).unwrap();
        assert!(o.validate().unwrap_err().contains("exactly one Host"));
        let o = parse(&["--backend", "sqlite", "--hosts", "1"]).unwrap();
        assert!(o.validate().is_ok());
        let mut o = parse(&[]).unwrap();
        o.database_url = None;
        assert!(o.validate().unwrap_err().contains("--database-url"));
    }
}
