//! The exactly-once checker against real stores (SQLite and PostgreSQL): command lifecycles
//! driven straight on the store the way a Host and its runtime drive them (claim, attempt,
//! journal application with its user message, settle; a stranded attempt closed under a later
//! journal epoch; a rejection), with the history their client recorded. A clean run reports
//! nothing; each rule is then broken once — by the history, by the store's own API, or where
//! the store refuses to break it, by raw SQL — and the report must name it.

use std::time::Duration;

use sessionstore::testing::{TestStore, begin_attempt, new_session, settle};
use sessionstore::*;
use testkit::checker::{Report, StoreView, ViolationKind, check};
use testkit::history::Recorder;

/// One session, its runtime's journal lease and its client's history.
struct World<'a> {
    ts: &'a TestStore,
    session: SessionRecord,
    lease: JournalLease,
    /// The residency epoch the "Host" writes under.
    residency: ResidencyEpoch,
    history: Recorder,
}

impl<'a> World<'a> {
    async fn new(ts: &'a TestStore) -> World<'a> {
        let name = format!("chk-{}", uuid::Uuid::now_v7().simple());
        let session = new_session(&ts.store, "acme", &name, "build-1").await;
        let lease = ts
            .store
            .journal_acquire(
                &session.tenant,
                session.binding.runtime_session_id,
                "runtime-1",
                Duration::from_secs(600),
            )
            .await
            .unwrap();
        World {
            ts,
            session,
            lease,
            residency: ResidencyEpoch(1),
            history: Recorder::new(Some(42)),
        }
    }

    fn store(&self) -> &Store {
        &self.ts.store
    }

    fn sid(&self) -> &SessionId {
        &self.session.session
    }

    /// Admits an input whose text is `text`, recording the invocation (with `marker`) and its
    /// acknowledgement.
    async fn admit(&self, id: &str, text: &str, marker: Option<&str>) -> CommandRecord {
        let command = CommandId::new(id).unwrap();
        self.history
            .invoke(self.sid(), &command, CommandKind::Input, marker);
        let body = sessionstore::wire::CommandBodyV1::Input { text: text.into() };
        let rec = self
            .store()
            .admit(NewCommand {
                tenant: self.session.tenant.clone(),
                session: self.session.session.clone(),
                command: command.clone(),
                kind: CommandKind::Input,
                body: CommandBody::Inline(sessionstore::wire::encode_command_body(&body)),
                principal: None,
                metadata: None,
                apply_within: Duration::from_secs(600),
                trace: None,
            })
            .await
            .unwrap();
        self.history
            .admitted(self.sid(), &command, rec.accepted_order);
        rec
    }

    async fn append(&mut self, entries: Vec<JournalEntry>) {
        self.lease.tip = self
            .store()
            .journal_append(&self.lease, entries)
            .await
            .unwrap();
    }

    fn user_message(rec: &CommandRecord, text: &str) -> JournalEntry {
        JournalEntry::Event {
            event: EventId::new(uuid::Uuid::now_v7().to_string()).unwrap(),
            public_body: serde_json::json!({
                "type": "user_message",
                "text": text,
                "cause": {"command_id": rec.command.as_str()},
            })
            .to_string()
            .into_bytes(),
            private_body: None,
            cause: Some(rec.runtime_command),
        }
    }

    /// The runtime applies `rec` (its application and, with `text`, its user message in one
    /// append) and the Host settles it; the client observes the outcome.
    async fn apply(&mut self, rec: &CommandRecord, text: Option<&str>) -> CommandRecord {
        let (applying, attempt) =
            begin_attempt(self.store(), rec, self.residency, self.lease.epoch)
                .await
                .unwrap();
        let mut entries = vec![JournalEntry::Application {
            identity: rec.identity(),
            attempt,
            attempt_epoch: self.lease.epoch,
            outcome: ApplicationOutcome::Applied,
            detail: None,
        }];
        if let Some(t) = text {
            entries.push(Self::user_message(rec, t));
        }
        self.append(entries).await;
        let done = settle(self.store(), &applying, self.residency)
            .await
            .unwrap();
        self.history
            .observed(self.sid(), &done.command, done.outcome.unwrap());
        done
    }

    /// An attempt of `rec` stranded by a crash, closed `not_applied` by a successor under a
    /// later journal epoch and a later residency.
    async fn strand_and_close(&mut self, rec: &CommandRecord) -> CommandRecord {
        let (applying, attempt) =
            begin_attempt(self.store(), rec, self.residency, self.lease.epoch)
                .await
                .unwrap();
        self.history
            .fault("kill", "the runtime dies before it records a disposition");
        self.store().journal_release(&self.lease).await.unwrap();
        self.lease = self
            .store()
            .journal_acquire(
                &self.session.tenant,
                self.session.binding.runtime_session_id,
                "runtime-2",
                Duration::from_secs(600),
            )
            .await
            .unwrap();
        self.residency = ResidencyEpoch(self.residency.0 + 1);
        self.append(vec![JournalEntry::Closure {
            identity: rec.identity(),
            attempt,
            attempt_epoch: applying.attempt.as_ref().unwrap().journal_epoch,
        }])
        .await;
        let done = settle(self.store(), &applying, self.residency)
            .await
            .unwrap();
        self.history
            .observed(self.sid(), &done.command, done.outcome.unwrap());
        done
    }

    async fn reject(&self, rec: &CommandRecord) -> CommandRecord {
        let done = self
            .store()
            .reject(RejectRequest {
                tenant: rec.tenant.clone(),
                session: rec.session.clone(),
                command: rec.command.clone(),
                epoch: self.residency,
                reason: "a body no Host could apply".into(),
                expected_revision: rec.revision,
            })
            .await
            .unwrap();
        self.history
            .observed(self.sid(), &done.command, done.outcome.unwrap());
        done
    }

    async fn report(&self) -> Report {
        let view = StoreView::read(self.store(), std::slice::from_ref(&self.session))
            .await
            .unwrap();
        check(&self.history.history(), &view)
    }

    async fn sql(&self, sql: &str) {
        self.ts.exec_raw(sql).await;
    }
}

/// The kinds a report names, each once, sorted.
fn kinds(r: &Report) -> Vec<ViolationKind> {
    let mut k: Vec<ViolationKind> = r.violations.iter().map(|v| v.kind).collect();
    k.sort();
    k.dedup();
    k
}

mod cases {
    use super::*;

