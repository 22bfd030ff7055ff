//! Property test: random operation sequences from two competing residencies (A at residency
//! epoch 1 with the first journal lease; B at epoch 2, whose runtime may take the journal lease
//! over) are driven against the store and against a small reference model. After every step
//! the store must agree with the model, and the invariants must hold: at most one attempt per
//! command, no terminal state without verified evidence in the journal, at most one
//! disposition per command, and epochs that never decrease. And the merged statements of the
//! PostgreSQL hot path must never presume a write the state machine does not make, nor miss one
//! it does.
//!
//! Then the same grown to a fleet (`model/fleet.rs`): three Hosts, two sessions and a run, with
//! residency leases that expire, renew and move under a paused clock, the Host registry, warm
//! release and restore, and run takeovers.
//!
//! Case counts: a bounded number per test by default (the whole file stays within about a
//! minute per backend on a busy machine); `HOST_MODEL_CASES=N` runs N cases in every test
//! instead (the long mode: e.g. `HOST_MODEL_CASES=100000 cargo test -p sessionstore --test
//! model --release`). Proptest shrinks a failing case to a short sequence of steps and records
//! its seed in `model.proptest-regressions`, which later runs replay first.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use sessionstore::testing::{TestBackend, TestStore};
use sessionstore::*;
use uuid::Uuid;

#[path = "model/fleet.rs"]
mod fleet;

