//! Shared pieces of the run tests: an environment of in-process runnables with a ledger of
//! what their handlers did, and a store wrapper that stops at a chosen write (before or after
//! it lands), the way a killed Host stops.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runnable::{Effect, OutcomeClass};
use serde_json::{Value, json};
use sessionstore::*;
use tokio::sync::Notify;
use workflow::program::{RunnableInfo, Unresolved, schema_from_yaml};
use workflow::{
    AgentTurn, AgentTurns, AsResolved, Environment, InvokeCall, InvokeDone, Invoker, RunJournal,
    StartRefusal,
};

/// One handler call, as the handler saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub identity: String,
    pub intent_id: String,
    pub effect_id: String,
    pub input: Value,
}

/// What a handler does when called.
#[derive(Clone)]
pub enum Behaviour {
    /// Succeeds with its input echoed under `echo`.
    Echo,
    /// Fails (certainly) the first `n` calls, then echoes.
    FailFirst(usize),
    /// Always fails.
    AlwaysFail,
    /// Ends with this uncertain class every time.
    Uncertain(OutcomeClass),
}

/// In-process runnables and agents with a ledger.
pub struct World {
    pub runnables: HashMap<String, (Effect, Behaviour)>,
    pub agents: BTreeSet<String>,
    pub calls: Mutex<Vec<Call>>,
    /// Effects applied, by effect id (a replay-safe handler applies one id once).
    pub applied: Mutex<HashMap<String, usize>>,
    /// When set, the call with this index (0-based over all calls) applies its effect, then
    /// hangs forever after notifying `hung`.
    pub hang_at: Mutex<Option<usize>>,
    pub hung: Notify,
    pub turns: Mutex<Vec<AgentTurn>>,
    /// How many agent turns still fail (each failing one is recorded in `turns` too).
    pub failing_turns: AtomicUsize,
}

impl World {
    pub fn new() -> Arc<World> {
        let mut runnables = HashMap::new();
        runnables.insert(
            "shop/read@1.0.0".into(),
            (Effect::ReadOnly, Behaviour::Echo),
        );
        runnables.insert(
            "shop/charge@1.0.0".into(),
            (Effect::Effectful, Behaviour::Echo),
        );
        runnables.insert(
            "shop/notify@1.0.0".into(),
            (Effect::Idempotent, Behaviour::Echo),
        );
        runnables.insert(
            "shop/word-count@1.0.0".into(),
            (Effect::ReadOnly, Behaviour::Echo),
        );
        runnables.insert(
            "shop/word-count@2.0.0".into(),
            (Effect::ReadOnly, Behaviour::Echo),
        );
        Arc::new(World {
            runnables,
            agents: ["echo".to_owned()].into_iter().collect(),
            calls: Mutex::new(Vec::new()),
            applied: Mutex::new(HashMap::new()),
            hang_at: Mutex::new(None),
            hung: Notify::new(),
            turns: Mutex::new(Vec::new()),
            failing_turns: AtomicUsize::new(0),
        })
    }

    pub fn with(mut self: Arc<Self>, identity: &str, effect: Effect, b: Behaviour) -> Arc<Self> {
        Arc::get_mut(&mut self)
            .expect("configure the world before sharing it")
            .runnables
            .insert(identity.into(), (effect, b));
        self
    }

    pub fn calls_of(&self, name: &str) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.identity.contains(&format!("/{name}@")))
            .cloned()
            .collect()
    }

    pub fn applied_of(&self, effect_id: &str) -> usize {
        self.applied
            .lock()
            .unwrap()
            .get(effect_id)
            .copied()
            .unwrap_or(0)
    }
}

