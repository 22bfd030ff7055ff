//! The fleet model: three Hosts, each with its own store handle on one database, drive two
//! sessions and one workflow run through random steps, and a reference model says after every
//! step what the store must answer and what it must hold.
//!
//! The Hosts acquire, renew, release and move sessions' residency leases; each new grant takes
//! the session's journal over (a warm restore) and a warm release hands back residency, journal
//! and registration. Hosts advertise themselves in the registry, restart under a new
//! generation (forgetting every grant and fence they held) and re-advertise stale generations.
//! Commands are admitted, claimed, attempted, applied or closed and settled by whichever Host
//! believes it holds the session, stale ones included. The run is started, renewed, written,
//! released and taken over. Time moves only when a step says so, in ticks far from every
//! expiry instant (a lease lives 100 s, a tick is 40 s), so the model knows what has expired.
//!
//! What must hold after every step: the residency lease row and the registry are what the
//! model says (one holder per lease at a time; a lower epoch never writes); each command's
//! state, mark and attempt are the model's, with at most one disposition in the journal and
//! settlement only on verified evidence; commands keep their admission order; the journal only
//! ever grows (a restore gives back every record a release left); the run's epoch, holder and
//! step journal are the model's, each step written under the epoch that was current.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use sessionstore::testing::{TestBackend, TestStore};
use sessionstore::*;
use uuid::Uuid;

pub const HOSTS: usize = 3;
const SESSIONS: usize = 2;
const COMMANDS: usize = 3;
/// Every lease, registration and advertisement lives this long.
const TTL_MS: i64 = 100_000;
/// One tick of the paused clock: 40 s, so 0, 40 and 80 s after a renewal are live and 120 s
/// is expired, each 20 s from the boundary: PostgreSQL's own clock runs on underneath the
/// shift, and a case on a busy machine may take seconds.
const TICK_MS: i64 = 40_000;
/// Claims and deadlines outlive any case: time stops moving once a case reaches this.
const TIME_BUDGET_MS: i64 = 3_000_000;
const LONG: Duration = Duration::from_secs(3600);

fn ttl() -> Duration {
    Duration::from_millis(TTL_MS as u64)
}

#[derive(Clone, Debug)]
pub enum Op {
    /// Host h publishes its advertisement under its current generation.
    Advertise(usize),
    /// Host h publishes under the generation before its current one.
    StaleAdvertise(usize),
    /// Host h restarts: a new generation, every grant, journal lease and run fence forgotten.
    Restart(usize),
    Acquire(usize, usize),
    /// Host h's heartbeat: its advertisement, every live lease and every registration of its
    /// generation renewed, other Hosts' long-expired advertisements collected.
    Heartbeat(usize),
    Register(usize, usize),
    /// Warm release: journal lease, registration (tombstoned) and residency handed back.
    Release(usize, usize),
    /// A residency move: warm release by one Host, restore and registration by another.
    Move(usize, usize, usize),
    /// A failover: the session's holder falls silent until its lease lapses (three ticks),
    /// then Host h acquires the session. The silent Host keeps believing it holds it.
    Failover(usize, usize),
    Admit(usize, usize),
    /// The command steps name their Host by rank among those holding a grant for the session,
    /// newest grant first (see [`actor`]).
    Claim(usize, usize, usize),
    Begin(usize, usize, usize),
    /// Claim and begin in one go, as a Host does before it hands a command to its runtime.
    Dispatch(usize, usize, usize),
    Apply(usize, usize, usize, ApplicationOutcome),
    Close(usize, usize, usize),
    Settle(usize, usize, usize),
    /// Ends a command before any attempt (the Host's refusal of it).
    Reject(usize, usize, usize),
    /// Saves the session's consumption cursor over its settled prefix.
    Consume(usize, usize),
    StartRun(usize),
    TakeRun(usize),
    /// Host h, booting, takes back the run if one of its incarnations holds it (or it is gone).
    TakeBack(usize),
    RenewRun(usize),
    StepRun(usize),
    ReleaseRun(usize),
    Advance(u8),
}

fn outcome() -> impl Strategy<Value = ApplicationOutcome> {
    prop_oneof![
        Just(ApplicationOutcome::Applied),
        Just(ApplicationOutcome::NoOp),
        Just(ApplicationOutcome::Refused)
    ]
}

/// Which of the Hosts that believe they hold a session acts on its commands: 0 is the one with
/// the newest grant (mostly the live holder), higher numbers reach older, stale ones.
fn actor() -> impl Strategy<Value = usize> {
    prop_oneof![3 => Just(0), 1 => 1..HOSTS]
}

pub fn op() -> impl Strategy<Value = Op> {
    let h = 0..HOSTS;
    let s = 0..SESSIONS;
    let c = 0..COMMANDS;
    prop_oneof![
        2 => h.clone().prop_map(Op::Advertise),
        1 => h.clone().prop_map(Op::StaleAdvertise),
        1 => h.clone().prop_map(Op::Restart),
        4 => (h.clone(), s.clone()).prop_map(|(h, s)| Op::Acquire(h, s)),
        3 => h.clone().prop_map(Op::Heartbeat),
        2 => (h.clone(), s.clone()).prop_map(|(h, s)| Op::Register(h, s)),
        1 => (h.clone(), s.clone()).prop_map(|(h, s)| Op::Release(h, s)),
        2 => (h.clone(), h.clone(), s.clone()).prop_map(|(a, b, s)| Op::Move(a, b, s)),
        2 => (h.clone(), s.clone()).prop_map(|(h, s)| Op::Failover(h, s)),
        4 => (s.clone(), c.clone()).prop_map(|(s, c)| Op::Admit(s, c)),
        3 => (actor(), s.clone(), c.clone()).prop_map(|(a, s, c)| Op::Claim(a, s, c)),
        3 => (actor(), s.clone(), c.clone()).prop_map(|(a, s, c)| Op::Begin(a, s, c)),
        4 => (actor(), s.clone(), c.clone()).prop_map(|(a, s, c)| Op::Dispatch(a, s, c)),
        3 => (actor(), s.clone(), c.clone(), outcome())
            .prop_map(|(a, s, c, o)| Op::Apply(a, s, c, o)),
        1 => (actor(), s.clone(), c.clone()).prop_map(|(a, s, c)| Op::Close(a, s, c)),
        3 => (actor(), s.clone(), c.clone()).prop_map(|(a, s, c)| Op::Settle(a, s, c)),
        1 => (actor(), s.clone(), c.clone()).prop_map(|(a, s, c)| Op::Reject(a, s, c)),
        2 => (actor(), s.clone()).prop_map(|(a, s)| Op::Consume(a, s)),
        1 => h.clone().prop_map(Op::StartRun),
        2 => h.clone().prop_map(Op::TakeRun),
        1 => h.clone().prop_map(Op::TakeBack),
        2 => h.clone().prop_map(Op::RenewRun),
        2 => h.clone().prop_map(Op::StepRun),
        1 => h.clone().prop_map(Op::ReleaseRun),
        2 => (1u8..=3).prop_map(Op::Advance),
    ]
}

