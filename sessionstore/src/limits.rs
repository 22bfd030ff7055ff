//! Sizes and limits, as named constants checked at the store's edge.

use std::time::Duration;

/// A command body at most this large is stored inline; larger bodies go to a payload object.
pub const MAX_INLINE_BODY_BYTES: usize = 64 * 1024;
/// The hard ceiling of a referenced (payload object) body.
pub const MAX_REFERENCED_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// The default cap of a referenced body (configurable above [`MAX_INLINE_BODY_BYTES`] up to
/// the ceiling).
pub const DEFAULT_REFERENCED_BODY_CAP: u64 = 8 * 1024 * 1024;
/// The kind of payload object a referenced command body is stored as; a Host applies no other.
pub const COMMAND_BODY_OBJECT_KIND: &str = "command_body";
/// The largest single journal record value (bodies above [`MAX_INLINE_BODY_BYTES`] are offloaded).
pub const MAX_RECORD_VALUE_BYTES: usize = 256 * 1024;
/// At most this many gates are open per session in the projection.
pub const MAX_OPEN_GATES: usize = 16;
/// The longest a host registration may be promised for.
pub const MAX_REGISTRATION_TTL: Duration = Duration::from_secs(3600);
/// The longest a command claim may be held for.
pub const MAX_CLAIM_TTL: Duration = Duration::from_secs(3600);
/// The longest a residency or journal lease may be granted for.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(3600);
/// The largest journal snapshot body a runtime may store (a larger fold is not checkpointed).
pub const MAX_SNAPSHOT_BYTES: usize = 8 * 1024 * 1024;
/// The most records one journal append may carry.
pub const MAX_APPEND_RECORDS: usize = 1024;
/// The largest page a list call returns.
pub const MAX_PAGE: usize = 1000;
/// Command metadata (JSON text) is at most this large.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;
/// A short text (gate prompt summary, reject reason, principal) is at most this large.
pub const MAX_SHORT_TEXT_BYTES: usize = 4 * 1024;

/// Checks a referenced-body cap: above [`MAX_INLINE_BODY_BYTES`] (a referenced body is one too
/// large to be inline) and at most [`MAX_REFERENCED_BODY_BYTES`].
pub fn check_referenced_body_cap(cap: u64) -> crate::StoreResult<()> {
    if cap <= MAX_INLINE_BODY_BYTES as u64 || cap > MAX_REFERENCED_BODY_BYTES {
        return Err(crate::StoreError::invalid(
            "referenced_body_cap",
            format!(
                "is {cap}; must be above {MAX_INLINE_BODY_BYTES} and at most {MAX_REFERENCED_BODY_BYTES} bytes"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn ttl_ms(field: &'static str, ttl: Duration, max: Duration) -> crate::StoreResult<i64> {
    if ttl.is_zero() {
        return Err(crate::StoreError::invalid(field, "must be positive"));
    }
    if ttl > max {
        return Err(crate::StoreError::invalid(
            field,
            format!("is {ttl:?}; at most {max:?} allowed"),
        ));
    }
    i64::try_from(ttl.as_millis()).map_err(|_| crate::StoreError::invalid(field, "is too large"))
}
