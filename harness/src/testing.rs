//! Test support (feature `testing`): the agent-side fixtures that harness's own suites and the
//! workspace's test kit (`testkit`) both use, kept here once. A tool whose effect is counted,
//! the command bodies a test sends, and a session's public journal read back as harness events.
//! (The store-side steps a Host takes around an apply are `sessionstore::testing`'s.)
//!
//! Only test and bench targets enable it; it never composes a Host and holds no scaffolding
//! that a single suite alone needs (that stays in the suite's own `support` module).

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use sessionstore::wire::{CommandBodyV1, GateAnswer};
use sessionstore::{RuntimeSessionId, Store, TenantId};
use uuid::Uuid;

use crate::events::HarnessEvent;
use crate::model::ToolSpec;
use crate::tool::{Tool, ToolError};

/// A tool with an effect (`launch_rocket`): it asks for approval first and counts its runs, so
/// a test can tell how often the effect really happened.
#[derive(Default)]
pub struct CountingTool {
    pub runs: AtomicUsize,
}

#[async_trait::async_trait]
impl Tool for CountingTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "launch_rocket".into(),
            description: "Has an effect; asks first.".into(),
            parameters: json!({"type": "object"}),
        }
    }
    fn needs_approval(&self) -> bool {
        true
    }
    async fn call(&self, _arguments: Value) -> Result<String, ToolError> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("launched (run {n})"))
    }
}

/// A plain user input.
pub fn input(text: &str) -> CommandBodyV1 {
    CommandBodyV1::Input { text: text.into() }
}

/// An answer to the gate `gate` (no expected gate sequence).
pub fn answer(gate: Uuid, action: &str, text: Option<&str>) -> CommandBodyV1 {
    CommandBodyV1::GateResponse(GateAnswer {
        gate_id: gate,
        action: action.into(),
        text: text.map(str::to_owned),
        expected_gate_seq: None,
    })
}

/// The assistant's non-empty replies, in order.
pub fn replies(evs: &[HarnessEvent]) -> Vec<String> {
    evs.iter()
        .filter_map(|e| match e {
            HarnessEvent::AssistantMessage { text, .. } if !text.is_empty() => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// How many events of type `ty` (`turn_done`, `gate_opened`, …).
pub fn count(evs: &[HarnessEvent], ty: &str) -> usize {
    evs.iter().filter(|e| e.type_name() == ty).count()
}

/// The first 1,000 public events of the runtime session `rs`, decoded. Panics on a read or an
/// event that does not decode (a test's failure).
pub async fn public_events(
    store: &Store,
    tenant: &TenantId,
    rs: RuntimeSessionId,
) -> Vec<HarnessEvent> {
    let page = store
        .journal_public_page(tenant, rs, 0, None, 1000)
        .await
        .expect("the public journal reads");
    page.events
        .iter()
        .map(|e| HarnessEvent::decode(&e.body).expect("a harness event"))
        .collect()
}