// ---- the reference model --------------------------------------------------------------------

#[derive(Clone, Debug)]
struct ModelLease {
    epoch: u64,
    holder: Option<String>,
    /// The Host and generation the lease names (what a heartbeat renews by).
    host: (usize, u64),
    expires: i64,
}

#[derive(Clone, Debug)]
struct ModelRegistration {
    host: usize,
    generation: u64,
    mark: u64,
    residency: ResidencyState,
    accepting: bool,
    expires: i64,
}

#[derive(Clone, Debug, Default)]
struct ModelCommand {
    admitted: bool,
    state: Option<CommandState>,
    mark: u64,
    claim_epoch: Option<u64>,
    /// (residency epoch, journal epoch) of the one attempt.
    attempt: Option<(u64, u64)>,
    disposition: Option<Disposition>,
}

#[derive(Clone, Debug, Default)]
struct ModelSession {
    lease: Option<ModelLease>,
    /// The epoch of the newest journal lease (0: none yet).
    journal_epoch: u64,
    registration: Option<ModelRegistration>,
    commands: Vec<ModelCommand>,
    /// Commands in the order they were first admitted.
    admitted: Vec<usize>,
    /// The consumption cursor: (consumed order, epoch mark).
    cursor: Option<(u64, u64)>,
}

#[derive(Clone, Debug)]
struct ModelRun {
    epoch: u64,
    holder: String,
    expires: i64,
    state: RunState,
    /// The epoch each accepted step was written under, in order.
    steps: Vec<u64>,
}

#[derive(Clone, Debug)]
struct ModelHost {
    generation: u64,
    /// The generation and expiry the registry holds for this Host.
    advertised: Option<(u64, i64)>,
    /// The generation and expiry of this Host's last heartbeat (an advertisement alone does
    /// not carry leases).
    beat: Option<(u64, i64)>,
}

struct Model {
    now: i64,
    hosts: Vec<ModelHost>,
    sessions: Vec<ModelSession>,
    run: Option<ModelRun>,
}

impl ModelLease {
    fn is_live(&self, now: i64) -> bool {
        self.holder.is_some() && self.expires > now
    }
}

impl ModelSession {
    /// Steers a step to where it can do something: the first command from `c` on (wrapping)
    /// that `ready` accepts, else `c` itself.
    fn next_command(&self, c: usize, ready: impl Fn(&ModelCommand) -> bool) -> usize {
        (0..COMMANDS)
            .map(|k| (c + k) % COMMANDS)
            .find(|k| ready(&self.commands[*k]))
            .unwrap_or(c)
    }

    /// `machine::residency_fence`, restated: a later epoch holds the session, or this epoch
    /// lapsed or was released.
    fn residency_refuses(&self, epoch: u64, now: i64) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|l| l.epoch > epoch || (l.epoch == epoch && !l.is_live(now)))
    }
}

// ---- the world: the Hosts' own views and the store ------------------------------------------

/// What one Host believes it holds.
#[derive(Default)]
struct HostView {
    grants: HashMap<usize, ResidencyGrant>,
    journals: HashMap<usize, JournalLease>,
    run: Option<RunFence>,
}

struct World {
    ts: TestStore,
    /// One store handle per Host (the first is `ts.store`'s own database, reopened).
    stores: Vec<Store>,
    views: Vec<HostView>,
    tenant: TenantId,
    sessions: Vec<SessionRecord>,
    run_id: RunId,
    tokens: HashMap<(usize, usize, u64), Uuid>,
    attempts: HashMap<(usize, usize, u64), AttemptId>,
    /// Every journal record seen so far, per session: the journal only ever grows.
    journals: Vec<Vec<JournalRecord>>,
    seen_attempts: HashMap<(usize, usize), AttemptId>,
    steps_written: u64,
}

fn host_id(h: usize) -> HostId {
    HostId::new(format!("h{h}")).expect("a host id")
}

fn cid(c: usize) -> CommandId {
    CommandId::new(format!("cmd-{c}")).expect("a command id")
}

fn holder(h: usize, generation: u64) -> String {
    format!("h{h}/g{generation}")
}

impl World {
    /// The Host of rank `rank` (wrapping) among those holding a grant for session s, newest
    /// grant first.
    fn holder_of(&self, s: usize, rank: usize) -> Option<usize> {
        let mut holders: Vec<(u64, usize)> = self
            .views
            .iter()
            .enumerate()
            .filter_map(|(h, v)| v.grants.get(&s).map(|g| (g.epoch.0, h)))
            .collect();
        if holders.is_empty() {
            return None;
        }
        holders.sort_by(|a, b| b.cmp(a));
        Some(holders[rank % holders.len()].1)
    }

    fn session_ids(&self, s: usize) -> (TenantId, SessionId) {
        (self.tenant.clone(), self.sessions[s].session.clone())
    }

    async fn record(&self, s: usize, c: usize) -> Option<CommandRecord> {
        let (t, sid) = self.session_ids(s);
        match self.ts.store.command(&t, &sid, &cid(c)).await {
            Ok(r) => Some(r),
            Err(e) if e.code() == ErrorCode::NotFound => None,
            Err(e) => panic!("reading command {c} of session {s}: {e}"),
        }
    }

