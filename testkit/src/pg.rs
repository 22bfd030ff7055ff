//! A PostgreSQL database of its own for a process-level test: the suites' shared server
//! (`HOST_TEST_DATABASE_URL`) gets a fresh database per test, which child processes reach by
//! URL alone, and which is dropped (connections forced off) when the test ends.

use sqlx::Connection;

/// A fresh database on the test server; dropped by [`FreshDatabase::drop_now`].
pub struct FreshDatabase {
    admin: String,
    name: String,
    pub url: String,
}

impl FreshDatabase {
    /// Creates one, or `None` when PostgreSQL is not configured (outside CI; see
    /// `sessionstore::testing::postgres_url`).
    pub async fn create(label: &str) -> Option<FreshDatabase> {
        let admin = sessionstore::testing::postgres_url()?;
        Some(
            FreshDatabase::create_on(&admin, label)
                .await
                .expect("the test PostgreSQL server answers"),
        )
    }

    /// Creates one on the server of `admin` (a URL naming a database the caller may connect
    /// to and create databases from).
    pub async fn create_on(admin: &str, label: &str) -> Result<FreshDatabase, sqlx::Error> {
        let admin = admin.to_owned();
        let name = format!(
            "t_{label}_{}_{:x}",
            std::process::id(),
            uuid::Uuid::now_v7().as_u128() & 0xffff_ffff
        );
        let mut c = sqlx::PgConnection::connect(&admin).await?;
        // The name is made here from a label, a pid and hex digits: nothing to escape.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut c)
            .await?;
        let (base, query) = match admin.split_once('?') {
            Some((b, q)) => (b, format!("?{q}")),
            None => (admin.as_str(), String::new()),
        };
        let base = base.rsplit_once('/').map_or(base, |(server, _)| server);
        let url = format!("{base}/{name}{query}");
        let _ = c.close().await;
        Ok(FreshDatabase { admin, name, url })
    }

    /// The database's name on its server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Drops the database, forcing any connection left by a killed process off.
    pub async fn drop_now(self) {
        if let Ok(mut c) = sqlx::PgConnection::connect(&self.admin).await {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            )))
            .execute(&mut c)
            .await;
        }
    }
}