/// The number of cases a test runs: `HOST_MODEL_CASES` when set (the long mode), else
/// `bounded`.
fn cases(bounded: u32) -> u32 {
    std::env::var("HOST_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(bounded)
}

const COMMANDS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Who {
    A,
    B,
}

impl Who {
    fn epoch(self) -> u64 {
        match self {
            Who::A => 1,
            Who::B => 2,
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Admit(usize),
    Claim(Who, usize),
    Begin(Who, usize),
    Apply(Who, usize, ApplicationOutcome),
    Close(Who, usize),
    Settle(Who, usize),
    Reject(Who, usize),
    TakeOverJournal,
}

fn who() -> impl Strategy<Value = Who> {
    prop_oneof![Just(Who::A), Just(Who::B)]
}

fn outcome() -> impl Strategy<Value = ApplicationOutcome> {
    prop_oneof![
        Just(ApplicationOutcome::Applied),
        Just(ApplicationOutcome::NoOp),
        Just(ApplicationOutcome::Refused)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..COMMANDS;
    prop_oneof![
        2 => c.clone().prop_map(Op::Admit),
        3 => (who(), c.clone()).prop_map(|(w, c)| Op::Claim(w, c)),
        3 => (who(), c.clone()).prop_map(|(w, c)| Op::Begin(w, c)),
        3 => (who(), c.clone(), outcome()).prop_map(|(w, c, o)| Op::Apply(w, c, o)),
        2 => (who(), c.clone()).prop_map(|(w, c)| Op::Close(w, c)),
        3 => (who(), c.clone()).prop_map(|(w, c)| Op::Settle(w, c)),
        1 => (who(), c.clone()).prop_map(|(w, c)| Op::Reject(w, c)),
        1 => Just(Op::TakeOverJournal),
    ]
}

/// What the model believes about one command.
#[derive(Clone, Debug, Default)]
struct ModelCommand {
    admitted: bool,
    state: Option<CommandState>,
    mark: u64,
    claim_epoch: Option<u64>,
    attempt: Option<(Who, AttemptId, u64)>,
    disposition: Option<Disposition>,
}

struct Model {
    commands: Vec<ModelCommand>,
    /// The journal epoch each residency's runtime writes under (B has none until it takes over).
    journal: HashMap<Who, u64>,
    current_journal_epoch: u64,
}

struct World {
    ts: TestStore,
    session: SessionRecord,
    leases: HashMap<Who, JournalLease>,
    tokens: HashMap<(Who, usize), Uuid>,
    attempts: HashMap<(Who, usize), AttemptId>,
    seen_attempts: HashMap<usize, AttemptId>,
    seen_marks: HashMap<usize, u64>,
}

fn cid(i: usize) -> CommandId {
    CommandId::new(format!("cmd-{i}")).unwrap()
}

impl World {
    async fn record(&self, i: usize) -> Option<CommandRecord> {
        match self
            .ts
            .store
            .command(&self.session.tenant, &self.session.session, &cid(i))
            .await
        {
            Ok(r) => Some(r),
            Err(e) if e.code() == ErrorCode::NotFound => None,
            Err(e) => panic!("reading command {i}: {e}"),
        }
    }
}

async fn step(w: &mut World, m: &mut Model, op: &Op) {
    let t = w.session.tenant.clone();
    let s = w.session.session.clone();
    match *op {
        Op::Admit(i) => {
            let r =
                w.ts.store
                    .admit(NewCommand {
                        tenant: t,
                        session: s,
                        command: cid(i),
                        kind: CommandKind::Input,
                        body: CommandBody::Inline(format!("{{\"n\":{i}}}").into_bytes()),
                        principal: None,
                        metadata: None,
                        apply_within: Duration::from_secs(3600),
                        trace: None,
                    })
                    .await;
            r.expect("admission always succeeds (idempotent)");
            let c = &mut m.commands[i];
            if !c.admitted {
                c.admitted = true;
                c.state = Some(CommandState::Pending);
            }
        }
        Op::Claim(who, i) => {
            let Some(rec) = w.record(i).await else { return };
            let token = *w.tokens.entry((who, i)).or_insert_with(Uuid::now_v7);
            let r =
                w.ts.store
                    .claim(ClaimRequest {
                        tenant: t,
                        session: s,
                        command: cid(i),
                        epoch: ResidencyEpoch(who.epoch()),
                        token,
                        ttl: Duration::from_secs(600),
                        expected_revision: rec.revision,
                    })
                    .await;
            let c = &mut m.commands[i];
            let state = c.state.unwrap_or(CommandState::Pending);
            let replay = state == CommandState::Claimed && c.claim_epoch == Some(who.epoch());
            let ok =
                replay || (!state.is_terminal() && c.attempt.is_none() && who.epoch() >= c.mark);
            assert_eq!(
                r.is_ok(),
                ok,
                "claim by {who:?} of {i}: {r:?} (model {c:?})"
            );
            if ok && !replay {
                c.state = Some(CommandState::Claimed);
                c.claim_epoch = Some(who.epoch());
                c.mark = c.mark.max(who.epoch());
            }
        }
        Op::Begin(who, i) => {
            let Some(rec) = w.record(i).await else { return };
            let Some(journal_epoch) = m.journal.get(&who).copied() else {
                return;
            };
            let token = *w.tokens.entry((who, i)).or_insert_with(Uuid::now_v7);
            let attempt = *w.attempts.entry((who, i)).or_insert_with(AttemptId::mint);
            let r =
                w.ts.store
                    .begin_attempt(AttemptRequest {
                        tenant: t,
                        session: s,
                        command: cid(i),
                        epoch: ResidencyEpoch(who.epoch()),
                        claim_token: token,
                        attempt,
                        journal_epoch: JournalEpoch(journal_epoch),
                        expected_revision: rec.revision,
                    })
                    .await;
            let c = &mut m.commands[i];
            let replay = c
                .attempt
                .is_some_and(|(w2, a, e)| w2 == who && a == attempt && e == journal_epoch);
            let ok = replay
                || (c.state == Some(CommandState::Claimed)
                    && c.claim_epoch == Some(who.epoch())
                    && who.epoch() >= c.mark);
            assert_eq!(
                r.is_ok(),
                ok,
                "begin by {who:?} of {i}: {r:?} (model {c:?})"
            );
            if ok && !replay {
                c.state = Some(CommandState::Applying);
                c.attempt = Some((who, attempt, journal_epoch));
            }
        }
        Op::Apply(who, i, outcome) => {
            let Some(rec) = w.record(i).await else { return };
            let Some(lease) = w.leases.get(&who).cloned() else {
                return;
            };
            let Some(attempt) = rec.attempt.clone() else {
                return;
            };
            let r =
                w.ts.store
                    .journal_append(
                        &lease,
                        vec![JournalEntry::Application {
                            identity: rec.identity(),
                            attempt: attempt.id,
                            attempt_epoch: attempt.journal_epoch,
                            outcome,
                            detail: None,
                        }],
                    )
                    .await;
            let c = &mut m.commands[i];
            let current = m.current_journal_epoch == lease.epoch.0;
            let ok = current && attempt.journal_epoch == lease.epoch && c.disposition.is_none();
            assert_eq!(
                r.is_ok(),
                ok,
                "apply by {who:?} of {i}: {r:?} (model {c:?})"
            );
            if let Ok(tip) = r {
                c.disposition = Some(outcome.disposition());
                if let Some(l) = w.leases.get_mut(&who) {
                    l.tip = tip;
                }
            }
        }
        Op::Close(who, i) => {
            let Some(rec) = w.record(i).await else { return };
            let Some(lease) = w.leases.get(&who).cloned() else {
                return;
            };
            let Some(attempt) = rec.attempt.clone() else {
                return;
            };
            let r =
                w.ts.store
                    .journal_append(
                        &lease,
                        vec![JournalEntry::Closure {
                            identity: rec.identity(),
                            attempt: attempt.id,
                            attempt_epoch: attempt.journal_epoch,
                        }],
                    )
                    .await;
            let c = &mut m.commands[i];
            let current = m.current_journal_epoch == lease.epoch.0;
            let ok = current && attempt.journal_epoch < lease.epoch && c.disposition.is_none();
            assert_eq!(
                r.is_ok(),
                ok,
                "close by {who:?} of {i}: {r:?} (model {c:?})"
            );
            if let Ok(tip) = r {
                c.disposition = Some(Disposition::NotApplied);
                if let Some(l) = w.leases.get_mut(&who) {
                    l.tip = tip;
                }
            }
        }
        Op::Settle(who, i) => {
            let Some(rec) = w.record(i).await else { return };
            let r =
                w.ts.store
                    .settle(SettleRequest {
                        tenant: t,
                        session: s,
                        command: cid(i),
                        epoch: ResidencyEpoch(who.epoch()),
                        expected_revision: rec.revision,
                    })
                    .await;
            let c = &mut m.commands[i];
            let settled_before = c.state.is_some_and(|st| st.is_terminal()) && c.attempt.is_some();
            let ok = settled_before
                || (c.state == Some(CommandState::Applying)
                    && c.disposition.is_some()
                    && who.epoch() >= c.mark);
            assert_eq!(
                r.is_ok(),
                ok,
                "settle by {who:?} of {i}: {r:?} (model {c:?})"
            );
            if ok && !settled_before {
                let d = c.disposition.expect("settled with a disposition");
                c.state = Some(d.terminal_state());
                c.mark = c.mark.max(who.epoch());
            }
        }
        Op::Reject(who, i) => {
            let Some(rec) = w.record(i).await else { return };
            let r =
                w.ts.store
                    .reject(RejectRequest {
                        tenant: t,
                        session: s,
                        command: cid(i),
                        epoch: ResidencyEpoch(who.epoch()),
                        reason: "model".into(),
                        expected_revision: rec.revision,
                    })
                    .await;
            let c = &mut m.commands[i];
            let already = c.state == Some(CommandState::Rejected) && c.attempt.is_none();
            let ok = already
                || (!c.state.is_some_and(|st| st.is_terminal())
                    && c.attempt.is_none()
                    && who.epoch() >= c.mark);
            assert_eq!(
                r.is_ok(),
                ok,
                "reject by {who:?} of {i}: {r:?} (model {c:?})"
            );
            if ok && !already {
                c.state = Some(CommandState::Rejected);
                c.mark = c.mark.max(who.epoch());
            }
        }
        Op::TakeOverJournal => {
            let lease =
                w.ts.store
                    .journal_acquire(
                        &t,
                        w.session.binding.runtime_session_id,
                        "runtime-b",
                        Duration::from_secs(600),
                    )
                    .await
                    .expect("a journal lease can always be taken over");
            assert!(
                lease.epoch.0 > m.current_journal_epoch,
                "journal epochs increase"
            );
            m.current_journal_epoch = lease.epoch.0;
            m.journal.insert(Who::B, lease.epoch.0);
            w.leases.insert(Who::B, lease);
        }
    }
}

async fn check_invariants(w: &mut World, m: &Model) {
    let t = &w.session.tenant;
    let rs = w.session.binding.runtime_session_id;
    let journal =
        w.ts.store
            .journal_runtime_page(t, rs, 0, 1000)
            .await
            .unwrap();
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
    for i in 0..COMMANDS {
        let Some(rec) = w.record(i).await else {
            assert!(!m.commands[i].admitted);
            continue;
        };
        let c = &m.commands[i];
        assert_eq!(Some(rec.state), c.state, "state of command {i}");
        assert_eq!(rec.epoch_mark.0, c.mark, "mark of command {i}");
        // Epoch marks never decrease.
        let prev = w.seen_marks.insert(i, rec.epoch_mark.0).unwrap_or(0);
        assert!(rec.epoch_mark.0 >= prev, "mark of command {i} decreased");
        // At most one attempt per command: once recorded it never changes.
        if let Some(a) = &rec.attempt {
            if let Some(seen) = w.seen_attempts.insert(i, a.id) {
                assert_eq!(seen, a.id, "attempt of command {i} changed");
            }
        } else {
            assert!(
                !w.seen_attempts.contains_key(&i),
                "attempt of command {i} vanished"
            );
        }
        // At most one disposition per command in the journal.
        let frames = dispositions
            .get(&rec.runtime_command)
            .cloned()
            .unwrap_or_default();
        assert!(
            frames.len() <= 1,
            "command {i} has {} dispositions",
            frames.len()
        );
        // No terminal state with an attempt without verified evidence.
        if rec.state.is_terminal() && rec.attempt.is_some() {
            let frame = frames.first().expect("a settled command has a disposition");
            assert_eq!(Some(frame.seq), rec.evidence_seq);
            assert_eq!(Some(frame.disposition.outcome()), rec.outcome);
            machine::verify_evidence(&rec, frame).expect("settled on matching evidence");
        }
    }
}

async fn run(backend: TestBackend, ops: Vec<Op>) {
    let Some(ts) = TestStore::open(backend).await else {
        return;
    };
    let tenant = TenantId::new("acme").unwrap();
    let session = ts
        .store
        .create_session(NewSession {
            tenant: tenant.clone(),
            session: SessionId::new("s").unwrap(),
            agent: AgentId::new("a").unwrap(),
            compatibility: CompatibilityId::new("b").unwrap(),
            binding: SessionBinding {
                runtime_session_id: RuntimeSessionId::mint(),
                storage_binding_id: local_binding(),
                binding_version: 1,
            },
        })
        .await
        .unwrap();
    let lease_a = ts
        .store
        .journal_acquire(
            &tenant,
            session.binding.runtime_session_id,
            "runtime-a",
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let mut model = Model {
        commands: vec![ModelCommand::default(); COMMANDS],
        journal: HashMap::from([(Who::A, lease_a.epoch.0)]),
        current_journal_epoch: lease_a.epoch.0,
    };
    let mut world = World {
        ts,
        session,
        leases: HashMap::from([(Who::A, lease_a)]),
        tokens: HashMap::new(),
        attempts: HashMap::new(),
        seen_attempts: HashMap::new(),
        seen_marks: HashMap::new(),
    };
    for op in &ops {
        step(&mut world, &mut model, op).await;
        check_invariants(&mut world, &model).await;
    }
    // One writer at a time: every merged statement's checks agreed with the state machine,
    // refusals and replays included (nothing presumed had to be undone or written again).
    let stats = world.ts.store.stats();
    assert_eq!(
        (stats.presumptions_undone, stats.presumptions_missed),
        (0, 0),
        "merged statements and the state machine disagreed"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    #[test]
    fn two_competing_residencies_on_sqlite_never_break_the_invariants(ops in proptest::collection::vec(op(), 1..40)) {
        runtime().block_on(run(TestBackend::Sqlite, ops));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(16), ..ProptestConfig::default() })]

    #[test]
    fn two_competing_residencies_on_postgres_never_break_the_invariants(ops in proptest::collection::vec(op(), 1..40)) {
        runtime().block_on(run(TestBackend::Postgres, ops));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), ..ProptestConfig::default() })]

    #[test]
    fn a_fleet_of_three_hosts_on_sqlite_does_what_the_model_says_at_every_step(ops in proptest::collection::vec(fleet::op(), 1..60)) {
        runtime().block_on(fleet::run(TestBackend::Sqlite, ops));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(12), ..ProptestConfig::default() })]

    #[test]
    fn a_fleet_of_three_hosts_on_postgres_does_what_the_model_says_at_every_step(ops in proptest::collection::vec(fleet::op(), 1..60)) {
        runtime().block_on(fleet::run(TestBackend::Postgres, ops));
    }
}
