//! The open gates of a set of tenants, a page at a time, oldest first: what an operator's view
//! of the questions waiting for a human reads, across every session, with one statement per
//! page (schema version 13 keeps an index of the open gates in this order).

use crate::error::{StoreError, StoreResult};
use crate::ids::{GateId, SessionId, TenantId};
use crate::model::GateRecord;
use crate::sql::{Conn, GATE_COLS, SqlTx, decode_gate, int, ms, split_page, tenant_list, text};

/// Names one gate: where a page of open gates resumes (the last gate of the page before).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateCursor {
    pub tenant: TenantId,
    pub session: SessionId,
    pub gate: GateId,
}

/// A page of open gates, and where the next one starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenGatesPage {
    pub gates: Vec<GateRecord>,
    /// The last gate of this page when more follow.
    pub next: Option<GateCursor>,
}

/// A page of the open gates of `tenants`, oldest first (the tenant, session and gate ids break
/// ties), after the gate `after` (a gate of one of them, open or since resolved; otherwise
/// `not_found`), at most `limit`.
pub(crate) async fn page<C: Conn>(
    tx: &mut SqlTx<C>,
    tenants: &[TenantId],
    after: Option<&GateCursor>,
    limit: u64,
) -> StoreResult<OpenGatesPage> {
    if tenants.is_empty() {
        return Ok(OpenGatesPage::default());
    }
    let (among, mut params) = tenant_list(tenants);
    let mut past_cursor = String::new();
    if let Some(after) = after {
        let opened_at = cursor_opened_at(tx, tenants, after).await?;
        let first = params.len() + 1;
        params.extend([
            ms(opened_at),
            text(after.tenant.as_str()),
            text(after.session.as_str()),
            text(after.gate.as_str()),
        ]);
        past_cursor = format!(
            " AND (opened_at, tenant_id, session_id, gate_id) > (${first}, ${}, ${}, ${})",
            first + 1,
            first + 2,
            first + 3
        );
    }
    // One more than the page, to know whether another follows.
    params.push(int(limit + 1));
    let q = format!(
        "SELECT {GATE_COLS} FROM gates WHERE state = 'open' AND tenant_id IN ({among}){past_cursor} \
         ORDER BY opened_at, tenant_id, session_id, gate_id LIMIT ${}",
        params.len()
    );
    let read = tx
        .rows(&q, params, "gate")
        .await?
        .iter()
        .map(decode_gate)
        .collect::<StoreResult<Vec<_>>>()?;
    let (gates, next) = split_page(read, limit, |g| GateCursor {
        tenant: g.tenant.clone(),
        session: g.session.clone(),
        gate: g.gate.clone(),
    });
    Ok(OpenGatesPage { gates, next })
}

/// When the cursor's gate opened; `not_found` unless it is a gate of one of `tenants`.
async fn cursor_opened_at<C: Conn>(
    tx: &mut SqlTx<C>,
    tenants: &[TenantId],
    after: &GateCursor,
) -> StoreResult<i64> {
    let unknown = || StoreError::NotFound {
        entity: "gate",
        key: format!("{}/{}/{}", after.tenant, after.session, after.gate),
    };
    if !tenants.contains(&after.tenant) {
        return Err(unknown());
    }
    let found = tx
        .rows(
            "SELECT opened_at FROM gates WHERE tenant_id = $1 AND session_id = $2 AND gate_id = $3",
            vec![
                text(after.tenant.as_str()),
                text(after.session.as_str()),
                text(after.gate.as_str()),
            ],
            "gate",
        )
        .await?;
    match found.first() {
        Some(row) => row.i64(0),
        None => Err(unknown()),
    }
}
