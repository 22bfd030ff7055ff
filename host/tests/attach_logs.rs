//! What an attach tells the operator, read from the Host's own log (captured by a global
//! subscriber for this test binary, `testkit::log_capture`), on SQLite and PostgreSQL: a refusal the operator may have
//! to act on is a WARN naming tenant, session, step and code; an attach before start is
//! `not_started`; a runtime that lacks a recovery capability is named at attach, and a
//! stranded attempt it cannot close holds the session's stream. Also what an attach writes
//! before it launches the runtime (the fencing write to the gate mark).

use std::sync::{Arc, Mutex};

use department::{
    Capabilities, LaunchError, LaunchRequest, LaunchTarget, Recovery, Registration, Runtime,
};
use host::Registrar;
use sessionstore::{CompatibilityId, Store};
use testkit::HarnessRegistrar;

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

/// The harness agent, recording the session's gate mark as each launch begins.
pub struct Marking {
    inner: Arc<dyn LaunchTarget>,
    store: Store,
    pub marks: Arc<Mutex<Vec<sessionstore::ResidencyEpoch>>>,
}

#[async_trait::async_trait]
impl LaunchTarget for Marking {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn compatibility(&self) -> CompatibilityId {
        self.inner.compatibility()
    }
    async fn launch(&self, request: LaunchRequest) -> Result<Runtime, LaunchError> {
        let session = self
            .store
            .session(&request.tenant, &request.session)
            .await
            .expect("the session reads at launch");
        self.marks.lock().unwrap().push(session.gate_mark);
        self.inner.launch(request).await
    }
}

pub struct MarkingRegistrar {
    pub marks: Arc<Mutex<Vec<sessionstore::ResidencyEpoch>>>,
}

#[async_trait::async_trait]
impl Registrar for MarkingRegistrar {
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
                target: Arc::new(Marking {
                    inner: r.target,
                    store: store.clone(),
                    marks: self.marks.clone(),
                }),
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

    use super::{BareRegistrar, BrokenRegistrar, MarkingRegistrar};
    use testkit::log_capture::{capture, lines_with};

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

    pub async fn a_stranded_attempt_a_runtime_without_a_closer_cannot_close_stays_applying_and_blocks_the_stream(
        ts: &TestStore,
    ) {
        capture();
        let c = Controller::new(ts);
        let s = c.session().await;
        // A conversation exists (journal epoch 1) and the session was given back.
        let (first, _) = started(ts, options("h-strand-first")).await;
        c.attach(&first, &s).await;
        let hello = c.send(&first, &s, input("hello")).await;
        assert_eq!(c.terminal(&s, &hello).await.outcome, Some(Outcome::Applied));
        first.stop().await;
        // A predecessor that died after beginning an attempt under journal epoch 1.
        let stranded = c.admit(&s, input("stranded")).await;
        let grant = ts
            .store
            .acquire_residency(ResidencyRequest {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                holder: "h-strand-dead/1/x".into(),
                host: HostId::new("h-strand-dead").unwrap(),
                host_generation: 1,
                ttl: std::time::Duration::from_secs(5),
            })
            .await
            .unwrap();
        sessionstore::testing::begin_attempt(&ts.store, &stranded, grant.epoch, JournalEpoch(1))
            .await
            .unwrap();
        ts.store.release_residency(&grant).await.unwrap();
        let behind = c.admit(&s, input("behind the stranded one")).await;
        // The successor's runtime cannot close attempts.
        let svc = host::Composition {
            options: options("h-strand-bare"),
            store: ts.options(),
            registrar: Box::new(BareRegistrar),
            profile: department::RuntimeProfile::BestEffort,
            version: "test".into(),
        }
        .build()
        .await
        .expect("the Host composes");
        svc.start().await.unwrap();
        let a = c.attach(&svc, &s).await;
        assert!(a.journal_epoch > JournalEpoch(1), "{a:?}");
        wait_until("the stream to block", || {
            svc.command_blocked(&s.tenant, &s.session) == Some(true)
        })
        .await;
        eventually("the block to be logged", async || {
            let lines = lines_with("cannot close attempts");
            check(lines.iter().any(|l| l.contains("WARN")), || {
                format!("{lines:#?}")
            })
        })
        .await;
        // Held, not skipped: the stranded command stays applying, nothing behind it moves.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        let held = ts
            .store
            .command(&s.tenant, &s.session, &stranded.command)
            .await
            .unwrap();
        assert_eq!(held.state, CommandState::Applying, "{held:?}");
        assert!(held.outcome.is_none());
        let waiting = ts
            .store
            .command(&s.tenant, &s.session, &behind.command)
            .await
            .unwrap();
        assert!(!waiting.state.is_terminal(), "{waiting:?}");
        assert!(waiting.attempt.is_none(), "{waiting:?}");
        assert_eq!(svc.command_blocked(&s.tenant, &s.session), Some(true));
        svc.stop().await;
    }

