//! A Host composed in-process with the real harness over a real store (SQLite or PostgreSQL
//! through [`TestStore`]), and a controller's-eye view of the store that admits commands,
//! waits for their outcomes and checks that every command ended exactly once, honestly. The
//! agent-side fixtures (the counted-effect tool, command bodies, event readings) are
//! `harness::testing`'s, re-exported here.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use department::{LaunchMode, Registration, RuntimeProfile};
use harness::events::HarnessEvent;
use harness::model::ScriptedModel;
use harness::testing::public_events;
use harness::tool::{EchoTool, ToolRegistry};
use harness::{AgentConfig, HarnessTarget};
use host::{AttachRequest, Attached, Composition, HostError, Options, Registrar, Service};
use sessionstore::testing::{TestStore, new_session};
use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::*;
use uuid::Uuid;

pub use harness::testing::{CountingTool, answer, count, input, replies};

use crate::poll::{WAIT, check, eventually};

pub const AGENT: &str = "assistant";
pub const BUILD: &str = "harness-1";

/// Registers the harness agent, journaling into the Host's own store.
pub struct HarnessRegistrar {
    pub rocket: Arc<CountingTool>,
}

#[async_trait::async_trait]
impl Registrar for HarnessRegistrar {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String> {
        let tools = ToolRegistry::new(vec![
            Arc::new(EchoTool::new("echo", false)),
            self.rocket.clone(),
        ])
        .map_err(|e| e.to_string())?;
        let mut agent = AgentConfig::new(Arc::new(ScriptedModel::new()), tools);
        agent.permission_timeout = Duration::from_secs(600);
        let target = HarnessTarget::new(store.clone(), agent, CompatibilityId::new(BUILD).unwrap())
            .map_err(|e| e.to_string())?;
        Ok(vec![Registration {
            agent: AgentId::new(AGENT).unwrap(),
            target: Arc::new(target),
        }])
    }
}

/// Options tuned for tests: short heartbeats so a crashed Host's lease lapses quickly.
pub fn options(host: &str) -> Options {
    Options {
        host_id: Some(HostId::new(host).unwrap()),
        internal_endpoint: Some("ws://127.0.0.1:7400".into()),
        capacity: 16,
        warm_ttl: Duration::from_secs(600),
        registry_heartbeat: Duration::from_millis(200),
        registry_expiry: Duration::from_millis(800),
        claim_ttl: Duration::from_secs(5),
        apply_deadline: Duration::from_secs(600),
        reconcile_interval: Duration::from_millis(200),
        drain_grace: Duration::from_secs(5),
        idle_boundary: Duration::from_secs(2),
        publish_bound: Duration::from_secs(2),
        ..Options::default()
    }
}

pub async fn compose(ts: &TestStore, opts: Options, rocket: Arc<CountingTool>) -> Service {
    compose_with(ts, opts, Box::new(HarnessRegistrar { rocket })).await
}

/// A Host on `ts` with durable runtimes from `registrar` (composed, not started).
pub async fn compose_with(ts: &TestStore, opts: Options, registrar: Box<dyn Registrar>) -> Service {
    Composition {
        options: opts,
        store: ts.options(),
        registrar,
        profile: RuntimeProfile::Durable,
        version: "test".into(),
    }
    .build()
    .await
    .expect("the Host composes")
}

/// A composed and started Host.
pub async fn started(ts: &TestStore, opts: Options) -> (Service, Arc<CountingTool>) {
    let rocket = Arc::new(CountingTool::default());
    let svc = compose(ts, opts, rocket.clone()).await;
    svc.start().await.expect("the Host starts");
    (svc, rocket)
}

/// The controller: creates sessions and admits commands straight into the store.
pub struct Controller {
    pub store: Store,
    pub tenant: TenantId,
    next: AtomicUsize,
}

impl Controller {
    pub fn new(ts: &TestStore) -> Controller {
        Controller {
            store: ts.store.clone(),
            tenant: TenantId::new("acme").unwrap(),
            next: AtomicUsize::new(0),
        }
    }

    /// A fresh session of this controller's tenant for [`AGENT`] at [`BUILD`].
    pub async fn session(&self) -> SessionRecord {
        let name = format!("s-{}", Uuid::now_v7());
        new_session(&self.store, self.tenant.as_str(), &name, BUILD).await
    }