impl Environment for World {
    fn runnable(&self, reference: &str) -> Result<RunnableInfo, Unresolved> {
        let name = reference.split('@').next().unwrap_or_default();
        let matching: Vec<&String> = self
            .runnables
            .keys()
            .filter(|id| {
                if *id == reference {
                    true
                } else if reference.contains('@') {
                    id.ends_with(&format!("/{reference}"))
                } else {
                    id.split('/').nth(1).and_then(|r| r.split('@').next()) == Some(name)
                }
            })
            .collect();
        match matching.as_slice() {
            [one] => {
                let (effect, _) = &self.runnables[*one];
                Ok(RunnableInfo {
                    identity: (*one).clone(),
                    digest: format!("sha256:{}", "0".repeat(64)),
                    effect: *effect,
                    input: schema_from_yaml("type: object\nadditionalProperties: true\n")
                        .expect("a valid schema"),
                })
            }
            [] => Err(Unresolved::NotFound {
                available: Vec::new(),
            }),
            many => {
                let mut c: Vec<String> = many.iter().map(|s| (*s).clone()).collect();
                c.sort();
                Err(Unresolved::Ambiguous { candidates: c })
            }
        }
    }

    fn agent_known(&self, agent: &str) -> bool {
        self.agents.contains(agent)
    }
}

#[async_trait]
impl Invoker for World {
    async fn invoke(&self, call: InvokeCall) -> Result<InvokeDone, String> {
        let (effect, behaviour) = self
            .runnables
            .get(&call.identity)
            .cloned()
            .ok_or_else(|| format!("no runnable {}", call.identity))?;
        let index = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(Call {
                identity: call.identity.clone(),
                intent_id: call.intent_id.clone(),
                effect_id: call.effect_id.clone(),
                input: call.input.clone(),
            });
            calls.len() - 1
        };
        let earlier = self
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.identity == call.identity && c.effect_id == call.effect_id)
            .count()
            - 1;
        let done = |outcome, output| InvokeDone {
            outcome,
            output,
            detail: String::new(),
        };
        let result = match behaviour {
            Behaviour::Echo => done(OutcomeClass::Succeeded, Some(json!({"echo": call.input}))),
            Behaviour::FailFirst(n) if earlier < n => done(OutcomeClass::Failed, None),
            Behaviour::FailFirst(_) => {
                done(OutcomeClass::Succeeded, Some(json!({"echo": call.input})))
            }
            Behaviour::AlwaysFail => done(OutcomeClass::Failed, None),
            Behaviour::Uncertain(class) => done(class, None),
        };
        if result.outcome == OutcomeClass::Succeeded {
            let mut applied = self.applied.lock().unwrap();
            let n = applied.entry(call.effect_id.clone()).or_insert(0);
            // A replay-safe handler applies an effect id once; an effectful one every call.
            if *n == 0 || effect == Effect::Effectful {
                *n += 1;
            }
        }
        if *self.hang_at.lock().unwrap() == Some(index) {
            self.hung.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(result)
    }
}

#[async_trait]
impl AgentTurns for World {
    async fn turn(&self, turn: AgentTurn) -> Result<String, String> {
        let reply = format!("You said: {}", turn.prompt);
        self.turns.lock().unwrap().push(turn);
        let failing = self
            .failing_turns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err("the turn failed".into());
        }
        Ok(reply)
    }
}

/// Where a crash lands relative to a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    Before,
    After,
}

/// A store that stops (hangs, for the test to abort) at write number `at`.
pub struct CrashingJournal {
    pub store: Store,
    pub writes: AtomicUsize,
    pub at: Option<(usize, Crash)>,
    pub crashed: Notify,
}

impl CrashingJournal {
    pub fn new(store: Store, at: Option<(usize, Crash)>) -> Arc<CrashingJournal> {
        Arc::new(CrashingJournal {
            store,
            writes: AtomicUsize::new(0),
            at,
            crashed: Notify::new(),
        })
    }

    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        F: std::future::Future<Output = StoreResult<T>> + Send,
    {
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        if self.at == Some((n, Crash::Before)) {
            self.crashed.notify_one();
            std::future::pending::<()>().await;
        }
        let r = f.await;
        if self.at == Some((n, Crash::After)) {
            self.crashed.notify_one();
            std::future::pending::<()>().await;
        }
        r
    }
}

