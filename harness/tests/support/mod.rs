//! What the harness test suites share: a session over a real store with a harness target
//! (`Fx`), the command path a Host drives, a tool that never finishes and a model that records
//! its requests. Each suite uses part of it. The fixtures the workspace's test kit uses too
//! (the counted-effect tool, command bodies, event readings) are `harness::testing`'s,
//! re-exported here.
#![allow(dead_code)]

pub mod strict_chat;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use department::{LaunchMode, LaunchRequest, Recorded, RuntimeCommand, RuntimeError};
use harness::events::HarnessEvent;
use harness::model::{Model, ModelError, ModelRequest, ModelStream, ScriptedModel};
use harness::testing::public_events;
use harness::tool::{EchoTool, Tool, ToolError, ToolRegistry};
use harness::{AgentConfig, HarnessTarget, SessionHandle};
use serde_json::{Value, json};
use sessionstore::testing::{TestStore, begin_attempt, new_session, settle};
use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::*;
use uuid::Uuid;

pub use harness::testing::{CountingTool, answer, count, input, replies};

pub const WAIT: Duration = Duration::from_secs(15);

/// A tool with an effect that never finishes on its own (no approval, not replay-safe): a
/// process that dies while it runs leaves its outcome unknown.
#[derive(Default)]
pub struct BlockingTool {
    pub started: AtomicUsize,
}

#[async_trait::async_trait]
impl Tool for BlockingTool {
    fn spec(&self) -> harness::model::ToolSpec {
        harness::model::ToolSpec {
            name: "slow_effect".into(),
            description: "Has an effect and takes forever.".into(),
            parameters: json!({"type": "object"}),
        }
    }
    async fn call(&self, _arguments: Value) -> Result<String, ToolError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
        Ok("never".into())
    }
}

/// The scripted model, recording every request it is asked.
pub struct RecordingModel {
    inner: ScriptedModel,
    pub requests: Mutex<Vec<ModelRequest>>,
}

#[async_trait::async_trait]
impl Model for RecordingModel {
    fn name(&self) -> &str {
        "recording-scripted"
    }
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        if let Ok(mut r) = self.requests.lock() {
            r.push(request.clone());
        }
        self.inner.stream(request).await
    }
}

pub struct Fx {
    pub store: Store,
    pub target: HarnessTarget,
    pub session: SessionRecord,
    pub counter: Arc<CountingTool>,
    pub blocker: Arc<BlockingTool>,
    pub model: Arc<RecordingModel>,
    pub residency: ResidencyEpoch,
    pub next: AtomicUsize,
}

pub fn agent(
    counter: Arc<CountingTool>,
    blocker: Arc<BlockingTool>,
    model: Arc<RecordingModel>,
) -> AgentConfig {
    let tools = ToolRegistry::new(vec![
        Arc::new(EchoTool::new("echo", false)),
        Arc::new(EchoTool::new("approve_echo", true)),
        counter,
        blocker,
    ])
    .unwrap();
    let mut a = AgentConfig::new(model, tools);
    a.permission_timeout = Duration::from_secs(600);
    a
}

pub fn recording_model() -> Arc<RecordingModel> {
    Arc::new(RecordingModel {
        inner: ScriptedModel::new(),
        requests: Mutex::new(Vec::new()),
    })
}

impl Fx {
    pub async fn new(ts: &TestStore) -> Fx {
        Self::with_store(ts.store.clone(), ts, |_| {}).await
    }

    pub async fn with_store(
        store: Store,
        ts: &TestStore,
        adjust: impl FnOnce(&mut AgentConfig),
    ) -> Fx {
        let counter = Arc::new(CountingTool::default());
        let blocker = Arc::new(BlockingTool::default());
        let model = recording_model();
        let mut a = agent(counter.clone(), blocker.clone(), model.clone());
        adjust(&mut a);
        let target = HarnessTarget::new(
            store.clone(),
            a,
            CompatibilityId::new("harness-test-1").unwrap(),
        )
        .unwrap();
        let name = format!("s-{}", Uuid::now_v7());
        let session = new_session(&ts.store, "acme", &name, "harness-test-1").await;
        Fx {
            store: ts.store.clone(),
            target,
            session,
            counter,
            blocker,
            model,
            residency: ResidencyEpoch(1),
            next: AtomicUsize::new(0),
        }
    }

