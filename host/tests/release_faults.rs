//! Warm release and drain against a runtime whose graceful release and abandon the test
//! steers (refused or held once; an abandon that fails, overruns its bound, leaves the runtime
//! alive, or cannot be offered at all), and which notes what the store showed at the moment
//! the Host called each of them. Also the steps a halt must wait out, held open with the
//! Host's failpoints, and a drain of a Host whose generation was superseded. Every case runs
//! on SQLite and PostgreSQL.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use department::{
    Capabilities, GracefulRelease, LaunchError, LaunchRequest, LaunchTarget, PersistenceFault,
    PersistenceFaults, Registration, Runtime, RuntimeError,
};
use host::Registrar;
use sessionstore::{
    CommandId, CommandState, CompatibilityId, ResidencyState, SessionId, Store, TenantId,
};
use testkit::HarnessRegistrar;
use tokio::sync::watch;

/// How the steered runtime answers a graceful release.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Release {
    /// The runtime's own release.
    Real,
    /// The first release is refused (`not_idle`); later ones are the runtime's own.
    RefusedOnce,
    /// The first release never returns; later ones are the runtime's own.
    HeldOnce,
}

/// How the steered runtime answers an abandon.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Abandon {
    /// The runtime's own abandon.
    Real,
    /// The abandon returns an error (the runtime keeps running).
    Fails,
    /// The abandon never returns.
    Hangs,
    /// The abandon answers Ok, but the runtime is still alive.
    LeavesItAlive,
    /// The runtime offers no `PersistenceFaults` at all (a best-effort target).
    Unsupported,
}

/// What the store showed when the Host called the runtime.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The session's registration state (`None`: no registration).
    pub registration: Option<ResidencyState>,
    /// Who holds the session's residency lease.
    pub lease_holder: Option<String>,
    /// Every command of the session, with its state.
    pub commands: Vec<(CommandId, CommandState)>,
    /// The consumer's cursor: the last accepted order it consumed.
    pub cursor: u64,
}

/// The test's hold on every runtime the Host launches.
pub struct Steering {
    pub release: Release,
    pub abandon: Abandon,
    /// Latches a persistence fault the Host sees as the runtime's own.
    pub fault: watch::Sender<Option<PersistenceFault>>,
    /// What the store showed at each graceful release the Host asked for.
    pub at_release: Mutex<Vec<Seen>>,
    /// What the store showed at each abandon the Host asked for.
    pub at_abandon: Mutex<Vec<Seen>>,
    releases_steered: AtomicBool,
    pub abandons: AtomicUsize,
}

impl Steering {
    pub fn new(release: Release, abandon: Abandon) -> Arc<Steering> {
        Arc::new(Steering {
            release,
            abandon,
            fault: watch::channel(None).0,
            at_release: Mutex::new(Vec::new()),
            at_abandon: Mutex::new(Vec::new()),
            releases_steered: AtomicBool::new(false),
            abandons: AtomicUsize::new(0),
        })
    }

    pub fn releases_seen(&self) -> Vec<Seen> {
        self.at_release.lock().unwrap().clone()
    }

    pub fn abandons_seen(&self) -> Vec<Seen> {
        self.at_abandon.lock().unwrap().clone()
    }
}

/// One launched session as the steered runtime knows it.
struct Watched {
    steering: Arc<Steering>,
    store: Store,
    tenant: TenantId,
    session: SessionId,
}

impl Watched {
    async fn seen(&self) -> Seen {
        let registration = self
            .store
            .registration(&self.tenant, &self.session)
            .await
            .unwrap()
            .map(|r| r.residency);
        let lease_holder = self
            .store
            .residency(&self.tenant, &self.session)
            .await
            .unwrap()
            .and_then(|l| l.holder);
        let commands = self
            .store
            .list_commands(&self.tenant, &self.session, 0, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.command, c.state))
            .collect();
        let cursor = self
            .store
            .cursor(&self.tenant, &self.session)
            .await
            .unwrap()
            .map_or(0, |c| c.consumed_order);
        Seen {
            registration,
            lease_holder,
            commands,
            cursor,
        }
    }
}

struct SteeredRelease {
    inner: Arc<dyn GracefulRelease>,
    watched: Watched,
}

