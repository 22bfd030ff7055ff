//! A drain racing a warm release, on SQLite and PostgreSQL. The runtime's first graceful
//! release is held until the drain has begun, then refused, so the warm release has to be
//! taken back while the Host drains: the drain must wait for it instead of skipping the
//! session, the consumer it halted must stay halted, and the drain must release the lease.
//! And a drain of many idle sessions releases them a bounded number at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use department::{
    Capabilities, GracefulRelease, LaunchError, LaunchRequest, LaunchTarget, Registration, Runtime,
    RuntimeError,
};
use host::Registrar;
use sessionstore::{CompatibilityId, Store};
use testkit::HarnessRegistrar;
use tokio::sync::Notify;

/// Holds the first release until `go`, then refuses it; later releases are the runtime's own.
#[derive(Default)]
pub struct ReleaseGate {
    pub entered: Notify,
    pub go: Notify,
    used: AtomicBool,
}

struct HeldRelease {
    inner: Arc<dyn GracefulRelease>,
    gate: Arc<ReleaseGate>,
}

#[async_trait::async_trait]
impl GracefulRelease for HeldRelease {
    async fn release(&self) -> Result<(), RuntimeError> {
        if self.gate.used.swap(true, Ordering::SeqCst) {
            return self.inner.release().await;
        }
        self.gate.entered.notify_one();
        self.gate.go.notified().await;
        Err(RuntimeError::NotIdle)
    }
}

/// Counts graceful releases in flight (and the most at once); each takes a moment, so
/// releases that run together overlap.
#[derive(Default)]
pub struct CountedReleases {
    now: std::sync::atomic::AtomicUsize,
    pub most: std::sync::atomic::AtomicUsize,
}

struct CountedRelease {
    inner: Arc<dyn GracefulRelease>,
    releases: Arc<CountedReleases>,
}

#[async_trait::async_trait]
impl GracefulRelease for CountedRelease {
    async fn release(&self) -> Result<(), RuntimeError> {
        let now = self.releases.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.releases.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let done = self.inner.release().await;
        self.releases.now.fetch_sub(1, Ordering::SeqCst);
        done
    }
}

/// Wraps each launched runtime's graceful release.
type WrapRelease = dyn Fn(Arc<dyn GracefulRelease>) -> Arc<dyn GracefulRelease> + Send + Sync;

struct WrappedTarget {
    inner: Arc<dyn LaunchTarget>,
    wrap: Arc<WrapRelease>,
}

#[async_trait::async_trait]
impl LaunchTarget for WrappedTarget {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn compatibility(&self) -> CompatibilityId {
        self.inner.compatibility()
    }
    async fn launch(&self, request: LaunchRequest) -> Result<Runtime, LaunchError> {
        let mut runtime = self.inner.launch(request).await?;
        runtime.release = (self.wrap)(runtime.release.clone());
        Ok(runtime)
    }
}

/// The harness agent, each runtime's release wrapped by `wrap`.
pub struct WrappedRegistrar {
    wrap: Arc<WrapRelease>,
}

impl WrappedRegistrar {
    /// Releases held by `gate` (see [`ReleaseGate`]).
    pub fn held(gate: Arc<ReleaseGate>) -> Self {
        WrappedRegistrar {
            wrap: Arc::new(move |inner| {
                Arc::new(HeldRelease {
                    inner,
                    gate: gate.clone(),
                })
            }),
        }
    }

    /// Releases counted by `releases` (see [`CountedReleases`]).
    pub fn counted(releases: Arc<CountedReleases>) -> Self {
        WrappedRegistrar {
            wrap: Arc::new(move |inner| {
                Arc::new(CountedRelease {
                    inner,
                    releases: releases.clone(),
                })
            }),
        }
    }
}

#[async_trait::async_trait]
impl Registrar for WrappedRegistrar {
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
                target: Arc::new(WrappedTarget {
                    inner: r.target,
                    wrap: self.wrap.clone(),
                }),
            })
            .collect())
    }
}

mod cases {
    use std::sync::Arc;
    use std::time::Duration;

    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use testkit::*;

    use super::{CountedReleases, ReleaseGate, WrappedRegistrar};