    async fn journal(&self, s: usize) -> Vec<JournalRecord> {
        let rs = self.sessions[s].binding.runtime_session_id;
        self.ts
            .store
            .journal_runtime_page(&self.tenant, rs, 0, 1000)
            .await
            .expect("the journal reads")
    }
}

async fn advertise(w: &mut World, m: &mut Model, h: usize, generation: u64) {
    let r = w.stores[h]
        .advertise(HostAdvertisement {
            host: host_id(h),
            endpoint: format!("http://127.0.0.1:{}", 9000 + h),
            placement: Placement::Pooled,
            isolation_class: "standard".into(),
            capacity: 8,
            accepting: true,
            generation,
            ttl: ttl(),
        })
        .await;
    let ok = m.hosts[h]
        .advertised
        .is_none_or(|(stored, _)| generation >= stored);
    assert_eq!(r.is_ok(), ok, "advertise h{h} g{generation}: {r:?}");
    if ok {
        m.hosts[h].advertised = Some((generation, m.now + TTL_MS));
    }
}

/// Host h asks for session s's residency; a new grant takes the journal over (restore).
async fn acquire(w: &mut World, m: &mut Model, h: usize, s: usize) {
    let generation = m.hosts[h].generation;
    let who = holder(h, generation);
    let (t, sid) = w.session_ids(s);
    let r = w.stores[h]
        .acquire_residency(ResidencyRequest {
            tenant: t.clone(),
            session: sid,
            holder: who.clone(),
            host: host_id(h),
            host_generation: generation,
            ttl: ttl(),
        })
        .await;
    let ms = &mut m.sessions[s];
    let expected = match &ms.lease {
        None => Some((1, true)),
        Some(l) if l.is_live(m.now) => {
            (l.holder.as_deref() == Some(who.as_str())).then_some((l.epoch, false))
        }
        Some(l) => Some((l.epoch + 1, true)),
    };
    match (&r, expected) {
        (Ok(grant), Some((epoch, changed))) => {
            assert_eq!(grant.epoch.0, epoch, "acquire h{h} s{s}: the epoch");
            if changed {
                ms.lease = Some(ModelLease {
                    epoch,
                    holder: Some(who.clone()),
                    host: (h, generation),
                    expires: m.now + TTL_MS,
                });
                // A new grant is a new residency: its runtime takes the journal over.
                w.views[h].journals.remove(&s);
            }
            w.views[h].grants.insert(s, grant.clone());
        }
        (Err(e), None) => assert_eq!(e.code(), ErrorCode::ClaimHeld, "acquire h{h} s{s}: {e}"),
        _ => panic!("acquire h{h} s{s}: {r:?}, the model expected {expected:?}"),
    }
    if w.views[h].grants.contains_key(&s) && !w.views[h].journals.contains_key(&s) {
        restore(w, m, h, s, &who).await;
    }
}

/// Host h takes session s's journal over: a strictly higher journal epoch, an opening fence at
/// the tip, and every record written before it still there.
async fn restore(w: &mut World, m: &mut Model, h: usize, s: usize, who: &str) {
    let rs = w.sessions[s].binding.runtime_session_id;
    let before = w.journal(s).await;
    let lease = w.stores[h]
        .journal_acquire(&w.tenant, rs, who, LONG)
        .await
        .expect("a residency holder can always take the journal over");
    let ms = &mut m.sessions[s];
    assert!(
        lease.epoch.0 > ms.journal_epoch,
        "journal epochs increase: {} after {}",
        lease.epoch.0,
        ms.journal_epoch
    );
    ms.journal_epoch = lease.epoch.0;
    let after = w.journal(s).await;
    assert_eq!(
        lease.tip,
        before.len() as u64 + 1,
        "the new lease's tip is its opening fence, right after the old tip"
    );
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "a restore gives back every record written before it"
    );
    w.views[h].journals.insert(s, lease);
}

async fn register(w: &mut World, m: &mut Model, h: usize, s: usize) {
    let Some(grant) = w.views[h].grants.get(&s).cloned() else {
        return;
    };
    let (t, sid) = w.session_ids(s);
    let r = w.stores[h]
        .put_registration(RegistrationUpdate {
            tenant: t,
            session: sid,
            host: host_id(h),
            host_generation: grant.host_generation,
            endpoint: format!("http://127.0.0.1:{}", 9000 + h),
            residency: ResidencyState::Resident,
            accepting: true,
            lease_epoch: grant.epoch,
            ttl: ttl(),
        })
        .await;
    let ms = &mut m.sessions[s];
    let ok = ms
        .registration
        .as_ref()
        .is_none_or(|reg| grant.epoch.0 >= reg.mark);
    assert_eq!(
        r.is_ok(),
        ok,
        "register h{h} s{s} e{}: {r:?}",
        grant.epoch.0
    );
    if ok {
        ms.registration = Some(ModelRegistration {
            host: h,
            generation: grant.host_generation,
            mark: grant.epoch.0,
            residency: ResidencyState::Resident,
            accepting: true,
            expires: m.now + TTL_MS,
        });
    }
}

async fn release(w: &mut World, m: &mut Model, h: usize, s: usize) {
    let Some(grant) = w.views[h].grants.remove(&s) else {
        return;
    };
    if let Some(lease) = w.views[h].journals.remove(&s) {
        w.stores[h]
            .journal_release(&lease)
            .await
            .expect("releasing a journal lease (superseded or not) succeeds");
    }
    let ms = &mut m.sessions[s];
    if let Some(reg) = &mut ms.registration {
        let (t, sid) = w.session_ids(s);
        let r = w.stores[h]
            .tombstone_registration(&t, &sid, grant.epoch)
            .await;
        let ok = grant.epoch.0 >= reg.mark;
        assert_eq!(r.is_ok(), ok, "tombstone h{h} s{s}: {r:?}");
        if ok {
            reg.mark = grant.epoch.0;
            reg.residency = ResidencyState::Released;
            reg.accepting = false;
        }
    }
    w.stores[h]
        .release_residency(&grant)
        .await
        .expect("releasing a residency (superseded or not) succeeds");
    if let Some(l) = &mut ms.lease
        && l.epoch == grant.epoch.0
        && l.holder.as_deref() == Some(grant.holder.as_str())
    {
        l.holder = None;
    }
}

