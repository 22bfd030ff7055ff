//! Published runnable packages: the bytes of one release (`workspace/name@version`) that every
//! Host of a fleet can fetch. Owns the `runnable_packages` table's statements (one set for both
//! backends), the rule that a release is immutable (the same digest again is a no-op, another
//! digest is reported as a conflict and changes nothing), and the check of the stored bytes on
//! every read (a mismatch is `integrity`).
//!
//! The store treats a package as opaque bytes named by the digest the publisher computed; it
//! must never interpret them. A Host verifies the package's own digest before it unpacks it.

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::model::sha256_hex;
use crate::sql::{Conn, Param, Row, SqlTx, render};

/// The largest package the store accepts.
pub const MAX_PACKAGE_BYTES: usize = 64 * 1024 * 1024;
/// The longest workspace, name or version.
pub const MAX_PACKAGE_NAME: usize = 128;

/// A package to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewPackage {
    pub workspace: String,
    pub name: String,
    pub version: String,
    /// The package's digest, `sha256:<64 hex>`.
    pub digest: String,
    pub bytes: Vec<u8>,
}

/// A published release, without its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageSummary {
    pub workspace: String,
    pub name: String,
    pub version: String,
    pub digest: String,
    pub size: u64,
    pub published_at_ms: Millis,
}

impl PackageSummary {
    /// `workspace/name@version`.
    pub fn identity(&self) -> String {
        format!("{}/{}@{}", self.workspace, self.name, self.version)
    }
}

/// A published release with its verified bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPackage {
    pub summary: PackageSummary,
    pub bytes: Vec<u8>,
}

/// What publishing did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Publication {
    /// The release is now recorded.
    Recorded(PackageSummary),
    /// It was already recorded with the same digest; nothing changed.
    Unchanged(PackageSummary),
    /// It is recorded with another digest; nothing changed.
    Conflict { recorded: PackageSummary },
}

fn check_part(field: &'static str, value: &str) -> StoreResult<()> {
    if value.is_empty()
        || value.len() > MAX_PACKAGE_NAME
        || value
            .chars()
            .any(|c| c == '/' || c == '@' || c.is_whitespace() || c.is_control())
    {
        return Err(StoreError::invalid(
            field,
            format!(
                "must be 1-{MAX_PACKAGE_NAME} bytes without `/`, `@`, whitespace or control characters"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn check_identity(workspace: &str, name: &str, version: &str) -> StoreResult<()> {
    check_part("workspace", workspace)?;
    check_part("name", name)?;
    check_part("version", version)
}

pub(crate) fn check_new(p: &NewPackage) -> StoreResult<()> {
    check_identity(&p.workspace, &p.name, &p.version)?;
    let hex = p.digest.strip_prefix("sha256:").unwrap_or_default();
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(StoreError::invalid(
            "digest",
            "must be sha256:<64 lowercase hex>",
        ));
    }
    if p.bytes.is_empty() || p.bytes.len() > MAX_PACKAGE_BYTES {
        return Err(StoreError::invalid(
            "bytes",
            format!("must be 1 to {MAX_PACKAGE_BYTES} bytes"),
        ));
    }
    Ok(())
}

const SUMMARY_COLS: &str = "workspace, name, version, digest, size, published_at";

fn decode_summary(r: &Row) -> StoreResult<PackageSummary> {
    Ok(PackageSummary {
        workspace: r.text(0)?,
        name: r.text(1)?,
        version: r.text(2)?,
        digest: r.text(3)?,
        size: r.u64(4)?,
        published_at_ms: r.i64(5)?,
    })
}

fn text(v: &str) -> Param {
    Param::Text(Some(v.to_owned()))
}

async fn rows<C: Conn>(
    tx: &mut SqlTx<C>,
    template: &str,
    params: Vec<Param>,
) -> StoreResult<Vec<Row>> {
    let sql = render(template, tx.conn.dialect(), tx.conn.locking());
    tx.conn.query(&sql, params, "runnable_package").await
}

/// One release's summary, without its bytes.
pub(crate) async fn summary<C: Conn>(
    tx: &mut SqlTx<C>,
    workspace: &str,
    name: &str,
    version: &str,
) -> StoreResult<Option<PackageSummary>> {
    let q = format!(
        "SELECT {SUMMARY_COLS} FROM runnable_packages WHERE workspace = $1 AND name = $2 AND version = $3"
    );
    let found = rows(tx, &q, vec![text(workspace), text(name), text(version)]).await?;
    found.first().map(decode_summary).transpose()
}

/// Records `p` unless its release exists (then reports it, changing nothing).
pub(crate) async fn publish<C: Conn>(
    tx: &mut SqlTx<C>,
    p: NewPackage,
    now: Millis,
) -> StoreResult<Publication> {
    let insert = "INSERT INTO runnable_packages (workspace, name, version, digest, size, sha256, bytes, published_at) \
         VALUES ($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (workspace, name, version) DO NOTHING";
    let sql = render(insert, tx.conn.dialect(), false);
    let inserted = tx
        .conn
        .execute(
            &sql,
            vec![
                text(&p.workspace),
                text(&p.name),
                text(&p.version),
                text(&p.digest),
                Param::Int(Some(p.bytes.len() as i64)),
                text(&sha256_hex(&p.bytes)),
                Param::Blob(Some(p.bytes.clone())),
                Param::Int(Some(now)),
            ],
        )
        .await?;
    let recorded = summary(tx, &p.workspace, &p.name, &p.version)
        .await?
        .ok_or_else(|| StoreError::integrity("runnable_package", "a publish left no row"))?;
    Ok(if inserted == 1 {
        Publication::Recorded(recorded)
    } else if recorded.digest == p.digest {
        Publication::Unchanged(recorded)
    } else {
        Publication::Conflict { recorded }
    })
}

/// One release with its bytes, checked against the stored SHA-256.
pub(crate) async fn get<C: Conn>(
    tx: &mut SqlTx<C>,
    workspace: &str,
    name: &str,
    version: &str,
) -> StoreResult<Option<StoredPackage>> {
    let q = format!(
        "SELECT {SUMMARY_COLS}, sha256, bytes FROM runnable_packages WHERE workspace = $1 AND name = $2 AND version = $3"
    );
    let found = rows(tx, &q, vec![text(workspace), text(name), text(version)]).await?;
    let Some(row) = found.first() else {
        return Ok(None);
    };
    let summary = decode_summary(row)?;
    let sha = row.text(6)?;
    let bytes = row
        .opt_blob(7)?
        .ok_or_else(|| StoreError::integrity("runnable_package", "no bytes"))?;
    if bytes.len() as u64 != summary.size || sha256_hex(&bytes) != sha {
        return Err(StoreError::integrity(
            "runnable_package",
            format!(
                "the stored bytes of {} do not match their recorded size and SHA-256",
                summary.identity()
            ),
        ));
    }
    Ok(Some(StoredPackage { summary, bytes }))
}

/// Every published release, ordered by workspace, name and version.
pub(crate) async fn list<C: Conn>(tx: &mut SqlTx<C>) -> StoreResult<Vec<PackageSummary>> {
    let q =
        format!("SELECT {SUMMARY_COLS} FROM runnable_packages ORDER BY workspace, name, version");
    rows(tx, &q, Vec::new())
        .await?
        .iter()
        .map(decode_summary)
        .collect()
}
