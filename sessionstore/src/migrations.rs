//! Schema migrations, with their rules written once for both backends. Owns the list of the
//! migration files each backend knows (`migrations/sqlite`, `migrations/postgres`) and how they
//! are applied: in version order, each at most once, all of one open in one transaction that
//! also records each applied version in `schema_migrations`, with concurrent openers kept out
//! while it runs; and a database that has applied a version this binary does not know (written
//! by a newer build) is refused with a `state` error before anything is applied. A backend
//! supplies only the execution ([`Schema`]); this module never touches a connection itself.

use crate::error::{StoreError, StoreResult};

/// One migration: its version and the SQL of its file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Migration {
    pub version: i64,
    /// The file's name in its backend's folder (tests check the list against the folder).
    #[cfg_attr(not(test), allow(dead_code))]
    pub file: &'static str,
    pub sql: &'static str,
}

/// The list of a backend's migration files, each with its version.
macro_rules! migration_files {
    ($backend:literal: $($version:literal => $file:literal),+ $(,)?) => {
        &[$(Migration {
            version: $version,
            file: $file,
            sql: include_str!(concat!("../migrations/", $backend, "/", $file)),
        }),+]
    };
}

/// The SQLite migrations this binary knows, in version order.
pub(crate) const SQLITE: &[Migration] = migration_files!("sqlite":
    1 => "0001_init.sql",
    2 => "0002_hot_path.sql",
    3 => "0003_runnable_packages.sql",
    4 => "0004_runs.sql",
    5 => "0005_fleet.sql",
    6 => "0006_public_offsets.sql",
    7 => "0007_run_pins.sql",
    8 => "0008_journal_snapshots.sql",
    9 => "0009_heartbeat_carries_leases.sql",
    10 => "0010_actors.sql",
    11 => "0011_command_trace.sql",
    12 => "0012_run_trace.sql",
    13 => "0013_open_gates.sql",
);

/// The PostgreSQL migrations this binary knows, in version order.
pub(crate) const POSTGRES: &[Migration] = migration_files!("postgres":
    1 => "0001_init.sql",
    2 => "0002_hot_path.sql",
    3 => "0003_runnable_packages.sql",
    4 => "0004_runs.sql",
    5 => "0005_fleet.sql",
    6 => "0006_public_offsets.sql",
    7 => "0007_run_pins.sql",
    8 => "0008_journal_snapshots.sql",
    9 => "0009_heartbeat_carries_leases.sql",
    10 => "0010_actors.sql",
    11 => "0011_command_trace.sql",
    12 => "0012_run_trace.sql",
    13 => "0013_open_gates.sql",
);

/// What a backend does for the runner: each step in its own dialect, all of them inside the
/// transaction [`Schema::begin`] opened.
pub(crate) trait Schema {
    /// Opens the migration transaction and waits until no other opener of the same database
    /// is migrating it.
    async fn begin(&mut self) -> StoreResult<()>;
    /// Creates `schema_migrations (version, applied_at)` if it does not exist.
    async fn create_version_table(&mut self) -> StoreResult<()>;
    /// The versions `schema_migrations` holds.
    async fn applied(&mut self) -> StoreResult<Vec<i64>>;
    /// Runs one migration's SQL (several statements).
    async fn apply(&mut self, sql: &'static str) -> StoreResult<()>;
    /// Records `version` as applied, at the backend's time.
    async fn record(&mut self, version: i64) -> StoreResult<()>;
    async fn commit(&mut self) -> StoreResult<()>;
    /// Undoes everything since [`Schema::begin`]; called after a failure, so its own failure
    /// is not reported (the first one is).
    async fn rollback(&mut self);
}

/// Brings the database `db` reaches up to `known`, or refuses it; either way in one
/// transaction, so a failed run leaves the schema as it found it.
pub(crate) async fn migrate(db: &mut impl Schema, known: &[Migration]) -> StoreResult<()> {
    db.begin().await?;
    match apply_missing(db, known).await {
        Ok(()) => db.commit().await,
        Err(e) => {
            db.rollback().await;
            Err(e)
        }
    }
}

async fn apply_missing(db: &mut impl Schema, known: &[Migration]) -> StoreResult<()> {
    db.create_version_table().await?;
    let applied = db.applied().await?;
    for m in missing(known, &applied)? {
        db.apply(m.sql).await?;
        db.record(m.version).await?;
    }
    Ok(())
}

/// The migrations of `known` not in `applied`, in order; or the refusal of a database that
/// has applied a version `known` lacks. Missing is decided by set, not by the highest applied
/// version: migrations are independent, so one numbered below an applied one (merged later)
/// is still applied.
fn missing<'k>(known: &'k [Migration], applied: &[i64]) -> StoreResult<Vec<&'k Migration>> {
    if let Some(unknown) = applied
        .iter()
        .find(|v| !known.iter().any(|m| m.version == **v))
    {
        let latest = known.last().map_or(0, |m| m.version);
        return Err(StoreError::state(
            "schema",
            format!("version {unknown}"),
            format!(
                "the database was written by a newer build (schema version {unknown}); this binary knows up to {latest}. Upgrade hostd or use another database."
            ),
        ));
    }
    Ok(known
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn versions(ms: &[&Migration]) -> Vec<i64> {
        ms.iter().map(|m| m.version).collect()
    }

    #[test]
    fn each_list_names_every_file_of_its_folder_in_order_under_the_number_the_file_carries() {
        for (backend, known) in [("sqlite", SQLITE), ("postgres", POSTGRES)] {
            let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(backend);
            let mut files: Vec<String> = std::fs::read_dir(&folder)
                .expect("the migrations folder is readable")
                .map(|e| {
                    e.expect("a folder entry")
                        .file_name()
                        .into_string()
                        .expect("UTF-8")
                })
                .filter(|name| name.ends_with(".sql"))
                .collect();
            files.sort();
            let listed: Vec<&str> = known.iter().map(|m| m.file).collect();
            assert_eq!(listed, files, "{backend}: the list and the folder differ");
            for (i, m) in known.iter().enumerate() {
                let number: i64 = m.file[..4].parse().expect("a four-digit prefix");
                assert_eq!(m.version, number, "{backend}: {}", m.file);
                assert_eq!(
                    m.version,
                    i as i64 + 1,
                    "{backend}: versions run 1, 2, 3, …"
                );
            }
        }
    }

    #[test]
    fn a_fresh_database_gets_every_migration_in_order() {
        assert_eq!(
            versions(&missing(SQLITE, &[]).unwrap()),
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
        );
    }

    #[test]
    fn only_the_versions_not_yet_applied_are_applied_even_below_an_applied_one() {
        assert_eq!(
            versions(&missing(SQLITE, &[1, 2, 4]).unwrap()),
            [3, 5, 6, 7, 8, 9, 10, 11, 12, 13]
        );
        assert!(
            missing(SQLITE, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_database_with_a_version_this_build_does_not_know_is_refused_by_code() {
        let err = missing(POSTGRES, &[1, 2, 999]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::State);
        assert_eq!(
            err.to_string(),
            "state: schema is version 999: the database was written by a newer build (schema \
             version 999); this binary knows up to 13. Upgrade hostd or use another database."
        );
    }
}