async fn claim(w: &mut World, m: &mut Model, h: usize, s: usize, c: usize) {
    let Some(epoch) = w.views[h].grants.get(&s).map(|g| g.epoch) else {
        return;
    };
    let Some(rec) = w.record(s, c).await else {
        return;
    };
    let token = *w.tokens.entry((s, c, epoch.0)).or_insert_with(Uuid::now_v7);
    let (t, sid) = w.session_ids(s);
    let r = w.stores[h]
        .claim(ClaimRequest {
            tenant: t,
            session: sid,
            command: cid(c),
            epoch,
            token,
            ttl: LONG,
            expected_revision: rec.revision,
        })
        .await;
    let ms = &mut m.sessions[s];
    let refused = ms.residency_refuses(epoch.0, m.now);
    let mc = &mut ms.commands[c];
    let state = mc.state.unwrap_or(CommandState::Pending);
    let replay = state == CommandState::Claimed && mc.claim_epoch == Some(epoch.0);
    let ok =
        replay || (!state.is_terminal() && mc.attempt.is_none() && epoch.0 >= mc.mark && !refused);
    assert_eq!(
        r.is_ok(),
        ok,
        "claim h{h} s{s} c{c} e{}: {r:?} (model {mc:?})",
        epoch.0
    );
    if ok && !replay {
        mc.state = Some(CommandState::Claimed);
        mc.claim_epoch = Some(epoch.0);
        mc.mark = mc.mark.max(epoch.0);
    }
}

async fn begin(w: &mut World, m: &mut Model, h: usize, s: usize, c: usize) {
    let (Some(epoch), Some(journal)) = (
        w.views[h].grants.get(&s).map(|g| g.epoch),
        w.views[h].journals.get(&s).map(|l| l.epoch),
    ) else {
        return;
    };
    let Some(rec) = w.record(s, c).await else {
        return;
    };
    let token = *w.tokens.entry((s, c, epoch.0)).or_insert_with(Uuid::now_v7);
    let attempt = *w
        .attempts
        .entry((s, c, epoch.0))
        .or_insert_with(AttemptId::mint);
    let (t, sid) = w.session_ids(s);
    let r = w.stores[h]
        .begin_attempt(AttemptRequest {
            tenant: t,
            session: sid,
            command: cid(c),
            epoch,
            claim_token: token,
            attempt,
            journal_epoch: journal,
            expected_revision: rec.revision,
        })
        .await;
    let ms = &mut m.sessions[s];
    let refused = ms.residency_refuses(epoch.0, m.now);
    let mc = &mut ms.commands[c];
    let replay = mc.attempt == Some((epoch.0, journal.0));
    let ok = replay
        || (mc.attempt.is_none()
            && mc.state == Some(CommandState::Claimed)
            && mc.claim_epoch == Some(epoch.0)
            && epoch.0 >= mc.mark
            && !refused);
    assert_eq!(
        r.is_ok(),
        ok,
        "begin h{h} s{s} c{c} e{}: {r:?} (model {mc:?})",
        epoch.0
    );
    if ok && !replay {
        mc.state = Some(CommandState::Applying);
        mc.attempt = Some((epoch.0, journal.0));
    }
}

/// The runtime on Host h records command c's disposition: an application (`Some(outcome)`)
/// or a closure (`None`).
async fn record_disposition(
    w: &mut World,
    m: &mut Model,
    h: usize,
    s: usize,
    c: usize,
    outcome: Option<ApplicationOutcome>,
) {
    let Some(lease) = w.views[h].journals.get(&s).cloned() else {
        return;
    };
    let Some(rec) = w.record(s, c).await else {
        return;
    };
    let Some(attempt) = rec.attempt.clone() else {
        return;
    };
    let entry = match outcome {
        Some(outcome) => JournalEntry::Application {
            identity: rec.identity(),
            attempt: attempt.id,
            attempt_epoch: attempt.journal_epoch,
            outcome,
            detail: None,
        },
        None => JournalEntry::Closure {
            identity: rec.identity(),
            attempt: attempt.id,
            attempt_epoch: attempt.journal_epoch,
        },
    };
    let r = w.stores[h].journal_append(&lease, vec![entry]).await;
    let ms = &mut m.sessions[s];
    let current = ms.journal_epoch == lease.epoch.0;
    let epoch_fits = match outcome {
        Some(_) => attempt.journal_epoch == lease.epoch,
        None => attempt.journal_epoch < lease.epoch,
    };
    let mc = &mut ms.commands[c];
    let ok = current && epoch_fits && mc.disposition.is_none();
    assert_eq!(
        r.is_ok(),
        ok,
        "disposition {outcome:?} by h{h} s{s} c{c} under journal epoch {}: {r:?} (model {mc:?})",
        lease.epoch.0
    );
    if let Ok(tip) = r {
        mc.disposition = Some(outcome.map_or(Disposition::NotApplied, |o| o.disposition()));
        if let Some(l) = w.views[h].journals.get_mut(&s) {
            l.tip = tip;
        }
    }
}

async fn settle(w: &mut World, m: &mut Model, h: usize, s: usize, c: usize) {
    let Some(epoch) = w.views[h].grants.get(&s).map(|g| g.epoch) else {
        return;
    };
    let Some(rec) = w.record(s, c).await else {
        return;
    };
    let (t, sid) = w.session_ids(s);
    let r = w.stores[h]
        .settle(SettleRequest {
            tenant: t,
            session: sid,
            command: cid(c),
            epoch,
            expected_revision: rec.revision,
        })
        .await;
    let mc = &mut m.sessions[s].commands[c];
    let settled_before = mc.state.is_some_and(|st| st.is_terminal()) && mc.attempt.is_some();
    let ok = settled_before
        || (mc.state == Some(CommandState::Applying)
            && mc.disposition.is_some()
            && epoch.0 >= mc.mark);
    assert_eq!(
        r.is_ok(),
        ok,
        "settle h{h} s{s} c{c} e{}: {r:?} (model {mc:?})",
        epoch.0
    );
    if ok && !settled_before {
        let d = mc.disposition.expect("settled with a disposition");
        mc.state = Some(d.terminal_state());
        mc.mark = mc.mark.max(epoch.0);
    }
}

