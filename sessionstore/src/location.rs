//! What a store URL names: a SQLite file or a PostgreSQL server. Owns the one rule for which
//! URLs are stores — `sqlite://PATH` (or `sqlite:PATH`), `postgres://…` / `postgresql://…`, or a
//! plain file path — and refuses everything else with `unsupported_store` before anything is
//! opened or created. Also owns how a location is shown in logs: never a password.

use std::fmt;
use std::path::PathBuf;

/// The schemes a store URL may carry, as an operator would type them (the refusal's text, kept
/// with the error it is shown in).
pub use crate::error::STORE_SCHEMES;
use crate::error::{StoreError, StoreResult};

/// Where a store lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    /// A SQLite database file.
    Sqlite(PathBuf),
    /// A PostgreSQL server; the URL as given (it may hold a password: never show it, show
    /// [`StoreLocation`]'s `Display` instead).
    Postgres(String),
}

impl StoreLocation {
    /// Classifies `url`. A plain path has no scheme: nothing before its first `/` contains a
    /// `:` (so `::::`, `mysql:x` and `mysql://x/y` are refused, `./data/host.db` and
    /// `/var/lib/a:b/host.db` are paths).
    pub fn parse(url: &str) -> StoreResult<StoreLocation> {
        let url = url.trim();
        if url.is_empty() {
            return Err(StoreError::UnsupportedStore {
                given: String::new(),
            });
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreLocation::Postgres(url.to_owned()));
        }
        if let Some(path) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err(StoreError::invalid("url", "names no SQLite file"));
            }
            return Ok(StoreLocation::Sqlite(PathBuf::from(path)));
        }
        let first_segment = url.split('/').next().unwrap_or_default();
        if first_segment.contains(':') {
            return Err(StoreError::UnsupportedStore {
                given: scheme_of(url),
            });
        }
        Ok(StoreLocation::Sqlite(PathBuf::from(url)))
    }

    /// The backend's name: `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreLocation::Sqlite(_) => "sqlite",
            StoreLocation::Postgres(_) => "postgres",
        }
    }
}

/// What of a refused URL may be shown: its scheme (or its first few characters).
fn scheme_of(url: &str) -> String {
    match url.split_once(':') {
        Some((scheme, _)) if !scheme.is_empty() => format!("{scheme}:"),
        _ => url.chars().take(8).collect(),
    }
}

impl fmt::Display for StoreLocation {
    /// `sqlite /path/host.db` or `postgres host:port/database` (user and password left out).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => write!(f, "sqlite {}", path.display()),
            StoreLocation::Postgres(url) => {
                let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
                let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
                let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
                write!(f, "postgres {rest}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn sqlite_urls_postgres_urls_and_plain_paths_are_stores() {
        assert_eq!(
            StoreLocation::parse("sqlite:///tmp/h.db").unwrap(),
            StoreLocation::Sqlite("/tmp/h.db".into())
        );
        assert_eq!(
            StoreLocation::parse("sqlite:rel.db").unwrap(),
            StoreLocation::Sqlite("rel.db".into())
        );
        assert_eq!(
            StoreLocation::parse("./data/host.db").unwrap(),
            StoreLocation::Sqlite("./data/host.db".into())
        );
        assert_eq!(
            StoreLocation::parse("/var/lib/a:b/host.db").unwrap(),
            StoreLocation::Sqlite("/var/lib/a:b/host.db".into())
        );
        for pg in ["postgres://u:p@h:5432/d", "postgresql://h/d"] {
            assert_eq!(StoreLocation::parse(pg).unwrap().backend(), "postgres");
        }
    }

    #[test]
    fn other_schemes_and_colon_names_are_refused_as_unsupported_stores() {
        for bad in [
            "::::",
            "mysql://x/y",
            "mysql:x",
            "redis://h",
            "",
            "http://h/x",
        ] {
            let e = StoreLocation::parse(bad).unwrap_err();
            assert_eq!(e.code(), ErrorCode::UnsupportedStore, "{bad}");
            let text = e.to_string();
            assert!(text.starts_with("unsupported_store"), "{text}");
            assert!(
                text.contains("postgres://") && text.contains("sqlite://"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_postgres_location_is_shown_without_its_credentials() {
        let l =
            StoreLocation::parse("postgres://admin:s3cret@db.example:5433/host?sslmode=require")
                .unwrap();
        let shown = l.to_string();
        assert_eq!(shown, "postgres db.example:5433/host");
        assert!(!shown.contains("s3cret"));
    }
}