    pub async fn a_clean_run_of_applied_closed_resent_and_rejected_commands_has_no_violations(
        ts: &TestStore,
    ) {
        let mut w = World::new(ts).await;
        let c1 = w.admit("c-1", "hello m-1", Some("m-1")).await;
        w.apply(&c1, Some("hello m-1")).await;
        let c2 = w.admit("c-2", "again m-2", Some("m-2")).await;
        assert_eq!(
            w.strand_and_close(&c2).await.outcome,
            Some(Outcome::NotApplied)
        );
        // The controller resends the payload under a new id: the marker applies once.
        let c3 = w.admit("c-2-resent", "again m-2", Some("m-2")).await;
        w.apply(&c3, Some("again m-2")).await;
        let c4 = w.admit("c-4", "bad", None).await;
        assert_eq!(w.reject(&c4).await.outcome, Some(Outcome::Rejected));
        let report = w.report().await;
        report.assert_clean();
        assert_eq!(report.summary.admitted, 4);
        assert_eq!(report.summary.by_outcome["applied"], 2);
        assert_eq!(report.summary.by_outcome["not_applied"], 1);
        assert_eq!(report.summary.by_outcome["rejected"], 1);
        assert_eq!(report.summary.faults["kill"], 1);
        assert!(report.to_string().contains("no violations"), "{report}");
    }

    pub async fn an_acknowledged_admission_the_store_lacks_is_reported_lost(ts: &TestStore) {
        let w = World::new(ts).await;
        let ghost = CommandId::new("ghost").unwrap();
        w.history.invoke(w.sid(), &ghost, CommandKind::Input, None);
        w.history.admitted(w.sid(), &ghost, 1);
        // An uncertain admission that never landed is not a loss.
        let maybe = CommandId::new("maybe").unwrap();
        w.history.invoke(w.sid(), &maybe, CommandKind::Input, None);
        w.history.uncertain(w.sid(), &maybe, "the link was cut");
        let report = w.report().await;
        assert_eq!(kinds(&report), [ViolationKind::Lost], "{report}");
        assert_eq!(report.violations[0].command, Some(ghost));
    }

    pub async fn a_command_that_never_ended_is_reported_wedged(ts: &TestStore) {
        let w = World::new(ts).await;
        w.admit("pending", "stuck", None).await;
        let report = w.report().await;
        assert_eq!(kinds(&report), [ViolationKind::Wedged], "{report}");
        assert!(
            report.violations[0]
                .evidence
                .contains("before its apply deadline")
        );
    }