async fn reject(w: &mut World, m: &mut Model, h: usize, s: usize, c: usize) {
    let Some(epoch) = w.views[h].grants.get(&s).map(|g| g.epoch) else {
        return;
    };
    let Some(rec) = w.record(s, c).await else {
        return;
    };
    let (t, sid) = w.session_ids(s);
    let r = w.stores[h]
        .reject(RejectRequest {
            tenant: t,
            session: sid,
            command: cid(c),
            epoch,
            reason: "model".into(),
            expected_revision: rec.revision,
        })
        .await;
    let mc = &mut m.sessions[s].commands[c];
    let already = mc.state == Some(CommandState::Rejected) && mc.attempt.is_none();
    let ok = already
        || (!mc.state.is_some_and(|st| st.is_terminal())
            && mc.attempt.is_none()
            && epoch.0 >= mc.mark);
    assert_eq!(
        r.is_ok(),
        ok,
        "reject h{h} s{s} c{c} e{}: {r:?} (model {mc:?})",
        epoch.0
    );
    if ok && !already {
        mc.state = Some(CommandState::Rejected);
        mc.mark = mc.mark.max(epoch.0);
    }
}

/// Host h saves session s's cursor over the commands that ended, in admission order, up to
/// the first that has not.
async fn consume(w: &mut World, m: &mut Model, h: usize, s: usize) {
    let Some(epoch) = w.views[h].grants.get(&s).map(|g| g.epoch) else {
        return;
    };
    let (t, sid) = w.session_ids(s);
    let commands =
        w.ts.store
            .list_commands(&t, &sid, 0, 100)
            .await
            .expect("commands");
    let Some(order) = commands
        .iter()
        .take_while(|r| r.state.is_terminal())
        .last()
        .map(|r| r.accepted_order)
    else {
        return;
    };
    let r = w.stores[h].save_cursor(&t, &sid, order, epoch).await;
    let ms = &mut m.sessions[s];
    let ok = ms.cursor.is_none_or(|(o, e)| epoch.0 >= e && order >= o);
    assert_eq!(
        r.is_ok(),
        ok,
        "cursor of s{s} to {order} by h{h} e{}: {r:?} (model {:?})",
        epoch.0,
        ms.cursor
    );
    if ok {
        let mark = ms.cursor.map_or(epoch.0, |(_, e)| e.max(epoch.0));
        ms.cursor = Some((order, mark));
    }
}

async fn admit(w: &mut World, m: &mut Model, s: usize, c: usize) {
    let (t, sid) = w.session_ids(s);
    w.ts.store
        .admit(NewCommand {
            tenant: t,
            session: sid,
            command: cid(c),
            kind: CommandKind::Input,
            body: CommandBody::Inline(format!("{{\"n\":{c}}}").into_bytes()),
            principal: None,
            metadata: None,
            apply_within: LONG,
            trace: None,
        })
        .await
        .expect("admission always succeeds (idempotent)");
    let ms = &mut m.sessions[s];
    let mc = &mut ms.commands[c];
    if !mc.admitted {
        mc.admitted = true;
        mc.state = Some(CommandState::Pending);
        ms.admitted.push(c);
    }
}

// ---- the run ----------------------------------------------------------------------------------

fn fenced_ok(m: &Model, fence: &RunFence) -> bool {
    m.run
        .as_ref()
        .is_some_and(|r| r.state == RunState::Running && r.epoch == fence.epoch)
}

async fn start_run(w: &mut World, m: &mut Model, h: usize) {
    if m.run.is_some() {
        return;
    }
    let who = holder(h, m.hosts[h].generation);
    let created = w.stores[h]
        .create_run(NewRun {
            run_id: w.run_id.clone(),
            tenant: w.tenant.clone(),
            source: "steps: []\n".into(),
            input: "{}".into(),
            holder: who.clone(),
            fencing_token: Uuid::now_v7().to_string(),
            lease: ttl(),
            idempotency_key: None,
            pins: Vec::new(),
            started_by: None,
            trace: None,
        })
        .await
        .expect("a new run is recorded");
    assert_eq!(created.status.epoch, 1);
    m.run = Some(ModelRun {
        epoch: 1,
        holder: who,
        expires: m.now + TTL_MS,
        state: RunState::Running,
        steps: Vec::new(),
    });
    w.views[h].run = Some(created.status.fence());
}

async fn take_run(w: &mut World, m: &mut Model, h: usize, take_back: bool) {
    let Some(run) = m.run.as_mut() else {
        return;
    };
    let who = holder(h, m.hosts[h].generation);
    let r = w.stores[h]
        .take_run(Takeover {
            run_id: w.run_id.clone(),
            expected_epoch: run.epoch,
            holder: who.clone(),
            fencing_token: Uuid::now_v7().to_string(),
            lease: ttl(),
            rule: if take_back {
                TakeoverRule::HeldByOrExpired(format!("h{h}/"))
            } else {
                TakeoverRule::LeaseExpired
            },
        })
        .await;
    // Gone: its lease ran out, or the registry says its Host's advertisement did.
    let holder_host: usize = holder_host(&run.holder)
        .trim_start_matches('h')
        .parse()
        .expect("a model holder names its Host");
    let host_gone = m.hosts[holder_host]
        .advertised
        .is_some_and(|(_, expires)| expires <= m.now);
    let own = take_back && run.holder.starts_with(&format!("h{h}/"));
    let ok = run.state == RunState::Running && (run.expires <= m.now || host_gone || own);
    assert_eq!(
        r.is_ok(),
        ok,
        "take the run by h{h} at {} (model {run:?}, holder's Host gone: {host_gone}): {r:?}",
        m.now
    );
    if let Ok(status) = r {
        run.epoch += 1;
        run.holder = who;
        run.expires = m.now + TTL_MS;
        assert_eq!(
            status.epoch, run.epoch,
            "a takeover raises the run's epoch by one"
        );
        w.views[h].run = Some(status.fence());
    }
}