    pub async fn a_drain_waits_for_a_warm_release_in_flight_and_releases_the_session_it_gives_back(
        ts: &TestStore,
    ) {
        let gate = Arc::new(ReleaseGate::default());
        let mut o = options("h-warm-drain");
        o.warm_ttl = Duration::from_millis(300);
        let svc = compose_with(ts, o, Box::new(WrappedRegistrar::held(gate.clone()))).await;
        svc.start().await.expect("the Host starts");
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let first = c.send(&svc, &s, input("before")).await;
        assert_eq!(c.terminal(&s, &first).await.outcome, Some(Outcome::Applied));
        // The session goes idle; the warm release reaches the runtime and is held there.
        tokio::time::timeout(WAIT, gate.entered.notified())
            .await
            .expect("the warm release reaches the runtime");
        let drainer = {
            let svc = svc.clone();
            tokio::spawn(async move { svc.drain().await })
        };
        wait_until("the drain to begin", || svc.draining()).await;
        // Admitted during the drain: it must stay pending for the successor.
        let during = c.admit(&s, input("during the drain")).await;
        // The runtime refuses the held release: the warm release is taken back mid-drain.
        gate.go.notify_one();
        let report = drainer.await.expect("the drain task");
        let key = host::SessionKey {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
        };
        assert_eq!(report.released, vec![key], "{report:?}");
        assert!(report.is_clean(), "{report:?}");
        // A warm release held for the drain (its take-back refused) is counted as a release
        // failure, as one taken back outside a drain is.
        assert_eq!(metric(&svc, "host_release_failures_total"), 1.0);
        assert!(svc.residents().is_empty());
        let reg = c
            .store
            .registration(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reg.residency, ResidencyState::Released, "tombstoned");
        // The consumer the drain halted never ran again: nothing was claimed or applied.
        let still = c
            .store
            .command(&s.tenant, &s.session, &during.command)
            .await
            .unwrap();
        assert_eq!(still.state, CommandState::Pending, "{still:?}");
        assert!(still.attempt.is_none());
        // The lease was handed back: a successor restores at once and applies it, once.
        let (next, _) = started(ts, options("h-warm-drain-next")).await;
        let a = c.attach(&next, &s).await;
        assert_eq!(a.launched, department::LaunchMode::Restore);
        next.deliver(&s.tenant, &s.session).unwrap();
        assert_eq!(
            c.terminal(&s, &during).await.outcome,
            Some(Outcome::Applied)
        );
        c.check_exactly_once(&s).await;
        svc.stop().await;
        next.stop().await;
    }

    pub async fn a_drain_releases_idle_sessions_a_bounded_number_at_a_time_and_each_whole(
        ts: &TestStore,
    ) {
        let count = host::DRAIN_PARALLELISM + 36;
        let releases = Arc::new(CountedReleases::default());
        let mut o = options("h-bounded-drain");
        o.capacity = u32::try_from(count).unwrap() + 4;
        let svc = compose_with(ts, o, Box::new(WrappedRegistrar::counted(releases.clone()))).await;
        svc.start().await.expect("the Host starts");
        let c = Controller::new(ts);
        let mut sessions = Vec::new();
        for _ in 0..count {
            let s = c.session().await;
            c.attach(&svc, &s).await;
            sessions.push(s);
        }
        let report = svc.drain().await;
        assert_eq!(report.released.len(), count, "{report:?}");
        assert!(report.is_clean(), "{report:?}");
        // Releases overlapped, but never more than the bound: the rest waited their turn
        // rather than all starting at once and all being half-done together.
        let most = releases.most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(most >= 2, "the drain releases in parallel: {most}");
        assert!(
            most <= host::DRAIN_PARALLELISM,
            "at most {} at once, saw {most}",
            host::DRAIN_PARALLELISM
        );
        for s in &sessions {
            let reg = c
                .store
                .registration(&s.tenant, &s.session)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(reg.residency, ResidencyState::Released, "{reg:?}");
        }
        svc.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    a_drain_waits_for_a_warm_release_in_flight_and_releases_the_session_it_gives_back,
    a_drain_releases_idle_sessions_a_bounded_number_at_a_time_and_each_whole,
);