#[async_trait::async_trait]
impl GracefulRelease for SteeredRelease {
    async fn release(&self) -> Result<(), RuntimeError> {
        let seen = self.watched.seen().await;
        let steering = &self.watched.steering;
        steering.at_release.lock().unwrap().push(seen);
        let first = !steering.releases_steered.swap(true, Ordering::SeqCst);
        match steering.release {
            Release::RefusedOnce if first => Err(RuntimeError::NotIdle),
            Release::HeldOnce if first => std::future::pending().await,
            _ => self.inner.release().await,
        }
    }
}

struct SteeredFaults {
    inner: Arc<dyn PersistenceFaults>,
    watched: Watched,
}

#[async_trait::async_trait]
impl PersistenceFaults for SteeredFaults {
    fn faults(&self) -> watch::Receiver<Option<PersistenceFault>> {
        self.watched.steering.fault.subscribe()
    }

    async fn abandon(&self) -> Result<(), RuntimeError> {
        let seen = self.watched.seen().await;
        let steering = &self.watched.steering;
        steering.at_abandon.lock().unwrap().push(seen);
        steering.abandons.fetch_add(1, Ordering::SeqCst);
        match steering.abandon {
            Abandon::Real | Abandon::Unsupported => self.inner.abandon().await,
            Abandon::Fails => Err(RuntimeError::Faulted(
                "the test's runtime refuses to be abandoned".into(),
            )),
            Abandon::Hangs => std::future::pending().await,
            Abandon::LeavesItAlive => Ok(()),
        }
    }
}

struct SteeredTarget {
    inner: Arc<dyn LaunchTarget>,
    steering: Arc<Steering>,
    store: Store,
}

#[async_trait::async_trait]
impl LaunchTarget for SteeredTarget {
    fn capabilities(&self) -> Capabilities {
        let mut c = self.inner.capabilities();
        if self.steering.abandon == Abandon::Unsupported {
            c.recovery.persistence_faults = false;
        }
        c
    }

    fn compatibility(&self) -> CompatibilityId {
        self.inner.compatibility()
    }

    async fn launch(&self, request: LaunchRequest) -> Result<Runtime, LaunchError> {
        let watched = || Watched {
            steering: self.steering.clone(),
            store: self.store.clone(),
            tenant: request.tenant.clone(),
            session: request.session.clone(),
        };
        let mut runtime = self.inner.launch(request.clone()).await?;
        runtime.release = Arc::new(SteeredRelease {
            inner: runtime.release.clone(),
            watched: watched(),
        });
        runtime.faults = match (self.steering.abandon, runtime.faults.take()) {
            (Abandon::Unsupported, _) | (_, None) => None,
            (_, Some(inner)) => Some(Arc::new(SteeredFaults {
                inner,
                watched: watched(),
            })),
        };
        Ok(runtime)
    }
}

/// The harness agent, every runtime of it steered by `steering`.
pub struct SteeredRegistrar {
    pub steering: Arc<Steering>,
}

#[async_trait::async_trait]
impl Registrar for SteeredRegistrar {
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
                target: Arc::new(SteeredTarget {
                    inner: r.target,
                    steering: self.steering.clone(),
                    store: store.clone(),
                }),
            })
            .collect())
    }
}

mod cases {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use department::PersistenceFault;
    use host::failpoints::{self, Action};
    use host::{DrainReport, Options, SessionKey};
    use hostlink::records::DrainState;
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use testkit::*;

    use super::{Abandon, Release, SteeredRegistrar, Steering};

    /// A started Host whose runtimes `steering` steers.
    async fn steered(ts: &TestStore, o: Options, steering: &Arc<Steering>) -> host::Service {
        let profile = if steering.abandon == Abandon::Unsupported {
            department::RuntimeProfile::BestEffort
        } else {
            department::RuntimeProfile::Durable
        };
        let svc = host::Composition {
            options: o,
            store: ts.options(),
            registrar: Box::new(SteeredRegistrar {
                steering: steering.clone(),
            }),
            profile,
            version: "test".into(),
        }
        .build()
        .await
        .expect("the Host composes");
        svc.start().await.expect("the Host starts");
        svc
    }

    fn key(s: &SessionRecord) -> SessionKey {
        SessionKey {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
        }
    }