async fn renew_run(w: &mut World, m: &mut Model, h: usize) {
    let Some(fence) = w.views[h].run.clone() else {
        return;
    };
    let r = w.stores[h].renew_run(&fence, ttl()).await;
    let ok = fenced_ok(m, &fence);
    assert_eq!(
        r.is_ok(),
        ok,
        "renew the run by h{h} e{}: {r:?}",
        fence.epoch
    );
    if ok && let Some(run) = m.run.as_mut() {
        run.expires = m.now + TTL_MS;
    }
}

async fn release_run(w: &mut World, m: &mut Model, h: usize) {
    let Some(fence) = w.views[h].run.clone() else {
        return;
    };
    let r = w.stores[h].release_run(&fence).await;
    let ok = fenced_ok(m, &fence);
    assert_eq!(
        r.is_ok(),
        ok,
        "release the run by h{h} e{}: {r:?}",
        fence.epoch
    );
    if ok && let Some(run) = m.run.as_mut() {
        run.expires = m.now;
    }
}

async fn step_run(w: &mut World, m: &mut Model, h: usize) {
    let Some(fence) = w.views[h].run.clone() else {
        return;
    };
    w.steps_written += 1;
    let r = w.stores[h]
        .append_run_step(
            &fence,
            NewStepEntry {
                step: format!("step-{}", w.steps_written),
                kind: StepEntryKind::Result,
                attempt: 0,
                outcome: None,
                body: "{}".into(),
                started_at_ms: None,
                consumes: None,
            },
        )
        .await;
    let ok = fenced_ok(m, &fence);
    assert_eq!(
        r.is_ok(),
        ok,
        "a step of the run by h{h} e{}: {r:?}",
        fence.epoch
    );
    if ok && let Some(run) = m.run.as_mut() {
        run.steps.push(fence.epoch);
    }
}

/// How long a Host's advertisement stays in the registry after it expired: 40 s, so it is
/// collected 140 s after its last heartbeat, 20 s from the nearest tick.
const RETENTION_MS: i64 = 40_000;

async fn heartbeat(w: &mut World, m: &mut Model, h: usize) {
    let generation = m.hosts[h].generation;
    let r = w.stores[h]
        .heartbeat(HostHeartbeat {
            advertisement: HostAdvertisement {
                host: host_id(h),
                endpoint: format!("http://127.0.0.1:{}", 9000 + h),
                placement: Placement::Pooled,
                isolation_class: "standard".into(),
                capacity: 8,
                accepting: true,
                generation,
                ttl: ttl(),
            },
            weight_used: 0,
            retention: Duration::from_millis(RETENTION_MS.unsigned_abs()),
        })
        .await;
    let ok = m.hosts[h]
        .advertised
        .is_none_or(|(stored, _)| generation >= stored);
    assert_eq!(r.is_ok(), ok, "heartbeat h{h} g{generation}: {r:?}");
    let Ok(report) = r else {
        return;
    };
    let expires = m.now + TTL_MS;
    let previous = m.hosts[h].beat;
    m.hosts[h].advertised = Some((generation, expires));
    m.hosts[h].beat = Some((generation, expires));
    let mut renewed = Vec::new();
    for (s, ms) in m.sessions.iter_mut().enumerate() {
        if let Some(l) = &mut ms.lease
            && l.host == (h, generation)
            && l.is_live(m.now)
        {
            l.expires = expires;
            renewed.push((w.sessions[s].session.as_str().to_owned(), l.epoch));
        }
        if let Some(reg) = &mut ms.registration
            && reg.host == h
            && reg.generation == generation
            && reg.residency == ResidencyState::Resident
        {
            reg.expires = expires;
        }
    }
    // A beat that carries on an unbroken run reads nothing (every lease the generation held is
    // still its own); one that begins a run reads the leases it carries.
    let unbroken = previous.is_some_and(|(g, e)| g == generation && e > m.now);
    match &report.renewed {
        None => assert!(unbroken, "h{h}'s beat began a run but read no lease"),
        Some(list) => {
            assert!(
                !unbroken,
                "h{h}'s beat carried on a run but read its leases"
            );
            let mut reported: Vec<(String, u64)> = list
                .iter()
                .map(|r| (r.session.as_str().to_owned(), r.epoch.0))
                .collect();
            reported.sort();
            assert_eq!(reported, renewed, "the leases h{h}'s heartbeat renewed");
        }
    }
    let mut collected = 0;
    for (other, mh) in m.hosts.iter_mut().enumerate() {
        if other != h && mh.advertised.is_some_and(|(_, e)| e < m.now - RETENTION_MS) {
            mh.advertised = None;
            mh.beat = None;
            collected += 1;
        }
    }
    assert_eq!(report.collected, collected, "advertisements h{h} collected");
}

async fn advance(w: &mut World, m: &mut Model, ticks: u8) {
    let by = i64::from(ticks) * TICK_MS;
    if m.now + by > TIME_BUDGET_MS {
        return;
    }
    w.ts.advance_instantly(Duration::from_millis(by.unsigned_abs()))
        .await;
    m.now += by;
}

// ---- one step ---------------------------------------------------------------------------------

