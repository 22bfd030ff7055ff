//! What an attach tells the operator, read from the Host's own log (captured by a global
//! subscriber for this test binary), on SQLite and PostgreSQL: a refusal the operator may have
//! to act on is a WARN naming tenant, session, step and code; an attach before start is
//! `not_started`; a runtime that lacks a recovery capability is named at attach.

use std::io::Write;
use std::sync::{Arc, Mutex, Once};

use department::{
    Capabilities, LaunchError, LaunchRequest, LaunchTarget, Recovery, Registration, Runtime,
};
use host::Registrar;
use sessionstore::{CompatibilityId, Store};
use testkit::HarnessRegistrar;

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber once for the whole binary.
pub fn capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(|| Capture)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
    });
}

/// The captured lines that mention `needle`.
pub fn lines_with(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&LOG.lock().unwrap())
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// The harness agent, launched without an attempt closer or fault reports and declaring
/// neither.
pub struct Bare {
    inner: Arc<dyn LaunchTarget>,
}

#[async_trait::async_trait]
impl LaunchTarget for Bare {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            recovery: Recovery::default(),
            ..self.inner.capabilities()
        }
    }
    fn compatibility(&self) -> CompatibilityId {
        self.inner.compatibility()
    }
    async fn launch(&self, request: LaunchRequest) -> Result<Runtime, LaunchError> {
        let mut runtime = self.inner.launch(request).await?;
        runtime.closer = None;
        runtime.faults = None;
        Ok(runtime)
    }
}

/// The harness agent whose every launch fails outright.
pub struct Broken {
    inner: Arc<dyn LaunchTarget>,
}

#[async_trait::async_trait]
impl LaunchTarget for Broken {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn compatibility(&self) -> CompatibilityId {
        self.inner.compatibility()
    }
    async fn launch(&self, request: LaunchRequest) -> Result<Runtime, LaunchError> {
        Err(LaunchError::UnknownTenant(request.tenant))
    }
}

pub struct BrokenRegistrar;

#[async_trait::async_trait]
impl Registrar for BrokenRegistrar {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String> {
        let inner = HarnessRegistrar {
            rocket: Default::default(),
        };
        Ok(inner
            .register(store)
            .await?
            .into_iter()
            .map(|r| Registration {
                agent: r.agent,
                target: Arc::new(Broken { inner: r.target }),
            })
            .collect())
    }
}

pub struct BareRegistrar;

#[async_trait::async_trait]
impl Registrar for BareRegistrar {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String> {
        let inner = HarnessRegistrar {
            rocket: Default::default(),
        };
        Ok(inner
            .register(store)
            .await?
            .into_iter()
            .map(|r| Registration {
                agent: r.agent,
                target: Arc::new(Bare { inner: r.target }),
            })
            .collect())
    }
}

mod cases {
    use host::HostError;
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use testkit::*;

    use super::{BareRegistrar, BrokenRegistrar, capture, lines_with};

    pub async fn an_attach_refusal_an_operator_must_see_is_a_warn_and_before_start_is_not_started(
        ts: &TestStore,
    ) {
        capture();
        let svc = compose(ts, options("h-logs"), Default::default()).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        assert_eq!(
            svc.attach(c.attach_request(&s)).await.unwrap_err(),
            HostError::NotStarted
        );
        let early = lines_with(s.session.as_str());
        assert!(
            early
                .iter()
                .any(|l| l.contains("WARN") && l.contains("not_started")),
            "{early:#?}"
        );
        svc.start().await.unwrap();
        // An agent this Host does not serve: runtime_unavailable, logged for the operator.
        let mut req = c.attach_request(&s);
        req.agent = AgentId::new("ghost").unwrap();
        let e = svc.attach(req).await.unwrap_err();
        assert_eq!(e.code(), Some("runtime_unavailable"));
        let lines = lines_with(s.session.as_str());
        let refusal = lines
            .iter()
            .find(|l| l.contains("runtime_unavailable"))
            .unwrap_or_else(|| panic!("{lines:#?}"));
        for part in [
            "WARN",
            "acme",
            "step=\"attach\"",
            "code=\"runtime_unavailable\"",
        ] {
            assert!(refusal.contains(part), "{part} missing from {refusal}");
        }
        svc.stop().await;
    }