#[async_trait]
impl RunJournal for CrashingJournal {
    async fn status(&self, run: &RunId) -> StoreResult<Option<RunStatus>> {
        self.store.run_status(None, run).await
    }
    async fn program(&self, run: &RunId) -> StoreResult<Option<RunProgram>> {
        self.store.run_program(run).await
    }
    async fn pins(&self, run: &RunId) -> StoreResult<Vec<RunPin>> {
        self.store.run_pins(run).await
    }
    async fn pin(&self, fence: &RunFence, pins: Vec<RunPin>) -> StoreResult<Vec<RunPin>> {
        self.write(self.store.pin_run(fence, pins)).await
    }
    async fn journal(&self, run: &RunId) -> StoreResult<Vec<StepEntry>> {
        self.store.run_journal(run).await
    }
    async fn checkpoints(&self, run: &RunId) -> StoreResult<Vec<Checkpoint>> {
        self.store.run_checkpoints(run).await
    }
    async fn answers(&self, run: &RunId) -> StoreResult<Vec<RunAnswer>> {
        self.store.run_answers(run).await
    }
    async fn append(&self, fence: &RunFence, entry: NewStepEntry) -> StoreResult<StepEntry> {
        self.write(self.store.append_run_step(fence, entry)).await
    }
    async fn arm(&self, fence: &RunFence, checkpoint: NewCheckpoint) -> StoreResult<Checkpoint> {
        self.write(self.store.arm_run_checkpoint(fence, checkpoint))
            .await
    }
    async fn end(&self, fence: &RunFence, how: RunEnd) -> StoreResult<RunStatus> {
        self.write(self.store.end_run(fence, how)).await
    }
    async fn renew(&self, fence: &RunFence, lease: Duration) -> StoreResult<Millis> {
        self.store.renew_run(fence, lease).await
    }
    async fn park(&self, fence: &RunFence, until: ParkUntil) -> StoreResult<bool> {
        self.write(self.store.park_run(fence, until)).await
    }
    async fn now_ms(&self) -> StoreResult<Millis> {
        self.store.now_ms().await
    }
}

pub fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

/// Records a run held by `host-a`, the way a Host's `run.start` does: validated and pinned to
/// the world's releases.
pub async fn start(
    store: &Store,
    world: &Arc<World>,
    id: &str,
    source: &str,
    input: Value,
) -> RunStatus {
    let env: Arc<dyn Environment> = world.clone();
    let pins = match workflow::pin_new_run(source, env.as_ref(), &AsResolved(env.clone())).await {
        Ok(p) => p,
        Err(StartRefusal::Problems(p)) => panic!("the program does not validate: {p:?}"),
        Err(StartRefusal::Release(e)) => panic!("the program cannot be pinned: {e}"),
    };
    record(store, id, source, input, pins).await
}

/// Records a run the way a Host recorded it before pinning existed: no pins.
pub async fn start_unpinned(store: &Store, id: &str, source: &str, input: Value) -> RunStatus {
    record(store, id, source, input, Vec::new()).await
}

async fn record(
    store: &Store,
    id: &str,
    source: &str,
    input: Value,
    pins: Vec<RunPin>,
) -> RunStatus {
    store
        .create_run(NewRun {
            run_id: RunId::new(id).unwrap(),
            tenant: tenant(),
            source: source.into(),
            input: input.to_string(),
            holder: "host-a/attempt-1".into(),
            fencing_token: format!("{id}-token-1"),
            lease: Duration::from_secs(30),
            idempotency_key: None,
            pins,
            started_by: None,
            trace: None,
        })
        .await
        .unwrap()
        .status
}

/// Takes a running run over the way a restarted Host does (epoch + 1, a new token).
pub async fn take_back(store: &Store, run: &RunId, n: u64) -> RunStatus {
    let s = store.run_status(None, run).await.unwrap().unwrap();
    store
        .take_run(Takeover {
            run_id: run.clone(),
            expected_epoch: s.epoch,
            holder: format!("host-a/attempt-{n}"),
            fencing_token: format!("{run}-token-{n}"),
            lease: Duration::from_secs(30),
            rule: TakeoverRule::HeldByOrExpired("host-a/".into()),
        })
        .await
        .unwrap()
}
