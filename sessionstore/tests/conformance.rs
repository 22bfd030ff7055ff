//! The store's conformance suite: every case runs against SQLite and PostgreSQL.

mod cases {
    use std::time::Duration;

    use sessionstore::testing::{self, TestBackend, TestStore};
    use sessionstore::*;
    use uuid::Uuid;

    const TTL: Duration = Duration::from_secs(30);

    fn tenant() -> TenantId {
        TenantId::new("acme").unwrap()
    }

    async fn new_session(ts: &TestStore, name: &str) -> SessionRecord {
        ts.store
            .create_session(NewSession {
                tenant: tenant(),
                session: SessionId::new(name).unwrap(),
                agent: AgentId::new("assistant").unwrap(),
                compatibility: CompatibilityId::new("build-1").unwrap(),
                binding: SessionBinding {
                    runtime_session_id: RuntimeSessionId::mint(),
                    storage_binding_id: local_binding(),
                    binding_version: 1,
                },
            })
            .await
            .unwrap()
    }

    fn new_command(s: &SessionRecord, id: &str, kind: CommandKind, body: &[u8]) -> NewCommand {
        NewCommand {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            command: CommandId::new(id).unwrap(),
            kind,
            body: CommandBody::Inline(body.to_vec()),
            principal: Some("user:1".into()),
            metadata: Some("{\"a\":1}".into()),
            apply_within: Duration::from_secs(3600),
            trace: None,
        }
    }

    async fn admit(ts: &TestStore, s: &SessionRecord, id: &str) -> CommandRecord {
        ts.store
            .admit(new_command(s, id, CommandKind::Input, b"{\"text\":\"hi\"}"))
            .await
            .unwrap()
    }

    fn claim_req(rec: &CommandRecord, epoch: u64, token: Uuid) -> ClaimRequest {
        ClaimRequest {
            tenant: rec.tenant.clone(),
            session: rec.session.clone(),
            command: rec.command.clone(),
            epoch: ResidencyEpoch(epoch),
            token,
            ttl: TTL,
            expected_revision: rec.revision,
        }
    }

    fn attempt_req(
        rec: &CommandRecord,
        epoch: u64,
        token: Uuid,
        journal: JournalEpoch,
    ) -> AttemptRequest {
        AttemptRequest {
            tenant: rec.tenant.clone(),
            session: rec.session.clone(),
            command: rec.command.clone(),
            epoch: ResidencyEpoch(epoch),
            claim_token: token,
            attempt: AttemptId::mint(),
            journal_epoch: journal,
            expected_revision: rec.revision,
        }
    }

    fn settle_req(rec: &CommandRecord, epoch: u64) -> SettleRequest {
        SettleRequest {
            tenant: rec.tenant.clone(),
            session: rec.session.clone(),
            command: rec.command.clone(),
            epoch: ResidencyEpoch(epoch),
            expected_revision: rec.revision,
        }
    }

    async fn journal(ts: &TestStore, s: &SessionRecord, holder: &str) -> JournalLease {
        ts.store
            .journal_acquire(&s.tenant, s.binding.runtime_session_id, holder, TTL)
            .await
            .unwrap()
    }

    async fn append(
        ts: &TestStore,
        lease: &mut JournalLease,
        entries: Vec<JournalEntry>,
    ) -> StoreResult<u64> {
        let tip = ts.store.journal_append(lease, entries).await?;
        lease.tip = tip;
        Ok(tip)
    }

    /// Claims and begins an attempt under residency `epoch` and the given journal lease.
    async fn to_applying(
        ts: &TestStore,
        rec: &CommandRecord,
        epoch: u64,
        lease: &JournalLease,
    ) -> CommandRecord {
        let token = Uuid::now_v7();
        let claimed = ts.store.claim(claim_req(rec, epoch, token)).await.unwrap();
        ts.store
            .begin_attempt(attempt_req(&claimed, epoch, token, lease.epoch))
            .await
            .unwrap()
    }

    async fn apply_in_journal(
        ts: &TestStore,
        lease: &mut JournalLease,
        rec: &CommandRecord,
        outcome: ApplicationOutcome,
    ) -> u64 {
        let attempt = rec.attempt.clone().unwrap();
        append(
            ts,
            lease,
            vec![JournalEntry::Application {
                identity: rec.identity(),
                attempt: attempt.id,
                attempt_epoch: attempt.journal_epoch,
                outcome,
                detail: None,
            }],
        )
        .await
        .unwrap()
    }