    fn failed_steps(report: &DrainReport, s: &SessionRecord) -> Vec<&'static str> {
        report
            .failures
            .iter()
            .filter(|f| f.session.as_ref() == Some(&key(s)))
            .map(|f| f.step)
            .collect()
    }

    /// Drains a Host whose one session is parked at a gate and whose runtime answers an
    /// abandon as `abandon` says; returns the report and the release failures counted.
    async fn drain_a_gated_session(
        ts: &TestStore,
        host_id: &str,
        abandon: Abandon,
    ) -> (DrainReport, SessionRecord, f64) {
        let steering = Steering::new(Release::Real, abandon);
        let svc = steered(ts, options(host_id), &steering).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        c.send(&svc, &s, input("/tool launch_rocket {}")).await;
        c.open_gate(&s).await;
        let report = svc.drain().await;
        let counted = metric(&svc, "host_release_failures_total");
        svc.stop().await;
        if abandon == Abandon::Unsupported {
            assert_eq!(steering.abandons.load(Ordering::SeqCst), 0);
        } else {
            assert_eq!(steering.abandons.load(Ordering::SeqCst), 1);
        }
        (report, s, counted)
    }

    /// What every parked session's drain shows: parked (never abandoned), an
    /// `abandon_residency` failure, one release failure counted, `drained` withheld.
    fn assert_parked(report: &DrainReport, s: &SessionRecord, counted: f64) {
        assert_eq!(report.parked, [key(s)], "{report:?}");
        assert!(report.abandoned.is_empty(), "{report:?}");
        assert!(report.released.is_empty(), "{report:?}");
        assert!(
            failed_steps(report, s).contains(&host::drain_steps::ABANDON_RESIDENCY),
            "{report:?}"
        );
        assert_eq!(report.state, DrainState::Draining, "drained is withheld");
        assert!(!report.is_clean(), "a parked session is no clean drain");
        assert_eq!(counted, 1.0, "the parked release is counted once");
    }

    pub async fn a_gated_session_whose_abandon_fails_is_reported_parked_not_abandoned(
        ts: &TestStore,
    ) {
        let (report, s, counted) = drain_a_gated_session(ts, "h-park-fails", Abandon::Fails).await;
        assert_parked(&report, &s, counted);
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.step == host::drain_steps::ABANDON_RESIDENCY
                    && f.reason.contains("refuses to be abandoned")),
            "the failure carries the abandon's error: {report:?}"
        );
    }

    pub async fn a_gated_session_whose_abandon_overruns_its_bound_is_reported_parked(
        ts: &TestStore,
    ) {
        let began = std::time::Instant::now();
        let (report, s, counted) = drain_a_gated_session(ts, "h-park-hangs", Abandon::Hangs).await;
        assert_parked(&report, &s, counted);
        let took = began.elapsed();
        // The abandon's bound is one idle boundary (2 s here); the drain does not wait it out
        // beyond grace + 1.5 idle boundaries.
        assert!(took < Duration::from_secs(8), "the drain took {took:?}");
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.step == host::drain_steps::ABANDON_RESIDENCY
                    && f.reason.contains("timed out")),
            "{report:?}"
        );
    }

    pub async fn a_gated_session_whose_runtime_outlives_its_abandon_is_reported_parked(
        ts: &TestStore,
    ) {
        let (report, s, counted) =
            drain_a_gated_session(ts, "h-park-alive", Abandon::LeavesItAlive).await;
        assert_parked(&report, &s, counted);
    }

    pub async fn a_gated_session_whose_runtime_cannot_be_abandoned_is_reported_parked(
        ts: &TestStore,
    ) {
        let (report, s, counted) =
            drain_a_gated_session(ts, "h-park-unsupported", Abandon::Unsupported).await;
        assert_parked(&report, &s, counted);
    }

    /// The abandon comes first: when the runtime is stopped the registration still says
    /// releasing and the lease is still this Host's; only then is the registration
    /// tombstoned and the lease handed back.
    pub async fn a_drain_abandons_a_session_before_it_tombstones_it_and_hands_its_lease_back(
        ts: &TestStore,
    ) {
        let steering = Steering::new(Release::Real, Abandon::Real);
        let svc = steered(ts, options("h-abandon-first"), &steering).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        c.send(&svc, &s, input("/tool launch_rocket {}")).await;
        c.open_gate(&s).await;
        let report = svc.drain().await;
        assert_eq!(report.abandoned, [key(&s)], "{report:?}");
        let seen = steering.abandons_seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(
            seen[0].registration,
            Some(ResidencyState::Releasing),
            "not yet tombstoned when abandoned: {seen:?}"
        );
        assert!(
            seen[0].lease_holder.is_some(),
            "the lease was still held when abandoned: {seen:?}"
        );
        let reg = c
            .store
            .registration(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reg.residency, ResidencyState::Released, "tombstoned after");
        let lease = c
            .store
            .residency(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.holder, None, "handed back after");
        svc.stop().await;
    }

    /// A persistence fault ends the residency, but the abandon waits for the command pass
    /// in flight (here held between the runtime's disposition and the settle): the command
    /// is settled before the runtime is stopped.
    pub async fn a_faulted_session_is_abandoned_only_after_the_command_pass_in_flight_settles(
        ts: &TestStore,
    ) {
        let host_id = "h-fault-halts-first";
        let steering = Steering::new(Release::Real, Abandon::Real);
        let svc = steered(ts, options(host_id), &steering).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let held = format!(
            "{host_id}:{}",
            failpoints::steps::AFTER_DISPATCH_BEFORE_SETTLE
        );
        failpoints::arm(&held, Action::Delay(Duration::from_millis(1200)));
        let cmd = c.send(&svc, &s, input("in flight")).await;
        wait_until("the pass to reach the settle", || {
            failpoints::hits(&held) == 1
        })
        .await;
        steering.fault.send_replace(Some(PersistenceFault {
            reason: "the test latched a fault".into(),
        }));
        wait_until("the faulted residency to end", || {
            svc.residents().is_empty()
        })
        .await;
        let seen = steering.abandons_seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let state = seen[0]
            .commands
            .iter()
            .find(|(id, _)| *id == cmd.command)
            .map(|(_, st)| *st);
        assert_eq!(
            state,
            Some(CommandState::Applied),
            "the pass in flight settled before the abandon: {seen:?}"
        );
        svc.stop().await;
    }

    /// A drain's halt that outlasts its bound (a pass held after its claim) is a failed
    /// `halt_consumption` step, and the release goes on: the session is still given back
    /// and the drain ends drained.
    pub async fn a_drain_halt_that_outlasts_its_bound_is_recorded_and_the_release_goes_on(
        ts: &TestStore,
    ) {
        let host_id = "h-halt-overrun";
        let (svc, _) = started(ts, options(host_id)).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let held = format!("{host_id}:{}", failpoints::steps::AFTER_CLAIM);
        // Longer than the halt's bound (the idle boundary, 2 s).
        failpoints::arm(&held, Action::Delay(Duration::from_secs(3)));
        c.send(&svc, &s, input("held after its claim")).await;
        wait_until("the pass to claim", || failpoints::hits(&held) == 1).await;
        let report = svc.drain().await;
        assert_eq!(
            failed_steps(&report, &s),
            [host::drain_steps::HALT_CONSUMPTION],
            "{report:?}"
        );
        assert_eq!(report.released, [key(&s)], "{report:?}");
        assert!(report.parked.is_empty(), "{report:?}");
        assert_eq!(report.state, DrainState::Drained, "{report:?}");
        svc.stop().await;
    }

    /// When the countdown fires the warm release halts the consumer first and waits out the
    /// pass in flight (here held after its settle, before it moves the cursor): the runtime is
    /// asked to release only once that pass has finished.
    pub async fn a_warm_release_waits_out_the_command_pass_in_flight_before_releasing(
        ts: &TestStore,
    ) {
        let host_id = "h-warm-halts-first";
        let steering = Steering::new(Release::Real, Abandon::Real);
        let mut o = options(host_id);
        o.warm_ttl = Duration::from_millis(500);
        let svc = steered(ts, o, &steering).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let held = format!(
            "{host_id}:{}",
            failpoints::steps::AFTER_SETTLE_BEFORE_CURSOR
        );
        // Longer than the warm TTL, shorter than the halt's bound (the idle boundary, 2 s).
        failpoints::arm(&held, Action::Delay(Duration::from_millis(1500)));
        let cmd = c.send(&svc, &s, input("settled, cursor held")).await;
        assert_eq!(c.terminal(&s, &cmd).await.outcome, Some(Outcome::Applied));
        wait_until("the warm release", || svc.residents().is_empty()).await;
        let seen = steering.releases_seen();
        assert_eq!(seen.len(), 1, "one warm release, not taken back: {seen:?}");
        assert!(
            seen[0].cursor >= cmd.accepted_order,
            "the pass moved the cursor before the runtime was released: {seen:?}"
        );
        svc.stop().await;
    }

    /// A refused warm release is taken back (the session is an ordinary resident again),
    /// counted once, and the next idle countdown releases it.
    pub async fn a_refused_warm_release_is_taken_back_counted_and_tried_again(ts: &TestStore) {
        let steering = Steering::new(Release::RefusedOnce, Abandon::Real);
        let mut o = options("h-warm-refused");
        o.warm_ttl = Duration::from_millis(300);
        let svc = steered(ts, o, &steering).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let first = c.send(&svc, &s, input("before")).await;
        assert_eq!(c.terminal(&s, &first).await.outcome, Some(Outcome::Applied));
        wait_until("the second warm release", || svc.residents().is_empty()).await;
        assert_eq!(steering.releases_seen().len(), 2);
        assert_eq!(metric(&svc, "host_release_failures_total"), 1.0);
        svc.stop().await;
    }

    /// The runtime's graceful release is bounded by the drain grace: one that does not end
    /// in time is taken back, the session serves on as an ordinary resident, and the failure
    /// is counted.
    pub async fn a_warm_release_the_runtime_does_not_finish_within_the_grace_is_taken_back(
        ts: &TestStore,
    ) {
        let steering = Steering::new(Release::HeldOnce, Abandon::Real);
        let mut o = options("h-warm-held");
        o.warm_ttl = Duration::from_millis(300);
        o.drain_grace = Duration::from_secs(1);
        o.idle_boundary = Duration::from_secs(1);
        let svc = steered(ts, o, &steering).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let first = c.send(&svc, &s, input("before")).await;
        assert_eq!(c.terminal(&s, &first).await.outcome, Some(Outcome::Applied));
        eventually(
            "the held release to be taken back and counted",
            async || {
                let n = metric(&svc, "host_release_failures_total");
                check(n == 1.0, || n.to_string())
            },
        )
        .await;
        // Taken back, then released at the next countdown (the runtime's own release).
        wait_until("the next warm release", || svc.residents().is_empty()).await;
        assert_eq!(steering.releases_seen().len(), 2);
        assert_eq!(metric(&svc, "host_release_failures_total"), 1.0);
        svc.stop().await;
    }

    /// A newer generation of the same Host id makes the old generation's withdrawal of its
    /// advertisement fail; the drain records that and still releases every session, so
    /// another Host restores them at once.
    pub async fn a_superseded_generation_still_releases_every_session_when_it_drains(
        ts: &TestStore,
    ) {
        let mut o = options("h-superseded");
        // No heartbeat before the drain: the old generation must not learn of the newer one
        // (and end its residencies) on its own first.
        o.registry_heartbeat = Duration::from_secs(30);
        o.registry_expiry = Duration::from_secs(120);
        o.registry_retention = Duration::from_secs(600);
        let (old, _) = started(ts, o.clone()).await;
        let c = Controller::new(ts);
        let sessions = [c.session().await, c.session().await];
        for s in &sessions {
            c.attach(&old, s).await;
        }
        let (newer, _) = started(ts, o).await;
        assert!(newer.generation() > old.generation());
        let report = old.drain().await;
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.session.is_none() && f.step == host::drain_steps::PUBLISH_NOT_ACCEPTING),
            "the withdrawal failed: {report:?}"
        );
        for s in &sessions {
            assert!(report.released.contains(&key(s)), "{report:?}");
        }
        assert_eq!(report.state, DrainState::Drained, "{report:?}");
        let (next, _) = started(ts, options("h-superseded-successor")).await;
        for s in &sessions {
            // Refused `epoch_mismatch` while the old generation's lease were still held.
            c.attach(&next, s).await;
        }
        old.stop().await;
        newer.stop().await;
        next.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    a_gated_session_whose_abandon_fails_is_reported_parked_not_abandoned,
    a_gated_session_whose_abandon_overruns_its_bound_is_reported_parked,
    a_gated_session_whose_runtime_outlives_its_abandon_is_reported_parked,
    a_gated_session_whose_runtime_cannot_be_abandoned_is_reported_parked,
    a_drain_abandons_a_session_before_it_tombstones_it_and_hands_its_lease_back,
    a_faulted_session_is_abandoned_only_after_the_command_pass_in_flight_settles,
    a_drain_halt_that_outlasts_its_bound_is_recorded_and_the_release_goes_on,
    a_warm_release_waits_out_the_command_pass_in_flight_before_releasing,
    a_refused_warm_release_is_taken_back_counted_and_tried_again,
    a_warm_release_the_runtime_does_not_finish_within_the_grace_is_taken_back,
    a_superseded_generation_still_releases_every_session_when_it_drains,
);
