//! Evidence routing for settlement. Owns the question "which journal holds the disposition of
//! this session's commands": a router maps (tenant, storage binding) to a reader. An unroutable
//! binding and a journal without the disposition are different failures, and neither writes an
//! outcome. Never writes anything.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::StoreResult;
use crate::ids::{RuntimeCommandId, RuntimeSessionId, StorageBindingId, TenantId};
use crate::journal::DispositionFrame;

/// Reads disposition frames (applications and closures) from one journal store.
#[async_trait]
pub trait EvidenceReader: Send + Sync {
    /// Every application or closure the journal of `runtime_session` holds for
    /// `runtime_command`, in sequence order. An empty list means "no evidence".
    async fn dispositions(
        &self,
        tenant: &TenantId,
        runtime_session: RuntimeSessionId,
        runtime_command: RuntimeCommandId,
    ) -> StoreResult<Vec<DispositionFrame>>;

    /// True when this reader is the settling store's own journal, so settlement can read the
    /// evidence inside its own write transaction.
    fn is_own_journal(&self) -> bool {
        false
    }
}

/// Routes a (tenant, storage binding) to the reader of that binding's journal store.
pub trait EvidenceRouter: Send + Sync {
    /// The reader for this binding, or `None` when nothing serves it.
    fn route(
        &self,
        tenant: &TenantId,
        storage_binding: &StorageBindingId,
    ) -> Option<Arc<dyn EvidenceReader>>;
}

/// Routes a fixed set of storage bindings (any tenant) to one reader; the default router sends
/// the store's own local bindings to the store's own journal.
pub struct FixedEvidenceRouter {
    bindings: HashSet<StorageBindingId>,
    reader: Arc<dyn EvidenceReader>,
}

impl FixedEvidenceRouter {
    /// Serves `bindings` from `reader`.
    pub fn new(
        bindings: impl IntoIterator<Item = StorageBindingId>,
        reader: Arc<dyn EvidenceReader>,
    ) -> Self {
        Self {
            bindings: bindings.into_iter().collect(),
            reader,
        }
    }
}

impl EvidenceRouter for FixedEvidenceRouter {
    fn route(
        &self,
        _tenant: &TenantId,
        storage_binding: &StorageBindingId,
    ) -> Option<Arc<dyn EvidenceReader>> {
        if self.bindings.contains(storage_binding) {
            Some(self.reader.clone())
        } else {
            None
        }
    }
}