async fn step(w: &mut World, m: &mut Model, op: &Op) {
    match *op {
        Op::Advertise(h) => advertise(w, m, h, m.hosts[h].generation).await,
        Op::StaleAdvertise(h) => {
            let g = m.hosts[h].generation;
            if g > 1 {
                advertise(w, m, h, g - 1).await;
            }
        }
        Op::Restart(h) => {
            m.hosts[h].generation += 1;
            w.views[h] = HostView::default();
        }
        Op::Acquire(h, s) => acquire(w, m, h, s).await,
        Op::Heartbeat(h) => heartbeat(w, m, h).await,
        Op::TakeBack(h) => take_run(w, m, h, true).await,
        Op::Register(h, s) => register(w, m, h, s).await,
        Op::Release(h, s) => release(w, m, h, s).await,
        Op::Move(from, to, s) => {
            if from == to || !w.views[from].grants.contains_key(&s) {
                return;
            }
            release(w, m, from, s).await;
            acquire(w, m, to, s).await;
            register(w, m, to, s).await;
        }
        Op::Failover(h, s) => {
            advance(w, m, 3).await;
            acquire(w, m, h, s).await;
        }
        Op::Admit(s, c) => admit(w, m, s, c).await,
        Op::Claim(a, s, c) => {
            let c = m.sessions[s].next_command(c, |mc| {
                mc.admitted && mc.attempt.is_none() && !mc.state.is_some_and(|s| s.is_terminal())
            });
            if let Some(h) = w.holder_of(s, a) {
                claim(w, m, h, s, c).await;
            }
        }
        Op::Dispatch(a, s, c) => {
            let c = m.sessions[s].next_command(c, |mc| {
                mc.admitted && mc.attempt.is_none() && !mc.state.is_some_and(|s| s.is_terminal())
            });
            if let Some(h) = w.holder_of(s, a) {
                claim(w, m, h, s, c).await;
                begin(w, m, h, s, c).await;
            }
        }
        Op::Begin(a, s, c) => {
            let c = m.sessions[s].next_command(c, |mc| mc.state == Some(CommandState::Claimed));
            if let Some(h) = w.holder_of(s, a) {
                begin(w, m, h, s, c).await;
            }
        }
        Op::Apply(a, s, c, o) => {
            let c = m.sessions[s]
                .next_command(c, |mc| mc.attempt.is_some() && mc.disposition.is_none());
            if let Some(h) = w.holder_of(s, a) {
                record_disposition(w, m, h, s, c, Some(o)).await;
            }
        }
        Op::Close(a, s, c) => {
            let c = m.sessions[s]
                .next_command(c, |mc| mc.attempt.is_some() && mc.disposition.is_none());
            if let Some(h) = w.holder_of(s, a) {
                record_disposition(w, m, h, s, c, None).await;
            }
        }
        Op::Settle(a, s, c) => {
            let c = m.sessions[s].next_command(c, |mc| {
                mc.disposition.is_some() && mc.state == Some(CommandState::Applying)
            });
            if let Some(h) = w.holder_of(s, a) {
                settle(w, m, h, s, c).await;
            }
        }
        Op::Reject(a, s, c) => {
            let c = m.sessions[s].next_command(c, |mc| {
                mc.admitted && mc.attempt.is_none() && !mc.state.is_some_and(|s| s.is_terminal())
            });
            if let Some(h) = w.holder_of(s, a) {
                reject(w, m, h, s, c).await;
            }
        }
        Op::Consume(a, s) => {
            if let Some(h) = w.holder_of(s, a) {
                consume(w, m, h, s).await;
            }
        }
        Op::StartRun(h) => start_run(w, m, h).await,
        Op::TakeRun(h) => take_run(w, m, h, false).await,
        Op::RenewRun(h) => renew_run(w, m, h).await,
        Op::StepRun(h) => step_run(w, m, h).await,
        Op::ReleaseRun(h) => release_run(w, m, h).await,
        Op::Advance(ticks) => advance(w, m, ticks).await,
    }
}

// ---- what must hold after every step ----------------------------------------------------------

async fn check(w: &mut World, m: &Model, base: i64) {
    // The store's time, against the model's (PostgreSQL's own clock runs on underneath).
    let now = w.ts.store.now_ms().await.expect("the store's time") - base;
    assert!(
        now >= m.now && now < m.now + TICK_MS / 2,
        "the store's time {now} strayed from the model's {}",
        m.now
    );
    // The registry: exactly the Hosts whose advertisement is live, at their generation.
    let mut live: Vec<(String, u64)> =
        w.ts.store
            .targets(true)
            .await
            .expect("targets")
            .into_iter()
            .map(|t| (t.host.as_str().to_owned(), t.generation))
            .collect();
    live.sort();
    let expected: Vec<(String, u64)> = m
        .hosts
        .iter()
        .enumerate()
        .filter_map(|(h, mh)| {
            mh.advertised
                .filter(|(_, expires)| *expires > m.now)
                .map(|(g, _)| (format!("h{h}"), g))
        })
        .collect();
    assert_eq!(live, expected, "the registry's live Hosts");
    for s in 0..SESSIONS {
        check_session(w, m, s).await;
    }
    check_run(w, m).await;
}