    pub async fn a_stopped_host_is_disposed_and_neither_starts_again_nor_takes_a_session(
        ts: &TestStore,
    ) {
        let svc = compose(ts, options("h-disposed"), Default::default()).await;
        svc.start().await.unwrap();
        let c = Controller::new(ts);
        let s = c.session().await;
        svc.stop().await;
        let e = svc.attach(c.attach_request(&s)).await.unwrap_err();
        assert_eq!(e, HostError::Disposed);
        assert_eq!(e.code(), Some("disposed"));
        assert_eq!(svc.start().await.unwrap_err(), HostError::Disposed);
        // A Host that never started is disposed by its stop, too.
        let never = compose(ts, options("h-never"), Default::default()).await;
        never.stop().await;
        assert_eq!(never.start().await.unwrap_err(), HostError::Disposed);
        assert_eq!(
            never.attach(c.attach_request(&s)).await.unwrap_err(),
            HostError::Disposed
        );
    }

    pub async fn a_launch_that_fails_is_an_internal_failure_that_names_its_step(ts: &TestStore) {
        capture();
        let svc = host::Composition {
            options: options("h-broken"),
            store: ts.options(),
            registrar: Box::new(BrokenRegistrar),
            profile: department::RuntimeProfile::BestEffort,
            version: "test".into(),
        }
        .build()
        .await
        .expect("the Host composes");
        svc.start().await.unwrap();
        let c = Controller::new(ts);
        let s = c.session().await;
        let e = svc.attach(c.attach_request(&s)).await.unwrap_err();
        assert_eq!(e.code(), None, "not a placement outcome: {e}");
        assert_eq!(e.step(), Some("launch"), "{e}");
        assert!(e.unreleased().is_empty(), "{e}");
        let lines = lines_with(s.session.as_str());
        assert!(
            lines
                .iter()
                .any(|l| l.contains("ERROR") && l.contains("at=\"launch\"")),
            "{lines:#?}"
        );
        // The unwind gave the lease back: another attach gets the same refusal, not a
        // held residency.
        let again = svc.attach(c.attach_request(&s)).await.unwrap_err();
        assert_eq!(again.step(), Some("launch"), "{again}");
        svc.stop().await;
    }

    pub async fn a_session_whose_binding_no_journal_store_here_serves_is_refused_before_any_dispatch_as_evidence_unroutable(
        ts: &TestStore,
    ) {
        capture();
        let svc = compose(ts, options("h-unroutable"), Default::default()).await;
        svc.start().await.unwrap();
        let c = Controller::new(ts);
        let s = ts
            .store
            .create_session(NewSession {
                tenant: c.tenant.clone(),
                session: SessionId::new(format!("s-{}", uuid::Uuid::now_v7())).unwrap(),
                agent: AgentId::new(AGENT).unwrap(),
                compatibility: CompatibilityId::new(BUILD).unwrap(),
                binding: SessionBinding {
                    runtime_session_id: RuntimeSessionId::mint(),
                    storage_binding_id: StorageBindingId::new("elsewhere").unwrap(),
                    binding_version: 1,
                },
            })
            .await
            .unwrap();
        let e = svc.attach(c.attach_request(&s)).await.unwrap_err();
        assert_eq!(e.code(), Some("runtime_unavailable"));
        assert!(e.to_string().contains("evidence_unroutable"), "{e}");
        let lines = lines_with(s.session.as_str());
        assert!(
            lines
                .iter()
                .any(|l| l.contains("WARN") && l.contains("evidence_unroutable")),
            "{lines:#?}"
        );
        // Refused before the runtime was launched, and the lease taken for the attach was
        // given back: no residency is left behind.
        let lease = ts.store.residency(&s.tenant, &s.session).await.unwrap();
        assert!(
            lease.as_ref().is_none_or(|l| l.holder.is_none()),
            "a lease was left behind: {lease:?}"
        );
        svc.stop().await;
    }

    pub async fn a_runtime_without_a_closer_or_fault_reports_is_named_at_attach(ts: &TestStore) {
        capture();
        let svc = host::Composition {
            options: options("h-bare"),
            store: ts.options(),
            registrar: Box::new(BareRegistrar),
            profile: department::RuntimeProfile::BestEffort,
            version: "test".into(),
        }
        .build()
        .await
        .expect("the Host composes");
        svc.start().await.unwrap();
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let lines = lines_with(s.session.as_str());
        assert!(
            lines
                .iter()
                .any(|l| l.contains("WARN") && l.contains("attempt_closer_unavailable")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("ERROR") && l.contains("persistence_faults_unavailable")),
            "{lines:#?}"
        );
        svc.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    an_attach_refusal_an_operator_must_see_is_a_warn_and_before_start_is_not_started,
    a_runtime_without_a_closer_or_fault_reports_is_named_at_attach,
    a_stopped_host_is_disposed_and_neither_starts_again_nor_takes_a_session,
    a_launch_that_fails_is_an_internal_failure_that_names_its_step,
    a_session_whose_binding_no_journal_store_here_serves_is_refused_before_any_dispatch_as_evidence_unroutable,
);