    pub async fn an_attach_fences_the_gate_mark_with_its_grant_before_the_runtime_is_launched(
        ts: &TestStore,
    ) {
        let marks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let compose = |host: &str| host::Composition {
            options: options(host),
            store: ts.options(),
            registrar: Box::new(MarkingRegistrar {
                marks: marks.clone(),
            }),
            profile: department::RuntimeProfile::Durable,
            version: "test".into(),
        };
        let c = Controller::new(ts);
        let s = c.session().await;
        let first = compose("h-fence-one").build().await.unwrap();
        first.start().await.unwrap();
        let a = c.attach(&first, &s).await;
        first.stop().await;
        // A successor's attach fences under its own, newer grant before its launch.
        let second = compose("h-fence-two").build().await.unwrap();
        second.start().await.unwrap();
        let b = c.attach(&second, &s).await;
        assert!(b.observation.lease_epoch > a.observation.lease_epoch);
        assert_eq!(
            *marks.lock().unwrap(),
            [a.observation.lease_epoch, b.observation.lease_epoch],
            "the gate mark each launch saw"
        );
        second.stop().await;
    }

    pub async fn a_journal_that_cannot_be_read_at_attach_is_an_unclassified_failure_naming_no_private_id(
        ts: &TestStore,
    ) {
        capture();
        let svc = compose(ts, options("h-journal-unread"), Default::default()).await;
        svc.start().await.unwrap();
        let c = Controller::new(ts);
        let s = c.session().await;
        ts.exec_raw(match ts.backend {
            sessionstore::testing::TestBackend::Sqlite => "DROP TABLE journal_leases",
            sessionstore::testing::TestBackend::Postgres => "DROP TABLE journal_leases CASCADE",
        })
        .await;
        let e = svc.attach(c.attach_request(&s)).await.unwrap_err();
        assert_eq!(e.code(), None, "no placement code: {e}");
        assert_eq!(e.step(), Some("hydrate"), "{e}");
        assert!(e.to_string().contains("journal"), "{e}");
        assert!(
            !e.to_string()
                .contains(&s.binding.runtime_session_id.to_string()),
            "the binding's runtime session is not named: {e}"
        );
        // Unwound: the lease taken for the attach was given back.
        assert!(e.unreleased().is_empty(), "{e}");
        let lease = ts.store.residency(&s.tenant, &s.session).await.unwrap();
        assert!(
            lease.as_ref().is_none_or(|l| l.holder.is_none()),
            "{lease:?}"
        );
        svc.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    an_attach_refusal_an_operator_must_see_is_a_warn_and_before_start_is_not_started,
    a_runtime_without_a_closer_or_fault_reports_is_named_at_attach,
    a_stranded_attempt_a_runtime_without_a_closer_cannot_close_stays_applying_and_blocks_the_stream,
    an_attach_fences_the_gate_mark_with_its_grant_before_the_runtime_is_launched,
    a_journal_that_cannot_be_read_at_attach_is_an_unclassified_failure_naming_no_private_id,
    a_stopped_host_is_disposed_and_neither_starts_again_nor_takes_a_session,
    a_launch_that_fails_is_an_internal_failure_that_names_its_step,
    a_session_whose_binding_no_journal_store_here_serves_is_refused_before_any_dispatch_as_evidence_unroutable,
);
