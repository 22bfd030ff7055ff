//! Types shared by the backends that are part of the public API.

use crate::ids::{CommandId, SessionId, TenantId};

/// A command admission, announced to wake consumers. Never relied on for correctness.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Admission {
    pub tenant: TenantId,
    pub session: SessionId,
    pub command: CommandId,
}