    pub async fn an_effect_of_a_command_that_did_not_apply_is_reported(ts: &TestStore) {
        let mut w = World::new(ts).await;
        let c = w.admit("c-1", "ghost m-9", Some("m-9")).await;
        w.strand_and_close(&c).await;
        // A user message caused by the closed command, carrying its marker.
        let m = World::user_message(&c, "ghost m-9");
        w.append(vec![m]).await;
        let report = w.report().await;
        assert_eq!(
            kinds(&report),
            [ViolationKind::EffectNotApplied],
            "{report}"
        );
        assert_eq!(
            report.violations.len(),
            2,
            "the caused record and the marker: {report}"
        );
    }

    pub async fn an_outcome_a_client_saw_that_the_store_contradicts_is_reported(ts: &TestStore) {
        let mut w = World::new(ts).await;
        let c = w.admit("c-1", "x", None).await;
        w.strand_and_close(&c).await;
        w.history.observed(w.sid(), &c.command, Outcome::Applied);
        let report = w.report().await;
        assert_eq!(
            kinds(&report),
            [ViolationKind::ObservationContradicted],
            "{report}"
        );
    }

    pub async fn a_marker_applied_by_two_commands_is_reported_twice(ts: &TestStore) {
        let mut w = World::new(ts).await;
        let a = w.admit("c-1", "pay m-5", Some("m-5")).await;
        w.apply(&a, Some("pay m-5")).await;
        // Resent under a new id while the first was not known to have failed: applied again.
        let b = w.admit("c-1-resent", "pay m-5", Some("m-5")).await;
        w.apply(&b, Some("pay m-5")).await;
        let report = w.report().await;
        assert_eq!(
            kinds(&report),
            [ViolationKind::MarkerAppliedTwice],
            "{report}"
        );
    }

    pub async fn an_applied_input_whose_marker_the_journal_lacks_is_reported_missing(
        ts: &TestStore,
    ) {
        let mut w = World::new(ts).await;
        let c = w.admit("c-1", "said m-3", Some("m-3")).await;
        w.apply(&c, None).await;
        let report = w.report().await;
        assert_eq!(kinds(&report), [ViolationKind::MarkerMissing], "{report}");
    }

    pub async fn commands_applied_out_of_acceptance_order_are_reported(ts: &TestStore) {
        let mut w = World::new(ts).await;
        let a = w.admit("first", "a", None).await;
        let b = w.admit("second", "b", None).await;
        w.apply(&b, None).await;
        w.apply(&a, None).await;
        let report = w.report().await;
        assert_eq!(kinds(&report), [ViolationKind::OutOfOrder], "{report}");
        assert_eq!(
            report.violations[0].command,
            Some(CommandId::new("second").unwrap())
        );
    }

    pub async fn a_command_accepted_before_one_its_client_saw_acknowledged_first_is_reported(
        ts: &TestStore,
    ) {
        let w = World::new(ts).await;
        // The store accepts "late" first; the history says "early" was acknowledged before
        // "late" was even invoked.
        let late = w.admit("late", "l", None).await;
        let early = w.admit("early", "e", None).await;
        let history = Recorder::new(Some(7));
        let (e, l) = (early.command.clone(), late.command.clone());
        history.invoke(w.sid(), &e, CommandKind::Input, None);
        history.admitted(w.sid(), &e, early.accepted_order);
        history.invoke(w.sid(), &l, CommandKind::Input, None);
        history.admitted(w.sid(), &l, late.accepted_order);
        let view = StoreView::read(w.store(), std::slice::from_ref(&w.session))
            .await
            .unwrap();
        let report = check(&history.history(), &view);
        let order: Vec<_> = report
            .violations
            .iter()
            .filter(|v| v.kind == ViolationKind::OutOfOrder)
            .collect();
        assert_eq!(order.len(), 1, "{report}");
        assert_eq!(order[0].command, Some(l));
    }

    pub async fn an_outcome_its_evidence_does_not_prove_is_reported(ts: &TestStore) {
        let mut w = World::new(ts).await;
        let c = w.admit("c-1", "x", None).await;
        w.apply(&c, None).await;
        w.sql(&format!(
            "UPDATE commands SET outcome = 'no_op' WHERE command_id = '{}'",
            c.command
        ))
        .await;
        let report = w.report().await;
        // The client saw `applied`, too.
        assert_eq!(
            kinds(&report),
            [
                ViolationKind::EvidenceMismatch,
                ViolationKind::ObservationContradicted
            ],
            "{report}"
        );
    }