    pub fn request(&self, mode: LaunchMode, holder: &str) -> LaunchRequest {
        LaunchRequest {
            tenant: self.session.tenant.clone(),
            session: self.session.session.clone(),
            agent: self.session.agent.clone(),
            binding: self.session.binding.clone(),
            mode,
            holder: holder.into(),
        }
    }

    pub async fn launch(&self, mode: LaunchMode) -> SessionHandle {
        self.target
            .launch_session(self.request(mode, &format!("holder-{}", Uuid::now_v7())))
            .await
            .unwrap()
    }

    pub fn rs(&self) -> RuntimeSessionId {
        self.session.binding.runtime_session_id
    }

    pub async fn admit(&self, body: CommandBodyV1) -> CommandRecord {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        self.store
            .admit(NewCommand {
                tenant: self.session.tenant.clone(),
                session: self.session.session.clone(),
                command: CommandId::new(format!("cmd-{n}")).unwrap(),
                kind: body.kind(),
                body: CommandBody::Inline(encode_command_body(&body)),
                principal: None,
                metadata: None,
                apply_within: Duration::from_secs(600),
                trace: None,
            })
            .await
            .unwrap()
    }

    /// Claims and begins an attempt under the runtime's epoch.
    pub async fn attempt(
        &self,
        rec: &CommandRecord,
        epoch: JournalEpoch,
    ) -> (CommandRecord, AttemptId) {
        begin_attempt(&self.store, rec, self.residency, epoch)
            .await
            .unwrap()
    }

    /// Admit → claim → attempt → apply → settle. Returns the settled record.
    pub async fn send(
        &self,
        h: &SessionHandle,
        body: CommandBodyV1,
    ) -> (CommandRecord, Result<Recorded, RuntimeError>) {
        let rec = self.admit(body.clone()).await;
        let epoch = h.journal_epoch();
        let (applying, attempt) = self.attempt(&rec, epoch).await;
        let r = h
            .apply(RuntimeCommand::for_attempt(&applying, attempt, epoch, body))
            .await;
        let settled = match &r {
            Ok(_) => settle(&self.store, &applying, self.residency)
                .await
                .unwrap(),
            Err(_) => applying,
        };
        (settled, r)
    }

    /// As `send`, asserting the runtime recorded a disposition.
    pub async fn ok(&self, h: &SessionHandle, body: CommandBodyV1) -> CommandRecord {
        let (rec, r) = self.send(h, body).await;
        r.expect("the runtime records a disposition");
        rec
    }

    pub async fn events(&self) -> Vec<HarnessEvent> {
        public_events(&self.store, &self.session.tenant, self.rs()).await
    }

    pub async fn tip(&self) -> u64 {
        self.store
            .journal_tip(&self.session.tenant, self.rs())
            .await
            .unwrap()
    }

    pub async fn wait_for(
        &self,
        what: &str,
        pred: impl Fn(&[HarnessEvent]) -> bool,
    ) -> Vec<HarnessEvent> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let evs = self.events().await;
            if pred(&evs) {
                return evs;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for {what}; events: {evs:#?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn open_gate(&self) -> Uuid {
        let evs = self
            .wait_for("a gate to open", |e| {
                e.iter()
                    .any(|e| matches!(e, HarnessEvent::GateOpened { .. }))
            })
            .await;
        let mut open = Vec::new();
        for e in &evs {
            match e {
                HarnessEvent::GateOpened { gate_id, .. } => open.push(gate_id.clone()),
                HarnessEvent::GateResolved { gate_id, .. } => open.retain(|g| g != gate_id),
                _ => {}
            }
        }
        Uuid::parse_str(open.last().expect("an open gate")).unwrap()
    }
}

pub async fn idle(h: &SessionHandle) {
    assert!(
        department::wait_idle(h, WAIT).await,
        "the session did not become idle"
    );
}

/// Waits until the session's turn streams a preview (a turn is in flight).
pub async fn streaming(h: &SessionHandle) {
    let mut previews = h.previews();
    tokio::time::timeout(WAIT, previews.recv())
        .await
        .expect("a preview within the wait")
        .expect("the preview stream is open");
}

pub fn turns_done(evs: &[HarnessEvent]) -> usize {
    evs.iter().filter(|e| e.is_turn_terminal()).count()
}

pub fn mode(m: LaunchMode) -> LaunchMode {
    m
}