async fn check_session(w: &mut World, m: &Model, s: usize) {
    let (t, sid) = w.session_ids(s);
    let ms = &m.sessions[s];
    // At most one holder, and it is the model's.
    let lease = w.ts.store.residency(&t, &sid).await.expect("residency");
    match (&lease, &ms.lease) {
        (None, None) => {}
        (Some(l), Some(ml)) => {
            assert_eq!(l.epoch.0, ml.epoch, "residency epoch of s{s}");
            assert_eq!(l.holder, ml.holder, "residency holder of s{s}");
        }
        _ => panic!("residency of s{s}: {lease:?}, the model has {:?}", ms.lease),
    }
    let holders = w
        .views
        .iter()
        .filter(|v| {
            v.grants.get(&s).is_some_and(|g| {
                ms.lease.as_ref().is_some_and(|l| {
                    l.epoch == g.epoch.0
                        && l.holder.as_deref() == Some(g.holder.as_str())
                        && l.is_live(m.now)
                })
            })
        })
        .count();
    assert!(holders <= 1, "s{s} has {holders} live holders");
    // The registration: the model's route, fenced by the highest epoch that wrote it.
    let reg =
        w.ts.store
            .registration(&t, &sid)
            .await
            .expect("registration");
    match (&reg, &ms.registration) {
        (None, None) => {}
        (Some(r), Some(mr)) => {
            assert_eq!(r.host, host_id(mr.host), "registration host of s{s}");
            assert_eq!(r.lease_epoch.0, mr.mark, "registration mark of s{s}");
            assert_eq!(r.residency, mr.residency, "registration state of s{s}");
            assert_eq!(r.accepting, mr.accepting, "registration accepting of s{s}");
            let store_now = w.ts.store.now_ms().await.expect("the store's time");
            assert_eq!(
                r.expires_at_ms > store_now,
                mr.expires > m.now,
                "registration of s{s} live"
            );
        }
        _ => panic!(
            "registration of s{s}: {reg:?}, the model has {:?}",
            ms.registration
        ),
    }
    // The journal only grows: everything seen before is still there, unchanged.
    let journal = w.journal(s).await;
    let seen = &w.journals[s];
    assert!(
        journal.len() >= seen.len() && journal[..seen.len()] == seen[..],
        "the journal of s{s} lost or changed records"
    );
    let mut dispositions: HashMap<RuntimeCommandId, Vec<DispositionFrame>> = HashMap::new();
    let mut last_epoch = 0;
    for r in &journal {
        assert!(r.epoch.0 >= last_epoch, "journal epochs never decrease");
        last_epoch = r.epoch.0;
        if let Some(f) = r.disposition_frame() {
            dispositions
                .entry(f.identity.runtime_command)
                .or_default()
                .push(f);
        }
    }
    w.journals[s] = journal;
    // Commands: the model's states, in admission order, each settled at most once.
    let listed: Vec<String> =
        w.ts.store
            .list_commands(&t, &sid, 0, 100)
            .await
            .expect("commands")
            .into_iter()
            .map(|r| r.command.as_str().to_owned())
            .collect();
    let admitted: Vec<String> = ms
        .admitted
        .iter()
        .map(|c| cid(*c).as_str().to_owned())
        .collect();
    assert_eq!(listed, admitted, "commands of s{s} in admission order");
    // The cursor is the model's, and never passes a command that has not ended.
    let cursor = w.ts.store.cursor(&t, &sid).await.expect("cursor");
    assert_eq!(
        cursor.map(|c| (c.consumed_order, c.epoch.0)),
        ms.cursor,
        "the cursor of s{s}"
    );
    if let Some((order, _)) = ms.cursor {
        for (k, c) in ms.admitted.iter().enumerate().take(order as usize) {
            assert!(
                ms.commands[*c].state.is_some_and(|st| st.is_terminal()),
                "the cursor of s{s} passed command {c} (admitted {k}th), which has not ended"
            );
        }
    }
    for c in 0..COMMANDS {
        let Some(rec) = w.record(s, c).await else {
            assert!(!ms.commands[c].admitted);
            continue;
        };
        let mc = &ms.commands[c];
        assert_eq!(Some(rec.state), mc.state, "state of s{s} c{c}");
        assert_eq!(rec.epoch_mark.0, mc.mark, "mark of s{s} c{c}");
        match (&rec.attempt, w.seen_attempts.get(&(s, c))) {
            (Some(a), Some(seen)) => assert_eq!(a.id, *seen, "the attempt of s{s} c{c} changed"),
            (Some(a), None) => {
                w.seen_attempts.insert((s, c), a.id);
            }
            (None, Some(_)) => panic!("the attempt of s{s} c{c} vanished"),
            (None, None) => {}
        }
        let frames = dispositions
            .get(&rec.runtime_command)
            .cloned()
            .unwrap_or_default();
        assert!(
            frames.len() <= 1,
            "s{s} c{c} has {} dispositions",
            frames.len()
        );
        if rec.state.is_terminal() && rec.attempt.is_some() {
            let frame = frames.first().expect("a settled command has a disposition");
            assert_eq!(Some(frame.seq), rec.evidence_seq);
            machine::verify_evidence(&rec, frame).expect("settled on matching evidence");
        }
    }
}

async fn check_run(w: &mut World, m: &Model) {
    let Some(run) = &m.run else {
        return;
    };
    let status =
        w.ts.store
            .run_status(Some(&w.tenant), &w.run_id)
            .await
            .expect("run status")
            .expect("the run exists");
    assert_eq!(status.epoch, run.epoch, "the run's epoch");
    assert_eq!(status.holder, run.holder, "the run's holder");
    assert_eq!(status.state, run.state, "the run's state");
    let journal =
        w.ts.store
            .run_journal(&w.run_id)
            .await
            .expect("run journal");
    let epochs: Vec<u64> = journal.iter().map(|e| e.epoch).collect();
    assert_eq!(
        epochs, run.steps,
        "the run's steps, each under the epoch current when it was written"
    );
}

// ---- a case -----------------------------------------------------------------------------------

pub async fn run(backend: TestBackend, ops: Vec<Op>) {
    // Four handles on a server other suites share: a few connections each (the lanes keep
    // their own), not eight.
    let Some(ts) = TestStore::open_with(backend, |o| o.pg_max_connections = 3).await else {
        return;
    };
    let mut stores = Vec::with_capacity(HOSTS);
    for _ in 0..HOSTS {
        stores.push(ts.reopen().await.expect("a Host's own store handle"));
    }
    let tenant = TenantId::new("acme").expect("a tenant");
    let mut sessions = Vec::with_capacity(SESSIONS);
    for s in 0..SESSIONS {
        sessions.push(
            sessionstore::testing::new_session(&ts.store, "acme", &format!("s{s}"), "b").await,
        );
    }
    let base = ts.store.now_ms().await.expect("the store's time");
    let mut model = Model {
        now: 0,
        hosts: vec![
            ModelHost {
                generation: 1,
                advertised: None,
                beat: None,
            };
            HOSTS
        ],
        sessions: vec![
            ModelSession {
                commands: vec![ModelCommand::default(); COMMANDS],
                ..ModelSession::default()
            };
            SESSIONS
        ],
        run: None,
    };
    let mut world = World {
        ts,
        stores,
        views: (0..HOSTS).map(|_| HostView::default()).collect(),
        tenant,
        sessions,
        run_id: RunId::new("run-0").expect("a run id"),
        tokens: HashMap::new(),
        attempts: HashMap::new(),
        journals: vec![Vec::new(); SESSIONS],
        seen_attempts: HashMap::new(),
        steps_written: 0,
    };
    for op in &ops {
        step(&mut world, &mut model, op).await;
        check(&mut world, &model, base).await;
    }
    // One writer at a time: on PostgreSQL every merged statement's checks agreed with the
    // state machine, refusals and replays included, on every Host's handle.
    for (h, s) in world.stores.iter().enumerate() {
        let stats = s.stats();
        assert_eq!(
            (stats.presumptions_undone, stats.presumptions_missed),
            (0, 0),
            "h{h}: merged statements and the state machine disagreed"
        );
        s.close().await;
    }
}