    fn code<T: std::fmt::Debug>(r: StoreResult<T>) -> &'static str {
        r.unwrap_err().code().as_str()
    }

    // ---- sessions ---------------------------------------------------------------------------

    pub async fn a_session_is_created_once_and_its_binding_is_immutable(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let again = ts
            .store
            .create_session(NewSession {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                agent: s.agent.clone(),
                compatibility: s.compatibility.clone(),
                binding: s.binding.clone(),
            })
            .await
            .unwrap();
        assert_eq!(again.binding, s.binding);
        let mut other = s.binding.clone();
        other.runtime_session_id = RuntimeSessionId::mint();
        let err = ts
            .store
            .create_session(NewSession {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                agent: s.agent.clone(),
                compatibility: s.compatibility.clone(),
                binding: other,
            })
            .await
            .unwrap_err();
        assert_eq!(err, StoreError::CommandMismatch { field: "binding" });
        assert_eq!(
            ts.store
                .session(&s.tenant, &s.session)
                .await
                .unwrap()
                .binding,
            s.binding
        );
    }

    pub async fn another_tenant_never_sees_a_session(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let other = TenantId::new("globex").unwrap();
        assert_eq!(
            code(ts.store.session(&other, &s.session).await),
            "not_found"
        );
        assert!(
            ts.store
                .list_sessions(&other, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            ts.store
                .list_sessions(&s.tenant, None, 10)
                .await
                .unwrap()
                .len(),
            1
        );
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.tenant = other;
        assert_eq!(code(ts.store.admit(c).await), "not_found");
    }

    // ---- admission --------------------------------------------------------------------------

    pub async fn admitting_to_a_session_that_is_not_bound_is_not_found(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.session = SessionId::new("nobody").unwrap();
        assert_eq!(code(ts.store.admit(c).await), "not_found");
    }

    pub async fn admission_is_idempotent_by_command_id(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let c = new_command(&s, "c1", CommandKind::Input, b"{\"text\":\"hi\"}");
        let (first, created) = ts.store.admit_reporting(c.clone()).await.unwrap();
        assert!(created);
        let (second, created) = ts.store.admit_reporting(c).await.unwrap();
        assert!(!created);
        assert_eq!(first, second);
        assert_eq!(first.state, CommandState::Pending);
        assert_eq!(first.revision, 1);
    }

    pub async fn a_command_keeps_the_trace_it_was_admitted_under_through_its_claim(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let trace = trace_context::TraceContext::from_headers(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("rojo=00f067aa0ba902b7"),
        )
        .unwrap();
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{\"text\":\"hi\"}");
        c.trace = trace.clone();
        let admitted = ts.store.admit(c.clone()).await.unwrap();
        assert_eq!(admitted.trace, trace);
        let read = ts
            .store
            .command(&s.tenant, &s.session, &c.command)
            .await
            .unwrap();
        assert_eq!(read.trace, trace);
        // A retried admission under another trace is the same command, with its first trace.
        let mut retry = c.clone();
        retry.trace = None;
        let again = ts.store.admit(retry).await.unwrap();
        assert_eq!(again.trace, trace);
        let claimed = ts
            .store
            .claim(claim_req(&admitted, 1, Uuid::now_v7()))
            .await
            .unwrap();
        assert_eq!(claimed.trace, trace);
        let untraced = ts
            .store
            .admit(new_command(
                &s,
                "c2",
                CommandKind::Input,
                b"{\"text\":\"hi\"}",
            ))
            .await
            .unwrap();
        assert_eq!(untraced.trace, None);
    }

    pub async fn an_admission_retry_that_differs_is_a_command_mismatch(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        ts.store
            .admit(new_command(&s, "c1", CommandKind::Input, b"a"))
            .await
            .unwrap();
        let err = ts
            .store
            .admit(new_command(&s, "c1", CommandKind::Input, b"b"))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            StoreError::CommandMismatch {
                field: "body_digest"
            }
        );
        let err = ts
            .store
            .admit(new_command(&s, "c1", CommandKind::Interrupt, b"a"))
            .await
            .unwrap_err();
        assert_eq!(err, StoreError::CommandMismatch { field: "kind" });
    }

    pub async fn acceptance_order_is_gap_free_and_monotonic_per_session(ts: &TestStore) {
        let s1 = new_session(ts, "s1").await;
        let s2 = new_session(ts, "s2").await;
        let a = admit(ts, &s1, "a").await;
        let b = admit(ts, &s1, "b").await;
        let x = admit(ts, &s2, "x").await;
        let c = admit(ts, &s1, "c").await;
        assert_eq!(
            (a.accepted_order, b.accepted_order, c.accepted_order),
            (1, 2, 3)
        );
        assert_eq!(x.accepted_order, 1);
        let page = ts
            .store
            .list_commands(&s1.tenant, &s1.session, 1, 10)
            .await
            .unwrap();
        let ids: Vec<_> = page.iter().map(|r| r.command.as_str().to_owned()).collect();
        assert_eq!(ids, ["b", "c"]);
    }

    pub async fn a_body_over_64_kib_must_be_stored_by_reference(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let big = vec![b'x'; 64 * 1024 + 1];
        let c = new_command(&s, "c1", CommandKind::Input, &big);
        assert_eq!(code(ts.store.admit(c).await), "invalid");
        let r = ts
            .store
            .put_object(NewObject {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                kind: "command_body".into(),
                media_type: "application/json".into(),
                bytes: big.clone(),
            })
            .await
            .unwrap();
        let mut c = new_command(&s, "c1", CommandKind::Input, b"");
        c.body = CommandBody::Object(r.clone());
        let rec = ts.store.admit(c).await.unwrap();
        assert_eq!(rec.body, CommandBody::Object(r.clone()));
        assert_eq!(rec.body_size, big.len() as u64);
        let obj = ts.store.get_object(&s.tenant, &r).await.unwrap();
        assert_eq!(obj.bytes, big);
    }

    pub async fn admission_wakes_a_subscriber(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut rx = ts.store.admissions();
        admit(ts, &s, "c1").await;
        let a = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("an admission hint arrives")
            .unwrap();
        assert_eq!(a.command.as_str(), "c1");
        assert_eq!(a.session, s.session);
    }

    pub async fn bad_admission_input_is_refused_with_a_typed_error(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.metadata = Some("[1,2]".into());
        assert_eq!(code(ts.store.admit(c).await), "invalid");
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.principal = Some("p".repeat(5000));
        assert_eq!(code(ts.store.admit(c).await), "invalid");
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.body = CommandBody::Object(ObjectRef {
            object_id: ObjectId::new("o").unwrap(),
            size: 10,
            sha256: "not-hex".into(),
        });
        assert_eq!(code(ts.store.admit(c).await), "invalid");
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.body = CommandBody::Object(ObjectRef {
            object_id: ObjectId::new("o").unwrap(),
            size: 17 * 1024 * 1024,
            sha256: "0".repeat(64),
        });
        assert_eq!(code(ts.store.admit(c).await), "invalid");
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.apply_within = Duration::ZERO;
        assert_eq!(code(ts.store.admit(c).await), "invalid");
    }

    // ---- claim ------------------------------------------------------------------------------

    pub async fn a_claim_replayed_with_the_same_token_is_returned_unchanged(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let token = Uuid::now_v7();
        let claimed = ts.store.claim(claim_req(&rec, 1, token)).await.unwrap();
        assert_eq!(claimed.state, CommandState::Claimed);
        assert_eq!(claimed.revision, 2);
        assert_eq!(claimed.epoch_mark, ResidencyEpoch(1));
        let replay = ts.store.claim(claim_req(&rec, 1, token)).await.unwrap();
        assert_eq!(replay, claimed);
    }

    pub async fn a_live_claim_of_the_same_epoch_with_another_token_is_claim_held(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let claimed = ts
            .store
            .claim(claim_req(&rec, 1, Uuid::now_v7()))
            .await
            .unwrap();
        let err = ts
            .store
            .claim(claim_req(&claimed, 1, Uuid::now_v7()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ClaimHeld);
        assert_eq!(err.mark(), Some(1));
    }

    pub async fn a_strictly_higher_epoch_takes_over_a_live_claim(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let claimed = ts
            .store
            .claim(claim_req(&rec, 1, Uuid::now_v7()))
            .await
            .unwrap();
        let taken = ts
            .store
            .claim(claim_req(&claimed, 2, Uuid::now_v7()))
            .await
            .unwrap();
        assert_eq!(taken.claim.as_ref().unwrap().epoch, ResidencyEpoch(2));
        assert_eq!(taken.epoch_mark, ResidencyEpoch(2));
    }

    pub async fn a_lower_epoch_is_refused_and_told_the_mark(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let claimed = ts
            .store
            .claim(claim_req(&rec, 3, Uuid::now_v7()))
            .await
            .unwrap();
        let err = ts
            .store
            .claim(claim_req(&claimed, 2, Uuid::now_v7()))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            StoreError::Epoch {
                field: "command.epoch_mark",
                mark: 3,
                offered: 2
            }
        );
    }

    pub async fn a_lapsed_claim_is_retaken_by_an_equal_epoch(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let mut req = claim_req(&rec, 1, Uuid::now_v7());
        req.ttl = Duration::from_millis(300);
        let claimed = ts.store.claim(req).await.unwrap();
        ts.advance(Duration::from_millis(450)).await;
        let retaken = ts
            .store
            .claim(claim_req(&claimed, 1, Uuid::now_v7()))
            .await
            .unwrap();
        assert_eq!(retaken.claim.unwrap().epoch, ResidencyEpoch(1));
    }

    pub async fn a_claim_past_the_apply_deadline_is_refused(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.apply_within = Duration::from_millis(300);
        let rec = ts.store.admit(c).await.unwrap();
        ts.advance(Duration::from_millis(450)).await;
        assert_eq!(
            code(ts.store.claim(claim_req(&rec, 1, Uuid::now_v7())).await),
            "deadline"
        );
    }

    pub async fn an_attempt_past_the_apply_deadline_is_refused_and_writes_nothing(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let lease = journal(ts, &s, "runtime-a").await;
        let mut c = new_command(&s, "c1", CommandKind::Input, b"{}");
        c.apply_within = Duration::from_millis(300);
        let rec = ts.store.admit(c).await.unwrap();
        let token = Uuid::now_v7();
        let claimed = ts.store.claim(claim_req(&rec, 1, token)).await.unwrap();
        ts.advance(Duration::from_millis(450)).await;
        assert_eq!(
            code(
                ts.store
                    .begin_attempt(attempt_req(&claimed, 1, token, lease.epoch))
                    .await
            ),
            "deadline"
        );
        let after = ts
            .store
            .command(&s.tenant, &s.session, &rec.command)
            .await
            .unwrap();
        assert_eq!(after, claimed);
    }

    pub async fn a_stale_revision_is_a_conflict_carrying_the_current_one(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let claimed = ts
            .store
            .claim(claim_req(&rec, 1, Uuid::now_v7()))
            .await
            .unwrap();
        let mut req = claim_req(&claimed, 2, Uuid::now_v7());
        req.expected_revision = 1;
        let err = ts.store.claim(req).await.unwrap_err();
        assert_eq!(
            err,
            StoreError::Conflict {
                entity: "command",
                expected: 1,
                current: 2
            }
        );
    }

    pub async fn a_claim_ttl_above_the_bound_is_invalid(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let mut req = claim_req(&rec, 1, Uuid::now_v7());
        req.ttl = Duration::from_secs(7200);
        assert_eq!(code(ts.store.claim(req).await), "invalid");
        let mut req = claim_req(&rec, 1, Uuid::now_v7());
        req.epoch = ResidencyEpoch(0);
        assert_eq!(code(ts.store.claim(req).await), "invalid");
    }

    pub async fn an_unknown_command_is_not_found(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut rec = admit(ts, &s, "c1").await;
        rec.command = CommandId::new("ghost").unwrap();
        assert_eq!(
            code(ts.store.claim(claim_req(&rec, 1, Uuid::now_v7())).await),
            "not_found"
        );
        assert_eq!(
            code(ts.store.command(&s.tenant, &s.session, &rec.command).await),
            "not_found"
        );
    }

    // ---- reject -----------------------------------------------------------------------------

    pub async fn a_command_is_rejected_before_any_attempt_and_the_retry_is_idempotent(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let claimed = ts
            .store
            .claim(claim_req(&rec, 1, Uuid::now_v7()))
            .await
            .unwrap();
        let req = RejectRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            command: rec.command.clone(),
            epoch: ResidencyEpoch(1),
            reason: "malformed_body".into(),
            expected_revision: claimed.revision,
        };
        let rejected = ts.store.reject(req.clone()).await.unwrap();
        assert_eq!(rejected.state, CommandState::Rejected);
        assert_eq!(rejected.outcome, Some(Outcome::Rejected));
        assert_eq!(rejected.reason.as_deref(), Some("malformed_body"));
        assert_eq!(ts.store.reject(req).await.unwrap(), rejected);
        // Terminal: nothing else moves it.
        assert_eq!(
            code(
                ts.store
                    .claim(claim_req(&rejected, 2, Uuid::now_v7()))
                    .await
            ),
            "terminal"
        );
        assert_eq!(
            code(ts.store.settle(settle_req(&rejected, 2)).await),
            "terminal"
        );
    }

    pub async fn a_pending_command_is_rejected_only_at_or_above_its_mark(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let claimed = ts
            .store
            .claim(claim_req(&rec, 5, Uuid::now_v7()))
            .await
            .unwrap();
        let req = RejectRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            command: rec.command.clone(),
            epoch: ResidencyEpoch(4),
            reason: "deadline_sweep".into(),
            expected_revision: claimed.revision,
        };
        assert_eq!(ts.store.reject(req).await.unwrap_err().mark(), Some(5));
    }

    pub async fn a_command_with_an_attempt_can_be_neither_rejected_nor_claimed(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &lease).await;
        assert_eq!(applying.state, CommandState::Applying);
        let req = RejectRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            command: rec.command.clone(),
            epoch: ResidencyEpoch(1),
            reason: "late".into(),
            expected_revision: applying.revision,
        };
        assert_eq!(code(ts.store.reject(req).await), "state");
        assert_eq!(
            code(
                ts.store
                    .claim(claim_req(&applying, 2, Uuid::now_v7()))
                    .await
            ),
            "state"
        );
    }

    // ---- attempt ----------------------------------------------------------------------------

    pub async fn an_attempt_needs_a_live_claim_held_by_this_residency(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        // Pending: no claim.
        assert_eq!(
            code(
                ts.store
                    .begin_attempt(attempt_req(&rec, 1, Uuid::now_v7(), JournalEpoch(1)))
                    .await
            ),
            "state"
        );
        // Another token of the same epoch: the claim is not ours.
        let token = Uuid::now_v7();
        let mut short = claim_req(&rec, 1, token);
        short.ttl = Duration::from_millis(300);
        let claimed = ts.store.claim(short).await.unwrap();
        assert_eq!(
            code(
                ts.store
                    .begin_attempt(attempt_req(&claimed, 1, Uuid::now_v7(), JournalEpoch(1)))
                    .await
            ),
            "claim_lost"
        );
        // Lapsed: the claim expired.
        ts.advance(Duration::from_millis(450)).await;
        assert_eq!(
            code(
                ts.store
                    .begin_attempt(attempt_req(&claimed, 1, token, JournalEpoch(1)))
                    .await
            ),
            "claim_lost"
        );
        // Taken over by a successor: the predecessor's attempt fails.
        let taken = ts
            .store
            .claim(claim_req(&claimed, 2, Uuid::now_v7()))
            .await
            .unwrap();
        let err = ts
            .store
            .begin_attempt(attempt_req(&taken, 1, token, JournalEpoch(1)))
            .await
            .unwrap_err();
        assert_eq!(err.mark(), Some(2));
    }

    pub async fn an_attempt_is_immutable_and_its_replay_is_unchanged(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let token = Uuid::now_v7();
        let claimed = ts.store.claim(claim_req(&rec, 1, token)).await.unwrap();
        let req = attempt_req(&claimed, 1, token, JournalEpoch(1));
        let applying = ts.store.begin_attempt(req.clone()).await.unwrap();
        assert_eq!(ts.store.begin_attempt(req.clone()).await.unwrap(), applying);
        let mut other = req;
        other.attempt = AttemptId::mint();
        other.expected_revision = applying.revision;
        assert_eq!(code(ts.store.begin_attempt(other).await), "state");
    }

    // ---- settle -----------------------------------------------------------------------------

    pub async fn settling_without_evidence_is_an_error_and_writes_nothing(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &lease).await;
        assert_eq!(
            code(ts.store.settle(settle_req(&applying, 1)).await),
            "evidence"
        );
        let after = ts
            .store
            .command(&s.tenant, &s.session, &rec.command)
            .await
            .unwrap();
        assert_eq!(after, applying);
    }

    pub async fn a_command_without_an_attempt_cannot_be_settled_and_nothing_is_written(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let claimed = ts
            .store
            .claim(claim_req(&rec, 1, Uuid::now_v7()))
            .await
            .unwrap();
        assert_eq!(
            code(ts.store.settle(settle_req(&claimed, 1)).await),
            "state"
        );
        let stored = ts.store.command(&s.tenant, &s.session, &rec.command);
        assert_eq!(stored.await.unwrap(), claimed);
        let rejected = ts
            .store
            .reject(RejectRequest {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: rec.command.clone(),
                epoch: ResidencyEpoch(1),
                reason: "malformed_body".into(),
                expected_revision: claimed.revision,
            })
            .await
            .unwrap();
        assert_eq!(
            code(ts.store.settle(settle_req(&rejected, 1)).await),
            "terminal"
        );
        let stored = ts.store.command(&s.tenant, &s.session, &rec.command);
        assert_eq!(stored.await.unwrap(), rejected);
    }

    pub async fn settlement_takes_the_outcome_from_the_runtimes_disposition(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut lease = journal(ts, &s, "runtime-a").await;
        for (id, outcome, state, out) in [
            (
                "a",
                ApplicationOutcome::Applied,
                CommandState::Applied,
                Outcome::Applied,
            ),
            (
                "b",
                ApplicationOutcome::NoOp,
                CommandState::Applied,
                Outcome::NoOp,
            ),
            (
                "c",
                ApplicationOutcome::Refused,
                CommandState::Rejected,
                Outcome::Refused,
            ),
        ] {
            let rec = admit(ts, &s, id).await;
            let applying = to_applying(ts, &rec, 1, &lease).await;
            let seq = apply_in_journal(ts, &mut lease, &applying, outcome).await;
            let settled = ts.store.settle(settle_req(&applying, 1)).await.unwrap();
            assert_eq!(settled.state, state);
            assert_eq!(settled.outcome, Some(out));
            assert_eq!(settled.evidence_seq, Some(seq));
            // Idempotent retry.
            assert_eq!(
                ts.store.settle(settle_req(&applying, 1)).await.unwrap(),
                settled
            );
        }
    }

    pub async fn a_successor_closes_a_stranded_attempt_not_applied(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let old = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &old).await;
        // The predecessor crashed before its runtime accepted the command. A successor's
        // runtime takes the journal lease (a strictly later epoch) and closes the attempt.
        let mut new = journal(ts, &s, "runtime-b").await;
        assert!(new.epoch > old.epoch);
        let attempt = applying.attempt.clone().unwrap();
        append(
            ts,
            &mut new,
            vec![JournalEntry::Closure {
                identity: applying.identity(),
                attempt: attempt.id,
                attempt_epoch: attempt.journal_epoch,
            }],
        )
        .await
        .unwrap();
        let settled = ts.store.settle(settle_req(&applying, 2)).await.unwrap();
        assert_eq!(settled.state, CommandState::Rejected);
        assert_eq!(settled.outcome, Some(Outcome::NotApplied));
        assert_eq!(settled.epoch_mark, ResidencyEpoch(2));
    }

    pub async fn an_unroutable_storage_binding_is_not_missing_evidence(ts: &TestStore) {
        let rs = RuntimeSessionId::mint();
        let s = ts
            .store
            .create_session(NewSession {
                tenant: tenant(),
                session: SessionId::new("remote").unwrap(),
                agent: AgentId::new("assistant").unwrap(),
                compatibility: CompatibilityId::new("build-1").unwrap(),
                binding: SessionBinding {
                    runtime_session_id: rs,
                    storage_binding_id: StorageBindingId::new("elsewhere").unwrap(),
                    binding_version: 1,
                },
            })
            .await
            .unwrap();
        let lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &lease).await;
        let err = ts.store.settle(settle_req(&applying, 1)).await.unwrap_err();
        assert_eq!(
            err,
            StoreError::Unroutable {
                storage_binding: "elsewhere".into()
            }
        );
        let after = ts
            .store
            .command(&s.tenant, &s.session, &rec.command)
            .await
            .unwrap();
        assert_eq!(after.state, CommandState::Applying);
        // Routing the binding to this store's journal makes the same settle find evidence.
        ts.store
            .set_evidence_router(std::sync::Arc::new(FixedEvidenceRouter::new(
                [StorageBindingId::new("elsewhere").unwrap()],
                ts.store.own_evidence_reader(),
            )));
        assert_eq!(
            code(ts.store.settle(settle_req(&applying, 1)).await),
            "evidence"
        );
    }

    pub async fn evidence_for_another_attempt_or_epoch_is_refused(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &lease).await;
        let epoch = lease.epoch;
        append(
            ts,
            &mut lease,
            vec![JournalEntry::Application {
                identity: applying.identity(),
                attempt: AttemptId::mint(),
                attempt_epoch: epoch,
                outcome: ApplicationOutcome::Applied,
                detail: None,
            }],
        )
        .await
        .unwrap();
        assert_eq!(
            code(ts.store.settle(settle_req(&applying, 1)).await),
            "evidence"
        );
        assert_eq!(
            ts.store
                .command(&s.tenant, &s.session, &rec.command)
                .await
                .unwrap()
                .state,
            CommandState::Applying
        );
    }

    pub async fn settling_under_a_lower_epoch_than_the_mark_is_refused(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 3, &lease).await;
        apply_in_journal(ts, &mut lease, &applying, ApplicationOutcome::Applied).await;
        assert_eq!(
            ts.store
                .settle(settle_req(&applying, 2))
                .await
                .unwrap_err()
                .mark(),
            Some(3)
        );
    }

    // ---- cursor -----------------------------------------------------------------------------

    pub async fn the_cursor_is_fenced_and_never_regresses(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        assert_eq!(ts.store.cursor(&s.tenant, &s.session).await.unwrap(), None);
        ts.store
            .save_cursor(&s.tenant, &s.session, 2, ResidencyEpoch(1))
            .await
            .unwrap();
        assert_eq!(
            code(
                ts.store
                    .save_cursor(&s.tenant, &s.session, 1, ResidencyEpoch(1))
                    .await
            ),
            "state"
        );
        ts.store
            .save_cursor(&s.tenant, &s.session, 3, ResidencyEpoch(2))
            .await
            .unwrap();
        let err = ts
            .store
            .save_cursor(&s.tenant, &s.session, 9, ResidencyEpoch(1))
            .await
            .unwrap_err();
        assert_eq!(err.mark(), Some(2));
        let c = ts
            .store
            .cursor(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((c.consumed_order, c.epoch), (3, ResidencyEpoch(2)));
    }

    // ---- residency --------------------------------------------------------------------------

    fn residency(s: &SessionRecord, holder: &str) -> ResidencyRequest {
        ResidencyRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            holder: holder.into(),
            host: HostId::new("host-a").unwrap(),
            host_generation: 1,
            ttl: TTL,
        }
    }

    pub async fn residency_epochs_strictly_increase_and_survive_release(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let g1 = ts
            .store
            .acquire_residency(residency(&s, "h1"))
            .await
            .unwrap();
        assert_eq!(g1.epoch, ResidencyEpoch(1));
        assert_eq!(
            ts.store
                .acquire_residency(residency(&s, "h1"))
                .await
                .unwrap()
                .epoch,
            g1.epoch
        );
        ts.store.release_residency(&g1).await.unwrap();
        let row = ts
            .store
            .residency(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((row.epoch, row.holder), (ResidencyEpoch(1), None));
        let g2 = ts
            .store
            .acquire_residency(residency(&s, "h2"))
            .await
            .unwrap();
        assert_eq!(g2.epoch, ResidencyEpoch(2));
        // Releasing a superseded grant changes nothing.
        ts.store.release_residency(&g1).await.unwrap();
        assert_eq!(
            ts.store
                .residency(&s.tenant, &s.session)
                .await
                .unwrap()
                .unwrap()
                .holder
                .as_deref(),
            Some("h2")
        );
    }

    pub async fn a_live_residency_held_elsewhere_is_refused_with_its_epoch(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let g1 = ts
            .store
            .acquire_residency(residency(&s, "h1"))
            .await
            .unwrap();
        let err = ts
            .store
            .acquire_residency(residency(&s, "h2"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ClaimHeld);
        assert_eq!(err.mark(), Some(g1.epoch.0));
    }

    pub async fn an_expired_residency_is_taken_over_and_the_old_holder_cannot_renew(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        let mut req = residency(&s, "h1");
        req.ttl = Duration::from_millis(300);
        let g1 = ts.store.acquire_residency(req).await.unwrap();
        let renewed = ts
            .store
            .renew_residency(&g1, Duration::from_millis(300))
            .await
            .unwrap();
        assert!(renewed.expires_at_ms >= g1.expires_at_ms);
        ts.advance(Duration::from_millis(450)).await;
        assert_eq!(code(ts.store.renew_residency(&g1, TTL).await), "claim_lost");
        let g2 = ts
            .store
            .acquire_residency(residency(&s, "h2"))
            .await
            .unwrap();
        assert_eq!(g2.epoch, ResidencyEpoch(2));
        assert_eq!(
            ts.store.renew_residency(&g1, TTL).await.unwrap_err().mark(),
            Some(2)
        );
    }

    /// A Host frozen past its lease's expiry wakes up still believing it is resident under its
    /// old epoch. A command admitted after a successor took the session has a mark of 0, so
    /// the mark alone cannot fence it: the claim (and an attempt) must be checked against the
    /// session's residency lease, and refused as fenced.
    pub async fn a_claim_under_an_epoch_older_than_the_sessions_residency_is_refused_as_fenced(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        let mut req = residency(&s, "frozen");
        req.ttl = Duration::from_millis(300);
        let old = ts.store.acquire_residency(req).await.unwrap();
        ts.advance(Duration::from_millis(450)).await;
        let new = ts
            .store
            .acquire_residency(residency(&s, "successor"))
            .await
            .unwrap();
        assert!(new.epoch > old.epoch);
        let rec = admit(ts, &s, "after-thaw").await;
        assert_eq!(rec.epoch_mark, ResidencyEpoch(0));
        let err = ts
            .store
            .claim(claim_req(&rec, old.epoch.0, Uuid::now_v7()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Epoch, "{err}");
        assert_eq!(err.mark(), Some(new.epoch.0));
        let unchanged = ts
            .store
            .command(&s.tenant, &s.session, &rec.command)
            .await
            .unwrap();
        assert_eq!(unchanged, rec, "a refused claim writes nothing");
        // The successor claims and applies it as usual.
        let lease = journal(ts, &s, "runtime-successor").await;
        let applying = to_applying(ts, &rec, new.epoch.0, &lease).await;
        assert_eq!(applying.state, CommandState::Applying);
    }

    /// The same fence at the attempt: a claim taken before the freeze does not let the old
    /// epoch begin an attempt once a successor holds the session.
    pub async fn an_attempt_under_an_epoch_older_than_the_sessions_residency_is_refused(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        let lease = journal(ts, &s, "runtime-a").await;
        let mut req = residency(&s, "frozen");
        req.ttl = Duration::from_millis(300);
        let old = ts.store.acquire_residency(req).await.unwrap();
        let rec = admit(ts, &s, "c1").await;
        let token = Uuid::now_v7();
        let claimed = ts
            .store
            .claim(claim_req(&rec, old.epoch.0, token))
            .await
            .unwrap();
        ts.advance(Duration::from_millis(450)).await;
        let new = ts
            .store
            .acquire_residency(residency(&s, "successor"))
            .await
            .unwrap();
        let err = ts
            .store
            .begin_attempt(attempt_req(&claimed, old.epoch.0, token, lease.epoch))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Epoch, "{err}");
        assert_eq!(err.mark(), Some(new.epoch.0));
        let after = ts
            .store
            .command(&s.tenant, &s.session, &rec.command)
            .await
            .unwrap();
        assert_eq!(after, claimed, "a refused attempt writes nothing");
    }

    /// A residency that lapsed or was given back is no longer held by anyone at its epoch:
    /// its holder's claims are refused as lost, and a lease at a lower epoch than the claim's
    /// (or none at all) does not stand in the way.
    pub async fn a_claim_under_a_lapsed_or_released_residency_is_refused_as_lost(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut req = residency(&s, "h1");
        req.ttl = Duration::from_millis(300);
        let lapsed = ts.store.acquire_residency(req).await.unwrap();
        let rec = admit(ts, &s, "c1").await;
        ts.advance(Duration::from_millis(450)).await;
        assert_eq!(
            code(
                ts.store
                    .claim(claim_req(&rec, lapsed.epoch.0, Uuid::now_v7()))
                    .await
            ),
            "claim_lost"
        );
        let held = ts
            .store
            .acquire_residency(residency(&s, "h2"))
            .await
            .unwrap();
        ts.store.release_residency(&held).await.unwrap();
        assert_eq!(
            code(
                ts.store
                    .claim(claim_req(&rec, held.epoch.0, Uuid::now_v7()))
                    .await
            ),
            "claim_lost"
        );
        let unchanged = ts
            .store
            .command(&s.tenant, &s.session, &rec.command)
            .await
            .unwrap();
        assert_eq!(unchanged, rec);
        let other = new_session(ts, "s2").await;
        let free = admit(ts, &other, "c1").await;
        let claimed = ts
            .store
            .claim(claim_req(&free, 3, Uuid::now_v7()))
            .await
            .unwrap();
        assert_eq!(claimed.state, CommandState::Claimed);
    }

    // ---- gate mark and projection -------------------------------------------------------------

    pub async fn the_gate_mark_refuses_lower_admits_equal_and_raises_on_higher(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        assert_eq!(
            ts.store
                .fence_gate_mark(&s.tenant, &s.session, ResidencyEpoch(2))
                .await
                .unwrap(),
            ResidencyEpoch(2)
        );
        assert_eq!(
            ts.store
                .fence_gate_mark(&s.tenant, &s.session, ResidencyEpoch(2))
                .await
                .unwrap(),
            ResidencyEpoch(2)
        );
        assert_eq!(
            ts.store
                .fence_gate_mark(&s.tenant, &s.session, ResidencyEpoch(1))
                .await
                .unwrap_err()
                .mark(),
            Some(2)
        );
        assert_eq!(
            ts.store
                .fence_gate_mark(&s.tenant, &s.session, ResidencyEpoch(3))
                .await
                .unwrap(),
            ResidencyEpoch(3)
        );
        assert_eq!(
            ts.store
                .session(&s.tenant, &s.session)
                .await
                .unwrap()
                .gate_mark,
            ResidencyEpoch(3)
        );
        let proj = SessionProjection {
            residency_state: ResidencyState::Resident,
            last_journal_seq: 4,
            checkpoint_seq: 2,
        };
        assert_eq!(
            code(
                ts.store
                    .update_projection(&s.tenant, &s.session, ResidencyEpoch(2), proj.clone())
                    .await
            ),
            "epoch"
        );
        let rec = ts
            .store
            .update_projection(&s.tenant, &s.session, ResidencyEpoch(3), proj)
            .await
            .unwrap();
        assert_eq!(rec.residency_state, ResidencyState::Resident);
    }

    fn gate(n: u64) -> OpenGate {
        OpenGate {
            gate: GateId::new(format!("g{n}")).unwrap(),
            opened_event: EventId::new(format!("e{n}")).unwrap(),
            opened_seq: n,
            kind: "permission".into(),
            prompt_summary: format!("allow tool {n}?"),
            deadline_ms: 1_000_000,
        }
    }

    pub async fn open_gates_are_read_a_page_at_a_time_oldest_first_across_sessions_and_tenants(
        ts: &TestStore,
    ) {
        let e = ResidencyEpoch(1);
        let s1 = new_session(ts, "s1").await;
        let s2 = new_session(ts, "s2").await;
        let theirs = sessionstore::testing::new_session(&ts.store, "globex", "s3", "build-1").await;
        for (s, n) in [(&s1, 1), (&s1, 2), (&s2, 3), (&theirs, 4)] {
            ts.store
                .open_gate(&s.tenant, &s.session, e, gate(n))
                .await
                .unwrap();
        }
        ts.store
            .resolve_gate(&s1.tenant, &s1.session, e, &gate(2).gate, 10)
            .await
            .unwrap();
        let acme = [tenant()];
        let named = |p: &OpenGatesPage| -> Vec<String> {
            p.gates
                .iter()
                .map(|g| format!("{}/{}", g.session, g.gate))
                .collect()
        };
        // Only open gates, only the tenants asked for, a page at a time, oldest first.
        let first = ts.store.open_gates_page(&acme, None, 1).await.unwrap();
        assert_eq!(named(&first), ["s1/g1"]);
        let cursor = first.next.clone().expect("a second page");
        let second = ts
            .store
            .open_gates_page(&acme, Some(&cursor), 1)
            .await
            .unwrap();
        assert_eq!(
            (named(&second), second.next),
            (vec!["s2/g3".to_owned()], None)
        );
        let both = [tenant(), TenantId::new("globex").unwrap()];
        let all = ts.store.open_gates_page(&both, None, 10).await.unwrap();
        assert_eq!(named(&all), ["s1/g1", "s2/g3", "s3/g4"]);
        // A gate resolved since is still a cursor; another tenant's or an unknown one is not.
        let resolved = GateCursor {
            tenant: tenant(),
            session: s1.session.clone(),
            gate: gate(2).gate,
        };
        let after = ts
            .store
            .open_gates_page(&acme, Some(&resolved), 10)
            .await
            .unwrap();
        assert_eq!(named(&after), ["s2/g3"]);
        for bad in [
            GateCursor {
                tenant: theirs.tenant.clone(),
                session: theirs.session.clone(),
                gate: gate(4).gate,
            },
            GateCursor {
                tenant: tenant(),
                session: s1.session.clone(),
                gate: GateId::new("g9").unwrap(),
            },
        ] {
            let e = ts
                .store
                .open_gates_page(&acme, Some(&bad), 10)
                .await
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
        }
    }

    pub async fn the_gate_projection_holds_at_most_16_open_and_never_reopens(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let e = ResidencyEpoch(1);
        for n in 1..=16 {
            ts.store
                .open_gate(&s.tenant, &s.session, e, gate(n))
                .await
                .unwrap();
        }
        // Re-opening a projected gate returns it unchanged.
        let again = ts
            .store
            .open_gate(&s.tenant, &s.session, e, gate(3))
            .await
            .unwrap();
        assert_eq!(again.state, GateState::Open);
        assert_eq!(
            code(ts.store.open_gate(&s.tenant, &s.session, e, gate(17)).await),
            "state"
        );
        let resolved = ts
            .store
            .resolve_gate(&s.tenant, &s.session, e, &gate(1).gate, 40)
            .await
            .unwrap();
        assert_eq!(resolved.resolved_seq, Some(40));
        ts.store
            .open_gate(&s.tenant, &s.session, e, gate(17))
            .await
            .unwrap();
        // A resolved gate is never reopened.
        let stays = ts
            .store
            .open_gate(&s.tenant, &s.session, e, gate(1))
            .await
            .unwrap();
        assert_eq!(stays.state, GateState::Resolved);
        assert_eq!(
            ts.store
                .gates(&s.tenant, &s.session, true)
                .await
                .unwrap()
                .len(),
            16
        );
        assert_eq!(
            ts.store
                .gates(&s.tenant, &s.session, false)
                .await
                .unwrap()
                .len(),
            17
        );
        assert_eq!(
            code(
                ts.store
                    .resolve_gate(&s.tenant, &s.session, e, &GateId::new("nope").unwrap(), 41)
                    .await
            ),
            "not_found"
        );
    }

    pub async fn gate_writes_are_fenced_by_the_gate_mark(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        ts.store
            .fence_gate_mark(&s.tenant, &s.session, ResidencyEpoch(2))
            .await
            .unwrap();
        let err = ts
            .store
            .open_gate(&s.tenant, &s.session, ResidencyEpoch(1), gate(1))
            .await
            .unwrap_err();
        assert_eq!(err.mark(), Some(2));
        ts.store
            .open_gate(&s.tenant, &s.session, ResidencyEpoch(2), gate(1))
            .await
            .unwrap();
        assert_eq!(
            ts.store
                .resolve_gate(&s.tenant, &s.session, ResidencyEpoch(1), &gate(1).gate, 5)
                .await
                .unwrap_err()
                .mark(),
            Some(2)
        );
    }

    // ---- registry ---------------------------------------------------------------------------

    fn registration(s: &SessionRecord, epoch: u64) -> RegistrationUpdate {
        RegistrationUpdate {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            host: HostId::new("host-a").unwrap(),
            host_generation: 1,
            endpoint: "ws://10.0.0.1:7400".into(),
            residency: ResidencyState::Resident,
            accepting: true,
            lease_epoch: ResidencyEpoch(epoch),
            ttl: TTL,
        }
    }

    pub async fn a_registration_is_fenced_and_its_tombstone_keeps_the_epoch(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        ts.store
            .put_registration(registration(&s, 2))
            .await
            .unwrap();
        assert_eq!(
            ts.store
                .put_registration(registration(&s, 1))
                .await
                .unwrap_err()
                .mark(),
            Some(2)
        );
        let tomb = ts
            .store
            .tombstone_registration(&s.tenant, &s.session, ResidencyEpoch(2))
            .await
            .unwrap();
        assert_eq!(tomb.residency, ResidencyState::Released);
        assert!(!tomb.accepting);
        assert_eq!(tomb.lease_epoch, ResidencyEpoch(2));
        let read = ts
            .store
            .registration(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read, tomb);
        assert_eq!(
            code(
                ts.store
                    .tombstone_registration(&s.tenant, &s.session, ResidencyEpoch(1))
                    .await
            ),
            "epoch"
        );
        let mut bad = registration(&s, 3);
        bad.ttl = Duration::from_secs(7200);
        assert_eq!(code(ts.store.put_registration(bad).await), "invalid");
    }

    fn advertisement(generation: u64, ttl: Duration) -> HostAdvertisement {
        HostAdvertisement {
            host: HostId::new("host-a").unwrap(),
            endpoint: "ws://10.0.0.1:7400".into(),
            placement: Placement::Pooled,
            isolation_class: "standard".into(),
            capacity: 8,
            accepting: true,
            generation,
            ttl,
        }
    }

    pub async fn an_advertisement_expires_and_a_lower_generation_is_refused(ts: &TestStore) {
        let t = ts
            .store
            .advertise(advertisement(2, Duration::from_millis(300)))
            .await
            .unwrap();
        assert_eq!(t.capacity, 8);
        assert_eq!(ts.store.targets(true).await.unwrap().len(), 1);
        assert_eq!(
            ts.store
                .advertise(advertisement(1, TTL))
                .await
                .unwrap_err()
                .mark(),
            Some(2)
        );
        ts.advance(Duration::from_millis(450)).await;
        assert!(ts.store.targets(true).await.unwrap().is_empty());
        assert_eq!(ts.store.targets(false).await.unwrap().len(), 1);
        ts.store.advertise(advertisement(2, TTL)).await.unwrap();
        assert_eq!(ts.store.targets(true).await.unwrap().len(), 1);
    }

    /// What the fleet model relies on: moving the store's time expires leases at once on
    /// either backend, for every handle opened on the same database, and never moves it back.
    pub async fn moving_the_store_s_time_expires_a_lease_for_every_handle_at_once(ts: &TestStore) {
        let s = new_session(ts, "moved-time").await;
        let other = ts.reopen().await.unwrap();
        let request = |holder: &str| ResidencyRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            holder: holder.into(),
            host: HostId::new("h1").unwrap(),
            host_generation: 1,
            ttl: TTL,
        };
        let before = other.now_ms().await.unwrap();
        let first = ts.store.acquire_residency(request("first")).await.unwrap();
        assert_eq!(
            other
                .acquire_residency(request("second"))
                .await
                .unwrap_err()
                .code(),
            ErrorCode::ClaimHeld
        );
        ts.advance_instantly(TTL + Duration::from_secs(1)).await;
        assert!(other.now_ms().await.unwrap() >= before + 31_000);
        let second = other.acquire_residency(request("second")).await.unwrap();
        assert_eq!(second.epoch.0, first.epoch.0 + 1);
        assert!(second.expires_at_ms >= first.expires_at_ms + 1_000);
        other.close().await;
    }

    // ---- payload objects --------------------------------------------------------------------

    async fn object(ts: &TestStore, s: &SessionRecord, bytes: &[u8]) -> ObjectRef {
        ts.store
            .put_object(NewObject {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                kind: "command_body".into(),
                media_type: "application/json".into(),
                bytes: bytes.to_vec(),
            })
            .await
            .unwrap()
    }

    pub async fn a_corrupted_payload_object_is_detected(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let r = object(ts, &s, b"the original bytes").await;
        assert_eq!(
            ts.store.get_object(&s.tenant, &r).await.unwrap().bytes,
            b"the original bytes"
        );
        ts.exec_raw(&format!(
            "UPDATE payload_objects SET bytes = {} WHERE object_id = '{}'",
            match ts.backend {
                sessionstore::testing::TestBackend::Sqlite => "X'6576696c'",
                sessionstore::testing::TestBackend::Postgres => "'\\x6576696c'::bytea",
            },
            r.object_id
        ))
        .await;
        assert_eq!(code(ts.store.get_object(&s.tenant, &r).await), "integrity");
    }

    pub async fn an_object_read_against_a_wrong_reference_is_refused(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let r = object(ts, &s, b"bytes").await;
        let mut wrong = r.clone();
        wrong.size = 4;
        assert_eq!(
            code(ts.store.get_object(&s.tenant, &wrong).await),
            "integrity"
        );
        let mut wrong = r.clone();
        wrong.sha256 = "0".repeat(64);
        assert_eq!(
            code(ts.store.get_object(&s.tenant, &wrong).await),
            "integrity"
        );
        let other = TenantId::new("globex").unwrap();
        assert_eq!(code(ts.store.get_object(&other, &r).await), "not_found");
        let mut missing = r;
        missing.object_id = ObjectId::new("nope").unwrap();
        assert_eq!(
            code(ts.store.get_object(&s.tenant, &missing).await),
            "not_found"
        );
    }

    // ---- journal ----------------------------------------------------------------------------

    fn event(n: u64, cause: Option<RuntimeCommandId>) -> JournalEntry {
        JournalEntry::Event {
            event: EventId::new(format!("ev{n}")).unwrap(),
            public_body: format!("{{\"n\":{n}}}").into_bytes(),
            private_body: Some(b"secret".to_vec()),
            cause,
        }
    }

    pub async fn acquiring_the_journal_lease_appends_an_opening_fence(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        assert_eq!(ts.store.journal_tip(&s.tenant, rs).await.unwrap(), 0);
        let l1 = journal(ts, &s, "runtime-a").await;
        assert_eq!((l1.epoch, l1.tip), (JournalEpoch(1), 1));
        let l2 = journal(ts, &s, "runtime-b").await;
        assert_eq!((l2.epoch, l2.tip), (JournalEpoch(2), 2));
        let page = ts
            .store
            .journal_runtime_page(&s.tenant, rs, 0, 10)
            .await
            .unwrap();
        assert_eq!(page.len(), 2);
        assert!(page.iter().all(|r| r.kind == RecordKind::Fence));
        assert_eq!(page[1].epoch, JournalEpoch(2));
    }

    pub async fn a_stale_writers_append_fails_after_a_successors_fence(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut old = journal(ts, &s, "runtime-a").await;
        append(ts, &mut old, vec![event(1, None)]).await.unwrap();
        let mut new = journal(ts, &s, "runtime-b").await;
        let err = append(ts, &mut old, vec![event(2, None)])
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Epoch);
        assert_eq!(err.mark(), Some(new.epoch.0));
        append(ts, &mut new, vec![event(3, None)]).await.unwrap();
        assert_eq!(new.tip, 4);
        // The stale lease can neither renew nor release the successor's.
        assert_eq!(code(ts.store.journal_renew(&old, TTL).await), "epoch");
        ts.store.journal_release(&old).await.unwrap();
        let state = ts
            .store
            .journal_lease_state(&s.tenant, s.binding.runtime_session_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(state.holder.as_deref(), Some("runtime-b"));
    }

    pub async fn appends_are_compare_and_set_on_the_writers_tip(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut lease = journal(ts, &s, "runtime-a").await;
        let stale = lease.clone();
        append(ts, &mut lease, vec![event(1, None), event(2, None)])
            .await
            .unwrap();
        let err = ts
            .store
            .journal_append(&stale, vec![event(3, None)])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            StoreError::Conflict {
                entity: "journal.tip",
                expected: 1,
                current: 3
            }
        );
    }

    pub async fn a_command_has_at_most_one_disposition(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &lease).await;
        apply_in_journal(ts, &mut lease, &applying, ApplicationOutcome::Applied).await;
        let attempt = applying.attempt.clone().unwrap();
        let dup = ts
            .store
            .journal_append(
                &lease,
                vec![JournalEntry::Application {
                    identity: applying.identity(),
                    attempt: attempt.id,
                    attempt_epoch: attempt.journal_epoch,
                    outcome: ApplicationOutcome::NoOp,
                    detail: None,
                }],
            )
            .await;
        assert_eq!(code(dup), "state");
        // A successor cannot close an applied command either.
        let mut next = journal(ts, &s, "runtime-b").await;
        let close = append(
            ts,
            &mut next,
            vec![JournalEntry::Closure {
                identity: applying.identity(),
                attempt: attempt.id,
                attempt_epoch: attempt.journal_epoch,
            }],
        )
        .await;
        assert_eq!(code(close), "state");
    }

    pub async fn a_closure_needs_a_later_epoch_and_no_effect_of_the_command(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let mut lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &lease).await;
        let attempt = applying.attempt.clone().unwrap();
        let closure = JournalEntry::Closure {
            identity: applying.identity(),
            attempt: attempt.id,
            attempt_epoch: attempt.journal_epoch,
        };
        // Same epoch as the attempt: a runtime never closes its own attempt.
        assert_eq!(
            code(append(ts, &mut lease, vec![closure.clone()]).await),
            "epoch"
        );
        // An effect caused by the command exists: it cannot be closed not_applied.
        append(
            ts,
            &mut lease,
            vec![event(1, Some(applying.runtime_command))],
        )
        .await
        .unwrap();
        let mut next = journal(ts, &s, "runtime-b").await;
        assert_eq!(code(append(ts, &mut next, vec![closure]).await), "state");
        // And the application epoch must be the writer's own.
        let other = admit(ts, &s, "c2").await;
        let applying2 = to_applying(ts, &other, 1, &lease).await;
        let a2 = applying2.attempt.clone().unwrap();
        let wrong = append(
            ts,
            &mut next,
            vec![JournalEntry::Application {
                identity: applying2.identity(),
                attempt: a2.id,
                attempt_epoch: a2.journal_epoch,
                outcome: ApplicationOutcome::Applied,
                detail: None,
            }],
        )
        .await;
        assert_eq!(code(wrong), "invalid");
    }

    // ---- journal snapshots ------------------------------------------------------------------

    pub async fn a_snapshot_is_fenced_by_the_journal_lease_and_never_replaced_by_an_older_one(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        let mut lease = journal(ts, &s, "runtime-a").await;
        append(ts, &mut lease, vec![event(1, None), event(2, None)])
            .await
            .unwrap();
        assert_eq!(
            ts.store.journal_snapshot(&s.tenant, rs).await.unwrap(),
            None
        );
        assert!(
            ts.store
                .journal_put_snapshot(&lease, 3, 1, b"through three".to_vec())
                .await
                .unwrap()
        );
        // Not past the tip, not format 0.
        assert_eq!(
            code(
                ts.store
                    .journal_put_snapshot(&lease, 4, 1, b"x".to_vec())
                    .await
            ),
            "invalid"
        );
        assert_eq!(
            code(
                ts.store
                    .journal_put_snapshot(&lease, 3, 0, b"x".to_vec())
                    .await
            ),
            "invalid"
        );
        // An older snapshot never replaces a newer one.
        assert!(
            !ts.store
                .journal_put_snapshot(&lease, 2, 1, b"through two".to_vec())
                .await
                .unwrap()
        );
        let got = ts
            .store
            .journal_snapshot(&s.tenant, rs)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (got.seq, got.epoch, got.format, got.body.as_slice()),
            (3, lease.epoch, 1, b"through three".as_slice())
        );
        // A successor's fence deposes the first writer: its snapshot is refused, and the
        // snapshot and the journal's records and public offsets are untouched by either.
        let tip = ts.store.journal_tip(&s.tenant, rs).await.unwrap();
        let offset = ts
            .store
            .journal_public_offset(&s.tenant, rs, tip)
            .await
            .unwrap();
        let mut next = journal(ts, &s, "runtime-b").await;
        assert_eq!(
            code(
                ts.store
                    .journal_put_snapshot(&lease, 3, 2, b"stale".to_vec())
                    .await
            ),
            "epoch"
        );
        assert_eq!(next.tip, tip + 1, "a snapshot takes no sequence number");
        assert_eq!(
            ts.store
                .journal_public_offset(&s.tenant, rs, next.tip)
                .await
                .unwrap(),
            offset
        );
        append(ts, &mut next, vec![event(3, None)]).await.unwrap();
        assert!(
            ts.store
                .journal_put_snapshot(&next, next.tip, 1, b"successor".to_vec())
                .await
                .unwrap()
        );
        assert_eq!(
            ts.store
                .journal_snapshot(&s.tenant, rs)
                .await
                .unwrap()
                .unwrap()
                .epoch,
            next.epoch
        );
        // A released lease writes none either.
        ts.store.journal_release(&next).await.unwrap();
        assert_eq!(
            code(
                ts.store
                    .journal_put_snapshot(&next, next.tip, 1, b"late".to_vec())
                    .await
            ),
            "claim_lost"
        );
    }

    pub async fn a_damaged_snapshot_reads_as_integrity_and_another_tenant_sees_none(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        let lease = journal(ts, &s, "runtime-a").await;
        ts.store
            .journal_put_snapshot(&lease, 1, 1, b"{\"fold\":1}".to_vec())
            .await
            .unwrap();
        let other = TenantId::new("globex").unwrap();
        assert_eq!(ts.store.journal_snapshot(&other, rs).await.unwrap(), None);
        ts.exec_raw(&format!(
            "UPDATE journal_snapshots SET sha256 = '{}' WHERE runtime_session_id = '{}'",
            "0".repeat(64),
            rs.to_text()
        ))
        .await;
        assert_eq!(
            code(ts.store.journal_snapshot(&s.tenant, rs).await),
            "integrity"
        );
    }

    pub async fn a_command_s_disposition_and_effects_are_read_from_the_journal_by_command(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        let mut lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &lease).await;
        let rc = applying.runtime_command;
        assert_eq!(
            ts.store
                .journal_command_disposition(&s.tenant, rs, rc)
                .await
                .unwrap(),
            None
        );
        assert!(
            !ts.store
                .journal_has_effect(&s.tenant, rs, rc)
                .await
                .unwrap()
        );
        let seq = apply_in_journal(ts, &mut lease, &applying, ApplicationOutcome::NoOp).await;
        append(ts, &mut lease, vec![event(1, Some(rc))])
            .await
            .unwrap();
        let frame = ts
            .store
            .journal_command_disposition(&s.tenant, rs, rc)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((frame.seq, frame.disposition), (seq, Disposition::NoOp));
        assert!(
            ts.store
                .journal_has_effect(&s.tenant, rs, rc)
                .await
                .unwrap()
        );
        let other = TenantId::new("globex").unwrap();
        assert_eq!(
            ts.store
                .journal_command_disposition(&other, rs, rc)
                .await
                .unwrap(),
            None
        );
        assert!(!ts.store.journal_has_effect(&other, rs, rc).await.unwrap());
    }

    pub async fn public_pages_hold_public_events_only_pinned_to_the_first_tip(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        let mut lease = journal(ts, &s, "runtime-a").await;
        append(
            ts,
            &mut lease,
            vec![
                event(1, None),
                JournalEntry::Control {
                    body: b"ctl".to_vec(),
                    cause: None,
                },
                event(2, None),
                event(3, None),
            ],
        )
        .await
        .unwrap();
        let first = ts
            .store
            .journal_public_page(&s.tenant, rs, 0, None, 2)
            .await
            .unwrap();
        assert_eq!(first.events.len(), 2);
        assert_eq!(first.events[0].body, b"{\"n\":1}");
        assert!(!first.is_complete());
        append(ts, &mut lease, vec![event(4, None)]).await.unwrap();
        let second = ts
            .store
            .journal_public_page(&s.tenant, rs, first.next_after, Some(first.tip), 2)
            .await
            .unwrap();
        let ids: Vec<_> = second
            .events
            .iter()
            .map(|e| e.event.as_str().to_owned())
            .collect();
        assert_eq!(ids, ["ev3"]);
        assert!(second.is_complete());
        let other = TenantId::new("globex").unwrap();
        assert!(
            ts.store
                .journal_public_page(&other, rs, 0, None, 10)
                .await
                .unwrap()
                .events
                .is_empty()
        );
        assert!(
            ts.store
                .journal_runtime_page(&other, rs, 0, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            code(ts.store.journal_acquire(&other, rs, "x", TTL).await),
            "not_found"
        );
    }

    pub async fn public_offsets_count_public_events_only_without_gaps(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        let mut lease = journal(ts, &s, "runtime-a").await;
        let control = || JournalEntry::Control {
            body: b"ctl".to_vec(),
            cause: None,
        };
        append(
            ts,
            &mut lease,
            vec![event(1, None), control(), control(), event(2, None)],
        )
        .await
        .unwrap();
        // A second writer's fence sits between public events too.
        let mut lease = journal(ts, &s, "runtime-b").await;
        append(
            ts,
            &mut lease,
            vec![control(), event(3, None), event(4, None)],
        )
        .await
        .unwrap();
        let all = ts
            .store
            .journal_by_offset(&s.tenant, rs, 0, 100)
            .await
            .unwrap();
        assert_eq!(all.top, 4);
        let offsets: Vec<u64> = all.events.iter().map(|e| e.offset).collect();
        assert_eq!(offsets, [1, 2, 3, 4]);
        let ids: Vec<&str> = all.events.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(ids, ["ev1", "ev2", "ev3", "ev4"]);
        assert_eq!(all.events[2].body, b"{\"n\":3}");
        // Each record's offset is the count of public events through its sequence.
        for e in &all.events {
            assert_eq!(
                ts.store
                    .journal_public_offset(&s.tenant, rs, e.seq)
                    .await
                    .unwrap(),
                e.offset
            );
            assert_eq!(
                ts.store
                    .journal_public_offset(&s.tenant, rs, e.seq - 1)
                    .await
                    .unwrap(),
                e.offset - 1
            );
        }
        let middle = ts
            .store
            .journal_by_offset(&s.tenant, rs, 1, 2)
            .await
            .unwrap();
        let offsets: Vec<u64> = middle.events.iter().map(|e| e.offset).collect();
        assert_eq!(offsets, [2, 3]);
        assert_eq!(middle.events[0].seq, all.events[1].seq);
        let past = ts
            .store
            .journal_by_offset(&s.tenant, rs, 4, 10)
            .await
            .unwrap();
        assert!(past.events.is_empty());
        assert_eq!(past.top, 4);
        let top_only = ts
            .store
            .journal_by_offset(&s.tenant, rs, 0, 0)
            .await
            .unwrap();
        assert!(top_only.events.is_empty());
        assert_eq!(top_only.top, 4);
        // Another tenant reads nothing and learns no top.
        let other = TenantId::new("globex").unwrap();
        let foreign = ts.store.journal_by_offset(&other, rs, 0, 10).await.unwrap();
        assert!(foreign.events.is_empty());
        assert_eq!(foreign.top, 0);
        assert_eq!(
            ts.store
                .journal_public_offset(&other, rs, u64::MAX)
                .await
                .unwrap(),
            0
        );
    }

    pub async fn an_offset_read_fails_closed_on_a_damaged_public_record(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        let mut lease = journal(ts, &s, "runtime-a").await;
        append(ts, &mut lease, vec![event(1, None), event(2, None)])
            .await
            .unwrap();
        ts.exec_raw("UPDATE journal_records SET event_id = '' WHERE seq = 3")
            .await;
        assert_eq!(
            code(ts.store.journal_by_offset(&s.tenant, rs, 0, 10).await),
            "integrity"
        );
    }

    pub async fn event_bodies_over_64_kib_are_offloaded_and_verified_on_read(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        let mut lease = journal(ts, &s, "runtime-a").await;
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        append(
            ts,
            &mut lease,
            vec![JournalEntry::Event {
                event: EventId::new("big").unwrap(),
                public_body: big.clone(),
                private_body: None,
                cause: None,
            }],
        )
        .await
        .unwrap();
        let page = ts
            .store
            .journal_public_page(&s.tenant, rs, 0, None, 10)
            .await
            .unwrap();
        assert_eq!(page.events[0].body, big);
        ts.exec_raw(&format!(
            "UPDATE payload_objects SET sha256 = '{}' WHERE object_id LIKE 'journal-%'",
            "1".repeat(64)
        ))
        .await;
        assert_eq!(
            code(
                ts.store
                    .journal_public_page(&s.tenant, rs, 0, None, 10)
                    .await
            ),
            "integrity"
        );
    }

    // ---- bad input and damage ---------------------------------------------------------------

    pub async fn a_corrupt_command_row_reads_as_integrity_not_a_panic(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        ts.exec_raw(&format!(
            "UPDATE commands SET runtime_command_id = 'not-a-uuid' WHERE command_id = '{}'",
            rec.command
        ))
        .await;
        assert_eq!(
            code(ts.store.command(&s.tenant, &s.session, &rec.command).await),
            "integrity"
        );
        assert_eq!(
            code(ts.store.claim(claim_req(&rec, 1, Uuid::now_v7())).await),
            "integrity"
        );
        assert_eq!(
            code(ts.store.list_commands(&s.tenant, &s.session, 0, 10).await),
            "integrity"
        );
    }

    pub async fn a_corrupt_journal_record_fails_the_page_closed(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rs = s.binding.runtime_session_id;
        let mut lease = journal(ts, &s, "runtime-a").await;
        append(ts, &mut lease, vec![event(1, None), event(2, None)])
            .await
            .unwrap();
        ts.exec_raw("UPDATE journal_records SET event_id = '' WHERE seq = 3")
            .await;
        assert_eq!(
            code(
                ts.store
                    .journal_public_page(&s.tenant, rs, 0, None, 10)
                    .await
            ),
            "integrity"
        );
    }

    pub async fn a_closed_store_answers_unavailable(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let second = ts.reopen().await.unwrap();
        second.close().await;
        assert_eq!(
            code(second.session(&s.tenant, &s.session).await),
            "unavailable"
        );
        let err = second
            .admit(new_command(&s, "c1", CommandKind::Input, b"{}"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);
        // The first handle is unaffected.
        ts.store.session(&s.tenant, &s.session).await.unwrap();
    }

    pub async fn a_database_written_by_a_newer_build_is_refused(ts: &TestStore) {
        ts.exec_raw("INSERT INTO schema_migrations (version, applied_at) VALUES (999, 0)")
            .await;
        let err = ts.reopen().await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::State);
        assert!(err.to_string().contains("newer build"), "{err}");
    }

    pub async fn concurrent_writers_racing_to_claim_have_exactly_one_winner(ts: &TestStore) {
        let s = new_session(ts, "s1").await;
        let rec = admit(ts, &s, "c1").await;
        let other = ts.reopen().await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..8 {
            let store = if i % 2 == 0 {
                ts.store.clone()
            } else {
                other.clone()
            };
            let req = claim_req(&rec, 1, Uuid::now_v7());
            tasks.push(tokio::spawn(async move { store.claim(req).await }));
        }
        let mut wins = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => wins += 1,
                Err(e) => assert!(
                    matches!(e.code(), ErrorCode::Conflict | ErrorCode::ClaimHeld),
                    "unexpected {e}"
                ),
            }
        }
        assert_eq!(wins, 1);
        other.close().await;
    }

    pub async fn a_successor_with_a_higher_epoch_takes_over_a_live_claim_from_another_connection(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s1").await;
        let lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let token = Uuid::now_v7();
        let claimed = ts.store.claim(claim_req(&rec, 1, token)).await.unwrap();
        let successor = ts.reopen().await.unwrap();
        let taken = successor
            .claim(claim_req(&claimed, 2, Uuid::now_v7()))
            .await
            .unwrap();
        assert_eq!(taken.claim.as_ref().unwrap().epoch, ResidencyEpoch(2));
        let late = ts
            .store
            .begin_attempt(attempt_req(&claimed, 1, token, lease.epoch))
            .await;
        assert_eq!(code(late), "epoch");
        successor.close().await;
    }

    pub async fn many_sessions_admitted_concurrently_keep_their_own_orders(ts: &TestStore) {
        let mut sessions = Vec::new();
        for i in 0..8 {
            sessions.push(new_session(ts, &format!("s{i}")).await);
        }
        let mut tasks = Vec::new();
        for s in &sessions {
            for n in 0..10 {
                let store = ts.store.clone();
                let c = new_command(s, &format!("c{n}"), CommandKind::Input, b"{}");
                tasks.push(tokio::spawn(async move { store.admit(c).await }));
            }
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        for s in &sessions {
            let page = ts
                .store
                .list_commands(&s.tenant, &s.session, 0, 100)
                .await
                .unwrap();
            let orders: Vec<u64> = page.iter().map(|r| r.accepted_order).collect();
            assert_eq!(orders, (1..=10).collect::<Vec<_>>());
        }
    }

    // ---- writes grouped in one transaction --------------------------------------------------

    /// A second handle on the store whose PostgreSQL writes all queue on one lane, so
    /// concurrent writes share group transactions.
    async fn one_lane(ts: &TestStore) -> Store {
        let mut options = ts.options();
        options.pg_write_lanes = 1;
        Store::open(options).await.unwrap()
    }

    type Pending = tokio::task::JoinHandle<StoreResult<()>>;

    /// Admits `rounds` commands (ids `{prefix}{round}`) to each session concurrently.
    fn admit_concurrently(
        store: &Store,
        sessions: &[SessionRecord],
        prefix: &str,
        rounds: usize,
    ) -> Vec<Pending> {
        let mut tasks = Vec::new();
        for round in 0..rounds {
            for s in sessions {
                let store = store.clone();
                let c = new_command(s, &format!("{prefix}{round}"), CommandKind::Input, b"{}");
                tasks.push(tokio::spawn(
                    async move { store.admit(c).await.map(|_| ()) },
                ));
            }
        }
        tasks
    }

    async fn assert_orders(store: &Store, s: &SessionRecord, n: u64) {
        let page = store
            .list_commands(&s.tenant, &s.session, 0, 100)
            .await
            .unwrap();
        let orders: Vec<u64> = page.iter().map(|r| r.accepted_order).collect();
        assert_eq!(orders, (1..=n).collect::<Vec<_>>(), "session {}", s.session);
    }

    pub async fn a_refusal_in_a_group_of_writes_leaves_the_others_standing(ts: &TestStore) {
        let store = one_lane(ts).await;
        let mut sessions = Vec::new();
        for i in 0..4 {
            sessions.push(new_session(ts, &format!("s{i}")).await);
        }
        let existing = admit(ts, &sessions[0], "existing").await;
        let claimed = ts
            .store
            .claim(claim_req(&existing, 1, Uuid::now_v7()))
            .await
            .unwrap();
        let admits = admit_concurrently(&store, &sessions, "c", 5);
        let mut refusals: Vec<(&str, Pending)> = Vec::new();
        for _ in 0..5 {
            // A retry that differs.
            let st = store.clone();
            let c = new_command(&sessions[0], "existing", CommandKind::Interrupt, b"{}");
            refusals.push((
                "command_mismatch",
                tokio::spawn(async move { st.admit(c).await.map(|_| ()) }),
            ));
            // An unknown command.
            let st = store.clone();
            let mut ghost = existing.clone();
            ghost.command = CommandId::new("ghost").unwrap();
            let req = claim_req(&ghost, 1, Uuid::now_v7());
            refusals.push((
                "not_found",
                tokio::spawn(async move { st.claim(req).await.map(|_| ()) }),
            ));
            // A stale revision.
            let st = store.clone();
            let mut req = claim_req(&claimed, 2, Uuid::now_v7());
            req.expected_revision = 1;
            refusals.push((
                "conflict",
                tokio::spawn(async move { st.claim(req).await.map(|_| ()) }),
            ));
        }
        for t in admits {
            t.await.unwrap().unwrap();
        }
        for (want, t) in refusals {
            assert_eq!(t.await.unwrap().unwrap_err().code().as_str(), want);
        }
        assert_orders(&store, &sessions[0], 6).await;
        for s in &sessions[1..] {
            assert_orders(&store, s, 5).await;
        }
        assert_eq!(
            store
                .command(&existing.tenant, &existing.session, &existing.command)
                .await
                .unwrap(),
            claimed
        );
        store.close().await;
    }

    pub async fn a_write_refused_after_writing_is_undone_alone(ts: &TestStore) {
        let store = one_lane(ts).await;
        let gated = new_session(ts, "gated").await;
        for n in 1..=16 {
            ts.store
                .open_gate(&gated.tenant, &gated.session, ResidencyEpoch(1), gate(n))
                .await
                .unwrap();
        }
        let mut sessions = Vec::new();
        for i in 0..3 {
            sessions.push(new_session(ts, &format!("s{i}")).await);
        }
        let admits = admit_concurrently(&store, &sessions, "c", 4);
        // Raises the gate mark to 2, then is refused: 16 gates are open already.
        let st = store.clone();
        let (t, s) = (gated.tenant.clone(), gated.session.clone());
        let refused =
            tokio::spawn(async move { st.open_gate(&t, &s, ResidencyEpoch(2), gate(17)).await });
        let more = admit_concurrently(&store, std::slice::from_ref(&gated), "c", 3);
        assert_eq!(code(refused.await.unwrap()), "state");
        for t in admits.into_iter().chain(more) {
            t.await.unwrap().unwrap();
        }
        // The refused write's own change is gone; everything else stands.
        assert_eq!(
            store
                .session(&gated.tenant, &gated.session)
                .await
                .unwrap()
                .gate_mark,
            ResidencyEpoch(1)
        );
        assert_eq!(
            store
                .gates(&gated.tenant, &gated.session, true)
                .await
                .unwrap()
                .len(),
            16
        );
        assert_orders(&store, &gated, 3).await;
        for s in &sessions {
            assert_orders(&store, s, 4).await;
        }
        store.close().await;
    }

    pub async fn a_group_that_fails_retryably_is_re_run_write_by_write(ts: &TestStore) {
        if ts.backend == TestBackend::Postgres {
            // The first two cursor writes fail as a lost serialization race would: the first
            // inside a group (rolled back whole), the second in that write's first run alone.
            ts.exec_raw(
                "CREATE SEQUENCE injected_failures; \
                 CREATE FUNCTION fail_twice() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN \
                   IF nextval('injected_failures') <= 2 THEN \
                     RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; \
                   END IF; \
                   RETURN NEW; \
                 END $$; \
                 CREATE TRIGGER fail_twice BEFORE INSERT OR UPDATE ON cursors \
                 FOR EACH ROW EXECUTE FUNCTION fail_twice();",
            )
            .await;
        }
        let store = one_lane(ts).await;
        let mut sessions = Vec::new();
        for i in 0..4 {
            sessions.push(new_session(ts, &format!("s{i}")).await);
        }
        let first = admit_concurrently(&store, &sessions, "a", 3);
        let st = store.clone();
        let (t, s) = (sessions[0].tenant.clone(), sessions[0].session.clone());
        let cursor =
            tokio::spawn(async move { st.save_cursor(&t, &s, 2, ResidencyEpoch(1)).await });
        let second = admit_concurrently(&store, &sessions[1..], "b", 3);
        let saved = cursor.await.unwrap().unwrap();
        assert_eq!(saved.consumed_order, 2);
        for t in first.into_iter().chain(second) {
            t.await.unwrap().unwrap();
        }
        // Every write committed exactly once.
        assert_orders(&store, &sessions[0], 3).await;
        for s in &sessions[1..] {
            assert_orders(&store, s, 6).await;
        }
        let c = store
            .cursor(&sessions[0].tenant, &sessions[0].session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((c.consumed_order, c.epoch), (2, ResidencyEpoch(1)));
        if ts.backend == TestBackend::Postgres {
            use sqlx::Connection as _;
            let options = ts.options();
            let mut conn = sqlx::PgConnection::connect(&options.url).await.unwrap();
            let used: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT last_value FROM \"{}\".injected_failures",
                options.pg_schema.unwrap()
            )))
            .fetch_one(&mut conn)
            .await
            .unwrap();
            assert!(used >= 3, "the injected failures never fired ({used})");
            let _ = conn.close().await;
        }
        store.close().await;
    }

    // ---- the merged hot path ------------------------------------------------------------

    /// Statements the lifecycle of one command issues, from the difference between a run of
    /// `1` and of `6` commands (the journal lease taken at the start of each run cancels out).
    async fn lifecycle_statements_per_command(ts: &TestStore) -> (f64, f64) {
        let a = new_session(ts, "counted-1").await;
        let b = new_session(ts, "counted-6").await;
        let before = ts.store.stats();
        testing::run_lifecycle(&ts.store, &a, 1).await.unwrap();
        let one = ts.store.stats().since(&before);
        let before = ts.store.stats();
        testing::run_lifecycle(&ts.store, &b, 6).await.unwrap();
        let six = ts.store.stats().since(&before);
        (
            (six.statements - one.statements) as f64 / 5.0,
            (six.writes - one.writes) as f64 / 5.0,
        )
    }

    pub async fn each_write_of_a_command_lifecycle_is_one_statement_on_postgres(ts: &TestStore) {
        let (statements, writes) = lifecycle_statements_per_command(ts).await;
        assert_eq!(writes, 6.0, "admit, claim, attempt, append, settle, cursor");
        match ts.backend {
            TestBackend::Postgres => assert_eq!(statements, 6.0),
            // SQLite runs each write as its steps (in-process statements cost no round trip);
            // the claim and the attempt each also read the session's residency lease.
            TestBackend::Sqlite => assert!(statements <= 21.0, "{statements} statements"),
        }
        let stats = ts.store.stats();
        assert_eq!(
            (stats.presumptions_undone, stats.presumptions_missed),
            (0, 0)
        );
    }

    /// Holds `s`'s catalog row (PostgreSQL) or the database's write lock (SQLite) from outside
    /// the store until the returned sender fires.
    async fn hold_writes(ts: &TestStore, s: &SessionRecord) -> tokio::sync::oneshot::Sender<()> {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (held, holding) = tokio::sync::oneshot::channel::<()>();
        let options = ts.options();
        match ts.backend {
            TestBackend::Postgres => {
                use sqlx::Connection as _;
                let mut conn = sqlx::PgConnection::connect(&options.url).await.unwrap();
                let sql = format!(
                    "SET search_path TO \"{}\"; BEGIN; SELECT 1 FROM sessions \
                     WHERE tenant_id = '{}' AND session_id = '{}' FOR UPDATE",
                    options.pg_schema.unwrap(),
                    s.tenant,
                    s.session
                );
                tokio::spawn(async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await
                        .unwrap();
                    let _ = held.send(());
                    let _ = released.await;
                    sqlx::raw_sql("COMMIT").execute(&mut conn).await.unwrap();
                });
            }
            TestBackend::Sqlite => {
                let path = options.url.trim_start_matches("sqlite://").to_owned();
                std::thread::spawn(move || {
                    let conn = rusqlite::Connection::open(path).unwrap();
                    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                    let _ = held.send(());
                    let _ = released.blocking_recv();
                    conn.execute_batch("COMMIT").unwrap();
                });
            }
        }
        holding.await.unwrap();
        release
    }

    pub async fn writes_of_one_kind_queued_in_a_lane_go_to_the_database_as_one_statement(
        ts: &TestStore,
    ) {
        let store = one_lane(ts).await;
        let blocker = new_session(ts, "blocker").await;
        let mut commands = Vec::new();
        for i in 0..12 {
            let s = new_session(ts, &format!("s{i}")).await;
            commands.push(admit(ts, &s, "c").await);
        }
        let release = hold_writes(ts, &blocker).await;
        let before = store.stats();
        // This write waits on the held row (or lock) inside the lane's group...
        let st = store.clone();
        let c = new_command(&blocker, "c", CommandKind::Input, b"{}");
        let first = tokio::spawn(async move { st.admit(c).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // ...while twelve claims on twelve sessions queue behind it.
        let claims: Vec<_> = commands
            .iter()
            .map(|rec| {
                let st = store.clone();
                let req = claim_req(rec, 1, Uuid::now_v7());
                tokio::spawn(async move { st.claim(req).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        for c in claims {
            assert_eq!(c.await.unwrap().unwrap().state, CommandState::Claimed);
        }
        let used = store.stats().since(&before);
        assert_eq!(used.writes, 13);
        assert_eq!(used.commits, 2, "the claims committed together: {used:?}");
        if ts.backend == TestBackend::Postgres {
            assert_eq!(used.statements, 13);
            // BEGIN, admit, COMMIT, NOTIFY; then BEGIN, the twelve claims, COMMIT.
            assert_eq!(used.server_statements, 7, "{used:?}");
        }
        store.close().await;
    }

    /// A journal reader of another store: it forwards to `inner` (or answers nothing) and is
    /// never the settling store's own journal.
    struct Foreign {
        inner: Option<std::sync::Arc<dyn EvidenceReader>>,
    }

    #[async_trait::async_trait]
    impl EvidenceReader for Foreign {
        async fn dispositions(
            &self,
            tenant: &TenantId,
            runtime_session: RuntimeSessionId,
            runtime_command: RuntimeCommandId,
        ) -> StoreResult<Vec<DispositionFrame>> {
            match &self.inner {
                Some(r) => {
                    r.dispositions(tenant, runtime_session, runtime_command)
                        .await
                }
                None => Ok(Vec::new()),
            }
        }
    }

    pub async fn settlement_reads_a_foreign_journal_even_when_the_own_journal_has_a_matching_frame(
        ts: &TestStore,
    ) {
        let foreign = StorageBindingId::new("foreign").unwrap();
        let s = ts
            .store
            .create_session(NewSession {
                tenant: tenant(),
                session: SessionId::new("remote").unwrap(),
                agent: AgentId::new("assistant").unwrap(),
                compatibility: CompatibilityId::new("build-1").unwrap(),
                binding: SessionBinding {
                    runtime_session_id: RuntimeSessionId::mint(),
                    storage_binding_id: foreign.clone(),
                    binding_version: 1,
                },
            })
            .await
            .unwrap();
        // The store's own journal holds a disposition for the command...
        let mut lease = journal(ts, &s, "runtime-a").await;
        let rec = admit(ts, &s, "c1").await;
        let applying = to_applying(ts, &rec, 1, &lease).await;
        apply_in_journal(ts, &mut lease, &applying, ApplicationOutcome::Applied).await;
        // ...but the session's binding routes to a foreign journal that holds none. (A second
        // handle settles: on PostgreSQL its statement presumes the settlement and must undo it,
        // which the suite's check after every case refuses on `ts.store`.)
        let settler = ts.reopen().await.unwrap();
        settler.set_evidence_router(std::sync::Arc::new(FixedEvidenceRouter::new(
            [foreign.clone()],
            std::sync::Arc::new(Foreign { inner: None }),
        )));
        assert_eq!(
            code(settler.settle(settle_req(&applying, 1)).await),
            "evidence"
        );
        let undone = settler.stats().presumptions_undone;
        match ts.backend {
            TestBackend::Postgres => assert!(undone >= 1, "{undone}"),
            TestBackend::Sqlite => assert_eq!(undone, 0),
        }
        let after = ts
            .store
            .command(&s.tenant, &s.session, &rec.command)
            .await
            .unwrap();
        assert_eq!(after, applying, "nothing was settled");
        // The foreign journal holding the frame settles it.
        settler.set_evidence_router(std::sync::Arc::new(FixedEvidenceRouter::new(
            [foreign],
            std::sync::Arc::new(Foreign {
                inner: Some(ts.store.own_evidence_reader()),
            }),
        )));
        let settled = settler.settle(settle_req(&applying, 1)).await.unwrap();
        assert_eq!(settled.state, CommandState::Applied);
        settler.close().await;
    }

    fn assert_index_lookups(plans: &[sessionstore::plans::LookupPlan]) {
        assert!(plans.len() >= 3, "{plans:?}");
        for p in plans {
            assert!(
                p.problem.is_none(),
                "{}: {}\n{}",
                p.statement,
                p.problem.as_deref().unwrap_or_default(),
                p.plan
            );
        }
    }

    pub async fn the_store_analyses_its_tables_once_they_hold_data_and_leaves_young_ones_alone(
        ts: &TestStore,
    ) {
        // A young table keeps the planner's own small-table assumption.
        let young = new_session(ts, "young").await;
        admit(ts, &young, "first").await;
        assert_eq!(
            ts.store.refresh_statistics().await.unwrap(),
            Vec::<String>::new()
        );
        let s = new_session(ts, "long").await;
        testing::grow_session(&ts.store, &s, 2_000).await.unwrap();
        let analysed = ts.store.refresh_statistics().await.unwrap();
        match ts.backend {
            TestBackend::Postgres => {
                for table in ["commands", "journal_records"] {
                    assert!(analysed.iter().any(|t| t == table), "{analysed:?}");
                }
            }
            // SQLite plans these lookups by index shape alone.
            TestBackend::Sqlite => assert!(analysed.is_empty(), "{analysed:?}"),
        }
    }

    pub async fn a_command_is_found_by_its_ids_through_an_index_in_a_fresh_store(ts: &TestStore) {
        let s = new_session(ts, "young").await;
        let rec = admit(ts, &s, "first").await;
        // Plans made now are the ones a young store caches and keeps while its tables grow.
        assert_index_lookups(&ts.store.lookup_plans(&s, &rec).await.unwrap());
    }

    pub async fn a_command_is_found_by_its_ids_through_an_index_in_a_session_of_10000_commands(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "long").await;
        // A store that checks its tables' growth often (a Host does every ten seconds).
        let mut options = ts.options();
        options.pg_statistics_interval = Duration::from_millis(100);
        let store = Store::open(options).await.unwrap();
        testing::grow_session(&store, &s, 10_000).await.unwrap();
        let rec = admit(ts, &s, "latest").await;
        assert_eq!(rec.accepted_order, 10_001);
        // Its own statistics check catches up with the growth: then every lookup of the command
        // by its ids, custom and generic, goes through an index on the id.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let plans = store.lookup_plans(&s, &rec).await.unwrap();
            assert!(plans.len() >= 3, "{plans:?}");
            let Some(bad) = plans.iter().find(|p| p.problem.is_some()) else {
                break;
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: {}\n{}",
                bad.statement,
                bad.problem.as_deref().unwrap_or_default(),
                bad.plan
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        store.close().await;
        // The grown session still runs whole lifecycles.
        testing::run_lifecycle(&ts.store, &s, 2).await.unwrap();
        let cursor = ts.store.cursor(&s.tenant, &s.session).await.unwrap();
        assert_eq!(cursor.map(|c| c.consumed_order), Some(10_003));
    }
}

/// After every case: no merged statement wrote what the state machine did not decide (every
/// refusal and replay above goes through them on PostgreSQL; an undone write means a statement
/// restates a check more loosely than `machine.rs`).
async fn no_presumption_undone(ts: &sessionstore::testing::TestStore) {
    let stats = ts.store.stats();
    assert_eq!(
        stats.presumptions_undone, 0,
        "a merged statement presumed a write the state machine refused: {stats:?}"
    );
}

sessionstore::both_backends!(cases =>
    public_offsets_count_public_events_only_without_gaps,
    an_offset_read_fails_closed_on_a_damaged_public_record,
    a_session_is_created_once_and_its_binding_is_immutable,
    another_tenant_never_sees_a_session,
    admitting_to_a_session_that_is_not_bound_is_not_found,
    admission_is_idempotent_by_command_id,
    a_command_keeps_the_trace_it_was_admitted_under_through_its_claim,
    an_admission_retry_that_differs_is_a_command_mismatch,
    acceptance_order_is_gap_free_and_monotonic_per_session,
    a_body_over_64_kib_must_be_stored_by_reference,
    admission_wakes_a_subscriber,
    bad_admission_input_is_refused_with_a_typed_error,
    a_claim_replayed_with_the_same_token_is_returned_unchanged,
    a_live_claim_of_the_same_epoch_with_another_token_is_claim_held,
    a_strictly_higher_epoch_takes_over_a_live_claim,
    a_lower_epoch_is_refused_and_told_the_mark,
    a_lapsed_claim_is_retaken_by_an_equal_epoch,
    a_claim_past_the_apply_deadline_is_refused,
    an_attempt_past_the_apply_deadline_is_refused_and_writes_nothing,
    a_stale_revision_is_a_conflict_carrying_the_current_one,
    a_claim_ttl_above_the_bound_is_invalid,
    an_unknown_command_is_not_found,
    a_command_is_rejected_before_any_attempt_and_the_retry_is_idempotent,
    a_pending_command_is_rejected_only_at_or_above_its_mark,
    a_command_with_an_attempt_can_be_neither_rejected_nor_claimed,
    an_attempt_needs_a_live_claim_held_by_this_residency,
    an_attempt_is_immutable_and_its_replay_is_unchanged,
    settling_without_evidence_is_an_error_and_writes_nothing,
    a_command_without_an_attempt_cannot_be_settled_and_nothing_is_written,
    settlement_takes_the_outcome_from_the_runtimes_disposition,
    a_successor_closes_a_stranded_attempt_not_applied,
    an_unroutable_storage_binding_is_not_missing_evidence,
    evidence_for_another_attempt_or_epoch_is_refused,
    settling_under_a_lower_epoch_than_the_mark_is_refused,
    the_cursor_is_fenced_and_never_regresses,
    residency_epochs_strictly_increase_and_survive_release,
    a_live_residency_held_elsewhere_is_refused_with_its_epoch,
    an_expired_residency_is_taken_over_and_the_old_holder_cannot_renew,
    a_claim_under_an_epoch_older_than_the_sessions_residency_is_refused_as_fenced,
    an_attempt_under_an_epoch_older_than_the_sessions_residency_is_refused,
    a_claim_under_a_lapsed_or_released_residency_is_refused_as_lost,
    the_gate_mark_refuses_lower_admits_equal_and_raises_on_higher,
    the_gate_projection_holds_at_most_16_open_and_never_reopens,
    open_gates_are_read_a_page_at_a_time_oldest_first_across_sessions_and_tenants,
    gate_writes_are_fenced_by_the_gate_mark,
    a_registration_is_fenced_and_its_tombstone_keeps_the_epoch,
    an_advertisement_expires_and_a_lower_generation_is_refused,
    moving_the_store_s_time_expires_a_lease_for_every_handle_at_once,
    a_corrupted_payload_object_is_detected,
    an_object_read_against_a_wrong_reference_is_refused,
    acquiring_the_journal_lease_appends_an_opening_fence,
    a_stale_writers_append_fails_after_a_successors_fence,
    appends_are_compare_and_set_on_the_writers_tip,
    a_command_has_at_most_one_disposition,
    a_closure_needs_a_later_epoch_and_no_effect_of_the_command,
    a_snapshot_is_fenced_by_the_journal_lease_and_never_replaced_by_an_older_one,
    a_damaged_snapshot_reads_as_integrity_and_another_tenant_sees_none,
    a_command_s_disposition_and_effects_are_read_from_the_journal_by_command,
    public_pages_hold_public_events_only_pinned_to_the_first_tip,
    event_bodies_over_64_kib_are_offloaded_and_verified_on_read,
    a_corrupt_command_row_reads_as_integrity_not_a_panic,
    a_corrupt_journal_record_fails_the_page_closed,
    a_closed_store_answers_unavailable,
    a_database_written_by_a_newer_build_is_refused,
    concurrent_writers_racing_to_claim_have_exactly_one_winner,
    a_successor_with_a_higher_epoch_takes_over_a_live_claim_from_another_connection,
    many_sessions_admitted_concurrently_keep_their_own_orders,
    a_refusal_in_a_group_of_writes_leaves_the_others_standing,
    a_write_refused_after_writing_is_undone_alone,
    a_group_that_fails_retryably_is_re_run_write_by_write,
    each_write_of_a_command_lifecycle_is_one_statement_on_postgres,
    writes_of_one_kind_queued_in_a_lane_go_to_the_database_as_one_statement,
    settlement_reads_a_foreign_journal_even_when_the_own_journal_has_a_matching_frame,
    a_command_is_found_by_its_ids_through_an_index_in_a_session_of_10000_commands,
    a_command_is_found_by_its_ids_through_an_index_in_a_fresh_store,
    the_store_analyses_its_tables_once_they_hold_data_and_leaves_young_ones_alone,
    ; after = no_presumption_undone
);

/// The store forbids sequential scans to its planner (they cost 10^10 each), so any scan it
/// cannot avoid (the registry's list of Hosts, say) costs far above PostgreSQL's JIT
/// thresholds: with JIT on, such a statement spent a few hundred milliseconds compiling and
/// inlining machine code to read a handful of rows. The store's connections turn JIT off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_s_postgresql_connections_never_jit_compile_a_statement() {
    let Some(ts) =
        sessionstore::testing::TestStore::open(sessionstore::testing::TestBackend::Postgres).await
    else {
        return;
    };
    ts.store
        .raw_sql_for_tests(
            "DO $$ BEGIN \
               IF current_setting('jit')::boolean THEN \
                 RAISE EXCEPTION 'jit is on for a store connection'; \
               END IF; \
             END $$",
        )
        .await
        .expect("JIT is off on the store's connections");
}