    pub async fn a_second_disposition_and_one_for_an_unknown_command_are_reported(ts: &TestStore) {
        let mut w = World::new(ts).await;
        let c = w.admit("c-1", "x", None).await;
        w.apply(&c, None).await;
        // The store's own guard refuses a second disposition: only a store that lost it
        // could hold one.
        w.sql("DROP INDEX journal_one_disposition_per_command")
            .await;
        let rs = w.session.binding.runtime_session_id.to_text();
        let copy = "runtime_session_id, seq, kind, journal_epoch, written_at, command_id, \
                    runtime_command_id, command_kind, attempt_id, attempt_journal_epoch, outcome";
        w.sql(&format!(
            "INSERT INTO journal_records ({copy}) SELECT runtime_session_id, seq + 100, kind, \
             journal_epoch, written_at, command_id, runtime_command_id, command_kind, attempt_id, \
             attempt_journal_epoch, outcome FROM journal_records \
             WHERE runtime_session_id = '{rs}' AND kind = 'application'"
        ))
        .await;
        w.sql(&format!(
            "INSERT INTO journal_records ({copy}) SELECT runtime_session_id, seq + 200, kind, \
             journal_epoch, written_at, 'stranger', '{}', command_kind, attempt_id, \
             attempt_journal_epoch, outcome FROM journal_records \
             WHERE runtime_session_id = '{rs}' AND kind = 'application' AND seq < 100",
            RuntimeCommandId::mint().to_text()
        ))
        .await;
        let report = w.report().await;
        assert_eq!(
            kinds(&report),
            [
                ViolationKind::DuplicateDisposition,
                ViolationKind::OrphanEvidence
            ],
            "{report}"
        );
    }

    pub async fn a_report_names_the_seed_the_violation_and_the_offending_sessions_history(
        ts: &TestStore,
    ) {
        let mut w = World::new(ts).await;
        let a = w.admit("c-1", "pay m-5", Some("m-5")).await;
        w.apply(&a, Some("pay m-5")).await;
        let b = w.admit("c-1-resent", "pay m-5", Some("m-5")).await;
        w.apply(&b, Some("pay m-5")).await;
        w.history.fault("cut", "every link to PostgreSQL");
        // A second, clean session is not printed.
        let other = World::new(ts).await;
        let view = StoreView::read(w.store(), &[w.session.clone(), other.session.clone()])
            .await
            .unwrap();
        let text = check(&w.history.history(), &view).to_string();
        for expected in [
            "exactly-once check, seed 42",
            "replay with --seed 42",
            "marker_applied_twice",
            &format!("== session {}", w.sid()),
            "invoke input c-1-resent marker m-5",
            "FAULT cut: every link to PostgreSQL",
            "application c-1 applied",
            "clients: 2 admitted",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
        assert!(
            !text.contains(&format!("== session {}", other.sid())),
            "{text}"
        );
    }

    pub async fn a_marker_inside_another_is_refused_as_a_bad_history(ts: &TestStore) {
        let mut w = World::new(ts).await;
        let a = w.admit("c-1", "m-1", Some("m-1")).await;
        w.apply(&a, Some("m-1")).await;
        let b = w.admit("c-2", "m-10", Some("m-10")).await;
        w.apply(&b, Some("m-10")).await;
        let report = w.report().await;
        assert!(
            kinds(&report).contains(&ViolationKind::BadHistory),
            "{report}"
        );
    }
}

sessionstore::both_backends!(cases =>
    a_clean_run_of_applied_closed_resent_and_rejected_commands_has_no_violations,
    an_acknowledged_admission_the_store_lacks_is_reported_lost,
    a_command_that_never_ended_is_reported_wedged,
    an_effect_of_a_command_that_did_not_apply_is_reported,
    an_outcome_a_client_saw_that_the_store_contradicts_is_reported,
    a_marker_applied_by_two_commands_is_reported_twice,
    an_applied_input_whose_marker_the_journal_lacks_is_reported_missing,
    commands_applied_out_of_acceptance_order_are_reported,
    a_command_accepted_before_one_its_client_saw_acknowledged_first_is_reported,
    an_outcome_its_evidence_does_not_prove_is_reported,
    a_second_disposition_and_one_for_an_unknown_command_are_reported,
    a_report_names_the_seed_the_violation_and_the_offending_sessions_history,
    a_marker_inside_another_is_refused_as_a_bad_history,
);