    pub fn attach_request(&self, s: &SessionRecord) -> AttachRequest {
        AttachRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            agent: s.agent.clone(),
            compatibility: Some(s.compatibility.clone()),
            mode: LaunchMode::Create,
            actor: Some("test".into()),
            trace: None,
        }
    }

    pub async fn attach(&self, svc: &Service, s: &SessionRecord) -> Attached {
        svc.attach(self.attach_request(s)).await.expect("attach")
    }

    /// Attaches, retrying while a crashed predecessor's lease has not lapsed.
    pub async fn attach_eventually(&self, svc: &Service, s: &SessionRecord) -> Attached {
        eventually("the predecessor's lease to lapse", async || {
            match svc.attach(self.attach_request(s)).await {
                Ok(a) => Ok(a),
                Err(e @ HostError::EpochMismatch { .. }) => Err(e.to_string()),
                Err(e) => panic!("attach failed: {e}"),
            }
        })
        .await
    }

    pub fn next_id(&self) -> CommandId {
        CommandId::new(format!("cmd-{}", self.next.fetch_add(1, Ordering::SeqCst))).unwrap()
    }

    pub async fn admit_raw(
        &self,
        s: &SessionRecord,
        kind: CommandKind,
        body: CommandBody,
    ) -> CommandRecord {
        self.store
            .admit(NewCommand {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: self.next_id(),
                kind,
                body,
                principal: Some("user:1".into()),
                metadata: None,
                apply_within: Duration::from_secs(600),
                trace: None,
            })
            .await
            .unwrap()
    }

    pub async fn admit(&self, s: &SessionRecord, body: CommandBodyV1) -> CommandRecord {
        self.admit_raw(
            s,
            body.kind(),
            CommandBody::Inline(encode_command_body(&body)),
        )
        .await
    }

    /// Admits and wakes the resident consumer (what a HostLink delivery does).
    pub async fn send(
        &self,
        svc: &Service,
        s: &SessionRecord,
        body: CommandBodyV1,
    ) -> CommandRecord {
        let rec = self.admit(s, body).await;
        let _ = svc.deliver(&s.tenant, &s.session);
        rec
    }

    pub async fn terminal(&self, s: &SessionRecord, c: &CommandRecord) -> CommandRecord {
        terminal(&self.store, s, &c.command).await
    }

    pub async fn events(&self, s: &SessionRecord) -> Vec<HarnessEvent> {
        public_events(&self.store, &s.tenant, s.binding.runtime_session_id).await
    }

    pub async fn wait_events(
        &self,
        s: &SessionRecord,
        what: &str,
        pred: impl Fn(&[HarnessEvent]) -> bool,
    ) -> Vec<HarnessEvent> {
        eventually(what, async || {
            let evs = self.events(s).await;
            if pred(&evs) {
                Ok(evs)
            } else {
                Err(format!("{evs:#?}"))
            }
        })
        .await
    }

    /// The gate the session has open now (waits for one).
    pub async fn open_gate(&self, s: &SessionRecord) -> Uuid {
        eventually("a gate to be projected", async || {
            let gates = self.store.gates(&s.tenant, &s.session, true).await.unwrap();
            match gates.first() {
                Some(g) => Ok(Uuid::parse_str(g.gate.as_str()).unwrap()),
                None => Err("no open gate".into()),
            }
        })
        .await
    }

    /// See [`check_exactly_once`].
    pub async fn check_exactly_once(&self, s: &SessionRecord) {
        check_exactly_once(&self.store, s).await
    }
}

/// Waits until `command` is terminal, and returns it.
pub async fn terminal(store: &Store, s: &SessionRecord, command: &CommandId) -> CommandRecord {
    let what = format!("command {command} to end");
    eventually(&what, async || {
        let rec = store.command(&s.tenant, &s.session, command).await.unwrap();
        if rec.state.is_terminal() {
            Ok(rec)
        } else {
            Err(format!("{rec:?}"))
        }
    })
    .await
}

/// Waits until a turn of the fed session streams a preview (a turn is in flight).
pub async fn streaming(feed: &mut tokio::sync::broadcast::Receiver<hostlink_server::FeedItem>) {
    tokio::time::timeout(WAIT, async {
        loop {
            match feed.recv().await {
                Ok(hostlink_server::FeedItem::Ephemeral(_)) => return,
                Ok(_) => continue,
                Err(e) => panic!("the live feed ended: {e}"),
            }
        }
    })
    .await
    .expect("a preview within the wait");
}

pub fn metric(svc: &Service, name: &str) -> f64 {
    for line in svc.metrics().render().lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix(name)
            && (rest.starts_with(' ') || rest.starts_with('{'))
            && let Some(v) = line.rsplit(' ').next()
        {
            return v.parse().unwrap_or(f64::NAN);
        }
    }
    f64::NAN
}

/// Waits until the Host's resident set satisfies `pred`.
pub async fn wait_until(what: &str, mut pred: impl FnMut() -> bool) {
    eventually(what, async || check(pred(), || "not yet".into())).await
}

/// Waits until every admitted command of the session has ended, then checks with the
/// exactly-once checker ([`crate::checker`], on the store's state alone) that each ended once
/// and honestly: at most one disposition per command, every outcome the one its evidence
/// proves, no effect of a command that did not apply, dispositions in acceptance order.
/// Panics with the checker's report otherwise.
pub async fn check_exactly_once(store: &Store, s: &SessionRecord) {
    let mut after = 0;
    loop {
        let page = store
            .list_commands(&s.tenant, &s.session, after, 1000)
            .await
            .expect("the session's commands");
        for c in &page {
            terminal(store, s, &c.command).await;
        }
        match page.last() {
            Some(last) if page.len() == 1000 => after = last.accepted_order,
            _ => break,
        }
    }
    let view = crate::checker::StoreView::read(store, std::slice::from_ref(s))
        .await
        .expect("the store reads");
    crate::checker::check(&crate::history::History::empty(), &view).assert_clean();
}
